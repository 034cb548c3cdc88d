"""The Mozart MoE layer as generated hardware (issue 16; FP8 and BF16 datapaths, issue 17): its
first block, ``moe_gate``, the root of the layer: gate scores on chip, node-limited top-k
routing, gate weights from a run-time table, and the NoP dispatch packet of every token.

Sources: seed 000 §3.3, §4.2 (the attention chiplet at the root computes the gate and dispatches
each token down the NoP tree to the chiplets of its experts), seed 003 §4.3 (node-limited
routing). The arithmetic and the packet format are :mod:`golden.moe_layer`'s; the contract is in
docs/blocks/moe_layer.md.

``moe_gate`` structure:

* x beats (``lanes`` elements each) are taken one per cycle and kept in the x FIFO; a pipeline
  of registers computes each beat's lanes' products with the matching rows of W_g
  (``lanes * E`` multipliers), sums them per expert and adds the sums into E wrapping
  accumulators; a token's final totals are registered and then their E score codes, for the
  router;
* ``topk_router`` (a submodule, its own contract) picks the k experts and the leaf mask;
* the packet former takes one route, looks the k gate weights up in the gate table and sends
  ``ceil(k/lanes)`` header flits, then the token's x beats from the FIFO as flits, the next
  route taken on the edge of the last flit (no bubble between packets).
"""

import dataclasses
import math
import types

from amaranth.hdl import (Cat, ClockSignal, Const, Instance, Module, Mux, ResetSignal, Signal,
                          signed, unsigned)
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import fp as golden_fp
from golden import moe_layer as golden
from golden import router as golden_router
from hw.fparith import fp_add, fp_fields, fp_multiply, fp_scale_cast
from hw.params import (ConfiguredComponent, TieredComponent, choice_param, int_param,
                       like_param, param_error, validate)
from hw.pipeline import (LUT_RAM_MARK, RegisteredHeadFIFO, RegisterSlice, SkidSlice, StallPipe,
                         or_tree, requant, requant_round, requant_shift_clamp, select)
from hw.registry import Block, register
from hw.nop import NopConfig, NopTree, down_layout, up_layout
from hw.pmu import PMU, PMUConfig, ScratchpadBanks, banks_signature
from hw.router import RouterConfig, TopKRouter, table_layout
from hw.systolic import SystolicTile, SystolicTileConfig

__all__ = ["MoEGateConfig", "MoEGate", "ExpertChipletConfig", "ExpertChiplet", "MoELayerConfig",
           "MoELayer"]

SHIFT_RANGE = 48
INT_ACT_BITS = 10   # expert_chiplet: the widest integer element (a 2**in_width activation table)
UNIT_SCALE, NAN_SCALE = golden.UNIT_SCALE, golden.NAN_SCALE     # E8M0 codes: 1, NaN
LUT_RAM_ENTRIES = 256           # expert_chiplet: an activation table this deep or less is LUT RAM
PLAN_DEPTH = golden.PLAN_DEPTH   # expert_chiplet: tile phases planned (weight jobs queued) ahead
# expert_chiplet: the integer gate-weighted product is two products, of the row value's low
# WEIGHTED_SPLIT bits (unsigned, an 18-bit signed operand: one ECP5 MULT18X18D) and of the
# rest, added a stage later (clock rate: one wide product and its adder chain in one cycle).
WEIGHTED_SPLIT = 17


class PacketShape:
    """The dispatch packet's shape, for a config with ``k``, ``lanes`` and ``d_model`` (and
    ``shared``: a shared expert's header entry after the k routed ones; a floating-point
    ``dtype``: x's scale code, the last ``scale_entries`` header entries, low bits first)."""

    @property
    def scale_entries(self):
        """Header entries of x's scale: none for integers, else its code's bits over the
        ``data_width``-bit lanes (E8M0: one; FP32: ceil(32 / data_width))."""
        if getattr(self, "dtype", "int") == "int":
            return 0
        return golden.scale_entries(self.scale_format, self.data_width)

    @property
    def scale_bits(self):
        """Bits of a scale code (8 for E8M0, 32 for FP32)."""
        return golden_fp.SCALE_BITS[self.scale_format]

    @property
    def unit_scale(self):
        """The code of a unit scale in ``scale_format``."""
        return golden.unit_scale(self.scale_format)

    def _check_scale_format(self):
        if self.scale_format != "e8m0" and self.dtype == "int":
            raise param_error("scale_format", self.scale_format,
                              "'e8m0' with dtype 'int' (integers carry no scales)")

    @property
    def header_entries(self):
        return self.k + getattr(self, "shared", 0) + self.scale_entries

    @property
    def header_flits(self):
        """ceil(entries / L) header flits."""
        return golden.header_flits(self.header_entries, self.lanes)

    @property
    def x_flits(self):
        """ceil(D / L) flits of x (or of a return's values)."""
        return math.ceil(self.d_model / self.lanes)


@dataclasses.dataclass(frozen=True)
class MoEGateConfig(PacketShape):
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
    dtype : str
        ``int``, or ``fp8_e4m3``/``fp8_e5m2``/``bf16``: x elements are codes (in_width 8, or
        16 for BF16), taken as fixed-point integers for the scores
        (``golden.moe_layer.fixed_x``: FP8 exactly, BF16 in Q16.16); W_g stays integer (the
        gate in higher precision, as seed 003 §3.3 keeps it).
    scale_format : str
        Floating point: the format of x's scale, ``e8m0`` (a power of two: the score's
        rounding moves) or ``fp32`` (the totals are multiplied by its 24-bit significand, one
        more pipeline stage; it rides in ceil(32 / data_width) header entries).
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
    shared: int = int_param(0, 0, 1, "1: a shared expert (id E) in every token's packet")
    shared_leaf: int = int_param(0, 0, 63, "leaf of the shared expert")
    dtype: str = choice_param("int", ("int", "fp8_e4m3", "fp8_e5m2", "bf16"),
                              "x elements: integers, or FP8 or BF16 codes")
    scale_format: str = choice_param("e8m0", golden.SCALE_FORMATS,
                                     "floating point: format of the scales (x's, weights')")

    def __post_init__(self):
        validate(self)
        self._check_scale_format()
        if self.dtype != "int":
            width = golden_fp.FORMATS[self.dtype].width
            if self.in_width != width:
                raise param_error("in_width", self.in_width,
                                  f"{width} with dtype {self.dtype} (x elements are its codes)")
        self.router_config()            # the router's cross-field rules, with its messages
        if self.shared_leaf >= self.leaves:
            raise param_error("shared_leaf", self.shared_leaf,
                              f"an integer in 0..leaves-1 (0..{self.leaves - 1})")
        if self.data_width < self.in_width:
            raise param_error("data_width", self.data_width,
                              f"an integer in in_width..32 ({self.in_width}..32)")
        entry = self.expert_bits + self.gate_width
        if self.data_width < entry:
            raise param_error("data_width", self.data_width,
                              f"at least expert bits + gate_width ({entry}): a header entry")

    @property
    def expert_bits(self):
        """Bits of an expert id in a header entry (the shared expert is id E)."""
        return ceil_log2(self.experts + self.shared)

    @property
    def beats(self):
        """x beats (and x flits) per token: ceil(D / L)."""
        return self.x_flits

    def router_config(self):
        return RouterConfig(experts=self.experts, k=self.k, score_width=self.score_width,
                            groups=self.groups, topk_groups=self.topk_groups,
                            leaves=self.leaves, token_width=self.token_width)


def x_layout(config):
    """An x beat: ``token``, with a floating-point ``dtype`` ``scale`` (x's scale code, 8 or 32
    bits, read on the token's first beat), ``data`` (L elements), ``last``."""
    scale = {} if config.dtype == "int" else {"scale": config.scale_bits}
    return data.StructLayout({"token": config.token_width, **scale,
                              "data": data.ArrayLayout(_element(config, config.in_width),
                                                       config.lanes),
                              "last": 1})


