"""NumPy golden models of the systolic blocks: results and cycle models.

Pure NumPy and Python: this module never imports amaranth or ``hw`` (the reference must not share
code with the design it checks). Cycle figures are derived from the documented stream contracts
(docs/blocks/systolic.md), counted in rising clock edges: an input taken at edge ``e`` and an
output taken at edge ``e + L`` are ``L`` cycles apart.
"""

import math

import numpy as np

from golden import fp
from golden.fixed import wrap

__all__ = ["matmul_wrapped", "os_tile_result", "tile_result", "ws_block_result", "fp_tile_result", "SCALE_BLOCK",
           "OS_PE_STAGES", "WS_PE_STAGES", "pe_stages", "OSCycleModel", "WSCycleModel", "figures"]

# Edges an integer PE adds by registering its product before the accumulator (or partial-sum)
# adder: on an ECP5-85F the multiplier and the 32-bit carry chain in one cycle held a 4 x 4
# array to 95 MHz, the two in separate cycles reach 135 MHz (docs/blocks/systolic.md). The
# weight-stationary PE registers its product once. The output-stationary PE registers its
# operands, its product and the product again: in ``systolic_tile`` (64 multipliers) the placer
# puts a DSP up to 60 columns from its accumulator and from the registers that feed it, and
# those routes held the tile at 138 MHz; the operand and first product registers are the DSP's
# own, the second product register a fabric one. The floating-point PEs (``fp_dot``'s
# accumulator) register no product.
OS_PE_STAGES = 3
WS_PE_STAGES = 1


def pe_stages(dtype="int", stages=OS_PE_STAGES):
    """Registers from an output-stationary PE's operands to its adder: ``stages`` (a block's
    ``pe_stages``, 0..3, :data:`OS_PE_STAGES` by default) for integers, 0 for the
    floating-point PEs."""
    return stages if dtype == "int" else 0


def matmul_wrapped(lhs, rhs, width):
    """``lhs @ rhs`` computed exactly and wrapped to ``width`` bits (object dtype, no overflow)."""
    return wrap(np.asarray(lhs, dtype=object) @ np.asarray(rhs, dtype=object), width)


def os_tile_result(a_matrix, b_matrix, acc_width):
    """One output-stationary tile: A (R x K) · B (K x C), wrapped; row i is output beat i."""
    return matmul_wrapped(a_matrix, b_matrix, acc_width)


def tile_result(a_slices, b_slices, acc_width):
    """``systolic_tile``: sum over slices of A_s · B_s, wrapped to ``acc_width``.

    Each array accumulates its own slice modulo 2^acc_width and the adder tree sums modulo
    2^acc_width; both are ring homomorphisms, so the result is the wrapped exact sum.
    """
    exact = sum(np.asarray(a, dtype=object) @ np.asarray(b, dtype=object)
                for a, b in zip(a_slices, b_slices))
    return wrap(exact, acc_width)


SCALE_BLOCK = 128               # elements of K per scale: 1x128 activation tiles, 128x128 blocks


def fp_tile_result(a_slices, b_slices, dtype, dot_config, scales_a, scales_b):
    """The floating-point output-stationary array and tile (``dtype`` not ``int``): per slice s,
    PE (i, j) computes ``golden.fp.dot`` of row i of A_s and column j of B_s (codes of
    ``dtype``, one product a beat: group 1) with ``dot_config``'s accumulator and promotion,
    ``scales_a[s][i]`` and ``scales_b[s]`` the per-128-block scale lists (values); the tile's
    adder tree then adds the slices' FP32 results pairwise, (0 + 1), (2 + 3), ..., an odd one
    passing to the next level, each addition rounded (``golden.fp.add``). Returns the R x C FP32
    codes, row i being output beat i."""
    results = []
    for a, b, scale_a, scale_b in zip(a_slices, b_slices, scales_a, scales_b):
        columns = list(zip(*b))
        results.append([[fp.dot(list(row), list(column), dtype, dtype, dot_config, scale_a[i],
                                scale_b) for column in columns] for i, row in enumerate(a)])
    while len(results) > 1:
        paired = [[[fp.add(x, y, "fp32") for x, y in zip(row_x, row_y)]
                   for row_x, row_y in zip(results[p], results[p + 1])]
                  for p in range(0, len(results) - 1, 2)]
        if len(results) % 2:
            paired.append(results[-1])
        results = paired
    return results[0]


def ws_block_result(x_matrix, w_matrix, acc_width):
    """One weight-stationary block: X (M x R) · W (R x C), wrapped; row m is output beat m."""
    return matmul_wrapped(x_matrix, w_matrix, acc_width)


