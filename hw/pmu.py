"""PMU: banked scratchpad with concurrent, programmable read and write address generators.

Source: SambaNova SN40L's Pattern Memory Unit (seed 001 §III-A, §IV-B, §VII): scratchpad banks,
independent read and write address pipelines, predication by a programmable valid range,
programmable bank bits, and the diagonally striped layout that reads a tensor at full bandwidth
in both regular and transposed order. The contract is in docs/blocks/pmu.md.

Each port owns an :class:`AddressGenerator`: a 2-entry job queue, L nested loops, V lane addresses
and their bank, offset and validity, and the *rank* of every lane among the valid lanes of the
same bank. An access takes ``cost = 1 + max(rank)`` cycles: in its cycle k the lanes of rank k
are served, at most one per bank, so lanes that share a bank are serialized, never dropped.
"""

import dataclasses
import operator
from functools import reduce

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from golden import pmu as golden
from hw.params import ConfiguredComponent, TieredComponent, int_param, param_error, validate
from hw.pipeline import OutputQueue, max_tree
from hw.registry import Block, register

__all__ = ["PMUConfig", "PMU", "AddressGenerator", "ScratchpadBanks", "banks_signature",
           "job_layout"]

JOB_QUEUE_DEPTH = 2   # the running job is latched; one more waits in the queue
READ_FIFO_DEPTH = 4   # read results in flight + buffered; 4 keeps a ready consumer at 1/cycle


def _power_of_two(value):
    return value > 0 and value & (value - 1) == 0


@dataclasses.dataclass(frozen=True)
class PMUConfig:
    """Parameters of the ``pmu`` block.

    Parameters
    ----------
    banks : int
        B, scratchpad banks (power of two, 1..32).
    bank_depth : int
        Words per bank (power of two, 2..65536). Capacity = banks * bank_depth elements.
    elem_width : int
        Bits per element (1..64).
    lanes : int
        V, elements per access (1..banks).
    loops : int
        L, nested loop levels of each address generator (1..6).
    addr_width : int
        A, width of addresses, bounds and the predicate range; at least log2(capacity), at most
        32. Address arithmetic wraps modulo 2^A; lanes at or above the capacity are invalid.

    Raises
    ------
    hw.params.ParamError
        A value out of range, naming the parameter, the value and what is allowed.
    """
    banks: int = int_param(8, 1, 32, "scratchpad banks B", check=_power_of_two,
                           check_doc="a power of two")
    bank_depth: int = int_param(64, 2, 65536, "words per bank", check=_power_of_two,
                                check_doc="a power of two")
    elem_width: int = int_param(16, 1, 64, "bits per element")
    lanes: int = int_param(8, 1, 32, "elements per access V (<= banks)")
    loops: int = int_param(3, 1, 6, "nested loop levels L")
    addr_width: int = int_param(16, 1, 32, "address width A (>= log2(banks*bank_depth))")

    def __post_init__(self):
        validate(self)
        if self.lanes > self.banks:
            raise param_error("lanes", self.lanes, f"an integer in 1..banks ({self.banks})")
        if self.addr_width < self.capacity_bits:
            raise param_error("addr_width", self.addr_width,
                              f"an integer in {self.capacity_bits}..32 "
                              "(log2(banks*bank_depth) and up)")

    @property
    def bank_bits(self):
        return exact_log2(self.banks)

    @property
    def capacity_bits(self):
        return exact_log2(self.banks * self.bank_depth)


