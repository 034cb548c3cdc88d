"""cocotb tests of the MoE layer's blocks against ``golden.moe_layer``: ``moe_gate`` so far.

Every dispatch flit is compared, in order, with the golden packet of its token (score codes,
node-limited route, gate weights from the table as written, leaf mask, header and x flits; with
a floating-point ``dtype`` the x codes, scored as ``golden.moe_layer.fixed_x``); with
every port ready the first flit leaves ``golden.moe_layer.gate_latency`` edges after the token's
final x beat and the packets follow each other with no bubble.
"""

import math
import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import fp as golden_fp
from golden import moe_layer as golden
from golden import router as golden_router
from golden.fixed import signed_limits
from tb.fp8 import largest_code, random_scale, random_token
from tb.harness import long_enough_to_time, start_bench, throughput_beats, write_throughput
from tb.streams import (STALL_PROFILES, InOrderScoreboard, StreamBench, pause_fraction,
                        reset_dut, wait_for)


class GateBench(StreamBench):
    """Sources on x, wg, gate_lut and table; a sink on packet; the golden layer state."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("x", "wg", "gate_lut", "table"), ("packet",),
                         gap, stall, always_ready=("wg", "gate_lut", "table"))
        self.cfg = config
        self.packet = self.sinks["packet"]
        self.board = InOrderScoreboard("packet", component.packet.payload.shape())
        self.wg = [[0] * config.experts for _ in range(config.d_model)]
        self.lut = [0] * (1 << config.score_width)
        self.placement = [0] * config.experts
        self.final_edges = []       # per token: the index of its final x beat among x beats
        self.routes = []            # per token: (experts, gates, mask)
        self.shared_mask = (1 << config.shared_leaf) if config.shared else 0

    # --- configuration (the golden state follows every write) ---
    async def configure(self, wg=None, lut=None, placement=None):
        cfg, rng = self.cfg, self.rng
        low, high = signed_limits(cfg.w_width)
        wg = wg or [[rng.randint(low, high) for _ in range(cfg.experts)]
                    for _ in range(cfg.d_model)]
        lut = lut or [rng.randint(0, (1 << cfg.gate_width) - 1)
                      for _ in range(1 << cfg.score_width)]
        placement = placement or [rng.randint(0, cfg.leaves - 1) for _ in range(cfg.experts)]
        for d, row in enumerate(wg):
            self.sources["wg"].send({"row": d, "data": row})
        for code, value in enumerate(lut):
            self.sources["gate_lut"].send({"code": code, "value": value})
        for expert, leaf in enumerate(placement):
            self.sources["table"].send({"expert": expert, "leaf": leaf})
        self.wg, self.lut, self.placement = wg, lut, placement
        budget = 20 * (cfg.d_model + len(lut) + cfg.experts) + 600
        await wait_for(self.dut, lambda: all(self.sources[n].idle
                                             for n in ("wg", "gate_lut", "table")),
                       budget, "configuration written")

    # --- tokens ---
    def random_x(self, extremes=False):
        dtype = self.cfg.dtype
        if dtype != "int":
            return random_token(self.rng, dtype, self.cfg.d_model, extremes,
                                spread=self.x_spread())
        low, high = signed_limits(self.cfg.in_width)
        if extremes:
            return [self.rng.choice((low, high)) for _ in range(self.cfg.d_model)]
        return [self.rng.randint(low, high) for _ in range(self.cfg.d_model)]

    def x_spread(self):
        """Floating point: the spread of x's values at which a score's sum is about a quarter
        of the codes' range, 2**(score_shift + score_width - 2), so that scores seldom
        saturate and a product's low bits decide codes near the rounding point (x at spread 1
        and a W_g weight of 2**(w_width - 1), D of them: 2**(FIXED_FRACTION + w_width - 1) *
        sqrt(D)). A mutant with one product bit 8 stuck survived a BF16 gate at spread 1 and
        score_shift 18."""
        cfg = self.cfg
        scale = cfg.score_shift + cfg.score_width - 2 - golden.FIXED_FRACTION[cfg.dtype] - \
            (cfg.w_width - 1)
        return 2.0 ** scale / math.sqrt(cfg.d_model)

    def send_token(self, token, x, last_beat=None, scale=None):
        """Queue a token's beats and its expected packet; ``last_beat`` misplaces ``last``
        (-1: on no beat). Floating point: ``scale`` x's scale code (``scale_format``; random
        by default), on the first beat; the later beats carry random codes, ignored."""
        cfg = self.cfg
        token %= 1 << cfg.token_width
        last_beat = cfg.beats - 1 if last_beat is None else last_beat
        floating = cfg.dtype != "int"
        if floating and scale is None:
            scale = random_scale(self.rng, cfg.scale_format)
        for b in range(cfg.beats):
            lanes = (list(x[b * cfg.lanes:(b + 1) * cfg.lanes]) + [0] * cfg.lanes)[:cfg.lanes]
            extra = {"scale": scale if b == 0 else self.rng.getrandbits(cfg.scale_bits)
                     } if floating else {}
            self.sources["x"].send({"token": token, **extra, "data": lanes,
                                    "last": int(b == last_beat)})
        codes = golden.score_codes(self.gate_x(x), self.wg, cfg.acc_width, cfg.score_shift,
                                   cfg.score_width, scale, cfg.scale_format)
        experts, _ = golden_router.route(codes, cfg.k, cfg.groups, cfg.topk_groups)
        gates = golden.gate_weights(codes, experts, self.lut)
        mask = golden_router.leaf_mask(experts, self.placement) | self.shared_mask
        shared = [(cfg.experts, (1 << cfg.gate_width) - 1)] if cfg.shared else []
        flits = golden.dispatch_flits(experts + [e for e, _ in shared],
                                      gates + [g for _, g in shared], x, cfg.lanes,
                                      cfg.gate_width, scale, cfg.scale_format, cfg.data_width)
        for index, flit in enumerate(flits):
            self.board.expect_payload({"token": token, "mask": mask, "data": flit,
                                       "last": int(index == len(flits) - 1)})
        self.routes.append((experts, gates, mask))

    def gate_x(self, x):
        """x as the scores take it: the integers, or the FP8 codes' fixed-point values."""
        if self.cfg.dtype == "int":
            return x
        return [golden.fixed_x(code, self.cfg.dtype) for code in x]

    def largest_x(self):
        dtype = self.cfg.dtype
        return largest_code(dtype) if dtype != "int" else signed_limits(self.cfg.in_width)[1]

    async def finish(self, max_cycles):
        await wait_for(self.dut, lambda: len(self.packet.received) >= len(self.board.expected),
                       max_cycles, f"{len(self.board.expected)} flits")
        await ClockCycles(self.dut.clk, 3 * self.cfg.beats + 20)     # nothing extra may come
        self.board.check(self.packet)


