"""lif: golden rule, config validation and cocotb on both simulators."""

import json

import pytest

from conftest import SIMULATORS, config_id, run_block, sweep_params
from golden import spiking as golden
from hw.params import ParamError
from hw.spiking import LifConfig
from tb.harness import THROUGHPUT_FILE, TIMED_CYCLES

COCOTB_TESTS = 8

SIM_CONFIGS = [
    {},                                                   # 16 neurons, 16-bit X and V
    {"neurons": 3, "x_width": 6, "v_width": 5},           # X wider than V: saturation every step
    {"neurons": 1, "x_width": 2, "v_width": 2},           # the smallest neuron
    {"neurons": 37, "x_width": 16, "v_width": 24},        # odd N, 24-bit V
]
# The smallest neuron in `make sweep` only (make test's time budget, 2026-11-30; with every
# other range end in tests/test_ranges.py): the 3-neuron one saturates at every step too.
LIF_SWEEP = (2,)


def test_order_leak_integrate_compare_reset():
    # V = 5, X = 4, leak 2 -> 7 > Vth 6: spike, V = 0.
    assert golden.lif_step([5], [4], 6, 2, 8) == ([0], [1])
    # Exactly at the threshold: no spike, V kept.
    assert golden.lif_step([5], [3], 6, 2, 8) == ([6], [0])
    # Leak below zero and saturation at the bottom of 4 bits.
    assert golden.lif_step([-7], [-1], 7, 3, 4) == ([-8], [0])
    # Saturation at the top, and a threshold the top cannot exceed.
    assert golden.lif_step([7], [7], 7, 0, 4) == ([7], [0])


def test_run_clears_after_last():
    out = golden.lif_run([([3], 1, 10, 0), ([3], 0, 10, 0), ([3], 0, 10, 0)], 8, 1)
    assert [o[1] for o in out] == [[3], [3], [6]]


@pytest.mark.parametrize("kwargs, message", [
    ({"neurons": 0}, "parameter 'neurons': got 0; allowed: an integer in 1..128"),
    ({"v_width": 41}, "parameter 'v_width': got 41; allowed: an integer in 2..40"),
    ({"x_width": 1}, "parameter 'x_width': got 1; allowed: an integer in 2..32"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ParamError) as info:
        LifConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", sweep_params(SIM_CONFIGS, LIF_SWEEP))
def test_cocotb(params, simulator):
    assert run_block("lif", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_a_reported_speed_is_timed_over_10k_cycles(simulator):
    """A run that gives a speed figure (`make bench`: measure, optimized build) repeats
    test_throughput, each run from its reset and with its assertions, until 10,000 simulated
    cycles have passed (tb.harness.long_enough_to_time); `make test` runs it once, and so does
    a measuring run that reports no speed (the demo; `make bench`'s traced activity run, whose
    operations must be one run's)."""
    reports = {}
    for kind, kwargs in (("check", {}), ("timed", {"measure": True, "optimize": True}),
                         ("traced", {"measure": True, "waves": True})):
        result = run_block("lif", {}, simulator, testcase=["test_throughput"], quiet=True,
                           **kwargs)
        reports[kind] = json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())
    once, timed = reports["check"], reports["timed"]
    assert "timed_runs" not in once and "timed_runs" not in reports["traced"]
    assert reports["traced"]["operations"] == once["operations"]
    runs = timed["timed_runs"]
    # The runs are alike (64 steps after a reset): the last one is the first past 10k cycles.
    cycles = timed["simulated_cycles"]
    assert runs > 1 and cycles * (runs - 1) / runs < TIMED_CYCLES <= cycles, (runs, cycles)
    assert timed["operations"] == runs * once["operations"]
    assert timed["metrics"] == once["metrics"]
    assert timed["sim_cycles_per_second"] > 0


def test_synthesizes(tmp_path):
    from flows.synth import synthesize
    from hw.registry import get_block
    block = get_block("lif")
    report = synthesize(block, block.config(**SIM_CONFIGS[1]), "generic", tmp_path)
    assert report["flip_flops"] > 0 and report["luts"] > 0
