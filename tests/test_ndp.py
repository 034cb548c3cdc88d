"""ndp_core: golden arithmetic, the DDR4 model, config validation and cocotb on both
simulators."""

import numpy as np
import pytest

from conftest import SIMULATORS, config_id, run_block
from golden import fixed
from golden import ndp as golden
from golden.dram import DDR4_3200AA, TABLE_I, Command, Ddr4Stream, check_trace
from hw.ndp import NdpConfig, NdpSystemConfig
from hw.params import ParamError
from flows import ndp_schedule

COCOTB_TESTS = 17

SIM_CONFIGS = [
    # Odd M, narrow operands, a 16-bit accumulator that wraps, the fewest output slots (2:
    # slot-limited single-beat rows, results on consecutive edges), buffers that are not
    # multiples of M.
    {"mults": 5, "w_width": 4, "x_width": 6, "acc_width": 16, "max_cols": 23, "max_inter": 11,
     "out_depth": 2, "max_tokens": 3},
    # Table I's 64 multipliers with int8 operands (the make demo configuration, 8 tokens).
    {"max_cols": 256, "max_inter": 128},
]

# Buffers for full-size Table II slices: test_throughput then runs Qwen3-30B-A3B's (2048 x 192)
# and DeepSeek-MoE's (2048 x 352) 4-DIMM slices unscaled.
# Plus the defaults (1024 / 256).
# Plus Table I's core with 64 tokens (S = 64 at M = 64) and the one-token core (max_tokens = 1).
# Plus 8 multipliers, power-of-two sizes, rows of several beats, the most tokens a command may
# name (64), moved here for make test's time budget (2026-11-30): make test's cores have rows
# of several beats too (Table I's, 256 / 64 = 4 beats); S = 64 runs here also in Table I's core
# with 64 tokens (above).
SWEEP_CONFIGS = [{}, {"max_cols": 2048, "max_inter": 384},
                 {"max_cols": 256, "max_inter": 128, "max_tokens": 64},
                 {"mults": 8, "max_cols": 64, "max_inter": 32, "max_tokens": 1},
                 {"mults": 8, "max_cols": 64, "max_inter": 32, "max_tokens": 64}]


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_CONFIGS, ids=[config_id(p) for p in SWEEP_CONFIGS])
def test_cocotb_sweep(params, simulator):
    assert run_block("ndp_core", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("value_shape,shift_bits,width", [
    (("s", 10), 4, 5), (("u", 8), 4, 4), (("s", 6), 3, 8), (("s", 9), 2, 3)])
def test_hardware_requant_matches_golden_everywhere(value_shape, shift_bits, width):
    """``hw.pipeline.requant`` (shift first, then an increment, the range read from the top bits)
    against the golden rule for every value and every run-time shift, and for constant shifts:
    signed and unsigned inputs, results that saturate both ways, shifts past the value's width,
    a width wider than the value (no saturation possible)."""
    from amaranth.hdl import Module, Signal, signed, unsigned
    from amaranth.sim import Simulator
    from hw.pipeline import requant
    kind, bits = value_shape
    shape = signed(bits) if kind == "s" else unsigned(bits)
    m = Module()
    value, shift = Signal(shape), Signal(shift_bits)
    runtime = requant(m, value, shift, width, "runtime")
    constant = {c: requant(m, value, c, width, f"constant{c}") for c in (0, 1, 3, 7)}
    low, high = (-(1 << (bits - 1)), 1 << (bits - 1)) if kind == "s" else (0, 1 << bits)
    mismatches = []

    async def bench(ctx):
        for v in range(low, high):
            ctx.set(value, v)
            for c, out in constant.items():
                if ctx.get(out) != golden.requant(v, c, width):
                    mismatches.append((v, c))
            for s in range(1 << shift_bits):
                ctx.set(shift, s)
                if ctx.get(runtime) != golden.requant(v, s, width):
                    mismatches.append((v, s))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert mismatches == []


def test_requant_rounds_half_up_and_saturates():
    assert golden.requant(5, 1, 8) == 3          # 2.5 -> 3
    assert golden.requant(-5, 1, 8) == -2        # -2.5 -> -2 (half up, towards +inf)
    assert golden.requant(-6, 2, 8) == -1        # -1.5 -> -1
    assert golden.requant(300, 0, 8) == 127 and golden.requant(-300, 0, 8) == -128
    assert golden.requant(1 << 40, 31, 8) == 127


def test_wrap_is_twos_complement():
    assert fixed.wrap(1 << 15, 16) == -(1 << 15)
    assert fixed.wrap(-(1 << 15) - 1, 16) == (1 << 15) - 1


def test_split_sizes_even_and_uneven():
    assert golden.split_sizes(12, 4) == [3, 3, 3, 3]
    assert golden.split_sizes(13, 4) == [4, 3, 3, 3]
    with pytest.raises(ValueError):
        golden.split_sizes(3, 4)


@pytest.mark.parametrize("parts, inter", [(2, 16), (4, 16), (6, 16), (4, 13), (6, 7)])
def test_tensor_parallel_sum_equals_whole_expert(parts, inter):
    rng = np.random.default_rng(parts * 100 + inter)
    hidden = 20
    wg, wu = (rng.integers(-128, 128, (inter, hidden)) for _ in range(2))
    wd = rng.integers(-128, 128, (hidden, inter))
    x = list(rng.integers(-128, 128, hidden))
    lut = golden.activation_lut("silu", 8, 4, 4)
    shifts = (9, 9, 6)
    whole = golden.ffn_expert(wg, wu, wd, x, lut, shifts, 8, 32)
    partials = [golden.ffn_slice(g, u, d, x, lut, shifts, 8, 32)[0]
                for g, u, d in golden.split_expert(wg, wu, wd, parts)]
    total = [fixed.wrap(v, 32) for v in np.array(partials, dtype=object).sum(0)]
    assert total == whole


def test_activation_tables():
    relu = golden.activation_lut("relu", 8, 4, 4)
    assert relu[5] == 5 and relu[256 - 5] == 0
    silu = golden.activation_lut("silu", 8, 4, 4)
    assert silu[16] == round(16 / (1 + np.exp(-1.0)))     # silu(1.0) in 4 fraction bits
    assert golden.activation_lut("gelu", 8, 4, 4)[127] == 127


def test_weight_stream_order():
    wg = np.array([[1, 2, 3]]); wu = np.array([[4, 5, 6]]); wd = np.array([[7], [8], [9]])
    beats = golden.ffn_weight_beats(wg, wu, wd, 2)
    assert beats == [[1, 2], [3, 0], [4, 5], [6, 0], [7, 0], [8, 0], [9, 0]]


def test_cycle_model_by_hand():
    # gemv 5x17 on M=8 with x: 1 command edge + 3 x beats + 5*3 weight beats.
    assert golden.command_cycles(golden.OP_GEMV, 5, 17, True, 8, 16) == 1 + 3 + 15
    # ffn_slice I_s=3, D=17, M=8: 2*3*3 gate beats, drain 3+10, 17 Wd rows of 1 beat.
    assert golden.command_cycles(golden.OP_FFN_SLICE, 3, 17, False, 8, 16) == 1 + 18 + 13 + 17
    assert golden.result_latency(64) == 12 and golden.result_latency(1) == 6
    # M=5: latency 9; 4 slots: 4 single-beat rows, then the first slot frees at edge 1+9+1.
    _, beats, results = golden.timeline([(golden.OP_GEMV, 6, 1, False)], 4, 5)
    assert beats == [1, 2, 3, 4, 11, 12] and results == [10, 11, 12, 13, 20, 21]


def test_multi_token_cycle_model_by_hand():
    # gemv 5x17 on M=8, S=4: 1 command edge + 4*3 x beats + 15 beats held 4 edges each.
    assert golden.command_cycles(golden.OP_GEMV, 5, 17, True, 8, 16, 4) == 1 + 12 + 60
    # ffn_slice I_s=3, D=17, S=2, no x: 18 gate beats x 2, drain 13, 17 Wd rows x 2.
    assert golden.command_cycles(golden.OP_FFN_SLICE, 3, 17, False, 8, 16, 2) == 1 + 36 + 13 + 34
    # A beat is taken at its token-0 pair: one-beat rows of 3 tokens, 4 slots (latency 9):
    # pairs at 1, 2, 3 | 4, then the slot of pair 1 frees at edge 11.
    _, beats, results = golden.timeline([(golden.OP_GEMV, 2, 1, False, 3)], 4, 5)
    assert beats == [1, 4] and results == [10, 11, 12, 13, 20, 21]
    # A DRAM that delivers late: the beat waits, the held pairs follow it.
    _, beats, _ = golden.timeline([(golden.OP_GEMV, 2, 16, False, 2)], 16, 8, [0, 20, 21, 22])
    assert beats == [1, 20, 22, 24]
    # Results row by row, token by token.
    assert golden.interleave_tokens([[1, 2, 3], [4, 5, 6]]) == [1, 4, 2, 5, 3, 6]
    assert golden.useful_macs(golden.OP_FFN_SLICE, 3, 5, 4) == 3 * 5 * 3 * 4


@pytest.mark.parametrize("total_bytes", [64, 4096, 300 * 1024, 1 << 20])
def test_ddr4_schedule_obeys_every_timing(total_bytes):
    stream = Ddr4Stream(total_bytes)
    assert check_trace(stream.commands) == []
    peak = TABLE_I.peak_bytes_per_clock(DDR4_3200AA)
    first = min(stream.data_start)
    for cycle in range(first, stream.last_data_cycle + 1, 7):
        assert stream.bytes_by(cycle) <= peak * (cycle - first)
    assert stream.bytes_by(stream.last_data_cycle) == total_bytes
    assert stream.bandwidth_gb_s() <= peak / DDR4_3200AA.tCK_ns


def test_ddr4_streams_near_peak_and_pays_first_access():
    stream = Ddr4Stream(1 << 20)
    assert stream.data_start[0] == DDR4_3200AA.RCD + DDR4_3200AA.CL
    assert 0.99 * 102.4 <= stream.bandwidth_gb_s() <= 102.4


@pytest.mark.parametrize("commands, rule", [
    ([Command(0, "ACT", 0, 0, 0), Command(10, "RD", 0, 0, 0)], "tRCD"),
    ([Command(0, "ACT", 0, 0, 0), Command(22, "RD", 0, 0, 0), Command(26, "RD", 0, 0, 0)],
     "tCCD"),
    ([Command(0, "ACT", 0, 0, 0), Command(30, "PRE", 0, 0, 0)], "tRAS"),
    ([Command(0, "ACT", 0, 0, 0), Command(22, "RD", 0, 0, 1)], "closed row"),
    ([Command(c, "ACT", c // 8 % 8, c // 64, 0) for c in range(0, 40, 8)], "tFAW"),
])
def test_ddr4_checker_catches_violations(commands, rule):
    assert any(rule in error for error in check_trace(commands))


@pytest.mark.parametrize("config, kwargs, message", [
    (NdpConfig, {"mults": 0}, "parameter 'mults': got 0; allowed: an integer in 1..128"),
    (NdpConfig, {"x_width": 11}, "parameter 'x_width': got 11; allowed: an integer in 2..10"),
    (NdpConfig, {"out_depth": 1}, "parameter 'out_depth': got 1; allowed: an integer in 2..256"),
    (NdpSystemConfig, {"dimms": 0}, "parameter 'dimms': got 0; allowed: an integer in 1..8"),
    (NdpSystemConfig, {"dimms": 9}, "parameter 'dimms': got 9; allowed: an integer in 1..8"),
    (NdpSystemConfig, {"max_tokens": 65},
     "parameter 'max_tokens': got 65; allowed: an integer in 1..64"),
])
def test_config_rejects_bad_values(config, kwargs, message):
    with pytest.raises(ParamError) as info:
        config(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SIM_CONFIGS, ids=[config_id(p) for p in SIM_CONFIGS])
def test_cocotb(params, simulator):
    assert run_block("ndp_core", params, simulator).tests == COCOTB_TESTS


# --- ndp_system ---------------------------------------------------------------------------------

SYSTEM_COCOTB_TESTS = 12

SYSTEM_CONFIGS = [
    # The defaults and demo: 4 DIMMs of Table I's 64-multiplier core, 8 tokens.
    {},
    # Odd everywhere: 3 DIMMs, M = 5, narrow operands, a wrapping 16-bit accumulator and
    # reduction, 2 output slots (the DIMMs wait on each other's results), 3 tokens.
    {"dimms": 3, "mults": 5, "w_width": 4, "x_width": 6, "acc_width": 16, "max_cols": 23,
     "max_inter": 4, "out_depth": 2, "max_tokens": 3},
]
# One DIMM, and 64 tokens over 4 small DIMMs (the range ends of every parameter also run in
# tests/test_ranges.py). The most DIMMs (8), M = 4, odd buffers, 5 tokens: moved here for make
# test's time budget (2026-11-30; make test's systems have 3 and 4 DIMMs).
SYSTEM_SWEEP_CONFIGS = [{"dimms": 1, "mults": 8, "max_cols": 32, "max_inter": 16},
                        {"mults": 8, "max_cols": 32, "max_inter": 8, "max_tokens": 64},
                        {"dimms": 8, "mults": 4, "max_cols": 13, "max_inter": 3, "max_tokens": 5}]


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SYSTEM_CONFIGS, ids=[config_id(p) for p in SYSTEM_CONFIGS])
def test_system_cocotb(params, simulator):
    assert run_block("ndp_system", params, simulator).tests == SYSTEM_COCOTB_TESTS


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SYSTEM_SWEEP_CONFIGS,
                         ids=[config_id(p) for p in SYSTEM_SWEEP_CONFIGS])
def test_system_cocotb_sweep(params, simulator):
    assert run_block("ndp_system", params, simulator).tests == SYSTEM_COCOTB_TESTS


@pytest.mark.parametrize("commands", [[(3, 17, True, 1)], [(3, 17, True, 2), (5, 9, False, 3)],
                                      [(9, 1, True, 4)]])
def test_system_timeline_of_one_dimm_is_the_core_timeline(commands):
    """With N = 1 the system is one core plus the reduction's register (one edge)."""
    system = golden.system_timeline(commands, 1, 4, 5)
    core = golden.timeline([(golden.OP_FFN_SLICE, *c) for c in commands], 4, 5)
    assert system[0] == core[0] and system[1] == [core[1]]
    assert system[2] == [t + 1 for t in core[2]]


def test_system_timeline_couples_the_dimms():
    """13 rows over 4 DIMMs (4, 3, 3, 3) and one-beat Wd rows: every result waits for DIMM 0,
    whose Wd phase starts 2 gate beats later; with 2 output slots the other DIMMs stall on
    theirs, so their beats shift by the wait."""
    commands, beats, results = golden.system_timeline([(13, 9, True, 1)], 4, 2, 8)
    alone = [golden.timeline([(golden.OP_FFN_SLICE, rows, 9, True)], 2, 8)
             for rows in golden.split_sizes(13, 4)]
    assert results == [t + 1 for t in alone[0][2]]            # DIMM 0 is the slowest
    assert beats[0] == alone[0][1]
    assert beats[1] != alone[1][1] and beats[1][:2 * 3 * 2] == alone[1][1][:2 * 3 * 2]


@pytest.mark.parametrize("inter, hidden, tokens, dimms, mults", [
    (13, 17, 1, 4, 8), (13, 17, 3, 4, 8), (7, 1, 2, 7, 5), (64, 40, 1, 3, 16), (9, 9, 5, 1, 4)])
def test_system_expert_cycles_closed_form(inter, hidden, tokens, dimms, mults):
    """The closed form the schedule model uses equals the edge-by-edge model (no slot waits)."""
    out_depth = golden.result_latency(mults) + 1
    for load_x in (True, False):
        _, _, results = golden.system_timeline([(inter, hidden, load_x, tokens)], dimms,
                                               out_depth, mults)
        assert golden.system_expert_cycles(inter, hidden, tokens, dimms, mults,
                                           load_x) == results[-1] + 1


def test_system_golden_is_the_unsplit_expert():
    rng = np.random.default_rng(5)
    wg, wu = (rng.integers(-8, 8, (7, 6)) for _ in range(2))
    wd = rng.integers(-8, 8, (6, 7))
    xs = [list(rng.integers(-8, 8, 6)) for _ in range(3)]
    lut = golden.activation_lut("silu", 6, 2, 2)
    want = golden.system_expert_tokens(wg, wu, wd, xs, lut, (3, 3, 4), 6, 16)
    for parts in (1, 2, 3, 7):
        partials = [golden.ffn_slice_tokens(g, u, d, xs, lut, (3, 3, 4), 6, 16)
                    for g, u, d in golden.split_expert(wg, wu, wd, parts)]
        assert [fixed.wrap(v, 16) for v in np.array(partials, dtype=object).sum(0)] == want


# --- schedule model (flows/ndp_schedule.py) ----------------------------------------------------

def test_eg_prime_follows_the_text():
    assert ndp_schedule.eg_prime(1.5, 2) == 0.25      # one N-th of the fractional part
    assert ndp_schedule.eg_prime(2.0, 2) == 0.5       # integer multiple of N: nominal 1/N
    assert ndp_schedule.eg_prime(1.0, 2) == 0.0 and ndp_schedule.eg_prime(0.0, 2) == 0.0


def test_balance_equations_on_hand_computed_cases():
    # Eq. (1): 10 E_g + 2 E_g' = 3 T_a + 5 (4 - E_g); at E_g = 1.5: 15 + 0.5 = 3 + 12.5.
    assert abs(ndp_schedule.solve_balance(4, 10, 2, 5, 1, 2) - 1.5) < 1e-9
    # Eq. (2), S = 3 adds (S-1) T_a N = 4 to the GPU side: 16 E_g - 1 = 19 on (1, 2).
    assert abs(ndp_schedule.solve_balance(4, 10, 2, 5, 1, 2, seq_len=3) - 1.25) < 1e-9
    # Eq. (3): 2 E_max = (4 - E_max) 5 + 3.
    assert abs(ndp_schedule.solve_e_max(4, 2, 5, 1, 2) - 23 / 7) < 1e-12
    # Sides that never meet: all on the NDPs, or all on the GPU.
    assert ndp_schedule.solve_balance(4, 100, 2, 0.1, 1, 2, seq_len=10) == 0.0
    assert ndp_schedule.solve_balance(4, 0.001, 0.001, 50, 10, 2) == 4.0


def test_ndp_time_is_the_rtl_cycle_model():
    """TP: an ndp_system command over N DIMMs; EP: N = 1; S tokens in commands of at most
    ndp_max_tokens (64), each paying the DDR4 first access."""
    hw = ndp_schedule.Hardware()
    qwen3 = golden.MODELS[1]
    first_beat = DDR4_3200AA.RCD + DDR4_3200AA.CL + DDR4_3200AA.BL
    for dimms, tokens in ((4, 1), (1, 1), (6, 8), (2, 64)):
        cycles = golden.system_expert_cycles(768, 2048, tokens, dimms, 64)
        assert ndp_schedule.ndp_expert_seconds(hw, qwen3, dimms, tokens) == \
            (cycles + first_beat) / 1.6e9
    # 130 tokens: two full commands and one of 2 tokens.
    cycles = (2 * golden.system_expert_cycles(768, 2048, 64, 4, 64) +
              golden.system_expert_cycles(768, 2048, 2, 4, 64) + 3 * first_beat)
    assert ndp_schedule.ndp_expert_seconds(hw, qwen3, 4, 130) == cycles / 1.6e9
    # The closed form is the edge-by-edge cycle model the RTL meets (a small expert).
    assert golden.system_expert_cycles(24, 40, 3, 4, 8) == \
        golden.system_timeline([(24, 40, True, 3)], 4, 16, 8)[2][-1] + 1


def test_schedule_plot_is_readable():
    """Every panel has axis titles; no two tick labels, titles or legends overlap; the paper's
    averages are drawn (one dashed line per strategy it reports, per panel)."""
    import matplotlib.pyplot as plt
    rows = ndp_schedule.run()
    fig = ndp_schedule.figure(rows)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = []
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_title()
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) == len(ndp_schedule.DIMMS)
        boxes += [t.get_window_extent(renderer) for t in labels]
        boxes.append(ax.title.get_window_extent(renderer))
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        stage = "prefill" if "prefill" in ax.get_title() else "decode"
        assert len(dashed) == len(ndp_schedule.PAPER[stage])
        if ax.get_legend():
            boxes.append(ax.get_legend().get_window_extent(renderer))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), f"{a} overlaps {b}"
    plt.close(fig)


