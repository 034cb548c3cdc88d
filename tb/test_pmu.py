"""cocotb tests of the ``pmu`` block against ``golden.pmu``.

Memory effects are checked by replaying the same jobs, in the same order, on the golden
:class:`~golden.pmu.Scratchpad`. Jobs that depend on each other are ordered by the hardware's own
``wait_other``: the bench hands a dependent descriptor over only once the job it depends on has
been latched (its port's busy flag was seen high), which is exactly when "the other port's
current job" is that job.
"""

import time

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from golden import pmu as golden
from tb.harness import load_dut_config, long_enough_to_time, make_rng, write_throughput
from tb.streams import STALL_PROFILES, StreamBench, edge_now, reset_dut, start_clock, wait_for



class PMUBench(StreamBench):
    """Sources for ``wjob``, ``rjob`` and ``w``; a sink on ``r``; a golden scratchpad."""

    def __init__(self, dut, config, component, rng, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("wjob", "rjob", "w"), ("r",), gap, stall)
        self.cfg = config
        self.params = {f: getattr(config, f) for f in
                       ("banks", "bank_depth", "elem_width", "lanes", "loops", "addr_width")}
        self.component = component
        self.wjob, self.rjob, self.w = (self.sources[n] for n in ("wjob", "rjob", "w"))
        self.r = self.sinks["r"]
        self.memory = golden.Scratchpad(self.params)
        self.expected = []          # (data, valid, last) per read beat
        self.w_costs, self.r_costs = [], []

    def _descriptor(self, job):
        width = max(1, self.cfg.bank_bits)
        return {**job, "bank_pos": (list(job["bank_pos"]) + [0] * width)[:width]}

    def queue_write(self, job, vectors=None, hold_data=False):
        """Queue a write job and its data (random when not given); update the golden memory.

        With ``hold_data`` only the descriptor is queued: :meth:`send_write_data` sends the
        returned vectors later."""
        accesses = len(golden.access_addresses(job, self.params))
        mask = (1 << self.cfg.elem_width) - 1
        if vectors is None:
            vectors = [[self.rng.randint(0, mask) for _ in range(self.cfg.lanes)]
                       for _ in range(accesses)]
        self.wjob.send(self._descriptor(job))
        if not hold_data:
            self.send_write_data(vectors)
        self.w_costs.append(self.memory.write_job(job, vectors))
        return vectors

    def send_write_data(self, vectors):
        """Queue one ``w`` beat per vector, ``last`` on the final one."""
        for index, vector in enumerate(vectors):
            self.w.send({"data": vector, "last": int(index == len(vectors) - 1)})

    async def writes_done(self, budget, what="writes done"):
        """Wait until every queued ``w`` beat is taken and the write port is idle."""
        await wait_for(self.dut, lambda: self.w.idle and not self.dut.w_busy.value, budget, what)

    def queue_read(self, job):
        """Queue a read job; the expected beats come from the golden memory as it is now."""
        vectors, valids, costs = self.memory.read_job(job)
        self.rjob.send(self._descriptor(job))
        for index, (vector, valid) in enumerate(zip(vectors, valids)):
            self.expected.append((vector, valid, int(index == len(vectors) - 1)))
        self.r_costs.append(costs)

    async def until_latched(self, port, budget=None):
        """Wait until the port's last queued job is running (the port was idle before it). The
        job before it on the port may cover the whole scratchpad (at bank_depth=65536, 524,288
        words: far past a fixed budget), so the deadlock guard scales with the capacity."""
        if budget is None:
            budget = 40 * self.cfg.banks * self.cfg.bank_depth + 20000
        busy = self.dut.w_busy if port == "w" else self.dut.r_busy
        source = self.wjob if port == "w" else self.rjob
        await wait_for(self.dut, lambda: source.idle, budget, f"{port} descriptor taken")
        await wait_for(self.dut, lambda: bool(busy.value), budget, f"{port} job latched")

    async def clear(self):
        """Zero the whole scratchpad (it keeps its words through reset), then forget the
        transfers this made so that cycle checks start from the next job."""
        capacity, lanes = self.cfg.banks * self.cfg.bank_depth, self.cfg.lanes
        self.start()
        job = golden.make_job(self.params, bounds=[-(-capacity // lanes)], strides=[lanes],
                              pred_hi=capacity)
        accesses = len(golden.access_addresses(job, self.params))
        self.queue_write(job, [[0] * lanes for _ in range(accesses)])
        await self.writes_done(4 * capacity + 100, "scratchpad cleared")
        for source in (self.wjob, self.w):
            source.sent_edges.clear()
        self.w_costs.clear()

    def check_conflict_counters(self, what, ports=("w", "r")):
        """Each port's conflict counter equals the extra cycles of every job queued on it so far
        (the golden costs less one per access; the counters reset only with the block)."""
        for port in ports:
            counter = getattr(self.dut, f"{port}_conflict_cycles").value.to_unsigned()
            costs = self.w_costs if port == "w" else self.r_costs
            assert counter == sum(c - 1 for job in costs for c in job), \
                f"{port}_conflict_cycles {counter}: {what}"

    def check_reads(self):
        """Every read beat equals the golden one: data, per-lane valid, last; none extra."""
        self.check_output("r", [{"data": data, "last": last,
                                 "valid": sum(bit << v for v, bit in enumerate(valid))}
                                for data, valid, last in self.expected])


async def _setup(dut, salt, gap=0.0, stall=0.0):
    _, config, component = load_dut_config()
    start_clock(dut)
    bench = PMUBench(dut, config, component, make_rng(salt), gap, stall)
    await reset_dut(dut)
    await bench.clear()
    await reset_dut(dut)  # conflict counters back to zero
    return bench


def _nest(cfg, bounds, strides, flat=None):
    """``bounds``/``strides`` keyword arguments of a 2-level nest; with one loop level, the
    ``flat`` ones (default: the innermost level alone). Bounds above 2^A (rejected, as the
    contract says) are cut to 2^A: the tiniest address spaces still run every test."""
    if cfg.loops < len(bounds):
        bounds, strides = flat or (bounds[:cfg.loops], strides[:cfg.loops])
    return {"bounds": [min(bound, 1 << cfg.addr_width) for bound in bounds],
            "strides": strides}


def _random_job(bench, wait_other=0):
    """A random affine job: bounds, signed strides, lane stride, predicate, mapping."""
    cfg, rng, params = bench.cfg, bench.rng, bench.params
    b, cb = cfg.bank_bits, cfg.capacity_bits
    bounds = [rng.randint(1, 3) for _ in range(cfg.loops)]
    strides = [rng.randint(-2 * cfg.lanes, 2 * cfg.lanes) for _ in range(cfg.loops)]
    limit = 1 << cfg.addr_width
    lo = rng.choice([0, 0, rng.randrange(0, limit)])
    hi = rng.choice([limit, limit, rng.randrange(lo, limit + 1)])
    diagonal = rng.randint(0, 1)
    bank_pos = sorted(rng.sample(range(cb), b)) if b else []
    # Half the bases inside the scratchpad, so most random jobs touch real words.
    base = rng.choice([rng.randrange(0, cfg.banks * cfg.bank_depth), rng.randrange(0, limit)])
    return golden.make_job(
        params, base=base, bounds=bounds, strides=strides,
        lane_stride=rng.choice([1, 1, -1, 0, rng.randint(-3, 5)]), pred_lo=lo, pred_hi=hi,
        diagonal=diagonal, bank_pos=bank_pos, row_shift=rng.randint(b, cb),
        wait_other=wait_other)


def _transpose_jobs(bench, diagonal):
    """Jobs that write an N x V tile row by row and read it column by column.

    Rows are ``banks`` elements apart (the diagonal row length); N = min(V, bank_depth) rows fit
    the scratchpad. The read takes V columns of V lanes; lanes at or past row N are predicated
    off, so every column reads N elements and V - N zeros. This needs V * banks <= 2^A when
    N < V: otherwise those lane addresses wrap back onto the tile and no predicate can cut them.
    """
    cfg = bench.cfg
    rows, row = min(cfg.lanes, cfg.bank_depth), cfg.banks
    assert rows == cfg.lanes or cfg.lanes * row <= 1 << cfg.addr_width, \
        "transpose test needs addr_width >= log2(lanes*banks) when lanes > bank_depth"
    common = {"diagonal": diagonal, "row_shift": cfg.bank_bits}
    write = golden.make_job(bench.params, bounds=[rows], strides=[row], lane_stride=1, **common)
    read = golden.make_job(bench.params, bounds=[cfg.lanes], strides=[1], lane_stride=row,
                           pred_hi=rows * row, **common)
    return write, read, rows


@cocotb.test()
@cocotb.parametrize(diagonal=[1, 0])
async def test_transpose(dut, diagonal):
    """Diagonal mapping: no conflict both ways. Bit-select on the low bits: N-way on columns."""
    bench = await _setup(dut, f"transpose{diagonal}")
    cfg = bench.cfg
    write, read, rows = _transpose_jobs(bench, diagonal)
    tile = [[bench.rng.randrange(1 << cfg.elem_width) for _ in range(cfg.lanes)]
            for _ in range(rows)]
    bench.queue_write(write, tile)
    await bench.writes_done(500, "tile written")
    w_base = bench.wjob.sent_edges[0]
    assert [e - w_base for e in bench.w.sent_edges] == golden.write_beat_edges(bench.w_costs)
    bench.queue_read(read)
    await wait_for(dut, lambda: len(bench.r.received) == cfg.lanes, 500 + cfg.lanes * rows,
                   "columns read")
    r_base = bench.rjob.sent_edges[0]
    assert [e - r_base for e, _ in bench.r.received] == golden.read_beat_edges(bench.r_costs)
    bench.check_reads()
    # The data came back transposed, and the conflict counters match the golden costs.
    padding = [0] * (cfg.lanes - rows)
    assert [[int(x) for x in beat.data] for _, beat in bench.r.received] == \
        [list(column) + padding for column in zip(*tile)]
    assert bench.w_costs[0] == [1] * rows
    assert bench.r_costs[0] == ([1] * cfg.lanes if diagonal else [rows] * cfg.lanes)
    assert dut.r_conflict_cycles.value.to_unsigned() == sum(c - 1 for c in bench.r_costs[0])
    assert dut.w_conflict_cycles.value.to_unsigned() == 0


@cocotb.test()
async def test_chained_jobs_cycle_exact(dut):
    """Descriptors queued back to back, no stalls: every beat on the golden edge, no idle."""
    bench = await _setup(dut, "chained")
    jobs = [_random_job(bench) for _ in range(5)]
    jobs = [job for job in jobs if golden.job_is_valid(job, bench.params)]
    for job in jobs:
        bench.queue_write(job)
    await bench.writes_done(3000)
    base = bench.wjob.sent_edges[0]
    assert [e - base for e in bench.w.sent_edges] == golden.write_beat_edges(bench.w_costs)
    assert dut.w_conflict_cycles.value.to_unsigned() == \
        sum(c - 1 for costs in bench.w_costs for c in costs)
    for job in jobs:
        bench.queue_read(job)
    await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected), 3000, "reads")
    base = bench.rjob.sent_edges[0]
    assert [e - base for e, _ in bench.r.received] == golden.read_beat_edges(bench.r_costs)
    bench.check_reads()


