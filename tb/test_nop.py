"""cocotb tests of ``nop_switch`` and ``nop_tree`` against ``golden.nop``.

A ``nop_switch`` is a tree of one level (its children are the leaves), so one bench drives both:
a source on the root's ``down_in``, a sink on ``up_out``, and per leaf a sink on ``down_out[i]``
plus a leaf model that returns one packet per packet received (lane ``j`` of flit ``f`` is a
function of leaf, token, data), in a random order among its pending packets, after random delays.
Every check compares against the golden model: the packets each leaf received, the combined
packet of every token (exactly once), and the flits counted on every link.
"""

import math
import random
import time

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from golden import placement
from golden import fixed
from golden import fp
from golden import nop as golden
from golden import router as golden_router
from hw import nop as hw_nop
from tb.harness import (dut_manifest, load_dut_config, long_enough_to_time, make_rng,
                        write_throughput)
from tb.streams import (STALL_PROFILES, HeldPauses, StreamBench, edge_now, reset_dut,
                        start_after_reset, start_clock, wait_for)

TRACE_K = 2          # experts per token of the synthetic placement trace


def leaf_output(leaf, packet, combine_dtype="int"):
    """What leaf ``leaf`` returns for ``packet``: its experts' weighted output, modelled as
    ``data * (leaf + 1) + token - flit``, exact integers (the switch wraps the sums); in a
    floating-point combine, :func:`float_lane` codes."""
    if combine_dtype != "int":
        return [[float_lane(leaf, packet["token"], index, lane, value, combine_dtype)
                 for lane, value in enumerate(flit)]
                for index, flit in enumerate(packet["flits"])]
    return [[value * (leaf + 1) + packet["token"] - index for value in flit]
            for index, flit in enumerate(packet["flits"])]


def float_lane(leaf, token, index, lane, value, dtype):
    """A BF16/FP32 code, a function of where it goes (reproducible): mostly values within 2**24
    of a per-lane scale (alignment, carries, near-cancellation), some the exact negative of the
    lane's first leaf's (cancellation to +0), and rarely a special: signed zero, the largest
    finite (a sum saturates), the smallest subnormal and normal, infinity, NaN."""
    fmt = fp.FORMATS[dtype]
    sign = 1 << (fmt.width - 1)
    where = f"{token}:{index}:{lane}:{value}"
    shared = random.Random(where)
    rng = random.Random(f"{leaf}:{where}")
    scale = shared.randint(-140, 120)
    base = fp.encode(shared.uniform(1, 2) * 2.0 ** scale, dtype) | shared.choice([0, sign])
    pick = rng.random()
    if pick < 0.03:
        infinity = ((1 << fmt.exp_bits) - 1) << fmt.man_bits
        return rng.choice([0, sign, fmt.max_code, 1, 1 << fmt.man_bits, infinity,
                           fmt.canonical_nan]) | rng.choice([0, sign])
    if pick < 0.15:
        return base ^ (sign if leaf % 2 else 0)
    value = rng.uniform(1, 2) * 2.0 ** (scale + rng.randint(-24, 3))
    return fp.encode(-value if rng.random() < 0.5 else value, dtype)


