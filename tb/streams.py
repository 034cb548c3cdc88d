"""Reusable cocotb stream source, sink and scoreboard for Amaranth ``lib.stream`` ports.

The generated Verilog flattens a stream port ``x`` into ``x__valid``, ``x__ready`` and
``x__payload``. Payloads are packed and unpacked with the block's own Amaranth layout, through
integer codecs computed once from it (:mod:`tb.codec`), so bit packing is defined once and costs
shifts per beat. Every :class:`StreamSink` is also a protocol checker of the output it watches
(:class:`ProtocolError`).

Handshakes are sampled right after :class:`~cocotb.triggers.RisingEdge`, i.e. the values the flops
saw at that edge (not after ``ReadOnly``, which would show post-edge values and miscount
transfers). Every transfer is stamped with its edge number (simulated time / clock period).
"""

import collections

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotb.utils import get_sim_time

from tb.codec import codec

__all__ = ["CLOCK_PERIOD_NS", "STALL_PROFILES", "LONG_BURSTS", "ProtocolError", "Pauses",
           "RandomPauses", "BurstPauses", "PeriodicPauses", "pauses", "pause_fraction",
           "start_clock", "assert_lockstep", "reset_dut", "start_after_reset", "edge_now",
           "sample_each_edge", "assert_high_from_to", "StreamSource",
           "StreamMonitor", "StreamSink", "StreamBench", "PipeBench", "JobBench",
           "InOrderScoreboard", "beats_per_cycle",
           "stream_layout", "Worker", "EdgeWorker", "bit_string", "read_bits",
           "wait_for", "stop_stream_ends"]

CLOCK_PERIOD_NS = 10

# (valid gaps on every input, ready stalls on every output) of the random-traffic tests of
# every block, as :func:`pauses` reads them: none; random gaps only; random stalls only; long
# bursts of 10 to 150 cycles on every port (they fill every FIFO and back the pipelines up).
LONG_BURSTS = ("burst", 0.02, 10, 150)
STALL_PROFILES = [(0.0, 0.0), (0.5, 0.0), (0.0, 0.6), (LONG_BURSTS, LONG_BURSTS)]


class Pauses:
    """When a port pauses: a valid gap on a source, a ready stall on a sink. ``next()`` is
    asked once per cycle in which the port could move and answers True to pause."""

    def next(self):
        raise NotImplementedError


class RandomPauses(Pauses):
    """Each cycle on its own: pause with ``probability``."""

    def __init__(self, rng, probability):
        self.rng, self.probability = rng, probability

    def next(self):
        return self.probability > 0 and self.rng.random() < self.probability


class BurstPauses(Pauses):
    """Long bursts: outside a burst, one starts with ``start_probability`` per cycle and lasts
    a uniform ``lengths`` = (shortest, longest) cycles (tens to hundreds: long enough to fill
    every FIFO of a block and back its pipeline up)."""

    def __init__(self, rng, start_probability, lengths):
        self.rng, self.start_probability, self.lengths = rng, start_probability, lengths
        self._left = 0

    def next(self):
        if self._left == 0 and self.rng.random() < self.start_probability:
            self._left = self.rng.randint(*self.lengths)
        if self._left:
            self._left -= 1
            return True
        return False


class PeriodicPauses(Pauses):
    """``length`` paused cycles every ``period`` cycles."""

    def __init__(self, period, length):
        self.period, self.length, self._cycle = period, length, 0

    def next(self):
        self._cycle = (self._cycle + 1) % self.period
        return self._cycle < self.length


class HeldPauses(Pauses):
    """Pause every cycle until ``release()``: a port held for as long as a test needs."""

    def __init__(self):
        self.held = True

    def release(self):
        self.held = False

    def hold(self):
        self.held = True

    def next(self):
        return self.held


def pause_fraction(spec):
    """The long-run fraction of cycles a pause spec (as :func:`pauses` reads it) pauses, for
    sizing a test's cycle budget."""
    if isinstance(spec, (int, float)):
        return float(spec)
    kind, *args = spec
    if kind == "burst":
        mean = args[0] * (args[1] + args[2]) / 2
        return mean / (1 + mean)
    return args[1] / args[0]


