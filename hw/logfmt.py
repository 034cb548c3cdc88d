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

The decoder is stateless per beat: every beat carries its tile's lo and step. It is a pipeline
of ``golden.logfmt.DECODER_LATENCY`` stages that move together whenever the output register is
free or read.
"""

import dataclasses

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import logfmt as golden
from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.pipeline import StallPipe, leading_one, max_tree, or_tree
from hw.registry import Block, register

__all__ = ["LogfmtEncoderConfig", "LogfmtDecoderConfig", "LogfmtEncoder", "LogfmtDecoder",
           "tile_layout", "bf16_layout"]

LO_BITS = 25                   # signed Q16: -133..128 binades
STEP_BITS = 23                 # Q24: at most 32 * 2**24 / 126
D_BITS = 22                    # 0 <= l - lo <= 32 * 2**16
LOG_BITS = 26                  # signed Q16 log2 and differences
POS_BITS = 19                  # Q8 positions: below 2 * 510 * 2**8
ROUND_BIT = 15                 # the decoder's Q24 value: bit 15 rounds the 8-bit table index


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
    return _log2_from(*_log2_parts(m, magnitude, name), name)


def _log2_parts(m, magnitude, name):
    """:func:`_log2`'s first half: the binade and the 7-bit fraction index (a subnormal
    normalized by its leading one)."""
    field, fraction = magnitude[7:15], magnitude[:7]
    top = leading_one(m, fraction, f"{name}_top")
    exponent = Signal(signed(10), name=f"{name}_exp")
    index = Signal(7, name=f"{name}_frac")
    with m.If(field == 0):                 # subnormal: fraction * 2**-133, normalized
        m.d.comb += [exponent.eq(top - 133),
                     index.eq(((fraction << 7) >> top)[:7])]
    with m.Else():
        m.d.comb += [exponent.eq(field - 127), index.eq(fraction)]
    return exponent, index


def _log2_from(exponent, index, name):
    """:func:`_log2`'s second half: exponent + log2(1 + index/128) from the table, Q16."""
    return ((exponent << golden.LOG_FRAC)
            + _rom(golden.LOG_TABLE, golden.LOG_FRAC)[index])


