"""The ``moegen`` command: list, verilog, lint, sim, synth, formal, mutate, sweep, doctor,
bench, demo, schedule, numerics, docs.

Every subcommand is a thin layer over the Python API in ``flows``. Bad input (unknown block,
parameter, simulator or target; a value of the wrong type or out of range) prints one line,
``moegen: error: ...``, naming the parameter, the value and what is allowed, and exits with
status 2, without a traceback.
"""

import argparse
import sys
from pathlib import Path

from flows.reports import table
from hw.params import ParamError, describe, parse_params
from hw.registry import UnknownBlock, all_blocks, get_block

__all__ = ["main"]

EXIT_USAGE = 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and then the error; users asked for one line.
    def error(self, message):
        raise _UsageError(message)


def _block_and_config(args):
    block = get_block(args.block)
    return block, parse_params(block.config, args.param or [])


def cmd_list(args):
    for block in all_blocks():
        print(f"{block.name} — {block.summary}")
        print(table(["parameter", "default", "allowed", "meaning"],
                     [(n, d, a, doc) for n, d, a, doc in describe(block.config)]))
        print()
    return 0


def _require_tiers(block):
    if block.tiers is None:
        raise _UsageError(f"option '--3d': block {block.name!r} has no tier partition; "
                          "allowed for: " + ", ".join(b.name for b in all_blocks()
                                                      if b.tiers is not None))


def cmd_formal(args):
    from flows.formal import run_formal
    block, config = _block_and_config(args)
    if not 1 <= args.depth <= 200:
        raise _UsageError(f"option '--depth': got {args.depth}; allowed: an integer in 1..200")
    result = run_formal(block, config, args.mode, args.depth, solver=args.solver)
    if args.mode == "cover":
        print(f"{block.name}: a transfer on every output within {args.depth} cycles: "
              f"{result['status']}")
    else:
        how = ("proven for all traffic (k-induction)" if result["proof"] else
               f"{result['mode']} to depth {result['depth']}")
        print(f"{block.name}: stream rules of every port: {result['status']} ({how})")
    if result["trace"]:
        print(f"counterexample: {result['trace']}")
    return 0 if result["status"] == "PASS" else 1


def _one_or_all(args, all_means):
    """Usage checks of a command taking BLOCK [-p ...] or --all."""
    if args.all == bool(args.block):
        raise _UsageError("argument BLOCK: give one block name or --all")
    if args.all and args.param:
        raise _UsageError(f"option '-p': not allowed with --all ({all_means})")


def cmd_mutate(args):
    from flows.mutate import MutationError, run_mutation, scored_configs
    _one_or_all(args, "every block runs at its configuration in flows/mutate.py "
                      "SCORED_CONFIGS")
    if not 1 <= args.count <= 1000:
        raise _UsageError(f"option '-n': got {args.count}; allowed: an integer in 1..1000")
    if not 1 <= args.jobs <= 64:
        raise _UsageError(f"option '--jobs': got {args.jobs}; allowed: an integer in 1..64")
    if not 0 <= args.seed < 2**31:
        raise _UsageError(f"option '--seed': got {args.seed}; allowed: an integer in "
                          f"0..{2**31 - 1}")
    jobs = scored_configs() if args.all else [_block_and_config(args)]
    rows, status = [], 0
    for block, config in jobs:
        try:
            report = run_mutation(block, config, args.count, args.sim, args.seed, args.jobs)
        except MutationError as failure:
            print(f"moegen: FAILED: {failure}", file=sys.stderr)
            rows.append((block.name, "-", "-", "-", "-", "flow failed"))
            status = 1
            continue
        score = "n/a" if report["score"] is None else f"{100 * report['score']:.1f}%"
        rows.append((block.name, report["sampled"], report["killed"], report["survived"],
                     report["equivalent"], score))
        for survivor in report["survivors"]:
            print(f"survived: mutant {survivor['index']}: {survivor['mutation']} "
                  f"({survivor['how']})")
        print(f"report: {report['path']}")
    print(table(["block", "sampled", "killed", "survived", "equivalent", "score"], rows))
    return status


