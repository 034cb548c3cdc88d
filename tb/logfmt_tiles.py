"""BF16 tiles for the LogFMT codec benches: realistic activations and every edge the codec has.

Simulator-free (plain Python), shared by ``tb/test_logfmt.py`` and
``tb/test_logfmt_decoder.py``.
"""

import functools
import math

import numpy as np

from golden import fp
from golden import logfmt as golden

__all__ = ["KINDS", "EDGE_KINDS", "random_tile", "divider_gap", "divider_gaps", "divider_edge_tile",
           "rounding_edges", "rounding_edge_tile"]

BF16_INF, BF16_NAN = 0x7F80, 0x7FC0
KINDS = ("gaussian", "heavy", "codes", "mixed")
EDGE_KINDS = ("zeros", "signed_zeros", "constant", "single", "single_first", "single_last",
              "wide", "subnormal", "extremes", "nan", "infinity", "only_infinity", "only_nan",
              "two_levels", "few_levels", "divider_edge", "rounding_edge")
# divider_edge: a doubled remainder this close to the divisor, at one of the reciprocal's
# top bits where it can (a wrong one there moves every position by 2**-13 of itself or more)
DIVIDER_EDGE, DIVIDER_EDGE_BITS = 1 << 12, 13
EDGE_MARGIN = 2.0 ** -12       # rounding_edge: an element this close to a rounding edge
EDGE_SPREAD = 400              # rounding_edge: tiles of up to this many adjacent codes


def _bf16(value):
    return fp.encode(value, "bf16")


def _edge_bits(comparator, comparators, below):
    """The quotient bits j (0..25, from the top) whose comparisons ``divider_gap`` reads: those
    of one comparator (j % comparators == comparator; the divider finds ``comparators`` bits a
    cycle, each with a comparator of its own) that can fall on the side ``below`` says (bit 0
    compares 2**23 with N >= 2**23: below, or equal; bit 1 compares 2**24 > N: above), the top
    ones (j < DIVIDER_EDGE_BITS) if there are any."""
    bits = [j for j in range(golden.RECIP_BITS) if j % comparators == comparator
            and j != (1 if below else 0)]
    return [j for j in bits if j < DIVIDER_EDGE_BITS] or bits


def divider_gap(step, comparator=0, comparators=1, below=True):
    """How near the encoder's reciprocal of ``step`` comes to a wrong quotient bit: the least
    amount by which a doubled partial remainder falls short of the divisor it is compared with
    (``below``; the bit is 0) or reaches past it (the bit is 1), over the bits ``_edge_bits``
    gives; None if none falls on that side. recip = floor(2**48 / N), N the step normalized to
    24 bits; bit j compares 2 * (2**(22 + j) mod N) with N."""
    divisor = step << (24 - step.bit_length())
    sign = 1 if below else -1
    gaps = [sign * (divisor - 2 * pow(2, 22 + j, divisor))
            for j in _edge_bits(comparator, comparators, below)]
    return min((gap for gap in gaps if gap > 0 or (gap == 0 and not below)), default=None)


def divider_gaps(steps, comparator=0, comparators=1, below=True):
    """``divider_gap`` of every step of the int64 array ``steps`` (each > 0) at once: the gap,
    or -1 where none falls on that side. (The edge-tile search below tries thousands of steps
    for each tile; one by one in Python that was most of the encoder bench's time.)"""
    steps = np.asarray(steps, dtype=np.int64)
    lengths = np.frexp(steps.astype(np.float64))[1]        # bit lengths (exact below 2**53)
    divisor = steps << (24 - lengths)
    sign = 1 if below else -1
    best = np.full(steps.shape, np.iinfo(np.int64).max)
    wanted = set(_edge_bits(comparator, comparators, below))
    residue = np.full(steps.shape, 1 << 22) % divisor             # 2**(22 + j) mod N, j = 0
    for j in range(golden.RECIP_BITS):
        if j in wanted:
            gap = sign * (divisor - 2 * residue)
            on_side = (gap > 0) | ((gap == 0) & (not below))
            best = np.where(on_side, np.minimum(best, gap), best)
        residue = (2 * residue) % divisor
    return np.where(best == np.iinfo(np.int64).max, -1, best)


