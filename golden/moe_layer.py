"""Golden model of the Mozart MoE layer (block ``moe_layer``, under construction): gate, node-
limited routing, gate weights, the dispatch packet, each expert chiplet's FFN and local
aggregation, the in-network combine, and the MAC-work bound.

Pure Python/NumPy (no amaranth, no hw/). Sources: seed 000 §3.3, §4.2-4.4 (tokens dispatched to
the chiplets of their experts, local aggregation inside a chiplet, global aggregation in the
switches), seed 003 §4.3 (node-limited routing), seed 002 (the expert FFN numerics of
``golden.ndp``, shared so that an expert means the same on a DIMM and on a chiplet).

Arithmetic, per token x (D signed ``in_width``-bit elements), bit for bit:

1. Gate scores: ``raw_e = sum_d x_d * Wg[d][e]`` exact, wrapped to signed ``score_acc_width``.
2. Score codes (what the router compares): ``s_e = requant(raw_e, score_shift, score_width) +
   2**(score_width-1)`` (``golden.ndp.requant``: round half up, saturate), an unsigned
   ``score_width``-bit code in the same order as ``raw_e``.
3. Routing: ``golden.router.route(s, k, groups, topk_groups)``: k distinct experts, highest code
   first (ties to the lower index), within the ``topk_groups`` best groups.
4. Gate weights: ``g_e = gate_lut[s_e]``, an unsigned ``gate_width``-bit run-time table (for
   example a sigmoid of the code); not renormalized over the k (fold a scale into the table).
   With a shared expert (DeepSeek-V3's, seed 003), every token also chooses expert E (the one
   after the routed ones) with gate ``2**gate_width - 1``, as header entry k, on its own leaf.
5. Expert e on its chiplet: ``y_e = golden.ndp.ffn_expert(Wg_e, Wu_e, Wd_e, x, act_lut, shifts,
   in_width, acc_width)``: ``h = requant(act(requant(x·Wgate)) * requant(x·Wup))``, ``y = Wd·h``.
6. Local aggregation: a chiplet returns, per element, ``requant(sum over its chosen experts of
   g_e * y_e, gate_shift, combine_width)``: the products summed exactly, then one rounding to
   the NoP's return lanes (its ``acc_width``, here ``combine_width``).
7. Combine: the switches add the returns of every chiplet the token went to, wrapping at
   ``combine_width``: ``y = wrap(sum over chiplets, combine_width)``.

Packet (flits of ``lanes`` signed ``data_width``-bit lanes): ``header_flits = ceil(k / lanes)``
header flits, entry j of the k choices in lane ``j % lanes`` of flit ``j // lanes``, holding
``expert * 2**gate_width + g`` (unsigned bits); then ``ceil(D / lanes)`` flits of x (element d in
lane ``d % lanes`` of x flit ``d // lanes``, missing lanes 0). A chiplet's return has the same
number of flits (the NoP drops a return of another length), lanes of ``combine_width`` bits:
zero header flits, then its aggregated values in the x positions. The root's combined packet,
header flits dropped, is y.

Floating point (``dtype`` fp8_e4m3, fp8_e5m2 or bf16, issue 17): x, the FFN weights and the
activation table hold codes of ``dtype`` (``golden.fp``'s formats and cast rule), with seed 003
§3.1's fine-grained scales in ``scale_format``: E8M0 codes c of value 2**(c - 127) (255: NaN),
or FP32 codes (``fp.scale_decode``). Each token has one for x (``layer``'s ``x_scales``: D <= 64, so
x is one 1 x 128 tile), and each expert one for each of its gate, up and down matrices
(``w_scales``: each one 128 x 128 block). x's value is its codes times its scale; the packet
carries the scale after the choices, in ``scale_entries`` header entries of ``data_width``
bits, low bits first (one for E8M0; ceil(32 / data_width) for FP32), so
``header_flits(k + shared + scale_entries, lanes)`` header flits.

1'. The gate stays in higher precision, as DeepSeek-V3 keeps its gating modules (seed 003
    §3.3): each x code is taken as a fixed-point integer ``fixed_x`` = value *
    2**FIXED_FRACTION[dtype] (FP8 exactly: the smallest subnormal is 1; BF16 in Q16.16,
    truncated toward zero and saturated at 65280; NaN as 0, an infinity as the largest
    value), and steps 1-4 run on those integers with the integer W_g.
2'. The token's scale, taken as ``(-1)**sign * m * 2**x`` with an integer m (``gate_scale``:
    E8M0 m = 1, x = c - 127; FP32 its 24-bit significand and exponent, an infinity as the
    largest finite FP32 value of its sign), gives ``s_e = scaled_requant(raw_e * (+-m),
    score_shift - x, score_width) + 2**(score_width-1)``: the exact product rounded once, a
    negative shift being a left shift that saturates; a NaN scale makes every raw_e 0.

5'. ``g = scale_cast(Wg·x, fp32, dtype, shift_g)`` and ``u`` likewise with ``shift_u``, where a
    product ``W·x`` is the chiplet's systolic tile in floating point
    (``golden.systolic.fp_tile_result``: K split over ``tile_arrays`` slices of ceil(K/n),
    each an ``fp_dot`` of group 1 with ``acc_frac`` and ``promote_every``, every promotion
    multiplied by the matrix's scale and x's (h's scale is 1), the slices' FP32 results added
    pairwise);
    ``h = multiply(activation(g), u, dtype, shift_h)`` (``activation``: the table's entry
    ``g >> act_index_drop(dtype)``: all of an FP8 code, a BF16 code's top 12 bits);
    ``y = Wd·h`` (FP32 codes). A shift is a power of two (2**-shift) folded into the one
    rounding.
6'. A chiplet's return: per element, starting from +0, for its chosen experts in the order it
    applies them (its slot order) ``sum = add(sum, multiply(y_e, g_e, fp32, gate_shift))`` in
    FP32, each step rounded; returned as FP32 codes, or cast to BF16 (``combine_dtype``).
"""

