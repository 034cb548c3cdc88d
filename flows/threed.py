"""Two-tier 3D builds (`moegen verilog|sim|synth BLOCK --3d`): seed 004 §III-B, Fig. 2/3 (arrays
under logic) and seed 000 (Mozart: logic over SRAM).

A block that can be split registers ``tiers(config) -> (top component, bottom component)``:
the top component is the block with the bottom tier's ports exposed as ``bottom__<port>``;
the bottom component has exactly those ports (``<port>``). This flow writes

* ``BLOCK_tier_top.v`` (module ``BLOCK_tier_top``) and ``BLOCK_tier_bottom.v``;
* ``BLOCK_3d.v``: module ``BLOCK_3d`` with the 2D block's ports, the two tiers, and one
  ``moegen_bond`` instance (a one-bit buffer: an F2F bond) for every bit that crosses, in both
  directions, clock and reset included — the tiers touch nothing else;
* ``BLOCK_partition.txt``: the instance-to-die map in the format of the open Pin-3D flow
  (``<instance> <die>``, 0 = top/upper die, 1 = bottom die; bonds listed with the top die);
* ``BLOCK_equiv.v``: module ``BLOCK_equiv`` running the 2D build and the 3D build side by side
  on the same inputs, presenting the 2D outputs and a sticky ``mismatch`` output that rises if
  any output of the two builds differs on any cycle (the 3D-vs-2D simulation).

The 2D build (``moegen verilog BLOCK``) is the same generator with the bottom tier as an
ordinary submodule, flattened by Yosys.
"""

import json
from pathlib import Path

from flows import toolchain
from flows.synth import summarize, synthesize_files
from flows.verilog import (config_key, convert, file_digest, generate, generator_digest,
                           is_fresh, port_list, shared_conversion, write_if_changed)

__all__ = ["generate_3d", "synthesize_3d", "bond_nets", "NoTiers"]

BOND_MODULE = """// One F2F bond: a one-bit connection between the dies.
module moegen_bond(input wire a, output wire y);
  assign y = a;
endmodule
"""


class NoTiers(ValueError):
    """The block has no tier partition."""


def bond_nets(top_ports, bottom_ports):
    """``(name, width, direction)`` of every tier crossing: each bottom-tier port (``down`` when
    the bottom tier takes it, ``up`` when it drives it); clk and rst go down too."""
    top_names = {p["name"] for p in top_ports}
    nets = []
    for port in bottom_ports:
        if port["name"] not in ("clk", "rst") and f"bottom__{port['name']}" not in top_names:
            raise ValueError(f"bottom-tier port {port['name']!r} has no top-tier partner")
        nets.append((port["name"], port["width"], "down" if port["direction"] == "in" else "up"))
    return nets


def _decl(port):
    direction = "input" if port["direction"] == "in" else "output"
    width = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
    return f"  {direction} wire {width}{port['name']}"


def _wrapper_3d(name, outer_ports, top_ports, nets):
    lines = [BOND_MODULE, f"module {name}_3d(", ",\n".join(_decl(p) for p in outer_ports),
             ");"]
    top_conn = [f".{p['name']}({p['name']})" for p in top_ports
                if not p["name"].startswith("bottom__")]
    bottom_conn, bonds = [], []
    for net, width, direction in nets:
        lines.append(f"  wire [{width - 1}:0] t_{net}, b_{net};")
        if net in ("clk", "rst"):
            lines.append(f"  assign t_{net} = {net};")
        else:
            top_conn.append(f".bottom__{net}(t_{net})")
        bottom_conn.append(f".{net}(b_{net})")
        source, sink = ("t", "b") if direction == "down" else ("b", "t")
        for bit in range(width):
            bonds.append(f"bond_{direction}_{net}_{bit}")
            lines.append(f"  moegen_bond bond_{direction}_{net}_{bit}(.a({source}_{net}[{bit}]), "
                         f".y({sink}_{net}[{bit}]));")
    lines.append(f"  {name}_tier_top u_top(" + ", ".join(top_conn) + ");")
    lines.append(f"  {name}_tier_bottom u_bottom(" + ", ".join(bottom_conn) + ");")
    lines.append("endmodule")
    return "\n".join(lines) + "\n", bonds


