"""The buffered harness: stimulus, expected responses and the comparison on the simulator side.

A per-cycle bench (:mod:`tb.streams`) wakes Python on every clock edge, and that wake-up, not the
design, bounds its speed (a 4x4 array runs about 4M cycles/s in a bare Verilator loop and about
35k under such a bench). This harness moves the per-cycle work into hardware around the block,
so Python wakes once per *window* of ``window`` cycles:

* :class:`BufferedHarness` (Amaranth, test-only, never synthesized) wraps a block. Every input
  stream is fed from two stimulus banks of ``2*window`` beats; every output stream is compared,
  transfer by transfer, with two banks of expected beats (the golden model's, loaded by Python);
  a bank is loaded a whole bank at a time. Valid gaps and ready stalls come from per-window pause
  masks; every transfer is recorded as one bit of a per-window mask (so Python knows its edge);
  a protocol checker watches every output stream.
* :class:`BufferedBench` (cocotb) is the Python side: ``send`` on a source and ``expect`` on a
  sink, ``sent_edges`` / ``received_edges`` back, one exchange per window.

Why banks that are input ports: Amaranth's Verilog copies every register through a ``$next``
variable each cycle, so a model holding thousands of stored beats pays for all of them on every
edge. The bench writes a bank's port only while the bank is empty, so the port *is* the storage;
the harness keeps only counts, indexes and masks, and reads a beat with a case mux.

Ports of the wrapper (module ``<block>_buffered``): the block's plain ports unchanged; ``window``
(in), toggled by the bench once per window: the edge after a toggle (the *window edge*) takes
the loads and the masks and closes the window's masks; ``status`` (out, :func:`status_layout`),
read once per window. Per input stream ``P`` (payload width w) and per output stream ``Q``:
``P__bank0``/``P__bank1`` and ``Q__expect0``/``Q__expect1`` (2*window beats, beat i at bits
[i*w, (i+1)*w)), ``P__load_count`` / ``Q__expect_count`` (beats put in the next bank at the
window edge, 0 for none), ``P__gaps`` / ``Q__stalls`` (bit j pauses the j-th cycle of the
window), ``X__fires`` (out: bit j set when a transfer happened on the j-th edge of the last
closed window), ``Q__mismatch_got`` and ``Q__mismatch_index`` (out: the first wrong payload and
its beat number).

Reset: the harness resets with the block; a bench does not resume across a reset (the per-cycle
benches test reset).

Icarus, and Verilator where it measures speed (``flows.sim``), run module
``<block>_buffered_clocked`` (:func:`clocked_verilog`): the wrapper with its clock made inside
the Verilog (``always #5``), so that no edge costs the simulator a call into cocotb. With the
GPI clock, each of the two edges per cycle was a VPI write and a callback: on the 4x4 systolic
array those, not the design or Python, bounded the harness's speed. Amaranth cannot express a
delay, hence the few lines of Verilog written here.
"""

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from cocotb.triggers import FallingEdge, Timer

from tb.codec import codec
from tb.streams import (CLOCK_PERIOD_NS, ProtocolError, Worker, bit_string, edge_now, pauses,
                        read_bits)

__all__ = ["WINDOW", "BufferedHarness", "BufferedBench", "stream_ports", "status_layout",
           "harness_window", "CLOCKED", "clocked_verilog"]

# Cycles between the bench's wake-ups: the per-wake Python cost is spread over this many cycles.
WINDOW = 64
COUNTER_WIDTH = 32
# Amaranth numbers the bits of a top module's inputs with 16 bits: all of them together stay
# below 65536. The banks (4 * window beats per stream) take nearly all.
INPUT_BITS = 60000


# The suffix of the module that gives the harness its clock (clocked_verilog).
CLOCKED = "_clocked"