import dataclasses
import math

import numpy as np

from golden import fp, ndp, nop, placement, router
from golden.pmu import READ_LATENCY
from golden.systolic import OS_PE_STAGES, fp_tile_result, pe_stages
from golden.fixed import wrap

__all__ = ["MoELayer", "score_codes", "gate_weights", "dispatch_flits", "parse_header",
           "chiplet_return", "fp_activation_lut", "fixed_x", "FIXED_FRACTION", "GATE_MAX_CODE",
           "ACT_INDEX_BITS", "act_index_drop", "activation", "layer",
           "mac_bound", "expert_macs", "header_flits",
           "chiplet_stream_returns", "chiplet_stream_edges",
           "gate_latency", "ChipletShape", "weight_beats", "chiplet_figures",
           "chiplet_batch_edges", "community_workload", "placements", "stream_order",
           "RESULT_STAGES", "A_SLICE_EDGES", "scaled_requant", "UNIT_SCALE", "NAN_SCALE",
           "SCALE_FORMATS", "unit_scale", "scale_entries", "gate_scale"]

UNIT_SCALE = 127                                    # E8M0: 2**(127 - 127)
NAN_SCALE = 255                                     # E8M0's one NaN
SCALE_FORMATS = ("e8m0", "fp32")       # the formats of a scale (seed 003 §3.1; fp.SCALE_BITS)
FP32_LARGEST = (0xFFFFFF, 127 - 23)                 # FP32's largest finite: m, x


def unit_scale(scale_format="e8m0"):
    """The code of a unit scale (1.0)."""
    return UNIT_SCALE if scale_format == "e8m0" else fp.encode(1.0, "fp32")


