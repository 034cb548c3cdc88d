"""Switching activity per operation, a relative dynamic-energy indicator (`make bench`).

A block's ``test_throughput`` runs under Verilator with a VCD trace; every bit flip of every net
of the design (clock and reset excepted) is counted over the whole test and divided by the
operations that test performs (``operations`` in its ``throughput.json``; the unit, MAC, flit,
synaptic op..., is the block's registered ``operation``). The count is split per part (each
submodule instance at the top of the block's hierarchy, and the top module's own nets) and,
for blocks with a two-tier 3D build, per tier (the test then runs on the lockstep 3D build:
parts from its 2D copy, tiers from its 3D copy). Bit flips are not energy: they weigh every net
alike, a flip-flop's clock load is not in them, and wires have no length; they compare
configurations and number formats of one block on one workload, nothing more.
"""

import dataclasses
import json

from flows.sim import run_tests
from tb.harness import THROUGHPUT_FILE

__all__ = ["Trace", "read_trace", "part_flips", "activity"]

OWN_NETS = "(top level)"          # the part name of the top module's own nets
UNCLOCKED = ("clk", "rst")        # nets not counted


@dataclasses.dataclass
class Trace:
    """Bit flips of one VCD. ``flips``: identifier code -> flips over the trace (its first
    value is the baseline; x and z read as 0); ``references``: identifier code -> the
    ``(scopes, name)`` it has (one per scope that shows the net); ``views``: the codes that are
    only views of another net's bits (Amaranth's Verilog shows each field of a struct-typed
    signal, ``row.data[0]``, as a wire of its own beside ``row``: counting both would count
    the same flip twice); ``top``: the toplevel scope; ``cycles``: rising edges of
    ``<top>.clk``."""
    flips: dict
    references: dict
    views: set
    top: str
    cycles: int


def read_trace(path):
    """Read a VCD into a :class:`Trace`, streaming.

    Written by hand rather than with vcdvcd (which the latency checks use): traces of the bench
    workloads reach hundreds of MB (fp_dot's 10k cycles: 220 MB), and vcdvcd keeps every value
    change in memory while this keeps one value per net (220 MB in about 7 s)."""
    scope, references, top = [], {}, None
    last, flips = {}, {}
    with open(path, "rb") as trace:
        for line in trace:
            words = line.split()
            if not words:
                continue
            if words[0] == b"$enddefinitions":
                break
            if words[0] == b"$scope":
                scope.append(words[2].decode())
                if len(scope) == 1 and scope[0] != "$rootio" and top is None:
                    top = scope[0]
            elif words[0] == b"$upscope":
                scope.pop()
            elif words[0] == b"$var":
                references.setdefault(words[3], []).append((tuple(scope), words[4].decode()))
        clock = next((code for code, names in references.items() if ((top,), "clk") in names),
                     None)
        rising = 0
        for line in trace:
            head = line[0]
            if head == 98:                                     # b<bits> <code>
                bits, code = line[1:].split()
                try:
                    value = int(bits, 2)
                except ValueError:
                    value = int(bits.replace(b"x", b"0").replace(b"z", b"0")
                                .replace(b"X", b"0").replace(b"Z", b"0"), 2)
            elif head in b"01xzXZ":                            # <bit><code>
                code, value = line[1:].rstrip(), 1 if head == 49 else 0
                if code == clock and value and not last.get(code, 1):
                    rising += 1
            else:                                              # #time, $dumpvars, $end
                continue
            previous = last.get(code)
            if previous is not None and previous != value:
                flips[code] = flips.get(code, 0) + (previous ^ value).bit_count()
            last[code] = value
    return Trace(flips, references, _views(references), top, rising)


def _views(references):
    """Codes whose every name is a field or element of a net of its scope (``row.data``,
    ``row.data[0]`` beside ``row``)."""
    names = {}
    for code, refs in references.items():
        for scope, name in refs:
            names.setdefault(scope, set()).add(name)

    def is_view(scope, name):
        base = name.split(".", 1)[0].split("[", 1)[0]
        return base != name and base in names[scope]
    return {code for code, refs in references.items()
            if all(is_view(scope, name) for scope, name in refs)}


def _counted(trace, code):
    return (code in trace.flips and code not in trace.views
            and not any(name in UNCLOCKED for _, name in trace.references[code]))


def part_flips(trace, root):
    """Flips per part under the scope path ``root`` (a tuple): each net counted once, in the
    outermost scope that shows it (a net passed into a submodule belongs to the parent)."""
    parts = {}
    for code, refs in trace.references.items():
        inside = [scope[len(root):] for scope, _ in refs if scope[:len(root)] == root]
        if not inside or not _counted(trace, code):
            continue
        path = min(inside, key=len)
        part = path[0] if path else OWN_NETS
        parts[part] = parts.get(part, 0) + trace.flips[code]
    return parts


def _operations(result, block):
    report = json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())
    if not report.get("operations"):
        raise RuntimeError(f"{block.name}: test_throughput reports no operations")
    return report["operations"]


def activity(block, config, testcase="test_throughput"):
    """Bit flips per operation of ``testcase`` on Verilator, in total and per part; per tier
    too for a block with a 3D build (see the module doc). Returns a dict for
    ``build/bench.json``."""
    three_d = block.tiers is not None
    result = run_tests(block, config, "verilator", testcase=[testcase], waves=True,
                       quiet=True, three_d=three_d, measure=True)
    operations = _operations(result, block)
    trace = read_trace(result.waves)
    root = (trace.top, "u_2d") if three_d else (trace.top,)
    parts = part_flips(trace, root)
    total = sum(parts.values())
    report = {"operation": block.operation, "operations": operations, "cycles": trace.cycles,
              "flips": total, "flips_per_operation": round(total / operations, 2),
              "flips_per_cycle": round(total / max(1, trace.cycles), 2),
              "parts_flips_per_operation": {name: round(count / operations, 2)
                                            for name, count in sorted(parts.items(),
                                                                      key=lambda p: -p[1])}}
    if three_d:
        tiers = _tier_flips(trace)
        report["tiers_flips_per_operation"] = {tier: round(count / operations, 2)
                                               for tier, count in tiers.items()}
        report["tiers_flips_per_cycle"] = {tier: round(count / max(1, trace.cycles), 2)
                                           for tier, count in tiers.items()}
    return report


def _tier_flips(trace):
    """Flips per tier of the lockstep 3D build (a bonded net counts on each die's side)."""
    flips = {"top": 0, "bottom": 0}
    for code, refs in trace.references.items():
        if not _counted(trace, code):
            continue
        for tier in flips:
            if any(scope[1:3] == ("u_3d", f"u_{tier}") for scope, _ in refs):
                flips[tier] += trace.flips[code]
    return flips

