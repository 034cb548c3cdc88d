"""cocotb tests of ``lif`` against ``golden.spiking``.

Every output beat (spikes, potentials, last) is compared, in order, with a replay of the input
beats through :func:`golden.spiking.lif_run`, each beat using the Vth/Vleak written at an edge
before its own (the edges come from the stream drivers, so run-time writes are checked exactly).
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import spiking as golden
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import STALL_PROFILES, StreamBench, reset_dut, start_after_reset, wait_for



class LifBench(StreamBench):
    """Sources on ``x`` and ``params``, a sink on ``s``; the golden replay."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("x", "params"), ("s",), gap, stall,
                         always_ready=("params",))
        self.cfg = config
        self.x, self.params, self.s = self.sources["x"], self.sources["params"], self.sinks["s"]
        self.inputs = []             # (x list, last)
        self.writes = []             # (vth, vleak) in send order

    def write(self, vth, vleak):
        self.params.send({"vth": vth, "vleak": vleak})
        self.writes.append((vth, vleak))

    def step(self, inputs, last=0):
        self.x.send({"x": list(inputs), "last": last})
        self.inputs.append((list(inputs), last))

    def random_inputs(self, spread=None):
        high = fixed.signed_limits(self.cfg.x_width)[1]
        spread = min(spread or high, high)
        return [self.rng.randint(-spread - 1, spread) for _ in range(self.cfg.neurons)]

    async def drain(self):
        await wait_for(self.dut, lambda: len(self.s.received) == len(self.inputs),
                       40 * len(self.inputs) + 100, "every step out")
        await ClockCycles(self.dut.clk, 3)

    def expected(self):
        """Golden replay: beat k uses the last write taken at an edge before beat k's edge."""
        write_edges = self.params.sent_edges
        steps, current, w = [], (0, 0), 0
        for (inputs, last), edge in zip(self.inputs, self.x.sent_edges):
            while w < len(write_edges) and write_edges[w] < edge:
                current, w = self.writes[w], w + 1
            steps.append((inputs, last, *current))
        return golden.lif_run(steps, self.cfg.v_width, self.cfg.neurons)

    def check(self):
        self.check_output("s", [{"spikes": sum(bit << i for i, bit in enumerate(spikes)),
                                 "v": v, "last": last} for spikes, v, last in self.expected()])


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return LifBench(dut, config, component, make_rng(salt), **kwargs)


async def _written(bench):
    await wait_for(bench.dut, lambda: bench.params.idle, 50, "parameters written")


@cocotb.test()
async def test_threshold_is_strict_and_reset_is_to_zero(dut):
    """V == Vth does not fire; V == Vth + 1 fires and V becomes 0 in the same step; a step
    after a spike starts from 0."""
    bench = _setup(dut, "strict")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    # The largest threshold with Vth + 1 representable in V and Vth an input value.
    vth = min(100, (1 << (cfg.v_width - 1)) - 2, fixed.signed_limits(cfg.x_width)[1])
    bench.write(vth, 0)
    await _written(bench)
    n = cfg.neurons
    bench.step([vth] * n)                 # V = Vth: no spike, V kept
    bench.step([1] * n)                   # V = Vth + 1: spike, V = 0
    bench.step([vth - 1] * n)             # from 0: below threshold
    bench.step([-1] * n, last=1)          # end of sample: V back to 0 afterwards
    bench.step([vth] * n)                 # from 0 again: V = Vth exactly
    await bench.drain()
    bench.check()
    spikes = [[int(b.spikes) >> i & 1 for i in range(n)] for _, b in bench.s.received]
    assert spikes[0] == [0] * n and spikes[1] == [1] * n, "strict threshold / firing"
    assert [int(v) for v in bench.s.received[4][1].v] == [vth] * n, "V not cleared by last"


