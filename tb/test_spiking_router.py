"""cocotb tests of ``spiking_router`` against ``golden.spiking_router``.

Every route beat (token, expert mask, the E scores, last) is compared, in order, with the
golden routing-score array and top-K (ties to the lower expert index). Spike bits past the
last token carry random values.
"""

import time

import cocotb
from amaranth.hdl import Shape
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import spiking_router as golden
from hw.spiking_router import router_command_layout
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import (STALL_PROFILES, JobBench, assert_high_from_to, sample_each_edge,
                        start_after_reset)



class RouterBench(JobBench):
    """Sources on ``cmd``, ``w``, ``s``; a sink on ``route``; the expected routes."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("cmd", "w", "s"), ("route",), gap, stall)
        self.cfg = config
        self.routes = self.sinks["route"]
        self.expected = []
        self.w_beats = 0                               # queued on `w` so far (drain's budget)

    def random_job(self, d_in, tokens, steps, density=0.4):
        w_max = fixed.signed_limits(self.cfg.w_width)[1]
        weights = [[[self.rng.randint(-w_max - 1, w_max) for _ in range(self.cfg.experts)]
                    for _ in range(d_in)] for _ in range(steps)]
        spikes = [[[int(self.rng.random() < density) for _ in range(d_in)] for _ in range(steps)]
                  for _ in range(tokens)]
        return weights, spikes

    def job(self, weights, spikes, k):
        cfg = self.cfg
        self.sources["cmd"].send({"d_in": len(weights[0]), "tokens": len(spikes),
                                  "timesteps": len(weights), "k": k})
        for w, s in golden.router_input_beats(weights, spikes, cfg.cols,
                                              pad=lambda: self.rng.randint(0, 1)):
            self.sources["w"].send({"w": w})
            self.sources["s"].send({"s": s})
            self.w_beats += 1
        self.expected += golden.router_output_order(spikes, weights, k, cfg.acc_width)

    async def drain(self):
        await self.settle("route", len(self.expected), 60 * len(self.expected)
                          + 20 * self.w_beats + 4000)

    def results(self):
        return [(int(b.token), int(b.experts), [int(x) for x in b.scores], int(b.last))
                for _, b in self.routes.received]

    def comparisons(self):
        return [("route", ("token", "experts", "scores", "last"), self.expected)]


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return RouterBench(dut, config, component, make_rng(salt), **kwargs)


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_jobs(dut, gap, stall):
    """Token counts below, at and above the C columns (several column tiles), one and several
    timesteps, short and long D_in, every K from 1 to min(E, 3), back to back; last a job of
    T·D_in = 256 beats, so that the gaps also hold the beat counter past 127 (a mutant that
    lost the counter's bit 7 while ``w`` waited passed the suite without it)."""
    bench = _setup(dut, f"jobs{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    C, E = cfg.cols, cfg.experts
    shapes = [(3, 1, 1), (C + 1, min(cfg.max_tokens, C), 2), (2, min(cfg.max_tokens, 2 * C + 1), 3),
              (1, 1, 1), (5, min(cfg.max_tokens, C + 2), 1), (128, min(cfg.max_tokens, 2), 2)]
    for index, (d_in, tokens, steps) in enumerate(shapes):
        bench.job(*bench.random_job(d_in, tokens, steps), k=1 + index % min(E, 3))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_ties_go_to_the_lower_expert(dut):
    """Equal scores: all-zero weights (every expert ties: K = 1 takes expert 0, K = 2 experts
    0 and 1); two best experts tied at the high end (K = 1 takes the lower, K = 2 both); a
    negative-score job (no spikes to a positive weight)."""
    bench = _setup(dut, "ties")
    await start_after_reset(dut, bench)
    E = bench.cfg.experts
    d_in, tokens = 2, min(bench.cfg.max_tokens, 3)
    spikes = [[[1, 1]] for _ in range(tokens)]
    zero = [[[0] * E for _ in range(d_in)]]
    tied = [[[1 if e in (E - 1, max(0, E - 3)) else 0 for e in range(E)]
             for _ in range(d_in)]]
    negative = [[[-1 - (e % 2) for e in range(E)] for _ in range(d_in)]]
    for weights in (zero, tied, negative):
        for k in sorted({1, min(2, E)}):
            bench.job(weights, spikes, k)
    await bench.drain()
    bench.check()
    masks = [mask for _, mask, _, _ in bench.results()][:2 * tokens]
    if E >= 2:
        assert masks == [0b1] * tokens + [0b11] * tokens, f"all-equal ties: {masks}"


@cocotb.test()
async def test_scores_wrap(dut):
    """Routing scores past the acc_width range wrap in two's complement: all spikes 1, expert 0's
    weights at the largest value and expert 1's (if any) at the most negative, over enough
    inputs (d_in x timesteps) that the exact sums pass 2^(acc_width-1); the route's scores and
    its top-K follow the wrapped sums (the exact ones would rank the experts the other way
    round). Where no command reaches that (d_in < 2^16, timesteps < 2^8: acc_width 32 with 8-bit
    weights), the scores cannot wrap, and sums past 2^16 are checked exact instead (an
    accumulator narrower than acc_width fails)."""
    bench = _setup(dut, "wrap")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    w_min, w_max = fixed.signed_limits(cfg.w_width)
    half = 1 << (cfg.acc_width - 1)
    command = router_command_layout(cfg)
    d_in_max, steps_max = ((1 << Shape.cast(command[name].shape).width) - 1
                           for name in ("d_in", "timesteps"))
    inputs = half // min(w_max, -w_min) + 2
    wraps = inputs <= d_in_max * steps_max
    if not wraps:
        assert d_in_max * steps_max * max(w_max, -w_min) < half
        inputs = (1 << 16) // min(w_max, -w_min) + 2
    steps = -(-inputs // d_in_max)
    d_in = -(-inputs // steps)
    row = [w_max, w_min] + [0] * (cfg.experts - 2)
    weights = [[row[:cfg.experts] for _ in range(d_in)] for _ in range(steps)]
    spikes = [[[1] * d_in for _ in range(steps)] for _ in range(min(cfg.max_tokens, 2))]
    wrapped = golden.router_scores(spikes, weights, cfg.acc_width)
    exact = golden.router_scores(spikes, weights, 64)
    assert (wrapped != exact) == wraps and abs(exact[0][0]) >= min(half, 1 << 16)
    bench.job(weights, spikes, 1)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_job(dut):
    """Reset with a job half taken and tokens in the array: no stale route afterwards."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.2)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    bench.job(*bench.random_job(cfg.cols + 3, min(cfg.max_tokens, cfg.cols + 1), 2), k=1)
    await ClockCycles(dut.clk, cfg.cols + 9)
    await bench.reset_mid_job("route")
    bench.expected.clear()
    bench.job(*bench.random_job(4, min(cfg.max_tokens, 3), 2), k=min(2, cfg.experts))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Zero sizes, too many tokens and K outside 1..E are dropped with a sticky error."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    good = {"d_in": 2, "tokens": 1, "timesteps": 1, "k": 1}
    bad = [{"d_in": 0}, {"tokens": 0}, {"timesteps": 0}, {"k": 0}]
    if (cfg.experts + 1).bit_length() == cfg.experts.bit_length():
        bad.append({"k": cfg.experts + 1})
    if (cfg.max_tokens + 1).bit_length() == cfg.max_tokens.bit_length():
        bad.append({"tokens": cfg.max_tokens + 1})
    await bench.reject_commands(good, bad)
    bench.job(*bench.random_job(3, 1, 2), k=1)
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, (
        "error not sticky or job wrong")


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Waiting streams and a ready output: every beat goes in one per cycle (no bubble between
    column tiles when T x D_in >= C), token j of a tile leaves route_latency + j edges after
    the tile's last beat: one route per cycle. ``busy`` is high from the edge after the
    command's to the one the last tile's last column (padding included) leaves the array: the
    last token's scores 3 edges before its route is taken, then the padding columns."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    C = cfg.cols
    steps, d_in = 2, max(1, -(-C // 2))                # T x D_in >= C
    tokens = min(cfg.max_tokens, 2 * C)
    weights, spikes = bench.random_job(d_in, tokens, steps)
    wall = time.perf_counter()
    bench.job(weights, spikes, k=1)
    await bench.drain()
    bench.check()
    taken = bench.sources["w"].sent_edges
    assert taken == list(range(taken[0], taken[0] + len(taken))), "bubble between beats"
    outs = [edge for edge, _ in bench.routes.received]
    per_tile = steps * d_in
    latency = golden.route_latency(cfg.experts)
    for tile, end in enumerate(taken[per_tile - 1::per_tile]):
        columns = outs[tile * C:(tile + 1) * C]
        want = [end + latency + j for j in range(len(columns))]
        assert columns == want, f"tile {tile}: routes at {columns}, expected {want}"
    padding = -tokens % C               # the last tile's columns past the job's tokens
    await ClockCycles(dut.clk, 1 + padding)     # past busy's last edge, to see it fall
    sampler.cancel()
    assert_high_from_to(samples, "busy", bench.sources["cmd"].sent_edges[-1] + 1,
                        outs[-1] - 3 + padding)
    cycles = outs[-1] - taken[0] + 1
    histogram = [0] * cfg.experts
    for _, mask, _, _ in bench.results():
        histogram[mask.bit_length() - 1] += 1
    spikes_in = sum(bin(s).count("1") for _, s in golden.router_input_beats(weights, spikes, C))
    write_throughput({"cycles": cycles, "tokens": tokens,
                      "score_ops_per_cycle": round(spikes_in * cfg.experts / cycles, 2),
                      "peak_ops_per_cycle": cfg.experts * C,
                      "dense_utilization": round(len(taken) / cycles, 3)},
                     "cycles, score additions per cycle (E per beat) against E x C",
                     outs[-1] / (time.perf_counter() - wall), routing_histogram=histogram,
                     operations=spikes_in * cfg.experts)
