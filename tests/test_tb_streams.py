"""tb.streams outside a simulator: the protocol checker's rules and the pause generators."""

import random

import pytest
from amaranth.lib import data

import tb.streams as streams
from tb.streams import (BurstPauses, PeriodicPauses, ProtocolError, StreamMonitor,
                        pause_fraction, pauses)


class _Value:
    def __init__(self, bits):
        self.bits = bits

    def to_unsigned(self):
        if self.bits is None:
            raise ValueError("X")
        return self.bits

    def __str__(self):
        return "x" if self.bits is None else str(self.bits)


class _Handle:
    """A cocotb handle as the stream ends read it: ``_handle.get_signal_val_binstr()``."""

    def __init__(self, name):
        self._name, self.value = name, _Value(0)

    @property
    def _handle(self):
        return self

    def get_signal_val_binstr(self):
        return "x" if self.value.bits is None else format(self.value.bits, "b")


class _Dut:
    def __init__(self):
        for name in ("clk", "rst", "p__valid", "p__ready", "p__payload"):
            setattr(self, name, _Handle(name))


LAYOUT = data.StructLayout({"data": 8, "last": 1})


def _watch(monkeypatch, cycles):
    """Feed ``(rst, valid, ready, payload)`` per edge to a monitor; return it."""
    dut = _Dut()
    monitor = StreamMonitor(dut, "p", LAYOUT)
    for edge, (rst, valid, ready, payload) in enumerate(cycles):
        monkeypatch.setattr(streams, "edge_now", lambda edge=edge: edge)
        dut.rst.value, dut.p__valid.value = _Value(rst), _Value(valid)
        dut.p__ready.value, dut.p__payload.value = _Value(ready), _Value(payload)
        monitor._observe()
    return monitor


def test_monitor_records_transfers_at_their_edges(monkeypatch):
    monitor = _watch(monkeypatch, [(0, 1, 0, 5), (0, 1, 0, 5), (0, 1, 1, 5), (0, 0, 1, 9),
                                   (0, 1, 1, 256 + 7)])
    assert [(edge, beat.data, beat.last) for edge, beat in monitor.received] == \
        [(2, 5, 0), (4, 7, 1)]


@pytest.mark.parametrize("cycles, message", [
    ([(0, 1, 0, 5), (0, 1, 1, 6)], "payload changed while valid and not ready"),
    ([(0, 1, 0, 5), (0, 0, 1, 5)], "valid fell before the transfer"),
    ([(0, None, 1, 0)], "p__valid is x after reset"),
    ([(0, 1, None, 0)], "p__ready is x after reset"),
])
def test_monitor_rejects_protocol_violations(monkeypatch, cycles, message):
    with pytest.raises(ProtocolError, match=message):
        _watch(monkeypatch, cycles)


def test_reset_restarts_the_rules(monkeypatch):
    # A beat held when reset rises may vanish; X during reset is not checked.
    monitor = _watch(monkeypatch, [(0, 1, 0, 5), (1, None, None, 0), (0, 0, 1, 0),
                                   (0, 1, 1, 3)])
    assert [edge for edge, _ in monitor.received] == [3]


def test_burst_pauses_come_in_bursts_of_the_given_lengths():
    gen = BurstPauses(random.Random(1), 0.02, (10, 150))
    runs, current = [], 0
    for _ in range(200000):
        if gen.next():
            current += 1
        elif current:
            runs.append(current)
            current = 0
    assert runs and min(runs) >= 10 and max(runs) <= 300       # back-to-back bursts may join
    fraction = sum(runs) / 200000
    assert abs(fraction - pause_fraction(("burst", 0.02, 10, 150))) < 0.05


def test_periodic_and_random_pauses():
    periodic = PeriodicPauses(10, 3)
    assert sum(periodic.next() for _ in range(1000)) == 300
    assert pause_fraction(("periodic", 10, 3)) == 0.3
    rand = pauses(0.25, random.Random(2))
    assert abs(sum(rand.next() for _ in range(20000)) / 20000 - 0.25) < 0.02
    assert not any(pauses(0.0, random.Random(3)).next() for _ in range(100))
    with pytest.raises(ValueError):
        pauses(("sometimes", 1), random.Random(4))