def pauses(spec, rng):
    """The :class:`Pauses` a profile entry names: a probability (random pauses), ``("burst",
    start_probability, shortest, longest)``, ``("periodic", period, length)`` or a
    :class:`Pauses` itself."""
    if isinstance(spec, Pauses):
        return spec
    if isinstance(spec, (int, float)):
        return RandomPauses(rng, float(spec))
    kind, *args = spec
    if kind == "burst":
        return BurstPauses(rng, args[0], (args[1], args[2]))
    if kind == "periodic":
        return PeriodicPauses(*args)
    raise ValueError(f"pause profile {spec!r}: unknown; allowed: a probability, "
                     "('burst', p, shortest, longest) or ('periodic', period, length)")


# The task driving the running test's clock (cocotb ends it with the test).
_clock_task = None


def start_clock(dut):
    """Start the 10 ns clock on ``dut.clk``, unless the design under test makes its own (an
    output ``clock_inside``: the buffered harness's ``BLOCK_buffered_clocked``, whose clock is
    the same, low from time 0 and rising every 10 ns from 5 ns), or this test's clock runs
    already (a bench started again after a reset mid-test: a second clock on the same signal
    shifted its phase by half a period and gave the design one extra edge)."""
    global _clock_task
    if _clock_task is not None and not _clock_task.done():
        return
    # The GPI clock (driven from C, no Python wake-up per edge). It starts low, so its first
    # rising edge comes half a period after the reset that follows is applied: started high, its
    # time-0 edge came before `rst` was written and a test that ran alone saw one reset edge.
    if getattr(dut, "clock_inside", None) is None:
        _clock_task = Clock(dut.clk, CLOCK_PERIOD_NS, unit="ns",
                            impl="gpi").start(start_high=False)
    mismatch = getattr(dut, "mismatch", None)        # BLOCK_equiv: the --3d lockstep run
    if mismatch is not None:
        cocotb.start_soon(_watch_lockstep(mismatch))


async def _watch_lockstep(mismatch):
    """Fail the test the moment the 3D build's outputs differ from the 2D build's (the sticky
    ``mismatch`` of :mod:`flows.threed`'s BLOCK_equiv), whatever the test checks itself."""
    if mismatch.value != 1:
        await RisingEdge(mismatch)
    raise AssertionError(f"the 3D build's outputs differ from the 2D build's (edge {edge_now()})")


def assert_lockstep(dut):
    """Under --3d (the DUT is BLOCK_equiv): the 3D build never differed from the 2D build."""
    mismatch = getattr(dut, "mismatch", None)
    if mismatch is not None:
        assert mismatch.value == 0, "the 3D build's outputs differ from the 2D build's"


def edge_now():
    """Index of the rising edge at the current simulation time."""
    return int(get_sim_time(unit="ns")) // CLOCK_PERIOD_NS


def sample_each_edge(dut, *names):
    """Record, at every rising edge from now on, the value each of the ``dut`` signals
    ``names`` held in the cycle that edge ends: returns ``({name: {edge: value}}, task)``;
    cancel the task when done. For a status output's contract (``busy`` high at exactly the
    edges its document names)."""
    samples = {name: {} for name in names}

    async def sample():
        while True:
            await RisingEdge(dut.clk)             # pre-edge values: the cycle before this edge
            for name in names:
                samples[name][edge_now()] = int(getattr(dut, name).value)
    return samples, cocotb.start_soon(sample())


def assert_high_from_to(samples, name, first, last, what=""):
    """Of :func:`sample_each_edge`'s ``samples``: ``name`` was high at edges ``first`` to
    ``last`` and low at the two edges before and after (those sampled; the two after must
    be)."""
    seen = samples[name]
    assert last + 2 in seen, f"{name}: edges up to {last + 2} not sampled yet"
    high = [edge for edge in range(first - 2, last + 3) if seen.get(edge)]
    assert high == list(range(first, last + 1)), (
        f"{name} high at edges {high[:3]}..{high[-3:]}, expected {first}..{last} {what}")


