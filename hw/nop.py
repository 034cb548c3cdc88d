"""NoP-tree switches with in-network dispatch (multicast) and combine (reduction).

Source: Mozart's 2.5D NoP-tree (seed 000 §3.3, §4.4: the attention chiplet at the root dispatches
tokens, expert chiplets are the leaves, switches aggregate the MoE outputs in the network) and
DeepSeek-V3's hardware lesson that dispatch is a multicast and combine a reduction, both best done
in the network (seed 003 §6.5). The contract is in docs/blocks/nop.md.

A switch has one parent side and F child sides, each a pair of streams: ``down`` (dispatch,
towards the leaves) and ``up`` (combine, towards the root).

* Dispatch: a packet (1 or more flits, ``last`` on the final one) carries a destination mask with
  one bit per leaf of the *whole* tree. The switch forwards the packet once to every child whose
  subtree holds a set bit. All destination children take a flit in the same cycle (the fork waits
  for all of them), through one output register per child: 1 flit per cycle, 1 cycle per hop.
* Combine: when a packet's first flit passes, the switch allocates one of ``max_inflight`` slots
  and records the token and which children owe a contribution. Each child's flits are written to
  that child's own buffer (one memory per child, so every child link takes 1 flit per cycle and
  the switch never back-pressures a child). When every owed child has returned its packet the
  slot is emitted upward as one packet whose lanes are the lane-wise sums (wrapping at
  ``acc_width``; or, with ``combine_dtype`` bf16/fp32, BF16/FP32 codes added in child order and
  rounded at every addition, seed 003 §6.5's BF16 combine), 1 flit per cycle; the slot is then
  free. Completed slots leave in round-robin order, so returns may come in any order; the next
  one is chosen a cycle ahead into a register and each return flit is written a cycle after it
  is taken (the clock rate), so a combined packet leaves 4 cycles after its last child's last
  flit (``golden.nop.COMBINE_HOP_CYCLES``).
"""

import dataclasses
import math

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden import fp
from golden import nop as golden
from hw.fparith import fp_add
from hw.params import (ConfiguredComponent, choice_param, int_list_param, int_param, param_error,
                       validate)
from hw.pipeline import SkidSlice, or_tree
from hw.registry import Block, register

__all__ = ["FlitParams", "NopConfig", "NopSwitchConfig", "NopSwitch", "NopTree", "down_layout",
           "up_layout"]

MAX_LEAVES = 64
# Bits of each per-link error count (saturating) of a tree with ``link_check``.
ERROR_COUNT_WIDTH = 16


def _check_combine(config):
    if config.combine_dtype != "int":
        width = fp.FORMATS[config.combine_dtype].width
        if config.acc_width != width:
            raise param_error("acc_width", config.acc_width,
                              f"{width} with combine_dtype {config.combine_dtype} (its codes)")


def _check_slots(config):
    # A token id is in flight at most once (a repeated id waits at the root), so slots beyond
    # 2**token_width could never fill.
    if config.max_inflight > 1 << config.token_width:
        raise param_error("max_inflight", config.max_inflight,
                          f"at most 2**token_width = {1 << config.token_width} (the token ids "
                          "in flight are distinct)")


def _check_links(config):
    if config.fault_inject and config.link_check == "none":
        raise param_error("fault_inject", config.fault_inject,
                          "0 with link_check 'none' (the flips test the link checks)")
    if len(config.fanouts) > 1:
        return
    for name, given, only in (("link_check", config.link_check, "none"),
                              ("fault_inject", config.fault_inject, 0)):
        if given != only:
            raise param_error(name, repr(given), f"{only!r} for a one-level tree (it has no "
                                                 f"switch-to-switch links)")


def _check_leaves(fanouts):
    leaves = math.prod(fanouts)
    if leaves > MAX_LEAVES:
        raise param_error("fanouts", fanouts,
                          f"a product of at most {MAX_LEAVES} leaves (got {leaves})")


@dataclasses.dataclass(frozen=True)
class FlitParams:
    """Flit shape and tracking capacity, the same for every switch of a tree.

    Parameters
    ----------
    lanes : int
        Data elements per flit (1..64).
    data_width : int
        Bits of a dispatched element, signed (1..32).
    acc_width : int
        Bits of a combined element, signed, wrapping (2..48).
    token_width : int
        Bits of the token id (1..16).
    max_flits : int
        P, the longest packet in flits (1..64).
    max_inflight : int
        Tokens a switch tracks between dispatch and combine (1..64, at most 2**token_width:
        the ids in flight are distinct).
    combine_dtype : str
        ``int`` (wrapping signed sums), ``bf16`` or ``fp32`` (the combine lanes are codes of the
        format, ``acc_width`` its width; each switch adds its children in child order, rounding
        every addition to nearest even). Dispatch lanes are carried bit for bit either way
        (FP8 codes ride in ``data_width`` = 8).
    """
    lanes: int = int_param(4, 1, 64, "data elements per flit")
    data_width: int = int_param(8, 1, 32, "bits per dispatched element (signed)")
    acc_width: int = int_param(16, 2, 48, "bits per combined element (signed, wrapping)")
    token_width: int = int_param(8, 1, 16, "bits of the token id")
    max_flits: int = int_param(4, 1, 64, "P, longest packet in flits")
    # 6 slots x 4 flits cover the default 2-level tree's round trip (19 cycles): 1 flit/cycle.
    max_inflight: int = int_param(6, 1, 64, "tokens a switch tracks between dispatch and combine")
    combine_dtype: str = choice_param("int", ("int", "bf16", "fp32"),
                                      "combine lanes: wrapping integers, BF16 or FP32 codes")

    def __post_init__(self):
        validate(self)
        _check_combine(self)
        _check_slots(self)


