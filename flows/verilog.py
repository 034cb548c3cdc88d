"""Verilog export and the block manifest (`moegen verilog`)."""

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Shape
from amaranth.lib import data, wiring

from flows import toolchain

__all__ = ["generate", "convert", "naming", "manifest_streams", "module_names", "IDENTIFIER",
           "manifest", "port_list", "config_key", "write_if_changed", "generator_digest",
           "file_digest", "is_fresh", "shared_conversion", "built_for_ports"]


def config_key(block, config, extra=""):
    """Short stable hash naming a configuration's build folders (cache key)."""
    text = json.dumps([block.name, dataclasses.asdict(config), extra], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _fields(layout, offset=0, prefix=""):
    """Bit range of every leaf field of a layout, first field at bit 0."""
    out = []
    if isinstance(layout, data.StructLayout):
        for name, field in layout:
            out.extend(_fields(field.shape, offset + field.offset, f"{prefix}{name}."))
    elif isinstance(layout, data.ArrayLayout):
        elem = data.Layout.cast(layout.elem_shape) if isinstance(layout.elem_shape, data.Layout) \
            else None
        width = layout.size // layout.length if layout.length else 0
        for index in range(layout.length):
            if elem is not None:
                out.extend(_fields(elem, offset + index * width, f"{prefix}{index}."))
            else:
                out.append(_leaf(f"{prefix}{index}", layout.elem_shape, offset + index * width))
    else:
        out.append(_leaf(prefix.rstrip("."), layout, offset))
    return out


def _width(shape):
    return Shape.cast(shape).width


def _leaf(name, shape, offset):
    shape = Shape.cast(shape)
    return {"field": name, "lsb": offset, "msb": offset + shape.width - 1,
            "signed": shape.signed}


def port_list(component):
    """Every Verilog port of ``component`` as ``{name, direction, width}``: clk, rst, then the
    flattened signature members in order (``a__b`` for member b of interface a)."""
    ports = [{"name": "clk", "direction": "in", "width": 1},
             {"name": "rst", "direction": "in", "width": 1}]
    for path, member, value in component.signature.flatten(component):
        ports.append({"name": "__".join(str(p) for p in path),
                      "direction": "in" if member.flow == wiring.In else "out",
                      "width": len(value.as_value()) if hasattr(value, "as_value")
                      else len(value)})
    return ports


def manifest_streams(ports):
    """A manifest's ports sorted out: ``({stream: {"valid": port, "ready": port, "payload":
    port}}, [other ports but clk and rst])``, in port order. A stream is a
    ``<name>__valid/__ready/__payload`` triple."""
    by_name = {port["name"]: port for port in ports}
    streams, others = {}, []
    for port in ports:
        name, _, member = port["name"].rpartition("__")
        if member in ("valid", "ready", "payload") and all(
                f"{name}__{m}" in by_name for m in ("valid", "ready", "payload")):
            streams.setdefault(name, {m: by_name[f"{name}__{m}"]
                                      for m in ("valid", "ready", "payload")})
        elif port["name"] not in ("clk", "rst"):
            others.append(port)
    return streams, others


def manifest(block, config, component):
    """The manifest of a generated block: parameters, ports, payload fields, golden figures."""
    ports = [{"name": "clk", "direction": "in", "width": 1},
             {"name": "rst", "direction": "in", "width": 1}]
    for name, member in component.signature.members.items():
        if member.is_port:
            ports.append({"name": name, "direction": member.flow.value.lower(),
                          "width": _width(member.shape)})
            continue
        members = member.signature.members
        if set(members.keys()) != {"valid", "ready", "payload"}:
            raise TypeError(f"port {name}: only plain ports and streams are described")
        producer = member.flow == wiring.Out
        layout = members["payload"].shape
        # An array of streams (``Out(sig).array(n)``) flattens to ``name__<i>__valid`` etc.
        names = [f"{name}__{i}" for i in range(member.dimensions[0])] if member.dimensions \
            else [name]
        for port in names:
            ports += [
                {"name": f"{port}__valid", "direction": "out" if producer else "in", "width": 1},
                {"name": f"{port}__ready", "direction": "in" if producer else "out", "width": 1},
                {"name": f"{port}__payload", "direction": "out" if producer else "in",
                 "width": _width(layout),
                 "fields": _fields(layout) if isinstance(layout, data.Layout) else []},
            ]
    return {
        "block": block.name,
        "family": block.family,
        "params": dataclasses.asdict(config),
        "top": block.name,
        "clock": "clk (rising edge)",
        "reset": "rst (synchronous, active high)",
        "ports": ports,
        "figures": block.figures(config),
    }


def write_if_changed(path, text):
    """Write ``text`` unless the file already holds it (keeps mtimes, so caches stay valid)."""
    path = Path(path)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


# Yosys puts a dummy reg, initialized to 0, into the sensitivity list of every `always @*` so the
# block runs once at start-up. Icarus 11 applies declaration initializers without an event, so
# a combinational block whose real inputs never change (e.g. a priority pick over registers that
# stay at their reset value) keeps X forever. Toggling the dummy at time 0 runs each block once;
# only under Icarus (`__ICARUS__`), so Verilator and Yosys read the Verilog Yosys wrote.
_DUMMY_REG = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+) += 0;$",
                        re.MULTILINE)


