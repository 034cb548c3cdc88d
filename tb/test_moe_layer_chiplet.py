"""cocotb tests of ``expert_chiplet`` (a leaf of the MoE layer) against ``golden.moe_layer``.

Every return flit is compared, in order, with the golden return of its token: the sum over the
token's chosen experts held by the chiplet of gate * FFN(x), rounded once to ``combine_width``
(``golden.moe_layer.chiplet_return``); with an FP8 or BF16 ``dtype``, the FP32 sum in slot
order cast to the return lanes' format, bit for bit. Weights are loaded in the tile order of
``golden.moe_layer.weight_beats``.
"""

import time

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from golden import moe_layer as golden
from golden import ndp as golden_ndp
from golden.fixed import signed_limits
from tb.fp8 import random_code, random_scale, random_scales, random_token, unit_scales
from tb.harness import long_enough_to_time, start_bench, write_throughput
from tb.streams import (LONG_BURSTS, STALL_PROFILES, InOrderScoreboard, StreamBench, edge_now,
                        pause_fraction, reset_dut, wait_for)


class ChipletBench(StreamBench):
    """Sources on down, weights and act_lut; a sink on up; the golden state of the slots."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("down", "weights", "assign", "act_lut"), ("up",),
                         gap, stall, always_ready=("act_lut",))
        self.cfg = config
        self.up = self.sinks["up"]
        self.board = InOrderScoreboard("up", component.up.payload.shape())
        self.slot_expert = {}               # slot -> (expert, (wg, wu, wd)), after its load
        self.slot_scales = {}               # slot -> its weight-block scales (floating point)
        self.act = [0] * (1 << config.act_index_bits)
        self.tokens = 0
        self.token_slots = []               # per token sent: the slots its choices use

    @property
    def shape(self):
        return self.cfg.schedule

    @property
    def floating(self):
        return self.cfg.dtype != "int"

    def random_expert(self):
        cfg, rng = self.cfg, self.rng
        low, high = signed_limits(cfg.w_width)

        def matrix(rows, cols):
            if self.floating:
                return [[random_code(rng, cfg.dtype, 0.5) for _ in range(cols)]
                        for _ in range(rows)]
            return [[rng.randint(low, high) for _ in range(cols)] for _ in range(rows)]
        return (matrix(cfg.d_ff, cfg.d_model), matrix(cfg.d_ff, cfg.d_model),
                matrix(cfg.d_model, cfg.d_ff))

    def load(self, slot, expert, weights=None, scales=None, hold_last=False):
        """Queue one expert's load into ``slot``; the golden slot follows. Floating point:
        ``scales`` its weight blocks' scales (``scale_format`` codes: random with random
        weights, else unit). ``hold_last``: the last beat is returned, to be sent later."""
        assigned = self.slot_expert.get(slot, (None, None))[1]
        if scales is None:                  # an assigned expert's (below), else random
            scales = (self.slot_scales[slot] if weights is not None and weights is assigned
                      else random_scales(self.rng, self.cfg.scale_format) if weights is None
                      else unit_scales(self.cfg.scale_format))
        weights = weights or self.random_expert()
        beats = golden.weight_beats(self.shape, *weights)
        extra = {"scale": scales} if self.floating else {}
        items = [{"slot": slot, "expert": expert, **extra, "data": beat,
                  "last": int(index == len(beats) - 1)} for index, beat in enumerate(beats)]
        held = items.pop() if hold_last else None
        for item in items:
            self.sources["weights"].send(item)
        self.slot_expert[slot] = (expert, weights)
        self.slot_scales[slot] = scales
        return held

    def assign(self, slot, expert, weights=None):
        """Queue an assignment of ``expert`` to ``slot`` (its weights, and random scales, to
        be loaded later with :meth:`load`); the golden slot follows. Returns the weights."""
        weights = weights or self.random_expert()
        self.sources["assign"].send({"slot": slot, "expert": expert})
        self.slot_expert[slot] = (expert, weights)
        self.slot_scales[slot] = random_scales(self.rng, self.cfg.scale_format)
        return weights

    def load_act(self, table=None):
        cfg = self.cfg
        if self.floating:
            table = table or golden.fp_activation_lut("silu", cfg.dtype)
        table = table or golden_ndp.activation_lut("silu", cfg.in_width, 4, 4)
        for index, value in enumerate(table):
            self.sources["act_lut"].send({"index": index, "value": value})
        self.act = list(table)

    async def configure(self, slots=None):
        """The activation table and every slot loaded (expert s+1 in slot s by default)."""
        cfg = self.cfg
        self.load_act()
        for slot in range(cfg.slots):
            self.load(slot, (slots or {}).get(slot, (slot + 1) % cfg.experts))
        await self.settle()

    async def settle(self):
        budget = 20 * (len(self.act) + self.cfg.slots * self.shape.expert_beats) + 500
        await wait_for(self.dut, lambda: self.sources["weights"].idle and
                       self.sources["act_lut"].idle, budget, "weights and table written")

    def model(self):
        """A ``golden.moe_layer.MoELayer`` whose leaf 0 is this chiplet."""
        cfg = self.cfg
        experts = [self.random_expert_zero()] * cfg.experts
        placement = [1] * cfg.experts
        unit = unit_scales(cfg.scale_format)
        scales = [tuple(unit.values())] * cfg.experts
        for slot, (expert, weights) in self.slot_expert.items():
            experts = list(experts)
            experts[expert] = weights
            placement[expert] = 0
            scales[expert] = tuple(self.slot_scales.get(slot, unit).values())
        return golden.MoELayer(
            wg=[[0] * cfg.experts] * cfg.d_model, experts=experts, placement=placement,
            gate_lut=[0], act_lut=list(self.act),
            shifts=(cfg.shift_g, cfg.shift_u, cfg.shift_h), k=cfg.k, in_width=cfg.in_width,
            acc_width=cfg.acc_width, gate_shift=cfg.gate_shift, data_width=cfg.data_width,
            combine_width=cfg.combine_width, lanes=cfg.lanes, gate_width=cfg.gate_width,
            dtype=cfg.dtype, acc_frac=cfg.acc_frac, promote_every=cfg.promote_every,
            tile_arrays=cfg.arrays, combine_dtype=cfg.combine_dtype, w_scales=tuple(scales),
            scale_format=cfg.scale_format)

    def random_expert_zero(self):
        cfg = self.cfg
        return ([[0] * cfg.d_model] * cfg.d_ff, [[0] * cfg.d_model] * cfg.d_ff,
                [[0] * cfg.d_ff] * cfg.d_model)

    # --- tokens ---
    def random_x(self, extremes=False):
        if self.floating:
            dtype = self.cfg.dtype
            return random_token(self.rng, dtype, self.cfg.d_model, extremes)
        low, high = signed_limits(self.cfg.in_width)
        if extremes:
            return [self.rng.choice((low, high)) for _ in range(self.cfg.d_model)]
        return [self.rng.randint(low, high) for _ in range(self.cfg.d_model)]

    def random_choices(self, held=None):
        """k distinct experts with random gates; ``held``: how many of them this chiplet
        holds (random by default)."""
        cfg, rng = self.cfg, self.rng
        hosted = sorted({e for e, _ in self.slot_expert.values()})
        others = [e for e in range(cfg.experts) if e not in hosted]
        if held is None:
            held = rng.randint(0, min(cfg.k, len(hosted)))
        held = max(min(held, len(hosted), cfg.k), cfg.k - len(others))   # k distinct
        picked = rng.sample(hosted, held) + rng.sample(others, cfg.k - held)
        rng.shuffle(picked)
        return [(e, rng.randint(0, (1 << cfg.gate_width) - 1)) for e in picked]

    def send_token(self, x, choices, token=None, length=None, scale=None):
        """Queue a dispatch packet and the return it must bring; ``length`` misframes it.
        Floating point: ``scale`` x's scale code (random by default)."""
        cfg = self.cfg
        token = (self.tokens if token is None else token) % (1 << cfg.token_width)
        self.tokens += 1
        gates = [g for _, g in choices]
        if self.floating and scale is None:
            scale = random_scale(self.rng, cfg.scale_format)
        flits = golden.dispatch_flits([e for e, _ in choices], gates, x, cfg.lanes,
                                      cfg.gate_width, scale, cfg.scale_format, cfg.data_width)
        length = len(flits) if length is None else length
        half = 1 << (cfg.data_width - 1)
        # A long packet's extra flits carry random data, which the chiplet must ignore.
        sent = (flits + [[self.rng.randrange(-half, half) for _ in range(cfg.lanes)]
                         for _ in range(length)])[:length]
        for index, flit in enumerate(sent):
            lanes = [(v + half) % (2 * half) - half for v in flit]
            self.sources["down"].send({"token": token, "mask": 1, "data": lanes,
                                       "last": int(index == length - 1)})
        # A short packet: the missing x elements are 0; a long one: extra flits ignored.
        got_x = [0] * cfg.d_model
        for d in range(cfg.d_model):
            index = cfg.header_flits + d // cfg.lanes
            if index < length:
                got_x[d] = x[d]
        # A packet's choices are its entries in flits before its last (a short packet's
        # final flit's entries are left unchosen; a whole packet's last flit is an x flit).
        held = [(e, g) for e, g in choices
                if length - 1 > choices.index((e, g)) // cfg.lanes]
        got_scale = self.received_scale(scale, length) if self.floating else None
        self.token_slots.append({slot for slot, (e, _) in self.slot_expert.items()
                                 if e in {e for e, _ in held}})
        order = [self.slot_expert[slot][0] for slot in sorted(self.slot_expert)]
        values = golden.chiplet_return(self.model(), 0, held, got_x, order=order,
                                       x_scale=got_scale)
        header = cfg.header_flits
        body = [[0] * cfg.lanes for _ in range(header)] + [
            [values[b * cfg.lanes + l] if b * cfg.lanes + l < cfg.d_model else 0
             for l in range(cfg.lanes)] for b in range(cfg.x_flits)]
        for index, lanes in enumerate(body):
            self.board.expect_payload({"token": token, "data": lanes,
                                       "last": int(index == len(body) - 1)})

    def received_scale(self, scale, length):
        """x's scale as a packet of ``length`` flits delivers it: each of its header entries
        (low bits first) the packet reaches, the unit scale's bits for those it ends before
        (x being 0 there: a finite nonzero scale then gives what unit does)."""
        cfg = self.cfg
        code, first = cfg.unit_scale, cfg.header_entries - cfg.scale_entries
        for piece in range(cfg.scale_entries):
            if length > (first + piece) // cfg.lanes:
                low = piece * cfg.data_width
                bits = ((1 << min(cfg.data_width, cfg.scale_bits - low)) - 1) << low
                code = (code & ~bits) | (scale & bits)
        return code

    async def finish(self, max_cycles):
        await wait_for(self.dut, lambda: len(self.up.received) >= len(self.board.expected),
                       max_cycles, f"{len(self.board.expected)} return flits")
        await ClockCycles(self.dut.clk, 2 * self.cfg.batch_wait + 20)   # nothing extra
        self.board.check(self.up)


async def _setup(dut, salt, gap=0.0, stall=0.0, **configure):
    bench = await start_bench(ChipletBench, dut, salt, gap, stall)
    await bench.configure(**configure)
    return bench


def _budget(bench, tokens, gap=0.0, stall=0.0):
    cfg, shape = bench.cfg, bench.shape
    slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))
    per_token = (cfg.header_flits + cfg.x_flits) * 2 + cfg.k * shape.expert_beats * 2
    return int((tokens * per_token + 40 * cfg.slots + 4 * cfg.batch_wait) * slowdown * 3) + 2000


