"""FP8/BF16 dot products: block ``fp_dot`` (contract: docs/blocks/fp.md).

Source: seed 003 §3.1 (DeepSeek-V3's FP8 GEMMs on Hopper: the products of a group are aligned
to the largest exponent among them and the accumulator, the bits below ``acc_frac`` fraction
bits are truncated, and the sum is kept with an 8-bit exponent: FP22 for acc_frac = 13; every
128 elements the partial sum is promoted into FP32, where the fine-grained scales apply). The
numerics are :func:`golden.fp.dot`, bit for bit.

One beat of ``group`` g operand pairs per cycle. ``FpAccumulator.step`` does a beat in one
cycle (the floating-point PEs, g = 1); ``fp_dot`` pipelines the same steps over six registers
(``golden.fp.DOT_LATENCY``), two of them loops that take a beat a cycle:

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

The pipeline (stage: what its register holds): 1, the products; 2, each product aligned to
the beat's own largest exponent B (at least -126), in F + 1 bits (B is at least each
product's leading-bit exponent); 3, for every further shift d = 0..F the beat's sum with each
term shifted right by d and truncated, from bit-column counts (a product aligned to E =
max(B, partial sum's) is its B-aligned value shifted by E - B, since floor(floor(x) / 2**d) =
floor(x / 2**d)); 4, the partial sum: the loop picks the sum for d = E - B (none past F: zero),
adds the aligned partial sum and renormalizes (steps 2 to 4); 5, the partial sum times its
scales; 6, the FP32 loop (step 5) and the output register.
"""

import dataclasses

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import fp as golden
from hw.fparith import fp_fields
from hw.params import ConfiguredComponent, choice_param, int_param, param_error, validate
from hw.pipeline import StallPipe, leading_one, leading_one_tree, max_tree, sum_tree
from hw.registry import Block, register

__all__ = ["FpDotConfig", "FpDot", "input_layout", "result_layout"]

