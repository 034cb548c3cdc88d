"""The Mozart MoE layer as generated hardware (issue 16, under construction): its first block,
``moe_gate``, the root of the layer: gate scores on chip, node-limited top-k routing, gate
weights from a run-time table, and the NoP dispatch packet of every token.

Sources: seed 000 §3.3, §4.2 (the attention chiplet at the root computes the gate and dispatches
each token down the NoP tree to the chiplets of its experts), seed 003 §4.3 (node-limited
routing). The arithmetic and the packet format are :mod:`golden.moe_layer`'s; the contract is in
docs/blocks/moe_layer.md.

``moe_gate`` structure:

* x beats (``lanes`` elements each) are taken one per cycle; each beat adds its lanes' products
  with the matching rows of W_g into E wrapping accumulators (``lanes * E`` multipliers) and is
  kept in the x FIFO; at a token's final beat the E score codes are registered for the router;
* ``topk_router`` (a submodule, its own contract) picks the k experts and the leaf mask;
* the packet former takes one route, looks the k gate weights up in the gate table and sends
  ``ceil(k/lanes)`` header flits, then the token's x beats from the FIFO as flits, the next
  route taken on the edge of the last flit (no bubble between packets).
"""

import dataclasses
import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import moe_layer as golden
from golden import router as golden_router
from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.pipeline import requant, select
from hw.registry import Block, register
from hw.router import RouterConfig, TopKRouter, table_layout

__all__ = ["MoEGateConfig", "MoEGate"]

SHIFT_RANGE = 48


@dataclasses.dataclass(frozen=True)
class MoEGateConfig:
    """Parameters of ``moe_gate``.

    Parameters
    ----------
    experts, k, groups, topk_groups, leaves, token_width
        The routing, as for ``topk_router`` (same ranges and cross-field rules).
    d_model : int
        D, elements of a token (1..256).
    lanes : int
        L, elements per x beat and per NoP flit (1..64).
    in_width : int
        Bits of a signed x element (2..16).
    w_width : int
        Bits of a signed W_g weight (2..16).
    acc_width : int
        Bits of a wrapping gate-score accumulator (8..48).
    score_shift : int
        Right shift (round half up) from an accumulator to a score code (0..47).
    score_width : int
        Bits of an unsigned score code, and log2 of the gate table's size (1..10).
    gate_width : int
        Bits of an unsigned gate weight (1..16).
    data_width : int
        Bits of a NoP flit lane (2..32): at least in_width, and a header entry (expert index
        and gate weight) must fit.
    """
    experts: int = int_param(8, 2, 64, "E, experts")
    k: int = int_param(2, 1, 8, "experts chosen per token")
    groups: int = int_param(1, 1, 64, "G, expert groups (1 = no node limit)")
    topk_groups: int = int_param(1, 1, 64, "M, groups a token may use")
    leaves: int = int_param(4, 1, 64, "chiplets (leaves of the destination mask)")
    token_width: int = int_param(8, 1, 16, "bits of the token id")
    d_model: int = int_param(8, 1, 256, "D, elements of a token")
    lanes: int = int_param(4, 1, 64, "L, elements per x beat and per flit")
    in_width: int = int_param(8, 2, 16, "bits of a signed x element")
    w_width: int = int_param(8, 2, 16, "bits of a signed W_g weight")
    acc_width: int = int_param(32, 8, 48, "bits of a wrapping score accumulator")
    score_shift: int = int_param(8, 0, SHIFT_RANGE - 1, "accumulator to score-code shift")
    score_width: int = int_param(8, 1, 10, "bits of a score code (gate table: 2**bits)")
    gate_width: int = int_param(8, 1, 16, "bits of an unsigned gate weight")
    data_width: int = int_param(16, 2, 32, "bits of a NoP flit lane")

    def __post_init__(self):
        validate(self)
        self.router_config()            # the router's cross-field rules, with its messages
        if self.data_width < self.in_width:
            raise param_error("data_width", self.data_width,
                              f"an integer in in_width..32 ({self.in_width}..32)")
        entry = self.expert_bits + self.gate_width
        if self.data_width < entry:
            raise param_error("data_width", self.data_width,
                              f"at least expert bits + gate_width ({entry}): a header entry")

    @property
    def expert_bits(self):
        return ceil_log2(self.experts)

    @property
    def beats(self):
        """x beats (and x flits) per token: ceil(D / L)."""
        return math.ceil(self.d_model / self.lanes)

    @property
    def header_flits(self):
        return golden.header_flits(self.k, self.lanes)

    def router_config(self):
        return RouterConfig(experts=self.experts, k=self.k, score_width=self.score_width,
                            groups=self.groups, topk_groups=self.topk_groups,
                            leaves=self.leaves, token_width=self.token_width)


