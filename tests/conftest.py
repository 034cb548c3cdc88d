"""Shared pytest fixtures and helpers: run a block's cocotb suite on a simulator."""

import pytest

from flows.sim import run_tests
from hw.params import format_value
from hw.registry import get_block

SIMULATORS = ("icarus", "verilator")


def pytest_configure(config):
    config.addinivalue_line("markers", "sweep: long sweeps, run by `make sweep` only")


# The longest tests of `make test` (a minute or two each: the largest blocks on Icarus, their
# Verilator builds, the layer's formal cover), run first: pytest-xdist's worksteal gives each
# worker half the list in order and lets an idle one take from the other's end, so a long test
# collected last would leave one core idle while it runs (about a minute of 20 before this).
LONGEST_FIRST = (
    "tests/test_moe_layer.py::test_layer_cocotb",
    "tests/test_moe_layer.py::test_layer_3d_in_lockstep_with_2d",
    "tests/test_formal.py::test_every_block_keeps_its_rules_and_transfers_on_every_output",
    "tests/test_systolic.py::test_cocotb",
    "tests/test_moe_layer.py::test_chiplet_cocotb",
    "tests/test_mutate.py::test_mutants_are_killed_by_the_suite_or_proven_equivalent",
    "tests/test_ndp.py::test_system_cocotb",
    "tests/test_fp.py::test_cocotb",
    "tests/test_dsp_pack.py",
    "tests/test_router.py::test_default_router_synthesizes",
)


def pytest_collection_modifyitems(config, items):
    """``LONGEST_FIRST``'s tests ahead of the rest, in that order; the rest as collected (a
    stable sort: every worker collects the same order, as pytest-xdist requires)."""
    def rank(item):
        return next((index for index, prefix in enumerate(LONGEST_FIRST)
                     if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))
    items.sort(key=rank)


def run_block(block_name, params, simulator, **kwargs):
    """Run every cocotb test of ``block_name`` with ``params`` on ``simulator``; return result."""
    block = get_block(block_name)
    result = run_tests(block, block.config(**params), simulator, **kwargs)
    assert result.failed == 0 and result.tests > 0
    return result


def config_id(params):
    return "-".join(f"{k}{format_value(v)}" for k, v in params.items()) or "defaults"


def sweep_params(configs, sweep):
    """``configs`` as pytest parameters, those at the indices in ``sweep`` marked ``sweep``
    (run by `make sweep` only: each is there for a reason given where ``configs`` is defined,
    and what it covers is named there)."""
    return [pytest.param(params, id=config_id(params),
                         marks=[pytest.mark.sweep] if index in sweep else [])
            for index, params in enumerate(configs)]


def two_d_params(configs, lockstep, sweep=()):
    """``configs`` as the parameters of a block's 2D cocotb run, ``configs[lockstep]`` marked
    ``sweep``: its 3D lockstep test (``BLOCK_equiv``) runs that configuration's whole suite on
    the 2D build's outputs, so `make test` runs it there only (and those in ``sweep``)."""
    return sweep_params(configs, {lockstep, *sweep})


@pytest.fixture(params=SIMULATORS)
def simulator(request):
    return request.param


def on_off_pattern(rng, kind, length, high=0.6):
    """Per cycle, whether a valid (or a ready) is high: ``none`` (always), ``random`` (each
    cycle with probability ``high``), or ``bursts`` (runs of 10 to 80 cycles, each run high
    with probability ``high``): the stall profiles of the hw.pipeline unit tests."""
    if kind == "none":
        return [True] * length
    if kind == "random":
        return [rng.random() < high for _ in range(length)]
    out = []
    while len(out) < length:
        out += [rng.random() < high] * rng.randint(10, 80)
    return out[:length]


def side_by_side(**components):
    """A module holding ``components`` (submodule name -> component) under one shared reset:
    a block and another build of it, driven alike by a test that compares them cycle by
    cycle. Returns ``(module, reset)``."""
    from amaranth.hdl import Module, ResetInserter, Signal
    m, reset = Module(), Signal()
    for name, component in components.items():
        m.submodules[name] = ResetInserter(reset)(component)
    return m, reset


def run_amaranth(top, testbench):
    """Run ``testbench`` (an async function of the context) on ``top`` in Amaranth's own
    simulator, with a clock: the unit tests of hw.pipeline's small components."""
    from amaranth.sim import Simulator
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
