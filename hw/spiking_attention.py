"""Spiking multi-head attention cores (``spiking_attention``): seed 004 §IV, Alg. 2, Fig. 3.

H attention cores, one per head, run in lockstep on one command; each is

* a score array (bottom tier): a :class:`hw.spiking_expert.SisArray` of N x N PEs whose rows
  are query tokens n and columns key tokens m; per feature i the Q bits enter as 0/1 weights,
  the K bits as spikes, so each PE counts ``A[n, m] = sum_i Q[n, i] AND K[m, i]``;
* an A·V array (bottom tier): N x d PEs, rows n, columns features j, fed straight from the
  score array's column read-out — column m of A is beat m, paired with V's row m — so each PE
  accumulates ``Y[n, j] = sum_m A[n, m] V[m, j]``: the multi-bit attention map never leaves
  the arrays (§IV-B ❺-❻);
* N LIF generators (top tier) keeping one potential per (token, feature) across timesteps
  (❼).

The heads' outputs leave concatenated in one beat per (timestep, feature). Q/K/V are split
between the cores by bit position in the stream words (the dispatcher of Fig. 3(a)).
Contract and formats: :mod:`golden.spiking_attention` and docs/blocks/spiking_attention.md.
"""

import dataclasses

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from hw.params import ConfiguredComponent, int_param, validate
from hw.pipeline import OutputQueue
from hw.registry import Block, register
from hw.spiking import lif_neuron
from hw.spiking_base import SisArray, SisTieredComponent, array_signature, tile_feeder

__all__ = ["SpikingAttentionConfig", "SpikingAttention", "AttentionArrays",
           "attention_command_layout"]


@dataclasses.dataclass(frozen=True)
class _ArrayShape:
    """What :class:`SisArray` reads of a config."""
    rows: int
    cols: int
    w_width: int
    acc_width: int


@dataclasses.dataclass(frozen=True)
class SpikingAttentionConfig:
    """Parameters of ``spiking_attention``.

    Parameters
    ----------
    heads : int
        H, attention cores (one head each).
    max_tokens : int
        N, tokens per job: the score array is N x N (seed 004 §V-A: a 16 x 16 array).
    max_head_dim : int
        d, features per head: the A·V array is N x d.
    v_width : int
        Bits of a signed membrane potential, Vth and Vleak (saturates).
    """
    heads: int = int_param(4, 1, 8, "H, attention cores (one head each)")
    max_tokens: int = int_param(16, 1, 32, "N, tokens per job (the score array is N x N)")
    max_head_dim: int = int_param(16, 1, 64, "d, features per head (the A.V array is N x d)")
    v_width: int = int_param(16, 2, 32, "bits of a membrane potential, Vth and Vleak")

    def __post_init__(self):
        validate(self)

    @property
    def score_width(self):
        """Signed bits of A (0..d)."""
        return bits_for(self.max_head_dim) + 1

    @property
    def product_width(self):
        """Signed bits of Y = A·V (0..N x d)."""
        return bits_for(self.max_tokens * self.max_head_dim) + 1

    def score_array(self):
        return _ArrayShape(self.max_tokens, self.max_tokens, 2, self.score_width)

    def product_array(self):
        return _ArrayShape(self.max_tokens, self.max_head_dim, self.score_width,
                           self.product_width)


def attention_command_layout(config):
    """``tokens``, ``timesteps``, ``head_dim``, ``vth``, ``vleak``."""
    return data.StructLayout({
        "tokens": bits_for(config.max_tokens), "timesteps": 8,
        "head_dim": bits_for(config.max_head_dim),
        "vth": signed(config.v_width), "vleak": signed(config.v_width)})


def attention_arrays_signature(config):
    """The bottom tier's ports: per head the score array's and the A·V array's."""
    members = {}
    for h in range(config.heads):
        members[f"score{h}"] = Out(array_signature(config.score_array()))
        members[f"product{h}"] = Out(array_signature(config.product_array()))
    return wiring.Signature(members)


class AttentionArrays(ConfiguredComponent):
    """Bottom tier of ``spiking_attention``: per head the score and the A·V arrays."""

    def __init__(self, config):
        super().__init__(config, attention_arrays_signature(config))

    def elaborate(self, platform):
        m = Module()
        for h in range(self.config.heads):
            for kind, shape in (("score", self.config.score_array()),
                                ("product", self.config.product_array())):
                m.submodules[f"{kind}{h}"] = array = SisArray(shape)
                wiring.connect(m, wiring.flipped(getattr(self, f"{kind}{h}")), array)
        return m