async def _setup(dut, salt, gap=0.0, stall=0.0, **configure):
    bench = await start_bench(GateBench, dut, salt, gap, stall)
    await bench.configure(**configure)
    return bench


def _budget(flits, gap=0.0, stall=0.0):
    slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))
    return int(flits * slowdown * 4) + 800


@cocotb.test()
async def test_cycle_exact_no_stalls(dut):
    """Every port ready: the first flit gate_latency edges after the final x beat, then the
    packets back to back (H + B flits per token, no bubble)."""
    bench = await _setup(dut, "cycle_exact")
    cfg = bench.cfg
    tokens = 12
    for token in range(tokens):
        bench.send_token(token, bench.random_x())
    await bench.finish(_budget(tokens * (cfg.header_flits + cfg.beats)))
    x_edges = bench.sources["x"].sent_edges
    flit_edges = [edge for edge, _ in bench.packet.received]
    latency = golden.gate_latency(cfg.k, cfg.groups, cfg.topk_groups, cfg.scale_format)
    assert flit_edges[0] - x_edges[cfg.beats - 1] == latency
    assert flit_edges == list(range(flit_edges[0], flit_edges[0] + len(flit_edges))), \
        "a bubble between flits"
    assert x_edges[:cfg.beats] == list(range(x_edges[0], x_edges[0] + cfg.beats))


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_stalls(dut, gap, stall):
    """Random and long-burst gaps on every input, stalls on packet: exact packets, in order."""
    bench = await _setup(dut, f"stalls:{gap}:{stall}", gap, stall)
    tokens = 30
    for token in range(tokens):
        bench.send_token(token, bench.random_x(extremes=token % 5 == 0))
    await bench.finish(_budget(tokens * (bench.cfg.header_flits + bench.cfg.beats), gap, stall))


