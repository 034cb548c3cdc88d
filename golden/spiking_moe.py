"""Golden model of the spiking MoE layer (``spiking_moe``): seed 004 Alg. 1, bit for bit.

Pure Python (no amaranth, no hw/). Steps: (1) routing scores and top-K
(:mod:`golden.spiking_router`); (2-4) each expert's synaptic integration and LIF generators on
the tokens routed to it (:func:`golden.spiking_expert.expert_reference`; a token's potentials
start from 0, so an expert's output for a token does not depend on the other tokens it
serves); (5) the merge: the chosen expert's spikes with K = 1, the element-wise OR with K > 1.
Also the stream formats of the layer's ports and the bond count of its two-tier build.
"""

from golden.spiking_expert import bond_count, column_latency, expert_output_order, expert_reference
from golden.spiking_router import route_latency
from golden.spiking_router import merge, route_mask, router_scores

__all__ = ["moe_reference", "moe_input_beats", "moe_output_order", "moe_bond_count",
           "routing_histogram", "moe_cycles"]


def moe_reference(spikes, routing_weights, expert_weights, k, vth, vleak, acc_width, v_width):
    """Returns ``(masks, outputs)``: per token its route mask, and ``outputs[n][t][r]``.

    ``spikes[n][t][d]``, ``routing_weights[t][d][e]``, ``expert_weights[e][r][d]`` (D_out x
    D_in per expert)."""
    scores = router_scores(spikes, routing_weights, acc_width)
    masks = [route_mask(row, k) for row in scores]
    per_expert = []
    for e, weights in enumerate(expert_weights):
        routed = [n for n, mask in enumerate(masks) if mask >> e & 1]
        out = expert_reference(weights, [spikes[n] for n in routed], vth, vleak, acc_width,
                               v_width) if routed else []
        by_token = dict(zip(routed, out))
        per_expert.append([by_token.get(n) for n in range(len(spikes))])
    return masks, merge(per_expert, masks)


def moe_input_beats(spikes, routing_weights, expert_weights, rows, max_timesteps,
                    pad=lambda: 0):
    """The three input streams: ``act`` (D_in words; bit ``n * max_timesteps + t`` of word d is
    S[n, t, d]), ``wr`` (T x D_in beats, timestep-major: lane e = W_r[t, d, e]) and ``w`` (per
    expert, per row tile of ``rows`` neurons, per d: lane i = W_e[tile*rows + i, d]; lanes past
    D_out are ``pad()``)."""
    d_in = len(spikes[0][0])
    act = [sum(int(step[d]) << (n * max_timesteps + t)
               for n, token in enumerate(spikes) for t, step in enumerate(token))
           for d in range(d_in)]
    wr = [[int(w) for w in lanes] for step in routing_weights for lanes in step]
    w = []
    for weights in expert_weights:
        d_out = len(weights)
        for row0 in range(0, d_out, rows):
            for d in range(d_in):
                w.append([int(weights[row0 + i][d]) if row0 + i < d_out else pad()
                          for i in range(rows)])
    return act, wr, w


def moe_output_order(outputs, d_out, rows):
    """Output beats ``(spikes bits, token, timestep, tile, last)``: per row tile, per token,
    per timestep (the expert core's order, :func:`expert_output_order`)."""
    return expert_output_order(outputs, d_out, rows)


def routing_histogram(masks, experts):
    """Tokens routed to each expert."""
    return [sum(mask >> e & 1 for mask in masks) for e in range(experts)]


def moe_bond_count(experts, rows, cols, max_tokens, w_width, acc_width):
    """F2F bonds of the two-tier layer: the routing-score array's and every expert array's
    interface (:func:`golden.spiking_expert.bond_count`), clock and reset bonded once."""
    router = bond_count(experts, max_tokens, w_width, acc_width)
    expert = bond_count(rows, cols, w_width, acc_width)
    return {"down": router["down"] + experts * (expert["down"] - 2),
            "up": router["up"] + experts * expert["up"]}


def moe_cycles(d_in, d_out, tokens, timesteps, counts, rows, cols):
    """Edges of one layer relative to the command's transfer (edge 0), every input stream
    waiting and the outputs ready. ``counts[e]``: tokens routed to expert e.

    * act beats at 1..d_in (LOAD follows the command);
    * the router's command at d_in + 1, its T x D_in beats right after (one column tile);
    * route j at the last routing beat + ``route_latency(E)`` + j (the router's model);
    * the weight stream (E x row tiles x D_in beats from edge 1) runs beside; the cores get
      their commands 2 edges after both the last route and the last weight beat (the ISSUE
      state; a core still draining an earlier layer takes its command later, which this
      model, one layer from an idle block, does not cover), their first beats one edge later;
    * core e: each tile's last beat waits max(D_in, C) beats after the previous one; its last
      output row leaves ``column_latency(R)`` + the last column after its last beat;
    * the read-out starts 3 edges after the last core's last row (the row is merged one edge
      later, then the COMPUTE check, then one beat per edge) and sends row tiles x tokens x T
      beats.
    """
    experts = len(counts)
    tiles = -(-d_out // rows)
    act_last = d_in
    route_beats_last = d_in + 1 + timesteps * d_in
    routes = [route_beats_last + route_latency(experts) + j for j in range(tokens)]
    weights_last = experts * tiles * d_in
    issue = max(routes[-1], weights_last) + 2
    finish = issue - 1                        # cores without tokens finish in ISSUE
    for count in counts:
        if count:
            pairs = count * timesteps
            beats_last = issue + d_in + (tiles * -(-pairs // cols) - 1) * max(d_in, cols)
            finish = max(finish, beats_last + column_latency(rows) + (pairs - 1) % cols)
    out_first = finish + 3
    return {"act_last": act_last, "route_beats": (d_in + 2, route_beats_last),
            "routes": routes, "weights_last": weights_last, "issue": issue,
            "outputs": list(range(out_first, out_first + tiles * tokens * timesteps))}
