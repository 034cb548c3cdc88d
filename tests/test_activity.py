"""Switching activity per operation (flows/activity.py): the VCD reader on a hand-made trace,
and the figures of two real Verilator traces."""

import pytest

from flows.activity import OWN_NETS, activity, part_flips, read_trace
from hw.registry import all_blocks, get_block

# A top ``dut`` with a clock, a reset, a 3-bit net, a struct-typed net with one field view, a
# submodule ``sub`` whose port shares the parent's code, and cocotb's $rootio copy of the ports.
VCD = """$timescale 1ps $end
 $scope module $rootio $end
  $var wire 1 ! clk $end
  $var wire 3 # n [2:0] $end
 $upscope $end
 $scope module dut $end
  $var wire 1 ! clk $end
  $var wire 1 " rst $end
  $var wire 3 # n [2:0] $end
  $var wire 4 $ row [3:0] $end
  $var wire 2 % row.data [1:0] $end
  $scope module sub $end
   $var wire 1 ! clk $end
   $var wire 3 # in [2:0] $end
   $var wire 2 & state [1:0] $end
  $upscope $end
 $upscope $end
$enddefinitions $end
#0
$dumpvars
0!
1"
bx #
b0000 $
b00 %
b00 &
$end
#1
1!
0"
b101 #
b0011 $
b11 %
#2
0!
#3
1!
b010 #
b01 &
#4
0!
#5
1!
bz1z #
b10 &
"""


def test_reader_counts_each_bit_flip_once_per_net(tmp_path):
    path = tmp_path / "t.vcd"
    path.write_text(VCD)
    trace = read_trace(path)
    assert trace.top == "dut" and trace.cycles == 3
    # n: x00 -> 101 (2) -> 010 (3) -> 010 (z reads 0: 0) ; row 0000 -> 0011 (2);
    # state 00 -> 01 -> 10 (1 + 2); row.data is a view of row: not counted.
    parts = part_flips(trace, ("dut",))
    assert parts == {OWN_NETS: 5 + 2, "sub": 3}
    assert trace.flips[b"%"] == 2 and b"%" in trace.views
    assert part_flips(trace, ("dut", "sub")) == {OWN_NETS: 5 + 3}


def test_every_block_names_its_operation():
    assert all(block.operation != "operation" for block in all_blocks())


def test_wider_operands_flip_more_bits_per_mac():
    """A real trace: the 2 x 2 array's test_throughput does 256 MACs (32 jobs of K = 2); with
    random 16-bit operands more bits flip per MAC than with 4-bit ones."""
    block = get_block("systolic")
    narrow, wide = (activity(block, block.config(rows=2, cols=2, in_width=width))
                    for width in (4, 16))
    for report in (narrow, wide):
        assert report["operation"] == "MAC" and report["operations"] == 256
        assert report["cycles"] > 64
        assert sum(report["parts_flips_per_operation"].values()) == \
            pytest.approx(report["flips_per_operation"], abs=0.05)
        assert set(report["parts_flips_per_operation"]) == {OWN_NETS, "out_fifo"}
    assert wide["flips_per_operation"] > 1.1 * narrow["flips_per_operation"]


def test_tier_activity_of_the_3d_build():
    block = get_block("spiking_expert")
    report = activity(block, block.config(rows=3, cols=4, max_tokens=4))
    assert report["operation"] == "synaptic op" and report["operations"] > 0
    tiers = report["tiers_flips_per_operation"]
    assert tiers["top"] > 0 and tiers["bottom"] > 0
    assert report["tiers_flips_per_cycle"]["top"] > 0


def test_a_partial_bench_run_adds_to_the_recorded_figures():
    from flows.docs import merge_bench
    old = {"generated": "then", "results": [
        {"block": "lif", "params": "", "cells": 10, "tier_activity": {"top_flips_per_cycle": 1}},
        {"block": "pmu", "params": "banks=8", "cells": 20}]}
    new = {"generated": "now", "results": [
        {"block": "lif", "params": "", "partial": True, "activity": {"flips_per_operation": 3}},
        {"block": "lif", "params": "other", "partial": True, "activity": {}},
        {"block": "pmu", "params": "banks=8", "partial": True, "pnr_ecp5": {"fmax_mhz": 99.0}}]}
    merged = merge_bench(old, new)
    assert merged["generated"] == "then"
    lif, pmu, other = merged["results"]
    assert other == {"generated": "now", "block": "lif", "params": "other",
                     "activity": {"generated": "now"}}
    assert lif == {"generated": "then", "block": "lif", "params": "", "cells": 10,
                   "activity": {"flips_per_operation": 3, "generated": "now"}}
    assert pmu == {"generated": "then", "block": "pmu", "params": "banks=8", "cells": 20,
                   "pnr_ecp5": {"fmax_mhz": 99.0, "generated": "now"}}


