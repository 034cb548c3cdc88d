"""spiking_moe: golden model, config validation and cocotb on both simulators (2D, 3D)."""

import pytest

from conftest import SIMULATORS, config_id, run_block, two_d_params
from golden import spiking_moe as golden
from hw.params import ParamError
from hw.spiking_moe import SpikingMoeConfig

COCOTB_TESTS = 12

SIM_CONFIGS = [
    {},                                                         # the make demo configuration
    # Odd sizes: 3 experts of 3 x 5, 5 tokens x 3 timesteps, D_in 6, D_out 7 (3 row tiles).
    {"experts": 3, "rows": 3, "cols": 5, "max_tokens": 5, "max_timesteps": 3, "max_d_in": 6,
     "max_d_out": 7},
    # One expert of one PE; 3-bit weights, the narrowest integrations and scores (4 bits:
    # they wrap), saturating 5-bit V.
    {"experts": 1, "rows": 1, "cols": 1, "max_tokens": 3, "max_timesteps": 2, "max_d_in": 3,
     "max_d_out": 2, "w_width": 3, "acc_width": 4, "v_width": 5},
    # Far more columns than pairs: a core drains up to C padding columns after its last row,
    # longer than the next small layer takes to reach the cores' commands.
    {"experts": 2, "rows": 2, "cols": 40, "max_tokens": 2, "max_timesteps": 2, "max_d_in": 2,
     "max_d_out": 3},
]


def test_alg1_routes_computes_and_merges():
    spikes = [[[1, 0]], [[0, 1]]]                               # 2 tokens, T 1, D_in 2
    routing = [[[5, 1], [1, 5]]]                                # token 0 -> expert 0, 1 -> 1
    experts = [[[3, 0]], [[0, 4]]]                              # D_out 1: expert e sees d = e
    masks, outputs = golden.moe_reference(spikes, routing, experts, 1, 2, 0, 16, 16)
    assert masks == [0b01, 0b10] and outputs == [[[1]], [[1]]]
    # K = 2: both experts per token; token 0 fires through expert 0 only -> OR = 1.
    masks, outputs = golden.moe_reference(spikes, routing, experts, 2, 3, 0, 16, 16)
    assert masks == [0b11, 0b11] and outputs == [[[0]], [[1]]]
    assert golden.routing_histogram([0b01, 0b11, 0b10], 2) == [2, 2]


def test_input_formats():
    spikes = [[[1, 0], [0, 1]], [[1, 1], [0, 0]]]               # N 2, T 2, D_in 2
    act, wr, w = golden.moe_input_beats(spikes, [[[1], [2]], [[3], [4]]], [[[7, 8]] * 3], 2, 4,
                                        pad=lambda: 0)
    assert act == [0b10001, 0b10010]                            # bit n * 4 + t of word d
    assert wr == [[1], [2], [3], [4]]
    assert w == [[7, 7], [8, 8], [7, 0], [8, 0]]                # 2 row tiles of D_out 3


def test_cycle_model_phases():
    model = golden.moe_cycles(4, 3, 2, 1, [2, 0], 3, 2)
    assert model["act_last"] == 4 and model["route_beats"] == (6, 9)
    assert model["routes"] == [9 + 6, 9 + 7]                    # route_latency(E = 2) = 6
    assert model["issue"] == 18 and len(model["outputs"]) == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": 9}, "parameter 'experts': got 9; allowed: an integer in 1..8"),
    ({"max_tokens": 0}, "parameter 'max_tokens': got 0; allowed: an integer in 1..32"),
    ({"max_d_out": 512, "rows": 1, "max_tokens": 32, "max_timesteps": 16},
     "parameter 'max_d_out': got 512; allowed: an output buffer of at most 16384 bits "
     "(ceil(max_d_out / rows) x max_tokens x max_timesteps x rows = 262144)"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        SpikingMoeConfig(**kwargs)
    assert str(info.value) == message


# The defaults in `make sweep` only (make test's time budget, 2026-11-30: about 90 s, most of
# it the largest Verilator build in make test); `make demo` runs them, and make test runs their
# parts at these sizes or larger (spiking_expert's 8 x 16 array, spiking_router's 16 columns
# of 8 experts).
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", two_d_params(SIM_CONFIGS, 1, sweep=(0,)))
def test_cocotb(params, simulator):
    assert run_block("spiking_moe", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_cocotb_3d_in_lockstep_with_2d(simulator):
    # BLOCK_equiv: every test passes on the 2D outputs and `mismatch` never rises.
    assert run_block("spiking_moe", SIM_CONFIGS[1], simulator, three_d=True).tests == \
        COCOTB_TESTS


def test_3d_bonds_and_synthesis(tmp_path):
    from flows.threed import synthesize_3d
    from hw.registry import get_block
    block = get_block("spiking_moe")
    config = block.config(**SIM_CONFIGS[2])           # the smallest: a flat MoE is slow in Yosys
    report = synthesize_3d(block, config, "generic", tmp_path)
    assert report["bonds"] == golden.moe_bond_count(
        config.experts, config.rows, config.cols, config.max_tokens, config.w_width,
        config.acc_width)
    assert 0 < report["footprint_3d"] < report["footprint_2d"]