def _settle_at_time_zero(text):
    return _DUMMY_REG.sub(lambda m: (f"{m.group(0)}\n{m.group(1)}`ifdef __ICARUS__\n"
                                     f"{m.group(1)}initial #0 {m.group(2)} = 1'h1;\n"
                                     f"{m.group(1)}`endif"), text)


_MODULE = re.compile(r"^module (\\?[^\s(]+)", re.MULTILINE)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_module_names(text, top, prefix):
    """Rename every submodule Yosys writes as an escaped hierarchical name (``\\top.a.b``) to
    the plain identifier ``prefix__a__b``, so that two configurations (two prefixes) can live in
    one design and tools that dislike escaped names read it."""
    mapping = {}
    for name in _MODULE.findall(text):
        if name == top:
            continue
        if not name.startswith(f"\\{top}."):
            raise ValueError(f"unexpected module name {name!r} in the Verilog of {top!r}")
        path = name[len(top) + 2:].split(".")
        mapping[name] = re.sub(r"[^A-Za-z0-9_]", "_", "__".join([prefix, *path]))
    if len(set(mapping.values()) | {top}) != len(mapping) + 1:
        raise ValueError(f"submodule names of {top!r} collide once made plain identifiers")
    if not mapping:
        return text
    pattern = re.compile("|".join(re.escape(name) for name in
                                  sorted(mapping, key=len, reverse=True)) + r"(?=\s)")
    return pattern.sub(lambda match: mapping[match.group(0)], text)


# Verilator inlines a module into each of its instances when its cost model allows (`-O3`),
# so a repeated submodule's C++ grew with its instances: the 16-leaf layer's model was 99 MB
# and built in 162 s, 2.9 GB; kept a module of its own, 82 MB, 66 s, 1.7 GB, at the same
# simulation speed (64 leaves: 40 minutes of g++, now under 10). Other tools read a comment.
NOT_INLINED = "/*verilator no_inline_module*/"


def _not_inlined(text, module):
    """``text`` with Verilator's metacomment that keeps ``module`` from being inlined."""
    header = re.search(rf"^module {re.escape(module)}\b[^;]*;\n", text, re.MULTILINE)
    if header is None:
        raise ValueError(f"no module {module!r} in its own Verilog")
    return f"{text[:header.end()]}  {NOT_INLINED}\n{text[header.end():]}"


def convert(component, name, prefix=None, platform=None):
    """Verilog text of ``component`` as module ``name``, every submodule renamed to the plain
    identifier ``<prefix>__<path>`` (``prefix`` defaults to ``name``); the Icarus time-0 settle
    included. ``platform``: elaborated with it (:class:`flows.sram.SramPlatform`). A component
    with ``shared_submodule()`` (``hw.moe_layer.MoELayer``) has that submodule written once,
    as module ``<prefix>__<role>``, and instanced wherever it occurs."""
    prefix = prefix or name
    shared = ""
    if hasattr(component, "shared_submodule"):
        # A submodule repeated identically (the layer's chiplets): converted once, into the
        # module <prefix>__<role> that the component then instances at every place.
        role, submodule = component.shared_submodule()
        module = f"{prefix}__{role}"
        component.instance_shared(module, submodule.signature)
        shared = _not_inlined(convert(submodule, module, module, platform), module)
    text = verilog.convert(component, name=name, platform=platform, emit_src=False,
                           strip_internal_attrs=True)
    return _settle_at_time_zero(_plain_module_names(text, name, prefix)) + shared


def built_for_ports(component):
    """Mark ``component``, and the sub-blocks its constructor built (a ``MoELayer``'s
    ``NopTree``), as built for their ports only: Amaranth warns at garbage collection about an
    elaboratable that was never elaborated, and this is its own flag saying the omission is
    meant (there is no public call for it). Returns ``component``."""
    pending, seen = [component], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, Elaboratable):
            item._MustUse__silence = True
            pending.extend(vars(item).values())
    return component


