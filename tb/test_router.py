"""cocotb tests of ``topk_router`` against ``golden.router``.

Every route is compared, in order, with :func:`golden.router.route` on the same scores and the
table as written; with a ready output each route leaves exactly ``pipeline_latency`` edges after
its scores were taken (serial router, ``scan_lanes`` >= 1: the edges of ``scan_edges``).
"""

import time

import cocotb
from cocotb.triggers import ClockCycles

from golden import placement
from golden import nop as golden_nop
from golden import router as golden
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import (STALL_PROFILES, StreamBench, edge_now, reset_dut,
                        start_after_reset, wait_for)



class RouterBench(StreamBench):
    """Sources on ``scores`` and ``table``, a sink on ``route``, the golden expectations."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("scores", "table"), ("route",), gap, stall,
                         always_ready=("table",))
        self.cfg = config
        self.scores, self.table = self.sources["scores"], self.sources["table"]
        self.routes = self.sinks["route"]
        self.leaf_of = [0] * config.experts
        self.expected = []

    async def write_table(self, table):
        """Write the whole expert-to-leaf table and wait until it is in."""
        for expert, leaf in enumerate(table):
            self.table.send({"expert": expert, "leaf": leaf})
        self.leaf_of = list(table)
        # Room for a long burst of gaps (tb.streams.LONG_BURSTS) on the table port.
        await wait_for(self.dut, lambda: self.table.idle, 10 * len(table) + 400, "table written")

    def random_scores(self, tie_heavy=False):
        top = (1 << self.cfg.score_width) - 1
        if tie_heavy:       # few distinct values: ties between experts and between groups
            values = [self.rng.randint(0, top) for _ in range(3)]
            return [self.rng.choice(values) for _ in range(self.cfg.experts)]
        return [self.rng.randint(0, top) for _ in range(self.cfg.experts)]

    def send(self, scores, token):
        cfg = self.cfg
        token %= 1 << cfg.token_width
        self.scores.send({"token": token, "score": scores})
        experts, chosen = golden.route(scores, cfg.k, cfg.groups, cfg.topk_groups)
        self.expected.append((token, experts, chosen, golden.leaf_mask(experts, self.leaf_of)))

    async def drain(self):
        await wait_for(self.dut, lambda: len(self.routes.received) == len(self.expected),
                       40 * self.cfg.interval * len(self.expected) + 100, "every route out")
        await ClockCycles(self.dut.clk, 5)

    def check(self):
        self.check_output("route", self.expected, ("token", "expert", "score", "mask"))


def _setup(dut, salt, **kwargs):
    _, config, component = load_dut_config()
    return RouterBench(dut, config, component, make_rng(salt), **kwargs)


def _random_table(bench):
    return [bench.rng.randrange(bench.cfg.leaves) for _ in range(bench.cfg.experts)]


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_routes(dut, gap, stall):
    """Random and tie-heavy scores under valid gaps (scores and table) and route stalls: every
    route equals the golden rule, in order; cycle-exact without stalls."""
    bench = _setup(dut, f"random:{gap}:{stall}", gap=gap, stall=stall)
    await start_after_reset(dut, bench)
    await bench.write_table(_random_table(bench))
    for token in range(80):
        bench.send(bench.random_scores(tie_heavy=token % 2 == 0), token)
    await bench.drain()
    bench.check()
    if gap == 0.0 and stall == 0.0:
        # Cycle-exact: the edge at which each token is taken and each route leaves.
        assert _edges(bench) == _golden_edges(bench.cfg, len(bench.expected))
    bench.stop()


def _edges(bench):
    """Edges of the scores taken and the routes out, from the first token's."""
    sent = bench.scores.sent_edges
    return ([e - sent[0] for e in sent], [e - sent[0] for e, _ in bench.routes.received])


def _golden_edges(cfg, tokens):
    """The golden cycle model's edges for ``tokens`` offered back to back, route ready."""
    if cfg.scan_lanes:
        return golden.scan_edges(tokens, cfg.experts, cfg.scan_lanes, cfg.k, cfg.groups,
                                 cfg.topk_groups)
    return list(range(tokens)), [t + cfg.latency for t in range(tokens)]


@cocotb.test()
async def test_extremes_and_all_equal(dut):
    """All scores equal (every tie goes to the lowest indices), all zero, all maximal, one hot."""
    bench = _setup(dut, "extremes")
    await start_after_reset(dut, bench)
    await bench.write_table(_random_table(bench))
    E, top = bench.cfg.experts, (1 << bench.cfg.score_width) - 1
    vectors = [[0] * E, [top] * E, [5 % (top + 1)] * E,
               [top if e == E - 1 else 0 for e in range(E)],
               [e % (top + 1) for e in range(E)], [(E - e) % (top + 1) for e in range(E)]]
    for token, scores in enumerate(vectors):
        bench.send(scores, token)
    await bench.drain()
    bench.check()


