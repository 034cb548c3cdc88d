"""NoP switch and tree: golden model, placement flow, config validation, cocotb on both
simulators."""

import numpy as np
import pytest

from conftest import SIMULATORS, config_id, run_block, sweep_params
from golden import placement
from golden import fixed
from golden import fp
from golden import nop as golden
from golden import router as golden_router
from hw.nop import NopConfig, NopSwitchConfig
from hw.params import ParamError, parse_params

SWITCH_CONFIGS = [
    {},
    # Odd fanout and lane count, single-flit capacity per slot, a small table.
    {"fanout": 3, "lanes": 3, "data_width": 5, "acc_width": 7, "max_flits": 3, "max_inflight": 3},
    # The widest switch: 16 children, one lane, two slots; a BF16 combine (15 adders in a row).
    {"fanout": 16, "lanes": 1, "max_flits": 2, "max_inflight": 2, "token_width": 6,
     "combine_dtype": "bf16"},
]
# The widest switch in `make sweep` only (make test's time budget, 2026-11-30; a range end,
# with the others in tests/test_ranges.py): make test combines BF16 in the FP8 layer's 3-way
# switch, and 4 children a switch in the tree's defaults.
SWITCH_SWEEP = (2,)
TREE_CONFIGS = [
    {},
    # Non-uniform fanouts, one slot per switch (every token waits for the previous one); an FP32
    # combine, rounded at each of the two levels; CRC-8 on the links, faults injected.
    {"fanouts": (2, 3), "lanes": 2, "max_flits": 2, "max_inflight": 1, "combine_dtype": "fp32",
     "acc_width": 32, "link_check": "crc8", "fault_inject": 1},
    # Three levels; parity on the links, faults injected.
    {"fanouts": (2, 2, 2), "lanes": 1, "max_flits": 3, "max_inflight": 3,
     "link_check": "parity", "fault_inject": 1},
]
COCOTB_TESTS = 15
FAULT_TESTS = 4           # tb/test_nop.py's link-fault tests, in trees with fault_inject
SWEEP_TREE_CONFIGS = [
    {"fanouts": (4, 16), "lanes": 2, "max_flits": 2, "max_inflight": 4},
]


def _packet(mask, flits, token=0):
    return {"token": token, "mask": mask, "flits": [[1, 2]] * flits}


def test_dedup_one_copy_per_child_subtree():
    fanouts = (4, 4)
    packets = [_packet(0b11, 2), _packet(1 << 15, 1), _packet(0xFFFF, 3)]
    counts = golden.link_flits(packets, fanouts)
    # Two leaves under child 0: one copy on its internal link, one per leaf link.
    assert counts["root"] == 6
    assert counts["internal"] == [2 + 3, 3, 3, 1 + 3]
    assert counts["leaf"][:3] == [5, 5, 3] and counts["leaf"][15] == 4
    assert golden.deliveries(packets, fanouts)[0] == [0, 2]


def test_forwarding_cost_is_r_times_combine():
    packets = [_packet(0b1011, 2), _packet(0b1, 2)]
    assert golden.forwarding_root_flits(packets) == 3 * 2 + 1 * 2
    assert golden.replication([p["mask"] for p in packets]) == 2.0


def test_combine_sums_wrap_at_acc_width():
    packets = [{"token": 1, "mask": 0b11, "flits": [[100]]}]
    out = golden.combine(packets, lambda leaf, p: [[p["flits"][0][0] * (leaf + 1)]], 8)
    assert out == [[[fixed.wrap(300, 8)]]] and out[0][0][0] == 44


def test_float_combine_adds_in_child_order_switch_by_switch():
    # Leaves 0..3 under (2, 2): ((l0 + l1) + (l2 + l3)), each addition rounded to BF16.
    big, one = fp.encode(256.0, "bf16"), fp.encode(1.0, "bf16")
    values = {0: big, 1: one, 2: one, 3: one}
    packets = [{"token": 0, "mask": 0b1111, "flits": [[0]]}]
    out = golden.combine(packets, lambda leaf, p: [[values[leaf]]], 16, "bf16", (2, 2))
    # 256 + 1 rounds to 256 (8 significant bits); 1 + 1 = 2; 256 + 2 = 258 exactly.
    assert out == [[[fp.encode(258.0, "bf16")]]]
    flat = golden.combine(packets, lambda leaf, p: [[values[leaf]]], 16, "bf16", (4,))
    assert flat == [[[fp.encode(256.0, "bf16")]]]          # ((256 + 1) + 1) + 1: each lost
    # A switch none of whose owed children contributes (wrong-length returns) sends +0.
    dropped = golden.combine(packets, lambda leaf, p: [[values[leaf]]] * (1 + (leaf < 2)), 16,
                             "bf16", (2, 2))
    assert dropped == [[[fp.encode(2.0, "bf16")]]]