@cocotb.test()
@cocotb.parametrize((("gap", "stall"), STALL_PROFILES))
async def test_random_jobs_with_dependencies(dut, gap, stall):
    """Random affine jobs; each read waits for the write before it and vice versa (wait_other);
    random gaps on wjob, rjob and w, random stalls on r."""
    bench = await _setup(dut, f"random:{gap}:{stall}", gap, stall)
    for phase in range(6):
        write = _random_job(bench, wait_other=int(phase > 0))
        while not golden.job_is_valid(write, bench.params):
            write = _random_job(bench, wait_other=int(phase > 0))
        bench.queue_write(write)
        await bench.until_latched("w")
        read = _random_job(bench, wait_other=1)
        while not golden.job_is_valid(read, bench.params):
            read = _random_job(bench, wait_other=1)
        bench.queue_read(read)
        await bench.until_latched("r")
    await wait_for(dut, lambda: len(bench.r.received) >= len(bench.expected), 20000, "reads")
    await ClockCycles(dut.clk, 20)
    bench.check_reads()
    assert dut.error.value == 0


@cocotb.test()
async def test_read_during_write_gets_the_old_word(dut):
    """The same job on both ports, descriptors taken at one edge: read access j and write
    access j touch the same words on the same edge, and every read returns the old word
    (docs/blocks/pmu.md); a read after the write returns the new words."""
    bench = await _setup(dut, "read-during-write")
    cfg = bench.cfg
    accesses = max(2, min(8, cfg.bank_depth))
    job = golden.make_job(bench.params, bounds=[accesses], strides=[cfg.lanes])
    bench.queue_write(job)                                 # the old words
    await bench.writes_done(40 * accesses + 100)
    bench.queue_read(job)                                  # expects the old words ...
    bench.queue_write(job)                                 # ... while these are written
    await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected),
                   40 * accesses + 100, "reads out")
    assert bench.wjob.sent_edges[-1] == bench.rjob.sent_edges[-1], "descriptors on one edge"
    assert bench.w_costs[-1] == bench.r_costs[-1] == [1] * accesses, "conflict-free accesses"
    bench.queue_read(job)                                  # now the new words
    await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected),
                   40 * accesses + 100, "reads out")
    bench.check_reads()


