"""cocotb tests of ``moe_layer`` (gate -> NoP tree -> expert chiplets -> in-network combine)
against the NumPy layer ``golden.moe_layer.layer``: y bit-exact for every token, each token
exactly once (tokens leave the root in completion order, tagged with their id), and the tokens
each chiplet received equal to the golden routing's. With an FP8 or BF16 ``dtype``: x and the
experts' weights are its codes, y BF16 or FP32 codes combined in the tree's order.
"""

import dataclasses
import math
import time

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from golden import fp as golden_fp
from golden import moe_layer as golden
from golden import ndp as golden_ndp
from golden import nop as golden_nop
from golden.dram import Ddr4Stream
from golden.fixed import signed_limits
from tb.fp8 import (largest_code, random_code, random_scale, random_scales, random_token,
                     unit_scales)
from tb.harness import (load_dut_config, long_enough_to_time, measuring, start_bench,
                        write_throughput)
from tb.streams import (STALL_PROFILES, HeldPauses, StreamBench, edge_now, pause_fraction,
                        wait_for)

# What this simulation has written into the chiplets' activation table, entry by entry: zero
# at start-up and kept through a reset (docs/blocks/moe_layer.md, "Reset values"), so a test
# writes only the entries that differ (BF16's table has 4,096; written whole, it was most of
# every test's cycles), and each test after the first relies on that contract.
_act_lut_held = []


def inputs(config):
    """Every input port: the switch groups' weight ports are ``weights__<g>``."""
    return ("x", "wg", "gate_lut", "table",
            *[f"weights__{g}" for g in range(config.switch_groups)], "assign", "act_lut")


