"""PMU: golden model, config validation, manifest, and cocotb on both simulators."""

import dataclasses
import random

import pytest

from conftest import (SIMULATORS, config_id, on_off_pattern, run_amaranth, run_block,
                      side_by_side, two_d_params)
from golden import pmu as golden
from hw.params import ParamError
from hw.pmu import PMUConfig
from hw.registry import get_block

SIM_CONFIGS = [
    # Default: 8 banks, 8 lanes, 3 loops, 16-bit addresses over a 9-bit scratchpad.
    {},
    # Lanes fewer than banks and not a power of two, narrow elements, address = capacity bits.
    {"banks": 4, "bank_depth": 16, "lanes": 3, "loops": 2, "addr_width": 6, "elem_width": 5},
    # One bank, one lane, one loop, wide elements: every mapping degenerates to offset = address.
    {"banks": 1, "bank_depth": 8, "lanes": 1, "loops": 1, "addr_width": 3, "elem_width": 32},
]
SWEEP_CONFIGS = [
    {"banks": 16, "bank_depth": 8, "lanes": 16, "loops": 6, "addr_width": 12, "elem_width": 8},
    {"banks": 32, "bank_depth": 2, "lanes": 5, "loops": 2, "addr_width": 8, "elem_width": 3},
]

P = {"banks": 4, "bank_depth": 8, "elem_width": 8, "lanes": 4, "loops": 2, "addr_width": 6}


def test_affine_addresses_level0_innermost_and_wrap():
    job = golden.make_job(P, base=1, bounds=[2, 3], strides=[4, -10], lane_stride=-1)
    first_lanes = [lanes[0] for lanes in golden.access_addresses(job, P)]
    assert first_lanes == [1, 5, (1 - 10) % 64, (5 - 10) % 64, (1 - 20) % 64, (5 - 20) % 64]
    assert golden.access_addresses(job, P)[0] == [1, 0, 63, 62]


def test_diagonal_mapping_transposes_without_conflict():
    write = golden.make_job(P, bounds=[4], strides=[4], diagonal=1, row_shift=2)
    read = golden.make_job(P, bounds=[4], strides=[1], lane_stride=4, diagonal=1, row_shift=2)
    pad = golden.Scratchpad(P)
    tile = [[10 * r + c for c in range(4)] for r in range(4)]
    assert pad.write_job(write, tile) == [1, 1, 1, 1]
    vectors, valids, costs = pad.read_job(read)
    assert vectors == [list(col) for col in zip(*tile)] and costs == [1, 1, 1, 1]
    naive = golden.make_job(P, bounds=[4], strides=[1], lane_stride=4)
    assert pad.job_costs(naive) == [4, 4, 4, 4]


def test_bit_select_offset_is_the_address_without_bank_bits():
    job = golden.make_job(P, bank_pos=[1, 4])
    valid, bank, offset = golden.decode_lane(0b10110, job, P)
    assert valid and bank == 0b11 and offset == 0b010   # bits 0, 2, 3 of the address
    # Every address of the scratchpad gets its own (bank, offset).
    cells = {golden.decode_lane(a, job, P)[1:] for a in range(32)}
    assert len(cells) == 32


def test_predicate_and_capacity():
    job = golden.make_job(P, pred_lo=3, pred_hi=5)
    assert [golden.decode_lane(a, job, P)[0] for a in (2, 3, 4, 5)] == [False, True, True, False]
    assert not golden.decode_lane(40, golden.make_job(P), P)[0]   # 40 >= capacity 32


def test_cost_counts_only_valid_lanes():
    assert golden.access_cost([(True, 1, 0), (True, 1, 1), (False, 1, 2), (True, 0, 0)]) == 2
    assert golden.access_cost([(False, 0, 0)]) == 1


def test_invalid_jobs_are_recognized():
    assert not golden.job_is_valid(golden.make_job(P, bounds=[0]), P)
    assert not golden.job_is_valid(golden.make_job(P, bank_pos=[3, 1]), P)
    assert not golden.job_is_valid(golden.make_job(P, bank_pos=[1, 5]), P)   # 5 >= log2(32)
    assert not golden.job_is_valid(golden.make_job(P, diagonal=1, row_shift=1), P)
    assert golden.job_is_valid(golden.make_job(P, diagonal=1, row_shift=3), P)


