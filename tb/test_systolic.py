"""cocotb tests of the systolic blocks (``systolic`` OS and WS, ``systolic_tile``).

Run through :mod:`flows.sim` (pytest or ``moegen sim``), which builds the configured Verilog and
names it with ``+moegen_manifest``. Each test applies to every configuration: the bench classes
below hide the difference between the output-stationary blocks (ports a, b -> c) and the
weight-stationary array (ports w, a -> c).
"""

import gc
import math
import statistics
import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import fp
from golden import systolic as golden
from tb.buffered import BufferedBench
from tb.harness import (load_dut_config, long_enough_to_time, make_rng, measuring,
                        throughput_beats, write_throughput)
from tb.streams import (STALL_PROFILES, InOrderScoreboard, StreamBench, edge_now, pause_fraction,
                        reset_dut, start_clock, wait_for)


def _random_matrix(rng, shape, width, extremes=False):
    lo, hi = fixed.signed_limits(width)
    values = (lo, hi, 0, -1, 1) if extremes else None
    return [[rng.choice(values) if extremes else rng.randint(lo, hi) for _ in range(shape[1])]
            for _ in range(shape[0])]


class _Bench(StreamBench):
    """Common driving and checking; subclasses define the ports and the job format."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0, buffered=False):
        self.cfg, self.component = config, component
        # buffered: the DUT is BLOCK_buffered (tb.buffered), Python wakes once per window.
        self.buffered = BufferedBench(dut, component, rng, gap, stall) if buffered else None
        if buffered:
            self.dut, self.rng = dut, rng
            self.sources, self.sinks = self.buffered.sources, self.buffered.sinks
            self.monitors = {}
        else:
            super().__init__(dut, component, rng, self.input_ports, ("c",), gap, stall)
        self.sink = self.sinks["c"]
        self.board = InOrderScoreboard("c", component.c.payload.shape())

    def start(self):
        (self.buffered or super()).start()

    def stop(self):
        (self.buffered or super()).stop()

    def _expect_rows(self, rows, last_on_final=True):
        for index, row in enumerate(rows):
            last = last_on_final and index == len(rows) - 1
            if self.buffered:       # compared in the harness, beat by beat
                self.sink.expect({"data": row, "last": int(last)})
            else:
                self.board.expect(row, last)

    def output_edges(self):
        """Edge of every transfer on c."""
        if self.buffered:
            return self.sink.received_edges
        return [edge for edge, _ in self.sink.received]

    async def finish(self, max_cycles):
        def done():
            return len(self.sink.received) >= len(self.board.expected)
        what = f"{len(self.board.expected)} output beats"
        # A few more cycles: nothing extra (duplicated) may come out.
        extra = 3 * (self.cfg.rows + self.cfg.cols) + 10
        if self.buffered:
            await self.buffered.finish(max_cycles, extra)
        else:
            await wait_for(self.dut, done, max_cycles, what)
            await ClockCycles(self.dut.clk, extra)
            self.board.check(self.sink)


class OSBench(_Bench):
    """Output-stationary array and tile: a tile is n slices of (A_s, B_s); with a
    floating-point ``dtype``, codes, and the scales of every 128-element block of K."""
    input_ports = ("a", "b")

    @property
    def arrays(self):
        return getattr(self.cfg, "arrays", 1)

    @property
    def float(self):
        return getattr(self.cfg, "dtype", "int") != "int"

    def random_tile(self, depth, extremes=False):
        R, C = self.cfg.rows, self.cfg.cols
        if self.float:
            blocks = -(-depth // golden.SCALE_BLOCK)
            a = [[[self.code(extremes) for _ in range(depth)] for _ in range(R)]
                 for _ in range(self.arrays)]
            b = [[[self.code(extremes) for _ in range(C)] for _ in range(depth)]
                 for _ in range(self.arrays)]
            scales = ([[[self.random_scale() for _ in range(blocks)] for _ in range(R)]
                       for _ in range(self.arrays)],
                      [[self.random_scale() for _ in range(blocks)] for _ in range(self.arrays)])
            return a, b, scales
        w = self.cfg.in_width
        a = [_random_matrix(self.rng, (R, depth), w, extremes) for _ in range(self.arrays)]
        b = [_random_matrix(self.rng, (depth, C), w, extremes) for _ in range(self.arrays)]
        return a, b

    # --- floating point ---
    def code(self, extremes=False):
        """A finite operand code of ``dtype``; with ``extremes``, often a special or boundary
        one (signed zero, the smallest subnormal, the largest finite, NaN, infinity)."""
        fmt, rng = fp.FORMATS[self.cfg.dtype], self.rng
        sign = 1 << (fmt.width - 1)
        if extremes and rng.random() < 0.3:
            specials = [0, 1, fmt.max_code, 1 << fmt.man_bits, fmt.canonical_nan]
            if fmt.ieee:
                specials.append(((1 << fmt.exp_bits) - 1) << fmt.man_bits)
            return rng.choice(specials) | rng.choice([0, sign])
        while True:
            code = rng.randrange(1 << fmt.width)
            if fp.components(code, fmt)[0] == "num":
                return code

    def random_scale(self):
        """A scale value: often 1, else a power of two (E8M0) or any FP32 value over 2**+-30."""
        rng = self.rng
        if rng.random() < 0.4:
            return 1.0
        if self.cfg.scale_format == "e8m0":
            return 2.0 ** rng.randint(-30, 30)
        return fp.decode(fp.encode(rng.uniform(-4, 4) * 2.0 ** rng.randint(-30, 30), "fp32"),
                         "fp32")

    def scale_code(self, value):
        if self.cfg.scale_format == "fp32":
            return fp.encode(value, "fp32")
        return int(math.log2(value)) + 127

    def send_tile(self, a_slices, b_slices, scales=None, b_last_beat=None):
        """Queue one tile; ``b_last_beat`` puts ``b.last`` on another beat (protocol misuse);
        ``scales``: (per slice per row, per slice) lists of per-block scale values."""
        depth = len(b_slices[0])
        b_last_beat = depth - 1 if b_last_beat is None else b_last_beat
        if self.float:
            blocks = -(-depth // golden.SCALE_BLOCK)
            rows = len(a_slices[0])
            scales = scales or ([[[1.0] * blocks for _ in range(rows)] for _ in a_slices],
                                [[1.0] * blocks for _ in b_slices])
        for k in range(depth):
            a_beat = {"data": [a[i][k] for a in a_slices for i in range(len(a))],
                      "last": int(k == depth - 1)}
            b_beat = {"data": [v for b in b_slices for v in b[k]], "last": int(k == b_last_beat)}
            if self.float:
                block = k // golden.SCALE_BLOCK
                a_beat["scale"] = [self.scale_code(row[block]) for per_slice in scales[0]
                                   for row in per_slice]
                b_beat["scale"] = [self.scale_code(per_slice[block]) for per_slice in scales[1]]
            self.sources["a"].send(a_beat)
            self.sources["b"].send(b_beat)
        if self.float:
            cfg = self.cfg
            config = fp.DotConfig(group=1, acc_frac=cfg.acc_frac,
                                  promote_every=cfg.promote_every)
            self._expect_rows(golden.fp_tile_result(a_slices, b_slices, cfg.dtype, config,
                                                    *scales))
        else:
            self._expect_rows(golden.tile_result(a_slices, b_slices,
                                                 self.cfg.acc_width).tolist())

    def send_random_job(self, depth):
        """Queue a random tile of depth K = ``depth``."""
        self.send_tile(*self.random_tile(depth))

    def model(self):
        return golden.OSCycleModel(self.cfg.rows, self.cfg.cols, self.arrays,
                                   getattr(self.cfg, "dtype", "int"),
                                   getattr(self.cfg, "pe_stages", golden.OS_PE_STAGES))


class WSBench(_Bench):
    """Weight-stationary array: a job is a weight block W (R x C) and activations X (M x R)."""
    input_ports = ("w", "a")

    def random_block(self, length, extremes=False):
        R, C, w = self.cfg.rows, self.cfg.cols, self.cfg.in_width
        return (_random_matrix(self.rng, (R, C), w, extremes),
                _random_matrix(self.rng, (length, R), w, extremes))

    def send_block(self, weights, acts, w_last_beat=None):
        R = self.cfg.rows
        w_last_beat = R - 1 if w_last_beat is None else w_last_beat
        for r, row in enumerate(weights):
            self.sources["w"].send({"data": row, "last": int(r == w_last_beat)})
        for m, row in enumerate(acts):
            self.sources["a"].send({"data": row, "last": int(m == len(acts) - 1)})
        self._expect_rows(golden.ws_block_result(acts, weights, self.cfg.acc_width).tolist())

    def send_random_job(self, length):
        """Queue random weights and a random activation block of M = ``length`` beats."""
        self.send_block(*self.random_block(length))


async def _setup(dut, salt, gap=0.0, stall=0.0, buffered=False):
    _, config, component = load_dut_config()
    rng = make_rng(salt)
    start_clock(dut)
    bench_cls = WSBench if getattr(config, "dataflow", "os") == "ws" else OSBench
    bench = bench_cls(dut, config, component, rng, gap, stall, buffered)
    await reset_dut(dut)
    return bench


def _budget(beats, gap=0.0, stall=0.0):
    slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))
    return int(beats * slowdown * 4) + 500


def _os_depths(rows):
    # Back-to-back K = R tiles first (the bubble-free claim), then K = 1, K < R, K > R.
    return [rows] * 4 + [1, 1, max(1, rows // 2), rows + 3, 2 * rows + 1, 1, rows]


@cocotb.test()
async def test_cycle_exact_no_stalls(dut):
    """Inputs offered every cycle, c always ready: every transfer on the golden model's cycle."""
    bench = await _setup(dut, "cycle_exact")
    cfg = bench.cfg
    if isinstance(bench, OSBench):
        depths = _os_depths(cfg.rows)
        for depth in depths:
            bench.send_random_job(depth)
        bench.start()
        await bench.finish(_budget(sum(depths) + cfg.rows * len(depths)))
        in_edges, out_edges = bench.model().schedule(depths)
        base = bench.sources["a"].sent_edges[0]
        assert bench.sources["b"].sent_edges == bench.sources["a"].sent_edges
        assert [e - base for e in bench.sources["a"].sent_edges] == in_edges
        assert [e - base for e, _ in bench.sink.received] == out_edges
        # The contract's headline figures, stated outright.
        first_latency = out_edges[0] - in_edges[0]
        assert first_latency == bench.model().first_output_latency(depths[0])
        assert first_latency <= depths[0] + cfg.rows + cfg.cols + 4 + bench.model().tree_depth
        back_to_back = 4 * cfg.rows
        assert in_edges[back_to_back - 1] - in_edges[0] + 1 == back_to_back, "bubble between tiles"
    else:
        lengths = [cfg.rows, cfg.rows + 2, 2 * cfg.rows, 1, cfg.rows, 3, cfg.rows]
        for length in lengths:
            bench.send_random_job(length)
        bench.start()
        await bench.finish(_budget(sum(lengths) + cfg.rows * len(lengths)))
        w_edges, a_edges, out_edges = golden.WSCycleModel(cfg.rows, cfg.cols).schedule(lengths)
        base = bench.sources["w"].sent_edges[0]
        assert [e - base for e in bench.sources["w"].sent_edges] == w_edges
        assert [e - base for e in bench.sources["a"].sent_edges] == a_edges
        assert [e - base for e, _ in bench.sink.received] == out_edges
        # Blocks 0..2 have M >= R: their activation beats follow each other with no bubble.
        span = sum(lengths[:3])
        assert a_edges[span - 1] - a_edges[0] + 1 == span, "bubble between weight blocks"


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_stalls(dut, gap, stall):
    """Random valid gaps on every input and ready stalls on c: exact data, in order, no loss."""
    bench = await _setup(dut, f"stalls:{gap}:{stall}", gap, stall)
    cfg = bench.cfg
    beats = 0
    for _ in range(8):
        size = bench.rng.randint(1, 2 * cfg.rows + 2)
        bench.send_random_job(size)
        beats += size + cfg.rows
    bench.start()
    await bench.finish(_budget(beats, gap, stall))


