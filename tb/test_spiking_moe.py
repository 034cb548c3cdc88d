"""cocotb tests of ``spiking_moe`` against ``golden.spiking_moe`` (seed 004 Alg. 1).

Every route (token, expert mask, scores, last) and every merged output beat (spikes, token,
timestep, tile, last) is compared, in order, with the golden layer on the same spikes, routing
weights, expert weights, K, Vth and Vleak.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import spiking_moe as golden
from golden.spiking_router import router_output_order
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import (STALL_PROFILES, JobBench, assert_high_from_to, pause_fraction,
                        sample_each_edge, start_after_reset, wait_for)



class MoeBench(JobBench):
    """Sources on ``cmd``, ``act``, ``wr``, ``w``; sinks on ``route`` and ``out``."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("cmd", "act", "wr", "w"), ("route", "out"),
                         gap, stall)
        self.cfg = config
        self.expected_routes, self.expected = [], []
        self.masks = []
        self.synaptic_ops = 0
        self.model_cycles = 0           # the golden cycle model's edges of every job queued
        self.slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))

    def random_layer(self, d_in, d_out, tokens, steps, density=0.4, favourite=None):
        """Random spikes and weights. ``favourite`` makes that expert every token's first
        choice: its routing weights are f, the largest at which a routing score (at most
        d_in x steps spikes) cannot wrap in acc_width bits, the other experts' are in
        -f..f-1, and every token has a spike."""
        cfg, rng = self.cfg, self.rng
        w_max = fixed.signed_limits(cfg.w_width)[1]
        spikes = [[[int(rng.random() < density) for _ in range(d_in)] for _ in range(steps)]
                  for _ in range(tokens)]
        others, f = (-w_max - 1, w_max), None
        if favourite is not None:
            f = min(w_max, fixed.signed_limits(cfg.acc_width)[1] // (d_in * steps))
            assert f >= 1, f"{d_in} x {steps} spikes wrap a routing score at any weight"
            others = (-f, f - 1)
            for token in spikes:
                token[0][0] = 1
        routing = [[[f if e == favourite else rng.randint(*others)
                     for e in range(cfg.experts)] for _ in range(d_in)] for _ in range(steps)]
        experts = [[[rng.randint(-w_max - 1, w_max) for _ in range(d_in)] for _ in range(d_out)]
                   for _ in range(cfg.experts)]
        v_max = fixed.signed_limits(cfg.v_width)[1]
        vth = min(v_max, rng.randint(0, w_max * max(1, d_in // 4)))
        return spikes, routing, experts, vth, min(v_max, rng.randint(0, 2))

    def threshold_and_leak(self, d_in, steps):
        """A random Vth in -I..T*I and Vleak in -I..I, I = the largest input of one timestep
        (d_in products of the largest weight): a potential crosses Vth for some neurons, and
        the fields' bits up to T*I's are used (``random_layer`` draws Vth in
        0..w_max*max(1, d_in // 4) and Vleak in 0..2)."""
        largest = fixed.signed_limits(self.cfg.w_width)[1] * d_in
        low, high = fixed.signed_limits(self.cfg.v_width)
        clip = lambda value: max(low, min(high, value))  # noqa: E731
        return (clip(self.rng.randint(-largest, steps * largest)),
                clip(self.rng.randint(-largest, largest)))

    def job(self, spikes, routing, experts, vth, vleak, k):
        cfg = self.cfg
        d_in, d_out = len(spikes[0][0]), len(experts[0])
        self.sources["cmd"].send({"d_in": d_in, "d_out": d_out, "tokens": len(spikes),
                                  "timesteps": len(spikes[0]), "k": k, "vth": vth,
                                  "vleak": vleak})
        w_max = fixed.signed_limits(cfg.w_width)[1]
        act, wr, w = golden.moe_input_beats(spikes, routing, experts, cfg.rows,
                                            cfg.max_timesteps,
                                            pad=lambda: self.rng.randint(-w_max - 1, w_max))
        for word in act:
            self.sources["act"].send({"s": word})
        for lanes in wr:
            self.sources["wr"].send({"w": lanes})
        for lanes in w:
            self.sources["w"].send({"w": lanes})
        masks, outputs = golden.moe_reference(spikes, routing, experts, k, vth, vleak,
                                              cfg.acc_width, cfg.v_width)
        self.masks += masks
        self.expected_routes += router_output_order(spikes, routing, k, cfg.acc_width)
        self.expected += golden.moe_output_order(outputs, d_out, cfg.rows)
        self.synaptic_ops += sum(d_out * bin(mask).count("1") * sum(map(sum, token))
                                 for mask, token in zip(masks, spikes))
        counts = [sum(mask >> e & 1 for mask in masks) for e in range(cfg.experts)]
        self.model_cycles += golden.moe_cycles(d_in, d_out, len(spikes), len(spikes[0]), counts,
                                               cfg.rows, cfg.cols)["outputs"][-1]
        return masks

    async def drain(self):
        # The jobs' modelled edges, stretched by the pauses (a max_d_in = 512 layer's routing
        # beats alone outlast a budget counted in output beats), plus a margin per beat.
        await self.settle("out", len(self.expected), int(self.model_cycles * self.slowdown)
                          + 80 * len(self.expected) + 6000)

    def routes(self):
        return [(int(b.token), int(b.experts), [int(x) for x in b.scores], int(b.last))
                for _, b in self.sinks["route"].received]

    def results(self):
        return [(int(b.spikes), int(b.token), int(b.timestep), int(b.tile), int(b.last))
                for _, b in self.sinks["out"].received]

    def comparisons(self):
        return [("route", ("token", "experts", "scores", "last"), self.expected_routes),
                ("out", ("spikes", "token", "timestep", "tile", "last"), self.expected)]


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return MoeBench(dut, config, component, make_rng(salt), **kwargs)


def _shapes(cfg):
    """(d_in, d_out, tokens, timesteps): small, full, and odd sizes within the buffers."""
    N, T, D, O = cfg.max_tokens, cfg.max_timesteps, cfg.max_d_in, cfg.max_d_out
    return [(min(D, 3), min(O, cfg.rows + 1), min(N, 3), min(T, 2)),
            (D, O, N, T),
            (1, 1, 1, 1),
            (max(1, D // 2 + 1), max(1, O - 1), max(1, N - 1), max(1, T - 1))]


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_layers(dut, gap, stall):
    """Back-to-back layers of several shapes (full buffers included) with K = 1, 2, E."""
    bench = _setup(dut, f"layers{gap}{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    E = bench.cfg.experts
    for index, shape in enumerate(_shapes(bench.cfg)):
        bench.job(*bench.random_layer(*shape), k=(1, min(2, E), E, 1)[index])
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_every_pair_and_threshold(dut):
    """With random gaps on the inputs and stalls on the outputs: every token to every expert
    (K = E) at full size, once per timestep count, so every core's columns take each (token,
    timestep) pair of a full token list over every row tile; each expert, for each first
    token past 0, that token and a random subset of the later ones (a list starting later,
    with gaps, reloaded at every row tile); random shapes and routes (K = 1..E); Vth and
    Vleak spread over the values a potential reaches, then at the ends of their range (every
    bit of both fields: V saturates at the largest value, which is not above it)."""
    bench = _setup(dut, "pairs", gap=0.3, stall=0.5)
    await start_after_reset(dut, bench)
    cfg, rng = bench.cfg, bench.rng
    E, N, T, D, O = cfg.experts, cfg.max_tokens, cfg.max_timesteps, cfg.max_d_in, cfg.max_d_out
    low, high = fixed.signed_limits(cfg.v_width)
    for steps in range(1, T + 1):
        spikes, routing, experts, _, _ = bench.random_layer(D, O, N, steps, density=0.5)
        bench.job(spikes, routing, experts, *bench.threshold_and_leak(D, steps), k=E)
    if E > 1 and D > 1 and N > 1:
        # Each expert in turn takes, for each first token 1..N-1, that token and a random
        # subset of the later ones (K = 1): its token list starts past 0 and has gaps, and
        # its columns reload that list at every row tile (D_out = 2R). A chosen token has
        # spike (0, 0) and scores f for the expert; any other has spike (0, 1) and scores f
        # for the next one; the other routing weights are 0 (one score f, the rest 0, at
        # every w_width: f // 2 would be 0 at w_width 2). f fits a score and an integration
        # (acc_width 4 holds 7, w_width 8 gives 127). Neuron r passes input r mod D_in
        # through (weight f from it, 0 from the others; Vth = Vleak = 0: it fires exactly
        # when that spike is 1), so a spike taken from the wrong (token, timestep) shows.
        f = min(fixed.signed_limits(cfg.w_width)[1], fixed.signed_limits(cfg.acc_width)[1])
        d_in, d_out = min(D, 3), min(O, 2 * cfg.rows)
        passing = [[[f if d == r % d_in else 0 for d in range(d_in)] for r in range(d_out)]
                   for _ in range(E)]
        for e in range(E):
            for first in range(1, N):
                chosen = {first} | {n for n in range(first + 1, N) if rng.random() < 0.5}
                steps = rng.randint(1, T)
                spikes = bench.random_layer(d_in, d_out, N, steps, density=0.5)[0]
                for n, token in enumerate(spikes):
                    token[0][0], token[0][1] = int(n in chosen), int(n not in chosen)
                routing = [[[0] * E for _ in range(d_in)] for _ in range(steps)]
                routing[0][0][e], routing[0][1][(e + 1) % E] = f, f
                masks = bench.job(spikes, routing, passing, 0, 0, k=1)
                assert {n for n, mask in enumerate(masks) if mask == 1 << e} == chosen
    for _ in range(6):
        shape = (rng.randint(1, D), rng.randint(1, O), rng.randint(1, N), rng.randint(1, T))
        spikes, routing, experts, _, _ = bench.random_layer(*shape)
        bench.job(spikes, routing, experts, *bench.threshold_and_leak(shape[0], shape[3]),
                  k=rng.randint(1, E))
    for vth, vleak in ((high, low), (low, high), (high - 1, 0)):
        spikes, routing, experts, _, _ = bench.random_layer(min(D, 3), O, N, T)
        bench.job(spikes, routing, experts, vth, vleak, k=E)
    # The thresholds split the neurons: some fire and some do not.
    bits = "".join(f"{beat[0]:b}" for beat in bench.expected)
    assert "1" in bits and bits.count("1") < cfg.rows * len(bench.expected), "all or nothing"
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_skewed_routing_and_merge(dut):
    """Every token to one expert (K = 1: the other cores stay idle and the busy core tiles
    all the pairs), then K = 2 with the same favourite: the OR of two experts' spikes."""
    bench = _setup(dut, "skewed")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    d_in = min(cfg.max_d_in, 4)
    # Timesteps within what a routing score of d_in x T spikes holds unwrapped at weight 1.
    steps = max(1, min(cfg.max_timesteps, fixed.signed_limits(cfg.acc_width)[1] // d_in))
    shape = (d_in, cfg.max_d_out, cfg.max_tokens, steps)
    favourite = cfg.experts - 1
    layer = bench.random_layer(*shape, density=0.6, favourite=favourite)
    masks = bench.job(*layer, k=1)
    assert set(masks) == {1 << favourite}, f"routing weights did not favour: {masks}"
    if cfg.experts > 1:
        bench.job(*layer, k=2)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_every_synapse_at_the_threshold(dut):
    """Every neuron of every expert held at its firing threshold, so that a synaptic sum off
    by any amount in any PE (row, column) shows as a flipped spike. The random-threshold tests
    cannot see that: a sum off by 2 rarely moves a potential across Vth. Every spike is 1,
    Vth = 0 and Vleak = v, a random value that a weight, Vleak and an integration hold. In
    expert e, each neuron's D_in weights are random with a sum of v or v + 1. A neuron that
    sums v + 1 fires at every timestep (V = 1, reset to 0); it shows any decrease. One that
    sums v stays at V = 0; it shows any increase. Each v runs twice with the two kinds
    swapped, so every neuron shows both. D_in is 1 (one weight per neuron: no two errors
    cancel in a sum) and the largest. All tokens go to expert e (K = 1: one routing weight of
    1, the rest 0), so that core's columns take every (token, timestep) pair over every row
    tile, and no other expert's spike ORs over its own. With random gaps on the inputs and
    stalls on the outputs."""
    bench = _setup(dut, "threshold", gap=0.3, stall=0.5)
    await start_after_reset(dut, bench)
    cfg, rng = bench.cfg, bench.rng
    E, N, T, D, O = cfg.experts, cfg.max_tokens, cfg.max_timesteps, cfg.max_d_in, cfg.max_d_out
    low, high = fixed.signed_limits(cfg.w_width)
    # v (Vleak) and v + 1 are weights, fit Vleak's field and an integration (no wrap).
    limits = [(low, high)] + [fixed.signed_limits(width) for width in (cfg.v_width, cfg.acc_width)]
    v_low, v_high = max(lo for lo, _ in limits), min(hi for _, hi in limits) - 1

    def summing_to(target, d_in):
        while True:                     # the other weights random, input 0's makes the sum
            others = [rng.randint(low, high) for _ in range(d_in - 1)]
            first = target - sum(others)
            if low <= first <= high:
                return [first, *others]

    for e in range(E):
        for d_in in sorted({1, D}):
            spikes = [[[1] * d_in for _ in range(T)] for _ in range(N)]
            routing = [[[int(t == 0 and d == 0 and x == e) for x in range(E)]
                        for d in range(d_in)] for t in range(T)]
            for _ in range(3):
                v = rng.randint(v_low, v_high)
                kinds = [rng.randint(0, 1) for _ in range(O)]
                for swap in (0, 1):
                    experts = [[summing_to(v + (kind ^ swap), d_in) if x == e else
                                [rng.randint(low, high) for _ in range(d_in)] for kind in kinds]
                               for x in range(E)]
                    masks = bench.job(spikes, routing, experts, 0, v, k=1)
                    assert set(masks) == {1 << e}, f"tokens not all routed to {e}: {masks}"
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_layers_while_cores_drain(dut):
    """Back-to-back smallest layers (one token, one timestep, D_in 1) after a layer with every
    token: a core drains its padding columns (up to C of them) after its last row, and with C
    large the next layer's commands reach the cores before they are ready; each core takes its
    command when it is (K = E, 1 and 2, so cores with and without tokens mix)."""
    bench = _setup(dut, "drain")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    E = cfg.experts
    bench.job(*bench.random_layer(1, cfg.max_d_out, cfg.max_tokens, 1), k=E)
    for k in (E, 1, min(2, E), E):
        bench.job(*bench.random_layer(1, 1, 1, 1), k=k)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_integrations_wrap(dut):
    """Every spike 1 and every weight at the largest, then at the most negative value, over the
    full D_in and timesteps: the expert integrations and routing scores reach the largest
    magnitude the configuration allows, and wrap in two's complement where that passes
    2^(acc_width-1) (the 1-PE test configuration: 4-bit integrations); outputs and routes
    follow the golden model's wrapped sums."""
    bench = _setup(dut, "wrap")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    D, T, N, E = cfg.max_d_in, cfg.max_timesteps, min(cfg.max_tokens, 2), cfg.experts
    spikes = [[[1] * D for _ in range(T)] for _ in range(N)]
    half = 1 << (cfg.acc_width - 1)
    for weight in fixed.signed_limits(cfg.w_width)[::-1]:
        routing = [[[weight if e == 0 else 0 for e in range(E)] for _ in range(D)]
                   for _ in range(T)]
        experts = [[[weight] * D for _ in range(cfg.max_d_out)] for _ in range(E)]
        bench.job(spikes, routing, experts, 0, 0, k=1)
        if abs(weight) * D >= half:                      # this configuration can wrap
            wrapped = golden.moe_reference(spikes, routing, experts, 1, 0, 0, cfg.acc_width,
                                           cfg.v_width)
            exact = golden.moe_reference(spikes, routing, experts, 1, 0, 0, 64, cfg.v_width)
            assert wrapped != exact                      # the wrap decides routes or spikes
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_job(dut):
    """Reset while the experts compute: no stale route or output, the next layer is exact."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.2)
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    bench.job(*bench.random_layer(cfg.max_d_in, cfg.max_d_out, cfg.max_tokens,
                                  cfg.max_timesteps), k=1)
    await wait_for(dut, lambda: len(bench.sinks["route"].received) == cfg.max_tokens,
                   200 * cfg.max_d_in * cfg.max_timesteps + 2000, "routes out")
    await ClockCycles(dut.clk, 3)
    await bench.reset_mid_job("out")
    bench.expected_routes.clear()
    bench.expected.clear()
    bench.job(*bench.random_layer(min(2, cfg.max_d_in), min(3, cfg.max_d_out),
                                  min(2, cfg.max_tokens), 1), k=1)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_bad_commands_set_sticky_error(dut):
    """Zero or too large sizes and K outside 1..E are dropped with a sticky error."""
    bench = _setup(dut, "bad")
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    good = {"d_in": 1, "d_out": 1, "tokens": 1, "timesteps": 1, "k": 1, "vth": 0, "vleak": 0}
    bad = [{"d_in": 0}, {"d_out": 0}, {"tokens": 0}, {"timesteps": 0}, {"k": 0}]
    for field, limit in (("d_in", cfg.max_d_in), ("d_out", cfg.max_d_out),
                         ("tokens", cfg.max_tokens), ("timesteps", cfg.max_timesteps),
                         ("k", cfg.experts)):
        if (limit + 1).bit_length() == limit.bit_length():       # representable
            bad.append({field: limit + 1})
    await bench.reject_commands(good, bad)
    bench.job(*bench.random_layer(min(2, cfg.max_d_in), min(2, cfg.max_d_out), 1,
                                  min(2, cfg.max_timesteps)), k=1)
    await bench.drain()
    assert bench.results() == bench.expected and dut.error.value == 1, (
        "error not sticky or job wrong")


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Waiting streams and ready outputs on a full-size layer: the cycle of every phase
    against the golden cycle model (activation load, routing, the cores in parallel, the
    merged read-out at one beat per cycle); synaptic operations per cycle. ``busy`` is high
    from the edge after the command's to the one the last output beat is taken at."""
    bench = _setup(dut, "throughput")
    await start_after_reset(dut, bench)
    samples, sampler = sample_each_edge(dut, "busy")
    cfg = bench.cfg
    layer = bench.random_layer(cfg.max_d_in, cfg.max_d_out, cfg.max_tokens, cfg.max_timesteps)
    wall = time.perf_counter()
    masks = bench.job(*layer, k=1)
    await bench.drain()
    bench.check()
    start = bench.sources["cmd"].sent_edges[0]
    model = golden.moe_cycles(cfg.max_d_in, cfg.max_d_out, cfg.max_tokens, cfg.max_timesteps,
                              golden.routing_histogram(masks, cfg.experts), cfg.rows, cfg.cols)
    relative = lambda edges: [edge - start for edge in edges]  # noqa: E731
    act = relative(bench.sources["act"].sent_edges)
    assert act == list(range(1, model["act_last"] + 1)), f"act beats at {act}"
    wr = relative(bench.sources["wr"].sent_edges)
    first, last = model["route_beats"]
    assert wr == list(range(first, last + 1)), f"routing beats at {wr}, expected {first}..{last}"
    routes = relative(edge for edge, _ in bench.sinks["route"].received)
    assert routes == model["routes"], f"routes at {routes}, expected {model['routes']}"
    weights = relative(bench.sources["w"].sent_edges)
    assert weights[-1] == model["weights_last"], f"weights end at {weights[-1]}"
    outs = relative(edge for edge, _ in bench.sinks["out"].received)
    assert outs == model["outputs"], f"outputs at {outs}, expected {model['outputs']}"
    await ClockCycles(dut.clk, 3)
    sampler.cancel()
    assert not any(high for edge, high in samples["busy"].items() if edge <= start)
    assert_high_from_to(samples, "busy", start + 1, start + outs[-1])
    cycles = outs[-1]
    spikes_out = sum(bin(int(b.spikes)).count("1") for _, b in bench.sinks["out"].received)
    d_out = cfg.max_d_out
    write_throughput({"cycles": cycles,
                      "synaptic_ops_per_cycle": round(bench.synaptic_ops / cycles, 2),
                      "peak_ops_per_cycle": cfg.experts * cfg.rows * cfg.cols,
                      "input_spike_rate": round(sum(map(sum, (step for token in layer[0]
                                                              for step in token)))
                                                / (len(masks) * cfg.max_timesteps
                                                   * cfg.max_d_in), 3),
                      "output_spike_rate": round(spikes_out / (len(masks) * cfg.max_timesteps
                                                               * d_out), 3)},
                     "cycles of a full-size layer (K = 1), synaptic operations per cycle",
                     (start + cycles) / (time.perf_counter() - wall),
                     routing_histogram=golden.routing_histogram(masks, cfg.experts),
                     operations=bench.synaptic_ops)
