"""cocotb tests of ``ndp_core`` against ``golden.ndp``.

Every output is compared, in order, with the golden GEMV / FFN slice on the same weights,
activations, LUT and shifts. Lanes past a row's end carry random values (they must be ignored).
With a ready output and waiting streams, command spacing and result edges are asserted against
the golden cycle model. The DDR4 test holds each weight beat back until :mod:`golden.dram` says the
DIMM delivered it.
"""

import math
import time

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import ndp as golden
from golden.dram import DDR4_3200AA, TABLE_I
from hw.ndp import token_bits
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.ndp_bench import NdpBenchBase, dram_times, silu_table
from tb.streams import (STALL_PROFILES, assert_high_from_to, edge_now, sample_each_edge,
                        start_after_reset, wait_for)



class NdpBench(NdpBenchBase):
    """Sources on ``cmd``, ``x``, ``w`` and ``lut``, a sink on ``y``, the golden expectations."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, config, component, rng, ("w",), gap, stall)

    def _command(self, op, rows, cols, xs, shifts=(0, 0, 0), load_x=True):
        """Queue a command naming ``len(xs)`` tokens; returns the x of each token the core will
        use (the first ``cols`` elements of the token's buffer)."""
        self.sources["cmd"].send({"op": op, "load_x": int(load_x), "rows": rows, "cols": cols,
                                  "shift_g": shifts[0], "shift_u": shifts[1],
                                  "shift_h": shifts[2], "tokens": len(xs)})
        return self.send_x(xs, cols, load_x)

    def gemv_tokens(self, weights, xs, load_x=True, not_before=None):
        """Queue a gemv over the tokens ``xs`` (what the buffer holds afterwards, sent when
        ``load_x``); results row by row, token by token."""
        rows, cols = weights.shape
        xs = self._command(golden.OP_GEMV, rows, cols, xs, load_x=load_x)
        self.send_weights("w", golden.gemv_weight_beats(weights, self.cfg.mults,
                                                        self.pad(self.cfg.w_width)),
                          not_before, len(xs))
        self.expect(golden.gemv_tokens(weights, xs, self.cfg.acc_width))

    def gemv(self, weights, x, load_x=True, not_before=None):
        """Queue a one-token gemv."""
        self.gemv_tokens(weights, [x], load_x, not_before)

    def ffn_tokens(self, wg, wu, wd, xs, shifts, load_x=True, not_before=None):
        """Queue an ffn_slice (rows of Wg/Wu, columns of Wd) over the tokens ``xs``; returns
        the expected partial y of each token."""
        xs = self._command(golden.OP_FFN_SLICE, wg.shape[0], wg.shape[1], xs, shifts, load_x)
        self.send_weights("w", golden.ffn_weight_beats(wg, wu, wd, self.cfg.mults,
                                                       self.pad(self.cfg.w_width)),
                          not_before, len(xs))
        partials = [golden.ffn_slice(wg, wu, wd, x, self.table, shifts,
                                     self.cfg.x_width, self.cfg.acc_width)[0] for x in xs]
        self.expect(golden.interleave_tokens(partials))
        return partials

    def ffn(self, wg, wu, wd, x, shifts, load_x=True, not_before=None):
        """Queue a one-token ffn_slice; returns the expected partial y."""
        return self.ffn_tokens(wg, wu, wd, [x], shifts, load_x, not_before)[0]


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return NdpBench(dut, config, component, make_rng(salt), **kwargs)


def _shapes(bench):
    """GEMV shapes: single row/column, exact multiples of M, one over, one under, the maximum."""
    M, max_cols = bench.cfg.mults, bench.cfg.max_cols
    cols = sorted({1, min(M, max_cols), min(M + 1, max_cols), max(min(2 * M - 1, max_cols), 1),
                   max_cols, bench.rng.randint(1, max_cols)})
    return [(bench.rng.choice([1, 2, M - 1 or 1, M + 1, 2 * M + 3]), c) for c in cols]


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_gemv_shapes(dut, gap, stall):
    """Rows and columns around multiples of M, reused and reloaded x, gaps and stalls."""
    bench = _setup(dut, f"gemv{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    for index, (rows, cols) in enumerate(_shapes(bench)):
        # Every third command reuses the buffer, pad lanes of the last load included.
        reload = index % 3 != 1 or not bench.x_buffer or cols > len(bench.x_buffer[0])
        bench.gemv(bench.weights(rows, cols), bench.vector(cols), load_x=reload)
    await bench.drain()
    bench.check()


def _mid_range_shift(value, cfg):
    """The smallest requant shift that brings ``value`` (wrapped as the accumulator wraps it)
    within half the range of an activation."""
    value = fixed.wrap(value, cfg.acc_width)       # a row sum as the accumulator holds it
    half = fixed.signed_limits(cfg.x_width)[1] // 2
    return next(s for s in range(32) if abs(golden.requant(value, s, cfg.x_width)) <= half)


@cocotb.test()
async def test_extremes_wrap_and_saturate(dut):
    """Most negative / positive weights and activations at the longest row (the accumulator
    wraps when acc_width is small), and ffn shifts of 0 and 31 with g negative and u positive,
    then the other way round (requant saturates both ways on each: the table's first and last
    entries are both read)."""
    bench = _setup(dut, "extremes")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    w_min, w_max = fixed.signed_limits(cfg.w_width)
    x_min, x_max = fixed.signed_limits(cfg.x_width)
    cols = cfg.max_cols
    weights = np.array([[w_min] * cols, [w_max] * cols, [w_min, w_max] * (cols // 2) +
                        [w_min] * (cols % 2)], dtype=np.int64)
    bench.gemv(weights, [x_min] * cols)
    bench.gemv(weights, [x_max] * cols)
    identity = [fixed.wrap(i, cfg.x_width) for i in range(1 << cfg.x_width)]
    await bench.write_lut(identity)
    inter = min(cfg.max_inter, 3)
    hidden = min(cfg.max_cols, 2 * cfg.mults + 1)
    for g_weight, u_weight in ((w_min, w_max), (w_max, w_min)):
        wg, wu, wd = (np.full(s, v, dtype=np.int64)
                      for s, v in (((inter, hidden), g_weight), ((inter, hidden), u_weight),
                                   ((hidden, inter), w_min)))
        # g saturated (the table's end), u and then h within half their range: the entry read
        # shows in h.
        u_row = fixed.wrap(u_weight * x_max * hidden, cfg.acc_width)
        shift_u = _mid_range_shift(u_row, cfg)
        u_code = golden.requant(u_row, shift_u, cfg.x_width)
        table_end = x_max if g_weight == w_max else x_min     # the identity's end entry
        for shifts in ((0, 0, 0), (31, 31, 31), (0, 31, 0), (3, 0, 31),
                       (0, shift_u, _mid_range_shift(table_end * u_code, cfg))):
            bench.ffn(wg, wu, wd, [x_max] * hidden, shifts)
    await bench.drain()
    bench.check()


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), [(0.0, 0.0), (0.5, 0.5)]))
async def test_ffn_slice_and_lut_reprogramming(dut, gap, stall):
    """ffn_slice with SiLU, then GELU, ReLU and a random table written between commands."""
    bench = _setup(dut, f"ffn{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    frac = max(cfg.x_width - 4, 0)
    tables = [golden.activation_lut(name, cfg.x_width, frac, frac)
              for name in ("silu", "gelu", "relu")]
    tables.append([bench.rng.randint(*fixed.signed_limits(cfg.x_width))
                   for _ in range(1 << cfg.x_width)])
    sizes = [(min(cfg.max_inter, cfg.mults + 1), min(cfg.max_cols, 2 * cfg.mults - 1)),
             (1, 1), (cfg.max_inter, cfg.max_cols), (min(cfg.max_inter, 2), cfg.max_cols)]
    for table, (inter, hidden) in zip(tables, sizes):
        await bench.write_lut(table)
        x = bench.vector(hidden)
        bench.ffn(*bench.expert(inter, hidden), x, bench.shifts(hidden))
        await bench.drain()          # the next table is written after this command's end
    bench.check()


@cocotb.test()
async def test_tensor_parallel_expert(dut):
    """One expert split over N = 2, 4, 6 DIMMs (and an uneven split): the host's sum of the
    partial outputs equals the unsplit fixed-point expert FFN bit for bit. The DIMMs' cores are
    identical and independent, so each slice runs on this core in turn."""
    bench = _setup(dut, "tp")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    hidden = min(cfg.max_cols, 2 * cfg.mults + 3)
    for parts, inter in ((2, 12), (4, 12), (6, 12), (4, 13)):
        inter = min(inter, parts * cfg.max_inter)
        wg, wu, wd = bench.expert(inter, hidden)
        x = bench.vector(hidden)
        shifts = bench.shifts(hidden)
        start = len(bench.expected)
        for wg_s, wu_s, wd_s in golden.split_expert(wg, wu, wd, parts):
            bench.ffn(wg_s, wu_s, wd_s, x, shifts)
        await bench.drain()
        partials = np.array([v for v, _ in bench.results()[start:]], dtype=object)
        total = [fixed.wrap(v, cfg.acc_width) for v in partials.reshape(parts, hidden).sum(0)]
        whole = golden.ffn_expert(wg, wu, wd, x, bench.table, shifts, cfg.x_width, cfg.acc_width)
        assert total == whole, f"N={parts}, I={inter}: TP sum differs from the whole expert"
    bench.check()


@cocotb.test()
async def test_ddr4_fed_weights(dut):
    """Weights arrive as the DDR4-3200 model delivers them (and the output stalls): results
    match and no beat is taken before the DRAM could have delivered it."""
    bench = _setup(dut, "ddr4", stall=0.2)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    rows, cols = 2 * cfg.mults + 1, cfg.max_cols
    weights = bench.weights(rows, cols)
    beats = len(golden.gemv_weight_beats(weights, cfg.mults))
    origin = edge_now()
    stream, not_before = dram_times(cfg, beats, origin)
    bench.gemv(weights, bench.vector(cols), not_before=not_before)
    await bench.drain()
    taken = bench.sources["w"].sent_edges
    assert all(t >= nb + 1 for t, nb in zip(taken, not_before)), "beat taken before it arrived"
    bench.check()


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), [(0.0, 0.0), (0.4, 0.6)]))
async def test_multi_token(dut, gap, stall):
    """Commands naming 1, 2, max_tokens and a random number of tokens: gemv rows around
    multiples of M, ffn_slices, x reused by commands naming fewer tokens (each token's buffer as
    it stands, pad lanes included); results row by row, token by token, every one checked."""
    bench = _setup(dut, f"tokens{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    M, T = cfg.mults, cfg.max_tokens
    counts = sorted({1, min(2, T), T, bench.rng.randint(1, T)})
    for tokens in counts:
        cols = bench.rng.choice(sorted({1, min(M + 1, cfg.max_cols), cfg.max_cols}))
        rows = bench.rng.choice([1, 3, M + 1])
        bench.gemv_tokens(bench.weights(rows, cols), [bench.vector(cols) for _ in range(tokens)])
        reuse = bench.rng.randint(1, tokens)
        bench.gemv_tokens(bench.weights(2, cols), [None] * reuse, load_x=False)
    inter, hidden = min(cfg.max_inter, M + 1), min(cfg.max_cols, 2 * M - 1)
    for tokens in (T, bench.rng.randint(1, T)):
        xs = [bench.vector(hidden) for _ in range(tokens)]
        bench.ffn_tokens(*bench.expert(inter, hidden), xs, bench.shifts(hidden))
    bench.ffn_tokens(*bench.expert(1, hidden), [None] * min(2, T), bench.shifts(hidden),
                     load_x=False)
    await bench.drain()
    bench.check()


@cocotb.test()
@cocotb.parametrize(tokens=[1, 3])
async def test_long_output_stall_loses_nothing(dut, tokens):
    """y held off for 360 of every 400 cycles under one-beat rows (a result per pair): the core
    reserves at most out_depth results, so before the first result leaves it takes at most
    ceil(out_depth / S) weight beats, and every result arrives, in order."""
    bench = _setup(dut, f"hold{tokens}", stall=("periodic", 400, 360))
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    S = min(tokens, cfg.max_tokens)
    rows = 3 * cfg.out_depth + 1
    bench.gemv_tokens(bench.weights(rows, 1), [bench.vector(1) for _ in range(S)])
    await bench.drain(budget=400 * (rows * S // 40 + 3))
    bench.check()
    first_out = bench.y.received[0][0]
    early = [e for e in bench.sources["w"].sent_edges if e < first_out]
    assert len(early) <= math.ceil(cfg.out_depth / S), \
        f"{len(early)} weight beats taken before the first result left (out_depth " \
        f"{cfg.out_depth}, {S} tokens): results were not reserved"


@cocotb.test()
async def test_reset_mid_command(dut):
    """Reset in the middle of an ffn_slice, then a fresh command: only its results appear."""
    bench = _setup(dut, "reset", gap=0.3, stall=0.3)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    hidden, inter = cfg.max_cols, cfg.max_inter
    bench.ffn(*bench.expert(inter, hidden), bench.vector(hidden), bench.shifts(hidden))
    await ClockCycles(dut.clk, golden.weight_beats(1, inter, hidden, cfg.mults) // 2 + 5)
    await bench.reset_mid_job()
    bench.gemv(bench.weights(3, hidden), bench.vector(hidden))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Zero sizes, cols > max_cols, ffn rows > max_inter, 0 tokens and (where the field can
    hold it) more than max_tokens are dropped with a sticky error; the core keeps working."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    bad = [(golden.OP_GEMV, 0, 4, 1), (golden.OP_GEMV, 4, 0, 1),
           (golden.OP_GEMV, 1, cfg.max_cols + 1, 1),
           (golden.OP_FFN_SLICE, cfg.max_inter + 1, 4, 1), (golden.OP_FFN_SLICE, 0, 4, 1),
           (golden.OP_GEMV, 1, 1, 0), (golden.OP_FFN_SLICE, 1, 1, 0)]
    if cfg.max_tokens + 1 < 1 << token_bits(cfg):
        bad.append((golden.OP_GEMV, 1, 1, cfg.max_tokens + 1))
    for op, rows, cols, tokens in bad:
        bench.sources["cmd"].send({"op": op, "load_x": 1, "rows": rows, "cols": cols,
                                   "shift_g": 0, "shift_u": 0, "shift_h": 0, "tokens": tokens})
        await wait_for(dut, lambda: bench.sources["cmd"].idle, 50, "bad command taken")
        await ClockCycles(dut.clk, 3)
        assert dut.error.value == 1, f"no error for op={op} rows={rows} cols={cols} S={tokens}"
        assert not dut.busy.value and not dut.x__ready.value, "a bad command started"
    cols = min(3, cfg.max_cols)
    bench.gemv(bench.weights(2, cols), bench.vector(cols))
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, "error not sticky"


@cocotb.test()
async def test_cycle_exact(dut):
    """Back-to-back commands with waiting streams and a ready output: every command, weight
    beat and result transfer lands on the edge :func:`golden.ndp.timeline` gives (including
    single-beat rows waiting for output slots)."""
    bench = _setup(dut, "cycles")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    hidden = min(cfg.max_cols, 2 * cfg.mults + 1)
    S = cfg.max_tokens
    plan = [(golden.OP_GEMV, 5, hidden, True, 1), (golden.OP_GEMV, 3, hidden, False, 1),
            (golden.OP_FFN_SLICE, min(cfg.max_inter, 2 * cfg.mults + 1), hidden, True, 1),
            (golden.OP_FFN_SLICE, 1, hidden, False, 1),
            (golden.OP_GEMV, 2 * cfg.out_depth + 1, 1, True, 1),
            # Multi-token: every token's pair of a one-beat row wants an output slot.
            (golden.OP_GEMV, cfg.out_depth + 2, 1, True, S),
            (golden.OP_FFN_SLICE, min(cfg.max_inter, cfg.mults + 1), hidden, True, S),
            (golden.OP_GEMV, 3, hidden, False, max(1, S // 2))]
    for op, rows, cols, load_x, tokens in plan:
        xs = [bench.vector(cols) for _ in range(tokens)]
        if op == golden.OP_GEMV:
            bench.gemv_tokens(bench.weights(rows, cols), xs, load_x=load_x)
        else:
            bench.ffn_tokens(*bench.expert(rows, cols), xs, bench.shifts(cols),
                             load_x=load_x)
    await bench.drain()
    bench.check()
    origin = bench.sources["cmd"].sent_edges[0]
    have = ([e - origin for e in bench.sources["cmd"].sent_edges],
            [e - origin for e in bench.sources["w"].sent_edges],
            [e - origin for e, _ in bench.y.received])
    want = golden.timeline(plan, cfg.out_depth, cfg.mults)
    for name, got, expected in zip(("command", "weight beat", "result"), have, want):
        assert len(got) == len(expected), f"{len(got)} {name} transfers, expected {len(expected)}"
        for index, (g, e) in enumerate(zip(got, expected)):
            assert g == e, f"{name} {index}: edge {g}, expected {e}"


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """MAC utilization with an ideal weight stream and with the DDR4 model (every beat taken
    at its arrival), a 4-DIMM tensor-parallel expert, and the cycles of one DIMM's slice of each
    Table II expert scaled to the buffers; asserted against the cycle model, written for make
    bench and make demo."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    M = cfg.mults
    rows, cols = 4 * M, cfg.max_cols
    metrics, wall = {}, time.perf_counter()
    done_macs = []                      # useful MACs of every command, for make bench

    async def run(op, rows, cols, queue, tokens=1, not_before=None):
        """Queue one command with ``queue()``; check its every weight beat and result edge
        against :func:`golden.ndp.timeline` (with the DRAM's arrival edges when ``not_before``
        paces the beats); returns its cycles (command edge to the edge after its last (beat,
        token) pair, which the last result's edge fixes) and useful MACs. ``busy`` is high
        from the edge after the command's to the one its last result is taken at."""
        queue()
        await bench.drain()
        bench.check()
        start = bench.sources["cmd"].sent_edges[-1]
        await ClockCycles(dut.clk, 2)
        assert_high_from_to(samples, "busy", start + 1, bench.y.received[-1][0],
                            f"({rows}x{cols}, S={tokens})")
        ready = None if not_before is None else [e + 1 - start for e in not_before]
        _, beats, results = golden.timeline([(op, rows, cols, True, tokens)], cfg.out_depth, M,
                                            ready)
        have = [e - start for e in bench.sources["w"].sent_edges[-len(beats):]]
        assert have == beats, f"{rows}x{cols}, S={tokens}: weight beats off the cycle model"
        have = [e - start for e, _ in bench.y.received[-len(results):]]
        assert have == results, f"{rows}x{cols}, S={tokens}: results off the cycle model"
        cycles = results[-1] - golden.result_latency(M) + 1
        done_macs.append(golden.useful_macs(op, rows, cols, tokens))
        return cycles, done_macs[-1]

    weights = bench.weights(rows, cols)
    x = bench.vector(cols)
    cycles, macs = await run(golden.OP_GEMV, rows, cols, lambda: bench.gemv(weights, x))
    metrics["gemv_mac_util_ideal"] = round(macs / (M * cycles), 3)
    metrics["gemv_cycles"] = cycles

    # Fed by the DDR4 model: every beat is taken the edge after it arrives or the edge after
    # the previous beat, whichever is later (the core never adds a bubble of its own).
    origin = edge_now() + 1
    beats = golden.weight_beats(golden.OP_GEMV, rows, cols, M)
    stream, not_before = dram_times(cfg, beats, origin)
    cycles, _ = await run(golden.OP_GEMV, rows, cols,
                          lambda: bench.gemv(weights, x, not_before=not_before),
                          not_before=not_before)
    start = bench.sources["cmd"].sent_edges[-1]
    metrics["gemv_mac_util_ddr4"] = round(macs / (M * (start + cycles - origin)), 3)

    # Multi-token commands (S tokens share each weight beat): ideal and DDR4-fed MAC
    # utilization, from bandwidth-bound at S = 1 towards compute-bound.
    for tokens in (8, 64):
        if tokens > cfg.max_tokens:
            continue
        xs = [bench.vector(cols) for _ in range(tokens)]
        cycles, macs = await run(golden.OP_GEMV, rows, cols,
                                 lambda: bench.gemv_tokens(weights, xs), tokens)
        metrics[f"s{tokens}_gemv_mac_util_ideal"] = round(macs / (M * cycles), 3)
        origin = edge_now() + 1
        _, not_before = dram_times(cfg, beats, origin)
        cycles, _ = await run(golden.OP_GEMV, rows, cols,
                              lambda: bench.gemv_tokens(weights, xs, not_before=not_before),
                              tokens, not_before)
        start = bench.sources["cmd"].sent_edges[-1]
        metrics[f"s{tokens}_gemv_mac_util_ddr4"] = round(
            macs / (M * (start + cycles - origin)), 3)

    # make demo's 4-DIMM tensor-parallel expert: Qwen3-30B-A3B (hidden 2048, intermediate 768)
    # scaled down to the buffers; the four slices run in turn, the host sums their outputs.
    hidden = min(cols, 2048)
    inter = max(4, min(4 * cfg.max_inter, 768 * hidden // 2048))
    wg, wu, wd = bench.expert(inter, hidden)
    x, shifts = bench.vector(hidden), bench.shifts(hidden)
    partials, slice_cycles, macs = [], [], 0
    for wg_s, wu_s, wd_s in golden.split_expert(wg, wu, wd, 4):
        first = len(bench.expected)
        cycles, slice_macs = await run(golden.OP_FFN_SLICE, wg_s.shape[0], hidden,
                                       lambda: bench.ffn(wg_s, wu_s, wd_s, x, shifts))
        partials.append([v for v, _ in bench.results()[first:]])
        slice_cycles.append(cycles)
        macs += slice_macs
    total = [fixed.wrap(v, cfg.acc_width) for v in np.array(partials, dtype=object).sum(0)]
    whole = golden.ffn_expert(wg, wu, wd, x, bench.table, shifts, cfg.x_width, cfg.acc_width)
    assert total == whole, "4-DIMM tensor-parallel sum differs from the whole expert"
    metrics[f"tp4_expert_{hidden}x{inter}_slice_cycles"] = max(slice_cycles)
    metrics["ffn_mac_util"] = round(macs / (M * sum(slice_cycles)), 3)

    # One DIMM's slice (N = 4) of each Table II expert, scaled by one factor to fit the buffers.
    for model in golden.MODELS:
        scale = max(math.ceil(model.hidden / cols), math.ceil(model.inter / 4 / cfg.max_inter))
        hidden, inter = math.ceil(model.hidden / scale), math.ceil(model.inter / scale / 4)
        wg, wu, wd = bench.expert(inter, hidden)
        cycles, _ = await run(golden.OP_FFN_SLICE, inter, hidden,
                              lambda: bench.ffn(wg, wu, wd, bench.vector(hidden),
                                                bench.shifts(hidden)))
        metrics[f"{model.name.split('-')[0].lower()}_{hidden}x{inter}_cycles"] = cycles
    sampler.cancel()
    write_throughput(metrics, "MAC utilization (useful MACs / M per cycle), cycles",
                     edge_now() / (time.perf_counter() - wall),
                     ddr4_gb_s=round(stream.bandwidth_gb_s(), 2),
                     ddr4_peak_gb_s=TABLE_I.peak_bytes_per_clock(DDR4_3200AA)
                     / DDR4_3200AA.tCK_ns, operations=sum(done_macs))
