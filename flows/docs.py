"""`moegen docs`: the generated tables of the documentation.

The prose of ``docs/blocks/<family>.md`` is written by hand, once; the tables are generated
between markers so they cannot drift from the code and the measurements:

* ``<!-- moegen:params BLOCK -->``: the parameter table, from the registry (:func:`hw.params.describe`);
* ``<!-- moegen:ports BLOCK -->``: every port of the default configuration with its width and,
  for a stream's payload, every field's bit range, from the hardware's signature (the manifest's
  ports, :func:`flows.verilog.manifest`);
* ``<!-- moegen:figures BLOCK -->``: the figure table, from ``docs/bench.json``, the record of the
  last ``make bench`` (``moegen docs --bench build/bench.json`` copies a new one in);
* ``<!-- moegen:blocks -->`` (README): the block table with a link to each family's page;
* ``<!-- moegen:mutation BLOCK -->`` and ``<!-- moegen:mutation -->`` (every block): the mutation
  score, from ``docs/mutation.json``, the record of the last ``make mutate``
  (``moegen docs --mutation build/mutation.json`` copies a new one in).

``tests/test_architecture.py`` fails when the committed docs differ from what this writes.
"""

import json
import math
import re
from pathlib import Path

from flows.pnr import fmax_text
from flows.toolchain import REPO_ROOT
from flows.verilog import manifest, manifest_streams
from hw.params import describe, format_value, parse_params
from hw.registry import all_blocks, get_block

__all__ = ["DOCS", "BENCH_RECORD", "render", "update", "stale_files"]

DOCS = REPO_ROOT / "docs"
BENCH_RECORD = DOCS / "bench.json"
MUTATION_RECORD = DOCS / "mutation.json"
_MARKER = re.compile(r"(<!-- moegen:(\w+)(?: (\w+))? -->\n)(.*?)(<!-- /moegen:\2 -->)", re.S)


def _md_table(headers, rows):
    def cell(value):
        return str(value).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _params_table(name):
    block = get_block(name)
    return _md_table(["parameter", "default", "allowed", "meaning"],
                     [(f"`{n}`", f"`{d}`", a, doc) for n, d, a, doc in describe(block.config)])


_INDEX_NAMES = "jkmn"                # of a payload field's array indices (i: a stream array's)


def _affine(c, strides, names):
    """``s0*j + s1*k + ... + c`` as text (``8j+8``; a 0 and strides of 0 left out)."""
    terms = [f"{s}{n}" if s != 1 else n for s, n in zip(strides, names) if s]
    return "+".join(terms + ([str(c)] if c or not terms else []))


def _field_text(parts, lsb, width, signed, strides=(), counts=()):
    """One field (or array of fields: ``#`` parts are its indices j, k, ...) as text."""
    names = iter(_INDEX_NAMES[:len(counts)])
    shown = ""
    for part in parts:
        if part == "#" or part.isdigit():
            shown += f"[{next(names) if part == '#' else part}]"
        else:
            shown += ("." if shown else "") + part
    names = _INDEX_NAMES[:len(counts)]
    bits = _affine(lsb, strides, names)
    if width > 1:
        bits += ".." + _affine(lsb + width - 1, strides, names)
    ranges = "".join(f", {n} = 0..{count - 1}" for n, count in zip(names, counts))
    return f"`{shown}` [{bits}]{' signed' if signed else ''}{ranges}"


def _fields_text(fields):
    """A payload's leaf fields, each array of like fields as one entry with its bit range as
    a function of its indices (``w[j] [8j..8j+7] signed, j = 0..63``) where it is one."""
    groups = {}
    for f in fields:
        parts = f["field"].split(".")
        template = tuple("#" if p.isdigit() else p for p in parts)
        index = tuple(int(p) for p in parts if p.isdigit())
        groups.setdefault(template, []).append((index, f))
    out = []
    for template, members in groups.items():
        first = members[0][1]
        width, signed = first["msb"] - first["lsb"] + 1, first["signed"]
        if not members[0][0]:
            out += [_field_text(template, f["lsb"], f["msb"] - f["lsb"] + 1, f["signed"])
                    for _, f in members]
            continue
        dims = len(members[0][0])
        counts = [max(index[d] for index, _ in members) + 1 for d in range(dims)]
        by_index = {index: f for index, f in members}
        base = by_index.get((0,) * dims)
        strides = []
        for d in range(dims):
            unit = tuple(int(d == e) for e in range(dims))
            strides.append(by_index[unit]["lsb"] - base["lsb"] if base and unit in by_index
                           else 0)
        regular = base is not None and len(members) == math.prod(counts) and all(
            f["lsb"] == base["lsb"] + sum(s * i for s, i in zip(strides, index))
            and f["msb"] - f["lsb"] + 1 == width and f["signed"] == signed
            for index, f in members)
        if regular:
            out.append(_field_text(template, base["lsb"], width, signed, strides, counts))
        else:
            out += [_field_text(tuple(f["field"].split(".")), f["lsb"],
                                f["msb"] - f["lsb"] + 1, f["signed"]) for _, f in members]
    return "; ".join(out)


