"""`moegen mutate`: Yosys mutants of a block's netlist run against its cocotb suite on both
simulators; survivors go to the equivalence proofs (Yosys's SAT, ABC), which must never call
a killed mutant equivalent."""

import hashlib
import json
import time

import pytest

from flows.cli import main
from flows.mutate import (abc_proof, equivalence, proven_locally, run_mutation, sample,
                          unchanged)
from hw.registry import get_block


@pytest.mark.parametrize("simulator, count", [("verilator", 2), ("icarus", 2)])
def test_mutants_are_killed_by_the_suite_or_proven_equivalent(simulator, count, tmp_path):
    block = get_block("logfmt_decoder")
    report = run_mutation(block, block.config(lanes=1), count=count, simulator=simulator,
                          jobs=1, progress=lambda text: None, out_root=tmp_path)
    verdicts = [m["verdict"] for m in report["mutants"]]
    assert len(verdicts) == report["sampled"] == count
    assert report["killed"] == verdicts.count("killed") >= 1
    assert report["killed"] + report["survived"] + report["equivalent"] == count
    assert report["score"] == report["killed"] / (report["killed"] + report["survived"])
    merged = json.loads((tmp_path / "mutation.json").read_text())
    assert merged["logfmt_decoder"]["killed"] == report["killed"]
    # the record names the netlist it is of: `moegen verilog` of the same configuration
    # today (docs/mutation.md tells readers to compare the two)
    assert main(["verilog", "logfmt_decoder", "-p", "lanes=1", "-o", str(tmp_path / "v")]) == 0
    assert merged["logfmt_decoder"]["verilog"] == \
        hashlib.sha256((tmp_path / "v" / "logfmt_decoder.v").read_bytes()).hexdigest()[:12]
    assert merged["logfmt_decoder"]["sampled_on"] == time.strftime("%Y-%m-%d", time.gmtime())
    if simulator == "verilator":
        # (Since the decoder's dead low bits were removed, none of these two is equivalent;
        # test_a_dead_bit_is_proven_equivalent checks that verdict.)
        # The check is sound where the suite has the last word: a mutant some test failed
        # must differ from the original.
        rtl = tmp_path / "mutation" / next((tmp_path / "mutation").iterdir()).name / simulator
        rtl = rtl / "rtl"
        lines = (rtl / "mutations.txt").read_text().splitlines()
        killed = [m["index"] for m in report["mutants"] if m["verdict"] == "killed"][:2]
        for index in killed:
            assert equivalence(rtl / "logfmt_decoder.v", "logfmt_decoder", lines[index - 1],
                               rtl, 100 + index) == "different"


def test_a_bit_tied_to_the_constant_it_had_is_unchanged_without_a_proof(tmp_path):
    """``y <= a ? 1'b0 : b``: tying the constant 0 to 0 changes nothing; tying it to 1 does,
    and the SAT check finds the difference."""
    (tmp_path / "t.v").write_text("module t(input clk, input a, input b, output reg y);\n"
                                  "  always @(posedge clk) y <= a ? 1'b0 : b;\nendmodule\n")
    cell = "-module t -cell $ternary$t.v:2$2 -port B -portbit 0"
    tie0, tie1 = f"mutate -mode const0 {cell}", f"mutate -mode const1 {cell}"
    assert unchanged(tmp_path / "t.v", "t", tie0, tmp_path, 1)
    assert equivalence(tmp_path / "t.v", "t", tie0, tmp_path, 1) == "unchanged"
    assert not unchanged(tmp_path / "t.v", "t", tie1, tmp_path, 2)
    assert equivalence(tmp_path / "t.v", "t", tie1, tmp_path, 2) == "different"