async def reset_dut(dut, cycles=2):
    """Hold the synchronous active-high reset ``rst`` for ``cycles`` edges."""
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    dut.rst.value = 0


async def start_after_reset(dut, bench):
    """Start the clock, reset, then ``bench.start()`` (the usual opening of a test)."""
    start_clock(dut)
    await reset_dut(dut)
    bench.start()


# The stream ends read their handles' bit strings from the simulator object (cocotb's
# ``_handle``, cocotb 2.1 pinned) rather than through ``handle.value``, which builds a Logic or
# LogicArray object per read: every port is read at every edge, and those objects were the
# largest single cost of a Verilator run's Python.
def bit_string(handle):
    """The simulator's bit string of ``handle`` (no LogicArray per read: the benches read
    wide payloads every cycle)."""
    return handle._handle.get_signal_val_binstr()


def read_bits(handle):
    """``handle``'s value as an integer; X or Z raises ValueError (an undriven payload fails
    loudly, never reads 0). Inlined, not through bit_string: a per-beat read."""
    return int(handle._handle.get_signal_val_binstr(), 2)


def _read_bit(handle):
    """A 1-bit handle's value as 0 or 1; X or Z raises ValueError (never read as 0)."""
    bit = bit_string(handle)
    if bit == "1":
        return 1
    if bit == "0":
        return 0
    raise ValueError(f"{handle._name} is {bit}")


class ProtocolError(AssertionError):
    """An output stream broke the stream rules (a valid dropped or a payload changed before its
    transfer, or X/Z on a handshake after reset)."""


class _EdgeTicker:
    """One coroutine per clock that calls ``_on_edge()`` of every started :class:`EdgeWorker`
    at each rising edge, in the order they were started. A coroutine per port costs cocotb's
    task scheduling per port per cycle (resume, trigger registration, event loop), which was
    most of what a bench spends beside its own checks; stepping the ports from one coroutine
    pays it once a cycle. A port is stepped at the edges its own coroutine would have seen:
    from the edge after its start, until its stop."""

    _tickers = {}

    def __init__(self, clock):
        self.clock = clock
        self.workers = []
        self.task = None

    @classmethod
    def of(cls, clock):
        ticker = cls._tickers.get(id(clock))
        if ticker is None or ticker.clock is not clock:
            ticker = cls._tickers[id(clock)] = cls(clock)
        return ticker

    def add(self, worker):
        if self.task is None or self.task.done():
            # (A task left from an earlier test, ended by cocotb with it, took its ports along.)
            self.workers = []
            self.task = cocotb.start_soon(self._run())
        self.workers.append(worker)

    def remove(self, worker):
        if worker in self.workers:
            self.workers.remove(worker)
        if not self.workers and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self):
        edge = RisingEdge(self.clock)
        while True:
            await edge
            now = get_sim_time(unit="step")
            for worker in tuple(self.workers):
                # Not one stopped by a port stepped before it, nor one started at this edge
                # (by code that ran before this coroutine): its first edge is the next one.
                if worker._ticking and worker._started != now:
                    worker._on_edge()


def stop_stream_ends():
    """Stop every started stream end (source, sink, monitor) of every clock: a test that runs
    again from a reset (``tb.harness.long_enough_to_time``) starts ports of its own."""
    for ticker in _EdgeTicker._tickers.values():
        for worker in tuple(ticker.workers):
            worker.stop()