class OSCycleModel:
    """Cycle model of the output-stationary array and of ``systolic_tile``.

    Inputs are offered every cycle and ``c`` is always ready. A beat is taken every cycle,
    except that a tile's ``last`` beat waits until ``rows`` cycles have passed since the previous
    tile's ``last`` beat (results of two tiles would otherwise meet in a column). Row i of a tile
    whose last beat was taken at edge T is taken from ``c`` at ``T + cols + 2 + P + i + tree``,
    where ``P`` is the PE's register stages (:func:`pe_stages`: the block's ``pe_stages``, 3 by
    default, for integers; 0 for floating point) and ``tree = ceil(log2 arrays)`` the
    adder-tree depth (0 for one array).

    Parameters
    ----------
    rows, cols : int
        Array size R x C.
    arrays : int
        Arrays in a tile (1 for the plain array).
    dtype : str
        The PEs' operand type (``int`` or a floating-point format).
    stages : int
        The block's ``pe_stages`` (integer PEs only).
    """

    def __init__(self, rows, cols, arrays=1, dtype="int", stages=OS_PE_STAGES):
        self.rows, self.cols = rows, cols
        self.tree_depth = math.ceil(math.log2(arrays)) if arrays > 1 else 0
        self.pe_stages = pe_stages(dtype, stages)

    def first_output_latency(self, depth):
        """Edges from the first input transfer to the first output transfer, for tile depth K."""
        return depth + self.cols + 1 + self.pe_stages + self.tree_depth

    def schedule(self, depths):
        """Edges of every input beat and every output row for tiles of the given depths.

        Returns
        -------
        (list of int, list of int)
            Input transfer edges (one per beat) and output transfer edges (``rows`` per tile),
            both counted from the first input transfer at edge 0.
        """
        in_edges, out_edges = [], []
        edge, previous_last = 0, None
        for depth in depths:
            for k in range(depth):
                if k == depth - 1 and previous_last is not None:
                    edge = max(edge, previous_last + self.rows)
                in_edges.append(edge)
                edge += 1
            previous_last = in_edges[-1]
            out_edges.extend(previous_last + self.cols + 2 + self.pe_stages + self.tree_depth + i
                             for i in range(self.rows))
        return in_edges, out_edges


class WSCycleModel:
    """Cycle model of the weight-stationary array.

    Both ``w`` and ``a`` are offered every cycle from edge 0 and ``c`` is always ready. Two
    weight banks: ``w`` fills the bank it points at when that bank is free (R beats, then the bank
    is full and ``w`` points at the other one); ``a`` reads the bank it points at when that bank
    is full (from the edge after its last weight beat), and its ``last`` beat frees the bank. An
    output is taken ``rows + cols + WS_PE_STAGES`` edges after its activation beat (each PE
    registers its product before the partial-sum adder).
    """

    def __init__(self, rows, cols):
        self.rows, self.cols = rows, cols

    def schedule(self, block_lengths):
        """Edges of every weight beat, activation beat and output for the given blocks.

        Parameters
        ----------
        block_lengths : list of int
            Activation beats M_n of each block; one weight block is sent per activation block.

        Returns
        -------
        (list of int, list of int, list of int)
            Weight, activation and output transfer edges, counted from edge 0 where both streams
            start being offered.
        """
        full, load_bank, use_bank, load_row = [False, False], 0, 0, 0
        weight_beats_left = self.rows * len(block_lengths)
        acts = [(n, m == length - 1) for n, length in enumerate(block_lengths) for m in range(length)]
        w_edges, a_edges = [], []
        edge = 0
        while weight_beats_left or len(a_edges) < len(acts):
            take_w = weight_beats_left > 0 and not full[load_bank]
            take_a = len(a_edges) < len(acts) and full[use_bank]
            if take_w:
                w_edges.append(edge)
                weight_beats_left -= 1
                load_row += 1
            if take_a:
                last = acts[len(a_edges)][1]
                a_edges.append(edge)
                if last:
                    full[use_bank] = False
                    use_bank ^= 1
            if take_w and load_row == self.rows:
                full[load_bank] = True
                load_bank ^= 1
                load_row = 0
            edge += 1
            if edge > 10 * (len(w_edges) + len(acts)) + 1000:
                raise RuntimeError("WS schedule does not progress")
        out_edges = [e + self.rows + self.cols + WS_PE_STAGES for e in a_edges]
        return w_edges, a_edges, out_edges


def figures(block, **params):
    """Golden cycle-model figures of a block configuration, for the manifest and ``moegen list``.

    Parameters
    ----------
    block : str
        ``"systolic"`` or ``"systolic_tile"``.
    **params
        The block's parameters (as in its config).
    """
    rows, cols = params["rows"], params["cols"]
    accumulator = {"width": params["acc_width"], "overflow": "wrap (two's complement)"}
    if params.get("dtype", "int") != "int":
        accumulator = {"dtype": params["dtype"], "acc_frac": params["acc_frac"],
                       "promote_every": params["promote_every"],
                       "scale_format": params["scale_format"], "result": "fp32"}
    if block == "systolic" and params["dataflow"] == "ws":
        return {
            "dataflow": "ws",
            "output_latency_cycles": rows + cols + WS_PE_STAGES,
            "output_latency_formula": f"R + C + {WS_PE_STAGES} (activation beat taken -> its "
                                      "output row taken; the PE's product register)",
            "steady_state": "1 activation beat and 1 output row per cycle when every block has "
                            "M >= R beats",
            "first_weight_block_load_cycles": rows,
            "peak_macs_per_cycle": rows * cols,
            "accumulator": accumulator,
        }
    model = OSCycleModel(rows, cols, params.get("arrays", 1), params.get("dtype", "int"),
                         params.get("pe_stages", OS_PE_STAGES))
    return {
        "dataflow": "os",
        "first_output_latency_formula": f"K + C + 1 + {model.pe_stages} + {model.tree_depth}",
        "first_output_latency_cycles_at_K_eq_R": model.first_output_latency(rows),
        "cycles_per_tile_formula": "max(K, R)",
        "output_beats_per_tile": rows,
        "adder_tree_stages": model.tree_depth,
        "peak_macs_per_cycle": rows * cols * params.get("arrays", 1),
        "accumulator": accumulator,
    }
