"""Glue between the pytest runner and cocotb test modules: which block and config is simulated.

The runner writes the block's manifest (``moegen verilog`` output) next to the Verilog and hands
its path to the simulator as the plusarg ``+moegen_manifest=PATH``. A test module calls
:func:`load_dut_config` to get the config and an (unelaborated) component whose stream members
give the payload layouts, so the test bench packs bits with the design's own layouts.
"""

import functools
import json
import random
import time

import cocotb

from hw.registry import get_block

__all__ = ["dut_manifest", "load_dut_config", "make_rng", "start_bench", "restart_bench",
           "write_throughput", "THROUGHPUT_FILE", "throughput_beats", "measuring", "timing",
           "TIMED_CYCLES", "long_enough_to_time"]

# Written by each block's test_throughput in its run folder; read by flows/bench.py.
THROUGHPUT_FILE = "throughput.json"


def measuring():
    """Whether the run measures (``flows.sim.run_tests(measure=True)``: `make bench`, the demo,
    sweeps; the plusarg ``+moegen_measure=1``) rather than `make test` checking: a test that
    times the design then runs its long form, and the figures that only the measurements
    report."""
    return bool(cocotb.plusargs.get("moegen_measure"))


def timing():
    """Whether the run gives a speed figure (``flows.sim.run_tests(measure=True,
    optimize=True)``: `make bench`'s throughput part; the plusarg ``+moegen_timed=1``): a
    throughput test then runs for :data:`TIMED_CYCLES` simulated cycles or more
    (:func:`long_enough_to_time`). Other measuring runs (the demo, ``moegen sweep``, `make
    bench`'s traced activity run) report no speed and run it once."""
    return bool(cocotb.plusargs.get("moegen_timed"))


# A speed (simulated cycles per wall-clock second) is timed over this many simulated cycles at
# least: over a few hundred, one slow wake-up of the VM moves it by tens of percent.
TIMED_CYCLES = 10_000


def long_enough_to_time(test):
    """Decorate a cocotb ``test_throughput`` (which writes :data:`THROUGHPUT_FILE`) so that,
    when the run reports a speed (:func:`timing`), it runs again and again, each time from its
    own reset and with all of its own assertions, until :data:`TIMED_CYCLES` simulated cycles
    have passed since it began; its file then gives the simulated cycles per wall second over
    all of them (``simulated_cycles``, ``timed_runs``) and the operations of all of them. The
    runs are alike (each draws from the same seeded generator), so every run's cycle figures
    are the first's. When the run gives no speed figure (`make test`, `make sweep`, the demo,
    a traced run) it is the test itself, run once."""
    @functools.wraps(test)
    async def timed(dut):
        if not timing():
            return await test(dut)
        from tb.streams import edge_now, stop_stream_ends   # streams needs a simulator
        began, first_edge = time.perf_counter(), edge_now()
        runs, operations, first_metrics = 0, 0, None
        while True:
            await test(dut)
            runs += 1
            with open(THROUGHPUT_FILE) as f:
                report = json.load(f)
            first_metrics = first_metrics or report["metrics"]
            assert report["metrics"] == first_metrics, (
                f"run {runs} measured {report['metrics']}, the first {first_metrics}")
            operations += report["operations"]
            cycles = edge_now() - first_edge
            if cycles >= TIMED_CYCLES:
                break
            stop_stream_ends()          # the next run's reset and ports start afresh
        wall = time.perf_counter() - began
        report.pop("sim_cycles_per_second_runs", None)     # one run's rates: not this figure
        report.update(operations=operations, simulated_cycles=cycles, timed_runs=runs,
                      sim_cycles_per_second=cycles / wall)
        with open(THROUGHPUT_FILE, "w") as f:
            json.dump(report, f, indent=2)
    return timed


def throughput_beats():
    """How many input beats (rows, tokens' flits, cycles) a saturated throughput test sends:
    10,000 when the run measures (``flows.sim.run_tests(measure=True)``: `make bench`, the
    demo, sweeps), long enough to time; 500 when `make test` checks the cycle model, still
    hundreds of transfers past pipelines tens of stages deep, counted to the cycle (it runs on
    Icarus in every configuration, where 2,000 took a sixth of make test's time budget)."""
    return 10_000 if measuring() else 500


def dut_manifest():
    """The manifest (flows.verilog.manifest) of the design under test."""
    path = cocotb.plusargs.get("moegen_manifest")
    if not path:
        raise RuntimeError("missing plusarg +moegen_manifest=PATH (run through flows.sim)")
    with open(path) as f:
        return json.load(f)


def load_dut_config():
    """Return ``(block, config, component)`` for the design under test."""
    manifest = dut_manifest()
    block = get_block(manifest["block"])
    config = block.config(**manifest["params"])
    return block, config, block.build(config)


def make_rng(salt):
    """A generator seeded from cocotb's RANDOM_SEED and a per-test salt (reproducible)."""
    return random.Random(f"{cocotb.RANDOM_SEED}:{salt}")


async def start_bench(bench_class, dut, salt, gap=0.0, stall=0.0):
    """A ``bench_class(dut, config, component, rng, gap, stall)`` on the design under test, its
    drivers started after a reset (``tb.streams.start_after_reset``)."""
    from tb.streams import start_after_reset      # streams needs a simulator; harness not
    _, config, component = load_dut_config()
    bench = bench_class(dut, config, component, make_rng(salt), gap, stall)
    await start_after_reset(dut, bench)
    return bench


async def restart_bench(bench, bench_class, dut, salt, gap=0.0, stall=0.0):
    """Reset mid-work: stop ``bench``'s drivers with the block busy, reset it (as
    :func:`start_bench` does) and return a fresh bench that knows nothing of the old traffic."""
    bench.stop()
    return await start_bench(bench_class, dut, salt, gap, stall)


def write_throughput(metrics, metric_unit, sim_cycles_per_second, *, operations, **extra):
    """Write the report ``make bench`` and ``make demo`` read: ``metrics`` (name -> cycle-exact
    figure), what they measure, the simulated cycles per wall second, the ``operations`` (of
    the block's registered unit) the whole test performed, which ``make bench`` divides the
    test's bit flips by (:mod:`flows.activity`), and any ``extra`` keys."""
    report = {"metrics": metrics, "metric_unit": metric_unit, "operations": operations, **extra,
              "sim_cycles_per_second": sim_cycles_per_second}
    with open(THROUGHPUT_FILE, "w") as f:
        json.dump(report, f, indent=2)
