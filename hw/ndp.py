"""NDP-DIMM core (``ndp_core``): the near-data GEMV / expert-FFN engine on each DIMM.

Source: seed 002 §III-A (central-buffer NDP-DIMM: a core on each DIMM computes on locally stored
expert weights), §III-B/Fig. 4 (tensor parallelism: Wg and Wu split by columns, Wd by rows), Table
I (64 multipliers per DIMM; 64 int8 weights per cycle at 1.6 GHz is the DIMM's internal 102.4
GB/s). The arithmetic, the stream orders and the cycle model are in :mod:`golden.ndp`.

Multi-token commands (seed 002's prefill): a command names S tokens (1..``max_tokens``) whose
activations sit in the buffer side by side; each weight beat is taken once and held for S cycles,
meeting token 0's x (or h) in the first and token S-1's in the last, so the weights of a command
are read from DRAM once however many tokens share them and the M multipliers stay busy.

Datapath, one (weight beat, token) pair per cycle::

    weight beat --> [w reg] --> [w, x/h operands] --> M multipliers --> [products] --> adder tree
                    x/h buffer read (same cycle)                        (one register per level)
        --> accumulator --> [row result] --+--> output FIFO --> y     (gemv, Wd rows)
                                           +--> shift --> [g, u] --> round, saturate --+
            Wg rows: [LUT[g]] --> [a];  Wu rows: [u] --> [a, u] --> x --> [p] --> shift
            --> [p >> shift_h] --> round, saturate --> [h] --> h buffer

Control: a command is taken only when the core is idle; with ``load_x`` it first takes
``S * ceil(cols/M)`` x beats (token by token), then it issues one (beat, token) pair per cycle;
the weight port is ready at the pair of token 0, except while ``ffn_slice`` waits for its last h
value (:func:`golden.ndp.gate_drain`) and while a row-ending pair would have no output FIFO slot
(slots are reserved when the pair issues, so the pipeline itself never stalls). The LUT port is
ready only between commands, so a table never changes under a command.

Misuse: a command with ``rows``, ``cols`` or ``tokens`` of 0, ``cols`` > ``max_cols``, ``tokens``
> ``max_tokens``, or an ``ffn_slice`` with ``rows`` > ``max_inter`` is dropped (no output) and
sets the sticky ``error`` output.

The contract, timing and figures: docs/blocks/ndp.md.
"""

import dataclasses
import math

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from golden import ndp as golden
from hw.params import ConfiguredComponent, int_param, like_param, param_error, validate
from hw.pipeline import requant_round, requant_shift, requant_shift_clamp
from hw.registry import Block, register

__all__ = ["NdpConfig", "NdpCore", "command_layout", "token_bits", "SHIFT_BITS", "COUNT_BITS",
           "NdpSystemConfig", "NdpSystem", "system_command_layout"]

SHIFT_BITS = 5          # requantization shifts 0..31
COUNT_BITS = 16         # rows and cols fields of a command


@dataclasses.dataclass(frozen=True)
class NdpConfig:
    """Parameters of ``ndp_core``.

    Parameters
    ----------
    mults : int
        M, multipliers = weights per beat (Table I: 64).
    w_width, x_width : int
        Bits of a signed weight / activation (also of h and of the LUT index and entries).
    acc_width : int
        Bits of a signed accumulator and of every output (sums wrap).
    max_cols : int
        Activation buffer size, elements (the longest GEMV row, the hidden size D of a slice).
    max_inter : int
        h buffer size, elements (the largest intermediate slice I_s).
    out_depth : int
        Results that may be reserved for ``y`` at once (output slots; one row per cycle needs
        the result latency + 1). The output FIFO has ``out_depth + 1`` entries.
    max_tokens : int
        Tokens one command may name (S); the x and h buffers hold ``max_tokens`` vectors each.
    """
    mults: int = int_param(64, 1, 128, "M, multipliers (weights per beat)")
    w_width: int = int_param(8, 2, 16, "bits of a signed weight")
    x_width: int = int_param(8, 2, 10, "bits of a signed activation, h and LUT entry")
    acc_width: int = int_param(32, 8, 48, "bits of the wrapping accumulator and outputs")
    max_cols: int = int_param(1024, 1, 16384, "activation buffer, elements")
    max_inter: int = int_param(256, 1, 16384, "h buffer (intermediate slice), elements")
    out_depth: int = int_param(16, 2, 256, "results held for y (output slots)")
    max_tokens: int = int_param(8, 1, 64, "tokens one command may name (S)")

    def __post_init__(self):
        validate(self)

    @property
    def x_words(self):
        return math.ceil(self.max_cols / self.mults)

    @property
    def h_words(self):
        return math.ceil(self.max_inter / self.mults)


