"""GPU + NDP-DIMM schedule model of one MoE layer (seed 002 §III-B..D, Table I, Table II).

Compares, for 2, 4 and 6 NDP-DIMMs and the four models of Table II:

* ``MoNDE``: expert parallelism, a whole expert per DIMM. Decode: expert e on DIMM e mod N plus
  GPU offload: experts move from the busiest DIMM to the GPU (weights over PCIe) while that
  lowers the layer's critical path (a greedy optimum of its balance rule). Prefill: the NDPs
  alone, the activated experts ordered by their token counts (their arithmetic intensity) and
  dealt to the DIMMs in turn ("MoNDE distributes expert workloads cyclically based on
  arithmetic intensity", seed 002 §V-B, where the prefill's experts are "relatively uniform"
  over the NDP units);
* ``TP``: every activated expert split over all N DIMMs (Fig. 4);
* ``TP+LB``: E_g experts on the GPU from the balance equations (1) (decode) / (2) (prefill);
* ``TP+PRE``: dataset-free prefetch: the TopK experts seen most often in the prefill (one for
  Mixtral, GPU memory) are copied to the GPU; activated prefetched experts run there, at most
  E_max of them (eq. (3));
* ``TP+LB+PRE``: prefetch hits on the GPU; with no hit, TP+LB.

NDP times come from the RTL's cycle models, which the RTL meets cycle for cycle
(``tb/test_ndp_system.py``): one expert tensor-parallel over N DIMMs (TP) is an ``ndp_system``
command (:func:`golden.ndp.system_expert_cycles`, partial sums reduced in hardware); a whole
expert on one DIMM (MoNDE's expert parallelism) is the same with N = 1; S tokens routed to an
expert go in multi-token commands of at most ``ndp_max_tokens`` (weights read once per command);
M = 64 at 1.6 GHz, each command started when the DDR4-3200 model (:mod:`golden.dram`) delivers
its first beat.
The other figures are assumptions, listed in :class:`Hardware`; change them there.
Routing is synthetic: expert popularity falls off as ``1/rank**skew`` (seeded), tokens draw
TopK distinct experts by popularity; the prefill (S = 512 tokens) and the decode tokens come
from the same distribution, which is what makes dataset-free prefetch work.
"""

import dataclasses
import math

import numpy as np

from golden import ndp as golden
from golden.dram import DDR4_3200AA, Ddr4Stream
from golden.ndp import MODELS, Model

__all__ = ["Hardware", "Model", "MODELS", "STRATEGIES", "eg_prime", "solve_balance",
           "solve_e_max", "ndp_expert_seconds", "layer_latencies", "run", "averages",
           "format_table", "write_json", "plot", "figure", "PAPER"]

STRATEGIES = ("MoNDE", "TP", "TP+LB", "TP+PRE", "TP+LB+PRE")
DIMMS = (2, 4, 6)

