"""Floating-point arithmetic shared by the blocks (no block of its own): the adder of the NoP's
BF16/FP32 combine (bit for bit :func:`golden.fp.add`); a code's fields; one rounding of an exact
value to a format; and the multiply and scaled cast of ``expert_chiplet``'s floating-point
datapath (bit for bit :func:`golden.fp.multiply` and :func:`golden.fp.scale_cast`).

Hand-written: amaranth.lib has no floating-point arithmetic, and the rounding, saturation and
special-value rules must be ours (golden.fp's), not a vendor core's.
"""

from amaranth.hdl import Cat, Const, Mux, Signal, signed

from hw.pipeline import leading_one

__all__ = ["fp_add", "fp_fields", "fp_round", "fp_multiply", "fp_scale_cast"]


def fp_add(m, a, b, fmt, name):
    """A Signal holding the code of a + b (codes of ``fmt``, a ``golden.fp.Format`` with
    IEEE-style specials), combinationally: the smaller magnitude aligned to the larger with a
    guard, a round and a sticky bit, added or subtracted, renormalized (not below the smallest
    normal exponent: subnormals kept), rounded to nearest even once; past the largest finite
    magnitude it saturates."""
    assert fmt.ieee, "fp_add: formats with infinities (bf16, fp32, fp8_e5m2)"
    W, E, M = fmt.width, fmt.exp_bits, fmt.man_bits
    top = (1 << E) - 1
    X = E + 3                                   # signed exponent arithmetic

    def special(code):
        field, man = code[M:M + E], code[:M]
        return (field == top) & (man != 0), (field == top) & (man == 0)

    nan_a, inf_a = special(a)
    nan_b, inf_b = special(b)
    swap = Signal(name=f"{name}_swap")
    m.d.comb += swap.eq(b[:W - 1] > a[:W - 1])  # magnitudes order as integers
    big, small = Signal(W, name=f"{name}_big"), Signal(W, name=f"{name}_small")
    m.d.comb += [big.eq(Mux(swap, b, a)), small.eq(Mux(swap, a, b))]
    big_field, small_field = big[M:M + E], small[M:M + E]
    big_exp = Mux(big_field == 0, 1, big_field)
    small_exp = Mux(small_field == 0, 1, small_field)
    distance = Signal(E, name=f"{name}_distance")
    m.d.comb += distance.eq(big_exp - small_exp)
    width = M + 4                               # significand with its hidden bit, G, R, S
    big_sig = Cat(Const(0, 3), big[:M], big_field != 0)
    small_sig = Cat(Const(0, 3), small[:M], small_field != 0)
    amount = Signal(range(width + 1), name=f"{name}_amount")
    m.d.comb += amount.eq(Mux(distance > width, width, distance))
    aligned = Signal(width, name=f"{name}_aligned")
    sticky = Signal(name=f"{name}_sticky")
    m.d.comb += [aligned.eq(small_sig >> amount),
                 sticky.eq((small_sig & ((Const(1, width + 1) << amount) - 1)) != 0)]
    subtract = big[W - 1] ^ small[W - 1]
    total = Signal(width + 1, name=f"{name}_sum")
    operand = aligned | sticky
    m.d.comb += total.eq(Mux(subtract, big_sig - operand, big_sig + operand))

    # Renormalize: right by one on a carry; else left until the hidden bit is set, but not
    # below exponent 1 (then the result is subnormal).
    lead = leading_one(m, total, f"{name}_lead")
    normal = Signal(width, name=f"{name}_normal")
    exponent = Signal(signed(X), name=f"{name}_exponent")
    with m.If(total[width]):
        m.d.comb += [normal.eq((total >> 1) | total[0]), exponent.eq(big_exp + 1)]
    with m.Else():
        missing = Signal(range(width + 1), name=f"{name}_missing")
        m.d.comb += missing.eq(width - 1 - lead)
        room = Signal(signed(X), name=f"{name}_room")
        m.d.comb += room.eq(big_exp - 1)
        left = Signal(range(width + 1), name=f"{name}_left")
        m.d.comb += left.eq(Mux(room < missing, room, missing))
        m.d.comb += [normal.eq(total << left), exponent.eq(big_exp - left)]
    kept = normal[3:]                           # M + 1 bits
    guard, rest = normal[2], normal[:2] != 0
    rounded = Signal(M + 2, name=f"{name}_rounded")
    m.d.comb += rounded.eq(kept + (guard & (rest | kept[0])))
    final_sig = Signal(M + 1, name=f"{name}_significand")
    final_exp = Signal(signed(X), name=f"{name}_final_exponent")
    with m.If(rounded[M + 1]):
        m.d.comb += [final_sig.eq(rounded >> 1), final_exp.eq(exponent + 1)]
    with m.Else():
        m.d.comb += [final_sig.eq(rounded), final_exp.eq(exponent)]

    result = Signal(W, name=f"{name}_result")
    sign = big[W - 1]
    both_negative_zero = (a == (1 << (W - 1))) & (b == (1 << (W - 1)))
    with m.If(nan_a | nan_b | (inf_a & inf_b & (a[W - 1] != b[W - 1]))):
        m.d.comb += result.eq(fmt.canonical_nan)
    with m.Elif(inf_a):
        m.d.comb += result.eq(a)
    with m.Elif(inf_b):
        m.d.comb += result.eq(b)
    with m.Elif(total == 0):
        m.d.comb += result.eq(Mux(both_negative_zero, 1 << (W - 1), 0))
    with m.Elif(final_exp >= top):
        m.d.comb += result.eq(Cat(Const(fmt.max_code, W - 1), sign))
    with m.Else():
        m.d.comb += result.eq(Cat(final_sig[:M], Mux(final_sig[M], final_exp[:E], 0), sign))
    return result