def _ports_table(name):
    """The default configuration's ports: a stream as one row (its payload's fields with their
    bit ranges), an array of like streams as one row."""
    block = get_block(name)
    config = block.config()
    streams, others = manifest_streams(manifest(block, config, block.build(config))["ports"])
    rows, arrays = [], {}
    for stream, triple in streams.items():
        base, _, index = stream.rpartition("__")
        key = base if index.isdigit() else stream
        payload = triple["payload"]
        shape = (payload["direction"], payload["width"], _fields_text(payload.get("fields", [])))
        arrays.setdefault(key, []).append((shape, stream))
    for key, members in arrays.items():
        (direction, width, fields), stream = members[0]
        if len(members) > 1 and all(shape == members[0][0] for shape, _ in members):
            port = f"`{key}[i]`, i = 0..{len(members) - 1} (`{key}__<i>__…`)"
            rows.append((port, f"{direction}, stream", width, fields or "-"))
        else:
            rows += [(f"`{s}`", f"{d}, stream", w, f or "-") for (d, w, f), s in members]
    rows += [(f"`{p['name']}`", p["direction"], p["width"], "-") for p in others]
    note = (f"Ports of the default configuration, from the hardware (`moegen verilog {name} -p "
            f"NAME=VALUE` writes any configuration's in its manifest, `{name}.json`). A stream `s` "
            "is the Verilog ports `s__valid`, `s__ready` and `s__payload`, a transfer at a "
            "rising edge of `clk` with both high; `rst` resets synchronously, active high. "
            "Bits are of the payload, bit 0 its least significant; signed fields are two's "
            "complement.\n\n")
    return note + _md_table(["port", "direction", "payload bits", "fields [bits]"], rows)


def _metric_text(metrics):
    return "; ".join(f"{k} {format_value(v) if isinstance(v, (list, tuple)) else v}"
                     for k, v in metrics.items())


def _speed(record, simulator):
    if simulator not in record:             # only partial runs' other figures
        return "-"
    text = f"{record[simulator]['sim_cycles_per_second']:,.0f}"
    if f"{simulator}_buffered" in record:
        text += f" | {record[simulator + '_buffered']['sim_cycles_per_second']:,.0f}"
    return text