class LayerBench(StreamBench):
    """Sources on every input, a sink on y, the golden layer, and a count of the tokens each
    chiplet takes (from ``leaf_packets``)."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, inputs(config), ("y",), gap, stall,
                         always_ready=("wg", "gate_lut", "table", "act_lut"))
        self.cfg = config
        self.y = self.sinks["y"]
        self.model = None
        self.loaded_beats = 0
        self.expected = {}                  # token id -> y
        self.leaf_tokens = [0] * config.leaves
        self.link_flits = {"down": [], "up": []}
        self.routes = []
        self.first_x_edge = None
        self.unit_x_scales = False          # floating point: see x_scale

    def start(self):
        super().start()
        cocotb.start_soon(self._count_taps())

    def clear_counts(self):
        links = len(self.dut.down_link_fire.value)
        self.leaf_tokens = [0] * self.cfg.leaves
        self.leaf_packet_edges = [[] for _ in range(self.cfg.leaves)]
        self.link_flits = {"down": [0] * links, "up": [0] * links}

    async def _count_taps(self):
        """Tokens each chiplet takes (``leaf_packets``) and flits on each tree link."""
        self.clear_counts()
        while True:
            await RisingEdge(self.dut.clk)
            if not self.dut.rst.value:
                bits = int(self.dut.leaf_packets.value)
                for leaf in range(self.cfg.leaves):
                    if (bits >> leaf) & 1:
                        self.leaf_tokens[leaf] += 1
                        self.leaf_packet_edges[leaf].append(edge_now())
                for way in ("down", "up"):
                    bits = int(getattr(self.dut, f"{way}_link_fire").value)
                    counts = self.link_flits[way]
                    for link in range(len(counts)):
                        counts[link] += (bits >> link) & 1

    # --- configuration ---
    @property
    def floating(self):
        return self.cfg.dtype != "int"

    def random_model(self, placement=None, hot=None):
        cfg, rng = self.cfg, self.rng
        low, high = signed_limits(cfg.w_width)

        def matrix(rows, cols, codes=self.floating):
            if codes:
                return [[random_code(rng, cfg.dtype, 0.5) for _ in range(cols)]
                        for _ in range(rows)]
            return [[rng.randint(low, high) for _ in range(cols)] for _ in range(rows)]
        wg = matrix(cfg.d_model, cfg.experts, codes=False)      # the gate: integers always
        if hot is not None:                 # one expert's column far above the rest
            wg = [[high if e == hot else low for e in range(cfg.experts)]
                  for _ in range(cfg.d_model)]
        placement = self.with_shared(placement or [e % cfg.leaves for e in range(cfg.experts)])
        return golden.MoELayer(
            wg=wg, experts=[(matrix(cfg.d_ff, cfg.d_model), matrix(cfg.d_ff, cfg.d_model),
                             matrix(cfg.d_model, cfg.d_ff))
                            for _ in range(cfg.experts + cfg.shared)],
            placement=placement, shared=bool(cfg.shared),
            gate_lut=[rng.randint(0, (1 << cfg.gate_width) - 1)
                      for _ in range(1 << cfg.score_width)],
            act_lut=(golden.fp_activation_lut("silu", cfg.dtype) if self.floating else
                     golden_ndp.activation_lut("silu", cfg.in_width, 4, 4)),
            shifts=(cfg.shift_g, cfg.shift_u, cfg.shift_h), k=cfg.k, groups=cfg.groups,
            topk_groups=cfg.topk_groups, in_width=cfg.in_width, acc_width=cfg.acc_width,
            score_acc_width=cfg.score_acc_width, score_shift=cfg.score_shift,
            score_width=cfg.score_width,
            gate_width=cfg.gate_width, gate_shift=cfg.gate_shift, data_width=cfg.data_width,
            combine_width=cfg.combine_width, lanes=cfg.lanes, leaves=cfg.leaves,
            dtype=cfg.dtype, acc_frac=cfg.acc_frac, promote_every=cfg.promote_every,
            tile_arrays=cfg.arrays, combine_dtype=cfg.combine_dtype,
            fanouts=tuple(cfg.fanouts),
            w_scales=tuple(tuple(random_scales(rng, cfg.scale_format).values())
                           for _ in range(cfg.experts + cfg.shared)) if self.floating else (),
            scale_format=cfg.scale_format)

    def with_shared(self, table):
        """An expert-to-leaf table of the routed experts, and the shared expert's leaf; every
        leaf within its slots."""
        cfg = self.cfg
        table = list(table[:cfg.experts]) + ([cfg.shared_leaf] if cfg.shared else [])
        assert all(table.count(leaf) <= cfg.slots for leaf in range(cfg.leaves)), table
        return table

    def clustered(self):
        """Consecutive routed experts on one leaf, as many as its free slots hold."""
        cfg = self.cfg
        free = [cfg.slots - (cfg.shared and leaf == cfg.shared_leaf) for leaf in range(cfg.leaves)]
        table, leaf = [], 0
        for _ in range(cfg.experts):
            while not free[leaf]:
                leaf += 1
            table.append(leaf)
            free[leaf] -= 1
        return table

    async def configure(self, model, weights=True, dram=False):
        """Write the model: W_g, the gate table, the router's table, the activation table and
        (``weights``) every expert into a slot of its chiplet; with ``dram`` each weight beat
        is held back until a DDR4-3200 channel (``golden.dram``, Table I organization) reading
        the weights in load order from this edge on could have delivered it."""
        cfg = self.cfg
        source = self.sources
        for d, row in enumerate(model.wg):
            source["wg"].send({"row": d, "data": row})
        for code, value in enumerate(model.gate_lut):
            source["gate_lut"].send({"code": code, "value": value})
        for expert, leaf in enumerate(model.placement[:cfg.experts]):     # routed experts
            source["table"].send({"expert": expert, "leaf": leaf})
        if not _act_lut_held:                   # the table at start-up
            _act_lut_held.extend([0] * len(model.act_lut))
        for index, value in enumerate(model.act_lut):
            if _act_lut_held[index] != value:
                source["act_lut"].send({"index": index, "value": value})
                _act_lut_held[index] = value
        self.model = model                  # (before the loads: their scales)
        if weights:
            self.send_loads(self.resident_loads(model), dram)
        shape = cfg.chiplet_config().schedule
        budget = 30 * (cfg.d_model + len(model.gate_lut) + len(model.act_lut) +
                       cfg.experts * shape.expert_beats) + 1000
        await wait_for(self.dut, lambda: all(source.idle for source in self.sources.values()),
                       budget, "configuration written")

    def zero_expert(self):
        """The zero weights of a slot left over (one object: :meth:`load_scales` knows it)."""
        cfg = self.cfg
        if getattr(self, "_zero", None) is None:
            self._zero = ([[0] * cfg.d_model] * cfg.d_ff, [[0] * cfg.d_model] * cfg.d_ff,
                          [[0] * cfg.d_ff] * cfg.d_model)
        return self._zero

    def load_scales(self, expert, matrices):
        """A load's E8M0 weight-block scales: the model's for its expert; unit for a slot's
        zero weights (so that they add +0 whatever the expert's scales, NaN among them)."""
        if matrices is self.zero_expert() or not self.model.w_scales:
            return unit_scales(self.cfg.scale_format)
        return dict(zip(unit_scales(), self.model.w_scales[expert]))

    def resident_loads(self, model):
        """``(leaf, slot, expert, matrices)``: every expert in a slot of its chiplet, in expert
        order. A slot keeps its expert until loaded again, through resets (and so from one
        test to the next): the slots the placement leaves over get zero weights (they add 0
        whatever token reaches them)."""
        cfg = self.cfg
        loads = [(leaf, expert, model.experts[expert])
                 for expert, leaf in enumerate(model.placement)]
        loads += [(leaf, 0, self.zero_expert()) for leaf in range(cfg.leaves)
                  for _ in range(cfg.slots - model.placement.count(leaf))]
        used = [0] * cfg.leaves
        out = []
        for leaf, expert, matrices in loads:
            out.append((leaf, used[leaf], expert, matrices))
            used[leaf] += 1
        return out

    def send_loads(self, loads, dram=False):
        """Queue ``(leaf, slot, expert, matrices)`` loads, each on its switch group's weight
        port in the order given; with ``dram`` each beat is held back until the group's DDR4-3200
        channel (``golden.dram``, Table I organization), reading the group's weights in load
        order from this edge on, could have delivered it."""
        cfg = self.cfg
        shape = cfg.chiplet_config().schedule
        beat_bytes = -(-shape.weight_lanes * cfg.w_width // 8)
        start = edge_now()
        self.loaded_beats = 0
        for group in range(cfg.switch_groups):
            mine = self.group_loads(loads, group)
            total = len(mine) * shape.expert_beats
            arrival = (Ddr4Stream(beat_bytes * total).beat_ready_cycles(beat_bytes, total)
                       if dram and total else [0] * total)
            beat_index = 0
            for leaf, slot, expert, matrices in mine:
                beats = golden.weight_beats(shape, *matrices)
                extra = {"scale": self.load_scales(expert, matrices)} if self.floating else {}
                for index, beat in enumerate(beats):
                    self.sources[f"weights__{group}"].send(
                        {"leaf": leaf % cfg.group_leaves, "slot": slot, "expert": expert,
                         **extra, "data": beat, "last": int(index == len(beats) - 1)},
                        start + arrival[beat_index] if dram else 0)
                    beat_index += 1
            self.loaded_beats += beat_index

    def group_loads(self, loads, group):
        """The loads of ``loads`` on switch group ``group``'s weight port, in sending order."""
        return [load for load in loads if load[0] // self.cfg.group_leaves == group]

    def load_end_edges(self, loads):
        """``{(leaf, slot): edge}``: the edge each load sent by :meth:`send_loads` (since the
        last :meth:`clear_weight_edges`) had its last beat taken."""
        beats = self.cfg.chiplet_config().schedule.expert_beats
        ends = {}
        for group in range(self.cfg.switch_groups):
            edges = self.sources[f"weights__{group}"].sent_edges
            for index, (leaf, slot, _, _) in enumerate(self.group_loads(loads, group)):
                ends[leaf, slot] = edges[(index + 1) * beats - 1]
        return ends

    def weight_edges(self):
        """Every weight beat's taken edge, all groups."""
        return sorted(edge for g in range(self.cfg.switch_groups)
                      for edge in self.sources[f"weights__{g}"].sent_edges)

    def clear_weight_edges(self):
        for g in range(self.cfg.switch_groups):
            self.sources[f"weights__{g}"].sent_edges.clear()

    async def stream(self, model, tokens, order="heaviest", dram=True):
        """Double buffering across the layer: the tables written; every chiplet's slots
        assigned, its experts in ``order`` (``heaviest`` or ``lightest`` first) of the tokens
        they take in the chiplet's first batch (``golden.moe_layer.stream_order``); then the
        batch dispatched while every switch group streams its experts' weights (rank by rank
        over its chiplets, through its DDR4 channel with ``dram``). Returns the golden layer
        output and the edge from which the tokens and the weights are sent."""
        cfg = self.cfg
        await self.configure(model, weights=False)
        ranked = golden.stream_order(model, tokens, cfg.leaves, cfg.slots,
                                     heaviest_first=order == "heaviest", batch=cfg.batch)
        loads = []
        for leaf, experts in enumerate(ranked):
            for slot, expert in enumerate(experts):
                if expert is None:              # a slot left over: zero weights
                    loads.append((leaf, slot, 0, self.zero_expert()))
                else:
                    loads.append((leaf, slot, expert, model.experts[expert]))
                self.sources["assign"].send({"leaf": leaf, "slot": slot,
                                             "expert": loads[-1][2]})
        await wait_for(self.dut, lambda: self.sources["assign"].idle, 20 * len(loads) + 50,
                       "slots assigned")
        # Floating point: a chiplet adds its experts in slot order, here the stream order.
        slot_of = [0] * len(model.placement)
        for experts in ranked:
            for slot, expert in enumerate(experts):
                if expert is not None:
                    slot_of[expert] = slot
        self.model = dataclasses.replace(self.model, slot_of=tuple(slot_of))
        self.expected.clear()
        self.y.received.clear()
        began = edge_now() + 1
        out = self.send_tokens(tokens)
        # rank by rank: every chiplet's heaviest expert first, then every chiplet's second, ...
        loads.sort(key=lambda load: (load[1], load[0]))
        self.send_loads(loads, dram)
        return out, began

    # --- tokens ---
    def random_x(self, extremes=False):
        dtype = self.cfg.dtype
        if self.floating:
            # No infinities: a slot the placement leaves over holds zero weights (tagged
            # expert 0), and inf * 0 there would be a NaN the golden layer, which has no
            # such slot, does not add (the chiplet's own tests send infinities).
            return random_token(self.rng, dtype, self.cfg.d_model, extremes, infinities=False)
        low, high = signed_limits(self.cfg.in_width)
        if extremes:
            return [self.rng.choice((low, high)) for _ in range(self.cfg.d_model)]
        return [self.rng.randint(low, high) for _ in range(self.cfg.d_model)]

    def x_scale(self):
        """Floating point: a token's x scale code, random unless :attr:`unit_x_scales` (tests
        that steer routes by their scores). Finite: a NaN or infinite scale times the zero
        weights of a slot the placement leaves over would be a NaN the golden layer does not
        add (as with infinities in :meth:`random_x`; the chiplet's own tests send them)."""
        fmt = self.cfg.scale_format
        if self.unit_x_scales:
            return golden.unit_scale(fmt)
        while True:
            scale = random_scale(self.rng, fmt)
            if math.isfinite(golden_fp.scale_decode(scale, fmt)):
                return scale

    def send_tokens(self, tokens, first_id=0, not_before=None, ids=None):
        """Queue tokens (ids from ``first_id``, or ``ids``) and their golden y;
        ``not_before[i]``: token i's beats are not offered before that edge. Floating point: each token with its x
        scale on its first beat (:meth:`x_scale`; the later beats' scale fields random,
        which the gate ignores)."""
        cfg = self.cfg
        scales = [self.x_scale() for _ in tokens] if self.floating else None
        out = golden.layer(self.model, tokens, scales)
        for offset, (x, y) in enumerate(zip(tokens, out["y"])):
            token = (ids[offset] if ids else first_id + offset) % (1 << cfg.token_width)
            assert token not in self.expected, "a token id still in flight"
            for b in range(cfg.x_flits):
                lanes = (list(x[b * cfg.lanes:(b + 1) * cfg.lanes]) + [0] * cfg.lanes)[
                    :cfg.lanes]
                extra = {"scale": scales[offset] if b == 0 else
                         self.rng.getrandbits(cfg.scale_bits)} if self.floating else {}
                self.sources["x"].send({"token": token, **extra, "data": lanes,
                                        "last": int(b == cfg.x_flits - 1)},
                                       not_before[offset] if not_before else 0)
            self.expected[token] = [int(v) for v in y]
        self.routes.append(out)
        return out

    async def run(self, tokens, budget):
        """Send ``tokens`` and check their y, in waves of at most 2**token_width tokens (ids
        are reused only once a wave is out: the tree tracks tokens by id). Returns the golden
        per-chiplet token counts summed over the waves."""
        ids = 1 << self.cfg.token_width
        counts = [0] * self.cfg.leaves
        for start in range(0, len(tokens), ids):
            self.expected.clear()
            self.y.received.clear()
            out = self.send_tokens(tokens[start:start + ids])
            await self.finish(budget)
            counts = [a + b for a, b in zip(counts, out["chiplet_tokens"])]
        return counts

    def received_tokens(self):
        """``{token: y}`` from the y flits so far; checks framing (``last`` on every X-th)."""
        cfg, got, current = self.cfg, {}, []
        for _, beat in self.y.received:
            current.append(beat)
            if len(current) == cfg.x_flits:
                assert int(beat.last) == 1, "a y packet without last on its final flit"
                token = int(beat.token)
                assert all(int(b.token) == token for b in current), "token changed in a packet"
                assert token not in got, f"token {token} twice"
                values = [int(v) for b in current for v in b.data][:cfg.d_model]
                got[token] = values
                current = []
            else:
                assert int(beat.last) == 0, "last before the packet's final flit"
        return got

    async def finish(self, max_cycles):
        await wait_for(self.dut, lambda: len(self.y.received) >= len(self.expected) *
                       self.cfg.x_flits, max_cycles, f"{len(self.expected)} tokens of y")
        await ClockCycles(self.dut.clk, 2 * self.cfg.batch_wait + 40)     # nothing extra
        got = self.received_tokens()
        assert set(got) == set(self.expected), \
            f"tokens missing {set(self.expected) - set(got)}, extra {set(got) - set(self.expected)}"
        for token, y in self.expected.items():
            route = self.routes[-1]
            index = list(self.expected).index(token)
            assert got[token] == y, (f"token {token}: y {got[token]} != golden {y} (experts "
                                     f"{route['experts'][index]}, mask {route['masks'][index]:b})")
        assert not self.dut.error.value
        self.dut._log.info(f"{len(got)} tokens of y bit-exact at edge {edge_now()}")


async def _setup(dut, salt, gap=0.0, stall=0.0, placement=None, hot=None):
    bench = await start_bench(LayerBench, dut, salt, gap, stall)
    await bench.configure(bench.random_model(placement, hot))
    return bench


def _budget(bench, tokens, gap=0.0, stall=0.0):
    cfg = bench.cfg
    shape = cfg.chiplet_config().schedule
    slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))
    per_token = 4 * (cfg.header_flits + cfg.x_flits) + 2 * cfg.k * shape.expert_beats
    return int((tokens * per_token + 60 * cfg.slots + 8 * cfg.batch_wait) * slowdown * 3) + 3000


@cocotb.test()
async def test_layer_bit_exact(dut):
    """Every port ready: y bit-exact for every token of two batches per chiplet; each chiplet
    received exactly the tokens the golden routing sends it (a token once per chiplet)."""
    bench = await _setup(dut, "exact")
    cfg = bench.cfg
    tokens = [bench.random_x(extremes=t % 7 == 3) for t in range(2 * cfg.batch + 3)]
    counts = await bench.run(tokens, _budget(bench, len(tokens)))
    assert bench.leaf_tokens == counts


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES[1:]))
async def test_random_stalls(dut, gap, stall):
    """Random and long-burst gaps on every input (x, the tables, the weights), stalls on y.
    (The profile without gaps or stalls is test_layer_bit_exact's, with more tokens.)"""
    bench = await _setup(dut, f"stalls:{gap}:{stall}", gap, stall)
    tokens = [bench.random_x() for _ in range(2 * bench.cfg.batch + 1)]
    await bench.run(tokens, _budget(bench, len(tokens), gap, stall))


