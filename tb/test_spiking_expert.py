"""cocotb tests of ``spiking_expert`` against ``golden.spiking_expert``.

Every output beat (spike bits, token, timestep, tile, last) is compared, in order, with the
golden spiking expert (synaptic integration + LIF over timesteps) on the same weights, spikes,
Vth and Vleak. Lanes past D_out and spike bits past the last pair carry random values.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import spiking_expert as golden
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import (STALL_PROFILES, JobBench, assert_high_from_to, sample_each_edge,
                        start_after_reset)



class ExpertBench(JobBench):
    """Sources on ``cmd``, ``w``, ``s``; a sink on ``out``; the expected beats."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("cmd", "w", "s"), ("out",), gap, stall)
        self.cfg = config
        self.out = self.sinks["out"]
        self.expected = []
        self.synaptic_ops = 0
        self.w_beats = 0             # every w beat queued: the drain budget counts them all

    def random_job(self, d_in, d_out, tokens, steps, density=0.3, vth=None, vleak=None):
        cfg = self.cfg
        w_max = fixed.signed_limits(cfg.w_width)[1]
        weights = [[self.rng.randint(-w_max - 1, w_max) for _ in range(d_in)]
                   for _ in range(d_out)]
        spikes = [[[int(self.rng.random() < density) for _ in range(d_in)] for _ in range(steps)]
                  for _ in range(tokens)]
        v_max = fixed.signed_limits(cfg.v_width)[1]
        if vth is None:
            vth = min(v_max, self.rng.randint(0, w_max * max(1, d_in // 4)))
        if vleak is None:
            vleak = min(v_max, self.rng.randint(0, 2))
        return weights, spikes, vth, vleak

    def job(self, weights, spikes, vth, vleak):
        cfg = self.cfg
        d_out, d_in = len(weights), len(weights[0])
        self.sources["cmd"].send({"d_in": d_in, "d_out": d_out, "tokens": len(spikes),
                                  "timesteps": len(spikes[0]), "vth": vth, "vleak": vleak})
        w_max = fixed.signed_limits(cfg.w_width)[1]
        pad = lambda: self.rng.randint(-w_max - 1, w_max)  # noqa: E731
        for w, s in golden.expert_input_beats(weights, spikes, cfg.rows, cfg.cols, pad):
            self.sources["w"].send({"w": w})
            self.sources["s"].send({"s": s})
            self.w_beats += 1
        reference = golden.expert_reference(weights, spikes, vth, vleak, cfg.acc_width,
                                            cfg.v_width)
        self.expected += golden.expert_output_order(reference, d_out, cfg.rows)
        self.synaptic_ops += d_out * sum(map(sum, (st for tok in spikes for st in tok)))

    async def drain(self):
        await self.settle("out", len(self.expected), 60 * len(self.expected)
                          + 20 * self.w_beats + 4000)

    def results(self):
        """Received beats as ``(spikes, token, timestep, tile, last)``."""
        return [(int(b.spikes), int(b.token), int(b.timestep), int(b.tile), int(b.last))
                for _, b in self.out.received]

    def comparisons(self):
        return [("out", ("spikes", "token", "timestep", "tile", "last"), self.expected)]


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return ExpertBench(dut, config, component, make_rng(salt), **kwargs)


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_tiled_jobs(dut, gap, stall):
    """Jobs smaller than, equal to and larger than the array in D_out and in pairs (several
    timesteps, tokens spanning column tiles), short and long D_in, back to back."""
    bench = _setup(dut, f"tiled{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    R, C, max_tokens = bench.cfg.rows, bench.cfg.cols, bench.cfg.max_tokens
    shapes = [(3, 1, 1, 1), (C + 2, R, min(2, max_tokens), 2),
              (2 * C, R + 1, min(3, max_tokens), C // 2 + 1),
              (1, 2 * R + 1, 1, 3), (5, max(1, R - 1), min(max_tokens, 2), 1)]
    for d_in, d_out, tokens, steps in shapes:
        bench.job(*bench.random_job(d_in, d_out, tokens, steps))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_threshold_and_leak_edges(dut):
    """All-ones spikes with equal weights: integration exactly at Vth (no spike), one above
    (spike, reset), a negative leak charging, a large leak keeping V negative; values clamped
    to what V's and the weights' widths hold (at the narrowest the edges fold together)."""
    bench = _setup(dut, "edges")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    R = cfg.rows
    v_min, v_max = fixed.signed_limits(cfg.v_width)
    weight = min(2, fixed.signed_limits(cfg.w_width)[1], v_max)
    d_in = max(1, min(3, v_max // weight))
    step = weight * d_in                                 # integration per step: 6 by default
    weights = [[weight] * d_in for _ in range(R)]
    spikes = [[[1] * d_in for _ in range(3)]]

    def fit(value):
        return max(v_min, min(v_max, value))
    for vth, vleak in ((step, 0), (step - 1, 0), (2 * step - 1, -1), (0, step + 1),
                       (2 * step, 0)):
        bench.job(weights, spikes, fit(vth), fit(vleak))
    await bench.drain()
    bench.check()


def _alternating_sums(cfg, longest=64):
    """Integration targets whose bits alternate both ways (0b..1010, 0b..0101) and their
    complements (negative: the sign and every bit above set), as wide as the accumulator, the
    potential and a D_in of at most ``longest`` inputs of the largest weight allow."""
    w_max = fixed.signed_limits(cfg.w_width)[1]
    width = min(cfg.acc_width, cfg.v_width, (w_max * longest).bit_length() + 1) - 1
    ones = (1 << width) - 1
    pattern = int("10" * width, 2) & ones
    return [pattern, pattern >> 1, ~pattern, ~(pattern >> 1)]


def _weights_summing_to(rng, total, d_in, w_min, w_max):
    """``d_in`` weights in [w_min, w_max] that sum to ``total``, spread at random."""
    low, extra = divmod(total, d_in)
    weights = [low + 1] * extra + [low] * (d_in - extra)
    for _ in range(2 * d_in):
        i, j = rng.randrange(d_in), rng.randrange(d_in)
        room = min(w_max - weights[i], weights[j] - w_min)
        if i != j and room > 0:
            step = rng.randint(1, room)
            weights[i] += step
            weights[j] -= step
    assert sum(weights) == total
    return weights


@cocotb.test()
async def test_every_sum_at_the_threshold(dut):
    """Every PE's integration sits exactly at the threshold's edge: all spikes 1, each neuron's
    weights (random, different per neuron) summing to a target S, over every column (tokens
    x timesteps covering the array). With Vth = S - 1 every neuron fires in every step (and
    resets); with Vth = S none fires in its first step. S runs through alternating bit
    patterns and their negative complements, so every accumulator bit is seen set and clear
    and a sum one unit off, in any PE, weight register or readout, flips a spike."""
    bench = _setup(dut, "at-threshold")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    w_min, w_max = fixed.signed_limits(cfg.w_width)
    tokens = min(cfg.max_tokens, cfg.cols)
    steps = -(-cfg.cols // tokens)
    for total in _alternating_sums(cfg):
        d_in = -(-abs(total) // w_max) + 2
        weights = [_weights_summing_to(bench.rng, total, d_in, w_min, w_max)
                   for _ in range(cfg.rows)]
        spikes = [[[1] * d_in for _ in range(steps)] for _ in range(tokens)]
        for vth in (total - 1, total):
            bench.job(weights, spikes, vth, 0)
    await bench.drain()
    bench.check()
    fired = [beat[0] for beat in bench.expected]
    assert any(fired) and not all(fired)


def _wrapping_length(weight, acc_width, d_in_max=(1 << 16) - 1):
    """The smallest D_in (at most ``d_in_max``) whose sum of ``weight`` wraps to the other
    side of zero in ``acc_width`` bits (a Vth = 0 neuron fires where the exact sum would not,
    or the other way round), or None where no D_in the port carries can."""
    for d_in in range(1, d_in_max + 1):
        exact = weight * d_in
        if (exact > 0) != (fixed.wrap(exact, acc_width) > 0):
            return d_in
    return None


@cocotb.test()
async def test_integration_wraps(dut):
    """Integrations past the acc_width range wrap in two's complement before the LIF step: all
    spikes 1, every weight at the largest and then at the most negative value, over the
    shortest D_in whose sum wraps to the other side of zero. Each sum is pinned by two jobs,
    Vth = V - 1 (fires) and Vth = V (does not), V the wrapped sum saturated to v_width. Where
    no D_in the port carries can wrap (acc_width = 32), the longest sum the port carries is
    pinned the same way, exact (a sum past 2^16, or 2^16 - 1 of weight 1)."""
    bench = _setup(dut, "wrap")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    v_lo, _ = fixed.signed_limits(cfg.v_width)
    for weight in fixed.signed_limits(cfg.w_width)[::-1]:
        d_in = _wrapping_length(weight, cfg.acc_width)
        wraps = d_in is not None
        if not wraps:                                  # a sum past 2^16, checked exact
            d_in = min((1 << 16) - 1, (1 << 16) // abs(weight) + 1)
        weights = [[weight] * d_in for _ in range(cfg.rows)]
        spikes = [[[1] * d_in]]
        potential = fixed.saturate(fixed.wrap(weight * d_in, cfg.acc_width), cfg.v_width)
        assert ((potential > 0) != (weight > 0)) == wraps   # the wrap decides the spikes
        for vth in (potential - 1, potential):
            if vth < v_lo:
                continue
            expected = golden.expert_reference(weights, spikes, vth, 0, cfg.acc_width,
                                               cfg.v_width)
            assert expected[0][0] == [int(vth < potential)] * cfg.rows
            bench.job(weights, spikes, vth, 0)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_job(dut):
    """Reset with a job half taken and columns in the array: no stale output afterwards."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.2)
    await start_after_reset(dut, bench)
    R, C = bench.cfg.rows, bench.cfg.cols
    bench.job(*bench.random_job(2 * C, 2 * R, min(2, bench.cfg.max_tokens), 3))
    await ClockCycles(dut.clk, 2 * C + 5)
    await bench.reset_mid_job("out")
    bench.expected.clear()
    bench.job(*bench.random_job(4, R, 1, 2))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Zero sizes and too many tokens are dropped with a sticky error; the core keeps working;
    a reset clears the error."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    good = {"d_in": 2, "d_out": 2, "tokens": 1, "timesteps": 1, "vth": 1, "vleak": 0}
    bad = [{"d_in": 0}, {"d_out": 0}, {"tokens": 0}, {"timesteps": 0}]
    if (cfg.max_tokens + 1).bit_length() == cfg.max_tokens.bit_length():
        bad.append({"tokens": cfg.max_tokens + 1})      # representable in the tokens field
    await bench.reject_commands(good, bad)
    bench.job(*bench.random_job(3, 2, 1, 2))
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, (
        "error not sticky or job wrong")
    await bench.reset()
    assert dut.error.value == 0 and not dut.busy.value, "error or busy survived the reset"


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Waiting streams and a ready output: every input beat of a job with D_in >= C goes in
    one per cycle (no bubble between tiles), column 0 of each tile leaves column_latency
    edges after the tile's last beat and column j j edges later; synaptic operations per
    cycle against the array's peak R x C. ``busy`` is high from the edge after the command's
    to the one the last tile's column C - 1 leaves the array, 2 before it would be taken: so
    past the last row by the padding columns (a second job, of C - 1 pairs, has one)."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    R, C = cfg.rows, cfg.cols
    d_in = max(C, 8)
    tokens = min(cfg.max_tokens, 2)
    steps = C                                   # tokens * steps = 2 column tiles per row tile
    weights, spikes, vth, vleak = bench.random_job(d_in, 2 * R, tokens, steps, density=0.5)
    wall = time.perf_counter()
    bench.job(weights, spikes, vth, vleak)
    await bench.drain()
    bench.check()
    taken = bench.sources["w"].sent_edges
    assert taken == list(range(taken[0], taken[0] + len(taken))), "bubble between beats"
    outs = [edge for edge, _ in bench.out.received]
    pairs = tokens * steps
    latency = golden.column_latency(R)
    tile_ends = taken[d_in - 1::d_in]
    per_tile = [outs[i:i + C] for i in range(0, len(outs), C)]
    for tile, (end, columns) in enumerate(zip(tile_ends, per_tile)):
        want = [end + latency + j for j in range(len(columns))]
        assert columns == want, f"tile {tile}: columns at {columns}, expected {want}"
    cycles = outs[-1] - taken[0] + 1
    ops = bench.synaptic_ops
    write_throughput({"cycles": cycles, "input_beats": len(taken),
                      "synaptic_ops_per_cycle": round(ops / cycles, 2),
                      "peak_ops_per_cycle": R * C,
                      "dense_utilization": round(len(taken) / cycles, 3),
                      "output_spike_rate": round(sum(bin(int(b.spikes)).count("1")
                                                     for _, b in bench.out.received)
                                                 / (2 * R * pairs), 3)},
                     "cycles, synaptic operations (adds of a weight on a 1 spike) per cycle",
                     outs[-1] / (time.perf_counter() - wall), operations=ops)

    def check_busy(command, last_tile_end):
        end = last_tile_end + latency + C - 1 - 2        # column C - 1 leaves the array
        assert_high_from_to(samples, "busy", command + 1, end)
    await ClockCycles(dut.clk, 2)
    check_busy(bench.sources["cmd"].sent_edges[-1], taken[-1])
    sent = len(taken)
    bench.job(*bench.random_job(d_in, R, 1, max(1, C - 1)))
    await bench.drain()
    await ClockCycles(dut.clk, C + 8)                  # the padding columns, then idle
    bench.check()
    check_busy(bench.sources["cmd"].sent_edges[-1], bench.sources["w"].sent_edges[-1])
    assert len(bench.sources["w"].sent_edges) == sent + d_in
    sampler.cancel()
