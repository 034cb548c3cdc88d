"""Verilator ``-Wall`` lint of a block's generated Verilog (`moegen lint`).

Each warning is put in one of two classes by the signal it names:

* ``generator``: what the code generator does, not what moegen asks for: Yosys's
  temporaries (``$123``), the forms its Verilog back end writes (see ``_GENERATOR_CODES``);
* ``moegen``: a signal named in moegen's source that nothing drives, or logic that can
  never matter (``_OURS``). These are ours to remove; the hand-written Verilog
  (the AXI4-Stream wrapper) is kept at zero warnings of any class.
"""

import re
import subprocess
from collections import Counter

from flows import toolchain
from flows.synth import prepare

__all__ = ["lint_files", "lint_block", "classify"]

_WARNING = re.compile(r"^%Warning-(\w+): ([^:]+):(\d+):\d+: (.*)$", re.MULTILINE)
# Verilog forms of Yosys's back end: ``reg x = init;`` (PROCASSINIT), several modules in a file
# (DECLFILENAME), operands left to Verilog's context widths where Amaranth's width rules are
# exact (WIDTHEXPAND, WIDTHTRUNC), case statements over a part of the values
# (CASEINCOMPLETE), bits of a wide intermediate that a slice drops.
_GENERATOR_CODES = {"PROCASSINIT", "DECLFILENAME", "WIDTHEXPAND", "WIDTHTRUNC",
                    "CASEINCOMPLETE"}
# Logic a moegen generator wrote that can never matter: a comparison with a constant result
# (CMPCONST, UNSIGNED), a process that never runs (ALWNEVER).
_OURS = {"CMPCONST", "UNSIGNED", "ALWNEVER"}


def classify(code, message):
    """``generator`` or ``moegen`` for one warning (see the module docstring)."""
    if code in _GENERATOR_CODES:
        return "generator"
    named = [n for n in re.findall(r"'([^']+)'", message) if not re.match(r"\\?\$", n)]
    if code in _OURS:
        return "moegen"
    # Yosys's back end keeps a wire for every named signal, including the fields of views
    # (``x__payload.field``) and renamed duplicates (``name$12``), even where the logic reading
    # it reads its driver directly: UNUSEDSIGNAL on those is the generator's. A named signal
    # that nothing drives is ours.
    if code == "UNDRIVEN" and named and not any(re.search(r"[.\[$]", n) for n in named):
        return "moegen"
    return "generator"


def lint_files(paths, top):
    """``[(code, file, line, message, class)]`` of Verilator ``--lint-only -Wall`` over
    ``paths`` with top module ``top``."""
    toolchain.activate()
    proc = subprocess.run(["verilator", "--lint-only", "-Wall", "-Wno-fatal", "--top-module",
                           top, *map(str, paths)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"verilator --lint-only failed on {top}:\n{tail}")
    return [(code, file, int(line), message, classify(code, message))
            for code, file, line, message in _WARNING.findall(proc.stderr)]


def lint_block(block, config):
    """Counts of the ``-Wall`` warnings of ``block`` at ``config``: ``{"total", "generator",
    "moegen", "codes": {code: n}, "moegen_warnings": [first few messages]}``."""
    _, v_path, info = prepare(block, config)
    warnings = lint_files([v_path], info["top"])
    classes = Counter(w[4] for w in warnings)
    return {"total": len(warnings), "generator": classes["generator"],
            "moegen": classes["moegen"], "codes": dict(Counter(w[0] for w in warnings)),
            "moegen_warnings": [f"{w[0]}: {w[3]} ({w[1]}:{w[2]})" for w in warnings
                                if w[4] == "moegen"][:20]}