def scale_entries(scale_format, data_width):
    """Header entries of x's scale: its code's bits over ``data_width``-bit lanes."""
    return -(-fp.SCALE_BITS[scale_format] // data_width)


def gate_scale(code, scale_format="e8m0"):
    """``(multiplier, exponent)`` of a scale as the gate applies it (step 2'): the value is
    ``multiplier * 2**exponent`` with a signed integer multiplier (E8M0: 1; FP32: its signed
    24-bit significand); an FP32 infinity as the largest finite value of its sign; None for
    NaN."""
    if scale_format == "e8m0":
        return None if code == NAN_SCALE else (1, code - UNIT_SCALE)
    kind, sign, m, x = fp.components(code, "fp32")
    if kind == "nan":
        return None
    if kind == "inf":
        m, x = FP32_LARGEST
    return (-m if sign else m), x


def score_codes(x, wg, acc_width, score_shift, score_width, scale=None, scale_format="e8m0"):
    """Unsigned router codes of one token (steps 1-2); ``wg`` is D x E. Floating point: the
    token's ``scale`` (a ``scale_format`` code) multiplies each wrapped sum before the one
    rounding (step 2', ``gate_scale``); NaN makes every sum 0."""
    raw = np.asarray(x, dtype=object).dot(np.asarray(wg, dtype=object))
    bias = 1 << (score_width - 1)
    if scale is None:
        return [ndp.requant(wrap(v, acc_width), score_shift, score_width) + bias for v in raw]
    parts = gate_scale(scale, scale_format)
    if parts is None:
        return [ndp.requant(0, score_shift, score_width) + bias for _ in raw]
    multiplier, exponent = parts
    return [scaled_requant(wrap(v, acc_width) * multiplier, score_shift - exponent, score_width)
            + bias for v in raw]


def scaled_requant(value, shift, width):
    """``golden.ndp.requant`` for a shift that may be negative (a left shift, saturating)."""
    if shift >= 0:
        return ndp.requant(value, shift, width)
    return ndp.requant(int(value) << -shift, 0, width)


def gate_weights(codes, experts, gate_lut):
    """``g_e`` of the chosen experts, in their order (step 4)."""
    return [int(gate_lut[codes[e]]) for e in experts]


def header_flits(k, lanes):
    """Header flits of a dispatch packet: ceil(k / lanes)."""
    return -(-k // lanes)


def gate_latency(k, groups, topk_groups, scale_format="e8m0"):
    """``moe_gate``: edges from a token's final x beat to its first flit, every port ready: the
    beat and W_g word registers (1), the products (1), their sums (1), the totals (1), with
    FP32 scales the totals times x's scale (1), the codes register (1), the router
    (``router.pipeline_latency``), the packet former (1)."""
    scaled = 1 if scale_format == "fp32" else 0
    return 5 + scaled + router.pipeline_latency(k, groups, topk_groups) + 1


def dispatch_flits(experts, gates, x, lanes, gate_width, scale=None, scale_format="e8m0",
                   data_width=32):
    """The flits of one token's dispatch packet (header, then x), as lists of lane values
    (header entries as their unsigned bits). Floating point: x's ``scale`` code (of
    ``scale_format``) follows the choices, in ``scale_entries`` entries of ``data_width`` bits,
    low bits first."""
    entries = [(int(expert) << gate_width) | int(gate) for expert, gate in zip(experts, gates)]
    if scale is not None:
        pieces = scale_entries(scale_format, data_width)
        mask = (1 << data_width) - 1
        entries += [(int(scale) >> (p * data_width)) & mask for p in range(pieces)]
    count = header_flits(len(entries), lanes)
    header = [[0] * lanes for _ in range(count)]
    for j, entry in enumerate(entries):
        header[j // lanes][j % lanes] = entry
    body = [[0] * lanes for _ in range(-(-len(x) // lanes))]
    for d, value in enumerate(x):
        body[d // lanes][d % lanes] = int(value)
    return header + body


def parse_header(flits, k, lanes, gate_width):
    """``[(expert, gate)]`` of the k choices, read back from a packet's header flits."""
    mask = (1 << gate_width) - 1
    entries = [flits[j // lanes][j % lanes] for j in range(k)]
    return [(entry >> gate_width, entry & mask) for entry in entries]


@dataclasses.dataclass
class MoELayer:
    """One layer's parameters and weights (what the run-time ports load).

    ``wg``: D x E gate matrix; ``experts[e] = (Wg_e, Wu_e, Wd_e)`` (F x D, F x D, D x F, as in
    ``golden.ndp``); ``placement[e]``: the chiplet (leaf) of expert e; ``gate_lut``:
    2**score_width unsigned entries; ``act_lut``: 2**in_width signed entries (floating
    point: ``fp_activation_lut``'s codes); ``shifts``:
    (shift_g, shift_u, shift_h) of the FFN; ``leaves``: the chiplets, counted in the per-chiplet
    figures even when no expert sits on some (0: those the placement uses). With ``shared``,
    ``experts`` and ``placement`` (and ``w_scales``) have one more entry, the shared expert's
    (index E = the columns of ``wg``).
    """
    wg: list
    experts: list
    placement: list
    gate_lut: list
    act_lut: list
    shifts: tuple
    k: int
    groups: int = 1
    topk_groups: int = 1
    in_width: int = 8
    acc_width: int = 32          # the experts' accumulators (the chiplets')
    score_acc_width: int = 32    # the gate's score accumulators (moe_layer's score_acc_width)
    score_shift: int = 8
    score_width: int = 8
    gate_width: int = 8
    gate_shift: int = 8
    data_width: int = 16
    combine_width: int = 24
    lanes: int = 4
    shared: bool = False
    leaves: int = 0              # chiplets of the layer (0: as many as the placement uses)
    dtype: str = "int"           # the expert datapath: int, fp8_e4m3, fp8_e5m2 or bf16
    acc_frac: int = 13           # floating point: the tile's accumulator fraction bits,
    promote_every: int = 128     # its promotion interval,
    tile_arrays: int = 1         # the arrays its K is split over,
    combine_dtype: str = "int"   # and the return lanes' format (bf16 or fp32)
    slot_of: tuple = ()          # floating point: each expert's slot on its chiplet (the order
    fanouts: tuple = ()          # a chiplet adds its experts in; default ascending) and the
                                 # NoP tree (the order the switches add the returns in)
    w_scales: tuple = ()         # floating point: per expert the scale codes of its gate,
                                 # up and down weight blocks (default: unit),
    scale_format: str = "e8m0"   # in this format (and x's): e8m0 or fp32

    @property
    def routed(self):
        """E, the routed experts (the shared one, if any, is expert E)."""
        return len(self.wg[0])

    def choices(self, experts, gates):
        """``[(expert, gate)]`` of a token: its routed choices, then the shared expert's."""
        extra = [(self.routed, (1 << self.gate_width) - 1)] if self.shared else []
        return list(zip(experts, gates)) + extra

    @property
    def d_model(self):
        return len(self.wg)

    @property
    def d_ff(self):
        return len(self.experts[0][0])

    def ffn(self, expert, x, x_scale=None):
        """y of expert e for x: integers (step 5), or FP32 codes (step 5'; ``x_scale`` x's
        scale code, default unit)."""
        wg, wu, wd = self.experts[expert]
        if self.dtype != "int":
            unit = unit_scale(self.scale_format)
            scales = self.w_scales[expert] if self.w_scales else (unit,) * 3
            return _fp_ffn(self, (wg, wu, wd), scales, x, unit if x_scale is None else x_scale)
        return ndp.ffn_expert(wg, wu, wd, x, self.act_lut, self.shifts, self.in_width,
                              self.acc_width)


def fp_activation_lut(name, dtype):
    """The activation table of a floating-point chiplet: entry i holds f of the value of code
    ``i << act_index_drop(dtype)`` (for FP8 code i; for BF16 the least magnitude of the codes
    that share the entry) cast to ``dtype`` (``golden.fp.encode``); NaN gives NaN, an infinity
    its limit (silu: +inf, -0; relu: +inf, +0)."""
    functions = {"silu": lambda v: v / (1.0 + math.exp(-v)) if v > -700 else -0.0,
                 "relu": lambda v: max(v, 0.0)}            # (exp(700) is near float's top)
    f = functions[name]
    drop = act_index_drop(dtype)
    table = []
    for index in range(1 << (fp.FORMATS[dtype].width - drop)):
        value = fp.decode(index << drop, dtype)
        if math.isinf(value):
            result = value if value > 0 else f(-1000.0)
        elif math.isnan(value):
            result = value
        else:
            result = f(value)
        table.append(fp.encode(result, dtype) if not math.isnan(result)
                     else fp.FORMATS[dtype].canonical_nan)
    return table


FIXED_FRACTION = {"fp8_e4m3": 9, "fp8_e5m2": 16, "bf16": 16}   # the gate's x fraction bits:
# -(exponent of the smallest subnormal) for FP8 (exact); BF16 (down to 2**-133, up to 2**128)
# is cut to E5M2's window instead: Q16.16, truncated toward zero below 2**-16 and saturated
# at the largest BF16 value below 2**16, 65280 (GATE_MAX_CODE), so that every format's x fits
# the 33 signed bits of E5M2's largest, 57344 * 2**16.
GATE_MAX_CODE = {"fp8_e4m3": fp.FORMATS["fp8_e4m3"].max_code,
                 "fp8_e5m2": fp.FORMATS["fp8_e5m2"].max_code, "bf16": 0x477F}


def fixed_x(code, dtype):
    """An x code as the gate takes it: its value times 2**FIXED_FRACTION[dtype], truncated
    toward zero (exact for FP8), its magnitude at most GATE_MAX_CODE[dtype]'s; NaN as 0, an
    infinity as that largest value of its sign."""
    kind, sign, m, x = fp.components(code, dtype)
    if kind == "nan":
        return 0
    _, _, top_m, top_x = fp.components(GATE_MAX_CODE[dtype], dtype)
    largest = top_m << (top_x + FIXED_FRACTION[dtype])
    shift = x + FIXED_FRACTION[dtype]
    magnitude = largest if kind == "inf" else (m << shift if shift >= 0 else m >> -shift)
    magnitude = min(magnitude, largest)
    return -magnitude if sign else magnitude


ACT_INDEX_BITS = 12      # a floating-point activation table's index: a code's top 12 bits


def act_index_drop(dtype):
    """Low code bits the activation table's index drops: none for FP8 (a 256-entry table,
    every code its own entry), 4 for BF16 (4096 entries: sign, exponent and the top 3 mantissa
    bits, an E8M3 grid; 65,536 entries would be 1 Mbit on every chiplet)."""
    return max(0, fp.FORMATS[dtype].width - ACT_INDEX_BITS)


def activation(model, code):
    """act(g) as a floating-point chiplet looks it up: ``act_lut[code >> act_index_drop]``.
    (A NaN g is the canonical NaN of ``fp.scale_cast``, whose BF16 entry, 0x7FC0 >> 4, no
    other kind of code shares; the infinities share theirs with NaN payloads a cast never
    makes.)"""
    return model.act_lut[code >> act_index_drop(model.dtype)]


def _fp_matvec(model, matrix, vector, scale, vector_scale):
    """``matrix · vector`` (codes of ``dtype``; ``scale`` the matrix's block scale code,
    ``vector_scale`` the vector's) as the chiplet's floating-point tile computes it: FP32
    codes, one per row of the matrix."""
    n, size = model.tile_arrays, len(vector)
    depth = -(-size // n)

    def sliced(values, s):
        part = list(values[s * depth:(s + 1) * depth])
        return part + [0] * (depth - len(part))

    config = fp.DotConfig(group=1, acc_frac=model.acc_frac, promote_every=model.promote_every)
    a_slices = [[sliced(vector, s)] for s in range(n)]
    b_slices = [[list(column) for column in zip(*[sliced(row, s) for row in matrix])]
                for s in range(n)]
    blocks = [-(-depth // config.scale_block)]
    return fp_tile_result(a_slices, b_slices, model.dtype, config,
                          [[[fp.scale_decode(vector_scale, model.scale_format)] * blocks[0]]
                           for _ in range(n)],
                          [[fp.scale_decode(scale, model.scale_format)] * blocks[0]
                           for _ in range(n)])[0]


def _fp_ffn(model, matrices, scales, x, x_scale):
    shift_g, shift_u, shift_h = model.shifts
    (wg, wu, wd), (scale_g, scale_u, scale_d) = matrices, scales
    dtype = model.dtype
    g = [fp.scale_cast(v, "fp32", dtype, shift_g)
         for v in _fp_matvec(model, wg, x, scale_g, x_scale)]
    u = [fp.scale_cast(v, "fp32", dtype, shift_u)
         for v in _fp_matvec(model, wu, x, scale_u, x_scale)]
    h = [fp.multiply(activation(model, a), dtype, b, dtype, dtype, shift_h)
         for a, b in zip(g, u)]
    return _fp_matvec(model, wd, h, scale_d,                   # (h: codes at their values)
                      unit_scale(model.scale_format))


def chiplet_return(model, leaf, choices, x, order=None, x_scale=None):
    """What chiplet ``leaf`` returns for a token (step 6, or 6' in floating point): its
    aggregated values, one per element of x. ``choices``: ``[(expert, gate)]`` of the token;
    ``order``: the chiplet's experts in the order it applies them (default: by
    ``model.slot_of``, else ascending), which only floating point depends on, as on
    ``x_scale`` (x's scale code, default unit)."""
    held = [(e, g) for e, g in choices if model.placement[e] == leaf]
    if model.dtype != "int":
        if order is not None:
            rank = {e: i for i, e in enumerate(order)}
        else:
            rank = dict(enumerate(model.slot_of))
        total = [0] * len(x)
        for expert, gate in sorted(held, key=lambda c: (rank.get(c[0], c[0]), c[0])):
            total = [fp.add(t, fp.multiply(y, "fp32", gate, None, "fp32", model.gate_shift),
                            "fp32") for t, y in zip(total, model.ffn(expert, x, x_scale))]
        if model.combine_dtype == "bf16":
            return [fp.scale_cast(t, "fp32", "bf16") for t in total]
        return total
    total = np.zeros(len(x), dtype=object)
    for expert, gate in held:
        total = total + gate * np.asarray(model.ffn(expert, x), dtype=object)
    return [ndp.requant(v, model.gate_shift, model.combine_width) for v in total]


def expert_macs(d_model, d_ff):
    """Multiply-accumulates of one expert FFN for one token: gate, up and down."""
    return 3 * d_model * d_ff


def layer(model, tokens, x_scales=None):
    """The layer over a batch: per token its route and y, and per chiplet its work.

    Parameters
    ----------
    model : MoELayer
    tokens : list of list of int
        The batch, in arrival order.
    x_scales : list of int, optional
        Floating point: each token's scale code (``model.scale_format``; default unit).

    Returns
    -------
    dict
        ``codes``, ``experts``, ``gates``, ``masks`` and ``y`` per token (y: D values, signed
        ``combine_width``, or in floating point ``combine_dtype`` codes combined in the
        tree's order, step 7'); ``chiplet_tokens`` (tokens each chiplet received) and
        ``chiplet_macs`` (its FFN multiply-accumulates); ``replication`` (chiplets per token).
    """
    chiplets = max(model.leaves, max(model.placement) + 1)
    out = {"codes": [], "experts": [], "gates": [], "masks": [], "y": [],
           "chiplet_tokens": [0] * chiplets, "chiplet_macs": [0] * chiplets}
    per_expert = expert_macs(model.d_model, model.d_ff)
    floating = model.dtype != "int"
    for index, x in enumerate(tokens):
        x_scale = unit_scale(model.scale_format) if x_scales is None else x_scales[index]
        gate_x = [fixed_x(code, model.dtype) for code in x] if floating else x
        codes = score_codes(gate_x, model.wg, model.score_acc_width, model.score_shift,
                            model.score_width, x_scale if floating else None,
                            model.scale_format)
        experts, _ = router.route(codes, model.k, model.groups, model.topk_groups)
        gates = gate_weights(codes, experts, model.gate_lut)
        choices = model.choices(experts, gates)
        mask = router.leaf_mask([e for e, _ in choices], model.placement)
        total = np.zeros(len(x), dtype=object)
        for leaf in range(chiplets):
            if (mask >> leaf) & 1:
                if not floating:
                    total = total + np.asarray(chiplet_return(model, leaf, choices, x),
                                               dtype=object)
                out["chiplet_tokens"][leaf] += 1
        y = _float_combine(model, mask, choices, x, x_scale) if floating else [
            wrap(v, model.combine_width) for v in total]
        for expert, _ in choices:
            out["chiplet_macs"][model.placement[expert]] += per_expert
        for key, value in (("codes", codes), ("experts", experts), ("gates", gates),
                           ("masks", mask), ("y", y)):
            out[key].append(value)
    out["replication"] = sum(bin(m).count("1") for m in out["masks"]) / max(1, len(tokens))
    return out


def _float_combine(model, mask, choices, x, x_scale):
    """Step 7': the chiplets' returns (``combine_dtype`` codes) added by the NoP tree
    (``golden.nop.combine``: each switch adds its children's in child order, each addition
    rounded); y is the combined packet's x positions. (The packet's header: the choices and
    x's scale.)"""
    lanes = model.lanes
    entries = len(choices) + scale_entries(model.scale_format, model.data_width)
    head = header_flits(entries, lanes)
    flits = head + -(-len(x) // lanes)

    def leaf_output(leaf, packet):
        values = chiplet_return(model, leaf, choices, x, x_scale=x_scale)
        body = [[values[b * lanes + lane] if b * lanes + lane < len(x) else 0
                 for lane in range(lanes)] for b in range(flits - head)]
        return [[0] * lanes for _ in range(head)] + body

    packet = {"mask": mask, "flits": [[0] * lanes for _ in range(flits)]}
    combined = nop.combine([packet], leaf_output, model.combine_width, model.combine_dtype,
                           model.fanouts)[0]
    return [v for flit in combined[head:] for v in flit][:len(x)]


def stream_order(model, tokens, leaves, slots, heaviest_first=True, batch=None):
    """Per chiplet, its experts in the order their weights are streamed and placed in its
    slots 0, 1, ...: by the tokens that choose them, the most first (seed 000 §4.4: streaming
    experts, the heaviest first; ties to the lower id), or the fewest first with
    ``heaviest_first=False``. With ``batch``, a chiplet counts only the first ``batch`` tokens
    it receives (its first batch, which computes while its later weights still arrive: the
    more of it the first slot takes, the more of the next load it hides). Each list is padded
    with None to ``slots`` (a slot left over). The shared expert, chosen by every token, is
    its chiplet's heaviest."""
    route = layer(model, tokens)
    counts = [[0] * len(model.placement) for _ in range(leaves)]
    received = [0] * leaves
    for experts, mask in zip(route["experts"], route["masks"]):
        chosen = list(experts) + ([model.routed] if model.shared else [])
        for leaf in range(leaves):
            if not (mask >> leaf) & 1 or (batch is not None and received[leaf] >= batch):
                continue
            received[leaf] += 1
            for expert in chosen:
                if model.placement[expert] == leaf:
                    counts[leaf][expert] += 1
    sign = -1 if heaviest_first else 1
    order = []
    for leaf in range(leaves):
        mine = [e for e, placed in enumerate(model.placement) if placed == leaf]
        mine.sort(key=lambda e: (sign * counts[leaf][e], e))
        order.append(mine + [None] * (slots - len(mine)))
    return order


def mac_bound(chiplet_macs, pes_per_chiplet):
    """The layer's compute bound in cycles: the busiest chiplet's MACs over its PEs."""
    return max(math.ceil(macs / pes_per_chiplet) for macs in chiplet_macs)


# --- the expert chiplet's schedule (block ``expert_chiplet``) ---

@dataclasses.dataclass(frozen=True)
class ChipletShape:
    """The sizes of an expert chiplet's schedule: an expert is D x F, the systolic tile R rows
    (tokens) by C columns with n arrays splitting K.

    A group of up to R tokens of one expert runs two phases on the tile. ``gu``: ``f_chunks``
    gate tiles then ``f_chunks`` up tiles, each of ``k_x`` beats (x split n ways); ``down``:
    ``d_chunks`` tiles of ``k_h`` beats (h split n ways). Each beat takes one weight beat of
    ``weight_lanes`` = n*C weights from the scratchpad.
    """
    d_model: int
    d_ff: int
    rows: int
    cols: int
    arrays: int
    dtype: str = "int"           # the tile's PEs: int, or a floating-point format
    pe_stages: int = OS_PE_STAGES    # an integer PE's registers before its adder

    @property
    def k_x(self):
        return -(-self.d_model // self.arrays)

    @property
    def k_h(self):
        return -(-self.d_ff // self.arrays)

    @property
    def f_chunks(self):
        return -(-self.d_ff // self.cols)

    @property
    def d_chunks(self):
        return -(-self.d_model // self.cols)

    @property
    def weight_lanes(self):
        return self.arrays * self.cols

    @property
    def gu_beats(self):
        return 2 * self.f_chunks * self.k_x

    @property
    def down_beats(self):
        return self.d_chunks * self.k_h

    @property
    def expert_beats(self):
        return self.gu_beats + self.down_beats

    @property
    def pes(self):
        return self.rows * self.cols * self.arrays


def weight_beats(shape, wg, wu, wd):
    """One expert's weights in the order the chiplet's tile reads them (its load stream).

    Gate tiles c = 0..f_chunks-1, then up tiles, each of ``k_x`` beats; beat k of tile c holds in
    lane ``s*C + j`` the weight ``W[c*C + j][s*k_x + k]`` (W = Wg or Wu, F x D); then the down
    tiles c = 0..d_chunks-1 of ``k_h`` beats, lane ``s*C + j`` holding ``Wd[c*C + j][s*k_h + k]``
    (Wd is D x F). Weights past the matrix are 0.
    """
    C, n = shape.cols, shape.arrays

    def tiles(matrix, chunks, depth, rows, cols):
        beats = []
        for c in range(chunks):
            for k in range(depth):
                beat = []
                for s in range(n):
                    for j in range(C):
                        r, col = c * C + j, s * depth + k
                        beat.append(int(matrix[r][col]) if r < rows and col < cols else 0)
                beats.append(beat)
        return beats

    D, F = shape.d_model, shape.d_ff
    return (tiles(wg, shape.f_chunks, shape.k_x, F, D) + tiles(wu, shape.f_chunks, shape.k_x, F, D)
            + tiles(wd, shape.d_chunks, shape.k_h, D, F))


def chiplet_figures(shape):
    """Manifest figures of an expert chiplet: its PEs, an expert's weight beats and MACs."""
    return {"pes": shape.pes, "weight_beats_per_expert": shape.expert_beats,
            "macs_per_token_expert": expert_macs(shape.d_model, shape.d_ff)}


def _tile_pairs(start, tiles, depth, rows, last_end):
    """Edges at which a run of ``tiles`` tiles of ``depth`` beats is taken by the systolic
    tile, the first pair no earlier than ``start``, one pair per edge, and a tile's last pair at
    least ``rows`` edges after the previous tile's (its spacing rule). Returns the edge of the
    final pair."""
    edge = start - 1
    for _ in range(tiles):
        edge += depth
        edge = max(edge, last_end + rows)
        last_end = edge
    return last_end


PLAN_DEPTH = 3           # phases the chiplet plans ahead (its plan FIFO)
A_SLICE_EDGES = 1        # the register slice between the chiplet's executor and its tile's `a`
RESULT_STAGES = 3        # registers between the tile's output and h or a token's sum


def chiplet_batch_edges(slot_tokens, shape, tokens, loaded=None):
    """The expert chiplet's schedule for one batch, every port ready.

    Parameters
    ----------
    slot_tokens : list of int
        Tokens of the batch that chose each slot's expert (slot order).
    shape : ChipletShape
    tokens : int
        Tokens in the batch.
    loaded : list of int or None, optional
        Per slot, the edge its load's last beat is taken (counted like the result), or None
        for weights already resident (the default for every slot).

    Returns
    -------
    dict
        Edges counted from the edge that takes the batch's final dispatch flit (0):
        ``first_return`` (the first return flit taken), ``compute_edges`` (the tile's
        busy span: from the first pair taken to the last result row) and ``h_written``
        (per group, slot order: the edge its last gate/up result row is written into h).

    Schedule (docs/blocks/moe_layer.md). The planner takes one action per edge from edge 1:
    visit a slot that has no group left (to the next slot), plan a group's gu phase, plan the
    previous group's down phase right after it, and at the end the last group's down; a
    phase is planned only when fewer than ``PLAN_DEPTH`` phases wait (one leaves at its last
    pair). Phases run in plan order: gu(0), gu(1), down(0), gu(2), ... A phase's first pair
    is at least ``READ_LATENCY + 2`` edges after it is planned (its weights' job is taken the
    next edge), and after the previous phase's last pair; a down phase
    starts once its group's last gate/up result row is written into h (the tile gives it out
    ``C + 2 + P + (R-1) + ceil(log2 n)`` edges after the last pair (P: the PEs' registers
    before their adders, ``pe_stages`` for int, 3 by default; 0 in floating point), and it
    is written
    ``RESULT_STAGES`` edges later), plus ``A_SLICE_EDGES + 1`` edges (the executor's register
    slice). The tile takes one pair per edge and a tile's last pair at least R edges after the
    previous tile's. The returns start two edges
    after the last result row is written, at the earliest three after the plan is done: H + X
    flits per token, back to back.

    A slot's weights still loading (``loaded``): its first gu phase is planned no earlier than
    the edge after its last beat. Meanwhile, once the tile runs dry (every planned phase's last
    pair taken, and the previous group's last gate/up row written into h), the planner plans
    the down phase it holds back for that group, so that group finishes while the slot loads;
    the gu follows once the slot is loaded. A load in by then keeps the usual order: the gu
    first, its tiles covering the wait for h.
    """
    loaded = list(loaded) if loaded is not None else [None] * len(slot_tokens)
    R, C = shape.rows, shape.cols
    tree = (shape.arrays - 1).bit_length()
    # last pair -> last row out
    tile_lag = C + 2 + pe_stages(shape.dtype, shape.pe_stages) + (R - 1) + tree
    result_lag = tile_lag + RESULT_STAGES            # ... -> written into h or the sums
    # The plan: phases (("gu"|"down", group)) and planner actions in order.
    actions, groups = [], 0
    for slot, count in enumerate(slot_tokens):
        for index in range(-(-count // R)):
            # a slot's first gu waits for its weights
            actions.append(("gu", groups, loaded[slot] if index == 0 else None))
            if groups:
                actions.append(("down", groups - 1, None))
            groups += 1
        actions.append(("visit", None, None))
    if groups:
        actions.insert(len(actions) - 1, ("down", groups - 1, None))
    edge, planned, phases = 0, [], []
    ends = []                                    # last pair of each phase, in plan order
    last_pair, last_gu_pair, last_result = -R, {}, 0
    first_pair = None

    def room(edge):
        """The first edge from ``edge`` at which the next phase fits: the phase PLAN_DEPTH
        places earlier has left (its last pair before that edge)."""
        index = len(planned)
        if index >= PLAN_DEPTH:
            edge = max(edge, _phase_end(ends, planned, phases, index - PLAN_DEPTH, shape, R,
                                        result_lag, last_gu_pair) + 1)
        return edge

    skip = False
    for position, (kind, group, ready) in enumerate(actions):
        if skip:                                 # a down already planned while waiting
            skip = False
            continue
        edge += 1
        if kind == "visit":
            continue
        edge = room(edge)
        if ready is not None and edge < ready + 1:
            held = position + 1 < len(actions) and actions[position + 1][:2] == ("down",
                                                                              group - 1)
            if held:
                # the held-back down goes first if the tile runs dry before the load is in:
                # every planned phase's last pair taken and the held group's h written
                last = _phase_end(ends, planned, phases, len(planned) - 1, shape, R,
                                  result_lag, last_gu_pair)
                release = max(edge, last + 1, last_gu_pair[group - 1] + result_lag + 1)
                if release < ready + 1:
                    planned.append(release)
                    phases.append(("down", group - 1))
                    skip = True
                    edge = room(release + 1)
            edge = max(edge, ready + 1)
        planned.append(edge)
        phases.append((kind, group))
    edge_plan_done = edge                        # the last visit finds nothing left
    for index in range(len(ends), len(phases)):
        _phase_end(ends, planned, phases, index, shape, R, result_lag, last_gu_pair)
    if phases:
        first_pair = planned[0] + READ_LATENCY + 2
        last_pair = ends[-1]
        last_result = last_pair + result_lag
    emitting = max(max(edge_plan_done, last_pair) + 1, last_result) + 1
    busy = last_result - RESULT_STAGES - first_pair + 1 if first_pair is not None else 0
    h_written = [last_gu_pair[group] + result_lag for group in range(groups)]
    return {"first_return": emitting + 1, "done": emitting, "compute_edges": busy,
            "h_written": h_written}


def chiplet_stream_returns(batches, shape, banks, flits, arrivals, *, batch, batch_wait):
    """First-return edges of consecutive batches (the ``firsts`` of
    :func:`chiplet_stream_edges`)."""
    return chiplet_stream_edges(batches, shape, banks, flits, arrivals, batch=batch,
                                batch_wait=batch_wait)["firsts"]


def chiplet_stream_edges(batches, shape, banks, flits, arrivals, *, batch, batch_wait,
                         loaded=None):
    """Per batch, the edges the collector takes its final flit (``lasts``: l), it closes
    (``closes``: c), the planner is done with it (``dones``: d) and its first return is taken
    (``firsts``), through a chiplet with ``banks`` token banks, every port ready.

    Parameters
    ----------
    batches : list of (slot_tokens, tokens)
        Each batch's tokens per expert slot and its token count, in order.
    shape : ChipletShape
    banks : int
        ``token_banks``.
    flits : int
        H + X, flits of a packet and of a return.
    arrivals : list of int
        Per batch, the edge at which the collector could take its final flit were it never
        held back (the edge ``down`` takes it, plus one through the input queue).
    batch, batch_wait : int
        The chiplet's parameters: tokens of a full batch, idle cycles before a partial one
        closes. A batch of fewer tokens is partial: no further packet comes before it closes.
    loaded : list of (list of int or None) or None, optional
        Per batch, per slot, the edge the last beat of a load it waits for is taken (the
        ``loaded`` of :func:`chiplet_batch_edges`, here counted like ``arrivals``); None:
        every slot resident.

    The collector takes a flit per edge into the next free bank; its final flit is taken at
    l_b = max(arrivals_b, c_(b-1) + n_b*flits, f_(b-banks) + n_b*flits), where f is the edge
    the emitter takes a batch's last return flit (a bank is free from the next edge). A full
    batch closes at c_b = l_b; a partial one at c_b = max(l_b + batch_wait, d_(b-1)), when
    the planner is free to take it (d: the edge it is done with a batch; 0 before the first).
    The planner starts it at s_b = max(c_b, d_(b-1)) and is done at d_b = s_b + ``done`` of
    :func:`chiplet_batch_edges`; the emitter starts it at e_b = max(d_b, f_(b-1)): its
    returns are taken at e_b + 1 .. f_b = e_b + n_b*flits.
    """
    lasts, closes, dones, ends, firsts = [], [], [], [], []
    for b, (slot_tokens, tokens) in enumerate(batches):
        close = arrivals[b]
        if b:
            close = max(close, closes[-1] + tokens * flits)
        if b >= banks:
            close = max(close, ends[b - banks] + tokens * flits)
        lasts.append(close)
        if tokens < batch:
            close = max(close + batch_wait, dones[-1] if dones else 0)
        start = max(close, dones[-1]) if dones else close
        waits = None
        if loaded is not None and loaded[b] is not None:
            waits = [None if edge is None else edge - start for edge in loaded[b]]
        done = start + chiplet_batch_edges(slot_tokens, shape, tokens, waits)["done"]
        emit = max(done, ends[-1]) if ends else done
        closes.append(close)
        dones.append(done)
        ends.append(emit + tokens * flits)
        firsts.append(emit + 1)
    return {"lasts": lasts, "closes": closes, "dones": dones, "firsts": firsts}


def _phase_end(ends, planned, phases, index, shape, rows, result_lag, last_gu_pair):
    """The last pair of phase ``index`` (computing the earlier ones first)."""
    while len(ends) <= index:
        i = len(ends)
        kind, group = phases[i]
        start = planned[i] + READ_LATENCY + 2    # its weights' job, taken the next edge
        if i:
            start = max(start, ends[-1] + 1)
        previous = ends[-1] if ends else -rows
        if kind == "gu":
            end = _tile_pairs(start, 2 * shape.f_chunks, shape.k_x, rows, previous)
            last_gu_pair[group] = end
        else:
            # h is written at last_gu_pair + result_lag; the executor reads it into its
            # register slice at the next edge, and the tile takes it at the one after.
            start = max(start, last_gu_pair[group] + result_lag + A_SLICE_EDGES + 1)
            end = _tile_pairs(start, shape.d_chunks, shape.k_h, rows, previous)
        ends.append(end)
    return ends[index]


# --- a workload with co-activation structure, and the placements it is run with ---

def community_workload(seed, count, d_model, experts, communities, in_width, w_width):
    """A gate matrix and ``count`` tokens whose routes have co-activation structure (the kind
    of trace Mozart's clustering exploits, seed 000 §3.2).

    The experts are split, through a seeded permutation, into ``communities`` hidden groups of
    equal size; each group has a random direction in {-1, +1}^D. Column e of W_g is 3/4 of the
    weight range along its group's direction plus uniform noise of 1/8 of it; a token picks a
    group uniformly (a balanced trace) and is 3/20 of the x range along its direction plus
    noise of 1/20. So a token's highest scores are its group's experts.

    Returns ``(wg, tokens, community)``: D x E, ``count`` x D, the group of each expert.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(experts)
    community = [0] * experts
    for position, expert in enumerate(order):
        community[int(expert)] = position % communities
    directions = rng.choice([-1, 1], size=(communities, d_model))
    w_high, x_high = (1 << (w_width - 1)) - 1, (1 << (in_width - 1)) - 1

    def clipped(values, high):
        return [int(v) for v in np.clip(np.rint(values), -high - 1, high)]

    wg_columns = [clipped(directions[community[e]] * 0.75 * w_high +
                          rng.uniform(-w_high / 8, w_high / 8, d_model), w_high)
                  for e in range(experts)]
    wg = [[wg_columns[e][d] for e in range(experts)] for d in range(d_model)]
    tokens = []
    for _ in range(count):
        group = int(rng.integers(communities))
        tokens.append(clipped(directions[group] * 0.15 * x_high +
                              rng.uniform(-x_high / 20, x_high / 20, d_model), x_high))
    return wg, tokens, community


def placements(model, tokens, leaves, switch_groups):
    """The routed experts' expert-to-leaf tables the layer is compared with: ``round_robin``
    (expert e on leaf e mod leaves) and ``clustered`` (``golden.placement.place`` on the routes
    of ``tokens``, one cluster of E / leaves experts per leaf; only when E divides by the
    leaves and the leaves by the switch groups)."""
    experts = model.routed
    tables = {"round_robin": placement.round_robin(experts, leaves)}
    if experts % leaves == 0 and leaves % switch_groups == 0:
        routes = layer(model, tokens)["experts"]
        tables["clustered"] = placement.place(routes, experts, leaves,
                                              switch_groups).expert_to_leaf
    return tables