@cocotb.test()
async def test_busy_from_start_to_last_access(dut):
    """``w_busy`` and ``r_busy`` (which ``wait_other`` reads) are high at every edge from the
    one a job starts at (its descriptor's edge + 1, the port idle) to the one its last access
    completes at (the last ``w`` beat; the read's last lanes picked, 3 edges before its last
    ``r`` beat), and low around that: jobs of 1 to 3 accesses, the write's data held back.
    The conflict counters are checked after every job (odd counts of accesses among them)."""
    bench = await _setup(dut, "busy")
    cfg = bench.cfg
    samples = {"w": {}, "r": {}}

    async def sample():
        while True:
            await RisingEdge(dut.clk)             # pre-edge values: the cycle before this edge
            samples["w"][edge_now()] = int(dut.w_busy.value)
            samples["r"][edge_now()] = int(dut.r_busy.value)

    sampler = cocotb.start_soon(sample())
    for accesses in range(1, min(3, cfg.bank_depth) + 1):
        job = golden.make_job(bench.params, bounds=[accesses], strides=[cfg.lanes])
        vectors = bench.queue_write(job, [[accesses] * cfg.lanes] * accesses, hold_data=True)
        await ClockCycles(dut.clk, 12)
        bench.send_write_data(vectors)
        await bench.writes_done(100 + 10 * accesses)
        bench.queue_read(job)
        await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected), 100, "reads")
        await ClockCycles(dut.clk, 4)
        bench.check_conflict_counters(f"after jobs of 1..{accesses} accesses")
        for port, start, end in (("w", bench.wjob.sent_edges[-1], bench.w.sent_edges[-1]),
                                 ("r", bench.rjob.sent_edges[-1], bench.r.received[-1][0] - 3)):
            first = max(start - 2, min(samples[port]))
            seen = [edge for edge in range(first, end + 4) if samples[port][edge]]
            assert seen == list(range(start + 2, end + 1)), \
                f"{port}_busy high at edges {seen}, expected {start + 2}..{end} " \
                f"({accesses} accesses, descriptor at {start})"
    sampler.cancel()
    bench.check_reads()


