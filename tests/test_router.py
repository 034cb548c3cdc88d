"""topk_router: config validation and cocotb on both simulators (golden rule tests are in
tests/test_nop.py next to the placement flow that uses them)."""

import pytest

from conftest import SIMULATORS, config_id, run_block, sweep_params
from golden import router as golden
from hw.params import ParamError
from hw.registry import get_block
from hw.router import RouterConfig

SIM_CONFIGS = [
    # Default: 32 experts in 4 groups, 2 groups kept, top-4, 16 leaves (DeepSeek-V3 style).
    {},
    # No group limit, odd sizes, 3-bit scores (ties everywhere), k = E.
    {"experts": 6, "k": 6, "score_width": 3, "groups": 1, "topk_groups": 1, "leaves": 3},
    # Three groups of 4, two kept, top-3 of 12, 4-bit scores (group ties too).
    {"experts": 12, "k": 3, "score_width": 4, "groups": 3, "topk_groups": 2, "leaves": 4},
    # Groups of one expert: the group score is the expert's score.
    {"experts": 16, "k": 2, "score_width": 5, "groups": 16, "topk_groups": 2, "leaves": 5},
    # Serial: groups of 6 scanned 4 lanes a beat (a beat of 4, then of 2), scan-bound (B=8, C=5).
    {"experts": 24, "k": 3, "score_width": 4, "groups": 4, "topk_groups": 2, "leaves": 5,
     "scan_lanes": 4},
    # Serial without a group limit, 7 experts 3 a beat, selection-bound (B=3 < C=6), ties.
    {"experts": 7, "k": 6, "score_width": 3, "groups": 1, "topk_groups": 1, "leaves": 3,
     "scan_lanes": 3},
]


def test_latency_counts_the_stages():
    # Ranks, not one pick per stage: neither k nor M adds a stage.
    assert golden.pipeline_latency(8, 8, 4) == golden.pipeline_latency(1, 2, 1) == 10
    assert golden.pipeline_latency(2, 1, 1) == golden.pipeline_latency(8, 1, 1) == 6


def test_serial_timing_follows_the_recurrence():
    # DeepSeek-V3: 8 groups of 32 scanned 32 a beat: B = 8, C = 4 + 8 = 12.
    assert golden.scan_beats(256, 32, 8) == 8 and golden.select_cycles(8, 8, 4) == 12
    assert golden.scan_latency(256, 32, 8, 8, 4) == 21
    taken, routed = golden.scan_edges(4, 256, 32, 8, 8, 4)
    assert taken == [0, 8, 20, 32] and routed == [21, 33, 45, 57]
    # Scan-bound: 24 experts in groups of 6, 4 lanes: beats of 4 and 2, B = 8 > C = 5.
    assert golden.scan_interval(24, 4, 3, 4, 2) == 8
    assert golden.scan_edges(3, 24, 4, 3, 4, 2) == ([0, 8, 16], [14, 22, 30])


def test_single_expert_groups_rank_by_score():
    scores = [3, 9, 9, 4]
    assert golden.group_scores(scores, 4) == [3, 9, 9, 4]
    assert golden.route(scores, 2, groups=4, topk_groups=2) == ([1, 2], [9, 9])


def test_scores_for_trace_reproduce_the_trace():
    trace = golden.synthetic_trace(20, 16, 3, 4, seed=2)
    for row, scores in zip(trace, golden.scores_for_trace(trace, 16, 8, seed=1)):
        assert golden.route(scores, 3)[0] == list(row)


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": 65}, "parameter 'experts': got 65; allowed: an integer in 2..64 with "
     "scan_lanes=0 (up to 256 with scan_lanes >= 1)"),
    ({"experts": 257, "scan_lanes": 8},
     "parameter 'experts': got 257; allowed: an integer in 2..256"),
    ({"scan_lanes": 9}, "parameter 'scan_lanes': got 9; allowed: an integer in 0..experts/groups "
     "(8)"),
    ({"k": 9}, "parameter 'k': got 9; allowed: an integer in 1..8"),
    ({"experts": 4, "k": 5, "groups": 1, "topk_groups": 1},
     "parameter 'k': got 5; allowed: an integer in 1..experts (4)"),
    ({"groups": 7}, "parameter 'groups': got 7; allowed: a divisor of experts (32)"),
    ({"topk_groups": 5}, "parameter 'topk_groups': got 5; allowed: an integer in 1..groups (4)"),
    # One kept group of 2 experts cannot supply 4.
    ({"groups": 16, "topk_groups": 1},
     "parameter 'k': got 4; allowed: an integer in 1..topk_groups*experts/groups (2)"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        RouterConfig(**kwargs)
    assert str(info.value) == message


# The largest parallel router: its Verilator build alone takes about 8 minutes on 2 cores. Paper
# scale, serial: 128 experts, top 8, no group limit.
# Paper scale, serial: DeepSeek-V3's routing (256 experts, top 8 within at most 4 of 8
# groups), 32 scores a beat (moved here for make test's time budget, 2026-11-30: about 65 s
# of it; make test's serial configurations scan 4 and 3 lanes a beat, scan-bound and
# selection-bound, with and without a group limit).
SWEEP_CONFIGS = [{"experts": 64, "k": 8, "groups": 8, "topk_groups": 4},
                 {"experts": 128, "k": 8, "groups": 1, "topk_groups": 1, "scan_lanes": 16},
                 {"experts": 256, "k": 8, "groups": 8, "topk_groups": 4, "scan_lanes": 32}]


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_CONFIGS, ids=[config_id(p) for p in SWEEP_CONFIGS])
def test_cocotb_sweep(params, simulator):
    assert run_block("topk_router", params, simulator).tests == 10


# Three groups of 4 in `make sweep` only (make test's time budget, 2026-11-30): the defaults
# keep 2 of 4 groups (top-4) and the serial router 2 of 4 (top-3).
ROUTER_SWEEP = (2,)


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", sweep_params(SIM_CONFIGS, ROUTER_SWEEP))
def test_cocotb(params, simulator):
    assert run_block("topk_router", params, simulator).tests == 10


def test_default_router_synthesizes(tmp_path):
    # Regression: an Array-indexed table read made Yosys 0.70's ABC9 exit without a message.
    from flows.synth import synthesize
    block = get_block("topk_router")
    report = synthesize(block, block.config(), "generic", tmp_path)
    assert report["flip_flops"] > 0 and report["luts"] > 0
