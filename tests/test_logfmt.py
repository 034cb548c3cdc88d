"""golden.logfmt against the float64 LogFMT of golden.fp, its constants, and the codec blocks
on both simulators."""

import json
import math
import random

import numpy as np
import pytest

from conftest import SIMULATORS, config_id, run_block
from golden import fp
from golden import logfmt as lf
from hw.params import ParamError
from hw.registry import get_block
from tb.harness import THROUGHPUT_FILE


def _bf16_tile(rng, size=128, scale=1.0):
    return [fp.encode(float(v), "bf16") for v in rng.normal(0, scale, size)]


def test_log_table_is_exact_to_its_rounding_and_every_bf16_log_is_ordered():
    for f, entry in enumerate(lf.LOG_TABLE):
        assert abs(entry - math.log2(1 + f / 128) * 2 ** 16) <= 0.5
    logs = [lf.bf16_log2(code)[2] for code in range(1, 0x7F80)]      # every positive finite
    assert logs == sorted(logs) and len(set(logs)) == len(logs)
    for code in (1, 0x7F, 0x80, 0x3F80, 0x7F7F):
        exact = math.log2(fp.decode(code, "bf16")) * 2 ** 16
        assert abs(lf.bf16_log2(code)[2] - exact) <= 0.5
    assert lf.bf16_log2(0x7F80) == lf.bf16_log2(0x7F7F)                # infinity saturates
    assert lf.bf16_log2(0xFFC1)[:2] == ("nan", 1) and lf.bf16_log2(0x8000)[:2] == ("zero", 1)


def test_fixed_point_codes_are_the_ideal_codes_but_at_ties():
    """Against golden.fp.logfmt_encode (float64): the same code but at most one level apart,
    the rare differences being elements within a hundredth of a level of a midpoint."""
    rng = np.random.default_rng(5)
    for bits in (8, 9, 10):
        differ = 0
        for index in range(60):
            tile = _bf16_tile(rng, scale=10.0 ** rng.integers(-3, 3))
            if index % 3 == 0:
                tile = [fp.encode(float(v), "bf16") for v in rng.standard_t(2, 128)]
            codes, params = lf.encode_tile(tile, bits)
            ideal, minimum, step = fp.logfmt_encode([fp.decode(c, "bf16") for c in tile], bits)
            assert params.lo / 2 ** 16 == pytest.approx(minimum / math.log(2), abs=2 ** -16)
            # lo and hi are each within half a Q16 unit; step then floors to Q24
            assert params.step / 2 ** 24 == pytest.approx(
                step / math.log(2), abs=2 ** -16 / ((1 << (bits - 1)) - 2) + 2 ** -24)
            for ours, theirs in zip(codes, ideal):
                assert ours >> (bits - 1) == theirs >> (bits - 1)
                assert abs((ours & 0x1FF) - (theirs & 0x1FF)) <= 1
                differ += ours != theirs
        assert differ <= 0.01 * 60 * 128, differ


def test_round_trip_error_stays_within_half_a_level_and_the_output_rounding():
    rng = np.random.default_rng(6)
    for bits in (8, 10):
        for _ in range(30):
            tile = _bf16_tile(rng)
            codes, params = lf.encode_tile(tile, bits)
            out = lf.decode_tile(codes, params, bits)
            s = params.step / 2 ** 24                       # binades per level
            for x, y in zip(tile, out):
                x, y = fp.decode(x, "bf16"), fp.decode(y, "bf16")
                if x:
                    # half a level (linear midpoint rule), the 8-bit exp index, BF16 rounding
                    bound = (2 ** (s / 2) * 2 ** (1 / 512) * (1 + 2 ** -8)) - 1
                    assert abs(y - x) / abs(x) <= bound + 1e-12


def test_clamp_zero_nan_and_extremes():
    tiny, big = fp.encode(2.0 ** -40, "bf16"), fp.encode(1.0, "bf16")
    codes, params = lf.encode_tile([big, tiny, 0x8000, 0], 8)
    assert params.lo == -32 * 2 ** 16 and params.step == (32 * 2 ** 24) // 126
    assert codes == [127, 0, 0x80, 0]                          # tiny: below half the lowest level
    near = fp.encode(2.0 ** -32.9, "bf16")                     # within a binade under lo
    assert lf.encode_tile([big, near], 8)[0][1] == 1
    codes, params = lf.encode_tile([0x7FC0, big], 8)
    assert params.nan and lf.decode_tile(codes, params, 8) == [lf.BF16_NAN] * 2
    codes, params = lf.encode_tile([0x7F80, 0xFF7F], 8)       # +inf and -max: one level
    assert params.step == 0 and codes == [1, 0x81]
    assert lf.decode_tile(codes, params, 8) == [0x7F7F, 0xFF7F]
    # A constant tile, and a subnormal one, decode exactly.
    for code in (0x0001, 0x0055, 0x3F80, 0x7F7F):
        codes, params = lf.encode_tile([code] * 4, 9)
        assert lf.decode_tile(codes, params, 9) == [code] * 4


