"""Top-K expert router with an optional node (group) limit and a run-time expert-to-leaf table.

Source: DeepSeek-V3 node-limited routing (seed 003 §4.3: each token goes to at most M nodes,
chosen by the sum of the highest affinity scores of the experts on each node) feeding Mozart's
NoP-tree dispatch (seed 000 §3.3), whose destination mask this block produces. The rule, with
its tie-breaking, is in :mod:`golden.router` and docs/blocks/router.md.

A fixed-latency pipeline moving on one enable (output register free or taken), one token per
cycle, built on ranks rather than one pick per stage so that no stage holds more than a
comparison or a small count (the argmax-per-stage pipeline before it held the defaults to 48 MHz
on ECP5; docs/blocks/router.md, "Clock rate"):

* stage 0 registers the scores;
* with ``groups`` > 1: every pair of a group's experts compared; each expert's rank within its
  group; the group scores (the values at in-group ranks 0 and 1); every pair of groups
  compared; the kept groups (rank < ``topk_groups``);
* every pair of experts compared (beside the kept groups when there are groups), one bit per
  pair: i is *ahead* of j when its score is higher, or equal and i < j;
* each eligible expert's rank among the eligible (how many are ahead of it), counted in two
  halves then added;
* route entry r is the expert of rank r (r < k); the output stage ORs the chosen experts'
  decoded rows of the expert-to-leaf table into the destination mask.

That pipeline holds E score registers per stage and E(E-1)/2 comparators, which grows past
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

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import router as golden
from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.pipeline import or_tree
from hw.registry import Block, register

__all__ = ["RouterConfig", "TopKRouter"]

PARALLEL_MAX_EXPERTS = 64       # the pipeline compares every pair of experts: past 64, scan


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


def _ahead_matrix(values, sets):
    """``((i, j), bit)`` for every pair i < j within each index set: bit = value i ranks
    ahead of value j (higher, or equal and i the lower index). j ranks ahead of i when the
    bit is 0, so one comparator serves both."""
    return [((i, j), values[i] >= values[j])
            for indices in sets for a, i in enumerate(indices) for j in list(indices)[a + 1:]]


def _rank(m, e, ahead, indices, eligible, name):
    """How many of ``indices`` (other than e, and eligible when ``eligible`` is given) rank
    ahead of e, from the registered pair bits ``ahead[(i, j)]`` (i < j); 0 when none."""
    terms = []
    for j in indices:
        if j == e:
            continue
        bit = ahead[(j, e)] if j < e else ~ahead[(e, j)]
        terms.append(bit & eligible[j] if eligible is not None else bit)
    rank = Signal(range(len(terms) + 1), name=name)
    # A balanced adder tree of single bits (a population count).
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    m.d.comb += rank.eq(terms[0] if terms else 0)
    return rank


def _pick(m, hits, values, name):
    """The value whose ``hits`` bit is set (hits one-hot or zero: 0 then)."""
    picked = Signal(Value.cast(values[0]).shape(), name=name)
    m.d.comb += picked.eq(or_tree([Mux(hit, value, 0) for hit, value in zip(hits, values)]))
    return picked


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
        """The expert-to-leaf table, each entry held decoded: ``leaves`` bits with bit
        ``leaf`` set (registers, reset to leaf 0). Decoded at the write, the mask of a route is
        an OR of the chosen rows in the output stage (a leaf index beyond the mask's bits gives
        an empty row, as its shifted one-bit would)."""
        leaves = self.config.leaves
        leaf_bits = [Signal(leaves, name=f"leaf_bits{e}", init=1)
                     for e in range(self.config.experts)]
        m.d.comb += self.table.ready.eq(1)
        with m.If(self.table.valid):
            for e in range(self.config.experts):
                with m.If(self.table.payload.expert == e):
                    m.d.sync += leaf_bits[e].eq((Const(1, leaves) << self.table.payload.leaf)
                                                [:leaves])
        return leaf_bits

    @staticmethod
    def _leaf_mask(leaf_bits, chosen):
        """The destination mask of the experts whose bit of ``chosen`` is set."""
        return or_tree([Mux(chosen[e], row, 0) for e, row in enumerate(leaf_bits)])

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

        leaf_bits = self._leaf_table(m)

        def stage(name, valid_in, token_in, scores_in, extra=()):
            """Registers carrying a token and its scores to the next stage, with ``extra``
            values of this stage's own; returns the registered copies."""
            valid = Signal(name=f"{name}_valid")
            token = Signal(cfg.token_width, name=f"{name}_token")
            scores = [Signal(cfg.score_width, name=f"{name}_s{e}") for e in range(E)]
            held = [Signal(Value.cast(v).shape(), name=f"{name}_{label}")
                    for label, v in extra]
            with m.If(enable):
                m.d.sync += [valid.eq(valid_in), token.eq(token_in),
                             *[r.eq(v) for r, v in zip(scores, scores_in)],
                             *[r.eq(v) for r, (_, v) in zip(held, extra)]]
            return valid, token, scores, held

        payload = self.scores.payload
        valid, token, scores, _ = stage("in", self.scores.valid, payload.token,
                                        [payload.score[e] for e in range(E)])
        if G > 1:
            size = cfg.group_size
            # In-group ranks: how many of its group's experts are ahead of each expert.
            ahead = _ahead_matrix(scores, [range(g * size, (g + 1) * size) for g in range(G)])
            valid, token, scores, held = stage("gcmp", valid, token, scores,
                                               [(f"a{i}_{j}", bit) for (i, j), bit in ahead])
            ahead = {pair: bit for (pair, _), bit in zip(ahead, held)}
            ranks = [_rank(m, e, ahead, range((e // size) * size, (e // size + 1) * size),
                           None, f"grank{e}") for e in range(E)]
            valid, token, scores, ranks = stage("grank", valid, token, scores,
                                                [(f"r{e}", r) for e, r in enumerate(ranks)])
            # Group score: the values at in-group ranks 0 and 1 (one expert: its one score).
            group_score = []
            for g in range(G):
                members = range(g * size, (g + 1) * size)
                top = [_pick(m, [ranks[e] == r for e in members],
                             [scores[e] for e in members], f"g{g}_top{r}")
                       for r in range(min(2, size))]
                group_score.append(sum(top[1:], top[0]))
            valid, token, scores, group_score = stage(
                "gscore", valid, token, scores, [(f"g{g}", v) for g, v in enumerate(group_score)])
            gahead = _ahead_matrix(group_score, [range(G)])
            valid, token, scores, held = stage("gcmp2", valid, token, scores,
                                               [(f"a{i}_{j}", bit) for (i, j), bit in gahead])
            gahead = {pair: bit for (pair, _), bit in zip(gahead, held)}
            kept = Cat(_rank(m, g, gahead, range(G), None, f"gkeep{g}") < cfg.topk_groups
                       for g in range(G))
        # Every pair of experts compared at once (beside the kept groups' stage when there is
        # one), then each eligible expert's rank among the eligible ones: rank r < k is the
        # route's entry r.
        ahead = _ahead_matrix(scores, [range(E)])
        bits = [(f"a{i}_{j}", bit) for (i, j), bit in ahead]
        if G > 1:
            valid, token, scores, (kept, *held) = stage("gkeep", valid, token, scores,
                                                        [("kept", kept)] + bits)
            eligible = Cat(kept[e // cfg.group_size] for e in range(E))
        else:
            valid, token, scores, held = stage("xcmp", valid, token, scores, bits)
            eligible = Const((1 << E) - 1, E)
        ahead = {pair: bit for (pair, _), bit in zip(ahead, held)}
        # The rank of an expert counts up to E - 1 bits: two halves counted in one stage,
        # added in the next (one 63-bit count in one cycle held E = 32 just under 100 MHz).
        halves = [(f"r{e}_{h}", _rank(m, e, ahead, part, eligible, f"xcount{e}_{h}"))
                  for e in range(E) for h, part in enumerate((range(E // 2), range(E // 2, E)))]
        valid, token, scores, held = stage("xcount", valid, token, scores,
                                           halves + [("eligible", eligible)])
        *counts, eligible = held
        ranks = [counts[2 * e] + counts[2 * e + 1] for e in range(E)]
        valid, token, scores, held = stage("xrank", valid, token, scores,
                                           [(f"r{e}", r) for e, r in enumerate(ranks)]
                                           + [("eligible", eligible)])
        *ranks, eligible = held
        chosen = []
        for r in range(k):
            hit = [eligible[e] & (ranks[e] == r) for e in range(E)]
            chosen.append((_pick(m, hit, [Const(e, ceil_log2(E)) for e in range(E)],
                                 f"x{r}_id"),
                           _pick(m, hit, scores, f"x{r}_score")))
        chosen_bits = Cat(eligible[e] & (ranks[e] < k) for e in range(E))
        valid, token, scores, held = stage(
            "select", valid, token, scores,
            [(f"id{r}", i) for r, (i, _) in enumerate(chosen)]
            + [(f"score{r}", v) for r, (_, v) in enumerate(chosen)]
            + [("chosen", chosen_bits)])
        chosen_index, chosen_score, chosen_bits = held[:k], held[k:2 * k], held[2 * k]

        # Output stage: the destination mask from the table as it stands at this edge.
        mask = self._leaf_mask(leaf_bits, chosen_bits)
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
        leaf_bits = self._leaf_table(m)

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
        # The chosen experts as an E-bit vector (a signal: each bit is read by every mask bit).
        chosen_bits = Signal(E, name="chosen_bits")
        m.d.comb += chosen_bits.eq(Cat(or_tree([x == e for x in experts]) for e in range(E)))
        mask = self._leaf_mask(leaf_bits, chosen_bits)
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
