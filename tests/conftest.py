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


@pytest.fixture(params=SIMULATORS)
def simulator(request):
    return request.param