@functools.cache
def _bf16_logs():
    """log2 (Q16) of every BF16 code of a positive finite number, 0x0001..0x7F7F (index)."""
    return np.array([golden.bf16_log2(code)[2] for code in range(0x7F80)], dtype=np.int64)


def divider_edge_tile(rng, size, bits, comparator=0, comparators=1, below=True):
    """A tile whose step's reciprocal meets a comparison within DIVIDER_EDGE of equality on the
    side ``below`` says (``divider_gap``): its smallest and largest magnitudes once, the rest
    between, random signs; None if the comparator has no bit on that side, or 20,000 random
    ranges give no such step (bit 0 is at N exactly only for a step that is a power of two).
    The 20,000 ranges are drawn and tried at once; the first that qualifies is taken."""
    if not _edge_bits(comparator, comparators, below):
        return None
    draws = np.random.default_rng(rng.getrandbits(64))
    low = draws.integers(0x0080, 0x7E00, 20000)
    high_end = np.minimum(low + 0x80 * golden.RANGE_BINADES, 0x7F80)
    high = low + 1 + (draws.random(20000) * (high_end - low - 1)).astype(np.int64)
    logs = _bf16_logs()
    hi = np.maximum(logs[low], logs[high])
    lo = np.maximum(np.minimum(logs[low], logs[high]),
                    hi - golden.RANGE_BINADES * (1 << golden.LOG_FRAC))
    steps = ((hi - lo) << (golden.STEP_FRAC - golden.LOG_FRAC)) // ((1 << (bits - 1)) - 2)
    gaps = np.full(steps.shape, -1)
    positive = steps > 0
    gaps[positive] = divider_gaps(steps[positive], comparator, comparators, below)
    found = np.flatnonzero((gaps >= 0) & (gaps < DIVIDER_EDGE))
    if not found.size:
        return None
    first = found[0]
    low, high = int(low[first]), int(high[first])
    # The arrays' arithmetic agrees with the golden's for the pair taken (checked each time).
    step = golden.tile_params([low, high], bits).step
    assert step == steps[first] and divider_gap(step, comparator, comparators, below) == gaps[first]
    tile = [high, low] + [rng.randrange(low, high + 1) for _ in range(size - 2)]
    tile = [value | rng.choice([0, 0x8000]) for value in tile[:size]]
    rng.shuffle(tile)
    return tile


@functools.cache
def rounding_edges(bits):
    """``(low, high, code)`` triples, codes of [1/2, 2**4): in a tile whose smallest magnitude
    is ``low`` and largest ``high`` (at most EDGE_SPREAD codes apart), ``code``'s exact position
    lies within EDGE_MARGIN of a position unit of the edge where it rounds up to the next level
    (just above it or just below). The rounding compares the position truncated to Q8, so a
    position or a comparison off by the least amount shows on these; random tiles meet one
    in thousands. Every low in one binade (positions depend on the codes' distance only)."""
    base = 0x3F00
    codes = range(base, base + 128 + EDGE_SPREAD + 1)
    logs = np.array([golden.bf16_log2(code)[2] for code in codes], dtype=np.int64)
    found = []
    for low in range(128):
        for high in range(low + 2, low + EDGE_SPREAD + 1):
            params = golden.tile_params([base + low, base + high], bits)
            theta = golden.theta(params.step)
            pos, rest = golden.position(logs[low + 1:high] - params.lo, params.step)
            frac = pos & ((1 << golden.POS_FRAC) - 1)
            near = (((frac == theta) & (rest < EDGE_MARGIN))
                    | ((frac == theta - 1) & (rest >= 1 - EDGE_MARGIN)))
            found += [(base + low, base + high, base + low + 1 + int(i))
                      for i in np.flatnonzero(near)]
    return tuple(found)


def rounding_edge_tile(rng, size, edge):
    """A tile of ``size`` codes with the ``rounding_edges`` triple ``edge`` moved to a random
    binade (its low and high once, the rest its code), random signs."""
    low, high, code = edge
    binades = rng.randrange(-120, 120) << 7
    tile = [high, low] + [code] * max(0, size - 2)
    tile = [(value + binades) | rng.choice([0, 0x8000]) for value in tile[:size]]
    rng.shuffle(tile)
    return tile


