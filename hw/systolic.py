"""Systolic-array generators: output-stationary and weight-stationary arrays, and tiles.

Sources: SambaNova SN40L's PCU (an output-stationary systolic array fed left-to-right and
top-to-bottom, results drained to output FIFOs) and Mozart's tiles of systolic arrays whose local
adder tree sums partial results. The stream contracts are in docs/blocks/systolic.md.

All three blocks share one structure: a free-running skewed PE grid whose every register moves on
one enable, ``advance``. ``advance`` is the output FIFO's ``w_rdy``: when the consumer stalls long
enough to fill the FIFO the whole pipeline (and so the input) freezes, and nothing in flight is
lost. With the consumer always ready the FIFO never fills, so the pipeline never stalls.
"""

import dataclasses
import operator
from functools import reduce

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from golden import fp as golden_fp
from golden import systolic as golden
from hw.fp import FpAccumulator
from hw.fparith import fp_add
from hw.params import ConfiguredComponent, choice_param, int_param, param_error, validate
from hw.pipeline import OutputQueue, OutputRegister, lanes_layout
from hw.registry import Block, register

__all__ = ["os_grid", "SystolicConfig", "SystolicTileConfig", "OutputStationaryArray",
           "WeightStationaryArray", "SystolicTile"]

# The floating-point datapath (seed 003 §3.1; the numerics of ``fp_dot``, one product per PE a
# cycle). With ``dtype`` int these four are unused and the Verilog is the integer array's.
DTYPE_PARAM = choice_param("int", ("int", "fp8_e4m3", "fp8_e5m2", "bf16"),
                           "operands: in_width-bit integers, or FP8/BF16 codes")
ACC_FRAC_PARAM = int_param(13, 4, 24, "F, fraction bits of a PE's accumulator (floating point)")
PROMOTE_PARAM = int_param(128, 0, 128, "K elements per promotion into FP32 (floating point; "
                          "0: at the end)")
SCALE_PARAM = choice_param("fp32", ("fp32", "e8m0"), "format of the scales (floating point)")
SCALE_BLOCK = 128                  # elements of K per scale (1x128 tiles, 128x128 blocks)
# Latency for clock rate (docs/blocks/systolic.md, "Clock rate"): the registers between an
# integer output-stationary PE's operands and its accumulator adder. Unused by the
# weight-stationary PE (one product register) and the floating-point PEs (none).
PE_STAGES_PARAM = int_param(golden.OS_PE_STAGES, 0, 3,
                            "registers from an integer OS PE's operands to its adder (0: none; "
                            "1: the product; 2: operands, product; 3: operands, product twice)")


def _check_float(config):
    if config.promote_every and SCALE_BLOCK % config.promote_every:
        raise param_error("promote_every", config.promote_every,
                          f"0 or a divisor of {SCALE_BLOCK} (one scale pair per partial sum)")


def is_float(config):
    return getattr(config, "dtype", "int") != "int"


def code_width(config):
    """Bits of an input lane: in_width, or the operand format's code."""
    return golden_fp.FORMATS[config.dtype].width if is_float(config) else config.in_width


def scale_bits(config):
    return golden_fp.SCALE_BITS[config.scale_format]


