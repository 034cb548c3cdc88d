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
