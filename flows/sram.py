"""SRAM macros for ASIC flows (`moegen verilog --sram`): every ``amaranth.lib.memory`` memory
whose shape a synchronous SRAM can take becomes a black-box instance, with a behavioural model
for simulation and an entry in the manifest.

Amaranth lets a platform replace every memory at elaboration (``platform.get_memory``); the
platform below returns an ``Instance`` of a macro named by its shape, or the memory as it is
when no SRAM fits it. A memory becomes a macro when every read port is synchronous (``sync``
domain: an SRAM registers its read), it has exactly one write port in that domain, and its
initial contents are all zero (a macro cannot be preloaded). Memories read asynchronously (the
FIFOs' storage, look-up tables read in the cycle they are addressed) stay as they are: their
contracts need the word in the same cycle, which no SRAM gives.

Macro ``moegen_sram_<depth>x<width>_<r>r1w[_b<granularity>][_t]`` (``_t``: the read ports see a
same-edge write, "transparent"), ports: ``clk``; ``w_en`` (one bit per granule), ``w_addr``,
``w_data``; per read port i ``r<i>_en``, ``r<i>_addr``, ``r<i>_data``. The model's behaviour is
Amaranth's, edge for edge: at a rising edge with ``w_en`` bit g set, granule g of the word at
``w_addr`` takes ``w_data``'s; with ``r<i>_en`` set, ``r<i>_data`` takes the word at ``r<i>_addr``
as it was before that edge (not transparent) or with that edge's write in it (transparent);
``r<i>_data`` keeps its value otherwise and is not reset; every word starts at 0.
"""

import re

from amaranth.hdl import ClockSignal, Instance, Module, Value
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

__all__ = ["SramPlatform", "macro_models", "macro_instances", "macro_ports"]

MACRO_PREFIX = "moegen_sram_"


