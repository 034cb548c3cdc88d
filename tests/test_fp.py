"""golden.fp: the formats against ml_dtypes, the cast rule's own cases, and the accumulator."""

import math
import random
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from conftest import SIMULATORS, config_id, run_block
from golden import fp
from hw.params import ParamError
from hw.registry import get_block

ML = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
      "bf16": ml_dtypes.bfloat16}
CODE_TYPES = {8: np.uint8, 16: np.uint16}


def _same(x, y):
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) ==
                                                 math.copysign(1, y))


@pytest.mark.parametrize("name", sorted(ML))
def test_every_code_decodes_as_ml_dtypes_does(name):
    fmt = fp.FORMATS[name]
    codes = np.arange(1 << fmt.width, dtype=CODE_TYPES[fmt.width])
    with np.errstate(invalid="ignore"):                   # NaN codes cast to NaN
        theirs = codes.view(ML[name]).astype(np.float64)
    for code, value in zip(codes.tolist(), theirs.tolist()):
        assert _same(fp.decode(code, name), value), hex(code)


@pytest.mark.parametrize("name", sorted(fp.FORMATS))
def test_every_value_encodes_back_to_its_code(name):
    fmt = fp.FORMATS[name]
    codes = range(1 << fmt.width) if fmt.width <= 16 else \
        random.Random(1).sample(range(1 << 32), 20000)
    for code in codes:
        value = fp.decode(code, name)
        if not math.isnan(value):
            assert fp.encode(value, name) == code, hex(code)


@pytest.mark.parametrize("name", sorted(ML))
def test_casts_round_to_nearest_even_like_ml_dtypes_within_range(name):
    fmt = fp.FORMATS[name]
    rng = np.random.default_rng(3)
    # float32 inputs over the format's whole range, subnormals included (no double rounding).
    exponents = rng.uniform(fmt.emin - fmt.man_bits - 2, math.log2(fmt.max_finite), 20000)
    values = (rng.choice([-1, 1], 20000) * np.exp2(exponents)).astype(np.float32)
    values = values[np.abs(values) <= fmt.max_finite]
    theirs = values.astype(ML[name]).view(CODE_TYPES[fmt.width]).tolist()
    for value, code in zip(values.tolist(), theirs):
        assert fp.encode(float(value), name) == code, (value, hex(code))


def test_overflow_saturates_and_infinity_follows_the_format():
    e4, e5 = "fp8_e4m3", "fp8_e5m2"
    assert fp.FORMATS[e4].max_finite == 448 and fp.FORMATS[e5].max_finite == 57344
    for value in (449.0, 500.0, 1e9, math.inf):
        assert fp.encode(value, e4) == 0x7E and fp.encode(-value, e4) == 0xFE
    for value in (61440.0, 1e9):                           # ml_dtypes: infinity
        assert fp.encode(value, e5) == 0x7B
    assert fp.encode(math.inf, e5) == 0x7C and fp.encode(-math.inf, "bf16") == 0xFF80
    assert fp.encode(1e39, "fp32") == 0x7F7FFFFF


def test_nan_zero_and_subnormals():
    assert fp.encode(math.nan, "fp8_e4m3") == 0x7F and fp.encode(-math.nan, "fp8_e4m3") == 0xFF
    assert fp.encode(math.nan, "fp8_e5m2") == 0x7E and fp.encode(math.nan, "bf16") == 0x7FC0
    assert fp.encode(-0.0, "fp8_e4m3") == 0x80 and fp.encode(0.0, "fp8_e4m3") == 0
    tiny = 2.0 ** -9                                       # E4M3's smallest subnormal
    assert fp.encode(tiny, "fp8_e4m3") == 1
    assert fp.encode(tiny / 2, "fp8_e4m3") == 0            # a tie: to even (zero)
    assert fp.encode(-tiny / 2, "fp8_e4m3") == 0x80        # and keeps its sign
    assert fp.encode(tiny * 1.5, "fp8_e4m3") == 2          # a tie: to even (2)
    assert fp.encode(Fraction(3, 2 ** 10), "fp8_e4m3") == 2
    assert fp.decode(0x07, "fp8_e4m3") == 7 * tiny         # largest subnormal
    assert fp.decode(0x08, "fp8_e4m3") == 2.0 ** -6        # smallest normal


