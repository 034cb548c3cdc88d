"""Spiking expert core (``spiking_expert``): synaptic integration, membrane accumulation and
conditional spike generation fused (seed 004 Alg. 1 steps 2-4, §III-B, Fig. 2).

Bottom tier: a synaptic-integration-stationary R x C array (:func:`hw.systolic.os_grid` with a
spike-gated add instead of a multiplier): rows are output neurons, columns (token, timestep)
pairs; multi-bit weights flow horizontally, 1-bit spikes vertically, each PE adds its weight
when the spike is 1 and keeps the sum. Each tile's sums are read out column by column (the
"3D-extractable" readout). Top tier: R LIF spike generators (:func:`hw.spiking.lif_neuron`)
that keep one membrane potential per (token, neuron) across timesteps and emit the output
spikes. D_in is streamed, D_out and the pairs are tiled (tile order in :mod:`golden.spiking`).
"""

import dataclasses

from amaranth.hdl import Cat, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from golden import spiking_expert as golden
from hw.params import int_param, validate
from hw.pipeline import StallPipe
from hw.registry import Block, register
from hw.spiking import lif_neuron
from hw.systolic import OUT_FIFO_DEPTH, os_grid

__all__ = ["SpikingExpertConfig", "SpikingExpert", "SisArray", "array_signature",
           "expert_command_layout", "tile_counter", "tile_feeder", "tier_report", "TieredComponent"]


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
        Tokens per job (the generators keep one V word of R potentials per token).
    """
    rows: int = int_param(16, 1, 32, "R, PE rows (output neurons per tile)")
    cols: int = int_param(16, 1, 128, "C, PE columns ((token, timestep) pairs per tile)")
    w_width: int = int_param(8, 2, 16, "bits of a signed weight")
    acc_width: int = int_param(16, 4, 32, "bits of a synaptic integration (wraps)")
    v_width: int = int_param(16, 2, 32, "bits of a membrane potential, Vth and Vleak")
    max_tokens: int = int_param(16, 1, 256, "tokens per job (one V word per token)")

    def __post_init__(self):
        validate(self)


def expert_command_layout(config):
    """``d_in``, ``d_out``, ``tokens``, ``timesteps``, ``vth``, ``vleak``."""
    return data.StructLayout({
        "d_in": 16, "d_out": 16, "tokens": bits_for(config.max_tokens), "timesteps": 8,
        "vth": signed(config.v_width), "vleak": signed(config.v_width)})


def array_signature(config):
    """The bottom tier's ports: the pipeline enable, the beat flags, one beat of weights and
    spikes in; one column of integrations out (the "3D-extractable" readout)."""
    return wiring.Signature({
        "enable": In(1), "valid": In(1), "first": In(1), "last": In(1),
        # Flat bit vectors (lane i at [i*width, (i+1)*width)): with array-typed ports Amaranth
        # names per-lane wires `values[0]`, which collide with the bit names ABC gives back
        # when a tier is synthesized alone (a Yosys 0.70 assertion).
        "w": In(config.w_width * config.rows),
        "s": In(config.cols),
        "column_valid": Out(1), "column_last": Out(1),
        "values": Out(config.acc_width * config.rows),
    })


class SisArray(wiring.Component):
    """Bottom tier: the synaptic-integration-stationary R x C array (:func:`os_grid` with a
    spike-gated add and a column readout), all registers moving on ``enable``."""

    def __init__(self, config):
        self._cfg = config
        super().__init__(array_signature(config))

    def elaborate(self, platform):
        cfg = self._cfg
        m = Module()
        pipe = StallPipe(self.enable)
        ww = cfg.w_width
        column_valid, column_last, values = os_grid(
            m, pipe, cfg.rows, cfg.cols, cfg.acc_width,
            [self.w[i * ww:(i + 1) * ww].as_signed() for i in range(cfg.rows)],
            [self.s[j] for j in range(cfg.cols)],
            self.valid, self.first, self.last, prefix="sis_",
            product=lambda weight, spike: Mux(spike, weight, 0), readout="columns")
        m.d.comb += [self.column_valid.eq(column_valid), self.column_last.eq(column_last),
                     self.values.eq(Cat(*[v.as_unsigned()[:cfg.acc_width] for v in values]))]
        pipe.emit(m)
        return m


class TieredComponent(wiring.Component):
    """A block built whole (2D, ``tier=None``: its arrays are submodules) or as its top tier
    alone (``tier="top"``: the arrays' ports become ports ``bottom__*``, for the 3D build).

    Parameters
    ----------
    config
        The block's config (``self.config``).
    members : dict
        The block's own ports.
    bottom : wiring.Signature
        The bottom tier's signature, as the bottom tier sees it.
    tier : None or "top"
    """

    def __init__(self, config, members, bottom, tier=None):
        self._cfg = config
        self._tier = tier
        if tier == "top":
            members["bottom"] = In(bottom)                 # flipped: the top drives enable
        super().__init__(members)

    @property
    def config(self):
        return self._cfg

    def feed_sis_array(self, m, pipe, take, first, last):
        """The bottom tier of the expert and the router: one :class:`SisArray` fed from the
        paired ``w``/``s`` streams (``self.bottom`` in a top-tier build, else a submodule
        ``array``). Returns the array and its R column read-out values (signed)."""
        if self._tier == "top":
            array = self.bottom
        else:
            m.submodules.array = array = SisArray(self._cfg)
        m.d.comb += [array.enable.eq(pipe.enable), array.valid.eq(take),
                     array.first.eq(first), array.last.eq(last),
                     array.w.eq(self.w.payload.w.as_value()), array.s.eq(self.s.payload.s)]
        acc = self._cfg.acc_width
        rows = len(array.values) // acc
        return array, [array.values[i * acc:(i + 1) * acc].as_signed() for i in range(rows)]


class SpikingExpert(TieredComponent):
    """``spiking_expert``: a synaptic-integration-stationary R x C array (bottom tier) and R
    LIF spike generators (top tier) fused: steps 2 + 3 + 4 of seed 004 Alg. 1.

    Ports: ``cmd`` (:func:`expert_command_layout`, taken when idle); ``w`` {w[R]} and ``s``
    {s: C bits}, paired beat by beat in the tile order of :mod:`golden.spiking`; ``out``
    {spikes: R bits, token, timestep, tile, last}; ``busy``; sticky ``error``.
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
        cfg = self._cfg
        R, C, vw = cfg.rows, cfg.cols, cfg.v_width
        m = Module()
        m.submodules.out_fifo = fifo = SyncFIFO(width=len(self.out.payload.as_value()),
                                                depth=OUT_FIFO_DEPTH)
        pipe = StallPipe(fifo.w_rdy)

        # The job (latched command).
        job = Signal(expert_command_layout(cfg))
        pair_bits = bits_for(cfg.max_tokens * 255 + C)      # pairs incl. a padded tile
        pairs = Signal(pair_bits)              # tokens * timesteps
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
                             running.eq(1)]

        # Input side: pair the w and s beats, count d / column tile / row tile.
        take, first, last, job_done = tile_feeder(
            m, pipe, R, C, running, self.w, self.s, job.d_in, pairs, job.d_out)
        with m.If(job_done):
            m.d.sync += [running.eq(0), draining.eq(1)]

        # Bottom tier: the synaptic-integration-stationary array, read out column by column.
        array, integrations = self.feed_sis_array(m, pipe, take, first, last)
        column_valid, column_last = array.column_valid, array.column_last

        # Top tier: spike generators. One V word (R potentials) per token of this row tile.
        m.submodules.potentials = potentials = Memory(
            shape=unsigned(R * vw), depth=cfg.max_tokens, init=[])
        v_read, v_write = potentials.read_port(domain="comb"), potentials.write_port()
        pair, token, step, tile = Signal(pair_bits), Signal(8), Signal(8), Signal(16)
        real = Signal()                 # this column is a (token, timestep) pair of the job
        m.d.comb += [real.eq(column_valid & (pair < pairs)), v_read.addr.eq(token),
                     v_write.addr.eq(token)]
        fires, afters = [], []
        for i in range(R):
            previous = Mux(step == 0, 0, v_read.data[i * vw:(i + 1) * vw].as_signed())
            fire, after = lif_neuron(m, previous, integrations[i], job.vth, job.vleak, vw,
                                     f"gen{i}")
            in_range = tile * R + i < job.d_out       # rows past d_out never spike
            fires.append(fire & in_range)
            afters.append(after)
        m.d.comb += [v_write.data.eq(Cat(*[a.as_unsigned()[:vw] for a in afters])),
                     v_write.en.eq(real & pipe.enable)]
        final = Signal()
        m.d.comb += final.eq((pair == pairs - 1) & ((tile + 1) * R >= job.d_out))
        with m.If(pipe.enable & column_valid):
            with m.If(column_last & ((pair + 1) >= pairs)):
                # The row tile's last column (padding included) has left the array.
                m.d.sync += [pair.eq(0), token.eq(0), step.eq(0), tile.eq(tile + 1)]
                with m.If((tile + 1) * R >= job.d_out):
                    m.d.sync += [draining.eq(0), tile.eq(0)]
            with m.Else():
                m.d.sync += pair.eq(pair + 1)
                with m.If(real):
                    with m.If(step == job.timesteps - 1):
                        m.d.sync += [step.eq(0), token.eq(token + 1)]
                    with m.Else():
                        m.d.sync += step.eq(step + 1)

        out_valid = pipe.reg(real, "gen_valid")
        row = Signal(self.out.payload.shape())
        m.d.comb += [row.spikes.eq(Cat(*fires)), row.token.eq(token), row.timestep.eq(step),
                     row.tile.eq(tile), row.last.eq(final)]
        out_row = pipe.reg(row.as_value(), "gen_out")
        m.d.comb += [fifo.w_en.eq(out_valid & pipe.enable), fifo.w_data.eq(out_row),
                     self.out.valid.eq(fifo.r_rdy), self.out.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.out.ready)]
        pipe.emit(m)
        return m


