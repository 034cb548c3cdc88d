"""Integer codecs for stream payloads, computed once from each Amaranth layout.

``layout.const(value).as_bits()`` and ``layout.from_bits(bits)`` define the bit packing (the
design's own layouts, so packing is written once), but they build Amaranth objects on every
beat: a profile of the 4x4 systolic bench spent most of its time there. A :class:`Codec` walks the
layout once and keeps plain ``(offset, width, signed)`` tables, so packing a beat is integer
shifts. ``tests/test_tb_codec.py`` checks it against Amaranth's own packing on every block's
payload layouts.
"""

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import data

__all__ = ["Codec", "Fields", "codec"]


class Fields:
    """A decoded struct payload: one attribute per field (ints, lists, nested ``Fields``)."""

    __slots__ = ("__dict__",)

    def __init__(self, **values):
        self.__dict__.update(values)

    def __eq__(self, other):
        return isinstance(other, Fields) and self.__dict__ == other.__dict__

    def __repr__(self):
        return "Fields(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"


def _plan(shape, offset):
    """A nested plan: ``("int", offset, width, signed)``, ``("ints", offset, width, signed,
    count)`` (an array of integers), ``("array", [plans])`` or ``("struct", [(name, plan)])``."""
    if isinstance(shape, data.StructLayout):
        return ("struct", [(name, _plan(field.shape, offset + field.offset))
                           for name, field in shape])
    if isinstance(shape, data.ArrayLayout):
        elem = shape.elem_shape
        if not isinstance(elem, data.Layout):
            # An array of plain integers (most payloads: lanes of values) packs in one loop
            # rather than one call per element: the NDP benches' 64-lane beats spent most of
            # their packing time in those calls.
            elem = Shape.cast(elem)
            return ("ints", offset, elem.width, elem.signed, shape.length)
        return ("array", [_plan(elem, offset + i * elem.size) for i in range(shape.length)])
    if isinstance(shape, data.Layout):
        raise TypeError(f"layout {shape!r}: only struct and array layouts have a codec")
    shape = Shape.cast(shape)
    return ("int", offset, shape.width, shape.signed)


_BYTE_WIDTHS = {8: "<u1", 16: "<u2", 32: "<u4"}


def _encode(plan, value):
    kind = plan[0]
    if kind == "int":
        _, offset, width, _ = plan
        return (int(value) & ((1 << width) - 1)) << offset
    if kind == "ints":                         # elements past the value's end are 0
        _, offset, width, _, count = plan
        values = list(value)[:count]
        if width in _BYTE_WIDTHS and len(values) >= 8:
            # Whole bytes: NumPy packs them (wraps two's complement) and int.from_bytes reads
            # them back as one integer; 64-lane beats were most of the packing time.
            try:
                packed = np.array(values, dtype=np.int64).astype(_BYTE_WIDTHS[width]).tobytes()
                return int.from_bytes(packed, "little") << offset
            except OverflowError:            # a value past int64: masked one by one below
                pass
        mask, bits = (1 << width) - 1, 0
        for element in reversed(values):
            bits = (bits << width) | (int(element) & mask)
        return bits << offset
    if kind == "array":
        return sum(_encode(sub, v) for sub, v in zip(plan[1], value))
    if isinstance(value, Fields):
        value = value.__dict__
    bits = 0
    for name, sub in plan[1]:
        if name in value:                      # absent fields are 0, as layout.const does
            bits |= _encode(sub, value[name])
    return bits


def _decode(plan, bits):
    kind = plan[0]
    if kind == "int":
        _, offset, width, signed = plan
        value = (bits >> offset) & ((1 << width) - 1)
        return value - (1 << width) if signed and value >> (width - 1) else value
    if kind == "ints":
        _, offset, width, signed, count = plan
        mask, top = (1 << width) - 1, (1 << width) >> 1
        values = [(bits >> (offset + i * width)) & mask for i in range(count)]
        return [v - (1 << width) if v & top else v for v in values] if signed else values
    if kind == "array":
        return [_decode(sub, bits) for sub in plan[1]]
    return Fields(**{name: _decode(sub, bits) for name, sub in plan[1]})


class Codec:
    """Packs dicts (as ``layout.const`` takes them) into integers and unpacks integers into
    :class:`Fields`, bit for bit as the layout does.

    Parameters
    ----------
    layout : amaranth.lib.data.StructLayout
    """

    def __init__(self, layout):
        self.layout = layout
        self.width = layout.size
        self._plan = _plan(layout, 0)
        names = {name for name, _ in self._plan[1]} if self._plan[0] == "struct" else set()
        self._names = names

    def encode(self, value):
        """The payload bits of ``value`` (a dict of field values; lists for arrays)."""
        if isinstance(value, Fields):
            value = value.__dict__
        unknown = set(value) - self._names
        if unknown:
            raise KeyError(f"fields {sorted(unknown)} are not in the layout {self.layout!r}")
        return _encode(self._plan, value)

    def decode(self, bits):
        """The :class:`Fields` of payload ``bits``."""
        return _decode(self._plan, bits)


_CACHE = {}


def codec(layout):
    """The :class:`Codec` of ``layout`` (one per layout and process)."""
    key = id(layout)
    if key not in _CACHE or _CACHE[key].layout is not layout:
        _CACHE[key] = Codec(layout)
    return _CACHE[key]