@dataclasses.dataclass(frozen=True)
class SystolicConfig:
    """Parameters of one systolic array (block ``systolic``).

    Parameters
    ----------
    rows : int
        R, rows of PEs (1..64): the rows of A in OS, the rows of W in WS.
    cols : int
        C, columns of PEs (1..64).
    dataflow : str
        ``"os"`` (output-stationary) or ``"ws"`` (weight-stationary).
    in_width : int
        Width of the signed input lanes (2..16).
    acc_width : int
        Width of the signed accumulators and output lanes (2..64); sums wrap in two's complement.
    pe_stages : int
        Registers from an integer output-stationary PE's operands to its accumulator adder
        (0..3, default ``golden.systolic.OS_PE_STAGES`` = 3): each adds an edge of latency.

    Raises
    ------
    hw.params.ParamError
        A parameter is out of range; the message names it, the value and the allowed range.
    """
    rows: int = int_param(4, 1, 64, "PE rows R")
    cols: int = int_param(4, 1, 64, "PE columns C")
    dataflow: str = choice_param("os", ("os", "ws"), "output- or weight-stationary")
    in_width: int = int_param(8, 2, 16, "signed input lane width")
    acc_width: int = int_param(32, 2, 64, "signed accumulator width (wraps)")
    dtype: str = DTYPE_PARAM
    acc_frac: int = ACC_FRAC_PARAM
    promote_every: int = PROMOTE_PARAM
    scale_format: str = SCALE_PARAM
    pe_stages: int = PE_STAGES_PARAM

    def __post_init__(self):
        validate(self)
        _check_float(self)
        if self.dtype != "int" and self.dataflow != "os":
            raise param_error("dataflow", self.dataflow,
                              f"'os' with dtype {self.dtype} (the floating-point PEs are "
                              "output-stationary)")


@dataclasses.dataclass(frozen=True)
class SystolicTileConfig:
    """Parameters of a tile of output-stationary arrays with an adder tree (``systolic_tile``).

    Parameters
    ----------
    rows, cols, in_width, acc_width, pe_stages
        As in :class:`SystolicConfig`, for every array of the tile.
    arrays : int
        n, the number of arrays (1..16); each takes one K-slice per beat.
    """
    rows: int = int_param(4, 1, 64, "PE rows R of each array")
    cols: int = int_param(4, 1, 64, "PE columns C of each array")
    arrays: int = int_param(4, 1, 16, "arrays n, each fed one K-slice")
    in_width: int = int_param(8, 2, 16, "signed input lane width")
    acc_width: int = int_param(32, 2, 64, "signed accumulator width (wraps)")
    dtype: str = DTYPE_PARAM
    acc_frac: int = ACC_FRAC_PARAM
    promote_every: int = PROMOTE_PARAM
    scale_format: str = SCALE_PARAM
    pe_stages: int = PE_STAGES_PARAM

    def __post_init__(self):
        validate(self)
        _check_float(self)


def float_layout(lanes, scales, config):
    """A floating-point input beat: ``data`` (lanes codes of ``dtype``), ``scale`` (``scales``
    codes of ``scale_format``: the block's scale for each row of A, or for each slice of B),
    ``last``."""
    return data.StructLayout({"data": data.ArrayLayout(code_width(config), lanes),
                              "scale": data.ArrayLayout(scale_bits(config), scales),
                              "last": 1})


