"""LogFMT-n codec: blocks ``logfmt_encoder`` and ``logfmt_decoder`` (contract:
docs/blocks/logfmt.md).

Source: seed 003 §3.2 (LogFMT-nBit for the all-to-all's activations; §3.2.2 asks for native
compression and decompression units). The fixed-point arithmetic is :mod:`golden.logfmt`'s, bit
for bit; its tables (log2 of a BF16 fraction, 2**(i/256)) are the specification, read from there.

The encoder makes two passes over every tile: its rows are written into an element FIFO while
the tile's smallest and largest magnitude are tracked (BF16 magnitudes order as integers, so
no logarithm is needed for that); after the tile's last row, one cycle turns them into lo and
step, and a divider finds the reciprocal of step, ``ceil(26 / T)`` quotient bits a cycle so that
it is done within the T = tile/lanes cycles the next tile's rows take. The rows then leave the
FIFO one a cycle, each element's log2 (a table) placed among the levels by a multiply with the
reciprocal. With every port ready a row enters and a row leaves every cycle.

The decoder is stateless per beat: every beat carries its tile's lo and step.
"""

import dataclasses

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import logfmt as golden
from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.pipeline import leading_one, max_tree
from hw.registry import Block, register

__all__ = ["LogfmtEncoderConfig", "LogfmtDecoderConfig", "LogfmtEncoder", "LogfmtDecoder",
           "tile_layout", "bf16_layout"]

LO_BITS = 25                   # signed Q16: -133..128 binades
STEP_BITS = 23                 # Q24: at most 32 * 2**24 / 126
D_BITS = 22                    # 0 <= l - lo <= 32 * 2**16
LOG_BITS = 26                  # signed Q16 log2 and differences
POS_BITS = 19                  # Q8 positions: below 2 * 510 * 2**8


def _bits_param():
    return int_param(8, 8, 10, "n, bits per element: a sign and an (n-1)-bit code")


def _lanes_param():
    return int_param(8, 1, 32, "elements per beat")


@dataclasses.dataclass(frozen=True)
class LogfmtEncoderConfig:
    """Parameters of ``logfmt_encoder``.

    Parameters
    ----------
    bits : int
        n (8..10).
    tile : int
        m, elements per tile: one lo and step each (1..1024; the seed's is 128).
    lanes : int
        Elements per beat (1..32, a divisor of tile).
    """
    bits: int = _bits_param()
    tile: int = int_param(128, 1, 1024, "m, elements per tile (one lo and step each)")
    lanes: int = _lanes_param()

    def __post_init__(self):
        validate(self)
        if self.tile % self.lanes:
            raise param_error("lanes", self.lanes, f"a divisor of tile ({self.tile})")

    @property
    def beats(self):
        """T, rows per tile."""
        return self.tile // self.lanes


@dataclasses.dataclass(frozen=True)
class LogfmtDecoderConfig:
    """Parameters of ``logfmt_decoder``: ``bits`` n (8..10), ``lanes`` (1..32)."""
    bits: int = _bits_param()
    lanes: int = _lanes_param()

    def __post_init__(self):
        validate(self)


def bf16_layout(lanes):
    return data.StructLayout({"data": data.ArrayLayout(16, lanes)})


def tile_layout(bits, lanes):
    """An encoded row: the codes, the tile's lo (Q16) and step (Q24), its NaN flag, and
    ``last`` on the tile's last row."""
    return data.StructLayout({"codes": data.ArrayLayout(bits, lanes), "lo": signed(LO_BITS),
                              "step": STEP_BITS, "nan": 1, "last": 1})


def _rom(values, width):
    return Array(Const(v, width) for v in values)


def _bf16_fields(code):
    """``(sign, nan, zero, magnitude)``: the magnitude a 15-bit integer, infinity taken as
    the largest finite one."""
    field, fraction = code[7:15], code[:7]
    special = field == 0xFF
    nan = special & (fraction != 0)
    zero = code[:15] == 0
    magnitude = Mux(special, golden.BF16_MAX, code[:15])
    return code[15], nan, zero, magnitude


