"""GTKWave save files for the traces of `moegen sim --waves`.

pyvcd's :class:`vcd.gtkw.GTKWSave` writes the format; this module only decides the layout: a
group per stream port (valid, ready, the payload in hex), one for clock and reset, one for the
other ports, in manifest order, so a trace opens readable (`gtkwave TRACE.gtkw`).
"""

from pathlib import Path

from vcd.gtkw import GTKWSave

from flows.verilog import manifest_streams

__all__ = ["write_gtkw"]


def _trace(save, scope, port):
    width = port["width"]
    save.trace(f"{scope}.{port['name']}" + (f"[{width - 1}:0]" if width > 1 else ""),
               datafmt="bin" if width == 1 else "hex")


def write_gtkw(trace, info, scope):
    """Write ``<trace>.gtkw`` for ``trace`` (VCD or FST) of the block described by manifest
    ``info``, whose ports sit in hierarchy scope ``scope``; returns its path."""
    trace = Path(trace)
    path = trace.with_suffix(".gtkw")
    streams, others = manifest_streams(info["ports"])
    with open(path, "w") as handle:
        save = GTKWSave(handle)
        save.comment(f"moegen {info['block']} ({info['top']}): one group per stream port")
        save.dumpfile(str(trace))
        save.treeopen(scope)
        with save.group("clock and reset"):
            for name in ("clk", "rst"):
                _trace(save, scope, {"name": name, "width": 1})
        for stream, members in streams.items():
            with save.group(stream):
                for member in ("valid", "ready", "payload"):
                    _trace(save, scope, members[member])
        if others:
            with save.group("other ports"):
                for port in others:
                    _trace(save, scope, port)
    return path