@cocotb.test()
async def test_read_waits_for_write(dut):
    """wait_other: a read queued behind a write that starves for data stays idle until the
    write's last access, then reads the new words (read-after-write between jobs) on the
    edges of a descriptor taken at that access, even while a write chained behind that one
    keeps the write port busy."""
    bench = await _setup(dut, "raw")
    cfg = bench.cfg
    region = {"bounds": [2], "strides": [cfg.lanes]}
    write = golden.make_job(bench.params, **region)
    vectors = [[bench.rng.randrange(1, 1 << cfg.elem_width) for _ in range(cfg.lanes)]
               for _ in range(2)]   # nonzero: a read of the old (cleared) words would differ
    bench.queue_write(write, vectors, hold_data=True)
    await bench.until_latched("w")
    bench.queue_read(golden.make_job(bench.params, **region, wait_other=1))
    # A second write chained right behind the first (elsewhere, its data held back): the write
    # port stays busy, but the read waited for the job that was current, not for this one.
    later = golden.make_job(bench.params, base=2 * cfg.lanes, bounds=[1])
    later_vectors = bench.queue_write(later, hold_data=True)
    await ClockCycles(dut.clk, 20)
    assert not dut.r_busy.value and not bench.r.received, "read started before the write ended"
    bench.send_write_data(vectors)
    await wait_for(dut, lambda: len(bench.r.received) == 2, 100, "reads")
    # It starts as if its descriptor were taken at the edge of the write's last beat.
    completed = bench.w.sent_edges[-1]
    assert [e - completed for e, _ in bench.r.received] == \
        golden.read_beat_edges(bench.r_costs), "the waiting read's beats (docs/blocks/pmu.md)"
    assert dut.w_busy.value, "the chained write should still wait for its data"
    bench.send_write_data(later_vectors)
    await bench.writes_done(100, "chained write done")
    bench.check_reads()


