"""FP8/BF16 dot-product accumulation: block ``fp_dot`` (contract: docs/blocks/fp.md).

Source: seed 003 §3.1 (DeepSeek-V3's FP8 GEMMs on Hopper: the products of a group are aligned
to the largest exponent among them and the accumulator, the bits below ``acc_frac`` fraction
bits are truncated, and the sum is kept with an 8-bit exponent: FP22 for acc_frac = 13). The
numerics are :func:`golden.fp.accumulate`, bit for bit.

One beat of ``group`` g operand pairs per cycle, all in one cycle (the accumulator feeds the
next beat's alignment):

1. decode the 2g operands (sign, mantissa with its hidden bit, exponent of its last bit; NaN,
   infinity), multiply the mantissas exactly and add the exponents;
2. E = the largest of the nonzero products' leading-bit exponents, the accumulator's (when
   nonzero) and -126;
3. align each product and the accumulator to E: magnitude * 2**(its exponent - E + F),
   truncated toward zero (a right barrel shift), signed;
4. add the g + 1 terms exactly, renormalize to F + 1 significant bits (truncating toward zero;
   at exponent -126 the sum stays unnormalized; above 127 it saturates).

This is the partial-sum stage of the seed's dot-product unit; promotion into FP32 with
per-block scales (``golden.fp.dot``) is not built yet.
"""

import dataclasses

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden import fp as golden
from hw.params import ConfiguredComponent, choice_param, int_param, validate
from hw.registry import Block, register

__all__ = ["FpDotConfig", "FpDot", "input_layout", "result_layout"]