def _codes(values, name):
    return [fp.encode(float(v), name) for v in values]


def test_a_wide_accumulator_is_exact_before_the_final_rounding():
    rng = np.random.default_rng(4)
    wide = fp.DotConfig(group=3, acc_frac=60, promote_every=0)
    for _ in range(20):
        a, b = (_codes(rng.normal(0, 4, 50), "fp8_e4m3") for _ in range(2))
        assert fp.dot(a, b, "fp8_e4m3", "fp8_e4m3", wide) == \
            fp.encode(fp.exact_dot(a, b, "fp8_e4m3", "fp8_e4m3"), "fp32")


def test_thirteen_fraction_bits_lose_small_products_after_a_large_one_and_promotion_helps():
    # 256 * 256 then 4095 products of 1: the 13-bit accumulator at exponent 16 keeps units of 8.
    count = 4096
    a = _codes([256.0] + [1.0] * (count - 1), "fp8_e4m3")
    exact = 65536 + count - 1

    def result(config):
        return fp.decode(fp.dot(a, a, "fp8_e4m3", "fp8_e4m3", config), "fp32")

    assert result(fp.DotConfig(acc_frac=13, promote_every=0)) == 65536
    promoted = result(fp.DotConfig(acc_frac=13, promote_every=128))
    assert promoted == 65536 + (count - 128)               # only the first chunk loses its 1s
    assert result(fp.DotConfig(acc_frac=23, promote_every=0)) == exact


def test_truncation_is_toward_zero_for_either_sign():
    acc = fp.DotConfig(group=2, acc_frac=2, promote_every=0)
    one, seven_eighths = fp.encode(1.0, "fp8_e4m3"), fp.encode(0.875, "fp8_e4m3")
    # 1 + 0.875 with 2 fraction bits at exponent 0: 0.875 -> 0.75; the sum 1.75 is kept.
    assert fp.decode(fp.dot([one, one], [one, seven_eighths], "fp8_e4m3", "fp8_e4m3", acc),
                     "fp32") == 1.75
    minus_one = fp.encode(-1.0, "fp8_e4m3")
    assert fp.decode(fp.dot([minus_one, minus_one], [one, seven_eighths], "fp8_e4m3",
                            "fp8_e4m3", acc), "fp32") == -1.75


def test_special_operands():
    e5 = "fp8_e5m2"
    inf, zero, one, nan = 0x7C, 0x00, fp.encode(1.0, e5), 0x7E
    fp32_nan = fp.FORMATS["fp32"].canonical_nan
    assert fp.dot([inf, one], [one, one], e5, e5) == 0x7F800000
    assert fp.dot([inf, inf ^ 0x80], [one, one], e5, e5) == fp32_nan
    assert fp.dot([inf], [zero], e5, e5) == fp32_nan
    assert fp.dot([nan, one], [one, one], e5, e5) == fp32_nan


def test_scales_apply_per_block_and_e8m0_is_a_power_of_two():
    config = fp.DotConfig(group=4, acc_frac=23, promote_every=8, scale_block=8)
    a = _codes([1.0] * 16, "fp8_e4m3")
    assert fp.decode(fp.dot(a, a, "fp8_e4m3", "fp8_e4m3", config, [2.0, 0.5], [1.0, 4.0]),
                     "fp32") == 8 * 2 + 8 * 2
    assert fp.e8m0_decode(127) == 1.0 and fp.e8m0_decode(130) == 8.0
    assert math.isnan(fp.e8m0_decode(255))


@pytest.mark.parametrize("kwargs, message", [
    ({"group": 32, "promote_every": 100}, "a multiple of group"),
    ({"group": 32, "promote_every": 96}, "a divisor of scale_block"),
])
def test_promotion_must_fit_the_groups_and_the_scale_blocks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fp.DotConfig(**kwargs)


