"""The MoE layer: its golden model (golden/moe_layer.py), and moe_gate, expert_chiplet and
moe_layer on both simulators (2D, and the 3D build in lockstep with the 2D)."""

import dataclasses
import math
import random
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import (config_id, on_off_pattern, run_amaranth, run_block, sweep_params,
                      two_d_params)
from flows.demo import FP8_LAYER
from flows.verilog import NOT_INLINED, convert, generate
from golden import moe_layer as golden
from golden import fp, ndp, router
from golden.fixed import signed_limits, wrap
from hw.params import ParamError
from hw.registry import get_block
from tb.buffered import BufferedHarness


def _model(experts=8, d_model=6, d_ff=5, k=2, placement=None, groups=1, topk_groups=1, seed=1,
           lanes=4):
    rng = random.Random(seed)
    low, high = signed_limits(8)

    def matrix(rows, cols):
        return [[rng.randint(low, high) for _ in range(cols)] for _ in range(rows)]

    return golden.MoELayer(
        wg=matrix(d_model, experts),
        experts=[(matrix(d_ff, d_model), matrix(d_ff, d_model), matrix(d_model, d_ff))
                 for _ in range(experts)],
        placement=placement or [e % 4 for e in range(experts)],
        gate_lut=[rng.randint(0, 255) for _ in range(256)],
        act_lut=ndp.activation_lut("silu", 8, 4, 4), shifts=(6, 6, 4), k=k, groups=groups,
        topk_groups=topk_groups, lanes=lanes)


def _tokens(count, d_model, seed=2):
    rng = random.Random(seed)
    return [[rng.randint(-128, 127) for _ in range(d_model)] for _ in range(count)]


def test_score_codes_keep_the_order_of_the_raw_scores():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, 16).tolist()
    wg = rng.integers(-128, 128, (16, 12)).tolist()
    raw = np.asarray(x, dtype=object).dot(np.asarray(wg, dtype=object))
    codes = golden.score_codes(x, wg, 32, 6, 8)
    assert all(0 <= c < 256 for c in codes)
    for a in range(12):
        for b in range(12):
            if raw[a] > raw[b]:
                assert codes[a] >= codes[b]
    assert golden.score_codes([0] * 16, wg, 32, 6, 8) == [128] * 12


def test_layer_scores_wrap_at_the_gate_accumulator_width():
    """The layer's scores wrap at ``score_acc_width`` (the gate's accumulators), not at the
    chiplets' ``acc_width``: the two were one field until a make-sweep range end
    (``moe_layer -p score_acc_width=8``) routed every token differently from the hardware."""
    base = _model()
    tokens = _tokens(12, 6)
    narrow = dataclasses.replace(base, score_acc_width=8)
    out, wide = golden.layer(narrow, tokens), golden.layer(base, tokens)
    assert out["codes"] == [golden.score_codes(x, base.wg, 8, 8, 8) for x in tokens]
    assert out["codes"] != wide["codes"]
    # The experts' accumulators keep acc_width: narrowing it alone leaves the scores alone.
    assert golden.layer(dataclasses.replace(base, acc_width=8), tokens)["codes"] == wide["codes"]


def test_header_round_trips_and_x_fills_lanes_in_order():
    flits = golden.dispatch_flits([5, 2, 7], [200, 3, 0], list(range(1, 8)), lanes=2,
                                  gate_width=8)
    assert len(flits) == 2 + 4
    assert golden.parse_header(flits, 3, 2, 8) == [(5, 200), (2, 3), (7, 0)]
    assert flits[2:] == [[1, 2], [3, 4], [5, 6], [7, 0]]


def test_one_chiplet_holding_every_expert_aggregates_before_rounding():
    model = _model(placement=[0] * 8)
    out = golden.layer(model, _tokens(5, 6))
    for x, experts, gates, y in zip(_tokens(5, 6), out["experts"], out["gates"], out["y"]):
        exact = sum(g * np.asarray(model.ffn(e, x), dtype=object) for e, g in zip(experts, gates))
        assert y == [wrap(ndp.requant(v, model.gate_shift, 24), 24) for v in exact]
    assert out["masks"] == [1] * 5 and out["chiplet_tokens"] == [5]
    assert out["replication"] == 1.0


def test_experts_on_separate_chiplets_are_rounded_each_then_summed_in_the_network():
    model = _model(placement=list(range(8)))
    tokens = _tokens(6, 6)
    out = golden.layer(model, tokens)
    for x, experts, gates, y in zip(tokens, out["experts"], out["gates"], out["y"]):
        parts = [[ndp.requant(g * v, model.gate_shift, 24)
                  for v in model.ffn(e, x)] for e, g in zip(experts, gates)]
        assert y == [wrap(sum(column), 24) for column in zip(*parts)]
    assert out["replication"] == 2.0


def test_chiplets_without_experts_are_counted_idle():
    # 2 experts on a 4-chiplet layer: the per-chiplet figures cover all 4 (the RTL's leaf taps
    # count 4), the empty ones at zero.
    import dataclasses
    model = dataclasses.replace(_model(experts=2, k=2, placement=[0, 1]), leaves=4)
    out = golden.layer(model, _tokens(5, 6))
    assert out["chiplet_tokens"] == [5, 5, 0, 0]
    assert out["chiplet_macs"][2:] == [0, 0] and min(out["chiplet_macs"][:2]) > 0