def test_cycle_model_recursion():
    # Two levels, leaves 0 and 5 return last flits at 10 and 14, 3-flit packets.
    edge = golden.combine_first_edge(0b100001, {0: 10, 5: 14}, 3, (4, 4))
    assert edge == (14 + golden.COMBINE_HOP_CYCLES) + 2 + golden.COMBINE_HOP_CYCLES
    assert golden.dispatch_edges([3, 4], (4, 4)) == [5, 6]


def test_router_rule_ties_and_groups():
    scores = [5, 9, 9, 1, 7, 7, 0, 8]
    assert golden_router.route(scores, 3) == ([1, 2, 7], [9, 9, 8])
    # Groups of 2: sums 14, 10, 14, 8 -> keep groups 0 and 2 (tie to the lower index).
    assert golden_router.group_scores(scores, 4) == [14, 10, 14, 8]
    assert golden_router.route(scores, 3, groups=4, topk_groups=2) == ([1, 4, 5], [9, 7, 7])
    assert golden_router.leaf_mask([1, 4, 5], [0, 3, 0, 0, 2, 2, 0, 0]) == 0b1100


def test_load_and_coactivation_match_definitions():
    trace = np.array([[0, 1], [0, 1], [2, 3], [0, 2]])
    assert placement.load_vector(trace, 4).tolist() == [0.75, 0.5, 0.5, 0.25]
    coact = placement.coactivation(trace, 4)
    assert coact[0, 1] == 1.0 and coact[1, 0] == 1.0 and coact[2, 3] == 0.5
    assert coact[0, 0] == 0 and coact.max() == 1.0