def _log2(m, magnitude, name):
    """The Q16 log2 of a nonzero finite BF16 magnitude (15 bits), signed LOG_BITS."""
    field, fraction = magnitude[7:15], magnitude[:7]
    top = leading_one(m, fraction, f"{name}_top")
    exponent = Signal(signed(10), name=f"{name}_exp")
    index = Signal(7, name=f"{name}_frac")
    with m.If(field == 0):                 # subnormal: fraction * 2**-133, normalized
        m.d.comb += [exponent.eq(top - 133),
                     index.eq(((fraction << 7) >> top)[:7])]
    with m.Else():
        m.d.comb += [exponent.eq(field - 127), index.eq(fraction)]
    log = Signal(signed(LOG_BITS), name=f"{name}_log")
    m.d.comb += log.eq((exponent << golden.LOG_FRAC)
                       + _rom(golden.LOG_TABLE, golden.LOG_FRAC)[index])
    return log


def _divide_by_constant(value, width, divisor):
    """floor(value / divisor) for 0 <= value < 2**width as a multiply and a shift (Granlund
    and Montgomery, 1994, theorem 4.2: m = ceil(2**(N + l) / d) with 2**l >= d)."""
    shift = width + ceil_log2(divisor)
    magic = -(-(1 << shift) // divisor)
    return (value * magic) >> shift


class LogfmtEncoder(ConfiguredComponent):
    """The ``logfmt_encoder`` block.

    Members
    -------
    inp : In(stream)
        ``data``: ``lanes`` BF16 codes; T = tile/lanes consecutive beats make a tile.
    out : Out(stream)
        ``tile_layout``: the codes of one row with the tile's lo, step, nan; ``last`` on its
        last row.
    """

    def __init__(self, config):
        super().__init__(config, {
            "inp": In(stream.Signature(bf16_layout(config.lanes))),
            "out": Out(stream.Signature(tile_layout(config.bits, config.lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        lanes, beats = cfg.lanes, cfg.beats
        levels = (1 << (cfg.bits - 1)) - 1
        per_cycle = golden.divider_bits_per_cycle(cfg.tile, lanes)
        div_cycles = golden.divider_cycles(cfg.tile, lanes)
        rows = golden.encoder_fifo_rows(cfg.tile, lanes)
        row_bits = 16 * lanes

        elements = m.submodules.elements = SyncFIFO(width=row_bits, depth=rows)
        # Tiles with parameters and rows left: at most one partly sent plus whole ones.
        params_depth = (rows - 1) // beats + 1
        params_layout = data.StructLayout({"lo": signed(LO_BITS), "step": STEP_BITS,
                                           "nan": 1, "recip": golden.RECIP_BITS,
                                           "shift": range(STEP_BITS + 9),
                                           "theta": golden.POS_FRAC + 1})
        params = m.submodules.params = SyncFIFO(width=params_layout.size, depth=params_depth)

        # Pass 1: rows into the FIFO, the tile's magnitude range tracked.
        take = self.inp.valid & self.inp.ready
        m.d.comb += [self.inp.ready.eq(elements.w_rdy), elements.w_en.eq(take),
                     elements.w_data.eq(self.inp.payload.as_value())]
        in_row = Signal(range(beats))
        highs, lows, nans, nonzeros = [], [], [], []
        for lane in range(lanes):
            _, nan, zero, magnitude = _bf16_fields(self.inp.payload.data[lane])
            number = ~nan & ~zero
            high, low = Signal(15, name=f"high{lane}"), Signal(15, name=f"low{lane}")
            m.d.comb += [high.eq(Mux(number, magnitude, 0)),
                         low.eq(Mux(number, ~magnitude, 0))]      # the smallest, inverted
            highs.append(high)
            lows.append(low)
            nans.append(nan)
            nonzeros.append(number)
        row_high = max_tree(m, highs, "row_high")
        row_low = max_tree(m, lows, "row_low")
        run_high, run_low = Signal(15), Signal(15)
        run_nan, run_any = Signal(), Signal()
        first = in_row == 0
        tile_done = Signal()
        m.d.sync += tile_done.eq(0)
        with m.If(take):
            m.d.sync += [run_high.eq(Mux(first | (row_high > run_high), row_high, run_high)),
                         run_low.eq(Mux(first | (row_low > run_low), row_low, run_low)),
                         run_nan.eq(Cat(*nans).any() | (~first & run_nan)),
                         run_any.eq(Cat(*nonzeros).any() | (~first & run_any)),
                         in_row.eq(Mux(in_row == beats - 1, 0, in_row + 1)),
                         tile_done.eq(in_row == beats - 1)]

        # The cycle after a tile's last row: lo, step, theta; the divider starts.
        hi_log = _log2(m, run_high, "hi")
        lo_log = _log2(m, ~run_low, "lo")
        floor_log = Signal(signed(LOG_BITS))
        m.d.comb += floor_log.eq(hi_log - (golden.RANGE_BINADES << golden.LOG_FRAC))
        lo = Signal(signed(LOG_BITS))
        m.d.comb += lo.eq(Mux(~run_any, 0, Mux(lo_log > floor_log, lo_log, floor_log)))
        diff = Signal(D_BITS)
        m.d.comb += diff.eq(Mux(run_any, hi_log - lo, 0))
        step = Signal(STEP_BITS)
        m.d.comb += step.eq(_divide_by_constant(
            Cat(Const(0, golden.STEP_FRAC - golden.LOG_FRAC), diff),
            D_BITS + golden.STEP_FRAC - golden.LOG_FRAC, levels - 1))
        top = leading_one(m, step, "step_top")               # e - 1
        normalized = Signal(STEP_BITS + 1)                     # step * 2**(24 - e)
        m.d.comb += normalized.eq((step << STEP_BITS) >> top)

        # The divider: floor(2**48 / normalized), per_cycle quotient bits a cycle; the first
        # (div_cycles * per_cycle - 26) bits are zero (the remainder starts below the divisor).
        total_bits = per_cycle * div_cycles
        divisor_bits = STEP_BITS + 1
        rem = Signal(divisor_bits + 1)
        quotient = Signal(golden.RECIP_BITS)
        divisor = Signal(divisor_bits)
        left = Signal(range(div_cycles + 1))
        tile_lo, tile_step = Signal(signed(LO_BITS)), Signal(STEP_BITS)
        tile_nan = Signal()
        tile_shift = Signal(range(STEP_BITS + 9))
        tile_theta = Signal(golden.POS_FRAC + 1)
        r, q = rem, quotient
        for i in range(per_cycle):
            doubled = Signal(divisor_bits + 2, name=f"div_doubled{i}")
            m.d.comb += doubled.eq(r << 1)
            fits = doubled >= divisor
            next_r = Signal(divisor_bits + 1, name=f"div_rem{i}")
            next_q = Signal(golden.RECIP_BITS, name=f"div_q{i}")
            m.d.comb += [next_r.eq(Mux(fits, doubled - divisor, doubled)),
                         next_q.eq(Cat(fits, q))]
            r, q = next_r, next_q
        finishing = Signal()
        m.d.comb += finishing.eq(left == 1)
        with m.If(left != 0):
            m.d.sync += [rem.eq(r), quotient.eq(q), left.eq(left - 1)]
        with m.If(tile_done):
            m.d.sync += [rem.eq(1 << (2 * divisor_bits - total_bits)), quotient.eq(0),
                         divisor.eq(normalized), left.eq(div_cycles),
                         tile_lo.eq(lo), tile_step.eq(step), tile_nan.eq(run_nan),
                         tile_shift.eq(top + 1 + 8),
                         tile_theta.eq((1 << (golden.POS_FRAC - 1))
                                       + ((step * golden.LN2_Q16) >> 35))]
        written = Signal(params_layout)
        m.d.comb += [written.lo.eq(tile_lo), written.step.eq(tile_step),
                     written.nan.eq(tile_nan), written.recip.eq(q),
                     written.shift.eq(tile_shift), written.theta.eq(tile_theta),
                     params.w_en.eq(finishing), params.w_data.eq(written.as_value())]

        # Pass 2: rows out of the FIFO, one a cycle, through the output register.
        current = Signal(params_layout)
        m.d.comb += current.eq(params.r_data)
        out_valid = Signal()
        out_row = Signal(range(beats))
        pop = Signal()
        m.d.comb += pop.eq(elements.r_rdy & params.r_rdy & (~out_valid | self.out.ready))
        last = out_row == beats - 1
        m.d.comb += [elements.r_en.eq(pop), params.r_en.eq(pop & last)]
        codes = []
        row = elements.r_data
        for lane in range(lanes):
            codes.append(self._encode(m, row[16 * lane:16 * lane + 16], current, levels,
                                      f"e{lane}"))
        out = self.out.payload
        with m.If(self.out.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(pop):
            m.d.sync += [out_valid.eq(1), out_row.eq(Mux(last, 0, out_row + 1)),
                         out.lo.eq(current.lo), out.step.eq(current.step),
                         out.nan.eq(current.nan), out.last.eq(last)]
            m.d.sync += [out.codes[lane].eq(code) for lane, code in enumerate(codes)]
        m.d.comb += self.out.valid.eq(out_valid)
        return m

    def _encode(self, m, code, tile, levels, name):
        sign, nan, zero, magnitude = _bf16_fields(code)
        log = _log2(m, magnitude, name)
        d = Signal(signed(LOG_BITS + 1), name=f"{name}_d")
        m.d.comb += d.eq(log - tile.lo)
        product = Signal(D_BITS + golden.RECIP_BITS, name=f"{name}_product")
        m.d.comb += product.eq(d[:D_BITS] * tile.recip)
        pos = Signal(POS_BITS, name=f"{name}_pos")
        m.d.comb += pos.eq(product >> tile.shift)
        k = Signal(POS_BITS - golden.POS_FRAC + 1, name=f"{name}_k")
        m.d.comb += k.eq(pos[golden.POS_FRAC:] + (pos[:golden.POS_FRAC] >= tile.theta))
        magnitude_code = Signal(range(levels + 1), name=f"{name}_code")
        with m.If(nan | zero | (d < -(1 << golden.LOG_FRAC))):
            m.d.comb += magnitude_code.eq(0)
        with m.Elif((d < 0) | (tile.step == 0)):
            m.d.comb += magnitude_code.eq(1)
        with m.Elif(k >= levels - 1):
            m.d.comb += magnitude_code.eq(levels)
        with m.Else():
            m.d.comb += magnitude_code.eq(k + 1)
        return Cat(magnitude_code, sign)


class LogfmtDecoder(ConfiguredComponent):
    """The ``logfmt_decoder`` block.

    Members
    -------
    inp : In(stream)
        ``tile_layout``: codes with their tile's lo, step and nan flag.
    out : Out(stream)
        ``data``: ``lanes`` BF16 codes; ``last`` passed through.
    """

    def __init__(self, config):
        layout = data.StructLayout({"data": data.ArrayLayout(16, config.lanes), "last": 1})
        super().__init__(config, {
            "inp": In(stream.Signature(tile_layout(config.bits, config.lanes))),
            "out": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        beat = self.inp.payload
        out_valid = Signal()
        take = self.inp.valid & self.inp.ready
        m.d.comb += self.inp.ready.eq(~out_valid | self.out.ready)
        with m.If(self.out.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(take):
            m.d.sync += [out_valid.eq(1), self.out.payload.last.eq(beat.last)]
            for lane in range(cfg.lanes):
                m.d.sync += self.out.payload.data[lane].eq(
                    self._decode(m, beat.codes[lane], beat, f"d{lane}"))
        m.d.comb += self.out.valid.eq(out_valid)
        return m

    def _decode(self, m, code, beat, name):
        bits = self.config.bits
        frac = golden.STEP_FRAC
        sign, magnitude = code[bits - 1], code[:bits - 1]
        value = Signal(signed(LO_BITS + 9 + 1), name=f"{name}_value")
        m.d.comb += value.eq((beat.lo << (frac - golden.LOG_FRAC)) + beat.step * (magnitude - 1))
        index = Signal(9, name=f"{name}_index")
        m.d.comb += index.eq((value[:frac] + (1 << 15)) >> 16)
        exponent = Signal(signed(12), name=f"{name}_exponent")
        m.d.comb += exponent.eq((value >> frac) + index[8])
        significand = Signal(8, name=f"{name}_significand")
        m.d.comb += significand.eq(_rom(golden.EXP_TABLE, 8)[index[:8]])
        biased = Signal(signed(12), name=f"{name}_biased")
        m.d.comb += biased.eq(exponent + 127)
        shift = Signal(signed(12), name=f"{name}_shift")
        m.d.comb += shift.eq(1 - biased)
        amount = Signal(range(10), name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift > 9, 9, shift[:4]))
        kept = Signal(8, name=f"{name}_kept")
        rest = Signal(9, name=f"{name}_rest")
        half = Signal(9, name=f"{name}_half")
        m.d.comb += [kept.eq(significand >> amount),
                     rest.eq(significand & ((Const(1, 10) << amount) - 1)),
                     half.eq((Const(1, 10) << amount) >> 1)]
        up = (rest > half) | ((rest == half) & kept[0])
        result = Signal(16, name=f"{name}_bf16")
        with m.If(beat.nan):
            m.d.comb += result.eq(golden.BF16_NAN)
        with m.Elif(magnitude == 0):
            m.d.comb += result.eq(Cat(Const(0, 15), sign))
        with m.Elif(biased >= 255):
            m.d.comb += result.eq(Cat(Const(golden.BF16_MAX, 15), sign))
        with m.Elif(biased >= 1):
            m.d.comb += result.eq(Cat(significand[:7], biased[:8], sign))
        with m.Elif(shift > 9):
            m.d.comb += result.eq(Cat(Const(0, 15), sign))
        with m.Else():
            # 128 after rounding up: the smallest normal, which is encoded the same way.
            m.d.comb += result.eq(Cat((kept + up)[:8], Const(0, 7), sign))
        return result


register(Block(
    name="logfmt_encoder", family="logfmt", config=LogfmtEncoderConfig, build=LogfmtEncoder,
    figures=lambda cfg: {"elements_per_cycle": cfg.lanes,
                         "divider_cycles": golden.divider_cycles(cfg.tile, cfg.lanes),
                         "fifo_rows": golden.encoder_fifo_rows(cfg.tile, cfg.lanes)},
    summary="LogFMT-n encoder: per-tile log range, linear-space rounding, a lane per element",
    demo_configs=({}, {"bits": 10}),
    area_unit="lane", operation="element", area_units=lambda cfg: cfg.lanes,
    legend="elements per cycle",
))

register(Block(
    name="logfmt_decoder", family="logfmt", config=LogfmtDecoderConfig, build=LogfmtDecoder,
    figures=lambda cfg: {"elements_per_cycle": cfg.lanes, "latency_cycles": 1},
    summary="LogFMT-n decoder: 2**(lo + step*(c-1)) as BF16, a lane per element",
    demo_configs=({}, {"bits": 10}),
    area_unit="lane", operation="element", area_units=lambda cfg: cfg.lanes,
    legend="elements per cycle",
    tb="logfmt_decoder",
))
