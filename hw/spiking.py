"""Leaky integrate-and-fire neurons (``lif``): the spike generators of a spiking expert core.

Source: seed 004 §II-A, equations (1)-(2) (V[t] = V[t-1] + X[t] - Vleak; spike and reset to 0
when V[t] > Vth), §III-B (the spike generators on the top tier keep the membrane potentials and
emit output spikes). The order of leak, integrate, compare and reset, the widths and the
saturation are in :mod:`golden.spiking` and docs/blocks/spiking.md.

N neurons step together: one input beat (N synaptic inputs) is one timestep, taken every cycle
the pipeline can move (its output register free or being emptied); the step's spikes and
potentials leave two edges later. ``Vth`` and ``Vleak`` come through the always-ready ``params``
stream; a write taken at edge e applies to input beats taken after e.

Two stages, so that the recurrence on V (one timestep a cycle) holds only one carry chain: the
first registers what depends on the input alone (``X - Vleak`` and ``Vth - (X - Vleak)``,
:func:`lif_prepare`), the second adds V and compares V in parallel (:func:`lif_update`). In one
stage the chain ``Vleak -> subtract -> add -> saturate -> compare -> select -> V`` held the
default block to 62 MHz on ECP5 (docs/blocks/spiking.md, "Clock rate").
"""

import dataclasses

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from golden import spiking as golden
from hw.params import ConfiguredComponent, int_param, validate
from golden.fixed import signed_limits
from hw.registry import Block, register

__all__ = ["LifConfig", "Lif", "lif_neuron", "lif_prepare", "lif_update"]


@dataclasses.dataclass(frozen=True)
class LifConfig:
    """Parameters of ``lif``.

    Parameters
    ----------
    neurons : int
        N, neurons stepping together (one input beat = one timestep of all of them).
    x_width : int
        Bits of a signed synaptic input (seed 004 §V-A: 16-bit synaptic integration).
    v_width : int
        Bits of a signed membrane potential, of Vth and of Vleak; V saturates at this width.
    """
    neurons: int = int_param(16, 1, 128, "N, neurons stepping together")
    x_width: int = int_param(16, 2, 32, "bits of a signed synaptic input")
    v_width: int = int_param(16, 2, 40, "bits of a signed membrane potential, Vth and Vleak")

    def __post_init__(self):
        validate(self)


class Lif(ConfiguredComponent):
    """``lif``: N leaky integrate-and-fire neurons stepping together (docs/blocks/spiking.md).

    Members
    -------
    x : In(stream.Signature({x: N signed x_width, last}))
        One timestep's synaptic inputs; ``last`` ends a sample (V returns to 0 after it).
    params : In(stream.Signature({vth, vleak: signed v_width}))
        Threshold and leak, applied from the edge after the write.
    s : Out(stream.Signature({spikes: N bits, v: N signed v_width, last}))
    """

    def __init__(self, config):
        cfg = config
        N = cfg.neurons
        super().__init__(config, {
            "x": In(stream.Signature(data.StructLayout({
                "x": data.ArrayLayout(signed(cfg.x_width), N), "last": 1}))),
            "params": In(stream.Signature(data.StructLayout({
                "vth": signed(cfg.v_width), "vleak": signed(cfg.v_width)}))),
            "s": Out(stream.Signature(data.StructLayout({
                "spikes": N, "v": data.ArrayLayout(signed(cfg.v_width), N), "last": 1}))),
        })

    def elaborate(self, platform):
        cfg = self.config
        N, vw = cfg.neurons, cfg.v_width
        m = Module()

        vth = Signal(signed(vw))
        vleak = Signal(signed(vw))
        m.d.comb += self.params.ready.eq(1)
        with m.If(self.params.valid):
            m.d.sync += [vth.eq(self.params.payload.vth), vleak.eq(self.params.payload.vleak)]

        potentials = [Signal(signed(vw), name=f"v{i}") for i in range(N)]
        # Both stages move together when the output register is free or being emptied.
        advance = Signal()
        m.d.comb += [advance.eq(~self.s.valid | self.s.ready), self.x.ready.eq(advance)]

        # Stage 1: the input beat and what depends on it and on the parameters alone.
        staged_valid, staged_last = Signal(), Signal()
        staged = []
        for i in range(N):
            prepared = lif_prepare(m, self.x.payload.x[i], vth, vleak, vw, f"n{i}")
            registers = [Signal(value.shape(), name=f"{value.name}_s1") for value in prepared]
            with m.If(advance):
                m.d.sync += [r.eq(value) for r, value in zip(registers, prepared)]
            staged.append(registers)
        with m.If(advance):
            m.d.sync += [staged_valid.eq(self.x.valid),
                         staged_last.eq(self.x.payload.last)]

        # Stage 2: V's update, into the output register.
        with m.If(self.s.ready):
            m.d.sync += self.s.valid.eq(0)
        out = self.s.payload
        with m.If(advance & staged_valid):
            m.d.sync += [self.s.valid.eq(1), out.last.eq(staged_last)]
            for i, v in enumerate(potentials):
                fire, after = lif_update(m, v, *staged[i], vw, f"n{i}")
                m.d.sync += [out.spikes[i].eq(fire), out.v[i].eq(after),
                             v.eq(Mux(staged_last, 0, after))]
        return m