@cocotb.test()
async def test_extremes(dut):
    """Most negative x most negative, max x min, long sums that wrap at acc_width."""
    bench = await _setup(dut, "extremes", 0.3, 0.3)
    cfg = bench.cfg
    long_depth = 3 * cfg.rows + 7
    if isinstance(bench, OSBench) and bench.float:
        await _float_extremes(bench, long_depth)
        return
    lo, hi = fixed.signed_limits(cfg.in_width)
    if isinstance(bench, OSBench):
        for depth, fill in ((cfg.rows, (lo, lo)), (1, (lo, lo)), (long_depth, (lo, lo)),
                            (cfg.rows + 1, (hi, lo))):
            n = bench.arrays
            bench.send_tile([[[fill[0]] * depth for _ in range(cfg.rows)]] * n,
                            [[[fill[1]] * cfg.cols for _ in range(depth)]] * n)
        bench.send_tile(*bench.random_tile(long_depth, extremes=True))
    else:
        for length, fill in ((cfg.rows, (lo, lo)), (1, (hi, lo)), (long_depth, (lo, lo))):
            bench.send_block([[fill[0]] * cfg.cols for _ in range(cfg.rows)],
                             [[fill[1]] * cfg.rows for _ in range(length)])
        bench.send_block(*bench.random_block(long_depth, extremes=True))
    bench.start()
    await bench.finish(_budget(4 * long_depth + 8 * cfg.rows, 0.3, 0.3))


