"""Golden model of the spiking expert core (``spiking_expert``): seed 004 Alg. 1 steps 2-4.

Pure Python (no amaranth, no hw/): the synaptic integration, the LIF generators (the rule of
:mod:`golden.spiking`), the tile order of the input streams, the output order and the timing.
"""

from golden.fixed import wrap
from golden.spiking import lif_step

__all__ = ["expert_reference", "expert_input_beats", "expert_output_order",
           "column_latency", "bond_count"]


def expert_reference(weights, spikes, vth, vleak, acc_width, v_width):
    """Output spikes ``[n][t][r]`` of one spiking expert.

    ``weights[r][d]`` (D_out x D_in, signed), ``spikes[n][t][d]`` (0/1). The synaptic
    integration ``I[n, t, r] = sum_d W[r, d] S[n, t, d]`` wraps to ``acc_width``; each
    (token, neuron) is a LIF neuron over the timesteps (:func:`lif_step`, V from 0 at t = 0).
    """
    out = []
    for token in spikes:
        potentials = [0] * len(weights)
        per_step = []
        for step in token:
            inputs = [wrap(sum(int(w) for w, s in zip(row, step) if s), acc_width)
                      for row in weights]
            potentials, fired = lif_step(potentials, inputs, vth, vleak, v_width)
            per_step.append(fired)
        out.append(per_step)
    return out


def _pairs(spikes):
    return [step for token in spikes for step in token]


def expert_input_beats(weights, spikes, rows, cols, pad=lambda: 0):
    """Paired ``(w beat, s beat)`` in stream order.

    For each row tile (``rows`` neurons) and each column tile (``cols`` (token, timestep)
    pairs, timestep fastest), for d = 0..D_in-1: w lane i = W[tile*rows + i, d], s bit k =
    S[pair ct*cols + k, d]. Lanes past D_out and bits past the last pair are ``pad()`` (ignored).
    """
    d_out, d_in = len(weights), len(weights[0])
    pairs = _pairs(spikes)
    beats = []
    for row0 in range(0, d_out, rows):
        for col0 in range(0, len(pairs), cols):
            for d in range(d_in):
                w = [int(weights[row0 + i][d]) if row0 + i < d_out else pad()
                     for i in range(rows)]
                s = sum((int(pairs[col0 + k][d]) if col0 + k < len(pairs) else pad() & 1) << k
                        for k in range(cols))
                beats.append((w, s))
    return beats


def expert_output_order(reference, d_out, rows):
    """Expected output beats ``(spikes bits, token, timestep, tile, last)`` in order: per row
    tile, per (token, timestep); bit i = neuron tile*rows + i (0 past D_out)."""
    tokens, steps = len(reference), len(reference[0])
    tiles = -(-d_out // rows)
    beats = []
    for tile in range(tiles):
        for n in range(tokens):
            for t in range(steps):
                bits = sum(reference[n][t][tile * rows + i] << i
                           for i in range(rows) if tile * rows + i < d_out)
                last = int(tile == tiles - 1 and n == tokens - 1 and t == steps - 1)
                beats.append((bits, n, t, tile, last))
    return beats


def column_latency(rows):
    """Edges from a tile's last beat to the output of its first column (ready output).

    The beat reaches PE row ``rows - 1`` after ``rows - 1`` skew stages; the PE's done flag (1),
    the row OR register (1) and the deskew align column 0 at ``rows + 1``; the generator
    register (1) and the output FIFO (1) follow. Column j leaves ``j`` edges after column 0.
    """
    return rows + 3


def bond_count(rows, cols, w_width, acc_width):
    """F2F bonds of the two-tier spiking expert, from its tier interface (seed 004 Fig. 2):
    down (top -> bottom) clock, reset, the pipeline enable, the beat's valid/first/last flags,
    R weights and C spikes; up (bottom -> top) the column's valid and last flags and its R
    integrations (the "3D-extractable" readout)."""
    return {"down": 2 + 4 + rows * w_width + cols, "up": 2 + rows * acc_width}
