"""Spiking token router (``spiking_router``): the expert routing-score array and the top-K
selection of seed 004 Alg. 1 step 1 (§III-A, §III-B, Fig. 2(a)/(c)).

Bottom tier: the expert routing-score array, a :class:`hw.spiking_expert.SisArray` whose rows
are the E experts and whose columns are tokens: routing weights W_r[t, d, :] flow
horizontally, the tokens' 1-bit spikes S[:, t, d] vertically, and each PE adds its weight when
the spike is 1, accumulating ``I[n, e] = sum_t sum_d S[n, t, d] W_r[t, d, e]`` over the T x D_in
beats. The scores are extracted column by column (one token per cycle) to the top tier, which
picks the K best experts (ties to the lower index) and emits the token's route. Dispatch of the
spikes to the chosen experts' cores and the merge of their outputs (K = 1: the expert's output;
K > 1: element-wise OR) sit with the activation buffers in ``spiking_moe``.

The contract, timing and figures: docs/blocks/spiking_router.md.
"""

import dataclasses

from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from golden import spiking_router as golden
from hw.params import int_param, validate
from hw.pipeline import OutputQueue, sum_tree
from hw.registry import Block, register
from hw.spiking_base import SisArray, SisTieredComponent, array_signature, tile_feeder

__all__ = ["SpikingRouterConfig", "SpikingRouter", "router_command_layout", "route_layout",
           "top_k_mask"]


@dataclasses.dataclass(frozen=True)
class SpikingRouterConfig:
    """Parameters of ``spiking_router``.

    Parameters
    ----------
    experts : int
        E, experts = rows of the routing-score array (seed 004 §V-A: a 16 x 8 routing array).
    cols : int
        C, tokens per column tile of the array.
    w_width : int
        Bits of a signed routing weight.
    acc_width : int
        Bits of a signed routing score (wraps).
    max_tokens : int
        Tokens per job (tiled over the C columns).
    """
    experts: int = int_param(8, 1, 16, "E, experts (rows of the routing-score array)")
    cols: int = int_param(16, 1, 64, "C, tokens per column tile")
    w_width: int = int_param(8, 2, 16, "bits of a signed routing weight")
    acc_width: int = int_param(16, 4, 32, "bits of a routing score (wraps)")
    max_tokens: int = int_param(64, 1, 256, "tokens per job")

    def __post_init__(self):
        validate(self)

    @property
    def rows(self):
        """Rows of the score array (one per expert), as :class:`SisArray` expects."""
        return self.experts


def router_command_layout(config):
    """``d_in``, ``tokens``, ``timesteps``, ``k`` (experts per token, 1..E)."""
    return data.StructLayout({"d_in": 16, "tokens": bits_for(config.max_tokens),
                              "timesteps": 8, "k": bits_for(config.experts)})


def route_layout(config):
    """A token's route: ``token``, ``experts`` (bit e = expert e chosen), ``scores[E]``,
    ``last`` (the job's last token)."""
    return data.StructLayout({
        "token": bits_for(config.max_tokens), "experts": config.experts,
        "scores": data.ArrayLayout(signed(config.acc_width), config.experts), "last": 1})


def top_k_wins(scores):
    """Expert e's comparisons, for :func:`top_k_mask`: one bit per other expert j, set when j
    beats e (a higher score, or an equal score at a lower index). E x (E - 1) comparators, each
    one carry chain (>= rather than > | ==)."""
    return [Cat(*[(other >= mine) if j < e else (other > mine)
                  for j, other in enumerate(scores) if j != e])
            for e, mine in enumerate(scores)]


def top_k_mask(m, wins, k, name):
    """Top-K from :func:`top_k_wins`' bits: bit e is set when fewer than ``k`` experts beat
    expert e. The beats are counted by a balanced adder tree (a left-leaning sum chains E - 2
    adders)."""
    bits = []
    for e, beats in enumerate(wins):
        beaten_by = Signal(range(len(wins) + 1), name=f"{name}_beaten_by{e}")
        m.d.comb += beaten_by.eq(sum_tree(beats) if len(beats) else 0)
        bits.append(beaten_by < k)
    return Cat(*bits)