def _division_magic(width, divisor):
    """``(magic, shift)`` with floor(value / divisor) = (value * magic) >> shift for every
    0 <= value < 2**width (Granlund and Montgomery, 1994, theorem 4.2: m = ceil(2**(N + l) / d)
    with 2**l >= d)."""
    shift = width + ceil_log2(divisor)
    return -(-(1 << shift) // divisor), shift


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

        # After a tile's last row, PARAMS_READY - 1 registered steps (clock rate), each the
        # edge after the one before: the binades and fraction indices of the range; their
        # logs; lo; the difference; step's partial products; step (a
        # division by a constant); its leading one; the normalized step and theta, as the
        # divider starts.
        parts_done, log_done, lo_done, range_done, step_done = (Signal() for _ in range(5))
        m.d.sync += [parts_done.eq(tile_done), log_done.eq(parts_done), lo_done.eq(log_done),
                     range_done.eq(lo_done)]
        parts_any, parts_nan = Signal(), Signal()
        registered = {}
        for side, magnitude in (("hi", run_high), ("lo", ~run_low)):
            parts = _log2_parts(m, magnitude, side)
            registered[side] = [Signal.like(v, name=f"{side}_{n}_r")
                                for v, n in zip(parts, ("exp", "index"))]
            with m.If(tile_done):
                m.d.sync += [r.eq(v) for r, v in zip(registered[side], parts)]
        hi_parts, lo_parts = registered["hi"], registered["lo"]
        with m.If(tile_done):
            m.d.sync += [parts_any.eq(run_any), parts_nan.eq(run_nan)]
        hi_log = Signal(signed(LOG_BITS))
        lo_log = Signal(signed(LOG_BITS))
        log_any, log_nan = Signal(), Signal()
        with m.If(parts_done):
            m.d.sync += [hi_log.eq(_log2_from(*hi_parts, "hi")),
                         lo_log.eq(_log2_from(*lo_parts, "lo")),
                         log_any.eq(parts_any), log_nan.eq(parts_nan)]
        floor_log = Signal(signed(LOG_BITS))
        m.d.comb += floor_log.eq(hi_log - (golden.RANGE_BINADES << golden.LOG_FRAC))
        lo = Signal(signed(LOG_BITS))
        lo_hi = Signal(signed(LOG_BITS))
        lo_any, lo_nan = Signal(), Signal()
        with m.If(log_done):
            m.d.sync += [lo.eq(Mux(~log_any, 0, Mux(lo_log > floor_log, lo_log, floor_log))),
                         lo_hi.eq(hi_log), lo_any.eq(log_any), lo_nan.eq(log_nan)]
        diff = Signal(D_BITS)
        range_lo = Signal(signed(LOG_BITS))
        range_nan = Signal()
        with m.If(lo_done):
            m.d.sync += [diff.eq(Mux(lo_any, lo_hi - lo, 0)), range_lo.eq(lo),
                         range_nan.eq(lo_nan)]
        # step = floor(diff * 2**8 / (levels - 1)) = (diff * magic) >> (shift - 8): the
        # product as four partial products (11-bit halves of diff, 16-bit halves of magic),
        # registered, then added and shifted.
        extra = golden.STEP_FRAC - golden.LOG_FRAC
        magic, magic_shift = _division_magic(D_BITS + extra, levels - 1)
        half_d, half_m = D_BITS // 2, 16
        magic_lo, magic_hi = magic & ((1 << half_m) - 1), magic >> half_m
        partials = {}
        for d_name, d_part in (("lo", diff[:half_d]), ("hi", diff[half_d:])):
            for m_name, m_part in (("lo", magic_lo), ("hi", magic_hi)):
                # Loaded every edge: read only at the edge after range_done.
                partial = Signal(len(d_part) + max(1, m_part.bit_length()),
                                 name=f"step_partial_{d_name}{m_name}")
                m.d.sync += partial.eq(d_part * m_part)
                partials[d_name + m_name] = partial
        partial_lo = Signal(signed(LOG_BITS))
        partial_nan, partial_done = Signal(), Signal()
        m.d.sync += partial_done.eq(range_done)
        with m.If(range_done):
            m.d.sync += [partial_lo.eq(range_lo), partial_nan.eq(range_nan)]
        product = (partials["lolo"] + (partials["lohi"] << half_m)
                   + ((partials["hilo"] + (partials["hihi"] << half_m)) << half_d))
        step = Signal(STEP_BITS)
        step_lo = Signal(signed(LOG_BITS))
        step_nan = Signal()
        m.d.sync += step_done.eq(partial_done)
        with m.If(partial_done):
            m.d.sync += [step.eq(product >> (magic_shift - extra)),
                         step_lo.eq(partial_lo), step_nan.eq(partial_nan)]
        top = Signal(range(STEP_BITS))                         # e - 1
        top_step = Signal(STEP_BITS)
        top_lo = Signal(signed(LOG_BITS))
        top_nan, top_done = Signal(), Signal()
        m.d.sync += top_done.eq(step_done)
        with m.If(step_done):
            m.d.sync += [top.eq(leading_one(m, step, "step_top")), top_step.eq(step),
                         top_lo.eq(step_lo), top_nan.eq(step_nan)]
        normalized = Signal(STEP_BITS + 1)                     # step * 2**(24 - e)
        m.d.comb += normalized.eq((top_step << STEP_BITS) >> top)

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
        with m.If(top_done):
            m.d.sync += [rem.eq(1 << (2 * divisor_bits - total_bits)), quotient.eq(0),
                         divisor.eq(normalized), left.eq(div_cycles),
                         tile_lo.eq(top_lo), tile_step.eq(top_step), tile_nan.eq(top_nan),
                         tile_shift.eq(top + 1 + 8),
                         tile_theta.eq((1 << (golden.POS_FRAC - 1))
                                       + ((top_step * golden.LN2_Q16) >> 35))]
        written = Signal(params_layout)
        m.d.comb += [written.lo.eq(tile_lo), written.step.eq(tile_step),
                     written.nan.eq(tile_nan), written.recip.eq(q),
                     written.shift.eq(tile_shift), written.theta.eq(tile_theta),
                     params.w_en.eq(finishing), params.w_data.eq(written.as_value())]

        # Pass 2: rows out of the FIFO, one a cycle, through ENCODER_STAGES registers that
        # move together whenever the output register is free or being read (clock rate): the
        # row; the binades and fraction indices; the logs; d = log - lo; four partial products
        # with recip; their sum; the shift into Q8 positions; the codes into the output
        # register.
        current = Signal(params_layout)
        m.d.comb += current.eq(params.r_data)
        advance = Signal()
        m.d.comb += advance.eq(~self.out.valid | self.out.ready)
        pipe = StallPipe(advance)
        out_row = Signal(range(beats))
        pop = Signal()
        m.d.comb += pop.eq(elements.r_rdy & params.r_rdy & advance)
        last = out_row == beats - 1
        m.d.comb += [elements.r_en.eq(pop), params.r_en.eq(pop & last)]
        with m.If(pop):
            m.d.sync += out_row.eq(Mux(last, 0, out_row + 1))
        row = elements.r_data
        tile = {"lo": current.lo, "step": current.step, "nan": current.nan, "last": last,
                "recip": current.recip, "shift": current.shift, "theta": current.theta,
                "step_zero": current.step == 0}
        # Each stage computes from the registers of the one before (lanes and tile alike),
        # then registers its results beside a copy of the tile's fields.
        valid = pop
        lanes_state = [row[16 * lane:16 * lane + 16] for lane in range(lanes)]
        for stage, step in (("row", self._row_stage), ("fields", self._fields_stage),
                            ("log", self._log_stage),
                            ("difference", self._difference_stage),
                            ("partials", self._partials_stage),
                            ("product", self._product_stage),
                            ("position", self._position_stage)):
            lanes_state = [step(m, pipe, state, tile, f"e{lane}")
                           for lane, state in enumerate(lanes_state)]
            valid = pipe.reg(valid, f"{stage}_valid")
            tile = {key: pipe.reg(value, f"{stage}_{key}") for key, value in tile.items()}
        codes = [self._code(m, state, tile, levels, f"e{lane}")
                 for lane, state in enumerate(lanes_state)]
        out = self.out.payload
        pipe.add(self.out.valid.eq(valid), out.lo.eq(tile["lo"]), out.step.eq(tile["step"]),
                 out.nan.eq(tile["nan"]), out.last.eq(tile["last"]))
        pipe.add(*[out.codes[lane].eq(code) for lane, code in enumerate(codes)])
        pipe.emit(m)
        return m

    def _row_stage(self, m, pipe, code, tile, name):
        """Stage 1: the element as read from the FIFO, registered."""
        return pipe.reg(code, f"{name}_code_r")

    def _fields_stage(self, m, pipe, code, tile, name):
        """Stage 2: the element's binade and fraction index, registered with its sign and
        class."""
        sign, nan, zero, magnitude = _bf16_fields(code)
        exponent, index = _log2_parts(m, magnitude, name)
        return {"sign": pipe.reg(sign, f"{name}_sign_r0"),
                "void": pipe.reg(nan | zero, f"{name}_void_r0"),
                "exponent": pipe.reg(exponent, f"{name}_exp_r"),
                "index": pipe.reg(index, f"{name}_index_r")}

    def _log_stage(self, m, pipe, state, tile, name):
        """Stage 3: the element's log2 (the table), registered with its sign and class."""
        log = Signal(signed(LOG_BITS), name=f"{name}_log")
        m.d.comb += log.eq(_log2_from(state["exponent"], state["index"], name))
        return {"sign": pipe.reg(state["sign"], f"{name}_sign_r1"),
                "void": pipe.reg(state["void"], f"{name}_void_r1"),
                "log": pipe.reg(log, f"{name}_log_r")}

    def _difference_stage(self, m, pipe, state, tile, name):
        """Stage 4: d = log - lo, registered with the class it gives."""
        d = Signal(signed(LOG_BITS + 1), name=f"{name}_d")
        m.d.comb += d.eq(state["log"] - tile["lo"])
        return {"sign": pipe.reg(state["sign"], f"{name}_sign_r"),
                "void": pipe.reg(state["void"] | (d < -(1 << golden.LOG_FRAC)),
                                 f"{name}_void_r"),
                "below": pipe.reg(d < 0, f"{name}_below_r"),
                "d": pipe.reg(d[:D_BITS], f"{name}_d_r")}

    def _partials_stage(self, m, pipe, state, tile, name):
        """Stage 5: d * recip (22 x 26 bits) as four partial products of 11 x 13 bits, each
        one DSP multiplier with its result registered."""
        d, recip = state["d"], tile["recip"]
        half_d, half_r = D_BITS // 2, golden.RECIP_BITS // 2
        parts = {}
        for d_part, d_bits in (("lo", d[:half_d]), ("hi", d[half_d:])):
            for r_part, r_bits in (("lo", recip[:half_r]), ("hi", recip[half_r:])):
                parts[d_part + r_part] = pipe.reg(d_bits * r_bits,
                                                  f"{name}_partial_{d_part}{r_part}")
        return {"sign": pipe.reg(state["sign"], f"{name}_sign_r2"),
                "void": pipe.reg(state["void"], f"{name}_void_r2"),
                "below": pipe.reg(state["below"], f"{name}_below_r2"),
                "parts": parts}

    def _product_stage(self, m, pipe, state, tile, name):
        """Stage 6: the partial products added into d * recip, registered."""
        half_d, half_r = D_BITS // 2, golden.RECIP_BITS // 2
        parts = state["parts"]
        product = Signal(D_BITS + golden.RECIP_BITS, name=f"{name}_product")
        m.d.comb += product.eq(parts["lolo"] + (parts["lohi"] << half_r)
                               + ((parts["hilo"] + (parts["hihi"] << half_r)) << half_d))
        return {"sign": pipe.reg(state["sign"], f"{name}_sign_r3"),
                "void": pipe.reg(state["void"], f"{name}_void_r3"),
                "below": pipe.reg(state["below"], f"{name}_below_r3"),
                "product": pipe.reg(product, f"{name}_product_r")}

    def _position_stage(self, m, pipe, state, tile, name):
        """Stage 7: the Q8 position product >> shift, registered."""
        pos = Signal(POS_BITS, name=f"{name}_pos")
        m.d.comb += pos.eq(state["product"] >> tile["shift"])
        return {"sign": pipe.reg(state["sign"], f"{name}_sign_r4"),
                "void": pipe.reg(state["void"], f"{name}_void_r4"),
                "below": pipe.reg(state["below"], f"{name}_below_r4"),
                "pos": pipe.reg(pos, f"{name}_pos_r")}

    def _code(self, m, state, tile, levels, name):
        """Stage 8 (into the output register): the level k, rounded in linear space by the
        comparison with theta, and the code."""
        pos = state["pos"]
        # k = floor(pos) + (frac(pos) >= theta); the code is k + 1, clamped at levels. Both
        # values of the rounding bit are worked out beside its comparison (clock rate: no
        # add, then compare, then add in series).
        whole = pos[golden.POS_FRAC:]
        up = Signal(name=f"{name}_up")
        m.d.comb += up.eq(pos[:golden.POS_FRAC] >= tile["theta"])
        magnitude_code = Signal(range(levels + 1), name=f"{name}_code")
        with m.If(state["void"]):
            m.d.comb += magnitude_code.eq(0)
        with m.Elif(state["below"] | tile["step_zero"]):
            m.d.comb += magnitude_code.eq(1)
        with m.Elif(Mux(up, whole >= levels - 2, whole >= levels - 1)):
            m.d.comb += magnitude_code.eq(levels)
        with m.Else():
            m.d.comb += magnitude_code.eq(Mux(up, whole + 2, whole + 1))
        return Cat(magnitude_code, state["sign"])


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
        # DECODER_LATENCY stages that all move together (golden.logfmt.DECODER_LATENCY): the
        # product and sum; the exponent and the table; the BF16 field, the subnormal shift and
        # the case; the packing into the output register. They move whenever the output
        # register is free or being read, so the ready rule is the one-register rule:
        # inp.ready = ~out.valid | out.ready.
        advance = Signal()
        m.d.comb += [advance.eq(~self.out.valid | self.out.ready), self.inp.ready.eq(advance)]
        pipe = StallPipe(advance)
        valid = self.inp.valid
        last = beat.last
        lanes = [self._sum(m, pipe, beat.codes[lane], beat, f"d{lane}")
                 for lane in range(cfg.lanes)]
        valid, last = pipe.reg(valid, "sum_valid"), pipe.reg(last, "sum_last")
        lanes = [self._exponent(m, pipe, lane, f"d{index}") for index, lane in enumerate(lanes)]
        valid, last = pipe.reg(valid, "exp_valid"), pipe.reg(last, "exp_last")
        lanes = [self._classify(m, pipe, lane, f"d{index}") for index, lane in enumerate(lanes)]
        valid, last = pipe.reg(valid, "class_valid"), pipe.reg(last, "class_last")
        packed = Signal.like(self.out.payload)
        m.d.comb += [packed.last.eq(last)]
        m.d.comb += [packed.data[index].eq(self._pack(m, lane, f"d{index}"))
                     for index, lane in enumerate(lanes)]
        pipe.add(self.out.valid.eq(valid), self.out.payload.eq(packed))
        pipe.emit(m)
        return m

    def _sum(self, m, pipe, code, beat, name):
        """Stage 1: lo + step * (c - 1) in Q24, registered with the flags the packing needs."""
        bits = self.config.bits
        frac = golden.STEP_FRAC
        magnitude = code[:bits - 1]
        value = Signal(signed(LO_BITS + 9 + 1), name=f"{name}_value")
        m.d.comb += value.eq((beat.lo << (frac - golden.LOG_FRAC)) + beat.step * (magnitude - 1))
        # Only bits 15 and up reach the result (the table index rounds bit 15 into bit 16).
        return {"value": pipe.reg(value[ROUND_BIT:].as_signed(), f"{name}_value_r"),
                "sign": pipe.reg(code[bits - 1], f"{name}_sign_r"),
                "zero": pipe.reg(magnitude == 0, f"{name}_zero_r"),
                "nan": pipe.reg(beat.nan, f"{name}_nan_r")}

    def _exponent(self, m, pipe, lane, name):
        """Stage 2: the binade and the 2**(i/256) table entry, registered."""
        frac = golden.STEP_FRAC - ROUND_BIT
        value = lane["value"]                       # the Q24 value >> ROUND_BIT
        index = Signal(9, name=f"{name}_index")
        m.d.comb += index.eq((value[:frac] + 1) >> 1)
        exponent = Signal(signed(12), name=f"{name}_exponent")
        m.d.comb += exponent.eq((value >> frac) + index[8])
        significand = Signal(8, name=f"{name}_significand")
        m.d.comb += significand.eq(_rom(golden.EXP_TABLE, 8)[index[:8]])
        return {"sign": pipe.reg(lane["sign"], f"{name}_sign_r2"),
                "zero": pipe.reg(lane["zero"], f"{name}_zero_r2"),
                "nan": pipe.reg(lane["nan"], f"{name}_nan_r2"),
                "exponent": pipe.reg(exponent, f"{name}_exponent_r"),
                "significand": pipe.reg(significand, f"{name}_significand_r")}

    def _classify(self, m, pipe, lane, name):
        """Stage 3: the BF16 exponent field, the subnormal shift (one-hot) and which case of the
        packing applies, registered."""
        biased = Signal(signed(12), name=f"{name}_biased")
        m.d.comb += biased.eq(lane["exponent"] + 127)
        shift = Signal(signed(12), name=f"{name}_shift")
        m.d.comb += shift.eq(1 - biased)
        amount = Signal(range(10), name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift > 9, 9, shift[:4]))
        one_hot = Signal(10, name=f"{name}_amount_one_hot")      # registered decoded: stage
        m.d.comb += one_hot.eq(Const(1, 10) << amount)            # 4 selects, no shifter
        # The packing's cases, first match wins: NaN tile; zero code or a value below half the
        # smallest subnormal (signed zero); above the largest finite value (saturated);
        # normal; subnormal (rounded to nearest even).
        signed_zero = lane["zero"] | ((biased < 1) & (shift > 9))
        return {"sign": pipe.reg(lane["sign"], f"{name}_sign_r3"),
                "nan": pipe.reg(lane["nan"], f"{name}_nan_r3"),
                "signed_zero": pipe.reg(signed_zero, f"{name}_zero_r3"),
                "saturated": pipe.reg(biased >= 255, f"{name}_saturated_r"),
                "normal": pipe.reg(biased >= 1, f"{name}_normal_r"),
                "significand": pipe.reg(lane["significand"], f"{name}_significand_r3"),
                "field": pipe.reg(biased[:8], f"{name}_field_r"),
                "one_hot": pipe.reg(one_hot, f"{name}_amount_r")}

    def _pack(self, m, lane, name):
        """Stage 4 (into the output register): the BF16 code, subnormals rounded to nearest
        even, saturation above the largest finite value."""
        sign, significand, one_hot = lane["sign"], lane["significand"], lane["one_hot"]
        # Subnormal rounding by a shift of a = 1..9 (one-hot): kept = significand >> a; the
        # round bit is bit a - 1, the sticky bits those below it; round to nearest even.
        kept = Signal(8, name=f"{name}_kept")
        round_bit = Signal(name=f"{name}_round")
        sticky = Signal(name=f"{name}_sticky")
        m.d.comb += [
            kept.eq(or_tree([Mux(one_hot[a], significand >> a, 0) for a in range(1, 10)])),
            round_bit.eq(or_tree([one_hot[a] & significand[a - 1] for a in range(1, 9)])),
            # No sticky term for a = 7 (kept = 1, odd: the round bit alone decides) or a = 9
            # (the round bit, bit 8, is 0): significands are 128..255.
            sticky.eq(or_tree([one_hot[a] & significand[:a - 1].any()
                               for a in (2, 3, 4, 5, 6, 8)])),
        ]
        up = round_bit & (sticky | kept[0])
        result = Signal(16, name=f"{name}_bf16")
        with m.If(lane["nan"]):
            m.d.comb += result.eq(golden.BF16_NAN)
        with m.Elif(lane["signed_zero"]):
            m.d.comb += result.eq(Cat(Const(0, 15), sign))
        with m.Elif(lane["saturated"]):
            m.d.comb += result.eq(Cat(Const(golden.BF16_MAX, 15), sign))
        with m.Elif(lane["normal"]):
            m.d.comb += result.eq(Cat(significand[:7], lane["field"], sign))
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
    figures=lambda cfg: {"elements_per_cycle": cfg.lanes,
                         "latency_cycles": golden.DECODER_LATENCY},
    summary="LogFMT-n decoder: 2**(lo + step*(c-1)) as BF16, a lane per element",
    demo_configs=({}, {"bits": 10}),
    area_unit="lane", operation="element", area_units=lambda cfg: cfg.lanes,
    legend="elements per cycle",
    tb="logfmt_decoder",
))
