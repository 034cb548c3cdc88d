"""`make demo`: the MoE layer as one generated system, end to end, in one page.

Stages (a progress line each): generate the default ``moe_layer``; synthesize its parts with
Yosys in the background (``expert_chiplet``, ``moe_gate``, ``nop_tree``: the area per
chiplet); build it with Verilator and run ``test_throughput`` — a balanced 64-token batch with
co-activation structure under round-robin and clustered placement, y bit-exact against the
NumPy layer (``golden.moe_layer``), cycles against the MAC bound, r and the tree's link traffic
measured at the RTL's taps, and the batch with its weights streamed (loaded first, or
double-buffered); then FP8 dispatch with BF16 combine (:data:`FP8_LAYER`, y bit-exact
against the golden layer); then the page and a picture. The per-block demo of every registered
block is ``moegen demo --all`` (:func:`flows.bench.run_demo`).
"""

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

from flows.reports import table
from flows.sim import SimFailure, run_tests
from flows.synth import SynthError, synthesize
from flows.toolchain import BUILD_ROOT
from flows.verilog import generate
from hw.registry import get_block
from tb.harness import THROUGHPUT_FILE

__all__ = ["run_layer_demo", "root_link_flits", "FP8_LAYER"]

PLACEMENTS = ("round_robin", "clustered")

# The layer in FP8 (seed 003 §6.5: dispatch in FP8, combine in BF16), small enough to build in
# seconds: E4M3 tokens and experts, BF16 returns added by a 3-way switch, 3 experts a chiplet
# (both orders of addition matter), a tile of 3 arrays promoting inside a dot; 5-bit token ids
# and 16 in-flight slots (the layer holds 24 tokens, so y held still fills it; with 32-token
# batches the suite takes 49 s on Icarus, against 85 s with 64). `make sweep` runs the layer's
# whole suite on it, `make test` on the same layer with a one-row tile (tests/test_moe_layer).
FP8_LAYER = {"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16,
             "fanouts": (3,), "experts": 7, "slots": 3, "k": 3, "d_model": 5, "d_ff": 3,
             "lanes": 2, "rows": 2, "cols": 2, "arrays": 3, "batch": 3, "score_shift": 12,
             "shift_g": 0, "shift_u": 1, "shift_h": 0, "promote_every": 2, "token_width": 5,
             "max_inflight": 16}


def root_link_flits(config, run):
    """Flits on the links below the root switch (both ways), per token of the run: the root's
    child links of a deeper tree, the leaf links of a one-level one."""
    if len(config.fanouts) > 1:
        children = config.fanouts[0]        # breadth-first: the root's children come first
        return sum(run["down_link_flits"][:children]) + sum(run["up_link_flits"][:children])
    flits = config.header_flits + config.x_flits
    return 2 * flits * sum(run["chiplet_tokens"])


def _synthesize_parts(pool, config, out_dir):
    """Yosys generic synthesis of each part, submitted to ``pool``: {part: future}. The tree
    (the longest) first."""
    parts = {"nop_tree": config.tree_config(), "expert_chiplet": config.chiplet_config(),
             "moe_gate": config.gate_config()}
    return {name: pool.submit(synthesize, get_block(name), cfg, "generic", out_dir / name)
            for name, cfg in parts.items()}


