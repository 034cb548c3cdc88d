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


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """Parameters of ``topk_router``.

    Parameters
    ----------
    experts : int
        E, scores per token (2..64).
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

    Raises
    ------
    ParamError
        On any value out of range.
    """
    experts: int = int_param(32, 2, 64, "E, experts (scores per token)")
    k: int = int_param(4, 1, 8, "experts chosen per token")
    score_width: int = int_param(8, 1, 16, "bits of an unsigned score")
    groups: int = int_param(4, 1, 64, "G, expert groups (1 = no node limit)")
    topk_groups: int = int_param(2, 1, 64, "M, groups a token may use")
    leaves: int = int_param(16, 1, 64, "leaves of the destination mask")
    token_width: int = int_param(8, 1, 16, "bits of the token id")

    def __post_init__(self):
        validate(self)
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

    @property
    def group_size(self):
        return self.experts // self.groups

    @property
    def latency(self):
        """Edges from a score vector's transfer to its route's transfer with a ready output."""
        return golden.pipeline_latency(self.k, self.groups, self.topk_groups)


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

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        E, k, G = cfg.experts, cfg.k, cfg.groups
        enable = Signal()
        out_valid = Signal()
        m.d.comb += [enable.eq(~out_valid | self.route.ready), self.scores.ready.eq(enable)]

        # Expert-to-leaf table (registers: k entries are read in the output stage at once).
        leaf_of = [Signal(len(self.table.payload.leaf), name=f"leaf_of{e}") for e in range(E)]
        m.d.comb += self.table.ready.eq(1)
        with m.If(self.table.valid):
            for e in range(E):
                with m.If(self.table.payload.expert == e):
                    m.d.sync += leaf_of[e].eq(self.table.payload.leaf)

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
        leaf_bits = []
        # An explicit compare per expert, not Array(leaf_of)[expert]: with the Array read,
        # Yosys 0.70's ABC9 (yowasp build) exits without a message on the default router.
        for i, expert in enumerate(chosen_index):
            leaf = Signal(len(self.table.payload.leaf), name=f"leaf{i}")
            for e in range(E):
                with m.If(expert == e):
                    m.d.comb += leaf.eq(leaf_of[e])
            leaf_bits.append(Const(1, cfg.leaves) << leaf)
        mask = leaf_bits[0]
        for bits in leaf_bits[1:]:
            mask = mask | bits
        out = self.route.payload
        with m.If(enable):
            m.d.sync += [out_valid.eq(valid), out.token.eq(token), out.mask.eq(mask[:cfg.leaves]),
                         *[out.expert[i].eq(v) for i, v in enumerate(chosen_index)],
                         *[out.score[i].eq(v) for i, v in enumerate(chosen_score)]]
        m.d.comb += self.route.valid.eq(out_valid)
        return m


register(Block(
    name="topk_router", family="router", config=RouterConfig, build=TopKRouter,
    figures=lambda cfg: {"latency_cycles": cfg.latency, "tokens_per_cycle": 1},
    summary="top-K expert router with node (group) limit and expert->leaf mask table",
    demo_configs=({},),
    legend="routes per cycle, latency, r of a top-k trace routed by the RTL",
    area_unit="expert", area_units=lambda cfg: cfg.experts,
))