@cocotb.test()
async def test_batch_cycles_no_stalls(dut):
    """Every port ready: two full batches and a partial one, random routing; exact returns,
    each batch's first return at the edge of ``golden.moe_layer.chiplet_stream_edges``
    (``chiplet_batch_edges`` after the planner takes it; with one token bank the second batch
    is collected after the first one's returns, with more while the first one computes), and
    its returns back to back. A last token comes ``batch_wait`` + 2 idle cycles after the
    partial batch's: it joins that batch if the planner was still busy (the batch had not
    closed), else it makes a fourth."""
    bench = await _setup(dut, "values")
    cfg = bench.cfg
    flits = cfg.header_flits + cfg.x_flits
    queue = 1 if cfg.queue_tokens else 0         # the queue adds an edge before the collector
    held = min(cfg.k, cfg.slots)                 # the late tokens have work
    sent = bench.sources["down"].sent_edges
    tokens = 2 * cfg.batch + 1

    def stream(members):
        batches = [([sum(slot in bench.token_slots[t] for t in batch)
                     for slot in range(cfg.slots)], len(batch)) for batch in members]
        arrivals = [sent[batch[-1] * flits + flits - 1] + queue for batch in members]
        return batches, golden.chiplet_stream_edges(batches, bench.shape, cfg.token_banks,
                                                    flits, arrivals, batch=cfg.batch,
                                                    batch_wait=cfg.batch_wait)

    for token in range(tokens):
        bench.send_token(bench.random_x(),
                         bench.random_choices(held=held if token == tokens - 1 else None))
    await wait_for(dut, lambda: len(sent) == tokens * flits, _budget(bench, tokens), "batches")
    members = [list(range(b * cfg.batch, min(tokens, (b + 1) * cfg.batch))) for b in range(3)]
    _, before = stream(members)
    # idle from the edge the collector takes the partial batch's final flit
    await ClockCycles(dut.clk, max(1, before["lasts"][2] + cfg.batch_wait + 2 - edge_now()))
    bench.send_token(bench.random_x(), bench.random_choices(held=held))
    await bench.finish(_budget(bench, tokens + 1))
    assert not dut.error.value
    returned = [edge for edge, _ in bench.up.received]

    # The last token's first flit is taken by the collector at or before the partial batch's
    # closing edge: it joins (with batch 1 the batch is full and closed, so it never does).
    if len(members[2]) < cfg.batch and sent[tokens * flits] + queue <= before["closes"][2]:
        members[2].append(tokens)
    else:
        members.append([tokens])
    batches, edges = stream(members)
    first = 0
    for b, batch in enumerate(members):
        out = returned[first:first + len(batch) * flits]
        first += len(batch) * flits
        assert out[0] == edges["firsts"][b], f"batch {b}: slots {batches[b][0]}: first " \
            f"return at {out[0]}, expected {edges['firsts'][b]} ({cfg.token_banks} token banks)"
        assert out == list(range(out[0], out[0] + len(out))), "a bubble between returns"


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_stalls(dut, gap, stall):
    """Random and long-burst gaps on down, weights and act_lut; stalls on up."""
    bench = await _setup(dut, f"stalls:{gap}:{stall}", gap, stall)
    tokens = 3 * bench.cfg.batch + 2
    for token in range(tokens):
        bench.send_token(bench.random_x(extremes=token % 5 == 0), bench.random_choices())
    await bench.finish(_budget(bench, tokens, gap, stall))
    assert not dut.error.value