@cocotb.test()
async def test_rewrites_between_tokens(dut):
    """W_g, the gate table and the expert-to-leaf table rewritten between tokens; a hot expert
    (one column of W_g far above the rest) takes every token; every expert on one leaf."""
    bench = await _setup(dut, "rewrites", 0.3, 0.3)
    cfg = bench.cfg
    for token in range(6):
        bench.send_token(token, bench.random_x())
    await bench.finish(_budget(6 * (cfg.header_flits + cfg.beats), 0.3, 0.3))
    low, high = signed_limits(cfg.w_width)
    hot = [[high if e == cfg.experts - 1 else low for e in range(cfg.experts)]
           for _ in range(cfg.d_model)]
    await bench.configure(wg=hot, placement=[cfg.leaves - 1] * cfg.experts)
    positive = [bench.largest_x()] * cfg.d_model
    unit = cfg.unit_scale if cfg.dtype != "int" else None       # (x's scale, floating point)
    for token in range(6, 12):
        bench.send_token(token, positive, scale=unit)
    await bench.finish(_budget(12 * (cfg.header_flits + cfg.beats), 0.3, 0.3))
    codes = golden.score_codes(bench.gate_x(positive), hot, cfg.acc_width, cfg.score_shift,
                               cfg.score_width, unit, cfg.scale_format)
    # The hot expert leads when its code stands above the rest (a shift that rounds every
    # score to one code leaves a tie: the lowest index wins); every expert is on one leaf.
    leader = cfg.experts - 1 if codes[-1] > max(codes[:-1]) else codes.index(max(codes))
    for experts, _, mask in bench.routes[6:]:
        assert experts[0] == leader and mask == (1 << (cfg.leaves - 1)) | bench.shared_mask


