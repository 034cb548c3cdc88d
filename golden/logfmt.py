"""LogFMT-n in fixed point, bit for bit as the ``logfmt_encoder`` / ``logfmt_decoder`` blocks.

Source: seed 003 §3.2. Per 1 x m tile of BF16 elements: a sign bit and an (n-1)-bit code per
element; code 0 is zero, code c >= 1 stands for 2**(lo + step*(c-1)); the tile's smallest
log2|x| encodes as 1 and its largest as all ones, lo clamped above max - 32 (the seed's
min > max - log(2**32)); step = (max - lo) / (2**(n-1) - 2); each element goes to the level
nearer in *linear* space. The seed writes the levels with exp and log: any base gives the same
levels, so the hardware works in base 2. :func:`golden.fp.logfmt_encode` is the same rule in
float64, the ideal this fixed-point version is measured against.

Fixed point (every quantity an integer; "Qk" = k fraction bits):

* log2 of a BF16 magnitude, Q16: a finite nonzero x is 2**E * (1 + f/128) exactly (subnormals
  normalized, f 7 bits), and ``log2(x) = E * 2**16 + LOG_TABLE[f]`` with
  ``LOG_TABLE[f] = round(log2(1 + f/128) * 2**16)``: exact up to the table's rounding, no
  interpolation (BF16 has 7 fraction bits). Infinity counts as the largest finite value (casts
  saturate); NaN as zero, and the tile's ``nan`` flag is set.
* per tile: ``hi`` the largest, ``lo`` the smallest log2 (Q16) of its nonzero elements, lo
  raised to ``hi - 32 * 2**16`` if below; ``step = floor((hi - lo) * 2**8 / (2**(n-1) - 2))``,
  Q24. A tile without a nonzero element has lo = step = 0.
* encoding, per element of log2 l: ``d = l - lo`` (Q16). d < -2**16 (below half the smallest
  level, which is the linear midpoint between it and zero): code 0; -2**16 <= d < 0: code 1.
  Else the position ``pos = floor(d * recip / 2**(e + 8))`` in levels, Q8, where e is the bit
  length of step and ``recip = floor(2**(e + 24) / step)`` (26 bits; computed once per tile);
  k = pos >> 8 goes up one if the fraction ``pos & 255`` is at least ``theta = 128 +
  floor(step * LN2_Q16 / 2**35)``, the linear midpoint between two levels: its position is
  log2((1 + 2**s) / 2) / s = 1/2 + s ln2 / 8 + O(s**3) levels for a step of s binades (the
  cubic term is below 3e-5 levels for s <= 32/126); code = min(k, 2**(n-1) - 2) + 1. A step of
  0 puts every element with d >= 0 on code 1.
* decoding, per code c >= 1: ``v = lo * 2**8 + step * (c - 1)`` (Q24); the exponent is
  ``v >> 24`` and the fraction, rounded half up to 8 bits, indexes
  ``EXP_TABLE[i] = round(2**(i/256) * 128)`` (128..255; i = 256 carries into the exponent):
  the value ``EXP_TABLE[i] * 2**(e - 7)`` is exactly a BF16 significand; below the normal range
  it is shifted right and rounded to nearest even (subnormals kept), above it saturates to the
  largest finite value. Code 0 is a zero with the element's sign; a tile whose ``nan`` flag is
  set decodes to the canonical NaN (0x7FC0) everywhere.

The timing of the blocks (:func:`encoder_edges`) is here too.
"""

import dataclasses
import math

__all__ = ["DECODER_LATENCY", "ENCODER_STAGES", "LOG_FRAC", "STEP_FRAC", "POS_FRAC",
           "LOG_TABLE", "EXP_TABLE", "LN2_Q16", "RANGE_BINADES", "BF16_MAX", "BF16_NAN",
           "TileParams", "bf16_log2", "tile_params", "reciprocal", "theta", "position",
           "encode_element",
           "encode_tile", "decode_code", "decode_tile",
           "divider_bits_per_cycle", "divider_cycles", "encoder_fifo_rows", "encoder_edges"]

