"""BF16 tiles for the LogFMT codec benches: realistic activations and every edge the codec has.

Simulator-free (plain Python), shared by ``tb/test_logfmt.py`` and
``tb/test_logfmt_decoder.py``.
"""

import math

from golden import fp

__all__ = ["KINDS", "EDGE_KINDS", "random_tile"]

BF16_INF, BF16_NAN = 0x7F80, 0x7FC0
KINDS = ("gaussian", "heavy", "codes", "mixed")
EDGE_KINDS = ("zeros", "signed_zeros", "constant", "single", "single_first", "single_last",
              "wide", "subnormal", "extremes", "nan", "infinity", "only_infinity", "only_nan",
              "two_levels", "few_levels")


def _bf16(value):
    return fp.encode(value, "bf16")


def random_tile(rng, size, kind):
    """``size`` BF16 codes of one tile of ``kind`` (KINDS: Gaussian, Student-t with 2 degrees of
    freedom, any code at all, Gaussian with zeros; EDGE_KINDS: the codec's corner cases)."""
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
    raise ValueError(kind)
