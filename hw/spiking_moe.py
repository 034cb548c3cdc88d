"""Spiking MoE layer (``spiking_moe``): seed 004 Alg. 1 and Fig. 2(a) — the spiking token
router, E spiking expert cores, the activation and weight buffers, dispatch and merge.

One job is one tile of up to ``max_tokens`` tokens (the routing array's columns):

1. ``act``: D_in words of spikes go into the activation buffer (word d holds S[n, t, d] at bit
   ``n * max_timesteps + t``), while ``w`` fills each expert's local weight buffer (per expert,
   per row tile, per d: R weights) — Alg. 1 "preload W(e) from W GLB into the LB".
2. Routing (step 1): the routing weights stream in on ``wr`` (timestep-major), paired with the
   tokens' spikes read from the activation buffer, into the :class:`SpikingRouter`; each token's
   route leaves on ``route`` and appends the token to its experts' lists.
3. Experts (steps 2-4): every expert with tokens gets a command; its dispatcher streams the
   local weights and the routed tokens' spikes (read from the activation buffer through the
   token list) in the core's tile order; the cores run in parallel.
4. Merge (step 5): each output row is ORed into the output buffer at (tile, token, timestep):
   with K = 1 that is the chosen expert's output, with K > 1 the OR of the K experts'.
5. ``out``: the merged spikes per row tile, token and timestep (the expert core's order).

Tiers (Fig. 2): the routing-score array and the E synaptic-integration arrays are the bottom
tier (:class:`MoeArrays`); buffers, router logic, generators, dispatch and merge the top.

The contract, timing and figures: docs/blocks/spiking_moe.md.
"""

import dataclasses
import functools
import operator

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from hw.params import ConfiguredComponent, int_param, param_error, validate
from hw.pipeline import select
from hw.registry import Block, register
from hw.spiking_base import SisArray, SisTieredComponent, array_signature, tile_counter
from hw.spiking_expert import SpikingExpert, SpikingExpertConfig
from hw.spiking_router import SpikingRouter, SpikingRouterConfig, route_layout

__all__ = ["SpikingMoeConfig", "SpikingMoe", "MoeArrays", "moe_command_layout"]

# Bits of the merged output buffer (flip-flops: E cores write it in the same cycle).
MAX_OUTPUT_BUFFER_BITS = 16384