class SramPlatform:
    """The platform of a ``--sram`` conversion; ``macros``: name -> shape of each macro used,
    ``kept``: the memories left as they are, with the reason."""

    def __init__(self):
        self.macros = {}
        self.kept = []

    def _why_not(self, memory):
        writes, reads = memory.write_ports, memory.read_ports
        if memory.depth < 2:
            return "one word (a register)"
        if len(writes) != 1:
            return f"{len(writes)} write ports (a macro has one)"
        domain = writes[0].domain
        if any(port.domain != domain for port in reads) or domain == "comb":
            return "read asynchronously (its word is needed in the cycle it is addressed)"
        if any(list(memory.init)):
            return "initial contents that are not all zero"
        if not reads:
            return "no read port"
        return None

    def get_memory(self, memory):
        reason = self._why_not(memory)
        width = Value.cast(memory.write_ports[0].data).shape().width \
            if memory.write_ports else None
        if reason is not None:
            self.kept.append({"depth": memory.depth, "width": width, "reason": reason})
            return Memory.elaborate(memory, None)          # Amaranth's own implementation
        write, reads = memory.write_ports[0], memory.read_ports
        lanes = len(write.en)
        transparent = [write in port.transparent_for for port in reads]
        if any(transparent) and not all(transparent):
            self.kept.append({"depth": memory.depth, "width": width,
                              "reason": "transparent and non-transparent read ports together"})
            return Memory.elaborate(memory, None)
        shape = {"depth": memory.depth, "width": width, "read_ports": len(reads),
                 "granularity": width // lanes, "transparent": all(transparent)}
        name = macro_name(**shape)
        self.macros[name] = shape
        ports = {"i_clk": ClockSignal(write.domain), "i_w_en": write.en,
                 "i_w_addr": write.addr, "i_w_data": Value.cast(write.data)}
        for index, port in enumerate(reads):
            ports.update({f"i_r{index}_en": port.en, f"i_r{index}_addr": port.addr,
                          f"o_r{index}_data": Value.cast(port.data)})
        m = Module()
        m.submodules.macro = Instance(name, **ports)
        return m


def macro_name(depth, width, read_ports, granularity, transparent):
    lanes = width // granularity
    return (f"{MACRO_PREFIX}{depth}x{width}_{read_ports}r1w"
            + (f"_b{granularity}" if lanes > 1 else "") + ("_t" if transparent else ""))


def _model(name, depth, width, read_ports, granularity, transparent):
    lanes = width // granularity
    ports = macro_ports(depth, width, read_ports, granularity, transparent)
    declarations = [f"  {'input wire' if direction == 'in' else 'output reg'} "
                    f"[{bits - 1}:0] {port}" for port, direction, bits in ports]
    lines = [f"// Behavioural model of SRAM macro {name} (flows/sram.py): {depth} words of "
             f"{width} bits, {read_ports} synchronous read port(s)"
             f"{', transparent' if transparent else ''}, one write port of {lanes} granule(s).",
             f"module {name} (", ",\n".join(declarations)]
    lines += [");",
              f"  reg [{width - 1}:0] mem [0:{depth - 1}];",
              "  integer i;",
              "  initial begin",
              f"    for (i = 0; i < {depth}; i = i + 1) mem[i] = {width}'d0;",
              "  end",
              "  always @(posedge clk) begin"]
    for lane in range(lanes):
        bits = f"[{(lane + 1) * granularity - 1}:{lane * granularity}]"
        lines.append(f"    if (w_en[{lane}]) mem[w_addr]{bits} <= w_data{bits};")
    for index in range(read_ports):
        lines.append(f"    if (r{index}_en) begin")
        lines.append(f"      r{index}_data <= mem[r{index}_addr];")
        if transparent:
            for lane in range(lanes):
                bits = f"[{(lane + 1) * granularity - 1}:{lane * granularity}]"
                lines.append(f"      if (w_en[{lane}] && w_addr == r{index}_addr) "
                             f"r{index}_data{bits} <= w_data{bits};")
        lines.append("    end")
    lines += ["  end", "endmodule", ""]
    return "\n".join(lines)


def macro_models(macros):
    """Verilog text of the behavioural models of ``macros`` (name -> shape)."""
    return "\n".join(_model(name, **shape) for name, shape in sorted(macros.items()))


_INSTANCE = re.compile(rf"^\s*({MACRO_PREFIX}\w+)\s+(\\?\S+)\s*\(", re.MULTILINE)
_CELL = re.compile(r"^\s*(\\?[^\s(]+)\s+(\\?[^\s(]+)\s*\(", re.MULTILINE)  # type, name
_MODULE_SPAN = re.compile(r"^module (\\?[^\s(]+).*?^endmodule", re.MULTILINE | re.DOTALL)


def macro_ports(depth, width, read_ports, granularity, transparent):
    """``(name, direction, width)`` of every port of a macro of this shape."""
    abits = max(1, ceil_log2(depth))
    ports = [("clk", "in", 1), ("w_en", "in", width // granularity), ("w_addr", "in", abits),
             ("w_data", "in", width)]
    for index in range(read_ports):
        ports += [(f"r{index}_en", "in", 1), (f"r{index}_addr", "in", abits),
                  (f"r{index}_data", "out", width)]
    return ports


def macro_instances(text, macros):
    """The manifest's list of macro instances in a Verilog text (its top: the module no other
    instances): for every place a macro sits in the hierarchy (a module instanced several
    times, as the layer's shared chiplet, holds its macros at each instance), its path below
    the top, module, macro, shape and ports; in the order of the modules in the text."""
    bodies = {match.group(1): match.group(0) for match in _MODULE_SPAN.finditer(text)}
    paths = {name: [] for name in bodies}

    def visit(name, where):
        paths[name].append(where)
        for kind, instance in cells[name]:
            if kind in bodies:
                visit(kind, [*where, instance.lstrip("\\")])

    cells = {name: _CELL.findall(body) for name, body in bodies.items()}
    instanced = {kind for found in cells.values() for kind, _ in found}
    for top in bodies.keys() - instanced:
        visit(top, [])
    out = []
    for name, body in bodies.items():
        for where in paths[name]:
            for macro, instance in _INSTANCE.findall(body):
                out.append({"path": ".".join([*where, instance.lstrip("\\")]), "module": name,
                            "macro": macro, **macros[macro],
                            "ports": [{"name": port, "direction": direction, "width": bits}
                                      for port, direction, bits in macro_ports(**macros[macro])]})
    return out
