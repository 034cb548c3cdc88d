"""Pack a multiplier's product register into its ECP5 DSP (flows/pnr.py, before nextpnr).

An ECP5 ``MULT18X18D`` has an output register of its own (``REG_OUTPUT_CLK``), but Yosys 0.70's
``synth_ecp5`` maps every multiplier with its registers off (``dsp_map_18x18.v``; only the
Nexus family has a DSP register packer, ``lattice_dsp_nexus``), so a product register lands in
fabric flip-flops and the multiplier's whole delay plus two trips of routing sit in one cycle
(docs/toolchain.md: the systolic arrays' and ndp_core's critical paths). No maintained tool
packs them for ECP5, so this does, on the synthesized JSON netlist: where every used output bit
of a ``MULT18X18D`` drives only the data input of ``TRELLIS_FF`` flip-flops that share one
clock and one enable and have neither a set/reset nor a set power-on value, those flip-flops
become the DSP's output register (the DSP's register is reset only through ``RST0``, tied to 0
here, and powers on at 0, which is what such a flip-flop does). The logic is unchanged: the
same value is registered at the same edges under the same enable. The hardware helps by
leaving its product registers without a reset (``reset_less``), which is safe wherever a
product's valid flag, which is reset, travels beside it.

The same holds for the DSP's input registers (``REG_INPUTA_CLK``, ``REG_INPUTB_CLK``): where
every non-constant bit of both operands comes from such a flip-flop whose output drives that
operand's pins of this DSP alone (the output-stationary PE's own operand registers, beside the
skew registers that also feed the next PE), the flip-flops become the DSP's input registers,
packed only for both operands together (nextpnr times a DSP with one registered operand as
one with none) and only under the clock and enable of its output register if that is packed
(a DSP's registers share ``CLK0``, ``CE0`` and ``RST0`` here). A constant operand bit must be
0, as the register powers on at 0.
"""

import itertools
from collections import defaultdict

__all__ = ["pack_output_registers"]

DSP, FF = "MULT18X18D", "TRELLIS_FF"
P_BITS = [f"P{i}" for i in range(36)]
OPERAND_BITS = {operand: [f"{operand}{i}" for i in range(18)] for operand in "AB"}


def _params(cell):
    """A cell's string parameters (Yosys's JSON ends a string that reads as binary, "1", with a
    space: "1 ")."""
    return {name: value.rstrip(" ") if isinstance(value, str) else value
            for name, value in cell["parameters"].items()}


def _packable(ff):
    """Whether a ``TRELLIS_FF`` is a plain register a DSP output register can replace: rising
    edge, no set or reset (its LSR unused or tied to 0), powering on at 0."""
    params, conns = _params(ff), ff["connections"]
    lsr = conns.get("LSR", ["0"])
    return (params.get("CLKMUX", "CLK") == "CLK" and params.get("REGSET", "RESET") == "RESET"
            and params.get("CEMUX", "CE") in ("CE", "INV", "1")
            and (params.get("LSRMUX", "LSR") == "LSR" and lsr == ["0"]))


def _enable(ff):
    """``(bit, inverted)``: what a flip-flop loads under (the bit ``"1"``: every edge)."""
    mux = _params(ff).get("CEMUX", "CE")
    if mux == "1":
        return "1", False
    return ff["connections"].get("CE", ["1"])[0], mux == "INV"


def _free_bits(module):
    """New net bits for ``module``: numbers above every bit it uses."""
    used = [bit for cell in module["cells"].values() for bits in cell["connections"].values()
            for bit in bits if isinstance(bit, int)]
    used += [bit for net in module.get("netnames", {}).values() for bit in net["bits"]
             if isinstance(bit, int)]
    used += [bit for port in module["ports"].values() for bit in port["bits"]
             if isinstance(bit, int)]
    return itertools.count(max(used, default=1) + 1)


def _inverter(source, out):
    """A ``LUT4`` giving the inverse of its input A (INIT 0x5555)."""
    return {"hide_name": 0, "type": "LUT4", "parameters": {"INIT": "0101010101010101"},
            "attributes": {},
            "port_directions": {"A": "input", "B": "input", "C": "input", "D": "input",
                                "Z": "output"},
            "connections": {"A": [source], "B": ["0"], "C": ["0"], "D": ["0"], "Z": [out]}}


def pack_output_registers(netlist):
    """Move product registers into their ``MULT18X18D``'s output register, and operand
    registers into its input registers, in place, in every module of a Yosys JSON ``netlist``
    (a dict); returns the number of flip-flops removed."""
    removed = 0
    for module in netlist["modules"].values():
        removed += _pack_module(module)
    return removed


