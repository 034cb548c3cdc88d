"""Spiking expert core (``spiking_expert``): synaptic integration, membrane accumulation and
conditional spike generation fused (seed 004 Alg. 1 steps 2-4, §III-B, Fig. 2).

Bottom tier: a synaptic-integration-stationary R x C array (:func:`hw.systolic.os_grid` with a
spike-gated add instead of a multiplier): rows are output neurons, columns (token, timestep)
pairs; multi-bit weights flow horizontally, 1-bit spikes vertically, each PE adds its weight
when the spike is 1 and keeps the sum. Each tile's sums are read out column by column (the
"3D-extractable" readout). Top tier: R LIF spike generators (:func:`hw.spiking.lif_neuron`)
that keep one membrane potential per (token, neuron) across timesteps and emit the output
spikes. D_in is streamed, D_out and the pairs are tiled (tile order in :mod:`golden.spiking`).

The contract, timing and figures: docs/blocks/spiking_expert.md.
"""

import dataclasses

from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from golden import spiking_expert as golden
from hw.params import int_param, validate
from hw.pipeline import OutputQueue
from hw.registry import Block, register
from hw.spiking import lif_neuron
from hw.spiking_base import SisArray, SisTieredComponent, array_signature, tile_feeder

__all__ = ["SpikingExpertConfig", "SpikingExpert", "expert_command_layout"]


@dataclasses.dataclass(frozen=True)
class SpikingExpertConfig:
    """Parameters of ``spiking_expert``.

    Parameters
    ----------
    rows : int
        R, PE rows = output neurons per tile (seed 004 §V-A: 16).
    cols : int
        C, PE columns = (token, timestep) pairs per tile (seed 004: 128).
    w_width : int
        Bits of a signed weight (seed 004: 8).
    acc_width : int
        Bits of a signed synaptic integration (seed 004: 16; wraps).
    v_width : int
        Bits of a signed membrane potential, Vth and Vleak (saturates).
    max_tokens : int
        Tokens per job (bounds the command's tokens field and the pair counters; the
        generators keep one V word of R potentials, the last pair's).
    """
    rows: int = int_param(16, 1, 32, "R, PE rows (output neurons per tile)")
    cols: int = int_param(16, 1, 128, "C, PE columns ((token, timestep) pairs per tile)")
    w_width: int = int_param(8, 2, 16, "bits of a signed weight")
    acc_width: int = int_param(16, 4, 32, "bits of a synaptic integration (wraps)")
    v_width: int = int_param(16, 2, 32, "bits of a membrane potential, Vth and Vleak")
    max_tokens: int = int_param(16, 1, 256, "tokens per job (a bound on the command)")

    def __post_init__(self):
        validate(self)


def expert_command_layout(config):
    """``d_in``, ``d_out``, ``tokens``, ``timesteps``, ``vth``, ``vleak``."""
    return data.StructLayout({
        "d_in": 16, "d_out": 16, "tokens": bits_for(config.max_tokens), "timesteps": 8,
        "vth": signed(config.v_width), "vleak": signed(config.v_width)})


