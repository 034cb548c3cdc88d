"""Floating-point arithmetic shared by the blocks (no block of its own): the adder of the NoP's
BF16/FP32 combine. Bit for bit :func:`golden.fp.add`.

Hand-written: amaranth.lib has no floating-point arithmetic, and the rounding, saturation and
special-value rules must be ours (golden.fp's), not a vendor core's.
"""

from amaranth.hdl import Cat, Const, Mux, Signal, signed

from hw.pipeline import leading_one

__all__ = ["fp_add"]


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