LOG_FRAC = 16                  # Q16 logarithms
# Edges from the decoder's taking a beat to its output's transfer, every port ready: four
# registers (the Q24 sum lo + step * (c - 1); the exponent and 2**(i/256); the BF16 exponent
# field, the subnormal shift and the case; the BF16 packing).
DECODER_LATENCY = 4
STEP_FRAC = 24                 # Q24 step
POS_FRAC = 8                   # Q8 positions (levels)
RANGE_BINADES = 32             # lo >= hi - 32 binades
LN2_Q16 = round(math.log(2) * (1 << 16))
RECIP_BITS = 26                # recip = floor(2**(e + 24) / step) lies in (2**24, 2**25]
BF16_MAX = 0x7F7F
BF16_NAN = 0x7FC0


def _round_half_even(value):
    return int(round(value))   # Python's round() is half-even


LOG_TABLE = tuple(_round_half_even(math.log2(1 + f / 128) * (1 << LOG_FRAC)) for f in range(128))
EXP_TABLE = tuple(_round_half_even(2 ** (i / 256) * 128) for i in range(256))
assert max(EXP_TABLE) < 256 and EXP_TABLE[0] == 128


@dataclasses.dataclass(frozen=True)
class TileParams:
    """What travels with a tile's codes: ``lo`` (Q16, signed), ``step`` (Q24) and ``nan``."""
    lo: int
    step: int
    nan: bool


def _levels(bits):
    return (1 << (bits - 1)) - 1               # magnitude codes 1..levels


def bf16_log2(code):
    """``(kind, sign, log2 Q16)`` of a BF16 code; kind is ``zero``, ``nan`` or ``num``
    (infinity taken as the largest finite value)."""
    sign = code >> 15
    field, fraction = (code >> 7) & 0xFF, code & 0x7F
    if field == 0xFF:
        if fraction:
            return "nan", sign, 0
        field, fraction = 0xFE, 0x7F
    if field == 0:
        if fraction == 0:
            return "zero", sign, 0
        top = fraction.bit_length() - 1        # a subnormal: fraction * 2**-133
        exponent = top - 133
        fraction = (fraction - (1 << top)) << (7 - top)
    else:
        exponent = field - 127
    return "num", sign, exponent * (1 << LOG_FRAC) + LOG_TABLE[fraction]


def tile_params(codes, bits):
    """The :class:`TileParams` of a tile of BF16 codes."""
    logs = []
    nan = False
    for code in codes:
        kind, _, log = bf16_log2(code)
        nan |= kind == "nan"
        if kind == "num":
            logs.append(log)
    if not logs:
        return TileParams(0, 0, nan)
    hi = max(logs)
    lo = max(min(logs), hi - RANGE_BINADES * (1 << LOG_FRAC))
    step = ((hi - lo) << (STEP_FRAC - LOG_FRAC)) // (_levels(bits) - 1)
    return TileParams(lo, step, nan)


def reciprocal(step):
    """``(recip, e)``: e the bit length of step, recip = floor(2**(e + 24) / step)."""
    e = step.bit_length()
    return (1 << (e + STEP_FRAC)) // step, e


def theta(step):
    """The position fraction (Q8) from which an element rounds up to the next level."""
    return (1 << (POS_FRAC - 1)) + ((step * LN2_Q16) >> 35)


def position(d, step):
    """``(pos, rest)``: the Q8 position of a log difference ``d`` (Q16, >= 0) in steps of
    ``step`` (Q24), d * 2**16 / step with the reciprocal: pos = floor(d * recip / 2**(e + 8));
    ``rest`` is the part cut off, as a fraction of one position unit (0 <= rest < 1)."""
    recip, e = reciprocal(step)
    product = d * recip
    return product >> (e + 8), (product & ((1 << (e + 8)) - 1)) / (1 << (e + 8))


def encode_element(code, params, bits):
    """The LogFMT code of one BF16 code in a tile of ``params``."""
    kind, sign, log = bf16_log2(code)
    sign_bit = sign << (bits - 1)
    if kind != "num":
        return sign_bit
    d = log - params.lo
    if d < -(1 << LOG_FRAC):
        return sign_bit
    if d < 0 or params.step == 0:
        return sign_bit | 1
    pos, _ = position(d, params.step)
    k = pos >> POS_FRAC
    if pos & ((1 << POS_FRAC) - 1) >= theta(params.step):
        k += 1
    return sign_bit | (min(k, _levels(bits) - 1) + 1)