ACC_EXPONENT_BITS = 9              # signed -126..127 (the 8-bit exponent's range)


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
    """
    dtype: str = choice_param("fp8_e4m3", ("fp8_e4m3", "fp8_e5m2", "bf16"), "operand format")
    group: int = int_param(32, 1, 32, "g, operand pairs per beat (aligned together)")
    acc_frac: int = int_param(13, 4, 24, "F, fraction bits of the accumulator")

    def __post_init__(self):
        validate(self)

    @property
    def format(self):
        return golden.FORMATS[self.dtype]


def input_layout(config):
    code = config.format.width
    return data.StructLayout({"a": data.ArrayLayout(code, config.group),
                              "b": data.ArrayLayout(code, config.group), "last": 1})


def result_layout(config):
    """``mantissa`` (F + 1 bits) * 2**(``exponent`` - F), ``sign``; flags ``nan``, ``inf``,
    ``overflow``."""
    return data.StructLayout({"mantissa": config.acc_frac + 1,
                              "exponent": signed(ACC_EXPONENT_BITS), "sign": 1, "nan": 1,
                              "inf": 1, "overflow": 1})


def _leading_one(m, value, name):
    """Index of the highest set bit of ``value`` (0 when zero), as a priority chain."""
    index = Signal(range(max(2, len(value))), name=name)
    for bit in range(len(value)):          # later assignments win: the highest bit
        with m.If(value[bit]):
            m.d.comb += index.eq(bit)
    return index


def _max_tree(m, values, name):
    """The largest of signed ``values`` through named pairwise stages."""
    level = 0
    while len(values) > 1:
        merged = []
        for i in range(0, len(values) - 1, 2):
            stage = Signal(signed(ACC_EXPONENT_BITS + 2), name=f"{name}_{level}_{i // 2}")
            left, right = values[i], values[i + 1]
            m.d.comb += stage.eq(Mux(left > right, left, right))
            merged.append(stage)
        if len(values) % 2:
            merged.append(values[-1])
        values, level = merged, level + 1
    return values[0]


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

    def _operand(self, m, code, name):
        """``(nan, inf, sign, mantissa, exponent of its last bit)`` of a code."""
        fmt = self.config.format
        man = code[:fmt.man_bits]
        field = code[fmt.man_bits:fmt.man_bits + fmt.exp_bits]
        top = (1 << fmt.exp_bits) - 1
        if fmt.ieee:
            special = field == top
            nan, inf = special & (man != 0), special & (man == 0)
        else:
            special = (field == top) & (man == (1 << fmt.man_bits) - 1)
            nan, inf = special, Const(0)
        subnormal = field == 0
        mantissa = Signal(fmt.man_bits + 1, name=f"{name}_m")
        exponent = Signal(signed(ACC_EXPONENT_BITS + 1), name=f"{name}_x")
        m.d.comb += [mantissa.eq(Mux(special, 0, Cat(man, ~subnormal))),
                     exponent.eq(Mux(subnormal, fmt.emin - fmt.man_bits,
                                     Cat(field, Const(0, 2)).as_signed()
                                     - (fmt.bias + fmt.man_bits)))]
        return nan, inf, code[fmt.width - 1], mantissa, exponent

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        g, F = cfg.group, cfg.acc_frac
        emin, emax = golden.ACC_EMIN, golden.ACC_EMAX
        E = ACC_EXPONENT_BITS + 2                        # room for exponent sums

        # Accumulator state (sign-magnitude), per dot product: sticky flags.
        acc_sign, acc_m = Signal(), Signal(F + 1)
        acc_e = Signal(signed(ACC_EXPONENT_BITS), init=emin)
        nan_seen, inf_pos, inf_neg, overflow = Signal(), Signal(), Signal(), Signal()
        first = Signal(init=1)                           # the next beat starts a dot product

        out_valid = Signal()
        take = self.inp.valid & self.inp.ready
        m.d.comb += self.inp.ready.eq(~out_valid | self.out.ready)

        # 1. Products.
        beat = self.inp.payload
        products = []
        beat_nan, beat_inf_pos, beat_inf_neg = [], [], []
        for i in range(g):
            a_nan, a_inf, a_sign, a_m, a_x = self._operand(m, beat.a[i], f"a{i}")
            b_nan, b_inf, b_sign, b_m, b_x = self._operand(m, beat.b[i], f"b{i}")
            sign = a_sign ^ b_sign
            a_zero, b_zero = (a_m == 0) & ~a_inf, (b_m == 0) & ~b_inf
            nan = a_nan | b_nan | (a_inf & b_zero) | (b_inf & a_zero)
            inf = (a_inf | b_inf) & ~nan
            beat_nan.append(nan)
            beat_inf_pos.append(inf & ~sign)
            beat_inf_neg.append(inf & sign)
            magnitude = Signal(2 * len(a_m), name=f"p{i}_m")
            exponent = Signal(signed(E), name=f"p{i}_x")
            m.d.comb += [magnitude.eq(a_m * b_m), exponent.eq(a_x + b_x)]
            lead = _leading_one(m, magnitude, f"p{i}_lead")
            top = Signal(signed(E), name=f"p{i}_top")
            m.d.comb += top.eq(Mux(magnitude == 0, emin, exponent + lead))
            products.append((sign, magnitude, exponent, top))

        # 2. The alignment exponent.
        held_m = Mux(first, 0, acc_m)
        held_e = Signal(signed(E))
        m.d.comb += held_e.eq(Mux(held_m == 0, emin, acc_e))
        largest = Signal(signed(E))
        m.d.comb += largest.eq(_max_tree(m, [top for *_, top in products] + [held_e,
                                                                            Const(emin, signed(E))],
                                         "align"))

        # 3. Aligned, truncated toward zero, signed.
        width = max(2 * (cfg.format.man_bits + 1) + F, F + 1) + 1
        terms = []
        for i, (sign, magnitude, exponent, _) in enumerate(products):
            shift = Signal(signed(E + 1), name=f"p{i}_shift")   # >= 0 for a nonzero product
            m.d.comb += shift.eq(largest - exponent)
            amount = Signal(range(width + 1), name=f"p{i}_amount")
            m.d.comb += amount.eq(Mux(shift > width, width, Mux(shift < 0, 0, shift)))
            aligned = Signal(width, name=f"p{i}_aligned")
            m.d.comb += aligned.eq((Cat(Const(0, F), magnitude)) >> amount)
            terms.append(Mux(sign, -aligned.as_signed(), aligned.as_signed()))
        acc_shift = Signal(range(width + 1))
        gap = Signal(signed(E + 1))
        m.d.comb += [gap.eq(largest - held_e),
                     acc_shift.eq(Mux(gap > width, width, gap))]
        acc_aligned = Signal(width)
        m.d.comb += acc_aligned.eq(held_m >> acc_shift)
        held_sign = Mux(first, 0, acc_sign)
        terms.append(Mux(held_sign, -acc_aligned.as_signed(), acc_aligned.as_signed()))

        # 4. Exact sum, renormalized to F + 1 bits.
        sum_width = width + ceil_log2(g + 1) + 2
        total = Signal(signed(sum_width))
        m.d.comb += total.eq(sum(terms))
        magnitude = Signal(sum_width)
        m.d.comb += magnitude.eq(Mux(total < 0, -total, total))
        lead = _leading_one(m, magnitude, "sum_lead")
        excess = Signal(signed(E + 1))                   # > 0: carry bits to drop
        m.d.comb += excess.eq(lead - F)
        raised = Signal(signed(E + 1))
        m.d.comb += raised.eq(largest + excess)
        normal_m, normal_e = Signal(F + 1), Signal(signed(E + 1))
        with m.If(excess >= 0):
            m.d.comb += [normal_m.eq(magnitude >> excess.as_unsigned()), normal_e.eq(raised)]
        with m.Else():
            # Left: by the missing bits, but not below exponent -126.
            room = Signal(signed(E + 1))
            m.d.comb += room.eq(largest - emin)
            left = Signal(range(F + 2))
            m.d.comb += left.eq(Mux(room < -excess, room, -excess))
            m.d.comb += [normal_m.eq(magnitude << left), normal_e.eq(largest - left)]
        new_m, new_e = Signal(F + 1), Signal(signed(E + 1))
        saturated = Signal()
        with m.If(magnitude == 0):
            m.d.comb += [new_m.eq(0), new_e.eq(emin)]
        with m.Elif(normal_e > emax):
            m.d.comb += [new_m.eq((1 << (F + 1)) - 1), new_e.eq(emax), saturated.eq(1)]
        with m.Else():
            m.d.comb += [new_m.eq(normal_m), new_e.eq(normal_e)]

        any_nan = Cat(*beat_nan).any()
        any_pos = Cat(*beat_inf_pos).any()
        any_neg = Cat(*beat_inf_neg).any()
        sticky_nan = Mux(first, 0, nan_seen) | any_nan
        sticky_pos = Mux(first, 0, inf_pos) | any_pos
        sticky_neg = Mux(first, 0, inf_neg) | any_neg
        sticky_overflow = Mux(first, 0, overflow) | saturated
        with m.If(take):
            m.d.sync += [acc_m.eq(new_m), acc_e.eq(new_e), acc_sign.eq(total < 0),
                         nan_seen.eq(sticky_nan), inf_pos.eq(sticky_pos),
                         inf_neg.eq(sticky_neg), overflow.eq(sticky_overflow),
                         first.eq(beat.last)]

        # Result register: loaded by a dot product's last beat.
        out = self.out.payload
        with m.If(self.out.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(take & beat.last):
            nan = sticky_nan | (sticky_pos & sticky_neg)
            inf = (sticky_pos | sticky_neg) & ~nan
            m.d.sync += [out_valid.eq(1), out.mantissa.eq(new_m), out.exponent.eq(new_e),
                         out.sign.eq(Mux(inf, sticky_neg, total < 0)), out.nan.eq(nan),
                         out.inf.eq(inf), out.overflow.eq(sticky_overflow)]
        m.d.comb += self.out.valid.eq(out_valid)
        return m


register(Block(
    name="fp_dot", family="fp", config=FpDotConfig, build=FpDot,
    figures=lambda cfg: {"beats_per_cycle": 1, "latency_cycles": 1,
                         "products_per_cycle": cfg.group},
    summary="FP8/BF16 dot-product accumulation: g products a cycle, acc_frac truncation",
    demo_configs=({},),
    area_unit="product lane", area_units=lambda cfg: cfg.group,
    legend="beats per cycle, products per cycle",
))