def test_clusters_recover_planted_communities():
    experts, leaves = 16, 4
    trace = golden_router.synthetic_trace(2000, experts, 2, leaves, seed=3, affinity=1.0)
    rng = np.random.default_rng(3)
    planted = rng.permutation(experts).reshape(leaves, experts // leaves)
    found = placement.cluster_experts(placement.coactivation(trace, experts), 4)
    assert sorted(map(sorted, found)) == sorted(sorted(int(e) for e in c) for c in planted)


def test_allocation_exact_and_heuristic():
    loads = [8, 7, 6, 5, 4, 3, 2, 1]
    assignment, method = placement.allocate_clusters(loads, 2)
    assert method == "exact" and max(sum(loads[c] for c in g) for g in assignment) == 18
    loads16 = list(range(16, 0, -1))
    assignment, method = placement.allocate_clusters(loads16, 4)
    assert method == "lpt+swap" and sorted(c for g in assignment for c in g) == list(range(16))
    assert max(sum(loads16[c] for c in g) for g in assignment) == 34   # the optimum, 136/4


def test_clustered_placement_lowers_r():
    trace = golden_router.synthetic_trace(400, 64, 4, 16, seed=1)
    result = placement.place(trace, 64, 16, 4)
    assert sorted(result.expert_to_leaf) == sorted(list(range(16)) * 4)
    clustered = golden.replication(golden_router.leaf_mask(t, result.expert_to_leaf) for t in trace)
    rr_table = placement.round_robin(64, 16)
    baseline = golden.replication(golden_router.leaf_mask(t, rr_table) for t in trace)
    assert clustered < baseline <= 4 and result.imbalance >= 1.0


@pytest.mark.parametrize("cls, kwargs, message", [
    (NopSwitchConfig, {"fanout": 1}, "parameter 'fanout': got 1; allowed: an integer in 2..16"),
    (NopSwitchConfig, {"fanout": 17}, "parameter 'fanout': got 17; allowed: an integer in 2..16"),
    (NopSwitchConfig, {"max_inflight": 0},
     "parameter 'max_inflight': got 0; allowed: an integer in 1..64"),
    (NopConfig, {"fanouts": (4, 1)},
     "parameter 'fanouts': got 4,1; allowed: 1..4 comma-separated integers, each in 2..16"),
    (NopConfig, {"fanouts": (16, 8)},
     "parameter 'fanouts': got 16,8; allowed: a product of at most 64 leaves (got 128)"),
    (NopConfig, {"fanouts": (2, 2, 2, 2, 2)},
     "parameter 'fanouts': got 2,2,2,2,2; allowed: 1..4 comma-separated integers, each in 2..16"),
    (NopConfig, {"combine_dtype": "fp32"},
     "parameter 'acc_width': got 16; allowed: 32 with combine_dtype fp32 (its codes)"),
    (NopSwitchConfig, {"combine_dtype": "bf16", "acc_width": 12},
     "parameter 'acc_width': got 12; allowed: 16 with combine_dtype bf16 (its codes)"),
    (NopSwitchConfig, {"combine_dtype": "fp16"},
     "parameter 'combine_dtype': got 'fp16'; allowed: one of 'int', 'bf16', 'fp32'"),
    (NopConfig, {"fanouts": (4,), "link_check": "crc8"},
     "parameter 'link_check': got 'crc8'; allowed: 'none' for a one-level tree (it has no "
     "switch-to-switch links)"),
    (NopConfig, {"fanouts": (8,), "fault_inject": 1, "link_check": "parity"},
     "parameter 'link_check': got 'parity'; allowed: 'none' for a one-level tree (it has no "
     "switch-to-switch links)"),
    (NopConfig, {"fault_inject": 1},
     "parameter 'fault_inject': got 1; allowed: 0 with link_check 'none' (the flips test the "
     "link checks)"),
    (NopConfig, {"link_check": "ecc"},
     "parameter 'link_check': got 'ecc'; allowed: one of 'none', 'parity', 'crc8'"),
])
def test_config_rejects_bad_values(cls, kwargs, message):
    with pytest.raises(ParamError) as info:
        cls(**kwargs)
    assert str(info.value) == message


def test_fanouts_from_the_command_line_and_manifest():
    assert parse_params(NopConfig, ["fanouts=2,8"]).fanouts == (2, 8)
    assert NopConfig(fanouts=[4, 4]) == NopConfig()        # JSON manifests store lists
    assert NopConfig(fanouts=(2,)).leaves == 2             # one level: no link check, accepted
    with pytest.raises(ParamError, match="parameter 'fanouts': got '4,x'"):
        parse_params(NopConfig, ["fanouts=4,x"])


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", sweep_params(SWITCH_CONFIGS, SWITCH_SWEEP))
def test_cocotb_switch(params, simulator):
    assert run_block("nop_switch", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", TREE_CONFIGS, ids=[config_id(p) for p in TREE_CONFIGS])
def test_cocotb_tree(params, simulator):
    want = COCOTB_TESTS + (FAULT_TESTS if params.get("fault_inject") else 0)
    assert run_block("nop_tree", params, simulator).tests == want


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_TREE_CONFIGS,
                         ids=[config_id(p) for p in SWEEP_TREE_CONFIGS])
def test_cocotb_tree_sweep(params, simulator):
    run_block("nop_tree", params, simulator)


def test_manifest_lists_every_port_of_the_verilog_top(tmp_path):
    import re

    from flows.verilog import generate
    from hw.registry import get_block
    block = get_block("nop_tree")
    v_path, _, info = generate(block, NopConfig(fanouts=(2, 3)), tmp_path)
    text = v_path.read_text()
    top = text[text.index("module nop_tree"):]
    top = top[:top.index("endmodule")]
    declared = set(re.findall(r"(?:input|output)\s+(?:\[\d+:0\]\s+)?(\S+);", top))
    assert {p["name"] for p in info["ports"]} == declared
    assert "up_in__5__payload" in declared and "down_link_fire" in declared


def test_crc8_is_the_catalogue_crc8_smbus():
    # The catalogue's check value: CRC-8/SMBUS of the ASCII bytes "123456789" is 0xF4.
    assert golden.crc8(int.from_bytes(b"123456789", "big"), 72) == 0xF4
    assert golden.crc8(0, 40) == 0 and golden.link_check("parity", 0b1011, 4) == 1


@pytest.mark.parametrize("kind, longest", [("parity", 1), ("crc8", 8)])
def test_link_checks_catch_every_burst_they_promise(kind, longest):
    """Every burst of up to ``longest`` adjacent bits anywhere in a link word (check bits
    included) fails the check, for random words of several widths."""
    rng = np.random.default_rng(4)
    bits = golden.CHECK_BITS[kind]
    for width in (1, 7, 8, 9, 31, 64, 129):
        for _ in range(4):
            message = int(rng.integers(0, 1 << min(width, 62))) << max(0, width - 62)
            word = message << bits | golden.link_check(kind, message, width)
            assert golden.link_check_ok(kind, word, width)
            for length in range(1, longest + 1):
                for offset in range(width + bits - length + 1):
                    flipped = word ^ (((1 << length) - 1) << offset)
                    assert not golden.link_check_ok(kind, flipped, width), (width, length, offset)
    # What parity does not promise: two flipped bits slip past it.
    word = 5 << 1 | golden.link_check("parity", 5, 8)
    assert golden.link_check_ok("parity", word ^ 0b110, 8)


def test_check_terms_are_the_code_bit_by_bit():
    rng = np.random.default_rng(5)
    for kind in ("parity", "crc8"):
        for width in (1, 13, 100):
            terms = golden.check_terms(kind, width)
            for _ in range(20):
                message = int(rng.integers(0, 1 << min(width, 62)))
                code = sum((sum(message >> i & 1 for i in term) & 1) << j
                           for j, term in enumerate(terms))
                assert code == golden.link_check(kind, message, width)


def test_link_check_none_keeps_the_verilog_and_adds_ports_otherwise(tmp_path):
    from flows.verilog import generate
    from hw.registry import get_block
    block = get_block("nop_tree")
    plain = generate(block, NopConfig(fanouts=(2, 2)), tmp_path / "none")[2]
    checked = generate(block, NopConfig(fanouts=(2, 2), link_check="crc8"), tmp_path / "crc8")[2]
    names = {p["name"]: p for p in checked["ports"]}
    assert {"down_link_errors", "up_link_errors", "link_error"} <= set(names)
    assert "down_link_flip" not in names
    assert names["down_link_errors"]["width"] == 2 * 16
    assert not {"down_link_errors", "link_error"} & {p["name"] for p in plain["ports"]}
