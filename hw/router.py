"""Top-K expert router with an optional node (group) limit and a run-time expert-to-leaf table.

Source: DeepSeek-V3 node-limited routing (seed 003 §4.3: each token goes to at most M nodes,
chosen by the sum of the highest affinity scores of the experts on each node) feeding Mozart's
NoP-tree dispatch (seed 000 §3.3), whose destination mask this block produces. The rule, with
its tie-breaking, is in :mod:`golden.router` and docs/blocks/router.md.

A fixed-latency pipeline moving on one enable (output register free or taken), one token per
cycle:

* stage 0 registers the scores;
* with ``groups`` > 1: one stage finds each group's highest score, one its second highest (their
  sum is the group score), then ``topk_groups`` stages each pick the best remaining group;
* ``k`` stages each pick the best remaining eligible expert (ties to the lower index: an argmax
  tree whose left inputs always hold the lower indices and win equal values);
* the output stage looks the chosen experts up in the expert-to-leaf table and ORs their leaf
  bits into the destination mask.

That pipeline holds E score registers per stage and E comparators per pick, which grows past
what builds in minutes near E = 64. With ``scan_lanes`` P >= 1 the block is instead a serial
router with the same ports and rule, for DeepSeek-V3 scale (E = 256, k = 8, G = 8, M = 4):

* a scanner takes one score vector and walks it P scores per cycle, group by group, inserting
  each score into a sorted list of the group's best L = min(max(k, 2 if G > 1 else 1), E/G)
  (the top two give the group score, the top k are all the selection can need from a group);
* at the scan's last beat the G lists go to a selector (double buffering: the scanner takes the
  next token at that edge), which picks the M best groups one per cycle, then the k best
  experts one per cycle by merging the kept groups' sorted lists;
* the output register is loaded with the k experts and the mask at the final pick.

Its timing is in :mod:`golden.router` (``scan_edges``): one token per max(B, C) cycles, B = G *
ceil((E/G)/P) scan beats, C = (M if G > 1) + k selection cycles.
"""

import dataclasses

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import router as golden
from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.registry import Block, register

__all__ = ["RouterConfig", "TopKRouter"]

PARALLEL_MAX_EXPERTS = 64       # the pipeline's size grows as E * (k + M): past 64, scan


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """Parameters of ``topk_router``.

    Parameters
    ----------
    experts : int
        E, scores per token (2..64; up to 256 with ``scan_lanes`` >= 1).
    k : int
        Experts chosen per token (1..8, at most E, at most topk_groups * E/groups).
    score_width : int
        Bits of an unsigned score (1..16).
    groups : int
        G, groups of E/G consecutive experts (1 = no node limit; must divide E).
    topk_groups : int
        M, groups a token may use (1..G).
    leaves : int
        Bits of the destination mask (1..64).
    token_width : int
        Bits of the token id carried alongside (1..16).
    scan_lanes : int
        0: the parallel pipeline (one token per cycle); P >= 1 (at most E/G): the serial
        router, scanning P scores per cycle.

    Raises
    ------
    ParamError
        On any value out of range.
    """
    experts: int = int_param(32, 2, 256, "E, experts (scores per token; > 64 needs scan_lanes)")
    k: int = int_param(4, 1, 8, "experts chosen per token")
    score_width: int = int_param(8, 1, 16, "bits of an unsigned score")
    groups: int = int_param(4, 1, 64, "G, expert groups (1 = no node limit)")
    topk_groups: int = int_param(2, 1, 64, "M, groups a token may use")
    leaves: int = int_param(16, 1, 64, "leaves of the destination mask")
    token_width: int = int_param(8, 1, 16, "bits of the token id")
    scan_lanes: int = int_param(0, 0, 64, "0: parallel pipeline; P: serial, P scores per cycle")

    def __post_init__(self):
        validate(self)
        if self.experts > PARALLEL_MAX_EXPERTS and not self.scan_lanes:
            raise param_error("experts", self.experts,
                              f"an integer in 2..{PARALLEL_MAX_EXPERTS} with scan_lanes=0 "
                              "(up to 256 with scan_lanes >= 1)")
        if self.k > self.experts:
            raise param_error("k", self.k, f"an integer in 1..experts ({self.experts})")
        if self.experts % self.groups:
            raise param_error("groups", self.groups, f"a divisor of experts ({self.experts})")
        if self.topk_groups > self.groups:
            raise param_error("topk_groups", self.topk_groups,
                              f"an integer in 1..groups ({self.groups})")
        if self.groups > 1 and self.k > self.topk_groups * self.group_size:
            raise param_error("k", self.k, "an integer in 1..topk_groups*experts/groups "
                              f"({self.topk_groups * self.group_size})")
        if self.scan_lanes > self.group_size:
            raise param_error("scan_lanes", self.scan_lanes,
                              f"an integer in 0..experts/groups ({self.group_size})")

    @property
    def group_size(self):
        return self.experts // self.groups

    @property
    def latency(self):
        """Edges from a score vector's transfer to its route's transfer with a ready output
        (and, serial, an idle router)."""
        if self.scan_lanes:
            return golden.scan_latency(self.experts, self.scan_lanes, self.k, self.groups,
                                       self.topk_groups)
        return golden.pipeline_latency(self.k, self.groups, self.topk_groups)

    @property
    def interval(self):
        """Cycles per token at saturation."""
        if self.scan_lanes:
            return golden.scan_interval(self.experts, self.scan_lanes, self.k, self.groups,
                                        self.topk_groups)
        return 1

    @property
    def list_length(self):
        """L, entries of a group's sorted list in the serial router."""
        return min(max(self.k, 2 if self.groups > 1 else 1), self.group_size)