def token_bits(config):
    """Bits of a command's ``tokens`` field: S in 1..max_tokens (0 is a misuse)."""
    return bits_for(config.max_tokens)


def command_layout(config):
    """``op`` (0 gemv, 1 ffn_slice), ``load_x``, ``rows``, ``cols``, the three shifts, ``tokens``.

    gemv: ``rows`` x ``cols`` weights, S x ``cols`` activations, ``rows`` x S outputs.
    ffn_slice: ``rows`` = I_s (this DIMM's intermediate rows), ``cols`` = D (hidden size):
    2*I_s rows of D weights, then D rows of I_s weights; D x S outputs.
    """
    return data.StructLayout({
        "op": 1, "load_x": 1, "rows": COUNT_BITS, "cols": COUNT_BITS,
        "shift_g": SHIFT_BITS, "shift_u": SHIFT_BITS, "shift_h": SHIFT_BITS,
        "tokens": token_bits(config)})


def stream_signatures(config):
    """The ``x``, ``w``, ``lut`` and ``y`` members of a core (``ndp_system`` has the same)."""
    M = config.mults
    return {
        "x": In(stream.Signature(data.StructLayout(
            {"x": data.ArrayLayout(signed(config.x_width), M)}))),
        "w": In(stream.Signature(data.StructLayout(
            {"w": data.ArrayLayout(signed(config.w_width), M)}))),
        "lut": In(stream.Signature(data.StructLayout(
            {"index": unsigned(config.x_width), "value": signed(config.x_width)}))),
        "y": Out(stream.Signature(data.StructLayout(
            {"data": signed(config.acc_width), "last": 1}))),
    }


