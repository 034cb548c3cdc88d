"""Switching activity per tier of a two-tier 3D build, a dynamic-power proxy (`make bench`).

A block's ``test_throughput`` runs on its 3D build (Verilator, VCD trace); vcdvcd reads the
trace and every bit flip of a net under ``u_3d.u_top`` or ``u_3d.u_bottom`` is counted.
"""

import vcdvcd

from flows.sim import run_tests
from flows.threed import NoTiers

__all__ = ["count_toggles", "tier_activity"]


def count_toggles(values):
    """Bit flips along a VCD value history (``[(time, "0101"), ...]``); x/z bits count as 0."""
    def bits(text):
        try:
            return int(text, 2)
        except ValueError:
            return int("".join(c if c in "01" else "0" for c in text), 2)
    flips, previous = 0, None
    for _, text in values:
        current = bits(text)
        if previous is not None:
            flips += bin(previous ^ current).count("1")
        previous = current
    return flips


def tier_activity(block, config, testcase="test_throughput"):
    """Switching activity per tier, a dynamic-power proxy: run ``testcase`` on the 3D build
    (Verilator, VCD trace) and count the bit flips of every net under ``u_3d.u_top`` and
    ``u_3d.u_bottom`` (the clock and reset excepted; a bonded net counts on each die's side).
    Returns flips per cycle per tier and the cycles traced."""
    if block.tiers is None:
        raise NoTiers(f"block {block.name!r} has no tier partition")
    result = run_tests(block, config, "verilator", testcase=[testcase], waves=True,
                       quiet=True, three_d=True)
    trace = vcdvcd.VCDVCD(str(result.waves), store_tvs=True)
    flips = {"top": 0, "bottom": 0}
    cycles = 1
    for signal in trace.data.values():
        if any(ref.endswith((".clk", ".rst")) for ref in signal.references):
            if any(ref.endswith(".clk") for ref in signal.references):
                cycles = max(cycles, sum(1 for _, value in signal.tv if value == "1"))
            continue
        for tier in flips:
            if any(f".u_3d.u_{tier}." in ref for ref in signal.references):
                flips[tier] += count_toggles(signal.tv)
                break
    return {"cycles": cycles, "trace": str(result.waves),
            **{f"{tier}_flips_per_cycle": round(count / cycles, 2)
               for tier, count in flips.items()}}