# The paper's figures (seed 002 §V): speedups over MoNDE, averaged over the four models.
PAPER = {
    "prefill": {"TP": 1.26, "TP+LB": 1.46},
    "decode": {"TP": 1.99, "TP+LB": 2.19, "TP+PRE": 2.23, "TP+LB+PRE": 2.41},
    "end_to_end": {"average": 2.41, "max": 2.56},
}


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Table I plus the assumptions the paper does not state (marked)."""
    ndp_mults: int = 64                 # Table I
    ndp_clock_hz: float = 1.6e9         # DDR4-3200 clock: 64 B/cycle = 102.4 GB/s (Table I)
    ndp_out_depth: int = 16             # ndp_core default (> result latency: no slot waits)
    ndp_max_tokens: int = 64            # tokens per multi-token command (ndp_core's maximum)
    gpu_mem_bytes_per_s: float = 960e9  # RTX 5080 GDDR7, 256-bit at 30 Gb/s (assumed spec)
    gpu_ops_per_s: float = 225e12       # RTX 5080 dense INT8 tensor throughput (assumed, /2)
    gpu_kernel_s: float = 5e-6          # launch + sync per expert on the GPU (assumed)
    pcie_bytes_per_s: float = 50e9      # PCIe 5.0 x16, effective (assumed 78% of 64 GB/s)
    act_latency_s: float = 2e-6         # host-mediated activation hop GPU<->DIMM (assumed)
    act_bytes_per_s: float = 25.6e9     # one DDR4-3200 channel
    weight_bytes: int = 2               # 16-bit expert weights over PCIe and on the GPU (§I:
                                        # Qwen3-30B-A3B "more than 60GB"); the NDPs' times
                                        # come from the int8 RTL (ndp_core's w_width)
    act_bytes: int = 2                  # fp16 activations between GPU and DIMMs
    skew: float = 0.8                   # expert popularity ~ 1/rank**skew (assumed)
    seq_len: int = 512                  # §V: input and output lengths 512
    seed: int = 7


# --- the paper's equations --------------------------------------------------------------------

def eg_prime(e_g, dimms):
    """E_g' of §III-C: one N-th of the fractional part of E_g, the nominal 1/N when E_g is a
    non-zero integer multiple of N, 0 with no GPU expert (our reading of the text)."""
    if e_g <= 0:
        return 0.0
    fraction = e_g - math.floor(e_g)
    if fraction == 0 and round(e_g) % dimms == 0:
        return 1.0 / dimms
    return fraction / dimms


def _gpu_side(e_g, t_w, t_g, dimms):
    return t_w * e_g + t_g * eg_prime(e_g, dimms)


def solve_balance(topk, t_w, t_g, t_n, t_a, dimms, seq_len=1):
    """E_g in [0, topk] where the GPU side meets the NDP side: equation (1) for ``seq_len`` 1,
    equation (2) otherwise. Returns the real solution (0 or topk when the sides never meet)."""
    def excess(e_g):
        gpu = _gpu_side(e_g, t_w, t_g, dimms) + (seq_len - 1) * t_a * dimms
        return gpu - ((dimms + 1) * t_a + t_n * (topk - e_g))
    if excess(0.0) >= 0:
        return 0.0
    if excess(float(topk)) < 0:
        return float(topk)
    low, high = 0.0, float(topk)
    for _ in range(60):                  # the E_g' sawtooth is small next to T_w: bisect
        mid = (low + high) / 2
        low, high = (mid, high) if excess(mid) < 0 else (low, mid)
    return high


def solve_e_max(topk, t_g, t_n, t_a, dimms):
    """E_max of equation (3): T_g E_max = (TopK - E_max) T_n + (1 + N) T_a."""
    return (topk * t_n + (1 + dimms) * t_a) / (t_g + t_n)


# --- component times --------------------------------------------------------------------------

def ndp_expert_seconds(hw, model, dimms, tokens=1):
    """One expert of ``model`` for ``tokens`` tokens on ``dimms`` DIMMs (``ndp_system``; 1: a
    whole expert on one DIMM): multi-token commands of at most ``hw.ndp_max_tokens`` tokens,
    each the RTL's cycle model plus the DDR4 first access."""
    assert hw.ndp_out_depth > golden.result_latency(hw.ndp_mults), "closed form needs no waits"
    first_beat = Ddr4Stream(hw.ndp_mults).data_start[0] + DDR4_3200AA.BL
    tokens = max(1, math.ceil(tokens))
    full, rest = divmod(tokens, hw.ndp_max_tokens)
    cycles = 0
    for count, size in ((full, hw.ndp_max_tokens), (1 if rest else 0, rest)):
        if count:
            one = golden.system_expert_cycles(model.inter, model.hidden, size, dimms,
                                              hw.ndp_mults)
            cycles += count * (one + first_beat)
    return cycles / hw.ndp_clock_hz


def _expert_bytes(model, hw):
    return 3 * model.hidden * model.inter * hw.weight_bytes


def _gpu_expert_seconds(model, hw, tokens):
    macs = 3 * model.hidden * model.inter * tokens
    return hw.gpu_kernel_s + max(_expert_bytes(model, hw) / hw.gpu_mem_bytes_per_s,
                                 2 * macs / hw.gpu_ops_per_s)


def _act_seconds(model, hw, tokens=1):
    return hw.act_latency_s + tokens * model.hidden * hw.act_bytes / hw.act_bytes_per_s


@dataclasses.dataclass
class Times:
    t_w: float          # one expert's weights over PCIe
    t_g: float          # one expert on the GPU (its tokens)
    t_a: float          # one activation hop
    t_n: float          # one expert's slice on one of N DIMMs (TP)
    t_n1: float         # one whole expert on one DIMM (EP)


