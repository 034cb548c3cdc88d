"""Helpers shared by pipelined blocks: stall-able registers, the output queue, a skid slice, a
register slice, a registered-head FIFO, lane layouts."""


from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.utils import ceil_log2
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden.fixed import signed_limits

__all__ = ["StallPipe", "OutputQueue", "OutputRegister", "SkidSlice", "RegisterSlice",
           "RegisteredHeadFIFO", "OUT_FIFO_DEPTH", "LUT_RAM_MARK", "lanes_layout", "saturate",
           "select", "or_tree", "sum_tree", "max_tree", "max_all_pairs", "thermometer_max",
           "thermometer_value", "leading_one", "leading_one_tree", "requant", "requant_shift",
           "requant_clamp", "requant_shift_clamp", "requant_round"]

# Depth of an output queue. Two entries suffice for full throughput: a pipeline writes at most
# one beat per cycle and a ready consumer reads one per cycle, so the level never exceeds one.
OUT_FIFO_DEPTH = 2


# A memory attribute: the ECP5 flow maps a memory carrying it to LUT RAM
# (flows.synth.LUT_RAM_HINT) where Yosys would pick block RAM by its depth, for the clock rate
# (a DP16KD's read leaves it 5.8 ns after the clock). moegen's own: other tools ignore it.
LUT_RAM_MARK = "moegen_lut_ram"


def lanes_layout(count, width, *, is_signed=True):
    """Stream payload of ``count`` lanes of ``width`` bits plus a ``last`` flag.

    Lane ``i`` occupies bits ``[i*width, (i+1)*width)``; ``last`` is the top bit.
    """
    shape = signed(width) if is_signed else width
    return data.StructLayout({"data": data.ArrayLayout(shape, count), "last": 1})


def leading_one(m, value, name):
    """Index of the highest set bit of ``value`` (0 when zero), as a priority chain (the
    normalizations of the floating-point and LogFMT datapaths)."""
    index = Signal(range(max(2, len(value))), name=name)
    for bit in range(len(value)):          # later assignments win: the highest bit
        with m.If(value[bit]):
            m.d.comb += index.eq(bit)
    return index


def leading_one_tree(m, value, name):
    """:func:`leading_one` as a balanced tree: halves at a power of two, the upper one's index
    (with its any-bit as the top bit) where it has a set bit, else the lower one's; depth
    ceil(log2 n) multiplexer levels instead of a priority chain of n (the floating-point
    loops, on the clock's critical path)."""
    def search(bits):
        """``(any bit set, index of the highest, ceil(log2 len) bits)``."""
        if len(bits) == 1:
            return bits[0], Const(0, 0)
        half = 1 << (ceil_log2(len(bits)) - 1)
        low_any, low = search(bits[:half])
        high_any, high = search(bits[half:])
        width = ceil_log2(half)
        return low_any | high_any, Cat(Mux(high_any, high, low)[:width] if width else Const(0, 0),
                                       high_any)

    index = Signal(range(max(2, len(value))), name=name)
    m.d.comb += index.eq(search(value)[1])
    return index


def max_tree(m, values, name):
    """The largest of ``values`` (one shape) through named pairwise stages, depth
    ceil(log2 n). Signals, not a nested expression: ``Mux(x > y, x, y)`` reads x twice, so a
    nested one doubles at every level (Amaranth's checks then take minutes)."""
    shape = Value.cast(values[0]).shape()
    level = 0
    while len(values) > 1:
        merged = []
        for i in range(0, len(values) - 1, 2):
            stage = Signal(shape, name=f"{name}_{level}_{i // 2}")
            left, right = values[i], values[i + 1]
            m.d.comb += stage.eq(Mux(left > right, left, right))
            merged.append(stage)
        if len(values) % 2:
            merged.append(values[-1])
        values, level = merged, level + 1
    return values[0]


def max_all_pairs(m, values, name, cut=None):
    """The largest of ``values`` (one shape) with every pair compared side by side, then the
    winner selected (of equal values the first): one level of comparators where
    :func:`max_tree` chains ceil(log2 n) compare-and-select levels, for n(n-1) of them (each
    ordered pair; one per pair would do, the other its complement)
    (clock rate: ``fp_dot``'s largest product exponents, a front stage's critical path).
    ``cut``: a pipeline's register between the comparisons and the select (a list in: each
    value's wins flag, then the values; the list registered out), or none."""
    if len(values) == 1:
        return values[0] if cut is None else cut([values[0]])[0]
    shape = Value.cast(values[0]).shape()
    flags = []
    for i, value in enumerate(values):
        # Against a value before it a tie loses, so exactly one value wins.
        wins = Signal(name=f"{name}_wins{i}")
        m.d.comb += wins.eq(Cat(*(value > other if j < i else value >= other
                                  for j, other in enumerate(values) if j != i)).all())
        flags.append(wins)
    if cut is not None:
        registered = cut(flags + list(values))
        flags, values = registered[:len(flags)], registered[len(flags):]
    picked = [Mux(wins, Value.cast(value).as_unsigned(), 0) for wins, value in zip(flags, values)]
    largest = Signal(shape, name=name)
    m.d.comb += largest.eq(or_tree(picked))
    return largest