def job_layout(config):
    """Layout of a job descriptor (the ``wjob`` and ``rjob`` payloads); first field at bit 0.

    Fields, in bit order: ``base`` (A bits); ``bounds`` (L x A+1 bits: iterations of each level,
    level 0 innermost, each in 1..2^A); ``strides`` (L x signed A+1 bits); ``lane_stride`` (signed
    A+1); ``pred_lo``, ``pred_hi`` (A+1 bits each: lanes with pred_lo <= address < pred_hi are
    valid); ``diagonal`` (1 bit: 1 diagonal mapping, 0 bit-select); ``bank_pos`` (max(1, log2 B)
    fields: address bit of each bank bit, strictly increasing, below log2(capacity));
    ``row_shift`` (log2 of the diagonal mapping's row length N, >= log2 B); ``wait_other``
    (1 bit: start only after the other port's current job has finished).
    """
    A, L = config.addr_width, config.loops
    return data.StructLayout({
        "base": unsigned(A),
        "bounds": data.ArrayLayout(unsigned(A + 1), L),
        "strides": data.ArrayLayout(signed(A + 1), L),
        "lane_stride": signed(A + 1),
        "pred_lo": unsigned(A + 1),
        "pred_hi": unsigned(A + 1),
        "diagonal": 1,
        "bank_pos": data.ArrayLayout(unsigned(max(1, ceil_log2(config.capacity_bits))),
                                     max(1, config.bank_bits)),
        "row_shift": unsigned(max(1, ceil_log2(config.capacity_bits + 1))),
        "wait_other": 1,
    })


def write_layout(config):
    """``w`` payload: V lanes of ``elem_width`` (lane i at bits [i*W, (i+1)*W)) and ``last``."""
    return data.StructLayout({"data": data.ArrayLayout(unsigned(config.elem_width), config.lanes),
                              "last": 1})


def read_layout(config):
    """``r`` payload: V lanes of data, V per-lane valid flags, ``last`` (end of the job)."""
    return data.StructLayout({"data": data.ArrayLayout(unsigned(config.elem_width), config.lanes),
                              "valid": config.lanes, "last": 1})


def _remove_bit(value, position):
    """``value`` with the bit at the run-time ``position`` (below its width) removed: one bit
    narrower, the higher bits moved down."""
    width = len(value) - 1
    # A thermometer of the bits below ``position``: ``(1 << position) - 1`` would compute
    # bits above ``width`` that are cut off again (dead logic a mutation cannot reach).
    low_mask = Cat(*[position > i for i in range(width)])
    return (value[:width] & low_mask) | (value[1:] & ~low_mask)