def _times(model, hw, dimms, tokens=1):
    return Times(
        t_w=_expert_bytes(model, hw) / hw.pcie_bytes_per_s,
        t_g=_gpu_expert_seconds(model, hw, tokens),
        t_a=_act_seconds(model, hw, tokens),
        t_n=ndp_expert_seconds(hw, model, dimms, tokens),
        t_n1=ndp_expert_seconds(hw, model, 1, tokens))


# --- routing ----------------------------------------------------------------------------------

def _popularity(model, hw, rng):
    weights = 1.0 / np.arange(1, model.experts + 1) ** hw.skew
    return rng.permutation(weights / weights.sum())


def _route(model, popularity, rng, tokens):
    return [rng.choice(model.experts, model.topk, replace=False, p=popularity)
            for _ in range(tokens)]


# --- strategies -------------------------------------------------------------------------------

def _monde(loads, expert_ids, dimms, t_w, gpu_time, t_a):
    """EP + greedy GPU offload: move the heaviest expert of the busiest DIMM while it helps.
    ``loads``: per activated expert, its NDP time on one DIMM; ``gpu_time(k)``: k experts."""
    per_dimm = [[] for _ in range(dimms)]
    for expert, load in zip(expert_ids, loads):
        per_dimm[expert % dimms].append(load)
    on_gpu = 0
    best = max(sum(d) for d in per_dimm)
    while True:
        busiest = max(range(dimms), key=lambda d: sum(per_dimm[d]))
        if not per_dimm[busiest]:
            break
        trial = [list(d) for d in per_dimm]
        trial[busiest].remove(max(trial[busiest]))
        latency = max(max(sum(d) for d in trial), (on_gpu + 1) * t_w + gpu_time(on_gpu + 1))
        if latency >= best:
            break
        per_dimm, on_gpu, best = trial, on_gpu + 1, latency
    return best + 2 * t_a


def _tp_lb(active, times, dimms, seq_len=1):
    """TP with E_g from eq. (1)/(2); E_g rounded down or up, whichever is faster."""
    real = solve_balance(active, times.t_w, times.t_g, times.t_n, times.t_a, dimms, seq_len)
    best = None
    for e_g in sorted({math.floor(real), math.ceil(real)}):
        gpu = _gpu_side(e_g, times.t_w, times.t_g, dimms) + (seq_len - 1) * times.t_a * dimms
        ndp = (dimms + 1) * times.t_a + times.t_n * (active - e_g)
        latency = max(gpu if e_g else 0.0, ndp)
        best = latency if best is None else min(best, latency)
    return best, real