def _pack_module(module):
    cells = module["cells"]
    sinks = defaultdict(list)            # net bit -> [(cell name, port)]; None for a module port
    for name, cell in cells.items():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if directions.get(port, "input") != "output":
                for bit in bits:
                    sinks[bit].append((name, port))
    for port in module["ports"].values():
        if port["direction"] != "input":
            for bit in port["bits"]:
                sinks[bit].append((None, port))
    renamed = {}                         # a removed flip-flop's Q bit -> the bit that replaces it
    inverters = {}                       # an enable bit -> its inverse's bit
    free = _free_bits(module)
    removed = []
    drivers = {}                         # net bit -> (cell name, port) driving it
    for name, cell in cells.items():
        for port, bits in cell["connections"].items():
            if cell.get("port_directions", {}).get(port) == "output":
                for bit in bits:
                    drivers[bit] = (name, port)

    def clock_and_enable(ffs):
        """The one (clock, enable) of these flip-flops if they are all packable, else None."""
        clocks = {tuple(ff["connections"]["CLK"]) for ff in ffs}
        enables = {_enable(ff) for ff in ffs}
        if not all(_packable(ff) for ff in ffs) or len(clocks) != 1 or len(enables) != 1:
            return None
        return clocks.pop(), enables.pop()

    def output_groups(conns):
        """P port -> the flip-flops it alone feeds, for every used P port; None if any is
        not so."""
        used = [p for p in P_BITS if p in conns and sinks.get(conns[p][0])]
        groups = {}
        for p in used:
            feeds = sinks[conns[p][0]]
            if not all(cell is not None and port == "DI" and cells[cell]["type"] == FF
                       for cell, port in feeds):
                return None
            groups[p] = [cell for cell, _ in feeds]
        return groups or None

    def operand_registers(dsp_name, conns, operand):
        """Operand pin -> the flip-flop driving it (None for a constant 0), where every one
        drives this operand's pins of this DSP alone; None otherwise."""
        pins = OPERAND_BITS[operand]
        registers = {}
        for pin in pins:
            if pin not in conns:
                continue
            bit = conns[pin][0]
            if isinstance(bit, str):
                if bit != "0":
                    return None
                registers[pin] = None
                continue
            name, port = drivers.get(bit, (None, None))
            if name is None or cells[name]["type"] != FF or port != "Q" or not all(
                    cell == dsp_name and sink in pins for cell, sink in sinks.get(bit, [])):
                return None
            registers[pin] = name
        return registers if any(registers.values()) else None

    taken = set()                        # flip-flops a DSP has taken (one can feed another DSP)
    for dsp_name, dsp in list(cells.items()):
        if dsp["type"] != DSP:
            continue
        conns, params = dsp["connections"], dsp["parameters"]
        packs = []                       # (kind, its flip-flops by port)
        if params.get("REG_OUTPUT_CLK", "NONE") == "NONE":
            groups = output_groups(conns)
            if groups is not None:
                packs.append(("output", groups))
        if all(params.get(f"REG_INPUT{x}_CLK", "NONE") == "NONE" for x in "AB"):
            operands = {x: operand_registers(dsp_name, conns, x) for x in "AB"}
            if all(operands.values()):
                packs.append(("input", operands))
        # The registers the DSP has already: their clock and enable bind the new ones.
        bound = None
        if any(params.get(f"REG_{r}_CLK", "NONE") != "NONE" for r in ("OUTPUT", "INPUTA")):
            bound = (tuple(conns["CLK0"]), conns["CE0"][0])
        chosen, key = [], bound
        for kind, groups in packs:
            names = ({ff for group in groups.values() for ff in group} if kind == "output"
                     else {ff for regs in groups.values() for ff in regs.values() if ff})
            found = clock_and_enable([cells[ff] for ff in names])
            if found is None or names & taken:
                continue
            clock, (bit, inverted) = found
            if key is not None:          # the enable must be the one the DSP has
                if key != (clock, inverters.get(bit) if inverted else bit):
                    continue
            else:
                if inverted:             # the DSP's CE has no inverter: a LUT4 is one
                    if bit not in inverters:
                        inverters[bit] = next(free)
                        cells[f"dsp_pack_not_{bit}"] = _inverter(bit, inverters[bit])
                    bit = inverters[bit]
                key = (clock, bit)
            chosen.append((kind, groups))
            taken |= names
        if not chosen:
            continue
        params["GSR"] = "DISABLED"
        conns.update({"CLK0": list(key[0]), "CE0": [key[1]], "RST0": ["0"]})
        dsp.setdefault("port_directions", {}).update(
            {"CLK0": "input", "CE0": "input", "RST0": "input"})
        for kind, groups in chosen:
            if kind == "output":
                params.update({"REG_OUTPUT_CLK": "CLK0", "REG_OUTPUT_CE": "CE0",
                               "REG_OUTPUT_RST": "RST0"})
                for p, group in groups.items():
                    keep = cells[group[0]]["connections"]["Q"][0]
                    conns[p] = [keep]
                    for ff in group[1:]:     # registers of one bit (a sign extension): one net
                        renamed[cells[ff]["connections"]["Q"][0]] = keep
                    removed += group
                continue
            for operand, registers in groups.items():
                params.update({f"REG_INPUT{operand}_CLK": "CLK0",
                               f"REG_INPUT{operand}_CE": "CE0",
                               f"REG_INPUT{operand}_RST": "RST0"})
                for pin, ff in registers.items():
                    if ff is not None:   # the pin now reads what the flip-flop read
                        conns[pin] = list(cells[ff]["connections"]["DI"])
                removed += sorted({ff for ff in registers.values() if ff} - set(removed))
    for name in removed:
        del cells[name]
    if renamed:
        def rename(bits):
            return [renamed.get(bit, bit) for bit in bits]
        for cell in cells.values():
            cell["connections"] = {port: rename(bits)
                                   for port, bits in cell["connections"].items()}
        for port in module["ports"].values():
            port["bits"] = rename(port["bits"])
        for net in module.get("netnames", {}).values():
            net["bits"] = rename(net["bits"])
    return len(removed)