class _ArrayComponent(ConfiguredComponent):
    """Ports and output stage shared by the systolic blocks.

    Parameters
    ----------
    config : SystolicConfig or SystolicTileConfig
    inputs : dict of str to int
        Input stream name -> lane count (lanes of ``in_width``). Every block adds the output
        stream ``c`` (``cols`` lanes of ``acc_width``) and the sticky ``error`` flag.
    """

    def __init__(self, config, inputs, scales=None, always_ready=False):
        self.always_ready = always_ready
        if is_float(config):
            members = {name: In(stream.Signature(float_layout(lanes, scales[name], config)))
                       for name, lanes in inputs.items()}
            members["c"] = Out(stream.Signature(lanes_layout(config.cols, 32, is_signed=False)))
        else:
            members = {name: In(stream.Signature(lanes_layout(lanes, config.in_width)))
                       for name, lanes in inputs.items()}
            members["c"] = Out(stream.Signature(lanes_layout(config.cols, config.acc_width)))
        members["error"] = Out(1)
        super().__init__(config, members)
        # Not a port: high in a cycle where a row would be written into a full output queue
        # (which would lose it). Read only by the formal harness (flows/formal.py), which
        # asserts it never rises; nothing in the block reads it, so synthesis drops it.
        self.queue_overflow = Signal(name="queue_overflow")

    def _join(self, m, pipe):
        cfg = self.config
        return _OSJoin(m, pipe, self.a, self.b, self.error, cfg.rows,
                       cfg.promote_every if is_float(cfg) else None)

    def _grid(self, m, pipe, join, a_lanes, b_lanes, prefix):
        """An OS grid on these lanes: integer, or floating-point PEs whose A lanes carry
        their row's scale and B lanes their slice's."""
        cfg = self.config
        if not is_float(cfg):
            return os_grid(m, pipe, cfg.rows, cfg.cols, cfg.acc_width,
                           [data for data, _ in a_lanes], [data for data, _ in b_lanes],
                           join.take, join.first, join.last, prefix=prefix,
                           product_stages=cfg.pe_stages)
        width = code_width(cfg)

        def pe(a_in, b_in, flags, name):
            valid, first, last, part_first, promote = (flags[k] for k in range(5))
            accumulator = FpAccumulator(m, cfg.dtype, 1, cfg.acc_frac, cfg.scale_format, name)
            updates, _ = accumulator.step([a_in[:width]], [b_in[:width]], a_in[width:],
                                          b_in[width:], part_first, first, promote | last, last)
            with m.If(pipe.enable & valid):
                m.d.sync += updates
            return accumulator.total_code

        return os_grid(m, pipe, cfg.rows, cfg.cols, 32,
                       [Cat(data, scale) for data, scale in a_lanes],
                       [Cat(data, scale) for data, scale in b_lanes],
                       join.take, join.first, join.last, prefix=prefix, pe=pe,
                       extra_flags=join.float_flags)

    def _lanes(self, port, first, count, scale_of):
        """``count`` lanes of ``port`` from ``first``: (data, its scale or None)."""
        payload = port.payload
        return [(payload.data[first + k],
                 payload.scale[scale_of(first + k)] if is_float(self.config) else None)
                for k in range(count)]

    def _output_stage(self, m):
        """The output queue on ``c`` and the pipeline that moves while it has a free slot; with
        ``always_ready``, an output register and a pipeline that never stalls."""
        if self.always_ready:
            queue = OutputRegister(m, self.c, overflow=self.queue_overflow)
        else:
            queue = OutputQueue(m, self.c, overflow=self.queue_overflow, registered_space=True)
        return queue, queue.stall_pipe()


def _drive_output(m, queue, c, row_valid, row_last, row_data, advance):
    """Write an aligned row into the output queue of stream ``c``."""
    row = Signal(c.payload.shape())
    m.d.comb += row.last.eq(row_last)
    queue.push(m, row_valid & advance, row.as_value())
    m.d.comb += [row.data[j].eq(value) for j, value in enumerate(row_data)]


