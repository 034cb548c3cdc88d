"""cocotb tests of ``ndp_system`` (N ``ndp_core`` DIMMs, one expert tensor-parallel, the partial
sums reduced in hardware) against ``golden.ndp``.

Every result is compared, in order, with the *unsplit* expert FFN of its token
(:func:`golden.ndp.system_expert_tokens`): the DIMMs' slices and the reduction must add up to it
bit for bit. Each DIMM's weight port is fed its own slice (its own DRAM); with a ready output and
waiting streams, command, weight-beat and result edges are asserted against
:func:`golden.ndp.system_timeline`.
"""

import math
import time

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import ndp as golden
from hw.ndp import COUNT_BITS, token_bits
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.ndp_bench import NdpBenchBase, dram_times, silu_table
from tb.streams import (STALL_PROFILES, assert_high_from_to, edge_now, sample_each_edge,
                        start_after_reset, wait_for)


class SystemBench(NdpBenchBase):
    """Sources on ``cmd``, ``x``, ``lut`` and every DIMM's ``w__<d>``, a sink on ``y``."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        self.weight_ports = [f"w__{d}" for d in range(config.dimms)]
        super().__init__(dut, config, component, rng, self.weight_ports, gap, stall)

    def run_expert(self, wg, wu, wd, xs, shifts, load_x=True, not_before=None):
        """Queue one expert over the tokens ``xs`` (``None`` entries: reuse the buffer);
        ``not_before[d][j]``: the edge after which DIMM d's beat j may be offered."""
        inter, hidden = wg.shape
        self.sources["cmd"].send({"load_x": int(load_x), "rows": inter, "cols": hidden,
                                  "shift_g": shifts[0], "shift_u": shifts[1],
                                  "shift_h": shifts[2], "tokens": len(xs)})
        xs = self.send_x(xs, hidden, load_x)
        slices = golden.system_weight_beats(wg, wu, wd, self.cfg.dimms, self.cfg.mults,
                                            self.pad(self.cfg.w_width))
        for d, beats in enumerate(slices):
            # The DIMMs run side by side: count the longest slice once.
            self.send_weights(self.weight_ports[d], beats,
                              None if not_before is None else not_before[d],
                              len(xs) if d == 0 else 0)
        self.expect(golden.system_expert_tokens(wg, wu, wd, xs, self.table, shifts,
                                                self.cfg.x_width, self.cfg.acc_width))


def _largest(cfg):
    """The largest expert a command can name: N * max_inter rows, at most what the 16-bit
    ``rows`` field holds."""
    return min(cfg.dimms * cfg.max_inter, (1 << COUNT_BITS) - 1)


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return SystemBench(dut, config, component, make_rng(salt), **kwargs)