def encode_tile(codes, bits):
    """``(LogFMT codes, TileParams)`` of a tile of BF16 codes."""
    params = tile_params(codes, bits)
    return [encode_element(code, params, bits) for code in codes], params


def decode_code(code, params, bits):
    """The BF16 code of one LogFMT code of a tile of ``params``."""
    if params.nan:
        return BF16_NAN
    sign = (code >> (bits - 1)) & 1
    magnitude = code & _levels(bits)
    if magnitude == 0:
        return sign << 15
    value = (params.lo << (STEP_FRAC - LOG_FRAC)) + params.step * (magnitude - 1)
    exponent = value >> STEP_FRAC
    index = ((value & ((1 << STEP_FRAC) - 1)) + (1 << 15)) >> 16
    if index == 256:
        exponent, index = exponent + 1, 0
    significand = EXP_TABLE[index]             # value = significand * 2**(exponent - 7)
    biased = exponent + 127
    if biased >= 255:
        return (sign << 15) | BF16_MAX
    if biased >= 1:
        return (sign << 15) | (biased << 7) | (significand - 128)
    shift = 1 - biased
    if shift > 9:
        return sign << 15
    kept = significand >> shift
    rest = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and kept & 1):
        kept += 1                              # 128: the smallest normal, encoded the same
    return (sign << 15) | kept


def decode_tile(codes, params, bits):
    return [decode_code(code, params, bits) for code in codes]


# --- timing -------------------------------------------------------------------------------

def divider_bits_per_cycle(tile, lanes):
    """Quotient bits the encoder's reciprocal divider finds a cycle: just enough to finish a
    tile's reciprocal within the T = tile/lanes cycles its rows take to arrive."""
    beats = tile // lanes
    return -(-RECIP_BITS // beats)


def divider_cycles(tile, lanes):
    """Q: cycles of the reciprocal division (at most T)."""
    return -(-RECIP_BITS // divider_bits_per_cycle(tile, lanes))


# From a tile's last row taken at edge t: the range registers hold the tile at t; the binades
# and fraction indices of the range are registered at t + 1, their logs at t + 2, lo at t + 3,
# the difference at t + 4, the partial products of step at t + 5, step at t + 6, its leading
# one at t + 7; the divider's first state (and theta) at t + 8; the divider's Q-th step, at
# t + 8 + Q, also writes the tile's entry into the parameter FIFO; its first row can leave the
# element FIFO at t + 9 + Q (popped into the first of the ENCODER_STAGES output-side
# registers) and is taken by a ready consumer ENCODER_STAGES edges later.
PARAMS_READY = 9               # first pop edge - last row edge - Q
# Registers a row passes from its pop to the output, moving together: the row; the binades
# and fraction indices; the logs; d = log - lo; four partial products with recip; their sum;
# the Q8 position; the codes (the output register).
ENCODER_STAGES = 8


def encoder_fifo_rows(tile, lanes):
    """Rows of the element FIFO: a row waits T - 1 + PARAMS_READY + Q edges at most with every
    port ready; the rest is margin so that the input never waits in steady state."""
    beats = tile // lanes
    return beats + divider_cycles(tile, lanes) + PARAMS_READY + 1


def encoder_edges(taken, tile, lanes):
    """Edges at which a consumer that is always ready takes the output rows, given the edges
    ``taken`` at which the input rows were taken (complete tiles): each row is popped one edge
    after it arrived at the earliest, its tile's parameters ready PARAMS_READY + Q edges after
    the tile's last row, one pop an edge; it reaches the output ENCODER_STAGES edges later."""
    beats = tile // lanes
    q = divider_cycles(tile, lanes)
    out, previous = [], None
    for index, edge in enumerate(taken):
        tile_last = taken[(index // beats) * beats + beats - 1]
        pop = max(edge + 1, tile_last + PARAMS_READY + q)
        if previous is not None:
            pop = max(pop, previous + 1)
        out.append(pop + ENCODER_STAGES)
        previous = pop
    return out