def clocked_verilog(top, ports):
    """Verilog of module ``top + CLOCKED``: ``top`` (ports ``ports``, as
    ``flows.verilog.port_list`` gives them) with every port passed through but ``clk``, which
    it drives itself: low from time 0, toggled every half :data:`CLOCK_PERIOD_NS` (the edges of
    the GPI clock ``tb.streams.start_clock`` starts at time 0); ``clk`` is an output, so
    benches still wait on its edges, and the constant output ``clock_inside`` tells
    ``start_clock`` not to drive it."""
    def declaration(port):
        width = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
        return f"  {'input' if port['direction'] == 'in' else 'output'} {width}{port['name']};"
    names = [port["name"] for port in ports]
    half = CLOCK_PERIOD_NS / 2
    lines = ["`timescale 1ns/1ps",
             f"module {top}{CLOCKED}({', '.join(names + ['clock_inside'])});",
             "  output reg clk;",
             *(declaration(port) for port in ports if port["name"] != "clk"),
             "  output clock_inside;",
             "  assign clock_inside = 1'b1;",
             "  initial clk = 1'b0;",
             f"  always #{half:g} clk = ~clk;",
             f"  {top} harness({', '.join(f'.{name}({name})' for name in names)});",
             "endmodule"]
    return "\n".join(lines) + "\n"


