"""Memories: SRAM macros for ASIC flows (flows/sram.py) and RAM mapping on the FPGA targets
(flows/synth.py)."""

import json
import re

import pytest

from conftest import run_block
from flows.cli import main
from flows.sim import SimFailure, run_tests
from flows.synth import synthesize
from flows.verilog import generate
from hw.registry import get_block


def test_sram_macros_replace_the_synchronous_memories(tmp_path):
    block = get_block("pmu")
    v_path, _, info = generate(block, block.config(), tmp_path, sram=True)
    sram = info["sram"]
    assert [m["path"] for m in sram["macros"]] == [f"banks.bank{b}.macro" for b in range(8)]
    assert {m["macro"] for m in sram["macros"]} == {"moegen_sram_64x16_1r1w"}
    assert all((m["depth"], m["width"], m["read_ports"], m["transparent"]) == (64, 16, 1, False)
               for m in sram["macros"])
    # The job queues and the read FIFO are read asynchronously: kept, with the reason.
    assert len(sram["kept"]) == 3 and all("asynchronous" in k["reason"] for k in sram["kept"])
    text = v_path.read_text()
    assert not re.search(r"reg \[15:0\] bank\d \[", text)        # no bank array left
    assert len(re.findall(r"^\s*moegen_sram_64x16_1r1w macro \(", text, re.M)) == 8
    models = (tmp_path / sram["models"]).read_text()
    assert models.count("module moegen_sram_64x16_1r1w (") == 1


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