def layer_latencies(model, hw, dimms):
    """Mean MoE-layer latency (seconds) of each strategy, decode and prefill, plus E_g/E_max."""
    rng = np.random.default_rng(hw.seed)
    popularity = _popularity(model, hw, rng)
    prefill = _route(model, popularity, rng, hw.seq_len)
    decode = _route(model, popularity, rng, hw.seq_len)
    shared = list(range(model.experts, model.experts + model.shared))   # always active
    counts = np.bincount(np.concatenate(prefill), minlength=model.experts)
    prefetched = set(np.argsort(-counts, kind="stable")[:model.prefetch].tolist())

    one = _times(model, hw, dimms)
    active = model.topk + model.shared
    e_max = solve_e_max(active, one.t_g, one.t_n, one.t_a, dimms)
    decode_ms = {s: [] for s in STRATEGIES}
    lb_real = None
    for chosen in decode:
        experts = list(chosen) + shared
        decode_ms["MoNDE"].append(_monde([one.t_n1] * active, experts, dimms, one.t_w,
                                         lambda k: k * one.t_g, one.t_a))
        tp = active * one.t_n + (dimms + 1) * one.t_a
        decode_ms["TP"].append(tp)
        lb, lb_real = _tp_lb(active, one, dimms)
        decode_ms["TP+LB"].append(lb)
        hits = sum(1 for e in chosen if e in prefetched)
        on_gpu = min(hits, math.floor(e_max))
        pre = max(on_gpu * one.t_g,
                  (active - on_gpu) * one.t_n + (dimms + 1) * one.t_a) if on_gpu else tp
        decode_ms["TP+PRE"].append(pre)
        decode_ms["TP+LB+PRE"].append(pre if on_gpu else lb)

    # Prefill: every expert with its token count, run as multi-token commands. MoNDE: each
    # expert whole on one DIMM, heaviest first dealt in turn; TP: every expert over all N;
    # TP+LB: the GPU takes the most-loaded ones (eq. (2)).
    tokens = counts.tolist() + [hw.seq_len] * model.shared
    experts = [e for e, n in enumerate(tokens) if n]
    loads = sorted((tokens[e] for e in experts), reverse=True)
    acts = _act_seconds(model, hw, hw.seq_len)
    per_dimm = [0.0] * dimms
    for index, n in enumerate(loads):           # heaviest first, dealt in turn
        per_dimm[index % dimms] += ndp_expert_seconds(hw, model, 1, n)
    tp_times = [ndp_expert_seconds(hw, model, dimms, n) for n in loads]
    prefill_s = {
        "MoNDE": max(per_dimm) + 2 * acts,
        "TP": sum(tp_times) + (dimms + 1) * acts,
    }
    mean_tokens = sum(loads) / len(loads)
    avg = _times(model, hw, dimms, tokens=mean_tokens)
    real = solve_balance(len(loads), avg.t_w, avg.t_g, avg.t_n, one.t_a, dimms,
                         hw.seq_len)
    best = None
    for e_g in sorted({math.floor(real), math.ceil(real)}):
        gpu = sum(one.t_w + _gpu_expert_seconds(model, hw, n) for n in loads[:e_g])
        gpu += (hw.seq_len - 1) * one.t_a * dimms if e_g else 0.0
        ndp = sum(tp_times[e_g:]) + (dimms + 1) * acts
        best = max(gpu, ndp) if best is None else min(best, max(gpu, ndp))
    prefill_s["TP+LB"] = best
    return {
        "decode": {s: float(np.mean(v)) for s, v in decode_ms.items()},
        "prefill": prefill_s,
        "e_g_decode": lb_real, "e_g_prefill": real, "e_max": e_max,
        "hit_rate": float(np.mean([sum(e in prefetched for e in c) / model.topk
                                   for c in decode])),
        "times": one,
    }


def _non_moe_seconds(model, hw, tokens):
    """Attention and the rest on the GPU: fp16 weights read once per step, or compute-bound."""
    params = model.total_params - model.expert_params
    return max(params * 2 / hw.gpu_mem_bytes_per_s, 2 * params * tokens / hw.gpu_ops_per_s * 2)


def end_to_end_seconds(model, hw, figures, strategy):
    """Prefill + seq_len decode steps over all layers; prefill uses the strategy's prefill
    schedule (PRE variants fall back to their LB/TP prefill)."""
    prefill_key = {"TP+PRE": "TP", "TP+LB+PRE": "TP+LB"}.get(strategy, strategy)
    prefill = model.moe_layers * figures["prefill"][prefill_key] + \
        _non_moe_seconds(model, hw, hw.seq_len)
    decode = hw.seq_len * (model.moe_layers * figures["decode"][strategy] +
                           _non_moe_seconds(model, hw, 1))
    return prefill + decode


def run(hw=Hardware(), models=MODELS, dimms=DIMMS):
    """All models x DIMM counts; rows of speedups over MoNDE."""
    rows = []
    for model in models:
        for n in dimms:
            figures = layer_latencies(model, hw, n)
            base_e2e = end_to_end_seconds(model, hw, figures, "MoNDE")
            row = {"model": model.name, "dimms": n, "figures": figures,
                   "decode": {s: figures["decode"]["MoNDE"] / figures["decode"][s]
                              for s in STRATEGIES},
                   "prefill": {s: figures["prefill"]["MoNDE"] / figures["prefill"][s]
                               for s in ("MoNDE", "TP", "TP+LB")},
                   "end_to_end": base_e2e / end_to_end_seconds(model, hw, figures,
                                                               "TP+LB+PRE")}
            rows.append(row)
    return rows


def averages(rows):
    out = {"decode": {}, "prefill": {}}
    for stage in out:
        for strategy in rows[0][stage]:
            out[stage][strategy] = float(np.mean([r[stage][strategy] for r in rows]))
    e2e = [r["end_to_end"] for r in rows]
    out["end_to_end"] = {"average": float(np.mean(e2e)), "max": float(np.max(e2e))}
    return out


