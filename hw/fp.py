"""FP8/BF16 dot products: block ``fp_dot`` (contract: docs/blocks/fp.md).

Source: seed 003 §3.1 (DeepSeek-V3's FP8 GEMMs on Hopper: the products of a group are aligned
to the largest exponent among them and the accumulator, the bits below ``acc_frac`` fraction
bits are truncated, and the sum is kept with an 8-bit exponent: FP22 for acc_frac = 13; every
128 elements the partial sum is promoted into FP32, where the fine-grained scales apply). The
numerics are :func:`golden.fp.dot`, bit for bit.

One beat of ``group`` g operand pairs per cycle. ``FpAccumulator.step`` does a beat in one
cycle (the floating-point PEs, g = 1); ``fp_dot`` pipelines the same steps, and holds
``slots`` dot products at once, each with its own partial sum and FP32 accumulator: a beat
names its slot, and a slot's next beat waits until its last has gone round both loops
(``golden.fp.DOT_SLOT_GAP`` edges), so that each loop can take several cycles and the unit still
takes a beat a cycle from that many slots in turn. The steps:

1. decode the 2g operands (sign, mantissa with its hidden bit, exponent of its last bit; NaN,
   infinity), multiply the mantissas exactly and add the exponents;
2. E = the largest of the nonzero products' leading-bit exponents, the partial sum's (when
   nonzero) and -126;
3. align each product and the partial sum to E: magnitude * 2**(its exponent - E + F),
   truncated toward zero (a right barrel shift), signed;
4. add the g + 1 terms exactly, renormalize to F + 1 significant bits (truncating toward zero;
   at exponent -126 the sum stays unnormalized; above 127 it saturates);
5. at a promotion: the partial sum times the two FP32 scales (exact, at most 73 bits) plus the
   FP32 accumulator, added in an 80-bit field with a sticky bit and rounded once to FP32.

The pipeline (``golden.fp.DOT_LATENCY`` registers; docs/blocks/fp.md, Timing): ten in front,
(1) the products; (2) which lane of each group of MAX_GROUP lanes has the largest leading-bit
exponent, (3) that exponent; (4) the beat's own largest exponent B (at least -126); (5) each
product's shift to it; (6) each product aligned to B, in F + 1 bits (B is at least each
product's leading-bit exponent); (7) the bit columns' counts per group of lanes, (8) in all,
and from them (9, 10), for every further shift d = 0..F, the beat's sum with each term
shifted right by d and truncated (a product aligned to E = max(B, partial sum's) is its
B-aligned value shifted by E - B, since floor(floor(x) / 2**d) = floor(x / 2**d)). Then the partial-sum loop over
``golden.fp.DOT_PARTIAL_STAGES`` cycles (steps 2 to 4: read the slot's partial sum; compare
its exponent with B, and d = E - B; pick the sum for d (none past F: zero); add the aligned
partial sum; its magnitude; its leading one; how far to shift it; shift it to F + 1 bits;
saturate and write it back), the partial sum times its scales over
``golden.fp.DOT_SCALE_STAGES``, and the FP32 loop over ``golden.fp.DOT_TOTAL_STAGES`` cycles
(step 5: read the slot's accumulator; decode it; its leading one; the operands' shifts; clamp
them; align; add; the sum's sign and magnitude; its leading one; the bits to drop; their mask;
the bits kept and the rounding bits; round; its code, written back) into the output register.
Each stage holds a few LUT levels (issue 20's 100 MHz on ECP5): a wide shift, a leading-one
search or a long carry chain, each with little before or after it. The registers past the
front are placed by the ``cut`` argument of ``FpAccumulator``'s steps (``_normalize``,
``_scaled``, ``_add_round``; in front, ``aligned_product``), which ``step`` calls with none.
"""

import dataclasses

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import fp as golden
from hw.fparith import fp_fields
from hw.params import ConfiguredComponent, choice_param, int_param, param_error, validate
from hw.pipeline import (StallPipe, leading_one, leading_one_tree, max_all_pairs, max_tree,
                         sum_tree)
from hw.registry import Block, register

__all__ = ["FpDotConfig", "FpDot", "input_layout", "result_layout"]

ACC_EXPONENT_BITS = 9              # signed -126..127 (the 8-bit exponent's range)
MAX_GROUP = 8                      # lanes whose largest exponent one fp_dot stage finds
SCALE_BLOCK = 128                  # elements per scale (1x128 tiles, 128x128 blocks)
FIELD = 80                         # promotion adder: bits from the larger operand's top down
DSP_OPERAND_BITS = 18              # an ECP5 MULT18X18D's: fp_dot's scale product in slices of it
FP32 = golden.FORMATS["fp32"]


@dataclasses.dataclass(frozen=True)
class FpDotConfig:
    """Parameters of ``fp_dot``.

    Parameters
    ----------
    dtype : str
        Operand format: ``fp8_e4m3``, ``fp8_e5m2`` or ``bf16`` (``golden.fp.FORMATS``).
    group : int
        g, operand pairs per beat, aligned together (1..32).
    acc_frac : int
        F, fraction bits of the accumulator (4..24; 13 is Hopper's FP22, 23 FP32-like).
    promote_every : int
        Elements after which the partial sum, times its scales, is added into the FP32
        accumulator (0: only at the end; else a multiple of g dividing 128).
    scale_format : str
        ``fp32`` (32-bit scales, multiplied in) or ``e8m0`` (8-bit powers of two 2**(c-127),
        255 = NaN: an exponent add, no multiplier).
    slots : int
        Dot products held at once (1..32), each with its own partial sum and FP32
        accumulator; a beat names its slot. A slot takes a beat every
        ``golden.fp.DOT_SLOT_GAP`` cycles at most, so the unit takes one a cycle from that
        many slots in turn.
    """
    dtype: str = choice_param("fp8_e4m3", ("fp8_e4m3", "fp8_e5m2", "bf16"), "operand format")
    group: int = int_param(32, 1, 32, "g, operand pairs per beat (aligned together)")
    acc_frac: int = int_param(13, 4, 24, "F, fraction bits of the accumulator")
    promote_every: int = int_param(128, 0, 128, "elements per promotion into FP32 (0: at the end)")
    scale_format: str = choice_param("fp32", ("fp32", "e8m0"), "format of the scales")
    slots: int = int_param(16, 1, 32, "dot products held at once (a beat names its slot)")

    def __post_init__(self):
        validate(self)
        if self.promote_every and (self.promote_every % self.group
                                   or SCALE_BLOCK % self.promote_every):
            raise param_error("promote_every", self.promote_every,
                              f"0 or a multiple of group ({self.group}) that divides "
                              f"{SCALE_BLOCK} (one scale pair per partial sum)")

    @property
    def scale_bits(self):
        return golden.SCALE_BITS[self.scale_format]

    @property
    def slot_bits(self):
        """Bits of a beat's and a result's ``slot`` field (at least one)."""
        return max(1, ceil_log2(self.slots))

    @property
    def chunk_beats(self):
        """Beats per promotion (0: the whole dot product)."""
        return self.promote_every // self.group

    @property
    def format(self):
        return golden.FORMATS[self.dtype]


def input_layout(config):
    code = config.format.width
    return data.StructLayout({"a": data.ArrayLayout(code, config.group),
                              "b": data.ArrayLayout(code, config.group),
                              "scale_a": config.scale_bits, "scale_b": config.scale_bits,
                              "last": 1, "slot": config.slot_bits})


