"""cocotb tests of the AXI4-Stream wrapper (`moegen verilog --axis`, flows.package) of the
output-stationary ``systolic`` array, driven by cocotbext-axi's AxiStreamSource and
AxiStreamSink: one frame per job on each input (tlast on its last beat), one frame of R rows on
c, every frame checked against the NumPy golden model.

Run through ``tests/test_package.py``, which builds ``systolic_axis`` and names the block's
manifest with ``+moegen_manifest``.
"""

import itertools

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from golden import fixed
from golden import systolic as golden
from tb.harness import dut_manifest, make_rng


def _field(port, name):
    return next(f for f in port["fields"] if f["field"] == name)


def _pack(port, values):
    """The payload integer of ``port`` with data fields ``values`` (two's complement)."""
    word = 0
    for index, value in enumerate(values):
        field = _field(port, f"data.{index}")
        width = field["msb"] - field["lsb"] + 1
        word |= (value & ((1 << width) - 1)) << field["lsb"]
    return word


def _unpack(port, word, count):
    out = []
    for index in range(count):
        field = _field(port, f"data.{index}")
        width = field["msb"] - field["lsb"] + 1
        value = (word >> field["lsb"]) & ((1 << width) - 1)
        out.append(value - (1 << width) if value >> (width - 1) else value)
    return out


def _paused(rng, fraction):
    """A cocotbext-axi pause generator: paused on about ``fraction`` of the cycles, with
    occasional bursts of tens of cycles."""
    def generator():
        while True:
            if rng.random() < 0.02:
                yield from itertools.repeat(True, rng.randint(10, 60))
            yield rng.random() < fraction
    return generator()


def _frame(port, lanes, beats):
    data = b"".join(_pack(port, beat).to_bytes(lanes, "little") for beat in beats)
    return AxiStreamFrame(data)


async def _start(dut):
    """Clock, the two sources and the sink (no pauses), the ports' manifest entries; after a
    reset of 3 cycles."""
    info = dut_manifest()
    cocotb.start_soon(Clock(dut.aclk, 10, unit="ns").start())
    ports = [AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_a"), dut.aclk, dut.aresetn,
                             reset_active_level=False),
             AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_b"), dut.aclk, dut.aresetn,
                             reset_active_level=False),
             AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_c"), dut.aclk, dut.aresetn,
                           reset_active_level=False)]
    dut.aresetn.value = 0
    await ClockCycles(dut.aclk, 3)
    dut.aresetn.value = 1
    await RisingEdge(dut.aclk)
    return info, {p["name"]: p for p in info["ports"]}, ports


def _random_job(rng, params, depth):
    lo, hi = fixed.signed_limits(params["in_width"])
    a = [[rng.choice((lo, hi, rng.randint(lo, hi))) for _ in range(depth)]
         for _ in range(params["rows"])]
    b = [[rng.choice((lo, hi, rng.randint(lo, hi))) for _ in range(params["cols"])]
         for _ in range(depth)]
    return a, b


async def _send_job(ports, a_src, b_src, a, b):
    rows = len(a)
    await a_src.send(_frame(ports["a__payload"], a_src.byte_lanes,
                            [[a[i][k] for i in range(rows)] for k in range(len(b))]))
    await b_src.send(_frame(ports["b__payload"], b_src.byte_lanes, b))


def _rows_of(frame, port, lanes, rows, cols):
    data = bytes(frame.tdata)
    assert len(data) == rows * lanes, f"a c frame of {len(data) // lanes} beats, not {rows}"
    return [_unpack(port, int.from_bytes(data[r * lanes:(r + 1) * lanes], "little"), cols)
            for r in range(rows)]


@cocotb.test()
async def test_axis_edges_match_the_cycle_model_without_stalls(dut):
    """No pauses anywhere: every c beat leaves at the edge the array's cycle model gives
    (`golden.systolic.OSCycleModel.schedule`, counted from the first a beat): the wrapper adds
    no cycle."""
    info, ports, (a_src, b_src, c_sink) = await _start(dut)
    params = info["params"]
    rows, cols = params["rows"], params["cols"]
    rng = make_rng("axis-edges")
    depths = (1, 4, 2, 7)
    edge, first_in, out_edges = 0, None, []

    async def count_edges():
        nonlocal edge, first_in
        while True:
            await RisingEdge(dut.aclk)
            edge += 1
            if first_in is None and dut.s_axis_a_tvalid.value and dut.s_axis_a_tready.value:
                first_in = edge
            if dut.m_axis_c_tvalid.value and dut.m_axis_c_tready.value:
                out_edges.append(edge)

    cocotb.start_soon(count_edges())
    for depth in depths:
        await _send_job(ports, a_src, b_src, *_random_job(rng, params, depth))
    for _ in depths:
        await with_timeout(c_sink.recv(), 100, "us")
    model = golden.OSCycleModel(rows, cols, stages=params.get("pe_stages", golden.OS_PE_STAGES))
    assert [e - first_in for e in out_edges] == model.schedule(depths)[1]


@cocotb.test()
async def test_axis_reset_mid_job_leaves_nothing_stale(dut):
    """aresetn pulled low in the middle of a job (for 2 cycles): after it, new jobs come out
    exactly right and nothing of the interrupted one ever appears."""
    info, ports, (a_src, b_src, c_sink) = await _start(dut)
    params = info["params"]
    rows, cols = params["rows"], params["cols"]
    rng = make_rng("axis-reset")
    await _send_job(ports, a_src, b_src, *_random_job(rng, params, 9))
    await ClockCycles(dut.aclk, 4)                        # 9-beat job half taken
    dut.aresetn.value = 0
    await ClockCycles(dut.aclk, 2)
    for port in (a_src, b_src, c_sink):
        port.clear()
    dut.aresetn.value = 1
    await RisingEdge(dut.aclk)
    jobs = [_random_job(rng, params, depth) for depth in (3, 1, 5)]
    for a, b in jobs:
        await _send_job(ports, a_src, b_src, a, b)
    for a, b in jobs:
        frame = await with_timeout(c_sink.recv(), 100, "us")
        got = _rows_of(frame, ports["c__payload"], c_sink.byte_lanes, rows, cols)
        assert got == golden.os_tile_result(a, b, params["acc_width"]).tolist()
    await ClockCycles(dut.aclk, 40)
    assert c_sink.empty(), "a c frame after the expected ones (stale or duplicated)"


@cocotb.test()
async def test_axis_frames_match_golden(dut):
    """Random jobs of random depth (1 included) under random pauses on every AXI4-Stream
    port: every c frame has R beats, tlast on the last, and the golden A·B."""
    info, ports, (a_src, b_src, c_sink) = await _start(dut)
    params = info["params"]
    rng = make_rng("axis")
    for port, fraction in ((a_src, 0.3), (b_src, 0.5), (c_sink, 0.4)):
        port.set_pause_generator(_paused(rng, fraction))
    jobs = []
    for depth in (1, 5, 2, 17, 3, 9):
        a, b = _random_job(rng, params, depth)
        jobs.append(golden.os_tile_result(a, b, params["acc_width"]).tolist())
        await _send_job(ports, a_src, b_src, a, b)
    for expected in jobs:
        frame = await with_timeout(c_sink.recv(), 200, "us")
        got = _rows_of(frame, ports["c__payload"], c_sink.byte_lanes, params["rows"],
                       params["cols"])
        assert got == expected, f"c frame {got} != golden {expected}"
    await ClockCycles(dut.aclk, 50)
    assert c_sink.empty(), "a c frame nobody owed"
    assert int(dut.error.value) == 0