def os_grid(m, pipe, rows, cols, acc_width, a_lanes, b_lanes, valid, first, last, prefix,
            product=operator.mul, readout="rows", pe=None, extra_flags=(), product_stages=0):
    """Build an output-stationary PE grid; return (out_valid, out_last, out_values).

    Beat k enters row i of A delayed by i stages and column j of B delayed by j stages, so PE
    (i, j) sees pair k ``i + j`` cycles after the beat was taken. On the pair flagged ``last`` a PE
    raises ``done`` with its final sum; every column ORs its (one-hot in time) done sums, and a
    deskew of ``cols-1-j`` stages on column j aligns row i's C sums into one output row.

    ``product(a, b)`` is what a PE adds (``a * b``; the spiking array adds ``a`` when the spike
    ``b`` is 1, no multiplier). ``readout="columns"`` transposes the readout: every row ORs its
    done sums and a deskew of ``rows-1-i`` stages on row i aligns column j's R sums, so the grid
    emits one column per cycle, column j of a tile ``j`` cycles after column 0 (in rows mode
    row i leaves ``i`` cycles after row 0).

    ``pe(a, b, flags, name)``, when given, builds a PE other than the integer accumulator: it
    makes its own registers, updated where ``flags`` (valid, first, last, ``extra_flags``...)
    say, and returns the register read out at ``done`` (the floating-point PE).

    ``product_stages``: registers between the integer PE's operands and its accumulator adder
    (the arrays pass their ``pe_stages``, 3 by default; the spiking array none): 0 none, 1
    ``product(a, b)``'s (with its flags), 2 and more the operands' and then the product's
    ``product_stages - 1`` times; every result leaves that many edges later.
    On ECP5 the operand registers and the first product register become the DSP's own
    (flows/dsp_pack.py), and the second product register, in fabric, gives the route out of a DSP
    placed far from its adder a cycle to itself: the route into the DSP, the multiplier, the
    route out and the accumulator's carry chain are each in a cycle of their own.
    """
    flags = Cat(valid, first, last, *extra_flags)
    b_down = [pipe.delay(b_lanes[j], j, f"{prefix}bskew{j}") for j in range(cols)]
    acc = [[None] * cols for _ in range(rows)]
    done = [[None] * cols for _ in range(rows)]
    for i in range(rows):
        a_in = pipe.delay(a_lanes[i], i, f"{prefix}askew{i}")
        flags_in = pipe.delay(flags, i, f"{prefix}fskew{i}")
        for j in range(cols):
            b_in = b_down[j]
            pe_valid, pe_first, pe_last = flags_in[0], flags_in[1], flags_in[2]
            done[i][j] = Signal(name=f"{prefix}done_{i}_{j}")
            stages = product_stages if pe is None else 0
            # The flags one edge on: the next column's, and the product stages' own.
            flags_next = (pipe.reg(flags_in, f"{prefix}f_{i}_{j}")
                          if j + 1 < cols or stages else None)
            if pe is not None:
                acc[i][j] = pe(a_in, b_in, flags_in, f"{prefix}pe_{i}_{j}_")
            else:
                acc[i][j] = Signal(signed(acc_width), name=f"{prefix}acc_{i}_{j}")
                if stages >= 2:
                    # The operands' own registers (not the skew registers, which also feed the
                    # next PE), then the product's.
                    term = product(pipe.reg(a_in, f"{prefix}pa_{i}_{j}", reset_less=True),
                                   pipe.reg(b_in, f"{prefix}pb_{i}_{j}", reset_less=True))
                    term = pipe.delay(term, stages - 1, f"{prefix}prod_{i}_{j}", reset_less=True)
                    pe_flags = pipe.delay(flags_next, stages - 1, f"{prefix}pf_{i}_{j}")
                    pe_valid, pe_first, pe_last = pe_flags[0], pe_flags[1], pe_flags[2]
                elif stages == 1:           # the product's register alone
                    term = pipe.reg(product(a_in, b_in), f"{prefix}prod_{i}_{j}",
                                    reset_less=True)
                    pe_valid, pe_first, pe_last = flags_next[0], flags_next[1], flags_next[2]
                else:
                    term = product(a_in, b_in)
                # Truncation on assignment is the documented wrap-around.
                update = Mux(pe_first, 0, acc[i][j]) + term
                with m.If(pipe.enable & pe_valid):
                    m.d.sync += acc[i][j].eq(update)
            pipe.add(done[i][j].eq(pe_valid & pe_last))
            if j + 1 < cols:
                a_in = pipe.reg(a_in, f"{prefix}a_{i}_{j}")
                flags_in = flags_next
            if i + 1 < rows:
                b_down[j] = pipe.reg(b_in, f"{prefix}b_{i}_{j}")
    if readout == "columns":
        column_values = []
        for i in range(rows):
            row = reduce(operator.or_, [Mux(done[i][j], acc[i][j], 0) for j in range(cols)])
            row = pipe.reg(row, f"{prefix}row{i}")
            column_values.append(pipe.delay(row, rows - 1 - i, f"{prefix}deskew{i}"))
        column_valid = pipe.reg(reduce(operator.or_, [done[rows - 1][j] for j in range(cols)]),
                                f"{prefix}column_valid")
        column_last = pipe.reg(done[rows - 1][cols - 1], f"{prefix}column_last")
        return column_valid, column_last, column_values
    row_values = []
    for j in range(cols):
        column = reduce(operator.or_, [Mux(done[i][j], acc[i][j], 0) for i in range(rows)])
        column = pipe.reg(column, f"{prefix}col{j}")
        row_values.append(pipe.delay(column, cols - 1 - j, f"{prefix}deskew{j}"))
    row_valid = pipe.reg(reduce(operator.or_, [done[i][cols - 1] for i in range(rows)]),
                         f"{prefix}row_valid")
    row_last = pipe.reg(done[rows - 1][cols - 1], f"{prefix}row_last")
    return row_valid, row_last, row_values


