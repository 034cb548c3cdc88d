"""The spiking base the four spiking blocks are built on (seed 004 §III-B, Fig. 2).

* :class:`SisArray`: the synaptic-integration-stationary array, the bottom tier of every spiking
  block (:func:`hw.systolic.os_grid` with a spike-gated add and a column read-out);
* :class:`SisTieredComponent`: a spiking block built whole (2D) or as its top tier alone (3D
  build, :class:`hw.params.TieredComponent`);
* :func:`tile_counter` and :func:`tile_feeder`: the tiled beat order of
  :func:`golden.spiking_expert.expert_input_beats`, paired into an array.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.params import ConfiguredComponent, TieredComponent
from hw.pipeline import StallPipe
from hw.systolic import os_grid

__all__ = ["SisArray", "array_signature", "SisTieredComponent", "tile_counter", "tile_feeder"]


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


class SisArray(ConfiguredComponent):
    """Bottom tier: the synaptic-integration-stationary R x C array (:func:`os_grid` with a
    spike-gated add and a column readout), all registers moving on ``enable``."""

    def __init__(self, config):
        super().__init__(config, array_signature(config))

    def elaborate(self, platform):
        cfg = self.config
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


class SisTieredComponent(TieredComponent):
    """A spiking block: its bottom tier is one :class:`SisArray` (a submodule ``array`` in the
    2D build)."""

    def feed_sis_array(self, m, pipe, take, first, last):
        """The bottom tier of the expert and the router: one :class:`SisArray` fed from the
        paired ``w``/``s`` streams (``self.bottom`` in a top-tier build, else a submodule
        ``array``). Returns the array and its R column read-out values (signed)."""
        if self._tier == "top":
            array = self.bottom
        else:
            m.submodules.array = array = SisArray(self.config)
        m.d.comb += [array.enable.eq(pipe.enable), array.valid.eq(take),
                     array.first.eq(first), array.last.eq(last),
                     array.w.eq(self.w.payload.w.as_value()), array.s.eq(self.s.payload.s)]
        acc = self.config.acc_width
        rows = len(array.values) // acc
        return array, [array.values[i * acc:(i + 1) * acc].as_signed() for i in range(rows)]


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
