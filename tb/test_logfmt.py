"""cocotb tests of ``logfmt_encoder`` against ``golden.logfmt``.

Every output row (codes, the tile's lo, step, NaN flag, ``last``) is compared in order with
``golden.logfmt.encode_tile``; with the consumer always ready every row leaves at the edge
``golden.logfmt.encoder_edges`` gives, and with every port ready the rows enter and leave one a
cycle.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import logfmt as golden
from tb.harness import (long_enough_to_time, restart_bench, start_bench, throughput_beats,
                        write_throughput)
from tb.logfmt_tiles import (EDGE_KINDS, KINDS, divider_edge_tile, random_tile,
                              rounding_edge_tile, rounding_edges)
from tb.streams import STALL_PROFILES, PipeBench, beats_per_cycle, edge_now


class EncoderBench(PipeBench):
    """A source on ``inp``, a sink on ``out``, the golden rows in order."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, gap, stall)
        self.cfg = config
        self.rows = 0

    def send_tile(self, codes):
        cfg = self.cfg
        encoded, params = golden.encode_tile(codes, cfg.bits)
        for start in range(0, cfg.tile, cfg.lanes):
            self.sources["inp"].send({"data": codes[start:start + cfg.lanes]})
            self.board.expect_payload({
                "codes": encoded[start:start + cfg.lanes], "lo": params.lo, "step": params.step,
                "nan": int(params.nan), "last": int(start + cfg.lanes == cfg.tile)})
            self.rows += 1

    def random_tile(self, kinds=KINDS):
        self.send_tile(random_tile(self.rng, self.cfg.tile, self.rng.choice(kinds), self.cfg.bits))

    async def drain(self, gap=0.0, stall=0.0):
        await self.drain_within(3 * self.rows + 4 * self.cfg.beats + 60, "every row out", gap,
                                stall)

    def check(self, timed=False):
        self.board.check(self.sinks["out"])
        if timed:
            taken = self.sources["inp"].sent_edges
            want = golden.encoder_edges(taken, self.cfg.tile, self.cfg.lanes)
            got = [edge for edge, _ in self.sinks["out"].received]
            assert got == want, f"row edges {got[:12]}..., golden {want[:12]}..."


def _tiles(cfg, budget=800):
    """Tiles per test: at least 12, else about ``budget`` rows."""
    return max(12, budget // cfg.beats)


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_tiles(dut, gap, stall):
    """Gaussian (three scales), heavy-tailed, arbitrary codes (NaN, infinity, subnormals) and
    tiles with zeros, under valid gaps and output stalls: every row as the golden's, in order;
    with the consumer always ready, at the golden edges (line rate without gaps)."""
    bench = await start_bench(EncoderBench, dut, f"random:{gap}:{stall}", gap, stall)
    for _ in range(_tiles(bench.cfg)):
        bench.random_tile()
    await bench.drain(gap, stall)
    bench.check(timed=stall == 0.0)
    if gap == 0.0 and stall == 0.0:
        taken = bench.sources["inp"].sent_edges
        assert taken == list(range(taken[0], taken[0] + len(taken))), "the input waited"
        out = [edge for edge, _ in bench.sinks["out"].received]
        assert out[-1] - out[0] == len(out) - 1, "a bubble between output rows"
    bench.stop()


@cocotb.test()
async def test_edge_tiles(dut):
    """Zeros only, signed zeros, one value repeated, a single nonzero element (anywhere, in the
    tile's first place, in its last: the range is complete only with that row), a range beyond
    2**32 (clamped), subnormals, the largest and smallest magnitudes together, a NaN (the tile's
    flag), infinities (the largest finite value), tiles of only infinities or only NaNs (with
    zeros), two adjacent magnitudes (the smallest step) and a few (small steps that the codes
    between the ends read), each several times, back to back. Then, for each of the reciprocal
    divider's comparators, steps that bring one of its comparisons within 2**12 of equality
    from below (six: a divisor bit dropped from the comparison shows where it is 1) and from
    above (three), where it has such comparisons; and every element that lies within
    2**-12 of a position unit of a rounding edge (``rounding_edges``: an error in the position's
    lowest bits, or in the comparison with theta, shows)."""
    bench = await start_bench(EncoderBench, dut, "edges")
    cfg = bench.cfg
    for kind in EDGE_KINDS:
        for _ in range(3):
            bench.random_tile((kind,))
    comparators = golden.divider_bits_per_cycle(cfg.tile, cfg.lanes)
    for comparator in range(comparators):
        for below, tiles in ((True, 6), (False, 3)):
            for _ in range(tiles):
                tile = divider_edge_tile(bench.rng, cfg.tile, cfg.bits, comparator, comparators,
                                         below)
                if tile is not None:
                    bench.send_tile(tile)
    for edge in rounding_edges(cfg.bits):
        bench.send_tile(rounding_edge_tile(bench.rng, cfg.tile, edge))
    await bench.drain()
    bench.check(timed=True)
    bench.stop()


@cocotb.test()
async def test_reset_mid_tile(dut):
    """Reset with a tile half taken, tiles in the FIFO and the divider busy: afterwards only
    the new tiles come out, their ranges not mixed with the old ones."""
    bench = await start_bench(EncoderBench, dut, "reset", 0.2, 0.5)
    for _ in range(4):
        bench.random_tile()
    bench.sources["inp"].send({"data": [0x3F80] * bench.cfg.lanes})   # an unfinished tile
    await ClockCycles(dut.clk, 3 * bench.cfg.beats + 5)
    bench = await restart_bench(bench, EncoderBench, dut, "after-reset", 0.2, 0.5)
    for _ in range(_tiles(bench.cfg, 400)):
        bench.random_tile()
    await bench.drain(0.2, 0.5)
    bench.check()
    bench.stop()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Elements per cycle at saturation over throughput_beats() beats: ``lanes``."""
    bench = await start_bench(EncoderBench, dut, "throughput")
    began, first_edge = time.perf_counter(), edge_now()
    while bench.rows < throughput_beats():
        bench.random_tile(("gaussian",))
    await bench.drain()
    bench.check(timed=True)
    out = [edge for edge, _ in bench.sinks["out"].received]
    rows_per_cycle = beats_per_cycle(out)
    assert rows_per_cycle == 1.0
    taken = bench.sources["inp"].sent_edges
    write_throughput({"elements_per_cycle": rows_per_cycle * bench.cfg.lanes,
                      "latency_cycles": out[bench.cfg.beats - 1] - taken[bench.cfg.beats - 1],
                      "tiles": bench.rows // bench.cfg.beats},
                     "BF16 elements encoded per cycle, every port ready; latency: a tile's "
                     "last row in to its last row out",
                     (edge_now() - first_edge) / (time.perf_counter() - began),
                     operations=bench.rows * bench.cfg.lanes)
    bench.stop()