def fp_fields(m, code, fmt, name, exponent_width=None):
    """``(nan, inf, sign, mantissa, exponent of its last bit)`` of a code of ``fmt``: the value
    is (-1)**sign * mantissa * 2**exponent (mantissa 0 for the specials)."""
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
    exponent = Signal(signed(exponent_width or fmt.exp_bits + 2), name=f"{name}_x")
    m.d.comb += [mantissa.eq(Mux(special, 0, Cat(man, ~subnormal))),
                 exponent.eq(Mux(subnormal, fmt.emin - fmt.man_bits,
                                 Cat(field, Const(0, 2)).as_signed()
                                 - (fmt.bias + fmt.man_bits)))]
    return nan, inf, code[fmt.width - 1], mantissa, exponent


def fp_round(m, sign, magnitude, exponent, fmt, name):
    """The code of (-1)**sign * magnitude * 2**exponent (an unsigned and a signed Value) in
    ``fmt``, rounded once: to nearest even at the format's precision, subnormals kept, past the
    largest finite magnitude saturated; a zero magnitude gives the zero of ``sign``."""
    M, E, W = fmt.man_bits, fmt.exp_bits, fmt.width
    size = len(magnitude)
    X = max(len(exponent), E + 2) + 2                 # signed exponent arithmetic
    lead = leading_one(m, magnitude, f"{name}_lead")
    top = Signal(signed(X), name=f"{name}_top")       # floor(log2 |value|)
    m.d.comb += top.eq(exponent + lead)
    kept_x = Signal(signed(X), name=f"{name}_kept_x")  # exponent of the kept last bit
    m.d.comb += kept_x.eq(Mux(top < fmt.emin, fmt.emin - M, top - M))
    drop = Signal(signed(X + 1), name=f"{name}_drop")  # magnitude bits below the kept ones
    m.d.comb += drop.eq(kept_x - exponent)
    amount = Signal(range(size + 3), name=f"{name}_amount")
    m.d.comb += amount.eq(Mux(drop < 0, 0, Mux(drop > size + 2, size + 2, drop)))
    left = Signal(range(M + 1), name=f"{name}_left")   # drop >= lead - M >= -M
    m.d.comb += left.eq(Mux(drop < 0, -drop, 0))
    kept = Signal(M + 1, name=f"{name}_kept")
    m.d.comb += kept.eq(Mux(drop < 0, magnitude << left, magnitude >> amount))
    guard = Signal(name=f"{name}_guard")
    rest = Signal(name=f"{name}_rest")
    below = Signal(range(size + 2), name=f"{name}_below")   # the guard bit's index
    m.d.comb += below.eq(amount - 1)
    m.d.comb += [guard.eq(Mux(amount == 0, 0, (magnitude >> below)[0])),
                 rest.eq(Mux(amount <= 1, 0,
                             (magnitude & ((Const(1, size + 3) << below) - 1)) != 0))]
    rounded = Signal(M + 2, name=f"{name}_rounded")
    m.d.comb += rounded.eq(kept + (guard & (rest | kept[0])))
    carry = rounded[M + 1]
    q = Signal(M + 1, name=f"{name}_q")
    biased = Signal(signed(X + 1), name=f"{name}_biased")
    m.d.comb += [q.eq(Mux(carry, rounded >> 1, rounded)),
                 biased.eq(kept_x + carry + M + fmt.bias)]
    top_field = (1 << E) - 1
    if fmt.ieee:
        too_big = biased >= top_field
    else:                                             # S.1111.111 is NaN: saturate below it
        too_big = (biased > top_field) | ((biased == top_field) & (q[:M] == (1 << M) - 1))
    code = Signal(W, name=f"{name}_code")
    with m.If(q == 0):
        m.d.comb += code.eq(Cat(Const(0, W - 1), sign))
    with m.Elif(~q[M]):                               # subnormal (kept_x is the lowest)
        m.d.comb += code.eq(Cat(q[:M], Const(0, E), sign))
    with m.Elif(too_big):
        m.d.comb += code.eq(Cat(Const(fmt.max_code, W - 1), sign))
    with m.Else():
        m.d.comb += code.eq(Cat(q[:M], biased[:E], sign))
    return code