async def _float_extremes(bench, long_depth):
    """Floating point: the largest finite products accumulated (the partial sum's exponent
    saturates) and cancelling, the smallest subnormal products, a large product followed by
    many small ones (the seed's truncation, across two 128-element scale blocks and their
    promotions), and random tiles of special and boundary codes with random block scales."""
    cfg, fmt = bench.cfg, fp.FORMATS[bench.cfg.dtype]
    sign = 1 << (fmt.width - 1)
    big, tiny, one = fmt.max_code, 1, fp.encode(1.0, fmt)
    large = fp.encode(min(256.0, fmt.max_finite), fmt)
    n, R, C = bench.arrays, cfg.rows, cfg.cols
    for depth, (a_fill, b_fill) in ((R, (big, big)), (1, (tiny, tiny)), (long_depth, (big, big)),
                                    (R + 1, (big, big | sign))):
        bench.send_tile([[[a_fill] * depth for _ in range(R)]] * n,
                        [[[b_fill] * C for _ in range(depth)]] * n)
    crafted = 2 * golden.SCALE_BLOCK + 3
    row = [large] + [one] * (crafted - 1)
    bench.send_tile([[row] * R] * n, [[[large if k == 0 else one] * C for k in range(crafted)]] * n)
    bench.send_tile(*bench.random_tile(crafted, extremes=True))
    bench.send_tile(*bench.random_tile(long_depth, extremes=True))
    bench.start()
    await bench.finish(_budget(8 * crafted + 8 * R, 0.3, 0.3))


