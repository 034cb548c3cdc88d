"""The one place blocks register themselves.

A block family module in ``hw/`` calls :func:`register` once per block. The CLI, the flows, the
benchmarks and the test runner find blocks here and nowhere else.
"""

import dataclasses
import importlib
from typing import Callable

__all__ = ["Block", "register", "get_block", "all_blocks", "UnknownBlock"]

# Families are imported lazily so that `import hw.registry` stays cheap; adding a family means
# adding its module name here and calling `register` inside it.
FAMILIES = ("systolic", "pmu", "nop", "router", "ndp", "spiking", "spiking_expert",
            "spiking_router", "spiking_moe", "spiking_attention")

_BLOCKS = {}


class UnknownBlock(ValueError):
    """The block name is not registered."""


@dataclasses.dataclass(frozen=True)
class Block:
    """A registered block.

    Parameters
    ----------
    name : str
        Block name, also the Verilog top module name.
    family : str
        Family module name: ``hw/<family>.py``, ``golden/<family>.py``, ``tb/test_<family>.py``.
    config : type
        Frozen config dataclass (see :mod:`hw.params`).
    build : callable
        ``build(config) -> amaranth.lib.wiring.Component``.
    figures : callable
        ``figures(config) -> dict`` of golden cycle-model figures for the manifest.
    summary : str
        One line for ``moegen list``.
    demo_configs : tuple of dict
        Parameter sets ``make demo`` and ``make bench`` use.
    area_unit : str
        What ``make bench`` divides the cell count by ("PE", "bank", ...).
    area_units : callable
        ``area_units(config) -> int``, how many of them the configuration has.
    tiers : callable, optional
        ``tiers(config) -> (top component, bottom component)`` for the two-tier 3D build
        (:mod:`flows.threed`); None when the block has no tier partition.
    demo_report : callable, optional
        ``demo_report(measured) -> str``, printed after the ``make demo`` table (a family's
        model results, e.g. the NDP schedule table); ``measured`` is what the first demo
        configuration's ``test_throughput`` wrote (None if it did not run).
    synth_flatten : bool
        Flatten before the generic synthesis (the default). False maps each module on its
        own: Yosys 0.70's ABC (yowasp) exits without a word on flattened netlists holding several
        spike-gated arrays (spiking_moe, spiking_attention); the cells are then counted over
        the hierarchy.
    """
    name: str
    family: str
    config: type
    build: Callable
    figures: Callable
    summary: str
    demo_configs: tuple = ({},)
    area_unit: str = "block"
    area_units: Callable = lambda config: 1
    tiers: Callable = None
    demo_report: Callable = None
    synth_flatten: bool = True

    @property
    def tb_module(self):
        return f"tb.test_{self.family}"


def register(block):
    """Register ``block``; a name may be registered once."""
    if block.name in _BLOCKS:
        raise RuntimeError(f"block {block.name!r} registered twice")
    _BLOCKS[block.name] = block
    return block


def _load_all():
    for family in FAMILIES:
        importlib.import_module(f"hw.{family}")


def all_blocks():
    """Every registered block, in registration order."""
    _load_all()
    return list(_BLOCKS.values())


def get_block(name):
    """The block called ``name``; raises :class:`UnknownBlock` with the allowed names."""
    _load_all()
    try:
        return _BLOCKS[name]
    except KeyError:
        raise UnknownBlock(f"block {name!r}: unknown; allowed: {', '.join(_BLOCKS)}") from None