@cocotb.test()
async def test_one_bit_sums_saturate_from_every_bit(dut):
    """Scores of one bit: x one element +-2**a, at row e % D of W_g, which holds +-2**b for
    expert e alone (and the experts e + D, ...), and (floating point) x's scale 2**j, chosen
    so that expert e's scaled sum, sum * scale * 2**-score_shift, is exactly +2**q, then
    -2**q, for every expert and every q from -2 to 66 (past every bit of the widest score
    pipeline, an FP32 scale's 48 + 25 bits): one token each. Each code saturates, or not,
    as the golden rounding says, and the other experts' codes stay at the middle, so expert
    e's decides the route and its gate. Random sums seldom have one high bit alone, and tie
    when they saturate: a mutant that missed one bit of the saturation check survived them
    (moe_gate E4M3 with FP32 scales: mutation score 94%, 16 of 17 non-equivalent killed)."""
    bench = await _setup(dut, "one_bit")
    cfg, rng = bench.cfg, bench.rng
    floating = cfg.dtype != "int"
    powers = [rng.randint(0, cfg.w_width - 2) for _ in range(cfg.experts)]
    signs = [rng.choice((1, -1)) for _ in range(cfg.experts)]
    wg = [[sign * (1 << b) if e % cfg.d_model == d else 0
           for e, (sign, b) in enumerate(zip(signs, powers))] for d in range(cfg.d_model)]
    await bench.configure(wg=wg)
    span = range(-2, 67)
    tokens = 2 * len(span) * cfg.experts
    for token in range(tokens):
        expert, q = token % cfg.experts, span[token // cfg.experts % len(span)]
        sign = signs[expert] * (1 if token < tokens // 2 else -1)     # x's, for +-2**q
        b = powers[expert]
        if floating:
            fraction = golden.FIXED_FRACTION[cfg.dtype]
            top = golden.fixed_x(golden.GATE_MAX_CODE[cfg.dtype], cfg.dtype).bit_length() - 1
            a = rng.randint(0, max(0, min(top, cfg.acc_width - 2 - b)))   # fixed_x = 2**a
            element = golden_fp.encode(sign * 2.0 ** (a - fraction), cfg.dtype)
            j = max(-126, min(127, q + cfg.score_shift - a - b))
            scale = golden.unit_scale(cfg.scale_format) + j if cfg.scale_format == "e8m0" \
                else golden_fp.encode(2.0 ** j, "fp32")
        else:                          # (no scale: q as far as x's and W_g's widths reach)
            a = max(0, min(cfg.in_width - 2, q + cfg.score_shift - b))
            element, scale = sign * (1 << a), None
        x = [0] * cfg.d_model
        x[expert % cfg.d_model] = element
        bench.send_token(token, x, scale=scale)
    await bench.finish(_budget(tokens * (cfg.header_flits + cfg.beats)))


@cocotb.test()
async def test_reset_mid_work(dut):
    """Reset with tokens half taken and packets in flight (the drivers drop what they hold):
    nothing stale after, tables kept (W_g, gate table) or reset (expert-to-leaf: leaf 0)."""
    bench = await _setup(dut, "reset", 0.2, 0.5)
    cfg = bench.cfg
    for token in range(8):
        bench.send_token(token, bench.random_x())
    await wait_for(dut, lambda: len(bench.sources["x"].sent_edges) >= 3 * cfg.beats + 1,
                   _budget(8 * cfg.beats, 0.2, 0.5), "tokens in flight")
    await bench.reset(3)
    assert not dut.packet__valid.value and not dut.error.value
    bench.board.expected.clear()
    bench.placement = [0] * cfg.experts        # the router's table resets to leaf 0
    for token in range(4):
        bench.send_token(token, bench.random_x())
    await bench.finish(_budget(4 * (cfg.header_flits + cfg.beats), 0.2, 0.5))
    assert not dut.error.value


@cocotb.test()
async def test_protocol_misuse_sets_error(dut):
    """A W_g row past D is ignored and sets the sticky error; a misplaced ``last`` on x sets it
    too, and the token still ends after ceil(D/L) beats (the count rules)."""
    bench = await _setup(dut, "misuse")
    cfg = bench.cfg
    rows = 1 << max(1, (cfg.d_model - 1).bit_length())
    if rows > cfg.d_model:
        bench.sources["wg"].send({"row": cfg.d_model, "data": [1] * cfg.experts})
        await wait_for(dut, lambda: bench.sources["wg"].idle, 200, "row written")
        await ClockCycles(dut.clk, 2)
        assert dut.error.value == 1, "a W_g row out of range did not set error"
        await reset_dut(dut)
        bench.placement = [0] * cfg.experts
    assert dut.error.value == 0
    # last on the first beat (or, with one beat per token, on none)
    bench.send_token(1, bench.random_x(), last_beat=0 if cfg.beats > 1 else -1)
    bench.send_token(2, bench.random_x())
    await bench.finish(_budget(4 * (cfg.header_flits + cfg.beats)))
    assert dut.error.value == 1, "misplaced last did not set error"


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Every port saturated: tokens per cycle against the bound 1/(H + B) of the packet port,
    over throughput_beats() flits or more; written for `make bench`."""
    bench = await _setup(dut, "throughput")
    cfg = bench.cfg
    flits = cfg.header_flits + cfg.beats
    tokens = max(64, -(-throughput_beats() // flits))
    for token in range(tokens):
        bench.send_token(token, bench.random_x())
    began = time.perf_counter()
    await bench.finish(_budget(tokens * flits))
    wall = time.perf_counter() - began
    edges = [edge for edge, _ in bench.packet.received]
    cycles = edges[-1] - edges[0] + 1
    assert cycles == tokens * flits, "the packet port was not kept busy"
    metrics = {"tokens": tokens, "cycles": cycles,
               "tokens_per_cycle": round(tokens / cycles, 4),
               "bound": round(1 / flits, 4)}
    write_throughput(metrics, "dispatch packets, every port saturated", cycles / wall,
                     operations=tokens * cfg.d_model * cfg.experts)      # x . W_g MACs
