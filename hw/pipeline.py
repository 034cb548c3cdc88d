"""Helpers shared by pipelined blocks: stall-able registers and lane layouts."""

import functools
import operator

from amaranth.hdl import Mux, Signal, signed
from amaranth.lib import data

__all__ = ["StallPipe", "lanes_layout", "saturate", "select"]


def lanes_layout(count, width, *, is_signed=True):
    """Stream payload of ``count`` lanes of ``width`` bits plus a ``last`` flag.

    Lane ``i`` occupies bits ``[i*width, (i+1)*width)``; ``last`` is the top bit.
    """
    shape = signed(width) if is_signed else width
    return data.StructLayout({"data": data.ArrayLayout(shape, count), "last": 1})


def saturate(value, width):
    """``value`` clamped to the signed ``width``-bit range (an expression)."""
    low, high = -(1 << (width - 1)), (1 << (width - 1)) - 1
    return Mux(value > high, high, Mux(value < low, low, value))


def select(index, values):
    """``values[index]`` as an OR of equality-gated terms (0 when ``index`` is out of range).

    Used instead of ``Array`` reads and ``word_select``/``bit_select`` with a variable index:
    the shifts those become made Yosys 0.70's ABC9 (yowasp) exit without a word.
    """
    return functools.reduce(operator.or_, (Mux(index == i, value, 0)
                                           for i, value in enumerate(values)))


class StallPipe:
    """Registers that all move on one enable (a global pipeline stall).

    A systolic array is a fixed-latency pipeline: its schedule is only correct if every stage
    moves together. Rather than putting an `If` around each of thousands of registers, the block
    collects their updates here and emits them under one enable in :meth:`emit`.

    Parameters
    ----------
    enable : Value
        The pipeline advances at a rising edge where ``enable`` is high.
    """

    def __init__(self, enable):
        self.enable = enable
        self._updates = []

    def add(self, *statements):
        """Add updates that happen only when the pipeline advances."""
        self._updates.extend(statements)

    def reg(self, value, name):
        """A register fed by ``value``; returns the register."""
        register = Signal(value.shape(), name=name)
        self._updates.append(register.eq(value))
        return register

    def delay(self, value, stages, name):
        """``value`` delayed by ``stages`` registers (``stages`` may be 0)."""
        for stage in range(stages):
            value = self.reg(value, f"{name}_d{stage}")
        return value

    def emit(self, m):
        """Emit every collected update into ``m`` under the enable."""
        with m.If(self.enable):
            m.d.sync += self._updates