def _fixed_x(m, code, dtype, name):
    """An x code as the gate's fixed-point integer (``golden.moe_layer.fixed_x``): the mantissa
    shifted up by its exponent plus the fraction bits; NaN 0, an infinity the largest value of
    its sign. FP8 is exact; BF16 is cut to the same Q16.16 window: shifted right (truncated)
    below it, saturated above it."""
    fmt = golden_fp.FORMATS[dtype]
    largest = golden.fixed_x(golden.GATE_MAX_CODE[dtype], dtype)
    nan, inf, sign, mantissa, exponent = fp_fields(m, code, fmt, name)
    magnitude = Signal(largest.bit_length(), name=f"{name}_magnitude")
    value = Signal(signed(largest.bit_length() + 1), name=f"{name}_fixed")
    fraction = golden.FIXED_FRACTION[dtype]
    if golden.GATE_MAX_CODE[dtype] == fmt.max_code:         # FP8: every finite value fits
        shift = Signal(range(largest.bit_length() + 1), name=f"{name}_shift")
        m.d.comb += [shift.eq(exponent + fraction),
                     magnitude.eq(Mux(inf, largest, mantissa << shift))]
    else:
        # The mantissa's M bits shifted by exponent + fraction + M >= 0, the M low bits
        # dropped: a right shift where exponent + fraction < 0 (less than -M: 0).
        M = fmt.man_bits + 1
        top = golden_fp.components(golden.GATE_MAX_CODE[dtype], fmt)[3]    # its exponent
        under = exponent + fraction + M < 0
        shift = Signal(range(top + fraction + M + 1), name=f"{name}_shift")
        m.d.comb += [shift.eq(Mux(under, 0, exponent + fraction + M)),
                     magnitude.eq(Mux(inf | (exponent > top), largest,
                                      Mux(under, 0, (mantissa << shift)[M:])))]
    m.d.comb += value.eq(Mux(nan, 0, Mux(sign, -magnitude, magnitude)))
    return value


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

        # Gate table: 2**score_width entries, zero at start-up, kept through reset; one read
        # port per choice (a memory: 1024 registers behind k selects made 22 MB of Verilog
        # that Verilator could not build in 24 GB).
        table = m.submodules.gate_table = Memory(shape=cfg.gate_width,
                                                 depth=1 << cfg.score_width, init=[])
        table_write = table.write_port()
        m.d.comb += [self.gate_lut.ready.eq(1), table_write.en.eq(self.gate_lut.valid),
                     table_write.addr.eq(self.gate_lut.payload.code),
                     table_write.data.eq(self.gate_lut.payload.value)]
        table_reads = [table.read_port(domain="comb") for _ in range(cfg.k)]

        # Scores: a pipeline of registers that move together (clock rate): the x beat and its
        # W_g word (a synchronous read at the edge the beat is taken), the L x E products,
        # their sum per expert, the accumulators (and a final beat's totals), then the E codes
        # registered for the router. The pipeline stops only while a final beat's totals
        # find the codes register full, even in a cycle where the router takes
        # those codes (so the stop does not depend on the router's ready, a long path through
        # the packet former; final beats B >= 1 edges apart and packets of H + B >= 2 flits
        # leave no throughput to this).
        beat = Signal(range(B))
        final = beat == B - 1
        read = weights.read_port(transparent_for=())
        acc = [Signal(signed(cfg.acc_width), name=f"acc_{e}") for e in range(E)]
        floating = cfg.dtype != "int"
        fp32_scale = floating and cfg.scale_format == "fp32"
        SB = cfg.scale_bits
        # Floating point: the token's scale, its first beat's, goes with every beat (into the
        # score pipeline, and into the x FIFO, whose head is the token's first beat when its
        # header leaves).
        scale_now = Const(UNIT_SCALE, 8)
        if floating:
            first_scale = Signal(SB, name="first_scale", reset_less=True)
            scale_now = Mux(beat == 0, self.x.payload.scale, first_scale)
            with m.If(self.x.valid & self.x.ready & (beat == 0)):
                m.d.sync += first_scale.eq(self.x.payload.scale)
        x_bits = L * cfg.in_width
        # (the FIFO holds a token's beats until its header leaves: the stages from its final
        # beat to the router's output, plus a margin)
        fifo = m.submodules.x_fifo = SyncFIFOBuffered(
            width=x_bits + (SB if floating else 0),
            depth=B * (cfg.router_config().latency + 7 + fp32_scale))
        scores = router.scores
        totals_final = Signal()
        scaled_final = Signal()          # (FP32 scales: the stage after the totals)
        advance = Signal()
        m.d.comb += advance.eq(~((scaled_final if fp32_scale else totals_final) & scores.valid))
        pipe = StallPipe(advance)
        m.d.comb += [self.x.ready.eq(fifo.w_rdy & advance), read.addr.eq(beat),
                     read.en.eq(advance)]
        taken = self.x.valid & self.x.ready
        scale_bits = scale_now if floating else Const(0, 0)
        m.d.comb += [fifo.w_en.eq(taken),
                     fifo.w_data.eq(Cat(self.x.payload.data.as_value(), scale_bits))]
        with m.If(taken):
            with m.If(self.x.payload.last != final):
                m.d.sync += error.eq(1)
            m.d.sync += beat.eq(Mux(final, 0, beat + 1))
        beat_valid = pipe.reg(taken, "beat_valid")
        beat_final = pipe.reg(final, "beat_final")
        beat_token = pipe.reg(self.x.payload.token, "beat_token")
        beat_scale = pipe.reg(scale_now, "beat_scale") if floating else None
        beat_x = pipe.reg(self.x.payload.data.as_value(), "beat_x")
        lanes_x = [beat_x[l * cfg.in_width:(l + 1) * cfg.in_width].as_signed()
                   for l in range(L)]
        if cfg.dtype != "int":                  # FP codes: their fixed-point values
            lanes_x = [_fixed_x(m, lane.as_unsigned(), cfg.dtype, f"x_{l}")
                       for l, lane in enumerate(lanes_x)]
        product_width = len(lanes_x[0]) + cfg.w_width
        products = [[pipe.reg(
            (lanes_x[l] *
             read.data[l * row_bits + e * cfg.w_width:
                       l * row_bits + (e + 1) * cfg.w_width].as_signed())[:product_width]
            .as_signed(), f"product_{e}_{l}", reset_less=True) for l in range(L)]
            for e in range(E)]
        products_valid = pipe.reg(beat_valid, "products_valid")
        products_final = pipe.reg(beat_final, "products_final")
        products_token = pipe.reg(beat_token, "products_token")
        products_scale = pipe.reg(beat_scale, "products_scale") if floating else None
        beat_sums = [pipe.reg(sum(products[e]).as_signed(), f"beat_sum_{e}") for e in range(E)]
        sums_valid = pipe.reg(products_valid, "sums_valid")
        sums_final = pipe.reg(products_final, "sums_final")
        sums_token = pipe.reg(products_token, "sums_token")
        sums_scale = pipe.reg(products_scale, "sums_scale") if floating else None
        # The accumulators; a final beat's totals are registered, their codes made in the next
        # stage (the wide add and the requantization do not fit in one cycle).
        totals = []
        for e in range(E):
            total = Signal(signed(cfg.acc_width), name=f"sum_{e}")
            m.d.comb += total.eq(acc[e] + beat_sums[e])
            pipe.add(acc[e].eq(Mux(sums_valid, Mux(sums_final, 0, total), acc[e])))
            totals.append(pipe.reg(total, f"total_{e}"))
        pipe.add(totals_final.eq(sums_valid & sums_final))
        totals_token = pipe.reg(sums_token, "totals_token")
        totals_scale = pipe.reg(sums_scale, "totals_scale") if floating else None
        final_stage, final_token = totals_final, totals_token
        if fp32_scale:
            # An FP32 scale (golden.moe_layer.gate_scale): the totals times its signed 24-bit
            # significand, registered (a 48 x 25 multiply has a cycle of its own), its
            # exponent beside them; an infinity as the largest finite value, NaN as 0.
            nan, inf, sign, mantissa, exponent = fp_fields(
                m, totals_scale, golden_fp.FORMATS["fp32"], "x_scale")
            largest_m, largest_x = golden.FP32_LARGEST
            magnitude = Mux(inf, largest_m, mantissa)
            multiplier = Signal(signed(len(mantissa) + 1), name="x_scale_multiplier")
            m.d.comb += multiplier.eq(Mux(nan, 0, Mux(sign, -magnitude, magnitude)))
            totals = [pipe.reg((total * multiplier).as_signed(), f"scaled_{e}")
                      for e, total in enumerate(totals)]
            scaled_exponent = pipe.reg(Mux(inf, largest_x, exponent), "scaled_exponent")
            pipe.add(scaled_final.eq(totals_final))
            final_stage = scaled_final
            final_token = pipe.reg(totals_token, "scaled_token")
        pipe.emit(m)
        with m.If(scores.ready):
            m.d.sync += scores.valid.eq(0)
        if floating:
            # The scale's exponent x (E8M0: c - 127; FP32: beside the product, above) moves the
            # rounding by x bits (golden.moe_layer.scaled_requant): the total is shifted up by
            # A = score_width + 1 first, so that the run-time right shift u = score_shift - x
            # + A is never negative once clamped at 0 (a larger left shift saturates as A
            # does) and at W + A + 1, W the total's bits (a larger one rounds to 0 as that one
            # does). A NaN scale makes the totals 0 (FP32: a zero multiplier, above).
            up = cfg.score_width + 1
            width = len(totals[0])
            exponent, offset = ((scaled_exponent, 0) if fp32_scale
                                else (totals_scale, UNIT_SCALE))   # (x = c - 127)
            amount = Signal(signed(11), name="score_shift_amount")
            shift = Signal(range(width + up + 2), name="score_shift_scaled")
            m.d.comb += [amount.eq(cfg.score_shift + offset + up - exponent),
                         shift.eq(Mux(amount < 0, 0, Mux(amount > width + up + 1,
                                                         width + up + 1, amount)))]
            nan_scale = Const(0) if fp32_scale else totals_scale == NAN_SCALE
        with m.If(advance & final_stage):
            bias = 1 << (cfg.score_width - 1)
            for e, total in enumerate(totals):
                if floating:
                    raised = Signal(signed(len(total) + up), name=f"raised_{e}")
                    m.d.comb += raised.eq(Mux(nan_scale, 0, total << up))
                    code = requant(m, raised, shift, cfg.score_width, f"code_{e}")
                else:
                    code = requant(m, total, cfg.score_shift, cfg.score_width, f"code_{e}")
                m.d.sync += scores.payload.score[e].eq(code + bias)
            m.d.sync += [scores.valid.eq(1), scores.payload.token.eq(final_token)]

        # Packet former: one route at a time, H header flits then B x flits.
        route = router.route
        m.d.comb += [table_reads[j].addr.eq(route.payload.score[j]) for j in range(cfg.k)]
        active = Signal()
        flit = Signal(range(H + B))
        token = Signal(cfg.token_width)
        mask = Signal(cfg.leaves)
        entries = [Signal(cfg.data_width, name=f"entry_{j}") for j in range(cfg.k)]
        if cfg.shared:                                 # expert E, the largest gate weight
            entries.append(Const((cfg.experts << cfg.gate_width) | ((1 << cfg.gate_width) - 1),
                                 cfg.data_width))
        if floating:               # x's scale, from the FIFO's head, low bits first
            dw = cfg.data_width
            entries += [fifo.r_data[x_bits + p * dw:min(x_bits + (p + 1) * dw, x_bits + SB)]
                        for p in range(cfg.scale_entries)]
        out = self.packet
        in_header = flit < H
        last_flit = flit == H + B - 1
        sent = out.valid & out.ready
        # (A token's beats are all in the FIFO before its route exists; floating point reads
        # the scale there, so its header waits for the FIFO too, which never holds it back.)
        m.d.comb += [out.valid.eq(active & (fifo.r_rdy if floating else in_header | fifo.r_rdy)),
                     out.payload.token.eq(token), out.payload.mask.eq(mask),
                     out.payload.last.eq(last_flit),
                     fifo.r_en.eq(sent & ~in_header),
                     route.ready.eq(~active | (sent & last_flit))]
        for lane in range(L):
            header = select(flit, [entries[j * L + lane] if j * L + lane < len(entries)
                                   else Const(0)
                                   for j in range(H)])
            element = fifo.r_data[lane * cfg.in_width:(lane + 1) * cfg.in_width]
            if cfg.dtype == "int":
                element = element.as_signed()
            # A header lane carries the entry's bits; an x lane its element, sign-extended
            # (an FP8 code: zero-extended).
            m.d.comb += out.payload.data[lane].eq(Mux(in_header, header, element))
        with m.If(sent):
            m.d.sync += flit.eq(flit + 1)
            with m.If(last_flit):
                m.d.sync += [active.eq(0), flit.eq(0)]
        with m.If(route.valid & route.ready):
            m.d.sync += [active.eq(1), flit.eq(0), token.eq(route.payload.token),
                         mask.eq(route.payload.mask | (1 << cfg.shared_leaf) if cfg.shared
                                 else route.payload.mask)]
            for j in range(cfg.k):
                m.d.sync += entries[j].eq(Cat(table_reads[j].data, route.payload.expert[j]))
        return m


register(Block(
    name="moe_gate", family="moe_layer", config=MoEGateConfig, build=MoEGate,
    figures=lambda cfg: {
        "beats_per_token": cfg.beats, "flits_per_token": cfg.header_flits + cfg.beats,
        "router_latency_cycles": golden_router.pipeline_latency(cfg.k, cfg.groups,
                                                                cfg.topk_groups)},
    summary="MoE layer root: gate scores, node-limited top-k, gate weights, NoP dispatch packets",
    demo_configs=({},),
    area_unit="expert", operation="MAC", area_units=lambda cfg: cfg.experts,
    legend=("tokens per cycle against the packet port's bound 1/(header + x flits) "
            "with every port saturated"),
))