@cocotb.test()
async def test_reset_mid_work(dut):
    """Reset while a tile is half in and earlier results are in flight: no stale output after."""
    bench = await _setup(dut, "reset", 0.2, 0.5)
    cfg = bench.cfg
    for _ in range(3):
        bench.send_random_job(cfg.rows + 2)
    bench.start()
    # Wait until the second job is partly taken, then reset in the middle of it.
    first_port = bench.input_ports[-1]
    await wait_for(dut, lambda: len(bench.sources[first_port].sent_edges) >= cfg.rows + 4,
                   _budget(4 * cfg.rows + 8, 0.2, 0.5), "half of the second job")
    # The drivers keep running through the reset and drop what they held (tb.streams).
    await bench.reset(3)
    assert not dut.c__valid.value, "c__valid high right after reset"
    assert all(source.idle for source in bench.sources.values()), "a beat survived the reset"
    bench.board.expected.clear()
    for _ in range(2):
        bench.send_random_job(cfg.rows + 1)
    await bench.finish(_budget(4 * cfg.rows + 8, 0.2, 0.5))


@cocotb.test()
async def test_protocol_misuse_sets_error(dut):
    """Misplaced ``last`` sets the sticky error flag; framing follows the documented rule."""
    bench = await _setup(dut, "misuse")
    cfg = bench.cfg
    assert dut.error.value == 0
    if isinstance(bench, OSBench):
        bench.send_tile(*bench.random_tile(3), b_last_beat=0)  # a.last on beat 2 rules
        bench.send_random_job(cfg.rows)
    else:
        bench.send_block(*bench.random_block(cfg.rows), w_last_beat=cfg.rows)  # no w.last
        bench.send_random_job(cfg.rows)
    bench.start()
    await bench.finish(_budget(4 * cfg.rows + 8))
    assert dut.error.value == 1, "misplaced last did not set error"
    await ClockCycles(dut.clk, 5)
    assert dut.error.value == 1, "error is not sticky"
    await reset_dut(dut)
    assert dut.error.value == 0, "reset does not clear error"


# Timed runs of a measuring throughput test on Verilator; the median rate is reported. This VM
# slows a run down by up to 1.8x now and then, within one process (4x4 OS, buffered: 87-171k
# cycles/s). Icarus runs once: its floating-point arrays take minutes per 10k-cycle run.
MEASURED_RUNS = 3


async def _saturated(dut, buffered, jobs):
    """Saturated streams: cycles against the ideal, asserted against the golden schedule;
    when measuring on Verilator, :data:`MEASURED_RUNS` times, each from a reset and each
    asserted.

    Writes ``throughput.json`` (cycles, ideal cycles, utilization, the median of the runs'
    simulated cycles per wall second and each run's) in the run folder for ``make bench``.
    """
    rates = []
    verilator = cocotb.SIM_NAME.lower().startswith("verilator")
    for _ in range(MEASURED_RUNS if measuring() and verilator else 1):
        metrics, rate, sim_cycles, macs = await _saturated_run(dut, buffered, jobs)
        rates.append(rate)
    write_throughput(metrics, f"{jobs} jobs, utilization = MACs/(PEs*cycles)",
                     statistics.median(rates), simulated_cycles=sim_cycles,
                     sim_cycles_per_second_runs=[round(rate) for rate in rates],
                     harness="buffered" if buffered else "per-cycle",
                     macs=macs, operations=macs)


