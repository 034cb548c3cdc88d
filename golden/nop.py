"""Golden model of the NoP tree: who receives which packet, flits per link, combined sums, timing.

Pure Python/NumPy (no amaranth, no hw/). A tree is described by ``fanouts`` (children per switch,
root level first); leaves are numbered left to right, and a destination mask has bit ``i`` for
leaf ``i``. A switch forwards a packet to child ``c`` iff the mask has a set bit among the leaves
of ``c``'s subtree, once, however many bits are set there.
"""

import math

import numpy as np

from golden import fp
from golden.fixed import wrap

__all__ = ["DISPATCH_HOP_CYCLES", "COMBINE_HOP_CYCLES", "leaf_count", "internal_links",
           "deliveries", "link_flits", "forwarding_root_flits", "combine", "replication",
           "dispatch_edges", "combine_first_edge", "figures", "LINK_CHECKS", "CHECK_BITS",
           "crc8", "link_check", "check_terms", "link_check_ok"]

# A flit accepted by a switch at edge e is offered by its child output register from e and,
# with a ready child, transferred at e + 1.
DISPATCH_HOP_CYCLES = 1
# A child's last flit transferred at edge e is written into its buffer at e + 1, which marks
# the slot complete; it is chosen (a register) at e + 2, the buffers are read in the next cycle
# and the first combined flit is offered from edge e + 3: transferred at e + 4.
COMBINE_HOP_CYCLES = 4


def leaf_count(fanouts):
    return math.prod(fanouts)


def _subtree_hit(mask, first_leaf, leaves):
    return (mask >> first_leaf) & ((1 << leaves) - 1) != 0


def internal_links(fanouts):
    """``(level, index, first_leaf, leaves)`` of every switch-to-switch link, breadth first:
    link j enters the j-th non-root switch (level >= 1, left to right)."""
    links = []
    for level in range(1, len(fanouts)):
        span = math.prod(fanouts[level:])
        for index in range(math.prod(fanouts[:level])):
            links.append((level, index, index * span, span))
    return links


def deliveries(packets, fanouts):
    """Packets each leaf receives, in dispatch order: list (per leaf) of packet indices."""
    leaves = leaf_count(fanouts)
    return [[i for i, p in enumerate(packets) if (p["mask"] >> leaf) & 1] for leaf in range(leaves)]


def link_flits(packets, fanouts):
    """Flits on every link, the same down (dispatch) and up (combine).

    Returns
    -------
    dict
        ``root``: flits through the root port (each packet once), ``internal``: per internal
        link (see :func:`internal_links`), ``leaf``: per leaf link.
    """
    def flits_into(first_leaf, leaves):
        return sum(len(p["flits"]) for p in packets if _subtree_hit(p["mask"], first_leaf, leaves))

    return {
        "root": flits_into(0, leaf_count(fanouts)),
        "internal": [flits_into(first, span) for _, _, first, span in internal_links(fanouts)],
        "leaf": [flits_into(leaf, 1) for leaf in range(leaf_count(fanouts))],
    }


def forwarding_root_flits(packets):
    """Root-link flits of the combine phase *without* in-network combine: every leaf's
    contribution travels to the root on its own (popcount(mask) packets per token)."""
    return sum(bin(p["mask"]).count("1") * len(p["flits"]) for p in packets)


def combine(packets, leaf_output, acc_width, combine_dtype="int", fanouts=None):
    """The combined packet of every token: lane-wise sum of its leaves' returns.

    Parameters
    ----------
    packets : list of dict
        ``token``, ``mask``, ``flits`` (list of lane lists).
    leaf_output : callable
        ``leaf_output(leaf, packet) -> list of lane lists``, what a leaf returns. A return whose
        length differs from the packet's is dropped: it adds nothing to the sum (the switch that
        sees it flags ``error``).
    acc_width : int
        Width of the sums.
    combine_dtype : str
        ``int``: wrapping integer sums (any order gives the same). ``bf16`` or ``fp32``: the
        lanes are codes of the format (``acc_width`` 16 or 32) and each switch adds its
        contributing children in child order, ((c0 + c1) + c2) + ..., rounding every addition
        (:func:`golden.fp.add`); a switch none of whose owed children contributes sends +0.
    fanouts : tuple of int
        The tree (root level first); needed for the floating-point order.

    Returns
    -------
    list of list of list of int
        Per packet, its combined flits (as many as the packet has).
    """
    if combine_dtype != "int":
        return [_float_combine(packet, leaf_output, combine_dtype, tuple(fanouts))
                for packet in packets]
    out = []
    for packet in packets:
        mask = packet["mask"]
        leaves = [leaf for leaf in range(mask.bit_length()) if (mask >> leaf) & 1]
        total = np.zeros((len(packet["flits"]), len(packet["flits"][0])), dtype=object)
        for leaf in leaves:
            returned = leaf_output(leaf, packet)
            if len(returned) == len(packet["flits"]):
                total = total + np.array(returned, dtype=object)
        out.append([[wrap(v, acc_width) for v in flit] for flit in total.tolist()])
    return out