# --------------------------------------------------------------------------------------------
# expert_chiplet: a leaf of the layer's NoP tree.
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ExpertChipletConfig(PacketShape):
    """Parameters of ``expert_chiplet`` (one leaf of the layer; contract in
    docs/blocks/moe_layer.md).

    Parameters
    ----------
    experts, k, leaves, token_width, lanes, data_width, gate_width
        The dispatch packet's shape, as ``moe_gate`` sends it (E, k, mask bits, token bits, L,
        lane bits, gate bits).
    combine_width : int
        Bits of a return lane (the NoP's ``acc_width``).
    slots : int
        S, experts this chiplet can hold (1..8).
    d_model, d_ff : int
        D and F of an expert FFN (1..64 each).
    in_width : int
        Bits of an x, activation and h element: 2..10 signed integers (the activation table
        has 2**in_width entries), or the floating-point ``dtype``'s width (8, BF16 16).
    w_width : int
        Bits of a signed FFN weight (2..16).
    acc_width : int
        Bits of the systolic tile's wrapping accumulators (8..48).
    shift_g, shift_u, shift_h, gate_shift : int
        Requantization shifts (0..47): gate and up projections to ``in_width``, their product
        to h, the gate-weighted sum to ``combine_width``.
    rows, cols, arrays : int
        The systolic tile: R token rows, C output columns, n arrays (K split n ways);
        n * C <= 32 (one scratchpad access per weight beat).
    batch : int
        Tokens collected before the chiplet computes (1..32).
    batch_wait : int
        Idle cycles after which a partial batch is computed, once the planner is free to take
        it (1..255).
    queue_tokens : int
        Dispatch packets the input queue holds while a batch is computed (0..32; 0: none).
    token_banks : int
        Banks of ``batch`` token slots (1..3), used in turn: while one bank's batch is
        computed, the next bank collects and a finished one returns its tokens.
    dtype : str
        The expert datapath: ``int`` (the default: the integer datapath above), or
        ``fp8_e4m3``/``fp8_e5m2``/``bf16``: x, weights, activations and h are codes of it
        (in_width and w_width its width, 8 or 16), the tile's PEs floating point
        (``acc_frac``, ``promote_every``; ``scale_format`` scales: x's from its packet's last
        header entries, each weight block's from its load), the shifts powers of two folded
        into each rounding; the activation table indexed by a code's top ``ACT_INDEX_BITS``
        (12) bits (all of an FP8 code).
    acc_frac, promote_every : int
        Floating point: the tile's accumulator fraction bits and promotion interval.
    scale_format : str
        Floating point: the scales' format, ``e8m0`` (a promotion's scaling an exponent add)
        or ``fp32`` (the tile's PEs multiply by them; x's scale in ceil(32 / data_width)
        header entries).
    combine_dtype : str
        The return lanes: ``int`` (signed ``combine_width`` bits) with an int ``dtype``;
        ``bf16`` or ``fp32`` codes (``combine_width`` 16 or 32) with a floating-point one.
    pe_stages : int
        The tile's integer PEs: registers from operands to adder (``systolic_tile``'s
        ``pe_stages``; each is an edge more from a group's last pair to its result rows).
    """
    experts: int = like_param(MoEGateConfig, "experts")
    k: int = like_param(MoEGateConfig, "k")
    leaves: int = like_param(MoEGateConfig, "leaves")
    token_width: int = like_param(MoEGateConfig, "token_width")
    lanes: int = like_param(MoEGateConfig, "lanes")
    data_width: int = like_param(MoEGateConfig, "data_width")
    gate_width: int = like_param(MoEGateConfig, "gate_width")
    combine_width: int = int_param(24, 2, 48, "bits of a return lane")
    slots: int = int_param(2, 1, 8, "S, experts held")
    d_model: int = int_param(8, 1, 64, "D, elements of a token")
    d_ff: int = int_param(8, 1, 64, "F, hidden elements of an expert")
    in_width: int = int_param(8, 2, 16, "bits of x, activation and h elements (int: 2..10)")
    w_width: int = int_param(8, 2, 16, "bits of an FFN weight")
    acc_width: int = int_param(32, 8, 48, "bits of the tile's wrapping accumulators")
    shift_g: int = int_param(6, 0, SHIFT_RANGE - 1, "gate projection to in_width shift")
    shift_u: int = int_param(6, 0, SHIFT_RANGE - 1, "up projection to in_width shift")
    shift_h: int = int_param(6, 0, SHIFT_RANGE - 1, "activation * up to h shift")
    gate_shift: int = int_param(8, 0, SHIFT_RANGE - 1, "gate-weighted sum to return shift")
    rows: int = int_param(4, 1, 16, "R, token rows of the systolic tile")
    cols: int = int_param(4, 1, 16, "C, output columns of the systolic tile")
    arrays: int = int_param(2, 1, 8, "n, arrays of the tile (K split n ways)")
    batch: int = int_param(8, 1, 32, "tokens per batch")
    batch_wait: int = int_param(16, 1, 255, "idle cycles that close a partial batch")
    queue_tokens: int = int_param(8, 0, 32, "packets the input queue holds (0: none)")
    token_banks: int = int_param(2, 1, 3, "banks of token slots: collect, compute, return")
    dtype: str = choice_param("int", ("int", "fp8_e4m3", "fp8_e5m2", "bf16"),
                              "expert datapath: integers, or FP8 or BF16 codes")
    acc_frac: int = like_param(SystolicTileConfig, "acc_frac")
    promote_every: int = like_param(SystolicTileConfig, "promote_every")
    scale_format: str = like_param(MoEGateConfig, "scale_format")
    combine_dtype: str = choice_param("int", ("int", "bf16", "fp32"),
                                      "return lanes: integers, or BF16/FP32 codes")
    pe_stages: int = like_param(SystolicTileConfig, "pe_stages")

    def __post_init__(self):
        validate(self)
        self._check_scale_format()
        self._check_float()
        if self.k > self.experts:
            raise param_error("k", self.k, f"an integer in 1..experts (1..{self.experts})")
        if self.data_width < self.in_width:
            raise param_error("data_width", self.data_width,
                              f"an integer in in_width..32 ({self.in_width}..32)")
        entry = ceil_log2(self.experts) + self.gate_width
        if self.data_width < entry:
            raise param_error("data_width", self.data_width,
                              f"at least expert bits + gate_width ({entry}): a header entry")
        if self.arrays * self.cols > 32:
            raise param_error("cols", self.cols,
                              f"at most 32 // arrays ({32 // self.arrays}): a weight beat is "
                              "one scratchpad access of arrays * cols lanes")
        if self._bank_depth() > 65536:
            raise param_error("slots", self.slots,
                              "fewer: the scratchpad would need more than 65536 words per bank "
                              f"({self._bank_depth()})")

    def _check_float(self):
        if self.dtype == "int":
            if self.in_width > INT_ACT_BITS:
                raise param_error("in_width", self.in_width,
                                  f"an integer in 2..{INT_ACT_BITS} with dtype 'int' (its "
                                  f"activation table has 2**in_width entries)")
            if self.combine_dtype != "int":
                raise param_error("combine_dtype", self.combine_dtype,
                                  "'int' with dtype 'int' (the return lanes are integers)")
            return
        code_width = golden_fp.FORMATS[self.dtype].width
        for name in ("in_width", "w_width"):
            if getattr(self, name) != code_width:
                raise param_error(name, getattr(self, name),
                                  f"{code_width} with dtype {self.dtype} (its elements are "
                                  "its codes)")
        if self.combine_dtype == "int":
            raise param_error("combine_dtype", self.combine_dtype,
                              f"'bf16' or 'fp32' with dtype {self.dtype}")
        width = golden_fp.FORMATS[self.combine_dtype].width
        if self.combine_width != width:
            raise param_error("combine_width", self.combine_width,
                              f"{width} with combine_dtype {self.combine_dtype} (its codes)")
        self.tile_config()                   # promote_every: the tile's rule

    def tile_config(self):
        """The systolic tile: integers of ``tile_width`` bits, or the FP PEs with
        ``scale_format`` scales (E8M0: a promotion's scaling an exponent add, no multiplier)."""
        extra = {} if self.dtype == "int" else {
            "dtype": self.dtype, "acc_frac": self.acc_frac,
            "promote_every": self.promote_every, "scale_format": self.scale_format}
        return SystolicTileConfig(rows=self.rows, cols=self.cols, arrays=self.arrays,
                                  in_width=self.tile_width, acc_width=self.acc_width,
                                  pe_stages=self.pe_stages, **extra)

    @property
    def schedule(self):
        """The sizes of the tile schedule (``golden.moe_layer.ChipletShape``)."""
        return golden.ChipletShape(d_model=self.d_model, d_ff=self.d_ff, rows=self.rows,
                                   cols=self.cols, arrays=self.arrays, dtype=self.dtype,
                                   pe_stages=self.pe_stages)

    @property
    def queue_flits(self):
        return self.queue_tokens * (self.header_flits + self.x_flits)

    @property
    def tile_width(self):
        return max(self.in_width, self.w_width)

    @property
    def act_index_bits(self):
        """Bits of an activation-table index: in_width, or a BF16 code's top 12
        (``golden.moe_layer.act_index_drop``)."""
        if self.dtype == "int":
            return self.in_width
        return self.in_width - golden.act_index_drop(self.dtype)

    def _banks(self):
        return 1 << ceil_log2(self.schedule.weight_lanes)

    def _bank_depth(self):
        words = -(-self.slots * self.schedule.expert_beats * self.schedule.weight_lanes
                  // self._banks())
        return max(2, 1 << ceil_log2(words))

    def pmu_config(self):
        """The weight scratchpad: V = n*C lanes, banks the next power of two (so the V
        consecutive words of a beat sit in V different banks: one access per beat), deep
        enough for S experts."""
        banks, depth = self._banks(), self._bank_depth()
        return PMUConfig(banks=banks, bank_depth=depth, elem_width=self.w_width,
                         lanes=self.schedule.weight_lanes, loops=1,
                         addr_width=ceil_log2(banks) + ceil_log2(depth))

    def nop_shape(self):
        """The flit fields ``hw.nop``'s layouts read (combine lanes are ``combine_width``)."""
        return types.SimpleNamespace(token_width=self.token_width, leaves=self.leaves,
                                     data_width=self.data_width, lanes=self.lanes,
                                     acc_width=self.combine_width,
                                     combine_dtype=self.combine_dtype)


SCALE_MATRICES = ("gate", "up", "down")      # an expert's weight blocks, one scale each


def weights_layout(config):
    """A weight beat: ``slot``, ``expert`` (read on a load's first beat), with a floating-point
    ``dtype`` ``scale`` (the ``scale_format`` codes of the expert's gate, up and down weight
    blocks, also read on the first beat), ``data`` (n*C signed weights or FP codes, the
    tile-order layout of ``golden.moe_layer.weight_beats``), ``last``."""
    scale = {} if config.dtype == "int" else {
        "scale": data.StructLayout({name: config.scale_bits for name in SCALE_MATRICES})}
    return data.StructLayout({
        "slot": max(1, ceil_log2(config.slots)),
        "expert": max(1, ceil_log2(config.experts)),
        **scale,
        "data": data.ArrayLayout(_element(config, config.w_width),
                                 config.schedule.weight_lanes),
        "last": 1})


def _element(config, width):
    """An x, weight or table element: a signed integer, or an FP8/BF16 code (unsigned bits)."""
    return signed(width) if config.dtype == "int" else unsigned(width)


def assign_layout(config):
    """An assignment: expert ``expert`` goes to ``slot``, its weights to follow."""
    return data.StructLayout({"slot": max(1, ceil_log2(config.slots)),
                              "expert": max(1, ceil_log2(config.experts))})


def act_lut_layout(config):
    return data.StructLayout({"index": config.act_index_bits,
                              "value": _element(config, config.in_width)})


class ExpertChiplet(TieredComponent):
    """The ``expert_chiplet`` block (contract: docs/blocks/moe_layer.md).

    Members
    -------
    down : In(stream)
        Dispatch flits (``hw.nop.down_layout``): the packets ``moe_gate`` sends, as a leaf of
        ``nop_tree`` receives them.
    up : Out(stream)
        Return flits (``hw.nop.up_layout`` with ``combine_width`` lanes): per token, H zero
        header flits then its gate-weighted sum over the experts held here.
    weights : In(stream)
        Weight loads: one expert into one slot, in tile order, ``slot`` and ``expert`` taken
        from the first beat.
    assign : In(stream)
        ``slot``, ``expert``: the slot is given the expert ahead of its weights (packets that
        choose the expert are taken; the planner waits for the load).
    act_lut : In(stream)
        ``index``, ``value``: one activation-table entry; always ready.
    error : Out(1)
        Sticky: a misframed packet or weight load, or a slot out of range.
    """

    def __init__(self, config, *, tier=None):
        """``tier="top"``: the logic alone, the scratchpad's banks as ports
        ``bottom__bank<b>__*`` (the 3D build, Mozart's logic die over its SRAM die)."""
        shape = config.nop_shape()
        super().__init__(config, {
            "down": In(stream.Signature(down_layout(shape))),
            "up": Out(stream.Signature(up_layout(shape))),
            "weights": In(stream.Signature(weights_layout(config))),
            "assign": In(stream.Signature(assign_layout(config))),
            "act_lut": In(stream.Signature(act_lut_layout(config))),
            "error": Out(1),
        }, banks_signature(config.pmu_config()), tier)

    def elaborate(self, platform):
        m = Module()
        cfg, shape = self.config, self.config.schedule
        S, R, C, n = cfg.slots, cfg.rows, cfg.cols, cfg.arrays
        D, F, L, T = cfg.d_model, cfg.d_ff, cfg.lanes, cfg.batch
        H, X = cfg.header_flits, cfg.x_flits
        Ks, Kf, cF, cD, V = shape.k_x, shape.k_h, shape.f_chunks, shape.d_chunks, \
            shape.weight_lanes
        iw = cfg.in_width
        error = Signal()
        m.d.comb += self.error.eq(error)

        def select_rows(index, banks):
            """``banks[index]`` element by element, for equally nested lists of values."""
            if isinstance(banks[0], list):
                return [select_rows(index, [bank[i] for bank in banks])
                        for i in range(len(banks[0]))]
            return select(index, banks)

        floating = cfg.dtype != "int"
        if floating:
            code_fmt, fp32 = golden_fp.FORMATS[cfg.dtype], golden_fp.FORMATS["fp32"]
        # The tile's output is always taken (below): no output queue, no stall.
        tile = m.submodules.tile = SystolicTile(cfg.tile_config(), always_ready=True)
        # The tile's `a` beats leave from a register slice: the token and beat selects that
        # build a beat and the wire to the tile's multipliers are then in different cycles
        # (the clock rate). A beat carries whether it ends its phase: the phase leaves the plan
        # when the executor moves past it, but counts as planned until the tile takes that beat.
        # Floating point: a beat also carries the E8M0 scale of the weight block its b beat
        # belongs to. The tile takes an a beat and a b beat together (its join), so the b
        # beat the tile takes beside this a beat gets that scale (the b beats come from the
        # scratchpad's read queue, which does not know their phase).
        # Behind the register slice, a skid slice: the register slice's ready, and so the
        # executor's, is then of registers alone (clock rate: the tile's take ran back into the
        # executor's counters, the plan's head and the descriptors). The skid keeps a beat the
        # tile did not take while the register slice takes the next: the tile takes beats at
        # the same edges as behind the register slice alone; only the executor moves on
        # earlier.
        w_scale_field = {"w_scale": cfg.scale_bits} if floating else {}
        beat_layout = data.StructLayout({
            "beat": tile.a.payload.shape(), "phase_last": 1, **w_scale_field})
        a_slice = m.submodules.a_slice = RegisterSlice(beat_layout)
        a_skid = m.submodules.a_skid = SkidSlice(beat_layout)
        wiring.connect(m, a_slice.o, a_skid.i)
        m.d.comb += [tile.a.valid.eq(a_skid.o.valid), tile.a.payload.eq(a_skid.o.payload.beat),
                     a_skid.o.ready.eq(tile.a.ready)]
        # Phases whose last beat waits in the slices (0 to 2, from registers): they count as
        # planned until the tile takes that beat.
        last_in_slice = a_slice.o.valid & a_slice.o.payload.phase_last
        last_in_skid = a_skid.full & a_skid.kept.phase_last
        phase_in_slice = last_in_slice | last_in_skid
        pmu_cfg = cfg.pmu_config()
        # Every job is V consecutive words per access (read_job below): no conflict logic.
        pmu = m.submodules.scratchpad = PMU(pmu_cfg, tier=self.tier, contiguous=True)
        if self.tier == "top":
            wiring.connect(m, pmu.bottom, wiring.flipped(self.bottom))
        with m.If(pmu.error | tile.error):
            m.d.sync += error.eq(1)

        def read_job(job, base, beats):
            """A contiguous job: ``beats`` accesses of V consecutive words from ``base``."""
            return [job.base.eq(base), job.bounds[0].eq(beats), job.strides[0].eq(V),
                    job.lane_stride.eq(1), job.pred_lo.eq(0),
                    job.pred_hi.eq(pmu_cfg.banks * pmu_cfg.bank_depth), job.diagonal.eq(0),
                    job.row_shift.eq(0), job.wait_other.eq(0),
                    *[job.bank_pos[b].eq(b) for b in range(pmu_cfg.bank_bits)]]

        # --- activation table: 2**in_width signed entries, zero at start-up, kept through reset
        # (floating point: indexed by a code's top act_index_bits, golden.moe_layer.activation)
        # A table of up to 256 entries is marked for LUT RAM on ECP5 (hw.pipeline.LUT_RAM_MARK),
        # its registered read a fabric flip-flop (clock rate: a block RAM's read, 5.8 ns from
        # its clock, fed the DSP of the activation times u, 3.5 ns of setup, in one cycle); a
        # larger one (BF16's 4,096) stays block RAM. A mark, not `ram_style` itself, which
        # Yosys refuses on iCE40 (no LUT RAM there) and a user's own flow may not want.
        depth = 1 << cfg.act_index_bits
        lut = m.submodules.act_table = Memory(
            shape=_element(cfg, iw), depth=depth, init=[],
            attrs={LUT_RAM_MARK: 1} if depth <= LUT_RAM_ENTRIES else None)
        lut_write = lut.write_port()
        m.d.comb += [self.act_lut.ready.eq(1), lut_write.en.eq(self.act_lut.valid),
                     lut_write.addr.eq(self.act_lut.payload.index),
                     lut_write.data.eq(self.act_lut.payload.value)]

        # --- state ---
        # Token banks, used in turn (ring pointers): the collector fills bank `c_bank`, the
        # planner computes bank `r_bank`, the emitter returns bank `e_bank`. A bank is FREE
        # (collectable), CLOSED (a batch to compute) or COMPUTED (a batch to return).
        NB = cfg.token_banks
        FREE, CLOSED, COMPUTED = 0, 1, 2
        bank_state = [Signal(2, name=f"bank_state_{b}") for b in range(NB)]
        c_bank, r_bank, e_bank = (Signal(range(NB), name=n) for n in ("c_bank", "r_bank",
                                                                      "e_bank"))

        def next_bank(bank):
            return Mux(bank == NB - 1, 0, bank + 1)

        running, draining, emitting = (Signal(name=s) for s in (
            "running", "draining", "emitting"))
        # The collecting bank is free: a register, loaded below with its value after the edge
        # (clock rate: the bank-state select began the paths through `taken`). Reset: every
        # bank free.
        collecting = Signal(init=1, name="collecting")
        bank_count = [Signal(range(T + 1), name=f"count_{b}") for b in range(NB)]
        count = Signal(range(T + 1))                   # tokens held in the collecting bank
        m.d.comb += count.eq(select(c_bank, bank_count))
        in_packet = Signal()
        flit = Signal(range(H + X + 1))
        idle = Signal(range(cfg.batch_wait + 1))

        # Expert slots: the global expert each is assigned ("tags", by an `assign` write or a
        # load's first beat) and whether its weights are in ("loaded", from the edge of its
        # load's last beat); kept through reset like the scratchpad.
        tags = [Signal(ceil_log2(cfg.experts) or 1, name=f"tag_{s}", reset_less=True)
                for s in range(S)]
        tag_set = [Signal(name=f"tag_set_{s}", reset_less=True) for s in range(S)]
        loaded = [Signal(name=f"loaded_{s}", reset_less=True) for s in range(S)]
        # Floating point: each slot's weight-block scales (gate, up, down), from its load's
        # first beat; unit at start-up, kept through reset like the weights.
        w_scales = [[Signal(cfg.scale_bits, init=cfg.unit_scale, name=f"w_scale_{s}_{name}",
                            reset_less=True)
                     for name in SCALE_MATRICES] for s in range(S)] if floating else []

        # Per token of the batch: id, x, the gate-weighted sums.
        product_bits = cfg.acc_width + cfg.gate_width + 1
        sum_bits = product_bits + ceil_log2(min(cfg.k, S) + 1)
        # Token t of bank b is slot b*T + t.
        TT = NB * T
        tok_id = [Signal(cfg.token_width, name=f"token_{t}", reset_less=True) for t in range(TT)]
        x = [[Signal(signed(iw), name=f"x_{t}_{d}", reset_less=True) for d in range(D)]
             for t in range(TT)]
        # (floating point: x's scale, the packet's last header entries)
        x_scale = [Signal(cfg.scale_bits, name=f"x_scale_{t}", reset_less=True)
                   for t in range(TT)] if floating else []
        # (floating point: FP32 codes, +0 when a token arrives)
        sum_shape = unsigned(32) if floating else signed(sum_bits)
        sums = [[Signal(sum_shape, name=f"sum_{t}_{d}", reset_less=True)
                 for d in range(D)] for t in range(TT)]
        # The slots the packet being collected chose so far (its header flits taken before
        # this one; read only within the packet, so one register serves every token slot).
        chosen = Signal(S, name="packet_chosen", reset_less=True)
        # The gates the packet being collected gave each slot so far (one register serves every
        # token slot, as `chosen` does).
        packet_gate = [Signal(cfg.gate_width, name=f"packet_gate_{s}", reset_less=True)
                       for s in range(S)]
        # Per bank and expert slot: the token slots that chose it, in arrival order, and the
        # gate each gave it (kept beside the member, not per token slot: the planner reads both
        # at a group's position side by side instead of the gate through the member; clock
        # rate: that chain into the plan queue was the chiplet's critical path).
        members = [[[Signal(range(TT), name=f"member_{b}_{s}_{p}", reset_less=True)
                     for p in range(T)] for s in range(S)] for b in range(NB)]
        member_gates = [[[Signal(cfg.gate_width, name=f"member_gate_{b}_{s}_{p}",
                                 reset_less=True)
                          for p in range(T)] for s in range(S)] for b in range(NB)]
        members_len = [[Signal(range(T + 1), name=f"members_len_{b}_{s}") for s in range(S)]
                       for b in range(NB)]

        # --- slot assignment and weight loads, while tokens are collected and computed ---
        # A slot no held token has chosen may be assigned or loaded at any time; a slot that
        # held tokens chose but whose weights are not in yet may be loaded (the planner waits
        # for it). That is double buffering: one slot loads while another one computes.
        slot_index = Signal(range(TT))                 # the token slot the collector fills
        # A held token chose the slot: a register, loaded with its next value (below; clock
        # rate: the member counts' compares with 0 began the path through the load and
        # assignment decisions and the header match into the member registers).
        referenced = Signal(S)
        loading, discarding = Signal(), Signal()
        load_slot = Signal(range(S))
        load_beat = Signal(range(shape.expert_beats))
        beats_end = load_beat == shape.expert_beats - 1
        wload = self.weights
        slot_ok = wload.payload.slot < S
        w_slot = wload.payload.slot
        startable = ~select(w_slot, list(referenced)) | ~select(w_slot, loaded)
        # No weight beat or assignment is taken at a reset edge: the tags, `loaded` and the
        # scales, kept through reset, would take it while the scratchpad's write pipeline
        # forgets it (a load's last beat there left the slot marked loaded, one word stale).
        in_reset = ResetSignal()
        m.d.comb += [pmu.wjob.valid.eq(wload.valid & ~loading & ~discarding & slot_ok &
                                       startable & ~in_reset),
                     *read_job(pmu.wjob.payload, w_slot * (shape.expert_beats * V),
                               shape.expert_beats),
                     pmu.w.valid.eq(wload.valid & loading & ~in_reset),
                     pmu.w.payload.last.eq(beats_end)]
        m.d.comb += [pmu.w.payload.data[v].eq(wload.payload.data[v]) for v in range(V)]
        m.d.comb += wload.ready.eq(((loading & pmu.w.ready) | discarding |
                                    (~loading & ~slot_ok)) & ~in_reset)
        load_start = pmu.wjob.valid & pmu.wjob.ready
        with m.If(load_start):
            m.d.sync += [loading.eq(1), load_slot.eq(w_slot), load_beat.eq(0)]
            # A slot that held tokens chose gets the weights of another expert: misuse.
            with m.If(select(w_slot, list(referenced)) &
                      (select(w_slot, tags) != wload.payload.expert)):
                m.d.sync += error.eq(1)
            for s in range(S):
                with m.If(w_slot == s):
                    m.d.sync += [tags[s].eq(wload.payload.expert), tag_set[s].eq(1),
                                 loaded[s].eq(0)]
                    if floating:
                        m.d.sync += [scale.eq(wload.payload.scale[name])
                                     for scale, name in zip(w_scales[s], SCALE_MATRICES)]
        with m.If(pmu.w.valid & pmu.w.ready):
            m.d.sync += load_beat.eq(load_beat + 1)
            with m.If(wload.payload.last != beats_end):
                m.d.sync += error.eq(1)
            with m.If(beats_end):
                m.d.sync += loading.eq(0)
                for s in range(S):
                    with m.If(load_slot == s):
                        m.d.sync += loaded[s].eq(1)
        # A load into a slot that does not exist is taken and dropped up to its `last`.
        with m.If(wload.valid & wload.ready & ~loading):
            with m.If(discarding | ~slot_ok):
                m.d.sync += [error.eq(1), discarding.eq(~wload.payload.last)]
        # An assignment: the slot takes the expert id and waits for its weights. It waits while
        # held tokens chose the slot or the slot is loading; a slot past S: dropped, error.
        assign = self.assign
        a_slot_ok = assign.payload.slot < S
        a_slot = assign.payload.slot
        m.d.comb += assign.ready.eq((~a_slot_ok | ~(select(a_slot, list(referenced)) |
                                                    (loading & (load_slot == a_slot)) |
                                                    (pmu.wjob.valid & (w_slot == a_slot))))
                                    & ~in_reset)
        assign_fire = assign.valid & assign.ready & a_slot_ok
        with m.If(assign.valid & ~a_slot_ok):
            m.d.sync += error.eq(1)
        with m.If(assign_fire):
            for s in range(S):
                with m.If(a_slot == s):
                    m.d.sync += [tags[s].eq(assign.payload.expert), tag_set[s].eq(1),
                                 loaded[s].eq(0)]
        # The tags a header flit taken at this edge is matched against: an assignment or a
        # load starting at this edge already counts (a load over an assignment), so a packet
        # never chooses a slot for the expert it is losing. Each entry is compared with all
        # three (the tag, the assignment's, the load's), and whether an assignment or a load
        # starts picks among the results last (clock rate: that decision comes late, from the
        # slots' member counts, and picking the tag before the compare put the compare after it
        # on the path into the member registers).
        # Per slot, each a flat AND of early terms, the same as `assign_fire & (a_slot == s)`
        # and `load_start & (w_slot == s)` (clock rate: through the selects of `referenced` by
        # w_slot and a_slot, the chain in front of the header match was 13 levels deep). They
        # repeat the rules of `pmu.wjob.valid` and `assign.ready` above: a change to one is a
        # change to both. (Those two as ORs of these terms placed worse: 76.3 MHz at seed 1,
        # 214 LUTs more, 2026-12-04.)
        load_valid_at = [wload.valid & ~loading & ~discarding & ~in_reset & (w_slot == s) &
                         ~(referenced[s] & loaded[s]) for s in range(S)]
        loaded_here = [load_valid_at[s] & pmu.wjob.ready for s in range(S)]
        assigned_here = [assign.valid & (a_slot == s) & ~referenced[s] & ~in_reset &
                         ~(loading & (load_slot == s)) & ~load_valid_at[s] for s in range(S)]

        def matches(s, expert):
            return Mux(loaded_here[s], wload.payload.expert == expert,
                       Mux(assigned_here[s], assign.payload.expert == expert,
                           tag_set[s] & (tags[s] == expert)))

        # --- collect: take packets into the batch ---
        # The input queue holds up to `queue_tokens` packets while a batch is computed, so the
        # tree above keeps dispatching to the other chiplets.
        down = stream.Signature(self.down.payload.shape()).flip().create(path=("inbox",))
        if cfg.queue_flits:
            # Its head is a register (SyncFIFO's timing): a header flit's entries are matched
            # with the slots' tags in the cycle they are taken (clock rate: a LUT-RAM read
            # in front of that match, on the path into the member registers).
            queue = m.submodules.queue = RegisteredHeadFIFO(
                width=len(self.down.payload.as_value()), depth=cfg.queue_flits)
            m.d.comb += [queue.w_en.eq(self.down.valid), queue.w_data.eq(self.down.payload),
                         self.down.ready.eq(queue.w_rdy), down.valid.eq(queue.r_rdy),
                         down.payload.eq(queue.r_data), queue.r_en.eq(down.ready)]
        else:
            wiring.connect(m, wiring.flipped(self.down), down)
        m.d.comb += down.ready.eq(collecting)
        taken = down.valid & down.ready
        m.d.comb += slot_index.eq(c_bank * T + count)
        first = flit == 0
        # Slots this flit's header entries choose (or-ed into the token's earlier choices).
        hits = Signal(S)
        hit_gate = [Signal(cfg.gate_width, name=f"hit_gate_{s}") for s in range(S)]
        header_index = Signal(range(H + X + 1))
        m.d.comb += header_index.eq(flit)
        for j in range(cfg.k):
            entry = down.payload.data[j % L].as_unsigned()
            expert = entry[cfg.gate_width:cfg.gate_width + (ceil_log2(cfg.experts) or 1)]
            here = header_index == j // L
            for s in range(S):
                with m.If(here & matches(s, expert)):
                    m.d.comb += [hits[s].eq(1), hit_gate[s].eq(entry[:cfg.gate_width])]
        current_chosen = Signal(S)
        # The choices of the packet's flits before this one: those its end writes into the
        # member lists. A packet of H + X flits ends on an x flit, which chooses nothing, so
        # they are all its choices; a short packet's final flit's entries are left unchosen
        # (misuse, docs/blocks/moe_layer.md; clock rate: the header match fed the member
        # registers' enables through the tags' same-edge assignment and load, 11 levels).
        earlier_chosen = Signal(S)
        m.d.comb += [earlier_chosen.eq(Mux(first, 0, chosen)),
                     current_chosen.eq(hits | earlier_chosen)]
        packet_end = taken & down.payload.last
        # A slot's sums are cleared at the edge after its packet's first flit, from a register
        # (clock rate: the slot compare fanned out into every sum's clear); nothing adds to
        # them until its batch is computed, after the packet's last flit.
        clear_sums = Signal(TT)
        m.d.sync += clear_sums.eq(Cat(*[taken & first & (slot_index == t) for t in range(TT)]))
        for t in range(TT):
            with m.If(clear_sums[t]):
                m.d.sync += [v.eq(0) for v in sums[t]]
        with m.If(taken):
            m.d.sync += [flit.eq(Mux(flit == H + X, flit, flit + 1)), in_packet.eq(1),
                         idle.eq(0)]
            with m.If(down.payload.last != (flit == H + X - 1)):
                m.d.sync += error.eq(1)
            m.d.sync += chosen.eq(current_chosen)
            for s in range(S):
                with m.If(hits[s]):
                    m.d.sync += packet_gate[s].eq(hit_gate[s])
            for t in range(TT):
                with m.If(slot_index == t):
                    with m.If(first):
                        m.d.sync += [tok_id[t].eq(down.payload.token),
                                     *[v.eq(0) for v in x[t]]]
                    for b in range(X):
                        with m.If(flit == H + b):
                            for lane in range(L):
                                if b * L + lane < D:
                                    m.d.sync += x[t][b * L + lane].eq(
                                        down.payload.data[lane][:iw])
                    if floating:         # (unit in a packet that ends before its entries)
                        with m.If(first):
                            m.d.sync += x_scale[t].eq(cfg.unit_scale)
                        dw, SE = cfg.data_width, cfg.scale_entries
                        for p in range(SE):   # piece p: entry k' + p, bits p*dw and up
                            entry = cfg.header_entries - SE + p
                            bits = min(dw, cfg.scale_bits - p * dw)
                            with m.If(flit == entry // L):
                                m.d.sync += x_scale[t][p * dw:p * dw + bits].eq(
                                    down.payload.data[entry % L][:bits])
        close = Signal()                               # the collecting bank's batch closes
        # The planner is free to take a bank at this edge (the edge it finishes draining
        # included), and the next bank it takes is `r_next`.
        drain_end = Signal()
        run_free = (~running & ~draining) | drain_end
        r_next = Mux(drain_end, next_bank(r_bank), r_bank)  # (the one draining is done)
        with m.If(packet_end):
            m.d.sync += [flit.eq(0), in_packet.eq(0)]
            for b in range(NB):
                with m.If(c_bank == b):
                    m.d.sync += bank_count[b].eq(count + 1)
                    for s in range(S):
                        with m.If(earlier_chosen[s]):
                            m.d.sync += members_len[b][s].eq(members_len[b][s] + 1)
                            for p in range(T):
                                with m.If(members_len[b][s] == p):
                                    m.d.sync += [members[b][s][p].eq(slot_index),
                                                 member_gates[b][s][p].eq(
                                                     packet_gate[s])]
            m.d.comb += close.eq(count + 1 == T)
        with m.Elif(collecting & (count != 0) & ~in_packet & ~taken):
            # A partial batch closes after `batch_wait` idle cycles, but only when the planner
            # would take it at once: while the tile is busy the batch keeps growing, so its
            # groups fill up and each expert's weights serve more tokens (work-conserving).
            waited = idle == cfg.batch_wait - 1
            with m.If(~waited):
                m.d.sync += idle.eq(idle + 1)
            with m.Elif(run_free & (r_next == c_bank)):
                m.d.comb += close.eq(1)
                m.d.sync += idle.eq(0)
        with m.If(close):
            m.d.sync += c_bank.eq(next_bank(c_bank))
            for b in range(NB):
                with m.If(c_bank == b):
                    m.d.sync += bank_state[b].eq(CLOSED)
        # The planner takes the next closed bank as soon as it is free: a bank closing at this
        # edge when none waits before it.
        r_closed = select(r_next, [st == CLOSED for st in bank_state]) & \
            ~(drain_end & (r_next == r_bank))
        start_run = run_free & (r_closed | (close & (c_bank == r_next)))

        # --- run: a planner lists the tile phases, an executor feeds them to the tile ---
        # Groups of up to R tokens of one slot, slot by slot. A group has a "gu" phase (F/C
        # gate tiles then F/C up tiles of K = ceil(D/n) beats over x) and a "down" phase (D/C
        # tiles of K = ceil(F/n) beats over h). Phases run gu(0), gu(1), down(0), gu(2),
        # down(1), ..., down(last): while group g's last gate/up rows come back, group g+1's
        # gu keeps the tile busy; h is double-buffered by group parity. Each phase's weights are
        # one contiguous scratchpad read job, queued as soon as the phase is planned.
        phase_layout = data.StructLayout({
            "down": 1, "parity": 1, "rows": range(R + 1),
            "base": range(S * shape.expert_beats * V + 1),
            "token": data.ArrayLayout(range(TT), R),
            # Row i's token one-hot, 0 for a row past the group's tokens and in a down phase:
            # the beat build's x select is then an AND-OR of registers (clock rate: decoding
            # the head's token and comparing its rows came first, 9 levels into the slice).
            "pick": data.ArrayLayout(TT, R),
            "gate": data.ArrayLayout(cfg.gate_width, R),
            **({"slot": range(S)} if floating else {})})  # (its weight blocks' scales)
        # The plan's head is a register (SyncFIFO's timing): its fields select each tile row's
        # token and activations (clock rate: a LUT-RAM read in front of those selects).
        plan = m.submodules.plan = RegisteredHeadFIFO(width=phase_layout.size, depth=PLAN_DEPTH)
        jobs = m.submodules.jobs = SyncFIFO(width=phase_layout.size, depth=PLAN_DEPTH)

        # Tiles given to the tile whose last result row is not written yet: all of them, and
        # those of gu phases per h buffer (a down phase starts when its buffer's count is 0).
        tree = ceil_log2(n)
        in_flight = Signal(range(C + R + tree + 7 + golden.RESULT_STAGES))
        gu_flight = [Signal(range(C + R + tree + 7 + golden.RESULT_STAGES),
                            name=f"gu_flight_{q}") for q in range(2)]
        # A tile given at the last edge, counted at the next (clock rate: the tile's take,
        # through the a slice's ready, led the path into the counters' adders); a count is
        # idle when it and its `given` are both 0.
        tile_given = Signal()
        gu_given = [Signal(name=f"gu_given_{q}") for q in range(2)]
        gu_idle = [(gu_flight[q] == 0) & ~gu_given[q] for q in range(2)]
        slot = Signal(range(S))
        group = Signal(range(T + R + 1))               # index into the slot's members
        parity = Signal()                              # of the next group found
        planned_all = Signal()
        held = Signal(phase_layout)                    # a group whose down is not planned yet
        held_valid = Signal()
        fresh = Signal(phase_layout)                   # the group whose gu was just planned
        want_down = Signal()                           # plan held's down now, then hold fresh
        found = Signal(phase_layout)
        # The current slot's members not yet planned (its member count less `group`, 0 once
        # every group is planned), a register (clock rate: the run bank's and the slot's selects
        # of the member counts and their compare with `group` began the planner's path into the
        # plan queue, 10 levels). While the planner is not running it follows slot 0's count in
        # the bank the planner takes next, as the edge leaves it (below); while it runs, the run
        # bank's counts hold (the bank is closed: no packet ends in it, no return clears it).
        left = Signal(range(T + 1))
        run_counts = select_rows(r_bank, members_len)  # [slot]
        m.d.comb += [found.down.eq(0), found.parity.eq(parity),
                     found.rows.eq(Mux(left > R, R, left)),
                     found.base.eq(slot * (shape.expert_beats * V))]
        if floating:
            m.d.comb += found.slot.eq(slot)
        run_members = select_rows(r_bank, members)      # [slot][position] of the run bank
        run_gates = select_rows(r_bank, member_gates)

        def row_select(is_token, i, values):
            """``values[t]`` for the token slot t that ``is_token(t)`` holds for, for tile row
            i, whose token is a slot's member at a position g + i: members are kept in arrival
            order and a bank fills its token slots in order, so that token's index within its
            bank is at least i. The slots below it are left out of the select (dead logic
            otherwise: area, and mutants no test can reach). A row past the group's tokens may
            select a stale member by its token: the caller masks it (its `pick` is 0)."""
            return or_tree([Mux(is_token(t), value, 0) for t, value in enumerate(values)
                            if t % T >= i] or [Const(0)])

        def at_position(i, lists):
            """``lists[slot][group + i]``, the value tile row i reads. `group` steps by R, so
            row i only ever reads positions g + i, g a multiple of R: no select term (dead
            logic) for the positions it cannot reach."""
            return or_tree([Mux(group == g, select(slot, [lists[s][g + i] for s in range(S)]), 0)
                            for g in range(0, T, R) if g + i < T] or [Const(0)])

        for i in range(R):
            m.d.comb += [found.token[i].eq(at_position(i, run_members)),
                         found.pick[i].eq(Cat(*[(found.token[i] == t) & (left > i)
                                                for t in range(TT)])),
                         found.gate[i].eq(at_position(i, run_gates))]
        push = Signal()
        pushed = Signal(phase_layout)
        m.d.comb += [plan.w_en.eq(push), plan.w_data.eq(pushed.as_value()),
                     jobs.w_en.eq(push), jobs.w_data.eq(pushed.as_value())]
        room = jobs.w_rdy & (plan.r_level + last_in_slice + last_in_skid < PLAN_DEPTH)
        done_slot = left == 0
        down_of_held = Signal(phase_layout)
        m.d.comb += [down_of_held.eq(held), down_of_held.down.eq(1),
                     *[down_of_held.pick[i].eq(0) for i in range(R)]]
        with m.If(running & ~planned_all):
            with m.If(want_down):
                m.d.comb += [push.eq(room), pushed.eq(down_of_held)]
                with m.If(room):
                    m.d.sync += [want_down.eq(0), held.eq(fresh)]
            with m.Elif(done_slot & (slot == S - 1)):
                with m.If(held_valid):                 # the last group's down
                    m.d.comb += [push.eq(room), pushed.eq(down_of_held)]
                    with m.If(room):
                        m.d.sync += held_valid.eq(0)
                with m.Else():
                    m.d.sync += [planned_all.eq(1), slot.eq(0), group.eq(0)]
            with m.Elif(done_slot):                    # visit the next slot
                m.d.sync += [slot.eq(slot + 1), group.eq(0),
                             left.eq(select(slot, run_counts[1:] + [Const(0)]))]
            with m.Elif(~select(slot, loaded)):        # its weights are not in yet: wait,
                # finishing the held group once the tile runs dry (every planned phase's last
                # pair taken, its h written). Not sooner: were the load in first, its gu would
                # wait behind that down, and not cover the wait for h as it does in order.
                dry = ~plan.r_rdy & ~phase_in_slice & select(held.parity, gu_idle)
                with m.If(held_valid & dry):
                    m.d.comb += [push.eq(1), pushed.eq(down_of_held)]
                    m.d.sync += held_valid.eq(0)
            with m.Else():                             # plan this group's gu
                m.d.comb += [push.eq(room), pushed.eq(found)]
                with m.If(room):
                    m.d.sync += [group.eq(group + R), parity.eq(~parity), held_valid.eq(1),
                                 left.eq(Mux(left > R, left - R, 0))]
                    with m.If(held_valid):
                        m.d.sync += [fresh.eq(found), want_down.eq(1)]
                    with m.Else():
                        m.d.sync += held.eq(found)

        # Read jobs, in plan order: a phase's weights are one contiguous job.
        rjob = pmu.rjob
        job = Signal(phase_layout)
        m.d.comb += [job.eq(jobs.r_data), rjob.valid.eq(jobs.r_rdy), jobs.r_en.eq(rjob.ready)]
        with m.If(job.down):
            m.d.comb += read_job(rjob.payload, job.base + shape.gu_beats * V, shape.down_beats)
        with m.Else():
            m.d.comb += read_job(rjob.payload, job.base, shape.gu_beats)

        # Tile descriptors, in issue order: what each tile's R result rows are.
        desc_layout = data.StructLayout({
            "kind": 2, "chunk": range(max(cF, cD)), "parity": 1, "rows": range(R + 1),
            "token": data.ArrayLayout(range(TT), R),
            "gate": data.ArrayLayout(cfg.gate_width, R)})
        descs = m.submodules.descriptors = SyncFIFO(width=desc_layout.size,
                                                    depth=C + R + tree + 4)

        # Executor: the plan's head phase, its tiles one after another.
        phase = Signal(phase_layout)
        m.d.comb += phase.eq(plan.r_data)
        tile_index = Signal(range(max(2 * cF, cD)))
        beat = Signal(range(max(Ks, Kf)))
        a = a_slice.i
        a_beat = a.payload.beat
        kind = Signal(2)                               # 0 gate, 1 up, 2 down
        chunk = Signal(range(max(cF, cD)))
        m.d.comb += [kind.eq(Mux(phase.down, 2, Mux(tile_index >= cF, 1, 0))),
                     chunk.eq(Mux(phase.down, tile_index,
                                  Mux(tile_index >= cF, tile_index - cF, tile_index)))]
        tile_beats = Mux(phase.down, Kf, Ks)
        a_last = beat == tile_beats - 1
        phase_last = a_last & (tile_index == Mux(phase.down, cD - 1, 2 * cF - 1))
        h_ready = ~phase.down | select(phase.parity, gu_idle)
        hbuf = [[[Signal(signed(iw), name=f"h{q}_{i}_{f}") for f in range(F)] for i in range(R)]
                for q in range(2)]
        m.d.comb += [a.valid.eq(plan.r_rdy & h_ready & descs.w_rdy),
                     a.payload.phase_last.eq(phase_last),
                     a_beat.last.eq(a_last),
                     tile.b.payload.last.eq(tile.a.payload.last), tile.b.valid.eq(pmu.r.valid),
                     pmu.r.ready.eq(tile.b.ready)]
        m.d.comb += [tile.b.payload.data[v].eq(pmu.r.payload.data[v].as_signed())
                     for v in range(V)]
        if floating:
            # b's scales are the phase's weight block's (kind: gate, up, down), carried beside
            # the a beat (above); a row's is its token's x scale (h's, in a down phase: unit;
            # a row past the group's tokens: unit, its data being 0).
            m.d.comb += [a.payload.w_scale.eq(select(phase.slot, [
                             select(kind, list(scales)) for scales in w_scales])),
                         *[scale.eq(a_skid.o.payload.w_scale)
                           for scale in tile.b.payload.scale]]
            for i in range(R):
                row_scale = Mux((i < phase.rows) & ~phase.down,
                                row_select(lambda t: phase.token[i] == t, i, x_scale),
                                cfg.unit_scale)
                m.d.comb += [a_beat.scale[sl * R + i].eq(row_scale) for sl in range(n)]
        # Each token's x element for this beat, shared by the rows (the beat is a register).
        x_beat = [[select(beat, [x[t][sl * Ks + kk] if sl * Ks + kk < D else Const(0)
                                 for kk in range(Ks)]) for sl in range(n)] for t in range(TT)]
        for i in range(R):
            h_row = (i < phase.rows) & phase.down
            for sl in range(n):
                x_lane = row_select(lambda t: phase.pick[i][t], i,
                                    [x_beat[t][sl] for t in range(TT)])
                h_lane = select(beat, [Mux(phase.parity, hbuf[1][i][sl * Kf + kk],
                                           hbuf[0][i][sl * Kf + kk])
                                       if sl * Kf + kk < F else Const(0) for kk in range(Kf)])
                m.d.comb += a_beat.data[sl * R + i].eq(x_lane | Mux(h_row, h_lane, 0))
        desc = Signal(desc_layout)
        m.d.comb += [desc.kind.eq(kind), desc.chunk.eq(chunk), desc.parity.eq(phase.parity),
                     desc.rows.eq(phase.rows),
                     *[desc.token[i].eq(phase.token[i]) for i in range(R)],
                     *[desc.gate[i].eq(phase.gate[i]) for i in range(R)],
                     descs.w_data.eq(desc.as_value())]
        a_taken = a.valid & a.ready
        tile_done = a_taken & a_last
        phase_done = a_taken & phase_last
        m.d.comb += [descs.w_en.eq(tile_done), plan.r_en.eq(phase_done)]
        with m.If(a_taken):
            m.d.sync += beat.eq(Mux(a_last, 0, beat + 1))
        with m.If(tile_done):
            m.d.sync += tile_index.eq(Mux(phase_done, 0, tile_index + 1))

        # --- results: one tile row per cycle (the tile's output is always taken) ---
        # A row is applied through RESULT_STAGES registers (golden.moe_layer): 1 the row, its
        # descriptor and its index; 2 the requantized gate and up codes and the gate-weighted
        # product; 3 the activation table's entry and the h product; then h or the token's sum
        # is written. Each stage is a register between two of the path's wide parts (the
        # output queue's read, a requantization, a table read or a multiplier), for the clock
        # rate; the counters below count a row out when it is written.
        c = tile.c
        m.d.comb += c.ready.eq(1)
        head = Signal(desc_layout)
        m.d.comb += head.eq(descs.r_data)
        result_row = Signal(range(R))
        row_done = c.valid & c.payload.last
        m.d.comb += descs.r_en.eq(row_done)
        with m.If(c.valid):
            m.d.sync += result_row.eq(Mux(c.payload.last, 0, result_row + 1))

        def stage(index, valid, last, desc, row):
            """One result stage's registers: valid (reset), the rest loaded at every edge."""
            regs = (Signal(name=f"res{index}_valid"),
                    Signal(name=f"res{index}_last", reset_less=True),
                    Signal(desc_layout, name=f"res{index}_desc", reset_less=True),
                    Signal(range(R), name=f"res{index}_row", reset_less=True))
            m.d.sync += [regs[0].eq(valid), regs[1].eq(last), regs[2].eq(desc),
                         regs[3].eq(row)]
            return regs

        v1, last1, head1, row1 = stage(1, c.valid, c.payload.last, head, result_row)
        value1 = [Signal(signed(len(c.payload.data[j])), name=f"res1_value_{j}",
                         reset_less=True) for j in range(C)]
        m.d.sync += [value1[j].eq(c.payload.data[j]) for j in range(C)]
        v2, last2, head2, row2 = stage(2, v1, last1, head1, row1)
        v3, last3, head3, row3 = stage(3, v2, last2, head2, row2)
        applied = v3 & last3                       # a tile's last row is written at this edge
        gu_applied = applied & (head3.kind != 2)
        m.d.sync += [tile_given.eq(tile_done), in_flight.eq(in_flight + tile_given - applied)]
        for q in range(2):
            m.d.sync += [gu_given[q].eq(tile_done & ~phase.down & (phase.parity == q)),
                         gu_flight[q].eq(gu_flight[q] + gu_given[q]
                                         - (gu_applied & (head3.parity == q)))]
        lut_reads = [lut.read_port(domain="comb") for _ in range(C)]
        # The row's gate, selected before stage 1's registers (clock rate: the select fed the
        # DSPs' unregistered multiplicand, 3.5 ns of setup, in the cycle after the register).
        row_gate1 = Signal(cfg.gate_width, name="res1_row_gate", reset_less=True)
        m.d.sync += row_gate1.eq(select(result_row, list(head.gate)))
        row_token3 = select(row3, list(head3.token))
        # A down row's sum enables, decoded from stage 2 into registers of stage 3 (one bit per
        # token slot and per chunk; clock rate: the token select and its compare with every
        # slot fanned out into the enables of all the sums in the cycle they are written).
        sum_row2 = v2 & (head2.kind == 2) & (row2 < head2.rows)
        row_token2 = select(row2, list(head2.token))
        sum_token3 = Signal(TT, name="sum_token3")
        sum_chunk3 = Signal(cD, name="sum_chunk3")
        m.d.sync += [sum_token3.eq(Cat(*[sum_row2 & (row_token2 == t) for t in range(TT)])),
                     sum_chunk3.eq(Cat(*[head2.chunk == cc for cc in range(cD)]))]
        weighted_shape = unsigned(32) if floating else signed(product_bits)
        split = not floating and len(c.payload.data[0]) > WEIGHTED_SPLIT

        def integer_weighted(j):
            """Stage 2's registers of column j's integer gate-weighted product, and the product
            they give to stage 3 (split: its two parts added there)."""
            gate = Cat(row_gate1, Const(0, 1)).as_signed()
            if not split:
                product = Signal(weighted_shape, name=f"weighted2_{j}", reset_less=True)
                m.d.sync += product.eq(value1[j] * gate)
                return product
            low = Signal(signed(WEIGHTED_SPLIT + 1 + len(gate)), name=f"weighted_low2_{j}",
                         reset_less=True)
            high = Signal(signed(len(value1[j]) - WEIGHTED_SPLIT + len(gate)),
                          name=f"weighted_high2_{j}", reset_less=True)
            m.d.sync += [low.eq(value1[j][:WEIGHTED_SPLIT] * gate),
                         high.eq(value1[j][WEIGHTED_SPLIT:].as_signed() * gate)]
            return (high << WEIGHTED_SPLIT) + low

        # Whether a row in stage 1 is the up row of the gate row in stage 3 (`forward1`) or in
        # stage 2 (`pending2`, as a register of stage 2): same h buffer, row and chunk.
        forward1 = v3 & (head3.kind == 0) & (head3.parity == head1.parity) & \
            (row3 == row1) & (head3.chunk == head1.chunk)
        pending2 = Signal(name="res2_pending")
        m.d.sync += pending2.eq(v2 & (head2.kind == 0) & (head2.parity == head1.parity) &
                                (row2 == row1) & (head2.chunk == head1.chunk))
        for j in range(C):
            # stage 2: the codes and the gate-weighted product of the row's value (floating
            # point: an FP32 code cast to dtype times 2**-shift, and times gate * 2**-gate_shift)
            g_code2 = Signal(signed(iw), name=f"g_code2_{j}", reset_less=True)
            u_code2 = Signal(signed(iw), name=f"u_code2_{j}", reset_less=True)
            if floating:
                weighted2 = Signal(weighted_shape, name=f"weighted2_{j}", reset_less=True)
                value = value1[j].as_unsigned()
                m.d.sync += [
                    g_code2.eq(fp_scale_cast(m, value, fp32, code_fmt, cfg.shift_g,
                                             f"g_code_{j}")),
                    u_code2.eq(fp_scale_cast(m, value, fp32, code_fmt, cfg.shift_u,
                                             f"u_code_{j}")),
                    weighted2.eq(fp_multiply(m, value, fp32, row_gate1, None, fp32,
                                             cfg.gate_shift, f"weighted_{j}"))]
            else:
                # The shift and the clamp to in_width + 2 bits at stage 1, beside value1; the
                # rounding and the saturation at stage 2 (clock rate: the clamp's top-bit check
                # led the rounding's carry chain into the codes).
                codes = (("g", g_code2, cfg.shift_g), ("u", u_code2, cfg.shift_u))
                clamped1 = []
                for kind, _, shift in codes:
                    clamp = requant_shift_clamp(m, c.payload.data[j], shift, iw,
                                                f"{kind}_code_{j}")
                    clamped1.append(Signal(signed(len(clamp)), name=f"res1_{kind}_clamped_{j}",
                                           reset_less=True))
                    m.d.sync += clamped1[-1].eq(clamp)
                m.d.sync += [code2.eq(requant_round(m, clamped, iw, f"{kind}_code_{j}"))
                             for (kind, code2, _), clamped in zip(codes, clamped1)]
                weighted2 = integer_weighted(j)
            # stage 3: the activation of the gate code, and the activation times up
            # (a BF16 code: its top act_index_bits; the read and act3 map to a block RAM)
            m.d.comb += lut_reads[j].addr.eq(g_code2.as_unsigned()[iw - cfg.act_index_bits:])
            act3 = Signal(signed(iw), name=f"act3_{j}", reset_less=True)
            # An up row reads the activation its chunk's gate row wrote, from h as stage 2
            # loads (a register, `old2`: clock rate, h's select fed a multiplier's unregistered
            # input, 3.5 ns of setup, in the cycle it was made). The gate row written at that
            # edge (stage 3 then) gives its activation instead; with one row between them (R = 1,
            # one beat a tile) the gate row is in stage 2, its activation not read yet:
            # `pending2` takes it from stage 3 in the next cycle.
            old2 = Signal(signed(iw), name=f"h_old2_{j}", reset_less=True)
            m.d.sync += old2.eq(Mux(forward1, act3, select(Cat(head1.parity, row1), [
                select(head1.chunk, [hbuf[q][i][cc * C + j] if cc * C + j < F else Const(0)
                                     for cc in range(cF)])
                for i in range(R) for q in range(2)])))
            h_product3 = Signal(signed(2 * iw), name=f"h_product3_{j}", reset_less=True)
            weighted3 = Signal(weighted_shape, name=f"weighted3_{j}", reset_less=True)
            gate_activation = Mux(pending2, act3, old2)     # the up row's chunk's, from h
            if floating:                    # the two codes: multiplied and rounded as written
                h_act3 = Signal(iw, name=f"h_act3_{j}", reset_less=True)
                h_up3 = Signal(iw, name=f"h_up3_{j}", reset_less=True)
                m.d.sync += [act3.eq(lut_reads[j].data), h_act3.eq(gate_activation),
                             h_up3.eq(u_code2), weighted3.eq(weighted2)]
            else:
                m.d.sync += [act3.eq(lut_reads[j].data),
                             h_product3.eq(gate_activation * u_code2),
                             weighted3.eq(weighted2)]
            # written: h (gate: the activation; up: its product with the activation, which
            # an earlier gate row of the same chunk wrote), or the token's sum (down)
            if floating:
                h_code = fp_multiply(m, h_act3, code_fmt, h_up3, code_fmt, code_fmt,
                                     cfg.shift_h, f"h_code_{j}")
            else:
                h_code = requant(m, h_product3, cfg.shift_h, iw, f"h_code_{j}")
            new_h = Mux(head3.kind == 0, act3, h_code)
            for q in range(2):
                for i in range(R):
                    for cc in range(cF):
                        f = cc * C + j
                        if f < F:
                            with m.If(v3 & (head3.kind != 2) & (head3.parity == q) &
                                      (row3 == i) & (head3.chunk == cc)):
                                m.d.sync += hbuf[q][i][f].eq(new_h)
            if floating:
                # One FP32 adder per column, on the sum the row's token and chunk select: a
                # token's experts are added in slot order, each step rounded.
                current = Signal(32, name=f"sum_read_{j}")
                m.d.comb += current.eq(select(row_token3, [
                    select(head3.chunk, [sums[t][cc * C + j] if cc * C + j < D else Const(0)
                                         for cc in range(cD)]) for t in range(TT)]))
                new_sum = fp_add(m, current, weighted3, fp32, f"sum_add_{j}")
            for t in range(TT):
                for cc in range(cD):
                    d = cc * C + j
                    if d < D:
                        with m.If(sum_token3[t] & sum_chunk3[cc]):
                            m.d.sync += sums[t][d].eq(new_sum if floating
                                                      else sums[t][d] + weighted3)

        # --- drain, then emit one return packet per token, in arrival order ---
        with m.If(running & planned_all & ~plan.r_rdy):
            m.d.sync += [running.eq(0), draining.eq(1), planned_all.eq(0)]
        m.d.comb += drain_end.eq(draining & (in_flight == 0) & ~tile_given)
        with m.If(drain_end):
            m.d.sync += [draining.eq(0), r_bank.eq(next_bank(r_bank))]
            for b in range(NB):
                with m.If(r_bank == b):
                    m.d.sync += bank_state[b].eq(COMPUTED)
        with m.If(start_run):                           # (after drain_end: it may restart)
            m.d.sync += running.eq(1)
        # The emitter takes the next computed bank as soon as it is free (its last flit's
        # edge included): a bank computed at this edge when none waits before it.
        out = self.up
        emit_token = Signal(range(T))
        # Tokens of the bank left to return after this one; loaded as the emitter takes a bank
        # (its count is final then: it is closed), so the return's end is a compare with zero
        # (clock rate: the count's decrement led the path into the banks' states).
        emit_left = Signal(range(T))
        emit_flit = Signal(range(H + X))
        out_last = emit_flit == H + X - 1
        emit_end = Signal()
        # `referenced` after this edge: a bank's member counts grow at a packet's end and are
        # cleared when the bank's last return leaves; the packet's choices count while it is
        # collected (after its last flit, through the counts; this flit's hits, which come
        # late, are or-ed in last).
        packet_continues = (in_packet | taken) & ~packet_end
        m.d.sync += referenced.eq(Cat(*[
            Cat(*[~(emit_end & (e_bank == b)) &
                  ((members_len[b][s] != 0) | (packet_end & (c_bank == b) & earlier_chosen[s]))
                  for b in range(NB)]).any() |
            (packet_continues & Mux(taken, earlier_chosen[s], chosen[s])) |
            (taken & ~down.payload.last & hits[s]) for s in range(S)]))
        e_next = Mux(emit_end, next_bank(e_bank), e_bank)  # (the one emitting is done)
        e_computed = select(e_next, [st == COMPUTED for st in bank_state]) & \
            ~(emit_end & (e_next == e_bank))
        start_emit = (~emitting | emit_end) & (e_computed | (drain_end & (r_bank == e_next)))
        emit_slot = Signal(range(TT))
        m.d.comb += [emit_slot.eq(e_bank * T + emit_token),
                     out.valid.eq(emitting), out.payload.last.eq(out_last),
                     out.payload.token.eq(select(emit_slot, tok_id))]
        for lane in range(L):
            candidates = []
            for b in range(X):
                d = b * L + lane
                candidates.append(select(emit_slot, [sums[t][d] for t in range(TT)])
                                  if d < D else Const(0))
            chosen_sum = Signal(sum_shape, name=f"emit_sum_{lane}")
            m.d.comb += chosen_sum.eq(select(emit_flit - H, candidates))
            if cfg.combine_dtype == "bf16":
                code = fp_scale_cast(m, chosen_sum, fp32, golden_fp.FORMATS["bf16"], 0,
                                     f"ret_{lane}")
            elif floating:                            # FP32 lanes: the sum's code as it is
                code = chosen_sum
            else:
                code = requant(m, chosen_sum, cfg.gate_shift, cfg.combine_width, f"ret_{lane}")
            m.d.comb += out.payload.data[lane].eq(Mux(emit_flit < H, 0, code))
        with m.If(out.valid & out.ready):
            m.d.sync += emit_flit.eq(emit_flit + 1)
            with m.If(out_last):
                m.d.sync += [emit_flit.eq(0), emit_token.eq(emit_token + 1)]
                m.d.sync += emit_left.eq(emit_left - 1)
                with m.If(emit_left == 0):
                    m.d.comb += emit_end.eq(1)
                    m.d.sync += [emitting.eq(0), emit_token.eq(0), e_bank.eq(next_bank(e_bank))]
                    for b in range(NB):
                        with m.If(e_bank == b):
                            m.d.sync += [bank_state[b].eq(FREE), bank_count[b].eq(0),
                                         *[v.eq(0) for v in members_len[b]]]
        with m.If(start_emit):
            m.d.sync += [emitting.eq(1), emit_left.eq(select(e_next, bank_count) - 1)]
        # `collecting` after this edge: whether bank `c_bank` is free as the edge leaves the
        # banks (a return's end frees a bank, over a drain's end or a close).
        free_after = [Mux(emit_end & (e_bank == b), 1,
                          Mux((drain_end & (r_bank == b)) | (close & (c_bank == b)), 0,
                              bank_state[b] == FREE)) for b in range(NB)]
        m.d.sync += collecting.eq(select(Mux(close, next_bank(c_bank), c_bank), free_after))
        # `left` while the planner is not running (above): slot 0's count in bank `r_next` as
        # this edge leaves it (a packet ending in that bank adds its choice). Only its value at
        # the edge the planner takes that bank counts, when the bank is closed or closing,
        # never being returned: so a return's end, which clears a bank's counts, is left out
        # (clock rate: that end, from the return's token count, led the path into `left`).
        with m.If(~running):
            m.d.sync += left.eq(select(r_next, [
                members_len[b][0] + (packet_end & (c_bank == b) & earlier_chosen[0])
                for b in range(NB)]))
        return m


register(Block(
    name="expert_chiplet", family="moe_layer", config=ExpertChipletConfig, build=ExpertChiplet,
    tb="moe_layer_chiplet", synth_abc=False,
    figures=lambda cfg: golden.chiplet_figures(cfg.schedule),
    summary="MoE layer leaf: experts' FFNs on a systolic tile from a PMU scratchpad, batched",
    demo_configs=({},),
    area_unit="PE", operation="MAC", area_units=lambda cfg: cfg.rows * cfg.cols * cfg.arrays,
    legend="PE utilization of a batch with every port ready",
    tiers=lambda cfg: (ExpertChiplet(cfg, tier="top"), ScratchpadBanks(cfg.pmu_config())),
    tier_contents=("tile, planner, token slots, address generators", "the scratchpad banks"),
))


# --------------------------------------------------------------------------------------------
# moe_layer: moe_gate -> nop_tree -> expert_chiplet leaves -> in-network combine -> y
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MoELayerConfig(PacketShape):
    """Parameters of ``moe_layer``: those of its parts, named as they name them.

    Routing and gate (``moe_gate``): experts, k, groups, topk_groups, shared, shared_leaf,
    token_width, d_model,
    lanes, in_width, w_width, score_shift, score_width, gate_width, data_width, and
    ``score_acc_width`` (its ``acc_width``). Tree (``nop_tree``): fanouts, max_inflight (its
    ``acc_width`` is ``combine_width``, its ``max_flits`` one packet). Chiplets
    (``expert_chiplet``, one per leaf): slots, d_ff, acc_width, shift_g, shift_u, shift_h,
    gate_shift, combine_width, rows, cols, arrays, batch, batch_wait, queue_tokens,
    token_banks, pe_stages. Floating point (all parts): dtype, acc_frac, promote_every,
    scale_format (x's and the weight blocks' scales), combine_dtype (the chiplets' return
    lanes and the tree's combine).
    """
    experts: int = like_param(MoEGateConfig, "experts")
    k: int = like_param(MoEGateConfig, "k")
    groups: int = like_param(MoEGateConfig, "groups")
    topk_groups: int = like_param(MoEGateConfig, "topk_groups")
    shared: int = like_param(MoEGateConfig, "shared")
    shared_leaf: int = like_param(MoEGateConfig, "shared_leaf")
    fanouts: tuple = like_param(NopConfig, "fanouts", (2, 2))
    # 32 slots per switch: fewer (16) held the root back while the chiplets batch (1038
    # cycles for the 64-token bench batch against 649 with 32, and 649 with 64).
    max_inflight: int = like_param(NopConfig, "max_inflight", 32)
    slots: int = like_param(ExpertChipletConfig, "slots")
    token_width: int = like_param(MoEGateConfig, "token_width")
    d_model: int = like_param(ExpertChipletConfig, "d_model")
    d_ff: int = like_param(ExpertChipletConfig, "d_ff")
    lanes: int = like_param(MoEGateConfig, "lanes")
    in_width: int = like_param(ExpertChipletConfig, "in_width")
    w_width: int = like_param(MoEGateConfig, "w_width")
    score_acc_width: int = dataclasses.field(
        default=32, metadata={**MoEGateConfig.__dataclass_fields__["acc_width"].metadata})
    score_shift: int = like_param(MoEGateConfig, "score_shift")
    score_width: int = like_param(MoEGateConfig, "score_width")
    gate_width: int = like_param(MoEGateConfig, "gate_width")
    data_width: int = like_param(MoEGateConfig, "data_width")
    acc_width: int = like_param(ExpertChipletConfig, "acc_width")
    shift_g: int = like_param(ExpertChipletConfig, "shift_g")
    shift_u: int = like_param(ExpertChipletConfig, "shift_u")
    shift_h: int = like_param(ExpertChipletConfig, "shift_h")
    gate_shift: int = like_param(ExpertChipletConfig, "gate_shift")
    combine_width: int = like_param(ExpertChipletConfig, "combine_width")
    rows: int = like_param(ExpertChipletConfig, "rows")
    cols: int = like_param(ExpertChipletConfig, "cols")
    arrays: int = like_param(ExpertChipletConfig, "arrays")
    batch: int = like_param(ExpertChipletConfig, "batch")
    batch_wait: int = like_param(ExpertChipletConfig, "batch_wait")
    queue_tokens: int = like_param(ExpertChipletConfig, "queue_tokens")
    token_banks: int = like_param(ExpertChipletConfig, "token_banks")
    dtype: str = like_param(ExpertChipletConfig, "dtype")
    acc_frac: int = like_param(ExpertChipletConfig, "acc_frac")
    promote_every: int = like_param(ExpertChipletConfig, "promote_every")
    scale_format: str = like_param(ExpertChipletConfig, "scale_format")
    combine_dtype: str = like_param(ExpertChipletConfig, "combine_dtype")
    pe_stages: int = like_param(ExpertChipletConfig, "pe_stages")

    def __post_init__(self):
        validate(self)
        self.chiplet_config()           # first: its floating-point rules, with its messages
        self.gate_config()
        self.tree_config()
        if self.experts + self.shared > self.leaves * self.slots:
            raise param_error("experts", self.experts,
                              f"at most leaves * slots - shared "
                              f"({self.leaves * self.slots - self.shared}): every expert "
                              "needs a slot")

    @property
    def leaves(self):
        return math.prod(self.fanouts)

    @property
    def switch_groups(self):
        """The root's children's subtrees (the whole tree when it has one level): group g is
        leaves g * group_leaves .. (g + 1) * group_leaves - 1, with one weight port (its DRAM,
        seed 000 §4.4: every four chiplets share one DRAM interface behind their switch)."""
        return self.fanouts[0] if len(self.fanouts) > 1 else 1

    @property
    def group_leaves(self):
        return self.leaves // self.switch_groups

    def gate_config(self):
        return MoEGateConfig(
            experts=self.experts, k=self.k, groups=self.groups, topk_groups=self.topk_groups,
            leaves=self.leaves, token_width=self.token_width, d_model=self.d_model,
            lanes=self.lanes, in_width=self.in_width, w_width=self.w_width,
            acc_width=self.score_acc_width, score_shift=self.score_shift,
            score_width=self.score_width, gate_width=self.gate_width,
            data_width=self.data_width, shared=self.shared, shared_leaf=self.shared_leaf,
            dtype=self.dtype, scale_format=self.scale_format)

    def tree_config(self):
        flits = self.header_flits + self.x_flits
        if flits > 64:
            raise param_error("d_model", self.d_model,
                              f"at most {64 - self.header_flits} * lanes: a packet of "
                              f"{flits} flits is longer than the tree's 64")
        return NopConfig(fanouts=self.fanouts, lanes=self.lanes, data_width=self.data_width,
                         acc_width=self.combine_width, token_width=self.token_width,
                         max_flits=flits, max_inflight=self.max_inflight,
                         combine_dtype=self.combine_dtype)

    def chiplet_config(self):
        return ExpertChipletConfig(      # the shared expert is one more expert, one more entry
            experts=self.experts + self.shared, k=self.k + self.shared, leaves=self.leaves,
            token_width=self.token_width,
            lanes=self.lanes, data_width=self.data_width, gate_width=self.gate_width,
            combine_width=self.combine_width, slots=self.slots, d_model=self.d_model,
            d_ff=self.d_ff, in_width=self.in_width, w_width=self.w_width,
            acc_width=self.acc_width, shift_g=self.shift_g, shift_u=self.shift_u,
            shift_h=self.shift_h, gate_shift=self.gate_shift, rows=self.rows, cols=self.cols,
            arrays=self.arrays, batch=self.batch, batch_wait=self.batch_wait,
            queue_tokens=self.queue_tokens, token_banks=self.token_banks, dtype=self.dtype,
            acc_frac=self.acc_frac, promote_every=self.promote_every,
            scale_format=self.scale_format, combine_dtype=self.combine_dtype,
            pe_stages=self.pe_stages)


def layer_weights_layout(config):
    """A weight beat of a switch group's port: ``leaf`` (the chiplet within the group) and a
    chiplet's weight beat."""
    chiplet = weights_layout(config.chiplet_config())
    return data.StructLayout({"leaf": max(1, ceil_log2(config.group_leaves)),
                              **{name: field.shape for name, field in chiplet}})


def layer_assign_layout(config):
    """An assignment in the layer: ``leaf`` (the chiplet) and a chiplet's assignment."""
    chiplet = assign_layout(config.chiplet_config())
    return data.StructLayout({"leaf": max(1, ceil_log2(config.leaves)),
                              **{name: field.shape for name, field in chiplet}})


def y_layout(config):
    return data.StructLayout({
        "token": config.token_width,
        "data": data.ArrayLayout(signed(config.combine_width) if config.combine_dtype == "int"
                                 else unsigned(config.combine_width), config.lanes),
        "last": 1})


def layer_banks_signature(config):
    """Every chiplet's scratchpad banks (``leaf<i>__bank<b>__*``), as the memory tier sees
    them."""
    return wiring.Signature({f"leaf{leaf}": Out(banks_signature(config.chiplet_config()
                                                                  .pmu_config()))
                             for leaf in range(config.leaves)})


class LayerScratchpads(ConfiguredComponent):
    """The memory tier of the layer's 3D build: one :class:`hw.pmu.ScratchpadBanks` per
    chiplet."""

    def __init__(self, config):
        super().__init__(config, layer_banks_signature(config))

    def elaborate(self, platform):
        m = Module()
        for leaf in range(self.config.leaves):
            banks = m.submodules[f"leaf{leaf}"] = ScratchpadBanks(
                self.config.chiplet_config().pmu_config())
            wiring.connect(m, wiring.flipped(getattr(self, f"leaf{leaf}")), banks)
        return m


class MoELayer(TieredComponent):
    """The ``moe_layer`` block (contract: docs/blocks/moe_layer.md): ``moe_gate`` at the root
    of a ``nop_tree`` whose leaves are ``expert_chiplet`` s; the tree's combine gives y.

    Members
    -------
    x, wg, gate_lut, table : In(stream)
        As ``moe_gate``'s.
    weights : In(stream).array(switch_groups)
        One port per switch group: ``leaf`` (within the group) and a chiplet weight beat.
    assign : In(stream)
        ``leaf`` and a chiplet assignment (a slot given its expert ahead of the weights).
    act_lut : In(stream)
        One activation-table entry, written into every chiplet; always ready.
    y : Out(stream)
        Per token, ceil(D/L) flits of y (``combine_width`` lanes), tagged with its token id.
    leaf_packets : Out(leaves)
        Bit i high in a cycle where chiplet i takes a packet's last flit (a token arrived).
    down_link_fire, up_link_fire : Out
        The tree's link taps (``nop_tree``).
    error : Out(1)
        Sticky: any part's error.
    """

    def __init__(self, config, *, tier=None):
        """``tier="top"``: the logic die alone, every chiplet's scratchpad banks as ports
        ``bottom__leaf<i>__bank<b>__*`` (:class:`LayerScratchpads` is the memory die)."""
        self._tree = NopTree(config.tree_config())
        self._chiplet_module = self._chiplet_signature = None
        super().__init__(config, {
            "x": In(stream.Signature(x_layout(config.gate_config()))),
            "wg": In(stream.Signature(wg_layout(config.gate_config()))),
            "gate_lut": In(stream.Signature(gate_lut_layout(config.gate_config()))),
            "table": In(stream.Signature(table_layout(config.gate_config().router_config()))),
            "weights": In(stream.Signature(layer_weights_layout(config))).array(
                config.switch_groups),
            "assign": In(stream.Signature(layer_assign_layout(config))),
            "act_lut": In(stream.Signature(act_lut_layout(config.chiplet_config()))),
            "y": Out(stream.Signature(y_layout(config))),
            "leaf_packets": Out(config.leaves),
            "down_link_fire": Out(len(self._tree.down_link_fire)),
            "up_link_fire": Out(len(self._tree.up_link_fire)),
            "error": Out(1),
        }, layer_banks_signature(config), tier)

    def shared_submodule(self):
        """``("chiplet", ExpertChiplet)``: the leaves are one design repeated, so a Verilog
        export (``flows.verilog.convert``) converts one chiplet into a module of its own, names
        it with :meth:`instance_shared`, and this layer instances it at every leaf. Amaranth
        elaborates and converts every submodule on its own (about 5.5 s per chiplet), which held
        a 32-leaf layer's generation to minutes."""
        return "chiplet", ExpertChiplet(self.config.chiplet_config(), tier=self.tier)

    def instance_shared(self, module, signature):
        """Elaborate every chiplet as an instance of the Verilog module ``module`` (the
        chiplet of :meth:`shared_submodule`, converted separately; ``signature`` its
        signature) instead of a submodule."""
        self._chiplet_module, self._chiplet_signature = module, signature

    def _chiplet(self, m, leaf):
        """Leaf ``leaf``'s chiplet: the submodule itself, or an interface with its signature
        wired to an instance of the shared module (same ports, same instance name)."""
        name = f"chiplet{leaf}"
        if self._chiplet_module is None:
            m.submodules[name] = chiplet = ExpertChiplet(self.config.chiplet_config(),
                                                         tier=self.tier)
            return chiplet
        signature = self._chiplet_signature
        chiplet = signature.create(path=(name,))
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in signature.flatten(chiplet):
            direction = "i" if member.flow == In else "o"
            ports[f"{direction}_{'__'.join(str(part) for part in path)}"] = value
        m.submodules[name] = Instance(self._chiplet_module, **ports)
        return chiplet

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        gate = m.submodules.gate = MoEGate(cfg.gate_config())
        tree = m.submodules.tree = self._tree
        for name in ("x", "wg", "gate_lut", "table"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(gate, name))
        wiring.connect(m, gate.packet, tree.down_in)
        m.d.comb += [self.down_link_fire.eq(tree.down_link_fire),
                     self.up_link_fire.eq(tree.up_link_fire)]
        errors = [gate.error, tree.error]
        assign = self.assign
        ready, assign_ready = [[] for _ in range(cfg.switch_groups)], []
        for leaf in range(cfg.leaves):
            chiplet = self._chiplet(m, leaf)
            if self.tier == "top":
                wiring.connect(m, chiplet.bottom,
                               wiring.flipped(getattr(self.bottom, f"leaf{leaf}")))
            wiring.connect(m, tree.down_out[leaf], chiplet.down)
            wiring.connect(m, chiplet.up, tree.up_in[leaf])
            errors.append(chiplet.error)
            group, local = divmod(leaf, cfg.group_leaves)
            weights = self.weights[group]
            mine = weights.payload.leaf == local
            m.d.comb += [chiplet.weights.valid.eq(weights.valid & mine),
                         chiplet.weights.payload.eq(weights.payload.as_value()[
                             len(weights.payload.leaf):]),
                         chiplet.act_lut.valid.eq(self.act_lut.valid),
                         chiplet.act_lut.payload.eq(self.act_lut.payload),
                         self.leaf_packets[leaf].eq(chiplet.down.valid & chiplet.down.ready &
                                                    chiplet.down.payload.last)]
            ready[group].append(mine & chiplet.weights.ready)
            to_me = assign.payload.leaf == leaf
            m.d.comb += [chiplet.assign.valid.eq(assign.valid & to_me),
                         chiplet.assign.payload.eq(assign.payload.as_value()[
                             len(assign.payload.leaf):])]
            assign_ready.append(to_me & chiplet.assign.ready)
        # A beat or an assignment for a leaf that does not exist is taken, dropped, and sets
        # error.
        bad_leaf = Signal()
        for group, weights in enumerate(self.weights):
            leaf_ok = weights.payload.leaf < cfg.group_leaves
            m.d.comb += weights.ready.eq(Cat(*ready[group]).any() | ~leaf_ok)
            with m.If(weights.valid & ~leaf_ok):
                m.d.sync += bad_leaf.eq(1)
        assign_leaf_ok = assign.payload.leaf < cfg.leaves
        m.d.comb += [assign.ready.eq(Cat(*assign_ready).any() | ~assign_leaf_ok),
                     self.act_lut.ready.eq(1)]
        with m.If(assign.valid & ~assign_leaf_ok):
            m.d.sync += bad_leaf.eq(1)
        errors.append(bad_leaf)
        m.d.comb += self.error.eq(Cat(*errors).any())

        # y: the root's combined packets without their (all-zero) header flits.
        root, y = tree.up_out, self.y
        flit = Signal(range(cfg.header_flits + 1))
        in_header = flit < cfg.header_flits
        m.d.comb += [y.valid.eq(root.valid & ~in_header), root.ready.eq(in_header | y.ready),
                     y.payload.token.eq(root.payload.token), y.payload.last.eq(root.payload.last),
                     y.payload.data.eq(root.payload.data)]
        with m.If(root.valid & root.ready):
            m.d.sync += flit.eq(Mux(root.payload.last, 0, Mux(in_header, flit + 1, flit)))
        return m


register(Block(
    name="moe_layer", family="moe_layer", config=MoELayerConfig, build=MoELayer,
    # Hierarchical: the leaves are one chiplet module, mapped once (flattened, the compute-bound
    # configuration's gate-level netlist outgrew 18 GB of memory in Yosys's techmap).
    tb="moe_layer_system", synth_abc=False, synth_flatten=False,
    figures=lambda cfg: {"leaves": cfg.leaves, "pes": cfg.leaves * cfg.rows * cfg.cols *
                         cfg.arrays, "flits_per_token": cfg.header_flits + cfg.x_flits},
    summary="the Mozart MoE layer: gate, NoP dispatch, expert chiplets, in-network combine",
    # The defaults are dispatch-bound (an expert's work per token is as long as its packet);
    # the second is compute-bound, as the paper's experts are: the figure against the MAC bound.
    demo_configs=({}, {"d_model": 32, "d_ff": 32, "batch": 16, "max_inflight": 64}),
    area_unit="chiplet", operation="MAC", area_units=lambda cfg: cfg.leaves,
    legend="tokens per cycle of a batch against the busiest chiplet's MAC bound",
    tiers=lambda cfg: (MoELayer(cfg, tier="top"), LayerScratchpads(cfg)),
    tier_contents=("gate, router, NoP tree, chiplet logic", "every chiplet's scratchpad banks"),
))