@dataclasses.dataclass(frozen=True)
class SpikingMoeConfig:
    """Parameters of ``spiking_moe``.

    Parameters
    ----------
    experts : int
        E, spiking expert cores (seed 004: 4).
    rows, cols : int
        R x C of each expert core's array (seed 004: 16 x 128).
    max_tokens : int
        Tokens per job = columns of the routing-score array (seed 004: 16).
    max_timesteps, max_d_in, max_d_out : int
        Largest T, D_in, D_out of a job (they size the buffers).
    w_width, acc_width, v_width : int
        Weight, integration/score and membrane widths (seed 004: 8, 16, 16).
    """
    experts: int = int_param(4, 1, 8, "E, spiking expert cores")
    rows: int = int_param(8, 1, 32, "R, PE rows of an expert core")
    cols: int = int_param(16, 1, 128, "C, PE columns of an expert core")
    max_tokens: int = int_param(8, 1, 32, "tokens per job (routing-array columns)")
    max_timesteps: int = int_param(4, 1, 16, "largest T of a job")
    max_d_in: int = int_param(16, 1, 512, "largest D_in of a job")
    max_d_out: int = int_param(16, 1, 512, "largest D_out of a job")
    w_width: int = int_param(8, 2, 16, "bits of a signed weight")
    acc_width: int = int_param(16, 4, 32, "bits of an integration and a routing score")
    v_width: int = int_param(16, 2, 32, "bits of a membrane potential, Vth and Vleak")

    def __post_init__(self):
        validate(self)
        bits = self.row_tiles * self.max_tokens * self.max_timesteps * self.rows
        if bits > MAX_OUTPUT_BUFFER_BITS:
            raise param_error(
                "max_d_out", self.max_d_out,
                f"an output buffer of at most {MAX_OUTPUT_BUFFER_BITS} bits (ceil(max_d_out / "
                f"rows) x max_tokens x max_timesteps x rows = {bits})")

    @property
    def row_tiles(self):
        return -(-self.max_d_out // self.rows)

    def expert_config(self):
        return SpikingExpertConfig(rows=self.rows, cols=self.cols, w_width=self.w_width,
                                   acc_width=self.acc_width, v_width=self.v_width,
                                   max_tokens=self.max_tokens)

    def router_config(self):
        return SpikingRouterConfig(experts=self.experts, cols=self.max_tokens,
                                   w_width=self.w_width, acc_width=self.acc_width,
                                   max_tokens=self.max_tokens)


def moe_command_layout(config):
    """``d_in``, ``d_out``, ``tokens``, ``timesteps``, ``k``, ``vth``, ``vleak``."""
    return data.StructLayout({
        "d_in": bits_for(config.max_d_in), "d_out": bits_for(config.max_d_out),
        "tokens": bits_for(config.max_tokens), "timesteps": bits_for(config.max_timesteps),
        "k": bits_for(config.experts),
        "vth": signed(config.v_width), "vleak": signed(config.v_width)})


def moe_arrays_signature(config):
    """The bottom tier's ports: the routing-score array's and each expert array's."""
    return wiring.Signature({
        "router": Out(array_signature(config.router_config())),
        **{f"expert{e}": Out(array_signature(config.expert_config()))
           for e in range(config.experts)}})


class MoeArrays(ConfiguredComponent):
    """Bottom tier of ``spiking_moe``: the routing-score array and the E expert arrays."""

    def __init__(self, config):
        super().__init__(config, moe_arrays_signature(config))

    def elaborate(self, platform):
        m = Module()
        m.submodules.router = router = SisArray(self.config.router_config())
        wiring.connect(m, wiring.flipped(self.router), router)
        for e in range(self.config.experts):
            m.submodules[f"expert{e}"] = array = SisArray(self.config.expert_config())
            wiring.connect(m, wiring.flipped(getattr(self, f"expert{e}")), array)
        return m


class SpikingMoe(SisTieredComponent):
    """``spiking_moe``: Alg. 1 of seed 004 (see the module docstring for the phases).

    Members
    -------
    cmd : In(stream.Signature(moe_command_layout(config)))
        Taken when idle.
    act : In(stream.Signature({s: max_tokens x max_timesteps bits}))
    wr : In(stream.Signature({w: E signed w_width}))
    w : In(stream.Signature({w: R signed w_width}))
        ``act``, ``wr`` and ``w`` in the order of :func:`golden.spiking_moe.moe_input_beats`.
    route : Out(stream.Signature(route_layout(router_config)))
        The router's routes, one per token.
    out : Out(stream.Signature({spikes: R bits, token, timestep, tile, last}))
    busy : Out(1)
    error : Out(1)
        Sticky: a command with a zero or too large size, or K outside 1..E, was dropped.
    """

    def __init__(self, config, *, tier=None):
        cfg = config
        N, T = cfg.max_tokens, cfg.max_timesteps
        members = {
            "cmd": In(stream.Signature(moe_command_layout(cfg))),
            "act": In(stream.Signature(data.StructLayout({"s": N * T}))),
            "wr": In(stream.Signature(data.StructLayout(
                {"w": data.ArrayLayout(signed(cfg.w_width), cfg.experts)}))),
            "w": In(stream.Signature(data.StructLayout(
                {"w": data.ArrayLayout(signed(cfg.w_width), cfg.rows)}))),
            "route": Out(stream.Signature(route_layout(cfg.router_config()))),
            "out": Out(stream.Signature(data.StructLayout({
                "spikes": cfg.rows, "token": bits_for(N), "timestep": bits_for(T),
                "tile": bits_for(cfg.row_tiles), "last": 1}))),
            "busy": Out(1),
            "error": Out(1),
        }
        super().__init__(cfg, members, moe_arrays_signature(cfg), tier)

    def elaborate(self, platform):
        cfg = self.config
        E, R = cfg.experts, cfg.rows
        N, T, D = cfg.max_tokens, cfg.max_timesteps, cfg.max_d_in
        m = Module()
        tier = "top" if self._tier == "top" else None
        m.submodules.router = router = SpikingRouter(cfg.router_config(), tier=tier)
        cores = []
        for e in range(E):
            m.submodules[f"core{e}"] = core = SpikingExpert(cfg.expert_config(), tier=tier)
            cores.append(core)
        if tier:
            wiring.connect(m, wiring.flipped(self.bottom.router), router.bottom)
            for e, core in enumerate(cores):
                wiring.connect(m, wiring.flipped(getattr(self.bottom, f"expert{e}")),
                               core.bottom)

        job = Signal(moe_command_layout(cfg))
        tiles = Signal(range(cfg.row_tiles + 1))     # row tiles of this job's D_out
        error = Signal()
        m.d.comb += self.error.eq(error)

        # Buffers: the activation buffer (one word per d) and one local weight buffer per core.
        m.submodules.act_buffer = act_buffer = Memory(shape=unsigned(N * T), depth=D, init=[])
        act_write = act_buffer.write_port()
        weight_buffers = []
        for e in range(E):
            m.submodules[f"weights{e}"] = buffer = Memory(
                shape=unsigned(R * cfg.w_width), depth=cfg.row_tiles * D, init=[])
            weight_buffers.append(buffer)

        # Routed token lists (step 1 -> dispatch) and the merged output buffer (step 5).
        token_bits = bits_for(N)
        counts = [Signal(range(N + 1), name=f"routed{e}") for e in range(E)]
        lists = [[Signal(token_bits, name=f"list{e}_{j}") for j in range(N)] for e in range(E)]
        words = cfg.row_tiles * N * T
        merged = [Signal(R, name=f"merged{i}") for i in range(words)]

        # Weight loading runs beside the activation load and the routing.
        w_left = Signal(range(E * cfg.row_tiles * D + 1))
        w_expert = Signal(range(E))
        w_d, w_tile = Signal(range(D)), Signal(range(cfg.row_tiles))
        m.d.comb += self.w.ready.eq(w_left != 0)
        for e, buffer in enumerate(weight_buffers):
            port = buffer.write_port()
            m.d.comb += [port.addr.eq(w_tile * D + w_d), port.data.eq(self.w.payload.as_value()),
                         port.en.eq(self.w.valid & self.w.ready & (w_expert == e))]
        with m.If(self.w.valid & self.w.ready):
            m.d.sync += w_left.eq(w_left - 1)
            with m.If(w_d != job.d_in - 1):
                m.d.sync += w_d.eq(w_d + 1)
            with m.Else():
                m.d.sync += w_d.eq(0)
                with m.If(w_tile != tiles - 1):
                    m.d.sync += w_tile.eq(w_tile + 1)
                with m.Else():
                    m.d.sync += [w_tile.eq(0), w_expert.eq(w_expert + 1)]

        cmd = self.cmd.payload
        act_d = Signal(range(D))
        route_t, route_d = Signal(range(T)), Signal(range(D))
        router_started, routed = Signal(), Signal()
        dispatching = Signal(E)
        unissued = Signal(E)            # cores that have not taken this layer's command yet
        finished = Signal(E)
        out_tile, out_token, out_step = Signal(range(cfg.row_tiles)), Signal(range(N)), \
            Signal(range(T))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    with m.If((cmd.d_in == 0) | (cmd.d_in > D) | (cmd.d_out == 0) |
                              (cmd.d_out > cfg.max_d_out) | (cmd.tokens == 0) |
                              (cmd.tokens > N) | (cmd.timesteps == 0) | (cmd.timesteps > T) |
                              (cmd.k == 0) | (cmd.k > E)):
                        m.d.sync += error.eq(1)
                    with m.Else():
                        # ceil(d_out / R) without a divider: count the R-multiples below d_out.
                        row_tiles = 1 + sum(cmd.d_out > i * R for i in range(1, cfg.row_tiles))
                        m.d.sync += [job.eq(cmd), tiles.eq(row_tiles),
                                     w_left.eq(E * row_tiles * cmd.d_in), w_expert.eq(0),
                                     w_d.eq(0), w_tile.eq(0), act_d.eq(0), route_t.eq(0),
                                     route_d.eq(0), router_started.eq(0), routed.eq(0),
                                     *[count.eq(0) for count in counts],
                                     *[word.eq(0) for word in merged]]
                        m.next = "LOAD"
            with m.State("LOAD"):
                m.d.comb += [self.act.ready.eq(1), act_write.addr.eq(act_d),
                             act_write.data.eq(self.act.payload.s),
                             act_write.en.eq(self.act.valid)]
                with m.If(self.act.valid):
                    m.d.sync += act_d.eq(act_d + 1)
                    with m.If(act_d == job.d_in - 1):
                        m.next = "ROUTE"
            with m.State("ROUTE"):
                m.d.comb += [router.cmd.valid.eq(~router_started),
                             router.cmd.payload.d_in.eq(job.d_in),
                             router.cmd.payload.tokens.eq(job.tokens),
                             router.cmd.payload.timesteps.eq(job.timesteps),
                             router.cmd.payload.k.eq(job.k),
                             router.w.valid.eq(self.wr.valid), self.wr.ready.eq(router.w.ready),
                             router.s.valid.eq(1)]
                with m.If(router.cmd.valid & router.cmd.ready):
                    m.d.sync += router_started.eq(1)
                with m.If(routed & (w_left == 0)):
                    with_tokens = Cat(*[count != 0 for count in counts])
                    m.d.sync += [dispatching.eq(with_tokens), unissued.eq(with_tokens),
                                 finished.eq(~with_tokens)]
                    m.next = "ISSUE"
            with m.State("ISSUE"):
                # A core may still be draining the previous layer's padding columns (up to C
                # of them after its last row): each core's command is held until it takes it,
                # and the layer computes once every core with tokens has.
                taken = Cat(*[core.cmd.valid & core.cmd.ready for core in cores])
                for e, core in enumerate(cores):
                    m.d.comb += core.cmd.valid.eq(unissued[e])
                m.d.sync += unissued.eq(unissued & ~taken)
                with m.If((unissued & ~taken) == 0):
                    m.next = "COMPUTE"
            with m.State("COMPUTE"):
                with m.If(finished.all()):
                    m.d.sync += [out_tile.eq(0), out_token.eq(0), out_step.eq(0)]
                    m.next = "READOUT"
            with m.State("READOUT"):
                m.d.comb += self.out.valid.eq(1)
                with m.If(self.out.ready):
                    with m.If(out_step != job.timesteps - 1):
                        m.d.sync += out_step.eq(out_step + 1)
                    with m.Else():
                        m.d.sync += out_step.eq(0)
                        with m.If(out_token != job.tokens - 1):
                            m.d.sync += out_token.eq(out_token + 1)
                        with m.Else():
                            m.d.sync += out_token.eq(0)
                            with m.If(out_tile != tiles - 1):
                                m.d.sync += out_tile.eq(out_tile + 1)
                            with m.Else():
                                m.next = "IDLE"
        m.d.comb += self.busy.eq(self.cmd.ready == 0)

        # Router feed (step 1): beat (t, d) carries bit d of every token at timestep t.
        route_read = act_buffer.read_port(domain="comb")
        m.d.comb += [route_read.addr.eq(route_d), router.w.payload.eq(self.wr.payload),
                     router.s.payload.s.eq(Cat(*[
                         select(route_t, [route_read.data[n * T + t] for t in range(T)])
                         for n in range(N)]))]
        with m.If(router.s.valid & router.s.ready):
            with m.If(route_d != job.d_in - 1):
                m.d.sync += route_d.eq(route_d + 1)
            with m.Else():
                m.d.sync += [route_d.eq(0), route_t.eq(route_t + 1)]
        # Routes go out on `route` and append the token to each chosen expert's list.
        route = router.route.payload
        wiring.connect(m, wiring.flipped(self.route), router.route)
        with m.If(router.route.valid & self.route.ready):
            for e in range(E):
                with m.If(route.experts[e]):
                    m.d.sync += counts[e].eq(counts[e] + 1)
                    for j, entry in enumerate(lists[e]):
                        with m.If(counts[e] == j):
                            m.d.sync += entry.eq(route.token)
            with m.If(route.last):
                m.d.sync += routed.eq(1)

        # Dispatch (steps 2-4): per core, its local weights and its tokens' spikes in tile order.
        for e, core in enumerate(cores):
            self._dispatch(m, e, core, job, counts[e], lists[e], dispatching,
                           weight_buffers[e].read_port(domain="comb"),
                           act_buffer.read_port(domain="comb"))
            for name in ("d_in", "d_out", "timesteps", "vth", "vleak"):
                m.d.comb += getattr(core.cmd.payload, name).eq(getattr(job, name))
            m.d.comb += [core.cmd.payload.tokens.eq(counts[e]), core.out.ready.eq(1)]

        # Merge (step 5): OR each core's output row into (tile, token, timestep). A core's row
        # and its buffer address are registered first, and the row is merged one edge later
        # (clock rate: the core's output FIFO, the token list, the address and the E-way OR
        # into every word were one path, 56.8 MHz); the core counts as finished at that edge.
        hits = []
        for e, core in enumerate(cores):
            beat = core.out.payload
            token = select(beat.token, lists[e])
            valid = Signal(name=f"merge_valid{e}")
            address = Signal(range(words), name=f"merge_address{e}")
            spikes = Signal(R, name=f"merge_spikes{e}")
            last = Signal(name=f"merge_last{e}")
            m.d.sync += [valid.eq(core.out.valid), last.eq(core.out.valid & beat.last),
                         address.eq((beat.tile * N + token) * T + beat.timestep),
                         spikes.eq(beat.spikes)]
            with m.If(last):
                m.d.sync += finished[e].eq(1)
            hits.append((valid, address, spikes))
        for i, word in enumerate(merged):
            incoming = [Mux(valid & (address == i), spikes, 0) for valid, address, spikes in hits]
            with m.If(Cat(*[valid & (address == i) for valid, address, _ in hits]).any()):
                m.d.sync += word.eq(word | functools.reduce(operator.or_, incoming))

        out = self.out.payload
        m.d.comb += [out.spikes.eq(select((out_tile * N + out_token) * T + out_step, merged)),
                     out.token.eq(out_token), out.timestep.eq(out_step), out.tile.eq(out_tile),
                     out.last.eq((out_tile == tiles - 1) & (out_token == job.tokens - 1) &
                                 (out_step == job.timesteps - 1))]
        return m

    def _dispatch(self, m, e, core, job, count, token_list, dispatching, weights, act):
        """Feed core ``e``: per row tile, per column tile of its (token, timestep) pairs, per d:
        the local weights of (tile, d) and, for column k, the spike of pair ``col*C + k``."""
        cfg = self.config
        C, T, D = cfg.cols, cfg.max_timesteps, cfg.max_d_in
        advance = Signal(name=f"dispatch{e}_advance")
        # The core's (token, timestep) pairs, registered (clock rate: the product was on the
        # path from the routed count into the column registers). The count is final from the
        # edge after the last route, two edges before the core's command.
        pairs = Signal(range(cfg.max_tokens * T + 1), name=f"dispatch{e}_pairs")
        m.d.sync += pairs.eq(count * job.timesteps)
        m.d.comb += advance.eq(core.w.valid & core.w.ready)
        d, col_tile, row_tile, done = tile_counter(m, advance, job.d_in, pairs, C, job.d_out,
                                                   cfg.rows, name=f"dispatch{e}")
        # Column k of this column tile holds pair p = col_tile * C + k of the core's
        # (routed token j, timestep t) pairs: j = p // T, t = p % T (T = the job's timesteps).
        # Kept per column in registers and stepped by C pairs at each column tile (clock rate:
        # a chain deriving column k + 1 from column k ran 44 logic levels at C = 16, from the
        # job's T through every column into the core's array). The constants C // T, C % T and
        # the first tile's k // T, k % T come from tables indexed by T.
        timesteps = range(1, T + 1)

        def by_timesteps(values, shape, name):
            value = Signal(shape, name=name)
            m.d.comb += value.eq(select(job.timesteps - 1, [Const(v, shape) for v in values]))
            return value

        j_shape, t_shape = unsigned(bits_for(cfg.max_tokens + C)), unsigned(bits_for(T - 1))
        step_j = by_timesteps([C // tt for tt in timesteps], j_shape, f"dispatch{e}_step_j")
        step_t = by_timesteps([C % tt for tt in timesteps], t_shape, f"dispatch{e}_step_t")
        col_j = [Signal(j_shape, name=f"dispatch{e}_j{k}") for k in range(C)]
        col_t = [Signal(t_shape, name=f"dispatch{e}_t{k}") for k in range(C)]
        # Beside each column's (j, t): its bit in an activation word, token_list[j] * T + t, and
        # whether j is a routed token (j < count), registers loaded with the column's next
        # (j, t) (clock rate: the token list's read and the index were on the path from the
        # column's registers into the core's array).
        bit_index = [Signal(range(cfg.max_tokens * T), name=f"dispatch{e}_bit{k}")
                     for k in range(C)]
        routed = [Signal(name=f"dispatch{e}_routed{k}") for k in range(C)]

        def load(k, j, t, kind):
            """Column k's registers loaded with the pair (j, t) (``kind``: for the names)."""
            next_j = Signal(j_shape, name=f"dispatch{e}_{kind}_j{k}")
            next_t = Signal(t_shape, name=f"dispatch{e}_{kind}_t{k}")
            m.d.comb += [next_j.eq(j), next_t.eq(t)]
            return [col_j[k].eq(next_j), col_t[k].eq(next_t), routed[k].eq(next_j < count),
                    bit_index[k].eq(select(next_j, token_list) * T + next_t)]

        first_tile = []
        stepped = []
        for k in range(C):
            first_tile += load(k, by_timesteps([k // tt for tt in timesteps], j_shape,
                                               f"dispatch{e}_first_j{k}"),
                               by_timesteps([k % tt for tt in timesteps], t_shape,
                                            f"dispatch{e}_first_t{k}"), "load_first")
            t_sum = Signal(bits_for(2 * T), name=f"dispatch{e}_tsum{k}")
            m.d.comb += t_sum.eq(col_t[k] + step_t)
            wrap = t_sum >= job.timesteps
            stepped += load(k, col_j[k] + step_j + wrap, Mux(wrap, t_sum - job.timesteps, t_sum),
                            "load_stepped")
        spikes = [routed[k] & select(bit_index[k], list(act.data)) for k in range(C)]
        m.d.comb += [weights.addr.eq(row_tile * D + d), act.addr.eq(d),
                     core.w.valid.eq(dispatching[e]), core.s.valid.eq(dispatching[e]),
                     core.w.payload.eq(weights.data), core.s.payload.s.eq(Cat(*spikes))]
        with m.If(advance & (d == job.d_in - 1)):
            with m.If((col_tile + 1) * C >= pairs):
                m.d.sync += first_tile
            with m.Else():
                m.d.sync += stepped
        with m.If(done):
            m.d.sync += dispatching[e].eq(0)
        with m.If(~dispatching[e]):
            m.d.sync += first_tile


register(Block(
    name="spiking_moe", family="spiking_moe", config=SpikingMoeConfig, build=SpikingMoe,
    figures=lambda cfg: {"experts": cfg.experts,
                         "peak_synaptic_ops_per_cycle": cfg.experts * cfg.rows * cfg.cols},
    summary="spiking MoE layer (Alg. 1): router + E expert cores + buffers, dispatch and merge",
    demo_configs=({},),
    area_unit="expert", operation="synaptic op", area_units=lambda cfg: cfg.experts,
    tiers=lambda cfg: (SpikingMoe(cfg, tier="top"), MoeArrays(cfg)),
    legend="cycles of a full layer, synaptic operations per cycle vs E x R x C",
    tier_contents=("router logic, generators, buffers, dispatch, merge",
                   "routing-score and expert arrays"),
    synth_flatten=False,
))