def format_table(rows):
    """The per-model table and the averages next to the paper's figures."""
    head = ["model", "N", "decode MoNDE us"] + [f"dec {s}" for s in STRATEGIES[1:]] + \
        ["pre TP", "pre TP+LB", "E2E", "E_g(1)", "E_max", "hit"]
    lines = []
    for r in rows:
        f = r["figures"]
        lines.append([r["model"], str(r["dimms"]), f"{f['decode']['MoNDE'] * 1e6:.1f}"] +
                     [f"{r['decode'][s]:.2f}x" for s in STRATEGIES[1:]] +
                     [f"{r['prefill']['TP']:.2f}x", f"{r['prefill']['TP+LB']:.2f}x",
                      f"{r['end_to_end']:.2f}x", f"{f['e_g_decode']:.2f}",
                      f"{f['e_max']:.2f}", f"{f['hit_rate']:.2f}"])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    text = ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head] + lines]
    avg = averages(rows)
    text.append("")
    text.append("speedup over MoNDE, average of the rows (ours | paper):")
    for stage in ("prefill", "decode"):
        for strategy, value in avg[stage].items():
            if strategy == "MoNDE":
                continue
            paper = PAPER[stage].get(strategy)
            text.append(f"  {stage:8s} {strategy:10s} {value:5.2f}x | "
                        f"{f'{paper:.2f}x' if paper else '-'}")
    text.append(f"  end-to-end TP+LB+PRE average {avg['end_to_end']['average']:.2f}x, max "
                f"{avg['end_to_end']['max']:.2f}x | paper 2.41x average, up to 2.56x")
    return "\n".join(text)


def write_json(rows, path):
    """The rows (speedups, latencies in seconds, E_g, E_max, hit rate) and averages as JSON."""
    import json
    records = []
    for r in rows:
        f = dict(r["figures"])
        f["times"] = dataclasses.asdict(f["times"])
        records.append({**r, "figures": f})
    path.write_text(json.dumps({"rows": records, "averages": averages(rows), "paper": PAPER},
                               indent=2) + "\n")
    return path


def plot(rows, path):
    """Write :func:`figure` to ``path``; returns the path."""
    import matplotlib.pyplot as plt
    fig = figure(rows)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def figure(rows):
    """Speedup over MoNDE, one panel per model and stage (prefill on top, decode below): bars
    per strategy over the DIMM count, the paper's averages as dashed lines in each strategy's
    colour, MoNDE = 1 as a solid line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    stages = (("prefill", ("TP", "TP+LB")), ("decode", STRATEGIES[1:]))
    colours = {s: f"C{i}" for i, s in enumerate(STRATEGIES[1:])}
    fig, axes = plt.subplots(len(stages), len(models), figsize=(3.4 * len(models) + 1.6, 6.4),
                             squeeze=False)
    for row, (stage, strategies) in enumerate(stages):
        for col, model in enumerate(models):
            ax = axes[row][col]
            mine = [r for r in rows if r["model"] == model]
            x = np.arange(len(mine))
            width = 0.8 / len(strategies)
            for i, strategy in enumerate(strategies):
                ax.bar(x + (i - (len(strategies) - 1) / 2) * width,
                       [r[stage][strategy] for r in mine], width, label=strategy,
                       color=colours[strategy])
                paper = PAPER[stage].get(strategy)
                if paper:
                    ax.axhline(paper, color=colours[strategy], linestyle="--", linewidth=1)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(x, [str(r["dimms"]) for r in mine])
            ax.set_xlabel("NDP-DIMMs N")
            ax.set_title(f"{model}: {stage}", fontsize=9)
            if col == 0:
                ax.set_ylabel("speedup over MoNDE (x)")
            ax.tick_params(labelsize=8)
    for row, (stage, strategies) in enumerate(stages):
        handles, labels = axes[row][0].get_legend_handles_labels()
        axes[row][-1].legend(handles, labels, fontsize=7, loc="upper left",
                             bbox_to_anchor=(1.02, 1.0), title="dashed: paper's\naverage",
                             title_fontsize=7)
    fig.suptitle("seed 002 schedule model, NDP times from the RTL cycle models", fontsize=10)
    fig.tight_layout()
    return fig