def tile_counter(m, advance, reduce_len, columns, cols, rows_total, rows, name="tile"):
    """Position in the beat order of :func:`golden.spiking_expert.expert_input_beats`: per row
    tile (``rows`` of ``rows_total``), per column tile (``cols`` of ``columns``),
    ``reduce_len`` beats. Moves on ``advance``; returns ``(d, col_tile, row_tile, done)``,
    ``done`` (combinational) marking the job's last beat."""
    # Sized by what they count to (d < reduce_len, tiles <= columns, rows_total): constant
    # upper bits make Yosys 0.70 stop on "conflicting init values".
    reduce_len, columns, rows_total = (Value.cast(v) for v in (reduce_len, columns, rows_total))
    d = Signal(len(reduce_len), name=f"{name}_d")
    col_tile = Signal(len(columns), name=f"{name}_col")
    row_tile = Signal(len(rows_total), name=f"{name}_row")
    done = Signal(name=f"{name}_done")
    with m.If(advance):
        with m.If(d != reduce_len - 1):
            m.d.sync += d.eq(d + 1)
        with m.Else():
            m.d.sync += d.eq(0)
            with m.If((col_tile + 1) * cols >= columns):
                m.d.sync += [col_tile.eq(0), row_tile.eq(row_tile + 1)]
                with m.If((row_tile + 1) * rows >= rows_total):
                    m.d.sync += row_tile.eq(0)
                    m.d.comb += done.eq(1)
            with m.Else():
                m.d.sync += col_tile.eq(col_tile + 1)
    return d, col_tile, row_tile, done