@cocotb.test()
async def test_full_batches_fill_every_position_with_many_tokens(dut):
    """Every port ready: six full batches of tokens that each choose 1..k held experts at
    random, so each bank's member positions are filled, batch after batch, by tokens of
    different indices (a position that always held one index would hide a wrong bit)."""
    bench = await _setup(dut, "positions")
    cfg = bench.cfg
    tokens = 6 * cfg.batch
    for _ in range(tokens):
        held = bench.rng.randint(1, max(1, min(cfg.k, cfg.slots)))
        bench.send_token(bench.random_x(), bench.random_choices(held=held))
    await bench.finish(_budget(bench, tokens))
    assert not dut.error.value


@cocotb.test()
async def test_every_member_position_holds_every_later_token(dut):
    """Every port ready, full batches: for each held expert and each skip d < batch, a batch
    whose tokens j >= d choose it (the held experts in groups a token can hold together, the
    i-th of a group skipping (d + i) mod batch), so its slot's member position p holds the
    batch's token p + d: every (position, token) pair the planner's gate and token selects can
    meet, for every slot, in every token bank, once with random gates and once with their
    complements (every gate bit both ways). Random routing meets each pair rarely (a bit of
    token 3's gate, read at tile row 1 for slot 0, tied to 0 passed every other test:
    expert_chiplet's mutant 8 of 2026-11-27)."""
    bench = await _setup(dut, "every-pair")
    cfg = bench.cfg
    rng, T = bench.rng, cfg.batch
    full = (1 << cfg.gate_width) - 1
    hosted = sorted({bench.slot_expert[s][0] for s in range(cfg.slots)})
    others = [e for e in range(cfg.experts) if e not in hosted]
    # A token takes k distinct experts: those of the group it chooses, then fillers (experts
    # held by no slot, else held ones outside the group). A group leaves k fillers outside it.
    size = max(1, min(cfg.k, len(hosted), cfg.experts - cfg.k))
    groups = [hosted[i:i + size] for i in range(0, len(hosted), size)]
    tokens = 0
    for group in groups:
        outside = others + [e for e in hosted if e not in group]
        for d in range(T if len(outside) >= cfg.k else 1):
            gates = [[rng.randint(0, full) for _ in range(cfg.k)] for _ in range(T)]
            for flip in (0, full):
                for _ in range(cfg.token_banks):
                    for j in range(T):
                        chosen = [e for i, e in enumerate(group) if j >= (d + i) % T]
                        picked = chosen + outside[:cfg.k - len(chosen)]
                        bench.send_token(bench.random_x(), [
                            (e, g ^ flip) for e, g in zip(picked, gates[j])])
                        tokens += 1
    await bench.finish(_budget(bench, tokens))
    assert not dut.error.value


