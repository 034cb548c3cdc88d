"""spiking_attention: golden model, config validation and cocotb on both simulators (2D, 3D)."""

import pytest

from conftest import SIMULATORS, config_id, run_block, two_d_params
from golden import spiking_attention as golden
from hw.params import ParamError
from hw.spiking_attention import SpikingAttentionConfig

COCOTB_TESTS = 11

SIM_CONFIGS = [
    {"heads": 2, "max_tokens": 8, "max_head_dim": 8},          # the make demo configuration
    {"heads": 3, "max_tokens": 5, "max_head_dim": 3},          # odd sizes
    # Heads wider than the tokens (the score tiles held d apart), a 5-bit V that saturates.
    {"heads": 2, "max_tokens": 3, "max_head_dim": 7, "v_width": 5},
    # Tiles one cycle apart: a potential is read the cycle after its write, from the write
    # register (hw.spiking_attention's forwarding, only built here).
    {"heads": 1, "max_tokens": 1, "max_head_dim": 1},
]


def test_alg2_scores_products_and_lif():
    # One head, 2 tokens, d 2, 1 timestep. Q = K = [[1, 1], [1, 0]]: A = [[2, 1], [1, 1]].
    q = k = [[[[1, 1]], [[1, 0]]]]
    v = [[[[1, 0]], [[1, 1]]]]                                 # Y = A V = [[3, 1], [2, 1]]
    assert golden.attention_reference(q, k, v, 1, 0, 16) == [[[1, 0], [1, 0]]]
    assert golden.attention_reference(q, k, v, 2, 0, 16) == [[[1, 0], [0, 0]]]
    # Two timesteps accumulate: Y = 1 each step against Vth 1 -> spike at t = 1 only.
    q2 = k2 = [[[[1]]], [[[1]]]]
    assert golden.attention_reference(q2, k2, q2, 1, 0, 16) == [[[0]], [[1]]]
    # Heads concatenate: head 1 silent.
    qh = [[[[1], [0]]]]
    assert golden.attention_reference(qh, qh, qh, 0, 0, 16) == [[[1, 0]]]


def test_stream_formats_and_cycle_model():
    q = [[[[1, 0]], [[0, 1]]]]                                  # T 1, N 2, H 1, d 2
    qk, vb = golden.attention_input_beats(q, q, q, 4, 3)
    assert qk == [(0b01, 0b01), (0b10, 0b10)] and vb == [0b001, 0b010]
    order = golden.attention_output_order([[[1, 0], [1, 1]]], 1, 4)
    assert order == [(0b11, 0, 0, 0), (0b10, 0, 1, 1)]
    model = golden.attention_cycles(2, 2, 2, 4, 3)
    assert model["last_qk"] == [1, 5] and model["v_beats"][:2] == [6, 7]
    assert model["outputs"][:2] == [1 + 4 + 2 + 4 + 3, 1 + 4 + 2 + 4 + 3 + 1]


@pytest.mark.parametrize("kwargs, message", [
    ({"heads": 0}, "parameter 'heads': got 0; allowed: an integer in 1..8"),
    ({"max_head_dim": 65}, "parameter 'max_head_dim': got 65; allowed: an integer in 1..64"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        SpikingAttentionConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", two_d_params(SIM_CONFIGS, 1))
def test_cocotb(params, simulator):
    assert run_block("spiking_attention", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_cocotb_3d_in_lockstep_with_2d(simulator):
    # BLOCK_equiv: every test passes on the 2D outputs and `mismatch` never rises.
    assert run_block("spiking_attention", SIM_CONFIGS[1], simulator, three_d=True).tests == \
        COCOTB_TESTS


def test_3d_bonds_and_synthesis(tmp_path):
    from flows.threed import synthesize_3d
    from hw.registry import get_block
    block = get_block("spiking_attention")
    config = block.config(**SIM_CONFIGS[1])
    report = synthesize_3d(block, config, "generic", tmp_path)
    assert report["bonds"] == golden.attention_bond_count(
        config.heads, config.max_tokens, config.max_head_dim, config.score_width,
        config.product_width)
    assert 0 < report["footprint_3d"] < report["footprint_2d"]


# The defaults (4 heads of a 16 x 16 score array and a 16 x 16 A.V array): make sweep.
SWEEP_CONFIGS = [{}]


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_CONFIGS, ids=[config_id(p) for p in SWEEP_CONFIGS])
def test_cocotb_sweep(params, simulator):
    assert run_block("spiking_attention", params, simulator).tests == COCOTB_TESTS