class AddressGenerator(ConfiguredComponent):
    """One port's address pipeline: job queue, nested loops, lane decode and bank ranks.

    A job descriptor taken on ``job`` waits in a 2-entry queue and is latched when the port is
    free (the cycle after the previous job's last access, so jobs chain with no idle cycle). The
    generator holds the current access until ``advance`` says it completed. Outputs describe the
    current access, combinationally from registers.

    Members
    -------
    job : In(stream.Signature(job_layout(config)))
    advance : In(1)
        The current access completes at this edge.
    other_busy, other_done : In(1)
        The other port's ``busy`` and ``done`` (for ``wait_other``).
    busy : Out(1)
        A job is latched.
    done : Out(1)
        Toggles when a job completes.
    bad_job : Out(1)
        Pulses when a descriptor is rejected (a bound of 0 or above 2^A, bank bits not strictly
        increasing or beyond the capacity, diagonal row shorter than the bank count); it is
        dropped.
    last_access : Out(1)
    lane_valid : Out(V)
    lane_bank, lane_offset, lane_rank : Out(ArrayLayout(..., V))
    cost : Out(...)
        Cycles the current access takes: 1 + the largest lane rank.
    """

    def __init__(self, config):
        V = config.lanes
        self._rank_bits = max(1, ceil_log2(V))
        super().__init__(config, {
            "job": In(stream.Signature(job_layout(config))),
            "advance": In(1),
            "other_busy": In(1),
            "other_done": In(1),
            "busy": Out(1),
            "done": Out(1),
            "bad_job": Out(1),
            "last_access": Out(1),
            "lane_valid": Out(V),
            "lane_bank": Out(data.ArrayLayout(unsigned(max(1, config.bank_bits)), V)),
            "lane_offset": Out(data.ArrayLayout(unsigned(exact_log2(config.bank_depth)), V)),
            "lane_rank": Out(data.ArrayLayout(unsigned(self._rank_bits), V)),
            "cost": Out(ceil_log2(V + 1) or 1),
        })

    def elaborate(self, platform):
        cfg = self.config
        A, L, V, b, CB = cfg.addr_width, cfg.loops, cfg.lanes, cfg.bank_bits, cfg.capacity_bits
        layout = job_layout(cfg)
        m = Module()

        queue = m.submodules.queue = SyncFIFO(width=layout.size, depth=JOB_QUEUE_DEPTH)
        m.d.comb += [queue.w_data.eq(self.job.payload.as_value()),
                     queue.w_en.eq(self.job.valid), self.job.ready.eq(queue.w_rdy)]
        head = layout(queue.r_data)

        job = Signal(layout)
        index = [Signal(A, name=f"index{level}") for level in range(L)]
        level_base = [Signal(A, name=f"level_base{level}") for level in range(L)]
        lane_offset_addr = [Signal(A, name=f"lane_off{v}") for v in range(V)]
        waiting = Signal()
        snapshot = Signal()

        # Loop nest: level 0 is innermost; level_base[l] is the address with levels below l at 0.
        at_end = [index[level] == job.bounds[level] - 1 for level in range(L)]
        m.d.comb += self.last_access.eq(reduce(operator.and_, at_end))
        with m.If(self.busy & self.advance & ~self.last_access):
            for level in range(L):
                inner_done = reduce(operator.and_, at_end[:level], Const(1))
                with m.If(inner_done & ~at_end[level]):
                    stepped = (level_base[level] + job.strides[level])[:A]
                    m.d.sync += [index[level].eq(index[level] + 1), level_base[level].eq(stepped)]
                    m.d.sync += [index[j].eq(0) for j in range(level)]
                    m.d.sync += [level_base[j].eq(stepped) for j in range(level)]

        # Job start: when free, the queue head is latched unless it must wait for the other port.
        free = ~self.busy | (self.advance & self.last_access)
        may_start = (~head.wait_other | ~self.other_busy
                     | (waiting & (self.other_done != snapshot)))
        bad = reduce(operator.or_, [(head.bounds[level] == 0) | (head.bounds[level] > (1 << A))
                                    for level in range(L)], Const(0))
        if b:
            positions = [head.bank_pos[i] for i in range(b)]
            misplaced = positions[-1] >= CB
            for lower, upper in zip(positions, positions[1:]):
                misplaced |= lower >= upper
            bad |= Mux(head.diagonal, head.row_shift < b, misplaced)
        start = Signal()
        m.d.comb += [start.eq(free & queue.r_rdy & may_start), queue.r_en.eq(start),
                     self.bad_job.eq(start & bad)]
        with m.If(self.busy & self.advance & self.last_access):
            m.d.sync += [self.busy.eq(0), self.done.eq(~self.done)]
        with m.If(free & queue.r_rdy & ~may_start & ~waiting):
            m.d.sync += [waiting.eq(1), snapshot.eq(self.other_done)]
        with m.If(start):
            m.d.sync += waiting.eq(0)
            with m.If(~bad):
                m.d.sync += [job.eq(head), self.busy.eq(1)]
                m.d.sync += [index[level].eq(0) for level in range(L)]
                m.d.sync += [level_base[level].eq(head.base) for level in range(L)]
                m.d.sync += [lane_offset_addr[v].eq((head.lane_stride * v)[:A]) for v in range(V)]

        # Lane decode of the current access.
        capacity = cfg.banks * cfg.bank_depth
        for v in range(V):
            address = Signal(A, name=f"lane_addr{v}")
            m.d.comb += address.eq(level_base[0] + lane_offset_addr[v])
            in_range = address < capacity if A > CB else Const(1)
            m.d.comb += self.lane_valid[v].eq(self.busy & in_range & (address >= job.pred_lo)
                                              & (address < job.pred_hi))
            word = address[:CB]
            if b == 0:
                bank, offset = Const(0, 1), word
            else:
                diagonal_bank = ((word >> job.row_shift)[:b] + word[:b])[:b]   # mod B
                select_bank = Cat(*[word.bit_select(job.bank_pos[i], 1) for i in range(b)])
                compacted = word
                for i in reversed(range(b)):  # highest first: lower positions stay put
                    # A named stage per bit (one bit narrower each): _remove_bit uses its input
                    # twice, and a nested expression would double at every step. A valid job's
                    # bank bit i lies below CB - (b - 1 - i), the width left at its stage.
                    stage = Signal(len(compacted) - 1, name=f"lane{v}_compact{i}")
                    m.d.comb += stage.eq(_remove_bit(compacted, job.bank_pos[i]))
                    compacted = stage
                bank = Mux(job.diagonal, diagonal_bank, select_bank)
                offset = Mux(job.diagonal, word[b:], compacted)
            m.d.comb += [self.lane_bank[v].eq(bank), self.lane_offset[v].eq(offset)]

        # Rank of each lane among the valid lanes of its bank that come before it.
        ranks = []
        for v in range(V):
            same = [self.lane_valid[u] & (self.lane_bank[u] == self.lane_bank[v])
                    for u in range(v)]
            # Every partial count cut to the rank's width (a rank is below V): Python's sum
            # would widen each adder by a bit whose value is always 0.
            rank = Const(0, self._rank_bits)
            for term in same:
                rank = (rank + term)[:self._rank_bits]
            m.d.comb += self.lane_rank[v].eq(rank)
            ranks.append(Mux(self.lane_valid[v], self.lane_rank[v], 0))
        # Lane 0's rank is always 0, the floor of the maximum anyway: left out of the tree.
        m.d.comb += self.cost.eq(max_tree(m, ranks[1:] or ranks, "rank_max") + 1)
        return m