@cocotb.test()
async def test_write_waits_for_read(dut):
    """wait_other the other way: a write queued while a read job runs, with a second read
    chained behind that one, starts as if its descriptor were taken at the edge the running
    read's last lanes are picked (3 edges before its last ``r`` beat), not when the read port
    goes idle: the second read keeps it busy past that edge."""
    bench = await _setup(dut, "war")
    cfg = bench.cfg
    accesses = max(1, min(4, cfg.banks * cfg.bank_depth // (2 * cfg.lanes)))
    region = {"bounds": [accesses], "strides": [cfg.lanes]}
    bench.queue_read(golden.make_job(bench.params, **region))
    await bench.until_latched("r")
    bench.queue_read(golden.make_job(bench.params, **region))
    bench.queue_write(golden.make_job(bench.params, base=accesses * cfg.lanes, **region,
                                      wait_other=1))
    await bench.writes_done(200 + 40 * accesses)
    await wait_for(dut, lambda: len(bench.r.received) == 2 * accesses, 200, "reads")
    completed = bench.r.received[accesses - 1][0] - 3
    assert [e - completed for e in bench.w.sent_edges] == \
        golden.write_beat_edges(bench.w_costs), "the waiting write's beats (docs/blocks/pmu.md)"
    assert bench.r.received[-1][0] - 3 > completed, "the second read should run past it"
    bench.check_reads()


@cocotb.test()
async def test_each_lane_carries_the_largest_rank(dut):
    """Every lane v as the one lane of the largest rank r (0 <= r <= v): lanes v-r..v in one
    bank (lane stride B; the predicate window switches the others off), so the access costs
    r + 1 and the conflict counter counts r more, on both ports, every read word against the
    golden. Lanes whose address would pass the capacity (v >= bank_depth) are left out."""
    bench = await _setup(dut, "largest-rank")
    cfg = bench.cfg
    for v in range(min(cfg.lanes, cfg.bank_depth)):
        for r in range(v + 1):
            job = golden.make_job(bench.params, lane_stride=cfg.banks,
                                  pred_lo=(v - r) * cfg.banks, pred_hi=v * cfg.banks + 1)
            bench.queue_write(job)
            await bench.writes_done(100)
            bench.queue_read(job)
            await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected), 100,
                           "reads")
            assert bench.w_costs[-1] == bench.r_costs[-1] == [r + 1], "the golden cost"
            bench.check_conflict_counters(f"lane {v} of rank {r} the largest")
    bench.check_reads()