class NdpCore(ConfiguredComponent):
    """``ndp_core``: command, x, weight and LUT streams in; the result stream ``y`` out.

    Members
    -------
    cmd : In(stream.Signature(command_layout()))
    x : In(stream.Signature({x: M signed x_width}))
    w : In(stream.Signature({w: M signed w_width}))
    lut : In(stream.Signature({index, value}))
        Ready only between commands.
    y : Out(stream.Signature({data: signed acc_width, last}))
        ``last`` on a command's final output.
    busy : Out(1)
    error : Out(1)
        Sticky until reset.
    """

    def __init__(self, config):
        super().__init__(config, {
            "cmd": In(stream.Signature(command_layout(config))),
            **stream_signatures(config),
            "busy": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        M, xw, T = cfg.mults, cfg.x_width, cfg.max_tokens
        m = Module()

        # Buffers: one M-lane word per beat, so lane l of a weight beat meets lane l of x/h.
        # Token t's vector starts at word t * x_words (t * h_words).
        m.submodules.x_buffer = x_buffer = Memory(
            shape=unsigned(M * xw), depth=T * cfg.x_words, init=[])
        m.submodules.h_buffer = h_buffer = Memory(
            shape=unsigned(M * xw), depth=T * cfg.h_words, init=[])
        m.submodules.lut_table = lut_table = Memory(shape=signed(xw), depth=1 << xw, init=[])
        x_write, x_read = x_buffer.write_port(), x_buffer.read_port()
        h_write, h_read = h_buffer.write_port(granularity=xw), h_buffer.read_port()
        lut_write, lut_read = lut_table.write_port(), lut_table.read_port()

        # Latched command.
        op = Signal(1)
        rows = Signal(COUNT_BITS)
        cols = Signal(COUNT_BITS)
        tokens = Signal(range(T + 1))
        shift_g, shift_u, shift_h = (Signal(SHIFT_BITS, name=n)
                                     for n in ("shift_g", "shift_u", "shift_h"))

        # Weight-phase counters.
        lane_bits = bits_for(M)
        row = Signal(COUNT_BITS + 1)
        row_count = Signal(COUNT_BITS + 1)     # rows in this phase
        row_length = Signal(COUNT_BITS)        # weights per row in this phase
        chunk = Signal(range(max(cfg.x_words, cfg.h_words, 1) + 1))
        left = Signal(COUNT_BITS)              # weights of the row from this chunk on
        use_h = Signal()                       # this phase reads the h buffer (Wd rows)
        # The token of the next (beat, token) pair and its vectors' first words.
        token = Signal(range(T))
        x_base = Signal(range(T * cfg.x_words + 1))
        h_base = Signal(range(T * cfg.h_words + 1))
        last_token = Signal()
        m.d.comb += last_token.eq(token == tokens - 1)
        x_count = Signal(range(cfg.x_words + 1))
        error = Signal()
        m.d.comb += self.error.eq(error)

        # Output FIFO slots reserved by issued row-ending pairs (results in flight or queued):
        # at most out_depth. The FIFO has one entry more: SyncFIFOBuffered refuses a write
        # while its inner memory (depth - 1 words) is full, even at the edge that moves a word
        # to its output register, so with exactly out_depth entries a reserved result could
        # arrive to a full inner memory and be lost (out_depth = 2: two results on
        # consecutive edges).
        m.submodules.out_fifo = out_fifo = SyncFIFOBuffered(
            width=cfg.acc_width + 1, depth=cfg.out_depth + 1)
        reserved = Signal(range(cfg.out_depth + 1))

        # `left <= M` as a register beside `left` (clock rate: the compare led into the weight
        # port's ready and from it into the enable of every w_reg bit); `set_left` sets both.
        row_end = Signal(init=1)

        def set_left(value):
            return [left.eq(value), row_end.eq(value <= M)]
        last_row = Signal()
        m.d.comb += last_row.eq(row == row_count - 1)
        lanes_now = Signal(lane_bits)
        m.d.comb += lanes_now.eq(Mux(row_end, left, M))

        # Pipeline stage 1: weight register + buffer read data.
        meta_layout = data.StructLayout({
            "valid": 1, "first": 1, "row_end": 1, "kind": 2, "final": 1, "use_h": 1,
            "lanes": lane_bits, "token": range(T), "last_token": 1})
        KIND_Y, KIND_G, KIND_U = 0, 1, 2
        issue = Signal()        # a (beat, token) pair enters the pipeline
        take = Signal()         # ... and its beat is taken from the weight port (token 0)
        in_meta = Signal(meta_layout)
        w_reg = Signal(data.ArrayLayout(signed(cfg.w_width), M))
        meta1 = Signal(meta_layout)
        m.d.comb += in_meta.valid.eq(issue)
        m.d.sync += meta1.eq(in_meta)
        with m.If(take):
            m.d.sync += w_reg.eq(self.w.payload.w)
        m.d.comb += [x_read.addr.eq(x_base + chunk), h_read.addr.eq(h_base + chunk)]
        # Stage 2: the multipliers' operands registered, lanes past the row end zeroed (clock
        # rate: the x/h select and the lane mask fan out to every lane, and each lane's DSP
        # then starts from registers).
        operand = Signal(M * xw)
        m.d.sync += operand.eq(Mux(meta1.use_h, h_read.data, x_read.data))
        w_operand = Signal(data.ArrayLayout(signed(cfg.w_width), M))
        for lane in range(M):
            m.d.sync += w_operand[lane].eq(Mux(lane < meta1.lanes, w_reg[lane], 0))
        meta_operand = Signal(meta_layout, name="meta_operand")
        m.d.sync += meta_operand.eq(meta1)

        # Stage 3: products (a masked lane's weight is 0, so its product is).
        product_width = cfg.w_width + xw
        # No reset: meta2's valid flag, reset, says which products count (flows/dsp_pack.py).
        products = [Signal(signed(product_width), name=f"product{l}", reset_less=True)
                    for l in range(M)]
        for lane, product in enumerate(products):
            x_lane = operand[lane * xw:(lane + 1) * xw].as_signed()
            m.d.sync += product.eq(w_operand[lane] * x_lane)
        meta = Signal(meta_layout, name="meta2")
        m.d.sync += meta.eq(meta_operand)
        metas = [meta1, meta_operand, meta]

        # Adder tree, one register per level.
        level, width, depth = products, product_width, 0
        while len(level) > 1:
            width += 1
            depth += 1
            nxt = []
            for i in range(0, len(level), 2):
                s = Signal(signed(width), name=f"sum{depth}_{i // 2}")
                m.d.sync += s.eq(level[i] + level[i + 1] if i + 1 < len(level) else level[i])
                nxt.append(s)
            level = nxt
            delayed = Signal(meta_layout, name=f"meta_sum{depth}")
            m.d.sync += delayed.eq(meta)
            meta = delayed
            metas.append(meta)
        tree_sum = level[0]

        # One accumulator per token and the row result. The token's accumulator is picked a
        # cycle ahead into `held` (clock rate: the T-way pick and the add in different
        # cycles), from the accumulators as this edge leaves them: the total being written
        # when the next beat is of the same token.
        accs = Array(Signal(signed(cfg.acc_width), name=f"acc{t}") for t in range(T))
        row_value = Signal(signed(cfg.acc_width))
        row_meta = Signal(meta_layout)
        total = Signal(signed(cfg.acc_width))
        held = Signal(signed(cfg.acc_width))
        upcoming = metas[-2]                 # the beat `meta` takes at the next edge
        m.d.comb += total.eq(Mux(meta.first, tree_sum, held + tree_sum))
        m.d.sync += held.eq(Mux(meta.valid & (meta.token == upcoming.token), total,
                                accs[upcoming.token]))
        with m.If(meta.valid):
            m.d.sync += accs[meta.token].eq(total)
        m.d.sync += [row_value.eq(total), row_meta.eq(meta),
                     row_meta.valid.eq(meta.valid & meta.row_end)]

        # Outputs: gemv rows and Wd rows go to the FIFO.
        m.d.comb += [
            out_fifo.w_data.eq(Cat(row_value, row_meta.final)),
            out_fifo.w_en.eq(row_meta.valid & (row_meta.kind == KIND_Y)),
            self.y.valid.eq(out_fifo.r_rdy),
            self.y.payload.eq(out_fifo.r_data),
            out_fifo.r_en.eq(self.y.ready),
        ]

        # Gate: a = LUT[requant(g)] at a Wg row (one per token), p = a * requant(u) at the next
        # Wu row, written to token t's h vector. Six registers, one per step (clock rate:
        # a run-time shift, a multiply and another run-time shift do not fit in one cycle):
        # the shifted row values, the table look-up, the multiplier's operands, the product p,
        # the shifted p, the h code.
        # The shifted values are registered already clamped to xw + 2 bits (requant_clamp:
        # the look-up's address is then only the rounding's increment away).
        g_shifted = Signal(signed(xw + 2))
        u_shifted = Signal(signed(xw + 2))
        code_valid = Signal()
        code_kind = Signal(2)
        code_token = Signal(range(T))
        code_last_token = Signal()
        m.d.sync += [g_shifted.eq(requant_shift_clamp(m, row_value, shift_g, xw, "g_requant")),
                     u_shifted.eq(requant_shift_clamp(m, row_value, shift_u, xw, "u_requant")),
                     code_valid.eq(row_meta.valid & (row_meta.kind != KIND_Y)),
                     code_kind.eq(row_meta.kind), code_token.eq(row_meta.token),
                     code_last_token.eq(row_meta.last_token)]
        g_code = requant_round(m, g_shifted, xw, "g_code")
        u_code = requant_round(m, u_shifted, xw, "u_code")
        # The table is read synchronously (block RAM where the target has it): the look-up
        # stage holds the row's u code, kind and token while the entry comes out.
        m.d.comb += lut_read.addr.eq(g_code.as_unsigned())
        look_valid = Signal()
        look_kind = Signal(2)
        look_token = Signal(range(T))
        look_last_token = Signal()
        look_u = Signal(signed(xw))
        m.d.sync += [look_valid.eq(code_valid), look_kind.eq(code_kind),
                     look_token.eq(code_token), look_last_token.eq(code_last_token),
                     look_u.eq(u_code)]
        gates = Array(Signal(signed(xw), name=f"gate{t}") for t in range(T))
        with m.If(look_valid & (look_kind == KIND_G)):
            m.d.sync += gates[look_token].eq(lut_read.data)
        # The multiplier's operands registered (the token's gate picked from T, then the DSP).
        # gates[t] was written at a Wg row of token t, at least one edge before its Wu row.
        a_operand = Signal(signed(xw))
        u_operand = Signal(signed(xw))
        operand_valid = Signal()
        operand_last_token = Signal()
        u_row = look_valid & (look_kind == KIND_U)
        m.d.sync += [a_operand.eq(gates[look_token]), u_operand.eq(look_u),
                     operand_valid.eq(u_row), operand_last_token.eq(look_last_token)]
        p_reg = Signal(signed(2 * xw), reset_less=True)     # p_valid says when it counts
        p_valid = Signal()
        p_last_token = Signal()
        m.d.sync += [p_reg.eq(a_operand * u_operand), p_valid.eq(operand_valid),
                     p_last_token.eq(operand_last_token)]
        # h = requant(p, shift_h) in two registers (the shift, then the rounding): the h code
        # fans out to every lane's buffer write.
        h_shifted = Signal(signed(2 * xw + 1))
        h_shifted_valid = Signal()
        h_shifted_last_token = Signal()
        m.d.sync += [h_shifted.eq(requant_shift(m, p_reg, shift_h, "h_requant")),
                     h_shifted_valid.eq(p_valid), h_shifted_last_token.eq(p_last_token)]
        h_code = Signal(signed(xw))
        h_valid = Signal()
        h_last_token = Signal()
        m.d.sync += [h_code.eq(requant_round(m, h_shifted, xw, "h_code_rounded")),
                     h_valid.eq(h_shifted_valid), h_last_token.eq(h_shifted_last_token)]
        h_lane = Signal(range(M))
        h_word = Signal(range(cfg.h_words + 1))
        h_write_base = Signal(range(T * cfg.h_words + 1))    # the token's first h word
        m.d.comb += [h_write.addr.eq(h_write_base + h_word),
                     h_write.data.eq(h_code.as_unsigned().replicate(M)),
                     h_write.en.eq(Mux(h_valid, (Const(1, M) << h_lane)[:M], 0))]
        with m.If(h_valid):
            m.d.sync += h_write_base.eq(Mux(h_last_token, 0, h_write_base + cfg.h_words))
            with m.If(h_last_token):
                with m.If(h_lane == M - 1):
                    m.d.sync += [h_lane.eq(0), h_word.eq(h_word + 1)]
                with m.Else():
                    m.d.sync += h_lane.eq(h_lane + 1)

        # Pairs still on their way to the h code register; that register is left out because
        # the h write it makes lands before a read issued in the next cycle.
        before_gate = Signal()
        m.d.comb += before_gate.eq(
            Cat(*(x.valid for x in metas), row_meta.valid, code_valid, look_valid,
                operand_valid, p_valid, h_shifted_valid).any())

        # Output slot accounting.
        reserve = Signal()
        release = Signal()
        m.d.comb += release.eq(self.y.valid & self.y.ready)
        m.d.sync += reserved.eq(reserved + reserve - release)

        # LUT writes between commands.
        m.d.comb += [lut_write.addr.eq(self.lut.payload.index),
                     lut_write.data.eq(self.lut.payload.value)]

        cmd = self.cmd.payload
        ffn = Signal()
        m.d.comb += ffn.eq(op == golden.OP_FFN_SLICE)

        def start_phase(n_rows, length, from_h):
            return [row.eq(0), row_count.eq(n_rows), row_length.eq(length), *set_left(length),
                    chunk.eq(0), use_h.eq(from_h), token.eq(0), x_base.eq(0), h_base.eq(0)]

        # busy: a command is running or a result is still on its way out.
        idle = Signal()
        m.d.comb += self.busy.eq(~idle | before_gate | h_valid | (reserved != 0))

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.cmd.ready.eq(1), self.lut.ready.eq(1), idle.eq(1),
                             lut_write.en.eq(self.lut.valid)]
                bad = Signal()
                m.d.comb += bad.eq((cmd.rows == 0) | (cmd.cols == 0) | (cmd.cols > cfg.max_cols) |
                                   (cmd.tokens == 0) | (cmd.tokens > T) |
                                   ((cmd.op == golden.OP_FFN_SLICE) & (cmd.rows > cfg.max_inter)))
                with m.If(self.cmd.valid):
                    with m.If(bad):
                        m.d.sync += error.eq(1)
                    with m.Else():
                        m.d.sync += [op.eq(cmd.op), rows.eq(cmd.rows), cols.eq(cmd.cols),
                                     tokens.eq(cmd.tokens),
                                     shift_g.eq(cmd.shift_g), shift_u.eq(cmd.shift_u),
                                     shift_h.eq(cmd.shift_h), x_count.eq(0),
                                     h_lane.eq(0), h_word.eq(0), h_write_base.eq(0)]
                        two_rows = cmd.rows << 1
                        m.d.sync += start_phase(
                            Mux(cmd.op == golden.OP_FFN_SLICE, two_rows, cmd.rows), cmd.cols, 0)
                        with m.If(cmd.load_x):
                            m.next = "LOAD_X"
                        with m.Else():
                            m.next = "WEIGHTS"
            with m.State("LOAD_X"):
                # Token by token, ceil(cols/M) beats each, into the token's words.
                m.d.comb += [self.x.ready.eq(1),
                             x_write.addr.eq(x_base + x_count),
                             x_write.data.eq(self.x.payload.x.as_value()),
                             x_write.en.eq(self.x.valid)]
                with m.If(self.x.valid):
                    m.d.sync += x_count.eq(x_count + 1)
                    with m.If((x_count + 1) * M >= cols):
                        m.d.sync += [x_count.eq(0), token.eq(token + 1),
                                     x_base.eq(x_base + cfg.x_words)]
                        with m.If(last_token):
                            m.d.sync += [token.eq(0), x_base.eq(0)]
                            m.next = "WEIGHTS"
            with m.State("WEIGHTS"):
                # Wg/Wu rows of ffn_slice produce no output; gemv and Wd rows need a slot per
                # token. A beat is taken at its token-0 pair and held for the other tokens.
                gate_phase = ffn & ~use_h
                needs_slot = row_end & ~gate_phase
                slot_free = ~needs_slot | (reserved < cfg.out_depth)
                first_token = token == 0
                m.d.comb += [
                    self.w.ready.eq(first_token & slot_free),
                    take.eq(self.w.valid & self.w.ready),
                    issue.eq(take | (~first_token & slot_free)),
                    reserve.eq(issue & needs_slot),
                    in_meta.first.eq(chunk == 0),
                    in_meta.row_end.eq(row_end),
                    in_meta.kind.eq(Mux(gate_phase, Mux(row[0], KIND_U, KIND_G), KIND_Y)),
                    in_meta.final.eq(row_end & last_row & last_token),
                    in_meta.use_h.eq(use_h),
                    in_meta.lanes.eq(lanes_now),
                    in_meta.token.eq(token),
                    in_meta.last_token.eq(last_token),
                ]
                with m.If(issue & ~last_token):
                    m.d.sync += [token.eq(token + 1), x_base.eq(x_base + cfg.x_words),
                                 h_base.eq(h_base + cfg.h_words)]
                with m.If(issue & last_token):
                    m.d.sync += [token.eq(0), x_base.eq(0), h_base.eq(0)]
                    with m.If(row_end):
                        m.d.sync += [row.eq(row + 1), chunk.eq(0), *set_left(row_length)]
                        with m.If(last_row):
                            with m.If(gate_phase):
                                m.next = "DRAIN"
                            with m.Else():
                                m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [chunk.eq(chunk + 1), *set_left(left - M)]
            with m.State("DRAIN"):
                # The first Wd beat reads h: wait until the last h value is written.
                with m.If(~before_gate):
                    m.d.sync += start_phase(cols, rows, 1)
                    m.next = "WEIGHTS"
        return m


register(Block(
    name="ndp_core", family="ndp", config=NdpConfig, build=NdpCore,
    figures=lambda cfg: {"result_latency_cycles": golden.result_latency(cfg.mults),
                         "gate_drain_cycles": golden.gate_drain(cfg.mults),
                         "macs_per_cycle": cfg.mults},
    summary="NDP-DIMM core: int GEMV and tensor-parallel expert-FFN slices with LUT activation",
    demo_configs=({"max_cols": 256, "max_inter": 128},),
    area_unit="multiplier", operation="MAC", area_units=lambda cfg: cfg.mults,
    legend=("MAC utilization (useful MACs / M per cycle) of a gemv with an ideal weight stream "
            "and fed by the DDR4-3200 model; a 4-DIMM tensor-parallel Qwen3 expert scaled to "
            "the buffers (slice cycles, partial sums checked against the whole expert); one "
            "DIMM's slice (N = 4) of each Table II expert, scaled, in cycles"),
))



# --------------------------------------------------------------------------------------------
# ndp_system: N ndp_core DIMMs, one expert tensor-parallel across them, partial sums reduced
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NdpSystemConfig:
    """Parameters of ``ndp_system``: ``dimms`` N and the parameters of each DIMM's ``ndp_core``
    (``max_inter`` is per DIMM: an expert of I intermediate rows needs ceil(I/N) <= max_inter).
    """
    dimms: int = int_param(4, 1, 8, "N, NDP-DIMMs the expert is split over")
    mults: int = like_param(NdpConfig, "mults")
    w_width: int = like_param(NdpConfig, "w_width")
    x_width: int = like_param(NdpConfig, "x_width")
    acc_width: int = like_param(NdpConfig, "acc_width")
    max_cols: int = like_param(NdpConfig, "max_cols", 256)
    max_inter: int = like_param(NdpConfig, "max_inter", 64)
    out_depth: int = like_param(NdpConfig, "out_depth")
    max_tokens: int = like_param(NdpConfig, "max_tokens")

    def __post_init__(self):
        validate(self)

    def core_config(self):
        """Every DIMM's ``ndp_core`` configuration: the fields the two share."""
        return NdpConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(NdpConfig)})