def test_a_token_reaches_a_chiplet_once_and_work_follows_the_experts():
    model = _model(placement=[0, 0, 1, 1, 2, 2, 3, 3], k=4)
    tokens = _tokens(10, 6)
    out = golden.layer(model, tokens)
    counts = [0] * 4
    for experts, mask in zip(out["experts"], out["masks"]):
        assert mask == router.leaf_mask(experts, model.placement)
        for leaf in range(4):
            counts[leaf] += (mask >> leaf) & 1
    assert out["chiplet_tokens"] == counts
    assert sum(out["chiplet_macs"]) == 10 * 4 * golden.expert_macs(6, 5)
    assert golden.mac_bound(out["chiplet_macs"], 16) == max(
        -(-m // 16) for m in out["chiplet_macs"])


@pytest.mark.parametrize("groups, topk_groups", [(4, 1), (4, 2), (2, 1)])
def test_node_limited_routing_keeps_the_token_within_its_groups(groups, topk_groups):
    model = _model(k=2, groups=groups, topk_groups=topk_groups)
    out = golden.layer(model, _tokens(12, 6))
    size = 8 // groups
    for experts in out["experts"]:
        assert len(set(experts)) == 2
        assert len({e // size for e in experts}) <= topk_groups


# ---- moe_gate: config, generation, cocotb on both simulators ---------------------------------

# Configurations simulated (those in GATE_SWEEP by `make sweep` only): the defaults;
# node-limited routing with odd sizes (3 lanes, 5 elements: a padded beat; 2 header flits); the
# smallest corner (one lane, one element, 1-bit codes and gates, one leaf); a wide one (16
# experts and a shared one on leaf 5, 8 lanes, one header flit); FP8 x (E5M2: the widest
# fixed-point values, 8-bit lanes that hold a code exactly, 3 lanes; E4M3 with a shared expert:
# x's scale entry opens a second header flit, and a 20-bit accumulator that wraps, scaled by
# every E8M0 code the bench draws, 0 and 254 among them); BF16 x.
SIM_CONFIGS = [
    {},
    {"experts": 6, "k": 3, "groups": 3, "topk_groups": 2, "leaves": 3, "d_model": 5, "lanes": 2,
     "in_width": 5, "score_width": 4, "gate_width": 5, "acc_width": 12, "score_shift": 3},
    {"experts": 2, "k": 1, "leaves": 1, "d_model": 1, "lanes": 1, "score_width": 1,
     "gate_width": 1, "data_width": 8, "score_shift": 0},
    {"experts": 16, "k": 4, "groups": 4, "topk_groups": 2, "leaves": 8, "d_model": 12,
     "lanes": 8, "w_width": 4, "score_width": 6, "shared": 1, "shared_leaf": 5},
    {"dtype": "fp8_e5m2", "d_model": 7, "lanes": 3, "data_width": 8, "gate_width": 5,
     "acc_width": 48, "score_shift": 20},
    {"dtype": "fp8_e4m3", "experts": 5, "k": 2, "shared": 1, "shared_leaf": 1, "leaves": 2,
     "d_model": 3, "lanes": 3, "acc_width": 20, "score_shift": 6},
    # BF16 x: cut to Q16.16 (truncated below 2**-16, saturated at 65280), 2 lanes; the bench
    # draws x near 2**-8 here (GateBench.x_spread), so the products' low bits decide codes
    {"dtype": "bf16", "in_width": 16, "d_model": 5, "lanes": 2, "w_width": 6,
     "acc_width": 40, "score_shift": 8},
    # FP32 x scales (the totals times a signed 24-bit significand, one more stage): in four
    # 8-bit header entries, low byte first, over 2 header flits of 3 lanes; a 30-bit
    # accumulator that wraps
    {"dtype": "fp8_e4m3", "scale_format": "fp32", "experts": 4, "leaves": 2, "d_model": 4,
     "lanes": 3, "data_width": 8, "gate_width": 4, "acc_width": 30, "score_shift": 6},
]


# In `make sweep` only (make test's time budget, 2026-11-30): the defaults, the default
# layer's gate (make test runs that layer), and the wide one (16 experts, 8 leaves, 8 lanes:
# make test keeps a shared expert in the E4M3 gate, 16 leaves in the router's defaults).
GATE_SWEEP = (0, 3)


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
@pytest.mark.parametrize("params", sweep_params(SIM_CONFIGS, GATE_SWEEP))
def test_gate_cocotb(params, simulator):
    assert run_block("moe_gate", params, simulator).tests == COCOTB_TESTS


COCOTB_TESTS = 10


@pytest.mark.parametrize("params, name", [
    ({"data_width": 4}, "data_width"),                     # narrower than in_width
    ({"data_width": 8, "gate_width": 8}, "data_width"),    # a header entry does not fit
    ({"experts": 6, "groups": 4}, "groups"),               # the router's rule, its message
    ({"k": 9}, "k"),
    ({"dtype": "bf16"}, "in_width"),                       # 8 bits: not a BF16 code
    ({"dtype": "fp8_e5m2", "in_width": 16}, "in_width"),   # 16 bits: not an FP8 code
    ({"scale_format": "fp32"}, "scale_format"),            # integers carry no scales
    ({"dtype": "fp8_e4m3", "scale_format": "fp16"}, "scale_format"),
])
def test_gate_config_errors_name_the_parameter(params, name):
    with pytest.raises(ParamError, match=f"parameter '{name}'"):
        get_block("moe_gate").config(**params)


def test_gate_generates_with_the_documented_ports():
    block = get_block("moe_gate")
    info = generate(block, block.config(), "build/test-moe-gate")[2]
    names = {port["name"] for port in info["ports"]}
    assert {"x__payload", "wg__payload", "gate_lut__payload", "table__payload",
            "packet__payload", "error"} <= names


# ---- expert_chiplet: the weight layout, the schedule, cocotb on both simulators -------------

def test_weight_beats_put_each_weight_where_the_tile_reads_it():
    shape = golden.ChipletShape(d_model=5, d_ff=3, rows=2, cols=2, arrays=3)
    rng = random.Random(4)
    wg, wu = ([[rng.randint(-9, 9) for _ in range(5)] for _ in range(3)] for _ in range(2))
    wd = [[rng.randint(-9, 9) for _ in range(3)] for _ in range(5)]
    beats = golden.weight_beats(shape, wg, wu, wd)
    assert len(beats) == shape.expert_beats == 2 * 2 * 2 + 3 * 1
    assert all(len(beat) == 6 for beat in beats)
    # Tile-by-tile products of the beats give x·W^T for every matrix (zero padding included).
    x = [rng.randint(-9, 9) for _ in range(5)]
    for matrix, first, chunks, depth, width in ((wg, 0, 2, shape.k_x, 5),
                                                (wu, 4, 2, shape.k_x, 5)):
        for c in range(chunks):
            for j in range(2):
                total = sum(beats[first + c * depth + k][s * 2 + j] *
                            (x[s * depth + k] if s * depth + k < width else 0)
                            for s in range(3) for k in range(depth))
                if c * 2 + j < 3:
                    assert total == sum(w * v for w, v in zip(matrix[c * 2 + j], x))
    h = [1, -2, 3]
    for c in range(3):
        for j in range(2):
            total = sum(beats[8 + c + k][s * 2 + j] * (h[s + k] if s + k < 3 else 0)
                        for s in range(3) for k in range(1))
            if c * 2 + j < 5:
                assert total == sum(w * v for w, v in zip(wd[c * 2 + j], h))


def test_token_banks_overlap_collecting_computing_and_returning():
    shape = golden.ChipletShape(d_model=8, d_ff=8, rows=4, cols=4, arrays=2)
    batches = [([4, 4], 8)] * 3
    done = golden.chiplet_batch_edges([4, 4], shape, 8)["done"]
    flits = 3
    arrivals = [24, 48, 72]                      # packets back to back, one flit per edge
    full = {"batch": 8, "batch_wait": 16}
    one = golden.chiplet_stream_returns(batches, shape, 1, flits, arrivals, **full)
    # One bank: a batch is collected after the previous one's returns.
    assert one[0] == 24 + done + 1
    assert one[1] == one[0] - 1 + 8 * flits + 8 * flits + done + 1
    two = golden.chiplet_stream_returns(batches, shape, 2, flits, arrivals, **full)
    # Two banks: the second batch is in before the first is computed; it starts when the
    # planner is free and returns right after it (compute-bound).
    assert two[0] == one[0] and two[1] == two[0] + done
    assert golden.chiplet_stream_returns(batches, shape, 3, flits, arrivals, **full) == two


def test_a_partial_batch_closes_when_the_planner_is_free():
    shape = golden.ChipletShape(d_model=8, d_ff=8, rows=4, cols=4, arrays=2)
    flits, done = 3, golden.chiplet_batch_edges([4, 4], shape, 8)["done"]
    wait = {"batch": 8, "batch_wait": 16}
    # Alone, a partial batch closes batch_wait cycles after its last flit.
    alone = golden.chiplet_stream_returns([([2, 1], 3)], shape, 2, flits, [9], **wait)
    assert alone[0] == 9 + 16 + golden.chiplet_batch_edges([2, 1], shape, 3)["done"] + 1
    # Behind a full batch still computing, it waits for the planner (and is taken at once).
    firsts = golden.chiplet_stream_returns([([4, 4], 8), ([2, 1], 3)], shape, 2, flits,
                                           [24, 33], **wait)
    assert 33 + 16 < 24 + done
    assert firsts[1] == 24 + done + golden.chiplet_batch_edges([2, 1], shape, 3)["done"] + 1


def test_chiplet_schedule_counts_one_visit_per_slot_and_grows_with_groups():
    shape = golden.ChipletShape(d_model=8, d_ff=8, rows=4, cols=4, arrays=2)
    empty = golden.chiplet_batch_edges([0, 0], shape, 1)
    assert empty["first_return"] == 2 + 3 and empty["compute_edges"] == 0   # 2 visits
    one = golden.chiplet_batch_edges([1, 0], shape, 1)
    five = golden.chiplet_batch_edges([5, 0], shape, 5)
    assert five["first_return"] > one["first_return"]     # two groups of R = 4 rows
    assert golden.chiplet_batch_edges([4, 0], shape, 4) == one   # one full group: same time


def test_a_slot_still_loading_delays_its_own_groups_and_no_others():
    shape = golden.ChipletShape(d_model=8, d_ff=8, rows=4, cols=4, arrays=2)
    resident = golden.chiplet_batch_edges([5, 3], shape, 8)
    # Weights in before the planner reaches the slot: no change.
    assert golden.chiplet_batch_edges([5, 3], shape, 8, loaded=[-50, 0]) == resident
    # Slot 1 loaded late: its groups start the edge after its last beat; the wait is paid
    # once, so every later edge moves by the same amount.
    late = [golden.chiplet_batch_edges([5, 3], shape, 8, loaded=[None, edge])["done"]
            for edge in (400, 401, 450)]
    assert late[1] == late[0] + 1 and late[2] == late[0] + 50
    assert late[0] > resident["done"]
    # Slot 0 late: nothing can start before it.
    first = golden.chiplet_batch_edges([5, 3], shape, 8, loaded=[300, None])
    assert first["done"] - 300 == golden.chiplet_batch_edges([5, 3], shape, 8,
                                                             loaded=[301, None])["done"] - 301
    # While slot 1 loads, slot 0's last group finishes (its down phase is not held back
    # behind slot 1's first gate/up): after a long wait the batch ends as slot 1 alone would.
    assert golden.chiplet_batch_edges([4, 4], shape, 8, loaded=[None, 200]) \
        ["done"] == golden.chiplet_batch_edges([0, 4], shape, 4, loaded=[None, 200])["done"]


def test_stream_order_puts_each_chiplets_heaviest_expert_first():
    model = _model(4, 4, 3, k=1, placement=[0, 1, 0, 1])
    tokens = _tokens(15, 4, seed=3)
    out = golden.layer(model, tokens)
    counts = [sum(e in experts for experts in out["experts"]) for e in range(4)]
    assert counts == [2, 1, 8, 4]                         # the later expert heavier on both
    order = golden.stream_order(model, tokens, 2, 3)
    assert order == [[2, 0, None], [3, 1, None]]
    for leaf in range(2):
        mine = [e for e in order[leaf] if e is not None]
        assert sorted(mine) == [e for e in range(4) if model.placement[e] == leaf]
        assert [counts[e] for e in mine] == sorted((counts[e] for e in mine), reverse=True)
        assert order[leaf][-1] is None                    # 3 slots, 2 experts
    light = golden.stream_order(model, tokens, 2, 3, heaviest_first=False)
    for leaf in range(2):
        assert [counts[e] for e in light[leaf] if e is not None] == sorted(
            counts[e] for e in light[leaf] if e is not None)
    # Counting each chiplet's first batch only: its first 2 tokens here (experts 2 and 0 on
    # leaf 0, a tie: the lower id first; 3 and 3 on leaf 1).
    assert [e for experts in out["experts"] for e in experts if e in (0, 2)][:2] == [2, 0]
    assert golden.stream_order(model, tokens, 2, 2, batch=2) == [[0, 2], [3, 1]]


def test_layer_has_a_weight_port_per_switch_group():
    block = get_block("moe_layer")
    params = {"experts": 4, "fanouts": (2, 3), "slots": 1, "d_model": 2, "d_ff": 2, "lanes": 2,
              "rows": 1, "cols": 1, "arrays": 1, "batch": 1}
    config = block.config(**params)
    assert (config.switch_groups, config.group_leaves) == (2, 3)
    assert block.config(**{**params, "fanouts": (6,)}).switch_groups == 1
    info = generate(block, config, "build/test-moe-layer-ports")[2]
    widths = {port["name"]: port["width"] for port in info["ports"]}
    # leaf in the group (2 bits for 3), slot (1), expert (2), one 8-bit weight, last
    assert widths["weights__0__payload"] == widths["weights__1__payload"] == 2 + 1 + 2 + 8 + 1
    assert "weights__2__payload" not in widths
    assert widths["assign__payload"] == 3 + 1 + 2            # leaf of 6, slot, expert
    # The six chiplets are one module (converted once) instanced six times, under the names
    # and so the hierarchical paths a submodule each had.
    chiplet = f"{info['modules'][1].split('__')[0]}__chiplet"
    assert info["modules"].count(chiplet) == 1
    text = Path("build/test-moe-layer-ports/moe_layer.v").read_text()
    assert re.findall(rf"^  {chiplet} (chiplet\d+) \(", text, re.M) == \
        [f"chiplet{leaf}" for leaf in range(6)]
    # Verilator keeps it a module of its own (not inlined six times), and the buffered
    # harness (tb.buffered) holds the layer with its chiplets shared the same way.
    assert re.search(rf"^module {chiplet}\(.*\n  {re.escape(NOT_INLINED)}$", text, re.M)
    harness = convert(BufferedHarness(block.build(config)), "moe_layer_buffered")
    assert re.findall(r"^  moe_layer_buffered__chiplet (chiplet\d+) \(", harness, re.M) == \
        [f"chiplet{leaf}" for leaf in range(6)]


# The defaults (2 token banks); odd sizes everywhere (3 slots, D=5, F=3, 2 lanes, a 3x2 tile
# of 3 arrays, a batch of 5, a queue of 2 packets, 2 header flits, 3 token banks); the
# smallest corner (1 of everything, 2-bit elements, no queue, one token bank); a tall narrow
# tile (R = 6 > K, so the tile's spacing rule paces it) with 4 slots holding every expert.
# The tile's integer PEs with 2 registers before their adders in the odd sizes, none in the
# corner (3, the default, elsewhere).
CHIPLET_CONFIGS = [
    {},
    {"experts": 7, "k": 3, "slots": 3, "d_model": 5, "d_ff": 3, "lanes": 2, "rows": 3,
     "cols": 2, "arrays": 3, "batch": 5, "batch_wait": 3, "in_width": 6, "w_width": 5,
     "acc_width": 20, "combine_width": 20, "gate_width": 4, "data_width": 8,
     "queue_tokens": 2, "token_banks": 3, "pe_stages": 2},
    {"experts": 2, "k": 1, "slots": 1, "leaves": 1, "d_model": 1, "d_ff": 1, "lanes": 1,
     "rows": 1, "cols": 1, "arrays": 1, "batch": 1, "batch_wait": 1, "in_width": 2,
     "w_width": 2, "gate_width": 1, "data_width": 2, "shift_g": 0, "shift_u": 0,
     "shift_h": 0, "gate_shift": 0, "queue_tokens": 0, "token_banks": 1, "pe_stages": 0},
    {"experts": 4, "k": 2, "slots": 4, "d_model": 4, "d_ff": 6, "lanes": 4, "rows": 6,
     "cols": 3, "arrays": 1, "batch": 7, "shift_g": 3, "gate_shift": 5},
    # Floating point (issue 17; E4M3 with BF16 returns runs in the layer's configurations):
    # E5M2 (infinities) with FP32 returns and a 23-bit accumulator.
    {"dtype": "fp8_e5m2", "combine_dtype": "fp32", "combine_width": 32, "acc_frac": 23,
     "promote_every": 0, "d_model": 6, "d_ff": 4, "rows": 2, "cols": 3, "batch": 4,
     "shift_g": 2, "shift_u": 2, "shift_h": 1},
    # BF16 (16-bit codes in 16-bit lanes, the activation table cut to a code's top 12 bits)
    # with BF16 returns, odd sizes (D = 5, F = 3, 2 lanes, a 2x3 tile of 2 arrays, batches
    # of 3), promotion inside a dot (K = 3 per slice, every 2).
    {"dtype": "bf16", "in_width": 16, "w_width": 16, "combine_dtype": "bf16",
     "combine_width": 16, "d_model": 5, "d_ff": 3, "lanes": 2, "rows": 2, "cols": 3,
     "arrays": 2, "batch": 3, "promote_every": 2, "shift_g": 1, "shift_u": 1, "shift_h": 0},
    # FP32 scales (x's in two 16-bit header entries, the second in the next header flit; the
    # tile's PEs multiply each promotion by them) with BF16 returns, a 2x2 tile of 2 arrays
    {"dtype": "fp8_e4m3", "scale_format": "fp32", "combine_dtype": "bf16",
     "combine_width": 16, "d_model": 4, "d_ff": 3, "lanes": 3, "rows": 2, "cols": 2,
     "batch": 3, "shift_g": 1, "shift_u": 1, "shift_h": 0},
]
CHIPLET_COCOTB_TESTS = 19
# In `make sweep` only (make test's time budget, 2026-11-30): the defaults, which are the
# chiplets of the layer's defaults that make test runs (every field equal:
# test_layer_defaults_hold_default_chiplets_and_gate); E5M2 with FP32 returns (about 140 s of
# make test, most of it on Icarus): make test keeps E5M2 in fp_dot and moe_gate, FP32 returns
# in the NoP tree, and a floating-point chiplet in the FP8 layer's (E4M3, BF16 returns); BF16
# (69 s, 46 of them on Icarus): make test keeps BF16 chiplets, their cut activation tables
# included, in the BF16 layer's (FP32 returns), and BF16 returns in the FP8 layer.
CHIPLET_SWEEP = (0, 4, 5, 6)


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
@pytest.mark.parametrize("params", sweep_params(CHIPLET_CONFIGS, CHIPLET_SWEEP))
def test_chiplet_cocotb(params, simulator):
    assert run_block("expert_chiplet", params, simulator).tests == CHIPLET_COCOTB_TESTS


def test_layer_defaults_hold_default_chiplets_and_gate():
    # Why make test may leave the chiplet's and the gate's defaults to make sweep: the default
    # layer, which it simulates on both simulators, is built of exactly these.
    layer = get_block("moe_layer").config()
    assert layer.chiplet_config() == get_block("expert_chiplet").config()
    assert layer.gate_config() == get_block("moe_gate").config()


# In `make sweep`: each FP8 format at the default sizes (a 4 x 4 tile of 2 arrays, D = F = 8;
# E5M2 with the widest accumulator, E4M3 promoting every 128, the largest interval),
# and E4M3 with BF16 returns, 3 of a token's experts on the chiplet (the FP32 sums' order
# matters), an odd adder tree (3 arrays), promotion inside a dot (K = 3 per slice, every 2).
CHIPLET_SWEEP_CONFIGS = [
    {"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16, "experts": 6, "k": 3,
     "slots": 3, "d_model": 7, "d_ff": 5, "lanes": 3, "rows": 3, "cols": 2, "arrays": 3,
     "batch": 5, "promote_every": 2, "gate_width": 7, "shift_g": 0, "shift_u": 1,
     "shift_h": 0, "gate_shift": 7},
    {"dtype": "fp8_e5m2", "combine_dtype": "fp32", "combine_width": 32, "acc_frac": 24,
     "promote_every": 0, "shift_g": 2, "shift_u": 2, "shift_h": 1},
    {"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16, "shift_g": 1,
     "shift_u": 1, "shift_h": 0},
    # the other ends of the accumulator: 4 fraction bits, promotion after every element
    {"dtype": "fp8_e4m3", "combine_dtype": "fp32", "combine_width": 32, "acc_frac": 4,
     "promote_every": 1, "d_model": 6, "d_ff": 4, "rows": 2, "cols": 3, "batch": 4},
]


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
@pytest.mark.parametrize("params", CHIPLET_SWEEP_CONFIGS,
                         ids=[config_id(p) for p in CHIPLET_SWEEP_CONFIGS])
def test_chiplet_cocotb_more_floating_point(params, simulator):
    assert run_block("expert_chiplet", params, simulator).tests == CHIPLET_COCOTB_TESTS


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_chiplet_3d_in_lockstep_with_2d(simulator):
    # Logic die over SRAM die: expert_chiplet_equiv runs both builds; every test passes on the
    # 2D outputs and `mismatch` never rises. In `make sweep` only: `make test`'s layer 3D run
    # below puts every chiplet's logic over its banks the same way.
    assert run_block("expert_chiplet", CHIPLET_CONFIGS[1], simulator,
                     three_d=True).tests == CHIPLET_COCOTB_TESTS


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_layer_3d_in_lockstep_with_2d(simulator):
    # Every test but test_throughput (make test's time budget: about half this run on Icarus):
    # its figures are the 2D build's (make bench), and its traffic, 64-token batches under
    # each placement and weight stream, is of the kinds the other tests send. The odd
    # configuration's test_throughput runs on both simulators in make sweep's 2D run.
    assert run_block("moe_layer", LAYER_CONFIGS[1], simulator, three_d=True,
                     skip=["test_throughput"]).tests == LAYER_COCOTB_TESTS - 1


def test_layer_3d_puts_every_scratchpad_bank_on_the_memory_die(tmp_path):
    from flows.threed import generate_3d
    block = get_block("moe_layer")
    config = block.config(**LAYER_CONFIGS[1])
    built = generate_3d(block, config, tmp_path)
    pmu = config.chiplet_config().pmu_config()
    address = pmu.bank_depth.bit_length() - 1
    banks = config.leaves * pmu.banks
    # Per bank: write enable, write address and data, read address down; read data up.
    assert built["bond_counts"] == {"down": 2 + banks * (1 + 2 * address + pmu.elem_width),
                                    "up": banks * pmu.elem_width}
    assert {net for net, _, _ in built["nets"]} >= {
        f"leaf{leaf}__bank{bank}__r_data" for leaf in range(config.leaves)
        for bank in range(pmu.banks)}
    # The bank memories (reg arrays named bank<b>) are on the bottom die, none on the top.
    bank_array = re.compile(r"^\s*reg \[\d+:0\] bank\d+ \[", re.M)
    assert len(bank_array.findall(built["paths"]["bottom"].read_text())) == banks
    assert not bank_array.findall(built["paths"]["top"].read_text())
    partition = built["paths"]["partition"].read_text().splitlines()
    assert partition[:2] == ["u_top 0", "u_bottom 1"] and len(partition) == 2 + len(built["bonds"])


@pytest.mark.parametrize("params, name", [
    ({"arrays": 8, "cols": 5}, "cols"),                    # a weight beat over 32 lanes
    ({"data_width": 6}, "data_width"),                     # narrower than in_width
    ({"slots": 8, "d_model": 64, "d_ff": 64, "cols": 1, "arrays": 1}, "slots"),
    ({"in_width": 11}, "in_width"),
    ({"in_width": 16}, "in_width"),                        # int: a 2**16-entry table
    ({"dtype": "bf16", "combine_dtype": "bf16", "combine_width": 16}, "in_width"),  # 8 bits
    ({"dtype": "bf16", "combine_dtype": "bf16", "combine_width": 16, "in_width": 16},
     "w_width"),                                           # 8-bit weights: not BF16 codes
    ({"combine_dtype": "bf16", "combine_width": 16}, "combine_dtype"),   # int returns
    ({"dtype": "fp8_e4m3", "combine_width": 16}, "combine_dtype"),       # FP needs FP returns
    ({"dtype": "fp8_e5m2", "combine_dtype": "fp32"}, "combine_width"),   # 24: not its code
    ({"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16, "in_width": 6},
     "in_width"),
    ({"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16, "w_width": 16},
     "w_width"),
    ({"dtype": "fp8_e4m3", "combine_dtype": "bf16", "combine_width": 16, "promote_every": 3},
     "promote_every"),                                     # not a divisor of 128
    ({"scale_format": "fp32"}, "scale_format"),            # integers carry no scales
])
def test_chiplet_config_errors_name_the_parameter(params, name):
    with pytest.raises(ParamError, match=f"parameter '{name}'"):
        get_block("expert_chiplet").config(**params)


# ---- moe_layer: the system -----------------------------------------------------------------

# The defaults (8 experts on 4 chiplets of 2 slots, a 2,2 tree, 2 token banks); an odd one:
# node-limited 6 experts in 3 groups and a shared expert on a 3-leaf tree, D = 5, F = 3, 2
# lanes (2 header flits), a 3x2 tile of 3 arrays with the product's register alone before
# each PE's adder (pe_stages 1), batches of 3, one token bank; FP8.
LAYER_CONFIGS = [
    {},
    {"experts": 6, "k": 3, "groups": 3, "topk_groups": 2, "fanouts": (3,), "slots": 3,
     "shared": 1, "shared_leaf": 2,
     "d_model": 5, "d_ff": 3, "lanes": 2, "rows": 3, "cols": 2, "arrays": 3, "batch": 3,
     "batch_wait": 4, "in_width": 6, "w_width": 5, "score_width": 4, "gate_width": 4,
     "data_width": 8, "acc_width": 20, "combine_width": 20, "score_shift": 3,
     "token_banks": 1, "pe_stages": 1},
    # FP8 dispatch, BF16 combine (seed 003 §6.5): E4M3 x and experts, BF16 returns added by a
    # 3-way switch (3 chiplets a token: the order matters), 3 experts a chiplet (their order
    # too), an odd adder tree (3 arrays), promotion inside a dot, the gate on fixed-point x; a
    # 1x2 tile: FP PEs side by side, each column with its own B lane and that slice's scale
    # (make test's only FP array wider than one column).
    {**FP8_LAYER, "rows": 1},
    # BF16 x and experts (the gate's Q16.16 x, a 16-bit W_g into a 48-bit score accumulator;
    # the chiplets' activation tables cut to a code's top 12 bits), FP32 returns added by a
    # 2-way switch, 2 experts a chiplet, a 1x2 tile of one array; FP32 scales: x's in two
    # 16-bit header entries, carried through the tree untouched, the gate's totals times its
    # significand, the chiplets' PEs multiplying each promotion by x's and the weight blocks'.
    {"dtype": "bf16", "scale_format": "fp32", "in_width": 16, "w_width": 16,
     "combine_dtype": "fp32", "combine_width": 32, "fanouts": (2,), "experts": 4, "slots": 2,
     "k": 2, "d_model": 3, "d_ff": 2, "lanes": 2, "rows": 1, "cols": 2, "arrays": 1,
     "batch": 2, "score_acc_width": 48, "score_shift": 28, "shift_g": 0, "shift_u": 1,
     "shift_h": 0, "token_width": 5, "max_inflight": 16},
    # In make sweep only (make test's time budget, 2026-12-01: each layer configuration is
    # some 30 s of generation and builds): FP32 scales with FP8 x, in four 8-bit header
    # entries (3 header flits of 2 lanes); BF16 returns, a 1x2 tile. make test covers the
    # four-entry split in the FP32-scale gate, FP32 scales in the layer in the BF16 one above.
    {"dtype": "fp8_e4m3", "scale_format": "fp32", "combine_dtype": "bf16",
     "combine_width": 16, "fanouts": (2,), "experts": 4, "slots": 2, "k": 2, "d_model": 3,
     "d_ff": 2, "lanes": 2, "rows": 1, "cols": 2, "arrays": 1, "batch": 2, "data_width": 8,
     "gate_width": 6, "score_shift": 6, "shift_g": 0, "shift_u": 1, "shift_h": 0,
     "token_width": 5, "max_inflight": 16},
    # The demo's FP8 layer itself, its tile 2x2: in make sweep only (make test's time budget:
    # its suite took 167 s on Icarus, a one-row tile's 118 s). FP rows, each with its
    # row's scale, make test runs in test_systolic's BF16 tile of 2x1 arrays; `make demo`
    # runs this layer's bit-exact test on Verilator.
    FP8_LAYER,
]
LAYER_SWEEP = (4, 5)
LAYER_COCOTB_TESTS = 18


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
@pytest.mark.parametrize("params", two_d_params(LAYER_CONFIGS, 1, LAYER_SWEEP))
def test_layer_cocotb(params, simulator):
    assert run_block("moe_layer", params, simulator).tests == LAYER_COCOTB_TESTS


# One-flit tokens (D <= L, X = 1): with y held the root dispatches one token more (docs
# Timing); no configuration above has them. A small layer, that test alone (make test's time).
ONE_FLIT_LAYER = {"fanouts": (2,), "experts": 4, "slots": 2, "d_model": 2, "d_ff": 2,
                  "lanes": 2, "rows": 2, "cols": 2, "arrays": 1, "batch": 2}


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_layer_with_one_flit_tokens_and_y_held(simulator):
    assert get_block("moe_layer").config(**ONE_FLIT_LAYER).x_flits == 1
    assert run_block("moe_layer", ONE_FLIT_LAYER, simulator,
                     testcase=["test_y_held_until_the_layer_is_full"]).tests == 1


@pytest.mark.parametrize("params, name", [
    ({"experts": 9}, "experts"),                           # 9 experts, 4 chiplets of 2 slots
    ({"d_model": 64, "lanes": 1}, "d_model"),              # a packet longer than 64 flits
    ({"fanouts": (2, 2), "k": 9}, "k"),
    ({"in_width": 12}, "in_width"),
    ({"dtype": "fp8_e4m3", "combine_width": 16}, "combine_dtype"),   # the chiplets' rules
    ({"dtype": "fp8_e5m2", "combine_dtype": "bf16", "combine_width": 16, "in_width": 10},
     "in_width"),
    ({"scale_format": "fp32"}, "scale_format"),            # integers carry no scales
])
def test_layer_config_errors_name_the_parameter(params, name):
    with pytest.raises(ParamError, match=f"parameter '{name}'"):
        get_block("moe_layer").config(**params)


def test_community_workload_routes_within_a_community_and_clustering_finds_it():
    wg, tokens, community = golden.community_workload(7, 64, 8, 8, 4, 8, 8)
    model = _model(placement=[e % 4 for e in range(8)], d_model=8)
    model = golden.MoELayer(**{**model.__dict__, "wg": wg})
    routes = golden.layer(model, tokens)["experts"]
    assert sum(community[a] == community[b] for a, b in routes) >= 60   # nearly every token
    tables = golden.placements(model, tokens, leaves=4, switch_groups=2)
    assert tables["round_robin"] == [e % 4 for e in range(8)]
    for name, table in tables.items():
        assert sorted(table) == [0, 0, 1, 1, 2, 2, 3, 3]                # 2 experts per leaf
    clustered = golden.layer(golden.MoELayer(**{**model.__dict__,
                                                "placement": tables["clustered"]}), tokens)
    assert clustered["replication"] < golden.layer(model, tokens)["replication"]
    assert "clustered" not in golden.placements(model, tokens, leaves=3, switch_groups=1)


def test_root_link_flits_count_the_root_children_or_the_leaf_links():
    from flows.demo import root_link_flits
    deep = get_block("moe_layer").config()
    run = {"down_link_flits": [5, 7], "up_link_flits": [3, 4], "chiplet_tokens": [1, 2, 3, 4]}
    assert root_link_flits(deep, run) == 19
    flat = get_block("moe_layer").config(fanouts=(4,))
    assert root_link_flits(flat, run) == 2 * (flat.header_flits + flat.x_flits) * 10


def test_a_shared_expert_joins_every_token_on_its_leaf_with_the_largest_gate():
    base = _model(placement=[e % 4 for e in range(8)])
    extra = base.experts[0]
    model = golden.MoELayer(**{**base.__dict__, "experts": base.experts + [extra],
                               "placement": base.placement + [3], "shared": True})
    tokens = _tokens(6, 6)
    out, plain = golden.layer(model, tokens), golden.layer(base, tokens)
    assert out["experts"] == plain["experts"] and model.routed == 8
    for mask, plain_mask in zip(out["masks"], plain["masks"]):
        assert mask == plain_mask | 1 << 3
    assert sum(out["chiplet_macs"]) == sum(plain["chiplet_macs"]) + 6 * golden.expert_macs(6, 5)
    x = tokens[0]
    choices = model.choices(out["experts"][0], out["gates"][0])
    assert choices[-1] == (8, 255)
    y = sum(np.asarray(golden.chiplet_return(model, leaf, choices, x), dtype=object)
            for leaf in range(4) if out["masks"][0] >> leaf & 1)
    assert out["y"][0] == [wrap(v, 24) for v in y]


def test_an_x_scale_moves_the_score_rounding_and_rides_in_the_header():
    """Floating point: x's E8M0 scale c multiplies the gate's wrapped sums by 2**(c - 127)
    before their one rounding: c = 127 + j is score_shift - j, a shift below 0 shifts left and
    saturates, NaN (255) scores every expert 0; the packet carries c after the choices."""
    rng = np.random.default_rng(4)
    x = rng.integers(-3000, 3000, 6).tolist()
    wg = rng.integers(-128, 128, (6, 5)).tolist()
    for j in (-20, -3, 0, 1, 5, 8):
        assert golden.score_codes(x, wg, 32, 8, 8, 127 + j) == \
            golden.score_codes(x, wg, 32, 8 - j, 8)
    raw = np.asarray(x, dtype=object).dot(np.asarray(wg, dtype=object))
    left = golden.score_codes(x, wg, 32, 2, 8, 127 + 5)         # shift -3: times 8
    assert left == [max(-128, min(127, int(v) * 8)) + 128 for v in raw]
    assert golden.score_codes(x, wg, 32, 8, 8, 254) == [0 if v < 0 else 255 if v > 0 else 128
                                                        for v in raw]
    assert golden.score_codes(x, wg, 32, 8, 8, 255) == [128] * 5
    assert golden.score_codes(x, wg, 32, 8, 8, 0) == [128] * 5        # 2**-127: rounds to 0
    flits = golden.dispatch_flits([3, 1], [9, 4], [7, 8, 9], lanes=2, gate_width=4, scale=200)
    assert flits == [[3 << 4 | 9, 1 << 4 | 4], [200, 0], [7, 8], [9, 0]]
    assert golden.header_flits(2 + 1, 2) == 2


def test_an_fp32_x_scale_multiplies_the_sums_exactly_and_spans_header_entries():
    """FP32 x scales (scale_format fp32): each wrapped sum times the scale exactly, rounded
    once; a power of two is the E8M0 scale of its exponent; a negative scale negates the sums;
    an infinity is the largest finite value (every nonzero sum saturates), NaN scores 0; the
    code rides in ceil(32 / data_width) header entries, low bits first."""
    rng = np.random.default_rng(6)
    x = rng.integers(-3000, 3000, 6).tolist()
    wg = rng.integers(-128, 128, (6, 5)).tolist()
    raw = [int(v) for v in np.asarray(x, dtype=object).dot(np.asarray(wg, dtype=object))]

    def codes(scale, shift=20):
        return golden.score_codes(x, wg, 32, shift, 8, fp.encode(scale, "fp32"), "fp32")
    for j in (-20, -3, 0, 5):
        assert codes(2.0 ** j) == golden.score_codes(x, wg, 32, 20, 8, 127 + j)
    for scale in (1.375, 3.1, 0.7071):
        exact = [Fraction(v) * Fraction(fp.decode(fp.encode(scale, "fp32"), "fp32")) / 2 ** 20
                 for v in raw]
        assert codes(scale) == [max(-128, min(127, math.floor(e + Fraction(1, 2)))) + 128
                                for e in exact]
    assert codes(-1.375) == golden.score_codes([-v for v in x], wg, 32, 20, 8,
                                               fp.encode(1.375, "fp32"), "fp32")
    assert golden.score_codes(x, wg, 32, 20, 8, 0x7F800000, "fp32") == \
        [0 if v < 0 else 255 if v > 0 else 128 for v in raw]
    assert golden.score_codes(x, wg, 32, 20, 8, 0xFF800000, "fp32") == \
        [255 if v < 0 else 0 if v > 0 else 128 for v in raw]
    assert golden.score_codes(x, wg, 32, 20, 8, 0x7FC00000, "fp32") == [128] * 5
    assert golden.score_codes(x, wg, 32, 0, 8, 0x00000001, "fp32") == [128] * 5   # 2**-149
    assert golden.score_codes(x, wg, 32, 0, 8, 0x80000000, "fp32") == [128] * 5   # -0
    flits = golden.dispatch_flits([3, 1], [9, 4], [7], lanes=3, gate_width=4,
                                  scale=0x3FB00000, scale_format="fp32", data_width=8)
    assert flits == [[3 << 4 | 9, 1 << 4 | 4, 0x00], [0x00, 0xB0, 0x3F], [7, 0, 0]]
    config = get_block("moe_gate").config(dtype="fp8_e4m3", scale_format="fp32", data_width=16)
    assert (config.scale_entries, config.header_entries, config.unit_scale) == \
        (2, 4, 0x3F800000)
    assert golden.gate_latency(2, 1, 1, "fp32") == golden.gate_latency(2, 1, 1) + 1


def test_a_weight_block_scale_scales_its_matrix_alone():
    """Floating point: an expert's E8M0 weight-block scales (gate, up, down) multiply its own
    matrix's products at each promotion. A down scale of 2 doubles y exactly (a power of two
    commutes with each rounding while values stay normal and finite); a gate scale of 2 moves
    g, so h and y change; a NaN scale (255) makes y NaN; unit scales are the default."""
    rng = random.Random(5)
    d_model, d_ff = 6, 4

    def matrix(rows, cols):
        return [[fp.encode(rng.gauss(0.0, 0.25), "fp8_e4m3") for _ in range(cols)]
                for _ in range(rows)]
    model = golden.MoELayer(
        wg=[[0]] * d_model, experts=[(matrix(d_ff, d_model), matrix(d_ff, d_model),
                                      matrix(d_model, d_ff))],
        placement=[0], gate_lut=[0], act_lut=golden.fp_activation_lut("silu", "fp8_e4m3"),
        shifts=(0, 0, 0), k=1, dtype="fp8_e4m3", combine_dtype="fp32", combine_width=32,
        tile_arrays=2, promote_every=2)
    x = [fp.encode(rng.gauss(0.0, 1.0), "fp8_e4m3") for _ in range(d_model)]
    unit = model.ffn(0, x)
    assert dataclasses.replace(model, w_scales=((127, 127, 127),)).ffn(0, x) == unit
    values = [fp.decode(v, "fp32") for v in unit]
    assert any(values) and all(abs(v) > 2.0 ** -100 or v == 0 for v in values)
    doubled = dataclasses.replace(model, w_scales=((127, 127, 128),)).ffn(0, x)
    assert [fp.decode(v, "fp32") for v in doubled] == [2 * v for v in values]
    assert dataclasses.replace(model, w_scales=((128, 127, 127),)).ffn(0, x) != unit
    nan = dataclasses.replace(model, w_scales=((127, 255, 127),)).ffn(0, x)
    assert all(math.isnan(fp.decode(v, "fp32")) for v in nan)
    # FP32 scales (scale_format fp32): a power of two is the E8M0 code of its exponent, and a
    # significand of its own scales too (x's by 1.5 moves g and u, so y)
    fp32 = dataclasses.replace(model, scale_format="fp32")
    one, two = fp.encode(1.0, "fp32"), fp.encode(2.0, "fp32")
    assert fp32.ffn(0, x) == unit and fp32.ffn(0, x, fp.encode(1.0, "fp32")) == unit
    assert dataclasses.replace(fp32, w_scales=((one, one, two),)).ffn(0, x) == doubled
    assert fp32.ffn(0, x, fp.encode(1.5, "fp32")) != unit


# --- the register slice in front of the chiplet's tile (hw.pipeline.RegisterSlice) -----------

def _pass_flits(top, i, o, gaps, check=None):
    """Offer a counting flit on ``i`` and take from ``o`` with ``gaps``' valid and ready
    patterns for 600 cycles; returns (sent, taken_at, received, left_at, problems, accept,
    cycles).
    A waiting flit must stay valid and unchanged; ``check(ctx)``, if given, adds problems."""
    rng = random.Random(f"{type(top).__name__} {gaps}")
    cycles = 600
    offer, accept = on_off_pattern(rng, gaps, cycles), on_off_pattern(rng, gaps, cycles)
    sent, received, taken_at, left_at, problems = [], [], [], [], []

    async def bench(ctx):
        value, waiting = 0, None
        for cycle in range(cycles):
            ctx.set(i.valid, offer[cycle])
            ctx.set(i.payload, value)
            ctx.set(o.ready, accept[cycle])
            valid, payload = ctx.get(o.valid), ctx.get(o.payload)
            problems.extend((cycle, problem) for problem in (check(ctx) if check else []))
            if waiting is not None and (not valid or payload != waiting):
                problems.append((cycle, "dropped or changed while waiting", waiting))
            in_taken = offer[cycle] and ctx.get(i.ready)
            waiting = payload if valid and not accept[cycle] else None
            if valid and accept[cycle]:
                received.append(payload)
                left_at.append(cycle)
            if in_taken:
                sent.append(value)
                taken_at.append(cycle)
                value = (value + 1) % 256
            await ctx.tick()

    run_amaranth(top, bench)
    return sent, taken_at, received, left_at, problems, accept, cycles


@pytest.mark.parametrize("gaps", ["none", "random", "bursts"])
def test_register_slice_keeps_order_one_edge_late_at_full_rate(gaps):
    """Every flit leaves once, in order, one edge after it is taken; while a flit waits its
    valid stays high and its payload stable; with no gaps and no stalls one flit leaves per
    cycle (the chiplet's reset mid-batch is tb/test_moe_layer_chiplet.py's)."""
    from hw.pipeline import RegisterSlice
    dut = RegisterSlice(8)
    sent, taken_at, received, left_at, problems, accept, cycles = \
        _pass_flits(dut, dut.i, dut.o, gaps)
    assert problems == []
    assert received == sent[:len(received)] and len(sent) - len(received) <= 1
    # One edge late: a flit taken at edge e (cycle e) can leave no earlier than cycle e + 1,
    # and does when the receiver is ready then.
    for taken, left in zip(taken_at, left_at):
        assert left >= taken + 1
        if accept[taken + 1]:
            assert left == taken + 1
    if gaps == "none":
        assert len(received) == cycles - 1


@pytest.mark.parametrize("gaps", ["none", "random", "bursts"])
def test_skid_slice_behind_the_register_slice_keeps_order_and_shows_its_state(gaps):
    """The chiplet's beats pass the register slice, then a skid slice (hw.pipeline.SkidSlice):
    every flit leaves once, in order, no earlier than an edge after the register slice takes
    it, and with no gaps and no stalls exactly then (the skid adds no edge); a waiting flit
    stays valid and stable; the skid's `full` is the inverse of its `i.ready`, and while full
    its `kept` is the flit it shows (the chiplet's room rule reads both)."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from hw.pipeline import RegisterSlice, SkidSlice
    slice_, skid = RegisterSlice(8), SkidSlice(8)
    top = Module()
    top.submodules.slice = slice_
    top.submodules.skid = skid
    wiring.connect(top, slice_.o, skid.i)

    def state(ctx):
        full = ctx.get(skid.full)
        return ((["full is not ~i.ready"] if full == ctx.get(skid.i.ready) else [])
                + (["kept is not the flit shown"]
                   if full and ctx.get(skid.kept) != ctx.get(skid.o.payload) else []))

    sent, taken_at, received, left_at, problems, accept, cycles = \
        _pass_flits(top, slice_.i, skid.o, gaps, state)
    assert problems == []
    assert received == sent[:len(received)] and len(sent) - len(received) <= 2
    assert all(left >= taken + 1 for taken, left in zip(taken_at, left_at))
    if gaps == "none":
        assert len(received) == cycles - 1
        assert left_at == [taken + 1 for taken in taken_at[:len(left_at)]]