class Worker:
    """Owns one coroutine, ``_run``, started and cancelled as a whole."""

    _task = None

    def start(self):
        """Start the coroutine (one decision per clock edge, or per window)."""
        self._task = cocotb.start_soon(self._run())

    def stop(self):
        """Cancel it."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self):
        raise NotImplementedError


class EdgeWorker(Worker):
    """A worker that does one synchronous step per rising edge (``_on_edge``), after
    ``_on_start`` at its start; all of a clock's are stepped from one coroutine
    (:class:`_EdgeTicker`)."""

    _ticking = False

    def start(self):
        self._on_start()
        self._ticking = True
        self._started = get_sim_time(unit="step")
        _EdgeTicker.of(self._clk).add(self)

    def stop(self):
        if self._ticking:
            self._ticking = False
            _EdgeTicker.of(self._clk).remove(self)

    def _on_start(self):
        pass

    def _on_edge(self):
        raise NotImplementedError


class _StreamEnd(EdgeWorker):
    """One end of a stream port: its three handles, stepped at every edge."""

    def __init__(self, dut, name, layout, rng):
        self.name = name
        self._clk = dut.clk
        self._rst = dut.rst
        self._valid = getattr(dut, f"{name}__valid")
        self._ready = getattr(dut, f"{name}__ready")
        self._payload = getattr(dut, f"{name}__payload")
        self._layout = layout
        self._codec = codec(layout)
        self._rng = rng

    @property
    def layout(self):
        """The port's payload layout."""
        return self._layout

    def stop(self):
        """Stop working the port and drive it idle."""
        super().stop()
        self._go_idle()


class StreamSource(_StreamEnd):
    """Drives a stream port from a queue of payloads, with seeded random valid gaps.

    Parameters
    ----------
    dut : cocotb handle
        The top level.
    name : str
        Port name (``a`` for ``a__valid``/``a__ready``/``a__payload``).
    layout : amaranth.lib.data.Layout
        The port's payload layout.
    rng : random.Random
        Seeded generator for the gaps.
    gap_probability : float or pause spec
        When ``valid`` stays low on a cycle a new beat could start (:func:`pauses`: a
        probability, random bursts or periodic gaps).

    Members
    -------
    sent_edges : list of int
        Edge of every transfer, in order.
    always_ready : bool
        The port's contract says it is always ready: a beat offered outside reset that is not
        taken at the next edge raises :class:`ProtocolError` (set by :class:`StreamBench`).
    """

    def __init__(self, dut, name, layout, rng, gap_probability=0.0):
        super().__init__(dut, name, layout, rng)
        self.always_ready = False
        self._valid_driven = None
        self._gaps = pauses(gap_probability, rng)
        self._in_reset = False
        self._queue = collections.deque()
        self.sent_edges = []
        self._go_idle()
        self._payload.value = 0

    def send(self, payload, not_before=0):
        """Queue one beat; ``payload`` is a dict for the layout (``{"data": [...], "last": 1}``).

        ``not_before``: the beat is not offered before this edge (a memory model's arrival time).
        """
        self._queue.append((self._codec.encode(payload), not_before))

    @property
    def idle(self):
        """Nothing queued and nothing on the port."""
        return not self._queue and not self._driving

    def _ready_now(self):
        # X/Z on ready outside reset fails loudly (ProtocolError) rather than reading as 0.
        try:
            return _read_bit(self._ready)
        except ValueError:
            raise ProtocolError(f"{self.name}__ready is {self._ready.value} after reset") from None

    def _go_idle(self):
        # What we drive is kept here: a write to a handle is applied later in the time step,
        # so reading it back would show the old value.
        self._queue.clear()
        self._driving = False
        self._drive_valid(0, force=True)

    def _drive_valid(self, value, force=False):
        # Written when it changes (or when asked), not at every edge: a write is a scheduled
        # simulator call, and the ports are driven at every edge.
        if force or value != self._valid_driven:
            self._valid.value = value
            self._valid_driven = value

    def _on_start(self):
        self._drive_valid(int(self._driving), force=True)

    def _on_edge(self):
        self._step()

    def _step(self):
        """One edge: what the port did at it, and what it drives until the next."""
        if _read_bit(self._rst):
            # A reset: the block forgets what it took, so the beat on the port and the queue
            # behind it are dropped at its first edge (the test queues afresh; what it queues
            # while the reset lasts is kept and offered after it).
            if not self._in_reset:
                self._go_idle()
            self._in_reset = True
            return
        self._in_reset = False
        if self._driving and self._ready_now():
            self.sent_edges.append(edge_now())
            self._queue.popleft()
            self._driving = False
        if self._driving:
            if self.always_ready:
                raise ProtocolError(f"{self.name}__ready low at edge {edge_now()} with a beat "
                                    "offered: its contract says always ready")
            return  # valid stays high with a stable payload until the transfer
        if self._queue and edge_now() >= self._queue[0][1] and not self._gaps.next():
            self._payload.value = self._queue[0][0]
            self._driving = True
        self._drive_valid(int(self._driving))


