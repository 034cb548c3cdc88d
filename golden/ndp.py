"""Golden model of the NDP-DIMM core (``ndp_core``): fixed-point GEMV, expert-FFN slices, tensor
parallelism, the weight stream order and the cycle model.

Pure Python/NumPy (no amaranth, no hw/). Source: seed 002 (§III-A central-buffer NDP-DIMM,
§III-B/Fig. 4 tensor parallelism, Table I: 64 multipliers per DIMM).

Arithmetic (followed bit for bit by the RTL):

* weights ``w`` are signed ``w_width``-bit, activations ``x`` and ``h`` signed ``x_width``-bit;
  a dot product is accumulated exactly and then wrapped to a signed ``acc_width``-bit result;
* ``requant(v, s, n)``: with ``s > 0``, ``(v + 2**(s-1)) >> s`` (arithmetic shift, i.e. round
  half up towards +inf), then saturation to the signed ``n``-bit range; ``s = 0`` only saturates;
* ``ffn_slice`` for intermediate rows ``i`` of this DIMM's slice::

      g_i = Wg[i]·x,  u_i = Wu[i]·x                          (acc_width, wrapping)
      a_i = LUT[requant(g_i, shift_g, x_width) mod 2**x_width]  (signed x_width entry)
      h_i = requant(a_i * requant(u_i, shift_u, x_width), shift_h, x_width)
      y_partial = Wd[:, slice]·h                               (acc_width, wrapping)

  The host adds the partial outputs of the N DIMMs, wrapping at ``acc_width``; since ``h_i``
  depends only on row ``i`` of Wg and Wu, the sum equals the unsplit expert FFN exactly.

Weight stream (the order the DRAM side delivers, one beat = ``mults`` M weights, lane l of a
beat is column ``c*M + l`` of the current row, lanes past the row end are ignored):

* ``gemv``: rows 0..R-1, each as ``ceil(cols/M)`` beats;
* ``ffn_slice``: ``Wg[i]``, ``Wu[i]`` for i = 0..I_s-1 (interleaved, each ``ceil(D/M)`` beats),
  then ``Wd[:, slice]`` rows 0..D-1 (each ``ceil(I_s/M)`` beats).

The activation port carries x as ``ceil(cols/M)`` beats of M elements, same lane order.

Multi-token commands: a command names S tokens; x is S vectors sent one after another, each
weight beat is used for every token before the next beat (token 0 first), and the results leave
row by row, token by token within a row: result ``r*S + t`` is row r of token t
(:func:`interleave_tokens`).
"""

import dataclasses
import math

import numpy as np

from golden.fixed import saturate, wrap

__all__ = ["requant", "gemv", "ffn_slice", "ffn_expert", "split_sizes", "split_expert",
           "activation_lut", "gemv_weight_beats", "ffn_weight_beats", "vector_beats",
           "tree_levels", "gate_drain", "result_latency", "command_cycles", "weight_beats",
           "useful_macs", "timeline", "interleave_tokens", "gemv_tokens", "ffn_slice_tokens",
           "system_expert_tokens", "system_weight_beats", "system_timeline",
           "system_expert_cycles", "OP_GEMV",
           "OP_FFN_SLICE"]

OP_GEMV, OP_FFN_SLICE = 0, 1


def requant(value, shift, width):
    """Round half up by an arithmetic right shift of ``shift``, then saturate to ``width`` bits."""
    value = int(value)
    if shift:
        value = (value + (1 << (shift - 1))) >> shift
    return saturate(value, width)


def gemv(weights, x, acc_width):
    """``y = W·x`` wrapped to ``acc_width``; ``weights`` is rows x cols, exact integer sums."""
    weights = np.asarray(weights, dtype=object)
    x = np.asarray(x, dtype=object)
    return [wrap(v, acc_width) for v in weights.dot(x)]