@cocotb.test()
async def test_sums_at_the_rounding_edge(dut):
    """Every port ready, full batches: each token's gates are drawn until one element's
    gate-weighted sum sits at the return's rounding edge (its bits below gate_shift equal to
    one half, then, in a second pass, one half minus one), the element and the token slot
    taking every pair in turn, through every bank; a token holds two experts where it can, so
    its sum register is read back and added to. A sum bit below the rounding point lost or
    flipped then moves the return by one, where random values hide it (a bit of token 5's sum
    of element 5 cleared at each write passed every other test: expert_chiplet's mutant 9 of
    2026-11-27). Floating point: random gates, the first pass's traffic."""
    bench = await _setup(dut, "rounding-edge")
    cfg = bench.cfg
    rng, shift = bench.rng, cfg.gate_shift
    model = bench.model()
    hosted = sorted({bench.slot_expert[slot][0] for slot in range(cfg.slots)})
    others = [e for e in range(cfg.experts) if e not in hosted]
    full = (1 << cfg.gate_width) - 1
    slots_in_turn = cfg.batch * cfg.token_banks
    tokens = (1 if bench.floating else 2) * slots_in_turn * cfg.d_model
    for j in range(tokens):
        element = (j // slots_in_turn) % cfg.d_model
        target = (1 << shift >> 1) - j // (slots_in_turn * cfg.d_model)
        picked = rng.sample(hosted, min(2, cfg.k, len(hosted)))
        picked += [e for e in others + hosted if e not in picked][:cfg.k - len(picked)]
        x = bench.random_x()
        held = [i for i, e in enumerate(picked) if e in hosted]
        ys = np.array([int(model.ffn(picked[i], x)[element]) for i in held], dtype=np.int64)
        # Up to 4,000 draws, the first that lands on the edge taken (else the next one), tried
        # at once with NumPy: one by one in Python this was most of the bench's time.
        tries = 4000 if shift and not bench.floating else 0
        draws = np.random.default_rng(rng.getrandbits(64)).integers(
            0, full, size=(tries + 1, len(picked)), endpoint=True)
        sums = draws[:tries, held] @ ys
        hits = np.flatnonzero(sums % (1 << shift) == target % (1 << shift))
        gates = draws[hits[0] if len(hits) else tries].tolist()
        bench.send_token(x, list(zip(picked, gates)))
    await bench.finish(_budget(bench, tokens))
    assert not dut.error.value


@cocotb.test()
async def test_tokens_arrive_while_the_other_bank_accumulates(dut):
    """Every port ready: a full batch, then five more whose tokens come one at a time, each
    a few cycles after the previous one's last flit (closer than batch_wait, so batches still
    fill), so one token bank collects while the other's sums are live (written by results,
    not yet returned). With the tokens sent back to back the collecting bank is full long
    before the first result is written, and a flit taken could change a live sum unseen (a
    bit of token slot 3's element-7 sum flipped at every flit taken while collecting, where
    its bit 11 was set, passed every other test: expert_chiplet's mutant 15 of 2026-11-28).
    Random inputs: with extreme ones the returns saturate and hide such a flip."""
    bench = await _setup(dut, "collect-while-live")
    cfg = bench.cfg
    flits = cfg.header_flits + cfg.x_flits
    sent = bench.sources["down"].sent_edges
    spacing = max(1, cfg.batch_wait // 2)
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), bench.random_choices(held=cfg.k))
    for token in range(cfg.batch, 6 * cfg.batch):
        await wait_for(dut, lambda: len(sent) == token * flits, _budget(bench, 1),
                       "the previous token taken")
        await ClockCycles(dut.clk, spacing)
        bench.send_token(bench.random_x(), bench.random_choices(held=cfg.k))
    await bench.finish(_budget(bench, 6 * cfg.batch))
    assert not dut.error.value


