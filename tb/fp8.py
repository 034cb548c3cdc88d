"""Random and boundary codes for the benches of the floating-point datapaths (``dtype``
fp8_e4m3, fp8_e5m2 or bf16): the codes of ``golden.fp``'s formats."""

import math

from golden import fp as golden_fp
from golden.moe_layer import FIXED_FRACTION, GATE_MAX_CODE, NAN_SCALE, UNIT_SCALE, unit_scale

__all__ = ["random_code", "random_token", "extreme_codes", "largest_code", "random_scales",
           "random_scale", "gate_window_codes", "UNIT_SCALES", "unit_scales", "FP32_EDGE_SCALES"]

UNIT_SCALES = {name: UNIT_SCALE for name in ("gate", "up", "down")}   # a weight load's default
# FP32 scales at the edges: zeros, the smallest and largest subnormal, the smallest normal,
# the largest finite (each sign), 2**-100 and 2**100, the infinities
FP32_EDGE_SCALES = (0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                    0xFF7FFFFF, 0x0D800000, 0x71800000, 0x7F800000, 0xFF800000)
FP32_NAN_SCALES = (0x7FC00000, 0x7F800001, 0xFFC00001)


def unit_scales(scale_format="e8m0"):
    """A weight load's unit scales (``gate``, ``up``, ``down``) in ``scale_format``."""
    return {name: unit_scale(scale_format) for name in UNIT_SCALES}


def random_code(rng, dtype, spread, infinities=True):
    """A code: mostly a normal value of standard deviation ``spread`` (subnormals and zeros of
    both signs included), sometimes any finite code (up to the largest: the saturating paths),
    rarely a NaN or (E5M2 and BF16, with ``infinities``) an infinity."""
    fmt, sign = golden_fp.FORMATS[dtype], _sign_bit(dtype)
    draw = rng.random()
    if draw < 0.01:
        nans = [fmt.canonical_nan, fmt.canonical_nan | sign]
        if fmt.ieee:
            nans += [fmt.max_code + 2, (fmt.max_code + 2) | sign]   # another NaN payload
        inf = fmt.max_code + 1
        if not fmt.ieee or not infinities:
            return rng.choice(nans)
        return rng.choice(nans + [inf, inf | sign])
    if draw < 0.1:
        while True:
            code = rng.randrange(1 << fmt.width)
            if math.isfinite(golden_fp.decode(code, dtype)):
                return code
    return golden_fp.encode(rng.gauss(0.0, spread), dtype)


def _sign_bit(dtype):
    return 1 << (golden_fp.FORMATS[dtype].width - 1)


def largest_code(dtype):
    """The largest finite positive value's code."""
    return golden_fp.FORMATS[dtype].max_code


def extreme_codes(dtype):
    """The largest and least finite values, the smallest subnormals and the zeros."""
    top, sign = largest_code(dtype), _sign_bit(dtype)
    return (top, top | sign, 1, 1 | sign, 0, sign)


def gate_window_codes(dtype):
    """Where the gate cuts a format to its fixed-point window (``golden.moe_layer.fixed_x``):
    none for FP8 (exact); for BF16 each sign of the largest value kept (65280) and the next
    (65536, saturated), and of 2**-16 (the window's unit), the codes either side of it
    (truncated to 0 and to 1)."""
    top = GATE_MAX_CODE[dtype]
    if top == largest_code(dtype):
        return ()
    unit = golden_fp.encode(2.0 ** -FIXED_FRACTION[dtype], dtype)
    return tuple(code | sign for code in (top, top + 1, unit - 1, unit, unit + 1)
                 for sign in (0, _sign_bit(dtype)))


def random_token(rng, dtype, size, extremes=False, infinities=True, spread=1.0):
    """``size`` codes: :func:`random_code` of ``spread``, or (``extremes``) each one of
    :func:`extreme_codes` and :func:`gate_window_codes`."""
    if extremes:
        return [rng.choice(extreme_codes(dtype) + gate_window_codes(dtype))
                for _ in range(size)]
    return [random_code(rng, dtype, spread, infinities) for _ in range(size)]


def random_scale(rng, scale_format="e8m0"):
    """A scale code. E8M0: mostly within 2**±4 of 1, sometimes an extreme (the smallest,
    2**-127, and the largest, 2**127, whose products underflow or overflow), rarely NaN
    (255). FP32: mostly a random significand within 2**±4 of 1 (one in eight negative),
    sometimes one of :data:`FP32_EDGE_SCALES` or a wide one (2**-30 to 2**50: the gate's
    scores saturate from every bit of its product, a mutant that missed one high bit survived
    scales within 2**±4), rarely a NaN."""
    draw = rng.random()
    if scale_format == "fp32":
        if draw < 0.02:
            return rng.choice(FP32_NAN_SCALES)
        if draw < 0.12:
            return rng.choice(FP32_EDGE_SCALES)
        sign = (1 << 31) if rng.random() < 0.125 else 0
        power = rng.randint(-30, 50) if draw < 0.32 else rng.randint(-4, 4)
        return sign | ((127 + power) << 23) | rng.getrandbits(23)
    if draw < 0.02:
        return NAN_SCALE
    if draw < 0.12:
        return rng.choice((0, 1, 100, 150, 253, 254))
    return UNIT_SCALE + rng.randint(-4, 4)


def random_scales(rng, scale_format="e8m0"):
    """An expert's weight-block scales (``gate``, ``up``, ``down``), each a
    :func:`random_scale` of ``scale_format``."""
    return {name: random_scale(rng, scale_format) for name in UNIT_SCALES}