def thermometer_max(values, bounds=None):
    """The thermometer code of the largest of the unsigned ``values``: bit t-1 is 1 where some
    value is at least t, for t = 1 .. the largest value possible. ``bounds[i]``, when given,
    is the most ``values[i]`` can be (a value that cannot reach t is left out of bit t-1).
    For small values a compare with a constant and an OR per bit are shallower than a tree of
    compare-and-select stages (clock rate: the PMU's largest lane rank)."""
    bounds = bounds or [(1 << len(Value.cast(v))) - 1 for v in values]
    return [or_tree([v >= t for v, bound in zip(values, bounds) if bound >= t])
            for t in range(1, max(bounds) + 1)]


def thermometer_value(bits, width):
    """The ``width``-bit number a thermometer code (``thermometer_max``) stands for: its count
    of ones, as the position of its highest one."""
    bits = list(bits) + [Const(0)]
    ones = [Const(0)] * width
    for t in range(1, len(bits)):
        highest = bits[t - 1] & ~bits[t]
        for k in range(width):
            if t >> k & 1:
                ones[k] = ones[k] | highest
    return Cat(*ones)


def saturate(value, width):
    """``value`` clamped to the signed ``width``-bit range (an expression)."""
    low, high = signed_limits(width)
    return Mux(value > high, high, Mux(value < low, low, value))


def requant(m, value, shift, width, name):
    """``golden.ndp.requant`` in hardware: round half up by an arithmetic right shift of
    ``shift`` (an int, or a Value: a run-time shift), then saturate to signed ``width`` bits.
    Returns the ``width``-bit signal ``name``.

    Shaped for the clock rate: floor((v + 2^(s-1)) / 2^s) = floor((floor(2v / 2^s) + 1) / 2)
    for every s >= 0, so the shift comes first and the rounding is an increment (no run-time
    decoded half feeding an adder before the shifter), and the range check reads the top bits
    (all equal) instead of comparing with two constants.
    """
    return requant_round(m, requant_shift(m, value, shift, name), width, name)


def requant_shift(m, value, shift, name):
    """:func:`requant`'s first half: floor(2v / 2^shift), a signed signal (a pipeline may
    register it before :func:`requant_round`)."""
    value = Value.cast(value)
    doubled = Signal(signed(len(value) + (1 if value.shape().signed else 2)),
                     name=f"{name}_doubled")
    m.d.comb += doubled.eq(value << 1)
    shifted = Signal(signed(len(doubled)), name=f"{name}_shifted")
    m.d.comb += shifted.eq(doubled >> shift)
    return shifted


def requant_clamp(m, shifted, width, name):
    """:func:`requant_round`'s clamp alone: ``shifted`` narrowed to ``width + 2`` bits by a
    top-bit check (a pipeline may register it, which leaves :func:`requant_round` only the
    increment and the saturation). A value past that range rounds to one past ``width`` bits
    either way, so it still saturates the same way."""
    narrow = width + 2
    if len(shifted) <= narrow:
        return shifted
    top = shifted[narrow - 1:]
    low, high = signed_limits(narrow)
    clamped = Signal(signed(narrow), name=f"{name}_clamped")
    m.d.comb += clamped.eq(Mux(~top.any() | top.all(), shifted[:narrow],
                               Mux(shifted[-1], low, high)))
    return clamped


def requant_shift_clamp(m, value, shift, width, name):
    """:func:`requant`'s first half for a pipeline that registers it: :func:`requant_shift`
    then :func:`requant_clamp` (``width + 2`` bits); the register goes to
    :func:`requant_round`, whose increment is then all that is left."""
    return requant_clamp(m, requant_shift(m, value, shift, name), width, name)