def shared_conversion(key, component, produce):
    """The Verilog text ``produce()`` returns for ``component``, kept once in build/convert
    under ``key`` (a stamp naming the block, its configuration, the module names and the
    generator sources): every folder a configuration is generated into (both simulators',
    the 3D flow's, synthesis', the tests' temporary ones) shares one conversion, as the
    largest blocks take tens of seconds (`moe_layer`'s defaults 26 s). Written whole by
    ``os.replace``, so a reader never sees half a file; two writers write the same text."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    path = toolchain.BUILD_ROOT / "convert" / f"{digest}.v"
    if path.exists():
        built_for_ports(component)
        return path.read_text()
    text = produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)
    return text


def module_names(text):
    """The names of the modules a Verilog text defines, in order."""
    return _MODULE.findall(text)


def naming(block, config, prefix=None):
    """``(top module, submodule prefix)`` of a generation: by default the top keeps the block's
    name and the submodules take ``<block>_<hash of the configuration>``, so that they never
    clash with another configuration's; ``prefix`` names both (``auto``: that derived name)."""
    derived = f"{block.name}_{config_key(block, config)[:8]}"
    if prefix is None:
        return block.name, derived
    if prefix == "auto":
        return derived, derived
    if not IDENTIFIER.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r}: a plain Verilog identifier is needed "
                         "(letters, digits, _; not starting with a digit) or 'auto'")
    return prefix, prefix


def file_digest(*paths):
    """A hash of the contents of ``paths``, in order."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def is_fresh(stamp_path, stamp, outputs):
    """Whether ``outputs`` were written for ``stamp`` (kept in ``stamp_path`` by the writer
    once they were all written): then they are reused as they are."""
    return (stamp_path.exists() and stamp_path.read_text() == stamp
            and all(Path(path).exists() for path in outputs))


@functools.cache
def generator_digest():
    """A hash of everything a block's Verilog and manifest depend on: the sources of hw/,
    golden/ and this module, and the Amaranth version."""
    digest = hashlib.sha256(importlib.metadata.version("amaranth").encode())
    root = Path(__file__).resolve().parent.parent
    for path in sorted([*root.glob("hw/*.py"), *root.glob("golden/*.py"), Path(__file__)]):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def generate(block, config, out_dir, prefix=None, sram=False):
    """Write ``out_dir/<block>.v`` (top module ``<block>``, or as :func:`naming` gives for
    ``prefix``) and ``out_dir/<block>.json``; with ``sram``, every memory an SRAM macro can
    take is a black-box instance (:mod:`flows.sram`), ``out_dir/<block>_sram.v`` holds the
    macros' behavioural models and the manifest's ``sram`` lists them.

    A folder already holding them for the same block, configuration and generator sources
    (``<block>.stamp``) is reused as it is: the simulators, synthesis and the 3D flow of one
    configuration share one generation (the largest blocks take tens of seconds to convert),
    and any other folder reuses the conversion itself (:func:`shared_conversion`).

    Returns
    -------
    (Path, Path, dict)
        The Verilog path, the manifest path and the manifest.
    """
    out_dir = Path(out_dir)
    v_path, j_path = out_dir / f"{block.name}.v", out_dir / f"{block.name}.json"
    stamp_path = out_dir / f"{block.name}.stamp"
    top, sub_prefix = naming(block, config, prefix)
    models_path = out_dir / f"{block.name}_sram.v"
    stamp = (f"{config_key(block, config)} {top} {sub_prefix} {generator_digest()}"
             f"{' sram' if sram else ''}\n")
    if is_fresh(stamp_path, stamp, (v_path, j_path, *([models_path] if sram else []))):
        return v_path, j_path, json.loads(j_path.read_text())
    component = block.build(config)
    if sram:
        from flows.sram import SramPlatform
        platform = SramPlatform()              # collects the macros as it converts
        text = convert(component, top, sub_prefix, platform)
    else:
        text = shared_conversion(stamp, component,
                                 lambda: convert(component, top, sub_prefix))
    info = manifest(block, config, component)
    info["top"] = top
    info["modules"] = module_names(text)
    if sram:
        from flows.sram import macro_instances, macro_models
        write_if_changed(models_path, macro_models(platform.macros))
        info["sram"] = {"models": models_path.name,
                        "macros": macro_instances(text, platform.macros),
                        "kept": platform.kept}
    write_if_changed(v_path, text)
    write_if_changed(j_path, json.dumps(info, indent=2) + "\n")
    stamp_path.write_text(stamp)
    return v_path, j_path, info