class _OSJoin:
    """Pairs the k-th beat of ``a`` with the k-th beat of ``b`` and enforces tile spacing.

    A tile's results leave column j on R consecutive cycles; two tiles whose ``last`` beats are
    fewer than R cycles apart would collide there, so a ``last`` beat waits until R advancing
    cycles have passed since the previous one. Tiles with K >= R never wait.
    """

    def __init__(self, m, pipe, a, b, error, rows, promote_every=None):
        since_last = Signal(range(rows + 1), init=rows)
        spacing_ok = since_last >= rows
        self.take = Signal()
        self.first = Signal(init=1)
        self.last = a.payload.last
        m.d.comb += [self.take.eq(pipe.enable & a.valid & b.valid & (~a.payload.last | spacing_ok)),
                     a.ready.eq(self.take), b.ready.eq(self.take)]
        with m.If(self.take):
            m.d.sync += self.first.eq(a.payload.last)
            # Protocol misuse: the tile boundary follows `a.last`; a disagreeing `b.last` is
            # reported on the sticky `error` output (cleared only by reset).
            with m.If(a.payload.last != b.payload.last):
                m.d.sync += error.eq(1)
        with m.If(pipe.enable):
            with m.If(self.take & a.payload.last):
                m.d.sync += since_last.eq(1)
            with m.Elif(~spacing_ok):
                m.d.sync += since_last.eq(since_last + 1)
        self.float_flags = ()
        if promote_every is not None:
            # Floating point: a beat starts a partial sum (its index in the tile is a multiple
            # of promote_every, or 0) or ends one (promotes: the next index is a multiple).
            if promote_every:
                chunk = Signal(range(promote_every), name="chunk_index")
                part_first, promote = chunk == 0, chunk == promote_every - 1
                with m.If(self.take):
                    m.d.sync += chunk.eq(Mux(self.last | promote, 0, chunk + 1))
            else:
                part_first, promote = self.first, Const(0)
            self.float_flags = (part_first, promote)


class OutputStationaryArray(_ArrayComponent):
    """Output-stationary R x C systolic array (block ``systolic``, ``dataflow="os"``).

    Computes C = A·B per tile: beat k of ``a`` is column k of A (R lanes), beat k of ``b`` is row
    k of B (C lanes), ``last`` marks beat K-1. After the tile ``c`` emits R beats, beat i being row
    i of A·B (C lanes of ``acc_width``, wrapping), ``last`` on beat R-1. Tiles with K >= R stream
    back to back with no bubble; first output ``K + C + 4`` cycles after the first input transfer
    (``K + C + 1`` with floating-point PEs, which register no product).

    Members
    -------
    a : In(stream.Signature(lanes_layout(rows, in_width)))
    b : In(stream.Signature(lanes_layout(cols, in_width)))
    c : Out(stream.Signature(lanes_layout(cols, acc_width)))
    error : Out(1)
        Sticky: set when a paired beat has ``a.last != b.last`` (the tile follows ``a.last``).
    """

    def __init__(self, config):
        if config.dataflow != "os":
            raise ValueError(f"OutputStationaryArray needs dataflow='os', got {config.dataflow!r}")
        super().__init__(config, {"a": config.rows, "b": config.cols},
                         {"a": config.rows, "b": 1})

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        queue, pipe = self._output_stage(m)
        join = self._join(m, pipe)
        row_valid, row_last, row_values = self._grid(
            m, pipe, join, self._lanes(self.a, 0, cfg.rows, lambda i: i),
            self._lanes(self.b, 0, cfg.cols, lambda j: 0), prefix="")
        _drive_output(m, queue, self.c, row_valid, row_last, row_values, pipe.enable)
        pipe.emit(m)
        return m


