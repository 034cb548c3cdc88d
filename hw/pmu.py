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
import types
from functools import reduce

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from golden import pmu as golden
from hw.params import ConfiguredComponent, TieredComponent, int_param, param_error, validate
from hw.pipeline import (OutputQueue, RegisteredHeadFIFO, sum_tree, thermometer_max,
                         thermometer_value)
from hw.registry import Block, register

__all__ = ["PMUConfig", "PMU", "AddressGenerator", "ScratchpadBanks", "banks_signature",
           "job_layout"]

JOB_QUEUE_DEPTH = 2   # the running job is latched; one more waits in the queue
# Decoded accesses: the three registers in flight (addresses, decode, ranks), the current one
# (the queue's head), and one for the edge a freed entry takes to reach the loop nest (so one
# access per cycle is sustained).
ACCESS_QUEUE_DEPTH = 5
READ_FIFO_DEPTH = 5   # read results in flight (2) + buffered; keeps a ready consumer at 1/cycle


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

    A job descriptor taken on ``job`` waits in a 2-entry queue and is latched by the loop nest
    when the nest is free (the cycle after it generated the previous job's last access, so jobs
    chain with no idle cycle). The nest generates one access per cycle through three registers
    (the lanes' addresses; their bank, offset and validity; their ranks and cost) into a
    queue of accesses whose head (a register, loaded at the edge after the rank register or at
    the edge the previous access leaves) is the *current* access, held until ``advance`` says
    it completed. The nest generates only while fewer than ACCESS_QUEUE_DEPTH accesses are in
    the registers and the queue, so the registers never stall (clock rate: a stalling
    pipeline's enable, from ``advance`` through every stage into the loop's registers, was the
    critical path; before the pipeline, the loop, the decode, the ranks and the access's
    completion were one path: 43.7 MHz on the ECP5-85F). A job latched at edge s has its first
    access current from edge s + 4.

    Members
    -------
    job : In(stream.Signature(job_layout(config)))
    advance : In(1)
        The current access completes at this edge (ignored without one).
    other_busy, other_done : In(1)
        The other port's ``busy`` and ``done`` (for ``wait_other``).
    busy : Out(1)
        A job is latched and not all its accesses have completed.
    done : Out(1)
        Toggles when a job's last access completes.
    bad_job : Out(1)
        Pulses when a descriptor is rejected (a bound of 0 or above 2^A, bank bits not strictly
        increasing or beyond the capacity, diagonal row shorter than the bank count); it is
        dropped.
    current : Out(1)
        There is a current access (the fields below describe it: the access queue's head).
    last_access : Out(1)
    lane_valid : Out(V)
    lane_bank, lane_offset, lane_rank : Out(ArrayLayout(..., V))
    cost : Out(...)
        Cycles the current access takes: 1 + the largest lane rank.
    last_step : Out(...)
        cost - 1, the largest lane rank.

    ``contiguous`` (see :class:`PMU`): every job is read as contiguous, its mapping and
    predicate fields, ``lane_stride`` and ``wait_other`` ignored; every rank is 0, and with
    V = banks lane v's bank is v.
    """

    def __init__(self, config, *, contiguous=False):
        V = config.lanes
        self.contiguous = contiguous
        self.fixed_banks = contiguous and V == config.banks
        self._rank_bits = max(1, ceil_log2(V))
        super().__init__(config, {
            "job": In(stream.Signature(job_layout(config))),
            "advance": In(1),
            "other_busy": In(1),
            "other_done": In(1),
            "busy": Out(1),
            "done": Out(1),
            "bad_job": Out(1),
            "current": Out(1),
            "last_access": Out(1),
            "lane_valid": Out(V),
            "lane_bank": Out(data.ArrayLayout(unsigned(max(1, config.bank_bits)), V)),
            "lane_offset": Out(data.ArrayLayout(unsigned(exact_log2(config.bank_depth)), V)),
            "lane_rank": Out(data.ArrayLayout(unsigned(self._rank_bits), V)),
            "cost": Out(ceil_log2(V + 1) or 1),
            "last_step": Out(self._rank_bits),
        })

    def elaborate(self, platform):
        cfg = self.config
        A, L, V, b, CB = cfg.addr_width, cfg.loops, cfg.lanes, cfg.bank_bits, cfg.capacity_bits
        layout = job_layout(cfg)
        m = Module()
        capacity = cfg.banks * cfg.bank_depth
        # A contiguous generator reads these fields as constants, so none of the logic that
        # serves other values is built.
        contiguous_job = types.SimpleNamespace(
            pred_lo=Const(0), pred_hi=Const(capacity), diagonal=Const(0), row_shift=Const(0),
            bank_pos=[Const(i) for i in range(b)], lane_stride=Const(1), wait_other=Const(0))

        def fixed(descriptor):
            return contiguous_job if self.contiguous else descriptor

        # A descriptor is checked as it is taken, and queued with the verdict (clock rate: the
        # checks were on the path from the queue's head into the loop's registers).
        def rejected(descriptor):
            bad = reduce(operator.or_, [(descriptor.bounds[level] == 0)
                                        | (descriptor.bounds[level] > (1 << A))
                                        for level in range(L)], Const(0))
            if b and not self.contiguous:
                positions = [descriptor.bank_pos[i] for i in range(b)]
                misplaced = positions[-1] >= CB
                for lower, upper in zip(positions, positions[1:]):
                    misplaced |= lower >= upper
                bad |= Mux(descriptor.diagonal, descriptor.row_shift < b, misplaced)
            return bad

        queue = m.submodules.queue = SyncFIFO(width=layout.size + 1, depth=JOB_QUEUE_DEPTH)
        m.d.comb += [queue.w_data.eq(Cat(self.job.payload.as_value(),
                                         rejected(self.job.payload))),
                     queue.w_en.eq(self.job.valid), self.job.ready.eq(queue.w_rdy)]
        head, bad = layout(queue.r_data[:layout.size]), queue.r_data[layout.size]

        # The latched job keeps only the fields read after its start (the loop's strides, the
        # lane stride, the mapping and predicate): the bounds, the base and wait_other are read
        # from the queue's head at the start.
        mapping_fields = ("pred_lo", "pred_hi", "diagonal", "bank_pos", "row_shift")

        def kept(names):
            return data.StructLayout({name: layout.members[name] for name in names})

        job = Signal(kept(("strides", "lane_stride", *mapping_fields)))
        generating = Signal()           # the loop nest holds a job with accesses to generate
        index = [Signal(A, name=f"index{level}") for level in range(L)]
        level_base = [Signal(A, name=f"level_base{level}") for level in range(L)]
        waiting = Signal()
        snapshot = Signal()

        # The pipeline: the loop nest generates an access into two registers that move at
        # every edge (addresses, then the decode), then the ranks and cost go into the access
        # queue, whose head is the current access; it leaves on `advance`. The nest generates
        # only while the queue has an entry for it (`credits`: entries not filled or promised),
        # so no stage ever stalls, and nothing that `advance` depends on reaches the nest's
        # registers in the same cycle (clock rate: a stalling pipeline's enable, from the
        # consumer through every stage into the loop's registers, was the critical path).
        addressed = Signal()            # the address register holds an access
        addressed_last = Signal()
        decoded = Signal()              # the decode register holds an access
        decoded_last = Signal()
        credits = Signal(range(ACCESS_QUEUE_DEPTH + 1), init=ACCESS_QUEUE_DEPTH)
        generate = generating & (credits != 0)
        m.d.sync += credits.eq(credits - generate + (self.current & self.advance))

        # Loop nest: level 0 is innermost; level_base[l] is the address with levels below l at 0.
        # at_end[l] (index[l] == bounds[l] - 1) is a register set beside the index: from the
        # job's bound at the start and at a reset to 0 (`single`: a bound of 1), from the
        # incremented index at a step (clock rate: the comparisons were on the path from the
        # indices into the loop's registers).
        # generated_last, every at_end set, is a register of its own, loaded with what the
        # at_end registers are loaded with (clock rate: their AND began the path from the loop
        # into `generating` through the job start).
        limit = [Signal(A, name=f"limit{level}") for level in range(L)]
        single = [Signal(name=f"single{level}") for level in range(L)]
        at_end = [Signal(name=f"at_end{level}") for level in range(L)]
        generated_last = Signal()
        with m.If(generate & ~generated_last):
            for level in range(L):
                inner_done = reduce(operator.and_, at_end[:level], Const(1))
                with m.If(inner_done & ~at_end[level]):
                    stepped = (level_base[level] + job.strides[level])[:A]
                    reaches_end = index[level] + 1 == limit[level]
                    m.d.sync += [index[level].eq(index[level] + 1), level_base[level].eq(stepped),
                                 at_end[level].eq(reaches_end),
                                 generated_last.eq(reduce(operator.and_, [
                                     *single[:level], reaches_end, *at_end[level + 1:]]))]
                    m.d.sync += [index[j].eq(0) for j in range(level)]
                    m.d.sync += [at_end[j].eq(single[j]) for j in range(level)]
                    m.d.sync += [level_base[j].eq(stepped) for j in range(level)]
        with m.If(generate & generated_last):
            m.d.sync += generating.eq(0)

        # Job start: when the nest is free, the queue head is latched unless it must wait for
        # the other port.
        free = ~generating | (generate & generated_last)
        may_start = (~fixed(head).wait_other | ~self.other_busy
                     | (waiting & (self.other_done != snapshot)))
        start = Signal()
        m.d.comb += [start.eq(free & queue.r_rdy & may_start), queue.r_en.eq(start),
                     self.bad_job.eq(start & bad)]
        with m.If(self.current & self.advance & self.last_access):
            m.d.sync += self.done.eq(~self.done)
        with m.If(free & queue.r_rdy & ~may_start & ~waiting):
            m.d.sync += [waiting.eq(1), snapshot.eq(self.other_done)]
        with m.If(start):
            m.d.sync += waiting.eq(0)
            with m.If(~bad):
                m.d.sync += [*[job[name].eq(head[name]) for name in job.shape().members],
                             generating.eq(1)]
                m.d.sync += [limit[level].eq(head.bounds[level] - 1) for level in range(L)]
                m.d.sync += [single[level].eq(head.bounds[level] == 1) for level in range(L)]
                m.d.sync += [at_end[level].eq(head.bounds[level] == 1) for level in range(L)]
                m.d.sync += generated_last.eq(reduce(operator.and_, [head.bounds[level] == 1
                                                                     for level in range(L)]))
                m.d.sync += [index[level].eq(0) for level in range(L)]
                m.d.sync += [level_base[level].eq(head.base) for level in range(L)]

        # Stage 1: the lanes' addresses of the generated access, registered with the job's
        # mapping and predicate (a new job may be latched while this access moves on).
        addresses = [Signal(A, name=f"lane_addr{v}") for v in range(V)]
        mapping = Signal(kept(mapping_fields), name="addressed_job")
        m.d.sync += [addressed.eq(generate), addressed_last.eq(generated_last),
                     *[mapping[name].eq(job[name]) for name in mapping_fields],
                     *[addresses[v].eq(level_base[0] + fixed(job).lane_stride * v)
                       for v in range(V)]]

        # Stage 2: the lane decode, registered.
        lane_valid = Signal(V, name="decoded_valid")
        lane_bank = Signal.like(self.lane_bank, name="decoded_bank")
        lane_offset = Signal.like(self.lane_offset, name="decoded_offset")
        m.d.sync += [decoded.eq(addressed), decoded_last.eq(addressed_last)]
        mapped = fixed(mapping)
        for v, address in enumerate(addresses):
            in_range = address < capacity if A > CB else Const(1)
            word = address[:CB]
            if b == 0:
                bank, offset = Const(0, 1), word
            elif self.fixed_banks:      # an access starts at a multiple of V = banks
                bank, offset = Const(v, b), word[b:]
            else:
                diagonal_bank = ((word >> mapped.row_shift)[:b] + word[:b])[:b]   # mod B
                select_bank = Cat(*[word.bit_select(mapped.bank_pos[i], 1) for i in range(b)])
                compacted = word
                for i in reversed(range(b)):  # highest first: lower positions stay put
                    # A named stage per bit (one bit narrower each): _remove_bit uses its input
                    # twice, and a nested expression would double at every step. A valid job's
                    # bank bit i lies below CB - (b - 1 - i), the width left at its stage.
                    stage = Signal(len(compacted) - 1, name=f"lane{v}_compact{i}")
                    m.d.comb += stage.eq(_remove_bit(compacted, mapped.bank_pos[i]))
                    compacted = stage
                bank = Mux(mapped.diagonal, diagonal_bank, select_bank)
                offset = Mux(mapped.diagonal, word[b:], compacted)
            m.d.sync += [lane_valid[v].eq(addressed & in_range & (address >= mapped.pred_lo)
                                          & (address < mapped.pred_hi)),
                         lane_bank[v].eq(bank), lane_offset[v].eq(offset)]

        # Into the access queue: the rank of each lane among the valid lanes of its bank that
        # come before it, and the cost.
        ranks = []
        for v in range(V):
            rank = Signal(self._rank_bits, name=f"decoded_rank{v}")
            # Contiguous: V consecutive words fall in V different banks (V <= banks).
            same = [] if self.contiguous else [lane_valid[u] & (lane_bank[u] == lane_bank[v])
                                               for u in range(v)]
            m.d.comb += rank.eq(sum_tree(same) if same else 0)
            ranks.append(Mux(lane_valid[v], rank, 0))
        # The largest rank as a thermometer code, registered, its number taken as the access is
        # written into the queue (clock rate: a tree of compare-and-select stages after the ranks
        # was the path into the rank register). Lane v's rank is at most v.
        reached = thermometer_max(ranks, bounds=range(V))
        m.d.comb += self.cost.eq(self.last_step + 1)
        fields = {"last": 1, "valid": V, "bank": self.lane_bank.shape(),
                  "offset": self.lane_offset.shape(), "rank": self.lane_rank.shape()}
        entry = data.StructLayout({**fields, "last_step": self.last_step.shape()})
        # Stage 3: the ranks and cost, registered, then written into a queue whose head, a
        # register, they reach at the next edge: the same two edges from the decode register to
        # the head as a SyncFIFOBuffered written from the decode directly (clock rate: the
        # ranks' compares ran into its memory's write port).
        ranked = Signal()               # the rank register holds an access
        ranked_access = Signal(data.StructLayout({**fields, "reached": max(1, len(reached))}))
        m.d.sync += [ranked.eq(decoded), ranked_access.last.eq(decoded_last),
                     ranked_access.valid.eq(lane_valid), ranked_access.bank.eq(lane_bank),
                     ranked_access.offset.eq(lane_offset), ranked_access.reached.eq(Cat(*reached)),
                     *[ranked_access.rank[v].eq(ranks[v]) for v in range(V)]]
        written = Signal(entry, name="queued_access")
        m.d.comb += [written.eq(Cat(*(ranked_access[name] for name in fields))),
                     written.last_step.eq(thermometer_value(
                         [ranked_access.reached[t] for t in range(len(reached))],
                         self._rank_bits))]
        accesses = m.submodules.accesses = RegisteredHeadFIFO(width=entry.size,
                                                              depth=ACCESS_QUEUE_DEPTH)
        head_access = entry(accesses.r_data)
        m.d.comb += [accesses.w_data.eq(written), accesses.w_en.eq(ranked),
                     accesses.r_en.eq(self.advance)]
        # Busy while the job has an access anywhere: the nest, the registers or the queue.
        m.d.comb += self.busy.eq(generating | addressed | decoded | ranked
                                 | (accesses.r_level != 0))
        # The outputs are assigned, not connected, so that a subclass can override one
        # (tests/test_formal.py breaks a rank).
        m.d.comb += [self.current.eq(accesses.r_rdy), self.last_access.eq(head_access.last),
                     self.lane_valid.eq(head_access.valid),
                     self.lane_bank.eq(Cat(*[Const(v, len(self.lane_bank[v])) for v in range(V)])
                                       if self.fixed_banks else head_access.bank),
                     self.lane_offset.eq(head_access.offset),
                     self.last_step.eq(0 if self.contiguous else head_access.last_step),
                     *[self.lane_rank[v].eq(0 if self.contiguous else head_access.rank[v])
                       for v in range(V)]]
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
    taken at edge e (the port idle) is taken at ``e + 5 + sum(costs[:j+1])``, a read beat at
    ``e + 8 + sum(costs[:j+1])`` (``golden.pmu``'s latencies), and queued jobs continue with no
    idle cycle.

    ``error`` (sticky until reset) is set by a rejected descriptor (see
    :class:`AddressGenerator`) or a ``w.last`` that is not on the job's final access. A read
    and a write of the same word in the same cycle read the old word.

    ``contiguous`` (not a parameter of the block: for ``expert_chiplet``, whose every access
    is V consecutive words from a multiple of V, its jobs' bases and strides multiples of V)
    reads every descriptor as ``lane_stride`` 1, ``pred_lo`` 0, ``pred_hi`` banks *
    bank_depth, ``diagonal`` 0, ``bank_pos[i]`` = i and ``wait_other`` 0, whatever those fields
    hold, and builds no bank-conflict logic: V consecutive words lie in V different banks, so
    every access takes one cycle. With V = banks lane v always uses bank v, and no lane-to-bank
    crossbar is built. Needs V <= banks; an access from a base that is not a multiple of V is
    misuse (with V = banks its words go to the wrong banks).
    """

    def __init__(self, config, *, tier=None, contiguous=False):
        """``tier="top"`` builds the logic alone, the banks' ports as ``bottom__bank<b>__*``
        (the 3D build: :class:`ScratchpadBanks` on the memory tier)."""
        if contiguous and config.lanes > config.banks:
            raise ValueError(f"a contiguous PMU needs lanes <= banks, not {config.lanes} lanes "
                             f"on {config.banks} banks")
        self.contiguous = contiguous
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
        wag = m.submodules.write_agen = self.address_generator(cfg, contiguous=self.contiguous)
        rag = m.submodules.read_agen = self.address_generator(cfg, contiguous=self.contiguous)
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
        # Contiguous: one step per access, so no step counter.
        w_step = (Const(0, len(wag.lane_rank[0])) if self.contiguous
                  else Signal.like(wag.lane_rank[0], name="w_step"))
        w_final = w_step == wag.last_step
        writing = wag.current & self.w.valid
        m.d.comb += [self.w.ready.eq(wag.current & w_final), wag.advance.eq(writing & w_final)]
        with m.If(writing):
            if not self.contiguous:
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

        # Each bank's write (enable, address, data) and read address are registered: a bank
        # is written and read one edge after its lanes are picked (clock rate: the pick of a
        # bank's lane and the bank's read or write were one path, 87.9 MHz). Both ports move
        # alike, so a read and a write picked in one cycle still meet at the bank in one.
        for bank, ports in enumerate(banks):
            selects = [writing & s for s in served_by(wag, w_step, bank)]
            conflicts += conflict(selects)
            w_en = Signal(name=f"bank{bank}_w_en")
            w_addr = Signal.like(ports.w_addr, name=f"bank{bank}_w_addr")
            w_data = Signal.like(ports.w_data, name=f"bank{bank}_w_data")
            m.d.sync += [w_en.eq(reduce(operator.or_, selects)),
                         w_addr.eq(one_hot_pick(selects, list(wag.lane_offset))),
                         w_data.eq(one_hot_pick(selects, list(self.w.payload.data)))]
            m.d.comb += [ports.w_en.eq(w_en), ports.w_addr.eq(w_addr), ports.w_data.eq(w_data)]

        # Read port: issue one rank per cycle; the banks read at the next edge, the data is
        # there the edge after and is gathered.
        queue = OutputQueue(m, self.r, depth=READ_FIFO_DEPTH, name="read_fifo")
        r_step = (Const(0, len(rag.lane_rank[0])) if self.contiguous
                  else Signal.like(rag.lane_rank[0], name="r_step"))
        r_final = r_step == rag.last_step
        reading = Signal()              # the access issued last cycle is read from the banks
        pushing = Signal()              # the access read last cycle completes now
        issuing = Signal()
        # Free read FIFO entries, less the accesses in flight (reading, pushing): a counter, so
        # that no sum of the FIFO's level leads into the address pipeline's moves (clock rate).
        credits = Signal(range(READ_FIFO_DEPTH + 1), init=READ_FIFO_DEPTH)
        m.d.sync += credits.eq(credits - (issuing & r_final) + (self.r.valid & self.r.ready))
        m.d.comb += [issuing.eq(rag.current & (credits != 0)),
                     rag.advance.eq(issuing & r_final)]
        with m.If(issuing):
            if not self.contiguous:
                m.d.sync += r_step.eq(Mux(r_final, 0, r_step + 1))
            with m.If(~r_final):
                m.d.sync += self.r_conflict_cycles.eq(self.r_conflict_cycles + 1)
        for bank, ports in enumerate(banks):
            selects = served_by(rag, r_step, bank)
            conflicts += conflict([issuing & s for s in selects])
            r_addr = Signal.like(ports.r_addr, name=f"bank{bank}_r_addr")
            m.d.sync += r_addr.eq(one_hot_pick(selects, list(rag.lane_offset)))
            m.d.comb += ports.r_addr.eq(r_addr)
        # One wide OR: a chain of hundreds of ORs (8 lanes, 8 banks) is too deep to elaborate.
        m.d.comb += self.bank_conflict.eq(Cat(*conflicts).any() if conflicts else 0)

        # The lanes served, their banks and the access's flags, two edges on (issue, read).
        issued, served = Signal(V), Signal(V)
        issued_bank, served_bank = Signal.like(rag.lane_bank), Signal.like(rag.lane_bank)
        issued_valid, access_valid = Signal(V), Signal(V)
        issued_last, access_last = Signal(), Signal()
        m.d.sync += [issued.eq(Mux(issuing, Cat(*[rag.lane_valid[v] & (rag.lane_rank[v] == r_step)
                                                    for v in range(V)]), 0)),
                     issued_bank.eq(rag.lane_bank), reading.eq(issuing & r_final),
                     served.eq(issued), served_bank.eq(issued_bank), pushing.eq(reading)]
        with m.If(issuing & r_final):
            m.d.sync += [issued_valid.eq(rag.lane_valid), issued_last.eq(rag.last_access)]
        with m.If(reading):
            m.d.sync += [access_valid.eq(issued_valid), access_last.eq(issued_last)]
        if rag.fixed_banks:            # lane v reads bank v
            bank_data, served_bank = [ports.r_data for ports in banks], list(range(V))
        else:
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