def test_a_partial_throughput_run_is_dated_on_the_block_page():
    """`moegen bench --only throughput` replaces the test_throughput figures of a recorded
    configuration; the page names both runs, as the synthesis figures stay the older run's."""
    from flows.docs import _figures_table, merge_bench
    figures = {"metrics": {"beats_per_cycle": 1.0}, "sim_cycles_per_second": 10.0}
    old = {"generated": "then", "results": [
        {"block": "lif", "params": "", "verilator": figures, "icarus": figures,
         "synth_generic": {"cells": 5, "flip_flops": 1, "luts": 4, "abc": True}}]}
    new = {"generated": "now", "results": [
        {"block": "lif", "params": "", "partial": True, "verilator": figures,
         "icarus": figures, "bare_verilator_cycles_per_second": 1000.0}]}
    assert "From `make bench` of then (docs" in _figures_table("lif", merge_bench(old, old))
    page = _figures_table("lif", merge_bench(old, new))
    assert "From `make bench` of then (the `test_throughput` figures of now)" in page
    # The bare loop runs with the throughput tests: its ceiling is that run's.
    assert "| 10 of 1,000 bare |" in page
    # `moegen bench --only synth` replaces the cells the same way, and the page says so too.
    area = {"cells": 7, "flip_flops": 2, "luts": 5, "abc": False}
    synth = {"generated": "later", "results": [
        {"block": "lif", "params": "", "partial": True, "synth_generic": area}]}
    page = _figures_table("lif", merge_bench(merge_bench(old, new), synth))
    assert ("From `make bench` of then (the `test_throughput` figures of now; the synthesis "
            "figures of later)") in page
    assert "| 7 (gate by gate) | 2 | 5 (gate by gate) |" in page
    # `moegen bench --only pnr` likewise: its Fmax is dated.
    placed = {"generated": "last", "results": [
        {"block": "lif", "params": "", "partial": True,
         "pnr_ecp5": {"fmax_mhz": 99.5, "luts": 4, "flip_flops": 1, "block_rams": 0,
                      "dsps": 0, "seed": 1}}]}
    page = _figures_table("lif", merge_bench(merge_bench(merge_bench(old, new), synth), placed))
    assert ("the synthesis figures of later; the Fmax figures of last)") in page
    assert "99.5 MHz" in page
    # `moegen bench --only activity` too: its flips per operation are dated.
    toggled = {"generated": "latest", "results": [
        {"block": "lif", "params": "", "partial": True,
         "activity": {"operation": "step", "operations": 4, "cycles": 14, "flips": 14,
                      "flips_per_operation": 3.5, "flips_per_cycle": 1.0,
                      "parts_flips_per_operation": {"(top level)": 3.5}}}]}
    page = _figures_table("lif", merge_bench(merge_bench(merge_bench(merge_bench(
        old, new), synth), placed), toggled))
    assert "the Fmax figures of last; the switching-activity figures of latest)" in page


def test_a_configuration_only_partial_runs_measured_gets_a_row():
    """A demo configuration that only `moegen bench --only synth` measured: its cells, and per
    unit as the block counts its units for those parameters; dashes for what no run measured."""
    from flows.docs import _figures_table, merge_bench
    area = {"cells": 800, "flip_flops": 2, "luts": 5, "abc": False}
    synth = {"generated": "now", "results": [
        {"block": "moe_layer", "params": "fanouts=2,2", "partial": True,
         "synth_generic": area}]}
    page = _figures_table("moe_layer", merge_bench({"results": []}, synth))
    assert "| fanouts=2,2 | - | - | - | 800 (gate by gate) | 2 | 5 (gate by gate) | " \
           "200 per chiplet | - |" in page