ACC_EXPONENT_BITS = 9              # signed -126..127 (the 8-bit exponent's range)
SCALE_BLOCK = 128                  # elements per scale (1x128 tiles, 128x128 blocks)
FIELD = 80                         # promotion adder: bits from the larger operand's top down
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
    """
    dtype: str = choice_param("fp8_e4m3", ("fp8_e4m3", "fp8_e5m2", "bf16"), "operand format")
    group: int = int_param(32, 1, 32, "g, operand pairs per beat (aligned together)")
    acc_frac: int = int_param(13, 4, 24, "F, fraction bits of the accumulator")
    promote_every: int = int_param(128, 0, 128, "elements per promotion into FP32 (0: at the end)")
    scale_format: str = choice_param("fp32", ("fp32", "e8m0"), "format of the scales")

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
                              "last": 1})


def result_layout(config):
    """``result``: the dot product as an FP32 code."""
    return data.StructLayout({"result": 32})


def _operand(m, code, name, fmt):
    """``(nan, inf, sign, mantissa, exponent of its last bit)`` of a code of ``fmt``."""
    return fp_fields(m, code, fmt, name, ACC_EXPONENT_BITS + 1)


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

    def aligned_product(self, magnitude, exponent, largest, name):
        """Step 3 for one product: magnitude * 2**(exponent - largest + F), truncated toward
        zero (``term_width`` bits; ``largest`` is at least the product's leading-bit exponent
        when it is nonzero)."""
        m, W = self.m, self.term_width
        shift = Signal(signed(ACC_EXPONENT_BITS + 3), name=f"{name}_shift")
        m.d.comb += shift.eq(largest - exponent)
        amount = Signal(range(W + 1), name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift > W, W, Mux(shift < 0, 0, shift)))
        aligned = Signal(W, name=f"{name}_aligned")
        m.d.comb += aligned.eq(Cat(Const(0, self.acc_frac), magnitude) >> amount)
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
        m, p = self.m, self.prefix
        held_total = Mux(dot_first, 0, self.total_code)
        promoted = self._add_round(*scaled, held_total)
        beat_nan, beat_inf_pos, beat_inf_neg = flags
        sticky_nan = Mux(dot_first, 0, self.nan_seen) | beat_nan | (promote & scale_bad)
        sticky_pos = Mux(dot_first, 0, self.inf_pos) | beat_inf_pos
        sticky_neg = Mux(dot_first, 0, self.inf_neg) | beat_inf_neg
        nan = sticky_nan | (sticky_pos & sticky_neg)
        inf = (sticky_pos | sticky_neg) & ~nan
        infinity = Cat(Const(0, 23), Const(0xFF, 8), sticky_neg)
        result = Signal(32, name=f"{p}result")
        m.d.comb += result.eq(Mux(nan, FP32.canonical_nan, Mux(inf, infinity, promoted)))
        updates = [self.nan_seen.eq(sticky_nan), self.inf_pos.eq(sticky_pos),
                   self.inf_neg.eq(sticky_neg),
                   self.total_code.eq(Mux(last, result, Mux(promote, promoted, held_total)))]
        return updates, result

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

    def _normalize(self, total, largest):
        """Step 4's renormalization: the exact signed sum ``total`` (its last bit's weight
        2**(largest - F)) as the magnitude's ``(mantissa of F + 1 bits, exponent)``: truncated
        toward zero, unnormalized at exponent -126, saturated above 127, (0, -126) for zero."""
        m, p, F = self.m, self.prefix, self.acc_frac
        emin, emax = golden.ACC_EMIN, golden.ACC_EMAX
        E = ACC_EXPONENT_BITS + 2
        magnitude = Signal(len(total), name=f"{p}sum_abs")
        m.d.comb += magnitude.eq(Mux(total < 0, -total, total))
        lead = leading_one_tree(m, magnitude, f"{p}sum_lead")
        excess = Signal(signed(E + 1), name=f"{p}excess")      # > 0: carry bits to drop
        m.d.comb += excess.eq(lead - F)
        # From ``largest`` alone, beside the sum: the room above -126 and below 127.
        room = Signal(signed(E + 1), name=f"{p}room")
        headroom = Signal(signed(E + 1), name=f"{p}headroom")
        m.d.comb += [room.eq(largest - emin), headroom.eq(emax - largest)]
        normal_m = Signal(F + 1, name=f"{p}normal_m")
        normal_e = Signal(signed(E + 1), name=f"{p}normal_e")
        overflow = Signal(name=f"{p}overflow")                 # normal_e > 127
        with m.If(excess >= 0):
            m.d.comb += [normal_m.eq(magnitude >> excess.as_unsigned()),
                         normal_e.eq(largest + excess), overflow.eq(excess > headroom)]
        with m.Else():
            # Left: by the missing bits, but not below exponent -126.
            left = Signal(range(F + 2), name=f"{p}left")
            m.d.comb += left.eq(Mux(room < -excess, room, -excess))
            m.d.comb += [normal_m.eq(magnitude << left), normal_e.eq(largest - left),
                         overflow.eq(left < -headroom)]
        new_m = Signal(F + 1, name=f"{p}new_m")
        new_e = Signal(signed(E + 1), name=f"{p}new_e")
        with m.If(total == 0):
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

    def _scaled(self, sign, mantissa, exponent, factor):
        """A partial sum (sign, F + 1-bit mantissa, exponent) times a scale factor
        (:meth:`_scale_factor`): ``(sign, mantissa, exponent of its last bit, of its leading
        bit)``, exact."""
        m, p, F = self.m, self.prefix, self.acc_frac
        _, f_sign, f_m, f_x = factor
        product = Signal(F + 1 + len(f_m), name=f"{p}scaled_m")
        product_x = Signal(signed(14), name=f"{p}scaled_x")
        m.d.comb += [product.eq(mantissa * f_m), product_x.eq(exponent - F + f_x)]
        top = Signal(signed(14), name=f"{p}scaled_top")
        m.d.comb += top.eq(product_x + leading_one_tree(m, product, f"{p}scaled_lead"))
        return sign ^ f_sign, product, product_x, top

    def _aligned(self, mantissa, shift, name):
        """``mantissa * 2**(FIELD - shift)`` in FIELD + 1 bits, truncated, and whether bits
        were lost (sticky): shift = FIELD - (exponent - base) for a mantissa of ``exponent``
        and the field's last bit at ``base``. The caller makes the top fit."""
        m = self.m
        width = len(mantissa)
        full = Cat(Const(0, FIELD), mantissa)
        # Shifts of 256 or more clear the field as FIELD + width does: their high bits, not a
        # comparison, make the clamp (a negative shift comes only with a zero mantissa).
        low = 8
        assert FIELD + width < 1 << low
        amount = Signal(low, name=f"{name}_amount")
        m.d.comb += amount.eq(Mux(shift[-1], 0, Mux(shift[low:-1].any(), (1 << low) - 1,
                                                    shift[:low])))
        value = Signal(FIELD + 1, name=f"{name}_aligned")
        lost = Signal(name=f"{name}_sticky")
        m.d.comb += [value.eq(full >> amount),
                     lost.eq((full & _low_mask(amount, FIELD + width)) != 0)]
        return value, lost

    def _scale(self, code, name):
        """A scale as ``(nan, inf, sign, mantissa, exponent of its last bit)``: an FP32 code,
        or an E8M0 one (mantissa 1, exponent code - 127; 255 is NaN)."""
        if self.scale_format == "fp32":
            return _operand(self.m, code, name, FP32)
        exponent = Signal(signed(10), name=f"{name}_x")
        self.m.d.comb += exponent.eq(Cat(code, Const(0, 2)).as_signed() - 127)
        return code == 255, Const(0), Const(0), Const(1, 1), exponent

    def _add_round(self, product_sign, product, product_x, p_top, total):
        """The FP32 code of ``total`` + (-1)**product_sign * product * 2**product_x (its
        leading bit's exponent ``p_top`` when nonzero), rounded to nearest even once
        (saturating, subnormals kept, zero positive)."""
        m, p = self.m, self.prefix
        _, _, t_sign, t_m, t_x = _operand(m, total, f"{p}total", FP32)
        t_lead = leading_one_tree(m, t_m, f"{p}total_lead")
        t_top = Signal(signed(14), name=f"{p}total_top")
        m.d.comb += t_top.eq(t_x + t_lead)
        p_zero, t_zero = product == 0, t_m == 0
        p_leads = Signal(name=f"{p}product_leads")     # the larger sets the field's top
        m.d.comb += p_leads.eq(~p_zero & (t_zero | (p_top > t_top)))
        top = Signal(signed(14))
        m.d.comb += top.eq(Mux(p_leads, p_top, t_top))
        base = Signal(signed(14))                      # the field's last bit's exponent
        m.d.comb += base.eq(top - (FIELD - 1))
        # Each operand's shift, FIELD - (exponent - base) = top + 1 - exponent, from either
        # top, so that the shifters need not wait for the comparison and then a subtraction.
        p_shift, t_shift = Signal(signed(14)), Signal(signed(14))
        p_own, p_under_t = Signal(signed(14)), Signal(signed(14))
        m.d.comb += [p_own.eq(p_top + 1 - product_x),
                     p_under_t.eq((t_x + 1 - product_x) + t_lead),
                     p_shift.eq(Mux(p_leads, p_own, p_under_t)),
                     t_shift.eq(Mux(p_leads, p_top + 1 - t_x, t_lead + 1))]
        p_value, p_lost = self._aligned(product, p_shift, f"{p}product")
        t_value, t_lost = self._aligned(t_m, t_shift, f"{p}total")
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
        m.d.comb += result_sign.eq(Mux(mixed, combined < 0, product_sign & (combined != 0)))
        # At most the smaller operand lost bits: the exact sum lies within one field unit of
        # raw, on that operand's side.
        lost = p_lost | t_lost
        lost_negative = Mux(p_lost, product_sign, t_sign)
        # |raw| less one where the lost bits lie on the other side of zero; for raw < 0 (only
        # with different signs), -raw - 1 is ~raw: one carry chain after the sum's.
        # Both candidates of each side are ready before toward_zero (which waits for the sign).
        toward_zero = lost & (lost_negative != result_sign)
        negative = mixed & (combined < 0)
        inverted = (~combined).as_unsigned()[:width]
        below, above = Signal(width), Signal(width)
        m.d.comb += [below.eq(combined.as_unsigned() - 1), above.eq(inverted + 1)]
        exact = Signal(width)                          # |sum| = exact + (sticky ? (0, 1) : 0)
        m.d.comb += exact.eq(Mux(negative, Mux(toward_zero, inverted, above),
                                 Mux(toward_zero, below, combined.as_unsigned())))
        lead = leading_one_tree(m, exact, f"{p}round_lead")
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
        kept = Signal(width)
        m.d.comb += kept.eq(Mux(drop[-1], exact << left, exact >> amount))
        dropped = _low_mask(amount, width)             # the guard bit and those below it
        guard = Signal()
        rest = Signal()
        m.d.comb += [guard.eq((exact & dropped & ~(dropped >> 1)) != 0),
                     rest.eq(lost | ((exact & (dropped >> 1)) != 0))]
        rounded = Signal(26)
        m.d.comb += rounded.eq(kept + (guard & (rest | kept[0])))
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

        # The whole pipeline moves together, stalled only by a full output register.
        out_valid = Signal()
        advance = Signal()
        m.d.comb += [advance.eq(~out_valid | self.out.ready), self.inp.ready.eq(advance),
                     self.out.valid.eq(out_valid)]
        pipe = StallPipe(advance)
        take = self.inp.valid & advance

        # Beat control, at the input: does the beat start a partial sum, a dot product, end
        # a partial sum (promote), end the dot product?
        first = Signal(init=1)
        dot_first = Signal(init=1)
        beat_index = Signal(range(max(1, cfg.chunk_beats)))
        beat = self.inp.payload
        promote = Signal()
        chunk_end = (beat_index == cfg.chunk_beats - 1) if cfg.chunk_beats else Const(0)
        m.d.comb += promote.eq(chunk_end | beat.last)
        with m.If(take):
            m.d.sync += [first.eq(promote), dot_first.eq(beat.last)]
            if cfg.chunk_beats:
                m.d.sync += beat_index.eq(Mux(promote, 0, beat_index + 1))

        # A stage's data registers have no reset: they are read only with the stage's valid
        # flag, which reset clears, and the stage's next beat overwrites them.
        def data(value, name):
            return pipe.reg(value, name, reset_less=True)

        def carry(values, name, stages):
            """``values`` (a dict) delayed by ``stages`` pipeline registers (only ``valid``
            reset)."""
            return {key: pipe.delay(value, stages, f"{name}_{key}", reset_less=key != "valid")
                    for key, value in values.items()}

        control = {"valid": self.inp.valid, "first": first, "dot_first": dot_first,
                   "promote": promote, "last": beat.last}
        factor = acc._scale_factor(beat.scale_a, beat.scale_b)

        # Stage 1: products (step 1).
        products, flags = acc.products(beat.a, beat.b)
        lanes = [tuple(data(value, f"s1_p{i}_{key}") for key, value in
                       zip(("sign", "m", "x", "top"), product))
                 for i, product in enumerate(products)]

        # Stage 2: each product aligned to the beat's largest exponent B (at least -126).
        beat_top = Signal(signed(E), name="beat_top")
        m.d.comb += beat_top.eq(max_tree(m, [top for *_, top in lanes] + [emin], "beat_top"))
        aligned = [(data(sign, f"s2_p{i}_sign"),
                    data(acc.aligned_product(magnitude, exponent, beat_top, f"s1_p{i}")[:W],
                         f"s2_p{i}_aligned"))
                   for i, (sign, magnitude, exponent, _) in enumerate(lanes)]
        top2 = data(beat_top, "s2_beat_top")

        # Stage 3: the beat's sums for every further right shift d the partial sum may force
        # (next stage), so that the loop selects one instead of shifting and adding g terms.
        shifted_sums = [data(value, f"s3_sum{d}")
                        for d, value in enumerate(_shifted_sums(m, aligned, W, acc.sum_width))]
        top3 = data(top2, "s3_beat_top")

        # Stage 4, the partial-sum loop (steps 2 to 4): the alignment exponent is the larger of
        # B and the partial sum's; past B by d, the products' sum is the one shifted by d.
        c4 = carry(control, "s4", 3)
        held_m, held_e, held_sign = acc.held(c4["first"])
        ahead = Signal(name="partial_ahead")
        gap = Signal(signed(E + 1), name="partial_gap")        # held_e - B
        behind = Signal(signed(E + 1), name="partial_behind")  # B - held_e, beside it
        m.d.comb += [ahead.eq(held_e > top3), gap.eq(held_e - top3), behind.eq(top3 - held_e)]
        largest = Signal(signed(E), name="largest")
        m.d.comb += largest.eq(Mux(ahead, held_e, top3))
        # Shifts clamped by their high bits, not by comparisons: the products' sums padded
        # with zeros to a power of two (a shift of W = F + 1 or more leaves none), the partial
        # sum's F + 1 bits cleared by any shift of 2**k - 1 >= F + 1: one clamp width for both.
        pick_bits = ceil_log2(W + 1)
        pick = Signal(pick_bits, name="products_shift")
        m.d.comb += pick.eq(Mux(ahead, Mux(gap[pick_bits:].any(), (1 << pick_bits) - 1,
                                           gap[:pick_bits]), 0))
        zero = Const(0, signed(acc.sum_width))
        products_sum = Array(shifted_sums + [zero] * ((1 << pick_bits) - W))[pick]
        # The partial sum's term as FpAccumulator.held_term computes it for step(), in the
        # clock-rate form of this loop (shift from B - held_e beside the comparison).
        held_bits = pick_bits
        held_shift = Signal(held_bits, name="partial_shift")
        m.d.comb += held_shift.eq(Mux(ahead, 0, Mux(behind[held_bits:].any(),
                                                    (1 << held_bits) - 1, behind[:held_bits])))
        held_aligned = Signal(acc.sum_width, name="partial_aligned")
        m.d.comb += held_aligned.eq(held_m >> held_shift)
        # Signed, in one adder: -x = ~x + 1, the 1 as a carry in.
        total = Signal(signed(acc.sum_width), name="sum")
        m.d.comb += total.eq(_add_with_carry(products_sum.as_unsigned(),
                                             Mux(held_sign, ~held_aligned, held_aligned),
                                             held_sign))
        new_m, new_e = acc._normalize(total, largest)
        with m.If(advance & c4["valid"]):
            m.d.sync += [acc.acc_m.eq(new_m), acc.acc_e.eq(new_e), acc.acc_sign.eq(total < 0)]

        # Stage 5: the partial sum (now in acc_m, acc_e, acc_sign) times its scales.
        c5 = carry(control, "s5", 4)
        f5 = carry(dict(zip(("bad", "sign", "m", "x"), factor)), "s5_scales", 4)
        flags5 = carry(dict(zip(("nan", "inf_pos", "inf_neg"), flags)), "s5_flags", 4)
        scaled = [data(value, f"s5_scaled_{key}") for key, value in
                  zip(("sign", "m", "x", "top"), acc._scaled(acc.acc_sign, acc.acc_m, acc.acc_e,
                                                      (f5["bad"], f5["sign"], f5["m"],
                                                       f5["x"])))]

        # Stage 6, the FP32 loop (step 5 and the specials), into the output register.
        c6 = carry(control, "s6", 5)
        updates, result = acc.promotion(
            scaled, data(f5["bad"], "s6_scales_bad"),
            [data(flag, f"s6_{key}") for key, flag in flags5.items()],
            c6["dot_first"], c6["promote"], c6["last"])
        with m.If(advance & c6["valid"]):
            m.d.sync += updates
        with m.If(advance):
            m.d.sync += out_valid.eq(c6["valid"] & c6["last"])
            with m.If(c6["valid"] & c6["last"]):
                m.d.sync += self.out.payload.result.eq(result)
        pipe.emit(m)
        return m