def lif_neuron(m, v, x, vth, vleak, v_width, name, vth_plus_leak=None):
    """One LIF step (combinational): returns ``(fire, V after the step)``.

    Leak and integrate with an exact sum saturated to ``v_width``, strict compare, reset to
    zero — the order of :mod:`golden.spiking`. ``vth_plus_leak``: see :func:`lif_prepare`.
    """
    return lif_update(m, v, *lif_prepare(m, x, vth, vleak, v_width, name, vth_plus_leak),
                      v_width, name)


def lif_prepare(m, x, vth, vleak, v_width, name, vth_plus_leak=None):
    """The part of a LIF step that does not read V: ``(d, e, fire_high)`` with ``d = X -
    Vleak``, ``e = Vth - d`` (exact), and whether a sum saturated at the top of the ``v_width``
    range fires (``max > Vth``; one saturated at the bottom never fires: Vth >= min).

    ``vth_plus_leak``: Vth + Vleak held in a register by the caller (a job's constants); then
    ``e = (Vth + Vleak) - X``, beside ``d`` instead of after it (clock rate: one carry chain
    fewer on the path from X to the compare)."""
    _, high = signed_limits(v_width)
    d = Signal(signed(max(v_width, len(x)) + 1), name=f"{name}_d")
    e = Signal(signed(max(v_width, len(x)) + 2), name=f"{name}_e")
    fire_high = Signal(name=f"{name}_fire_high")
    m.d.comb += [d.eq(x - vleak), fire_high.eq(vth < high),
                 e.eq(vth - d if vth_plus_leak is None else vth_plus_leak - x)]
    return d, e, fire_high


def lif_update(m, v, d, e, fire_high, v_width, name):
    """The part of a LIF step that reads V (:func:`lif_prepare` gives the rest): returns
    ``(fire, V after the step)``. Unsaturated, ``sat(V + d) > Vth`` is ``V > e``, so the
    compare runs beside the adder instead of after it."""
    low, high = signed_limits(v_width)
    total = Signal(signed(len(d) + 1), name=f"{name}_sum")
    m.d.comb += total.eq(v + d)
    # Out of range when the bits from v_width-1 up are not all equal (the sign says which
    # way): a few bits' AND/OR instead of two comparisons with constants after the adder.
    top, sign = total[v_width - 1:], total[-1]
    above, below = ~sign & top.any(), sign & ~top.all()
    fire = Signal(name=f"{name}_fire")
    m.d.comb += fire.eq(Mux(above, fire_high, ~below & (v > e)))
    integrated = Mux(above, high, Mux(below, low, total))
    return fire, Mux(fire, 0, integrated)


register(Block(
    name="lif", family="spiking", config=LifConfig, build=Lif,
    figures=lambda cfg: {"latency_cycles": golden.LATENCY, "steps_per_cycle": 1},
    summary="N leaky integrate-and-fire neurons: strict threshold, reset to zero, saturating V",
    demo_configs=({},),
    legend="timesteps per cycle, latency, spike rate of a random drive",
    area_unit="neuron", operation="neuron update", area_units=lambda cfg: cfg.neurons,
))