def test_numerics_table_shows_truncation_growing_with_k_and_promotion_bounding_it(tmp_path):
    from flows import numerics
    rows = numerics.error_table(trials=3, seed=2, lengths=(128, 4096))
    by = {(row["K"], row["inputs"]): row for row in rows}
    plain, promoted, wide = numerics.MODES
    crafted_long = by[(4096, "crafted")]
    assert crafted_long[plain]["max"] == (4096 - 1) / (65536 + 4096 - 1)      # every 1 lost
    assert crafted_long[promoted]["max"] == 127 / (65536 + 4096 - 1)          # one chunk's
    assert crafted_long[wide]["max"] == 0
    assert by[(4096, "random")][plain]["max"] > by[(128, "random")][plain]["max"]
    assert by[(4096, "random")][promoted]["max"] < by[(4096, "random")][plain]["max"]
    assert numerics.plot(rows, tmp_path / "p.png").stat().st_size > 0


def test_numerics_cli_rejects_a_bad_trial_count(capsys):
    from flows.cli import main
    assert main(["numerics", "--trials", "0"]) == 2
    assert "option '--trials': got 0" in capsys.readouterr().err


def test_logfmt_levels_zero_and_sign():
    tile = [0.0, -1.0, 2.0, 4.0, -0.5, 3.0]
    codes, minimum, step = fp.logfmt_encode(tile, 8)
    assert minimum == math.log(0.5) and step == pytest.approx((math.log(4) - math.log(0.5)) / 126)
    assert codes[0] == 0 and codes[3] == 127 and codes[4] == 0x80 | 1   # zero, max, -min
    values = fp.logfmt_decode(codes, minimum, step, 8)
    assert values[0] == 0 and values[3] == pytest.approx(4.0) and values[4] == pytest.approx(-0.5)
    assert values[1] < 0 and abs(values[2] - 2.0) / 2.0 < step


def test_logfmt_rounds_in_linear_space_and_clamps_the_range():
    # Between two levels, the nearer in linear space wins (the geometric midpoint would not).
    codes, minimum, step = fp.logfmt_encode([1.0, 16.0], 3)    # levels 1, 4, 16 (step log 4)
    below, above = math.exp(minimum), math.exp(minimum + step)
    x = (below + above) / 2 - 1e-9                             # under the linear midpoint
    assert math.sqrt(below * above) < x
    assert fp.logfmt_encode([1.0, 16.0, x], 3)[0][2] == 1      # -> level 1, code 1
    # The range is clamped to 2**32: a tiny element falls to zero or the smallest level.
    codes, minimum, _ = fp.logfmt_encode([1.0, 2.0 ** -40], 8)
    assert minimum == pytest.approx(-32 * math.log(2)) and codes[1] == 0


def test_tile_formats_reproduce_the_seeds_ranking():
    from flows import numerics
    for row in numerics.tile_error_table(tiles=20, seed=3):
        mean = {name: row[name]["mean"] for name in numerics.TILE_FORMATS}
        for logfmt in ("LogFMT-8", "LogFMT-8 float64"):
            assert mean[logfmt] < mean["fp8_e4m3"] < mean["fp8_e5m2"]
        assert mean["bf16"] < mean["LogFMT-10 float64"] < 3 * mean["bf16"]
        # The blocks' fixed point and their BF16 input and output cost little against exact
        # logarithms: about 1% of LogFMT-8's error, a fifth of LogFMT-10's.
        assert mean["LogFMT-8"] < 1.03 * mean["LogFMT-8 float64"]
        assert mean["LogFMT-10"] < 1.3 * mean["LogFMT-10 float64"]


# --- block fp_dot -----------------------------------------------------------------------------

