"""Golden model of the leaky integrate-and-fire neurons (``lif``).

Pure Python (no amaranth, no hw/). Source: seed 004 §II-A, equations (1)-(2), with the bit-level
choices of Loihi's LIF (strict threshold, reset to zero in the firing step).

One timestep of neuron i, in this order (followed bit for bit by the RTL):

1. leak and integrate: ``V' = sat(V + X - Vleak)``, computed exactly, then saturated to the
   signed ``v_width`` range (X is the step's synaptic input, signed ``x_width``);
2. compare: the neuron spikes when ``V' > Vth`` (strictly: ``V' == Vth`` does not fire);
3. reset: ``V = 0`` if it spiked, else ``V = V'``.

``Vth`` and ``Vleak`` are signed ``v_width`` values written at run time; a negative leak
charges, a leak larger than the input drives V below zero (it saturates at the bottom too).
After a step whose input beat carries ``last`` (the final timestep of a sample), every V
returns to 0 for the next sample.
"""

from golden.fixed import saturate

__all__ = ["lif_step", "lif_run", "LATENCY"]

# Edges from an input beat's transfer to its output's transfer (ready output): two registers
# (the input-only part of the step, then V's update into the output register).
LATENCY = 2


def lif_step(potentials, inputs, vth, vleak, v_width):
    """One timestep for all neurons: returns ``(new potentials, spikes)`` (lists)."""
    new, spikes = [], []
    for v, x in zip(potentials, inputs):
        v = saturate(int(v) + int(x) - int(vleak), v_width)
        fire = v > vth
        spikes.append(int(fire))
        new.append(0 if fire else v)
    return new, spikes


def lif_run(steps, v_width, neurons):
    """Replay input beats: ``steps`` is a list of ``(inputs, last, vth, vleak)``.

    Returns a list of ``(spikes, potentials after the step, last)`` per beat.
    """
    potentials = [0] * neurons
    out = []
    for inputs, last, vth, vleak in steps:
        potentials, spikes = lif_step(potentials, inputs, vth, vleak, v_width)
        out.append((spikes, list(potentials), int(last)))
        if last:
            potentials = [0] * neurons
    return out

