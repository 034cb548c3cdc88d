"""GPU + NDP-DIMM schedule model of one MoE layer (seed 002 §III-B..D, Table I, Table II).

Compares, for 2, 4 and 6 NDP-DIMMs and the four models of Table II:

* ``MoNDE``: expert parallelism (expert e on DIMM e mod N, a whole expert per DIMM) plus GPU
  offload: experts move from the busiest DIMM to the GPU (weights over PCIe) while that lowers
  the layer's critical path (the MoNDE-style baseline; a greedy optimum of its balance rule);
* ``TP``: every activated expert split over all N DIMMs (Fig. 4);
* ``TP+LB``: E_g experts on the GPU from the balance equations (1) (decode) / (2) (prefill);
* ``TP+PRE``: dataset-free prefetch: the TopK experts seen most often in the prefill (one for
  Mixtral, GPU memory) are copied to the GPU; activated prefetched experts run there, at most
  E_max of them (eq. (3));
* ``TP+LB+PRE``: prefetch hits on the GPU; with no hit, TP+LB.

Time of an NDP expert slice: the ``ndp_core`` cycle model (:func:`golden.ndp.command_cycles`,
which the RTL meets cycle for cycle in ``tb/test_ndp.py``) for ``ffn_slice(I/N, D)`` with
M = 64 at 1.6 GHz, started when the DDR4-3200 model (:mod:`golden.dram`) delivers the first beat.
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
           "solve_e_max", "ndp_slice_seconds", "layer_latencies", "run", "averages",
           "format_table", "write_json", "plot", "PAPER"]

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
    ndp_out_depth: int = 16             # ndp_core default
    gpu_mem_bytes_per_s: float = 960e9  # RTX 5080 GDDR7, 256-bit at 30 Gb/s (assumed spec)
    gpu_ops_per_s: float = 225e12       # RTX 5080 dense INT8 tensor throughput (assumed, /2)
    gpu_kernel_s: float = 5e-6          # launch + sync per expert on the GPU (assumed)
    pcie_bytes_per_s: float = 50e9      # PCIe 5.0 x16, effective (assumed 78% of 64 GB/s)
    act_latency_s: float = 2e-6         # host-mediated activation hop GPU<->DIMM (assumed)
    act_bytes_per_s: float = 25.6e9     # one DDR4-3200 channel
    weight_bytes: int = 1               # int8 expert weights (the NDP core's w_width)
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

def ndp_slice_seconds(hw, hidden, inter_slice, tokens=1):
    """One DIMM's ffn_slice(I_s, D) for ``tokens`` tokens: the RTL cycle model after the DDR4
    first access (weights re-streamed per token: the core is a GEMV engine)."""
    cycles = golden.command_cycles(golden.OP_FFN_SLICE, inter_slice, hidden, True,
                                   hw.ndp_mults, hw.ndp_out_depth)
    first_beat = Ddr4Stream(hw.ndp_mults).data_start[0] + DDR4_3200AA.BL
    return tokens * (cycles + first_beat) / hw.ndp_clock_hz


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
    slice_rows = math.ceil(model.inter / dimms)
    return Times(
        t_w=_expert_bytes(model, hw) / hw.pcie_bytes_per_s,
        t_g=_gpu_expert_seconds(model, hw, tokens),
        t_a=_act_seconds(model, hw, tokens),
        t_n=ndp_slice_seconds(hw, model.hidden, slice_rows, tokens),
        t_n1=ndp_slice_seconds(hw, model.hidden, model.inter, tokens))


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

    # Prefill: every expert with its token count; the GPU takes the most-loaded ones.
    tokens = counts.tolist() + [hw.seq_len] * model.shared
    experts = [e for e, n in enumerate(tokens) if n]
    loads = sorted((tokens[e] for e in experts), reverse=True)
    mean_tokens = sum(loads) / len(loads)
    avg = _times(model, hw, dimms, tokens=mean_tokens)
    prefill_s = {
        "MoNDE": _monde([n * one.t_n1 for n in (tokens[e] for e in experts)], experts,
                        dimms, one.t_w,
                        lambda k: sum(_gpu_expert_seconds(model, hw, n) for n in loads[:k]),
                        _act_seconds(model, hw, hw.seq_len)),
        "TP": sum(loads) * one.t_n + (dimms + 1) * _act_seconds(model, hw, hw.seq_len),
    }
    real = solve_balance(len(loads), avg.t_w, avg.t_g, avg.t_n, one.t_a, dimms,
                         hw.seq_len)
    best = None
    for e_g in sorted({math.floor(real), math.ceil(real)}):
        gpu = sum(one.t_w + _gpu_expert_seconds(model, hw, n) for n in loads[:e_g])
        gpu += (hw.seq_len - 1) * one.t_a * dimms if e_g else 0.0
        ndp = sum(loads[e_g:]) * one.t_n + (dimms + 1) * _act_seconds(model, hw,
                                                                              hw.seq_len)
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
    """Bar chart of normalized decode MoE latency (MoNDE = 1) per model and DIMM count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    labels = [f"{r['model']}\nN={r['dimms']}" for r in rows]
    x = np.arange(len(rows))
    for ax, stage, strategies in ((axes[0], "prefill", ("MoNDE", "TP", "TP+LB")),
                                  (axes[1], "decode", STRATEGIES)):
        width = 0.8 / len(strategies)
        for i, s in enumerate(strategies):
            ax.bar(x + i * width, [1.0 / r[stage][s] for r in rows], width, label=s)
        ax.set_xticks(x + 0.4 - width / 2, labels, fontsize=6)
        ax.set_ylabel("normalized MoE latency (MoNDE = 1)")
        ax.set_title(f"{stage} MoE layer")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
