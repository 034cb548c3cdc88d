"""cocotb tests of ``spiking_attention`` against ``golden.spiking_attention`` (seed 004 Alg. 2).

Every output beat (the H heads' spikes of one feature and timestep, timestep, feature, last)
is compared, in order, with the golden spiking multi-head attention on the same Q, K, V, Vth
and Vleak.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import spiking_attention as golden
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import (LONG_BURSTS, STALL_PROFILES, JobBench, assert_high_from_to,
                        sample_each_edge, start_after_reset)



class AttentionBench(JobBench):
    """Sources on ``cmd``, ``qk``, ``v``; a sink on ``out``; the expected beats."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("cmd", "qk", "v"), ("out",), gap, stall)
        self.cfg = config
        self.out = self.sinks["out"]
        self.expected = []
        self.synaptic_ops = 0

    def random_job(self, tokens, steps, dim, density=0.5):
        def spikes():
            return [[[[int(self.rng.random() < density) for _ in range(dim)]
                      for _ in range(self.cfg.heads)] for _ in range(tokens)]
                    for _ in range(steps)]
        q, k, v = spikes(), spikes(), spikes()
        v_max = fixed.signed_limits(self.cfg.v_width)[1]
        vth = min(v_max, self.rng.randint(0, max(1, tokens * dim // 3)))
        return q, k, v, vth, min(v_max, self.rng.randint(0, 2))

    def job(self, q, k, v, vth, vleak):
        cfg = self.cfg
        tokens, steps, dim = len(q[0]), len(q), len(q[0][0][0])
        self.sources["cmd"].send({"tokens": tokens, "timesteps": steps, "head_dim": dim,
                                  "vth": vth, "vleak": vleak})
        qk, vb = golden.attention_input_beats(q, k, v, cfg.max_tokens, cfg.max_head_dim)
        for q_bits, k_bits in qk:
            self.sources["qk"].send({"q": q_bits, "k": k_bits})
        for bits in vb:
            self.sources["v"].send({"v": bits})
        out = golden.attention_reference(q, k, v, vth, vleak, cfg.v_width)
        self.expected += golden.attention_output_order(out, cfg.heads, cfg.max_tokens)
        # AND-popcount adds (N x N x d) and A.V adds where V is 1, per head and timestep.
        self.synaptic_ops += steps * cfg.heads * tokens * tokens * dim + tokens * sum(
            bits for step in v for token in step for head in token for bits in head)

    async def drain(self):
        await self.settle("out", len(self.expected), 80 * len(self.expected)
                          + 40 * len(self.sources["qk"].sent_edges) + 4000)

    def results(self):
        return [(int(b.spikes), int(b.timestep), int(b.feature), int(b.last))
                for _, b in self.out.received]

    def comparisons(self):
        return [("out", ("spikes", "timestep", "feature", "last"), self.expected)]


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return AttentionBench(dut, config, component, make_rng(salt), **kwargs)


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_jobs(dut, gap, stall):
    """Full, small and odd token counts and head sizes, one and several timesteps, back to
    back (the LIF state restarts per job)."""
    bench = _setup(dut, f"jobs{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    N, D = bench.cfg.max_tokens, bench.cfg.max_head_dim
    for tokens, steps, dim in ((N, 3, D), (1, 1, 1), (max(1, N - 1), 2, max(1, D // 2 + 1)),
                               (min(N, 2), 4, D)):
        bench.job(*bench.random_job(tokens, steps, dim))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_threshold_edges(dut):
    """All-ones Q, K, V (every Y = tokens x d): Y exactly at Vth (no spike), one below Vth
    (spike and reset each step), and a leak that keeps V at zero. Y is at most the largest
    potential, so that Vth = Y and Vleak = Y fit the command's v_width-bit fields (v_width = 2:
    one token, one feature)."""
    bench = _setup(dut, "edges")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    v_max = fixed.signed_limits(cfg.v_width)[1]
    tokens, dim = max(((t, d) for t in range(1, min(cfg.max_tokens, 2) + 1)
                       for d in range(1, min(cfg.max_head_dim, 2) + 1) if t * d <= v_max),
                      key=lambda size: size[0] * size[1])
    ones = [[[[1] * dim for _ in range(cfg.heads)] for _ in range(tokens)] for _ in range(2)]
    y = tokens * dim                       # A[n, m] = dim, Y[n, j] = tokens x dim
    for vth, vleak in ((y, 0), (y - 1, 0), (0, y)):
        bench.job(ones, ones, ones, vth, vleak)
    await bench.drain()
    bench.check()


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), [(0.5, 0.6), (LONG_BURSTS, LONG_BURSTS)]))
async def test_held_sums_at_the_threshold(dut, gap, stall):
    """All-ones Q, K, V at the largest size whose Y = tokens x d fits a potential, with valid
    gaps and ready stalls that hold the arrays mid-tile: every Y sits exactly at Vth (no spike
    at the first timestep), then one above it (a spike). A product added again while the
    arrays are held, or one lost, moves a Y across Vth: random spikes (test_random_jobs) meet
    a threshold too seldom to show a single A.V sum off by one product. Then the same with
    key token m holding (m mod d) + 1 ones, so A[n, m] steps 1, 2, ... and the partial sums
    pass through many values (equal steps of d can hide a partial sum's flipped bit: flipped
    back at a later step, the total comes out right)."""
    bench = _setup(dut, f"held{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    v_max = fixed.signed_limits(cfg.v_width)[1]

    def steps(t, d):                       # Y[n, j] = sum of A[n, m] with K's ramp
        return sum(m % d + 1 for m in range(t))

    for y_of, key_ones in ((lambda t, d: t * d, lambda m, d: d),
                           (steps, lambda m, d: m % d + 1)):
        tokens, dim = max(((t, d) for t in range(1, cfg.max_tokens + 1)
                           for d in range(1, cfg.max_head_dim + 1) if y_of(t, d) <= v_max),
                          key=lambda size: (y_of(*size), size))
        ones = [[[[1] * dim for _ in range(cfg.heads)] for _ in range(tokens)]
                for _ in range(2)]
        keys = [[[[int(i < key_ones(m, dim)) for i in range(dim)] for _ in range(cfg.heads)]
                 for m in range(tokens)] for _ in range(2)]
        y = y_of(tokens, dim)
        for vth in (y, y - 1):
            bench.job(ones, keys, ones, vth, 0)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_potentials_saturate(dut):
    """Leaks and thresholds at the ends of the v_width range, so that potentials saturate at
    both ends in every timestep: Vleak = min (every sum past max: V holds at max, which fires
    only when Vth < max), Vleak = max (every sum past min: V holds at min, which never fires),
    with Vth = max, max - 1, min and 0, on random spikes over three timesteps. Random jobs
    keep V far inside the range (Y <= tokens x d)."""
    bench = _setup(dut, "saturate")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    low, high = fixed.signed_limits(cfg.v_width)
    for vth, vleak in ((high, low), (high - 1, low), (low, high), (0, high), (high, high)):
        q, k, v, _, _ = bench.random_job(cfg.max_tokens, 3, cfg.max_head_dim)
        bench.job(q, k, v, vth, vleak)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_job(dut):
    """Reset with a job in the arrays: no stale output, the next job is exact."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.2)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    bench.job(*bench.random_job(cfg.max_tokens, 3, cfg.max_head_dim))
    await ClockCycles(dut.clk, 2 * cfg.max_tokens + cfg.max_head_dim + 4)
    await bench.reset_mid_job("out")
    bench.expected.clear()
    bench.job(*bench.random_job(1, 2, 1))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Zero or too large sizes are dropped with a sticky error; the cores keep working."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    good = {"tokens": 1, "timesteps": 1, "head_dim": 1, "vth": 0, "vleak": 0}
    bad = [{"tokens": 0}, {"timesteps": 0}, {"head_dim": 0}]
    for field, limit in (("tokens", cfg.max_tokens), ("head_dim", cfg.max_head_dim)):
        if (limit + 1).bit_length() == limit.bit_length():
            bad.append({field: limit + 1})
    await bench.reject_commands(good, bad)
    bench.job(*bench.random_job(1, 2, 1))
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, (
        "error not sticky or job wrong")


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Waiting streams and a ready output: every qk beat, V beat and output on the edge the
    golden cycle model gives (one timestep per max(d, N, max_head_dim) cycles). ``busy`` is
    high from the edge after the command's to the one the last timestep's A.V column
    max_head_dim - 1 leaves its array, 2 before it would be taken: past the last output by
    the padding features (a second job, of head_dim = max_head_dim - 1, has one)."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    tokens, steps, dim = cfg.max_tokens, 4, cfg.max_head_dim
    wall = time.perf_counter()
    bench.job(*bench.random_job(tokens, steps, dim))
    await bench.drain()
    bench.check()
    qk = bench.sources["qk"].sent_edges
    start = qk[0]
    model = golden.attention_cycles(tokens, steps, dim, cfg.max_tokens, cfg.max_head_dim)
    last_qk = [qk[(t + 1) * dim - 1] - start for t in range(steps)]
    assert last_qk == model["last_qk"], f"timesteps end at {last_qk}, expected {model['last_qk']}"
    v = [edge - start for edge in bench.sources["v"].sent_edges]
    assert v == model["v_beats"], f"V beats at {v}, expected {model['v_beats']}"
    outs = [edge - start for edge, _ in bench.out.received]
    assert outs == model["outputs"], f"outputs at {outs}, expected {model['outputs']}"
    cycles = outs[-1] + 1
    spikes = sum(bin(int(b.spikes)).count("1") for _, b in bench.out.received)
    write_throughput({"cycles": cycles,
                      "cycles_per_timestep": model["last_qk"][1] - model["last_qk"][0],
                      "synaptic_ops_per_cycle": round(bench.synaptic_ops / cycles, 2),
                      "peak_ops_per_cycle": cfg.heads * cfg.max_tokens
                      * (cfg.max_tokens + cfg.max_head_dim),
                      "output_spike_rate": round(spikes / (steps * tokens * dim * cfg.heads), 3)},
                     "cycles, adds (AND-popcount and A.V) per cycle",
                     (start + cycles) / (time.perf_counter() - wall),
                     operations=bench.synaptic_ops)

    def check_busy(head_dim):
        command, last_out = bench.sources["cmd"].sent_edges[-1], bench.out.received[-1][0]
        assert_high_from_to(samples, "busy", command + 1,
                            last_out - 2 + cfg.max_head_dim - head_dim, f"(head_dim {head_dim})")
    await ClockCycles(dut.clk, 2)
    check_busy(dim)
    bench.job(*bench.random_job(max(1, tokens - 1), 2, max(1, dim - 1)))
    await bench.drain()
    await ClockCycles(dut.clk, cfg.max_head_dim + 8)    # the padding features, then idle
    bench.check()
    check_busy(max(1, dim - 1))
    sampler.cancel()