def result_layout(config):
    """``result``: the dot product as an FP32 code; ``slot``: the slot its beats named."""
    return data.StructLayout({"result": 32, "slot": config.slot_bits})


def _operand(m, code, name, fmt):
    """``(nan, inf, sign, mantissa, exponent of its last bit)`` of a code of ``fmt``."""
    return fp_fields(m, code, fmt, name, ACC_EXPONENT_BITS + 1)


def _in_one_cycle(values):
    """The ``cut`` of a step done in one cycle: no register, the values as they are. A pipeline
    passes a function that registers them (and whatever else it carries beside them)."""
    return values


class FpAccumulator:
    """The numerics of ``fp_dot`` for one dot product at a time: its state registers and the
    step that takes one beat of g operand pairs (see the module docstring). Shared by ``fp_dot``
    (one accumulator) and the floating-point systolic arrays (one per PE, g = 1).

    Parameters
    ----------
    m : Module
    dtype, group, acc_frac, scale_format
        As in :class:`FpDotConfig`.
    prefix : str
        Prefix of every signal's name.

    Members
    -------
    total_code : Signal(32)
        The FP32 accumulator; after a dot product's last beat, its result.
    """

    def __init__(self, m, dtype, group, acc_frac, scale_format, prefix=""):
        self.m, self.prefix = m, prefix
        self.format = golden.FORMATS[dtype]
        self.group, self.acc_frac, self.scale_format = group, acc_frac, scale_format
        F = acc_frac
        self.acc_sign = Signal(name=f"{prefix}acc_sign")
        self.acc_m = Signal(F + 1, name=f"{prefix}acc_m")
        self.acc_e = Signal(signed(ACC_EXPONENT_BITS), init=golden.ACC_EMIN, name=f"{prefix}acc_e")
        self.nan_seen = Signal(name=f"{prefix}nan_seen")
        self.inf_pos = Signal(name=f"{prefix}inf_pos")
        self.inf_neg = Signal(name=f"{prefix}inf_neg")
        self.total_code = Signal(32, name=f"{prefix}total")

    def step(self, a, b, scale_a, scale_b, part_first, dot_first, promote, last):
        """The register updates of one beat in one cycle (the floating-point PEs; ``fp_dot``
        pipelines the same pieces): ``a``, ``b`` g codes each; ``part_first``: the partial sum
        starts at zero; ``dot_first``: so do the FP32 accumulator and the sticky flags;
        ``promote``: the partial sum times the scales goes into the FP32 accumulator; ``last``
        (implies ``promote``): the accumulator takes the dot product's result (the canonical
        NaN or an infinity where the specials say so). Returns ``(updates, result)``: the
        statements to apply under the beat's enable, and the result code."""
        m, p = self.m, self.prefix
        E = ACC_EXPONENT_BITS + 2
        emin = golden.ACC_EMIN

        # 1. Products.
        products, flags = self.products(a, b)

        # 2. The alignment exponent.
        held_m, held_e, held_sign = self.held(part_first)
        largest = Signal(signed(E), name=f"{p}largest")
        m.d.comb += largest.eq(max_tree(m, [top for *_, top in products] + [held_e,
                                                                            Const(emin, signed(E))],
                                         f"{p}align"))

        # 3. Aligned, truncated toward zero, signed.
        terms = []
        for i, (sign, magnitude, exponent, _) in enumerate(products):
            aligned = self.aligned_product(magnitude, exponent, largest, f"{p}p{i}")
            terms.append(Mux(sign, -aligned.as_signed(), aligned.as_signed()))
        terms.append(self.held_term(held_m, held_e, held_sign, largest))

        # 4. Exact sum, renormalized to F + 1 bits.
        total = Signal(signed(self.sum_width), name=f"{p}sum")
        m.d.comb += total.eq(sum(terms))
        new_m, new_e = self._normalize(total, largest)

        # 5. Promotion: the partial sum times the beat's two scales, added into the FP32
        # accumulator, rounded once.
        factor = self._scale_factor(scale_a, scale_b)
        scaled = self._scaled(total < 0, new_m, new_e, factor)
        updates, result = self.promotion(scaled, factor[0], flags, dot_first, promote, last)
        updates += [self.acc_m.eq(new_m), self.acc_e.eq(new_e), self.acc_sign.eq(total < 0)]
        return updates, result

    def held(self, part_first):
        """The partial sum a beat adds to: ``(mantissa, exponent, sign)``, zero at -126 where
        the beat starts one."""
        m, p = self.m, self.prefix
        held_m = Mux(part_first, 0, self.acc_m)
        held_e = Signal(signed(ACC_EXPONENT_BITS + 2), name=f"{p}held_e")
        m.d.comb += held_e.eq(Mux(held_m == 0, golden.ACC_EMIN, self.acc_e))
        return held_m, held_e, Mux(part_first, 0, self.acc_sign)

    def aligned_product(self, magnitude, exponent, largest, name, cut=_in_one_cycle):
        """Step 3 for one product: magnitude * 2**(exponent - largest + F), truncated toward
        zero (``term_width`` bits; ``largest`` is at least the product's leading-bit exponent
        when it is nonzero). ``cut``: a pipeline's register between the shift amount and the
        shift (one cut; :func:`_in_one_cycle`)."""
        m, W = self.m, self.term_width
        shift = Signal(signed(ACC_EXPONENT_BITS + 3), name=f"{name}_shift")
        m.d.comb += shift.eq(largest - exponent)
        amount = Signal(range(W + 1), name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift > W, W, Mux(shift < 0, 0, shift)))
        live = cut({"magnitude": magnitude, "amount": amount})
        aligned = Signal(W, name=f"{name}_aligned")
        m.d.comb += aligned.eq(Cat(Const(0, self.acc_frac), live["magnitude"]) >> live["amount"])
        return aligned

    def held_term(self, held_m, held_e, held_sign, largest):
        """Step 3 for the partial sum: aligned to ``largest`` (>= held_e), truncated, signed."""
        m, p, W = self.m, self.prefix, self.term_width
        gap = Signal(signed(ACC_EXPONENT_BITS + 3), name=f"{p}acc_gap")
        shift = Signal(range(W + 1), name=f"{p}acc_shift")
        m.d.comb += [gap.eq(largest - held_e), shift.eq(Mux(gap > W, W, gap))]
        aligned = Signal(W, name=f"{p}acc_aligned")
        m.d.comb += aligned.eq(held_m >> shift)
        return Mux(held_sign, -aligned.as_signed(), aligned.as_signed())

    def promotion(self, scaled, scale_bad, flags, dot_first, promote, last):
        """Step 5 and the specials: the FP32 accumulator plus ``scaled`` (a partial sum times
        its scales, :meth:`_scaled`) rounded once, the sticky NaN and infinity flags with the
        beat's ``flags`` (and ``scale_bad`` at a promotion). Returns ``(updates, result)``."""
        held_total = Mux(dot_first, 0, self.total_code)
        promoted = self._add_round(*scaled, held_total)
        state = (self.total_code, self.nan_seen, self.inf_pos, self.inf_neg)
        (total, nan, inf_pos, inf_neg), result = self.promoted(
            promoted, state, scale_bad, flags, dot_first, promote, last)
        updates = [self.nan_seen.eq(nan), self.inf_pos.eq(inf_pos), self.inf_neg.eq(inf_neg),
                   self.total_code.eq(total)]
        return updates, result

    def promoted(self, promoted, state, scale_bad, flags, dot_first, promote, last):
        """The end of step 5: the FP32 state after a beat, from ``promoted`` (the rounded sum
        of the promotion adder) and the state before it, ``(total, NaN seen, +infinity seen,
        -infinity seen)``. Returns ``(state after, result)``."""
        m, p = self.m, self.prefix
        total_code, nan_seen, inf_pos, inf_neg = state
        held_total = Mux(dot_first, 0, total_code)
        beat_nan, beat_inf_pos, beat_inf_neg = flags
        sticky_nan = Mux(dot_first, 0, nan_seen) | beat_nan | (promote & scale_bad)
        sticky_pos = Mux(dot_first, 0, inf_pos) | beat_inf_pos
        sticky_neg = Mux(dot_first, 0, inf_neg) | beat_inf_neg
        nan = sticky_nan | (sticky_pos & sticky_neg)
        inf = (sticky_pos | sticky_neg) & ~nan
        infinity = Cat(Const(0, 23), Const(0xFF, 8), sticky_neg)
        result = Signal(32, name=f"{p}result")
        m.d.comb += result.eq(Mux(nan, FP32.canonical_nan, Mux(inf, infinity, promoted)))
        total = Mux(last, result, Mux(promote, promoted, held_total))
        return (total, sticky_nan, sticky_pos, sticky_neg), result

    # --- the pieces of a beat, shared by step() and fp_dot's pipeline -------------------------

    def products(self, a, b):
        """Step 1 for g operand pairs: per lane ``(sign, magnitude, exponent of its last bit,
        exponent of its leading bit or -126 when zero)``, and the beat's ``(NaN, +infinity,
        -infinity)`` flags."""
        m, p, fmt = self.m, self.prefix, self.format
        E = ACC_EXPONENT_BITS + 2
        products, nans, inf_pos, inf_neg = [], [], [], []
        for i in range(self.group):
            a_nan, a_inf, a_sign, a_m, a_x = _operand(m, a[i], f"{p}a{i}", fmt)
            b_nan, b_inf, b_sign, b_m, b_x = _operand(m, b[i], f"{p}b{i}", fmt)
            sign = a_sign ^ b_sign
            a_zero, b_zero = (a_m == 0) & ~a_inf, (b_m == 0) & ~b_inf
            nan = a_nan | b_nan | (a_inf & b_zero) | (b_inf & a_zero)
            inf = (a_inf | b_inf) & ~nan
            nans.append(nan)
            inf_pos.append(inf & ~sign)
            inf_neg.append(inf & sign)
            magnitude = Signal(2 * len(a_m), name=f"{p}p{i}_m")
            exponent = Signal(signed(E), name=f"{p}p{i}_x")
            m.d.comb += [magnitude.eq(a_m * b_m), exponent.eq(a_x + b_x)]
            lead = leading_one(m, magnitude, f"{p}p{i}_lead")
            top = Signal(signed(E), name=f"{p}p{i}_top")
            m.d.comb += top.eq(Mux(magnitude == 0, golden.ACC_EMIN, exponent + lead))
            products.append((sign, magnitude, exponent, top))
        return products, (Cat(*nans).any(), Cat(*inf_pos).any(), Cat(*inf_neg).any())

    @property
    def term_width(self):
        """Bits of a product aligned to the beat's exponent with F fraction bits (and a zero
        top bit): 2(M + 1) + F, at least F + 1, plus one. Aligned to an exponent at least the
        product's leading one, only the low F + 1 can be set: fp_dot's stages 2 and 3 keep
        those alone."""
        return max(2 * (self.format.man_bits + 1) + self.acc_frac, self.acc_frac + 1) + 1

    @property
    def sum_width(self):
        """Bits of the signed exact sum of g aligned products and the partial sum."""
        return self.term_width + ceil_log2(self.group + 1) + 2

    def _normalize(self, total, largest, cut=_in_one_cycle):
        """Step 4's renormalization: the exact signed sum ``total`` (its last bit's weight
        2**(largest - F)) as the magnitude's ``(mantissa of F + 1 bits, exponent)``: truncated
        toward zero, unnormalized at exponent -126, saturated above 127, (0, -126) for zero.
        ``cut``: where a pipeline places its registers (four cuts; :func:`_in_one_cycle`)."""
        m, p, F = self.m, self.prefix, self.acc_frac
        emin, emax = golden.ACC_EMIN, golden.ACC_EMAX
        E = ACC_EXPONENT_BITS + 2
        magnitude = Signal(len(total), name=f"{p}sum_abs")
        m.d.comb += magnitude.eq(Mux(total < 0, -total, total))
        live = cut({"magnitude": magnitude, "largest": largest, "zero": total == 0})
        magnitude, largest = live["magnitude"], live["largest"]
        lead = leading_one_tree(m, magnitude, f"{p}sum_lead")
        excess = Signal(signed(E + 1), name=f"{p}excess")      # > 0: carry bits to drop
        missing = Signal(signed(E + 1), name=f"{p}missing")    # -excess, beside it
        m.d.comb += [excess.eq(lead - F), missing.eq(F - lead)]
        # From ``largest`` alone, beside the sum: the room above -126 and below 127 (and its
        # negation, for the left shift's overflow test).
        room = Signal(signed(E + 1), name=f"{p}room")
        headroom = Signal(signed(E + 1), name=f"{p}headroom")
        beyond = Signal(signed(E + 1), name=f"{p}beyond")      # -headroom
        m.d.comb += [room.eq(largest - emin), headroom.eq(emax - largest),
                     beyond.eq(largest - emax)]
        live = cut({"magnitude": magnitude, "largest": largest, "zero": live["zero"],
                    "excess": excess, "missing": missing, "room": room, "headroom": headroom,
                    "beyond": beyond})
        magnitude, largest, excess = live["magnitude"], live["largest"], live["excess"]
        room, missing, beyond = live["room"], live["missing"], live["beyond"]
        normal_m = Signal(F + 1, name=f"{p}normal_m")
        normal_e = Signal(signed(E + 1), name=f"{p}normal_e")
        overflow = Signal(name=f"{p}overflow")                 # normal_e > 127
        # Right by the carry bits, or left by the missing ones but not below exponent -126:
        # how far, the exponent and the overflow first, the shift in the next stage. The
        # exponent and the overflow for both lefts beside the comparison that picks one.
        floored = room < missing
        left = Signal(range(F + 2), name=f"{p}left")
        to_floor = Signal(range(F + 2), name=f"{p}left_to_floor")
        by_missing = Signal(range(F + 2), name=f"{p}left_by_missing")
        m.d.comb += [to_floor.eq(room), by_missing.eq(missing)]
        with m.If(excess >= 0):
            m.d.comb += [normal_e.eq(largest + excess), overflow.eq(excess > live["headroom"])]
        with m.Else():
            m.d.comb += left.eq(Mux(floored, to_floor, by_missing))
            m.d.comb += [normal_e.eq(Mux(floored, largest - to_floor, largest - by_missing)),
                         overflow.eq(Mux(floored, to_floor < beyond, by_missing < beyond))]
        live = cut({"magnitude": magnitude, "excess": excess, "left": left,
                    "normal_e": normal_e, "overflow": overflow, "zero": live["zero"]})
        excess = live["excess"]
        m.d.comb += normal_m.eq(Mux(excess >= 0, live["magnitude"] >> excess.as_unsigned(),
                                    live["magnitude"] << live["left"]))
        # The shifts end a stage, the saturation's select (and a loop's write back) begins one.
        live = cut({"normal_m": normal_m, "normal_e": live["normal_e"],
                    "overflow": live["overflow"], "zero": live["zero"]})
        normal_m, normal_e, overflow = live["normal_m"], live["normal_e"], live["overflow"]
        new_m = Signal(F + 1, name=f"{p}new_m")
        new_e = Signal(signed(E + 1), name=f"{p}new_e")
        with m.If(live["zero"]):
            m.d.comb += [new_m.eq(0), new_e.eq(emin)]
        with m.Elif(overflow):
            m.d.comb += [new_m.eq((1 << (F + 1)) - 1), new_e.eq(emax)]
        with m.Else():
            m.d.comb += [new_m.eq(normal_m), new_e.eq(normal_e)]
        return new_m, new_e

    def _scale_factor(self, scale_a, scale_b):
        """The product of a beat's two scales: ``(NaN or infinite, sign, mantissa, exponent
        of its last bit)``, exact (FP32: 48 bits; E8M0: the mantissa is 1)."""
        m, p = self.m, self.prefix
        _, _, a_sign, a_m, a_x = self._scale(scale_a, f"{p}scale_a")
        _, _, b_sign, b_m, b_x = self._scale(scale_b, f"{p}scale_b")
        mantissa = Signal(len(a_m) + len(b_m), name=f"{p}scales_m")
        exponent = Signal(signed(11), name=f"{p}scales_x")
        m.d.comb += [mantissa.eq(a_m * b_m), exponent.eq(a_x + b_x)]
        # NaN or infinite: the exponent field all ones, whatever the mantissa (one compare, not
        # the NaN and infinity tests ORed, whose mantissa terms cancel).
        top = 31 if self.scale_format == "fp32" else 8
        special = (scale_a[top - 8:top] == 255) | (scale_b[top - 8:top] == 255)
        return special, a_sign ^ b_sign, mantissa, exponent

    def _scaled(self, sign, mantissa, exponent, factor, cut=_in_one_cycle, slice_bits=None):
        """A partial sum (sign, F + 1-bit mantissa, exponent) times a scale factor
        (:meth:`_scale_factor`): ``(sign, mantissa, exponent of its last bit, of its leading
        bit)``, exact. ``cut``: a pipeline's registers after the product and after its leading
        one (two cuts; :func:`_in_one_cycle`); with ``slice_bits``, first the mantissa times
        each slice of that many bits of the factor's (an ECP5 DSP's 18: a multiplier each,
        with nothing after it), and their sum in the stage after (three cuts)."""
        m, p, F = self.m, self.prefix, self.acc_frac
        _, f_sign, f_m, f_x = factor
        product = Signal(F + 1 + len(f_m), name=f"{p}scaled_m")
        product_x = Signal(signed(14), name=f"{p}scaled_x")
        if slice_bits is None:
            m.d.comb += [product.eq(mantissa * f_m), product_x.eq(exponent - F + f_x)]
        else:
            m.d.comb += product_x.eq(exponent - F + f_x)
            slices = range(0, len(f_m), slice_bits)
            live = cut({"sign": sign, "f_sign": f_sign, "product_x": product_x,
                        **{f"slice{k}": mantissa * f_m[k:k + slice_bits] for k in slices}})
            total = 0
            for k in slices:
                total = total + (live[f"slice{k}"] << k)
            m.d.comb += product.eq(total)
            sign, f_sign, product_x = live["sign"], live["f_sign"], live["product_x"]
        live = cut({"sign": sign ^ f_sign, "product": product, "product_x": product_x})
        product, product_x = live["product"], live["product_x"]
        top = Signal(signed(14), name=f"{p}scaled_top")
        lead = leading_one_tree(m, product, f"{p}scaled_lead")
        live = cut({"sign": live["sign"], "product": product, "product_x": product_x,
                    "lead": lead})
        m.d.comb += top.eq(live["product_x"] + live["lead"])
        return live["sign"], live["product"], live["product_x"], top

    def _alignment(self, shift, width, name):
        """The amount :meth:`_aligned` shifts a ``width``-bit mantissa by: ``shift`` = FIELD -
        (exponent - base) for a mantissa of ``exponent`` and the field's last bit at ``base``,
        clamped to 0..255. Returns ``(amount, the signals _aligned drives)``: those are made
        here, with the amount, so that a step done in one cycle names its signals in one
        order whether or not a pipeline's register parts the clamp from the shift."""
        m = self.m
        # Shifts of 256 or more clear the field as FIELD + width does: their high bits, not a
        # comparison, make the clamp (a negative shift comes only with a zero mantissa).
        low = 8
        assert FIELD + width < 1 << low
        amount = Signal(low, name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift[-1], 0, Mux(shift[low:-1].any(), (1 << low) - 1,
                                                    shift[:low])))
        return amount, (Signal(FIELD + 1, name=f"{name}_aligned"),
                        Signal(name=f"{name}_sticky"))

    def _aligned(self, mantissa, amount, outputs):
        """``mantissa * 2**(FIELD - amount)`` in FIELD + 1 bits, truncated, and whether bits
        were lost (sticky), into ``outputs`` (:meth:`_alignment`). The caller makes the top
        fit."""
        full = Cat(Const(0, FIELD), mantissa)
        value, lost = outputs
        self.m.d.comb += [value.eq(full >> amount),
                          lost.eq((full & _low_mask(amount, FIELD + len(mantissa))) != 0)]
        return value, lost

    def _scale(self, code, name):
        """A scale as ``(nan, inf, sign, mantissa, exponent of its last bit)``: an FP32 code,
        or an E8M0 one (mantissa 1, exponent code - 127; 255 is NaN)."""
        if self.scale_format == "fp32":
            return _operand(self.m, code, name, FP32)
        exponent = Signal(signed(10), name=f"{name}_x")
        self.m.d.comb += exponent.eq(Cat(code, Const(0, 2)).as_signed() - 127)
        return code == 255, Const(0), Const(0), Const(1, 1), exponent

    def _add_round(self, product_sign, product, product_x, p_top, total, cut=_in_one_cycle):
        """The FP32 code of ``total`` + (-1)**product_sign * product * 2**product_x (its
        leading bit's exponent ``p_top`` when nonzero), rounded to nearest even once
        (saturating, subnormals kept, zero positive). ``cut``: where a pipeline places its
        registers (twelve cuts; :func:`_in_one_cycle`)."""
        m, p = self.m, self.prefix
        _, _, t_sign, t_m, t_x = _operand(m, total, f"{p}total", FP32)
        live = cut({"product": product, "product_sign": product_sign, "product_x": product_x,
                    "p_top": p_top, "t_sign": t_sign, "t_m": t_m, "t_x": t_x})
        product, product_sign, product_x, p_top = (live["product"], live["product_sign"],
                                                   live["product_x"], live["p_top"])
        t_sign, t_m, t_x = live["t_sign"], live["t_m"], live["t_x"]
        t_lead = leading_one_tree(m, t_m, f"{p}total_lead")
        t_top = Signal(signed(14), name=f"{p}total_top")
        m.d.comb += t_top.eq(t_x + t_lead)
        live = cut({"product": product, "product_sign": product_sign, "product_x": product_x,
                    "p_top": p_top, "t_sign": t_sign, "t_m": t_m, "t_x": t_x, "t_lead": t_lead,
                    "t_top": t_top})
        product, product_sign, product_x, p_top = (live["product"], live["product_sign"],
                                                   live["product_x"], live["p_top"])
        t_sign, t_m, t_x, t_lead, t_top = (live["t_sign"], live["t_m"], live["t_x"],
                                           live["t_lead"], live["t_top"])
        p_zero, t_zero = product == 0, t_m == 0
        p_leads = Signal(name=f"{p}product_leads")     # the larger sets the field's top
        m.d.comb += p_leads.eq(~p_zero & (t_zero | (p_top > t_top)))
        top = Signal(signed(14))
        m.d.comb += top.eq(Mux(p_leads, p_top, t_top))
        base = Signal(signed(14))                      # the field's last bit's exponent
        # Each operand's shift, FIELD - (exponent - base) = top + 1 - exponent, from either
        # top, so that the shifters need not wait for the comparison and then a subtraction.
        p_shift, t_shift = Signal(signed(14)), Signal(signed(14))
        p_own, p_under_t = Signal(signed(14)), Signal(signed(14))
        m.d.comb += [p_own.eq(p_top + 1 - product_x),
                     p_under_t.eq((t_x + 1 - product_x) + t_lead),
                     p_shift.eq(Mux(p_leads, p_own, p_under_t)),
                     t_shift.eq(Mux(p_leads, p_top + 1 - t_x, t_lead + 1))]
        live = cut({"product": product, "p_shift": p_shift, "t_m": t_m, "t_shift": t_shift,
                    "product_sign": product_sign, "t_sign": t_sign, "top": top})
        m.d.comb += base.eq(live["top"] - (FIELD - 1))
        product, t_m = live["product"], live["t_m"]
        p_amount, p_out = self._alignment(live["p_shift"], len(product), f"{p}product")
        t_amount, t_out = self._alignment(live["t_shift"], len(t_m), f"{p}total")
        live = cut({"product": product, "p_amount": p_amount, "t_m": t_m, "t_amount": t_amount,
                    "product_sign": live["product_sign"], "t_sign": live["t_sign"],
                    "base": base})
        product_sign, t_sign, base = live["product_sign"], live["t_sign"], live["base"]
        p_value, p_lost = self._aligned(live["product"], live["p_amount"], p_out)
        t_value, t_lost = self._aligned(live["t_m"], live["t_amount"], t_out)
        live = cut({"p_value": p_value, "p_lost": p_lost, "t_value": t_value, "t_lost": t_lost,
                    "product_sign": product_sign, "t_sign": t_sign, "base": base})
        p_value, p_lost, t_value, t_lost = (live["p_value"], live["p_lost"], live["t_value"],
                                            live["t_lost"])
        product_sign, t_sign, base = live["product_sign"], live["t_sign"], live["base"]
        width = FIELD + 3
        # raw = +-p_value +-t_value in one adder: with equal signs the magnitudes' sum, with
        # different ones the positive less the negative (-x = ~x + 1, the 1 as a carry in).
        mixed = product_sign != t_sign
        p_wide = Cat(p_value, Const(0, 2))
        t_wide = Cat(t_value, Const(0, 2))
        combined = Signal(signed(width))               # |raw| (equal signs) or raw (different)
        m.d.comb += combined.eq(_add_with_carry(Mux(mixed & product_sign, ~p_wide, p_wide),
                                                Mux(mixed & t_sign, ~t_wide, t_wide), mixed))
        result_sign = Signal()                         # raw < 0
        # At most the smaller operand lost bits: the exact sum lies within one field unit of
        # raw, on that operand's side.
        lost = p_lost | t_lost
        lost_negative = Mux(p_lost, product_sign, t_sign)
        # The sum's sign (a test of all its bits) waits for the stage after the adder's.
        live = cut({"combined": combined, "product_sign": product_sign, "lost": lost,
                    "lost_negative": lost_negative, "mixed": mixed, "base": base})
        combined, lost, mixed, base = live["combined"], live["lost"], live["mixed"], live["base"]
        m.d.comb += result_sign.eq(Mux(mixed, combined < 0,
                                       live["product_sign"] & (combined != 0)))
        # |raw| less one where the lost bits lie on the other side of zero; for raw < 0 (only
        # with different signs), -raw - 1 is ~raw: one carry chain after the sum's.
        # Both candidates of each side are ready before toward_zero (which waits for the sign).
        toward_zero = lost & (live["lost_negative"] != result_sign)
        negative = mixed & (combined < 0)
        inverted = (~combined).as_unsigned()[:width]
        below, above = Signal(width), Signal(width)
        m.d.comb += [below.eq(combined.as_unsigned() - 1), above.eq(inverted + 1)]
        exact = Signal(width)                          # |sum| = exact + (sticky ? (0, 1) : 0)
        m.d.comb += exact.eq(Mux(negative, Mux(toward_zero, inverted, above),
                                 Mux(toward_zero, below, combined.as_unsigned())))
        live = cut({"exact": exact, "lost": lost, "result_sign": result_sign, "base": base})
        exact, lost, result_sign, base = (live["exact"], live["lost"], live["result_sign"],
                                          live["base"])
        lead = leading_one_tree(m, exact, f"{p}round_lead")
        live = cut({"exact": exact, "lead": lead, "lost": lost, "result_sign": result_sign,
                    "base": base})
        exact, lead, lost, result_sign, base = (live["exact"], live["lead"], live["lost"],
                                                live["result_sign"], live["base"])
        # The bits to drop below the kept 24: lead - 23, but the kept last bit no lower than
        # FP32's smallest subnormal, 2**(emin - 23) (its floor is ready before the sum).
        floor, lifted = Signal(signed(15)), Signal(signed(15))
        m.d.comb += [floor.eq(FP32.emin - 23 - base), lifted.eq(FP32.emin - base)]
        floored = Signal()                             # lead - 23 < floor
        natural = Signal(signed(8))
        m.d.comb += [floored.eq(lead < lifted), natural.eq(lead - 23)]
        drop = Signal(signed(15))                      # at least -23 (lead >= 0)
        m.d.comb += drop.eq(Mux(floored, floor, natural))
        kept_x = Signal(signed(14))                    # exponent of the kept last bit
        m.d.comb += kept_x.eq(base + drop)
        # Right by drop (128 or more clears the field as 83 does: the high bits make the
        # clamp), or left by -drop (from the two candidates, not by negating drop).
        amount = Signal(7)
        left = Signal(5)
        m.d.comb += [amount.eq(Mux(drop[-1], 0, Mux(drop[7:-1].any(), 127, drop[:7]))),
                     left.eq(Mux(floored, -floor, 23 - lead))]
        live = cut({"exact": exact, "lost": lost, "result_sign": result_sign, "kept_x": kept_x,
                    "amount": amount, "left": left, "leftward": drop[-1]})
        # The mask of the bits to drop (the guard bit and those below it), decoded from the
        # amount in a stage of its own.
        dropped = _low_mask(live["amount"], width)
        live = cut({**live, "dropped": dropped})
        exact, lost, result_sign, kept_x = (live["exact"], live["lost"], live["result_sign"],
                                            live["kept_x"])
        amount, left, dropped = live["amount"], live["left"], live["dropped"]
        kept = Signal(width)
        m.d.comb += kept.eq(Mux(live["leftward"], exact << left, exact >> amount))
        guard = Signal()
        rest = Signal()
        m.d.comb += [guard.eq((exact & dropped & ~(dropped >> 1)) != 0),
                     rest.eq(lost | ((exact & (dropped >> 1)) != 0))]
        live = cut({"kept": kept, "guard": guard, "rest": rest, "kept_x": kept_x,
                    "result_sign": result_sign})
        kept, guard, rest, kept_x, result_sign = (live["kept"], live["guard"], live["rest"],
                                                  live["kept_x"], live["result_sign"])
        rounded = Signal(26)
        m.d.comb += rounded.eq(kept + (guard & (rest | kept[0])))
        live = cut({"rounded": rounded, "kept_x": kept_x, "result_sign": result_sign})
        rounded, kept_x, result_sign = live["rounded"], live["kept_x"], live["result_sign"]
        carry = rounded[24]
        q = Signal(24)
        m.d.comb += q.eq(Mux(carry, rounded >> 1, rounded))
        # The biased exponent of q's last bit, kept_x + carry + 23 + bias, and whether it is
        # past 254: each for both values of the rounding's carry, computed before it is known.
        biased = Signal(signed(15))
        overflow = Signal()
        m.d.comb += [biased.eq(Mux(carry, kept_x + (24 + FP32.bias), kept_x + (23 + FP32.bias))),
                     overflow.eq(Mux(carry, kept_x > 254 - 24 - FP32.bias,
                                     kept_x > 254 - 23 - FP32.bias))]
        code = Signal(32)
        with m.If(q == 0):
            m.d.comb += code.eq(0)
        with m.Elif(~q[23]):                           # subnormal (kept_x is the lowest)
            m.d.comb += code.eq(Cat(q[:23], Const(0, 8), result_sign))
        with m.Elif(overflow):
            m.d.comb += code.eq(Cat(Const(FP32.max_code, 31), result_sign))
        with m.Else():
            m.d.comb += code.eq(Cat(q[:23], biased[:8], result_sign))
        return code