def harness_window(component):
    """The window of ``component``'s harness: :data:`WINDOW`, or fewer cycles when its banks
    would pass :data:`INPUT_BITS` (very wide streams); at least 2."""
    streams, _ = stream_ports(component)
    beat_bits = sum(len(_payload(port)) for _, port, _ in streams)
    window = min(WINDOW, INPUT_BITS // (4 * beat_bits))
    if window < 2:
        raise ValueError(f"streams of {beat_bits} bits per beat in all: too wide for the "
                         "buffered harness (use the per-cycle bench)")
    return window


def stream_ports(component):
    """``(name, handle, produces)`` of every stream of ``component`` (arrays of streams as
    ``name__<i>``), and ``(name, member)`` of its plain ports."""
    streams, plain = [], []
    for name, member in component.signature.members.items():
        if member.is_port:
            if member.dimensions:
                raise TypeError(f"port {name}: arrays of plain ports are not wrapped")
            plain.append((name, member))
            continue
        if set(member.signature.members) != {"valid", "ready", "payload"}:
            raise TypeError(f"port {name}: only plain ports and streams are wrapped")
        produces = member.flow == Out
        handle = getattr(component, name)
        if member.dimensions:
            streams += [(f"{name}__{i}", handle[i], produces)
                        for i in range(member.dimensions[0])]
        else:
            streams.append((name, handle, produces))
    return streams, plain


def status_layout(streams, window):
    """The layout of the one ``status`` output the bench reads per window: ``window_cycles``
    (edges in the last closed window, always ``window`` unless the bench woke late), sticky
    ``overflow`` (some window was longer than ``window``); per stream its handshake mirrors
    (``X__valid``, ``X__ready``, read so that X or Z fails loudly) and ``X__free`` (the next bank
    to load is empty); per output stream sticky ``Q__protocol_error`` (valid fell or the payload
    changed before the transfer), sticky ``Q__mismatch`` (a payload differed from the expected
    one), sticky ``Q__unexpected`` (a transfer with no expected beat left) and ``Q__compared``
    (transfers compared so far)."""
    fields = {"window_cycles": range(window + 2), "overflow": 1}
    for name, _, produces in streams:
        fields[f"{name}__valid"] = 1
        fields[f"{name}__ready"] = 1
        fields[f"{name}__free"] = 1
        if produces:
            fields[f"{name}__protocol_error"] = 1
            fields[f"{name}__mismatch"] = 1
            fields[f"{name}__unexpected"] = 1
            fields[f"{name}__compared"] = COUNTER_WIDTH
    return data.StructLayout(fields)


def _payload(port):
    return port.payload.as_value() if hasattr(port.payload, "as_value") else port.payload


class _Banks:
    """Two banks of ``depth`` beats held in input ports, emptied in order: ``current`` is the
    beat at the head, ``take`` drops it."""

    def __init__(self, m, tick, ports, load_count, width, depth, name):
        self.count = [Signal(range(depth + 1), name=f"{name}_count{b}") for b in range(2)]
        self.fill = Signal(name=f"{name}_fill")      # the bank the next load goes to
        self.read = Signal(name=f"{name}_read")      # the bank at the head
        self.index = Signal(range(depth), name=f"{name}_index")
        self.take = Signal(name=f"{name}_take")
        beats = [Array(bank[i * width:(i + 1) * width] for i in range(depth)) for bank in ports]
        self.current = Mux(self.read, beats[1][self.index], beats[0][self.index])
        count_read = Mux(self.read, self.count[1], self.count[0])
        count_other = Mux(self.read, self.count[0], self.count[1])
        self.free = Mux(self.fill, self.count[1], self.count[0]) == 0
        self.last_of_bank = self.index + 1 == count_read
        self.present = count_read != 0
        # After a take: is there a next beat (this bank or the other)?
        self.after_take = ~self.last_of_bank | (count_other != 0)
        with m.If(self.take):
            with m.If(self.last_of_bank):
                m.d.sync += [self.index.eq(0), self.read.eq(~self.read)]
                for b in range(2):
                    with m.If(self.read == b):
                        m.d.sync += self.count[b].eq(0)
            with m.Else():
                m.d.sync += self.index.eq(self.index + 1)
        # Loads come last: the bench loads only a free bank, which no take touches.
        with m.If(tick & (load_count != 0)):
            m.d.sync += self.fill.eq(~self.fill)
            for b in range(2):
                with m.If(self.fill == b):
                    m.d.sync += self.count[b].eq(load_count)


class BufferedHarness(wiring.Component):
    """Wraps ``dut`` (a block's component) with stimulus banks, expected-response banks and
    comparators (module doc)."""

    def __init__(self, dut, window=None):
        window = harness_window(dut) if window is None else window
        self.dut, self.cycles = dut, window
        self.streams, self.plain = stream_ports(dut)
        self._status_fields = {name for name, _ in status_layout(self.streams, window)}
        depth = 2 * window
        members = {"window": In(1), "status": Out(status_layout(self.streams, window))}
        for name, member in self.plain:
            members[name] = member
        for name, port, produces in self.streams:
            width = len(_payload(port))
            banks, count, pause = (("expect", "expect_count", "stalls") if produces
                                   else ("bank", "load_count", "gaps"))
            members[f"{name}__{banks}0"] = In(depth * width)
            members[f"{name}__{banks}1"] = In(depth * width)
            members[f"{name}__{count}"] = In(range(depth + 1))
            members[f"{name}__{pause}"] = In(window)
            members[f"{name}__fires"] = Out(window)
            if produces:
                members[f"{name}__mismatch_got"] = Out(width)
                members[f"{name}__mismatch_index"] = Out(COUNTER_WIDTH)
        super().__init__(members)
        if hasattr(dut, "shared_submodule"):
            # The layer's chiplets stay one Verilog module here too, as in the layer's own
            # Verilog (flows.verilog.convert): converted one by one, each costs about 5.5 s
            # and Verilator gets a module per leaf.
            self.shared_submodule, self.instance_shared = (dut.shared_submodule,
                                                           dut.instance_shared)

    def _port(self, name):
        return getattr(self.status, name) if name in self._status_fields else \
            getattr(self, name)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        seen = Signal()
        tick = Signal()
        m.d.sync += seen.eq(self.window)
        m.d.comb += tick.eq(self.window != seen)
        # Edges per window (the masks assume exactly `window`), counted from the first toggle.
        cycles = Signal(range(self.cycles + 2))
        started = Signal()
        with m.If(tick):
            m.d.sync += [self.status.window_cycles.eq(cycles), cycles.eq(1), started.eq(1)]
        with m.Elif(cycles <= self.cycles):
            m.d.sync += cycles.eq(cycles + 1)
        with m.Elif(started):
            m.d.sync += self.status.overflow.eq(1)
        for name, member in self.plain:
            inner = getattr(self.dut, name)
            if member.flow == In:
                m.d.comb += inner.eq(self._port(name))
            else:
                m.d.comb += self._port(name).eq(inner)
        for name, port, produces in self.streams:
            m.d.comb += [self._port(f"{name}__valid").eq(port.valid),
                         self._port(f"{name}__ready").eq(port.ready)]
            (self._sink if produces else self._source)(m, tick, name, port)
        return m

    def _pause_bit(self, m, tick, mask, name):
        """This cycle's bit of the window's pause mask (a shift register loaded at the tick)."""
        shifter = Signal(self.cycles, name=f"{name}_pauses")
        m.d.sync += shifter.eq(Mux(tick, mask, shifter) >> 1)
        return Mux(tick, mask[0], shifter[0])

    def _fires(self, m, tick, fire, name):
        """Record one bit per edge (oldest at bit 0 once the window is full); the window edge
        closes the mask."""
        filling = Signal(self.cycles, name=f"{name}_filling")
        shifted = Cat(filling[1:], fire)
        with m.If(tick):
            m.d.sync += [self._port(f"{name}__fires").eq(filling),
                         filling.eq(Cat(C(0, self.cycles - 1), fire))]
        with m.Else():
            m.d.sync += filling.eq(shifted)

    def _banks(self, m, tick, name, port, banks, count):
        width = len(_payload(port))
        return _Banks(m, tick, [self._port(f"{name}__{banks}{b}") for b in range(2)],
                      self._port(f"{name}__{count}"), width, 2 * self.cycles, name)

    def _source(self, m, tick, name, port):
        stimulus = self._banks(m, tick, name, port, "bank", "load_count")
        gap = self._pause_bit(m, tick, self._port(f"{name}__gaps"), name)
        valid = Signal(name=f"{name}_valid_reg")
        fire = valid & port.ready
        m.d.comb += [port.valid.eq(valid), port.payload.eq(stimulus.current),
                     stimulus.take.eq(fire), self._port(f"{name}__free").eq(stimulus.free)]
        # valid rises when a beat is there and the gap mask allows; it falls only after a transfer.
        available = Mux(fire, stimulus.after_take, stimulus.present)
        m.d.sync += valid.eq((valid & ~port.ready) | (available & ~gap))
        self._fires(m, tick, fire, name)

    def _sink(self, m, tick, name, port):
        expected = self._banks(m, tick, name, port, "expect", "expect_count")
        stall = self._pause_bit(m, tick, self._port(f"{name}__stalls"), name)
        payload = _payload(port)
        fire = port.valid & port.ready
        m.d.comb += [port.ready.eq(~stall), self._port(f"{name}__free").eq(expected.free),
                     expected.take.eq(fire & expected.present)]
        self._fires(m, tick, fire, name)
        # The scoreboard: every transfer against the next expected beat, in order.
        compared = self._port(f"{name}__compared")
        mismatch = self._port(f"{name}__mismatch")
        with m.If(fire):
            m.d.sync += compared.eq(compared + 1)
            with m.If(~expected.present):
                m.d.sync += self._port(f"{name}__unexpected").eq(1)
            with m.Elif((payload != expected.current) & ~mismatch):
                m.d.sync += [mismatch.eq(1), self._port(f"{name}__mismatch_got").eq(payload),
                             self._port(f"{name}__mismatch_index").eq(compared)]
        # Protocol checker: a beat offered and not taken must be offered again, unchanged.
        held = Signal(name=f"{name}_held")
        held_payload = Signal(len(payload), name=f"{name}_held_payload")
        with m.If(held & (~port.valid | (payload != held_payload))):
            m.d.sync += self._port(f"{name}__protocol_error").eq(1)
        m.d.sync += [held.eq(port.valid & ~port.ready), held_payload.eq(payload)]


def _set_bits(bits, first_edge):
    """Edges of the set bits of a window's fire mask, given as its bit string, most significant
    bit first (bit j is edge ``first_edge + j``). X or Z in it raises."""
    if bits.strip("01"):
        raise ValueError(f"X or Z in a fire mask: {bits}")
    return [first_edge + j for j, bit in enumerate(reversed(bits)) if bit == "1"]


def _pack(beats, width):
    """``beats`` as one integer, beat i at bits [i*width, (i+1)*width): pairs joined level by
    level (a shift per beat into an ever wider sum costs twice as much on a 128-beat bank)."""
    while len(beats) > 1:
        if len(beats) % 2:
            beats = beats + [0]
        beats = [low | (high << width) for low, high in zip(beats[::2], beats[1::2])]
        width *= 2
    return beats[0] if beats else 0


class _BufferedPort:
    """One stream's banks (stimulus or expected beats), pause mask and fire mask."""

    def __init__(self, dut, name, layout, rng, pause_spec, window, banks, count, pause):
        self.name = name
        self.codec = codec(layout)
        self._pauses = pauses(pause_spec, rng)
        self._pausing = pause_spec not in (0, 0.0)
        self._window = window
        self._dut = dut
        self._queue = []
        self._head = 0
        self._banks = [getattr(dut, f"{name}__{banks}{b}") for b in range(2)]
        self._count = getattr(dut, f"{name}__{count}")
        self._pause = getattr(dut, f"{name}__{pause}")
        self._fires = getattr(dut, f"{name}__fires")
        self._fill = 0          # the bank the next load goes to (as the harness counts)
        self._loaded = 0
        self._count.value = 0
        self._pause.value = 0
        self.edges = []

    def _exchange(self, status, closed_first_edge):
        if closed_first_edge is not None:
            self.edges += _set_bits(bit_string(self._fires), closed_first_edge)
        if self._head < len(self._queue) and getattr(status, f"{self.name}__free"):
            beats = self._queue[self._head:self._head + 2 * self._window]
            self._head += len(beats)
            self._banks[self._fill].value = _pack(beats, self.codec.width)
            self._fill ^= 1
            self._count.value = self._loaded = len(beats)
        elif self._loaded:
            self._count.value = self._loaded = 0
        if self._pausing:
            self._pause.value = sum(1 << j for j in range(self._window) if self._pauses.next())


class BufferedSource(_BufferedPort):
    """``send`` beats; ``sent_edges`` holds the edge of every transfer (a window or two late)."""

    def __init__(self, dut, name, layout, rng, gap, window):
        super().__init__(dut, name, layout, rng, gap, window, "bank", "load_count", "gaps")
        self.sent_edges = self.edges

    def send(self, payload):
        """Queue one beat (a dict for the layout)."""
        self._queue.append(self.codec.encode(payload))

    @property
    def idle(self):
        return len(self.sent_edges) == len(self._queue)


class BufferedSink(_BufferedPort):
    """``expect`` beats (compared in the harness, in order); ``received_edges`` holds the edge
    of every transfer."""

    def __init__(self, dut, name, layout, rng, stall, window):
        super().__init__(dut, name, layout, rng, stall, window, "expect", "expect_count",
                         "stalls")
        self.received_edges = self.edges
        self.compared = 0

    def expect(self, payload):
        """Queue one expected beat (a dict for the layout)."""
        self._queue.append(self.codec.encode(payload))

    @property
    def expected(self):
        return len(self._queue)

    def exchange(self, status, closed_first_edge):
        if getattr(status, f"{self.name}__protocol_error"):
            raise ProtocolError(f"{self.name}: valid fell or the payload changed before the "
                                "transfer (the harness's checker)")
        if getattr(status, f"{self.name}__mismatch"):
            index = read_bits(getattr(self._dut, f"{self.name}__mismatch_index"))
            got = self.codec.decode(read_bits(getattr(self._dut, f"{self.name}__mismatch_got")))
            want = self.codec.decode(self._queue[index])
            raise AssertionError(f"{self.name} beat {index}: got {got}, expected {want}")
        if getattr(status, f"{self.name}__unexpected"):
            raise AssertionError(f"{self.name}: more beats than the {len(self._queue)} expected "
                                 "(a duplicated or invented beat)")
        self.compared = getattr(status, f"{self.name}__compared")
        self._exchange(status, closed_first_edge)


class BufferedBench(Worker):
    """The Python side of :class:`BufferedHarness` (module doc): a :class:`BufferedSource` per
    input stream and a :class:`BufferedSink` per output stream of ``component``."""

    def __init__(self, dut, component, rng, gap=0.0, stall=0.0, window=None):
        window = harness_window(component) if window is None else window
        self.dut, self.window = dut, window
        streams, _ = stream_ports(component)
        layouts = {name: port.payload.shape() for name, port, _ in streams}
        self.sources = {name: BufferedSource(dut, name, layouts[name], rng, gap, window)
                        for name, _, produces in streams if not produces}
        self.sinks = {name: BufferedSink(dut, name, layouts[name], rng, stall, window)
                      for name, _, produces in streams if produces}
        self._status = codec(status_layout(streams, window))
        self._toggle = 0
        self._window_edges = []     # first edge of every window opened so far
        dut.window.value = 0
        self.failure = None

    async def _run(self):
        await FallingEdge(self.dut.clk)     # wake mid-cycle: no race with the rising edge
        while True:
            try:
                self._exchange()
            except AssertionError as failure:
                # Kept and raised by the next wait_for/finish: the test fails there, at a point
                # a test of the harness itself can catch it.
                self.failure = failure
                return
            await Timer(self.window * CLOCK_PERIOD_NS, unit="ns")

    def _raise_failure(self):
        if self.failure is not None:
            raise self.failure

    def _exchange(self):
        # One read of every count and flag; X or Z on a handshake mirror raises here.
        try:
            status = self._status.decode(read_bits(self.dut.status))
        except ValueError:
            raise ProtocolError(f"X or Z on a handshake after reset: status "
                                f"{self.dut.status.value}") from None
        if status.overflow:
            raise AssertionError("buffered harness overflow: the bench missed a window")
        # The masks read now were closed at the last window edge: they cover the window before.
        closed = self._window_edges[-2] if len(self._window_edges) >= 2 else None
        if closed is not None:
            assert status.window_cycles == self.window, "a window of the wrong length"
        for source in self.sources.values():
            source._exchange(status, closed)
        for sink in self.sinks.values():
            sink.exchange(status, closed)
        # The edge after this wake (mid-cycle) is the next window's first edge.
        self._window_edges.append(edge_now())
        self._toggle ^= 1
        self.dut.window.value = self._toggle

    async def wait_for(self, condition, max_cycles, what):
        """Wait (window by window) until ``condition()`` holds; fail after ``max_cycles``."""
        for _ in range(0, max_cycles + 3 * self.window, self.window):
            self._raise_failure()
            if condition():
                return
            await Timer(self.window * CLOCK_PERIOD_NS, unit="ns")
        self._raise_failure()
        assert condition(), f"deadlock or lost data: {what} not reached within {max_cycles} cycles"

    async def finish(self, max_cycles, quiet_cycles):
        """Wait until every sink compared all its expected beats, then ``quiet_cycles`` more (a
        late extra beat fails as unexpected); assert every sink got exactly what it expected."""
        sinks = list(self.sinks.values())
        try:
            await self.wait_for(lambda: all(s.compared >= s.expected for s in sinks),
                                max_cycles, "every expected beat out")
        except AssertionError:
            if self.failure is not None:
                raise
        await Timer((quiet_cycles + 2 * self.window) * CLOCK_PERIOD_NS, unit="ns")
        self._raise_failure()
        for sink in sinks:
            assert sink.compared == sink.expected, (
                f"{sink.name}: {sink.compared} beats, expected {sink.expected} (deadlock or "
                f"lost data within {max_cycles} cycles)")
            assert len(sink.received_edges) == sink.compared