def test_source_drops_its_beats_at_a_reset_and_keeps_those_queued_during_it(monkeypatch):
    """Reset-aware driver: the first reset edge drops the offered beat and the queue; beats
    queued while the reset lasts are offered after it, in order."""
    dut = _Dut()
    source = streams.StreamSource(dut, "p", LAYOUT, random.Random(1))

    def edge(index, rst, ready):
        monkeypatch.setattr(streams, "edge_now", lambda: index)
        dut.rst.value, dut.p__ready.value = _Value(rst), _Value(ready)
        source._step()
        return dut.p__valid.value

    for value in (1, 2, 3):
        source.send({"data": value})
    assert edge(0, 0, 0) == 1 and dut.p__payload.value == 1       # offered, not taken
    assert edge(1, 1, 0) == 0 and source.idle                        # reset: all dropped
    source.send({"data": 9})                                         # queued during the reset
    edge(2, 1, 0)
    assert not source.idle and dut.p__valid.value == 0
    assert edge(3, 0, 0) == 1 and dut.p__payload.value == 9
    edge(4, 0, 1)
    assert source.sent_edges == [4] and source.idle


def test_a_bench_started_again_keeps_the_running_clock(monkeypatch):
    """start_clock a second time in one test (restart_bench after a reset mid-test) keeps the
    running clock: a second GPI clock on clk shifted its phase by half a period and gave the
    design one extra edge (21 rising edges in 200 ns, seen on both simulators); a test that
    starts after cocotb ended the last one's clock gets a new one."""
    import types
    started = []

    class _Task:
        finished = False

        def done(self):
            return self.finished

    class _Clock:
        def __init__(self, signal, period, unit, impl):
            pass

        def start(self, start_high):
            started.append(_Task())
            return started[-1]

    monkeypatch.setattr(streams, "Clock", _Clock)
    monkeypatch.setattr(streams, "_clock_task", None)
    dut = types.SimpleNamespace(clk=object())
    streams.start_clock(dut)
    streams.start_clock(dut)
    assert len(started) == 1
    started[0].finished = True          # the test ended: cocotb ended its clock
    streams.start_clock(dut)
    assert len(started) == 2


def test_a_status_output_is_high_from_to_exactly():
    # busy sampled at edges 3..20: high at 6..12 only.
    samples = {"busy": {edge: int(6 <= edge <= 12) for edge in range(3, 21)}}
    streams.assert_high_from_to(samples, "busy", 6, 12)
    for first, last in ((5, 12), (7, 12), (6, 11), (6, 13)):
        with pytest.raises(AssertionError, match="busy high at edges"):
            streams.assert_high_from_to(samples, "busy", first, last)
    with pytest.raises(AssertionError, match="not sampled yet"):
        streams.assert_high_from_to(samples, "busy", 6, 19)
    samples["busy"][14] = 1                              # high again two edges after
    with pytest.raises(AssertionError):
        streams.assert_high_from_to(samples, "busy", 6, 12)


def test_an_always_ready_source_fails_on_a_beat_not_taken_at_once(monkeypatch):
    dut = _Dut()
    source = streams.StreamSource(dut, "p", LAYOUT, random.Random(1))
    source.always_ready = True

    def edge(index, rst, ready):
        monkeypatch.setattr(streams, "edge_now", lambda: index)
        dut.rst.value, dut.p__ready.value = _Value(rst), _Value(ready)
        source._step()

    source.send({"data": 1})
    source.send({"data": 2})
    edge(0, 0, 0)                                    # offered from here
    edge(1, 0, 1)                                    # taken at once
    edge(2, 1, 0)                                    # a reset may hold ready low
    source.send({"data": 3})
    edge(3, 0, 0)                                    # offered again after it
    with pytest.raises(ProtocolError, match="p__ready low at edge 4 .* always ready"):
        edge(4, 0, 0)