@cocotb.test()
async def test_saturation_and_negative_leak(dut):
    """V saturates at the top and the bottom of its width; a leak larger than the input drives
    V negative; a negative leak charges; a negative threshold fires at V = 0 + 1."""
    bench = _setup(dut, "saturate")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    x_max = fixed.signed_limits(cfg.x_width)[1]
    v_max = fixed.signed_limits(cfg.v_width)[1]
    n = cfg.neurons
    bench.write(v_max, 0)                 # nothing can exceed v_max: no spike
    await _written(bench)
    for _ in range(4):
        bench.step([x_max] * n)           # climbs to and sticks at v_max
    bench.step([-x_max - 1] * n, last=1)
    await bench.drain()
    bench.write(v_max, min(7, v_max))     # leak 7: V goes negative and sticks at the bottom
    await _written(bench)
    for _ in range(3):
        bench.step([-x_max - 1] * n)
    bench.step([min(2, x_max)] * n, last=1)
    await bench.drain()
    v_min = -v_max - 1
    bench.write(max(-3, v_min), max(-2, v_min))   # negative leak charges, negative threshold
    await _written(bench)
    for _ in range(3):
        bench.step([max(-4, -x_max - 1)] * n)
    await bench.drain()
    bench.check()
    tops = [[int(v) for v in beat.v] for _, beat in bench.s.received[:4]]
    assert tops[-1] == [min(v_max, 4 * x_max)] * n, "no saturation at the top"


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_with_stalls(dut, gap, stall):
    """Random inputs and samples of random length, parameters rewritten mid-stream, random
    valid gaps on both inputs and ready stalls on the output."""
    bench = _setup(dut, f"random{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    v_max = fixed.signed_limits(cfg.v_width)[1]
    spread = max(1, min(fixed.signed_limits(cfg.x_width)[1], v_max // 3))
    for write in range(4):
        leak = bench.rng.randint(-2, max(2, spread // 8))
        bench.write(bench.rng.randint(0, v_max), max(-v_max - 1, min(leak, v_max)))
        for _ in range(bench.rng.randint(5, 15)):
            bench.step(bench.random_inputs(spread), last=int(bench.rng.random() < 0.2))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_stream(dut):
    """Reset with steps in flight: no stale output, potentials start from 0 again."""
    bench = _setup(dut, "reset", stall=0.3)
    await start_after_reset(dut, bench)
    v_max = fixed.signed_limits(bench.cfg.v_width)[1]
    bench.write(min(50, v_max), 1)
    for _ in range(20):
        bench.step(bench.random_inputs(40))
    await ClockCycles(dut.clk, 8)
    bench.stop()
    await reset_dut(dut)
    assert not dut.s__valid.value, "output valid after reset"
    bench.s.received.clear()
    bench.inputs.clear()
    bench.writes.clear()
    bench.x.sent_edges.clear()
    bench.params.sent_edges.clear()
    bench.start()
    bench.write(min(30, v_max), 1)   # reset also cleared Vth/Vleak; this write sets them again
    await _written(bench)
    for _ in range(10):
        bench.step(bench.random_inputs(20))
    await bench.drain()
    bench.check()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """One timestep per cycle with a ready output, each output LATENCY edges after its input
    (cycle-exact); spike rate of a random drive, written for make bench / make demo."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    # A positive drive: inputs uniform in 0..spread against Vth = 2 * spread.
    spread = max(1, min(fixed.signed_limits(cfg.x_width)[1], (1 << (cfg.v_width - 1)) // 8))
    bench.write(min(2 * spread, fixed.signed_limits(cfg.v_width)[1]), 1)
    await _written(bench)
    steps, wall = 64, time.perf_counter()
    for index in range(steps):
        bench.step([bench.rng.randint(0, spread) for _ in range(cfg.neurons)],
                   last=int(index % 8 == 7))
    await bench.drain()
    bench.check()
    x_edges = bench.x.sent_edges
    out_edges = [edge for edge, _ in bench.s.received]
    assert x_edges == list(range(x_edges[0], x_edges[0] + steps)), "input bubbles"
    assert all(o - i == golden.LATENCY for i, o in zip(x_edges, out_edges)), "latency"
    cycles = out_edges[-1] - x_edges[0] + 1 - golden.LATENCY
    spikes = sum(bin(int(beat.spikes)).count("1") for _, beat in bench.s.received)
    write_throughput({"steps_per_cycle": round(steps / cycles, 3),
                      "latency_cycles": golden.LATENCY,
                      "spike_rate": round(spikes / (steps * cfg.neurons), 3)},
                     "timesteps per cycle", out_edges[-1] / (time.perf_counter() - wall),
                     operations=steps * cfg.neurons)
