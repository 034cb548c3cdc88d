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
  free. Completed slots leave in round-robin order, so returns may come in any order.
"""

import dataclasses
import math

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden import fp
from golden import nop as golden
from hw.fparith import fp_add
from hw.params import (ConfiguredComponent, choice_param, int_list_param, int_param, param_error,
                       validate)
from hw.registry import Block, register

__all__ = ["FlitParams", "NopConfig", "NopSwitchConfig", "NopSwitch", "NopTree", "down_layout",
           "up_layout"]

MAX_LEAVES = 64


def _check_combine(config):
    if config.combine_dtype != "int":
        width = fp.FORMATS[config.combine_dtype].width
        if config.acc_width != width:
            raise param_error("acc_width", config.acc_width,
                              f"{width} with combine_dtype {config.combine_dtype} (its codes)")


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
        Tokens a switch tracks between dispatch and combine (1..64).
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


@dataclasses.dataclass(frozen=True)
class NopConfig(FlitParams):
    """Parameters of ``nop_tree``: :class:`FlitParams` and

    Parameters
    ----------
    fanouts : tuple of int
        Children per switch, root level first (each 2..16, 1..4 levels, at most 64 leaves).
        ``(4, 4)``: a root switch over 4 group switches of 4 leaves each.

    Raises
    ------
    ParamError
        On any value out of range.
    """
    fanouts: tuple = int_list_param((4, 4), 2, 16, 4, "children per switch, root level first")

    def __post_init__(self):
        validate(self)
        _check_combine(self)
        _check_leaves(self.fanouts)

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


def down_layout(config):
    """Dispatch flit: ``token``, ``mask`` (bit i = leaf i), ``data`` lanes, ``last``."""
    return data.StructLayout({
        "token": config.token_width,
        "mask": config.leaves,
        "data": data.ArrayLayout(signed(config.data_width), config.lanes),
        "last": 1,
    })


def _combine_dtype(config):
    return getattr(config, "combine_dtype", "int")


def up_layout(config):
    """Combine flit: ``token``, ``data`` lanes (``acc_width``: signed integers, or the codes of
    ``combine_dtype``), ``last``."""
    lane = signed(config.acc_width) if _combine_dtype(config) == "int" else config.acc_width
    return data.StructLayout({
        "token": config.token_width,
        "data": data.ArrayLayout(lane, config.lanes),
        "last": 1,
    })


def _ports(config, children):
    return {
        "down_in": In(stream.Signature(down_layout(config))),
        "up_out": Out(stream.Signature(up_layout(config))),
        "down_out": Out(stream.Signature(down_layout(config))).array(children),
        "up_in": In(stream.Signature(up_layout(config))).array(children),
        "error": Out(1),
    }


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
    m.d.comb += at_or_after.eq(Cat(requests[i] & (i >= pointer) for i in range(len(requests))))
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
        different length than the dispatched packet.
    """

    def __init__(self, config, fanout=None, base=0, span=1):
        self.fanout = fanout or config.fanouts[0]
        self.base, self.span = base, span
        super().__init__(config, _ports(config, self.fanout))

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
        # Length of each child's return (P + 1: longer than P). A return whose length differs
        # from the dispatched packet's is dropped: the combine leaves that child out.
        returned = [[Signal(range(P + 2), name=f"slot{s}_returned{c}") for c in range(F)]
                    for s in range(slots)]

        # --- dispatch ---
        flit = self.down_in.payload
        in_packet = Signal()       # a packet's first flit has passed, not yet its last
        dropping = Signal()        # the current packet has no destination here: consumed
        cur_slot = Signal(range(slots))
        cur_dests = Signal(F)
        cur_count = Signal(range(P + 1))
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
        for child in range(F):
            port = self.down_out[child]
            m.d.comb += [port.valid.eq(out_valid[child]), port.payload.eq(out_payload[child])]
            with m.If(port.ready):
                m.d.sync += out_valid[child].eq(0)
        outputs_free = Cat(~out_valid[c] | self.down_out[c].ready for c in range(F))
        fork_ready = ((dests & ~outputs_free) == 0)
        first_ok = (mask_dests == 0) | (any_free & ~token_busy)
        m.d.comb += self.down_in.ready.eq(fork_ready & (in_packet | first_ok))

        with m.If(self.down_in.valid & self.down_in.ready):
            for child in range(F):
                with m.If(dests[child]):
                    m.d.sync += [out_valid[child].eq(1), out_payload[child].eq(flit)]
            count = Mux(in_packet, cur_count, 0) + 1
            kept_count = Mux(count > P, P, count)     # a packet longer than P combines P flits
            with m.If(~in_packet):
                m.d.sync += [cur_dests.eq(mask_dests), cur_slot.eq(free_slot),
                             dropping.eq(mask_dests == 0)]
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
                    with m.If(flit.last):
                        m.d.sync += [dispatched[s].eq(1), flits[s].eq(kept_count)]

        # --- combine: per-child buffers written at (slot, flit index) ---
        acc_layout = up_layout(cfg).members["data"]
        read_ports = []
        emit_slot = Signal(range(slots))
        emit_index = Signal(range(P))
        advance = Signal()
        for child in range(F):
            port = self.up_in[child]
            m.d.comb += port.ready.eq(1)
            memory = Memory(shape=acc_layout, depth=slots * P, init=[])
            m.submodules[f"buffer{child}"] = memory
            write = memory.write_port()
            read = memory.read_port(transparent_for=())
            read_ports.append(read)
            m.d.comb += [read.addr.eq(emit_slot * P + emit_index), read.en.eq(advance)]

            count = Signal(range(P + 2), name=f"up{child}_count")     # saturates at P + 1
            # A signal, not an expression: every bit is read by the priority pick, and an
            # expression would be emitted again for each read (slots^2 terms per child).
            hits = Signal(slots, name=f"up{child}_hits")
            m.d.comb += hits.eq(Cat(valid[s] & owed[s][child] & ~arrived[s][child] &
                                    (token[s] == port.payload.token) for s in range(slots)))
            hit_slot = _lowest_set(m, hits, f"up{child}_slot")
            with m.If(port.valid):
                with m.If(hits.any() & (count < P)):
                    m.d.comb += [write.addr.eq(hit_slot * P + count), write.en.eq(1),
                                 write.data.eq(port.payload.data)]
                with m.Else():
                    m.d.sync += error.eq(1)
                m.d.sync += count.eq(Mux(port.payload.last, 0, Mux(count > P, count, count + 1)))
                with m.If(port.payload.last & hits.any()):
                    for s in range(slots):
                        with m.If(hit_slot == s):
                            m.d.sync += [arrived[s][child].eq(1),
                                         returned[s][child].eq(Mux(count > P, count, count + 1))]

        # --- emit completed slots upward, one flit per cycle ---
        complete = Signal(slots)
        m.d.comb += complete.eq(Cat(v & d & (a == o) for v, d, a, o in
                                    zip(valid, dispatched, arrived, owed)))
        pointer = Signal(range(slots))
        busy = Signal()
        busy_slot = Signal(range(slots))
        busy_index = Signal(range(P))
        pick, any_complete = _round_robin_pick(m, complete, pointer, "done")
        issuing = busy | any_complete
        m.d.comb += [emit_slot.eq(Mux(busy, busy_slot, pick)),
                     emit_index.eq(Mux(busy, busy_index, 0))]
        slot_flits, slot_owed = Array(flits)[emit_slot], Array(owed)[emit_slot]
        # The children whose return has the dispatched length; the others are dropped.
        length_ok = [Signal(F, name=f"slot{s}_length_ok") for s in range(slots)]
        for s in range(slots):
            m.d.comb += length_ok[s].eq(Cat(returned[s][c] == flits[s] for c in range(F)))
        slot_used = slot_owed & Array(length_ok)[emit_slot]
        slot_token = Array(token)[emit_slot]
        final = emit_index + 1 >= slot_flits

        out_full = Signal()
        out_owed = Signal(F)
        out_token = Signal(cfg.token_width)
        out_last = Signal()
        m.d.comb += advance.eq(~out_full | self.up_out.ready)
        with m.If(advance):
            m.d.sync += [out_full.eq(issuing), out_owed.eq(slot_used), out_token.eq(slot_token),
                         out_last.eq(final)]
            with m.If(issuing & (slot_used != slot_owed)):
                m.d.sync += error.eq(1)
            with m.If(issuing):
                with m.If(final):
                    m.d.sync += [busy.eq(0), pointer.eq(Mux(emit_slot + 1 == slots, 0,
                                                            emit_slot + 1))]
                    m.d.sync += Array(valid)[emit_slot].eq(0)
                with m.Else():
                    m.d.sync += [busy.eq(1), busy_slot.eq(emit_slot),
                                 busy_index.eq(emit_index + 1)]
        # The read data holds while the output waits (read enable = advance).
        for lane in range(cfg.lanes):
            if cfg.combine_dtype == "int":
                total = Const(0, signed(cfg.acc_width))
                for child, read in enumerate(read_ports):
                    total = total + Mux(out_owed[child], read.data[lane], 0)
            else:
                total = self._float_sum(m, [read.data[lane] for read in read_ports], out_owed,
                                        f"lane{lane}")
            m.d.comb += self.up_out.payload.data[lane].eq(total)
        m.d.comb += [self.up_out.valid.eq(out_full), self.up_out.payload.token.eq(out_token),
                     self.up_out.payload.last.eq(out_last)]
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
    a cycle that link transfers a flit) for link-traffic monitors.

    Internal links are numbered breadth-first: link ``j`` connects the ``j``-th non-root switch
    (level by level, left to right) to its parent.
    """

    def __init__(self, config):
        self.internal_links = sum(math.prod(config.fanouts[:level + 1])
                                  for level in range(len(config.fanouts) - 1))
        ports = _ports(config, config.leaves)
        ports["down_link_fire"] = Out(max(1, self.internal_links))
        ports["up_link_fire"] = Out(max(1, self.internal_links))
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
                switch = NopSwitch(cfg, fanout, base=index * fanout * span, span=span)
                m.submodules[f"switch_l{level}_{index}"] = switch
                errors.append(switch.error)
                row.append(switch)
            levels.append(row)
        wiring.connect(m, wiring.flipped(self.down_in), levels[0][0].down_in)
        wiring.connect(m, wiring.flipped(self.up_out), levels[0][0].up_out)
        link = 0
        for level in range(1, len(levels)):
            parent_fanout = cfg.fanouts[level - 1]
            for index, switch in enumerate(levels[level]):
                parent = levels[level - 1][index // parent_fanout]
                child = index % parent_fanout
                wiring.connect(m, parent.down_out[child], switch.down_in)
                wiring.connect(m, switch.up_out, parent.up_in[child])
                m.d.comb += [
                    self.down_link_fire[link].eq(switch.down_in.valid & switch.down_in.ready),
                    self.up_link_fire[link].eq(switch.up_out.valid & switch.up_out.ready)]
                link += 1
        bottom, fanout = levels[-1], cfg.fanouts[-1]
        for leaf in range(cfg.leaves):
            switch = bottom[leaf // fanout]
            wiring.connect(m, switch.down_out[leaf % fanout], wiring.flipped(self.down_out[leaf]))
            wiring.connect(m, wiring.flipped(self.up_in[leaf]), switch.up_in[leaf % fanout])
        m.d.comb += self.error.eq(Cat(errors).any())
        return m


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
    area_unit="port", area_units=lambda cfg: cfg.fanout + 1,
))
register(Block(
    name="nop_tree", family="nop", config=NopConfig, build=NopTree, figures=_figures,
    summary="NoP tree of switches by fanouts: root dispatch/combine, one stream pair per leaf",
    demo_configs=({"fanouts": (4, 4)},),
    legend=("flits per cycle per link (burst root/leaf/combine, continuous root), hop latency, r = "
            "leaf copies per token of a synthetic top-2 trace, round-robin vs clustered "
            "placement, root-link flits per token forwarding every expert / every leaf / "
            "in-network combine"),
    area_unit="switch", area_units=lambda cfg: sum(math.prod(cfg.fanouts[:level])
                                                   for level in range(len(cfg.fanouts))),
))