def test_beat_edges_chain_jobs():
    # e + 5 + the costs so far (docs/blocks/pmu.md); a read beat 3 edges after a write's
    assert golden.write_beat_edges([[1, 2], [1]]) == [6, 8, 9]
    assert golden.read_beat_edges([[3]]) == [11]


@pytest.mark.parametrize("kwargs, message", [
    ({"banks": 6}, "parameter 'banks': got 6; allowed: an integer in 1..32, a power of two"),
    ({"banks": 64}, "parameter 'banks': got 64; allowed: an integer in 1..32, a power of two"),
    ({"bank_depth": 100},
     "parameter 'bank_depth': got 100; allowed: an integer in 2..65536, a power of two"),
    ({"elem_width": 0}, "parameter 'elem_width': got 0; allowed: an integer in 1..64"),
    ({"lanes": 9}, "parameter 'lanes': got 9; allowed: an integer in 1..banks (8)"),
    ({"lanes": 0}, "parameter 'lanes': got 0; allowed: an integer in 1..32"),
    ({"loops": 7}, "parameter 'loops': got 7; allowed: an integer in 1..6"),
    ({"addr_width": 8},
     "parameter 'addr_width': got 8; allowed: an integer in 9..32 (log2(banks*bank_depth) and up)"),
    ({"addr_width": 33}, "parameter 'addr_width': got 33; allowed: an integer in 1..32"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        PMUConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", two_d_params(SIM_CONFIGS, 1))
def test_cocotb(params, simulator):
    result = run_block("pmu", params, simulator)
    assert result.tests == 19  # every cocotb test of tb/test_pmu.py ran


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_cocotb_3d_in_lockstep_with_2d(simulator):
    # The banks on the memory die, the address generators on the logic die: pmu_equiv runs both
    # builds, every test passes on the 2D outputs and `mismatch` never rises.
    assert run_block("pmu", SIM_CONFIGS[1], simulator, three_d=True).tests == 19


def test_3d_bonds_are_the_bank_ports(tmp_path):
    from flows.threed import generate_3d
    block = get_block("pmu")
    config = block.config(**SIM_CONFIGS[1])
    built = generate_3d(block, config, tmp_path)
    address = config.bank_depth.bit_length() - 1
    assert built["bond_counts"] == {
        "down": 2 + config.banks * (1 + 2 * address + config.elem_width),
        "up": config.banks * config.elem_width}


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_CONFIGS, ids=[config_id(p) for p in SWEEP_CONFIGS])
def test_cocotb_sweep(params, simulator):
    run_block("pmu", params, simulator)


@pytest.mark.parametrize("depth", [2, 5])
@pytest.mark.parametrize("traffic", ["random", "bursts"])
def test_registered_head_fifo_has_sync_fifos_timing(depth, traffic):
    """The address generators' queues (hw.pipeline.RegisteredHeadFIFO: a register as the head,
    in front of a SyncFIFO) against amaranth.lib.fifo.SyncFIFO of the same depth, driven alike:
    every cycle the same w_rdy, r_rdy and level, the same head while r_rdy; writes into a full
    queue (ignored by both) and resets mid-run included."""
    from amaranth.hdl import Module, ResetInserter, Signal
    from amaranth.lib.fifo import SyncFIFO

    from hw.pipeline import RegisteredHeadFIFO
    rng = random.Random(f"{traffic}{depth}")
    cycles = 800
    writes = on_off_pattern(rng, traffic, cycles, 0.6)
    reads = on_off_pattern(rng, traffic, cycles, 0.5)
    resets = [cycle % 300 == 299 for cycle in range(cycles)]
    m, reset = Module(), Signal()
    dut = RegisteredHeadFIFO(width=8, depth=depth)
    ref = SyncFIFO(width=8, depth=depth)
    m.submodules.dut, m.submodules.ref = ResetInserter(reset)(dut), ResetInserter(reset)(ref)
    mismatches, seen = [], set()

    async def bench(ctx):
        for cycle in range(cycles):
            for fifo in (dut, ref):
                ctx.set(fifo.w_en, writes[cycle])
                ctx.set(fifo.w_data, cycle % 256)
                ctx.set(fifo.r_en, reads[cycle])
            ctx.set(reset, resets[cycle])
            state = [(ctx.get(f.w_rdy), ctx.get(f.r_rdy), ctx.get(f.r_level),
                      ctx.get(f.r_data) if ctx.get(f.r_rdy) else None) for f in (dut, ref)]
            if state[0] != state[1]:
                mismatches.append((cycle, state))
            seen.add((state[1][2], state[1][0]))
            await ctx.tick()

    run_amaranth(m, bench)
    assert mismatches == []
    assert {(0, True), (depth, False)} <= seen           # both empty and full were reached


@pytest.mark.parametrize("count, bounded", [(1, True), (2, True), (5, False), (8, True)])
def test_thermometer_max_is_the_largest(count, bounded):
    """The largest lane rank (hw.pipeline.thermometer_max, then thermometer_value): the
    number is the largest of the values, for random values and for every value at its bound
    (lane v's rank is at most v: ``bounds`` leaves the compares it cannot reach out)."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from hw.pipeline import thermometer_max, thermometer_value
    width = 3
    bounds = list(range(count)) if bounded else [(1 << width) - 1] * count
    values = [Signal(width, name=f"value{i}") for i in range(count)]
    largest = Signal(width)
    m = Module()
    bits = thermometer_max(values, bounds=bounds if bounded else None)
    m.d.comb += largest.eq(thermometer_value(bits, width) if bits else 0)
    rng = random.Random(count)
    draws = [[rng.randint(0, bound) for bound in bounds] for _ in range(300)]
    draws += [list(bounds), [0] * count]
    draws += [[bound if i == j else 0 for i, bound in enumerate(bounds)] for j in range(count)]
    wrong = []

    async def bench(ctx):
        for draw in draws:
            for signal, value in zip(values, draw):
                ctx.set(signal, value)
            if ctx.get(largest) != max(draw):
                wrong.append((draw, ctx.get(largest)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == []


# The contiguous build (hw.pmu.PMU(contiguous=True), expert_chiplet's scratchpad) against the
# block, on the jobs it is built for. Lanes = banks (the fixed-bank build: lane v on bank v,
# no crossbar; addresses past the capacity), fewer lanes than banks and not a power of two
# (crossbar kept: any base), one lane, and one bank (no bank bits).
CONTIGUOUS_CONFIGS = [
    {"banks": 4, "bank_depth": 4, "elem_width": 5, "lanes": 4, "loops": 2, "addr_width": 5},
    {"banks": 8, "bank_depth": 4, "elem_width": 6, "lanes": 6, "loops": 3, "addr_width": 5},
    {"banks": 2, "bank_depth": 2, "elem_width": 3, "lanes": 1, "loops": 1, "addr_width": 3},
    {"banks": 1, "bank_depth": 4, "elem_width": 4, "lanes": 1, "loops": 2, "addr_width": 2},
]


def _contiguous_jobs(rng, cfg, count, aligned):
    """``count`` descriptors (golden.make_job) whose mapping fields are the contiguous build's
    constants: base and strides multiples of V when ``aligned`` (else any base, V-multiple
    strides), bounds 1..3; with the number of accesses of each."""
    from hw.pmu import job_layout
    params = dataclasses.asdict(cfg)
    A, V, L = cfg.addr_width, cfg.lanes, cfg.loops
    assert 3 * V < 1 << A
    bank_fields = max(1, cfg.bank_bits)
    jobs = []
    for _ in range(count):
        base = rng.randrange(1 << A)
        job = golden.make_job(params, base=base - base % V if aligned else base,
                              bounds=[rng.randint(1, 3) for _ in range(L)],
                              strides=[V * rng.randint(-3, 3) for _ in range(L)],  # < 2**A
                              pred_hi=cfg.banks * cfg.bank_depth, row_shift=0)
        job["bank_pos"] = (job["bank_pos"] + [0] * bank_fields)[:bank_fields]
        jobs.append((job_layout(cfg).const(job), len(golden.access_addresses(job, params))))
    return jobs


@pytest.mark.parametrize("params", CONTIGUOUS_CONFIGS, ids=config_id)
@pytest.mark.parametrize("traffic", ["random", "bursts"])
def test_contiguous_build_is_the_block_cycle_for_cycle_on_contiguous_jobs(params, traffic):
    """Both builds side by side, driven alike (valid gaps on wjob, rjob and w, ready stalls on
    r, a reset mid-run, a wrong w.last now and then): every output equal in every cycle, and
    no bank conflict counted. With V < banks any base is such a job; with V = banks only a
    base that is a multiple of V (the misuse test below)."""
    aligned = params["lanes"] == params["banks"]
    mismatches, transfers, conflicts = _side_by_side(params, traffic, aligned)
    assert mismatches[:3] == []
    assert min(transfers.values()) > 20, transfers                 # real traffic on every port
    assert conflicts == [0, 0]            # consecutive words: never two lanes on one bank


def test_contiguous_build_with_lanes_equal_banks_differs_on_an_unaligned_base():
    """The documented misuse: with V = banks lane v is wired to bank v, so V consecutive words
    from a base that is not a multiple of V go to the wrong banks (the block reads them back
    from the right ones)."""
    mismatches, _, _ = _side_by_side(CONTIGUOUS_CONFIGS[0], "random", aligned=False)
    assert mismatches


def _side_by_side(params, traffic, aligned):
    """The block and its contiguous build driven alike for 1,000 cycles; returns the cycles
    whose outputs differ, the transfers on each port, and the block's largest conflict
    counts (write, read)."""
    from hw.pmu import PMU, write_layout
    cfg = PMUConfig(**params)
    rng = random.Random(f"{config_id(params)}{traffic}{aligned}")
    cycles = 1000
    pmus = general, contiguous = PMU(cfg), PMU(cfg, contiguous=True)
    m, reset = side_by_side(general=general, contiguous=contiguous)
    gaps = {name: on_off_pattern(rng, traffic, cycles, 0.7) for name in ("wjob", "rjob", "w")}
    ready = on_off_pattern(rng, traffic, cycles, 0.6)
    resets = {cycles // 2}
    outputs = ("w_busy", "r_busy", "error", "w_conflict_cycles", "r_conflict_cycles")
    mismatches, transfers = [], {"wjob": 0, "rjob": 0, "w": 0, "r": 0}
    conflicts = [0, 0]                    # the block's write and read conflict cycles, largest

    def fresh_stimuli():
        wjobs = _contiguous_jobs(rng, cfg, 40, aligned)
        beats = []
        for _, accesses in wjobs:
            for index in range(accesses):
                last = index == accesses - 1
                beats.append(([rng.randrange(1 << cfg.elem_width) for _ in range(cfg.lanes)],
                              last != (rng.random() < 0.01)))     # now and then misplaced
        return ([d for d, _ in wjobs], [d for d, _ in _contiguous_jobs(rng, cfg, 40, aligned)],
                beats)

    async def bench(ctx):
        wjobs, rjobs, beats = fresh_stimuli()
        for cycle in range(cycles):
            in_reset = cycle in resets
            ctx.set(reset, in_reset)
            for pmu in pmus:
                ctx.set(pmu.wjob.valid, bool(wjobs) and gaps["wjob"][cycle])
                ctx.set(pmu.rjob.valid, bool(rjobs) and gaps["rjob"][cycle])
                ctx.set(pmu.w.valid, bool(beats) and gaps["w"][cycle])
                if wjobs:
                    ctx.set(pmu.wjob.payload, wjobs[0])
                if rjobs:
                    ctx.set(pmu.rjob.payload, rjobs[0])
                if beats:
                    ctx.set(pmu.w.payload, write_layout(cfg).const(
                        {"data": beats[0][0], "last": beats[0][1]}))
                ctx.set(pmu.r.ready, ready[cycle])
            state = []
            for pmu in pmus:
                valid = ctx.get(pmu.r.valid)
                state.append((ctx.get(pmu.wjob.ready), ctx.get(pmu.rjob.ready),
                              ctx.get(pmu.w.ready), valid,
                              ctx.get(pmu.r.payload.as_value()) if valid else None,
                              *[ctx.get(getattr(pmu, name)) for name in outputs]))
            if state[0] != state[1]:
                mismatches.append((cycle, state))
            conflicts[:] = [max(conflicts[0], state[0][-2]), max(conflicts[1], state[0][-1])]
            wjob_ready, rjob_ready, w_ready, r_valid = state[0][:4]
            if not in_reset:
                if wjobs and gaps["wjob"][cycle] and wjob_ready:
                    wjobs.pop(0)
                    transfers["wjob"] += 1
                if rjobs and gaps["rjob"][cycle] and rjob_ready:
                    rjobs.pop(0)
                    transfers["rjob"] += 1
                if beats and gaps["w"][cycle] and w_ready:
                    beats.pop(0)
                    transfers["w"] += 1
                transfers["r"] += r_valid and ready[cycle]
            await ctx.tick()
            if in_reset:
                wjobs, rjobs, beats = fresh_stimuli()

    run_amaranth(m, bench)
    return mismatches, transfers, conflicts