@cocotb.test()
async def test_conflict_counters_count_far(dut):
    """The conflict counters past 2^12 on both ports, checked after every job: jobs of 61 to
    65 accesses (at most 2^A; odd and even counts, so that a bit toggled at every count does
    not cancel out) at one address with every lane whose address fits in bank 0 (lane stride
    B), so each access of n lanes costs n cycles. A bit flipped or held below bit 12 shows.
    With one lane there is no conflict to count: the counters stay 0 over a job of up to 64
    accesses. (Bits above 12 would take ~2^k cycles.)"""
    bench = await _setup(dut, "far")
    cfg = bench.cfg
    lanes = min(cfg.lanes, cfg.bank_depth)
    if lanes < 2:
        job = golden.make_job(bench.params, bounds=[min(64, 1 << cfg.addr_width)])
        bench.queue_write(job)
        await bench.writes_done(64 * 4 + 100)
        bench.queue_read(job)
        await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected), 64 * 4 + 100,
                       "reads")
        assert dut.w_conflict_cycles.value.to_unsigned() == 0
        assert dut.r_conflict_cycles.value.to_unsigned() == 0
        bench.check_reads()
        return
    jobs = -(-(1 << 12) // (61 * (lanes - 1))) + 1
    for port in ("w", "r"):
        for index in range(jobs):
            length = min(61 + index % 5, 1 << cfg.addr_width)      # a bound is at most 2^A
            job = golden.make_job(bench.params, bounds=[length], strides=[0],
                                  lane_stride=cfg.banks, pred_hi=(lanes - 1) * cfg.banks + 1)
            if port == "w":
                bench.queue_write(job)
                await bench.writes_done(64 * lanes + 100)
            else:
                bench.queue_read(job)
                await wait_for(dut, lambda: len(bench.r.received) == len(bench.expected),
                               64 * lanes + 100, "reads")
            bench.check_conflict_counters(f"after job {index}", ports=(port,))
        assert getattr(dut, f"{port}_conflict_cycles").value.to_unsigned() > 1 << 12
    bench.check_reads()


@cocotb.test()
async def test_predication_and_wrap(dut):
    """Predicate edges cut accesses; negative strides wrap modulo 2^A; beyond capacity is off."""
    bench = await _setup(dut, "predicate", 0.3, 0.3)
    cfg, params = bench.cfg, bench.params
    limit = 1 << cfg.addr_width
    fill = golden.make_job(params, bounds=[cfg.bank_depth], strides=[cfg.lanes],
                           lane_stride=1, pred_hi=cfg.banks * cfg.bank_depth)
    bench.queue_write(fill)
    await bench.until_latched("w")
    reads = [
        golden.make_job(params, base=1, bounds=[min(3, limit)], strides=[cfg.lanes], pred_lo=2,
                        pred_hi=2 * cfg.lanes + 1, wait_other=1),
        golden.make_job(params, base=2, **_nest(cfg, [2, 2], [-3, limit - 5]),
                        lane_stride=-1, wait_other=1),
        golden.make_job(params, base=limit - 2, bounds=[2], strides=[1], lane_stride=1,
                        wait_other=1),
    ]
    for read in reads:
        bench.queue_read(read)
    # The reads wait for the fill: bank_depth beats under 30% valid gaps first.
    await wait_for(dut, lambda: len(bench.r.received) >= len(bench.expected),
                   20000 + 3 * cfg.bank_depth, "reads")
    bench.check_reads()
    assert any(not all(valid) for _, valid, _ in bench.expected), "no lane was predicated off"


@cocotb.test()
async def test_predicate_bounds_bit_by_bit(dut):
    """Every bit of ``pred_lo`` and ``pred_hi``, set and clear, decides a lane on both ports.
    For bit i and an address r below 2^i and the capacity, one-beat jobs at r with pred_hi =
    2^i | r (r in) or r (r out), pred_lo = 2^i | r (r out) or r (r in): a write with that
    predicate, read back unpredicated (its words changed from what they held), then a read with
    it (the lanes' valid flags). Random gaps and stalls. A predicate bit stuck in either port's
    latched job or decode register changes whether r is in."""
    bench = await _setup(dut, "predicate bits", 0.3, 0.3)
    cfg, params, rng = bench.cfg, bench.params, bench.rng
    capacity, limit = cfg.banks * cfg.bank_depth, 1 << cfg.addr_width
    mask = (1 << cfg.elem_width) - 1
    for bit in range(cfg.addr_width + 1):
        r = rng.randrange(min(1 << bit, capacity))
        for lo, hi in ((0, (1 << bit) | r), (0, r), ((1 << bit) | r, limit), (r, limit)):
            at_r = golden.make_job(params, base=r, wait_other=1)
            held, _, _ = bench.memory.read_job(at_r)
            bench.queue_write(golden.make_job(params, base=r, pred_lo=lo, pred_hi=hi),
                              [[(word + 1) & mask for word in held[0]]])
            await bench.until_latched("w")
            bench.queue_read(at_r)
            bench.queue_read(golden.make_job(params, base=r, pred_lo=lo, pred_hi=hi))
            await wait_for(dut, lambda: len(bench.r.received) >= len(bench.expected), 2000,
                           f"reads of bit {bit}, predicate [{lo}, {hi})")
    bench.check_reads()
    assert dut.error.value == 0


@cocotb.test()
async def test_bank_bit_positions_and_a_wrapping_base(dut):
    """Bit-select mappings with the bank bits at the top, at random positions and at the
    bottom: the whole scratchpad is written with each and read back with another, so every
    word's bank and offset (the address with its bank bits removed) is checked. Then a write
    and a read whose base has every high address bit set wrap past 2^A back onto word 0, and a
    write predicated to a window inside the scratchpad leaves the words outside it; a long
    write and read whose bound has its top bit set."""
    bench = await _setup(dut, "bank-bits", 0.2, 0.2)
    cfg, params, rng = bench.cfg, bench.params, bench.rng
    b, cb = cfg.bank_bits, cfg.capacity_bits
    capacity, lanes, limit = cfg.banks * cfg.bank_depth, cfg.lanes, 1 << cfg.addr_width
    whole = {"bounds": [-(-capacity // lanes)], "strides": [lanes], "pred_hi": capacity}
    mappings = [list(range(cb - b, cb)), sorted(rng.sample(range(cb), b)), list(range(b))]
    for written, read in zip(mappings, mappings[1:] + mappings[:1]):
        bench.queue_write(golden.make_job(params, **whole, bank_pos=written, wait_other=1))
        await bench.until_latched("w")
        bench.queue_read(golden.make_job(params, **whole, bank_pos=read, wait_other=1))
        await bench.until_latched("r")
    wrap = {"base": limit - 2 * lanes, "bounds": [min(4, limit)], "strides": [lanes],
            "bank_pos": mappings[1]}
    vectors = [[rng.randrange(1, 1 << cfg.elem_width) for _ in range(lanes)]
               for _ in range(len(golden.access_addresses(golden.make_job(params, **wrap),
                                                          params)))]
    bench.queue_write(golden.make_job(params, **wrap, wait_other=1), vectors)
    await bench.until_latched("w")
    bench.queue_read(golden.make_job(params, **wrap, wait_other=1))
    await bench.until_latched("r")
    # Writes predicated to windows inside the scratchpad: the words outside them keep their
    # values. pred_lo has every bit but bit 0 set, pred_hi only its top bit and bit 0, so a
    # flipped bit of either moves the window's edge.
    for lo, hi in ((capacity - 2, capacity), (0, capacity // 2 + 1)):
        window = {**whole, "pred_lo": lo, "pred_hi": hi}
        bench.queue_write(golden.make_job(params, **window, bank_pos=mappings[1], wait_other=1))
        await bench.writes_done(40 * capacity + 2000, "window written")
    # A long job: a bound with its top bit set (2^(CB-1) + 1 accesses, over the scratchpad
    # more than once), so every bit of a bound counts.
    long_bound = min((1 << max(0, cb - 1)) + 1, limit)
    long_job = {"bounds": [long_bound], "strides": [lanes + 1], "pred_hi": capacity,
                "bank_pos": mappings[1]}
    bench.queue_write(golden.make_job(params, **long_job, wait_other=1))
    await bench.writes_done(40 * (capacity + long_bound) + 2000, "long job written")
    bench.queue_read(golden.make_job(params, **long_job, wait_other=1))
    await bench.until_latched("r")
    bench.queue_read(golden.make_job(params, **whole, wait_other=1))
    await wait_for(dut, lambda: len(bench.r.received) >= len(bench.expected),
                   40 * (capacity + long_bound) + 2000, "reads")
    await ClockCycles(dut.clk, 10)
    bench.check_reads()
    assert dut.error.value == 0


@cocotb.test()
async def test_reset_mid_job(dut):
    """Reset during a long write and a read: ports, queues and counters restart clean."""
    bench = await _setup(dut, "reset", 0.2, 0.4)
    cfg, params = bench.cfg, bench.params
    loops = _nest(cfg, [4, 3], [cfg.lanes, 4 * cfg.lanes],
                  flat=([min(12, 1 << cfg.addr_width)], [cfg.lanes]))
    region = golden.make_job(params, **loops, lane_stride=1)
    bench.queue_write(region)
    bench.queue_read(golden.make_job(params, bounds=[min(4, 1 << cfg.addr_width)], strides=[1],
                                     lane_stride=cfg.lanes))
    await wait_for(dut, lambda: len(bench.w.sent_edges) >= 3, 2000, "write under way")
    bench.stop()
    await RisingEdge(dut.clk)
    await reset_dut(dut, 3)
    assert not dut.r__valid.value and not dut.w_busy.value and not dut.r_busy.value
    assert dut.w_conflict_cycles.value.to_unsigned() == 0 and dut.error.value == 0
    # The scratchpad keeps its words through reset (documented); rewrite before reading.
    fresh = PMUBench(dut, cfg, bench.component, bench.rng, 0.2, 0.4)
    fresh.start()
    fresh.queue_write(region)
    await fresh.until_latched("w")
    fresh.queue_read(golden.make_job(params, **loops, lane_stride=1, wait_other=1))
    await wait_for(dut, lambda: len(fresh.r.received) >= len(fresh.expected), 5000, "reads")
    await ClockCycles(dut.clk, 10)
    fresh.check_reads()


@cocotb.test()
async def test_misuse_sets_error(dut):
    """A bound of 0 is rejected (job dropped); a misplaced w.last is flagged. Sticky."""
    bench = await _setup(dut, "misuse")
    params = bench.params
    bad = golden.make_job(params, bounds=[0])
    bench.wjob.send(bench._descriptor(bad))
    good = golden.make_job(params, bounds=[2], strides=[bench.cfg.lanes])
    bench.queue_write(good)
    await bench.writes_done(500, "good job done")
    assert dut.error.value == 1, "bound 0 not flagged"
    bench.stop()
    await reset_dut(dut)
    assert dut.error.value == 0
    bench2 = PMUBench(dut, bench.cfg, bench.component, bench.rng)
    bench2.wjob.send(bench2._descriptor(good))
    bench2.w.send({"data": [0] * bench.cfg.lanes, "last": 1})   # last on access 0 of 2
    bench2.w.send({"data": [0] * bench.cfg.lanes, "last": 1})
    bench2.start()
    await bench2.writes_done(500, "job done")
    assert dut.error.value == 1, "misplaced w.last not flagged"


@cocotb.test()
@long_enough_to_time
async def test_throughput(dut):
    """Accesses per cycle per port for row, column and strided patterns, diagonal vs naive.

    Each pattern is one job of ``4 * lanes`` accesses; the rate is asserted against the golden
    costs and written to ``throughput.json`` for ``make bench``.
    """
    started, first_edge = time.perf_counter(), edge_now()
    bench = await _setup(dut, "throughput")
    cfg = bench.cfg
    n, row = cfg.lanes, cfg.banks
    accesses = min(4 * n, 1 << cfg.addr_width)      # a bound above 2^A is rejected
    patterns = {"row": (1, row), "column": (row, 1), "stride3": (3, 3 * n)}
    metrics = {}
    for name, (lane_stride, step) in patterns.items():
        for mapping, diagonal in (("diagonal", 1), ("naive", 0)):
            job = golden.make_job(bench.params, bounds=[accesses], strides=[step],
                                  lane_stride=lane_stride, diagonal=diagonal,
                                  row_shift=cfg.bank_bits)
            bench.w_costs.clear()
            bench.r_costs.clear()
            bench.wjob.sent_edges.clear()
            bench.w.sent_edges.clear()
            bench.queue_write(job)
            await bench.writes_done(50 * accesses, "pattern written")
            w_edges = bench.w.sent_edges
            start = len(bench.r.received)
            bench.queue_read(job)
            await wait_for(dut, lambda: len(bench.r.received) == start + accesses,
                           50 * accesses, "pattern read")
            r_edges = [e for e, _ in bench.r.received[start:]]
            want = sum(bench.w_costs[0])
            # Cycles the port spent on the job: from its first beat's first cycle to its last.
            w_cycles = w_edges[-1] - w_edges[0] + bench.w_costs[0][0]
            r_cycles = r_edges[-1] - r_edges[0] + bench.r_costs[0][0]
            assert w_cycles == want and r_cycles == sum(bench.r_costs[0])
            metrics[f"{name}/{mapping}"] = round(accesses / r_cycles, 4)
    bench.check_reads()
    rate = (edge_now() - first_edge) / (time.perf_counter() - started)
    # Word accesses: every pattern's beats (n words each) written and read once.
    write_throughput(metrics, "read accesses per cycle", rate,
                     operations=len(patterns) * 2 * 2 * accesses * n)