class SpikingRouter(SisTieredComponent):
    """``spiking_router``: the routing-score array (bottom tier) and the top-K selection (top).

    Members
    -------
    cmd : In(stream.Signature(router_command_layout(config)))
        Taken when idle.
    w : In(stream.Signature({w: E signed w_width}))
    s : In(stream.Signature({s: C bits}))
        Paired with ``w`` beat by beat, in the order of
        :func:`golden.spiking_router.router_input_beats`.
    route : Out(stream.Signature(route_layout(config)))
        One per token, in token order.
    busy : Out(1)
    error : Out(1)
        Sticky: a command with a zero size, too many tokens or K outside 1..E was dropped.
    """

    def __init__(self, config, *, tier=None):
        cfg = config
        members = {
            "cmd": In(stream.Signature(router_command_layout(cfg))),
            "w": In(stream.Signature(data.StructLayout(
                {"w": data.ArrayLayout(signed(cfg.w_width), cfg.experts)}))),
            "s": In(stream.Signature(data.StructLayout({"s": cfg.cols}))),
            "route": Out(stream.Signature(route_layout(cfg))),
            "busy": Out(1),
            "error": Out(1),
        }
        super().__init__(cfg, members, array_signature(cfg), tier)

    def elaborate(self, platform):
        cfg = self.config
        E, C = cfg.experts, cfg.cols
        m = Module()
        queue = OutputQueue(m, self.route)
        pipe = queue.stall_pipe()

        job = Signal(router_command_layout(cfg))
        reduce_len = Signal(24)                 # T x D_in beats per column tile
        running, draining, error = Signal(), Signal(), Signal()
        m.d.comb += [self.busy.eq(running | draining), self.error.eq(error),
                     self.cmd.ready.eq(~running & ~draining)]
        cmd = self.cmd.payload
        with m.If(self.cmd.valid & self.cmd.ready):
            with m.If((cmd.d_in == 0) | (cmd.tokens == 0) | (cmd.tokens > cfg.max_tokens) |
                      (cmd.timesteps == 0) | (cmd.k == 0) | (cmd.k > E)):
                m.d.sync += error.eq(1)
            with m.Else():
                m.d.sync += [job.eq(cmd), reduce_len.eq(cmd.timesteps * cmd.d_in),
                             running.eq(1)]

        take, first, last, job_done = tile_feeder(
            m, pipe, E, C, running, self.w, self.s, reduce_len, job.tokens, E)
        with m.If(job_done):
            m.d.sync += [running.eq(0), draining.eq(1)]

        array, scores = self.feed_sis_array(m, pipe, take, first, last)

        # Top tier: one token's scores per column; padding columns past the job's tokens drop.
        token = Signal(bits_for(cfg.max_tokens + C))
        real = Signal()
        m.d.comb += real.eq(array.column_valid & (token < job.tokens))
        with m.If(pipe.enable & array.column_valid):
            with m.If(array.column_last & (token + 1 >= job.tokens)):
                m.d.sync += [token.eq(0), draining.eq(0)]
            with m.Else():
                m.d.sync += token.eq(token + 1)
        # Two stages (clock rate): the comparisons registered with the route's other fields
        # and K (a new command may be taken while they are in flight), then the counts and the
        # compare with K into the output register.
        route = Signal(route_layout(cfg))
        m.d.comb += [route.token.eq(token),
                     route.scores.eq(Cat(*[sc.as_unsigned() for sc in scores])),
                     route.last.eq(token == job.tokens - 1)]
        compared_valid = pipe.reg(real, "compared_valid")
        compared = Signal(route_layout(cfg))
        m.d.comb += compared.eq(pipe.reg(route.as_value(), "compared_route"))
        wins = [pipe.reg(bits, f"topk_wins{e}") for e, bits in enumerate(top_k_wins(scores))]
        compared_k = pipe.reg(job.k, "compared_k")
        routed = Signal(route_layout(cfg))
        m.d.comb += [routed.eq(compared),
                     routed.experts.eq(top_k_mask(m, wins, compared_k, "topk"))]
        out_valid = pipe.reg(compared_valid, "route_valid")
        out_route = pipe.reg(routed.as_value(), "route_out")
        queue.push(m, out_valid & pipe.enable, out_route)
        pipe.emit(m)
        return m


register(Block(
    name="spiking_router", family="spiking_router", config=SpikingRouterConfig,
    build=SpikingRouter,
    figures=lambda cfg: {"route_latency_cycles": golden.route_latency(cfg.experts),
                         "routes_per_cycle_in_a_tile": 1},
    summary="spiking token router: expert routing-score array (spike-gated) + top-K, ties low",
    demo_configs=({"experts": 8, "cols": 16, "max_tokens": 32},),
    area_unit="PE", operation="score op", area_units=lambda cfg: cfg.experts * cfg.cols,
    tiers=lambda cfg: (SpikingRouter(cfg, tier="top"), SisArray(cfg)),
    legend="score additions per cycle vs E x C",
    tier_contents=("top-K selection, control, FIFO", "the routing-score array"),
))
