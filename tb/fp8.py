"""Random and boundary FP8 codes for the benches of the floating-point datapaths (``dtype``
fp8_e4m3 or fp8_e5m2): the codes of ``golden.fp``'s formats."""

import math

from golden import fp as golden_fp
from golden.moe_layer import NAN_SCALE, UNIT_SCALE

__all__ = ["random_code", "random_token", "extreme_codes", "largest_code", "random_scales",
           "random_scale", "UNIT_SCALES"]

UNIT_SCALES = {name: UNIT_SCALE for name in ("gate", "up", "down")}   # a weight load's default


def random_code(rng, dtype, spread, infinities=True):
    """A code: mostly a normal value of standard deviation ``spread`` (subnormals and zeros of
    both signs included), sometimes any finite code (up to the largest: the saturating paths),
    rarely a NaN or (E5M2, with ``infinities``) an infinity."""
    draw = rng.random()
    if draw < 0.01:
        if dtype == "fp8_e4m3" or not infinities:
            return rng.choice((0x7F, 0xFF) if dtype == "fp8_e4m3" else (0x7D, 0xFE))
        return rng.choice((0x7C, 0xFC, 0x7D, 0xFE))
    if draw < 0.1:
        while True:
            code = rng.randrange(256)
            if math.isfinite(golden_fp.decode(code, dtype)):
                return code
    return golden_fp.encode(rng.gauss(0.0, spread), dtype)


def largest_code(dtype):
    """The largest finite positive value's code."""
    return golden_fp.FORMATS[dtype].max_code


def extreme_codes(dtype):
    """The largest and least finite values, the smallest subnormals and the zeros."""
    top = largest_code(dtype)
    return (top, top | 0x80, 1, 0x81, 0, 0x80)


def random_token(rng, dtype, size, extremes=False, infinities=True):
    """``size`` codes: :func:`random_code` of spread 1, or (``extremes``) each one of
    :func:`extreme_codes`."""
    if extremes:
        return [rng.choice(extreme_codes(dtype)) for _ in range(size)]
    return [random_code(rng, dtype, 1.0, infinities) for _ in range(size)]


def random_scale(rng):
    """An E8M0 scale code: mostly within 2**±4 of 1, sometimes an extreme (the smallest,
    2**-127, and the largest, 2**127, whose products underflow or overflow), rarely NaN
    (255)."""
    draw = rng.random()
    if draw < 0.02:
        return NAN_SCALE
    if draw < 0.12:
        return rng.choice((0, 1, 100, 150, 253, 254))
    return UNIT_SCALE + rng.randint(-4, 4)


def random_scales(rng):
    """An expert's E8M0 weight-block scales (``gate``, ``up``, ``down``), each a
    :func:`random_scale`."""
    return {name: random_scale(rng) for name in UNIT_SCALES}