def scores_layout(config):
    return data.StructLayout({"token": config.token_width,
                              "score": data.ArrayLayout(config.score_width, config.experts)})


def route_layout(config):
    return data.StructLayout({
        "token": config.token_width,
        "expert": data.ArrayLayout(ceil_log2(config.experts), config.k),
        "score": data.ArrayLayout(config.score_width, config.k),
        "mask": config.leaves,
    })


def table_layout(config):
    return data.StructLayout({"expert": ceil_log2(config.experts),
                              "leaf": max(1, ceil_log2(config.leaves))})


def _argmax(m, values, eligible, name):
    """Index and value of the highest eligible value, ties to the lower index, and "any".

    A balanced tree of pairwise choices; the left side always holds lower indices and wins
    equal values, so the result is the lowest index among the maxima."""
    nodes = [(eligible[i], Const(i, range(len(values))), values[i]) for i in range(len(values))]
    level = 0
    while len(nodes) > 1:
        merged = []
        for left, right in zip(nodes[0::2], nodes[1::2]):
            take_left = left[0] & (~right[0] | (left[2] >= right[2]))
            found = Signal(name=f"{name}_l{level}_{len(merged)}_any")
            index = Signal(len(left[1]), name=f"{name}_l{level}_{len(merged)}_index")
            value = Signal(len(left[2]), name=f"{name}_l{level}_{len(merged)}_value")
            m.d.comb += [found.eq(left[0] | right[0]),
                         index.eq(Mux(take_left, left[1], right[1])),
                         value.eq(Mux(take_left, left[2], right[2]))]
            merged.append((found, index, value))
        if len(nodes) % 2:
            merged.append(nodes[-1])
        nodes = merged
        level += 1
    return nodes[0]


