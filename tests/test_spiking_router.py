"""spiking_router: golden model, config validation and cocotb on both simulators (2D, 3D)."""

import pytest

from conftest import SIMULATORS, config_id, run_block, two_d_params
from golden import spiking_router as golden
from hw.params import ParamError
from hw.spiking_router import SpikingRouterConfig

COCOTB_TESTS = 9

SIM_CONFIGS = [
    {"experts": 8, "cols": 16, "max_tokens": 32},               # the make demo configuration
    {"experts": 3, "cols": 5, "max_tokens": 11},                # odd sizes, 3 column tiles
    # One column, 3-bit weights and 6-bit scores that wrap.
    {"experts": 2, "cols": 1, "w_width": 3, "acc_width": 6, "max_tokens": 3},
]


def test_scores_topk_and_merge():
    weights = [[[1, 2, 2], [0, 5, -1]], [[3, 0, 0], [1, 1, 1]]]    # T 2, D_in 2, E 3
    spikes = [[[1, 0], [0, 1]], [[1, 1], [1, 0]]]
    assert golden.router_scores(spikes, weights, 16) == [[2, 3, 3], [4, 7, 1]]
    assert golden.route_mask([2, 3, 3], 1) == 0b010                 # tie -> lower index
    assert golden.route_mask([2, 3, 3], 2) == 0b110
    assert golden.route_mask([0, 0, 0], 2) == 0b011
    assert golden.router_scores([[[1]]], [[[100]]], 6) == [[-28]]   # 100 wraps in 6 bits
    outputs = [[[1, 0]], [[0, 1]]]                                   # expert e's token-0 output
    assert golden.merge([outputs[0], outputs[1]], [0b01]) == [[1, 0]]
    assert golden.merge([outputs[0], outputs[1]], [0b11]) == [[1, 1]]


def test_input_order():
    weights = [[[1, 2]], [[3, 4]]]                                   # T 2, D_in 1, E 2
    spikes = [[[1], [0]], [[0], [1]], [[1], [1]]]                    # 3 tokens
    beats = golden.router_input_beats(weights, spikes, 2, pad=lambda: 1)
    assert beats == [([1, 2], 0b01), ([3, 4], 0b10), ([1, 2], 0b11), ([3, 4], 0b11)]


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": 17}, "parameter 'experts': got 17; allowed: an integer in 1..16"),
    ({"cols": 0}, "parameter 'cols': got 0; allowed: an integer in 1..64"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        SpikingRouterConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", two_d_params(SIM_CONFIGS, 1))
def test_cocotb(params, simulator):
    assert run_block("spiking_router", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_cocotb_3d_in_lockstep_with_2d(simulator):
    # BLOCK_equiv: every test passes on the 2D outputs and `mismatch` never rises.
    assert run_block("spiking_router", SIM_CONFIGS[1], simulator, three_d=True).tests == \
        COCOTB_TESTS


def test_3d_bonds_and_synthesis(tmp_path):
    from flows.threed import synthesize_3d
    from golden.spiking_expert import bond_count
    from hw.registry import get_block
    block = get_block("spiking_router")
    config = block.config(**SIM_CONFIGS[1])
    report = synthesize_3d(block, config, "generic", tmp_path)
    assert report["bonds"] == bond_count(config.experts, config.cols, config.w_width,
                                         config.acc_width)
    assert 0 < report["footprint_3d"] < report["footprint_2d"]
