"""cocotb tests of ``logfmt_decoder`` against ``golden.logfmt.decode_code``.

Every output beat (BF16 codes, ``last``) is compared in order with the golden decoding of the
beat that went in; with every port ready the beats go one a cycle and each leaves
``golden.logfmt.DECODER_LATENCY`` edges after it was taken.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles, FallingEdge

from golden import logfmt as golden
from tb.harness import (long_enough_to_time, restart_bench, start_bench, throughput_beats,
                        write_throughput)
from tb.logfmt_tiles import EDGE_KINDS, KINDS, random_tile
from tb.streams import STALL_PROFILES, PipeBench, beats_per_cycle, edge_now

LO_BITS, STEP_BITS = 25, 23                  # the port's fields (docs/blocks/logfmt.md)


class DecoderBench(PipeBench):
    """A source on ``inp``, a sink on ``out``, the golden beats in order."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, gap, stall)
        self.cfg = config
        self.beats = 0

    def send(self, codes, params, last):
        bits = self.cfg.bits
        self.sources["inp"].send({"codes": codes, "lo": params.lo, "step": params.step,
                                  "nan": int(params.nan), "last": int(last)})
        self.board.expect_payload({"data": [golden.decode_code(c, params, bits) for c in codes],
                                   "last": int(last)})
        self.beats += 1

    def encoded_tile(self, kinds=KINDS + EDGE_KINDS):
        """A tile of 128 elements through the golden encoder, in rows of ``lanes`` codes."""
        lanes, bits = self.cfg.lanes, self.cfg.bits
        size = -(-128 // lanes) * lanes
        tile = random_tile(self.rng, size, self.rng.choice(kinds), bits)
        codes, params = golden.encode_tile(tile, bits)
        for start in range(0, size, lanes):
            self.send(codes[start:start + lanes], params, start + lanes == size)

    def random_beat(self):
        """Any codes with any lo and step the ports can carry: the exponent far above and below
        BF16's range (saturation, subnormals, zero), a NaN flag now and then."""
        rng, bits = self.rng, self.cfg.bits
        params = golden.TileParams(
            lo=rng.randrange(-(1 << (LO_BITS - 1)), 1 << (LO_BITS - 1)),
            step=rng.choice([0, 1, rng.randrange(1 << STEP_BITS), (1 << STEP_BITS) - 1]),
            nan=rng.random() < 0.05)
        codes = [rng.randrange(1 << bits) for _ in range(self.cfg.lanes)]
        self.send(codes, params, rng.random() < 0.2)

    async def drain(self, gap=0.0, stall=0.0):
        await self.drain_within(3 * self.beats, "every beat out", gap, stall)

    def check(self, timed=False):
        self.board.check(self.sinks["out"])
        if timed:
            taken = self.sources["inp"].sent_edges
            got = [edge for edge, _ in self.sinks["out"].received]
            latency = golden.DECODER_LATENCY
            assert got == [edge + latency for edge in taken], \
                f"a beat did not leave {latency} edges after it was taken"


async def _watch_ready_rule(dut, broken):
    """The contract's ready rule, in every cycle out of reset: ``inp.ready = ~out.valid |
    out.ready`` (sampled mid-cycle, when every driver has settled). Under stalls the beats' edges
    are not asserted, so this is what checks that the decoder takes a beat whenever its output
    register is free (a mutant that waited for ``out.ready`` passed every data check)."""
    while True:
        await FallingEdge(dut.clk)
        if int(dut.rst.value):
            continue
        ready, valid, taken = (int(dut.inp__ready.value), int(dut.out__valid.value),
                               int(dut.out__ready.value))
        if ready != (not valid or taken):
            broken.append((edge_now(), ready, valid, taken))


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_beats(dut, gap, stall):
    """Encoded tiles of every kind and arbitrary beats (any lo, step and codes), under valid
    gaps and output stalls: every beat as the golden's, in order; DECODER_LATENCY edges of
    latency when the consumer is always ready; the ready rule in every cycle."""
    bench = await start_bench(DecoderBench, dut, f"random:{gap}:{stall}", gap, stall)
    broken = []
    watcher = cocotb.start_soon(_watch_ready_rule(dut, broken))
    for _ in range(12):
        bench.encoded_tile()
        for _ in range(40):
            bench.random_beat()
    await bench.drain(gap, stall)
    watcher.cancel()
    assert not broken, f"inp.ready != ~out.valid | out.ready at (edge, ready, valid, " \
                       f"out.ready) {broken[:4]}"
    bench.check(timed=stall == 0.0)
    bench.stop()


@cocotb.test()
async def test_edge_values(dut):
    """Every code at the top and bottom of the exponent range: the largest finite value and the
    saturation above it, the subnormals and their rounding to nearest even (every shift with
    every table entry), the smallest normal reached by rounding, zero codes of both signs, a
    NaN tile; consecutive values across the table index's rounding bit."""
    bench = await start_bench(DecoderBench, dut, "edges")
    bits, lanes = bench.cfg.bits, bench.cfg.lanes
    levels = (1 << (bits - 1)) - 1
    codes = list(range(1 << bits))
    steps = (0, 1, 1 << 16, 1 << 20, (1 << STEP_BITS) - 1)
    los = (127 << 16, 128 << 16, -126 << 16, -133 << 16, -134 << 16, -(1 << (LO_BITS - 1)),
           (1 << (LO_BITS - 1)) - 1, (-126 << 16) - (1 << 15), -130 << 16)
    for lo in los:
        for step in steps:
            params = golden.TileParams(lo, step, False)
            for start in range(0, len(codes), lanes):
                row = (codes[start:start + lanes] + [levels] * lanes)[:lanes]
                bench.send(row, params, start + lanes >= len(codes))
    bench.send(([0, 1 << (bits - 1)] * lanes)[:lanes],
               golden.TileParams(0, 0, False), True)
    bench.send([1] * lanes, golden.TileParams(0, 0, True), True)
    # Every subnormal shift (1..9 and past the smallest subnormal) with every entry of the
    # 2**(i/256) table: step 0, so every nonzero code decodes lo; every tie, sticky and
    # round bit of the subnormal rounding.
    for shift in range(1, 11):
        for index in range(256):
            lo = ((-126 - shift) << 16) + (index << 8)
            bench.send([1 + (index + lane) % levels for lane in range(lanes)],
                       golden.TileParams(lo, 0, False), index == 255)
    # The table index's rounding bit (bit 15 of the Q24 value) crossed by consecutive codes,
    # at table entries where the significand steps (so the crossing shows in the output): lo's
    # fraction puts the value just below the boundary and each code adds step.
    table_steps = [i for i in range(255) if golden.EXP_TABLE[i] != golden.EXP_TABLE[i + 1]]
    for n, step in enumerate((1, 2, 3, 255, 4097, (1 << 15) - 1)):
        for exponent in (-130, 0, 100):
            entry = table_steps[(7 * n + exponent) % len(table_steps)]
            below = (entry << 16) + (1 << 15) - step * (levels // 2)
            lo = (exponent << 16) + (below >> 8)
            params = golden.TileParams(lo, step, False)
            for start in range(0, len(codes), lanes):
                row = (codes[start:start + lanes] + [levels] * lanes)[:lanes]
                bench.send(row, params, start + lanes >= len(codes))
    await bench.drain()
    bench.check(timed=True)
    bench.stop()


@cocotb.test()
async def test_reset_mid_stream(dut):
    """Reset with beats in flight and the output stalled: afterwards only new beats come out."""
    bench = await start_bench(DecoderBench, dut, "reset", 0.2, 0.5)
    for _ in range(30):
        bench.random_beat()
    await ClockCycles(dut.clk, 12)
    bench = await restart_bench(bench, DecoderBench, dut, "after-reset", 0.2, 0.5)
    for _ in range(3):
        bench.encoded_tile()
    await bench.drain(0.2, 0.5)
    bench.check()
    bench.stop()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Elements per cycle at saturation over throughput_beats() beats: ``lanes``."""
    bench = await start_bench(DecoderBench, dut, "throughput")
    began, first_edge = time.perf_counter(), edge_now()
    while bench.beats < throughput_beats():
        bench.encoded_tile(("gaussian",))
    await bench.drain()
    bench.check(timed=True)
    rate = beats_per_cycle(bench.sources["inp"].sent_edges)
    assert rate == 1.0
    latency = bench.sinks["out"].received[0][0] - bench.sources["inp"].sent_edges[0]
    write_throughput({"elements_per_cycle": rate * bench.cfg.lanes,
                      "latency_cycles": latency},
                     "LogFMT codes decoded to BF16 per cycle, every port ready",
                     (edge_now() - first_edge) / (time.perf_counter() - began),
                     operations=bench.beats * bench.cfg.lanes)
    bench.stop()