class SpikingExpert(SisTieredComponent):
    """``spiking_expert``: a synaptic-integration-stationary R x C array (bottom tier) and R
    LIF spike generators (top tier) fused: steps 2 + 3 + 4 of seed 004 Alg. 1.

    Members
    -------
    cmd : In(stream.Signature(expert_command_layout(config)))
        Taken when idle.
    w : In(stream.Signature({w: R signed w_width}))
    s : In(stream.Signature({s: C bits}))
        Paired with ``w`` beat by beat, in the tile order of
        :func:`golden.spiking_expert.expert_input_beats`.
    out : Out(stream.Signature({spikes: R bits, token, timestep, tile, last}))
    busy : Out(1)
    error : Out(1)
        Sticky: a command with a zero or too large size was dropped.
    """

    def __init__(self, config, *, tier=None):
        """``tier="top"`` builds the top tier alone: the array's ports become ports named
        ``bottom__*`` (for the 3D build); by default the array is a submodule (2D)."""
        cfg = config
        R, C = cfg.rows, cfg.cols
        members = {
            "cmd": In(stream.Signature(expert_command_layout(cfg))),
            "w": In(stream.Signature(data.StructLayout(
                {"w": data.ArrayLayout(signed(cfg.w_width), R)}))),
            "s": In(stream.Signature(data.StructLayout({"s": C}))),
            "out": Out(stream.Signature(data.StructLayout({
                "spikes": R, "token": bits_for(cfg.max_tokens), "timestep": 8, "tile": 16,
                "last": 1}))),
            "busy": Out(1),
            "error": Out(1),
        }
        super().__init__(cfg, members, array_signature(cfg), tier)

    def elaborate(self, platform):
        cfg = self.config
        R, C, vw = cfg.rows, cfg.cols, cfg.v_width
        m = Module()
        # The pipeline's enable leaves a flip-flop (`registered_space`), not a compare on the
        # queue's level (the clock rate: in `spiking_moe` that compare's fan-out over a core
        # was the critical path).
        queue = OutputQueue(m, self.out, registered_space=True)
        pipe = queue.stall_pipe()

        # The job (latched command).
        job = Signal(expert_command_layout(cfg))
        pair_bits = bits_for(cfg.max_tokens * 255 + C)      # pairs incl. a padded tile
        pairs = Signal(pair_bits)              # tokens * timesteps
        # pairs - 1 and timesteps - 1, latched with the command, and the compares of the column
        # counters below against them kept in registers beside the counters: a subtractor into
        # a compare into the enables and selects of every V bit held the block below 100 MHz.
        last_pair, last_step = Signal(pair_bits), Signal(8)
        # pair <= last_pair (a real pair), pair >= last_pair (the last one, or padding after it)
        in_job, at_end = Signal(init=1), Signal()
        last_of_token = Signal()    # step == last_step, likewise kept beside step
        vth_plus_leak = Signal(signed(vw + 1))  # the compare's constant (hw.spiking.lif_prepare)
        running, draining, error = Signal(), Signal(), Signal()
        m.d.comb += [self.busy.eq(running | draining), self.error.eq(error)]
        cmd = self.cmd.payload
        m.d.comb += self.cmd.ready.eq(~running & ~draining)
        with m.If(self.cmd.valid & self.cmd.ready):
            with m.If((cmd.d_in == 0) | (cmd.d_out == 0) | (cmd.tokens == 0) |
                      (cmd.tokens > cfg.max_tokens) | (cmd.timesteps == 0)):
                m.d.sync += error.eq(1)
            with m.Else():
                m.d.sync += [job.eq(cmd), pairs.eq(cmd.tokens * cmd.timesteps),
                             last_pair.eq(cmd.tokens * cmd.timesteps - 1),
                             last_step.eq(cmd.timesteps - 1),
                             at_end.eq(cmd.tokens * cmd.timesteps == 1),
                             last_of_token.eq(cmd.timesteps == 1),
                             vth_plus_leak.eq(cmd.vth + cmd.vleak),
                             running.eq(1)]

        # Input side: pair the w and s beats, count d / column tile / row tile.
        take, first, last, job_done = tile_feeder(
            m, pipe, R, C, running, self.w, self.s, job.d_in, pairs, job.d_out)
        with m.If(job_done):
            m.d.sync += [running.eq(0), draining.eq(1)]

        # Bottom tier: the synaptic-integration-stationary array, read out column by column.
        array, integrations = self.feed_sis_array(m, pipe, take, first, last)
        column_valid, column_last = array.column_valid, array.column_last

        # Top tier: spike generators. Pairs arrive in (token, timestep) order, timestep
        # fastest, so a neuron's V at step t > 0 is the one its previous pair left: one V word
        # of R potentials in a register, no per-token memory (a LUT-RAM read in the LIF
        # recurrence held the block at 89.9 MHz on ECP5). The register is cleared where a
        # token's last step leaves (and at a tile's end), so V starts from 0 with no select.
        held = Signal(R * vw)           # V before this column's pair, R lanes of vw bits
        pair, token, step, tile = Signal(pair_bits), Signal(8), Signal(8), Signal(16)
        real = Signal()                 # this column is a (token, timestep) pair of the job
        m.d.comb += real.eq(column_valid & in_job)
        fires, afters = [], []
        for i in range(R):
            fire, after = lif_neuron(m, held[i * vw:(i + 1) * vw].as_signed(), integrations[i],
                                     job.vth, job.vleak, vw, f"gen{i}", vth_plus_leak)
            in_range = tile * R + i < job.d_out       # rows past d_out never spike
            fires.append(fire & in_range)
            afters.append(after)
        final = Signal()
        m.d.comb += final.eq(in_job & at_end & ((tile + 1) * R >= job.d_out))
        with m.If(pipe.enable & column_valid):
            with m.If(column_last & at_end):
                # The row tile's last column (padding included) has left the array.
                m.d.sync += [pair.eq(0), in_job.eq(1), at_end.eq(last_pair == 0), token.eq(0),
                             step.eq(0), last_of_token.eq(last_step == 0), held.eq(0),
                             tile.eq(tile + 1)]
                with m.If((tile + 1) * R >= job.d_out):
                    m.d.sync += [draining.eq(0), tile.eq(0)]
            with m.Else():
                m.d.sync += [pair.eq(pair + 1), in_job.eq(~at_end),
                             at_end.eq(pair + 1 >= last_pair)]
                with m.If(real):
                    with m.If(last_of_token):
                        m.d.sync += [step.eq(0), last_of_token.eq(last_step == 0),
                                     token.eq(token + 1), held.eq(0)]
                    with m.Else():
                        m.d.sync += [step.eq(step + 1), last_of_token.eq(step + 1 == last_step),
                                     held.eq(Cat(*[a.as_unsigned()[:vw] for a in afters]))]

        out_valid = pipe.reg(real, "gen_valid")
        row = Signal(self.out.payload.shape())
        m.d.comb += [row.spikes.eq(Cat(*fires)), row.token.eq(token), row.timestep.eq(step),
                     row.tile.eq(tile), row.last.eq(final)]
        out_row = pipe.reg(row.as_value(), "gen_out")
        queue.push(m, out_valid & pipe.enable, out_row)
        pipe.emit(m)
        return m


register(Block(
    name="spiking_expert", family="spiking_expert", config=SpikingExpertConfig, build=SpikingExpert,
    figures=lambda cfg: {"column_latency_cycles": golden.column_latency(cfg.rows),
                         "peak_synaptic_ops_per_cycle": cfg.rows * cfg.cols},
    summary="spiking expert core: synaptic-integration-stationary array + LIF spike generators",
    demo_configs=({"rows": 8, "cols": 16},),
    area_unit="PE", operation="synaptic op", area_units=lambda cfg: cfg.rows * cfg.cols,
    legend="cycles of a 2 x 2-tile job, synaptic operations per cycle vs the R x C peak",
    tiers=lambda cfg: (SpikingExpert(cfg, tier="top"), SisArray(cfg)),
    tier_contents=("generators, V register, control, FIFO", "the synaptic-integration array"),
))