def banks_signature(config):
    """The scratchpad banks' ports as the banks see them (``bank<b>__*`` per bank): a write
    port (``w_en``, ``w_addr``, ``w_data``: the word is written at the edge) and a synchronous
    read port (``r_addr`` in, ``r_data`` out the cycle after: the old word on a read and a
    write of the same word at one edge)."""
    address = exact_log2(config.bank_depth)
    bank = wiring.Signature({"w_en": In(1), "w_addr": In(address),
                             "w_data": In(config.elem_width), "r_addr": In(address),
                             "r_data": Out(config.elem_width)})
    return wiring.Signature({f"bank{b}": Out(bank) for b in range(config.banks)})


class ScratchpadBanks(ConfiguredComponent):
    """The PMU's B memory banks alone (the memory tier of a two-tier 3D build): each
    ``bank_depth`` words of ``elem_width`` bits, zero at start-up, not reset."""

    def __init__(self, config):
        super().__init__(config, banks_signature(config))

    def elaborate(self, platform):
        m = Module()
        for bank in range(self.config.banks):
            ports = getattr(self, f"bank{bank}")
            mem = Memory(shape=unsigned(self.config.elem_width), depth=self.config.bank_depth,
                         init=[])
            m.submodules[f"bank{bank}"] = mem
            write, read = mem.write_port(), mem.read_port()
            m.d.comb += [write.en.eq(ports.w_en), write.addr.eq(ports.w_addr),
                         write.data.eq(ports.w_data), read.addr.eq(ports.r_addr),
                         ports.r_data.eq(read.data)]
        return m


