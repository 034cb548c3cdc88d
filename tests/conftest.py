"""Shared pytest fixtures and helpers: run a block's cocotb suite on a simulator."""

import pytest

from flows.sim import run_tests
from hw.params import format_value
from hw.registry import get_block

SIMULATORS = ("icarus", "verilator")


def pytest_configure(config):
    config.addinivalue_line("markers", "sweep: long sweeps, run by `make sweep` only")


def run_block(block_name, params, simulator, **kwargs):
    """Run every cocotb test of ``block_name`` with ``params`` on ``simulator``; return result."""
    block = get_block(block_name)
    result = run_tests(block, block.config(**params), simulator, **kwargs)
    assert result.failed == 0 and result.tests > 0
    return result


def config_id(params):
    return "-".join(f"{k}{format_value(v)}" for k, v in params.items()) or "defaults"


def two_d_params(configs, lockstep):
    """``configs`` as the parameters of a block's 2D cocotb run, ``configs[lockstep]`` marked
    ``sweep``: its 3D lockstep test (``BLOCK_equiv``) runs that configuration's whole suite on
    the 2D build's outputs, so `make test` runs it there only."""
    return [pytest.param(params, id=config_id(params),
                         marks=[pytest.mark.sweep] if index == lockstep else [])
            for index, params in enumerate(configs)]


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