def requant_round(m, shifted, width, name):
    """:func:`requant`'s second half: (shifted + 1) / 2 rounded down, saturated to signed
    ``width`` bits (the signal ``name``).

    ``shifted`` is first clamped by :func:`requant_clamp` (a no-op on a value already that
    narrow), so the increment is ``width + 2`` bits long instead of the shifted value's."""
    shifted = requant_clamp(m, shifted, width, name)
    rounded = Signal(signed(len(shifted)), name=f"{name}_rounded")
    m.d.comb += rounded.eq((shifted + 1) >> 1)
    out = Signal(signed(width), name=name)
    if len(rounded) <= width:
        m.d.comb += out.eq(rounded)
    else:
        top = rounded[width - 1:]
        low, high = signed_limits(width)
        m.d.comb += out.eq(Mux(~top.any() | top.all(), rounded[:width],
                               Mux(rounded[-1], low, high)))
    return out


def select(index, values):
    """``values[index]`` as an OR of equality-gated terms (0 when ``index`` is out of range).

    Used instead of ``Array`` reads and ``word_select``/``bit_select`` with a variable index:
    the shifts those become made Yosys 0.70's ABC9 (yowasp) exit without a word.
    """
    return or_tree([Mux(index == i, value, 0) for i, value in enumerate(values)])


def or_tree(terms):
    """The OR of ``terms`` as a balanced tree (depth ceil(log2 n)).

    A left-leaning fold of hundreds of terms (a 512-word buffer read through :func:`select`)
    nests deeper than Python's recursion limit in Amaranth's transformers, and is a deeper
    logic cone too.
    """
    return _pairwise(terms, lambda a, b: a | b)


def sum_tree(terms):
    """The sum of ``terms`` as a balanced tree of adders (depth ceil(log2 n)); a left-leaning
    sum chains n - 1 adders."""
    return _pairwise(terms, lambda a, b: a + b)