@cocotb.test()
async def test_hot_expert_and_every_slot(dut):
    """One expert takes every token, then (once those are back, so a new batch starts in the
    next bank) every token uses every held expert, but a batch's token j < S skips slot j:
    slots fill to their last positions, and a slot's position p does not hold the batch's
    token p, in the second bank as in the first."""
    bench = await _setup(dut, "hot", 0.2, 0.2)
    cfg = bench.cfg
    hot = bench.slot_expert[0][0]
    for _ in range(cfg.batch + 1):
        choices = [(e, g) for e, g in bench.random_choices(held=0) if e != hot]
        choices = [(hot, bench.rng.randint(0, (1 << cfg.gate_width) - 1))] + choices[:cfg.k - 1]
        bench.send_token(bench.random_x(), choices)
    await bench.finish(_budget(bench, cfg.batch + 1, 0.2, 0.2))
    hosted = {bench.slot_expert[s][0] for s in range(cfg.slots)}
    others = [e for e in range(cfg.experts) if e not in hosted]
    for position in range(2 * cfg.batch):
        choices = bench.random_choices(held=cfg.k)
        if position % cfg.batch < cfg.slots < cfg.batch and others:
            skipped = bench.slot_expert[position % cfg.batch][0]
            choices = [(others[0], g) if e == skipped else (e, g) for e, g in choices]
        bench.send_token(bench.random_x(), choices)
    await bench.finish(_budget(bench, 2 * cfg.batch, 0.2, 0.2))


@cocotb.test()
async def test_weights_reloaded_between_batches(dut):
    """A slot reloaded with another expert between batches: later tokens see the new one."""
    bench = await _setup(dut, "reload", 0.1, 0.1)
    cfg = bench.cfg
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), bench.random_choices(held=1))
    await bench.finish(_budget(bench, cfg.batch, 0.1, 0.1))
    held = {e for e, _ in bench.slot_expert.values()}
    free = [e for e in range(cfg.experts) if e not in held]
    bench.load(0, free[0] if free else bench.slot_expert[0][0])    # new weights either way
    await bench.settle()
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), bench.random_choices(held=cfg.k))
    await bench.finish(_budget(bench, 2 * cfg.batch, 0.1, 0.1))
    assert not dut.error.value


@cocotb.test()
async def test_reset_mid_batch(dut):
    """Reset while a batch computes: nothing stale after; the weights and tags are kept."""
    bench = await _setup(dut, "reset", 0.2, 0.3)
    cfg = bench.cfg
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), bench.random_choices(held=cfg.k))
    await wait_for(dut, lambda: len(bench.sources["down"].sent_edges) >=
                   cfg.batch * (cfg.header_flits + cfg.x_flits), _budget(bench, cfg.batch, 0.2),
                   "a batch sent")
    await ClockCycles(dut.clk, 3)
    await bench.reset(3)
    assert not dut.up__valid.value and not dut.error.value
    bench.board.expected.clear()
    bench.up.received.clear()
    for _ in range(cfg.batch + 1):
        bench.send_token(bench.random_x(), bench.random_choices())
    await bench.finish(_budget(bench, cfg.batch + 1, 0.2, 0.3))
    assert not dut.error.value


@cocotb.test()
async def test_misuse(dut):
    """A short packet (missing x is 0) and a long one (extra flits ignored) set the sticky
    error and still return; a load or an assignment of a slot that does not exist is dropped;
    a slot held tokens chose, waiting for its weights, loaded with another expert's sets
    error."""
    bench = await _setup(dut, "misuse")
    cfg = bench.cfg
    full = cfg.header_flits + cfg.x_flits
    bench.send_token(bench.random_x(), bench.random_choices(held=1), length=full + 2)
    await bench.finish(_budget(bench, 1))
    assert dut.error.value == 1, "a long packet did not set error"
    await reset_dut(dut)
    bench.send_token(bench.random_x(), bench.random_choices(held=1),
                     length=max(1, full - 1))
    await bench.finish(_budget(bench, 1))
    assert dut.error.value == 1, "a short packet did not set error"
    if cfg.slots < 1 << max(1, (cfg.slots - 1).bit_length()):
        await reset_dut(dut)
        saved = dict(bench.slot_expert)
        bench.load(cfg.slots, 0)
        bench.slot_expert = saved
        await bench.settle()
        await ClockCycles(dut.clk, 2)
        assert dut.error.value == 1, "a load into a missing slot did not set error"
        bench.send_token(bench.random_x(), bench.random_choices(held=cfg.k))
        await bench.finish(_budget(bench, 1))
        await reset_dut(dut)
        bench.sources["assign"].send({"slot": cfg.slots, "expert": 0})
        await wait_for(dut, lambda: bench.sources["assign"].idle, 20, "the assignment")
        await ClockCycles(dut.clk, 2)
        assert dut.error.value == 1, "an assignment of a missing slot did not set error"
    # A slot that a held token chose while it waited for its weights, loaded with another
    # expert's: error; the token computes with what was loaded (here the same weights).
    await reset_dut(dut)
    expert = bench.slot_expert[0][0]
    weights = bench.assign(0, expert)
    bench.send_token(bench.random_x(), _choosing(bench, expert))
    await wait_for(dut, lambda: len(bench.sources["down"].sent_edges) >= full and
                   bench.sources["assign"].idle, _budget(bench, 1), "a token held")
    await ClockCycles(dut.clk, 2)
    assert not dut.error.value
    bench.load(0, (expert + 1) % cfg.experts, weights)
    await bench.finish(_budget(bench, 1))
    assert dut.error.value == 1, "a held slot loaded with another expert did not set error"


