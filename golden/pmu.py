"""Golden model of the PMU: address sequences, bank mapping, access costs, memory and cycles.

Plain Python and NumPy; never imports amaranth or ``hw``. A *job* is a dict with the fields of
the job descriptor (docs/blocks/pmu.md): ``base``, ``bounds`` (L values, level 0 innermost),
``strides`` (L values), ``lane_stride``, ``pred_lo``, ``pred_hi``, ``diagonal``, ``bank_pos``,
``row_shift``, ``wait_other``. :func:`make_job` fills the defaults.
"""

import itertools

import numpy as np

__all__ = ["make_job", "job_is_valid", "access_addresses", "decode_lane", "access_cost",
           "Scratchpad", "write_beat_edges", "read_beat_edges", "figures",
           "WRITE_LATENCY", "READ_LATENCY"]

# Edges from a job descriptor's transfer (port idle) to the end of the job's first access
# before its cost: beat j is taken at edge e + LATENCY + sum(costs[:j+1]).
WRITE_LATENCY = 5
READ_LATENCY = 8


def make_job(params, *, base=0, bounds=None, strides=None, lane_stride=1, pred_lo=0,
             pred_hi=None, diagonal=0, bank_pos=None, row_shift=None, wait_other=0):
    """A job dict for a PMU with ``params`` (a dict of the block's parameters).

    Defaults: one access per job (all bounds 1), unit lane stride, the whole address space
    valid, bit-select mapping on the lowest address bits, a diagonal row length equal to the
    bank count.
    """
    L = params["loops"]
    b = params["banks"].bit_length() - 1
    if len(bounds or []) > L or len(strides or []) > L:
        raise ValueError(f"a job of this PMU has at most {L} loop levels")
    bounds = list(bounds or [1]) + [1] * (L - len(bounds or [1]))
    strides = list(strides or [0]) + [0] * (L - len(strides or [0]))
    return {
        "base": base, "bounds": bounds, "strides": strides, "lane_stride": lane_stride,
        "pred_lo": pred_lo,
        "pred_hi": (1 << params["addr_width"]) if pred_hi is None else pred_hi,
        "diagonal": diagonal,
        "bank_pos": list(range(b)) if bank_pos is None else list(bank_pos),
        "row_shift": b if row_shift is None else row_shift,
        "wait_other": wait_other,
    }


def _bits(params):
    b = params["banks"].bit_length() - 1
    cb = (params["banks"] * params["bank_depth"]).bit_length() - 1
    return b, cb


def job_is_valid(job, params):
    """Whether the PMU accepts ``job`` (a rejected job is dropped and sets ``error``)."""
    b, cb = _bits(params)
    if any(not 1 <= bound <= 1 << params["addr_width"] for bound in job["bounds"]):
        return False
    if b == 0:
        return True
    if job["diagonal"]:
        return job["row_shift"] >= b
    pos = job["bank_pos"][:b]
    return all(x < y for x, y in zip(pos, pos[1:])) and pos[-1] < cb


def access_addresses(job, params):
    """Lane addresses of every access, in order: a list (accesses) of lists (V lanes).

    Address of access (i_0, ..., i_{L-1}) lane v is ``base + sum(i_l * stride_l) + v *
    lane_stride`` modulo 2^addr_width; level 0 changes fastest.
    """
    modulus = 1 << params["addr_width"]
    levels = range(params["loops"])
    out = []
    for indices in itertools.product(*[range(job["bounds"][lvl]) for lvl in reversed(levels)]):
        indices = indices[::-1]  # indices[l] is level l
        start = job["base"] + sum(i * job["strides"][lvl] for lvl, i in enumerate(indices))
        out.append([(start + v * job["lane_stride"]) % modulus for v in range(params["lanes"])])
    return out