def _pairwise(terms, combine):
    terms = list(terms)
    while len(terms) > 1:
        terms = [combine(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


class StallPipe:
    """Registers that all move on one enable (a global pipeline stall).

    A systolic array is a fixed-latency pipeline: its schedule is only correct if every stage
    moves together. Rather than putting an `If` around each of thousands of registers, the block
    collects their updates here and emits them under one enable in :meth:`emit`.

    Parameters
    ----------
    enable : Value
        The pipeline advances at a rising edge where ``enable`` is high.
    """

    def __init__(self, enable):
        self.enable = enable
        self._updates = []

    def add(self, *statements):
        """Add updates that happen only when the pipeline advances."""
        self._updates.extend(statements)

    def reg(self, value, name, reset_less=False):
        """A register fed by ``value``; returns the register. ``reset_less``: kept through a
        reset (for a product whose valid flag, reset, travels beside it: a DSP's own output
        register has no reset worth wiring, flows/dsp_pack.py)."""
        register = Signal(value.shape(), name=name, reset_less=reset_less)
        self._updates.append(register.eq(value))
        return register

    def delay(self, value, stages, name, reset_less=False):
        """``value`` delayed by ``stages`` registers (``stages`` may be 0)."""
        for stage in range(stages):
            value = self.reg(value, f"{name}_d{stage}", reset_less)
        return value

    def emit(self, m):
        """Emit every collected update into ``m`` under the enable."""
        with m.If(self.enable):
            m.d.sync += self._updates


class OutputQueue:
    """An output stream served from a small FIFO that a stall-able pipeline writes.

    The FIFO decouples the stream's ``ready`` from the pipeline: ``valid`` is the FIFO's
    ``r_rdy`` (never a function of ``ready``), and the pipeline moves only while the FIFO has a
    free slot (:meth:`stall_pipe`), so a consumer that stalls long enough freezes the pipeline
    with nothing in flight lost. Built with amaranth.lib.fifo.SyncFIFO.

    Parameters
    ----------
    m : Module
        The module the FIFO is added to (submodule ``name``).
    port : stream interface
        The block's output stream (``Out(stream.Signature(...))``).
    depth : int
        FIFO entries.
    name : str
        Submodule name.
    overflow : Signal, optional
        Driven high in a cycle where a beat is pushed into a full FIFO (and so lost), or where
        ``space`` is not the FIFO's ``w_rdy``: a probe for the formal harness, which asserts it
        never rises.
    registered_space : bool
        Keep ``space`` in a register of its own (below).

    Members
    -------
    fifo : SyncFIFO
    space : Value
        A beat can be written this cycle: the FIFO's ``w_rdy`` (its level is not the depth).
        With ``registered_space`` it is a register loaded with what ``w_rdy`` will be after
        each edge, so equal to ``w_rdy`` in every cycle (reset included: 1, the FIFO empty),
        and the enable of a whole pipeline leaves a flip-flop instead of a compare on the
        level's flip-flops (clock rate: that hop and the enable's fanout across the die were
        ``systolic_tile``'s critical path at 139 MHz).
    level : Value
        Beats held (the FIFO's ``w_level``).
    """

    def __init__(self, m, port, *, depth=OUT_FIFO_DEPTH, name="out_fifo", overflow=None,
                 registered_space=False):
        self.fifo = fifo = SyncFIFO(width=len(port.payload.as_value()), depth=depth)
        m.submodules[name] = fifo
        self._port = port
        self._overflow = overflow
        self.level = fifo.w_level
        self.space = fifo.w_rdy
        if registered_space:
            self.space = Signal(init=1, name=f"{name}_space")
            level_next = (fifo.w_level + (fifo.w_en & fifo.w_rdy).as_unsigned()
                          - (fifo.r_en & fifo.r_rdy).as_unsigned())
            m.d.sync += self.space.eq(level_next != depth)

    def stall_pipe(self, enable=None):
        """The pipeline feeding the queue: it advances on ``enable`` (by default: a free slot)."""
        return StallPipe(self.space if enable is None else enable)

    def push(self, m, valid, payload):
        """Write ``payload`` (bits) in the cycles where ``valid`` is high, and serve the port."""
        port, fifo = self._port, self.fifo
        if self._overflow is not None:   # (and `space` is the FIFO's w_rdy)
            m.d.comb += self._overflow.eq((valid & ~fifo.w_rdy) | (self.space != fifo.w_rdy))
        m.d.comb += [fifo.w_en.eq(valid), fifo.w_data.eq(payload),
                     port.valid.eq(fifo.r_rdy), port.payload.eq(fifo.r_data),
                     fifo.r_en.eq(port.ready)]


class OutputRegister:
    """An output stream for a consumer that takes every beat: one register, no queue.

    The stand-in for :class:`OutputQueue` inside a block whose parent ties the stream's
    ``ready`` high (``expert_chiplet``'s tile): a beat written at an edge is on the port from
    that edge, as from the queue's head, so the timing is the queue's; the pipeline never
    stalls, so none of its registers needs an enable, and ``ready`` is not read. While
    ``valid`` is low the payload is not a beat (the pipeline's row of the cycle before).
    """

    def __init__(self, m, port, overflow=None):
        self._port = port
        if overflow is not None:         # nothing is ever lost: the probe stays low
            m.d.comb += overflow.eq(0)

    def stall_pipe(self):
        """The pipeline feeding the register: it advances at every edge."""
        return StallPipe(Const(1))

    def push(self, m, valid, payload):
        """Put ``payload`` (bits) on the port from the edge that ends a cycle where ``valid``
        is high."""
        port = self._port
        held = Signal(len(port.payload.as_value()), name="out_beat", reset_less=True)
        m.d.sync += [port.valid.eq(valid), held.eq(payload)]
        m.d.comb += port.payload.eq(held)


class SkidSlice(wiring.Component):
    """A stream slice that registers only ``ready``: a flit passes straight through while the
    slice is empty (no added latency, one flit per cycle); one that arrives while the receiver
    stalls is kept, and ``i.ready`` is low from the next edge until it has left. The sender's
    ready is then a register, so a chain of stages never carries a ready combinationally from
    its end to its start (the clock rate of a tree of switches). Written by hand:
    amaranth.lib.stream has no register slice, and a FIFO would add a cycle of latency.

    Members
    -------
    i : In(stream.Signature(shape))
    o : Out(stream.Signature(shape))
        Reset: empty (``i.ready`` high, ``o.valid`` = ``i.valid``).

    Attributes
    ----------
    full, kept : Signal
        The slice's registers, for a parent to read: whether it keeps a flit, and that flit
        (a stale value while ``full`` is low). ``i.ready`` is ``~full``.
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})
        self.full = Signal(name="full")
        self.kept = Signal.like(self.i.payload, name="kept")

    def elaborate(self, platform):
        m = Module()
        full, kept = self.full, self.kept
        m.d.comb += [self.i.ready.eq(~full), self.o.valid.eq(full | self.i.valid),
                     self.o.payload.eq(Mux(full, kept, self.i.payload))]
        # While empty, the slice copies every offered payload (its enable is then a register,
        # not the receiver's ready); it keeps the one the receiver did not take.
        with m.If(full):
            with m.If(self.o.ready):
                m.d.sync += full.eq(0)
        with m.Else():
            m.d.sync += [kept.eq(self.i.payload), full.eq(self.i.valid & ~self.o.ready)]
        return m


class RegisterSlice(wiring.Component):
    """A stream slice that registers ``valid`` and the payload: one edge of latency, one flit
    per cycle (it is refilled at the edge its flit leaves). The receiver's inputs then come
    from flip-flops, so the logic that computes a flit and the wire to the receiver are in
    different cycles. ``i.ready`` is ``~o.valid | o.ready`` (combinational from the receiver).
    Written by hand: amaranth.lib.stream has no register slice.

    Members
    -------
    i : In(stream.Signature(shape))
    o : Out(stream.Signature(shape))
        Reset: empty (``o.valid`` low); the payload register keeps its value (it is read only
        with ``o.valid``).
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        payload = Signal(self._shape, name="held", reset_less=True)
        m.d.comb += [self.i.ready.eq(~self.o.valid | self.o.ready), self.o.payload.eq(payload)]
        with m.If(self.i.ready):
            m.d.sync += [self.o.valid.eq(self.i.valid), payload.eq(self.i.payload)]
        return m


class RegisteredHeadFIFO(wiring.Component):
    """A queue with the timing and ports of amaranth.lib.fifo.SyncFIFO whose head is a
    register: an entry becomes the head at the edge the previous one leaves (``r_en``) or, if
    it is written after that, at its write's edge (SyncFIFOBuffered, also with a registered
    head, takes an edge more). The entries behind the head wait in a ring whose asynchronous
    read feeds only the head register, so neither the head's readers nor the writer's logic
    pass through a memory port in the cycle they are computed. Written by hand:
    amaranth.lib.fifo has no registered-head FIFO of SyncFIFO's timing.

    Parameters
    ----------
    width : int
        Bits per entry.
    depth : int
        Entries held, the head included (at least 2).

    Members
    -------
    w_data : In(width)
    w_en : In(1)
        An entry is written at the edge if ``w_rdy``; a write while ``w_rdy`` is low is ignored.
    w_rdy : Out(1)
        Fewer than ``depth`` entries are held (as in SyncFIFO, the head's leaving at the same
        edge is not counted, so ``w_rdy`` never depends on ``r_en``).
    r_data : Out(width)
        The head entry, a register; valid while ``r_rdy``.
    r_rdy : Out(1)
        There is a head entry. Reset: empty.
    r_en : In(1)
        The head leaves at the edge.
    r_level : Out(range(depth + 1))
        Entries held.
    """

    def __init__(self, *, width, depth):
        if depth < 2:
            raise ValueError(f"depth: {depth}; allowed: an integer >= 2")
        self.width, self.depth = width, depth
        super().__init__({"w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
                          "r_data": Out(width), "r_rdy": Out(1), "r_en": In(1),
                          "r_level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        # The entries behind the head: a ring of depth - 1 in a memory with an asynchronous
        # read (LUT RAM, as SyncFIFO's). Written by hand rather than a SyncFIFO so that the
        # memory's write enable is the writer's alone: every accepted write stores its entry at
        # the write pointer, and only the pointer's and the level's step leave out a write
        # that goes straight to the head (clock rate: that choice comes from `r_en`, the
        # reader's logic, which then ran into every LUT-RAM cell's write enable).
        n = self.depth - 1
        storage = m.submodules.storage = Memory(shape=self.width, depth=n, init=[])
        write, read = storage.write_port(), storage.read_port(domain="comb")
        w_ptr, r_ptr = Signal(range(n), name="w_ptr"), Signal(range(n), name="r_ptr")
        level = Signal(range(n + 1), name="behind_level")
        behind_rdy, behind_w_rdy = level != 0, level != n
        head = Signal(self.width, name="head", reset_less=True)   # read only with r_rdy
        free = ~self.r_rdy | self.r_en              # the head register is loaded at the edge
        direct = free & ~behind_rdy                 # a write goes straight to the head
        accepted = self.w_en & behind_w_rdy
        stored = accepted & ~direct                 # it waits behind the head
        taken = free & behind_rdy                   # the oldest one behind moves to the head
        m.d.comb += [write.en.eq(accepted), write.addr.eq(w_ptr), write.data.eq(self.w_data),
                     read.addr.eq(r_ptr), self.w_rdy.eq(behind_w_rdy),
                     self.r_data.eq(head), self.r_level.eq(self.r_rdy + level)]
        with m.If(stored):
            m.d.sync += w_ptr.eq(Mux(w_ptr == n - 1, 0, w_ptr + 1))
        with m.If(taken):
            m.d.sync += r_ptr.eq(Mux(r_ptr == n - 1, 0, r_ptr + 1))
        m.d.sync += level.eq(level + stored - taken)
        with m.If(free):
            m.d.sync += [self.r_rdy.eq(behind_rdy | self.w_en),
                         head.eq(Mux(behind_rdy, read.data, self.w_data))]
        return m