@cocotb.test()
async def test_one_bank_collects_while_another_holds_sums(dut):
    """Two batches' tokens at once, then a third batch's trickled in, a token every 12 cycles
    (its batch keeps growing: the idle gaps are shorter than batch_wait), all to the chiplet
    of one hot expert: that chiplet collects into one token bank (writing x, and zeroing the
    sums, at other token slots) while the other bank's sums are accumulated and returned.
    Four rounds, the banks taking turns: y bit-exact. (A mutant that cleared bit 36 of one
    slot's sum whenever another slot took a flit passed every other test: `moe_layer`'s 6 of
    2026-11-29.)"""
    _, config, _ = load_dut_config()
    bench = await _setup(dut, "banks", hot=config.experts - 1)
    cfg = bench.cfg
    fast = min(2 * cfg.batch, (1 << cfg.token_width) // 2)
    slow = min(cfg.batch, (1 << cfg.token_width) - fast)
    for _ in range(4):
        tokens = [bench.random_x() for _ in range(fast + slow)]
        start = edge_now()
        bench.expected.clear()
        bench.y.received.clear()
        bench.send_tokens(tokens, not_before=[0] * fast +
                          [start + 8 * fast + 12 * (i + 1) for i in range(slow)])
        await bench.finish(_budget(bench, len(tokens)) + 12 * slow)


async def _until_unchanged(dut, read, quiet, max_cycles, what):
    """Wait in steps of 50 cycles until ``read()`` has not changed for ``quiet`` cycles; return
    its value and the cycles waited. Fails with ``what`` once ``max_cycles`` have passed."""
    value, still, waited = None, 0, 0
    while still < quiet:
        await ClockCycles(dut.clk, 50)
        now = read()
        still = still + 50 if now == value else 0
        value, waited = now, waited + 50
        assert waited < max_cycles, what
    return value, waited


@cocotb.test()
async def test_y_held_until_the_layer_is_full(dut):
    """y not ready at all while more tokens arrive than the layer can hold (max_inflight, two
    batches per chiplet and a batch more, and at least max_inflight + 1 and all the gate holds,
    as token ids allow): every switch's in-flight slots and
    the chiplets' queues fill and the layer stops taking x, a y beat offered meanwhile held
    unchanged (the monitor); the root keeps exactly max_inflight tokens in flight (one more
    where y is one flit a token), so the chiplets take the packets of the first that many
    tokens and no more; released, every token's y is bit-exact, none lost or doubled.
    Two rounds: with y held, slot s of every switch holds the round's s-th token; its id is s
    in the first round and its complement (all ones − s) in the second, so every bit of every
    slot's token register holds a 0 in one round and a 1 in the other (a bit stuck is seen)."""
    held = HeldPauses()
    bench = await _setup(dut, "held", 0.0, held)
    for complement in (False, True):
        held.hold()
        await _held_round(dut, bench, held, complement)


async def _held_round(dut, bench, held, complement):
    """One round of test_y_held_until_the_layer_is_full: the i-th token's id is i, or with
    ``complement`` all ones − i."""
    cfg = bench.cfg
    bench.expected.clear()
    bench.y.received.clear()
    # The gate holds at most 2 * gate latency + 8 tokens undispatched (its x FIFO: router
    # latency + 7 tokens and one beat; its stages: one token each): with small batches the
    # first count alone is less than the layer holds (batch=1: 41 tokens, all taken).
    gate_holds = 2 * golden.gate_latency(cfg.k, cfg.groups, cfg.topk_groups,
                                         cfg.scale_format) + 8
    sent = min(max(cfg.max_inflight + 2 * cfg.batch * cfg.leaves + cfg.batch,
                   cfg.max_inflight + 1 + gate_holds), 1 << cfg.token_width)
    x_beats = bench.sources["x"].sent_edges
    beats_before, packets_before = len(x_beats), list(bench.leaf_tokens)
    ones = (1 << cfg.token_width) - 1
    bench.send_tokens([bench.random_x() for _ in range(sent)],
                      ids=[ones - i if complement else i for i in range(sent)])
    quiet = 4 * cfg.batch_wait + 400
    # x has stopped (or every token is in), and every dispatched packet has reached its chiplet
    # (a return's space is reserved at dispatch, so the chiplets keep computing with y held):
    # both unchanged for `quiet` cycles, watched together (one quiet window, not two in turn).
    (taken, packets), _ = await _until_unchanged(
        dut, lambda: (len(x_beats) - beats_before,
                      [n - before for n, before in zip(bench.leaf_tokens, packets_before)]),
        quiet, 2 * _budget(bench, sent),
        "x neither stopped nor finished, or the chiplets' packet counts never settled")
    assert taken < sent * cfg.x_flits or sent == 1 << cfg.token_width, \
        f"x never stopped: {sent} tokens taken with y held"
    # With y held the root dispatches the first max_inflight tokens, in order, and one more
    # where a token's y is one flit (docs/blocks/moe_layer.md, Timing).
    in_flight = min(cfg.max_inflight + (cfg.x_flits == 1), sent)
    masks = bench.routes[-1]["masks"][:in_flight]
    assert packets == [sum((mask >> leaf) & 1 for mask in masks) for leaf in range(cfg.leaves)], \
        (f"with y held the chiplets took {packets} packets, not those of the first "
         f"{in_flight} tokens (max_inflight)")
    dut._log.info(f"held ({'complemented' if complement else 'counting'} ids): "
                  f"{taken // cfg.x_flits} of {sent} tokens taken, {in_flight} in flight")
    held.release()
    await bench.finish(_budget(bench, sent))


@cocotb.test()
async def test_hot_expert_and_clustered_placement(dut):
    """A hot expert takes every token (one chiplet does all the work); then the experts placed
    in clusters (consecutive experts on one chiplet) instead of round-robin."""
    _, config, _ = load_dut_config()
    bench = await _setup(dut, "hot", 0.2, 0.2, hot=config.experts - 1)
    largest = (largest_code(config.dtype) if config.dtype != "int"
               else signed_limits(config.in_width)[1])
    tokens = [[largest] * config.d_model for _ in range(config.batch + 1)]
    counts = await bench.run(tokens, _budget(bench, len(tokens), 0.2, 0.2))
    assert bench.leaf_tokens == counts
    bench.clear_counts()
    await bench.configure(bench.random_model(bench.clustered()))
    counts = await bench.run([bench.random_x() for _ in range(config.batch + 1)],
                             _budget(bench, config.batch + 1, 0.2, 0.2))
    assert bench.leaf_tokens == counts


@cocotb.test()
async def test_reset_mid_batch(dut):
    """Reset with tokens in the gate, the tree and the chiplets: nothing stale after. The
    router's table resets (every expert on leaf 0), so it is written again; weights, W_g and
    the tables kept."""
    bench = await _setup(dut, "reset", 0.1, 0.3)
    cfg = bench.cfg
    sent = min(cfg.batch + 2, 1 << cfg.token_width)
    bench.send_tokens([bench.random_x() for _ in range(sent)])
    await wait_for(dut, lambda: len(bench.sources["x"].sent_edges) >= (sent - 1) * cfg.x_flits,
                   _budget(bench, cfg.batch), "tokens in flight")
    await ClockCycles(dut.clk, 5)
    await bench.reset(3)
    assert not dut.y__valid.value and not dut.error.value
    bench.expected.clear()
    for expert, leaf in enumerate(bench.model.placement[:cfg.experts]):
        bench.sources["table"].send({"expert": expert, "leaf": leaf})
    await wait_for(dut, lambda: bench.sources["table"].idle, 50 * cfg.experts + 200, "table")
    bench.y.received.clear()
    await bench.run([bench.random_x() for _ in range(cfg.batch + 1)],
                    _budget(bench, cfg.batch + 1, 0.1, 0.3))


@cocotb.test()
async def test_weights_reloaded_between_batches(dut):
    """New weights for every expert between batches: later tokens see only the new ones."""
    bench = await _setup(dut, "reload", 0.1, 0.1)
    cfg = bench.cfg
    await bench.run([bench.random_x() for _ in range(cfg.batch)],
                    _budget(bench, cfg.batch, 0.1, 0.1))
    await bench.configure(bench.random_model())
    await bench.run([bench.random_x() for _ in range(cfg.batch)],
                    _budget(bench, cfg.batch, 0.1, 0.1))


@cocotb.test()
async def test_weights_stream_while_the_batch_computes(dut):
    """Double buffering in the layer, with gaps on every input (each switch group's weight
    port, the assignments) and stalls on y: every chiplet's slots assigned, then the batch
    dispatched at once while each group streams its chiplets' experts in, the heaviest first;
    twice, with new weights: y bit-exact, each chiplet's tokens as routed."""
    bench = await _setup(dut, "stream", 0.3, 0.3)
    cfg = bench.cfg
    for _ in range(2):
        tokens = [bench.random_x() for _ in range(min(cfg.batch + 2, 1 << cfg.token_width))]
        bench.clear_counts()
        out, _ = await bench.stream(bench.random_model(), tokens, dram=False)
        await bench.finish(_budget(bench, len(tokens), 0.3, 0.3))
        assert bench.leaf_tokens == out["chiplet_tokens"]


@cocotb.test()
async def test_a_bank_waits_for_weights_while_the_other_collects(dut):
    """A batch's bank waits for a slot's weights while the other bank collects the next batch.
    Per round, expert slot s of every chiplet is assigned again (its weights out: "loaded"
    cleared) and a batch sent that gives each chiplet at least two members of that slot (the
    second member's gate register too); once each bank has closed and its planner waits at
    slot s, a second batch reaches every chiplet (its packets end in the other bank); no
    token of slot s has a y yet; then slot s is loaded: y bit-exact for both batches. Every
    slot, each bank waiting in turn (a batch to every chiplet between the turns), with the
    gate table as written and then complemented, so each member gate register bit waits with
    a 0 and a 1. (A mutant that flipped a bit of bank 1's member gate whenever a packet ended
    in bank 0 passed every other test: `moe_layer`'s 11 of 2026-12-04.)"""
    bench = await _setup(dut, "wait-weights")
    cfg = bench.cfg
    bench.unit_x_scales = True              # routes chosen from the golden scores
    for complement in (False, True):
        if complement:
            ones = (1 << cfg.gate_width) - 1
            lut = [ones ^ value for value in bench.model.gate_lut]
            for code, value in enumerate(lut):
                bench.sources["gate_lut"].send({"code": code, "value": value})
            await wait_for(dut, lambda: bench.sources["gate_lut"].idle, 4 * len(lut) + 50,
                           "gate table written")
            bench.model = dataclasses.replace(bench.model, gate_lut=lut)
        for slot in range(cfg.slots):
            for turn in range(min(2, cfg.token_banks)):
                if turn:                    # the other bank waits next
                    tokens = _covering_tokens(bench, {})
                    await bench.run(tokens, _budget(bench, len(tokens)))
                await _wait_for_weights_round(dut, bench, slot)


def _covering_tokens(bench, wanted):
    """Random tokens, chosen by their golden routes, that reach every chiplet, at most a batch
    of them each, and for each ``leaf: expert`` of ``wanted`` at least min(2, batch) choose
    that expert."""
    cfg, model = bench.cfg, bench.model
    need = min(2, cfg.batch)
    tokens, reached, members = [], [0] * cfg.leaves, dict.fromkeys(wanted, 0)
    for _ in range(20000):
        if all(reached) and all(n >= need for n in members.values()):
            return tokens
        x = bench.random_x()
        out = golden.layer(model, [x])
        experts = {e for e, _ in model.choices(out["experts"][0], out["gates"][0])}
        leaves = [leaf for leaf in range(cfg.leaves) if (out["masks"][0] >> leaf) & 1]
        after = {leaf: (reached[leaf] + 1,
                        members.get(leaf, 0) + (wanted.get(leaf) in experts)) for leaf in leaves}
        # a chiplet's batch keeps room for the members it still needs
        fits = all(cfg.batch - count >= (need - got if leaf in wanted else 0)
                   for leaf, (count, got) in after.items())
        useful = any(reached[leaf] == 0 or (leaf in wanted and got > members[leaf])
                     for leaf, (_, got) in after.items())
        if fits and useful:
            tokens.append(x)
            for leaf, (count, got) in after.items():
                reached[leaf] = count
                if leaf in wanted:
                    members[leaf] = got
    raise AssertionError(f"no tokens found that reach every chiplet with {need} members of "
                         f"{wanted} (reached {reached}, members {members})")


async def _wait_for_weights_round(dut, bench, slot):
    """One round of test_a_bank_waits_for_weights_while_the_other_collects at expert slot
    ``slot``."""
    cfg = bench.cfg
    loads = [load for load in bench.resident_loads(bench.model) if load[1] == slot]
    for leaf, _, expert, _ in loads:
        bench.sources["assign"].send({"leaf": leaf, "slot": slot, "expert": expert})
    await wait_for(dut, lambda: bench.sources["assign"].idle, 20 * len(loads) + 50,
                   "slots assigned")
    wanted = {leaf: expert for leaf, _, expert, matrices in loads
              if matrices is not bench.zero_expert()}
    waiting = _covering_tokens(bench, wanted)
    later = _covering_tokens(bench, {})
    bench.expected.clear()
    bench.y.received.clear()
    packets = list(bench.leaf_tokens)
    out = bench.send_tokens(waiting)
    arrived = [a + b for a, b in zip(packets, out["chiplet_tokens"])]
    await wait_for(dut, lambda: bench.leaf_tokens == arrived, _budget(bench, len(waiting)),
                   "the waiting batch's packets at their chiplets")
    # the batch closes after batch_wait idle cycles; its planner then waits at the slot
    await ClockCycles(dut.clk, 2 * cfg.batch_wait + 40)
    out_later = bench.send_tokens(later, first_id=len(waiting))
    if cfg.token_banks > 1:                 # (one bank: they wait in the input queue)
        arrived = [a + b for a, b in zip(arrived, out_later["chiplet_tokens"])]
        await wait_for(dut, lambda: bench.leaf_tokens == arrived, _budget(bench, len(later)),
                       "the later batch's packets in the other bank")
    await ClockCycles(dut.clk, 4 * (cfg.header_flits + cfg.x_flits) + 40)
    stuck = [t for t, (experts, gates) in enumerate(zip(out["experts"], out["gates"]))
             if {e for e, _ in bench.model.choices(experts, gates)} & set(wanted.values())]
    early = set(bench.received_tokens()) & set(stuck)
    assert not early, f"tokens {sorted(early)} of slot {slot} returned before its weights"
    bench.send_loads(loads)
    await bench.finish(_budget(bench, len(waiting) + len(later)))


@cocotb.test()
async def test_every_y_at_the_edge_of_the_golden_schedule(dut):
    """Cycle-exact through the whole layer, every port ready, the weights resident. Each round
    sends one x (non-negative, x[0] the largest) to the k experts of one chiplet first (W_g's
    columns the largest weight for them, the smallest for the rest; the route is whatever the
    scores give, the same for every token), chiplet by chiplet: every chiplet the mask holds
    takes every token, in order, and returns them in order. Per such chiplet, the edges it
    took each packet's last flit (``leaf_packets``) give its batches (``batch`` tokens in
    turn, the last partial) to ``golden.moe_layer.chiplet_stream_edges``: each token's return
    ends P - 1 edges after its first flit, its batch's returns back to back from the batch's
    first. Then ``golden.nop.combine_first_edge`` gives the root's first combined flit, and
    y's first flit follows the H header flits the layer drops: every token's y at exactly
    that edge, its X flits back to back. 2 full batches and a partial one (as max_inflight
    and token ids allow: the root never holds dispatch back). (moe_layer's mutant 20 of
    2026-12-01, a chiplet's planner taking a closed bank one edge late, changed only when y
    left.)"""
    bench = await start_bench(LayerBench, dut, "schedule")
    cfg = bench.cfg
    chiplet = cfg.chiplet_config()
    shape = chiplet.schedule
    flits = cfg.header_flits + cfg.x_flits
    queue = 1 if chiplet.queue_tokens else 0       # the queue adds an edge before the collector
    count = min(2 * cfg.batch + max(1, cfg.batch // 2), cfg.max_inflight, 1 << cfg.token_width)
    low, high = signed_limits(cfg.w_width)
    bench.unit_x_scales = True
    base = bench.random_model()
    for leaf in range(cfg.leaves):
        chosen = sorted(range(cfg.experts),
                        key=lambda e: (base.placement[e] != leaf, e))[:cfg.k]
        model = dataclasses.replace(base, wg=[[high if e in chosen else low
                                               for e in range(cfg.experts)]] * cfg.d_model)
        await bench.configure(model)
        # One x for every token of the round: the same scores, so the same route whatever
        # the widths do to them (a score accumulator that wraps, 1-bit codes).
        if bench.floating:
            x = [largest_code(cfg.dtype)] + [golden_fp.encode(bench.rng.random(), cfg.dtype)
                                             for _ in range(cfg.d_model - 1)]
        else:
            x_high = signed_limits(cfg.in_width)[1]
            x = [x_high] + [bench.rng.randint(0, x_high) for _ in range(cfg.d_model - 1)]
        tokens = [x] * count
        bench.clear_counts()
        bench.expected.clear()
        bench.y.received.clear()
        out = bench.send_tokens(tokens)
        await bench.finish(_budget(bench, count))
        mask = out["masks"][0]
        tags = {(at, slot): expert for at, slot, expert, _ in bench.resident_loads(model)}
        experts = {e for e, _ in model.choices(out["experts"][0], out["gates"][0])}
        return_last = {}                    # per chiplet of the mask: each token's last flit
        for at in range(cfg.leaves):
            if not (mask >> at) & 1:
                continue
            arrived = bench.leaf_packet_edges[at]
            assert len(arrived) == count, f"chiplet {at} took {len(arrived)} packets"
            members = [range(b, min(count, b + cfg.batch)) for b in range(0, count, cfg.batch)]
            batches = [([len(group) if tags[at, slot] in experts else 0
                         for slot in range(cfg.slots)], len(group)) for group in members]
            firsts = golden.chiplet_stream_edges(
                batches, shape, cfg.token_banks, flits,
                [arrived[group[-1]] + queue for group in members], batch=cfg.batch,
                batch_wait=cfg.batch_wait)["firsts"]
            return_last[at] = [firsts[b] + (j + 1) * flits - 1
                               for b, group in enumerate(members) for j in range(len(group))]
        packets = [bench.y.received[i:i + cfg.x_flits]
                   for i in range(0, len(bench.y.received), cfg.x_flits)]
        for token, packet in enumerate(packets):
            edges = [edge for edge, _ in packet]
            assert int(packet[0][1].token) == token, f"y of token {packet[0][1].token} " \
                f"where token {token}'s was due (chiplets {mask:b})"
            expected = golden_nop.combine_first_edge(
                mask, {at: ends[token] for at, ends in return_last.items()}, flits,
                tuple(cfg.fanouts)) + cfg.header_flits
            assert edges == list(range(expected, expected + cfg.x_flits)), \
                (f"chiplets {mask:b}: token {token}'s y at edges {edges}, expected from "
                 f"{expected} (its returns' last flits {[r[token] for r in return_last.values()]})")
        dut._log.info(f"chiplets {mask:b}: {count} tokens' y at the golden edges, the last at "
                      f"{packets[-1][0][0]}")


def _held_slots(bench, loads, out):
    """``(leaf, slot)`` pairs the golden routing's tokens hold while no slot is loaded: a
    chiplet's token banks take the first ``token_banks * batch`` tokens sent to it (later ones
    wait in its queue and hold nothing), and a token in a bank holds each of the chiplet's
    slots whose expert (the tag ``loads`` gave it) is among its choices, the slots the
    placement left over (tagged expert 0) included."""
    cfg = bench.cfg
    held, banked = set(), [0] * cfg.leaves
    for experts, gates, mask in zip(out["experts"], out["gates"], out["masks"]):
        chosen = {e for e, _ in bench.model.choices(experts, gates)}
        for leaf in range(cfg.leaves):
            if (mask >> leaf) & 1 and banked[leaf] < cfg.token_banks * cfg.batch:
                banked[leaf] += 1
                held |= {(at, slot) for at, slot, expert, _ in loads
                         if at == leaf and expert in chosen}
    return sorted(held)


@cocotb.test()
async def test_an_assignment_waits_for_the_tokens_holding_its_slot(dut):
    """Every chiplet's slots assigned, not loaded; a batch dispatched, whose tokens wait in the
    chiplets holding the slots they chose. An assignment of a held slot (its own expert again)
    is not taken while the slot is held: none for 2 * batch_wait + 100 cycles, and later only
    after that slot's load has ended (the contract: taken when the slot is neither held nor
    being loaded). The assignments queue on one port, so only the first can be seen waiting:
    one round per held slot, each held slot first once (as many rounds as leaves x slots at
    most); then the loads, y bit-exact, and every assignment taken. Gaps on every input,
    stalls on y. (moe_layer's mutant 12 of 2026-12-01, chiplet 0 taking an assignment of its
    slot 0 while tokens held it, passed every other test.)"""
    bench = await _setup(dut, "held-assign", 0.2, 0.2)
    cfg = bench.cfg
    shape = cfg.chiplet_config().schedule
    tested, rounds = set(), 0
    while rounds < cfg.leaves * cfg.slots:
        rounds += 1
        model = bench.random_model()
        await bench.configure(model, weights=False)
        loads = bench.resident_loads(model)
        for leaf, slot, expert, _ in loads:
            bench.sources["assign"].send({"leaf": leaf, "slot": slot, "expert": expert})
        await wait_for(dut, lambda: bench.sources["assign"].idle, 40 * len(loads) + 200,
                       "slots assigned")
        bench.expected.clear()
        bench.y.received.clear()
        # No more than the token banks hold, nor than the root dispatches before any returns
        # (max_inflight): a token left in a chiplet's queue or the root's would be collected
        # after an assignment was taken and wait for a load that never comes.
        count = min(cfg.token_banks * cfg.batch, cfg.max_inflight, 1 << cfg.token_width)
        tokens = [bench.random_x() for _ in range(count)]
        held = _held_slots(bench, loads, bench.send_tokens(tokens))
        untested = [pair for pair in held if pair not in tested]
        if not untested:
            break
        # Every packet in its chiplet (the counts unchanged), then the held slots reassigned,
        # a slot not yet seen waiting first.
        await _until_unchanged(dut, lambda: list(bench.leaf_tokens), 2 * cfg.batch_wait + 100,
                               2 * _budget(bench, len(tokens), 0.2, 0.2), "packets settled")
        order = untested[:1] + [pair for pair in held if pair != untested[0]]
        tags = {(leaf, slot): expert for leaf, slot, expert, _ in loads}
        source = bench.sources["assign"]
        source.sent_edges.clear()
        for leaf, slot in order:
            source.send({"leaf": leaf, "slot": slot, "expert": tags[leaf, slot]})
        await ClockCycles(dut.clk, 2 * cfg.batch_wait + 100)
        assert not source.sent_edges, \
            f"chiplet {order[0][0]} took an assignment of its slot {order[0][1]}, held by tokens"
        tested.add(order[0])
        bench.clear_weight_edges()
        bench.send_loads(loads)
        await bench.finish(_budget(bench, len(tokens), 0.2, 0.2))
        await wait_for(dut, lambda: source.idle and all(
            bench.sources[f"weights__{g}"].idle for g in range(cfg.switch_groups)),
            _budget(bench, 1, 0.2, 0.2) + 30 * len(loads) * shape.expert_beats,
            "the loads, and the assignments once their slots were free")
        load_end = bench.load_end_edges(loads)
        for (leaf, slot), taken in zip(order, source.sent_edges):
            assert taken > load_end[leaf, slot], \
                f"chiplet {leaf} slot {slot}: assignment taken at {taken}, before its load ended"
    dut._log.info(f"{len(tested)} held slots seen waiting in {rounds} rounds: {sorted(tested)}")
    assert tested


def _steered_model(bench, model, edges):
    """``(model, c)``: ``model`` with a constant gate table G = 2**gate_width - 1 and each
    expert e made to output one constant vector y_e, whatever the token, so that G*y_e has its
    bits below ``gate_shift`` equal to ``edges[e]``, for x[0] = c: W_g = 0 (g = 0, act = table
    entry 0 = A), one W_u column (u from w_e*c, so h = H_e for every row), W_d rows summing to
    r_e with H_e*r_e = y_e. None where the configuration cannot (no H_e and r_e within the
    widths)."""
    cfg = bench.cfg
    modulus = 1 << cfg.gate_shift
    gate = (1 << cfg.gate_width) - 1
    low, high = signed_limits(cfg.w_width)
    x_high = signed_limits(cfg.in_width)[1]        # x and the activation table's entries
    shifts = (cfg.shift_g, cfg.shift_u, cfg.shift_h)
    zero = [[0] * cfg.d_model for _ in range(cfg.d_ff)]
    unit_down = [[int(d == 0 and f == 0) for f in range(cfg.d_ff)] for d in range(cfg.d_model)]
    small = [v for v in (1, 2, 3, 4, 5, 7, 8, 11, 16, 23, 32, 47, 64, 95)
             if v <= min(high, x_high)]

    def down_rows(h, edge):
        # Row sum r with G*H*r = edge (mod 2**gate_shift), spread over d_ff weights:
        # H*r = edge/G, solvable where the power of two dividing H divides it.
        target = edge * pow(gate, -1, modulus) % modulus
        step = math.gcd(h, modulus)
        if h == 0 or target % step:
            return None
        period = modulus // step
        r = target // step * pow(h // step, -1, period) % period if period > 1 else 0
        r = r - period if r >= period // 2 else r
        row = []
        for _ in range(cfg.d_ff):
            row.append(max(low, min(high, r - sum(row))))
        return [list(row) for _ in range(cfg.d_model)] if sum(row) == r else None

    for c in small + [x_high]:
        for a in small + [x_high]:
            act = [a] + list(model.act_lut[1:])
            x = [c] + [0] * (cfg.d_model - 1)
            experts = []
            for edge in edges:                 # each expert its own W_u weight w, so its H
                for w in small + [high]:
                    up = [[w if d == 0 else 0 for d in range(cfg.d_model)]
                          for _ in range(cfg.d_ff)]
                    h = golden_ndp.ffn_expert(zero, up, unit_down, x, act, shifts,
                                              cfg.in_width, cfg.acc_width)[0]
                    down = down_rows(h, edge)
                    if down is not None:
                        experts.append((zero, up, down))
                        break
            if len(experts) < len(edges):
                continue
            steered = dataclasses.replace(model, experts=experts, act_lut=act,
                                          gate_lut=[gate] * len(model.gate_lut))
            if all(gate * v % modulus == edge for e, edge in enumerate(edges)
                   for v in steered.ffn(e, x)):
                return steered, c
    return None


@cocotb.test()
async def test_chiplet_sums_at_the_rounding_edge(dut):
    """Integer layers: every gate is G = 2**gate_width - 1 (a constant gate table) and every
    expert outputs one constant vector y (x[0] fixed, W_g = 0, one W_u column, W_d rows
    chosen: ``_steered_model``), so a chiplet's sum for a token of which it holds one expert
    is G*y, placed at its return's rounding edge: the bits below gate_shift one half minus
    one, then (the experts reloaded) one half. The router's weights and the other elements of
    x stay random, so the tokens spread over the chiplets and their token slots, in every
    bank. A chiplet's sum bit below the rounding point wrong (its start value, a carry)
    moves that chiplet's return by one, and so y (moe_layer's mutant 15 of 2026-11-27:
    chiplet 1's sum of token slot 1, element 1 starting at 1, passed every other test).
    Floating point, or where no such model exists: the same traffic on a random model."""
    bench = await start_bench(LayerBench, dut, "chiplet-edge")
    cfg = bench.cfg
    count = min(cfg.batch * cfg.token_banks * max(1, cfg.leaves // cfg.k),
                1 << cfg.token_width)
    half = 1 << cfg.gate_shift >> 1
    for edge in (half - 1, half):
        model, c = bench.random_model(), None
        steered = None if bench.floating or not cfg.gate_shift else _steered_model(
            bench, model, [edge % (1 << cfg.gate_shift)] * len(model.experts))
        if steered:
            model, c = steered
        else:
            dut._log.info("no steered model for this configuration: random ones")
        await bench.configure(model)
        tokens = [bench.random_x() for _ in range(count)]
        if c is not None:
            tokens = [[c] + x[1:] for x in tokens]
        await bench.run(tokens, _budget(bench, count))


@cocotb.test()
async def test_two_experts_of_a_chiplet_sum_at_the_rounding_edge(dut):
    """Integer layers: a chiplet adds a token's experts into one sum (one adder per token slot
    and element), and the other tests rarely give a token two experts on one chiplet with the
    sum near its return's rounding edge. Here each token is routed to the first
    min(k, slots) experts of one chiplet (x[0] = c for the steered experts of
    ``_steered_model``, x[1 + i] the largest code and W_g's row 1 + i the largest weight for
    those experts, the smallest for the others), the first d_model - 1 chiplets with two
    routed experts taken in turn, and their first two experts' G*y end in (half + 1, all
    ones): the sum's bits below gate_shift exactly one half, so any set bit of either addend
    lost (or a carry) moves the return down; then (half - 1, 0): one below half, so any bit
    gained moves it up; then (half - 1, 1): one half again, reached by a carry through every
    bit the first addend has below half, so any of them lost in its write moves the return
    down (moe_layer's mutant 8 of 2026-12-01, bit 2 of chiplet 1's sum of token slot 11,
    element 3, inverted at each write, passed the first two: its flips cancel or stay below
    the rounding point there). Every token slot and element of those chiplets gets such a sum
    (moe_layer's mutant 1 of 2026-11-27: bit 3 of the addend into token slot 8's element 2
    tied to 0, which no other test saw); the log says how many tokens the golden routing put
    there. Floating point, k = 1, no chiplet with two routed experts, or edges the widths
    cannot make: the same number of tokens on a random model."""
    bench = await start_bench(LayerBench, dut, "pair-edge")
    cfg = bench.cfg
    model = bench.random_model()
    per_leaf = [[e for e in range(cfg.experts) if model.placement[e] == leaf][:cfg.k]
                for leaf in range(cfg.leaves)]
    pairs = [leaf for leaf in range(cfg.leaves) if len(per_leaf[leaf]) >= 2]
    modulus = 1 << cfg.gate_shift
    half = modulus >> 1
    count = min(cfg.batch * cfg.token_banks + cfg.batch, 1 << cfg.token_width)

    async def random_run(why):
        dut._log.info(f"{why}: {count} tokens on a random model")
        await bench.configure(bench.random_model())
        await bench.run([bench.random_x() for _ in range(count)], _budget(bench, count))

    if bench.floating or not cfg.gate_shift or not pairs or cfg.d_model < 2:
        await random_run("no chiplet sums two steered experts here")
        return
    low, high = signed_limits(cfg.w_width)
    x_high = signed_limits(cfg.in_width)[1]
    # x[1 + i] selects chiplet i, so d_model - 1 of them at once. Each chiplet is an instance
    # of one Verilog module, but `moegen mutate` mutates the flattened netlist one instance
    # at a time: every steerable chiplet is covered, not just one.
    leaves = pairs[:cfg.d_model - 1]
    for first, second in (((half + 1) % modulus, modulus - 1), (half - 1, 0), (half - 1, 1)):
        edges = [0] * len(model.experts)
        for leaf in leaves:
            edges[per_leaf[leaf][0]], edges[per_leaf[leaf][1]] = first, second
        steered = _steered_model(bench, model, edges)
        if steered is None:
            await random_run(f"no steered model for the edges {first}, {second}")
            continue
        steered, c = steered
        wg = [[0] * cfg.experts for _ in range(cfg.d_model)]
        for i, leaf in enumerate(leaves):
            wg[1 + i] = [high if e in per_leaf[leaf] else low for e in range(cfg.experts)]
        steered = dataclasses.replace(steered, wg=wg)
        # every token slot of each chiplet and a batch more (bench.run sends them in waves
        # when token ids run out)
        steered_count = len(leaves) * (cfg.batch * cfg.token_banks + cfg.batch)
        tokens = [[c] + [x_high if d == 1 + i % len(leaves) else 0
                         for d in range(1, cfg.d_model)] for i in range(steered_count)]
        bench.unit_x_scales = True          # (the routes the scores steer)
        routes = golden.layer(steered, tokens)["experts"]
        colocated = sum(set(per_leaf[leaves[i % len(leaves)]][:2]) <= set(route)
                        for i, route in enumerate(routes))
        # (All of them but where the scores cannot tell the experts apart, e.g. 2-bit
        # weights or a shift past every score, or the group limit splits a pair.)
        dut._log.info(f"edges {first}, {second}, chiplets {leaves}: {colocated} of "
                      f"{steered_count} tokens on two experts of one chiplet")
        await bench.configure(steered)
        bench.clear_counts()
        counts = await bench.run(tokens, _budget(bench, steered_count))
        assert bench.leaf_tokens == counts


@cocotb.test()
async def test_scores_at_the_rounding_edge(dut):
    """Every expert's raw score one below half a code step or exactly on it (x all ones, W_g
    made so; FP8: code 1, the smallest subnormal, fixed-point value 1): of experts 2j and 2j+1
    one scores 2**(score_shift-1) - 1 and the other 2**(score_shift-1) above j code steps, and
    then the other way round, with partial sums of both parities. A score accumulator, its
    rounding or its saturation off by one moves a code: a chosen expert's gate weight (a
    random gate table) or, where the move makes or breaks a tie at the k-th place (ties go to
    the lower index), the routing; hence y."""
    bench = await start_bench(LayerBench, dut, "rounding")
    cfg = bench.cfg
    step = 1 << cfg.score_shift
    _, high = signed_limits(cfg.w_width)
    for phase in range(2):
        columns = []
        for expert in range(cfg.experts):
            target = step // 2 - 1 + (expert + phase) % 2 + (expert // 2) * step
            target = min(target, cfg.d_model * (high - 1))  # (small widths: as far as it goes)
            weights = [target // cfg.d_model + (d < target % cfg.d_model)
                       for d in range(cfg.d_model)]
            # partial sums of both parities: +1 -1 in pairs, then +1 first and -1 last
            pairs = [(d, d + 1) for d in range(0, cfg.d_model - 1, 2)]
            for up, down in pairs if phase == 0 else [(0, cfg.d_model - 1)] * (cfg.d_model > 1):
                weights[up] += 1
                weights[down] -= 1
            columns.append(weights)
        wg = [[columns[e][d] for e in range(cfg.experts)] for d in range(cfg.d_model)]
        await bench.configure(dataclasses.replace(bench.random_model(), wg=wg))
        tokens = [[1] * cfg.d_model] * cfg.batch + [bench.random_x() for _ in range(2)]
        bench.unit_x_scales = True          # (the scores at the rounding edge)
        bench.clear_counts()
        counts = await bench.run(tokens, _budget(bench, len(tokens)))
        assert bench.leaf_tokens == counts


@cocotb.test()
async def test_misuse(dut):
    """A weight beat for a leaf past its switch group's chiplets, and an assignment for a leaf
    past the layer's, are taken, dropped and set the sticky error (where the field can hold
    such a leaf: not with power-of-two counts, as in the defaults); after a reset (and the
    router's table written again) the weights are as they were: y exact."""
    bench = await _setup(dut, "misuse")
    cfg = bench.cfg
    lanes = cfg.chiplet_config().schedule.weight_lanes

    def field_holds_more(count):
        return count < 1 << max(1, (count - 1).bit_length())
    cases = []
    if field_holds_more(cfg.group_leaves):
        cases.append(("weights__0", {"leaf": cfg.group_leaves, "slot": 0, "expert": 0,
                                     "data": [1] * lanes, "last": 1}))
    if field_holds_more(cfg.leaves):
        cases.append(("assign", {"leaf": cfg.leaves, "slot": 0, "expert": 0}))
    for port, payload in cases:
        assert not dut.error.value
        bench.sources[port].send(payload)
        await wait_for(dut, lambda: bench.sources[port].idle, 50, f"{port} taken")
        await ClockCycles(dut.clk, 2)
        assert dut.error.value == 1, f"{port}: a leaf that does not exist did not set error"
        await bench.reset(3)
        for expert, leaf in enumerate(bench.model.placement[:cfg.experts]):
            bench.sources["table"].send({"expert": expert, "leaf": leaf})
        await wait_for(dut, lambda: bench.sources["table"].idle, 50 * cfg.experts + 200,
                       "table")
        bench.y.received.clear()
        await bench.run([bench.random_x() for _ in range(cfg.batch)],
                        _budget(bench, cfg.batch))


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """A balanced 64-token batch (fewer if 2**token_width is; 16 in `make test`, which checks
    rather than measures) with co-activation structure (``golden.moe_layer.community_workload``),
    every port ready, weights resident, under round-robin and clustered placement: y bit-exact;
    tokens per cycle and cycles against the busiest chiplet's MAC bound; r and the flits on
    every tree link, measured at the RTL's taps and equal to the golden routing's chiplet
    counts; then the weights streamed, first or double-buffered. Written for `make bench` and
    the demo."""
    bench = await start_bench(LayerBench, dut, "throughput")
    cfg = bench.cfg
    communities = max(1, cfg.experts // cfg.slots)
    count = min(64 if measuring() else 16, 1 << cfg.token_width)   # one id per token in flight
    wg, tokens, _ = golden.community_workload(7, count, cfg.d_model, cfg.experts, communities,
                                              cfg.in_width, cfg.w_width)
    if bench.floating:                            # each element / 16, as an FP8 code
        tokens = [[golden_fp.encode(v / 16, cfg.dtype) for v in x] for x in tokens]
    base = dataclasses.replace(bench.random_model(), wg=wg)
    runs, wall, edges = {}, 0.0, 0
    tables = golden.placements(base, tokens, cfg.leaves, cfg.switch_groups)
    for name, table in tables.items():
        bench.clear_weight_edges()
        await bench.configure(dataclasses.replace(base, placement=bench.with_shared(table)))
        loads = bench.weight_edges()
        load_cycles = loads[-1] - loads[0] + 1
        assert len(loads) == bench.loaded_beats
        bench.clear_counts()
        bench.expected.clear()
        bench.y.received.clear()
        began, began_edge = time.perf_counter(), edge_now()
        first = edge_now() + 1
        out = bench.send_tokens(tokens)
        await bench.finish(_budget(bench, len(tokens)))
        wall += time.perf_counter() - began
        edges += edge_now() - began_edge
        cycles = bench.y.received[-1][0] - first + 1
        bound = golden.mac_bound(out["chiplet_macs"], cfg.rows * cfg.cols * cfg.arrays)
        measured_r = sum(bench.leaf_tokens) / len(tokens)
        assert bench.leaf_tokens == out["chiplet_tokens"]
        assert measured_r == out["replication"]
        runs[name] = {"cycles": cycles, "tokens_per_cycle": round(len(tokens) / cycles, 4),
                      "mac_bound_cycles": bound, "of_bound": round(bound / cycles, 4),
                      "replication": measured_r, "chiplet_tokens": list(bench.leaf_tokens),
                      "chiplet_macs": out["chiplet_macs"],
                      "down_link_flits": list(bench.link_flits["down"]),
                      "up_link_flits": list(bench.link_flits["up"]),
                      "placement": bench.with_shared(table), "weight_load_cycles": load_cycles}
    main = runs["round_robin"]
    metrics = {"tokens": len(tokens), "cycles": main["cycles"],
               "tokens_per_cycle": main["tokens_per_cycle"],
               "mac_bound_cycles": main["mac_bound_cycles"], "of_bound": main["of_bound"],
               "r": main["replication"], "weight_load_cycles": main["weight_load_cycles"]}
    if "clustered" in runs:
        metrics["r_clustered"] = runs["clustered"]["replication"]
        metrics["cycles_clustered"] = runs["clustered"]["cycles"]
        metrics["of_bound_clustered"] = runs["clustered"]["of_bound"]
    # The cost of streaming the weights (round-robin placement), each switch group's from its
    # DDR4-3200 channel: first all of them, then the batch; then double-buffered, the batch
    # dispatched at once while each chiplet's experts stream in, the heaviest first (and, to
    # compare, the lightest first).
    model = dataclasses.replace(base, placement=bench.with_shared(tables["round_robin"]))
    await bench.configure(model, weights=False)
    bench.clear_weight_edges()
    began_load = edge_now() + 1
    bench.send_loads(bench.resident_loads(model), dram=True)
    await wait_for(dut, lambda: len(bench.weight_edges()) == bench.loaded_beats,
                   _budget(bench, len(tokens)), "the weights")
    loads = bench.weight_edges()
    bench.clear_counts()
    bench.expected.clear()
    bench.y.received.clear()
    bench.send_tokens(tokens)
    await bench.finish(_budget(bench, len(tokens)))
    metrics["ddr4_weight_load_cycles"] = loads[-1] - began_load + 1
    metrics["streamed_cycles"] = bench.y.received[-1][0] - began_load + 1
    # The lightest first is a figure to compare (the demo prints it), not a check of its own:
    # measured runs only.
    orders = [("heaviest", "overlapped_cycles")] + \
        ([("lightest", "overlapped_lightest_first_cycles")] if measuring() else [])
    for order, key in orders:
        bench.clear_counts()
        _, began = await bench.stream(model, tokens, order)
        await bench.finish(_budget(bench, len(tokens)))
        metrics[key] = bench.y.received[-1][0] - began + 1
    # Double buffering beats loading first (the batch computes while the weights arrive).
    assert metrics["overlapped_cycles"] < metrics["streamed_cycles"], metrics
    # Operations: the experts' MACs and the gate's (D x E a token) of the batches run.
    batches = [*runs.values(), *[main] * (1 + len(orders))]
    macs = sum(sum(run["chiplet_macs"]) for run in batches) \
        + len(batches) * len(tokens) * cfg.d_model * cfg.experts
    write_throughput(metrics, f"a {count}-token balanced batch, weights resident, round-robin "
                     "placement; streamed: the weights read from a DDR4-3200 channel per "
                     "switch group, first or (overlapped) while the batch computes",
                     edges / wall, placements=runs, operations=macs)
