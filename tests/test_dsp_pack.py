"""flows/dsp_pack.py: a product register moves into its ECP5 DSP's output register, operand
registers into its input registers, and only where that changes nothing (a bounded equivalence
proof of the netlists before and after)."""

import json
import subprocess

from flows.dsp_pack import pack_output_registers
from flows.synth import _yosys, synthesize_files

# Seven multipliers: product registers without a reset, under an enable or none (packed;
# `hold`'s inverse through a LUT, as the DSP's CE has no inverter), a product register with a
# reset (kept: the DSP's reset and enable are not a flip-flop's), a product that also feeds
# logic (kept: a DSP output is registered for every reader or for none), operand registers
# that feed their DSP alone (packed, with its product register: the output-stationary PE), and
# operand registers one of which also feeds an output (kept: its DSP's operands stay in fabric).
DESIGN = """
module pack_demo(input clk, input rst, input en, input hold, input signed [7:0] a,
                 input signed [7:0] b, input [9:0] c, input [9:0] d, input [9:0] e,
                 output reg signed [31:0] acc, output reg [15:0] square, output reg [19:0] ce,
                 output reg [19:0] held, output reg [19:0] kept, output wire parity,
                 output reg signed [5:0] pe, output wire [5:0] shared, output wire [2:0] seen);
  // (3-bit operands: a SAT proof through a wider multiplier whose inputs the two netlists
  // register differently does not end in minutes)
  reg signed [2:0] pa, pb;
  reg [2:0] sa, sb;
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
    if (en) begin pa <= a[2:0]; pb <= b[2:0]; pe <= pa * pb; end
    sa <= c[2:0]; sb <= d[2:0];
  end
  assign parity = ^de;
  assign shared = sa * sb;
  assign seen = sa;
endmodule
"""


def _dsp_model():
    """A behavioural MULT18X18D for the proof, as its ports and the parameters the two
    netlists use: A x B, signed per SIGNEDA/SIGNEDB, registered at CLK0 under CE0 (RST0
    clears) when REG_OUTPUT_CLK is set, and each operand likewise when its REG_INPUT*_CLK is.
    Yosys's ECP5 library has only a black box of it."""
    a = [f"A{i}" for i in range(18)]
    b = [f"B{i}" for i in range(18)]
    c = [f"C{i}" for i in range(18)]
    p = [f"P{i}" for i in range(36)]
    return f"""
module MULT18X18D({", ".join(a + b + c + p)}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK0, CE0,
                  RST0);
  input {", ".join(a + b + c)}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK0, CE0, RST0;
  output {", ".join(p)};
  parameter REG_INPUTA_CLK = "NONE";
  parameter REG_INPUTB_CLK = "NONE";
  parameter REG_INPUTA_CE = "CE0";
  parameter REG_INPUTB_CE = "CE0";
  parameter REG_INPUTA_RST = "RST0";
  parameter REG_INPUTB_RST = "RST0";
  parameter REG_OUTPUT_CLK = "NONE";
  parameter REG_OUTPUT_CE = "CE0";
  parameter REG_OUTPUT_RST = "RST0";
  parameter GSR = "ENABLED";
  wire [17:0] ain = {{{", ".join(reversed(a))}}};
  wire [17:0] bin = {{{", ".join(reversed(b))}}};
  reg [17:0] ar = 18'b0, br = 18'b0;
  always @(posedge CLK0) if (RST0) begin ar <= 18'b0; br <= 18'b0; end
                         else if (CE0) begin ar <= ain; br <= bin; end
  wire [17:0] av = REG_INPUTA_CLK == "NONE" ? ain : ar;
  wire [17:0] bv = REG_INPUTB_CLK == "NONE" ? bin : br;
  wire [35:0] ax = SIGNEDA ? {{{{18{{av[17]}}}}, av}} : {{18'b0, av}};
  wire [35:0] bx = SIGNEDB ? {{{{18{{bv[17]}}}}, bv}} : {{18'b0, bv}};
  wire [35:0] product = ax * bx;
  reg [35:0] q = 36'b0;
  always @(posedge CLK0) if (RST0) q <= 36'b0; else if (CE0) q <= product;
  assign {{{", ".join(reversed(p))}}} = REG_OUTPUT_CLK == "NONE" ? product : q;
endmodule
"""


