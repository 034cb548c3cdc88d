"""`make bench` and `make demo`: every registered block's demo configurations, end to end.

bench: per configuration, the saturated-stream cocotb test (``test_throughput``) on Verilator
and on Icarus in the same run (cycles, ideal cycles, utilization, simulated cycles per wall
second), the same Verilog in a bare Verilator loop (:mod:`flows.bare`, the ceiling the bench's
cycles per second are a fraction of), Yosys generic synthesis (cells, flip-flops, LUTs, cells per
PE), place and route on ECP5 and the switching activity per operation (bit flips of
``test_throughput``'s VCD per MAC, flit, synaptic op..., per part and, for two-tier blocks, per
tier: a relative energy indicator, :mod:`flows.activity`); written to ``build/bench.json``.
demo: per configuration, Verilog, the full cocotb suite on Verilator against the golden model,
and synthesis, as one summary table.
"""

import json
import time
from pathlib import Path

from flows.activity import activity
from flows.bare import bare_cycles_per_second
from flows.pnr import fmax_text, pnr_block
from flows.reports import model_reports, table
from flows.sim import BUFFERED_PREFIX, SimFailure, buffered_tests, run_tests
from flows.synth import SynthError, synthesize
from flows.toolchain import BUILD_ROOT
from flows.verilog import generate
from hw.params import format_value
from hw.registry import all_blocks
from tb.harness import THROUGHPUT_FILE

__all__ = ["run_bench", "run_demo", "demo_configurations"]


def demo_configurations():
    """``(block, config, label)`` for every registered block's demo parameter sets."""
    out = []
    for block in all_blocks():
        for params in block.demo_configs:
            config = block.config(**params)
            label = " ".join(f"{k}={format_value(v)}" for k, v in params.items())
            out.append((block, config, label))
    return out


def _metrics_text(metrics):
    return " ".join(f"{k}={v}" for k, v in metrics.items())


def _throughput(result):
    return json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())


def _speeds(record, simulator):
    """Cycles per second on the per-cycle bench, and on the buffered harness if measured."""
    text = f"{record[simulator]['sim_cycles_per_second']:.0f}"
    if f"{simulator}_buffered" in record:
        text += f" | {record[simulator + '_buffered']['sim_cycles_per_second']:.0f}"
    return text


def _bare_text(record):
    """The bare loop's cycles per second and, in brackets, the fastest bench's share of it."""
    bare = record["bare_verilator_cycles_per_second"]
    fastest = record.get("verilator_buffered", record["verilator"])["sim_cycles_per_second"]
    return f"{bare:.0f} ({fastest / bare:.3f})"


def _pnr_figures(block, config):
    """Fmax and device use on an ECP5-85F (``flows.pnr``), or the one-line reason it failed
    (a design larger than the device does not place)."""
    try:
        r = pnr_block(block, config, "ecp5")
    except SynthError as failure:
        return {"error": str(failure).splitlines()[-1][:200]}
    return {k: r[k] for k in ("fmax_mhz", "luts", "flip_flops", "block_rams", "dsps",
                              "critical_path", "device", "seed", "mapper", "multipliers",
                              "lut_multipliers") if k in r}


def activity_table(records):
    """The switching activity of every record that has one, as a table with its caption."""
    rows = []
    for record in records:
        act = record.get("activity")
        if not act:
            continue
        parts = ", ".join(f"{name} {value}" for name, value
                          in list(act["parts_flips_per_operation"].items())[:3])
        tiers = " / ".join(str(value) for value in act.get("tiers_flips_per_operation",
                                                             {}).values()) or "-"
        rows.append((record["block"], record["params"], act["operation"], act["operations"],
                     act["flips_per_operation"], act["flips_per_cycle"], parts, tiers))
    return (table(["block", "params", "operation", "operations", "flips/op", "flips/cycle",
                   "largest parts (flips/op)", "tiers top / bottom (flips/op)"], rows)
            + "\nflips/op: bit flips of every net (clock and reset excepted) over the whole "
            "test_throughput, per operation it performs: a relative energy indicator for "
            "comparing configurations and formats, not a power estimate (flows/activity.py)")