def _sizes(cfg, rng):
    """Expert sizes (I, D): I a multiple of N, one over (uneven), I = N (one row per DIMM), the
    largest I (:func:`_largest`), D from 1 to max_cols."""
    N, M = cfg.dimms, cfg.mults
    top = _largest(cfg)
    inters = sorted({N, min(2 * N, top), min(2 * N + 1, top), min(N * M + N - 1, top), top})
    hiddens = [1, min(M + 1, cfg.max_cols), cfg.max_cols, rng.randint(1, cfg.max_cols)]
    return [(inter, hiddens[i % len(hiddens)]) for i, inter in enumerate(inters)]


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_expert_split_and_reduced(dut, gap, stall):
    """Experts whose rows split evenly, unevenly, one row per DIMM and at the buffers' limit,
    over 1, 2, max_tokens and a random number of tokens, x reloaded or reused, gaps on every
    input (every DIMM's weight port on its own) and stalls on y: every result equals the
    unsplit expert's."""
    bench = _setup(dut, f"split{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    T = cfg.max_tokens
    counts = [1, min(2, T), T, bench.rng.randint(1, T)]
    for index, (inter, hidden) in enumerate(_sizes(cfg, bench.rng)):
        tokens = counts[index % len(counts)]
        reuse = index % 3 == 2 and bench.x_buffer and all(
            len(b) >= hidden for b in bench.x_buffer[:tokens]) and len(bench.x_buffer) >= tokens
        xs = [None] * tokens if reuse else [bench.vector(hidden) for _ in range(tokens)]
        bench.run_expert(*bench.expert(inter, hidden), xs, bench.shifts(hidden),
                         load_x=not reuse)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_lut_broadcast_and_extremes(dut):
    """A random activation table written through the one LUT port reaches every DIMM; the most
    negative and positive operands at the largest expert (the accumulator wraps when acc_width
    is small; the reduction wraps the same way)."""
    bench = _setup(dut, "extremes")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut([bench.rng.randint(*fixed.signed_limits(cfg.x_width))
                           for _ in range(1 << cfg.x_width)])
    w_min, w_max = fixed.signed_limits(cfg.w_width)
    x_min, x_max = fixed.signed_limits(cfg.x_width)
    inter, hidden = _largest(cfg), cfg.max_cols
    for w_value, x_value, shifts in ((w_min, x_min, (0, 0, 0)), (w_max, x_min, (31, 0, 31)),
                                     (w_min, x_max, (0, 31, 0))):
        wg, wu, wd = (np.full(shape, w_value, dtype=np.int64)
                      for shape in ((inter, hidden), (inter, hidden), (hidden, inter)))
        bench.run_expert(wg, wu, wd, [[x_value] * hidden, [x_max] * hidden][:cfg.max_tokens],
                         shifts)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_every_shift(dut):
    """Every requantization shift from 0 to 31 of g and of h, with u shifted by 0..7 (a larger
    shift of u leaves u's code 0 or -1 and hides h's rounding): the rounding constant and the
    saturation of every shift reach the result, in every DIMM."""
    bench = _setup(dut, "shifts")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut([bench.rng.randint(*fixed.signed_limits(cfg.x_width))
                           for _ in range(1 << cfg.x_width)])
    inter, hidden = min(2 * cfg.dimms, cfg.dimms * cfg.max_inter), min(cfg.max_cols, 3)
    tokens = min(3, cfg.max_tokens)
    for shift in range(32):
        shifts = (shift, shift % 8, (shift + 16) % 32)
        bench.run_expert(*bench.expert(inter, hidden),
                         [bench.vector(hidden) for _ in range(tokens)], shifts)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_every_accumulator_bit(dut):
    """Weights and x of at most b in magnitude, b^2 D within x's range, and shifts of 0: g, u
    and h are exact (a table of -1, 0 and 1 keeps h = a u in range), so a wrong bit in any
    token's accumulator, over rows of one beat and of several, changes y, in every DIMM."""
    bench = _setup(dut, "accumulator-bits")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut([bench.rng.randint(-1, 1) for _ in range(1 << cfg.x_width)])
    x_max = fixed.signed_limits(cfg.x_width)[1]
    for hidden in sorted({min(cfg.mults, cfg.max_cols), cfg.max_cols}):
        bound = max(1, math.isqrt(x_max // hidden))
        for tokens in sorted({1, cfg.max_tokens}):
            bench.run_expert(*bench.expert(_largest(cfg), hidden, bound),
                             [bench.vector(hidden, bound) for _ in range(tokens)], (0, 0, 0))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_cycle_exact(dut):
    """Back-to-back experts with waiting streams and a ready output: every command, every
    DIMM's weight beats and every result land on the edges :func:`golden.ndp.system_timeline`
    gives (uneven splits: the DIMMs with one row more finish later and the others wait on their
    output slots)."""
    bench = _setup(dut, "cycles")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    N, T = cfg.dimms, cfg.max_tokens
    hidden = min(cfg.max_cols, 2 * cfg.mults + 1)
    plan = [(min(2 * N + 1, N * cfg.max_inter), hidden, True, 1),
            (N, hidden, False, 1),
            (_largest(cfg), hidden, True, T),
            (min(N + 1, N * cfg.max_inter), 1, True, T),
            (min(3 * N - 1, N * cfg.max_inter), hidden, False, max(1, T // 2))]
    for inter, cols, load_x, tokens in plan:
        xs = [bench.vector(cols) for _ in range(tokens)] if load_x else [None] * tokens
        bench.run_expert(*bench.expert(inter, cols), xs, bench.shifts(cols), load_x=load_x)
    await bench.drain()
    bench.check()
    origin = bench.sources["cmd"].sent_edges[0]
    commands, beats, results = golden.system_timeline(plan, N, cfg.out_depth, cfg.mults)
    have = [e - origin for e in bench.sources["cmd"].sent_edges]
    assert have == commands, f"command edges {have}, expected {commands}"
    for d, port in enumerate(bench.weight_ports):
        have = [e - origin for e in bench.sources[port].sent_edges]
        assert len(have) == len(beats[d]), f"DIMM {d}: {len(have)} beats, expected {len(beats[d])}"
        for index, (got, want) in enumerate(zip(have, beats[d])):
            assert got == want, f"DIMM {d} beat {index}: edge {got}, expected {want}"
    have = [e - origin for e, _ in bench.y.received]
    assert len(have) == len(results), f"{len(have)} results, expected {len(results)}"
    for index, (got, want) in enumerate(zip(have, results)):
        assert got == want, f"result {index}: edge {got}, expected {want}"


@cocotb.test()
async def test_reset_mid_expert(dut):
    """Reset while the DIMMs compute an expert (stalls and gaps on): nothing of it comes out
    afterwards, the next expert is exact."""
    bench = _setup(dut, "reset", gap=0.3, stall=0.3)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    inter, hidden = _largest(cfg), cfg.max_cols
    bench.run_expert(*bench.expert(inter, hidden), [bench.vector(hidden)], bench.shifts(hidden))
    slice_beats = golden.weight_beats(golden.OP_FFN_SLICE, -(-inter // cfg.dimms), hidden,
                                      cfg.mults)
    await ClockCycles(dut.clk, slice_beats // 2 + 5)
    await bench.reset_mid_job()
    inter = min(cfg.dimms + 1, cfg.dimms * cfg.max_inter)
    bench.run_expert(*bench.expert(inter, hidden), [bench.vector(hidden)], bench.shifts(hidden))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Fewer rows than DIMMs, a slice over max_inter, cols of 0 or over max_cols, 0 tokens and
    (where the field holds it) more than max_tokens: dropped, no DIMM starts, sticky error; the
    system keeps working."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))     # the table outlives resets: write a known one
    N = cfg.dimms
    bad = [(N - 1, 4, 1), (N, 0, 1), (N, cfg.max_cols + 1, 1),
           (N, 1, 0)]
    if N * cfg.max_inter + 1 < 1 << COUNT_BITS:       # a slice over max_inter, if it fits
        bad.append((N * cfg.max_inter + 1, 4, 1))
    if cfg.max_tokens + 1 < 1 << token_bits(cfg):
        bad.append((N, 1, cfg.max_tokens + 1))
    for rows, cols, tokens in bad:
        bench.sources["cmd"].send({"load_x": 1, "rows": rows, "cols": cols, "shift_g": 0,
                                   "shift_u": 0, "shift_h": 0, "tokens": tokens})
        await wait_for(dut, lambda: bench.sources["cmd"].idle, 50, "bad command taken")
        await ClockCycles(dut.clk, 3)
        assert dut.error.value == 1, f"no error for rows={rows} cols={cols} S={tokens}"
        assert not dut.busy.value and not dut.x__ready.value, "a bad command started"
    hidden = min(3, cfg.max_cols)
    bench.run_expert(*bench.expert(N, hidden), [bench.vector(hidden)], bench.shifts(hidden))
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, "error not sticky"


@cocotb.test()
async def test_ddr4_fed_dimms(dut):
    """Each DIMM's weights arrive as its own DDR4-3200 channel delivers them, with output
    stalls: results exact, no beat taken before its DIMM's DRAM delivered it."""
    bench = _setup(dut, "ddr4", stall=0.2)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    inter, hidden = min(2 * cfg.dimms + 1, cfg.dimms * cfg.max_inter), cfg.max_cols
    wg, wu, wd = bench.expert(inter, hidden)
    origin = edge_now()
    not_before = [dram_times(cfg, len(beats), origin)[1]
                  for beats in golden.system_weight_beats(wg, wu, wd, cfg.dimms, cfg.mults)]
    tokens = min(2, cfg.max_tokens)
    bench.run_expert(wg, wu, wd, [bench.vector(hidden) for _ in range(tokens)],
                     bench.shifts(hidden), not_before=not_before)
    await bench.drain()
    for d, port in enumerate(bench.weight_ports):
        taken = bench.sources[port].sent_edges
        assert all(t >= nb + 1 for t, nb in zip(taken, not_before[d])), \
            f"DIMM {d}: a beat taken before it arrived"
    bench.check()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """One Table II expert (Qwen3-30B-A3B's 2048 x 768, scaled to the buffers) over the N DIMMs
    for S = 1, 8 and max_tokens tokens: cycles against the cycle model, MAC utilization of the
    N x M multipliers, written for make bench. ``busy`` is high from the edge after each
    command's to the one its last result is taken at."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    await bench.write_lut(silu_table(cfg))
    N, M = cfg.dimms, cfg.mults
    hidden = min(cfg.max_cols, 2048)
    inter = max(N, min(N * cfg.max_inter, 768 * hidden // 2048))
    wg, wu, wd = bench.expert(inter, hidden)
    metrics, wall = {"expert": f"{hidden}x{inter}"}, time.perf_counter()
    done_macs = 0
    for tokens in sorted({1, min(8, cfg.max_tokens), cfg.max_tokens}):
        bench.run_expert(wg, wu, wd, [bench.vector(hidden) for _ in range(tokens)],
                         bench.shifts(hidden))
        await bench.drain()
        bench.check()
        command = bench.sources["cmd"].sent_edges[-1]
        cycles = bench.y.received[-1][0] - command + 1
        want = golden.system_timeline([(inter, hidden, True, tokens)], N, cfg.out_depth, M)[2][-1]
        assert cycles == want + 1, f"S={tokens}: {cycles} cycles, expected {want + 1}"
        await ClockCycles(dut.clk, 2)
        assert_high_from_to(samples, "busy", command + 1, bench.y.received[-1][0],
                            f"(S={tokens})")
        macs = golden.useful_macs(golden.OP_FFN_SLICE, inter, hidden, tokens)
        metrics[f"s{tokens}_cycles"] = cycles
        metrics[f"s{tokens}_mac_util"] = round(macs / (N * M * cycles), 3)
        done_macs += macs
    sampler.cancel()
    write_throughput(metrics, "cycles from the command to the last result of one expert, "
                     "MAC utilization of the N x M multipliers",
                     edge_now() / (time.perf_counter() - wall), operations=done_macs)