def _shifted_sums(m, aligned, width, sum_width):
    """For d = 0..width-1, the sum over the lanes of sign * (magnitude >> d), each term
    truncated toward zero: sum over bit columns j >= d of c_j * 2**(j - d), where c_j counts
    the positive lanes with bit j set less the negative ones. Suffix sums in ceil(log2 width)
    levels of adders (windows doubling), instead of width shifts of every lane."""
    columns = []
    for j in range(width):
        positive = sum_tree([magnitude[j] & ~sign for sign, magnitude in aligned])
        negative = sum_tree([magnitude[j] & sign for sign, magnitude in aligned])
        column = Signal(signed(sum_width), name=f"column{j}")
        m.d.comb += column.eq(positive - negative)
        columns.append(column)
    level, span = columns, 1
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
    return level


register(Block(
    name="fp_dot", family="fp", config=FpDotConfig, build=FpDot,
    figures=lambda cfg: {"beats_per_cycle": 1, "latency_cycles": golden.DOT_LATENCY,
                         "products_per_cycle": cfg.group},
    summary="FP8/BF16 dot product: g products a cycle, acc_frac truncation, FP32 promotion",
    # The cost trade-off seed 003 asks hardware to expose: formats, accumulator widths, scales.
    demo_configs=({}, {"acc_frac": 23}, {"dtype": "fp8_e5m2"}, {"dtype": "bf16"},
                  {"scale_format": "e8m0"}),
    # Gate by gate (no ABC): ABC9 had not mapped the default after 13 minutes; -noabc takes 16 s.
    synth_abc=False,
    area_unit="product lane", operation="product", area_units=lambda cfg: cfg.group,
    legend="beats per cycle, products per cycle",
))