def _figures_table(name, bench):
    records = [r for r in bench.get("results", []) if r["block"] == name]
    if not records:
        return f"No `make bench` record of `{name}` yet (run `make bench`, then `moegen docs --bench build/bench.json`).\n"
    block = get_block(name)
    rows = []
    for r in records:
        if "synth_generic" not in r:        # only a partial run's figures (activity, pnr)
            continue
        # A configuration measured only by partial runs has no count of its units recorded.
        units = r.get(block.area_unit + "s") or block.area_units(
            parse_params(block.config, r["params"].split()))
        area = r["synth_generic"]
        bare = r.get("bare_verilator_cycles_per_second")
        # Gate by gate (no ABC): an unoptimized upper bound, marked so.
        # Older records do not say: the block's rule for the record's configuration.
        abc = area["abc"] if "abc" in area else block.abc(
            parse_params(block.config, r["params"].split()))
        mapped = "" if abc else " (gate by gate)"
        measured = _metric_text(r["verilator"]["metrics"]) if "verilator" in r else "-"
        rows.append((r["params"] or "defaults", measured,
                     _speed(r, "verilator") + (f" of {bare:,.0f} bare" if bare else ""),
                     _speed(r, "icarus"),
                     f"{area['cells']:,}{mapped}", f"{area['flip_flops']:,}",
                     f"{area['luts']:,}{mapped}",
                     f"{area['cells'] / units:,.0f} per {block.area_unit}",
                     fmax_text(r.get("pnr_ecp5"))))
    full = [r for r in records if "synth_generic" in r] or records
    when = full[0].get("generated", bench.get("generated", "?"))
    # A later `moegen bench --only PART` run stamps the figures it re-measured.
    later = []
    for key, what in (("verilator", "the `test_throughput` figures"),
                      ("synth_generic", "the synthesis figures"),
                      ("pnr_ecp5", "the Fmax figures"),
                      ("activity", "the switching-activity figures")):
        again = sorted({r[key]["generated"] for r in full
                        if (r.get(key) or {}).get("generated", when) != when})
        if again:
            later.append(f"{what} of {', '.join(again)}")
    if later:
        when += f" ({'; '.join(later)})"
    note = (f"From `make bench` of {when} (docs/bench.json): figures "
            "measured by `test_throughput` on Verilator and asserted against the golden cycle "
            "model; simulated cycles per wall-clock second on both simulators, each timed over "
            "10,000 simulated cycles or more of the whole test, its set-up and golden model "
            "included (`test_throughput` run again from its reset until then, "
            "`tb.harness.long_enough_to_time`; noisy: compare within one run; after a "
            "`|`, `test_buffered_throughput` on the buffered harness, `tb/buffered.py`, its "
            "10k-cycle saturated run alone, the median of three on Verilator); Yosys generic "
            "synthesis (`synth -lut 4`, the logic mapped by ABC unless marked gate by gate: an "
            "unoptimized upper bound); ECP5 Fmax: nextpnr on an "
            "LFE5U-85F-6 out of context, seed 1 (`moegen synth BLOCK --target ecp5 --pnr`); "
            "a dash: not measured in that run.\n\n")
    text = note + _md_table(["params", "measured (cycle-exact)", "Verilator cycles/s",
                             "Icarus cycles/s", "cells", "flip-flops", "LUTs", "cells per unit",
                             "ECP5 Fmax"], rows)
    activity = [r for r in records if r.get("activity")]
    if activity:
        text += ("\nSwitching activity per operation (`flows/activity.py`): bit flips of every "
                 "net, clock and reset excepted, over the whole `test_throughput` on Verilator, "
                 "divided by the operations it performs; per part (submodules at the top of the "
                 "hierarchy) and, on the 3D build, per tier. A relative energy indicator for "
                 "comparing configurations and formats, not a power estimate.\n\n")
        rows = []
        for r in activity:
            act = r["activity"]
            parts = ", ".join(f"{name} {value}" for name, value
                              in act["parts_flips_per_operation"].items())
            tiers = " / ".join(str(v) for v in act.get("tiers_flips_per_operation", {}).values())
            rows.append((r["params"] or "defaults", act["operation"], f"{act['operations']:,}",
                         act["flips_per_operation"], act["flips_per_cycle"], parts,
                         tiers or "-"))
        text += _md_table(["params", "operation", "operations", "flips per operation",
                           "flips per cycle", "per part (flips per operation)",
                           "tiers top / bottom (flips per operation)"], rows)
    return text


def _blocks_table():
    return _md_table(["block", "family page", "what it is"],
                     [(f"`{b.name}`", f"[docs/blocks/{b.family}.md](docs/blocks/{b.family}.md)",
                       b.summary) for b in all_blocks()])


def _score(entry):
    return "n/a" if entry["score"] is None else f"{100 * entry['score']:.0f}%"


def _mutation_row(entry):
    params = ", ".join(f"{k}={v}" for k, v in sorted(entry["params"].items()))
    netlist = entry.get("sampled_on", "?") + (f" (`{entry['verilog']}`)"
                                              if entry.get("verilog") else "")
    return (f"`{entry['block']}`", params, entry["simulator"], netlist, entry["sampled"],
            entry["killed"], entry["survived"], entry["equivalent"], _score(entry))


# "sampled": the day of the sample and a digest of the Verilog it was drawn from
# (flows.mutate.verilog_digest), so a reader can tell a record of today's netlist from an
# older one.
_MUTATION_HEADERS = ["block", "configuration", "simulator", "sampled", "mutants", "killed",
                     "survived", "equivalent", "score"]