def tile_feeder(m, pipe, rows, cols, running, w, s, reduce_len, columns, rows_total,
                spacing=None):
    """Pair the ``w`` and ``s`` beats of a tiled job for a :class:`SisArray`.

    Beats come in the order of :func:`golden.spiking_expert.expert_input_beats`: per row tile
    (``rows`` of ``rows_total``), per column tile (``cols`` of ``columns``), ``reduce_len``
    beats. A tile's columns leave every row on ``cols`` consecutive cycles, so a tile's last
    beat waits until ``cols`` advancing cycles have passed since the previous one (never when
    ``reduce_len >= cols``). A larger ``spacing`` than ``cols`` holds the tiles further apart
    (for an array read out into a wider one). Returns ``(take, first, last, done)``: the beat
    is taken, it is its tile's first / last, it is the job's last (all combinational).
    """
    spacing = cols if spacing is None else spacing
    first, last, take = Signal(), Signal(), Signal()
    d, _, _, done = tile_counter(m, take, reduce_len, columns, cols, rows_total, rows)
    m.d.comb += [first.eq(d == 0), last.eq(d == reduce_len - 1)]
    since_last = Signal(range(spacing + 1), init=spacing)
    m.d.comb += [take.eq(pipe.enable & running & w.valid & s.valid &
                         (~last | (since_last >= spacing))),
                 w.ready.eq(take), s.ready.eq(take)]
    with m.If(pipe.enable):
        with m.If(take & last):
            m.d.sync += since_last.eq(1)
        with m.Elif(since_last < spacing):
            m.d.sync += since_last.eq(since_last + 1)
    return take, first, last, done


register(Block(
    name="spiking_expert", family="spiking_expert", config=SpikingExpertConfig, build=SpikingExpert,
    figures=lambda cfg: {"column_latency_cycles": golden.column_latency(cfg.rows),
                         "peak_synaptic_ops_per_cycle": cfg.rows * cfg.cols},
    summary="spiking expert core: synaptic-integration-stationary array + LIF spike generators",
    demo_configs=({"rows": 8, "cols": 16},),
    area_unit="PE", area_units=lambda cfg: cfg.rows * cfg.cols,
    tiers=lambda cfg: (SpikingExpert(cfg, tier="top"), SisArray(cfg)),
    demo_report=lambda measured: tier_report(
        "spiking_expert", "generators, V memory, control, FIFO", "the synaptic-integration array"),
))


def tier_report(name, top_holds, bottom_holds):
    """The ``make demo`` 2D/3D table of a two-tier block (its first demo configuration)."""
    from flows.threed import synthesize_3d      # imported late: flows import the registry
    from hw.registry import get_block
    block = get_block(name)
    params = block.demo_configs[0]
    r = synthesize_3d(block, block.config(**params))
    shown = " ".join(f"{key}={value}" for key, value in params.items()) or "(defaults)"
    return "\n".join([
        f"{name} {shown}, two-tier 3D build (moegen synth {name} --3d)",
        f"  tier top (die 0: {top_holds}): {r['top']['cells']} cells",
        f"  tier bottom (die 1: {bottom_holds}): {r['bottom']['cells']} cells",
        f"  2D (one die): {r['2d']['cells']} cells; bonds {r['bonds']['down']} down, "
        f"{r['bonds']['up']} up",
        f"  footprint estimate (largest tier / 2D): {r['footprint_ratio']:.2f}"])