def test_decoder_saturates_and_rounds_subnormals_to_even():
    top = lf.TileParams(lo=200 << 16, step=0, nan=False)
    assert lf.decode_code(1, top, 8) == 0x7F7F and lf.decode_code(0x81, top, 8) == 0xFF7F
    # 2**-134 is half the smallest subnormal: a tie, to even (zero); 1.5 * 2**-133 -> 2.
    assert lf.decode_code(1, lf.TileParams(-134 << 16, 0, False), 8) == 0
    three_halves = round(math.log2(1.5) * 2 ** 16) + (-133 << 16)
    assert lf.decode_code(1, lf.TileParams(three_halves, 0, False), 8) == 2
    assert lf.decode_code(0x80, lf.TileParams(0, 0, False), 8) == 0x8000


@pytest.mark.parametrize("bits", [8, 9, 10])
def test_the_step_division_by_a_constant_is_exact_over_its_whole_range(bits):
    """hw.logfmt divides (hi - lo) * 2**8 by 2**(n-1) - 2 as a multiply and a shift
    (Granlund-Montgomery): every difference 0..32 * 2**16 against integer division."""
    divisor = (1 << (bits - 1)) - 2
    width = 30
    shift = width + math.ceil(math.log2(divisor))
    magic = -(-(1 << shift) // divisor)
    diff = np.arange(0, 32 * 2 ** 16 + 1, dtype=np.uint64) << np.uint64(8)
    assert magic < 2 ** 33                           # x * magic < 2**63: no overflow
    quotient = (diff * np.uint64(magic)) >> np.uint64(shift)
    assert np.array_equal(quotient, diff // np.uint64(divisor))


def test_divider_is_done_within_a_tile_and_the_fifo_covers_its_latency():
    for tile in range(1, 200):
        for lanes in [d for d in range(1, 33) if tile % d == 0]:
            beats = tile // lanes
            q = lf.divider_cycles(tile, lanes)
            assert q <= beats
            assert lf.divider_bits_per_cycle(tile, lanes) * q >= 26
            assert lf.encoder_fifo_rows(tile, lanes) >= beats + q + lf.PARAMS_READY


# --- the blocks -----------------------------------------------------------------------------

# Defaults (n = 8, 128-element tiles, 8 lanes: 16 rows a tile, 2 quotient bits a cycle); n = 10
# with a whole tile of 5 a row (T = 1: the reciprocal in one cycle); n = 9, one lane, tiles of
# 30 (T = 30 >= 26: one quotient bit a cycle).
ENCODER_CONFIGS = [{}, {"bits": 10, "tile": 5, "lanes": 5}, {"bits": 9, "tile": 30, "lanes": 1}]
DECODER_CONFIGS = [{}, {"bits": 10, "lanes": 3}]
SWEEP_DECODER_CONFIGS = [{"bits": 9, "lanes": 1}, {"lanes": 32}]
COCOTB_TESTS = 7


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", ENCODER_CONFIGS, ids=[config_id(p) for p in ENCODER_CONFIGS])
def test_encoder_cocotb(params, simulator):
    assert run_block("logfmt_encoder", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", DECODER_CONFIGS, ids=[config_id(p) for p in DECODER_CONFIGS])
def test_decoder_cocotb(params, simulator):
    assert run_block("logfmt_decoder", params, simulator).tests == COCOTB_TESTS


def test_a_measuring_run_sends_the_long_throughput_form():
    """`make bench` times test_throughput over 10,000 beats, `make test` checks it over 500
    (tb.harness.throughput_beats, told by run_tests(measure=True) through a plusarg)."""
    params = DECODER_CONFIGS[1]
    lanes = params["lanes"]
    beats = {}
    for measure in (False, True):
        result = run_block("logfmt_decoder", params, "verilator", testcase=["test_throughput"],
                           quiet=True, measure=measure)
        report = json.loads((result.results_xml.parent / THROUGHPUT_FILE).read_text())
        beats[measure] = report["operations"] // lanes
    assert 500 <= beats[False] < 700 and 10_000 <= beats[True] < 10_200, beats


@pytest.mark.sweep
@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("params", SWEEP_DECODER_CONFIGS,
                         ids=[config_id(p) for p in SWEEP_DECODER_CONFIGS])
def test_decoder_cocotb_sweep(params, simulator):
    assert run_block("logfmt_decoder", params, simulator).tests == COCOTB_TESTS


@pytest.mark.parametrize("block, params, message", [
    ("logfmt_encoder", {"bits": 7}, "parameter 'bits': got 7; allowed: an integer in 8..10"),
    ("logfmt_encoder", {"bits": 11}, "parameter 'bits': got 11; allowed: an integer in 8..10"),
    ("logfmt_encoder", {"tile": 1025}, "parameter 'tile': got 1025; allowed: an integer in "
     "1..1024"),
    ("logfmt_encoder", {"tile": 100, "lanes": 8}, "parameter 'lanes': got 8; allowed: a divisor "
     "of tile (100)"),
    ("logfmt_decoder", {"lanes": 33}, "parameter 'lanes': got 33; allowed: an integer in 1..32"),
])
def test_config_errors(block, params, message):
    with pytest.raises(ParamError) as info:
        get_block(block).config(**params)
    assert str(info.value) == message


def test_cli_rejects_a_bad_parameter_with_exit_status_2(capsys):
    from flows.cli import main
    assert main(["verilog", "logfmt_encoder", "-p", "lanes=7"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["moegen: error: parameter 'lanes': got 7; allowed: a "
                                        "divisor of tile (128)"]


def test_random_tiles_are_reproducible():
    from tb.logfmt_tiles import EDGE_KINDS, KINDS, random_tile
    for kind in KINDS + EDGE_KINDS:
        assert random_tile(random.Random(1), 16, kind) == random_tile(random.Random(1), 16, kind)


def test_divider_edges_are_found_by_a_long_division():
    """``divider_gap`` against the restoring division written out: floor(2**48 / N) one
    quotient bit at a time, the doubled remainder compared with N; ``divider_gaps`` (the
    edge-tile search's, on arrays) against ``divider_gap``."""
    from tb.logfmt_tiles import divider_gap, divider_gaps
    rng = random.Random(3)
    steps = [rng.randrange(1, 1 << 23) for _ in range(200)] + [1, 2, 1 << 22, (1 << 23) - 1]
    for comparators in (1, 2, 5, 26):
        for comparator in range(comparators):
            for below in (True, False):
                gaps = divider_gaps(steps, comparator, comparators, below)
                assert [None if g < 0 else int(g) for g in gaps] == [
                    divider_gap(step, comparator, comparators, below) for step in steps]
    for _ in range(200):
        step = rng.randrange(1, 1 << 23)
        divisor = step << (24 - step.bit_length())
        remainder, comparisons = 1 << 22, []
        for _ in range(26):
            remainder *= 2
            comparisons.append(remainder - divisor)
            if remainder >= divisor:
                remainder -= divisor
        for comparators in (1, 2, 26):
            for comparator in range(comparators):
                mine = [j for j in range(26) if j % comparators == comparator]
                below_bits = [j for j in mine if j != 1]
                below_bits = [j for j in below_bits if j < 13] or below_bits
                above_bits = [j for j in mine if j != 0]
                above_bits = [j for j in above_bits if j < 13] or above_bits
                below = [-c for j, c in enumerate(comparisons) if j in below_bits and c < 0]
                above = [c for j, c in enumerate(comparisons) if j in above_bits and c >= 0]
                assert divider_gap(step, comparator, comparators) == min(below, default=None)
                assert (divider_gap(step, comparator, comparators, below=False)
                        == min(above, default=None))


def test_rounding_edges_sit_on_the_edge():
    """Each ``rounding_edges`` element, in its tile moved to another binade, has an exact
    position d * 2**16 / step (Q8 units, as a fraction) within 1/64 of a unit of a rounding
    edge k * 256 + theta (the reciprocal's truncation moves a position by up to pos * 2**-24,
    less than 1/128 of a unit at 510 levels)."""
    from fractions import Fraction
    from tb.logfmt_tiles import rounding_edge_tile, rounding_edges
    for bits in (8, 10):
        edges = rounding_edges(bits)
        assert len(edges) >= 8
        for edge in edges:
            tile = rounding_edge_tile(random.Random(1), 16, edge)
            params = lf.tile_params(tile, bits)
            moved = {abs(lf.bf16_log2(code)[2] - params.lo) for code in tile} - {0}
            d = lf.bf16_log2(edge[2])[2] - lf.bf16_log2(edge[0])[2]
            assert d in moved and params.step
            exact = Fraction(d << 16, params.step)
            theta = lf.theta(params.step)
            k = round((exact - theta) / 256)
            assert abs(exact - (256 * k + theta)) < Fraction(1, 64), (edge, float(exact))