def test_schedule_rows_and_averages():
    rows = ndp_schedule.run(models=ndp_schedule.MODELS[:2], dimms=(2, 4))
    assert [(r["model"], r["dimms"]) for r in rows] == [
        ("DeepSeek-MoE", 2), ("DeepSeek-MoE", 4), ("Qwen3-30B-A3B", 2), ("Qwen3-30B-A3B", 4)]
    for r in rows:
        assert r["decode"]["MoNDE"] == 1.0
        assert all(v > 0 for v in r["decode"].values())
        # More DIMMs: every TP slice is shorter, so TP's own latency falls.
        assert 0 <= r["figures"]["e_max"] <= ndp_schedule.MODELS[0].topk + 2
    tp = [r["figures"]["decode"]["TP"] for r in rows]
    assert tp[1] < tp[0] and tp[3] < tp[2]
    text = ndp_schedule.format_table(rows)
    assert "paper 2.41x average" in text and "decode   TP          " in text


def test_schedule_cli(tmp_path):
    from flows.cli import main
    assert main(["schedule", "--dimms", "4", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "ndp_schedule.png").stat().st_size > 10000
    assert main(["schedule", "--dimms", "0,4"]) == 2
    assert main(["schedule", "--skew", "9"]) == 2


@pytest.mark.parametrize("name, params", [
    ("ndp_core", {"mults": 8, "max_cols": 64, "max_inter": 32, "max_tokens": 2}),
    ("ndp_system", {"dimms": 2, "mults": 4, "max_cols": 8, "max_inter": 4, "max_tokens": 2})])
def test_synthesizes(tmp_path, name, params):
    """Yosys generic synthesis (small buffers: they become flip-flops there)."""
    from flows.synth import synthesize
    from hw.registry import get_block
    block = get_block(name)
    report = synthesize(block, block.config(**params), "generic", tmp_path)
    assert report["flip_flops"] > 0 and report["luts"] > 0
