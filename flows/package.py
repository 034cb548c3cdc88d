"""Packaging a generated block for other people's flows (`moegen verilog --axis`, BLOCK.core).

* :func:`axis_wrapper`: module ``<top>_axis`` around the block with AXI4-Stream port names, so
  vendor tools infer the interfaces (``s_axis_<port>_tdata/tvalid/tready/tlast`` for each input
  stream, ``m_axis_<port>_…`` for each output stream, ``aclk`` and the active-low ``aresetn``).
  Written from the manifest as plain Verilog: it is pure renaming, no logic worth a generator.
* :func:`fusesoc_core`: a FuseSoC CAPI2 core file listing the RTL and the manifest, with lint
  (Verilator) and simulation (Icarus) targets through FuseSoC's flow API.
"""

import dataclasses
import re
from pathlib import Path

from flows.verilog import IDENTIFIER, manifest_streams, write_if_changed

__all__ = ["axis_wrapper", "axis_streams", "fusesoc_core", "core_name", "write_package"]

CORE_VENDOR, CORE_LIBRARY, CORE_VERSION = "moegen", "blocks", "0.1.0"


def axis_streams(info):
    """``[(stream, axis prefix, payload width, tdata width, bit of the payload's last field or
    None)]`` of a block's manifest: ``s_axis_<stream>`` for inputs, ``m_axis_<stream>`` for
    outputs (``__`` of array streams becomes ``_``); tdata is the payload rounded up to bytes."""
    out = []
    for name, members in manifest_streams(info["ports"])[0].items():
        payload = members["payload"]
        side = "s_axis" if payload["direction"] == "in" else "m_axis"
        last = next((f["lsb"] for f in payload.get("fields", []) if f["field"] == "last"), None)
        width = payload["width"]
        out.append((name, f"{side}_{name.replace('__', '_')}", width, -(-width // 8) * 8, last))
    prefixes = [entry[1] for entry in out]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"{info['block']}: two streams map to one AXI4-Stream name")
    return out


def _range(width):
    return f"[{width - 1}:0] " if width > 1 else ""


def axis_wrapper(info):
    """``(module name, Verilog text)`` of the AXI4-Stream wrapper of the block described by
    manifest ``info`` (its top module is ``info["top"]``).

    Per stream: tdata holds the payload in its low bits (the manifest's field ranges), zero above
    on outputs and ignored above on inputs. A payload with a ``last`` field is a packet stream:
    tlast carries that bit (an input's tdata bit at that position is ignored; an output's tdata
    keeps it too). Any other stream has one-beat packets: output tlast is always 1, input tlast
    is ignored. Ports that are not streams keep their names and widths.
    """
    top = info["top"]
    module = f"{top}_axis"
    streams = axis_streams(info)
    decls = ["  input wire aclk", "  input wire aresetn"]
    body = ["  // AXI resets are active low; the block's reset is synchronous, active high.",
            "  wire rst = ~aresetn;"]
    conn = [".clk(aclk)", ".rst(rst)"]
    for name, axis, width, tdata, last in streams:
        inward = axis.startswith("s_")
        flow_in, flow_out = ("input", "output") if inward else ("output", "input")
        decls += [f"  {flow_in} wire {_range(tdata)}{axis}_tdata",
                  f"  {flow_in} wire {axis}_tvalid", f"  {flow_out} wire {axis}_tready",
                  f"  {flow_in} wire {axis}_tlast"]
        body.append(f"  wire {_range(width)}{name}_payload;")
        if inward:
            if last is None:
                body.append(f"  assign {name}_payload = {axis}_tdata[{width - 1}:0];")
            else:
                parts = ([f"{axis}_tdata[{width - 1}:{last + 1}]"] if last + 1 < width else []) \
                    + [f"{axis}_tlast"] + ([f"{axis}_tdata[{last - 1}:0]"] if last else [])
                body.append(f"  assign {name}_payload = {{{', '.join(parts)}}};")
            conn += [f".{name}__payload({name}_payload)", f".{name}__valid({axis}_tvalid)",
                     f".{name}__ready({axis}_tready)"]
            ignored = ([f"{axis}_tdata[{tdata - 1}:{width}]"] if tdata > width else []) + \
                ([f"{axis}_tlast"] if last is None else [f"{axis}_tdata[{last}]"])
            # Verilator's -Wall exempts signals named *unused*: the ignored bits, said once.
            body.append(f"  wire unused_{axis} = &{{1'b0, {', '.join(ignored)}, 1'b0}};")
        else:
            pad = f"{{{tdata - width}'b0, {name}_payload}}" if tdata > width else \
                f"{name}_payload"
            body += [f"  assign {axis}_tdata = {pad};",
                     f"  assign {axis}_tlast = "
                     + (f"{name}_payload[{last}];" if last is not None else "1'b1;")]
            conn += [f".{name}__payload({name}_payload)", f".{name}__valid({axis}_tvalid)",
                     f".{name}__ready({axis}_tready)"]
    for port in manifest_streams(info["ports"])[1]:
        direction = "input" if port["direction"] == "in" else "output"
        decls.append(f"  {direction} wire {_range(port['width'])}{port['name']}")
        conn.append(f".{port['name']}({port['name']})")
    lines = [f"// AXI4-Stream wrapper of {top} (moegen {info['block']}, written by "
             "`moegen verilog --axis`; see docs/toolchain.md).",
             f"module {module}(", ",\n".join(decls), ");", *body,
             f"  {top} u_{info['block']}(", "    " + ",\n    ".join(conn), "  );",
             "endmodule", ""]
    return module, "\n".join(lines)


def core_name(info, defaults):
    """The core's name: the block, then every parameter that differs from its default
    (``systolic-rows2-cols3``), so one configuration has one name."""
    parts = [info["block"]]
    for key, value in info["params"].items():
        if defaults.get(key) != value:
            parts.append(f"{key}{value}")
    name = "-".join(re.sub(r"[^A-Za-z0-9_.]", "_", str(part)) for part in parts)
    if info["top"] != info["block"]:
        name += f"-{info['top']}"
    if "sram" in info:                  # memories as SRAM macros: another netlist
        name += "-sram"
    return name


def fusesoc_core(info, defaults, files):
    """Text of the FuseSoC CAPI2 core file of a generated block: fileset ``rtl`` (``files``,
    Verilog, in order), fileset ``manifest`` (the JSON manifest), targets ``default``,
    ``lint`` (Verilator, flow API) and ``sim`` (Icarus, flow API), toplevel ``info["top"]``
    (or the AXI4-Stream wrapper when it is among ``files``)."""
    top = info["top"]
    toplevel = f"{top}_axis" if any(f.endswith("_axis.v") for f in files) else top
    assert IDENTIFIER.fullmatch(toplevel)
    params = " ".join(f"{k}={v}" for k, v in info["params"].items())
    rtl = "\n".join(f"      - {f}" for f in files)
    return f"""CAPI=2:
# Written by `moegen verilog` ({info['block']}: {params}).
name: {CORE_VENDOR}:{CORE_LIBRARY}:{core_name(info, defaults)}:{CORE_VERSION}
description: "moegen {info['block']} ({params})"

filesets:
  rtl:
    files:
{rtl}
    file_type: verilogSource
  manifest:
    files:
      - {info['block']}.json: {{file_type: user}}

targets:
  default: &default
    filesets: [rtl, manifest]
    toplevel: {toplevel}
  lint:
    <<: *default
    flow: lint
    flow_options:
      tool: verilator
      # Yosys-written Verilog trips Verilator's style warnings (unused bits and the like):
      # reported, not fatal.
      verilator_options: [-Wno-fatal]
  sim:
    <<: *default
    flow: sim
    flow_options:
      tool: icarus
"""


def write_package(block, info, out_dir, axis=False):
    """Beside a generated ``BLOCK.v`` (manifest ``info``) in ``out_dir``: with ``axis``,
    ``BLOCK_axis.v``; always ``BLOCK.core`` (its rtl fileset with the SRAM macros' models when
    the Verilog was generated with ``sram``). Returns the paths written."""
    out_dir = Path(out_dir)
    files, paths = [f"{block.name}.v"], []
    if "sram" in info:                  # the SRAM macros' behavioural models
        files.append(info["sram"]["models"])
    if axis:
        _, text = axis_wrapper(info)
        paths.append(out_dir / f"{block.name}_axis.v")
        write_if_changed(paths[-1], text)
        files.append(paths[-1].name)
    defaults = dataclasses.asdict(block.config())
    paths.append(out_dir / f"{block.name}.core")
    write_if_changed(paths[-1], fusesoc_core(info, defaults, files))
    return paths