@dataclasses.dataclass(frozen=True)
class NopConfig(FlitParams):
    """Parameters of ``nop_tree``: :class:`FlitParams` and

    Parameters
    ----------
    fanouts : tuple of int
        Children per switch, root level first (each 2..16, 1..4 levels, at most 64 leaves).
        ``(4, 4)``: a root switch over 4 group switches of 4 leaves each.
    link_check : str
        ``none``, ``parity`` or ``crc8``: check bits on every switch-to-switch link, checked at
        the receiving switch; a flit that fails is never delivered or combined, its packet is
        dropped and its token leaves the root as one ``abort`` flit (docs/blocks/nop.md).
    fault_inject : int
        Test only (0 or 1; 1 needs a ``link_check``): ``down_link_flip``/``up_link_flip``
        inputs XORed into the flit of every switch-to-switch link, for fault-injection tests.
        Leave 0 in a design.

    Raises
    ------
    ParamError
        On any value out of range.
    """
    fanouts: tuple = int_list_param((4, 4), 2, 16, 4, "children per switch, root level first")
    link_check: str = choice_param("none", golden.LINK_CHECKS,
                                   "check bits on switch-to-switch links: none, parity, CRC-8")
    fault_inject: int = int_param(0, 0, 1, "test only: bit-flip inputs on every internal link")

    def __post_init__(self):
        validate(self)
        _check_combine(self)
        _check_slots(self)
        _check_leaves(self.fanouts)
        _check_links(self)

    @property
    def leaves(self):
        return math.prod(self.fanouts)


@dataclasses.dataclass(frozen=True)
class NopSwitchConfig(FlitParams):
    """Parameters of ``nop_switch`` (one switch whose children are the leaves):
    :class:`FlitParams` and

    Parameters
    ----------
    fanout : int
        F, child sides (2..16).
    """
    fanout: int = int_param(4, 2, 16, "F, child sides")

    @property
    def fanouts(self):
        return (self.fanout,)

    @property
    def leaves(self):
        return self.fanout


def _link_check(config):
    return getattr(config, "link_check", "none")


def _flit(config, fields, checked):
    """A flit layout: ``check`` bits first on a switch-to-switch link (``checked``), then
    ``fields``, then ``abort`` when the tree checks its links."""
    kind = _link_check(config)
    head = {"check": golden.CHECK_BITS[kind]} if checked and kind != "none" else {}
    tail = {"abort": 1} if kind != "none" else {}
    return data.StructLayout({**head, **fields, **tail})


def down_layout(config, checked=False):
    """Dispatch flit: ``token``, ``mask`` (bit i = leaf i), ``data`` lanes, ``last``; with
    ``link_check``, ``abort`` (and ``check`` at bit 0 on a switch-to-switch link)."""
    return _flit(config, {
        "token": config.token_width,
        "mask": config.leaves,
        "data": data.ArrayLayout(signed(config.data_width), config.lanes),
        "last": 1,
    }, checked)


def _combine_dtype(config):
    return getattr(config, "combine_dtype", "int")


def up_layout(config, checked=False):
    """Combine flit: ``token``, ``data`` lanes (``acc_width``: signed integers, or the codes of
    ``combine_dtype``), ``last``; with ``link_check``, ``abort`` (and ``check``, as above)."""
    lane = signed(config.acc_width) if _combine_dtype(config) == "int" else config.acc_width
    return _flit(config, {
        "token": config.token_width,
        "data": data.ArrayLayout(lane, config.lanes),
        "last": 1,
    }, checked)


def _ports(config, children, parent_link=False, child_links=False):
    ports = {
        "down_in": In(stream.Signature(down_layout(config, parent_link))),
        "up_out": Out(stream.Signature(up_layout(config, parent_link))),
        "down_out": Out(stream.Signature(down_layout(config, child_links))).array(children),
        "up_in": In(stream.Signature(up_layout(config, child_links))).array(children),
        "error": Out(1),
    }
    if parent_link:     # the flit on down_in fails its check; the parent's word on the flit it took
        ports.update(down_in_bad=Out(1), up_out_nack=In(1))
    if child_links:
        ports.update(down_out_nack=In(children), up_in_nack=Out(children))
    return ports


