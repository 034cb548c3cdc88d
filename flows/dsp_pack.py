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
"""

import itertools
from collections import defaultdict

__all__ = ["pack_output_registers"]

DSP, FF = "MULT18X18D", "TRELLIS_FF"
P_BITS = [f"P{i}" for i in range(36)]


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
    """Move product registers into their ``MULT18X18D``'s output register, in place, in every
    module of a Yosys JSON ``netlist`` (a dict); returns the number of flip-flops removed."""
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
    for dsp in list(cells.values()):
        if dsp["type"] != DSP or dsp["parameters"].get("REG_OUTPUT_CLK", "NONE") != "NONE":
            continue
        conns = dsp["connections"]
        used = [p for p in P_BITS if p in conns and sinks.get(conns[p][0])]
        if not used:
            continue
        groups = {}                      # P port -> the names of the flip-flops it feeds
        for p in used:
            feeds = sinks[conns[p][0]]
            if not all(cell is not None and port == "DI" and cells[cell]["type"] == FF
                       for cell, port in feeds):
                break
            groups[p] = [cell for cell, _ in feeds]
        else:
            ffs = [cells[ff] for group in groups.values() for ff in group]
            clocks = {tuple(ff["connections"]["CLK"]) for ff in ffs}
            enables = {_enable(ff) for ff in ffs}
            if not all(_packable(ff) for ff in ffs) or len(clocks) != 1 or len(enables) != 1:
                continue
            dsp["parameters"].update({"REG_OUTPUT_CLK": "CLK0", "REG_OUTPUT_CE": "CE0",
                                      "REG_OUTPUT_RST": "RST0", "GSR": "DISABLED"})
            bit, inverted = enables.pop()
            if inverted:                 # the DSP's CE has no inverter: a LUT4 is one
                if bit not in inverters:
                    inverters[bit] = next(free)
                    cells[f"dsp_pack_not_{bit}"] = _inverter(bit, inverters[bit])
                bit = inverters[bit]
            conns.update({"CLK0": list(clocks.pop()), "CE0": [bit], "RST0": ["0"]})
            dsp.setdefault("port_directions", {}).update(
                {"CLK0": "input", "CE0": "input", "RST0": "input"})
            for p, group in groups.items():
                keep = cells[group[0]]["connections"]["Q"][0]
                conns[p] = [keep]
                for ff in group[1:]:     # registers of one bit (a sign extension): one net
                    renamed[cells[ff]["connections"]["Q"][0]] = keep
                removed += group
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