class StreamMonitor(_StreamEnd):
    """Watches a stream port without driving it: records every transfer and checks the stream
    rules on it (a protocol checker): once ``valid`` is high it stays high, with the same
    payload, until the transfer; no X or Z on ``valid`` or ``ready`` after reset. A violation
    raises :class:`ProtocolError` and fails the test. Reset restarts the rules (a reset may
    drop a beat).

    Parameters
    ----------
    dut, name, layout
        As for :class:`StreamSource`.
    rng : random.Random, optional
        Unused by a monitor (a :class:`StreamSink` draws its stalls from it).

    Members
    -------
    received : list of (int, tb.codec.Fields)
        ``(edge, payload)`` of every transfer, in order.
    """

    def __init__(self, dut, name, layout, rng=None):
        super().__init__(dut, name, layout, rng)
        self.received = []
        self._held = None       # payload of a beat offered but not taken at the last edge

    def _go_idle(self):
        self._held = None

    def _ready_at_edge(self):
        return self._handshake(self._ready)

    def _handshake(self, handle):
        try:
            return _read_bit(handle)
        except ValueError:
            raise ProtocolError(f"{handle._name} is {handle.value} after reset") from None

    def _observe(self):
        """Sample the port at the edge just passed (pre-edge values)."""
        if _read_bit(self._rst):
            self._held = None
            return
        if self._handshake(self._valid):
            bits = read_bits(self._payload)
            if self._held is not None and bits != self._held:
                raise ProtocolError(f"{self.name}: payload changed while valid and not ready "
                                    f"(edge {edge_now()})")
            if self._ready_at_edge():
                self.received.append((edge_now(), self._codec.decode(bits)))
                self._held = None
            else:
                self._held = bits
        elif self._held is not None:
            raise ProtocolError(f"{self.name}: valid fell before the transfer (edge "
                                f"{edge_now()})")

    def _on_edge(self):
        self._observe()


class StreamSink(StreamMonitor):
    """A :class:`StreamMonitor` that also drives ``ready``, with seeded stalls.

    Parameters
    ----------
    dut, name, layout, rng
        As for :class:`StreamSource`.
    stall_probability : float or pause spec
        When ``ready`` is low (:func:`pauses`).
    """

    def __init__(self, dut, name, layout, rng, stall_probability=0.0):
        super().__init__(dut, name, layout, rng)
        self._ready_driven = None
        self._stalls = pauses(stall_probability, rng)
        self._go_idle()

    def _go_idle(self):
        super()._go_idle()
        self._accepting = False
        self._drive_ready(force=True)

    def _ready_at_edge(self):
        # What we drove before the edge (reading the handle back would race the write).
        return self._accepting

    def _drive_ready(self, force=False):
        # Written when it changes (or when asked), as a source's valid.
        if force or self._accepting != self._ready_driven:
            self._ready.value = int(self._accepting)
            self._ready_driven = self._accepting

    def _choose_ready(self):
        self._accepting = not self._stalls.next()
        self._drive_ready()

    def _on_start(self):
        self._choose_ready()
        self._drive_ready(force=True)

    def _on_edge(self):
        self._observe()
        self._choose_ready()


def stream_layout(component, name):
    """The payload layout of stream port ``name`` of ``component``; ``name__<i>`` names
    element i of an array of streams."""
    base, _, index = name.rpartition("__")
    if index.isdigit() and hasattr(component, base):
        return getattr(component, base)[int(index)].payload.shape()
    return getattr(component, name).payload.shape()