def _check_code(m, kind, message, name):
    """The check bits of ``message`` (``golden.nop.link_check``) as XORs of its bits."""
    terms = golden.check_terms(kind, len(message))
    code = Signal(len(terms), name=name)
    m.d.comb += code.eq(Cat(Cat(message[i] for i in term).xor() if term else Const(0)
                            for term in terms))
    return code


def _receive(m, kind, port, layout, checked, name):
    """The message of the flit on ``port`` (a view of ``layout``) and whether it fails its
    check (never, on a link without check bits)."""
    if not checked:
        return port.payload, Const(0)
    bits = port.payload.as_value()
    width = golden.CHECK_BITS[kind]
    bad = Signal(name=f"{name}_bad")
    m.d.comb += bad.eq(_check_code(m, kind, bits[width:], f"{name}_code") != bits[:width])
    return layout(bits[width:]), bad


def _send(m, kind, port, message, checked, name):
    """Drive ``port.payload`` with ``message``, its check bits first on a checked link."""
    if not checked:
        m.d.comb += port.payload.eq(message)
        return
    bits = message.as_value()
    m.d.comb += port.payload.as_value().eq(Cat(_check_code(m, kind, bits, f"{name}_code"), bits))


def _lowest_set(m, bits, name):
    """Index of the lowest set bit of ``bits`` (0 when none).

    Hand-written: amaranth.lib has no priority encoder or arbiter in 0.5 (lib.coding is
    deprecated). Later assignments win, so the loop runs from the highest index down."""
    index = Signal(range(len(bits)), name=name)
    for position in reversed(range(len(bits))):
        with m.If(bits[position]):
            m.d.comb += index.eq(position)
    return index


def _round_robin_pick(m, requests, pointer, name):
    """Index of the first set bit of ``requests`` at or after ``pointer`` (wrapping), and "any"."""
    at_or_after = Signal(len(requests), name=f"{name}_at_or_after")
    # i >= pointer holds for every value of a pointer of log2(n) bits when i is its largest:
    # written as a constant there (no comparison that lint reports as constant).
    top = (1 << len(pointer)) - 1
    m.d.comb += at_or_after.eq(Cat(requests[i] & (1 if i == top else i >= pointer)
                                   for i in range(len(requests))))
    pick = Signal(range(len(requests)), name=f"{name}_pick")
    m.d.comb += pick.eq(Mux(at_or_after.any(), _lowest_set(m, at_or_after, f"{name}_after"),
                            _lowest_set(m, requests, f"{name}_first")))
    return pick, requests.any()


