"""The one place blocks register themselves.

A block family module ``hw/<family>.py`` calls :func:`register` once per block. Families are
found by discovery: every module of the ``hw`` package is imported on first use, and those that
register blocks are the families (helper modules such as :mod:`hw.pipeline` register none). The
CLI, the flows, the benchmarks and the test runner find blocks here and nowhere else, so adding a
family touches only its own files (``hw``, ``golden``, ``tb``, ``tests``, ``docs/blocks``).
"""

import dataclasses
import importlib
import pkgutil
from typing import Callable

__all__ = ["Block", "register", "get_block", "all_blocks", "families", "UnknownBlock"]

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
    operation : str
        The unit of work ``make bench``'s switching activity is counted per ("MAC", "flit",
        "synaptic op"...); the block's ``test_throughput`` reports how many it performs.
    legend : str
        What the figures its ``test_throughput`` measures mean (printed under the demo table).
    tiers : callable, optional
        ``tiers(config) -> (top component, bottom component)`` for the two-tier 3D build
        (:mod:`flows.threed`); None when the block has no tier partition.
    tier_contents : tuple of str, optional
        What the top and the bottom tier hold, for the 3D reports.
    synth_abc : bool or callable
        Map the generic synthesis' logic to LUTs with ABC (the default). False maps gate by
        gate (``-noabc``): Yosys 0.70's ABC9 (yowasp) exits without a word on expert_chiplet's
        netlist, or takes minutes; the LUT count is then an unoptimized upper bound. On ECP5
        (which must map with ABC9) False skips ABC9's proof of its own mapping. A callable
        ``synth_abc(config) -> bool`` decides per configuration (:meth:`abc`).
    tb : str
        The cocotb module's name after ``tb/test_`` when a family holds blocks with different
        tests (default: the family's): ``tb/test_<family>_<what>.py``.
    synth_flatten : bool or callable
        Flatten before the generic synthesis (the default). False maps each module on its
        own, once however many instances it has: Yosys 0.70's ABC (yowasp) exits without a word
        on flattened netlists holding several spike-gated arrays (spiking_moe,
        spiking_attention), and moe_layer's flattened gate-level netlist (its leaves' chiplets
        repeated) outgrows the machine's memory at its larger sizes; the cells are then counted
        over the hierarchy, each module once per instance. A callable
        ``synth_flatten(config) -> bool`` decides per configuration (:meth:`flatten`).
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
    operation: str = "operation"
    legend: str = ""
    tiers: Callable = None
    tier_contents: tuple = ("", "")
    synth_flatten: object = True
    synth_abc: object = True
    tb: str = ""

    def flatten(self, config):
        """Whether the generic synthesis of ``config`` flattens first (``synth_flatten``)."""
        return self.synth_flatten(config) if callable(self.synth_flatten) else self.synth_flatten

    def abc(self, config):
        """Whether the generic synthesis of ``config`` maps with ABC (``synth_abc``)."""
        return self.synth_abc(config) if callable(self.synth_abc) else self.synth_abc

    @property
    def tb_module(self):
        return f"tb.test_{self.tb or self.family}"


def register(block):
    """Register ``block``; a name may be registered once."""
    if block.name in _BLOCKS:
        raise RuntimeError(f"block {block.name!r} registered twice")
    _BLOCKS[block.name] = block
    return block


_loaded = False


def _load_all():
    global _loaded
    if _loaded:
        return
    import hw
    for module in pkgutil.iter_modules(hw.__path__):
        if module.name != "registry":
            importlib.import_module(f"hw.{module.name}")
    _loaded = True


def families():
    """Names of the families (``hw`` modules that register blocks), in module-name order."""
    return list(dict.fromkeys(block.family for block in all_blocks()))


def all_blocks():
    """Every registered block: families by module name, blocks of a family in the order they
    register (the same order in every process, whatever was imported first)."""
    _load_all()
    order = list(_BLOCKS)
    return sorted(_BLOCKS.values(), key=lambda block: (block.family, order.index(block.name)))


def get_block(name):
    """The block called ``name``; raises :class:`UnknownBlock` with the allowed names."""
    _load_all()
    try:
        return _BLOCKS[name]
    except KeyError:
        raise UnknownBlock(f"block {name!r}: unknown; allowed: "
                           f"{', '.join(block.name for block in all_blocks())}") from None