def _flatten(tmp_path, netlist, name, top="pack_demo"):
    """The top module of a Yosys JSON netlist, flattened over the ECP5 cell models, as RTLIL."""
    (tmp_path / f"{name}.json").write_text(
        json.dumps({"modules": {top: netlist["modules"][top]}}))
    subprocess.run([_yosys(), "-q", "-p",
                    "read_verilog dsp_model.v; "
                    "read_verilog -D NO_INCLUDES +/lattice/cells_sim_ecp5.v; "
                    f"read_json {name}.json; hierarchy -top {top}; proc; flatten; "
                    f"opt_clean; rename {top} {name}; write_rtlil {name}.il"],
                   cwd=tmp_path, check=True, capture_output=True)


def _same_for_steps(tmp_path, gold, gate, steps=4):
    """Whether the two flattened designs give the same outputs for every input sequence of
    ``steps`` cycles from power-on (a SAT proof). ``pack_demo``'s deepest path is two
    registers (a -> prod -> acc, a -> pa -> pe): 4 steps reach every output from every input
    with a cycle to spare (8 took 51 s instead of 16, the multipliers' SAT growing per step)."""
    proc = subprocess.run([_yosys(), "-p",
                           f"read_rtlil {gold}.il; read_rtlil {gate}.il; "
                           f"miter -equiv -flatten -make_assert {gold} {gate} miter; "
                           f"hierarchy -top miter; "
                           f"sat -verify -prove-asserts -set-init-zero -seq {steps} miter"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert "SUCCESS" in proc.stdout or "FAIL" in proc.stdout, proc.stdout[-2000:]
    return proc.returncode == 0


def _synthesized(tmp_path, top, verilog):
    """``verilog`` synthesized for ECP5 (with the DSP model beside it for the proofs): two
    copies of its JSON netlist, one to keep and one to pack."""
    (tmp_path / f"{top}.v").write_text(verilog)
    (tmp_path / "dsp_model.v").write_text(_dsp_model())
    synthesize_files([tmp_path / f"{top}.v"], top, "ecp5", tmp_path, top, netlist=f"{top}.json")
    return (json.loads((tmp_path / f"{top}.json").read_text()),
            json.loads((tmp_path / f"{top}.json").read_text()))


def test_a_product_register_moves_into_its_dsp_and_nothing_else_does(tmp_path):
    before, after = _synthesized(tmp_path, "pack_demo", DESIGN)

    # prod's and square's 16 bits each, ce's 20, pe's 6, pa's and pb's 3 each; no others
    assert pack_output_registers(after) == 2 * 16 + 20 + 6 + 2 * 3
    module = after["modules"]["pack_demo"]
    cells, ports = module["cells"], module["ports"]
    dsps = [c for c in cells.values() if c["type"] == "MULT18X18D"]
    packed = [c for c in dsps if c["parameters"].get("REG_OUTPUT_CLK") == "CLK0"]
    inputs = [c for c in dsps if c["parameters"].get("REG_INPUTA_CLK") == "CLK0"]
    assert len(dsps) == 7 and len(packed) == 4 and len(inputs) == 1
    assert inputs[0] in packed and inputs[0]["parameters"]["REG_INPUTB_CLK"] == "CLK0"
    # pa and pb were loaded from the ports a and b: the DSP now reads them
    operand_bits = {bit for pin in [f"A{i}" for i in range(18)] + [f"B{i}" for i in range(18)]
                    for bit in inputs[0]["connections"].get(pin, [])}
    assert set(ports["a"]["bits"]) | set(ports["b"]["bits"]) >= operand_bits - {"0"}
    assert all(c["connections"]["CLK0"] == ports["clk"]["bits"] for c in packed)
    enables = [c["connections"]["CE0"] for c in packed]
    assert ["1"] in enables                               # ce loads at every edge
    inverted = [c for c in cells.values()
                if c["type"] == "LUT4" and c["connections"]["Z"] in enables]
    assert len(inverted) <= 1 and ports["en"]["bits"] in enables + [
        c["connections"]["A"] for c in inverted]
    ffs = [c for c in cells.values() if c["type"] == "TRELLIS_FF"]
    assert len(ffs) == sum(c["type"] == "TRELLIS_FF"
                           for c in before["modules"]["pack_demo"]["cells"].values()) - 64
    assert pack_output_registers(after) == 0              # done once

    _flatten(tmp_path, before, "before")
    _flatten(tmp_path, after, "after")
    assert _same_for_steps(tmp_path, "before", "after")
    # The proof can fail: the DSP's registers loading at every edge, not under `en`, differ;
    # so do pe's operands registered once more.
    broken = json.loads(json.dumps(after))
    for cell in broken["modules"]["pack_demo"]["cells"].values():
        if cell["parameters"].get("REG_OUTPUT_CLK") == "CLK0":
            cell["connections"]["CE0"] = ["1"]
    _flatten(tmp_path, broken, "broken")
    assert not _same_for_steps(tmp_path, "before", "broken")
    inputs[0]["parameters"]["REG_OUTPUT_CLK"] = "NONE"
    _flatten(tmp_path, after, "unpipelined")
    assert not _same_for_steps(tmp_path, "before", "unpipelined")


# A chain: one DSP's product register alone feeds the next DSP's operand pins, so it could be
# packed as the first DSP's output register or as the second's input register; it must be one
# of them, never both (the second DSP's pins would read a net nothing drives any more).
CHAIN = """
module pack_chain(input clk, input [2:0] a, input [2:0] b, input [2:0] c,
                  output reg [8:0] out);
  reg [5:0] q;
  reg [2:0] r;
  always @(posedge clk) begin
    q <= a * b;
    r <= c;
    out <= q * r;
  end
endmodule
"""


def test_a_register_between_two_dsps_is_packed_into_one_of_them(tmp_path):
    before, after = _synthesized(tmp_path, "pack_chain", CHAIN)
    removed = pack_output_registers(after)
    module = after["modules"]["pack_chain"]
    dsps = [c for c in module["cells"].values() if c["type"] == "MULT18X18D"]
    assert len(dsps) == 2
    # q's 6 bits as the first DSP's output register, or with r's 3 as the second's inputs;
    # out's 9 bits as the second's output register either way
    assert removed in (6 + 9, 6 + 3 + 9)
    ffs = sum(c["type"] == "TRELLIS_FF" for c in module["cells"].values())
    assert ffs == sum(c["type"] == "TRELLIS_FF"
                      for c in before["modules"]["pack_chain"]["cells"].values()) - removed
    driven = {bit for cell in module["cells"].values()
              for port, bits in cell["connections"].items()
              if cell["port_directions"].get(port) == "output" for bit in bits}
    driven |= {bit for port in module["ports"].values() if port["direction"] == "input"
               for bit in port["bits"]}
    for dsp in dsps:                    # every operand pin reads a driven net or a constant
        for pin in [f"{x}{i}" for x in "AB" for i in range(18)]:
            for bit in dsp["connections"].get(pin, []):
                assert isinstance(bit, str) or bit in driven, (pin, bit)
    _flatten(tmp_path, before, "before", "pack_chain")
    _flatten(tmp_path, after, "after", "pack_chain")
    assert _same_for_steps(tmp_path, "before", "after", steps=6)