def ffn_slice(wg, wu, wd, x, lut, shifts, x_width, acc_width):
    """One DIMM's partial expert output and its ``h`` vector.

    Parameters
    ----------
    wg, wu : array (I_s, D)
        This DIMM's rows of the gate and up projections (their "column slices" in x·W form).
    wd : array (D, I_s)
        This DIMM's columns of the down projection.
    x : sequence of int, length D
    lut : sequence of int, length 2**x_width
        Signed activation table indexed by the requantized gate value's bits.
    shifts : (int, int, int)
        ``shift_g, shift_u, shift_h``.

    Returns
    -------
    (list of int, list of int)
        The partial output (length D, acc_width) and h (length I_s).
    """
    shift_g, shift_u, shift_h = shifts
    g = gemv(wg, x, acc_width)
    u = gemv(wu, x, acc_width)
    mask = (1 << x_width) - 1
    h = [requant(int(lut[requant(gi, shift_g, x_width) & mask]) * requant(ui, shift_u, x_width),
                 shift_h, x_width) for gi, ui in zip(g, u)]
    return gemv(wd, h, acc_width), h


def ffn_expert(wg, wu, wd, x, lut, shifts, x_width, acc_width):
    """The whole expert FFN (no split): ``Wd·h`` with h as in :func:`ffn_slice`."""
    return ffn_slice(wg, wu, wd, x, lut, shifts, x_width, acc_width)[0]


def interleave_tokens(per_token):
    """Per-token result lists (S lists of R values) in the core's output order: row by row,
    token 0..S-1 within a row."""
    return [int(values[r]) for r in range(len(per_token[0])) for values in per_token]


def gemv_tokens(weights, xs, acc_width):
    """A multi-token gemv: ``W·x_t`` for every token t, in output order."""
    return interleave_tokens([gemv(weights, x, acc_width) for x in xs])


def ffn_slice_tokens(wg, wu, wd, xs, lut, shifts, x_width, acc_width):
    """A multi-token ffn_slice: each token's partial y (:func:`ffn_slice`), in output order."""
    return interleave_tokens([ffn_slice(wg, wu, wd, x, lut, shifts, x_width, acc_width)[0]
                              for x in xs])


def split_sizes(inter, parts):
    """Intermediate rows per DIMM: as even as possible, the first ones one larger."""
    if not 1 <= parts <= inter:
        raise ValueError(f"cannot split {inter} intermediate rows over {parts} DIMMs")
    base, extra = divmod(inter, parts)
    return [base + (d < extra) for d in range(parts)]


def split_expert(wg, wu, wd, parts):
    """Per DIMM ``(wg_s, wu_s, wd_s)``: rows of Wg/Wu and the matching columns of Wd."""
    wg, wu, wd = (np.asarray(a) for a in (wg, wu, wd))
    out, start = [], 0
    for size in split_sizes(wg.shape[0], parts):
        out.append((wg[start:start + size], wu[start:start + size], wd[:, start:start + size]))
        start += size
    return out


