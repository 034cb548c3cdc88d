"""`moegen sweep` (flows/sweep.py): the cross product as Dask jobs, the cache, failing jobs."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from flows import sweep
from flows.cli import main
from flows.sweep import SweepUsageError, expand, job_code_digest, pareto_front, run_sweep
from hw.registry import get_block


def test_expand_is_the_cross_product_in_the_order_given():
    systolic = get_block("systolic")
    assert expand(systolic, ["rows=2,4", "cols=3", "rows=8"]) == [
        ["rows=2", "cols=3"], ["rows=4", "cols=3"], ["rows=8", "cols=3"]]
    # A list parameter takes one alternative per -p.
    assert expand(get_block("nop_tree"), ["fanouts=4,4", "fanouts=2,8"]) == [
        ["fanouts=4,4"], ["fanouts=2,8"]]
    for bad in (["bogus=1"], ["rows"], ["rows="]):
        with pytest.raises(SweepUsageError):
            expand(systolic, bad)


def test_pareto_front_keeps_only_the_undominated():
    points = [(10, 1.0), (20, 2.0), (20, 1.5), (30, 2.0), (5, 0.5), (10, 1.0)]
    assert pareto_front(points) == [0, 1, 4, 5]     # equal points both stay
    assert pareto_front([(1, 1), (2, 2)]) == [0, 1]
    assert pareto_front([(1, 2), (2, 1)]) == [0]


def test_sweep_runs_on_two_local_workers_caches_and_reports_a_failing_job(tmp_path, capsys):
    systolic = get_block("systolic")
    pairs = ["rows=2,3,0", "cols=2"]
    first = run_sweep(systolic, pairs, sim="icarus", synth="generic", output=tmp_path / "out",
                      cache_dir=tmp_path / "cache", workers=2, progress=False)
    jobs = first["results"]
    assert len(jobs) == 6 and not any(job["cached"] for job in jobs)
    failed = [job for job in jobs if not job["ok"]]
    assert {(tuple(j["params"]), j["kind"]) for j in failed} == {
        (("rows=0", "cols=2"), "sim"), (("rows=0", "cols=2"), "synth")}
    assert all(j["error"].startswith("parameter 'rows': got 0") and "\n" not in j["error"]
               for j in failed)
    rows = {row["params"]: row for row in first["rows"]}
    for r in (2, 3):
        row = rows[f"rows={r} cols=2"]
        assert row["throughput_metric"] == "macs_per_cycle" and row["cells"] > 0
        assert row["luts"] > 0 and row["cycles"] > 0
        # MACs per cycle: at most the R x C PEs, and the bench keeps them about 90 % busy.
        assert 0.8 * r * 2 < row["throughput"] <= r * 2
    assert rows["rows=3 cols=2"]["cells"] > rows["rows=2 cols=2"]["cells"]
    with open(first["paths"]["csv"]) as handle:
        table = list(csv.DictReader(handle))
    assert [r["params"] for r in table] == ["rows=2 cols=2", "rows=3 cols=2", "rows=0 cols=2"]
    assert "rows" in table[2]["errors"]
    assert json.loads(first["paths"]["json"].read_text())["rows"] == first["rows"]
    assert first["paths"]["plot"].stat().st_size > 10_000

    again = run_sweep(systolic, pairs, sim="icarus", synth="generic", output=tmp_path / "out",
                      cache_dir=tmp_path / "cache", workers=2, progress=False)
    assert [j["cached"] for j in again["results"]] == [j["ok"] for j in jobs]
    assert again["rows"] == first["rows"]


def test_cache_key_follows_every_source_a_job_runs(tmp_path, monkeypatch):
    """A job's cached figures are reused only while nothing they depend on changed: the
    generator, the synthesis and place-and-route flows, the benches (a sim job's figures)."""
    root = Path(sweep.__file__).resolve().parent.parent
    for folder in ("hw", "golden", "flows", "tb"):
        (tmp_path / folder).mkdir()
        for path in (root / folder).glob("*.py"):
            shutil.copy(path, tmp_path / folder)
    base = job_code_digest(tmp_path)
    assert base == job_code_digest(root)
    (tmp_path / "README.md").write_text("not a job's source")
    assert job_code_digest(tmp_path) == base
    seen = {base}
    for edited in ("flows/pnr.py", "flows/synth.py", "flows/dsp_pack.py", "tb/harness.py",
                   "hw/systolic.py", "golden/systolic.py"):
        path = tmp_path / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        seen.add(job_code_digest(tmp_path))
        path.write_bytes(original)
        assert job_code_digest(tmp_path) == base
    (tmp_path / "flows" / "new_flow.py").write_text("")
    seen.add(job_code_digest(tmp_path))
    assert len(seen) == 8                          # every edit gave its own key
    # job_specs puts the digest in every key: another digest, other keys.
    keys = [s["key"] for s in sweep.job_specs("systolic", [["rows=2"]], synth="generic", pnr=True)]
    monkeypatch.setattr(sweep, "job_code_digest", lambda: "other")
    again = [s["key"] for s in sweep.job_specs("systolic", [["rows=2"]], synth="generic", pnr=True)]
    assert len(set(keys)) == 2 and not set(keys) & set(again)


def test_sweep_usage_errors_are_one_line(capsys):
    assert main(["sweep", "systolic", "-p", "rows=2"]) == 2
    assert "nothing to run" in capsys.readouterr().err
    assert main(["sweep", "systolic", "-p", "bogus=2", "--synth", "generic"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'bogus'" in err