def test_a_bit_masked_where_it_matters_is_proven_equivalent(tmp_path):
    """``w = a + 1``, whose bit 1 is read only when ``a = 3``, where it is 0: tying bit 1 to 0
    changes the netlist (``prep`` keeps the bit: it is read) but no output, and the SAT check
    proves it (by induction); tying it to 1, or bit 0 to 0, does not."""
    # (y starts at 0, as every Amaranth register has its init value.)
    (tmp_path / "t.v").write_text("module t(input clk, input [1:0] a, output reg y = 1'b0);\n"
                                  "  wire [1:0] w = a + 2'd1;\n"
                                  "  always @(posedge clk) y <= a == 2'd3 ? w[1] : w[0];\n"
                                  "endmodule\n")
    cell = "-module t -cell $add$t.v:2$1 -port Y -portbit"
    masked, live = f"mutate -mode const0 {cell} 1", f"mutate -mode const0 {cell} 0"
    assert not unchanged(tmp_path / "t.v", "t", masked, tmp_path, 1)
    assert equivalence(tmp_path / "t.v", "t", masked, tmp_path, 1) == "equivalent"
    assert equivalence(tmp_path / "t.v", "t", live, tmp_path, 2) == "different"
    assert equivalence(tmp_path / "t.v", "t", f"mutate -mode const1 {cell} 1", tmp_path,
                       3) == "different"


def test_a_bit_nothing_reads_is_not_sampled(tmp_path):
    """``prep`` (MCY's preparation) trims a sum's bit nothing reads before sampling, as
    synthesis would, so no mutant sits on it."""
    (tmp_path / "t.v").write_text("module t(input clk, input [1:0] a, output reg y);\n"
                                  "  wire [1:0] w = a + 2'd1;\n"
                                  "  always @(posedge clk) y <= w[0];\nendmodule\n")
    lines = sample(tmp_path / "t.v", "t", 40, 1, tmp_path)
    assert lines and not any("-cell $add" in line and "-portbit 1" in line and "-port Y" in line
                             for line in lines)


@pytest.mark.parametrize("argv, words", [
    (["mutate"], "give one block name or --all"),
    (["mutate", "pmu", "-n", "0"], "option '-n': got 0"),
    (["mutate", "pmu", "--jobs", "0"], "option '--jobs': got 0"),
    (["mutate", "--all", "-p", "banks=2"], "option '-p': not allowed with --all"),
    (["mutate", "pmu", "-p", "banks=0"], "parameter 'banks': got 0"),
])
def test_bad_mutate_arguments_get_one_line_and_status_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_bit_xored_with_a_constant_neighbour_is_proven_signal_by_signal(tmp_path):
    """``y <= (a ? 3'b100 : 3'b000) ^ b``: XORing the select's bit 2 with its bit 0 (always 0)
    changes the netlist but no signal: the local proof (``equiv_simple``, pair by pair) settles
    it. XORing bit 1 with bit 2 (which is ``a``) is a real difference. A flip-flop's clock tied
    off is never called equivalent: Yosys's SAT model steps every flip-flop whatever drives its
    clock, so both proofs would wrongly pass it."""
    (tmp_path / "t.v").write_text(
        "module t(input clk, input a, input [2:0] b, output reg [2:0] y = 3'b0);\n"
        "  always @(posedge clk) y <= (a ? 3'b100 : 3'b000) ^ b;\nendmodule\n")
    cell = "-module t -cell $ternary$t.v:2$2 -port Y"
    constant = f"mutate -mode cnot1 {cell} -portbit 2 -ctrlbit 0"
    live = f"mutate -mode cnot1 {cell} -portbit 1 -ctrlbit 2"
    clock = "mutate -mode const0 -module t -cell $procdff$5 -port CLK -portbit 0"
    assert proven_locally(tmp_path / "t.v", "t", constant, tmp_path, 1)
    assert equivalence(tmp_path / "t.v", "t", constant, tmp_path, 1) == "equivalent"
    assert not proven_locally(tmp_path / "t.v", "t", live, tmp_path, 2)
    assert equivalence(tmp_path / "t.v", "t", live, tmp_path, 2) == "different"
    assert proven_locally(tmp_path / "t.v", "t", clock, tmp_path, 3)     # the blind spot
    assert equivalence(tmp_path / "t.v", "t", clock, tmp_path, 3) == "undecided"