def _write(output, records):
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"generated": time.strftime("%Y-%m-%d %H:%M:%S"),
                                  "results": records}, indent=2) + "\n")
    print(f"wrote {output}")


def _throughputs(block, config, label):
    """test_throughput (and the buffered harness's, where the block's suite has one) on both
    simulators: the cycle-exact figures and each bench's simulated cycles per second."""
    harnesses = [("", "test_throughput")]
    if f"{BUFFERED_PREFIX}throughput" in buffered_tests(block):
        harnesses.append(("_buffered", f"{BUFFERED_PREFIX}throughput"))
    figures = {}
    for simulator in ("verilator", "icarus"):
        for suffix, test in harnesses:
            print(f"bench: {block.name} {label} on {simulator}: {test}", flush=True)
            result = run_tests(block, config, simulator, testcase=[test], quiet=True,
                               optimize=True, measure=True)
            figures[simulator + suffix] = _throughput(result)
    return figures


def _synth_figures(block, config):
    area = synthesize(block, config, "generic")
    return {"synth_generic": {k: area[k] for k in ("cells", "flip_flops", "luts", "dsps", "abc")}}


def _throughputs_and_bare(block, config, label):
    """:func:`_throughputs` and, in the same run, the bare Verilator loop of the same Verilog:
    the bench's speed against its ceiling is a ratio of one run's figures (the VM's speed
    moves by tens of percent between runs)."""
    figures = _throughputs(block, config, label)
    print(f"bench: {block.name} {label} bare Verilator loop (the ceiling)", flush=True)
    return {**figures, "bare_verilator_cycles_per_second": bare_cycles_per_second(block, config)}


# part: (what it measures, its function (block, config, label) -> {record key: figures}).
PARTS = {"throughput": ("test_throughput on both simulators, the bare Verilator loop",
                        _throughputs_and_bare),
         "synth": ("synthesis (yosys, generic)",
                   lambda block, config, _: _synth_figures(block, config)),
         "activity": ("switching activity per operation (VCD)",
                      lambda block, config, _: {"activity": activity(block, config)}),
         "pnr": ("place and route (nextpnr, ecp5)",
                 lambda block, config, _: {"pnr_ecp5": _pnr_figures(block, config)})}


def run_part(output, part, blocks=None):
    """Only one part of the bench (``PARTS``: the throughput tests, the switching activity, or
    place and route) for every demo configuration (of ``blocks``): partial records, which
    ``moegen docs --bench`` adds to the recorded figures of the same configurations."""
    what, measure = PARTS[part]
    records = []
    for block, config, label in demo_configurations():
        if blocks and block.name not in blocks:
            continue
        print(f"bench: {block.name} {label} {what}", flush=True)
        records.append({"block": block.name, "params": label, "partial": True,
                        **measure(block, config, label)})
        _write(output, records)         # after each: an interrupted run keeps what it measured
    if part == "activity":
        print(activity_table(records))
    elif part == "pnr":
        print(table(["block", "params", "ECP5 Fmax"],
                    [(r["block"], r["params"], fmax_text(r["pnr_ecp5"])) for r in records]))
    elif part == "synth":
        print(table(["block", "params", "cells", "flip-flops", "LUTs", "mapped"],
                    [(r["block"], r["params"], *(r["synth_generic"][k] for k in
                                                 ("cells", "flip_flops", "luts")),
                      "ABC" if r["synth_generic"]["abc"] else "gate by gate")
                     for r in records]))
    else:
        print(table(["block", "params", "measured (cycle-exact)", "verilator cyc/s",
                     "bare verilator cyc/s (fastest bench/bare)", "icarus cyc/s"],
                    [(r["block"], r["params"], _metrics_text(r["verilator"]["metrics"]),
                      _speeds(r, "verilator"), _bare_text(r), _speeds(r, "icarus"))
                     for r in records]))
    _write(output, records)
    return 0


