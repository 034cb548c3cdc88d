"""spiking_expert: golden model, config validation and cocotb on both simulators."""

import pytest

from conftest import SIMULATORS, config_id, run_block, two_d_params
from golden import spiking_expert as golden
from hw.params import ParamError
from hw.spiking_expert import SpikingExpertConfig

COCOTB_TESTS = 10

SIM_CONFIGS = [
    {"rows": 8, "cols": 16},                                   # the make demo configuration
    {"rows": 3, "cols": 4, "max_tokens": 4},                   # odd rows, tokens across tiles
    {"rows": 1, "cols": 1, "max_tokens": 3},                   # one PE
    # 8-bit integrations that wrap, 6-bit V that saturates, 3-bit weights.
    {"rows": 5, "cols": 7, "w_width": 3, "acc_width": 8, "v_width": 6, "max_tokens": 5},
]


def test_integration_wraps_and_lif_runs_over_timesteps():
    weights = [[100, 100, 100]]                                # 300 wraps to 44 in 8 bits
    assert golden.expert_reference(weights, [[[1, 1, 1]]], 43, 0, 8, 16) == [[[1]]]
    assert golden.expert_reference(weights, [[[1, 1, 1]]], 44, 0, 8, 16) == [[[0]]]
    # Two timesteps of 5 against Vth 8: V = 5 (no spike), then 10 (spike).
    assert golden.expert_reference([[5]], [[[1], [1]]], 8, 0, 16, 16) == [[[0], [1]]]
    # Each token starts from V = 0.
    assert golden.expert_reference([[5]], [[[1]], [[1]]], 4, 0, 16, 16) == [[[1]], [[1]]]


def test_tile_order_of_the_streams():
    weights = [[1, 2], [3, 4], [5, 6]]                         # D_out 3, D_in 2
    spikes = [[[1, 0], [0, 1]], [[1, 1], [0, 0]]]              # 2 tokens x 2 timesteps
    beats = golden.expert_input_beats(weights, spikes, 2, 3, pad=lambda: 9)
    # Row tile 0 (neurons 0, 1), column tiles of 3 pairs then 1 pair (+ 2 padding bits).
    assert beats[:2] == [([1, 3], 0b101), ([2, 4], 0b110)]
    assert beats[2:4] == [([1, 3], 0b110), ([2, 4], 0b110)]
    assert beats[4][0] == [5, 9] and len(beats) == 8
    order = golden.expert_output_order([[[1, 0, 1], [0, 0, 0]]], 3, 2)
    assert order == [(1, 0, 0, 0, 0), (0, 0, 1, 0, 0), (1, 0, 0, 1, 0), (0, 0, 1, 1, 1)]


@pytest.mark.parametrize("kwargs, message", [
    ({"rows": 33}, "parameter 'rows': got 33; allowed: an integer in 1..32"),
    ({"cols": 0}, "parameter 'cols': got 0; allowed: an integer in 1..128"),
    ({"max_tokens": 257}, "parameter 'max_tokens': got 257; allowed: an integer in 1..256"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        SpikingExpertConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
# One PE in `make sweep` only (make test's time budget, 2026-11-30; a range end, with the others
# in tests/test_ranges.py): spiking_moe's one-PE expert runs in make test.
@pytest.mark.parametrize("params", two_d_params(SIM_CONFIGS, 3, sweep=(2,)))
def test_cocotb(params, simulator):
    assert run_block("spiking_expert", params, simulator).tests == COCOTB_TESTS


def test_synthesizes(tmp_path):
    # Regression: over-wide pair counters left constant bits Yosys refused ("conflicting init").
    from flows.synth import synthesize
    from hw.registry import get_block
    block = get_block("spiking_expert")
    report = synthesize(block, block.config(**SIM_CONFIGS[1]), "generic", tmp_path)
    assert report["flip_flops"] > 0 and report["luts"] > 0


# The defaults (16 x 16, 256 PEs): a slower Verilator build, so in make sweep.
SWEEP_CONFIGS = [{}]


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_CONFIGS, ids=[config_id(p) for p in SWEEP_CONFIGS])
def test_cocotb_sweep(params, simulator):
    assert run_block("spiking_expert", params, simulator).tests == COCOTB_TESTS


# --- two-tier 3D build (flows/threed.py) --------------------------------------------------------

SIM_CONFIGS_3D = [SIM_CONFIGS[3]]                      # odd sizes, narrow widths


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SIM_CONFIGS_3D, ids=[config_id(p) for p in SIM_CONFIGS_3D])
def test_cocotb_3d_in_lockstep_with_2d(params, simulator):
    # BLOCK_equiv: every test passes on the 2D outputs and `mismatch` never rises.
    assert run_block("spiking_expert", params, simulator, three_d=True).tests == COCOTB_TESTS


def test_3d_files_connect_the_tiers_only_through_bonds(tmp_path):
    import re
    from flows.threed import generate_3d
    from hw.registry import get_block
    block = get_block("spiking_expert")
    config = block.config(**SIM_CONFIGS[3])
    built = generate_3d(block, config, tmp_path)
    want = golden.bond_count(config.rows, config.cols, config.w_width, config.acc_width)
    assert built["bond_counts"] == want
    text = built["paths"]["3d"].read_text()
    bonds = re.findall(r"^\s*moegen_bond (\S+)\(\.a\((\w)_\w+\[\d+\]\), \.y\((\w)_", text, re.M)
    assert len(bonds) == want["down"] + want["up"] == len(built["bonds"])
    assert sum(1 for _, a, y in bonds if (a, y) == ("t", "b")) == want["down"]
    assert sum(1 for _, a, y in bonds if (a, y) == ("b", "t")) == want["up"]
    top_line = next(line for line in text.splitlines() if " u_top(" in line)
    bottom_line = next(line for line in text.splitlines() if " u_bottom(" in line)
    assert "(b_" not in top_line and "(t_" not in bottom_line
    assert re.findall(r"\.\w+\((\w+)\)", bottom_line) == \
        [f"b_{name}" for name, _, _ in built["nets"]]          # the bottom sees only bonds
    partition = built["paths"]["partition"].read_text().splitlines()
    assert partition[:2] == ["u_top 0", "u_bottom 1"]
    assert sorted(partition[2:]) == sorted(f"{b} 0" for b in built["bonds"])


def test_3d_synthesis_reports_tiers(tmp_path):
    from flows.threed import synthesize_3d
    from hw.registry import get_block
    block = get_block("spiking_expert")
    report = synthesize_3d(block, block.config(**SIM_CONFIGS[1]), "generic", tmp_path)
    assert report["top"]["cells"] > 0 and report["bottom"]["cells"] > 0
    assert report["footprint_3d"] == max(report["top"]["cells"], report["bottom"]["cells"])
    assert report["footprint_3d"] < report["footprint_2d"]


def test_3d_cli_refuses_blocks_without_tiers():
    from flows.cli import main
    assert main(["verilog", "lif", "--3d"]) == 2
    assert main(["synth", "ndp_core", "--3d"]) == 2
