"""Low-precision floating-point formats and the FP8 dot-product accumulator, bit for bit.

Pure Python/NumPy (no amaranth, no hw/); ml_dtypes (``tests/test_fp.py``) cross-checks the
casts where its rules and ours agree.

Sources: seed 003 §3.1 (FP8 training: E4M3 with 1x128 activation tiles and 128x128 weight blocks;
Hopper tensor cores align the products of a group to the largest exponent, keep the highest 13
fraction bits and truncate the rest; promotion of partial sums into FP32 every 128 elements).

Formats (``FORMATS``): ``fp8_e4m3`` (OCP E4M3FN: bias 7, max 448, no infinity, S.1111.111 is
NaN), ``fp8_e5m2`` (bias 15, IEEE-style infinities and NaNs, max 57344), ``bf16`` and ``fp32``
(IEEE). One rule for every cast to a format (:func:`encode`):

* round to nearest, ties to even, at the format's precision, subnormals included (kept, never
  flushed);
* a finite value whose rounded magnitude exceeds the largest finite one saturates to it (FP8
  training pipelines do this; ml_dtypes instead gives NaN for E4M3 and infinity for E5M2);
* an infinite value stays infinite where the format has infinities and saturates where it has
  none (E4M3);
* NaN gives the format's canonical NaN (E4M3 0x7F, E5M2 0x7E, BF16 0x7FC0, FP32 0x7FC00000),
  with the input's sign bit;
* zero keeps its sign; a nonzero value that rounds to zero gets the sign of the value.

Every value of these formats is exactly a Python float (binary64), so :func:`decode` returns
floats; exact arithmetic is done on integers, a value being ``m * 2**x``.
"""

import dataclasses
import math
from fractions import Fraction