class SpikingAttention(SisTieredComponent):
    """``spiking_attention``: Alg. 2 of seed 004 on H lockstep cores.

    Members
    -------
    cmd : In(stream.Signature(attention_command_layout(config)))
        Taken when idle.
    qk : In(stream.Signature({q, k: H x N bits}))
        One beat per (timestep, feature), in the order of
        :func:`golden.spiking_attention.attention_input_beats`.
    v : In(stream.Signature({v: H x d bits}))
        One beat per (timestep, token); taken when its A column reaches the A·V array.
    out : Out(stream.Signature({spikes: H x N bits, timestep, feature, last}))
    busy : Out(1)
    error : Out(1)
        Sticky: a command with a zero or too large size was dropped.
    """

    def __init__(self, config, *, tier=None):
        cfg = config
        H, N, D = cfg.heads, cfg.max_tokens, cfg.max_head_dim
        members = {
            "cmd": In(stream.Signature(attention_command_layout(cfg))),
            "qk": In(stream.Signature(data.StructLayout({"q": H * N, "k": H * N}))),
            "v": In(stream.Signature(data.StructLayout({"v": H * D}))),
            "out": Out(stream.Signature(data.StructLayout({
                "spikes": H * N, "timestep": 8, "feature": bits_for(D), "last": 1}))),
            "busy": Out(1),
            "error": Out(1),
        }
        super().__init__(cfg, members, attention_arrays_signature(cfg), tier)

    def elaborate(self, platform):
        cfg = self.config
        H, N, D, vw = cfg.heads, cfg.max_tokens, cfg.max_head_dim, cfg.v_width
        m = Module()
        queue = OutputQueue(m, self.out)

        if self._tier == "top":
            scores = [getattr(self.bottom, f"score{h}") for h in range(H)]
            products = [getattr(self.bottom, f"product{h}") for h in range(H)]
        else:
            scores, products = [], []
            for h in range(H):
                m.submodules[f"score{h}"] = score = SisArray(cfg.score_array())
                m.submodules[f"product{h}"] = product = SisArray(cfg.product_array())
                scores.append(score)
                products.append(product)

        # The job. A column of A that reaches the A·V array needs its V beat: the whole
        # pipeline (both arrays, the generators) holds while that beat is missing.
        job = Signal(attention_command_layout(cfg))
        vth_plus_leak = Signal(signed(cfg.v_width + 1))   # hw.spiking.lif_prepare's constant
        running, draining, error = Signal(), Signal(), Signal()
        m.d.comb += [self.busy.eq(running | draining), self.error.eq(error),
                     self.cmd.ready.eq(~running & ~draining)]
        cmd = self.cmd.payload
        with m.If(self.cmd.valid & self.cmd.ready):
            with m.If((cmd.tokens == 0) | (cmd.tokens > N) | (cmd.timesteps == 0) |
                      (cmd.head_dim == 0) | (cmd.head_dim > D)):
                m.d.sync += error.eq(1)
            with m.Else():
                m.d.sync += [job.eq(cmd), running.eq(1),
                             vth_plus_leak.eq(cmd.vth + cmd.vleak)]
        column = Signal(range(N))                # column m of A leaving the score arrays
        needs_v = Signal()
        m.d.comb += needs_v.eq(scores[0].column_valid & (column < job.tokens))
        enable = Signal()
        m.d.comb += [enable.eq(queue.space & (~needs_v | self.v.valid)),
                     self.v.ready.eq(queue.space & needs_v)]
        pipe = queue.stall_pipe(enable)

        # Score arrays: timesteps are the feeder's "row tiles" (one row and one column tile of
        # N keys each); tiles S = max(N, d) apart, so the A·V array, whose beats are the
        # score read-out, sees its own tiles >= d apart (all its columns out) as it needs.
        take, first, last, job_done = tile_feeder(
            m, pipe, 1, N, running, self.qk, self.qk, job.head_dim, job.tokens, job.timesteps,
            spacing=max(N, D))
        with m.If(job_done):
            m.d.sync += [running.eq(0), draining.eq(1)]
        for h, score in enumerate(scores):
            q = self.qk.payload.q[h * N:(h + 1) * N]
            m.d.comb += [score.enable.eq(enable), score.valid.eq(take), score.first.eq(first),
                         score.last.eq(last),
                         score.w.eq(Cat(*[Cat(q[n], Const(0, 1)) for n in range(N)])),
                         score.s.eq(self.qk.payload.k[h * N:(h + 1) * N])]
        with m.If(enable & scores[0].column_valid):
            m.d.sync += column.eq(Mux(scores[0].column_last, 0, column + 1))

        # A·V arrays: beat m = column m of A (N scores as weights) with V row m (d spikes).
        for h, (score, product) in enumerate(zip(scores, products)):
            m.d.comb += [product.enable.eq(enable), product.valid.eq(needs_v),
                         product.first.eq(column == 0),
                         product.last.eq(column == job.tokens - 1),
                         product.w.eq(score.values),
                         product.s.eq(self.v.payload.v[h * D:(h + 1) * D])]

        # Generators: one potential per (token, feature) of each head, over the timesteps.
        feature, step = Signal(range(D)), Signal(8)
        next_feature = Signal(range(D))     # feature's value after this edge
        first_step = Signal(init=1)     # step == 0, held in a register (clock rate)
        real = Signal()
        m.d.comb += real.eq(products[0].column_valid & (feature < job.head_dim))
        m.d.comb += next_feature.eq(feature)
        with m.If(enable & products[0].column_valid):
            m.d.comb += next_feature.eq(Mux(products[0].column_last, 0, feature + 1))
        spikes = []
        writes = []
        pw = cfg.product_width
        for h, product in enumerate(products):
            m.submodules[f"potentials{h}"] = memory = Memory(
                shape=unsigned(N * vw), depth=D, init=[])
            # Clock rate: the feature register, an asynchronous read, the LIF step and the
            # memory's write port made one path, mostly wire. So the read is synchronous, at
            # the address the feature register is about to take and in every cycle (a held
            # pipeline re-reads its word), and the new potentials reach the memory through a
            # register, written one edge later. The read is not transparent: Yosys builds a
            # transparent one from a registered address, which puts the read back on the
            # path; a write to the word read on the same edge is kept beside it instead
            # (`caught`). A feature's potential is read again one tile later, tiles
            # max(N, D) >= 1 cycles apart: with two or more its write is at or before the
            # read's edge; only with N = D = 1 can it be the next cycle, when the word is
            # still in the register, and only then is the register's value forwarded to the
            # read (elsewhere it would be dead logic on the path).
            read, write = memory.read_port(), memory.write_port()
            pending = Signal(N * vw, name=f"potentials{h}_pending")
            pending_en = Signal(name=f"potentials{h}_pending_en")
            pending_addr = Signal(range(D), name=f"potentials{h}_pending_addr")
            stored = Signal(N * vw, name=f"potentials{h}_stored")
            caught = Signal(name=f"potentials{h}_caught")       # written on the read's edge
            written = Signal(N * vw, name=f"potentials{h}_written")
            m.d.sync += [caught.eq(pending_en & (pending_addr == next_feature)),
                         written.eq(pending)]
            fresh = Mux(caught, written, read.data)
            if max(N, D) == 1:
                m.d.comb += stored.eq(Mux(pending_en, pending, fresh))
            else:
                m.d.comb += stored.eq(fresh)
            afters = []
            for n in range(N):
                previous = Mux(first_step, 0, stored[n * vw:(n + 1) * vw].as_signed())
                fire, after = lif_neuron(m, previous, product.values[n * pw:(n + 1) * pw]
                                         .as_signed(), job.vth, job.vleak, vw, f"gen{h}_{n}",
                                         vth_plus_leak)
                spikes.append(fire & (n < job.tokens))
                afters.append(after)
            m.d.sync += [pending.eq(Cat(*[a.as_unsigned()[:vw] for a in afters])),
                         pending_en.eq(real & enable), pending_addr.eq(feature)]
            m.d.comb += [read.addr.eq(next_feature), write.addr.eq(pending_addr),
                         write.data.eq(pending), write.en.eq(pending_en)]
            writes.append(write)
        final = Signal()
        m.d.comb += final.eq((step == job.timesteps - 1) & (feature == job.head_dim - 1))
        m.d.sync += feature.eq(next_feature)
        with m.If(enable & products[0].column_valid & products[0].column_last):
            m.d.sync += [step.eq(step + 1), first_step.eq(0)]
            with m.If(step == job.timesteps - 1):
                m.d.sync += [step.eq(0), first_step.eq(1), draining.eq(0)]

        out_valid = pipe.reg(real, "gen_valid")
        row = Signal(self.out.payload.shape())
        m.d.comb += [row.spikes.eq(Cat(*spikes)), row.timestep.eq(step),
                     row.feature.eq(feature), row.last.eq(final)]
        out_row = pipe.reg(row.as_value(), "gen_out")
        queue.push(m, out_valid & enable, out_row)
        pipe.emit(m)
        return m


register(Block(
    name="spiking_attention", family="spiking_attention", config=SpikingAttentionConfig,
    build=SpikingAttention,
    figures=lambda cfg: {"heads": cfg.heads,
                         "cycles_per_timestep": max(cfg.max_tokens, cfg.max_head_dim)},
    summary="spiking multi-head attention (Alg. 2): AND+popcount scores, A.V, LIF; H cores",
    demo_configs=({"heads": 2, "max_tokens": 8, "max_head_dim": 8},),
    area_unit="head", operation="synaptic op", area_units=lambda cfg: cfg.heads,
    tiers=lambda cfg: (SpikingAttention(cfg, tier="top"), AttentionArrays(cfg)),
    legend="cycles per timestep, adds per cycle vs H x N x (N + d)",
    tier_contents=("generators, V memories, control", "score and A.V arrays"),
    synth_flatten=False,
))