async def _saturated_run(dut, buffered, jobs):
    """One timed saturated run: ``(metrics, simulated cycles per second, simulated cycles,
    MACs)``."""
    bench = await _setup(dut, "throughput", buffered=buffered)
    cfg = bench.cfg
    if isinstance(bench, OSBench):
        depths = [cfg.rows] * jobs
        for depth in depths:
            bench.send_random_job(depth)
        macs_per_pe = sum(depths)
        _, want_out = bench.model().schedule(depths)
    else:
        lengths = [max(cfg.rows, 8)] * jobs
        for length in lengths:
            bench.send_random_job(length)
        macs_per_pe = sum(lengths)
        w_edges, a_edges, want_out = golden.WSCycleModel(cfg.rows, cfg.cols).schedule(lengths)
        want_out = [e - a_edges[0] for e in want_out]
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    start_edge = edge_now()
    bench.start()
    await bench.finish(_budget(macs_per_pe + jobs * cfg.rows))
    wall = time.perf_counter() - started
    sim_cycles = edge_now() - start_edge
    first_in = bench.sources["a"].sent_edges[0]
    out_edges = [e - first_in for e in bench.output_edges()]
    assert out_edges == want_out
    # Every PE does one MAC per beat, so the ideal is one cycle per beat.
    cycles = out_edges[-1] + 1
    metrics = {"cycles": cycles, "ideal": macs_per_pe,
               "utilization": round(macs_per_pe / cycles, 4),
               # Jobs of K = R (OS) or one output per beat (WS): one output row per cycle is
               # full use of the PEs once the pipeline is filled.
               "steady": round((len(out_edges) - 1) / (out_edges[-1] - out_edges[0]), 4)}
    macs = macs_per_pe * cfg.rows * cfg.cols * getattr(cfg, "arrays", 1)
    return metrics, sim_cycles / wall, sim_cycles, macs


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """32 saturated jobs on the per-cycle bench (tb.streams): cycle-exact, and its speed."""
    await _saturated(dut, buffered=False, jobs=32)


@cocotb.test()
async def test_buffered_throughput(dut):
    """The same saturated jobs on the buffered harness (tb.buffered, module BLOCK_buffered),
    enough of them for throughput_beats() cycles (10k when measuring, long enough to time):
    cycle-exact against the same golden schedule, and the simulated cycles per second that
    `make bench` reports."""
    _, config, _ = load_dut_config()
    beats_per_job = max(config.rows, 8) if getattr(config, "dataflow", "os") == "ws" \
        else config.rows
    await _saturated(dut, buffered=True, jobs=-(-throughput_beats() // beats_per_job))


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_buffered_random_stalls(dut, gap, stall):
    """test_random_stalls on the buffered harness: its pause masks give the same kinds of valid
    gaps and ready stalls, and its comparators check every beat in order."""
    bench = await _setup(dut, f"buffered-stalls:{gap}:{stall}", gap, stall, buffered=True)
    beats = 0
    for _ in range(40):
        size = bench.rng.randint(1, 2 * bench.cfg.rows + 2)
        bench.send_random_job(size)
        beats += size + bench.cfg.rows
    bench.start()
    await bench.finish(_budget(beats, gap, stall))


@cocotb.test()
async def test_buffered_harness_catches_defects(dut):
    """The buffered harness fails a run whose output differs from the expected beats: one
    wrong payload (named by beat number), one beat too many, one beat missing."""
    for defect in ("wrong", "extra", "missing"):
        bench = await _setup(dut, f"defect:{defect}", buffered=True)
        bench.stop()
        queue = bench.sink._queue
        while len(queue) < 6:
            bench.send_random_job(bench.cfg.rows)
        if defect == "wrong":
            queue[4] ^= 1                       # the golden beat 4, one bit off
        elif defect == "extra":
            queue.pop()                         # the block sends one beat more than expected
        else:
            queue.append(queue[-1])             # one beat expected that never comes
        bench.start()
        try:
            await bench.finish(_budget(8 * bench.cfg.rows))
        except AssertionError as failure:
            text = str(failure)
            assert {"wrong": "beat 4: got", "extra": "more beats than",
                    "missing": "beats, expected"}[defect] in text, text
        else:
            raise AssertionError(f"the harness missed a {defect} beat")
        bench.stop()