def _picture(config, runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [name for name in PLACEMENTS if name in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    width = 0.8 / len(names)
    links = len(runs[names[0]]["down_link_flits"])
    for i, name in enumerate(names):
        run = runs[name]
        offset = (i - (len(names) - 1) / 2) * width
        axes[0].bar([leaf + offset for leaf in range(config.leaves)], run["chiplet_tokens"],
                    width, label=f"{name.replace('_', '-')} (r = {run['replication']:.2f})")
        axes[1].bar([link + offset for link in range(links)],
                    [d + u for d, u in zip(run["down_link_flits"], run["up_link_flits"])],
                    width, label=name.replace("_", "-"))
    axes[0].set_xticks(range(config.leaves))
    axes[1].set_xticks(range(links))
    axes[0].set(title="tokens per chiplet (64-token batch)", xlabel="chiplet (leaf)",
                ylabel="tokens")
    axes[1].set(title="flits per switch-to-switch link (down + up)",
                xlabel="internal link (breadth-first)", ylabel="flits")
    for axis in axes[:2]:
        axis.legend(fontsize=8)
    grid = [runs[name]["placement"] for name in names]
    axes[2].imshow(grid, aspect="auto", cmap="tab10", vmin=0, vmax=9)
    for row, placement in enumerate(grid):
        for expert, leaf in enumerate(placement):
            axes[2].text(expert, row, str(leaf), ha="center", va="center", fontsize=8)
    axes[2].set(title="placement: chiplet of each expert", xlabel="expert",
                yticks=range(len(names)), yticklabels=[n.replace("_", "-") for n in names])
    fig.suptitle(f"moe_layer: {config.experts} experts, top-{config.k}, {config.leaves} "
                 f"chiplets (fanouts {','.join(map(str, config.fanouts))})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_layer_demo():
    """The main job; returns the exit status."""
    began = time.monotonic()
    block = get_block("moe_layer")
    config = block.config()
    out_dir = BUILD_ROOT / "demo" / "moe_layer"

    def stage(number, text):
        print(f"demo [{number}/6] {time.monotonic() - began:5.0f} s  {text}", flush=True)

    stage(1, "generate moe_layer (defaults): Verilog and manifest")
    v_path, m_path, _ = generate(block, config, out_dir / "rtl")
    stage(2, "Yosys generic synthesis of the parts, in the background (two at a time)")
    pool = ThreadPoolExecutor(max_workers=2)
    areas = _synthesize_parts(pool, config, out_dir / "synth")
    stage(3, "Verilator: build; a 64-token batch under round-robin and clustered placement, "
             "y bit-exact against golden.moe_layer")
    status = 0
    try:
        result = run_tests(block, config, "verilator", testcase=["test_throughput"],
                           quiet=True, measure=True)
        figures = json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())
        verdict = "passed: y bit-exact for every token under both placements"
    except SimFailure as failure:
        figures, verdict, status = None, f"FAILED: {failure}", 1
    stage(4, "Verilator: the layer in FP8 (E4M3 dispatch, BF16 combine), y bit-exact")
    fp8_config = block.config(**FP8_LAYER)
    try:
        run_tests(block, fp8_config, "verilator", testcase=["test_layer_bit_exact"], quiet=True)
        fp8_verdict = "passed: y bit-exact for every token of two batches per chiplet"
    except SimFailure as failure:
        fp8_verdict, status = f"FAILED: {failure}", 1
    stage(5, "waiting for the synthesis")
    try:
        parts = {name: areas[name].result()
                 for name in ("expert_chiplet", "moe_gate", "nop_tree")}
    except SynthError as failure:
        parts, status = None, 1
        print(f"demo: synthesis FAILED: {failure}")
    pool.shutdown()

    stage(6, "the page and the picture")
    shape = config.chiplet_config().schedule
    print()
    print(f"moegen demo: the Mozart MoE layer (moe_layer, defaults) — {config.experts} experts, "
          f"top-{config.k}, {config.leaves} expert chiplets under a "
          f"{'x'.join(map(str, config.fanouts))} NoP tree, {config.slots} expert slots each; "
          f"D = {config.d_model}, F = {config.d_ff}; per chiplet a {shape.rows}x{shape.cols}"
          f"x{shape.arrays} systolic tile ({shape.pes} PEs) and a PMU weight scratchpad")
    print(f"Verilog: {v_path}  (manifest {m_path})")
    print(f"Verilator, test_throughput: {verdict}")
    if figures:
        runs = figures["placements"]
        rows = []
        for name in PLACEMENTS:
            if name not in runs:
                continue
            run = runs[name]
            rows.append((name.replace("_", "-"), run["cycles"], run["tokens_per_cycle"],
                         run["mac_bound_cycles"], run["of_bound"], f"{run['replication']:.2f}",
                         f"{root_link_flits(config, run) / figures['metrics']['tokens']:.1f}",
                         " ".join(map(str, run["chiplet_tokens"])),
                         " ".join(map(str, run["chiplet_macs"]))))
        print()
        print(table(["placement", "cycles", "tokens/cycle", "MAC bound", "of bound", "r",
                     "root-link flits/token", "tokens per chiplet", "MACs per chiplet"], rows))
        print("cycles: first x beat in to last y flit out, cycle-exact on Verilator; MAC bound: "
              "the busiest chiplet's MACs / its PEs; r: chiplets per token, counted at the "
              "chiplets' ports; root-link flits: both ways on the root switch's child links.")
        metrics = figures["metrics"]
        print(f"Weights streamed (round-robin placement) from one DDR4-3200 channel per switch "
              f"group ({config.switch_groups}): loaded first, then the batch: "
              f"{metrics['streamed_cycles']} cycles (the load {metrics['ddr4_weight_load_cycles']}"
              f"); double-buffered, the batch computing while each chiplet's experts stream "
              f"in, the heaviest first: {metrics['overlapped_cycles']} (the lightest first: "
              f"{metrics['overlapped_lightest_first_cycles']}); resident: {metrics['cycles']}.")
        picture = out_dir / "moe_layer.png"
        _picture(config, runs, picture)
    print()
    print(f"FP8 (moe_layer dtype={fp8_config.dtype} combine_dtype={fp8_config.combine_dtype}; "
          f"{fp8_config.experts} experts, top-{fp8_config.k}, {fp8_config.leaves} chiplets "
          f"under one {fp8_config.fanouts[0]}-way switch): E4M3 tokens and expert weights "
          f"with E8M0 scales (one per token, one per weight block), the experts' FP8 tiles, "
          f"BF16 returns added in the switch's order; Verilator, "
          f"test_layer_bit_exact: {fp8_verdict}")
    if parts:
        print()
        rows = [(name, p["cells"], p["flip_flops"], p["luts"]) for name, p in parts.items()]
        chiplets = config.leaves
        total = {key: parts["moe_gate"][key] + parts["nop_tree"][key] +
                 chiplets * parts["expert_chiplet"][key] for key in ("cells", "flip_flops",
                                                                     "luts")}
        rows.append((f"layer (gate + tree + {chiplets} chiplets)", total["cells"],
                     total["flip_flops"], total["luts"]))
        print(table(["part", "cells", "flip-flops", "LUTs"], rows))
        print("Yosys generic synthesis (LUT4), each part alone; the chiplet's logic mapped gate "
              "by gate (no ABC: an upper bound), its memories as flip-flops.")
    if figures:
        print(f"picture (per-chiplet load, tree link traffic, placements): {picture}")
    print(f"moegen demo finished in {math.ceil(time.monotonic() - began)} s "
          f"(every block's own demo: moegen demo --all)")
    return status