# The defaults (E4M3, 32 products a beat, FP22, promoted every 128, FP32 scales, 16 slots);
# E5M2 with an odd group, the narrowest accumulator (infinities, heavy truncation), no promotion
# until the end and one slot (each beat waits golden.fp.DOT_SLOT_GAP edges; slot 1 names none);
# BF16 one product a beat into the widest accumulator, promoted every 64, E8M0 scales and
# DOT_SLOT_GAP slots, the fewest that take a beat a cycle (not a power of two: some slot
# values name none).
SIM_CONFIGS = [
    {},
    {"dtype": "fp8_e5m2", "group": 3, "acc_frac": 4, "promote_every": 0, "slots": 1},
    {"dtype": "bf16", "group": 1, "acc_frac": 24, "promote_every": 64, "scale_format": "e8m0",
     "slots": fp.DOT_SLOT_GAP},
]
COCOTB_TESTS = 15


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SIM_CONFIGS, ids=[config_id(p) for p in SIM_CONFIGS])
def test_cocotb(params, simulator):
    assert run_block("fp_dot", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("params, message", [
    ({"dtype": "fp16"}, "parameter 'dtype': got 'fp16'; allowed: one of 'fp8_e4m3', "
     "'fp8_e5m2', 'bf16'"),
    ({"group": 33}, "parameter 'group': got 33; allowed: an integer in 1..32"),
    ({"acc_frac": 3}, "parameter 'acc_frac': got 3; allowed: an integer in 4..24"),
    ({"slots": 33}, "parameter 'slots': got 33; allowed: an integer in 1..32"),
    ({"group": 32, "promote_every": 48}, "parameter 'promote_every': got 48; allowed: 0 or a "
     "multiple of group (32) that divides 128 (one scale pair per partial sum)"),
    ({"group": 3}, "parameter 'promote_every': got 128; allowed: 0 or a multiple of group (3) "
     "that divides 128 (one scale pair per partial sum)"),
])
def test_fp_dot_config_errors(params, message):
    with pytest.raises(ParamError) as info:
        get_block("fp_dot").config(**params)
    assert str(info.value) == message


# --- the adder of the floating-point combine (golden.fp.add, hw.fparith.fp_add) -------------

def test_fp32_add_is_numpy_float32_addition_within_range():
    rng = np.random.default_rng(8)
    a = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    b[:5000] = a[:5000] ^ np.uint32(1 << 31)                 # exact cancellation
    b[5000:10000] = (a[5000:10000] + rng.integers(-4, 5, 5000).astype(np.uint32))
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = (a.view(np.float32) + b.view(np.float32)).view(np.uint32)
    for x, y, z in zip(a.tolist(), b.tolist(), theirs.tolist()):
        ours = fp.add(x, y, "fp32")
        if math.isnan(fp.decode(z, "fp32")):
            assert ours == 0x7FC00000
        elif math.isinf(fp.decode(z, "fp32")) and not any(
                math.isinf(fp.decode(v, "fp32")) for v in (x, y)):
            assert ours == (z & 0x80000000) | 0x7F7FFFFF        # saturates, numpy overflows
        else:
            assert ours == z, (hex(x), hex(y))


def _special_codes(fmt):
    sign = 1 << (fmt.width - 1)
    infinity = ((1 << fmt.exp_bits) - 1) << fmt.man_bits
    plain = [0, 1, 2, (1 << fmt.man_bits) - 1, 1 << fmt.man_bits, (1 << fmt.man_bits) + 1,
             fmt.max_code, fmt.max_code - 1, infinity, fmt.canonical_nan, infinity | 1,
             fp.encode(1.0, fmt), fp.encode(1.5, fmt)]
    return plain + [code | sign for code in plain]


@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_the_hardware_adder_is_the_golden_add(name):
    """hw.fparith.fp_add (Amaranth's simulator) against golden.fp.add: every pair of special and
    boundary codes (signed zeros, subnormals, the largest, infinities, NaNs), random pairs, and
    pairs one or a few units apart with opposite signs (massive cancellation)."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator
    from hw.fparith import fp_add
    fmt = fp.FORMATS[name]
    module = Module()
    a, b = Signal(fmt.width), Signal(fmt.width)
    result = fp_add(module, a, b, fmt, "add")
    rng = random.Random(9)
    specials = _special_codes(fmt)
    top = 1 << (fmt.width - 1)
    pairs = [(x, y) for x in specials for y in specials]
    pairs += [(rng.randrange(2 * top), rng.randrange(2 * top)) for _ in range(3000)]
    for _ in range(1500):
        x = rng.randrange(top)
        pairs.append((x, ((x + rng.randint(-3, 3)) % top) | top))
        pairs.append((x | rng.choice([0, top]), rng.randrange(top) >> rng.randint(0, 30)))
    mismatches = []

    async def bench(ctx):
        for x, y in pairs:
            ctx.set(a, x)
            ctx.set(b, y)
            if ctx.get(result) != fp.add(x, y, fmt):
                mismatches.append((hex(x), hex(y), hex(ctx.get(result))))

    simulator = Simulator(module)
    simulator.add_testbench(bench)
    simulator.run()
    assert not mismatches, mismatches[:5]


def test_add_rules_for_specials_and_zeros():
    bf = "bf16"
    one, inf = fp.encode(1.0, bf), 0x7F80
    assert fp.add(0x8000, 0x8000, bf) == 0x8000 and fp.add(0x8000, 0, bf) == 0
    assert fp.add(one, one | 0x8000, bf) == 0                     # exact cancellation: +0
    assert fp.add(inf, inf | 0x8000, bf) == 0x7FC0 and fp.add(inf, one, bf) == inf
    assert fp.add(0x7F7F, 0x7F7F, bf) == 0x7F7F                   # saturates
    assert fp.add(0xFFC1, one, bf) == 0x7FC0                      # NaN: canonical, positive


# --- the multiply and scaled cast of expert_chiplet's datapath (golden.fp.multiply,
# golden.fp.scale_cast; hw.fparith.fp_multiply, fp_scale_cast) -------------------------------

def _hardware_against_golden(operands, build, expect):
    """Drive ``build(module, a, b)``'s result through every ``(a, b)`` in Amaranth's simulator
    and collect the pairs where it differs from ``expect(a, b)``."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator
    module = Module()
    a, b = Signal(32), Signal(32)
    result = build(module, a, b)
    mismatches = []

    async def bench(ctx):
        for x, y in operands:
            ctx.set(a, x)
            ctx.set(b, y)
            if ctx.get(result) != expect(x, y):
                mismatches.append((hex(x), hex(y), hex(ctx.get(result)), hex(expect(x, y))))

    simulator = Simulator(module)
    simulator.add_testbench(bench)
    simulator.run()
    return mismatches


@pytest.mark.parametrize("name, shift", [("fp8_e4m3", 3), ("fp8_e5m2", 9)])
def test_the_hardware_fp8_multiply_is_the_golden_multiply(name, shift):
    """Every pair of FP8 codes (65,536: zeros of both signs, subnormals, the largest, NaNs,
    infinities), rounded back to the format with a power-of-two shift."""
    from hw.fparith import fp_multiply
    fmt = fp.FORMATS[name]
    pairs = [(x, y) for x in range(256) for y in range(256)]
    mismatches = _hardware_against_golden(
        pairs, lambda m, a, b: fp_multiply(m, a[:8], fmt, b[:8], fmt, fmt, shift, "mul"),
        lambda x, y: fp.multiply(x, name, y, name, name, shift))
    assert not mismatches, mismatches[:5]


@pytest.mark.parametrize("dst, shift", [("fp8_e4m3", 0), ("fp8_e4m3", 6), ("fp8_e5m2", 47),
                                        ("bf16", 0), ("fp8_e5m2", 1)])
def test_the_hardware_scaled_cast_is_the_golden_cast(dst, shift):
    """FP32 codes to ``dst`` times 2**-shift: the specials, every exponent with boundary and
    random mantissas (ties, the largest finite, deep subnormals), random codes."""
    from hw.fparith import fp_scale_cast
    rng = random.Random(11)
    codes = _special_codes(fp.FORMATS["fp32"])
    for field in range(256):
        for man in (0, 1, 0x7FFFFF, 0x400000, 0x0C0000, 0x100000, rng.randrange(1 << 23)):
            codes += [(field << 23) | man, (1 << 31) | (field << 23) | man]
    codes += [rng.randrange(1 << 32) for _ in range(2000)]
    mismatches = _hardware_against_golden(
        [(c, 0) for c in codes],
        lambda m, a, b: fp_scale_cast(m, a, fp.FORMATS["fp32"], fp.FORMATS[dst], shift, "cast"),
        lambda x, _: fp.scale_cast(x, "fp32", dst, shift))
    assert not mismatches, mismatches[:5]


def test_the_hardware_gate_product_is_the_golden_product():
    """An FP32 code times an unsigned 8-bit gate times 2**-8, rounded to FP32."""
    from hw.fparith import fp_multiply
    rng = random.Random(12)
    fp32 = fp.FORMATS["fp32"]
    codes = _special_codes(fp32) + [rng.randrange(1 << 32) for _ in range(1500)] + [
        (rng.randrange(3) << 23) | rng.randrange(1 << 23) for _ in range(300)]
    pairs = [(c, g) for c in codes for g in (0, 1, 3, 255, rng.randrange(256))]
    mismatches = _hardware_against_golden(
        pairs, lambda m, a, b: fp_multiply(m, a, fp32, b[:8], None, fp32, 8, "gate"),
        lambda x, y: fp.multiply(x, "fp32", y, None, "fp32", 8))
    assert not mismatches, mismatches[:5]


def test_multiply_rules_for_specials_zeros_and_saturation():
    e4, e5 = "fp8_e4m3", "fp8_e5m2"
    one, big = fp.encode(1.0, e4), fp.FORMATS[e4].max_code
    assert fp.multiply(one | 0x80, e4, 0, e4, e4) == 0x80          # -1 * +0 = -0
    assert fp.multiply(big, e4, big, e4, e4) == big                # saturates, no NaN
    assert fp.multiply(0x7F, e4, one, e4, e4) == 0x7F              # NaN
    assert fp.multiply(0x7C, e5, 0, e5, e5) == 0x7E                # inf * 0: NaN
    assert fp.multiply(0x7C, e5, 0xBC, e5, e4) == 0xFE             # -inf into E4M3: -448
    assert fp.scale_cast(fp.encode(1.0, "fp32"), "fp32", e4, 9) == 0x01    # 2**-9: subnormal
    assert fp.scale_cast(fp.encode(1.0, "fp32"), "fp32", e4, 10) == 0x00   # half of it: even
    assert fp.scale_cast(fp.encode(3.0, "fp32"), "fp32", e4, 10) == 0x02   # 1.5 of it: even
    assert fp.multiply(fp.encode(3.0, "fp32"), "fp32", 5, None, "fp32", 2) == fp.encode(3.75,
                                                                                       "fp32")


# --- the floating-point loops' leading-one search (hw.pipeline.leading_one_tree) ------------

@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 24, 62, 83])
def test_leading_one_tree_is_the_priority_chain(width):
    """The balanced search the FP32 and partial-sum loops use gives the priority chain's index
    (0 for zero) on zero, all ones, every single bit and random values."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from hw.pipeline import leading_one, leading_one_tree
    m = Module()
    value = Signal(width)
    chain, tree = leading_one(m, value, "chain"), leading_one_tree(m, value, "tree")
    rng = np.random.default_rng(width)
    values = [0, (1 << width) - 1, *(1 << bit for bit in range(width)),
              *(int(rng.integers(0, 1 << min(width, 62))) << max(0, width - 62)
                for _ in range(200))]
    mismatches = []

    async def bench(ctx):
        for v in values:
            ctx.set(value, v)
            if ctx.get(tree) != ctx.get(chain) or ctx.get(chain) != max(v.bit_length() - 1, 0):
                mismatches.append((v, ctx.get(chain), ctx.get(tree)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert mismatches == []
