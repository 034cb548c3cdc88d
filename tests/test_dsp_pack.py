"""flows/dsp_pack.py: a product register moves into its ECP5 DSP's output register, and only
where that changes nothing (a bounded equivalence proof of the netlists before and after)."""

import json
import subprocess

from flows.dsp_pack import pack_output_registers
from flows.synth import _yosys, synthesize_files

# Five multipliers: product registers without a reset, under an enable or none (packed;
# `hold`'s inverse through a LUT, as the DSP's CE has no inverter), a product register with a
# reset (kept: the DSP's reset and enable are not a flip-flop's), and a product that also feeds
# logic (kept: a DSP output is registered for every reader or for none).
DESIGN = """
module pack_demo(input clk, input rst, input en, input hold, input signed [7:0] a,
                 input signed [7:0] b, input [9:0] c, input [9:0] d, input [9:0] e,
                 output reg signed [31:0] acc, output reg [15:0] square, output reg [19:0] ce,
                 output reg [19:0] held, output reg [19:0] kept, output wire parity);
  reg signed [15:0] prod = 0;
  wire [19:0] cd = c * d;
  wire [19:0] de = d * e;
  always @(posedge clk) begin
    if (en) prod <= a * b;
    if (!hold) square <= a * a;
    ce <= c * e;
    if (rst) acc <= 0; else if (en) acc <= acc + prod;
    if (rst) held <= 0; else held <= cd;
    kept <= de;
  end
  assign parity = ^de;
endmodule
"""


def _dsp_model():
    """A behavioural MULT18X18D for the proof, as its ports and the parameters the two
    netlists use: A x B, signed per SIGNEDA/SIGNEDB, registered at CLK0 under CE0 (RST0
    clears) when REG_OUTPUT_CLK is set. Yosys's ECP5 library has only a black box of it."""
    a = [f"A{i}" for i in range(18)]
    b = [f"B{i}" for i in range(18)]
    c = [f"C{i}" for i in range(18)]
    p = [f"P{i}" for i in range(36)]
    return f"""
module MULT18X18D({", ".join(a + b + c + p)}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK0, CE0,
                  RST0);
  input {", ".join(a + b + c)}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK0, CE0, RST0;
  output {", ".join(p)};
  parameter REG_OUTPUT_CLK = "NONE";
  parameter REG_OUTPUT_CE = "CE0";
  parameter REG_OUTPUT_RST = "RST0";
  parameter GSR = "ENABLED";
  wire [17:0] av = {{{", ".join(reversed(a))}}};
  wire [17:0] bv = {{{", ".join(reversed(b))}}};
  wire [35:0] ax = SIGNEDA ? {{{{18{{av[17]}}}}, av}} : {{18'b0, av}};
  wire [35:0] bx = SIGNEDB ? {{{{18{{bv[17]}}}}, bv}} : {{18'b0, bv}};
  wire [35:0] product = ax * bx;
  reg [35:0] q = 36'b0;
  always @(posedge CLK0) if (RST0) q <= 36'b0; else if (CE0) q <= product;
  assign {{{", ".join(reversed(p))}}} = REG_OUTPUT_CLK == "NONE" ? product : q;
endmodule
"""


def _flatten(tmp_path, netlist, name):
    """The top module of a Yosys JSON netlist, flattened over the ECP5 cell models, as RTLIL."""
    (tmp_path / f"{name}.json").write_text(
        json.dumps({"modules": {"pack_demo": netlist["modules"]["pack_demo"]}}))
    subprocess.run([_yosys(), "-q", "-p",
                    "read_verilog dsp_model.v; "
                    "read_verilog -D NO_INCLUDES +/lattice/cells_sim_ecp5.v; "
                    f"read_json {name}.json; hierarchy -top pack_demo; proc; flatten; "
                    f"opt_clean; rename pack_demo {name}; write_rtlil {name}.il"],
                   cwd=tmp_path, check=True, capture_output=True)


def _same_for_steps(tmp_path, gold, gate, steps=8):
    """Whether the two flattened designs give the same outputs for every input sequence of
    ``steps`` cycles from power-on (a SAT proof)."""
    proc = subprocess.run([_yosys(), "-p",
                           f"read_rtlil {gold}.il; read_rtlil {gate}.il; "
                           f"miter -equiv -flatten -make_assert {gold} {gate} miter; "
                           f"hierarchy -top miter; "
                           f"sat -verify -prove-asserts -set-init-zero -seq {steps} miter"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert "SUCCESS" in proc.stdout or "FAIL" in proc.stdout, proc.stdout[-2000:]
    return proc.returncode == 0


def test_a_product_register_moves_into_its_dsp_and_nothing_else_does(tmp_path):
    (tmp_path / "pack_demo.v").write_text(DESIGN)
    (tmp_path / "dsp_model.v").write_text(_dsp_model())
    synthesize_files([tmp_path / "pack_demo.v"], "pack_demo", "ecp5", tmp_path, "pack_demo",
                     netlist="pack_demo.json")
    before = json.loads((tmp_path / "pack_demo.json").read_text())
    after = json.loads((tmp_path / "pack_demo.json").read_text())

    assert pack_output_registers(after) == 52            # prod's, square's and ce's, no others
    module = after["modules"]["pack_demo"]
    cells, ports = module["cells"], module["ports"]
    dsps = [c for c in cells.values() if c["type"] == "MULT18X18D"]
    packed = [c for c in dsps if c["parameters"].get("REG_OUTPUT_CLK") == "CLK0"]
    assert len(dsps) == 5 and len(packed) == 3
    assert all(c["connections"]["CLK0"] == ports["clk"]["bits"] for c in packed)
    enables = [c["connections"]["CE0"] for c in packed]
    assert ["1"] in enables                               # ce loads at every edge
    inverted = [c for c in cells.values()
                if c["type"] == "LUT4" and c["connections"]["Z"] in enables]
    assert len(inverted) <= 1 and ports["en"]["bits"] in enables + [
        c["connections"]["A"] for c in inverted]
    ffs = [c for c in cells.values() if c["type"] == "TRELLIS_FF"]
    assert len(ffs) == sum(c["type"] == "TRELLIS_FF"
                           for c in before["modules"]["pack_demo"]["cells"].values()) - 52
    assert pack_output_registers(after) == 0              # done once

    _flatten(tmp_path, before, "before")
    _flatten(tmp_path, after, "after")
    assert _same_for_steps(tmp_path, "before", "after")
    # The proof can fail: the DSP's register loading at every edge, not under `en`, differs.
    for cell in packed:
        cell["connections"]["CE0"] = ["1"]
    _flatten(tmp_path, after, "broken")
    assert not _same_for_steps(tmp_path, "before", "broken")
