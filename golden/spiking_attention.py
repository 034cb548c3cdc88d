"""Golden model of the spiking multi-head attention cores (``spiking_attention``): seed 004
§IV, Alg. 2, bit for bit.

Pure Python (no amaranth, no hw/). Per timestep t and head h (Q, K, V in {0,1}^{T x N x H x d}):

1. ``A[n, m] = sum_i Q[t, n, h, i] AND K[t, m, h, i]`` (AND + popcount, 0..d);
2. ``Y[n, j] = sum_m A[n, m] V[t, m, h, j]`` (attention-weighted synaptic integration, an add of
   A[n, m] wherever V is 1; 0..N x d, held exactly);
3-4. neuron (n, h*d + j) is a LIF neuron over the timesteps fed by Y[n, j]
   (:func:`golden.spiking.lif_step`: leak and integrate, saturate to ``v_width``, strict
   threshold, reset to zero; V starts at 0 at t = 0).

The output ``S_out[t, n, h*d + j]`` concatenates the heads (Alg. 2 "Merge ... Concat"). No
scale factor is applied to A·V: a model with one (Spikformer's s) folds it into Vth.
"""

from golden.spiking import lif_step

__all__ = ["attention_reference", "attention_input_beats", "attention_output_order",
           "attention_cycles", "attention_bond_count"]


def attention_reference(q, k, v, vth, vleak, v_width):
    """``out[t][n][h*d + j]`` for ``q, k, v[t][n][h][i]`` (0/1)."""
    steps, tokens, heads, dim = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])
    potentials = [[0] * dim for _ in range(heads * tokens)]
    out = []
    for t in range(steps):
        row = [[0] * (heads * dim) for _ in range(tokens)]
        for h in range(heads):
            a = [[sum(q[t][n][h][i] & k[t][m][h][i] for i in range(dim)) for m in range(tokens)]
                 for n in range(tokens)]
            for n in range(tokens):
                y = [sum(a[n][m] for m in range(tokens) if v[t][m][h][j]) for j in range(dim)]
                index = h * tokens + n
                potentials[index], spikes = lif_step(potentials[index], y, vth, vleak, v_width)
                row[n][h * dim:(h + 1) * dim] = spikes
        out.append(row)
    return out


def attention_input_beats(q, k, v, max_tokens, max_head_dim):
    """The two input streams: ``qk`` per timestep t, per feature i < d: ``(q bits, k bits)``
    with bit ``h * max_tokens + n`` = Q[t, n, h, i] (resp. K); ``v`` per timestep t, per token
    m: bit ``h * max_head_dim + j`` = V[t, m, h, j]."""
    steps, tokens, heads, dim = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])

    def column(x, t, i):
        return sum(x[t][n][h][i] << (h * max_tokens + n)
                   for h in range(heads) for n in range(tokens))
    qk = [(column(q, t, i), column(k, t, i)) for t in range(steps) for i in range(dim)]
    vb = [sum(v[t][m][h][j] << (h * max_head_dim + j) for h in range(heads) for j in range(dim))
          for t in range(steps) for m in range(tokens)]
    return qk, vb


def attention_output_order(out, heads, max_tokens):
    """Output beats ``(spikes, timestep, feature j, last)`` per timestep, per j < d: bit
    ``h * max_tokens + n`` = S_out[t, n, h*d + j]."""
    steps, tokens = len(out), len(out[0])
    dim = len(out[0][0]) // heads
    return [(sum(out[t][n][h * dim + j] << (h * max_tokens + n)
                 for h in range(heads) for n in range(tokens)),
             t, j, int(t == steps - 1 and j == dim - 1))
            for t in range(steps) for j in range(dim)]


def attention_cycles(tokens, steps, dim, max_tokens, max_head_dim):
    """Edges relative to the first ``qk`` beat (edge 0), streams waiting and ``out`` ready.

    * timestep t's last qk beat at ``(dim - 1) + t * max(dim, S)``, S = max(max_tokens,
      max_head_dim): the score array's tiles are held S apart so that the A·V array, fed by
      its read-out, sees its own tiles at least max_head_dim apart;
    * column m of A (and V beat m) enters the A·V array ``max_tokens + 1 + m`` edges after the
      timestep's last qk beat;
    * output column j leaves ``max_tokens + 3 + j`` edges after the last of them (the expert
      core's column latency).
    """
    spacing = max(dim, max_tokens, max_head_dim)
    last_qk = [dim - 1 + t * spacing for t in range(steps)]
    v_beats = [e + max_tokens + 1 + m for e in last_qk for m in range(tokens)]
    outputs = [e + max_tokens + tokens + max_tokens + 3 + j for e in last_qk for j in range(dim)]
    return {"last_qk": last_qk, "v_beats": v_beats, "outputs": outputs}


def attention_bond_count(heads, max_tokens, max_head_dim, score_width, product_width):
    """F2F bonds: per head, the score array's interface (down: enable, valid, first, last,
    N two-bit Q weights, N K spikes; up: column valid/last, N scores) and the A·V array's
    (down: the same flags, N scores as weights, d V spikes; up: column flags, N integrations);
    clock and reset once."""
    score = {"down": 4 + max_tokens * 2 + max_tokens, "up": 2 + max_tokens * score_width}
    product = {"down": 4 + max_tokens * score_width + max_head_dim,
               "up": 2 + max_tokens * product_width}
    return {"down": 2 + heads * (score["down"] + product["down"]),
            "up": heads * (score["up"] + product["up"])}