# The edge patterns of the default 32 experts with 8-bit scores (11,904 tokens); larger routers
# (`make sweep`: up to 780,000 patterns) run a seeded sample of this many.
EDGE_PATTERNS_AT_MOST = 12_000


def edge_pattern(experts, width, bit, i, j, equal):
    """One score vector that sets experts i and j at the edge of score bit ``bit``, the others
    0: i one above j (v + 2^b against v + 2^b - 1), or i equal to j (both v + 2^b). The pair
    shares the bits above b (v = 2^(b+1) below the top bit, so even the lower score is above the
    others'). Over both orders and the equal pair, a comparator bit stuck at 0 or 1 in either
    operand, strict or not, turns one of the three around."""
    high = (0 if bit == width - 1 else 1 << (bit + 1)) + (1 << bit)
    scores = [0] * experts
    scores[i], scores[j] = high, high if equal else high - 1
    return scores


def edge_patterns(experts, width, rng):
    """Every pair of experts at the edge of every bit (:func:`edge_pattern`): each ordered pair
    one apart and each unordered pair equal, at each bit; a seeded sample of
    ``EDGE_PATTERNS_AT_MOST`` of them, in order, when there are more."""
    specs = [(b, i, j, eq) for b in range(width) for i in range(experts)
             for j in range(experts) for eq in (False, True) if i != j and (i < j or not eq)]
    if len(specs) > EDGE_PATTERNS_AT_MOST:
        specs = sorted(rng.sample(specs, EDGE_PATTERNS_AT_MOST))
    return [edge_pattern(experts, width, *spec) for spec in specs]


@cocotb.test()
async def test_every_pair_at_the_edge_of_every_bit(dut):
    """Every pair of experts one apart and equal at every score bit (:func:`edge_patterns`):
    each of the E(E-1) comparisons, at each of their bits, decides a route."""
    bench = _setup(dut, "edges")
    await start_after_reset(dut, bench)
    await bench.write_table(_random_table(bench))
    for token, scores in enumerate(edge_patterns(bench.cfg.experts, bench.cfg.score_width,
                                                 bench.rng)):
        bench.send(scores, token)
    await bench.drain()
    bench.check()


@cocotb.test()
async def test_table_rewrite_between_tokens(dut):
    """Routes use the table as written before them; rewriting it redirects later tokens."""
    bench = _setup(dut, "table")
    await start_after_reset(dut, bench)
    for round_ in range(3):
        await bench.write_table(_random_table(bench))
        for token in range(10):
            bench.send(bench.random_scores(), 10 * round_ + token)
        await bench.drain()
    bench.check()


@cocotb.test()
async def test_table_write_edge(dut):
    """The contract of a run-time table write (docs/blocks/router.md): a route's mask is
    computed from the table as it stands when the route enters the output register. With no
    stalls a write taken at edge w is seen by every route leaving at w + 2 or later and by none
    leaving earlier; a route held in the output register keeps its mask (the payload is stable
    while valid is high) although the write lands while it waits."""
    cfg = load_dut_config()[1]
    bench = _setup(dut, "table-edge")
    await start_after_reset(dut, bench)
    old_table = _random_table(bench)
    new_table = [(leaf + 1) % cfg.leaves for leaf in old_table]
    await bench.write_table(old_table)

    # 1. No stalls: a stream of one token per cycle with the write in the middle.
    scores = [bench.random_scores() for _ in range(cfg.experts + 3 * cfg.latency + 12)]
    for token, row in enumerate(scores):
        bench.scores.send({"token": token % (1 << cfg.token_width), "score": row})
    await ClockCycles(dut.clk, cfg.latency + 4)
    writes = len(bench.table.sent_edges)
    for expert, leaf in enumerate(new_table):
        bench.table.send({"expert": expert, "leaf": leaf})
    await wait_for(dut, lambda: len(bench.routes.received) == len(scores),
                   40 * cfg.interval * len(scores), "every route out")
    written = bench.table.sent_edges[writes:]                # edge of each entry's write
    seen_old = seen_new = 0
    for (edge, route), row in zip(bench.routes.received, scores):
        experts, _ = golden.route(row, cfg.k, cfg.groups, cfg.topk_groups)
        table = [new_table[e] if edge >= written[e] + 2 else old_table[e]
                 for e in range(cfg.experts)]
        assert int(route.mask) == golden.leaf_mask(experts, table), (edge, written)
        seen_old += edge < written[0] + 2
        seen_new += edge >= written[-1] + 2
    assert seen_old and seen_new                  # the write fell inside the stream

    # 2. A route held in the output register while the table changes keeps its old mask.
    bench.routes.received.clear()
    bench.routes.stop()                                    # ready low from now on
    held, after = bench.random_scores(), bench.random_scores()
    bench.scores.send({"token": 1, "score": held})
    await wait_for(dut, lambda: dut.route__valid.value == 1, 4 * cfg.latency, "route held")
    for expert, leaf in enumerate(old_table):
        bench.table.send({"expert": expert, "leaf": leaf})
    await wait_for(dut, lambda: bench.table.idle, 10 * cfg.experts + 20, "table written")
    bench.scores.send({"token": 2, "score": after})
    await ClockCycles(dut.clk, 3)
    bench.routes.start()
    await wait_for(dut, lambda: len(bench.routes.received) == 2, 4 * cfg.latency + 20,
                   "both routes out")
    (_, first), (_, second) = bench.routes.received
    held_experts, _ = golden.route(held, cfg.k, cfg.groups, cfg.topk_groups)
    after_experts, _ = golden.route(after, cfg.k, cfg.groups, cfg.topk_groups)
    assert int(first.mask) == golden.leaf_mask(held_experts, new_table)
    assert int(second.mask) == golden.leaf_mask(after_experts, old_table)


