"""cocotb tests of ``fp_dot`` against ``golden.fp.dot``.

The bench spreads the dot products of a test over the unit's slots (each to the slot with the
fewest beats waiting) and sends their beats interleaved, one slot after the other. Every result
(an FP32 code and its slot) is compared, in order, with the golden dot product on the same
codes and scales; with every port ready the beats are taken at the edges
``golden.fp.dot_take_edges`` gives and each result leaves ``golden.fp.DOT_LATENCY`` edges after
its dot product's last beat.
"""

import math
import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fp as golden
from tb.harness import (long_enough_to_time, restart_bench, start_bench, throughput_beats,
                        write_throughput)
from tb.streams import STALL_PROFILES, PipeBench, beats_per_cycle, edge_now


class DotBench(PipeBench):
    """A source on ``inp``, a sink on ``out``, the golden results in order."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, gap, stall, board_name="result")
        self.cfg = config
        self.fmt = config.format
        self.beats = 0
        self.products = 0           # operand pairs sent (padding lanes not counted)
        self.last_flags = []             # per beat sent, in order
        self.beat_slots = []             # per beat sent, in order
        self.waiting = [[] for _ in range(config.slots)]   # per slot: (beat, result or None)

    def code(self, special_rate=0.1):
        """A random operand: any code, often a special or extreme one."""
        fmt, rng = self.fmt, self.rng
        if rng.random() < special_rate:
            sign = rng.choice([0, 1 << (fmt.width - 1)])
            return sign | rng.choice([0, 1, 2, fmt.max_code, fmt.canonical_nan,
                                      (1 << fmt.man_bits) - 1, 1 << fmt.man_bits])
        return rng.randrange(1 << fmt.width)

    def finite(self, code):
        return code if golden.components(code, self.fmt)[0] == "num" else 0

    @property
    def dot_config(self):
        cfg = self.cfg
        return golden.DotConfig(group=cfg.group, acc_frac=cfg.acc_frac,
                                promote_every=cfg.promote_every)

    def scale_code(self, value):
        """The code of a scale value (E8M0: its exponent; NaN is 255)."""
        if self.cfg.scale_format == "fp32":
            return golden.encode(value, "fp32")
        return 255 if math.isnan(value) else int(math.log2(value)) + 127

    def random_scale(self):
        """A scale: often 1, sometimes extreme (FP32: zero, subnormal, the largest; E8M0: the
        smallest and largest powers of two), else a random one over a wide range."""
        rng = self.rng
        pick = rng.random()
        if self.cfg.scale_format == "e8m0":
            if pick < 0.3:
                return 1.0
            code = rng.choice([0, 254]) if pick < 0.4 else rng.randint(127 - 40, 127 + 40)
            return golden.e8m0_decode(code)
        if pick < 0.3:
            return 1.0
        if pick < 0.4:
            return golden.decode(rng.choice([0, 1, 0x00800000, 0x7F7FFFFF, 0x80000001]), "fp32")
        return golden.decode(golden.encode(rng.uniform(-4, 4) * 2.0 ** rng.randint(-40, 40),
                                           "fp32"), "fp32")

    def scales(self, count):
        """One scale pair per 128 elements (one pair in all without promotion)."""
        blocks = -(-count // 128)
        if not self.cfg.promote_every:
            return [self.random_scale()] * blocks, [self.random_scale()] * blocks
        return ([self.random_scale() for _ in range(blocks)],
                [self.random_scale() for _ in range(blocks)])

    def send_dot(self, a, b, scale_a=None, scale_b=None):
        """One dot product: ceil(n/g) beats, the last padded with zero codes; each beat carries
        the scales of its 128-element block. Queued on the slot with the fewest beats waiting
        (the lowest of those); :meth:`flush` sends them."""
        g = self.cfg.group
        blocks = -(-len(a) // 128)
        scale_a = scale_a or [1.0] * blocks
        scale_b = scale_b or [1.0] * blocks
        slot = min(range(self.cfg.slots), key=lambda s: len(self.waiting[s]))
        result = golden.dot(a, b, self.fmt, self.fmt, self.dot_config, scale_a, scale_b)
        for start in range(0, len(a), g):
            part_a, part_b = a[start:start + g], b[start:start + g]
            pad = [0] * (g - len(part_a))
            last = int(start + g >= len(a))
            block = start // 128
            self.waiting[slot].append(({"a": part_a + pad, "b": part_b + pad,
                                        "scale_a": self.scale_code(scale_a[block]),
                                        "scale_b": self.scale_code(scale_b[block]),
                                        "last": last, "slot": slot},
                                       result if last else None))
        self.products += len(a)

    def send_beat(self, beat):
        self.sources["inp"].send(beat)
        self.last_flags.append(beat["last"])
        self.beat_slots.append(beat["slot"])
        self.beats += 1

    def flush(self, between=None):
        """Send every queued beat, the slots in turn (each slot's own in order), and expect
        each result, with its slot, in the order of the last beats; ``between()`` after each
        slot's turn."""
        while any(self.waiting):
            for slot, queue in enumerate(self.waiting):
                if queue:
                    beat, result = queue.pop(0)
                    self.send_beat(beat)
                    if result is not None:
                        self.board.expect_payload({"result": result, "slot": slot})
                if between:
                    between()

    def random_dot(self, specials=False, longest=None, count=None):
        count = count or self.rng.randint(1, longest or max(4 * self.cfg.group, 300))
        a = [self.code() for _ in range(count)]
        b = [self.code() for _ in range(count)]
        if not specials:
            a, b = [self.finite(c) for c in a], [self.finite(c) for c in b]
        self.send_dot(a, b, *self.scales(count))

    async def drain(self, gap=0.0, stall=0.0):
        self.flush()
        await self.drain_within(golden.DOT_SLOT_GAP * self.beats, "every result out", gap,
                                stall)

    def check_schedule(self):
        """With every port ready: each beat taken at the edge golden.fp.dot_take_edges gives,
        each result DOT_LATENCY edges after its last beat."""
        taken = self.sources["inp"].sent_edges
        assert taken == golden.dot_take_edges(self.beat_slots, taken[0], self.cfg.slots)
        lasts = [edge for edge, last, slot in zip(taken, self.last_flags, self.beat_slots)
                 if last and slot < self.cfg.slots]
        assert ([edge for edge, _ in self.sinks["out"].received]
                == [edge + golden.DOT_LATENCY for edge in lasts])

    def check(self):
        self.board.check(self.sinks["out"])


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_dots(dut, gap, stall):
    """Random dot products of 1..max(4g, 300) elements with random scales per 128-element
    block, finite and with specials, under valid gaps and result stalls: every result equals
    the golden dot product, with its slot, in order; without stalls each beat is taken at the
    edge golden.fp.dot_take_edges gives (one a cycle while DOT_SLOT_GAP slots have beats to
    send, a slot's next beat DOT_SLOT_GAP edges after its last) and each result leaves
    golden.fp.DOT_LATENCY edges after its last beat."""
    bench = await start_bench(DotBench, dut, f"random:{gap}:{stall}", gap, stall)
    for index in range(40):
        bench.random_dot(specials=index % 3 == 0)
    await bench.drain(gap, stall)
    bench.check()
    if gap == 0.0 and stall == 0.0:
        bench.check_schedule()
    bench.stop()


@cocotb.test()
async def test_edge_values(dut):
    """Signed zeros, subnormals times subnormals (in every lane), the largest finite values
    (accumulated until the exponent saturates where the format reaches it), exact
    cancellation, NaN, infinity times zero and infinities of both signs; scales that saturate
    the FP32 result, make it subnormal or zero, a NaN scale and an infinite one."""
    bench = await start_bench(DotBench, dut, "edges")
    fmt, g = bench.fmt, bench.cfg.group
    sign = 1 << (fmt.width - 1)
    big, tiny = fmt.max_code, 1
    one = golden.encode(1.0, fmt)
    cases = [
        ([0, sign], [sign, 0]),                               # -0 products
        ([tiny] * 5, [tiny] * 5),                             # subnormal * subnormal
        # ... in every lane, products 1, 2 and 3 units: each lane's leading-one search at its
        # lowest positions
        ([tiny] * g, [1] * g), ([tiny] * g, [2] * g), ([3] * g, [tiny] * g),
        ([big] * (3 * g + 1), [big] * (3 * g + 1)),           # the largest products
        ([big, big | sign], [big, big]),                      # exact cancellation
        ([one, big, one | sign], [one, big | sign, one]),
        ([fmt.canonical_nan, one], [one, one]),               # NaN
    ]
    if fmt.ieee:
        inf = ((1 << fmt.exp_bits) - 1) << fmt.man_bits
        cases += [([inf, one], [0, one]),                     # infinity * 0: NaN
                  ([inf, inf | sign], [one, one]),            # +inf and -inf: NaN
                  ([inf, big], [one | sign, big])]            # -inf
    for a, b in cases:
        bench.send_dot(a, b)
    blocks = -(-(3 * g + 1) // 128)
    if bench.cfg.scale_format == "fp32":
        extremes = (golden.decode(0x7F7FFFFF, "fp32"), 2.0 ** -140, 0.0, -1.0, math.nan)
    else:
        extremes = (2.0 ** 127, 2.0 ** -127, math.nan)
    for scale in extremes:
        bench.send_dot([big] * (3 * g + 1), [one] * (3 * g + 1), [scale] * blocks,
                       [scale if scale not in (2.0 ** -140, 2.0 ** -127) else 1.0] * blocks)
    if bench.cfg.scale_format == "fp32":
        # An infinite scale on either side alone (E8M0's code 255 is the NaN above).
        for a_scale, b_scale in ((math.inf, 1.0), (1.0, -math.inf)):
            bench.send_dot([one] * (3 * g + 1), [one] * (3 * g + 1), [a_scale] * blocks,
                           [b_scale] * blocks)
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_one_special_in_each_lane(dut):
    """One special operand among finite ones, in each lane of a beat in turn, in ``a`` and in
    ``b``: a NaN, and where the format has them an infinity and infinity times zero. Every
    lane has its own decoder: with several specials per dot product, a lane that missed its
    NaN would hide behind the others."""
    bench = await start_bench(DotBench, dut, "lanes")
    fmt, g = bench.fmt, bench.cfg.group
    one = golden.encode(1.0, fmt)
    specials = [(fmt.canonical_nan, one)]
    if fmt.ieee:
        inf = ((1 << fmt.exp_bits) - 1) << fmt.man_bits
        specials += [(inf, one), (inf | (1 << (fmt.width - 1)), one), (inf, 0)]
    for lane in range(g):
        for special, partner in specials:
            a = [bench.finite(bench.code(0.0)) for _ in range(g)]
            b = [bench.finite(bench.code(0.0)) for _ in range(g)]
            a[lane], b[lane] = special, partner
            bench.send_dot(a, b)
            bench.send_dot(b, a)
    await bench.drain()
    bench.check()
    bench.stop()


def _products_by_top(fmt, rng, operands=400):
    """``{(t, l): (a, b)}``: for every exponent t = floor(log2 |a*b|) that products of finite
    nonzero positive codes reach, and every leading-bit position l of the integer product of
    their significands that reaches t (what a lane's leading-one search sees: subnormal
    operands put it low), one pair at random (every code for FP8; for BF16 a sample of 400
    codes with the smallest and largest). And ``{x: code}`` of the exact powers of two."""
    codes = [c for c in range(1, 1 << (fmt.width - 1))
             if golden.components(c, fmt)[0] == "num"]
    if len(codes) > operands:
        codes = sorted({codes[0], codes[-1], *rng.sample(codes, operands - 2)})
    significand = {c: golden.components(c, fmt)[2] for c in codes}
    value = {c: golden.decode(c, fmt) for c in codes}      # decoded once, not per pair
    by_top = {}
    for a in codes:
        for b in codes:
            top = math.frexp(value[a] * value[b])[1] - 1
            lead = (significand[a] * significand[b]).bit_length() - 1
            by_top.setdefault((top, lead), []).append((a, b))
    powers = {}
    for c in range(1, 1 << (fmt.width - 1)):
        value = golden.decode(c, fmt)
        if golden.components(c, fmt)[0] == "num" and math.frexp(value)[0] == 0.5:
            powers[math.frexp(value)[1] - 1] = c
    return {key: rng.choice(pairs) for key, pairs in by_top.items()}, powers


def _power_pair(powers, x, rng):
    """Codes (a, b) with a * b = 2**x (``powers``: ``{x: code}`` of the exact powers of two),
    or None."""
    for xa in rng.sample(sorted(powers), len(powers)):
        if x - xa in powers:
            return powers[xa], powers[x - xa]
    return None


@cocotb.test()
async def test_each_lane_leads(dut):
    """Each lane in turn holds the beat's largest product, at every exponent t its leading bit
    can take and (FP8) every position of the leading bit of its significands' product that
    reaches t (for BF16 a sample of 64 pairs), beside the smallest unit the accumulator keeps
    below it, 2**(t - F), or the largest it drops, 2**(t - F - 1) (a product of two powers of
    two in the next lane; with g = 1, the beat before): a lane whose leading-one search or
    top exponent were off would align the beat to a wrong exponent, dropping that unit or
    keeping one that should go (and alone, where the unit is below the format's smallest
    product, it would come out at a wrong exponent). The other lanes hold a zero times the
    largest finite value, either side: a zero product's exponent must not set the alignment
    (fp_dot's mutant 14 of 2026-12-04). Random signs; every result equals the golden dot
    product. (The leading-bit positions kill fp_dot's mutant 11 of 2026-11-29:
    lane 31's search reporting 5 for a product of 16 to 31.)"""
    bench = await start_bench(DotBench, dut, "leads")
    fmt, g, F = bench.fmt, bench.cfg.group, bench.cfg.acc_frac
    rng = bench.rng
    sign = 1 << (fmt.width - 1)
    by_top, powers = _products_by_top(fmt, rng)
    keys = sorted(by_top)
    if len(keys) > 400:                                # BF16: a sample, the ends included
        keys = sorted({keys[0], keys[-1], *rng.sample(keys, 62)})

    for lane in range(g):
        for top, lead in keys:
            for drop in (0, 1, None):
                a, b = by_top[top, lead]
                a ^= rng.choice((0, sign))
                unit = (0, 0) if drop is None else _power_pair(powers, top - F - drop, rng)
                if unit is None:
                    continue
                ua, ub = unit[0] ^ rng.choice((0, sign)), unit[1]
                if g == 1:
                    bench.send_dot([ua, a], [ub, b])
                    continue
                # The other lanes: a zero times the largest finite value (either side), whose
                # exponent must not set the alignment.
                beat_a, beat_b = [0] * g, [0] * g
                for other in range(g):
                    zero, big = rng.choice((0, sign)), fmt.max_code | rng.choice((0, sign))
                    beat_a[other], beat_b[other] = (zero, big) if other % 2 else (big, zero)
                beat_a[lane], beat_b[lane] = a, b
                beat_a[(lane + 1) % g], beat_b[(lane + 1) % g] = ua, ub
                bench.send_dot(beat_a, beat_b)
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_partial_sum_ahead_by_every_gap(dut):
    """Dot products of two beats: the first a power of two 2**t alone (the partial sum at
    exponent t), the second products of random significands and signs whose largest sits d
    below t, for every d from 0 to F + 2 (each shifted sum the partial-sum loop selects from,
    and past the last), 32 times each, back to back under result stalls nine cycles in ten
    (a waiting result holds the whole pipeline: every beat waits in every stage, for runs of
    either parity): a beat held in the pipeline keeps every one of its shifted sums (fp_dot's
    mutant 11 of 2026-12-04 flipped a bit of the sum shifted by 7 at each stalled edge)."""
    bench = await start_bench(DotBench, dut, "gaps", 0.0, 0.9)
    fmt, g, F = bench.fmt, bench.cfg.group, bench.cfg.acc_frac
    rng = bench.rng
    sign = 1 << (fmt.width - 1)
    by_top, powers = _products_by_top(fmt, rng)
    tops = sorted({top for top, _ in by_top})
    t = max(x for x in tops if _power_pair(powers, x, rng))      # 2**t a product exactly
    for d in range(F + 3):
        below = [key for key in by_top if t - d - F <= key[0] <= t - d]
        leading = [key for key in below if key[0] == t - d]
        first = _power_pair(powers, t, rng)
        if not leading:
            continue
        for _ in range(32):
            keys = [rng.choice(leading)] + [rng.choice(below) for _ in range(g - 1)]
            pairs = [by_top[key] for key in keys]
            second_a = [a ^ rng.choice((0, sign)) for a, _ in pairs]
            second_b = [b for _, b in pairs]
            bench.send_dot([first[0]] + [0] * (g - 1) + second_a,
                           [first[1]] + [0] * (g - 1) + second_b)
    await bench.drain(0.0, 0.9)
    bench.check()
    bench.stop()


@cocotb.test()
async def test_small_products_after_a_cancellation(dut):
    """A beat whose products cancel to r = 1, 2 or 3 units of its alignment (+2**t, -2**t and
    r products 2**(t - F)), then a beat with one product 2**(t - 2F + j), j = 0..3, at and
    above the unit the renormalized residue keeps below itself. A renormalization that put
    the residue's exponent a bit or two high would align the second beat too coarsely and
    drop that product (fp_dot's mutant 6 of 2026-11-28, an index bit of the partial sum's
    leading-one search tied to 1, passed every other test). For g < r + 2 the first beat's
    products spill over beats (no residue then; the golden still decides)."""
    bench = await start_bench(DotBench, dut, "cancel-residue")
    fmt, g, F, rng = bench.fmt, bench.cfg.group, bench.cfg.acc_frac, bench.rng
    sign = 1 << (fmt.width - 1)
    _, powers = _products_by_top(fmt, rng)
    top = 10                                   # 2**10 = 2**5 * 2**5 in every format
    large = _power_pair(powers, top, rng)
    for r in (1, 2, 3):
        for j in range(4):
            unit, small = _power_pair(powers, top - F, rng), _power_pair(powers, top - 2 * F + j,
                                                                        rng)
            if unit is None or small is None:
                continue
            first = [large, (large[0] | sign, large[1])] + [unit] * r
            first += [(0, 0)] * (-len(first) % g)
            pairs = first + [small]
            bench.send_dot([a for a, _ in pairs], [b for _, b in pairs])
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_small_products_after_a_large_one(dut):
    """The seed's mechanism: one large product, then many small ones that the acc_frac-bit
    accumulator truncates unless a promotion comes first (every result equals the golden's)."""
    bench = await start_bench(DotBench, dut, "crafted")
    fmt = bench.fmt
    large = golden.encode(min(256.0, fmt.max_finite), fmt)
    one = golden.encode(1.0, fmt)
    for count in (2, 65, 4 * bench.cfg.group + 3, 300):
        bench.send_dot([large] + [one] * (count - 1), [large] + [one] * (count - 1))
        bench.send_dot([one] * (count - 1) + [large], [one] * (count - 1) + [large])
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_promotion_cancels_to_every_depth(dut):
    """A promotion whose scaled partial sum nearly cancels the FP32 total, so the rounding's
    leading one lands at every depth below the top of the promotion adder, 0 to 46 bits (FP32
    scales only: the cancelling bits come from the scales' 24-bit mantissas; E8M0 scales are
    powers of two, and without promotion there is no total to cancel against).

    The first promotion's segment holds one product 1 * 1 with scale T, so the total is T; the
    next segment, in the next scale block, holds 1 * 1 with scales A and B. With A = 1 + 2**-23:
    B = 1 and T = -(A - 2**-d) leave 2**-d (depth d < 24); B = 1 + 2**-j and
    T = -(1 + 2**-j + 2**-23) leave 2**-(23 + j) (depth 23 + j). Each at two exponents, with
    a random sign."""
    bench = await start_bench(DotBench, dut, "cancel")
    pe = bench.cfg.promote_every
    if bench.cfg.scale_format != "fp32" or not pe:
        bench.stop()
        return
    # The second product's element: a later promotion segment and a later scale block.
    at = max(pe, 128) if max(pe, 128) % min(pe, 128) == 0 else pe * 128
    one = golden.encode(1.0, bench.fmt)
    a_scale = 1.0 + 2.0 ** -23
    cases = [(a_scale, 1.0, -(a_scale - 2.0 ** -d)) for d in range(24)]
    cases += [(a_scale, 1.0 + 2.0 ** -j, -(1.0 + 2.0 ** -j + 2.0 ** -23)) for j in range(1, 24)]
    for scale_a, scale_b, total in cases:
        for shift in (0, bench.rng.randint(-60, 60)):
            sign = bench.rng.choice((1.0, -1.0))
            codes = [one] + [0] * (at - 1) + [one]
            blocks = -(-len(codes) // 128)
            first = ([sign * total * 2.0 ** shift] + [1.0] * (blocks - 2)
                     + [sign * scale_a * 2.0 ** shift])
            second = [1.0] * (blocks - 1) + [scale_b]
            bench.send_dot(codes, codes, first, second)
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_promotion_ties_round_to_even(dut):
    """Promotions whose exact result lies halfway between two FP32 values, the lower one even:
    round to nearest even keeps the lower, and any bit the rounding's sticky term wrongly
    counts (one not shifted out) rounds it up. A dot of 1 * 1 (a partial sum of 1) with scales
    A * B of 25 to 29 significant bits: B a subnormal scale whose mantissa is 3 to 63 (not a
    power of two) times 2**j, j in 0, 7, 14; A normal, its mantissa the first from 2**23 that
    makes the tie (guard at bit 0 to 4 of A * B, then j higher); A's exponent random in 30..120,
    with a random sign (FP32 scales only: E8M0 scales are powers of two, so a partial sum
    times them is exact)."""
    bench = await start_bench(DotBench, dut, "ties")
    if bench.cfg.scale_format != "fp32":
        bench.stop()
        return
    one, rng = golden.encode(1.0, bench.fmt), bench.rng
    for b_m in (b for b in range(3, 64) if b & (b - 1)):
        a_m = next(a for a in range(1 << 23, 1 << 24)
                   if (a * b_m) % (1 << ((a * b_m).bit_length() - 23))
                   == 1 << ((a * b_m).bit_length() - 25))
        for j in (0, 7, 14):
            sign = rng.choice((1.0, -1.0))
            scale_a = sign * a_m * 2.0 ** (rng.randint(30, 120) - 23)
            scale_b = (b_m << j) * 2.0 ** -149                # FP32 subnormal
            exact = scale_a * scale_b                           # < 53 bits: exact in a double
            result = golden.decode(golden.dot([one], [one], bench.fmt, bench.fmt,
                                              bench.dot_config, [scale_a], [scale_b]), "fp32")
            assert abs(result) < abs(exact), "the case is not a tie that rounds down"
            bench.send_dot([one], [one], [scale_a], [scale_b])
    await bench.drain()
    bench.check()
    bench.stop()


@cocotb.test()
async def test_a_beat_naming_no_slot_is_dropped(dut):
    """Beats whose ``slot`` is not below ``slots`` (only where the field can hold one: slots
    not a power of two, or one slot), random codes and ``last`` flags, between the beats of
    random dot products: each is taken at once (no slot's wait applies), nothing comes out for
    it and no slot's sums change: every result equals the golden dot product, and every beat is
    taken at the edge golden.fp.dot_take_edges gives."""
    bench = await start_bench(DotBench, dut, "no-slot")
    cfg, rng = bench.cfg, bench.rng
    unheld = range(cfg.slots, 1 << cfg.slot_bits)
    if not unheld:
        bench.stop()
        return
    for _ in range(3 * cfg.slots):
        bench.random_dot(specials=True, longest=3 * cfg.group)
    bench.flush(between=lambda: bench.send_beat({
        "a": [bench.code() for _ in range(cfg.group)],
        "b": [bench.code() for _ in range(cfg.group)],
        "scale_a": rng.randrange(1 << cfg.scale_bits),
        "scale_b": rng.randrange(1 << cfg.scale_bits),
        "last": rng.randrange(2), "slot": rng.choice(unheld)}))
    await bench.drain()
    bench.check()
    bench.check_schedule()
    bench.stop()


@cocotb.test()
async def test_reset_mid_dot(dut):
    """Reset with a dot product half taken and results waiting: afterwards only the new dot
    products come out, each from a fresh accumulator."""
    bench = await start_bench(DotBench, dut, "reset", 0.2, 0.5)
    for _ in range(6):
        bench.random_dot()
    bench.flush()
    await ClockCycles(dut.clk, 4)
    bench = await restart_bench(bench, DotBench, dut, "after-reset", 0.2, 0.5)
    for _ in range(20):
        bench.random_dot()
    await bench.drain(0.2, 0.5)
    bench.check()
    bench.stop()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Beats and products per cycle at saturation over throughput_beats() beats: dot products
    of 4g elements, as many on every slot, so that the slots take turns to the end; with at
    least golden.fp.DOT_SLOT_GAP slots one beat a cycle, with fewer each slot's beats
    DOT_SLOT_GAP edges apart (cycle-exact against golden.fp.dot_take_edges)."""
    bench = await start_bench(DotBench, dut, "throughput")
    began, first_edge = time.perf_counter(), edge_now()
    slots = bench.cfg.slots
    while sum(map(len, bench.waiting)) < throughput_beats():
        for _ in range(slots):
            bench.random_dot(count=4 * bench.cfg.group)
    await bench.drain()
    bench.check()
    bench.check_schedule()
    taken = bench.sources["inp"].sent_edges
    rate = beats_per_cycle(taken)
    if slots >= golden.DOT_SLOT_GAP:
        assert rate == 1.0
    lasts = [edge for edge, last in zip(taken, bench.last_flags) if last]
    latencies = {out - last for (out, _), last in zip(bench.sinks["out"].received, lasts)}
    write_throughput({"beats_per_cycle": round(rate, 4),
                      "products_per_cycle": round(rate * bench.cfg.group, 2),
                      "latency_cycles": latencies.pop(),
                      "dot_products": len(bench.board.expected)},
                     "operand pairs of group g per cycle, every port ready",
                     (edge_now() - first_edge) / (time.perf_counter() - began),
                     operations=bench.products)
    bench.stop()
