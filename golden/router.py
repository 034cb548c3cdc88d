"""Golden model of the top-K router (plain and node-limited) and a synthetic routing trace.

Pure Python/NumPy (no amaranth, no hw/).

Routing rule (DeepSeek-V3 node-limited routing, seed 003 §4.3, with integer scores):

1. Without a group limit, the k experts with the highest scores, highest first; equal scores go
   to the lower expert index.
2. With ``groups`` G and ``topk_groups`` M: experts ``g*E/G .. (g+1)*E/G - 1`` form group g. A
   group's score is the sum of its two highest expert scores. The M groups with the highest group
   scores are kept (ties to the lower group index); the k experts are chosen as in 1 among the
   experts of the kept groups only.
3. The destination mask has bit ``table[e]`` set for every chosen expert e (a leaf holding two
   chosen experts gets the token once).
"""

import numpy as np

__all__ = ["rank_order", "group_scores", "route", "leaf_mask", "synthetic_trace",
           "scores_for_trace", "pipeline_latency", "scan_beats", "select_cycles",
           "scan_latency", "scan_interval", "scan_edges"]


def pipeline_latency(k, groups, topk_groups):
    """Edges from a score vector's transfer to its route's transfer (ready output).

    Registers (ranks rather than one pick per stage, so the latency depends on neither k nor
    M): input; with groups > 1, the in-group pair comparisons, the in-group ranks, the group
    scores, the group pair comparisons, then the kept groups with the expert pair comparisons
    (without groups: the expert pair comparisons alone); the experts' ranks among the eligible,
    counted in two halves, then added; the k selected; the output register. The route is taken
    one edge after the last.
    """
    return 10 if groups > 1 else 6


def scan_beats(experts, lanes, groups):
    """B: cycles the serial router (``scan_lanes`` P >= 1) spends scanning one token's scores:
    ceil(S/P) beats for each of the G groups of S = E/G experts (a beat never spans two
    groups)."""
    size = experts // groups
    return groups * -(-size // lanes)


def select_cycles(k, groups, topk_groups):
    """C: cycles the serial router spends selecting: one per kept group (G > 1), one per
    chosen expert."""
    return (topk_groups if groups > 1 else 0) + k


def scan_latency(experts, lanes, k, groups, topk_groups):
    """Edges from a token's scores to its route with the serial router idle: B + C + 1."""
    return scan_beats(experts, lanes, groups) + select_cycles(k, groups, topk_groups) + 1


def scan_interval(experts, lanes, k, groups, topk_groups):
    """Cycles per token of the serial router at saturation: max(B, C)."""
    return max(scan_beats(experts, lanes, groups), select_cycles(k, groups, topk_groups))


def scan_edges(tokens, experts, lanes, k, groups, topk_groups):
    """Edges, from the first token's, at which the serial router takes each of ``tokens``
    score vectors offered back to back and hands out its route (``route`` always ready).

    The scanner takes a token, spends B beats on it and hands its per-group lists to the
    selector at the edge of its last beat, h_i = max(a_i + B, h_(i-1) + C) (it waits for the
    selector); it takes the next token at that same edge, a_(i+1) = h_i; the route leaves at
    h_i + C + 1.
    """
    beats = scan_beats(experts, lanes, groups)
    select = select_cycles(k, groups, topk_groups)
    taken, routed, accept, handoff = [], [], 0, None
    for _ in range(tokens):
        handoff = accept + beats if handoff is None else max(accept + beats, handoff + select)
        taken.append(accept)
        routed.append(handoff + select + 1)
        accept = handoff
    return taken, routed


def rank_order(values, allowed=None):
    """Indices sorted by value descending, ties to the lower index; only ``allowed`` ones."""
    indices = range(len(values)) if allowed is None else allowed
    return sorted(indices, key=lambda i: (-int(values[i]), i))


def group_scores(scores, groups):
    """Per group, the sum of its two highest scores (its one score if it has one expert)."""
    size = len(scores) // groups
    out = []
    for g in range(groups):
        top = sorted((int(s) for s in scores[g * size:(g + 1) * size]), reverse=True)
        out.append(sum(top[:2]))
    return out


def route(scores, k, groups=1, topk_groups=1):
    """Chosen experts (highest first) and their scores for one token.

    Parameters
    ----------
    scores : sequence of int
        E unsigned scores.
    k : int
        Experts per token.
    groups, topk_groups : int
        G groups of E/G consecutive experts, of which the best M are eligible (G = 1: no limit).

    Returns
    -------
    experts : list of int
    chosen_scores : list of int
    """
    experts = len(scores)
    if groups > 1:
        size = experts // groups
        kept = rank_order(group_scores(scores, groups))[:topk_groups]
        allowed = [e for e in range(experts) if e // size in kept]
    else:
        allowed = None
    chosen = rank_order(scores, allowed)[:k]
    return chosen, [int(scores[e]) for e in chosen]


def leaf_mask(experts, table):
    """Destination mask: bit ``table[e]`` for each chosen expert ``e``."""
    mask = 0
    for expert in experts:
        mask |= 1 << int(table[expert])
    return mask


def synthetic_trace(tokens, experts, k, clusters, seed, affinity=0.85, skew=1.0):
    """A seeded routing trace (tokens x k distinct experts) with co-activation structure.

    The experts are split, through a random permutation, into ``clusters`` hidden communities of
    equal size. Each token draws a community (popularity ~ 1/(rank+1)^skew, so the load is uneven)
    and picks each of its k experts from that community with probability ``affinity``, else
    uniformly from all experts; experts are distinct within a token.

    Returns
    -------
    numpy.ndarray of int, shape (tokens, k)
    """
    rng = np.random.default_rng(seed)
    community = rng.permutation(experts).reshape(clusters, experts // clusters)
    popularity = 1.0 / np.arange(1, clusters + 1) ** skew
    popularity /= popularity.sum()
    trace = np.zeros((tokens, k), dtype=int)
    for token in range(tokens):
        home = community[rng.choice(clusters, p=popularity)]
        chosen = []
        while len(chosen) < k:
            pool = home if rng.random() < affinity else np.arange(experts)
            candidate = int(rng.choice(pool))
            if candidate not in chosen:
                chosen.append(candidate)
        trace[token] = chosen
    return trace


def scores_for_trace(trace, experts, score_width, seed):
    """Score vectors whose plain top-k (no group limit) is each trace row, best first.

    Chosen experts get the top scores in row order; the others get lower random scores (with
    ties among themselves), so the router's choice is exactly the trace."""
    rng = np.random.default_rng(seed)
    top = (1 << score_width) - 1
    k = np.asarray(trace).shape[1]
    out = []
    for row in np.asarray(trace):
        scores = rng.integers(0, top - k + 1, size=experts)
        for rank, expert in enumerate(row):
            scores[expert] = top - rank
        out.append([int(s) for s in scores])
    return out