@cocotb.test()
async def test_reset_mid_stream(dut):
    """Reset with tokens in the pipeline: nothing comes out afterwards but new routes."""
    bench = _setup(dut, "reset", gap=0.2, stall=0.3)
    await start_after_reset(dut, bench)
    await bench.write_table(_random_table(bench))
    for token in range(12):
        bench.send(bench.random_scores(), token)
    await ClockCycles(dut.clk, 5)
    bench.stop()
    await reset_dut(dut)
    bench = _setup(dut, "after-reset", gap=0.2, stall=0.3)
    bench.start()
    await bench.write_table(_random_table(bench))
    for token in range(20):
        bench.send(bench.random_scores(), token)
    await bench.drain()
    bench.check()


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Tokens per cycle and latency at saturation, and r of a synthetic trace routed by the RTL
    with round-robin and clustered expert-to-leaf tables."""
    bench = _setup(dut, "throughput")
    cfg = bench.cfg
    await start_after_reset(dut, bench)
    began, cycles_before = time.perf_counter(), edge_now()
    await bench.write_table(_random_table(bench))
    for token in range(64):
        bench.send(bench.random_scores(), token)
    await bench.drain()
    bench.check()
    assert _edges(bench) == _golden_edges(cfg, len(bench.expected))
    out_edges = [e for e, _ in bench.routes.received]
    rate = (len(out_edges) - 1) / (out_edges[-1] - out_edges[0])
    latency = out_edges[0] - bench.scores.sent_edges[0]
    assert rate == 1 / cfg.interval and latency == cfg.latency
    figures = {"tokens_per_cycle": rate, "latency_cycles": latency}
    figures.update(await _replication(bench))
    write_throughput(figures, "routes per cycle, cycles; r = leaf copies per token of a "
                     "synthetic trace (round-robin vs clustered table)",
                     (edge_now() - cycles_before) / (time.perf_counter() - began),
                     operations=len(bench.routes.received))


async def _replication(bench):
    """r of the trace's routes under both tables (every route checked against the golden rule;
    without a group limit the routes are the trace itself). Needs one cluster per leaf."""
    cfg = bench.cfg
    if cfg.experts % cfg.leaves or (1 << cfg.score_width) <= cfg.k:
        return {}
    trace = golden.synthetic_trace(64, cfg.experts, cfg.k, cfg.leaves, seed=5)
    scores = golden.scores_for_trace(trace, cfg.experts, cfg.score_width, seed=6)
    groups = next(g for g in (4, 2, 1) if cfg.leaves % g == 0)
    out = {}
    for name, table in (("r_round_robin", placement.round_robin(cfg.experts, cfg.leaves)),
                        ("r_clustered", placement.place(trace, cfg.experts, cfg.leaves,
                                                        groups).expert_to_leaf)):
        await bench.write_table(table)
        start = len(bench.routes.received)
        for token, vector in enumerate(scores):
            bench.send(vector, token)
        await bench.drain()
        bench.check()
        masks = [int(r.mask) for _, r in bench.routes.received[start:]]
        if cfg.groups == 1:
            assert masks == [golden.leaf_mask(row, table) for row in trace]
        out[name] = round(golden_nop.replication(masks), 3)
    return out