def run_bench(output, blocks=None, only=None):
    """Run the benchmarks (of ``blocks``, names, or every block); print a table and write
    ``output`` (JSON). Returns the exit status.

    Each block's cocotb ``test_throughput`` measures its own figures (asserted against its
    golden cycle model) and writes them with the simulated cycles per wall second.
    """
    if only:
        return run_part(output, only, blocks)
    records, rows = [], []
    for block, config, label in demo_configurations():
        if blocks and block.name not in blocks:
            continue
        units = block.area_units(config)
        record = {"block": block.name, "params": label, block.area_unit + "s": units}
        # The per-cycle bench, and the buffered harness where the block's suite has one.
        record.update(_throughputs(block, config, label))
        print(f"bench: {block.name} {label} bare Verilator loop (the ceiling)", flush=True)
        record["bare_verilator_cycles_per_second"] = bare_cycles_per_second(block, config)
        print(f"bench: {block.name} {label} synthesis (yosys, generic)", flush=True)
        record.update(_synth_figures(block, config))
        area = record["synth_generic"]
        record[f"cells_per_{block.area_unit}"] = area["cells"] / units
        print(f"bench: {block.name} {label} place and route (nextpnr, ecp5)", flush=True)
        record["pnr_ecp5"] = _pnr_figures(block, config)
        print(f"bench: {block.name} {label} switching activity per operation (VCD)", flush=True)
        record["activity"] = activity(block, config)
        records.append(record)
        _write(output, records)         # after each: an interrupted run keeps what it measured
        figures = record["verilator"]
        rows.append((block.name, label, _metrics_text(figures["metrics"]),
                     _speeds(record, "verilator"), _bare_text(record), _speeds(record, "icarus"),
                     area["cells"], f"{area['cells'] / units:.0f}/{block.area_unit}",
                     fmax_text(record.get("pnr_ecp5"))))
    print(table(["block", "params", "measured (cycle-exact)", "verilator cyc/s",
                  "bare verilator cyc/s (fastest bench/bare)", "icarus cyc/s", "cells",
                  "cells per unit", "ECP5 Fmax"], rows))
    print("cyc/s: simulated cycles per wall second of test_throughput on the per-cycle bench, "
          "and after '|' of test_buffered_throughput on the buffered harness (tb.buffered), "
          "each timed over 10,000 simulated cycles or more")
    print(activity_table(records))
    _write(output, records)
    return 0


def run_demo():
    """Generate, simulate on Verilator against the golden model, synthesize; print a summary."""
    rows, status, measured_first = [], 0, {}
    for block, config, label in demo_configurations():
        out_dir = BUILD_ROOT / "demo" / f"{block.name}-{label.replace(' ', '_')}"
        generate(block, config, out_dir)
        print(f"demo: {block.name} {label}: Verilog, Verilator tests, synthesis", flush=True)
        try:
            result = run_tests(block, config, "verilator", quiet=True, measure=True)
            verdict = f"{result.tests}/{result.tests} pass"
            figures = _throughput(result)
            measured_first.setdefault(block.name, figures)
            measured = _metrics_text(figures["metrics"])
        except SimFailure as failure:
            verdict, measured, status = f"FAIL ({failure})", "-", 1
        try:
            area = synthesize(block, config, "generic", out_dir)
        except SynthError as failure:
            print(f"demo: {block.name} {label}: synthesis FAILED: {failure}", flush=True)
            area, status = {"cells": "FAIL", "flip_flops": "-", "luts": "-"}, 1
        rows.append((block.name, label, verdict, measured, area["cells"], area["flip_flops"],
                     area["luts"]))
    print()
    print("moegen demo: Verilog -> cocotb on Verilator vs NumPy golden -> Yosys (generic, LUT4)")
    print(table(["block", "params", "verilator tests", "measured (cycle-exact)", "cells",
                  "flip-flops", "LUTs"], rows))
    for block in all_blocks():
        if block.legend:
            print(f"{block.name}: {block.legend}")
    print(f"Verilog, manifests and synthesis reports: {BUILD_ROOT / 'demo'}")
    for block in all_blocks():
        for text in model_reports(block, measured_first.get(block.name)):
            print()
            print(text)
    return status