class PMU(TieredComponent):
    """Banked scratchpad with concurrent write and read address generators (block ``pmu``).

    Members
    -------
    wjob, rjob : In(stream.Signature(job_layout(config)))
        Job descriptors of the write and the read port.
    w : In(stream.Signature(write_layout(config)))
        One V-lane vector per write access, ``last`` on the job's final access.
    r : Out(stream.Signature(read_layout(config)))
        One V-lane vector per read access.
    w_busy, r_busy : Out(1)
    w_conflict_cycles, r_conflict_cycles : Out(32)
        Extra cycles spent on bank conflicts (wrap).
    error : Out(1)
        Sticky until reset.

    Lanes that are
    predicated off or outside the scratchpad are not written, and read back as zero with their
    ``valid`` flag low. An access whose valid lanes fall at most once in every bank takes one
    cycle; otherwise it takes as many cycles as the largest number of its valid lanes in one
    bank (``*_conflict_cycles`` count the extra cycles). Without conflicts or backpressure each
    port sustains one access per cycle; a write beat of access j of a job whose descriptor was
    taken at edge e is taken at ``e + 1 + sum(costs[:j+1])``, a read beat at
    ``e + 3 + sum(costs[:j+1])``, and queued jobs continue with no idle cycle.

    ``error`` (sticky until reset) is set by a rejected descriptor (see
    :class:`AddressGenerator`) or a ``w.last`` that is not on the job's final access. A read
    and a write of the same word in the same cycle read the old word.
    """

    def __init__(self, config, *, tier=None):
        """``tier="top"`` builds the logic alone, the banks' ports as ``bottom__bank<b>__*``
        (the 3D build: :class:`ScratchpadBanks` on the memory tier)."""
        super().__init__(config, {
            "wjob": In(stream.Signature(job_layout(config))),
            "rjob": In(stream.Signature(job_layout(config))),
            "w": In(stream.Signature(write_layout(config))),
            "r": Out(stream.Signature(read_layout(config))),
            "w_busy": Out(1),
            "r_busy": Out(1),
            "w_conflict_cycles": Out(32),
            "r_conflict_cycles": Out(32),
            "error": Out(1),
        }, banks_signature(config), tier)
        # Not a port: high in a cycle where two lanes access one bank through one port (the
        # write or the read side). Read only by the formal harness (flows/formal.py), which
        # asserts it never rises; nothing in the block reads it, so synthesis drops it.
        self.bank_conflict = Signal(name="bank_conflict")

    # The address generator class (a test builds a broken one to show the invariant can fail).
    address_generator = AddressGenerator

    def elaborate(self, platform):
        cfg = self.config
        V = cfg.lanes
        m = Module()
        wag = m.submodules.write_agen = self.address_generator(cfg)
        rag = m.submodules.read_agen = self.address_generator(cfg)
        wiring.connect(m, wiring.flipped(self.wjob), wag.job)
        wiring.connect(m, wiring.flipped(self.rjob), rag.job)
        m.d.comb += [wag.other_busy.eq(rag.busy), wag.other_done.eq(rag.done),
                     rag.other_busy.eq(wag.busy), rag.other_done.eq(wag.done),
                     self.w_busy.eq(wag.busy), self.r_busy.eq(rag.busy)]
        with m.If(wag.bad_job | rag.bad_job):
            m.d.sync += self.error.eq(1)

        if self.tier == "top":
            memory = self.bottom
        else:
            memory = m.submodules.banks = ScratchpadBanks(cfg)
        banks = [getattr(memory, f"bank{bank}") for bank in range(cfg.banks)]

        def served_by(agen, step, bank):
            """Lanes of the current access that use ``bank`` in serialization step ``step``."""
            return [agen.lane_valid[v] & (agen.lane_bank[v] == bank) & (agen.lane_rank[v] == step)
                    for v in range(V)]

        def one_hot_pick(selects, values):
            return reduce(operator.or_, [Mux(s, x, 0) for s, x in zip(selects, values)])

        # Write port: the beat is held while its lanes are written one rank per cycle.
        w_step = Signal.like(wag.lane_rank[0], name="w_step")
        w_final = w_step == wag.cost - 1
        writing = wag.busy & self.w.valid
        m.d.comb += [self.w.ready.eq(wag.busy & w_final), wag.advance.eq(writing & w_final)]
        with m.If(writing):
            m.d.sync += w_step.eq(Mux(w_final, 0, w_step + 1))
            with m.If(~w_final):
                m.d.sync += self.w_conflict_cycles.eq(self.w_conflict_cycles + 1)
            with m.If(w_final & (self.w.payload.last != wag.last_access)):
                m.d.sync += self.error.eq(1)
        conflicts = []

        def conflict(selects):
            """More than one of ``selects`` high: x & (x - 1) clears the lowest set bit."""
            lanes = Cat(*selects)
            return [(lanes & (lanes - 1)).any()]

        for bank, ports in enumerate(banks):
            selects = [writing & s for s in served_by(wag, w_step, bank)]
            conflicts += conflict(selects)
            m.d.comb += [ports.w_en.eq(reduce(operator.or_, selects)),
                         ports.w_addr.eq(one_hot_pick(selects, list(wag.lane_offset))),
                         ports.w_data.eq(one_hot_pick(selects, list(self.w.payload.data)))]

        # Read port: issue one rank per cycle; data returns a cycle later and is gathered.
        queue = OutputQueue(m, self.r, depth=READ_FIFO_DEPTH, name="read_fifo")
        r_step = Signal.like(rag.lane_rank[0], name="r_step")
        r_final = r_step == rag.cost - 1
        pushing = Signal()              # the access issued last cycle completes now
        issuing = Signal()
        m.d.comb += [issuing.eq(rag.busy & (queue.level + pushing < READ_FIFO_DEPTH)),
                     rag.advance.eq(issuing & r_final)]
        with m.If(issuing):
            m.d.sync += r_step.eq(Mux(r_final, 0, r_step + 1))
            with m.If(~r_final):
                m.d.sync += self.r_conflict_cycles.eq(self.r_conflict_cycles + 1)
        for bank, ports in enumerate(banks):
            selects = served_by(rag, r_step, bank)
            conflicts += conflict([issuing & s for s in selects])
            m.d.comb += ports.r_addr.eq(one_hot_pick(selects, list(rag.lane_offset)))
        # One wide OR: a chain of hundreds of ORs (8 lanes, 8 banks) is too deep to elaborate.
        m.d.comb += self.bank_conflict.eq(Cat(*conflicts).any() if conflicts else 0)

        served = Signal(V)
        served_bank = Signal.like(rag.lane_bank)
        access_valid = Signal(V)
        access_last = Signal()
        m.d.sync += [served.eq(Mux(issuing, Cat(*[rag.lane_valid[v] & (rag.lane_rank[v] == r_step)
                                                    for v in range(V)]), 0)),
                     served_bank.eq(rag.lane_bank), pushing.eq(issuing & r_final)]
        with m.If(issuing & r_final):
            m.d.sync += [access_valid.eq(rag.lane_valid), access_last.eq(rag.last_access)]
        bank_data = Array(ports.r_data for ports in banks)
        gathered = [Signal(cfg.elem_width, name=f"gathered{v}") for v in range(V)]
        merged = [Mux(served[v], bank_data[served_bank[v]], gathered[v]) for v in range(V)]
        for v in range(V):
            m.d.sync += gathered[v].eq(Mux(pushing, 0, merged[v]))
        result = Signal(read_layout(cfg))
        m.d.comb += [result.valid.eq(access_valid), result.last.eq(access_last)]
        queue.push(m, pushing, result.as_value())
        m.d.comb += [result.data[v].eq(merged[v]) for v in range(V)]
        return m


register(Block(
    name="pmu", family="pmu", config=PMUConfig, build=PMU,
    figures=lambda cfg: golden.figures(**dataclasses.asdict(cfg)),
    summary=("banked scratchpad with concurrent programmable read/write address generators "
             "(SN40L PMU)"),
    demo_configs=({"banks": 8, "bank_depth": 64, "elem_width": 16, "lanes": 8, "loops": 3},),
    area_unit="bank", operation="word access", area_units=lambda cfg: cfg.banks,
    legend="read accesses per cycle, pattern/mapping",
    tiers=lambda cfg: (PMU(cfg, tier="top"), ScratchpadBanks(cfg)),
    tier_contents=("address generators, gather, read FIFO", "the memory banks"),
))