class StreamBench:
    """The ports of one block under test, bound by name prefix: a :class:`StreamSource` on each
    of ``sources``, a :class:`StreamSink` on each of ``sinks`` and a :class:`StreamMonitor` on
    each of ``monitors`` (port names of ``component``, the unelaborated design; ``x__<i>`` for
    element i of an array of streams), started and stopped together.

    Clock- and reset-aware: every driver samples ``rst`` at every edge; a reset makes the
    sources drop the beat they offer and everything queued (the block forgets what it took, so
    the test queues its jobs afresh) and restarts the monitors' protocol rules. :meth:`reset`
    resets the block mid-job, with no stop and start around it. The sources named in
    ``always_ready`` check that every beat they offer outside reset is taken at once.
    """

    def __init__(self, dut, component, rng, sources=(), sinks=(), gap=0.0, stall=0.0,
                 monitors=(), always_ready=()):
        self.dut, self.rng = dut, rng
        self.sources = {name: StreamSource(dut, name, stream_layout(component, name), rng, gap)
                        for name in sources}
        for name in always_ready:
            self.sources[name].always_ready = True
        self.sinks = {name: StreamSink(dut, name, stream_layout(component, name), rng, stall)
                      for name in sinks}
        self.monitors = {name: StreamMonitor(dut, name, stream_layout(component, name))
                         for name in monitors}

    @property
    def ports(self):
        return [*self.sources.values(), *self.sinks.values(), *self.monitors.values()]

    def start(self):
        for port in self.ports:
            port.start()

    def stop(self):
        for port in self.ports:
            port.stop()

    def check_output(self, sink, expected, fields=None):
        """Assert ``sink`` received exactly ``expected``, in order, through the in-order
        scoreboard (payload bits; the first difference decoded). ``expected``: payload dicts,
        or tuples of the payload ``fields`` in that order."""
        board = InOrderScoreboard(sink, self.sinks[sink].layout)
        for beat in expected:
            board.expect_payload(dict(zip(fields, beat)) if fields else beat)
        board.check(self.sinks[sink])

    def transfers(self):
        """Beats the sources sent and the sinks received so far (a flit count of a network)."""
        return (sum(len(source.sent_edges) for source in self.sources.values())
                + sum(len(sink.received) for sink in self.sinks.values()))

    async def reset(self, cycles=2):
        """Reset the block mid-job: the drivers keep running and drop what they hold; what the
        sinks received and the sources sent before is forgotten."""
        await reset_dut(self.dut, cycles)
        for port in (*self.sinks.values(), *self.monitors.values()):
            port.received.clear()
        for source in self.sources.values():
            source.sent_edges.clear()


class PipeBench(StreamBench):
    """A :class:`StreamBench` for a one-in, one-out pipeline: a source on ``inp``, a sink on
    ``out`` and the expected beats in order on ``board`` (an :class:`InOrderScoreboard` named
    ``board_name``)."""

    def __init__(self, dut, component, rng, gap=0.0, stall=0.0, board_name="out"):
        super().__init__(dut, component, rng, ("inp",), ("out",), gap, stall)
        self.board = InOrderScoreboard(board_name, component.out.payload.shape())

    async def drain_within(self, cycles, what, gap=0.0, stall=0.0):
        """Wait until every expected beat is out, allowing ``cycles`` stretched by the pauses
        of ``gap`` and ``stall`` (plus 400), then 3 more edges; under ``--3d`` check that the
        3D build never differed from the 2D build."""
        slowdown = 1.0 / ((1.0 - pause_fraction(gap)) * (1.0 - pause_fraction(stall)))
        await wait_for(self.dut, lambda: len(self.sinks["out"].received) ==
                       len(self.board.expected), int(cycles * slowdown) + 400, what)
        await ClockCycles(self.dut.clk, 3)
        assert_lockstep(self.dut)