def cmd_lint(args):
    from flows.lint import lint_block
    from hw.registry import all_blocks
    _one_or_all(args, "every block at its defaults")
    jobs = [(block, block.config()) for block in all_blocks()] if args.all \
        else [_block_and_config(args)]
    rows = []
    for block, config in jobs:
        report = lint_block(block, config)
        codes = ", ".join(f"{code} {n}" for code, n in
                          sorted(report["codes"].items(), key=lambda item: -item[1]))
        rows.append((block.name, report["total"], report["generator"], report["moegen"], codes))
        for message in report["moegen_warnings"] if not args.all else []:
            print(f"moegen: {message}")
    print(table(["block", "-Wall warnings", "generator", "moegen", "by code"], rows))
    return 0


def cmd_sweep(args):
    from flows.sweep import SweepUsageError, run_sweep, sweep_table
    from hw.registry import get_block
    block = get_block(args.block)
    if not 1 <= args.workers <= 64:
        raise _UsageError(f"option '--workers': got {args.workers}; allowed: an integer in 1..64")
    try:
        sweep = run_sweep(block, args.param, sim=args.sim, synth=args.synth, pnr=args.pnr,
                          scheduler=args.scheduler, workers=args.workers, output=args.output)
    except SweepUsageError as error:
        raise _UsageError(str(error)) from None
    print(sweep_table(sweep))
    failed = [r for r in sweep["results"] if not r["ok"]]
    for r in failed:
        print(f"failed: {block.name} {' '.join(r['params'])} {r['kind']}: {r['error']}")
    cached = sum(r["cached"] for r in sweep["results"])
    print(f"{len(sweep['results'])} jobs: {len(sweep['results']) - cached} run, {cached} from "
          f"the cache, {len(failed)} failed")
    for kind, path in sweep["paths"].items():
        print(f"{kind}: {path}")
    return 0


def cmd_verilog(args):
    from flows.package import write_package
    from flows.verilog import generate
    block, config = _block_and_config(args)
    if args.three_d:
        from flows.threed import generate_3d
        _require_tiers(block)
        if args.sram:
            raise _UsageError("option '--sram': got it with --3d; allowed: one of them")
        built = generate_3d(block, config, Path(args.output))
        for kind, path in built["paths"].items():
            print(f"wrote {path} ({kind})")
        print(f"bonds: {built['bond_counts']['down']} down (top -> bottom), "
              f"{built['bond_counts']['up']} up")
        return 0
    try:
        v_path, j_path, info = generate(block, config, Path(args.output), prefix=args.prefix,
                                        sram=args.sram)
    except ValueError as error:
        raise _UsageError(f"option '--prefix': {error}") from None
    count = len(info["modules"])
    print(f"wrote {v_path} (top module {info['top']}, {count} module{'s' * (count > 1)})")
    print(f"wrote {j_path}")
    if args.sram:
        sram = info["sram"]
        print(f"wrote {v_path.parent / sram['models']} (models of "
              f"{len({m['macro'] for m in sram['macros']})} SRAM macros, "
              f"{len(sram['macros'])} instances; {len(sram['kept'])} memories kept: "
              f"{'; '.join(sorted({k['reason'] for k in sram['kept']})) or 'none'})")
    for path in write_package(block, info, Path(args.output), axis=args.axis):
        print(f"wrote {path}")
    return 0


def cmd_sim(args):
    from flows.sim import SimFailure, run_tests
    block, config = _block_and_config(args)
    try:
        if args.three_d:
            _require_tiers(block)
            if args.sram:
                raise _UsageError("option '--sram': got it with --3d; allowed: one of them")
        result = run_tests(block, config, args.sim, waves=args.waves,
                           testcase=args.test or None, seed=args.seed, three_d=args.three_d,
                           sram=args.sram)
    except SimFailure as failure:
        print(f"moegen: FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"{result.block} on {result.simulator}: {result.tests} passed, 0 failed "
          f"(build {result.build_seconds:.1f} s, run {result.test_seconds:.1f} s)")
    print(f"results: {result.results_xml}")
    if args.waves:
        print(f"waves: {result.waves}")
        save = result.waves.with_suffix(".gtkw")
        if save.exists():
            print(f"gtkwave save file: {save} (ports grouped by stream)")
    return 0