def _add_with_carry(a, b, carry):
    """a + b + carry (one bit) as one adder: a 1 below each operand's last bit carries the
    ``carry`` in (Amaranth has no carry input), where adding it after would be a second chain."""
    return (Cat(Const(1, 1), a) + Cat(carry, b))[1:]


def _low_mask(amount, width):
    """``width`` bits, those below ``amount`` set: a shifted constant, where (1 << amount) - 1
    would put a carry chain the width of the field in the FP32 loop."""
    return ~(Const((1 << width) - 1, width) << amount)[:width]


class FpDot(ConfiguredComponent):
    """The ``fp_dot`` block.

    Members
    -------
    inp : In(stream)
        ``a``, ``b``: g operand codes each; ``last``: the dot product's final beat.
    out : Out(stream)
        One result per dot product (``result_layout``).
    """

    def __init__(self, config):
        super().__init__(config, {
            "inp": In(stream.Signature(input_layout(config))),
            "out": Out(stream.Signature(result_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        acc = FpAccumulator(m, cfg.dtype, cfg.group, cfg.acc_frac, cfg.scale_format)
        # Products aligned to the beat's exponent B keep F + 1 bits: B is at least every
        # product's leading-bit exponent, so the bits above (term_width has them for step(),
        # whose alignment exponent is not known before the products) are always zero.
        W, E = cfg.acc_frac + 1, ACC_EXPONENT_BITS + 2
        emin = Const(golden.ACC_EMIN, signed(E))
        S = cfg.slots

        # The whole pipeline moves together, stalled only by a full output register.
        out_valid = Signal()
        advance = Signal()
        m.d.comb += [advance.eq(~out_valid | self.out.ready), self.out.valid.eq(out_valid)]
        pipe = StallPipe(advance)

        # A slot's next beat waits until its last one has written both loops' state: each
        # slot counts down the edges left (golden.fp.DOT_SLOT_GAP after a beat it takes).
        beat = self.inp.payload
        slot_ok = beat.slot < S                        # else the beat is taken and dropped
        gap = golden.DOT_SLOT_GAP
        wait = Array(Signal(range(gap), name=f"slot{s}_wait") for s in range(S))
        # wait == 0 kept in a flip-flop of its own, so that ready reads one bit per slot.
        idle = Array(Signal(init=1, name=f"slot{s}_idle") for s in range(S))
        m.d.comb += self.inp.ready.eq(advance & (~slot_ok | idle[beat.slot]))
        take = self.inp.valid & self.inp.ready
        enter = take & slot_ok

        # Beat control, per slot, at the input: does the beat start a partial sum, a dot
        # product, end a partial sum (promote), end the dot product?
        first = Array(Signal(init=1, name=f"slot{s}_first") for s in range(S))
        dot_first = Array(Signal(init=1, name=f"slot{s}_dot_first") for s in range(S))
        beat_index = Array(Signal(range(max(1, cfg.chunk_beats)), name=f"slot{s}_beat")
                           for s in range(S))
        index = beat_index[beat.slot]
        promote = Signal()
        chunk_end = (index == cfg.chunk_beats - 1) if cfg.chunk_beats else Const(0)
        m.d.comb += promote.eq(chunk_end | beat.last)
        with m.If(enter):
            m.d.sync += [first[beat.slot].eq(promote), dot_first[beat.slot].eq(beat.last)]
            if cfg.chunk_beats:
                m.d.sync += beat_index[beat.slot].eq(Mux(promote, 0, index + 1))
        with m.If(advance):
            for s in range(S):
                with m.If(enter & (beat.slot == s)):
                    m.d.sync += [wait[s].eq(gap - 1), idle[s].eq(gap == 1)]
                with m.Elif(wait[s] != 0):
                    m.d.sync += [wait[s].eq(wait[s] - 1), idle[s].eq(wait[s] == 1)]

        # A stage's data registers have no reset: they are read only with the stage's valid
        # flag, which reset clears, and the stage's next beat overwrites them.
        def data(value, name):
            return pipe.reg(value, name, reset_less=True)

        def carry(values, name, stages):
            """``values`` (a dict) delayed by ``stages`` pipeline registers (only ``valid``
            reset)."""
            return {key: pipe.delay(value, stages, f"{name}_{key}", reset_less=key != "valid")
                    for key, value in values.items()}

        factor = acc._scale_factor(beat.scale_a, beat.scale_b)
        products, flags = acc.products(beat.a, beat.b)
        control = {"valid": enter, "slot": beat.slot, "first": first[beat.slot],
                   "dot_first": dot_first[beat.slot], "promote": promote, "last": beat.last,
                   **dict(zip(("scales_bad", "scales_sign", "scales_m", "scales_x"), factor)),
                   **dict(zip(("nan", "inf_pos", "inf_neg"), flags))}

        # Stage 1: products (step 1).
        lanes = [tuple(data(value, f"s1_p{i}_{key}") for key, value in
                       zip(("sign", "m", "x", "top"), product))
                 for i, product in enumerate(products)]

        # Stages 2 to 4: the beat's largest exponent B (at least -126): in each group of lanes
        # which is the largest (every pair compared), then it, then the groups' largest; stage
        # 5: each product's shift to B; stage 6: each product aligned.
        def group_cut(group):
            return lambda values: [data(value, f"s2_group{group}_{k}")
                                   for k, value in enumerate(values)]

        group_tops = [max_all_pairs(m, [top for *_, top in lanes[start:start + MAX_GROUP]],
                                    f"group{start // MAX_GROUP}_top",
                                    group_cut(start // MAX_GROUP))
                      for start in range(0, len(lanes), MAX_GROUP)]
        group_tops = [data(top, f"s3_group{i}_top") for i, top in enumerate(group_tops)]
        for stage in ("s2", "s3"):
            lanes = [tuple(data(value, f"{stage}_p{i}_{key}") for key, value in
                           zip(("sign", "m", "x"), lane[:3]))
                     for i, lane in enumerate(lanes)]
        beat_top = data(max_all_pairs(m, group_tops + [emin], "beat_top"), "s4_beat_top")
        lanes = [tuple(data(value, f"s4_p{i}_{key}") for key, value in
                       zip(("sign", "m", "x"), lane))
                 for i, lane in enumerate(lanes)]

        def lane_cut(i):
            return lambda values: {key: data(value, f"s5_p{i}_{key}")
                                   for key, value in values.items()}

        aligned = [(data(data(sign, f"s5_p{i}_sign"), f"s6_p{i}_sign"),
                    data(acc.aligned_product(magnitude, exponent, beat_top, f"s4_p{i}",
                                             lane_cut(i))[:W], f"s6_p{i}_aligned"))
                   for i, (sign, magnitude, exponent) in enumerate(lanes)]
        top6 = pipe.delay(beat_top, 2, "s6_beat_top", reset_less=True)

        # Stages 7 to 10: the beat's sums for every further right shift d the partial sum may
        # force (the loop), so that it selects one instead of shifting and adding g terms:
        # the bit columns' counts per group of lanes, in all, then their suffix sums over two
        # stages.
        sums_cuts = iter(("s7", "s8", "s9"))

        def sums_cut(values):
            stage = next(sums_cuts)
            return [data(value, f"{stage}_sum{j}") for j, value in enumerate(values)]

        shifted_sums = [data(value, f"s10_sum{d}") for d, value in
                        enumerate(_shifted_sums(m, aligned, W, acc.sum_width, sums_cut))]
        top10 = pipe.delay(top6, 4, "s10_beat_top", reset_less=True)

        # From here a beat's control rides with its data through every register (cut).
        stages = _Stages(pipe, carry(control, "front", golden.DOT_FRONT_STAGES))

        # The partial-sum loop (steps 2 to 4), golden.fp.DOT_PARTIAL_STAGES cycles from reading
        # the slot's partial sum to writing it back: the alignment exponent is the larger of B
        # and the partial sum's; past B by d, the products' sum is the one shifted by d.
        part_m = Array(Signal(W, name=f"slot{s}_partial_m") for s in range(S))
        part_e = Array(Signal(signed(ACC_EXPONENT_BITS), init=golden.ACC_EMIN,
                              name=f"slot{s}_partial_e") for s in range(S))
        part_sign = Array(Signal(name=f"slot{s}_partial_sign") for s in range(S))
        read_at = stages.count
        fresh = stages.carried["first"]
        slot = stages.carried["slot"]
        held_m = Mux(fresh, 0, part_m[slot])
        held_e = Signal(signed(E), name="partial_held_e")
        # A slot's partial sum is zero only at exponent -126 (reset, and _normalize's zero; a
        # nonzero sum keeps its leading one): so no test of the mantissa read.
        m.d.comb += held_e.eq(Mux(fresh, golden.ACC_EMIN, part_e[slot]))
        held_sign = Mux(fresh, 0, part_sign[slot])
        stages.drop("first")
        live = stages.cut({"held_m": held_m, "held_e": held_e, "held_sign": held_sign,
                           "top": top10,
                           **{f"sum{d}": value for d, value in enumerate(shifted_sums)}})
        held_m, held_e, held_sign, top10 = (live["held_m"], live["held_e"], live["held_sign"],
                                           live["top"])
        shifted_sums = [live[f"sum{d}"] for d in range(W)]
        ahead = Signal(name="partial_ahead")
        gap_e = Signal(signed(E + 1), name="partial_gap")        # held_e - B
        behind = Signal(signed(E + 1), name="partial_behind")  # B - held_e, beside it
        m.d.comb += [ahead.eq(held_e > top10), gap_e.eq(held_e - top10),
                     behind.eq(top10 - held_e)]
        largest = Signal(signed(E), name="largest")
        m.d.comb += largest.eq(Mux(ahead, held_e, top10))
        # Shifts clamped by their high bits, not by comparisons: the products' sums padded
        # with zeros to a power of two (a shift of W = F + 1 or more leaves none), the partial
        # sum's F + 1 bits cleared by any shift of 2**k - 1 >= F + 1: one clamp width for both.
        pick_bits = ceil_log2(W + 1)
        pick = Signal(pick_bits, name="products_shift")
        m.d.comb += pick.eq(Mux(ahead, Mux(gap_e[pick_bits:].any(), (1 << pick_bits) - 1,
                                           gap_e[:pick_bits]), 0))
        zero = Const(0, signed(acc.sum_width))
        products_sum = Signal(signed(acc.sum_width), name="products_sum")
        # The partial sum's term as FpAccumulator.held_term computes it for step(), in the
        # clock-rate form of this loop (shift from B - held_e beside the comparison).
        held_shift = Signal(pick_bits, name="partial_shift")
        m.d.comb += held_shift.eq(Mux(ahead, 0, Mux(behind[pick_bits:].any(),
                                                    (1 << pick_bits) - 1, behind[:pick_bits])))
        # The shifts end a stage; the products' sum for the pick is selected in the next.
        live = stages.cut({"pick": pick, "held_shift": held_shift, "largest": largest,
                           "held_m": held_m, "held_sign": held_sign,
                           **{f"sum{d}": value for d, value in enumerate(shifted_sums)}})
        shifted_sums = [live[f"sum{d}"] for d in range(W)]
        m.d.comb += products_sum.eq(Array(shifted_sums + [zero] * ((1 << pick_bits) - W))
                                    [live["pick"]])
        live = stages.cut({"products_sum": products_sum, "held_m": live["held_m"],
                           "held_shift": live["held_shift"], "held_sign": live["held_sign"],
                           "largest": live["largest"]})
        held_aligned = Signal(acc.sum_width, name="partial_aligned")
        m.d.comb += held_aligned.eq(live["held_m"] >> live["held_shift"])
        # Signed, in one adder: -x = ~x + 1, the 1 as a carry in.
        total = Signal(signed(acc.sum_width), name="sum")
        m.d.comb += total.eq(_add_with_carry(live["products_sum"].as_unsigned(),
                                             Mux(live["held_sign"], ~held_aligned,
                                                 held_aligned),
                                             live["held_sign"]))
        live = stages.cut({"total": total, "largest": live["largest"]})
        stages.carried["negative"] = live["total"] < 0
        new_m, new_e = acc._normalize(live["total"], live["largest"], stages.cut)
        assert stages.count - read_at + 1 == golden.DOT_PARTIAL_STAGES
        c = stages.carried
        with m.If(advance & c["valid"]):
            m.d.sync += [part_m[c["slot"]].eq(new_m), part_e[c["slot"]].eq(new_e),
                         part_sign[c["slot"]].eq(c["negative"])]
        live = stages.cut({"m": new_m, "e": new_e})

        # The partial sum times its scales (three registers: the products of the slices of
        # the scales' mantissa, their sum, its leading one; the exponent of that one is added
        # in the FP32 loop's first stage, beside the read).
        c = stages.carried
        scaled_at = stages.count
        scaled = acc._scaled(c["negative"], live["m"], live["e"],
                             (c["scales_bad"], c["scales_sign"], c["scales_m"], c["scales_x"]),
                             stages.cut, slice_bits=DSP_OPERAND_BITS)
        stages.drop("scales_sign", "scales_m", "scales_x")
        live = dict(zip(("sign", "m", "x", "top"), scaled))
        assert stages.count - scaled_at == golden.DOT_SCALE_STAGES

        # The FP32 loop (step 5 and the specials), golden.fp.DOT_TOTAL_STAGES cycles from
        # reading the slot's accumulator to writing it back, and the output register.
        totals = Array(Signal(32, name=f"slot{s}_total") for s in range(S))
        nans = Array(Signal(name=f"slot{s}_nan") for s in range(S))
        pos = Array(Signal(name=f"slot{s}_inf_pos") for s in range(S))
        neg = Array(Signal(name=f"slot{s}_inf_neg") for s in range(S))
        read_at = stages.count
        c = stages.carried
        slot = c["slot"]
        c.update({"total": totals[slot], "nan_seen": nans[slot], "pos_seen": pos[slot],
                  "neg_seen": neg[slot]})
        live = stages.cut(live)                    # the slot's accumulator, read
        c = stages.carried
        held_total = Mux(c["dot_first"], 0, c["total"])
        promoted = acc._add_round(live["sign"], live["m"], live["x"], live["top"], held_total,
                                  stages.cut)
        assert stages.count - read_at + 1 == golden.DOT_TOTAL_STAGES
        c = stages.carried
        (total_code, nan, inf_pos, inf_neg), result = acc.promoted(
            promoted, (c["total"], c["nan_seen"], c["pos_seen"], c["neg_seen"]),
            c["scales_bad"], (c["nan"], c["inf_pos"], c["inf_neg"]),
            c["dot_first"], c["promote"], c["last"])
        with m.If(advance & c["valid"]):
            m.d.sync += [nans[c["slot"]].eq(nan), pos[c["slot"]].eq(inf_pos),
                         neg[c["slot"]].eq(inf_neg), totals[c["slot"]].eq(total_code)]
        assert golden.DOT_FRONT_STAGES + stages.count + 1 == golden.DOT_LATENCY
        with m.If(advance):
            m.d.sync += out_valid.eq(c["valid"] & c["last"])
            with m.If(c["valid"] & c["last"]):
                m.d.sync += [self.out.payload.result.eq(result),
                             self.out.payload.slot.eq(c["slot"])]
        pipe.emit(m)
        return m


class _Stages:
    """The registers of a pipeline past its front: each :meth:`cut` registers the values it is
    given and everything ``carried`` beside them (a beat's control, its flags and scales, the
    slot state it read), so that a step written for one cycle (``FpAccumulator``'s ``cut``
    argument) becomes a chain of stages with its beat's context alongside."""

    def __init__(self, pipe, carried):
        self.pipe, self.carried, self.count = pipe, dict(carried), 0

    def cut(self, values):
        self.count += 1

        def register(key, value, prefix):
            return self.pipe.reg(value, f"{prefix}{self.count}_{key}", reset_less=key != "valid")

        self.carried = {key: register(key, value, "c")
                        for key, value in self.carried.items()}
        return {key: register(key, value, "r") for key, value in values.items()}

    def drop(self, *keys):
        """Carry ``keys`` no further (the stages after need them no more)."""
        for key in keys:
            del self.carried[key]


def _shifted_sums(m, aligned, width, sum_width, cut):
    """For d = 0..width-1, the sum over the lanes of sign * (magnitude >> d), each term
    truncated toward zero: sum over bit columns j >= d of c_j * 2**(j - d), where c_j counts
    the positive lanes with bit j set less the negative ones. Suffix sums in ceil(log2 width)
    levels of adders (windows doubling), instead of width shifts of every lane. ``cut``: a
    register (a list in, a list out), after each group of MAX_GROUP lanes' counts, after the
    column counts and after the first two levels of the suffix sums (or all, if fewer)."""
    groups = range(0, len(aligned), MAX_GROUP)
    partial_shape = signed(ceil_log2(MAX_GROUP + 1) + 1)
    partials = []                                  # per column, per group of lanes
    for j in range(width):
        for start in groups:
            lanes = aligned[start:start + MAX_GROUP]
            positive = sum_tree([magnitude[j] & ~sign for sign, magnitude in lanes])
            negative = sum_tree([magnitude[j] & sign for sign, magnitude in lanes])
            partial = Signal(partial_shape, name=f"column{j}_group{start // MAX_GROUP}")
            m.d.comb += partial.eq(positive - negative)
            partials.append(partial)
    partials = cut(partials)
    columns = []
    for j in range(width):
        column = Signal(signed(sum_width), name=f"column{j}")
        m.d.comb += column.eq(sum_tree(partials[j * len(groups):(j + 1) * len(groups)]))
        columns.append(column)
    level, span = cut(columns), 1
    levels_before_cut = min(2, ceil_log2(width))
    if levels_before_cut == 0:
        level = cut(level)
    while span < width:
        merged = []
        for d in range(width):
            if d + span >= width:
                merged.append(level[d])
                continue
            window = Signal(signed(sum_width), name=f"suffix{span}_{d}")
            m.d.comb += window.eq(level[d] + (level[d + span] << span))
            merged.append(window)
        level, span = merged, 2 * span
        if span == 1 << levels_before_cut:
            level = cut(level)
    return level


register(Block(
    name="fp_dot", family="fp", config=FpDotConfig, build=FpDot,
    # Beats a cycle with the slots taken in turn: one, or one per slot every DOT_SLOT_GAP.
    figures=lambda cfg: {"beats_per_cycle": min(1, cfg.slots / golden.DOT_SLOT_GAP),
                         "latency_cycles": golden.DOT_LATENCY,
                         "products_per_cycle": cfg.group * min(1, cfg.slots
                                                               / golden.DOT_SLOT_GAP)},
    summary="FP8/BF16 dot product: g products a cycle, acc_frac truncation, FP32 promotion",
    # The cost trade-off seed 003 asks hardware to expose: formats, accumulator widths, scales.
    demo_configs=({}, {"acc_frac": 23}, {"dtype": "fp8_e5m2"}, {"dtype": "bf16"},
                  {"scale_format": "e8m0"}),
    # Gate by gate (no ABC): ABC9 had not mapped the default after 13 minutes; -noabc takes 16 s.
    synth_abc=False,
    area_unit="product lane", operation="product", area_units=lambda cfg: cfg.group,
    legend="beats per cycle, products per cycle",
))