def system_command_layout(config):
    """An expert command: ``load_x``, ``rows`` = I (the whole expert's intermediate rows),
    ``cols`` = D, the three shifts, ``tokens`` = S. DIMM d runs ffn_slice over its
    ``golden.ndp.split_sizes(I, N)[d]`` rows."""
    return data.StructLayout({
        "load_x": 1, "rows": COUNT_BITS, "cols": COUNT_BITS,
        "shift_g": SHIFT_BITS, "shift_u": SHIFT_BITS, "shift_h": SHIFT_BITS,
        "tokens": token_bits(config)})


class NdpSystem(ConfiguredComponent):
    """``ndp_system``: one host port over N ``ndp_core`` DIMMs running one expert tensor-parallel
    (seed 002 Fig. 4: Wg/Wu rows and the matching Wd columns split over the DIMMs), the DIMMs'
    partial outputs summed by a reduction tree at the host port.

    Members
    -------
    cmd : In(stream.Signature(system_command_layout()))
        Taken when every DIMM is idle, by all of them at the same edge.
    x, lut : In(stream)
        Broadcast: a beat is taken by every DIMM at the same edge (each holds its own copy).
    w : In(stream).array(N)
        DIMM d's weight stream from its own DRAM: its slice in ``ndp_core``'s ffn_slice order.
    y : Out(stream.Signature({data: signed acc_width, last}))
        The sum over the DIMMs of their partial outputs (wrapped to acc_width), row by row and
        token by token; ``last`` on a command's final result.
    busy, error : Out(1)
    """

    def __init__(self, config):
        ports = stream_signatures(config.core_config())
        super().__init__(config, {
            "cmd": In(stream.Signature(system_command_layout(config))),
            "x": ports["x"], "w": ports["w"].array(config.dimms), "lut": ports["lut"],
            "y": ports["y"], "busy": Out(1), "error": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        N = cfg.dimms
        m = Module()
        cores = [NdpCore(cfg.core_config()) for _ in range(N)]
        for d, core in enumerate(cores):
            m.submodules[f"dimm{d}"] = core
            wiring.connect(m, wiring.flipped(self.w[d]), core.w)

        # Command: checked here, so a DIMM never sees a bad slice; all DIMMs take it together.
        cmd = self.cmd.payload
        base = Signal(COUNT_BITS)
        extra = Signal(range(N))
        m.d.comb += [base.eq(cmd.rows // N), extra.eq(cmd.rows % N)]
        per_dimm = Signal(COUNT_BITS + 1)               # the largest slice, ceil(I/N)
        m.d.comb += per_dimm.eq(base + (extra != 0))
        bad = Signal()
        m.d.comb += bad.eq((cmd.rows < N) | (per_dimm > cfg.max_inter) | (cmd.cols == 0) |
                           (cmd.cols > cfg.max_cols) | (cmd.tokens == 0) |
                           (cmd.tokens > cfg.max_tokens))
        all_idle = Cat(*(core.cmd.ready for core in cores)).all()
        m.d.comb += self.cmd.ready.eq(all_idle)
        error = Signal()
        with m.If(self.cmd.valid & all_idle & bad):
            m.d.sync += error.eq(1)
        for d, core in enumerate(cores):
            m.d.comb += [
                core.cmd.valid.eq(self.cmd.valid & all_idle & ~bad),
                core.cmd.payload.op.eq(golden.OP_FFN_SLICE),
                core.cmd.payload.load_x.eq(cmd.load_x),
                # DIMM d takes one of the I mod N extra rows when d < I mod N (never the last).
                core.cmd.payload.rows.eq(base + (d < extra if d < N - 1 else 0)),
                core.cmd.payload.cols.eq(cmd.cols),
                core.cmd.payload.shift_g.eq(cmd.shift_g),
                core.cmd.payload.shift_u.eq(cmd.shift_u),
                core.cmd.payload.shift_h.eq(cmd.shift_h),
                core.cmd.payload.tokens.eq(cmd.tokens),
            ]

        # Broadcast ports: a beat goes to every DIMM at the edge all of them are ready.
        for name in ("x", "lut"):
            port = getattr(self, name)
            all_ready = Cat(*(getattr(core, name).ready for core in cores)).all()
            m.d.comb += port.ready.eq(all_ready)
            for core in cores:
                m.d.comb += [getattr(core, name).valid.eq(port.valid & all_ready),
                             getattr(core, name).payload.eq(port.payload)]

        # Reduction: result k of every DIMM joined and summed (wrapping), one output register.
        all_valid = Cat(*(core.y.valid for core in cores)).all()
        out_valid = Signal()
        take = Signal()
        m.d.comb += take.eq(all_valid & (~out_valid | self.y.ready))
        total = sum((core.y.payload.data for core in cores[1:]), cores[0].y.payload.data)
        for core in cores:
            m.d.comb += core.y.ready.eq(take)
        with m.If(take):
            m.d.sync += [out_valid.eq(1), self.y.payload.data.eq(total[:cfg.acc_width]),
                         self.y.payload.last.eq(cores[0].y.payload.last)]
        with m.Elif(self.y.ready):
            m.d.sync += out_valid.eq(0)
        m.d.comb += [self.y.valid.eq(out_valid),
                     self.busy.eq(Cat(*(core.busy for core in cores)).any() | out_valid),
                     self.error.eq(error | Cat(*(core.error for core in cores)).any())]
        return m


register(Block(
    name="ndp_system", family="ndp", config=NdpSystemConfig, build=NdpSystem, tb="ndp_system",
    figures=lambda cfg: {"result_latency_cycles": golden.result_latency(cfg.mults) + 1,
                         "macs_per_cycle": cfg.dimms * cfg.mults},
    summary="N NDP-DIMMs running one expert tensor-parallel, partial sums reduced in hardware",
    demo_configs=({},),
    area_unit="DIMM", operation="MAC", area_units=lambda cfg: cfg.dimms,
    legend=("cycles of one expert over N DIMMs (S tokens) against the cycle model, MAC "
            "utilization of the N x M multipliers"),
))