def cmd_synth(args):
    from flows.synth import SynthError, synthesize
    block, config = _block_and_config(args)
    seeds = _seeds(args.seed)
    if args.no_ram and (args.target == "generic" or args.three_d or args.pnr):
        raise _UsageError(f"option '--no-ram': got it with "
                          f"{'--3d' if args.three_d else '--pnr' if args.pnr else 'generic'}; "
                          "allowed: with --target ecp5 or ice40 (generic maps memories to "
                          "flip-flops anyway)")
    if args.three_d:
        return _synth_3d(block, config, args.target)
    if args.pnr:
        return _synth_pnr(block, config, args.target, seeds)
    try:
        report = synthesize(block, config, args.target, ram=not args.no_ram)
    except SynthError as failure:
        print(f"moegen: FAILED: {failure}", file=sys.stderr)
        return 1
    print(table(["block", "target", "cells", "flip-flops", "LUTs", "DSPs", "block RAMs",
                 "LUT RAMs"],
                 [(block.name, args.target + ("" if report["ram"] else " (no RAM)"),
                   report["cells"], report["flip_flops"], report["luts"], report["dsps"],
                   report["block_rams"], report["lut_rams"])]))
    if "mapper" in report:
        print(f"LUT mapper: {report['mapper']}")
    print(f"report: {report['json']}")
    return 0


def _seeds(text):
    """``--seed``: one nextpnr seed or a comma-separated list of them."""
    try:
        seeds = tuple(int(v) for v in text.split(","))
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) != len(seeds) or any(not 0 <= s < 2**31 for s in seeds):
        raise _UsageError(f"option '--seed': got {text}; allowed: an integer in "
                          f"0..{2**31 - 1} or a comma-separated list of different ones")
    return seeds


def _synth_pnr(block, config, target, seeds):
    from flows.pnr import DEVICE, DSPS, pnr_block, pnr_seeds, seed_spread
    from flows.synth import SynthError
    if target not in DEVICE:
        print(f"moegen: error: --pnr: target {target!r} not supported; allowed: "
              f"{', '.join(DEVICE)} (a device's place and route)", file=sys.stderr)
        return 2
    try:
        if len(seeds) == 1:
            reports = [pnr_block(block, config, target, seeds[0])]
        else:
            reports = pnr_seeds(block, config, target, seeds)
    except SynthError as failure:
        print(f"moegen: FAILED: {failure}", file=sys.stderr)
        return 1
    if len(seeds) > 1:
        print(table(["seed", "Fmax MHz", "critical path (from -> to)", "levels", "ns",
                     "logic ns"],
                    [(r["seed"], r["fmax_mhz"],
                      f"{r['critical_path']['from']} -> {r['critical_path']['to']}",
                      r["critical_path"]["logic_levels"], r["critical_path"]["delay_ns"],
                      r["critical_path"]["logic_ns"]) for r in reports]))
        spread = seed_spread(reports)
        print(f"Fmax over {spread['seeds']} seeds: lowest {spread['min']}, median "
              f"{spread['median']}, highest {spread['max']} MHz (the same netlist; only "
              "nextpnr's seed differs)")
    r = reports[0]                     # (the device use is the same at every seed)
    path = r["critical_path"]
    print(table(["block", "device", "Fmax MHz", "LUTs", "FFs", "block RAMs", "DSPs"],
                [(block.name, r["device"], r["fmax_mhz"], r["luts"], r["flip_flops"],
                  r["block_rams"], r["dsps"])]))
    print(f"critical path: {path['from']} -> {path['to']}, {path['logic_levels']} logic levels, "
          f"{path['delay_ns']} ns ({path['logic_ns']} ns in logic, {path.get('setup_ns', 0)} ns "
          f"setup); seed {r['seed']}")
    if r.get("dsp_register_bits"):
        print(f"DSP registers: {r['dsp_register_bits']} operand and product register bits "
              "packed into their DSPs (flows/dsp_pack.py)")
    if "mapper" in r:
        print(f"LUT mapper: {r['mapper']}")
    if r.get("lut_multipliers"):
        print(f"multipliers: {r['lut_multipliers']} of {r['multipliers']} made of LUTs, as the "
              f"device has {DSPS[target][1]} DSPs (flows/pnr.py, fit_multipliers)")
    if "harness_flip_flops" in r:
        print(f"pin harness: {r['harness_flip_flops']} of the flip-flops are the harness's "
              "(input shift register, output registers)")
    print(f"report{'s' if len(reports) > 1 else ''}: {', '.join(x['json'] for x in reports)}")
    return 0