@cocotb.test()
async def test_misframed_packets_in_every_token_slot(dut):
    """Every token slot of every bank takes a long packet (one to three extra flits of random
    data, ignored) and a short one (its missing x elements read as 0, never as the slot's
    previous token's), in two passes of full batches; every return equals the golden's and
    error is set. (An extra flit that cleared a bit of token slot 13's element 6 passed every
    other test: expert_chiplet's mutant 19 of 2026-11-27.)"""
    bench = await _setup(dut, "misframed")
    cfg, rng = bench.cfg, bench.rng
    full = cfg.header_flits + cfg.x_flits
    slots_in_turn = cfg.batch * cfg.token_banks
    for j in range(2 * slots_in_turn):
        long = (j + j // slots_in_turn) % 2 == 0 or full == 1
        length = full + rng.randint(1, 3) if long else rng.randint(1, full - 1)
        bench.send_token(bench.random_x(), bench.random_choices(), length=length)
    await bench.finish(_budget(bench, 2 * slots_in_turn))
    assert dut.error.value == 1, "a misframed packet did not set error"


def _choosing(bench, expert):
    """k distinct random choices, every held expert's among them when k allows, ``expert``'s
    always."""
    choices = bench.random_choices(held=bench.cfg.k)
    if expert not in {e for e, _ in choices}:
        choices[0] = (expert, choices[0][1])
    return choices


def _stream_setup(bench):
    """Every slot assigned a new expert (the slots' previous ones leave the golden), the
    heaviest first: slot 0 is chosen by every token, the later ones by fewer."""
    cfg = bench.cfg
    experts = [(bench.slot_expert[s][0] + cfg.slots) % cfg.experts if cfg.experts > cfg.slots
               else bench.slot_expert[s][0] for s in range(cfg.slots)]
    weights = [bench.assign(slot, expert) for slot, expert in enumerate(experts)]
    return experts, weights


@cocotb.test()
async def test_weights_stream_while_computing(dut):
    """Double buffering, every port ready. Every slot is assigned a new expert, a full batch
    is dispatched while slot 0 (the heaviest: every token chose it) loads, and the other slots
    load once the batch is in: the planner computes slot 0's groups while they load. The first
    return is at the edge of ``golden.moe_layer.chiplet_stream_edges`` given each load's
    last-beat edge (and, with 2 slots or more, sooner than after every load), returns back to
    back, y exact. Then, while a second batch is held, slot 0 is assigned again: the
    assignment is taken at the edge after that batch's last return flit (the edge its tokens
    are no longer held), and a third batch waits for the new weights, loaded after its tokens
    came. Last, slot 1's load ends just before slot 0's last h is written
    (:func:`_load_in_before_h`)."""
    bench = await _setup(dut, "stream")
    cfg = bench.cfg
    flits = cfg.header_flits + cfg.x_flits
    queue = 1 if cfg.queue_tokens else 0
    experts, weights = _stream_setup(bench)
    await wait_for(dut, lambda: bench.sources["assign"].idle, 50, "assignments taken")
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
    beats = bench.shape.expert_beats
    bench.load(0, experts[0], weights[0])
    sent = bench.sources["down"].sent_edges
    await wait_for(dut, lambda: len(sent) == cfg.batch * flits and
                   bench.sources["weights"].idle, _budget(bench, cfg.batch), "slot 0 and tokens")
    for slot in range(1, cfg.slots):                # they load while slot 0 computes
        bench.load(slot, experts[slot], weights[slot])
    await wait_for(dut, lambda: len(bench.up.received) >= cfg.batch * flits,
                   _budget(bench, cfg.batch), "the streamed batch")
    loads = bench.sources["weights"].sent_edges[-cfg.slots * beats:]
    loaded = [loads[(slot + 1) * beats - 1] for slot in range(cfg.slots)]
    slot_tokens = [sum(slot in bench.token_slots[t] for t in range(cfg.batch))
                   for slot in range(cfg.slots)]
    edges = golden.chiplet_stream_edges(
        [(slot_tokens, cfg.batch)], bench.shape, cfg.token_banks, flits,
        [sent[cfg.batch * flits - 1] + queue], batch=cfg.batch, batch_wait=cfg.batch_wait,
        loaded=[loaded])
    returned = [edge for edge, _ in bench.up.received]
    assert returned[0] == edges["firsts"][0], \
        f"first return at {returned[0]}, expected {edges['firsts'][0]} (slots {slot_tokens}, " \
        f"loads ending at {loaded}, planner taking the batch at {edges['closes'][0]})"
    assert returned == list(range(returned[0], returned[0] + len(returned))), "a bubble"
    resident = golden.chiplet_stream_edges(
        [(slot_tokens, cfg.batch)], bench.shape, cfg.token_banks, flits,
        [sent[cfg.batch * flits - 1] + queue], batch=cfg.batch, batch_wait=cfg.batch_wait)
    dut._log.info(f"streamed: loads end at {loaded}, planner from {edges['closes'][0]}, "
                  f"first return {returned[0]}; resident: {resident['firsts'][0]}")
    assert edges["firsts"][0] >= resident["firsts"][0]
    if cfg.slots > 1:       # slot 0 computed while the others loaded: sooner than after them
        sequential = loaded[-1] + resident["firsts"][0] - resident["closes"][0]
        assert returned[0] < sequential, (returned[0], sequential)
    await bench.finish(_budget(bench, cfg.batch))

    # A slot held tokens chose is assigned only once they are returned.
    tokens_before = len(bench.board.expected)
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
    await wait_for(dut, lambda: len(sent) == 2 * cfg.batch * flits, _budget(bench, cfg.batch),
                   "a batch held")
    await ClockCycles(dut.clk, 3)                  # its last flit through the input queue
    new = bench.assign(0, experts[0])              # same expert, new weights
    await wait_for(dut, lambda: bench.sources["assign"].idle, _budget(bench, cfg.batch),
                   "the assignment")
    taken = bench.sources["assign"].sent_edges[-1]
    await bench.finish(_budget(bench, cfg.batch))
    last_return = bench.up.received[-1][0]
    assert len(bench.up.received) == len(bench.board.expected) == \
        tokens_before + cfg.batch * flits
    assert taken == last_return + 1, \
        f"assignment taken at {taken}, the held batch's last return at {last_return}"
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
    await ClockCycles(dut.clk, 3 * cfg.batch_wait + 10)     # the batch waits for its weights
    assert len(bench.up.received) == len(bench.board.expected) - cfg.batch * flits
    bench.load(0, experts[0], new)
    await bench.finish(_budget(bench, 2 * cfg.batch))
    assert not dut.error.value
    if cfg.slots > 1 and (cfg.k > 1 or cfg.batch > 1):     # a batch can choose two slots
        await _load_in_before_h(bench)
        assert not dut.error.value


async def _load_in_before_h(bench):
    """Slot 1's load ends just before the tile has written slot 0's last group's h: the
    planner, waiting for slot 1, has not planned that group's held-back down phase (the tile
    is not dry), so slot 1's gate/up goes first, as with every slot resident, and covers the
    wait for h. First return cycle-exact, and sooner than with every slot loaded first."""
    dut, cfg = bench.dut, bench.cfg
    flits = cfg.header_flits + cfg.x_flits
    queue = 1 if cfg.queue_tokens else 0
    experts, weights = _stream_setup(bench)
    await wait_for(dut, lambda: bench.sources["assign"].idle, 50, "assignments taken")
    for slot in [0] + list(range(2, cfg.slots)):
        bench.load(slot, experts[slot], weights[slot])
    last_beat = bench.load(1, experts[1], weights[1], hold_last=True)
    await wait_for(dut, lambda: bench.sources["weights"].idle, _budget(bench, cfg.batch),
                   "the loads but slot 1's last beat")
    first = len(bench.token_slots)
    for index in range(cfg.batch):
        choices = bench.random_choices(held=cfg.k)
        if cfg.k == 1:
            choices[0] = (experts[index % 2], choices[0][1])
        else:
            others = [c for c in choices if c[0] not in experts[:2]]
            choices = [(e, g) for e, (_, g) in zip(experts[:2], choices)] + others[:cfg.k - 2]
        bench.send_token(bench.random_x(), choices)
    sent = bench.sources["down"].sent_edges
    await wait_for(dut, lambda: len(bench.token_slots) == first + cfg.batch and
                   bench.sources["down"].idle, _budget(bench, cfg.batch), "the batch")
    arrival = sent[-1] + queue
    slot_tokens = [sum(slot in bench.token_slots[t] for t in range(first, first + cfg.batch))
                   for slot in range(cfg.slots)]
    resident = golden.chiplet_stream_edges(
        [(slot_tokens, cfg.batch)], bench.shape, cfg.token_banks, flits, [arrival],
        batch=cfg.batch, batch_wait=cfg.batch_wait)
    start = resident["closes"][0]
    held = -(-slot_tokens[0] // cfg.rows) - 1                # slot 0's last group
    h_written = start + golden.chiplet_batch_edges(
        slot_tokens, bench.shape, cfg.batch)["h_written"][held]
    while edge_now() < h_written - 4:
        await RisingEdge(dut.clk)
    bench.sources["weights"].send(last_beat)
    await wait_for(dut, lambda: bench.sources["weights"].idle, 50, "slot 1's last beat")
    loaded = bench.sources["weights"].sent_edges[-1]
    received = len(bench.up.received)
    await wait_for(dut, lambda: len(bench.up.received) >= received + cfg.batch * flits,
                   _budget(bench, cfg.batch), "the batch's returns")
    returned = [edge for edge, _ in bench.up.received[received:]]
    assert start < loaded < h_written, \
        f"slot 1 loaded at {loaded}, the planner took the batch at {start}, h at {h_written}"
    edges = golden.chiplet_stream_edges(
        [(slot_tokens, cfg.batch)], bench.shape, cfg.token_banks, flits, [arrival],
        batch=cfg.batch, batch_wait=cfg.batch_wait,
        loaded=[[loaded if slot == 1 else None for slot in range(cfg.slots)]])
    dut._log.info(f"slot 1 loaded at {loaded} (h at {h_written}), first return {returned[0]}; "
                  f"resident: {resident['firsts'][0]}")
    assert returned[0] == edges["firsts"][0], \
        f"first return at {returned[0]}, expected {edges['firsts'][0]} (slots {slot_tokens})"
    assert returned == list(range(returned[0], returned[0] + len(returned))), "a bubble"
    assert returned[0] < loaded + resident["firsts"][0] - start
    await bench.finish(_budget(bench, cfg.batch))


@cocotb.test()
async def test_weights_stream_under_stalls(dut):
    """Double buffering with long bursts of gaps and stalls on every port: slots assigned,
    tokens dispatched and weights streamed at once, batch after batch, each batch with new
    experts; y exact for every token."""
    bench = await _setup(dut, "stream-stalls", LONG_BURSTS, LONG_BURSTS)
    cfg = bench.cfg
    for round_ in range(3):
        experts, weights = _stream_setup(bench)
        await wait_for(dut, lambda: bench.sources["assign"].idle, _budget(bench, cfg.batch,
                                                                          LONG_BURSTS,
                                                                          LONG_BURSTS),
                       "assignments taken")
        tokens = cfg.batch + round_
        for _ in range(tokens):
            bench.send_token(bench.random_x(), bench.random_choices())
        for slot in range(cfg.slots):
            bench.load(slot, experts[slot], weights[slot])
        await bench.finish(_budget(bench, tokens, LONG_BURSTS, LONG_BURSTS))
    assert not dut.error.value


@cocotb.test()
async def test_reset_while_weights_stream(dut):
    """Reset while a batch waits for its weights and slot 0's load is half done: nothing
    stale after; the slots keep their assigned experts (slot 0 not loaded), and the batch,
    sent again with every slot's weights, computes with them: y exact."""
    bench = await _setup(dut, "stream-reset", 0.2, 0.2)
    cfg = bench.cfg
    experts, weights = _stream_setup(bench)
    await wait_for(dut, lambda: bench.sources["assign"].idle, _budget(bench, 1), "assigned")
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
    sent = bench.sources["weights"].sent_edges
    sent.clear()
    bench.load(0, experts[0], weights[0])
    half = max(1, bench.shape.expert_beats // 2)
    await wait_for(dut, lambda: len(sent) >= half, _budget(bench, cfg.batch, 0.2, 0.2),
                   "half a load")
    await bench.reset(3)
    assert not dut.up__valid.value and not dut.error.value
    assert not bench.up.received
    bench.board.expected.clear()
    for _ in range(cfg.batch):
        bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
    for slot in range(cfg.slots):
        bench.load(slot, experts[slot], weights[slot])
    await bench.finish(_budget(bench, cfg.batch, 0.2, 0.2))
    assert not dut.error.value


@cocotb.test()
async def test_reset_at_a_loads_first_middle_and_last_beat(dut):
    """A reset whose first edge is the edge a load's beat j is offered, for j the second, a
    middle and the last beat (every port ready, so the beat is offered at that edge): the
    beat is not taken (weights and assign are not ready during reset), the slot is left not
    loaded, and the batch, sent again with the load, computes with the whole new weights: y
    exact. (Before, the last beat was taken at the reset edge: the slot was marked loaded, kept
    through reset, while the scratchpad's write pipeline forgot that beat's words.)"""
    bench = await _setup(dut, "load-reset")
    cfg, beats = bench.cfg, bench.shape.expert_beats
    for j in sorted({min(1, beats - 1), beats // 2, beats - 1}):
        experts, weights = _stream_setup(bench)
        await wait_for(dut, lambda: bench.sources["assign"].idle, _budget(bench, 1), "assigned")
        sent = bench.sources["weights"].sent_edges
        sent.clear()
        bench.load(0, experts[0], weights[0])
        await wait_for(dut, lambda: len(sent) >= j, _budget(bench, 1), f"{j} beats")
        dut.rst.value = 1                    # its first edge: the one beat j is offered at
        await ReadOnly()
        assert dut.weights__valid.value == 1, f"beat {j} not offered at the reset edge"
        assert dut.weights__ready.value == 0, "weights ready at a reset edge"
        assert dut.assign__ready.value == 0, "assign ready at a reset edge"
        await RisingEdge(dut.clk)
        dut.rst.value = 0
        for port in bench.sinks.values():
            port.received.clear()
        bench.board.expected.clear()
        for _ in range(cfg.batch):
            bench.send_token(bench.random_x(), _choosing(bench, experts[0]))
        for slot in range(cfg.slots):
            bench.load(slot, experts[slot], weights[slot])
        await bench.finish(_budget(bench, cfg.batch))
    assert not dut.error.value


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Every port saturated, weights resident: PE utilization of full batches (MACs of the
    chosen experts over PEs x cycles from the first flit in to the last flit out)."""
    bench = await _setup(dut, "throughput")
    cfg = bench.cfg
    batches = 4
    tokens = batches * cfg.batch
    for _ in range(tokens):
        bench.send_token(bench.random_x(), bench.random_choices(held=min(cfg.k, cfg.slots)))
    began = time.perf_counter()
    await bench.finish(_budget(bench, tokens))
    wall = time.perf_counter() - began
    first = bench.sources["down"].sent_edges[0]
    last = bench.up.received[-1][0]
    cycles = last - first + 1
    macs = tokens * min(cfg.k, cfg.slots) * golden.expert_macs(cfg.d_model, cfg.d_ff)
    metrics = {"tokens": tokens, "cycles": cycles,
               "pe_utilization": round(macs / (cycles * bench.shape.pes), 4)}
    write_throughput(metrics, "one batch after another, weights resident", cycles / wall,
                     operations=macs)