def _mutation_table(name, record):
    if name is None:
        if not record:
            return "No `make mutate` record yet.\n"
        return _md_table(_MUTATION_HEADERS, [_mutation_row(record[b]) for b in sorted(record)])
    entry = record.get(name)
    if entry is None:
        return (f"No `make mutate` record of `{name}` yet (run `make mutate`, then "
                f"`moegen docs --mutation build/mutation.json`).\n")
    survivors = "".join(f"- mutant {m['index']}: `{m['mutation']}` ({m['how']})\n"
                        for m in entry["survivors"])
    return (_md_table(_MUTATION_HEADERS, [_mutation_row(entry)]) +
            ("\nSurvivors (no test failed; not proven equivalent):\n\n" + survivors
             if survivors else ""))


def render(text, bench, mutation=None):
    """``text`` with every marked table regenerated."""
    mutation = mutation or {}

    def fill(match):
        kind, name = match.group(2), match.group(3)
        if kind == "mutation":
            body = _mutation_table(name, mutation)
        elif kind == "params":
            body = _params_table(name)
        elif kind == "ports":
            body = _ports_table(name)
        elif kind == "figures":
            body = _figures_table(name, bench)
        elif kind == "blocks":
            body = _blocks_table()
        else:
            raise ValueError(f"unknown docs marker 'moegen:{kind}'")
        return match.group(1) + body + match.group(5)
    return _MARKER.sub(fill, text)


def _files():
    return [REPO_ROOT / "README.md", DOCS / "mutation.md",
            *sorted((DOCS / "blocks").glob("*.md"))]


def _bench():
    return json.loads(BENCH_RECORD.read_text()) if BENCH_RECORD.exists() else {}


def _mutation():
    return json.loads(MUTATION_RECORD.read_text()) if MUTATION_RECORD.exists() else {}


def merge_bench(old, new):
    """The bench record with ``new``'s blocks replacing ``old``'s (a `moegen bench --block`
    run updates only its blocks); every record keeps the time of the run that measured it.
    A partial record (`moegen bench --only PART`) adds its figures, each with its own time, to
    the recorded configuration of the same block and parameters."""
    def stamped(record):
        return [{"generated": record.get("generated", "?"), **r}
                for r in record.get("results", [])]
    fresh = [r for r in stamped(new) if not r.get("partial")]
    blocks = {r["block"] for r in fresh}
    kept = [r for r in stamped(old) if r["block"] not in blocks]
    results = kept + fresh
    for partial in (r for r in stamped(new) if r.get("partial")):
        record = next((r for r in results if (r["block"], r["params"])
                       == (partial["block"], partial["params"])), None)
        if record is None:                  # a configuration no full run has measured yet
            record = {"generated": partial["generated"], "block": partial["block"],
                      "params": partial["params"]}
            results.append(record)
        if "activity" in partial:
            record.pop("tier_activity", None)   # the older per-tier-only figure
        for key, value in partial.items():
            if key not in ("block", "params", "partial", "generated"):
                # A figure (the bare loop's speed) is dated by the figures measured with it.
                record[key] = ({**value, "generated": partial["generated"]}
                               if isinstance(value, dict) else value)
    return {"generated": new.get("generated", "?") if fresh else old.get("generated", "?"),
            "results": results}


def stale_files():
    """The documentation files whose generated tables differ from what :func:`update` writes."""
    bench, mutation = _bench(), _mutation()
    return [path for path in _files()
            if render(path.read_text(), bench, mutation) != path.read_text()]


def update(bench_json=None, mutation_json=None):
    """Regenerate every table (after copying ``bench_json`` to docs/bench.json and merging
    ``mutation_json`` into docs/mutation.json, if given); returns the files that changed."""
    if bench_json is not None:
        BENCH_RECORD.write_text(json.dumps(merge_bench(_bench(), json.loads(
            Path(bench_json).read_text())), indent=2) + "\n")
    if mutation_json is not None:
        MUTATION_RECORD.write_text(json.dumps(
            {**_mutation(), **json.loads(Path(mutation_json).read_text())},
            indent=2, sort_keys=True) + "\n")
    bench, mutation = _bench(), _mutation()
    changed = []
    for path in _files():
        text = path.read_text()
        new = render(text, bench, mutation)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