def _synth_3d(block, config, target):
    from flows.synth import SynthError
    from flows.threed import synthesize_3d
    _require_tiers(block)
    try:
        r = synthesize_3d(block, config, target)
    except SynthError as failure:
        print(f"moegen: FAILED: {failure}", file=sys.stderr)
        return 1
    rows = [(f"{block.name} tier top (die 0)", r["top"]["cells"], r["top"]["flip_flops"],
             r["top"]["luts"]),
            (f"{block.name} tier bottom (die 1)", r["bottom"]["cells"],
             r["bottom"]["flip_flops"], r["bottom"]["luts"]),
            (f"{block.name} 2D (one die)", r["2d"]["cells"], r["2d"]["flip_flops"],
             r["2d"]["luts"])]
    print(table(["build", "cells", "flip-flops", "LUTs"], rows))
    print(f"bonds: {r['bonds']['down']} top -> bottom, {r['bonds']['up']} bottom -> top")
    print(f"footprint estimate (largest tier / 2D cells): {r['footprint_3d']} / "
          f"{r['footprint_2d']} = {r['footprint_ratio']:.2f}")
    return 0


def cmd_doctor(args):
    from flows.toolchain import doctor_rows
    rows = doctor_rows()
    print(table(["tool", "path", "version", "ok", "note"],
                 [(t, p or "MISSING", ".".join(map(str, v)) if isinstance(v, tuple) else v,
                   "yes" if ok else "NO", note) for t, p, v, ok, note in rows]))
    return 0 if all(row[3] for row in rows) else 1


def cmd_bench(args):
    from flows.bench import run_bench
    if args.block:
        names = [b.name for b in all_blocks()]
        for name in args.block:
            if name not in names:
                raise _UsageError(f"option '--block': got {name}; allowed: {', '.join(names)}")
    return run_bench(Path(args.output), args.block, only=args.only)


def cmd_demo(args):
    if args.all:
        from flows.bench import run_demo
        return run_demo()
    from flows.demo import run_layer_demo
    return run_layer_demo()


def cmd_docs(args):
    from flows import docs
    if args.check:
        stale = docs.stale_files()
        for path in stale:
            print(f"moegen docs: {path} is not what `moegen docs` generates", file=sys.stderr)
        return 1 if stale else 0
    if args.bench and not Path(args.bench).is_file():
        raise _UsageError(f"option '--bench': got {args.bench}; allowed: a bench.json that "
                          "`make bench` wrote")
    if args.mutation and not Path(args.mutation).is_file():
        raise _UsageError(f"option '--mutation': got {args.mutation}; allowed: a "
                          "mutation.json that `make mutate` wrote")
    for path in docs.update(args.bench, args.mutation):
        print(f"wrote {path}")
    return 0