class NopSwitch(ConfiguredComponent):
    """One NoP switch over children ``base + i*span ... base + (i+1)*span - 1`` (leaf indices).

    Parameters
    ----------
    config : NopConfig or NopSwitchConfig
        Flit shape and capacity (``fanouts``/``leaves`` give the mask width).
    fanout : int
        F, child sides of this switch.
    base, span : int
        First leaf of this switch's subtree and leaves per child subtree.

    Members
    -------
    down_in : In(stream)  ; up_out : Out(stream)
        Parent side.
    down_out : Out(stream) array of F ; up_in : In(stream) array of F
        Child sides (``up_in`` is always ready).
    error : Out(1)
        Sticky protocol error (docs/blocks/nop.md): a dispatch with no destination in this subtree,
        a return for a token not owed by that child, a return longer than ``max_flits`` or of a
        different length than the dispatched packet, a first flit with ``abort`` set.
    down_in_bad : Out(1) ; up_out_nack : In(1)
        With ``parent_link``: the flit offered on ``down_in`` fails its check (combinational:
        the tree's link answers the sender, ``NopTree``); the parent says the flit it took from
        ``up_out`` failed its check (this cycle).
    down_out_nack : In(F) ; up_in_nack : Out(F)
        With ``child_links``: the same words on the child side.

    ``parent_link``/``child_links``: the parent side / the child sides are switch-to-switch
    links of a tree with ``link_check`` (check bits on them, checked on input).
    """

    def __init__(self, config, fanout=None, base=0, span=1, parent_link=False,
                 child_links=False):
        self.fanout = fanout or config.fanouts[0]
        self.base, self.span = base, span
        self.kind = _link_check(config)
        self.parent_link = parent_link and self.kind != "none"
        self.child_links = child_links and self.kind != "none"
        super().__init__(config, _ports(config, self.fanout, self.parent_link, self.child_links))

    def elaborate(self, platform):
        m = Module()
        cfg, F = self.config, self.fanout
        slots, P = cfg.max_inflight, cfg.max_flits
        error = Signal()
        m.d.comb += self.error.eq(error)

        # --- slot table (registers: the CAM lookups need every entry at once) ---
        valid = [Signal(name=f"slot{s}_valid") for s in range(slots)]
        token = [Signal(cfg.token_width, name=f"slot{s}_token") for s in range(slots)]
        owed = [Signal(F, name=f"slot{s}_owed") for s in range(slots)]
        arrived = [Signal(F, name=f"slot{s}_arrived") for s in range(slots)]
        dispatched = [Signal(name=f"slot{s}_dispatched") for s in range(slots)]
        flits = [Signal(range(P + 1), name=f"slot{s}_flits") for s in range(slots)]
        # The packet is one flit long, set beside `flits` (the clock rate: the emitter's first
        # flit reads this bit, not a compare of the chosen slot's length).
        single = [Signal(name=f"slot{s}_single") for s in range(slots)]
        # Length of each child's return (P + 1: longer than P). A return whose length differs
        # from the dispatched packet's is dropped: the combine leaves that child out.
        returned = [[Signal(range(P + 2), name=f"slot{s}_returned{c}") for c in range(F)]
                    for s in range(slots)]

        checking = self.kind != "none"
        # A slot whose packet or return failed a link check (or came back aborted): it leaves
        # as one abort flit.
        poisoned = [Signal(name=f"slot{s}_poisoned") for s in range(slots)]

        # --- dispatch ---
        flit, bad_in = _receive(m, self.kind, self.down_in, down_layout(cfg), self.parent_link,
                                "down_in")
        # A bad flit, or a good one with abort set, voids the packet it belongs to.
        void = Signal()
        if checking:
            m.d.comb += void.eq(bad_in | flit.abort)
        if self.parent_link:
            m.d.comb += self.down_in_bad.eq(bad_in)
        in_packet = Signal()       # a packet's first flit has passed, not yet its last
        dropping = Signal()        # the current packet has no destination here: consumed
        cur_slot = Signal(range(slots))
        cur_dests = Signal(F)
        cur_count = Signal(range(P + 1))
        cur_head = Signal(down_layout(cfg))    # the packet's first flit: an abort repeats it
        mask_dests = Signal(F)
        for child in range(F):
            low = self.base + child * self.span
            m.d.comb += mask_dests[child].eq(flit.mask[low:low + self.span].any())
        dests = Mux(in_packet, cur_dests, mask_dests)

        free_requests = Signal(slots)
        m.d.comb += free_requests.eq(Cat(~v for v in valid))
        free_slot, any_free = _lowest_set(m, free_requests, "free_pick"), free_requests.any()
        token_busy = Signal()
        m.d.comb += token_busy.eq(Cat(v & (t == flit.token) for v, t in zip(valid, token)).any())

        out_valid = Signal(F)
        out_payload = [Signal(down_layout(cfg), name=f"down_out{c}_payload") for c in range(F)]
        out_slot = [Signal(range(slots), name=f"down_out{c}_slot") for c in range(F)]
        for child in range(F):
            port = self.down_out[child]
            m.d.comb += port.valid.eq(out_valid[child])
            _send(m, self.kind, port, out_payload[child], self.child_links, f"down_out{child}")
            with m.If(port.ready):
                m.d.sync += out_valid[child].eq(0)
        outputs_free = Cat(~out_valid[c] | self.down_out[c].ready for c in range(F))
        fork_ready = ((dests & ~outputs_free) == 0)
        first_ok = (mask_dests == 0) | (any_free & ~token_busy)
        # A void first flit is consumed at once (nothing forwarded); a void flit inside a packet
        # waits for the packet's outputs, where its abort goes.
        take = self.down_in.valid & self.down_in.ready
        # A free output register loads an input flit bound for it, forwarded or not (its valid
        # says which): the payload's load enable waits only for its own child's ready, not for
        # the whole fork's or the slot check (the clock rate of a tree: ready crosses levels).
        for child in range(F):
            with m.If(self.down_in.valid & dests[child] & outputs_free[child]):
                m.d.sync += out_payload[child].eq(flit)
        if not checking:
            m.d.comb += self.down_in.ready.eq(fork_ready & (in_packet | first_ok))
            forward = m.If(take)
        else:
            m.d.comb += self.down_in.ready.eq(Mux(in_packet, fork_ready,
                                                  (fork_ready & first_ok) | void))
            # The two void cases spelled out with their own ready terms, so the output
            # registers' abort load does not see the first flit's slot check (the clock rate).
            void_inside = self.down_in.valid & in_packet & fork_ready & void
            void_first = self.down_in.valid & ~in_packet & void         # taken at once
            with m.If(void_inside):
                # End the packet here: every child it went to gets its first flit again with
                # abort and last set and zero data; this switch owes nothing for it.
                for child in range(F):
                    with m.If(cur_dests[child]):
                        aborting = out_payload[child]
                        m.d.sync += [out_valid[child].eq(1), aborting.eq(cur_head),
                                     aborting.data.eq(0), aborting.last.eq(1),
                                     aborting.abort.eq(1)]
                m.d.sync += in_packet.eq(0)
                with m.If(~dropping):
                    m.d.sync += Array(valid)[cur_slot].eq(0)
            with m.Elif(void_first):
                with m.If(~bad_in):
                    m.d.sync += error.eq(1)             # a first flit with abort set: dropped
            forward = m.Elif(take)
        with forward:
            for child in range(F):
                with m.If(dests[child]):
                    m.d.sync += out_valid[child].eq(1)
                    if self.child_links:
                        m.d.sync += out_slot[child].eq(Mux(in_packet, cur_slot, free_slot))
            count = Mux(in_packet, cur_count, 0) + 1
            kept_count = Mux(count > P, P, count)     # a packet longer than P combines P flits
            with m.If(~in_packet):
                m.d.sync += [cur_dests.eq(mask_dests), cur_slot.eq(free_slot),
                             dropping.eq(mask_dests == 0)]
                if checking:
                    m.d.sync += cur_head.eq(flit)
                with m.If(mask_dests == 0):
                    m.d.sync += error.eq(1)
            with m.If(count > P):
                m.d.sync += error.eq(1)
            m.d.sync += [cur_count.eq(kept_count), in_packet.eq(~flit.last)]
            slot_now = Mux(in_packet, cur_slot, free_slot)
            owner = ~Mux(in_packet, dropping, mask_dests == 0)
            for s in range(slots):
                with m.If(owner & (slot_now == s)):
                    with m.If(~in_packet):
                        m.d.sync += [valid[s].eq(1), token[s].eq(flit.token),
                                     owed[s].eq(mask_dests), arrived[s].eq(0),
                                     dispatched[s].eq(0)]
                        if checking:
                            m.d.sync += poisoned[s].eq(0)
                    with m.If(flit.last):
                        m.d.sync += [dispatched[s].eq(1), flits[s].eq(kept_count),
                                     single[s].eq(kept_count == 1)]

        # A child says the flit it just took failed its check: it owes nothing for that packet,
        # the slot leaves as an abort, and the rest of the packet is not sent to it.
        if self.child_links:
            for child in range(F):
                with m.If(self.down_out_nack[child]):
                    for s in range(slots):
                        with m.If(out_slot[child] == s):
                            m.d.sync += [owed[s][child].eq(0), poisoned[s].eq(1)]
                    with m.If(~out_payload[child].last):
                        m.d.sync += [out_valid[child].eq(0), cur_dests[child].eq(0)]

        # --- combine: per-child buffers written at (slot, flit index) ---
        acc_layout = up_layout(cfg).members["data"]
        read_ports = []
        # A return flit is matched to its slot at the edge it is taken and written into the
        # buffer at the next (the clock rate: the token lookup and the write are different
        # cycles); `closing` is the slot whose return ends in that write stage.
        closing = [Signal(slots, name=f"up{child}_closing") for child in range(F)]
        emit_slot = Signal(range(slots))
        emit_index = Signal(range(P))
        advance = Signal()
        for child in range(F):
            port = self.up_in[child]
            m.d.comb += port.ready.eq(1)
            ret, bad = _receive(m, self.kind, port, up_layout(cfg), self.child_links,
                                f"up_in{child}")
            if self.child_links:
                m.d.comb += self.up_in_nack[child].eq(port.valid & bad)
            memory = Memory(shape=acc_layout, depth=slots * P, init=[])
            m.submodules[f"buffer{child}"] = memory
            write = memory.write_port()
            read = memory.read_port(transparent_for=())
            read_ports.append(read)
            m.d.comb += [read.addr.eq(emit_slot * P + emit_index), read.en.eq(advance)]

            count = Signal(range(P + 2), name=f"up{child}_count")     # saturates at P + 1
            # The slots this flit's token matches (a named net: waveforms show the lookup).
            hits = Signal(slots, name=f"up{child}_hits")
            m.d.comb += hits.eq(Cat(valid[s] & owed[s][child] & ~arrived[s][child] &
                                    ~closing[child][s] & (token[s] == ret.token)
                                    for s in range(slots)))
            # The write stage, loaded at every edge (no enable on the lookup's path): the slot
            # the taken flit hit (at most one bit: the valid slots hold distinct tokens, as a
            # packet whose token is in flight waits at down_in), its index, data and length.
            taken = port.valid & ~bad if self.child_links else port.valid
            st_hits = Signal(slots, name=f"up{child}_st_hits")
            st_taken, st_room, st_last, st_abort = (
                Signal(name=f"up{child}_st_{n}") for n in ("taken", "room", "last", "abort"))
            st_index = Signal(range(P), name=f"up{child}_st_index")
            st_data = Signal(acc_layout, name=f"up{child}_st_data")
            st_length = Signal(range(P + 2), name=f"up{child}_st_length")
            m.d.sync += [st_hits.eq(Mux(taken, hits, 0)), st_taken.eq(taken),
                         st_room.eq(count < P), st_last.eq(ret.last),
                         st_index.eq(count[:len(st_index)]), st_data.eq(ret.data),
                         st_length.eq(Mux(count > P, count, count + 1))]
            if checking:
                m.d.sync += st_abort.eq(ret.abort)
            # A return's end closes its slot to further returns from the edge it is taken.
            m.d.comb += closing[child].eq(Mux(st_last, st_hits, 0))
            st_hit = st_hits.any()
            st_slot = or_tree([Mux(st_hits[s], s * P, 0) for s in range(slots)])
            m.d.comb += [write.addr.eq(st_slot + st_index), write.en.eq(st_hit & st_room),
                         write.data.eq(st_data)]
            # A flit that no slot owes, or beyond P, is not written: error.
            with m.If(st_taken & ~(st_hit & st_room)):
                m.d.sync += error.eq(1)
            # A bad flit is not taken and changes nothing: the child answers the nack by
            # ending its return with an abort flit.
            with m.If(taken):
                m.d.sync += count.eq(Mux(ret.last, 0, Mux(count > P, count, count + 1)))
            with m.If(st_last):
                for s in range(slots):
                    with m.If(st_hits[s]):
                        m.d.sync += [arrived[s][child].eq(1), returned[s][child].eq(st_length)]
                        if checking:
                            with m.If(st_abort):
                                m.d.sync += poisoned[s].eq(1)

        # --- emit completed slots upward, one flit per cycle ---
        complete = Signal(slots)
        m.d.comb += complete.eq(Cat(v & d & (a == o) for v, d, a, o in
                                    zip(valid, dispatched, arrived, owed)))
        pointer = Signal(range(slots))
        busy = Signal()
        busy_slot = Signal(range(slots))
        busy_index = Signal(range(P))
        busy_last = Signal()                   # the busy slot's next flit is its last
        # The next slot to leave is chosen a cycle ahead into a register (`chosen`), so the
        # round-robin pick and the buffer read are in different cycles (the clock rate): the
        # pick never offers the slot already chosen or the one leaving.
        chosen = Signal(range(slots))
        chosen_valid = Signal()
        candidates = Signal(slots)
        m.d.comb += candidates.eq(complete & ~Mux(chosen_valid, 1 << chosen, 0)
                                  & ~Mux(busy, 1 << busy_slot, 0))
        pick, any_complete = _round_robin_pick(m, candidates, pointer, "done")
        issuing = busy | chosen_valid
        m.d.comb += [emit_slot.eq(Mux(busy, busy_slot, chosen)),
                     emit_index.eq(Mux(busy, busy_index, 0))]
        slot_flits, slot_owed = Array(flits)[emit_slot], Array(owed)[emit_slot]
        # The children whose return has the dispatched length; the others are dropped.
        length_ok = [Signal(F, name=f"slot{s}_length_ok") for s in range(slots)]
        for s in range(slots):
            m.d.comb += length_ok[s].eq(Cat(returned[s][c] == flits[s] for c in range(F)))
        slot_used = slot_owed & Array(length_ok)[emit_slot]
        slot_token = Array(token)[emit_slot]
        # Whether this flit ends its slot: a register or a one-bit select, so the length
        # compare is off the path from `chosen` into `valid` and `busy` (the clock rate).
        final = Mux(busy, busy_last, Array(single)[chosen])
        if checking:
            slot_poisoned = Array(poisoned)[emit_slot]
            final = final | slot_poisoned      # an abort is one flit

        out_full = Signal()
        out_owed = Signal(F)
        out_token = Signal(cfg.token_width)
        out_last = Signal()
        out_abort = Signal()
        m.d.comb += advance.eq(~out_full | self.up_out.ready)
        if self.parent_link:
            with m.If(advance & self.up_out_nack):
                # The parent took the flit and found it bad: send an abort for its token next,
                # and end the slot it came from if that flit was not the slot's last.
                m.d.sync += [out_full.eq(1), out_last.eq(1), out_abort.eq(1)]
                with m.If(~out_last):
                    m.d.sync += [busy.eq(0), Array(valid)[busy_slot].eq(0)]
            emitting = m.Elif(advance)
        else:
            emitting = m.If(advance)
        with emitting:
            m.d.sync += [out_full.eq(issuing), out_owed.eq(slot_used), out_token.eq(slot_token),
                         out_last.eq(final)]
            wrong_length = issuing & (slot_used != slot_owed)
            if checking:
                m.d.sync += out_abort.eq(slot_poisoned)
                wrong_length = wrong_length & ~slot_poisoned
            with m.If(wrong_length):
                m.d.sync += error.eq(1)
            with m.If(issuing):
                with m.If(final):
                    m.d.sync += [busy.eq(0), Array(valid)[emit_slot].eq(0)]
                with m.Else():
                    m.d.sync += [busy.eq(1), busy_slot.eq(emit_slot),
                                 busy_index.eq(emit_index + 1),
                                 busy_last.eq(emit_index + 2 >= slot_flits)]
        # Choose when nothing is chosen or the chosen slot starts leaving at this edge (it
        # enters up_out), round-robin from the slot after the last one chosen.
        starts = advance & ~busy
        if self.parent_link:
            starts = starts & ~self.up_out_nack       # (an abort flit goes first)
        with m.If(~chosen_valid | starts):
            m.d.sync += [chosen.eq(pick), chosen_valid.eq(any_complete)]
            with m.If(any_complete):
                m.d.sync += pointer.eq(Mux(pick + 1 == slots, 0, pick + 1))
        # The read data holds while the output waits (read enable = advance).
        up_flit = Signal(up_layout(cfg)) if self.parent_link else self.up_out.payload
        for lane in range(cfg.lanes):
            if cfg.combine_dtype == "int":
                total = Const(0, signed(cfg.acc_width))
                for child, read in enumerate(read_ports):
                    total = total + Mux(out_owed[child], read.data[lane], 0)
            else:
                total = self._float_sum(m, [read.data[lane] for read in read_ports], out_owed,
                                        f"lane{lane}")
            m.d.comb += up_flit.data[lane].eq(Mux(out_abort, 0, total) if checking else total)
        m.d.comb += [self.up_out.valid.eq(out_full), up_flit.token.eq(out_token),
                     up_flit.last.eq(out_last)]
        if checking:
            m.d.comb += up_flit.abort.eq(out_abort)
        if self.parent_link:
            _send(m, self.kind, self.up_out, up_flit, True, "up_out")
        return m


    def _float_sum(self, m, values, used, name):
        """((c0 + c1) + c2) + ... over the children in ``used``, each addition rounded
        (``hw.fparith.fp_add``); +0 when none is used."""
        fmt = fp.FORMATS[self.config.combine_dtype]
        total, any_used = Const(0, fmt.width), Const(0)
        for child, value in enumerate(values):
            step = Signal(fmt.width, name=f"{name}_sum{child}")
            if child == 0:
                m.d.comb += step.eq(Mux(used[child], value, total))
            else:
                added = fp_add(m, total, value, fmt, f"{name}_add{child}")
                m.d.comb += step.eq(Mux(used[child], Mux(any_used, added, value), total))
            total, any_used = step, any_used | used[child]
        return total