class TopKRouter(ConfiguredComponent):
    """The ``topk_router`` block.

    Members
    -------
    scores : In(stream)
        ``token`` and E unsigned ``score`` lanes (expert e in lane e).
    table : In(stream)
        ``expert``, ``leaf``: sets the expert's leaf; always ready, takes effect at its edge.
    route : Out(stream)
        ``token``, ``expert[k]`` (best first), ``score[k]``, ``mask`` (bit ``table[e]`` per
        chosen expert).
    """

    def __init__(self, config):
        super().__init__(config, {
            "scores": In(stream.Signature(scores_layout(config))),
            "table": In(stream.Signature(table_layout(config))),
            "route": Out(stream.Signature(route_layout(config))),
        })

    def _leaf_table(self, m):
        """The expert-to-leaf table (registers, reset to leaf 0: k entries are read at once)."""
        leaf_of = [Signal(len(self.table.payload.leaf), name=f"leaf_of{e}")
                   for e in range(self.config.experts)]
        m.d.comb += self.table.ready.eq(1)
        with m.If(self.table.valid):
            for e in range(self.config.experts):
                with m.If(self.table.payload.expert == e):
                    m.d.sync += leaf_of[e].eq(self.table.payload.leaf)
        return leaf_of

    def _leaf_mask(self, m, leaf_of, experts):
        """The destination mask of ``experts``: bit ``leaf_of[e]`` for each (k table reads)."""
        leaves = self.config.leaves
        leaf_bits = []
        # An explicit compare per expert, not Array(leaf_of)[expert]: with the Array read,
        # Yosys 0.70's ABC9 (yowasp build) exits without a message on the default router.
        for i, expert in enumerate(experts):
            leaf = Signal(len(self.table.payload.leaf), name=f"leaf{i}")
            for e in range(self.config.experts):
                with m.If(expert == e):
                    m.d.comb += leaf.eq(leaf_of[e])
            leaf_bits.append(Const(1, leaves) << leaf)
        mask = leaf_bits[0]
        for bits in leaf_bits[1:]:
            mask = mask | bits
        return mask[:leaves]

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        if cfg.scan_lanes:
            self._elaborate_serial(m)
            return m
        E, k, G = cfg.experts, cfg.k, cfg.groups
        enable = Signal()
        out_valid = Signal()
        m.d.comb += [enable.eq(~out_valid | self.route.ready), self.scores.ready.eq(enable)]

        leaf_of = self._leaf_table(m)

        def stage(name, valid_in, token_in, scores_in, eligible_in):
            """Registers carrying a token between stages; returns the registered copies."""
            valid = Signal(name=f"{name}_valid")
            token = Signal(cfg.token_width, name=f"{name}_token")
            scores = [Signal(cfg.score_width, name=f"{name}_s{e}") for e in range(E)]
            eligible = Signal(E, name=f"{name}_eligible")
            with m.If(enable):
                m.d.sync += [valid.eq(valid_in), token.eq(token_in), eligible.eq(eligible_in),
                             *[r.eq(v) for r, v in zip(scores, scores_in)]]
            return valid, token, scores, eligible

        payload = self.scores.payload
        valid, token, scores, eligible = stage(
            "in", self.scores.valid, payload.token, [payload.score[e] for e in range(E)],
            Const((1 << E) - 1, E))

        if G > 1:
            size = cfg.group_size
            # Group score = highest + second highest of the group's experts.
            tops = []
            for g in range(G):
                members = scores[g * size:(g + 1) * size]
                tops.append(_argmax(m, members, [Const(1)] * size, f"g{g}_top1"))
            top1 = [Signal(cfg.score_width, name=f"g{g}_top1") for g in range(G)]
            top1_index = [Signal(len(t[1]), name=f"g{g}_top1_index") for g, t in enumerate(tops)]
            with m.If(enable):
                m.d.sync += [r.eq(t[2]) for r, t in zip(top1, tops)]
                m.d.sync += [r.eq(t[1]) for r, t in zip(top1_index, tops)]
            valid, token, scores, eligible = stage("g1", valid, token, scores, eligible)
            group_score = [Signal(cfg.score_width + 1, name=f"g{g}_score") for g in range(G)]
            for g in range(G):
                members = scores[g * size:(g + 1) * size]
                if size == 1:
                    second = Const(0, cfg.score_width)
                else:
                    others = [top1_index[g] != i for i in range(size)]
                    second = _argmax(m, members, others, f"g{g}_top2")[2]
                with m.If(enable):
                    m.d.sync += group_score[g].eq(top1[g] + second)
            valid, token, scores, eligible = stage("g2", valid, token, scores, eligible)
            kept = Const(0, G)
            remaining = Const((1 << G) - 1, G)
            for pick in range(cfg.topk_groups):
                kept_reg = Signal(G, name=f"kept{pick}")
                remaining_reg = Signal(G, name=f"remaining{pick}")
                score_regs = [Signal(cfg.score_width + 1, name=f"gs{pick}_{g}") for g in range(G)]
                _, best, _ = _argmax(m, group_score, remaining, f"group{pick}")
                onehot = Signal(G, name=f"group{pick}_onehot")
                m.d.comb += onehot.eq(1 << best)
                with m.If(enable):
                    m.d.sync += [kept_reg.eq(kept | onehot), remaining_reg.eq(remaining & ~onehot),
                                 *[r.eq(v) for r, v in zip(score_regs, group_score)]]
                valid, token, scores, eligible = stage(f"grp{pick}", valid, token, scores,
                                                       eligible)
                kept, remaining, group_score = kept_reg, remaining_reg, score_regs
            eligible = Cat(kept[e // size] for e in range(E))

        chosen_index, chosen_score = [], []
        for pick in range(k):
            _, best, value = _argmax(m, scores, eligible, f"expert{pick}")
            onehot = Signal(E, name=f"expert{pick}_onehot")
            m.d.comb += onehot.eq(1 << best)
            index_regs = [Signal(ceil_log2(E), name=f"x{pick}_id{i}") for i in range(pick + 1)]
            score_regs = [Signal(cfg.score_width, name=f"x{pick}_score{i}")
                          for i in range(pick + 1)]
            with m.If(enable):
                m.d.sync += [r.eq(v) for r, v in zip(index_regs, chosen_index + [best])]
                m.d.sync += [r.eq(v) for r, v in zip(score_regs, chosen_score + [value])]
            chosen_index, chosen_score = index_regs, score_regs
            valid, token, scores, eligible = stage(f"x{pick}", valid, token, scores,
                                                   eligible & ~onehot)

        # Output stage: the destination mask from the table as it stands at this edge.
        mask = self._leaf_mask(m, leaf_of, chosen_index)
        out = self.route.payload
        with m.If(enable):
            m.d.sync += [out_valid.eq(valid), out.token.eq(token), out.mask.eq(mask),
                         *[out.expert[i].eq(v) for i, v in enumerate(chosen_index)],
                         *[out.score[i].eq(v) for i, v in enumerate(chosen_score)]]
        m.d.comb += self.route.valid.eq(out_valid)
        return m

    def _elaborate_serial(self, m):
        """The serial router (``scan_lanes`` >= 1; module docstring and docs/blocks/router.md)."""
        cfg = self.config
        E, k, G, M, P = cfg.experts, cfg.k, cfg.groups, cfg.topk_groups, cfg.scan_lanes
        W, S, L = cfg.score_width, cfg.group_size, cfg.list_length
        per_group = -(-S // P)                       # beats per group
        tail = S - (per_group - 1) * P               # lanes in a group's last beat (1..P)
        group_picks = M if G > 1 else 0
        select = group_picks + k                     # C, selection cycles
        entry = data.StructLayout({"score": W, "expert": ceil_log2(E)})
        leaf_of = self._leaf_table(m)

        def entries(name, count=L):
            return [Signal(entry, name=f"{name}_{i}") for i in range(count)]

        # --- Scanner: one token's scores, P per beat, a group's beats one after another.
        scan_busy, scan_token = Signal(), Signal(cfg.token_width)
        vector = Signal(E * W)                       # the scores not yet scanned, lane 0 first
        beat = Signal(range(per_group))
        group = Signal(range(G))
        base = Signal(ceil_log2(E) + 1)              # expert index of lane 0
        current, current_valid = entries("current"), Signal(L)
        done_lists = [entries(f"scanned{g}") for g in range(G - 1)]   # the last goes straight on

        group_last = beat == per_group - 1
        scan_last = scan_busy & group_last & (group == G - 1)
        # Insert the beat's lanes, lowest index first, into the group's sorted list (empty at
        # a group's first beat). A score goes after equal ones: ties to the lower index.
        chain = [Mux(beat == 0, Const(0, entry.size), e.as_value()) for e in current]
        chain_valid = Mux(beat == 0, 0, current_valid)
        for lane in range(P):
            score = vector[lane * W:(lane + 1) * W]
            lane_on = Const(1) if lane < tail else ~group_last
            old = [entry(v) for v in chain]
            beats = [lane_on & (~chain_valid[i] | (score > old[i].score)) for i in range(L)]
            stage, stage_valid = entries(f"lane{lane}_list"), Signal(L, name=f"lane{lane}_valid")
            for i in range(L):
                moved_down = beats[i - 1] if i else Const(0)
                m.d.comb += [
                    stage[i].eq(Mux(moved_down, chain[i - 1] if i else 0,
                                    Mux(beats[i], Cat(score, (base + lane)[:entry.size - W]),
                                        chain[i]))),
                    stage_valid[i].eq(Mux(moved_down, chain_valid[i - 1] if i else 0,
                                          beats[i] | chain_valid[i]))]
            chain, chain_valid = [e.as_value() for e in stage], stage_valid

        # --- Selector: M group picks, then k expert picks merging the kept groups' lists.
        sel_busy, sel_token = Signal(), Signal(cfg.token_width)
        count = Signal(range(select + 1))
        lists = [entries(f"select{g}") for g in range(G)]
        kept = Signal(G, init=0 if G > 1 else (1 << G) - 1)
        remaining = Signal(G, init=(1 << G) - 1)
        heads = [Signal(range(L + 1), name=f"head{g}") for g in range(G)]
        chosen = entries("chosen", k - 1)
        out_valid = Signal()
        out_free = ~out_valid | self.route.ready
        final = sel_busy & (count == select - 1)
        handoff = scan_last & (~sel_busy | (final & out_free))

        # Scanner registers.
        with m.If(scan_busy & (~scan_last | handoff)):
            step = Mux(group_last, tail, P)
            m.d.sync += [vector.eq(Mux(group_last, vector >> (tail * W), vector >> (P * W))),
                         base.eq(base + step), beat.eq(Mux(group_last, 0, beat + 1)),
                         group.eq(group + group_last),
                         *[c.eq(v) for c, v in zip(current, chain)],
                         current_valid.eq(chain_valid)]
            for g in range(G - 1):
                with m.If(group_last & (group == g)):
                    m.d.sync += [d.eq(v) for d, v in zip(done_lists[g], chain)]
        with m.If(handoff):
            m.d.sync += scan_busy.eq(0)
        m.d.comb += self.scores.ready.eq(~scan_busy | handoff)
        with m.If(self.scores.valid & self.scores.ready):
            m.d.sync += [scan_busy.eq(1), scan_token.eq(self.scores.payload.token),
                         vector.eq(self.scores.payload.score.as_value()), beat.eq(0),
                         group.eq(0), base.eq(0)]

        # Selector registers.
        group_score = [Signal(W + 1, name=f"group_score{g}") for g in range(G)]
        for g in range(G):
            second = lists[g][1].score if L > 1 else 0
            m.d.comb += group_score[g].eq(lists[g][0].score + second)
        picking_groups = count < group_picks
        _, best_group, _ = _argmax(m, group_score, remaining, "group")
        heads_entry = []
        for g in range(G):
            head = Signal(entry, name=f"head_entry{g}")
            m.d.comb += head.eq(lists[g][0])
            for i in range(1, L):
                with m.If(heads[g] == i):
                    m.d.comb += head.eq(lists[g][i])
            heads_entry.append(head)
        _, best_list, _ = _argmax(m, [h.score for h in heads_entry],
                                  [kept[g] & (heads[g] < L) for g in range(G)], "expert")
        pick = Signal(entry)
        m.d.comb += pick.eq(heads_entry[0])
        for g in range(1, G):
            with m.If(best_list == g):
                m.d.comb += pick.eq(heads_entry[g])
        with m.If(sel_busy & (~final | out_free)):
            m.d.sync += count.eq(count + 1)
            with m.If(picking_groups):
                m.d.sync += [kept.eq(kept | (1 << best_group)),
                             remaining.eq(remaining & ~(1 << best_group))]
            with m.Else():
                m.d.sync += [c.eq(v) for c, v in zip(chosen, chosen[1:] + [pick])]
                for g in range(G):
                    with m.If(best_list == g):
                        m.d.sync += heads[g].eq(heads[g] + 1)
            with m.If(final):
                m.d.sync += sel_busy.eq(0)
        with m.If(handoff):
            m.d.sync += [sel_busy.eq(1), sel_token.eq(scan_token), count.eq(0),
                         kept.eq(kept.init), remaining.eq(remaining.init),
                         *[h.eq(0) for h in heads]]
            for g in range(G - 1):
                m.d.sync += [d.eq(v) for d, v in zip(lists[g], done_lists[g])]
            m.d.sync += [d.eq(v) for d, v in zip(lists[G - 1], chain)]

        # Output register, loaded at the final pick: the mask from the table as it stands.
        experts = [c.expert for c in chosen] + [pick.expert]
        mask = self._leaf_mask(m, leaf_of, experts)
        out = self.route.payload
        with m.If(self.route.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(final & out_free):
            m.d.sync += [out_valid.eq(1), out.token.eq(sel_token), out.mask.eq(mask),
                         *[out.expert[i].eq(x) for i, x in enumerate(experts)],
                         *[out.score[i].eq(c.score) for i, c in enumerate(chosen + [pick])]]
        m.d.comb += self.route.valid.eq(out_valid)


register(Block(
    name="topk_router", family="router", config=RouterConfig, build=TopKRouter,
    figures=lambda cfg: {"latency_cycles": cfg.latency,
                         "tokens_per_cycle": round(1 / cfg.interval, 4) if cfg.scan_lanes else 1},
    summary="top-K expert router with node (group) limit and expert->leaf mask table",
    demo_configs=({},),
    legend="routes per cycle, latency, r of a top-k trace routed by the RTL",
    area_unit="expert", operation="route", area_units=lambda cfg: cfg.experts,
))
