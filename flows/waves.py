"""GTKWave save files for the traces of `moegen sim --waves`.

pyvcd's :class:`vcd.gtkw.GTKWSave` writes the format; this module only decides the layout: a
group per stream port (valid, ready, the payload in hex), one for clock and reset, one for the
other ports, in manifest order, so a trace opens readable (`gtkwave TRACE.gtkw`).
"""

import re
from pathlib import Path

from vcd.gtkw import GTKWSave

__all__ = ["write_gtkw"]


def _name(scope, port):
    width = port["width"]
    return f"{scope}.{port['name']}" + (f"[{width - 1}:0]" if width > 1 else "")


def write_gtkw(trace, info, scope):
    """Write ``<trace>.gtkw`` for ``trace`` (VCD or FST) of the block described by manifest
    ``info``, whose ports sit in hierarchy scope ``scope``; returns its path."""
    trace = Path(trace)
    path = trace.with_suffix(".gtkw")
    groups, plain = {}, []
    for port in info["ports"]:
        match = re.fullmatch(r"(.+)__(valid|ready|payload)", port["name"])
        if match:
            groups.setdefault(match.group(1), []).append(port)
        elif port["name"] not in ("clk", "rst"):
            plain.append(port)
    with open(path, "w") as handle:
        save = GTKWSave(handle)
        save.comment(f"moegen {info['block']} ({info['top']}): one group per stream port")
        save.dumpfile(str(trace))
        save.treeopen(scope)
        with save.group("clock and reset"):
            save.trace(f"{scope}.clk", datafmt="bin")
            save.trace(f"{scope}.rst", datafmt="bin")
        for stream, ports in groups.items():
            with save.group(stream):
                for port in sorted(ports, key=lambda p: ("valid", "ready", "payload").index(
                        p["name"].rsplit("__", 1)[1])):
                    save.trace(_name(scope, port), datafmt="bin" if port["width"] == 1
                               else "hex")
        if plain:
            with save.group("other ports"):
                for port in plain:
                    save.trace(_name(scope, port),
                               datafmt="bin" if port["width"] == 1 else "hex")
    return path