def activation_lut(name, x_width, in_frac_bits, out_frac_bits):
    """A signed table for ``silu``, ``gelu`` or ``relu`` of fixed-point codes.

    Entry ``q mod 2**x_width`` (q the signed code, value ``q / 2**in_frac_bits``) holds
    ``round(f(value) * 2**out_frac_bits)``, saturated to ``x_width`` bits.
    """
    functions = {
        "silu": lambda v: v / (1.0 + math.exp(-v)),
        "gelu": lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
        "relu": lambda v: max(v, 0.0),
    }
    f = functions[name]
    size = 1 << x_width
    table = [0] * size
    for q in range(-(size // 2), size // 2):
        value = f(q / (1 << in_frac_bits)) * (1 << out_frac_bits)
        table[q % size] = requant(math.floor(value + 0.5), 0, x_width)
    return table


def _row_beats(row, mults, pad):
    """One row as beats of ``mults`` lanes; lanes past the end take values from ``pad()``."""
    row = row.tolist() if isinstance(row, np.ndarray) else [int(v) for v in row]
    beats = []
    for start in range(0, len(row), mults):
        chunk = row[start:start + mults]
        beats.append(chunk + [pad() for _ in range(mults - len(chunk))])
    return beats


def vector_beats(x, mults, pad=lambda: 0):
    """The activation vector as beats of ``mults`` elements."""
    return _row_beats(x, mults, pad)


def gemv_weight_beats(weights, mults, pad=lambda: 0):
    """Weight beats of a ``gemv`` in stream order (see module docstring)."""
    return [beat for row in weights for beat in _row_beats(row, mults, pad)]


def ffn_weight_beats(wg, wu, wd, mults, pad=lambda: 0):
    """Weight beats of an ``ffn_slice`` in stream order: Wg/Wu rows interleaved, then Wd rows."""
    beats = []
    for g_row, u_row in zip(wg, wu):
        beats += _row_beats(g_row, mults, pad) + _row_beats(u_row, mults, pad)
    return beats + gemv_weight_beats(wd, mults, pad)


# --- cycle model ------------------------------------------------------------------------------

def tree_levels(mults):
    """Registered levels of the adder tree over M products."""
    return max(mults - 1, 0).bit_length()


def gate_drain(mults):
    """Cycles ``ffn_slice`` pauses the weight port between the last Wu beat and the first Wd beat.

    The last h value must be in the h buffer before the first Wd beat reads it: the beat passes
    the weight register (1), the operand registers (1), the product register (1), the adder
    tree, the row register (1), the shifted-value register (1), the activation table's
    synchronous read (1), the gate multiplier's operand registers (1), its product register (1),
    the shifted-product register (1) and the h code register (1); the h write lands at the end
    of that cycle.
    """
    return tree_levels(mults) + 10


def result_latency(mults):
    """Edges from the transfer of a row's last weight beat to its result's transfer (ready output).

    Weight register, operand registers, product register, adder tree, row register (the FIFO
    write), then the output FIFO's two-register read path.
    """
    return 1 + 1 + 1 + tree_levels(mults) + 1 + 2


def weight_beats(op, rows, cols, mults):
    """Weight beats one command consumes (however many tokens it names)."""
    if op == OP_GEMV:
        return rows * math.ceil(cols / mults)
    return 2 * rows * math.ceil(cols / mults) + cols * math.ceil(rows / mults)


def useful_macs(op, rows, cols, tokens=1):
    """Multiply-accumulates the command needs (no padding lanes)."""
    return rows * cols * (1 if op == OP_GEMV else 3) * tokens


def timeline(commands, out_depth, mults, beat_ready=None):
    """Transfer edges of back-to-back commands when every command, x beat and weight beat is
    waiting and the output is always ready; edge 0 takes the first command.

    Parameters
    ----------
    commands : sequence of (op, rows, cols, load_x) or (op, rows, cols, load_x, tokens)
        ``tokens`` (S) defaults to 1.
    out_depth, mults : int
        The core's output FIFO entries and M.
    beat_ready : sequence of int, optional
        The earliest edge each weight beat (over all commands, in order) can be taken (a DRAM
        that delivers it later); by default every beat is waiting.

    Returns
    -------
    (list, list, list)
        Edges of the command transfers, of every weight beat, of every result.

    Notes
    -----
    One edge takes a command; with ``load_x`` the next ``S*ceil(cols/M)`` edges take x; then
    one (beat, token) pair issues per edge, the beat taken at its token-0 pair and held for
    tokens 1..S-1, except that ``ffn_slice`` pauses :func:`gate_drain` edges between its
    last gate-row pair and its first Wd pair, and that a row-ending pair of an output row issues
    at edge c only while fewer than ``out_depth`` earlier output pairs t have
    ``t < c <= t + result_latency`` (a slot is reserved from the edge after the pair until the
    edge after its result's transfer). Each result leaves :func:`result_latency` edges after its
    row-ending pair. The next command is taken the edge after the last pair.
    """
    latency = result_latency(mults)
    cycle, command_edges, weight_edges, row_ends = 0, [], [], []
    for command in commands:
        op, rows, cols, load_x = command[:4]
        tokens = command[4] if len(command) > 4 else 1
        command_edges.append(cycle)
        cycle += 1 + (tokens * math.ceil(cols / mults) if load_x else 0)
        if op == OP_GEMV:
            phases = [(rows, math.ceil(cols / mults), True)]
        else:
            phases = [(2 * rows, math.ceil(cols / mults), False),
                      (cols, math.ceil(rows / mults), True)]
        for index, (n_rows, row_beats, output) in enumerate(phases):
            if index:
                cycle += gate_drain(mults)
            for _ in range(n_rows):
                for beat in range(row_beats):
                    for token in range(tokens):
                        if token == 0 and beat_ready is not None:
                            cycle = max(cycle, beat_ready[len(weight_edges)])
                        if output and beat == row_beats - 1:
                            while sum(1 for t in row_ends[-out_depth:]
                                      if t < cycle <= t + latency) >= out_depth:
                                cycle += 1
                            row_ends.append(cycle)
                        if token == 0:
                            weight_edges.append(cycle)
                        cycle += 1
    return command_edges, weight_edges, [t + latency for t in row_ends]


def command_cycles(op, rows, cols, load_x, mults, out_depth, tokens=1):
    """Edges from a command's transfer to the next one's, in the setting of :func:`timeline`
    with no earlier result holding an output slot."""
    # The edge the next command would be taken (a one-beat gemv after it, as a probe).
    commands = [(op, rows, cols, load_x, tokens), (OP_GEMV, 1, 1, False, 1)]
    return timeline(commands, out_depth, mults)[0][1]


# --- ndp_system: N cores, one expert tensor-parallel, partial sums reduced --------------------

def system_expert_tokens(wg, wu, wd, xs, lut, shifts, x_width, acc_width):
    """What ``ndp_system`` returns: the unsplit expert FFN of every token (the sum of the N
    slices' partials wraps to exactly this), row by row, token by token."""
    return interleave_tokens([ffn_expert(wg, wu, wd, x, lut, shifts, x_width, acc_width)
                              for x in xs])


def system_weight_beats(wg, wu, wd, dimms, mults, pad=lambda: 0):
    """Per DIMM, the weight beats of its slice (:func:`split_expert`) in ffn_slice order."""
    return [ffn_weight_beats(g, u, d, mults, pad) for g, u, d in split_expert(wg, wu, wd, dimms)]


def _slice_pairs(rows, cols, tokens, mults):
    """(gap, is_output, is_beat, phase) per (beat, token) pair of one DIMM's ffn_slice: ``gap``
    is the least distance in edges from the previous pair (0 for the first: it follows the x
    load; 1 + gate_drain for the first Wd pair)."""
    pairs = []
    phases = [(2 * rows, math.ceil(cols / mults), False), (cols, math.ceil(rows / mults), True)]
    for index, (n_rows, row_beats, output) in enumerate(phases):
        for _ in range(n_rows):
            for beat in range(row_beats):
                for token in range(tokens):
                    gap = 1 if pairs else 0
                    if index and pairs[-1][3] == 0:
                        gap = 1 + gate_drain(mults)
                    pairs.append((gap, output and beat == row_beats - 1, token == 0, index))
    return pairs


def system_timeline(commands, dimms, out_depth, mults):
    """Transfer edges of back-to-back ``ndp_system`` commands when every command, x beat and
    weight beat is waiting and ``y`` is always ready; edge 0 takes the first command.

    Parameters
    ----------
    commands : sequence of (rows, cols, load_x, tokens)
        ``rows`` = I, the whole expert's intermediate rows; DIMM d runs
        ``split_sizes(I, dimms)[d]`` of them.

    Returns
    -------
    (list, list of list, list)
        Command edges; per DIMM, the edges of its weight beats; the edges of the results.

    Notes
    -----
    Every DIMM runs its slice as :func:`timeline` says, with one coupling: its output slots are
    released when the reduction takes a result, at the edge J(k) = max over DIMMs of (their
    result k's edge t_d(k) + :func:`result_latency`), and at least J(k-1) + 1; a row-ending
    pair of DIMM d issues at edge c only while fewer than ``out_depth`` of its earlier output
    pairs have t_d(k) < c <= J(k). The reduction's register adds one edge: result k leaves at
    J(k) + 1. All DIMMs take a command at the same edge, the edge after the last pair of the
    slowest DIMM (each DIMM's first pair follows the x load: command edge + 1 + S*ceil(D/M)).
    """
    latency = result_latency(mults)
    outputs = [[] for _ in range(dimms)]       # per DIMM, its output pairs' edges
    released = [0] * dimms                     # per DIMM, its outputs joined before now
    joins, command_edges, beat_edges = [], [], [[] for _ in range(dimms)]
    cycle = 0
    for rows, cols, load_x, tokens in commands:
        command_edges.append(cycle)
        sequences = [_slice_pairs(size, cols, tokens, mults)
                     for size in split_sizes(rows, dimms)]
        start = cycle + 1 + (tokens * math.ceil(cols / mults) if load_x else 0)
        position = [0] * dimms
        earliest = [start] * dimms
        last = [start] * dimms
        now = start
        while any(position[d] < len(sequences[d]) for d in range(dimms)):
            for d in range(dimms):
                if position[d] == len(sequences[d]) or now < earliest[d]:
                    continue
                _, output, beat, _ = sequences[d][position[d]]
                if output:
                    # Joins rise, so the outputs joined before now are a prefix, free for
                    # good: counted past, the count stays linear in the run's length.
                    first = released[d]
                    while first < min(len(joins), len(outputs[d])) and joins[first] < now:
                        first += 1
                    released[d] = first
                    held = sum(1 for k in range(first, len(outputs[d]))
                               if outputs[d][k] < now and (k >= len(joins) or now <= joins[k]))
                    if held >= out_depth:
                        continue
                    outputs[d].append(now)
                if beat:
                    beat_edges[d].append(now)
                last[d] = now
                position[d] += 1
                if position[d] < len(sequences[d]):
                    earliest[d] = now + sequences[d][position[d]][0]
            while all(len(o) > len(joins) for o in outputs):
                k = len(joins)
                join = max(o[k] for o in outputs) + latency
                joins.append(max(join, joins[-1] + 1) if joins else join)
            now += 1
        cycle = max(last) + 1
    return command_edges, beat_edges, [j + 1 for j in joins]


def system_expert_cycles(inter, hidden, tokens, dimms, mults, load_x=True):
    """Edges from an ``ndp_system`` command's transfer to the edge after its last result's, for
    one expert of ``inter`` x ``hidden`` over ``dimms`` DIMMs and ``tokens`` tokens, in the
    setting of :func:`system_timeline` with ``out_depth`` > :func:`result_latency` (no slot
    waits: the defaults). In closed form, so the schedule model can price full-size experts.

    DIMM 0 holds the most rows, I_0 = ceil(I/N), and sets the pace: 1 command edge, S x beats
    per x word, S pairs per gate beat (2 I_0 ceil(D/M) beats), the gate drain, S pairs per Wd
    beat (D ceil(I_0/M) beats), then its last result's latency and the reduction's register.
    """
    rows = split_sizes(inter, dimms)[0]
    x_beats = math.ceil(hidden / mults)
    last_pair = (tokens * x_beats * bool(load_x) + tokens * 2 * rows * x_beats +
                 gate_drain(mults) + tokens * hidden * math.ceil(rows / mults))
    return last_pair + result_latency(mults) + 2


# Table II of seed 002: the four MoE models the schedule model and the tests scale from.
@dataclasses.dataclass(frozen=True)
class Model:
    """One row of Table II (+ total parameters from the model cards for the non-MoE part)."""
    name: str
    experts: int
    topk: int
    shared: int
    hidden: int
    inter: int
    moe_layers: int
    layers: int
    total_params: float
    expert_params: float
    prefetch: int                      # experts per layer the GPU holds after the prefill


MODELS = (
    Model("DeepSeek-MoE", 64, 6, 2, 2048, 1408, 27, 28, 16.4e9, 15.4e9, 6),
    Model("Qwen3-30B-A3B", 128, 8, 0, 2048, 768, 48, 48, 30.5e9, 29.0e9, 8),
    Model("Phi-3.5-MoE", 16, 2, 0, 6400, 4096, 32, 32, 41.9e9, 40.3e9, 2),
    Model("Mixtral-8x7B", 8, 2, 0, 4096, 14336, 32, 32, 46.7e9, 42.0e9, 1),
)