class SystolicTile(_ArrayComponent):
    """n output-stationary arrays in lockstep whose rows a pipelined adder tree sums.

    Computes C = sum over s of A_s·B_s (the K dimension split into n slices): beat k of ``a``
    carries n·R lanes, lanes ``[s*R, (s+1)*R)`` being column k of A_s; beat k of ``b`` carries
    n·C lanes, lanes ``[s*C, (s+1)*C)`` being row k of B_s. Framing, ``last``, spacing, ``error``
    and throughput are those of :class:`OutputStationaryArray`; the tree adds ``ceil(log2 n)``
    cycles of latency (first output ``K + C + 4 + ceil(log2 n)`` cycles after the first input;
    three fewer with floating-point PEs).

    ``always_ready`` (not a parameter of the block: for a parent that ties ``c.ready`` high,
    ``expert_chiplet``) builds an output register instead of the output queue
    (:class:`hw.pipeline.OutputRegister`): the same cycles, ``c.ready`` unread, and no stall
    enable on any register.
    """

    def __init__(self, config, *, always_ready=False):
        super().__init__(config, {"a": config.arrays * config.rows,
                                  "b": config.arrays * config.cols},
                         {"a": config.arrays * config.rows, "b": config.arrays},
                         always_ready=always_ready)

    def elaborate(self, platform):
        cfg = self.config
        R, C, n = cfg.rows, cfg.cols, cfg.arrays
        m = Module()
        queue, pipe = self._output_stage(m)
        join = self._join(m, pipe)
        partial_rows = []
        for s in range(n):
            row_valid, row_last, row_values = self._grid(
                m, pipe, join, self._lanes(self.a, s * R, R, lambda i: i),
                self._lanes(self.b, s * C, C, lambda j: j // C), prefix=f"sa{s}_")
            if s == 0:
                flags = Cat(row_valid, row_last)
            partial_rows.append(row_values)
        # Pipelined adder tree: one register level per halving; an odd element passes through.
        level = 0
        while len(partial_rows) > 1:
            summed = []
            for p in range(0, len(partial_rows) - 1, 2):
                summed.append([
                    pipe.reg(self._add(m, x, y, f"tree{level}_{p}_{j}"), f"tree{level}_{p}_{j}")
                    for j, (x, y) in enumerate(zip(partial_rows[p], partial_rows[p + 1]))])
            if len(partial_rows) % 2:
                summed.append([pipe.reg(x, f"tree{level}_pass_{j}")
                               for j, x in enumerate(partial_rows[-1])])
            partial_rows = summed
            flags = pipe.reg(flags, f"tree{level}_flags")
            level += 1
        _drive_output(m, queue, self.c, flags[0], flags[1], partial_rows[0], pipe.enable)
        pipe.emit(m)
        return m


    def _add(self, m, x, y, name):
        """One adder of the tree: wrapping integers, or FP32 codes rounded once."""
        if is_float(self.config):
            return fp_add(m, x, y, golden_fp.FORMATS["fp32"], f"{name}_add")
        return (x + y)[:self.config.acc_width].as_signed()


class WeightStationaryArray(_ArrayComponent):
    """Weight-stationary R x C systolic array (block ``systolic``, ``dataflow="ws"``).

    Computes Y = X·W per block. Weights arrive on ``w``: R beats, beat r being row r of W (C
    lanes), ``last`` on beat R-1. Activations arrive on ``a``: each beat is one row x of X (R
    lanes); ``c`` emits one beat per ``a`` beat, the row x·W (C lanes of ``acc_width``, wrapping),
    with the same ``last``. An ``a`` beat with ``last`` ends the use of the current weights.

    Every PE holds two weight banks. Blocks of ``w`` fill them alternately; an ``a`` block uses the
    oldest filled bank and frees it when its ``last`` beat is taken, so the next block's weights
    load while the current block streams. A weight block is usable from the cycle after its last
    beat is taken. With ``w`` and ``a`` offered every cycle and every activation block at least R
    beats long, activation beats stream with no bubble after the first weight block has loaded;
    each output leaves ``R + C + 1`` cycles after its activation beat was taken (each PE
    registers its product before adding it to the partial sum from above).

    Members
    -------
    w : In(stream.Signature(lanes_layout(cols, in_width)))
    a : In(stream.Signature(lanes_layout(rows, in_width)))
    c : Out(stream.Signature(lanes_layout(cols, acc_width)))
    error : Out(1)
        Sticky: set when ``w.last`` is not exactly on every R-th weight beat (blocks are framed
        by counting R beats).
    """

    def __init__(self, config):
        if config.dataflow != "ws":
            raise ValueError(f"WeightStationaryArray needs dataflow='ws', got {config.dataflow!r}")
        super().__init__(config, {"w": config.cols, "a": config.rows})

    def elaborate(self, platform):
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        m = Module()
        queue, pipe = self._output_stage(m)

        # Bank bookkeeping: `load_bank` is filled by `w`, `use_bank` is read by `a`.
        bank_full = Signal(2)
        load_bank = Signal()
        use_bank = Signal()
        load_row = Signal(range(R))
        w_take = Signal()
        a_take = Signal()
        m.d.comb += [
            self.w.ready.eq(pipe.enable & ~bank_full.bit_select(load_bank, 1)),
            self.a.ready.eq(pipe.enable & bank_full.bit_select(use_bank, 1)),
            w_take.eq(self.w.valid & self.w.ready),
            a_take.eq(self.a.valid & self.a.ready),
        ]
        row_done = load_row == R - 1
        with m.If(w_take):
            m.d.sync += load_row.eq(Mux(row_done, 0, load_row + 1))
            with m.If(self.w.payload.last != row_done):
                m.d.sync += self.error.eq(1)
            with m.If(row_done):
                m.d.sync += [bank_full.bit_select(load_bank, 1).eq(1), load_bank.eq(~load_bank)]
        with m.If(a_take & self.a.payload.last):
            m.d.sync += [bank_full.bit_select(use_bank, 1).eq(0), use_bank.eq(~use_bank)]

        # Weight row r reaches column j j cycles after it was taken (skewed like the
        # activations), so a bank is rewritten behind the wavefront of its last user.
        w_tag = Cat(w_take, load_row, load_bank)
        w_lane = [pipe.delay(self.w.payload.data[j], j, f"wskew{j}") for j in range(C)]
        w_tags = [w_tag]
        for j in range(1, C):
            w_tags.append(pipe.reg(w_tags[-1], f"wtag{j}"))
        row_bits = len(load_row)

        flags = Cat(a_take, self.a.payload.last, use_bank)
        psum_down = [None] * C
        out_flags = None
        for i in range(R):
            a_in = pipe.delay(self.a.payload.data[i], i, f"askew{i}")
            # The flags' skew chain, kept: `upcoming` is what `flags_in` takes at the next
            # advancing edge (None where `flags_in` is the port's, row 0).
            chain = [flags]
            for stage in range(i):
                chain.append(pipe.reg(chain[-1], f"fskew{i}_d{stage}"))
            flags_in, upcoming = chain[-1], (chain[-2] if i else None)
            for j in range(C):
                tag_valid = w_tags[j][0]
                tag_row = w_tags[j][1:1 + row_bits]
                tag_bank = w_tags[j][1 + row_bits]
                weight = [Signal(signed(cfg.in_width), name=f"w{bank}_{i}_{j}") for bank in (0, 1)]
                loads = [tag_valid & (tag_row == i) & (tag_bank == bank) for bank in (0, 1)]
                for bank in (0, 1):
                    with m.If(pipe.enable & loads[bank]):
                        m.d.sync += weight[bank].eq(w_lane[j])
                if upcoming is None:
                    operand = Mux(flags_in[2], weight[1], weight[0])
                else:
                    # The weight in use, picked a cycle ahead into a register (clock rate: the
                    # bank flag's select was in the multiplier's cycle, 134 MHz): the bank
                    # the next flags name, as the loads of this edge leave it.
                    after = [Mux(loads[bank], w_lane[j], weight[bank]) for bank in (0, 1)]
                    operand = pipe.reg(Mux(upcoming[2], after[1], after[0]), f"w_{i}_{j}")
                # The product is registered (the multiplier and the partial-sum adder in
                # different cycles); the partial sum from above is then one edge later too.
                product = pipe.reg(a_in * operand, f"prod_{i}_{j}", reset_less=True)
                psum_in = psum_down[j] if i else 0
                psum_down[j] = pipe.reg((psum_in + product)[:cfg.acc_width].as_signed(),
                                        f"psum_{i}_{j}")
                if j + 1 < C:
                    a_in = pipe.reg(a_in, f"a_{i}_{j}")
                    flags_in, upcoming = pipe.reg(flags_in, f"f_{i}_{j}"), flags_in
                elif i == R - 1:
                    # Registered with product and psum (R-1, C-1): the flags of the row
                    # leaving the grid.
                    out_flags = pipe.delay(flags_in, 2, f"f_{i}_{j}")
        row_values = [pipe.delay(psum_down[j], C - 1 - j, f"deskew{j}") for j in range(C)]
        _drive_output(m, queue, self.c, out_flags[0], out_flags[1], row_values, pipe.enable)
        pipe.emit(m)
        return m


def build_systolic(config):
    """The component for a :class:`SystolicConfig` (OS or WS by ``dataflow``)."""
    if config.dataflow == "os":
        return OutputStationaryArray(config)
    return WeightStationaryArray(config)


register(Block(
    name="systolic", family="systolic", config=SystolicConfig, build=build_systolic,
    figures=lambda cfg: golden.figures("systolic", **dataclasses.asdict(cfg)),
    summary="one R x C systolic array, output- or weight-stationary (SN40L PCU)",
    # The cost trade-off seed 003 asks hardware to expose: int8 against FP8 and BF16 PEs,
    # FP22 against FP32-like accumulation.
    demo_configs=({"rows": 4, "cols": 4, "dataflow": "os"},
                  {"rows": 3, "cols": 5, "dataflow": "os"},
                  {"rows": 4, "cols": 4, "dataflow": "ws"},
                  {"rows": 4, "cols": 4, "dtype": "fp8_e4m3"},
                  {"rows": 4, "cols": 4, "dtype": "fp8_e4m3", "acc_frac": 23},
                  {"rows": 4, "cols": 4, "dtype": "fp8_e5m2"},
                  {"rows": 4, "cols": 4, "dtype": "bf16"}),
    # Floating-point PEs gate by gate: ABC takes many minutes on fp_dot's datapath (hw/fp.py).
    synth_abc=lambda cfg: not is_float(cfg),
    area_unit="PE", operation="MAC", area_units=lambda cfg: cfg.rows * cfg.cols,
    legend="cycles for 32 jobs of K=R (ideal = one MAC per PE per cycle)",
))

register(Block(
    name="systolic_tile", family="systolic", config=SystolicTileConfig, build=SystolicTile,
    figures=lambda cfg: golden.figures("systolic_tile", **dataclasses.asdict(cfg)),
    summary="n OS arrays on K-slices summed by a pipelined adder tree (Mozart tile)",
    demo_configs=({"rows": 4, "cols": 4, "arrays": 4},),
    area_unit="PE", operation="MAC", area_units=lambda cfg: cfg.rows * cfg.cols * cfg.arrays,
    legend="cycles for 32 jobs of K=R (ideal = one MAC per PE per cycle)",
))