__all__ = ["Format", "FORMATS", "decode", "encode", "components", "e8m0_decode", "SCALE_BITS",
           "scale_decode", "add", "multiply", "scale_cast", "DotConfig", "dot", "dot_take_edges",
           "exact_dot", "logfmt_encode", "logfmt_decode"]


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, ``exp_bits``, ``man_bits``, ``bias``;
    ``ieee``: the all-ones exponent holds infinities and NaNs (else only S.1..1.1..1 is NaN)."""
    name: str
    exp_bits: int
    man_bits: int
    bias: int
    ieee: bool
    canonical_nan: int

    @property
    def width(self):
        return 1 + self.exp_bits + self.man_bits

    @property
    def emin(self):
        """Exponent of the smallest normal value (also the subnormals' scale)."""
        return 1 - self.bias

    @property
    def max_code(self):
        """Code of the largest finite positive value."""
        top = (1 << self.exp_bits) - 1
        if self.ieee:
            return ((top - 1) << self.man_bits) | ((1 << self.man_bits) - 1)
        return (top << self.man_bits) | ((1 << self.man_bits) - 2)

    @property
    def max_finite(self):
        return decode(self.max_code, self)


FORMATS = {
    "fp8_e4m3": Format("fp8_e4m3", 4, 3, 7, False, 0x7F),
    "fp8_e5m2": Format("fp8_e5m2", 5, 2, 15, True, 0x7E),
    "bf16": Format("bf16", 8, 7, 127, True, 0x7FC0),
    "fp32": Format("fp32", 8, 23, 127, True, 0x7FC00000),
}


def _format(fmt):
    return FORMATS[fmt] if isinstance(fmt, str) else fmt


def components(code, fmt):
    """``(kind, sign, m, x)`` of a code: kind "nan", "inf" or "num"; for numbers the value is
    ``(-1)**sign * m * 2**x`` with m >= 0 an integer (hidden bit included; 0 for zero)."""
    fmt = _format(fmt)
    sign = (code >> (fmt.width - 1)) & 1
    field = (code >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    man = code & ((1 << fmt.man_bits) - 1)
    top = (1 << fmt.exp_bits) - 1
    if fmt.ieee and field == top:
        return ("inf" if man == 0 else "nan"), sign, 0, 0
    if not fmt.ieee and field == top and man == (1 << fmt.man_bits) - 1:
        return "nan", sign, 0, 0
    if field == 0:
        return "num", sign, man, fmt.emin - fmt.man_bits
    return "num", sign, man | (1 << fmt.man_bits), field - fmt.bias - fmt.man_bits


def decode(code, fmt):
    """The value of a code, as a float (exact)."""
    kind, sign, m, x = components(code, fmt)
    if kind == "nan":
        return math.nan
    value = math.inf if kind == "inf" else math.ldexp(m, x)
    return -value if sign else value


def _floor_log2(value):
    """floor(log2(value)) of a positive Fraction."""
    e = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** e > value:
        e -= 1
    elif Fraction(2) ** (e + 1) <= value:
        e += 1
    return e


def _round_half_even(value):
    floor = value.numerator // value.denominator
    rest = value - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2):
        return floor + 1
    return floor


def encode(value, fmt):
    """The code of ``value`` (a float, int or Fraction) under the cast rule of the module."""
    fmt = _format(fmt)
    sign_bit = 1 << (fmt.width - 1)
    if isinstance(value, float):
        if math.isnan(value):
            return fmt.canonical_nan | (sign_bit if math.copysign(1, value) < 0 else 0)
        negative = math.copysign(1, value) < 0
        if math.isinf(value):
            if fmt.ieee:
                return (sign_bit if negative else 0) | (((1 << fmt.exp_bits) - 1)
                                                        << fmt.man_bits)
            return (sign_bit if negative else 0) | fmt.max_code
        magnitude = Fraction(abs(value))
    else:
        magnitude = abs(Fraction(value))
        negative = value < 0
    sign = sign_bit if negative else 0
    if magnitude == 0:
        return sign
    e = max(_floor_log2(magnitude), fmt.emin)
    quantum = Fraction(2) ** (e - fmt.man_bits)
    rounded = _round_half_even(magnitude / quantum) * quantum
    if rounded == 0:
        return sign
    if rounded > Fraction(fmt.max_finite):
        return sign | fmt.max_code
    e = _floor_log2(rounded)
    if e < fmt.emin:                                    # subnormal
        return sign | int(rounded / Fraction(2) ** (fmt.emin - fmt.man_bits))
    man = int(rounded / Fraction(2) ** (e - fmt.man_bits)) - (1 << fmt.man_bits)
    return sign | ((e + fmt.bias) << fmt.man_bits) | man


def add(a, b, fmt):
    """The code of a + b for two codes of an IEEE-style format, rounded once under the cast rule
    (nearest even, subnormals kept, a finite sum past the largest finite value saturates).
    A NaN operand or infinities of both signs give the canonical NaN (sign bit 0); otherwise an
    infinity gives itself. An exact zero sum is +0, except -0 + -0 = -0."""
    fmt = _format(fmt)
    kind_a, sign_a, m_a, x_a = components(a, fmt)
    kind_b, sign_b, m_b, x_b = components(b, fmt)
    if "nan" in (kind_a, kind_b) or (kind_a == kind_b == "inf" and sign_a != sign_b):
        return fmt.canonical_nan
    if kind_a == "inf":
        return a
    if kind_b == "inf":
        return b
    total = (-1) ** sign_a * Fraction(m_a) * Fraction(2) ** x_a + \
        (-1) ** sign_b * Fraction(m_b) * Fraction(2) ** x_b
    if total == 0:
        return (1 << (fmt.width - 1)) if (sign_a and sign_b) else 0
    return encode(total, fmt)


def multiply(a, fmt_a, b, fmt_b, dst, shift=0):
    """The code of ``dst`` for a * b * 2**-shift, rounded once under the cast rule (nearest
    even, subnormals kept, a finite product past the largest finite value saturates).

    ``fmt_b`` None: b is an unsigned integer (a gate weight). A NaN operand or an infinity times
    zero gives ``dst``'s canonical NaN (sign bit 0); an infinity times a nonzero gives the
    infinity of the product's sign (the largest finite value where ``dst`` has none); a zero
    product is a zero with the product's sign (the exclusive or of the signs)."""
    dst = _format(dst)
    kind_a, sign_a, m_a, x_a = components(a, fmt_a)
    kind_b, sign_b, m_b, x_b = components(b, fmt_b) if fmt_b is not None else ("num", 0, b, 0)
    sign = sign_a ^ sign_b
    zero_a, zero_b = kind_a == "num" and m_a == 0, kind_b == "num" and m_b == 0
    if "nan" in (kind_a, kind_b) or (kind_a == "inf" and zero_b) or (kind_b == "inf" and zero_a):
        return dst.canonical_nan
    if "inf" in (kind_a, kind_b):
        return encode(-math.inf if sign else math.inf, dst)
    if zero_a or zero_b:
        return sign << (dst.width - 1)
    value = Fraction(m_a * m_b) * Fraction(2) ** (x_a + x_b - shift)
    return encode(-value if sign else value, dst)


def scale_cast(code, src, dst, shift=0):
    """The code of ``dst`` for code's value times 2**-shift (:func:`multiply` by one): the cast
    rule, a zero keeping its sign, a NaN giving ``dst``'s canonical NaN with sign bit 0."""
    return multiply(code, src, 1, None, dst, shift)


def e8m0_decode(code):
    """An E8M0 scale: 2**(code - 127); code 255 is NaN."""
    return math.nan if code == 255 else math.ldexp(1.0, code - 127)


SCALE_BITS = {"e8m0": 8, "fp32": 32}        # a scale code's bits, by ``scale_format``


def scale_decode(code, scale_format):
    """A scale code's value (a float; NaN for a NaN code): E8M0 or FP32."""
    return e8m0_decode(code) if scale_format == "e8m0" else decode(code, "fp32")


# --- the dot-product unit (block ``fp_dot``, docs/blocks/fp.md and docs/numerics.md) ---

ACC_EMIN, ACC_EMAX = -126, 127          # the accumulator's 8-bit exponent range

# The unit's cycle model (docs/blocks/fp.md, Timing). A beat names its slot: one of the dot
# products the unit holds at once, each with its own partial sum and FP32 accumulator. The
# partial-sum loop (read a slot's partial sum, add the beat's products, renormalize, write it
# back) takes DOT_PARTIAL_STAGES cycles and the FP32 loop (read the slot's accumulator, add
# the scaled partial sum, round, write it back) DOT_TOTAL_STAGES: so a slot's next beat is
# taken DOT_SLOT_GAP edges after its last one at the earliest, and beats of different slots
# one per cycle. The result of a dot product whose last beat is taken at edge t is taken at
# edge t + DOT_LATENCY with every port ready: DOT_FRONT_STAGES registers before the partial-sum
# loop (the products; which lane of each group of lanes has the largest exponent; that
# exponent; the beat's; each product's shift; the aligned products; the bit columns' counts
# per group of lanes; in all; two levels of their suffix sums; the beat's sums for every
# shift), the loop's (its last holds the new partial sum), DOT_SCALE_STAGES for the partial
# sum times its scales (the products of 18-bit slices of the scales' mantissa, their sum, its
# leading one), the FP32 loop's (its last is the output register).
DOT_FRONT_STAGES = 10
DOT_PARTIAL_STAGES = 9
DOT_SCALE_STAGES = 3
DOT_TOTAL_STAGES = 14
DOT_SLOT_GAP = max(DOT_PARTIAL_STAGES, DOT_TOTAL_STAGES)
DOT_LATENCY = DOT_FRONT_STAGES + DOT_PARTIAL_STAGES + DOT_SCALE_STAGES + DOT_TOTAL_STAGES


def dot_take_edges(slots, first_edge=0, held=None):
    """The edges at which beats of ``slots`` (each beat's slot, in order) are taken when each is
    offered as soon as the one before it is taken and every result is taken at once: one a
    cycle, but a slot's beat no sooner than DOT_SLOT_GAP edges after that slot's previous. A
    beat naming no slot the unit holds (``held`` of them, 0 .. held - 1) waits for nothing."""
    edges, previous = [], {}
    for slot in slots:
        edge = edges[-1] + 1 if edges else first_edge
        if held is None or slot < held:
            edge = max(edge, previous.get(slot, first_edge - DOT_SLOT_GAP) + DOT_SLOT_GAP)
            previous[slot] = edge
        edges.append(edge)
    return edges


@dataclasses.dataclass(frozen=True)
class DotConfig:
    """The accumulation of a dot-product unit.

    ``group``: g products per step, aligned together with the accumulator; ``acc_frac``: the
    accumulator's fraction bits (13: Hopper's FP22, 23: FP32-like); ``promote_every``: elements
    after which the partial sum is scaled and added into the FP32 accumulator (0: only at the
    end); ``scale_block``: elements per scale (1x128 activation tiles, 128x128 weight blocks).
    """
    group: int = 32
    acc_frac: int = 13
    promote_every: int = 128
    scale_block: int = 128

    def __post_init__(self):
        if self.promote_every % self.group:
            raise ValueError(f"promote_every {self.promote_every}: a multiple of group "
                             f"({self.group}) or 0")
        if self.promote_every and self.scale_block % self.promote_every:
            raise ValueError(f"promote_every {self.promote_every}: a divisor of scale_block "
                             f"({self.scale_block}), so a partial sum has one scale")


class _Accumulator:
    """The partial sum: ``m * 2**(e - F)``, |m| < 2**(F+1), normalized (|m| >= 2**F) unless at
    the lowest exponent; truncation toward zero wherever bits are dropped."""

    def __init__(self, frac):
        self.frac, self.m, self.e = frac, 0, ACC_EMIN
        self.overflow = False

    def value(self):
        return Fraction(self.m) * Fraction(2) ** (self.e - self.frac)

    def add(self, products):
        """One step: ``products`` are ``(m, x)`` exact values m * 2**x (m signed)."""
        live = [(m, x) for m, x in products if m]
        exponents = [x + abs(m).bit_length() - 1 for m, x in live]
        if self.m:
            exponents.append(self.e)
        if not exponents:
            return
        top = max(max(exponents), ACC_EMIN)
        unit = top - self.frac                          # weight of the lowest kept bit

        def aligned(m, x):
            shift = x - unit
            magnitude = abs(m) << shift if shift >= 0 else abs(m) >> -shift
            return -magnitude if m < 0 else magnitude

        total = aligned(self.m, self.e - self.frac) + sum(aligned(m, x) for m, x in live)
        if total == 0:
            self.m, self.e = 0, ACC_EMIN
            return
        shift = abs(total).bit_length() - 1 - self.frac  # > 0: carry bits to drop
        exponent = top + shift
        if exponent < ACC_EMIN:
            shift, exponent = ACC_EMIN - top, ACC_EMIN
        magnitude = abs(total) >> shift if shift >= 0 else abs(total) << -shift
        if exponent > ACC_EMAX:
            magnitude, exponent, self.overflow = (1 << (self.frac + 1)) - 1, ACC_EMAX, True
        self.m, self.e = (-magnitude if total < 0 else magnitude), exponent


def _product(a, b, fmt_a, fmt_b):
    ka, sa, ma, xa = components(a, fmt_a)
    kb, sb, mb, xb = components(b, fmt_b)
    kind = "nan" if "nan" in (ka, kb) else "inf" if "inf" in (ka, kb) else "num"
    if kind == "inf" and ((ka == "num" and ma == 0) or (kb == "num" and mb == 0)):
        kind = "nan"                                    # inf * 0
    m = ma * mb
    return kind, sa ^ sb, (-m if sa ^ sb else m), xa + xb


def dot(a, b, fmt_a, fmt_b, config=DotConfig(), scale_a=None, scale_b=None):
    """The dot product of codes ``a`` and ``b`` as the unit computes it: an FP32 code.

    Steps of ``group`` products (a short last step is padded with zeros) go into the
    partial-sum accumulator; every ``promote_every`` elements and at the end the partial sum,
    times its scales, is added into the FP32 accumulator, rounded once (to nearest even,
    saturating) and the partial sum restarts from zero. ``scale_a``/``scale_b``: one float per
    ``scale_block`` elements (default all 1; with ``promote_every`` 0 they must be uniform).
    NaN operands, infinity times zero, infinities of both signs and a NaN or infinite scale give
    NaN; otherwise an infinite product gives that infinity.
    """
    count = len(a)
    blocks = -(-count // config.scale_block)
    scale_a = [1.0] * blocks if scale_a is None else list(scale_a)
    scale_b = [1.0] * blocks if scale_b is None else list(scale_b)
    products = [_product(x, y, fmt_a, fmt_b) for x, y in zip(a, b)]
    kinds = {kind for kind, *_ in products}
    scales = scale_a + scale_b
    if "nan" in kinds or not all(math.isfinite(s) for s in scales):
        return FORMATS["fp32"].canonical_nan
    infinite = {sign for kind, sign, _, _ in products if kind == "inf"}
    if len(infinite) == 2:
        return FORMATS["fp32"].canonical_nan
    if infinite:
        return encode(-math.inf if infinite.pop() else math.inf, "fp32")
    if not config.promote_every and (len(set(scale_a)) > 1 or len(set(scale_b)) > 1):
        raise ValueError("scales that change along K need promote_every > 0")
    span = config.promote_every or count or 1
    total = Fraction(0)
    for start in range(0, max(count, 1), span):
        partial = _Accumulator(config.acc_frac)
        chunk = products[start:start + span]
        for step in range(0, len(chunk), config.group):
            partial.add([(m, x) for _, _, m, x in chunk[step:step + config.group]])
        block = start // config.scale_block
        scaled = partial.value() * Fraction(scale_a[block]) * Fraction(scale_b[block])
        total = Fraction(decode(encode(total + scaled, "fp32"), "fp32"))
    return encode(total, "fp32")


def exact_dot(a, b, fmt_a, fmt_b):
    """The exact sum of the exact products (a Fraction), the reference of the error tables."""
    return sum((Fraction(decode(x, fmt_a)) * Fraction(decode(y, fmt_b))
                for x, y in zip(a, b)), Fraction(0))


# --- LogFMT-n (seed 003 §3.2): the reference numerics (float64 logarithms) ---

LOG_RANGE = 32 * math.log(2)           # min is clamped above max - log(2**32)


def logfmt_encode(tile, bits):
    """A 1 x m tile in LogFMT-``bits``: ``(codes, minimum, step)``.

    Per element a sign bit and a (bits-1)-bit code: 0 is zero; code c >= 1 stands for
    exp(minimum + step*(c-1)). ``minimum`` and the largest log|x| of the tile's nonzero elements
    encode as 1 and as all ones, minimum clamped above max - log(2**32); step = (max - minimum) /
    (2**(bits-1) - 2). Each element goes to the nearer of its two neighbouring levels (or zero)
    *in linear space*, ties to the larger magnitude. Float64 logarithms here: the hardware's
    fixed-point log and exp, with their bit-exact model, come with the encoder blocks.
    """
    levels = (1 << (bits - 1)) - 1                       # codes 1..levels
    magnitudes = [abs(float(v)) for v in tile]
    logs = [math.log(a) for a in magnitudes if a > 0]
    if not logs:
        return [0] * len(magnitudes), 0.0, 0.0
    top = max(logs)
    minimum = max(min(logs), top - LOG_RANGE)
    step = (top - minimum) / (levels - 1)
    sign_bit = 1 << (bits - 1)
    codes = []
    for value, magnitude in zip(tile, magnitudes):
        sign = sign_bit if float(value) < 0 else 0
        if magnitude == 0:
            codes.append(sign)
            continue
        if step == 0:
            codes.append(sign | 1)
            continue
        position = (math.log(magnitude) - minimum) / step
        low = min(max(math.floor(position), -1), levels - 1)   # -1: below the minimum (zero)
        high = min(low + 1, levels - 1)

        def level(k):
            return 0.0 if k < 0 else math.exp(minimum + step * k)
        below, above = level(low), level(high)
        k = high if abs(above - magnitude) <= abs(magnitude - below) else low
        codes.append(sign | (k + 1))
    return codes, minimum, step


def logfmt_decode(codes, minimum, step, bits):
    """Values of LogFMT-``bits`` codes: 0 for code 0, else +-exp(minimum + step*(code-1))."""
    out = []
    for code in codes:
        magnitude_code = code & ((1 << (bits - 1)) - 1)
        value = 0.0 if magnitude_code == 0 else math.exp(minimum + step * (magnitude_code - 1))
        out.append(-value if code >> (bits - 1) else value)
    return out