def _wrapper_equiv(name, outer_ports):
    inputs = [p for p in outer_ports if p["direction"] == "in"]
    outputs = [p for p in outer_ports if p["direction"] == "out"]
    lines = [f"module {name}_equiv(", ",\n".join(_decl(p) for p in outer_ports) + ",",
             "  output reg mismatch", ");"]
    for p in outputs:
        lines.append(f"  wire [{p['width'] - 1}:0] d3_{p['name']};")
    conn2 = ", ".join(f".{p['name']}({p['name']})" for p in outer_ports)
    conn3 = ", ".join([f".{p['name']}({p['name']})" for p in inputs] +
                      [f".{p['name']}(d3_{p['name']})" for p in outputs])
    names = {p["name"] for p in outputs}

    def differs(port):
        # A stream payload only counts while its valid is high (it is don't-care otherwise, and
        # a FIFO's unwritten memory may differ between two builds).
        name = port["name"]
        test = f"({name} !== d3_{name})"
        if name.endswith("__payload") and name.replace("__payload", "__valid") in names:
            test = f"({name.replace('__payload', '__valid')} && {test})"
        return test
    both = " || ".join(differs(p) for p in outputs)
    lines += [f"  {name} u_2d({conn2});", f"  {name}_3d u_3d({conn3});",
              "  initial mismatch = 1'b0;",
              "  always @(posedge clk) begin",
              f"    if (!rst && ({both})) mismatch <= 1'b1;",
              "  end", "endmodule"]
    return "\n".join(lines) + "\n"


def generate_3d(block, config, out_dir):
    """Write the 3D files for ``block``; returns a dict of their paths, the bond list and the
    per-direction bond counts. Raises :class:`NoTiers` for blocks without a partition."""
    if block.tiers is None:
        raise NoTiers(f"block {block.name!r} has no tier partition; --3d is available for "
                      "blocks that register a bottom and a top tier (`moegen list`)")
    out_dir = Path(out_dir)
    v2d, _, info = generate(block, config, out_dir)
    paths = {"2d": v2d, "top": out_dir / f"{block.name}_tier_top.v",
             "bottom": out_dir / f"{block.name}_tier_bottom.v",
             "3d": out_dir / f"{block.name}_3d.v", "equiv": out_dir / f"{block.name}_equiv.v",
             "partition": out_dir / f"{block.name}_partition.txt"}
    # As generate(): the same configuration and sources reuse the folder (both simulators);
    # this module's source writes the wrappers.
    stamp_path = out_dir / f"{block.name}_3d.stamp"
    record_path = out_dir / f"{block.name}_3d.json"
    stamp = f"{config_key(block, config)} {generator_digest()} {file_digest(__file__)}\n"
    if is_fresh(stamp_path, stamp, [record_path, *paths.values()]):
        return {"paths": paths, **json.loads(record_path.read_text())}
    top, bottom = block.tiers(config)
    top_ports, bottom_ports = port_list(top), port_list(bottom)
    nets = [list(net) for net in bond_nets(top_ports, bottom_ports)]
    for tier, component in (("top", top), ("bottom", bottom)):
        write_if_changed(paths[tier], shared_conversion(
            f"{stamp} {tier}", component,
            lambda: convert(component, f"{block.name}_tier_{tier}")))
    text, bonds = _wrapper_3d(block.name, info["ports"], top_ports, nets)
    write_if_changed(paths["3d"], text)
    write_if_changed(paths["equiv"], _wrapper_equiv(block.name, info["ports"]))
    write_if_changed(paths["partition"], "".join(
        ["u_top 0\n", "u_bottom 1\n"] + [f"{b} 0\n" for b in bonds]))
    counts = {"down": sum(w for _, w, d in nets if d == "down"),
              "up": sum(w for _, w, d in nets if d == "up")}
    record = {"bonds": bonds, "bond_counts": counts, "nets": nets}
    record_path.write_text(json.dumps(record))
    stamp_path.write_text(stamp)
    return {"paths": paths, **record}


def synthesize_3d(block, config, target="generic", out_dir=None):
    """Synthesize each tier and the 2D build; returns cells per tier, the bond counts and the
    footprint estimate (largest tier) against the 2D build (all cells on one die)."""
    out_dir = Path(out_dir) if out_dir else \
        toolchain.BUILD_ROOT / "synth3d" / f"{block.name}-{config_key(block, config)}"
    built = generate_3d(block, config, out_dir)
    paths = built["paths"]
    report = {"block": block.name, "target": target, "bonds": built["bond_counts"]}
    for tier in ("top", "bottom"):
        report[tier] = summarize(synthesize_files(
            [paths[tier]], f"{block.name}_tier_{tier}", target, out_dir,
            f"{block.name}_tier_{tier}", flatten=block.flatten(config),
            abc=block.abc(config)))
    report["2d"] = summarize(synthesize_files([paths["2d"]], block.name, target, out_dir,
                                              block.name, flatten=block.flatten(config),
                                              abc=block.abc(config)))
    report["footprint_3d"] = max(report["top"]["cells"], report["bottom"]["cells"])
    report["footprint_2d"] = report["2d"]["cells"]
    report["footprint_ratio"] = report["footprint_3d"] / report["footprint_2d"]
    return report
