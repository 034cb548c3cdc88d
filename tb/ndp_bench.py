"""What the ``ndp_core`` and ``ndp_system`` testbenches share: random operands, the activation
table, x sent token by token into a model of the activation buffer, the DDR4 pacing of weight
beats, and the results drained and checked in order against the golden values."""

import math

import numpy as np
from cocotb.triggers import ClockCycles

from golden import fixed
from golden import ndp as golden
from golden.dram import Ddr4Stream
from tb.streams import StreamBench, reset_dut, wait_for

__all__ = ["NdpBenchBase", "silu_table", "dram_times"]


class NdpBenchBase(StreamBench):
    """Sources on ``cmd``, ``x``, ``lut`` and the weight ports, a sink on ``y``; ``expected``
    holds (value, last) of every result in order."""

    def __init__(self, dut, config, component, rng, weight_ports, gap=0.0, stall=0.0):
        super().__init__(dut, component, rng, ("cmd", "x", "lut", *weight_ports), ("y",),
                         gap, stall)
        self.cfg = config
        self.y = self.sinks["y"]
        self.table = [0] * (1 << config.x_width)
        self.x_buffer = []           # per token, what the activation buffer holds (pad lanes too)
        self.expected = []           # (value, last)
        self.queued_beats = 0        # x and weight pairs queued since the last drain

    # --- stimulus --------------------------------------------------------------------------
    @staticmethod
    def _limits(width, bound):
        """Signed ``width``-bit limits, narrowed to at most ``bound`` in magnitude if given."""
        low, high = fixed.signed_limits(width)
        return (low, high) if bound is None else (max(low, -bound), min(high, bound))

    def weights(self, rows, cols, bound=None):
        """Random weights, of at most ``bound`` in magnitude if given."""
        low, high = self._limits(self.cfg.w_width, bound)
        # NumPy draws, seeded from the bench's generator: a 256-column expert is 10^5 values.
        draws = np.random.default_rng(self.rng.getrandbits(64))
        return draws.integers(low, high, size=(rows, cols), endpoint=True, dtype=np.int64)

    def expert(self, inter, hidden, bound=None):
        """Random Wg, Wu (inter x hidden) and Wd (hidden x inter)."""
        return (self.weights(inter, hidden, bound), self.weights(inter, hidden, bound),
                self.weights(hidden, inter, bound))

    def vector(self, length, bound=None):
        low, high = self._limits(self.cfg.x_width, bound)
        return [self.rng.randint(low, high) for _ in range(length)]

    def pad(self, width):
        """Random values for the lanes past a row's end (they must be ignored)."""
        low, high = fixed.signed_limits(width)
        draws = np.random.default_rng(self.rng.getrandbits(64))
        buffer = []

        def value():               # drawn 4,096 at a time: the 64-lane beats pad a lot
            if not buffer:
                buffer.extend(draws.integers(low, high, 4096, endpoint=True).tolist())
            return buffer.pop()
        return value

    def shifts(self, hidden):
        """Shifts that keep g and u mostly inside the x range (some saturate)."""
        cfg = self.cfg
        acc_bits = cfg.w_width + cfg.x_width - 2 + max(hidden - 1, 0).bit_length() // 2
        base = max(acc_bits - cfg.x_width + 1, 0)
        return (base, base, cfg.x_width - 2)

    async def write_lut(self, table):
        """Write the activation table once every queued command is done (the host's rule: the
        LUT port is served between commands, so a queued command could see a partial table)."""
        await self.drain()
        for index, value in enumerate(table):
            self.sources["lut"].send({"index": index, "value": value})
        self.table = list(table)
        await wait_for(self.dut, lambda: self.sources["lut"].idle, 4 * len(table) + 100,
                       "LUT written")

    def send_x(self, xs, cols, load_x):
        """With ``load_x``, send each token's first ``cols`` elements (token by token); returns
        the x of each of the ``len(xs)`` tokens the block will use (``None`` entries: reused)."""
        if load_x:
            for token, x in enumerate(xs):
                if token == len(self.x_buffer):
                    self.x_buffer.append([])
                beats = golden.vector_beats(x[:cols], self.cfg.mults, self.pad(self.cfg.x_width))
                self.queued_beats += len(beats)
                for index, beat in enumerate(beats):
                    self.sources["x"].send({"x": beat})
                    start = index * self.cfg.mults
                    self.x_buffer[token][start:start + len(beat)] = beat
        assert len(self.x_buffer) >= len(xs) and all(
            len(self.x_buffer[t]) >= cols for t in range(len(xs))), \
            "bench error: reusing an x that was never loaded"
        return [self.x_buffer[t][:cols] for t in range(len(xs))]

    def send_weights(self, port, beats, not_before=None, tokens=1):
        """Queue weight beats on ``port``; ``not_before[j]``: the edge after which beat j may be
        offered (a DRAM delivering it)."""
        self.queued_beats += len(beats) * tokens      # each beat is held for every token
        for index, beat in enumerate(beats):
            self.sources[port].send({"w": beat}, 0 if not_before is None else not_before[index])

    def expect(self, values):
        self.expected += [(int(v), int(i == len(values) - 1)) for i, v in enumerate(values)]

    async def reset_mid_job(self):
        """Reset the block in the middle of its work, drivers stopped around it: afterwards
        nothing is busy or offered, and what was expected or received before is forgotten."""
        self.stop()
        await reset_dut(self.dut)
        assert not self.dut.busy.value and not self.dut.y__valid.value, "state survived the reset"
        self.y.received.clear()
        self.expected.clear()
        self.start()

    # --- checks ----------------------------------------------------------------------------
    async def drain(self, budget=None):
        # A deadlock detector: generous for the slowest gap/stall profile.
        budget = budget or 60 * len(self.expected) + 20 * self.queued_beats + 6000
        self.queued_beats = 0
        await wait_for(self.dut, lambda: len(self.y.received) == len(self.expected), budget,
                       "every result out")
        await wait_for(self.dut, lambda: not self.dut.busy.value, 200, "idle")
        await ClockCycles(self.dut.clk, 5)

    def results(self):
        return [(int(beat.data), int(beat.last)) for _, beat in self.y.received]

    def check(self):
        self.check_output("y", self.expected, ("data", "last"))
        assert not self.dut.error.value, "error flag set by valid commands"


def silu_table(cfg):
    frac = max(cfg.x_width - 4, 0)
    return golden.activation_lut("silu", cfg.x_width, frac, frac)


def dram_times(cfg, beats, origin):
    """The DDR4-3200 stream of ``beats`` weight beats and the edge after which each may be
    offered, DRAM clock 0 at edge ``origin`` (a beat offered after edge e is taken at e + 1
    at the earliest)."""
    beat_bytes = math.ceil(cfg.mults * cfg.w_width / 8)
    stream = Ddr4Stream(beat_bytes * beats)
    ready = stream.beat_ready_cycles(beat_bytes, beats)
    return stream, [origin + r - 1 for r in ready]
