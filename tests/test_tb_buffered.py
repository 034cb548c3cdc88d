"""The buffered harness's hardware (tb/buffered.py) on Amaranth's simulator, around two tiny
blocks: a one-stage pipe that keeps the stream rules and one that breaks them. The cocotb side
is exercised by the systolic suite (test_buffered_*), on both simulators."""

import pytest
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from tb.buffered import BufferedHarness

WINDOW = 4
WIDTH = 8


class _Pipe(wiring.Component):
    """One register stage; ``drop_valid`` lets valid fall before the transfer (a rule broken)."""

    def __init__(self, drop_valid=False):
        self.drop_valid = drop_valid
        super().__init__({"i": In(stream.Signature(WIDTH)), "o": Out(stream.Signature(WIDTH)),
                          "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(self.i.payload)]
        with m.Elif(self.o.ready | self.drop_valid):
            m.d.sync += self.o.valid.eq(0)
        return m


def _run(dut, beats, expected, gaps=(), stalls=(), windows=8):
    """Load ``beats`` on i and ``expected`` on o, toggle ``windows`` windows (``gaps`` /
    ``stalls``: per-window masks); return the status and the fire masks of every window but
    the last."""
    harness = BufferedHarness(dut, window=WINDOW)
    seen = {}

    async def bench(ctx):
        masks = []
        for window in range(windows):
            if window == 0:
                ctx.set(harness.i__bank0, sum(b << (k * WIDTH) for k, b in enumerate(beats)))
                ctx.set(harness.i__load_count, len(beats))
                ctx.set(harness.o__expect0, sum(b << (k * WIDTH) for k, b in enumerate(expected)))
                ctx.set(harness.o__expect_count, len(expected))
            else:
                ctx.set(harness.i__load_count, 0)
                ctx.set(harness.o__expect_count, 0)
            ctx.set(harness.i__gaps, gaps[window] if window < len(gaps) else 0)
            ctx.set(harness.o__stalls, stalls[window] if window < len(stalls) else 0)
            ctx.set(harness.window, (window + 1) % 2)
            await ctx.tick().repeat(WINDOW)
            # Read before the next window edge: the masks closed at this window's first edge,
            # i.e. those of the window before.
            if window:
                masks.append((ctx.get(harness.i__fires), ctx.get(harness.o__fires)))
        seen["status"] = {name: ctx.get(getattr(harness.status, name))
                          for name in ("window_cycles", "overflow", "o__compared",
                                       "o__mismatch", "o__unexpected", "o__protocol_error")}
        seen["mismatch"] = (ctx.get(harness.o__mismatch_index), ctx.get(harness.o__mismatch_got))
        seen["masks"] = masks

    sim = Simulator(harness)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _transfers(masks, which):
    return sum(bin(pair[which]).count("1") for pair in masks)


def test_every_beat_through_and_compared():
    seen = _run(_Pipe(), [3, 1, 4, 1, 5], [3, 1, 4, 1, 5])
    assert seen["status"] == {"window_cycles": WINDOW, "overflow": 0, "o__compared": 5,
                              "o__mismatch": 0, "o__unexpected": 0, "o__protocol_error": 0}
    assert _transfers(seen["masks"], 0) == _transfers(seen["masks"], 1) == 5


def test_a_wrong_beat_is_caught_with_its_index_and_value():
    seen = _run(_Pipe(), [3, 1, 4, 1, 5], [3, 1, 9, 1, 5])
    assert seen["status"]["o__mismatch"] == 1
    assert seen["mismatch"] == (2, 4)


def test_an_unexpected_beat_is_caught():
    seen = _run(_Pipe(), [3, 1, 4], [3, 1])
    assert seen["status"]["o__unexpected"] == 1 and seen["status"]["o__compared"] == 3


def test_masks_pause_the_ports():
    # Windows 0 and 1 gap every cycle of i; window 2 stalls o every cycle.
    full = (1 << WINDOW) - 1
    seen = _run(_Pipe(), [7, 8, 9], [7, 8, 9], gaps=(full, full), stalls=(0, 0, full))
    assert seen["masks"][0][0] == seen["masks"][1][0] == 0, "a source sent during a gap"
    assert seen["masks"][2][0] and not seen["masks"][2][1], "a sink took a beat in a stall"
    assert seen["status"]["o__compared"] == 3 and seen["status"]["o__mismatch"] == 0


@pytest.mark.parametrize("stalls", [(0, (1 << WINDOW) - 1)])
def test_the_protocol_checker_sees_a_dropped_valid(stalls):
    seen = _run(_Pipe(drop_valid=True), [7, 8, 9], [7, 8, 9], stalls=stalls)
    assert seen["status"]["o__protocol_error"] == 1


def test_the_runner_finds_the_buffered_tests():
    """flows.sim runs test_buffered_* on BLOCK_buffered and the rest on the block."""
    from flows.sim import buffered_tests
    from hw.registry import get_block
    assert buffered_tests(get_block("systolic")) == [
        "test_buffered_throughput", "test_buffered_random_stalls",
        "test_buffered_harness_catches_defects"]
    assert buffered_tests(get_block("lif")) == []


def test_wide_streams_get_a_shorter_window_and_still_generate():
    """Amaranth numbers a top module's input bits with 16 bits: the banks of a 4-array tile
    (three 129-bit streams) need a window under 64 to fit; streams wider than any window
    allows get a clear error."""
    from flows.verilog import built_for_ports, convert
    from hw.registry import get_block
    from tb.buffered import harness_window
    tile = get_block("systolic_tile")
    component = tile.build(tile.config(rows=4, cols=4, arrays=4))
    window = harness_window(component)
    assert 2 <= window < 64
    assert "module tile_buffered" in convert(BufferedHarness(component), "tile_buffered")
    wide = get_block("systolic").build(get_block("systolic").config(rows=64, cols=64,
                                                                    in_width=16, acc_width=64))
    assert harness_window(built_for_ports(wide)) >= 2
    huge = built_for_ports(wiring.Component({"i": In(stream.Signature(8000)),
                                             "o": Out(stream.Signature(8))}))
    with pytest.raises(ValueError, match="too wide for the buffered harness"):
        harness_window(huge)


def test_the_clocked_module_passes_every_port_and_makes_the_clock():
    """BLOCK_buffered_clocked (the module the simulators run): every harness port passed
    through by name, clk an output it toggles every half period from low at time 0 (the GPI
    clock's edges), and clock_inside, which tells tb.streams.start_clock not to drive clk."""
    import re
    from flows.verilog import convert, port_list
    from tb.buffered import CLOCKED, clocked_verilog
    from tb.streams import CLOCK_PERIOD_NS
    harness = BufferedHarness(_Pipe(), window=WINDOW)
    ports = port_list(harness)
    # The module it wraps has exactly these ports.
    inner = re.search(r"module pipe_buffered\((.*?)\);", convert(harness, "pipe_buffered"))
    assert sorted(inner.group(1).split(", ")) == sorted(port["name"] for port in ports)
    text = clocked_verilog("pipe_buffered", ports)
    header = re.search(r"module pipe_buffered" + CLOCKED + r"\((.*?)\);", text).group(1)
    assert header.split(", ") == [port["name"] for port in ports] + ["clock_inside"]
    for port in ports:
        assert f".{port['name']}({port['name']})" in text
        if port["name"] != "clk":
            width = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
            direction = "input" if port["direction"] == "in" else "output"
            assert f"  {direction} {width}{port['name']};" in text
    assert "  output reg clk;" in text and "  initial clk = 1'b0;" in text
    assert f"  always #{CLOCK_PERIOD_NS / 2:g} clk = ~clk;" in text
    assert "  assign clock_inside = 1'b1;" in text
