"""tb.codec packs and unpacks exactly as Amaranth's layouts do, for every block's streams."""

import functools
import random

import pytest
from amaranth.lib import data

from flows.verilog import built_for_ports
from hw.registry import all_blocks
from tb.codec import Fields, codec


def _python(view, layout):
    """A layout const view as nested ints, lists and dicts (Amaranth's reading of the bits)."""
    if isinstance(layout, data.StructLayout):
        return {name: _python(view[name], field.shape) for name, field in layout}
    if isinstance(layout, data.ArrayLayout):
        return [_python(view[i], layout.elem_shape) for i in range(layout.length)]
    return int(view.as_value().value) if hasattr(view, "as_value") else int(view)


def _plain(value):
    if isinstance(value, Fields):
        return {k: _plain(v) for k, v in value.__dict__.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@functools.cache
def _layouts():
    seen = []
    for block in all_blocks():
        component = built_for_ports(block.build(block.config()))
        for name, member in component.signature.members.items():
            if not member.is_port:
                seen.append((f"{block.name}.{name}", member.signature.members["payload"].shape))
    return seen


@pytest.mark.parametrize("name, layout", _layouts(), ids=[n for n, _ in _layouts()])
def test_codec_matches_amaranth_packing(name, layout):
    rng = random.Random(name)
    packer = codec(layout)
    for _ in range(25):
        bits = rng.getrandbits(layout.size)
        decoded = _plain(packer.decode(bits))
        assert decoded == _python(layout.from_bits(bits), layout)
        assert packer.encode(decoded) == bits
        assert packer.encode(decoded) == layout.const(decoded).as_bits()
    with pytest.raises(KeyError):
        packer.encode({"no_such_field": 1})