def beats_per_cycle(edges):
    """Transfers per cycle over the span of ``edges`` (their edge numbers, in order)."""
    return len(edges) / (edges[-1] - edges[0] + 1)


class JobBench(StreamBench):
    """A :class:`StreamBench` for a block that takes jobs on a ``cmd`` port and has ``busy`` and
    a sticky ``error`` output: the drain, reset and bad-command steps its tests share."""

    async def settle(self, sink, count, max_cycles):
        """Wait for ``count`` beats on ``sink``, then for ``busy`` to fall; under ``--3d`` (the
        DUT is BLOCK_equiv) also check the 3D build never differed from the 2D build."""
        await wait_for(self.dut, lambda: len(self.sinks[sink].received) == count, max_cycles,
                       f"every {sink} beat out")
        await wait_for(self.dut, lambda: not self.dut.busy.value, 400, "block idle")
        await ClockCycles(self.dut.clk, 3)
        assert_lockstep(self.dut)

    async def reset_mid_job(self, output):
        """Reset with the ports running (:meth:`StreamBench.reset`); check nothing survived on
        ``busy`` and the ``output`` stream."""
        await self.reset()
        assert not self.dut.busy.value and not getattr(self.dut, f"{output}__valid").value, (
            "state survived the reset")

    def comparisons(self):
        """``(sink, fields, expected)`` for each output :meth:`check` compares (set by the
        subclass): the sink's name, the payload fields in the order of the expected tuples,
        and the expected beats as such tuples."""
        raise NotImplementedError

    def check(self):
        """Every output's beats are exactly its expected ones, in order, compared by the
        in-order scoreboard as payload bits; ``error`` stayed low."""
        for sink, fields, expected in self.comparisons():
            self.check_output(sink, expected, fields)
        assert not self.dut.error.value, "error set by valid jobs"

    async def reject_commands(self, good, changes):
        """Send ``good`` with each of ``changes`` applied: every one must set ``error`` and
        leave the block idle (the command is dropped)."""
        for change in changes:
            self.sources["cmd"].send({**good, **change})
            await wait_for(self.dut, lambda: self.sources["cmd"].idle, 50, "bad command taken")
            await ClockCycles(self.dut.clk, 3)
            assert self.dut.error.value == 1 and not self.dut.busy.value, (
                f"{change} not rejected")


class InOrderScoreboard:
    """The one in-order scoreboard: expected payloads, in order, against what a sink received
    (a :class:`StreamSink` or a buffered sink), compared as payload bits; the first difference
    is reported decoded.

    Parameters
    ----------
    name : str
        Used in failure messages.
    layout : amaranth.lib.data.Layout
        The stream's payload layout.
    """

    def __init__(self, name, layout):
        self.name = name
        self.codec = codec(layout)
        self.expected = []

    def expect_payload(self, payload):
        """Append one expected beat (a dict for the layout)."""
        self.expected.append(self.codec.encode(payload))

    def expect(self, data, last):
        """Append one expected beat of a ``{data, last}`` layout."""
        self.expect_payload({"data": [int(x) for x in data], "last": int(last)})

    def check(self, sink):
        """Assert the beats ``sink`` received equal the expected ones exactly, in order."""
        if hasattr(sink, "received_bits"):
            got = [bits for _, bits in sink.received_bits]
        else:
            got = [self.codec.encode(payload) for _, payload in sink.received]
        assert len(got) == len(self.expected), (
            f"{self.name}: received {len(got)} beats, expected {len(self.expected)}")
        for index, (have, want) in enumerate(zip(got, self.expected)):
            assert have == want, (f"{self.name}: beat {index}: got {self.codec.decode(have)}, "
                                  f"expected {self.codec.decode(want)}")


async def wait_for(dut, condition, max_cycles, what):
    """Wait until ``condition()`` holds, failing with ``what`` after ``max_cycles`` (deadlock)."""
    for _ in range(max_cycles):
        if condition():
            return
        await RisingEdge(dut.clk)
    assert condition(), f"deadlock or lost data: {what} not reached within {max_cycles} cycles"
