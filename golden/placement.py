"""Expert placement on the NoP tree from a routing trace (Mozart, seed 000 §3.2, §4.2).

1. Profile: the per-expert load vector (eq. 3, the fraction of tokens that activate each expert)
   and the co-activation matrix (eq. 4, tokens that activate both i and j, normalized by the
   largest off-diagonal entry so every entry is in [0, 1]).
2. Cluster (Stage 1, farthest-point-sampling style, Alg. 1): one cluster per leaf, all of size
   E / leaves. Seeds: the expert with the highest total co-activation first, then repeatedly the
   expert least co-activated (largest "distance") with the seeds chosen so far. Growth: repeatedly
   add the (cluster, expert) pair with the highest mean co-activation between the expert and the
   cluster's members, among clusters not yet full. Ties go to the lower index.
3. Allocate (Stage 2): clusters to switch groups (``leaves / groups`` clusters each) minimizing
   the largest group load. Exact (every partition) when there are at most 8 clusters; beyond, a
   documented heuristic: longest-processing-time-first then pairwise swaps while the largest
   group load improves. The imbalance (largest / mean group load) is reported.

The output is the expert-to-leaf table ``topk_router`` takes through its table port.
"""

import dataclasses
import itertools

import numpy as np

__all__ = ["load_vector", "coactivation", "cluster_experts", "allocate_clusters", "place",
           "round_robin", "Placement", "EXACT_MAX_CLUSTERS"]

EXACT_MAX_CLUSTERS = 8


def load_vector(trace, experts):
    """Eq. 3: fraction of tokens that activate each expert."""
    trace = np.asarray(trace)
    counts = np.bincount(trace.reshape(-1), minlength=experts)
    return counts / len(trace)


def coactivation(trace, experts):
    """Eq. 4: co-activation counts normalized by their maximum (zero diagonal)."""
    matrix = np.zeros((experts, experts))
    for row in np.asarray(trace):
        for i, j in itertools.permutations(set(int(e) for e in row), 2):
            matrix[i, j] += 1
    peak = matrix.max()
    return matrix / peak if peak else matrix


def cluster_experts(coact, size):
    """Stage 1: equal clusters of ``size`` experts maximizing intra-cluster co-activation."""
    experts = len(coact)
    count = experts // size
    seeds = [int(np.argmax(coact.sum(axis=1)))]
    while len(seeds) < count:
        closeness = [coact[e, seeds].max() if e not in seeds else np.inf for e in range(experts)]
        seeds.append(int(np.argmin(closeness)))
    clusters = [[s] for s in seeds]
    free = [e for e in range(experts) if e not in seeds]
    while free:
        best = None
        for c, members in enumerate(clusters):
            if len(members) == size:
                continue
            for e in free:
                score = coact[e, members].mean()
                if best is None or score > best[0]:
                    best = (score, c, e)
        _, c, e = best
        clusters[c].append(e)
        free.remove(e)
    return [sorted(c) for c in clusters]


def _partitions(items, groups, per_group):
    """Every split of ``items`` into ``groups`` unordered groups of ``per_group``."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, per_group - 1):
        remaining = [i for i in rest if i not in others]
        for tail in _partitions(remaining, groups - 1, per_group):
            yield [[first, *others], *tail]


def allocate_clusters(cluster_loads, groups):
    """Stage 2: clusters per group minimizing the largest group load.

    Returns
    -------
    assignment : list of list of int
        Cluster indices per group.
    method : str
        ``"exact"`` or ``"lpt+swap"``.
    """
    loads = list(cluster_loads)
    count = len(loads)
    per_group = count // groups
    if count <= EXACT_MAX_CLUSTERS:
        best = min(_partitions(list(range(count)), groups, per_group),
                   key=lambda p: max(sum(loads[c] for c in g) for g in p))
        return best, "exact"
    assignment = [[] for _ in range(groups)]
    for c in sorted(range(count), key=lambda c: (-loads[c], c)):
        open_groups = [g for g in range(groups) if len(assignment[g]) < per_group]
        target = min(open_groups, key=lambda g: (sum(loads[x] for x in assignment[g]), g))
        assignment[target].append(c)

    def peak():
        return max(sum(loads[c] for c in g) for g in assignment)

    improved = True
    while improved:
        improved = False
        for ga, gb in itertools.combinations(range(groups), 2):
            for ia, ib in itertools.product(range(per_group), repeat=2):
                before = peak()
                assignment[ga][ia], assignment[gb][ib] = assignment[gb][ib], assignment[ga][ia]
                if peak() < before - 1e-12:
                    improved = True
                else:
                    assignment[ga][ia], assignment[gb][ib] = assignment[gb][ib], assignment[ga][ia]
    return assignment, "lpt+swap"


@dataclasses.dataclass
class Placement:
    """Result of :func:`place`."""
    expert_to_leaf: list
    clusters: list
    group_loads: list
    imbalance: float
    method: str


def place(trace, experts, leaves, groups):
    """Cluster the experts (one cluster per leaf) and allocate clusters to switch groups.

    Leaves ``g * leaves/groups ... (g+1) * leaves/groups - 1`` form switch group g.
    """
    if experts % leaves or leaves % groups:
        raise ValueError(f"experts ({experts}) must divide by leaves ({leaves}) and leaves by "
                         f"groups ({groups})")
    load = load_vector(trace, experts)
    clusters = cluster_experts(coactivation(trace, experts), experts // leaves)
    cluster_loads = [float(load[c].sum()) for c in clusters]
    assignment, method = allocate_clusters(cluster_loads, groups)
    table = [0] * experts
    per_group = leaves // groups
    for group, members in enumerate(assignment):
        for slot, c in enumerate(members):
            for expert in clusters[c]:
                table[expert] = group * per_group + slot
    group_loads = [sum(cluster_loads[c] for c in members) for members in assignment]
    imbalance = max(group_loads) / (sum(group_loads) / groups)
    return Placement(table, clusters, group_loads, imbalance, method)


def round_robin(experts, leaves):
    """The baseline table: expert e on leaf e mod leaves."""
    return [e % leaves for e in range(experts)]