def random_tile(rng, size, kind, bits=8):
    """``size`` BF16 codes of one tile of ``kind`` (KINDS: Gaussian, Student-t with 2 degrees of
    freedom, any code at all, Gaussian with zeros; EDGE_KINDS: the codec's corner cases) for
    LogFMT-``bits``."""
    if kind == "gaussian":
        return [_bf16(rng.gauss(0.0, rng.choice([1e-3, 1.0, 50.0]))) for _ in range(size)]
    if kind == "heavy":
        return [_bf16(rng.gauss(0, 1) / math.sqrt(max(1e-12, rng.gammavariate(1, 1))))
                for _ in range(size)]
    if kind == "codes":
        return [rng.randrange(1 << 16) for _ in range(size)]
    if kind == "mixed":
        return [0 if rng.random() < 0.3 else _bf16(rng.gauss(0, 1)) for _ in range(size)]
    if kind == "zeros":
        return [0] * size
    if kind == "signed_zeros":
        return [rng.choice([0, 0x8000]) for _ in range(size)]
    if kind == "constant":
        value = rng.randrange(1, 0x7F80)
        return [value | rng.choice([0, 0x8000]) for _ in range(size)]
    if kind in ("single", "single_first", "single_last"):
        # The only number first or last: the tile's range is complete only with its first or
        # its last row (a range captured one row early reads an empty tile).
        at = {"single_first": 0, "single_last": size - 1}.get(kind, rng.randrange(size))
        tile = [0] * size
        tile[at] = rng.randrange(1, 0x7F80) | rng.choice([0, 0x8000])
        return tile
    if kind == "wide":          # beyond 2**32: the smallest clamp to zero or the lowest level
        return [_bf16(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-60, 40)) for _ in range(size)]
    if kind == "subnormal":
        return [rng.randrange(0, 0x80) | rng.choice([0, 0x8000]) for _ in range(size)]
    if kind == "extremes":      # the largest and the smallest magnitudes in one tile
        return [rng.choice([0x7F7F, 0x0001, 0x0080, 0x7F00, 0x3F80]) | rng.choice([0, 0x8000])
                for _ in range(size)]
    if kind == "nan":
        tile = [_bf16(rng.gauss(0, 1)) for _ in range(size)]
        tile[rng.randrange(size)] = BF16_NAN | rng.choice([0, 0x8000, 0x3F])
        return tile
    if kind == "infinity":
        return [rng.choice([BF16_INF, BF16_INF | 0x8000, _bf16(rng.gauss(0, 1e38))])
                for _ in range(size)]
    # Tiles whose only nonzero elements are infinities, or NaNs: whether the tile has any
    # number at all (its lo) then hangs on telling the two apart (a mutant that swapped them
    # passed every other tile).
    if kind == "only_infinity":
        return [rng.choice([BF16_INF, BF16_INF | 0x8000, 0, 0x8000]) for _ in range(size)]
    if kind == "only_nan":
        return [rng.choice([BF16_NAN | rng.choice([0, 0x8000, 0x3F]), 0]) for _ in range(size)]
    if kind == "two_levels":    # two adjacent magnitudes: the smallest step there is
        base = rng.randrange(0x0100, 0x7F00)
        return [rng.choice([base, base + 1]) for _ in range(size)]
    if kind == "few_levels":    # 3 to 6 adjacent magnitudes: a step below 2**13 (Q24) that
        # the intermediate codes read (two levels encode as 1 and all ones whatever the step)
        base = rng.randrange(0x0100, 0x7F00)
        spread = rng.choice([2, 3, 5])
        return [(base + rng.randrange(spread + 1)) | rng.choice([0, 0x8000])
                for _ in range(size)]
    if kind == "divider_edge":  # a step whose reciprocal's comparisons are nearly equal
        return divider_edge_tile(rng, size, bits, below=rng.random() < 0.5)
    if kind == "rounding_edge":
        return rounding_edge_tile(rng, size, rng.choice(rounding_edges(bits)))
    raise ValueError(kind)