def _float_combine(packet, leaf_output, dtype, fanouts):
    """One packet's combine in a floating-point format, switch by switch (see :func:`combine`)."""
    length, lanes = len(packet["flits"]), len(packet["flits"][0])

    def subtree(level, first_leaf):
        """The flits a subtree sends up, or None when the packet does not reach it or (a leaf)
        its return is dropped."""
        leaves = leaf_count(fanouts[level:])
        if not _subtree_hit(packet["mask"], first_leaf, leaves):
            return None
        if level == len(fanouts):
            returned = leaf_output(first_leaf, packet)
            return returned if len(returned) == length else None
        span = leaves // fanouts[level]
        total = None
        for child in range(fanouts[level]):
            part = subtree(level + 1, first_leaf + child * span)
            if part is None:
                continue
            total = part if total is None else [
                [fp.add(x, y, dtype) for x, y in zip(row, other)]
                for row, other in zip(total, part)]
        return total if total is not None else [[0] * lanes for _ in range(length)]

    return subtree(0, 0)


def replication(masks):
    """r: average number of leaves a token is copied to (seed 000 §3.3)."""
    masks = list(masks)
    return sum(bin(m).count("1") for m in masks) / len(masks) if masks else 0.0


def dispatch_edges(root_edges, fanouts):
    """Edges at which a leaf receives the flits the root took at ``root_edges`` (no stalls)."""
    return [e + DISPATCH_HOP_CYCLES * len(fanouts) for e in root_edges]


def combine_first_edge(mask, leaf_last_edges, flits, fanouts, level=0, first_leaf=0):
    """Edge of the first combined flit leaving the switch at ``level`` for one token alone.

    ``leaf_last_edges[leaf]`` is the edge of each owed leaf's last return flit. A switch emits
    ``COMBINE_HOP_CYCLES`` after its last owed child's last flit; a child switch's last flit is
    ``flits - 1`` after its first.
    """
    span = math.prod(fanouts[level + 1:])
    child_last = []
    for child in range(fanouts[level]):
        first = first_leaf + child * span
        if not _subtree_hit(mask, first, span):
            continue
        if level + 1 == len(fanouts):
            child_last.append(leaf_last_edges[first])
        else:
            child_last.append(combine_first_edge(mask, leaf_last_edges, flits, fanouts,
                                                 level + 1, first) + flits - 1)
    return max(child_last) + COMBINE_HOP_CYCLES


def figures(fanouts):
    """Golden cycle-model figures for the manifest."""
    depth = len(fanouts)
    return {"leaves": leaf_count(fanouts), "depth": depth,
            "dispatch_latency_cycles": DISPATCH_HOP_CYCLES * depth,
            "combine_cycles_per_hop": COMBINE_HOP_CYCLES,
            "flits_per_cycle_per_port": 1}


# ---- link error detection (seed 003 §6.1: silent data corruption on links) -------------------
#
# A switch-to-switch flit carries ``check`` bits at bit 0 and the message (every other field)
# above them, so the link word is ``message << CHECK_BITS[kind] | check``. ``parity``: one even
# parity bit (the XOR of the message bits). ``crc8``: CRC-8 with generator x^8 + x^2 + x + 1
# (0x07), initial value 0, no reflection, no final XOR (the catalogue's CRC-8/SMBUS), over the
# message bits from its most significant bit down. With the check at the low end the link word,
# read as a polynomial with bit i the coefficient of x^i, is a multiple of the generator, so every
# error burst of at most 8 adjacent bits of the word (check bits included) is detected.

LINK_CHECKS = ("none", "parity", "crc8")
CHECK_BITS = {"none": 0, "parity": 1, "crc8": 8}
CRC8_POLY = 0x07


def crc8(value, width):
    """CRC-8/SMBUS of the ``width``-bit message ``value``, its most significant bit first."""
    register = 0
    for bit in reversed(range(width)):
        feedback = ((register >> 7) ^ (value >> bit)) & 1
        register = (register << 1) & 0xFF
        if feedback:
            register ^= CRC8_POLY
    return register


def link_check(kind, message, width):
    """The check bits a switch sends with a ``width``-bit ``message``."""
    if kind == "parity":
        return bin(message & ((1 << width) - 1)).count("1") & 1
    if kind == "crc8":
        return crc8(message, width)
    if kind == "none":
        return 0
    raise ValueError(f"link check {kind!r}: unknown; allowed: {', '.join(LINK_CHECKS)}")


def check_terms(kind, width):
    """Per check bit, the message bits whose XOR it is (both codes are linear with a zero
    start, so bit j of the check is the XOR of bit j of the unit messages' checks)."""
    return [[i for i in range(width) if (link_check(kind, 1 << i, width) >> j) & 1]
            for j in range(CHECK_BITS[kind])]


def link_check_ok(kind, word, width):
    """Whether a received link word (``message << CHECK_BITS[kind] | check``) passes."""
    bits = CHECK_BITS[kind]
    return link_check(kind, word >> bits, width) == word & ((1 << bits) - 1)