def fp_multiply(m, a, fmt_a, b, fmt_b, dst, shift, name):
    """The code of ``dst`` for a * b * 2**-shift (``shift`` an int), rounded once
    (:func:`fp_round`); ``fmt_b`` None: b is an unsigned integer. A NaN operand or an infinity
    times zero gives ``dst``'s canonical NaN; an infinity otherwise gives the infinity of the
    product's sign (the largest finite value where ``dst`` has none)."""
    nan_a, inf_a, sign_a, m_a, x_a = fp_fields(m, a, fmt_a, f"{name}_a")
    if fmt_b is None:
        nan_b, inf_b, sign_b, m_b, x_b = Const(0), Const(0), Const(0), b, Const(0)
    else:
        nan_b, inf_b, sign_b, m_b, x_b = fp_fields(m, b, fmt_b, f"{name}_b")
    zero_a = ~nan_a & ~inf_a & (m_a == 0)
    zero_b = ~nan_b & ~inf_b & (m_b == 0)
    sign = Signal(name=f"{name}_sign")
    product = Signal(len(m_a) + len(m_b), name=f"{name}_product")
    exponent = Signal(signed(max(len(x_a), len(x_b)) + 1 + max(shift, 1).bit_length() + 1),
                      name=f"{name}_exponent")
    m.d.comb += [sign.eq(sign_a ^ sign_b), product.eq(m_a * m_b),
                 exponent.eq(x_a + x_b - shift)]
    rounded = fp_round(m, sign, product, exponent, dst, f"{name}_round")
    W = dst.width
    infinity = (((1 << dst.exp_bits) - 1) << dst.man_bits) if dst.ieee else dst.max_code
    code = Signal(W, name=f"{name}_code")
    with m.If(nan_a | nan_b | (inf_a & zero_b) | (inf_b & zero_a)):
        m.d.comb += code.eq(dst.canonical_nan)
    with m.Elif(inf_a | inf_b):
        m.d.comb += code.eq(Cat(Const(infinity, W - 1), sign))
    with m.Else():
        m.d.comb += code.eq(rounded)
    return code


def fp_scale_cast(m, code, src, dst, shift, name):
    """The code of ``dst`` for code's value times 2**-shift (:func:`fp_multiply` by one)."""
    return fp_multiply(m, code, src, Const(1, 1), None, dst, shift, name)