class NopTree(ConfiguredComponent):
    """Switches composed by ``config.fanouts``: root dispatch in / combine out, one stream pair per
    leaf, and ``down_link_fire``/``up_link_fire`` taps (one bit per switch-to-switch link, high in
    a cycle that link transfers a flit; a down link transfers where the parent's flit enters its
    skid slice) for link-traffic monitors.

    Internal links are numbered breadth-first: link ``j`` connects the ``j``-th non-root switch
    (level by level, left to right) to its parent.

    With ``link_check``: ``down_link_errors``/``up_link_errors`` (a 16-bit count per internal
    link, saturating: flits that failed their check on it, taken by a down link's skid slice or
    on the parent's ``up_in``) and the sticky ``link_error``. With ``fault_inject`` (tests
    only): ``down_link_flip``/``up_link_flip``, one word per internal link XORed into the link's
    flit (check bits at bit 0).
    """

    def __init__(self, config):
        self.internal_links = sum(math.prod(config.fanouts[:level + 1])
                                  for level in range(len(config.fanouts) - 1))
        ports = _ports(config, config.leaves)
        ports["down_link_fire"] = Out(max(1, self.internal_links))
        ports["up_link_fire"] = Out(max(1, self.internal_links))
        links = self.internal_links
        if config.link_check != "none":
            ports["down_link_errors"] = Out(data.ArrayLayout(unsigned(ERROR_COUNT_WIDTH), links))
            ports["up_link_errors"] = Out(data.ArrayLayout(unsigned(ERROR_COUNT_WIDTH), links))
            ports["link_error"] = Out(1)
        if config.fault_inject:
            ports["down_link_flip"] = In(data.ArrayLayout(down_layout(config, True).size, links))
            ports["up_link_flip"] = In(data.ArrayLayout(up_layout(config, True).size, links))
        super().__init__(config, ports)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        errors = []
        levels = []          # switches per level, left to right
        for level, fanout in enumerate(cfg.fanouts):
            span = math.prod(cfg.fanouts[level + 1:])
            count = math.prod(cfg.fanouts[:level])
            row = []
            for index in range(count):
                switch = NopSwitch(cfg, fanout, base=index * fanout * span, span=span,
                                   parent_link=level > 0,
                                   child_links=level + 1 < len(cfg.fanouts))
                m.submodules[f"switch_l{level}_{index}"] = switch
                errors.append(switch.error)
                row.append(switch)
            levels.append(row)
        wiring.connect(m, wiring.flipped(self.down_in), levels[0][0].down_in)
        wiring.connect(m, wiring.flipped(self.up_out), levels[0][0].up_out)
        link = 0
        link_bad = []           # a flit failed its check on some link this cycle
        for level in range(1, len(levels)):
            parent_fanout = cfg.fanouts[level - 1]
            for index, switch in enumerate(levels[level]):
                parent = levels[level - 1][index // parent_fanout]
                child = index % parent_fanout
                down_nack = self._down_link(m, link, parent.down_out[child], switch)
                self._flipped(m, link, switch.up_out, parent.up_in[child], "up")
                if cfg.link_check != "none":
                    m.d.comb += [parent.down_out_nack[child].eq(down_nack),
                                 switch.up_out_nack.eq(parent.up_in_nack[child])]
                    self._count_errors(m, link, down_nack, parent.up_in_nack[child])
                    link_bad += [down_nack, parent.up_in_nack[child]]
                m.d.comb += [
                    self.down_link_fire[link].eq(parent.down_out[child].valid &   # enters
                                                 parent.down_out[child].ready),   # the skid
                    self.up_link_fire[link].eq(switch.up_out.valid & switch.up_out.ready)]
                link += 1
        bottom, fanout = levels[-1], cfg.fanouts[-1]
        for leaf in range(cfg.leaves):
            switch = bottom[leaf // fanout]
            wiring.connect(m, switch.down_out[leaf % fanout], wiring.flipped(self.down_out[leaf]))
            wiring.connect(m, wiring.flipped(self.up_in[leaf]), switch.up_in[leaf % fanout])
        m.d.comb += self.error.eq(Cat(errors).any())
        if link_bad:
            flag = Signal()
            m.d.comb += self.link_error.eq(flag)
            with m.If(Cat(link_bad).any()):
                m.d.sync += flag.eq(1)
        return m

    def _flipped(self, m, link, sender, receiver, direction):
        """Connect ``sender`` to ``receiver`` (a return link, or a dispatch link's slice); with
        ``fault_inject`` the flit passes through an XOR with the link's flip input."""
        if not self.config.fault_inject:
            wiring.connect(m, sender, receiver)
            return
        flip = getattr(self, f"{direction}_link_flip")[link]
        m.d.comb += [receiver.valid.eq(sender.valid), sender.ready.eq(receiver.ready),
                     receiver.payload.as_value().eq(sender.payload.as_value() ^ flip)]

    def _down_link(self, m, link, sender, switch):
        """A switch-to-switch dispatch link into ``switch``: a skid slice, so the child's ready
        reaches the parent a cycle later, as a register, instead of through every level below
        in one cycle (the clock rate). With a ``link_check`` the returned nack says the flit the
        slice takes this cycle fails its check: the slice takes only while empty, and then
        passes the link's flit straight to the switch, whose check (``down_in_bad``) is of that
        flit; so the nack depends on the flit and the slice's register, not on the switch's
        slots or outputs, and the link needs no checker of its own."""
        skid = SkidSlice(sender.payload.shape())
        m.submodules[f"down_link{link}_skid"] = skid
        self._flipped(m, link, sender, skid.i, "down")
        wiring.connect(m, skid.o, switch.down_in)
        if self.config.link_check == "none":
            return None
        nack = Signal(name=f"down_link{link}_nack")
        m.d.comb += nack.eq(skid.i.valid & skid.i.ready & switch.down_in_bad)
        return nack

    def _count_errors(self, m, link, down_bad, up_bad):
        """Saturating counts of the flits that failed their check on ``link``."""
        for direction, bad in (("down", down_bad), ("up", up_bad)):
            count = Signal(ERROR_COUNT_WIDTH, name=f"{direction}_link{link}_errors")
            m.d.comb += getattr(self, f"{direction}_link_errors")[link].eq(count)
            with m.If(bad & ~count.all()):
                m.d.sync += count.eq(count + 1)


def _figures(config):
    return golden.figures(config.fanouts)


register(Block(
    name="nop_switch", family="nop", config=NopSwitchConfig, build=NopSwitch, figures=_figures,
    summary="NoP switch: dedup multicast dispatch, in-network combine of 2..16 children (Mozart)",
    demo_configs=({"fanout": 4},),
    legend=("flits per cycle per link (burst root/leaf/combine, continuous root), hop latency, r = "
            "leaf copies per token of a synthetic top-2 trace, round-robin vs clustered "
            "placement, root-link flits per token forwarding every expert / every leaf / "
            "in-network combine"),
    area_unit="port", operation="flit", area_units=lambda cfg: cfg.fanout + 1,
))
register(Block(
    name="nop_tree", family="nop", config=NopConfig, build=NopTree, figures=_figures,
    summary="NoP tree of switches by fanouts: root dispatch/combine, one stream pair per leaf",
    demo_configs=({"fanouts": (4, 4)}, {"fanouts": (4, 4), "link_check": "crc8"}),
    legend=("flits per cycle per link (burst root/leaf/combine, continuous root), hop latency, r = "
            "leaf copies per token of a synthetic top-2 trace, round-robin vs clustered "
            "placement, root-link flits per token forwarding every expert / every leaf / "
            "in-network combine"),
    area_unit="switch", operation="flit", area_units=lambda cfg: sum(math.prod(cfg.fanouts[:level])
                                                   for level in range(len(cfg.fanouts))),
    # With link checks, each switch is mapped on its own: flattened, a sender's check and the
    # receiver's recomputation of it are one net, and Yosys removes the checker as a
    # tautology. Gate by gate: Yosys 0.70's ABC fails an internal assertion (rtlil.cc:3091,
    # ABC_OPS_REINTEGRATE) on the flattened parity tree.
    synth_flatten=lambda cfg: cfg.link_check == "none",
    synth_abc=lambda cfg: cfg.link_check == "none",
))
