"""Golden model of the spiking token router (``spiking_router``): seed 004 Alg. 1 step 1 and
the merge of step 5.

Pure Python (no amaranth, no hw/). The expert routing-score array computes, per token n and
expert e, ``I[n, e] = sum_t sum_d S_in[n, t, d] * W_r[t, d, e]`` (a spike-gated sum of signed
weights, wrapping to ``acc_width`` bits like the expert core's integration). The K experts
with the highest scores are chosen; equal scores go to the lower expert index
(:func:`golden.router.rank_order`). Merge (step 5): with K = 1 a token's output is its expert's
output; with K > 1 it is the element-wise OR of its K experts' output spikes.
"""

from golden.router import rank_order
from golden.fixed import wrap
from golden.spiking_expert import column_latency

__all__ = ["router_scores", "route_mask", "router_input_beats", "router_output_order",
           "merge", "route_latency"]


def route_latency(experts):
    """Edges from a column tile's last beat to the route of its first token (ready output):
    the score array's :func:`golden.spiking_expert.column_latency`, plus the top-K's
    comparison register (the counts and the compare with K follow in the output register's
    cycle). Token j of the tile leaves ``j`` edges later."""
    return column_latency(experts) + 1


def router_scores(spikes, routing_weights, acc_width):
    """``I[n][e]`` for ``spikes[n][t][d]`` (0/1) and ``routing_weights[t][d][e]`` (signed)."""
    experts = len(routing_weights[0][0])
    return [[wrap(sum(int(routing_weights[t][d][e])
                      for t, step in enumerate(token) for d, s in enumerate(step) if s),
                  acc_width)
             for e in range(experts)] for token in spikes]


def route_mask(scores, k):
    """Bit mask of the ``k`` chosen experts (highest scores, ties to the lower index)."""
    return sum(1 << e for e in rank_order(scores)[:k])


def router_input_beats(routing_weights, spikes, cols, pad=lambda: 0):
    """Paired ``(w beat, s beat)`` in stream order: per column tile of ``cols`` tokens, per
    timestep t, per d: w lane e = W_r[t, d, e]; s bit k = S[tile*cols + k, t, d] (bits past the
    last token are ``pad() & 1``, ignored)."""
    tokens = len(spikes)
    beats = []
    for col0 in range(0, tokens, cols):
        for t, step in enumerate(routing_weights):
            for d, lanes in enumerate(step):
                s = sum((int(spikes[col0 + k][t][d]) if col0 + k < tokens else pad() & 1) << k
                        for k in range(cols))
                beats.append(([int(w) for w in lanes], s))
    return beats


def router_output_order(spikes, routing_weights, k, acc_width):
    """Expected route beats ``(token, mask, scores, last)``, one per token in token order."""
    scores = router_scores(spikes, routing_weights, acc_width)
    return [(n, route_mask(row, k), row, int(n == len(scores) - 1))
            for n, row in enumerate(scores)]


def merge(per_expert, masks):
    """Step 5: ``per_expert[e][n]`` is expert e's output for token n (any nested 0/1 lists, or
    None where the token was not routed to e); ``masks[n]`` the token's route mask. Returns the
    per-token outputs: the chosen expert's when one is chosen, else the element-wise OR."""
    def combine(a, b):
        if isinstance(a, list):
            return [combine(x, y) for x, y in zip(a, b)]
        return int(a) | int(b)
    out = []
    for n, mask in enumerate(masks):
        chosen = [per_expert[e][n] for e in range(len(per_expert)) if mask >> e & 1]
        merged = chosen[0]
        for other in chosen[1:]:
            merged = combine(merged, other)
        out.append(merged)
    return out