def _dimm_counts(text):
    try:
        counts = tuple(int(v) for v in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(not 1 <= n <= 6 for n in counts):
        raise _UsageError(f"option '--dimms': got {text}; allowed: comma-separated integers "
                          "in 1..6 (Table I: up to six NDP-DIMMs)")
    return counts


def cmd_schedule(args):
    import dataclasses
    from flows import ndp_schedule
    if not 0.0 <= args.skew <= 4.0:
        raise _UsageError(f"option '--skew': got {args.skew}; allowed: a number in 0..4")
    hw = dataclasses.replace(ndp_schedule.Hardware(), skew=args.skew)
    rows = ndp_schedule.run(hw, dimms=_dimm_counts(args.dimms))
    print(ndp_schedule.format_table(rows))
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    print(f"wrote {ndp_schedule.plot(rows, output / 'ndp_schedule.png')}")
    print(f"wrote {ndp_schedule.write_json(rows, output / 'ndp_schedule.json')}")
    return 0


def cmd_numerics(args):
    from flows import numerics
    if not 1 <= args.trials <= 1000:
        raise _UsageError(f"option '--trials': got {args.trials}; allowed: an integer in "
                          "1..1000")
    numerics.run(Path(args.output), trials=args.trials, seed=args.seed)
    return 0


def _parser():
    parser = _Parser(prog="moegen", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_block(p):
        p.add_argument("block", help="block name (see `moegen list`)")
        p.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                       help="set a parameter (repeatable)")

    sub.add_parser("list", help="blocks, parameters, defaults and ranges").set_defaults(
        func=cmd_list)
    p = sub.add_parser("verilog", help="write BLOCK.v and BLOCK.json")
    with_block(p)
    p.add_argument("--3d", dest="three_d", action="store_true",
                   help="also write the two tiers, BLOCK_3d.v with bond cells, the partition")
    p.add_argument("-o", "--output", default="build/verilog", help="output folder")
    p.add_argument("--prefix", help="name the top module PREFIX and every submodule "
                   "PREFIX__<path> ('auto': <block>_<hash of the configuration>); by default "
                   "the top keeps the block's name and submodules take the derived prefix")
    p.add_argument("--axis", action="store_true",
                   help="also write BLOCK_axis.v: the top with AXI4-Stream port names")
    p.add_argument("--sram", action="store_true",
                   help="ASIC flows: every memory an SRAM can take becomes a macro instance; "
                        "BLOCK_sram.v holds their behavioural models, the manifest lists them")
    p.set_defaults(func=cmd_verilog)
    p = sub.add_parser("lint", help="Verilator -Wall warnings of the generated Verilog, per "
                       "block, split into the code generator's and moegen's own")
    p.add_argument("block", nargs="?", help="block name (see `moegen list`)")
    p.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="set a parameter (repeatable)")
    p.add_argument("--all", action="store_true", help="every block at its defaults")
    p.set_defaults(func=cmd_lint)
    p = sub.add_parser("sim", help="run the block's cocotb tests")
    with_block(p)
    p.add_argument("--sim", default="verilator", choices=["icarus", "verilator"])
    p.add_argument("--waves", action="store_true", help="record a trace and print its path")
    p.add_argument("--test", action="append", help="run only this cocotb test (repeatable)")
    p.add_argument("--seed", type=int, default=1234, help="random seed of the tests")
    p.add_argument("--3d", dest="three_d", action="store_true",
                   help="simulate the two-tier 3D build in lockstep with the 2D build")
    p.add_argument("--sram", action="store_true",
                   help="simulate the --sram Verilog (SRAM macros by their models)")
    p.set_defaults(func=cmd_sim)
    p = sub.add_parser("formal", help="prove the stream rules of every port and the block's invariants "
                       "(SymbiYosys)")
    with_block(p)
    p.add_argument("--mode", default="prove", choices=["prove", "bmc", "cover"],
                   help="k-induction (a proof when it closes), bounded model checking, or "
                        "reach a transfer on every output")
    p.add_argument("--solver", default="boolector", choices=["boolector", "z3"],
                   help="SMT solver of yosys-smtbmc")
    p.add_argument("--depth", type=int, default=10,
                   help="induction length or BMC depth in cycles")
    p.set_defaults(func=cmd_formal)
    p = sub.add_parser("mutate", help="mutation score: Yosys mutants of the netlist against "
                       "the block's cocotb suite")
    p.add_argument("block", nargs="?", help="block name (see `moegen list`)")
    p.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="set a parameter (repeatable)")
    p.add_argument("--all", action="store_true",
                   help="every block at its `make mutate` configuration")
    p.add_argument("-n", dest="count", type=int, default=20, help="mutants to sample")
    p.add_argument("--sim", default="verilator", choices=["icarus", "verilator"])
    p.add_argument("--seed", type=int, default=1, help="seed of Yosys's sampling")
    p.add_argument("--jobs", type=int, default=2, help="mutants run in parallel")
    p.set_defaults(func=cmd_mutate)
    p = sub.add_parser("synth", help="Yosys synthesis: cells, flip-flops, LUTs, DSPs")
    with_block(p)
    p.add_argument("--target", default="generic", choices=["generic", "ice40", "ecp5"])
    p.add_argument("--3d", dest="three_d", action="store_true",
                   help="cells per tier, bonds and footprint against the 2D build")
    p.add_argument("--pnr", action="store_true",
                   help="place and route with nextpnr (ecp5): Fmax, critical path, device use")
    p.add_argument("--seed", default="1",
                   help="nextpnr's placement seed (--pnr), or several, comma-separated "
                        "(1,2,3,4): one synthesis placed at each, two at a time, and the "
                        "Fmax's lowest, median and highest")
    p.add_argument("--no-ram", action="store_true",
                   help="map every memory to flip-flops (ecp5, ice40): the figures before RAM "
                        "mapping")
    p.set_defaults(func=cmd_synth)
    p = sub.add_parser("sweep", help="the cross product of parameter values as jobs on Dask "
                       "(simulation, synthesis, place and route), cached; table, CSV, JSON, "
                       "Pareto plot")
    p.add_argument("block", help="block name (see `moegen list`)")
    p.add_argument("-p", "--param", action="append", metavar="KEY=V1,V2",
                   help="values of a parameter (repeatable; a list parameter such as fanouts "
                        "takes one value per -p)")
    p.add_argument("--sim", choices=["icarus", "verilator"],
                   help="run test_throughput on this simulator")
    p.add_argument("--synth", choices=["generic", "ice40", "ecp5"],
                   help="synthesize for this target")
    p.add_argument("--pnr", action="store_true", help="place and route on ECP5 (Fmax)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="an existing Dask scheduler (default: a LocalCluster here)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    p.add_argument("-o", "--output", help="output folder (default build/sweep/BLOCK)")
    p.set_defaults(func=cmd_sweep)
    sub.add_parser("doctor", help="check the toolchain").set_defaults(func=cmd_doctor)
    p = sub.add_parser("bench", help="cycles, utilization, sim speed and area per block")
    p.add_argument("-o", "--output", default="build/bench.json")
    p.add_argument("--block", action="append", metavar="NAME",
                   help="bench only this block (repeatable); `moegen docs --bench` then "
                        "replaces only its records")
    p.add_argument("--only", choices=["throughput", "synth", "activity", "pnr"],
                   help="measure only the throughput tests, the generic synthesis, the "
                        "switching activity per operation, or place and route; `moegen docs "
                        "--bench` then adds it to the recorded figures")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("demo", help="the MoE layer end to end (generate, simulate against "
                       "NumPy, synthesize, one page and a picture)")
    p.add_argument("--all", action="store_true",
                   help="instead, every block's demo configurations, one table")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("schedule", help="GPU + NDP-DIMM MoE schedule model (table and plot)")
    p.add_argument("--dimms", default="2,4,6", help="NDP-DIMM counts, e.g. 2,4,6")
    p.add_argument("--skew", type=float, default=0.8,
                   help="expert popularity ~ 1/rank**skew of the synthetic routing")
    p.add_argument("-o", "--output", default="build/schedule", help="output folder")
    p.set_defaults(func=cmd_schedule)
    p = sub.add_parser("numerics", help="FP8 dot-product error against K for three "
                       "accumulation precisions (table and plot)")
    p.add_argument("--trials", type=int, default=16, help="random dot products per K")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-o", "--output", default="build/numerics", help="output folder")
    p.set_defaults(func=cmd_numerics)
    p = sub.add_parser("docs", help="regenerate the parameter, figure and block tables of "
                       "README.md and docs/blocks/")
    p.add_argument("--bench", metavar="BENCH_JSON",
                   help="first record this `make bench` output as docs/bench.json")
    p.add_argument("--mutation", metavar="MUTATION_JSON",
                   help="first merge this `make mutate` output into docs/mutation.json")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a table differs from what it would write")
    p.set_defaults(func=cmd_docs)
    return parser


def main(argv=None):
    """Entry point of the ``moegen`` command; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        return args.func(args)
    except (_UsageError, ParamError, UnknownBlock) as error:
        print(f"moegen: error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