def decode_lane(address, job, params):
    """``(valid, bank, offset)`` of one lane address under the job's predicate and mapping."""
    b, cb = _bits(params)
    capacity = 1 << cb
    valid = address < capacity and job["pred_lo"] <= address < job["pred_hi"]
    word = address % capacity
    if b == 0:
        return valid, 0, word
    if job["diagonal"]:
        row, column = word >> job["row_shift"], word
        return valid, (row + column) % params["banks"], word >> b
    positions = job["bank_pos"][:b]
    bank = sum(((word >> p) & 1) << i for i, p in enumerate(positions))
    rest = [(word >> p) & 1 for p in range(cb) if p not in positions]
    return valid, bank, sum(bit << i for i, bit in enumerate(rest))


def access_cost(decoded):
    """Cycles of one access: the most valid lanes in one bank (1 when no lane is valid)."""
    counts = {}
    for valid, bank, _ in decoded:
        if valid:
            counts[bank] = counts.get(bank, 0) + 1
    return max(counts.values(), default=1)


class Scratchpad:
    """The PMU's memory: ``banks`` x ``bank_depth`` words, all zero after construction."""

    def __init__(self, params):
        self.params = params
        self.words = np.zeros((params["banks"], params["bank_depth"]), dtype=object)
        self.words[:] = 0

    def write_job(self, job, vectors):
        """Apply a write job with the given V-lane vectors; return each access's cost."""
        costs = []
        accesses = access_addresses(job, self.params)
        assert len(vectors) == len(accesses), "one vector per access"
        mask = (1 << self.params["elem_width"]) - 1
        for lanes, vector in zip(accesses, vectors):
            decoded = [decode_lane(a, job, self.params) for a in lanes]
            # Within one access, lanes are written rank by rank in lane order: a later lane to
            # the same word wins, as in the hardware.
            for (valid, bank, offset), value in zip(decoded, vector):
                if valid:
                    self.words[bank, offset] = int(value) & mask
            costs.append(access_cost(decoded))
        return costs

    def read_job(self, job):
        """Read a job: ``(vectors, valids, costs)``; invalid lanes read as zero."""
        vectors, valids, costs = [], [], []
        for lanes in access_addresses(job, self.params):
            decoded = [decode_lane(a, job, self.params) for a in lanes]
            vectors.append([int(self.words[bank, offset]) if valid else 0
                            for valid, bank, offset in decoded])
            valids.append([int(valid) for valid, _, _ in decoded])
            costs.append(access_cost(decoded))
        return vectors, valids, costs

    def job_costs(self, job):
        """Cost of every access of ``job`` (does not touch the memory)."""
        return [access_cost([decode_lane(a, job, self.params) for a in lanes])
                for lanes in access_addresses(job, self.params)]


def _beat_edges(costs_per_job, latency):
    edges, total = [], 0
    for costs in costs_per_job:
        for cost in costs:
            total += cost
            edges.append(latency + total)
    return edges


def write_beat_edges(costs_per_job):
    """Edges (from the first descriptor's transfer) of every write beat of chained jobs.

    Descriptors are offered back to back and ``w`` every cycle: the accesses of all jobs follow
    each other with no idle cycle, each taking its cost.
    """
    return _beat_edges(costs_per_job, WRITE_LATENCY)


def read_beat_edges(costs_per_job):
    """Edges (from the first descriptor's transfer) of every read beat, ``r`` always ready."""
    return _beat_edges(costs_per_job, READ_LATENCY)


def figures(**params):
    """Cycle-model figures of a PMU configuration for the manifest."""
    return {
        "accesses_per_cycle_per_port_without_conflicts": 1,
        "access_cost": "max over banks of the valid lanes in that bank (>= 1)",
        "write_beat_edge": f"e + {WRITE_LATENCY} + sum(costs[:j+1]) (e: descriptor taken)",
        "read_beat_edge": f"e + {READ_LATENCY} + sum(costs[:j+1]) (e: descriptor taken)",
        "capacity_elements": params["banks"] * params["bank_depth"],
        "conflict_counters": {"width": 32, "overflow": "wrap"},
    }