class TreeBench(StreamBench):
    """Root source/sink, per-leaf sinks and leaf models, link monitors."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0, return_delay=(0, 6)):
        leaves = golden.leaf_count(tuple(config.fanouts))
        super().__init__(dut, component, rng,
                         ["down_in"] + [f"up_in__{i}" for i in range(leaves)],
                         ["up_out"] + [f"down_out__{i}" for i in range(leaves)], gap, stall,
                         always_ready=[f"up_in__{i}" for i in range(leaves)])
        self.cfg = config
        self.fanouts = tuple(config.fanouts)
        self.leaves = leaves
        self.root, self.combined = self.sources["down_in"], self.sinks["up_out"]
        self.leaf_in = [self.sinks[f"down_out__{i}"] for i in range(leaves)]
        self.leaf_out = [self.sources[f"up_in__{i}"] for i in range(leaves)]
        self.return_delay = return_delay
        self.hold_returns = False
        self.in_order = False          # return pending packets oldest first (else shuffled)
        self._queued = [0] * self.leaves
        self.packets = []
        self.internal = len(golden.internal_links(self.fanouts))
        self.down_link_flits = [0] * self.internal
        self.up_link_flits = [0] * self.internal
        self.leaf_return_edges = {}        # (leaf, token) -> edge of the last return flit
        self.return_lengths = {}           # (leaf, token) -> flits returned, when not the packet's
        self.duplicates = set()            # (leaf, token) returned twice, back to back
        self.held_leaves = set()           # leaves holding their returns (as hold_returns)
        self._tasks = []
        for name in ("down_link_flip", "up_link_flip"):       # fault injection: none here
            if hasattr(dut, name):
                getattr(dut, name).value = 0

    # --- traffic ---
    def random_packet(self, token, mask=None, flits=None):
        cfg = self.cfg
        if mask is None:
            mask = self.rng.randint(1, (1 << self.leaves) - 1)
        flits = flits or self.rng.randint(1, cfg.max_flits)
        low, high = fixed.signed_limits(cfg.data_width)
        data = [[self.rng.randint(low, high) for _ in range(cfg.lanes)] for _ in range(flits)]
        return {"token": token % (1 << cfg.token_width), "mask": mask, "flits": data}

    def send(self, packet):
        self.packets.append(packet)
        for index, flit in enumerate(packet["flits"]):
            self.root.send({"token": packet["token"], "mask": packet["mask"], "data": flit,
                            "last": int(index == len(packet["flits"]) - 1)})

    # --- processes ---
    def start(self):
        super().start()
        self._tasks = [cocotb.start_soon(self._leaf(i)) for i in range(self.leaves)]
        if self.internal:
            self._tasks.append(cocotb.start_soon(self._count_links()))

    def stop(self):
        for task in self._tasks:
            task.cancel()
        super().stop()

    async def _count_links(self):
        while True:
            await RisingEdge(self.dut.clk)
            down = self.dut.down_link_fire.value.to_unsigned()
            up = self.dut.up_link_fire.value.to_unsigned()
            for link in range(self.internal):
                self.down_link_flits[link] += (down >> link) & 1
                self.up_link_flits[link] += (up >> link) & 1

    async def _leaf(self, leaf):
        """Collect whole packets; return them in random order after random delays."""
        sink, source = self.leaf_in[leaf], self.leaf_out[leaf]
        seen, pending, current = 0, [], []
        while True:
            await RisingEdge(self.dut.clk)
            while seen < len(sink.received):
                _, flit = sink.received[seen]
                seen += 1
                if getattr(flit, "abort", 0):
                    current = []         # the tree voided the packet: nothing is owed for it
                    continue
                current.append([int(x) for x in flit.data])
                if flit.last:
                    token = int(flit.token)
                    due = edge_now() + self.rng.randint(*self.return_delay)
                    pending.append((due, {"token": token, "flits": current}))
                    current = []
            if self.hold_returns or leaf in self.held_leaves:
                continue
            ready = [p for p in pending if p[0] <= edge_now()]
            if not self.in_order:
                self.rng.shuffle(ready)
            # Whole packets are queued back to back: a link never interleaves two packets.
            for choice in ready:
                pending.remove(choice)
                packet = choice[1]
                output = self.returned(leaf, packet)
                for index, flit in enumerate(output):
                    source.send({"token": packet["token"], "data": flit,
                                 "last": int(index == len(output) - 1)})
                self._queued[leaf] += len(output)
                cocotb.start_soon(self._note_return(leaf, packet["token"], self._queued[leaf]))
                if (leaf, packet["token"]) in self.duplicates:
                    # The same return again, other data, right behind the first (misuse).
                    for index in range(len(output)):
                        source.send({"token": packet["token"], "data": self._junk_flit(),
                                     "last": int(index == len(output) - 1)})
                    self._queued[leaf] += len(output)

    def returned(self, leaf, packet):
        """What ``leaf`` returns for ``packet``: :func:`leaf_output`, cut short or padded with
        extra flits where a test set ``return_lengths`` (a misbehaving leaf)."""
        output = leaf_output(leaf, packet, self.cfg.combine_dtype)
        length = self.return_lengths.get((leaf, packet["token"]), len(output))
        extra = [self._junk_flit() for _ in range(max(0, length - len(output)))]
        return (output + extra)[:length]

    def _junk_flit(self):
        return [self.rng.randint(-99, 99) if self.cfg.combine_dtype == "int" else
                self.rng.randrange(1 << self.cfg.acc_width) for _ in range(self.cfg.lanes)]

    async def _note_return(self, leaf, token, sent_count):
        source = self.leaf_out[leaf]
        while len(source.sent_edges) < sent_count:
            await RisingEdge(self.dut.clk)
        self.leaf_return_edges[(leaf, token)] = source.sent_edges[sent_count - 1]

    # --- checks ---
    def combined_packets(self):
        """Root output split into packets: list of (token, flits, first edge)."""
        out, current, first = [], [], None
        for edge, flit in self.combined.received:
            first = edge if not current else first
            current.append([int(x) for x in flit.data])
            if flit.last:
                out.append((int(flit.token), current, first))
                current = []
        return out

    async def drain(self, max_cycles=20000):
        await wait_for(self.dut, lambda: len(self.combined_packets()) == len(self.packets),
                       max_cycles, "every token combined at the root")
        await ClockCycles(self.dut.clk, 10)

    def check(self):
        packets = self.packets
        # Leaves: exactly the golden packets, in dispatch order, each once.
        for leaf, indices in enumerate(golden.deliveries(packets, self.fanouts)):
            want = []
            for i in indices:
                p = packets[i]
                want += [(p["token"], p["mask"], flit, int(k == len(p["flits"]) - 1))
                         for k, flit in enumerate(p["flits"])]
            got = [(int(f.token), int(f.mask), [int(x) for x in f.data], int(f.last))
                   for _, f in self.leaf_in[leaf].received]
            assert got == want, f"leaf {leaf}: received {len(got)} flits, expected {len(want)}"
        self.check_sums()
        # Links: flits seen on every link equal the golden count, down and up.
        counts = golden.link_flits(packets, self.fanouts)
        assert len(self.root.sent_edges) == counts["root"]
        assert len(self.combined.received) == counts["root"]
        assert [len(s.received) for s in self.leaf_in] == counts["leaf"]
        assert [len(s.sent_edges) for s in self.leaf_out] == counts["leaf"]
        assert self.down_link_flits == counts["internal"], self.down_link_flits
        assert self.up_link_flits == counts["internal"], self.up_link_flits
        assert self.dut.error.value == 0

    def check_sums(self):
        """Root: one combined packet per token with the golden sums (order is free)."""
        packets = self.packets
        expected = golden.combine(packets, self.returned, self.cfg.acc_width,
                                  self.cfg.combine_dtype, self.fanouts)
        want = sorted((p["token"], flits) for p, flits in zip(packets, expected))
        got = sorted((token, flits) for token, flits, _ in self.combined_packets())
        assert got == want, "combined packets differ from the golden sums"


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    rng = make_rng(salt)
    return TreeBench(dut, config, component, rng, **kwargs)


def _special_masks(bench):
    """One leaf, all leaves, every leaf under the first child, and two leaves of one child."""
    leaves, span = bench.leaves, bench.leaves // bench.fanouts[0]
    masks = [1, 1 << (leaves - 1), (1 << leaves) - 1, (1 << span) - 1]
    if span >= 2:
        masks.append(0b11 << (leaves - 2))
    else:
        masks.append(0b101 if leaves > 2 else 0b11)
    return masks


@cocotb.test()
async def test_dispatch_cycle_exact(dut):
    """No stalls: every flit reaches its leaves exactly depth hops after the root took it, the
    root takes one flit per cycle, and each packet reaches each destination leaf once."""
    bench = _setup(dut, "exact", return_delay=(0, 0))
    await start_after_reset(dut, bench)
    token = 0
    for mask in _special_masks(bench):
        for flits in (1, bench.cfg.max_flits):
            bench.send(bench.random_packet(token, mask, flits))
            token += 1
    await bench.drain()
    bench.check()
    root_edges = bench.root.sent_edges
    for leaf, indices in enumerate(golden.deliveries(bench.packets, bench.fanouts)):
        flit_ids = []
        position = 0
        for i, p in enumerate(bench.packets):
            count = len(p["flits"])
            if i in indices:
                flit_ids += range(position, position + count)
            position += count
        want = golden.dispatch_edges([root_edges[f] for f in flit_ids], bench.fanouts)
        assert [e for e, _ in bench.leaf_in[leaf].received] == want, f"leaf {leaf} edges"


@cocotb.test()
async def test_combine_round_robin_slot_order(dut):
    """Slots that complete on one edge leave in round-robin slot order from the slot after the
    last one emitted (docs/blocks/nop.md), not lowest slot first."""
    bench = _setup(dut, "round-robin", return_delay=(0, 0))
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    span = bench.leaves // bench.fanouts[0]
    flits = cfg.max_flits
    # Token 0 uses root slot 0 and leaves: the root's pointer moves to slot 1.
    bench.send(bench.random_packet(0, mask=1, flits=flits))
    await bench.drain()
    count = min(cfg.max_inflight, bench.fanouts[0])
    bench.hold_returns = True
    # token 10 + j (its id: modulo 2**token_width) takes root slot j
    tokens = [(10 + j) % (1 << cfg.token_width) for j in range(count)]
    for j, token in enumerate(tokens):
        bench.send(bench.random_packet(token, mask=1 << (j * span), flits=flits))
    await wait_for(dut, lambda: sum(len(s.received) for s in bench.leaf_in)
                   == flits * (count + 1), 200 + 20 * count, "every packet at its leaf")
    bench.hold_returns = False                       # every leaf returns on the same edges
    await bench.drain()
    bench.check_sums()
    order = [token for token, _, _ in bench.combined_packets()[1:]]
    pointer = 1 % cfg.max_inflight
    want = [tokens[(pointer + i) % count] for i in range(count)] if pointer < count else tokens
    assert order == want, f"emitted {order}, round-robin from slot {pointer} gives {want}"


@cocotb.test()
async def test_combine_round_robin_from_every_pointer(dut):
    """In every switch of the tree (the root first): for every slot i below the last, the
    pointer set to i + 1 (slot i the last one chosen) and slots i and i + 1 completing on one
    edge, slot i + 1 leaves first (slot i is before the pointer). Three leaves under distinct
    children of that switch: H holds the returns of slots 0..i-1, R1 and R2 those of slots i
    and i + 1 (two children: i = 0 only). Every token passes every switch on its way, so each
    switch on the path has the same slots taken; a lower switch's order is the root's."""
    bench = _setup(dut, "round-robin-pointer", return_delay=(0, 0))
    await start_after_reset(dut, bench)
    cfg = bench.cfg
    token = 0

    def send(leaf):
        nonlocal token
        token = (token + 1) % (1 << cfg.token_width)
        bench.send(bench.random_packet(token, mask=1 << leaf, flits=1))
        return token

    def combined():
        return [t for t, _, _ in bench.combined_packets()]

    def last_token_at(leaf):
        received = bench.leaf_in[leaf].received
        return int(received[-1][1].token) if received else None

    switches = []                                   # (level, first leaf under the switch)
    for level in range(len(bench.fanouts)):
        under = bench.leaves // math.prod(bench.fanouts[:level])     # leaves under one switch
        switches += [(level, base) for base in range(0, bench.leaves, under)]
    for level, base in switches:
        children = bench.fanouts[level]
        span = bench.leaves // math.prod(bench.fanouts[:level + 1])
        if cfg.max_inflight < 2 or children < 2:
            continue                                # no two slots or children to order
        first, second = base, base + span
        hold = base + 2 * span if children >= 3 else None
        # i + 3 consecutive ids are in flight or just left: distinct within 2**token_width.
        rounds = min(cfg.max_inflight - 1, (1 << cfg.token_width) - 2) if hold is not None \
            else 1
        for i in range(rounds):
            held = {hold} - {None}
            bench.held_leaves = set(held)
            for _ in range(i):                      # slots 0..i-1, held at H
                send(hold)
            done = len(combined())
            send(first)                             # slot i: returns and leaves at once
            await wait_for(dut, lambda: len(combined()) == done + 1, 400, "slot i combined")
            bench.held_leaves = held | {first, second}
            a, b = send(first), send(second)        # slots i and i + 1
            await wait_for(dut, lambda: (last_token_at(first), last_token_at(second)) ==
                           (a, b), 400, "both packets at their leaves")
            bench.held_leaves = set(held)           # R1 and R2 return on the same edges
            await wait_for(dut, lambda: len(combined()) == done + 3, 400,
                           "slots i, i + 1 combined")
            assert combined()[-2:] == [b, a], (
                f"switch over leaves {base}.., pointer {i + 1}: slot {i + 1} (token {b}) should "
                f"leave before slot {i} ({a})")
            bench.held_leaves = set()
            await bench.drain()
    bench.check_sums()


@cocotb.test()
async def test_combine_latency_one_token_at_a_time(dut):
    """One token in flight: the combined packet leaves the root at the golden edge (each switch
    emits COMBINE_HOP_CYCLES after its last owed child's last flit)."""
    bench = _setup(dut, "latency", return_delay=(0, 5))
    await start_after_reset(dut, bench)
    masks = _special_masks(bench) + [bench.rng.randint(1, (1 << bench.leaves) - 1)
                                     for _ in range(4)]
    for token, mask in enumerate(masks):
        packet = bench.random_packet(token, mask)
        bench.send(packet)
        await wait_for(dut, lambda: len(bench.combined_packets()) == token + 1, 2000, "combine")
        _, _, first = bench.combined_packets()[-1]
        leaf_edges = {leaf: bench.leaf_return_edges[(leaf, packet["token"])]
                      for leaf in range(bench.leaves) if (mask >> leaf) & 1}
        want = golden.combine_first_edge(mask, leaf_edges, len(packet["flits"]), bench.fanouts)
        assert first == want, f"token {token}: first combined flit at {first}, golden {want}"
    await ClockCycles(dut.clk, 5)
    bench.check()


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_traffic(dut, gap, stall):
    """Random masks and lengths, out-of-order returns interleaved across leaves, random valid
    gaps and ready stalls on every port; the golden deliveries, sums and link counts."""
    bench = _setup(dut, f"random:{gap}:{stall}", gap=gap, stall=stall, return_delay=(0, 12))
    await start_after_reset(dut, bench)
    # Ids drawn over the whole token width, so every bit of every slot's token register meets
    # the return lookup's compare; distinct within each run of 2**token_width packets.
    ids = list(range(1 << bench.cfg.token_width))
    bench.rng.shuffle(ids)
    for j in range(60):
        bench.send(bench.random_packet(ids[j % len(ids)]))
    # Long bursts of stalls on every port: 40k cycles are enough for packets of up to 4 flits;
    # the budget grows with the longest packet (60 packets of up to 64 flits take longer).
    await bench.drain(max_cycles=40000 * max(1, bench.cfg.max_flits // 4))
    bench.check()
    bench.stop()


@cocotb.test()
async def test_table_full_backpressure(dut):
    """With the leaves holding their returns, the root accepts exactly max_inflight packets and
    then waits (never drops); released, every token combines once. The packets that fill the
    table go to every leaf, so every slot is owed a return by every child (each slot's place
    in each child's return buffer is written and read)."""
    bench = _setup(dut, "full")
    start_clock(dut)
    await reset_dut(dut)
    bench.hold_returns = True
    bench.start()
    cfg = bench.cfg
    for token in range(cfg.max_inflight + 3):
        mask = (1 << bench.leaves) - 1 if token < cfg.max_inflight else None
        bench.send(bench.random_packet(token, mask=mask, flits=1))
    await ClockCycles(dut.clk, 40 + 4 * cfg.max_inflight)
    assert len(bench.root.sent_edges) == cfg.max_inflight
    assert dut.down_in__valid.value == 1 and dut.down_in__ready.value == 0
    bench.hold_returns = False
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_repeated_token_waits(dut):
    """A token id still in flight is not dispatched again until its first instance combined,
    whichever slot holds it: slots 0..s filled (lowest free first), then slot s's token again."""
    bench = _setup(dut, "repeat")
    start_clock(dut)
    await reset_dut(dut)
    bench.start()
    cfg = bench.cfg
    for held in range(min(cfg.max_inflight, 1 << cfg.token_width)):   # distinct ids
        bench.hold_returns = True
        before = len(bench.root.sent_edges)
        tokens = [(7 + 10 * held + j) % (1 << cfg.token_width) for j in range(held + 1)]
        for token in tokens:
            bench.send(bench.random_packet(token, flits=1))
        bench.send(bench.random_packet(tokens[-1], flits=1))
        await ClockCycles(dut.clk, 30 + 2 * held)
        assert len(bench.root.sent_edges) - before == held + 1, f"slot {held}'s token again"
        bench.hold_returns = False
        await bench.drain()
    bench.check()


@cocotb.test()
async def test_reset_mid_packet(dut):
    """Reset while packets are in the tree; afterwards traffic is exact again."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.2)
    await start_after_reset(dut, bench)
    for token in range(6):
        bench.send(bench.random_packet(token, flits=bench.cfg.max_flits))
    await ClockCycles(dut.clk, 3 + bench.cfg.max_flits)
    bench.stop()
    await reset_dut(dut)
    bench = _setup(dut, "reset-after", gap=0.2, stall=0.2)
    bench.start()
    for token in range(20):
        bench.send(bench.random_packet(token))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_protocol_misuse_sets_sticky_error(dut):
    """A packet with an empty mask is consumed and dropped; a return for a token nobody owes
    (on each leaf in turn) is dropped; both raise the sticky error, and the tree keeps
    working."""
    bench = _setup(dut, "misuse")
    await start_after_reset(dut, bench)
    bench.root.send({"token": 1, "mask": 0, "data": [0] * bench.cfg.lanes, "last": 1})
    await wait_for(dut, lambda: bench.root.idle, 100, "empty-mask packet consumed")
    await ClockCycles(dut.clk, 3)
    assert dut.error.value == 1
    assert all(not s.received for s in bench.leaf_in)
    for leaf in range(bench.leaves):             # every child port's check, one at a time
        await reset_dut(dut)
        assert dut.error.value == 0
        bench.leaf_out[leaf].send({"token": 9, "data": [1] * bench.cfg.lanes, "last": 1})
        await wait_for(dut, lambda: bench.leaf_out[leaf].idle, 100, "stray return consumed")
        await ClockCycles(dut.clk, 3)
        assert dut.error.value == 1, f"a stray return on leaf {leaf} set no error"
        assert not bench.combined.received
    await reset_dut(dut)
    bench.stop()
    bench = _setup(dut, "misuse-after")
    bench.start()
    for token in range(8):
        bench.send(bench.random_packet(token))
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_wrong_length_returns_are_dropped(dut):
    """Returns one flit short, one flit long and longer than P: each is left out of the sum
    (no stale buffer word, no extra flit reaches the root), the slot completes with the
    dispatched length, error is set, and traffic around them is summed correctly."""
    bench = _setup(dut, "wrong-length")
    await start_after_reset(dut, bench)
    P = bench.cfg.max_flits
    # Fill every slot's buffer with old data first, so a short return would expose it; the
    # fill is checked and forgotten (the cases below may reuse its token ids).
    for token in range(bench.cfg.max_inflight):
        bench.send(bench.random_packet(token, mask=(1 << bench.leaves) - 1, flits=P))
    await bench.drain()
    bench.check_sums()
    bench.packets.clear()
    bench.combined.received.clear()
    cases = [(0, P - 1), (bench.leaves - 1, P + 1), (bench.leaves // 2, P + 3)]
    if P == 1:
        cases[0] = (0, 2)
    for index, (leaf, length) in enumerate(cases):
        token = 40 + index
        bench.return_lengths[(leaf, token % (1 << bench.cfg.token_width))] = length
        bench.send(bench.random_packet(token, mask=(1 << bench.leaves) - 1, flits=P))
        bench.send(bench.random_packet(token + 10))                  # good traffic around it
    await bench.drain()
    bench.check_sums()
    assert dut.error.value == 1


@cocotb.test()
async def test_duplicate_returns_are_dropped(dut):
    """Every leaf returns every packet twice, the second copy (other data) right behind the
    first: a return nobody owes any more from the edge the first one's last flit is taken, so
    it is dropped (error), whichever slot and child it hits. P-flit packets fill every slot;
    one leaf of each lowest switch (its last child, then its first) returns only after the
    others' copies are in, so those copies meet slots still waiting. Every token combines
    once with the first copies' sums."""
    bench = _setup(dut, "duplicates", return_delay=(0, 0))
    await start_after_reset(dut, bench)
    cfg, span = bench.cfg, bench.fanouts[-1]
    bench.in_order = True
    count = min(cfg.max_inflight, 1 << cfg.token_width)
    for late in (span - 1, 0):
        bench.hold_returns = True
        first = len(bench.packets)
        for token in range(first, first + count):         # every slot, owed by every leaf
            packet = bench.random_packet(token, mask=(1 << bench.leaves) - 1,
                                         flits=cfg.max_flits)
            bench.send(packet)
            bench.duplicates |= {(leaf, packet["token"]) for leaf in range(bench.leaves)}
        await wait_for(dut, lambda: len(bench.root.sent_edges) == sum(
            len(p["flits"]) for p in bench.packets), 100 + 20 * count * cfg.max_flits,
            "every packet dispatched")
        bench.held_leaves = set(range(late, bench.leaves, span))
        bench.hold_returns = False
        await ClockCycles(dut.clk, 20 + 2 * count * cfg.max_flits)    # the others' copies in
        assert len(bench.combined_packets()) == first
        bench.held_leaves = set()
        await bench.drain()
        bench.check_sums()
        assert dut.error.value == 1


def _placement_masks(bench, clustered):
    """Destination masks of a synthetic routing trace under round-robin or clustered placement
    of 4 experts per leaf (top-2 of 4*leaves experts)."""
    experts, k = 4 * bench.leaves, TRACE_K
    trace = golden_router.synthetic_trace(tokens=48, experts=experts, k=k,
                                          clusters=bench.leaves, seed=5)
    groups = bench.fanouts[0]
    if clustered:
        table = placement.place(trace, experts, bench.leaves, groups).expert_to_leaf
    else:
        table = placement.round_robin(experts, bench.leaves)
    return [golden_router.leaf_mask(row, table) for row in trace]


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Saturation and placement figures, each asserted against the golden model.

    Burst: max_inflight packets to every leaf, one flit per cycle on the root and leaf links;
    the leaves then return them oldest first, and the root emits one combined flit per cycle.
    Continuous: 4 * max_inflight packets with immediate returns (bounded by the round trip
    against max_inflight). Placement: r on the leaves for two placements of a synthetic trace.
    """
    bench = _setup(dut, "throughput", return_delay=(0, 0))
    cfg = bench.cfg
    start_clock(dut)
    await reset_dut(dut)
    bench.in_order, bench.hold_returns = True, True
    bench.start()
    began = time.perf_counter()
    cycles_before = edge_now()
    all_leaves = (1 << bench.leaves) - 1
    burst_flits = cfg.max_inflight * cfg.max_flits
    for token in range(cfg.max_inflight):
        bench.send(bench.random_packet(token, all_leaves, cfg.max_flits))
    await wait_for(dut, lambda: all(len(s.received) == burst_flits for s in bench.leaf_in),
                   1000, "burst at the leaves")

    def rate(edges):
        return len(edges) / (edges[-1] - edges[0] + 1)

    dispatch_rate = rate(bench.root.sent_edges)
    leaf_edges = [e for e, _ in bench.leaf_in[bench.leaves - 1].received]
    latency = leaf_edges[0] - bench.root.sent_edges[0]
    assert dispatch_rate == 1.0 and rate(leaf_edges) == 1.0
    assert latency == golden.dispatch_edges([0], bench.fanouts)[0]
    bench.hold_returns = False
    await bench.drain()
    bench.check()
    combine_rate = rate([e for e, _ in bench.combined.received])
    assert combine_rate == 1.0

    continuous = _setup(dut, "continuous", return_delay=(0, 0))
    bench.stop()
    continuous.in_order = True
    continuous.start()
    for token in range(4 * cfg.max_inflight):
        continuous.send(continuous.random_packet(token, all_leaves, cfg.max_flits))
    await continuous.drain()
    continuous.check()
    flits = bench.transfers() + continuous.transfers()      # at the block's ports
    continuous_rate = rate(continuous.root.sent_edges)
    # Round trip of the first token: its first flit in at the root to its last combined flit out
    # (its slot frees one cycle earlier). One packet enters per max_flits cycles, so slots for
    # round_trip cycles' worth of packets keep the root busy (Little's law).
    round_trip = (continuous.combined.received[cfg.max_flits - 1][0]
                  - continuous.root.sent_edges[0] + 1)
    if cfg.max_inflight * cfg.max_flits >= round_trip:
        assert continuous_rate == 1.0, (continuous_rate, round_trip)
    continuous.stop()

    rates = {}
    for clustered in (False, True):
        placed = _setup(dut, f"placement{clustered}", return_delay=(0, 0))
        placed.start()
        masks = _placement_masks(placed, clustered)
        for token, mask in enumerate(masks):
            placed.send(placed.random_packet(token, mask, 1))
        await placed.drain()
        placed.check()
        flits += placed.transfers()
        measured = sum(len(s.received) for s in placed.leaf_in) / len(masks)
        assert measured == golden.replication(masks)
        rates["r_clustered" if clustered else "r_round_robin"] = round(measured, 3)
        if clustered:
            # Root-link flits per token of the combine phase: forwarding every expert's output
            # (k), forwarding every leaf's local sum (r), and in-network combine (measured).
            combined = len(placed.combined.received) / len(masks)
            assert combined == 1.0
            leaf_forwarding = golden.forwarding_root_flits(placed.packets) / len(masks)
            rates["root_flits_per_token_k/r/combined"] = (
                f"{TRACE_K}/{round(leaf_forwarding, 3)}/{combined}")
        placed.stop()
    elapsed = time.perf_counter() - began
    write_throughput(
        {"burst_flits_per_cycle_root_leaf_combine": f"{dispatch_rate}/{rate(leaf_edges)}/"
                                                    f"{combine_rate}",
         "continuous_root_flits_per_cycle": round(continuous_rate, 3),
         "round_trip_cycles": round_trip,
         "dispatch_latency_cycles": latency,
         **rates},
        "flits per cycle on a link, cycles, r (leaf copies per token) for round-robin vs "
        "clustered placement, root-link flits per token without/with in-network combine",
        (edge_now() - cycles_before) / elapsed, operations=flits)


# ---- link_check: fault injection (only in trees built with fault_inject=1) -------------------

class FaultInjector:
    """Flips bits of random switch-to-switch links for one cycle at a time: a single bit with
    ``parity``, a burst of 1 to 8 adjacent bits with ``crc8`` (anywhere in the link word, check
    bits included). A flip counts as a fault when the link transfers a flit in that cycle (its
    ``*_link_fire`` tap); the tree must then report it on that link's counter."""

    def __init__(self, bench, probability):
        self.bench, self.dut, self.rng = bench, bench.dut, bench.rng
        self.probability = probability
        self.links = bench.internal
        layouts = {"down": hw_nop.down_layout(bench.cfg, True),
                   "up": hw_nop.up_layout(bench.cfg, True)}
        self.width = {d: layout.size for d, layout in layouts.items()}
        self.faults = {"down": [0] * self.links, "up": [0] * self.links}
        self.bursts = []        # (direction, link, offset, length) of every fault
        self.running = False
        self._task = None

    def start(self):
        self.running = True
        self._task = cocotb.start_soon(self._run())

    async def stop(self):
        self.running = False
        await ClockCycles(self.dut.clk, 2)
        self._task.cancel()
        self.dut.down_link_flip.value = 0
        self.dut.up_link_flip.value = 0

    def _burst(self, direction):
        width = self.width[direction]
        length = 1 if self.bench.cfg.link_check == "parity" else self.rng.randint(1, min(8, width))
        offset = self.rng.randint(0, width - length)
        return offset, length

    async def _run(self):
        while True:
            await RisingEdge(self.dut.clk)
            if not self.running or self.rng.random() >= self.probability:
                continue
            direction = self.rng.choice(("down", "up"))
            link = self.rng.randrange(self.links)
            offset, length = self._burst(direction)
            word = ((1 << length) - 1) << (offset + link * self.width[direction])
            port = getattr(self.dut, f"{direction}_link_flip")
            port.value = word
            await RisingEdge(self.dut.clk)
            port.value = 0
            fired = getattr(self.dut, f"{direction}_link_fire").value.to_unsigned() >> link & 1
            if fired:
                self.faults[direction][link] += 1
                self.bursts.append((direction, link, offset, length))

    def counted(self):
        """The tree's per-link error counts, down and up."""
        out = {}
        for direction in ("down", "up"):
            bits = getattr(self.dut, f"{direction}_link_errors").value.to_unsigned()
            width = hw_nop.ERROR_COUNT_WIDTH
            out[direction] = [(bits >> (link * width)) & ((1 << width) - 1)
                              for link in range(self.links)]
        return out


def check_faulty_run(bench):
    """After faults: nothing corrupted left the tree. Each token leaves the root once, either
    as the golden combine or as one abort flit (data zero); each leaf received golden packets
    in dispatch order, some missing and some cut short by an abort flit (data zero), and a
    token whose packet did not reach every leaf whole is aborted at the root. Returns the
    number of aborted tokens."""
    packets = bench.packets
    sums = golden.combine(packets, bench.returned, bench.cfg.acc_width, bench.cfg.combine_dtype,
                          bench.fanouts)
    outcome = {}
    current = []
    for _, flit in bench.combined.received:
        current.append(flit)
        if flit.last:
            token = int(current[0].token)
            assert token not in outcome, f"token {token} left the root twice"
            if current[-1].abort:
                assert len(current) == 1 and all(int(v) == 0 for v in current[0].data), (
                    f"token {token}: an abort must be one flit of zero data")
                outcome[token] = "abort"
            else:
                assert not any(f.abort for f in current)
                outcome[token] = [[int(v) for v in f.data] for f in current]
            current = []
    assert not current, "the root output ends inside a packet"
    assert sorted(outcome) == sorted(p["token"] for p in packets), "a token was lost"
    whole = {p["token"]: True for p in packets}
    for leaf, indices in enumerate(golden.deliveries(packets, bench.fanouts)):
        got, packet = [], []
        for _, flit in bench.leaf_in[leaf].received:
            packet.append(flit)
            if flit.last:
                got.append(packet)
                packet = []
        assert not packet, f"leaf {leaf}: its flits end inside a packet"
        position = 0
        for received in got:
            token = int(received[0].token)
            while position < len(indices) and packets[indices[position]]["token"] != token:
                whole[packets[indices[position]]["token"]] = False      # never arrived
                position += 1
            assert position < len(indices), f"leaf {leaf}: token {token} out of order or stray"
            want = packets[indices[position]]
            position += 1
            flits = [(int(f.token), int(f.mask), [int(v) for v in f.data]) for f in received]
            expect = [(want["token"], want["mask"], data) for data in want["flits"]]
            if received[-1].abort:
                whole[token] = False
                assert flits[-1] == (want["token"], want["mask"], [0] * bench.cfg.lanes)
                assert flits[:-1] == expect[:len(flits) - 1], (
                    f"leaf {leaf}: token {token} corrupted")
                assert len(flits) - 1 < len(expect)
            else:
                assert flits == expect, f"leaf {leaf}: token {token} corrupted"
        for index in indices[position:]:
            whole[packets[index]["token"]] = False
    for packet, flits in zip(packets, sums):
        token = packet["token"]
        if outcome[token] != "abort":
            assert whole[token], f"token {token} combined though a leaf missed its packet"
            assert outcome[token] == flits, f"token {token}: combined sums differ from golden"
    assert bench.dut.error.value == 0
    return sum(1 for value in outcome.values() if value == "abort")


if dut_manifest()["params"].get("fault_inject"):
    @cocotb.test()
    @cocotb.parametrize((("gap", "stall"), [STALL_PROFILES[0], STALL_PROFILES[-1]]))
    async def test_link_faults_are_detected_dropped_and_counted(dut, gap, stall):
        """Random bit flips on random internal links while random traffic flows: every flip
        that met a transfer is counted on its link (every single bit with parity, every burst
        of up to 8 bits with crc8); nothing corrupted leaves the tree; every token leaves the
        root once (summed or aborted); traffic after the faults is exact; reset clears the
        counts and the sticky flag."""
        bench = _setup(dut, f"faults:{gap}:{stall}", gap=gap, stall=stall, return_delay=(0, 8))
        await start_after_reset(dut, bench)
        injector = FaultInjector(bench, probability=0.08)
        injector.start()
        sent, ids = 0, min(200, 1 << bench.cfg.token_width)    # one id per token of the run
        # 80 tokens, then 40 more at a time until at least 10 flips met a transfer (how many
        # do depends on the traffic's timing, a small tree with one slot per switch idles most)
        while sent < 80 or (sum(injector.faults["down"]) + sum(injector.faults["up"]) < 10
                            and sent + 40 <= ids):
            for token in range(sent, sent + (80 if sent == 0 else 40)):
                bench.send(bench.random_packet(token))
            sent += 80 if sent == 0 else 40
            await bench.drain(max_cycles=60000)
        await injector.stop()
        await ClockCycles(dut.clk, 5)
        faults = sum(injector.faults["down"]) + sum(injector.faults["up"])
        assert injector.counted() == injector.faults, (injector.counted(), injector.faults)
        aborted = check_faulty_run(bench)
        assert faults >= 10, f"only {faults} flips met a transfer: the test is too weak"
        assert 1 <= aborted <= faults, (aborted, faults)
        assert dut.link_error.value == 1
        dut._log.info("faults %s, bursts up to %d bits, %d of %d tokens aborted", injector.faults,
                      max(length for *_, length in injector.bursts), aborted, sent)
        # Traffic after the faults: exact, with every slot of every switch released.
        bench.stop()
        after = _setup(dut, f"after-faults:{gap}:{stall}", gap=gap, stall=stall)
        after.start()
        for token in range(3 * bench.cfg.max_inflight + 10):
            after.send(after.random_packet(100 + token))
        await after.drain()
        after.check()
        assert injector.counted() == injector.faults       # no new error
        after.stop()
        await reset_dut(dut)
        assert dut.link_error.value == 0
        assert injector.counted() == {"down": [0] * injector.links, "up": [0] * injector.links}

    async def _flip_flit(dut, direction, link, position, offset, width):
        """Flip bit ``offset`` of the ``position``-th flit the link carries from now on (flits
        of a packet or a return cross one a cycle with no stalls)."""
        port = getattr(dut, f"{direction}_link_flip")
        fire = getattr(dut, f"{direction}_link_fire")
        word = 1 << (offset + link * width)
        if position == 0:
            port.value = word          # on while the link is idle: the first flit meets it
        while True:
            await RisingEdge(dut.clk)
            if fire.value.to_unsigned() >> link & 1:
                break
        if position:
            for _ in range(position - 1):
                await RisingEdge(dut.clk)
            port.value = word
            await RisingEdge(dut.clk)
            assert fire.value.to_unsigned() >> link & 1, "the packet's flits did not follow"
        port.value = 0

    @cocotb.test()
    async def test_link_faults_in_every_flit_position(dut):
        """One fault at a time, no stalls, on the down and the up link of the first child
        switch: in a packet's first flit (a check bit), a middle one (the token's low bit) and
        its last (the ``last`` bit, so framing itself is hit). Each aborts exactly its token,
        is counted once on that link, and the next token is exact."""
        bench = _setup(dut, "faults-positions", return_delay=(0, 0))
        await start_after_reset(dut, bench)
        injector = FaultInjector(bench, probability=0.0)
        length = bench.cfg.max_flits
        token = 0
        for direction in ("down", "up"):
            layout = (hw_nop.down_layout if direction == "down" else hw_nop.up_layout)(
                bench.cfg, True)
            offsets = {0: 0, length // 2: layout["token"].offset,
                       length - 1: layout["last"].offset}
            for position, offset in sorted(offsets.items()):
                before = injector.counted()[direction][0]
                flip = cocotb.start_soon(_flip_flit(dut, direction, 0, position, offset,
                                                    injector.width[direction]))
                bench.send(bench.random_packet(token, (1 << bench.leaves) - 1, length))
                await bench.drain()
                await flip
                assert injector.counted()[direction][0] == before + 1, (direction, position)
                bench.send(bench.random_packet(token + 1, (1 << bench.leaves) - 1, length))
                await bench.drain()
                token += 2
        check_faulty_run(bench)
        aborted = [int(f.token) for _, f in bench.combined.received if f.abort]
        assert aborted == list(range(0, token, 2)), f"aborted tokens {aborted}"

    @cocotb.test()
    async def test_a_bad_flit_is_answered_where_the_link_takes_it(dut):
        """Every leaf held not ready: the down link into leaf 0's switch still takes a second
        flit (its skid slice) while that switch cannot, and a bad one is answered then, counted
        on that link before leaf 0 has received anything. Released, the switch ends the packet
        with an abort flit, the token leaves the root as one abort, and the next is exact."""
        held = HeldPauses()
        bench = _setup(dut, "skid-nack", stall=held, return_delay=(0, 0))
        await start_after_reset(dut, bench)
        injector = FaultInjector(bench, probability=0.0)
        # The link into the first leaf-level switch (links are numbered level by level).
        link = bench.internal - math.prod(bench.fanouts[:-1])
        layout = hw_nop.down_layout(bench.cfg, True)
        # The packet's second flit crosses that link on the edge after its first, though the
        # first then waits in the switch's output register for leaf 0 (_flip_flit asserts it).
        flip = cocotb.start_soon(_flip_flit(dut, "down", link, 1, layout["token"].offset,
                                            injector.width["down"]))
        bench.send(bench.random_packet(0, 1, bench.cfg.max_flits))
        await flip
        await ClockCycles(dut.clk, 2)
        assert injector.counted()["down"][link] == 1, injector.counted()
        assert dut.link_error.value == 1
        assert not bench.leaf_in[0].received, "leaf 0 took a flit while held"
        held.release()
        bench.send(bench.random_packet(1, 1, bench.cfg.max_flits))
        await bench.drain()
        assert check_faulty_run(bench) == 1
        aborted = [int(f.token) for _, f in bench.combined.received if f.abort]
        assert aborted == [0], f"aborted tokens {aborted}"
        assert injector.counted()["down"][link] == 1 and sum(injector.counted()["up"]) == 0