def x_layout(config):
    return data.StructLayout({"token": config.token_width,
                              "data": data.ArrayLayout(signed(config.in_width), config.lanes),
                              "last": 1})


def wg_layout(config):
    return data.StructLayout({"row": max(1, ceil_log2(config.d_model)),
                              "data": data.ArrayLayout(signed(config.w_width), config.experts)})


def gate_lut_layout(config):
    return data.StructLayout({"code": config.score_width, "value": config.gate_width})


def packet_layout(config):
    """A NoP dispatch flit (``hw.nop.down_layout`` of a tree with the same widths)."""
    return data.StructLayout({"token": config.token_width, "mask": config.leaves,
                              "data": data.ArrayLayout(signed(config.data_width), config.lanes),
                              "last": 1})


class MoEGate(ConfiguredComponent):
    """The ``moe_gate`` block (contract: docs/blocks/moe_layer.md).

    Members
    -------
    x : In(stream)
        ``token``, ``data`` (L signed elements), ``last``: a token is ``ceil(D/L)`` beats.
    wg : In(stream)
        ``row`` d, ``data`` (E weights): sets row d of W_g; always ready.
    gate_lut : In(stream)
        ``code``, ``value``: sets one gate-table entry; always ready.
    table : In(stream)
        The router's expert-to-leaf table (``topk_router``'s ``table``).
    packet : Out(stream)
        NoP dispatch flits: ``token``, ``mask``, ``data`` (L lanes), ``last``.
    error : Out(1)
        Sticky: a misplaced ``last`` on x, or a W_g row out of range.
    """

    def __init__(self, config):
        super().__init__(config, {
            "x": In(stream.Signature(x_layout(config))),
            "wg": In(stream.Signature(wg_layout(config))),
            "gate_lut": In(stream.Signature(gate_lut_layout(config))),
            "table": In(stream.Signature(table_layout(config.router_config()))),
            "packet": Out(stream.Signature(packet_layout(config))),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        E, L, B, H = cfg.experts, cfg.lanes, cfg.beats, cfg.header_flits
        router = m.submodules.router = TopKRouter(cfg.router_config())
        wiring.connect(m, wiring.flipped(self.table), router.table)

        # W_g: word b holds rows b*L .. b*L+L-1 (lane l = row b*L+l, E weights); a row write
        # is a one-lane write. Zero at start-up, kept through reset.
        row_bits = cfg.w_width * E
        weights = m.submodules.weights = Memory(shape=L * row_bits, depth=B, init=[])
        write = weights.write_port(granularity=row_bits)
        row = self.wg.payload.row
        row_ok = row < cfg.d_model
        m.d.comb += [self.wg.ready.eq(1), write.addr.eq(row // L),
                     write.data.eq(Cat(*([self.wg.payload.data.as_value()] * L)))]
        for lane in range(L):
            m.d.comb += write.en[lane].eq(self.wg.valid & row_ok & (row % L == lane))
        error = Signal()
        m.d.comb += self.error.eq(error)
        with m.If(self.wg.valid & ~row_ok):
            m.d.sync += error.eq(1)

        # Gate table: 2**score_width entries, zero at start-up, kept through reset.
        table = [Signal(cfg.gate_width, name=f"gate_{c}", reset_less=True)
                 for c in range(1 << cfg.score_width)]
        m.d.comb += self.gate_lut.ready.eq(1)
        with m.If(self.gate_lut.valid):
            with m.Switch(self.gate_lut.payload.code):
                for code, entry in enumerate(table):
                    with m.Case(code):
                        m.d.sync += entry.eq(self.gate_lut.payload.value)

        # Scores: beat counter, accumulators, the registered codes offered to the router.
        beat = Signal(range(B))
        final = beat == B - 1
        read = weights.read_port(domain="comb")
        m.d.comb += read.addr.eq(beat)
        acc = [Signal(signed(cfg.acc_width), name=f"acc_{e}") for e in range(E)]
        fifo = m.submodules.x_fifo = SyncFIFOBuffered(
            width=L * cfg.in_width, depth=B * (cfg.router_config().latency + 3))
        scores = router.scores
        taken = self.x.valid & self.x.ready
        m.d.comb += self.x.ready.eq(fifo.w_rdy & (~final | ~scores.valid | scores.ready))
        m.d.comb += [fifo.w_en.eq(taken), fifo.w_data.eq(self.x.payload.data.as_value())]
        with m.If(scores.ready):
            m.d.sync += scores.valid.eq(0)
        with m.If(taken):
            with m.If(self.x.payload.last != final):
                m.d.sync += error.eq(1)
            m.d.sync += beat.eq(Mux(final, 0, beat + 1))
            bias = 1 << (cfg.score_width - 1)
            for e in range(E):
                products = [self.x.payload.data[l] *
                            read.data[l * row_bits + e * cfg.w_width:
                                      l * row_bits + (e + 1) * cfg.w_width].as_signed()
                            for l in range(L)]
                total = Signal(signed(cfg.acc_width), name=f"sum_{e}")
                m.d.comb += total.eq(acc[e] + sum(products))
                code = requant(m, total, cfg.score_shift, cfg.score_width, f"code_{e}")
                with m.If(final):
                    m.d.sync += [acc[e].eq(0), scores.payload.score[e].eq(code + bias)]
                with m.Else():
                    m.d.sync += acc[e].eq(total)
            with m.If(final):
                m.d.sync += [scores.valid.eq(1), scores.payload.token.eq(self.x.payload.token)]

        # Packet former: one route at a time, H header flits then B x flits.
        route = router.route
        active = Signal()
        flit = Signal(range(H + B))
        token = Signal(cfg.token_width)
        mask = Signal(cfg.leaves)
        entries = [Signal(cfg.data_width, name=f"entry_{j}") for j in range(cfg.k)]
        out = self.packet
        in_header = flit < H
        last_flit = flit == H + B - 1
        sent = out.valid & out.ready
        m.d.comb += [out.valid.eq(active & (in_header | fifo.r_rdy)),
                     out.payload.token.eq(token), out.payload.mask.eq(mask),
                     out.payload.last.eq(last_flit),
                     fifo.r_en.eq(sent & ~in_header),
                     route.ready.eq(~active | (sent & last_flit))]
        for lane in range(L):
            header = select(flit, [entries[j * L + lane] if j * L + lane < cfg.k else Const(0)
                                   for j in range(H)])
            element = fifo.r_data[lane * cfg.in_width:(lane + 1) * cfg.in_width].as_signed()
            # A header lane carries the entry's bits; an x lane its element, sign-extended.
            m.d.comb += out.payload.data[lane].eq(Mux(in_header, header, element))
        with m.If(sent):
            m.d.sync += flit.eq(flit + 1)
            with m.If(last_flit):
                m.d.sync += [active.eq(0), flit.eq(0)]
        with m.If(route.valid & route.ready):
            m.d.sync += [active.eq(1), flit.eq(0), token.eq(route.payload.token),
                         mask.eq(route.payload.mask)]
            for j in range(cfg.k):
                gate = select(route.payload.score[j], table)
                m.d.sync += entries[j].eq(Cat(gate, route.payload.expert[j]))
        return m


register(Block(
    name="moe_gate", family="moe_layer", config=MoEGateConfig, build=MoEGate,
    figures=lambda cfg: {
        "beats_per_token": cfg.beats, "flits_per_token": cfg.header_flits + cfg.beats,
        "router_latency_cycles": golden_router.pipeline_latency(cfg.k, cfg.groups,
                                                                cfg.topk_groups)},
    summary="MoE layer root: gate scores, node-limited top-k, gate weights, NoP dispatch packets",
    demo_configs=({},),
    area_unit="expert", area_units=lambda cfg: cfg.experts,
    legend=("tokens per cycle against the packet port's bound 1/(header + x flits) "
            "with every port saturated"),
))