def test_a_difference_a_later_stage_hides_is_proven_by_unpairing_it(tmp_path):
    """``c = a[3] ? 4'b1111 : a; y <= c[3] ? 2'b10 : c[1:0]``: tying the clamp's bit 0 to 0
    changes ``c`` (its pair cannot be proven) but never ``y``, as ``c[3]`` is 1 wherever it
    changed (ndp_core's requantization clamp, 2026-11-26). The local proof unpairs ``c`` and
    proves ``y`` from both copies of its cone. Tying bit 3 to 0 reaches ``y``: not proven."""
    (tmp_path / "t.v").write_text(
        "module t(input clk, input [3:0] a, output reg [1:0] y = 2'b0);\n"
        "  wire [3:0] c = a[3] ? 4'b1111 : a;\n"
        "  always @(posedge clk) y <= c[3] ? 2'b10 : c[1:0];\nendmodule\n")
    cell = "-module t -cell $ternary$t.v:2$1 -port B -portbit"
    hidden, live = f"mutate -mode const0 {cell} 0", f"mutate -mode const0 {cell} 3"
    assert proven_locally(tmp_path / "t.v", "t", hidden, tmp_path, 1)
    assert (tmp_path / "local1.blacklist").read_text().split() == ["\\c"]
    assert not proven_locally(tmp_path / "t.v", "t", live, tmp_path, 2)
    assert equivalence(tmp_path / "t.v", "t", live, tmp_path, 2) == "different"


def test_only_the_pairs_the_mutation_reaches_are_proven_and_a_difference_two_registers_on_is_found(
        tmp_path):
    """``r <= a[3] ? 4'b1111 : a; y <= r[3] ? 2'b10 : r[1:0]``, mutations on the select's
    output named by cell and wire (as ``mutate -list`` writes them): the local proof gives the
    solver only the pairs the mutated wire reaches (through unpaired nets and registers), not
    every pair. Bit 2 is never read past ``r``: proven. Bit 3 reaches ``y`` through two
    registers: not proven, and the whole-design check finds the difference."""
    (tmp_path / "t.v").write_text(
        "module t(input clk, input [3:0] a, input [3:0] b, output reg [1:0] y = 2'b0,\n"
        "         output reg [3:0] z = 4'b0);\n"
        "  reg [3:0] r = 4'b0;\n"
        "  wire [3:0] c = a[3] ? 4'b1111 : a;\n"
        "  always @(posedge clk) begin r <= c; y <= r[3] ? 2'b10 : r[1:0]; z <= b + 1; end\n"
        "endmodule\n")
    cell = "-module t -cell $ternary$t.v:4$1 -port Y -portbit"
    hidden = f"mutate -mode const0 {cell} 2 -wire c -wirebit 2"
    live = f"mutate -mode const0 {cell} 3 -wire c -wirebit 3"
    assert proven_locally(tmp_path / "t.v", "t", hidden, tmp_path, 1)
    checked = (tmp_path / "local1.check").read_text().split()
    assert 0 < len(checked) < 8             # c's and r's pairs at most: never z's or y's alone
    assert not proven_locally(tmp_path / "t.v", "t", live, tmp_path, 2)
    assert equivalence(tmp_path / "t.v", "t", live, tmp_path, 2) == "different"


def test_abc_proves_a_mux_input_an_unreachable_state_guards_and_finds_a_live_difference(
        tmp_path):
    """``r`` counts 0..5 (held while ``a`` is low) and ``y <= r == 7 ? c : d``: tying ``c``
    to 0 changes nothing reachable; ABC (``scorr``, then ``pdr``, on the miter as an AIGER
    file) proves it, as it proves spiking_moe's survivors on states the layer never reaches.
    Tying ``d`` to 1 is a real difference, which pdr finds."""
    (tmp_path / "t.v").write_text(
        "module t(input clk, input a, input c, input d, output reg y = 1'b0);\n"
        "  reg [2:0] r = 3'd0;\n"
        "  always @(posedge clk) begin\n"
        "    if (a) r <= (r == 3'd5) ? 3'd0 : r + 3'd1;\n"
        "    y <= (r == 3'd7) ? c : d;\n"
        "  end\nendmodule\n")
    cell = "-module t -cell $ternary$t.v:5$6 -port"
    guarded, live = f"mutate -mode const0 {cell} B -portbit 0", \
        f"mutate -mode const1 {cell} A -portbit 0"
    assert abc_proof(tmp_path / "t.v", "t", guarded, tmp_path, 1, 60) == "equivalent"
    assert abc_proof(tmp_path / "t.v", "t", live, tmp_path, 2, 60) == "different"
    assert "Property proved" in (tmp_path / "abc1.abc.log").read_text()
