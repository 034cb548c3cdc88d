"""The architecture rules of DESIGN.md: one-way layers, one home per family, fresh docs."""

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows import docs, toolchain
from hw.registry import all_blocks, families

ROOT = toolchain.REPO_ROOT
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(cwd):
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


def test_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("golden/fixed.py", "from flows import verilog", "layers"),
    ("golden/fixed.py", "import amaranth", "golden is NumPy"),
    ("hw/pipeline.py", "import subprocess", "hw generators never run a tool"),
    ("flows/verilog.py", "import flows.cli", "the CLI is the top"),
    ("flows/toolchain.py", "import flows.sim", "no import cycles"),
])
def test_a_wrong_arrow_fails_and_names_the_import(tmp_path, module, line, contract):
    for package in ("golden", "hw", "tb", "flows"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(line + "\n" + path.read_text())
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    broken = [text for text in result.stdout.splitlines() if text.endswith("BROKEN")]
    assert any(text.startswith(contract) for text in broken), result.stdout
    # The report names the importing module (cycles name it relative to its package).
    package, name = module[:-3].split("/")
    assert f"{package}.{name}" in result.stdout or f".{name} -> " in result.stdout


def test_every_family_lives_in_exactly_its_five_places():
    names = [block.name for block in all_blocks()]
    assert len(names) == len(set(names))
    for family in families():
        for path in (f"hw/{family}.py", f"golden/{family}.py", f"tb/test_{family}.py",
                     f"tests/test_{family}.py", f"docs/blocks/{family}.md"):
            assert (ROOT / path).is_file(), path
        page = (ROOT / "docs" / "blocks" / f"{family}.md").read_text()
        for block in all_blocks():
            if block.family == family:
                # The block is defined in its family's module and documented on its page.
                assert block.config.__module__ == f"hw.{family}", block.name
                assert f"<!-- moegen:params {block.name} -->" in page, block.name
                assert f"<!-- moegen:ports {block.name} -->" in page, block.name
                assert f"<!-- moegen:figures {block.name} -->" in page, block.name
                # Its cocotb module is the family's, or one named after the family.
                tb = block.tb_module.replace(".", "/") + ".py"
                assert (ROOT / tb).is_file() and tb.startswith(f"tb/test_{family}"), tb
                for params in block.demo_configs:
                    block.config(**params)          # demo configurations are valid
    # No second list of the families: nothing outside the registry names them all.
    for path in ROOT.glob("*/*.py"):
        if ".venv" not in path.parts and path != Path(__file__):
            assert "FAMILIES =" not in path.read_text(), path
    # Every documented family page belongs to a registered family.
    assert {p.stem for p in (ROOT / "docs" / "blocks").glob("*.md")} == set(families())


def test_every_block_s_speed_is_timed_over_10k_cycles():
    """Each block's cocotb module has a test_throughput, decorated so that a run reporting a
    speed times it over 10k simulated cycles or more (tb.harness.long_enough_to_time)."""
    for module in sorted({block.tb_module for block in all_blocks()}):
        text = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert "@cocotb.test()\n@long_enough_to_time\nasync def test_throughput(dut):" in text, \
            module


def test_committed_docs_are_what_moegen_docs_generates():
    assert docs.stale_files() == [], "run `.venv/bin/moegen docs` and commit the result"


def test_port_tables_give_every_field_its_bit_range():
    def leaf(field, lsb, msb, signed=False):
        return {"field": field, "lsb": lsb, "msb": msb, "signed": signed}
    # An array of like fields is one entry, its bits a function of its indices.
    lanes = [leaf(f"data.{j}", 8 + 16 * j, 23 + 16 * j, True) for j in range(4)]
    assert docs._fields_text([leaf("token", 0, 7), *lanes, leaf("last", 72, 72)]) == (
        "`token` [0..7]; `data[j]` [16j+8..16j+23] signed, j = 0..3; `last` [72]")
    grid = [leaf(f"w.{j}.{k}.v", 12 * j + 4 * k, 12 * j + 4 * k + 3) for j in range(2)
            for k in range(3)]
    assert docs._fields_text(grid) == "`w[j][k].v` [12j+4k..12j+4k+3], j = 0..1, k = 0..2"
    # One that is not (a lane of another width, or a gap) is listed lane by lane.
    uneven = [leaf("s.0", 0, 7), leaf("s.1", 8, 11), leaf("s.2", 12, 19)]
    assert docs._fields_text(uneven) == "`s[0]` [0..7]; `s[1]` [8..11]; `s[2]` [12..19]"
    gap = [leaf("s.0", 0, 3), leaf("s.1", 4, 7), leaf("s.2", 9, 12)]
    assert docs._fields_text(gap) == "`s[0]` [0..3]; `s[1]` [4..7]; `s[2]` [9..12]"
    # A block's table: every stream with its payload, an array of streams as one row.
    table = docs._ports_table("nop_switch")
    assert ("| `down_out[i]`, i = 0..3 (`down_out__<i>__…`) | out, stream | 45 | `token` [0..7]; "
            "`mask` [8..11]; `data[j]` [8j+12..8j+19] signed, j = 0..3; `last` [44] |") in table
    assert "| `error` | out | 1 | - |" in table


_PORT_TABLE = re.compile(r"<!-- moegen:ports (\w+) -->(.*?)<!-- /moegen:ports -->", re.S)
_FIELD_BITS = re.compile(r"`?\b([a-z_][\w.]*)`? \[(\d+)(?:\.\.(\d+))?\]")
_PORTS_AT_DEFAULTS = re.compile(r"^\*\*Ports\*\* \([^\n]*default.*?(?=^\*\*|^#|\Z)",
                                re.S | re.M)


def _prose_bit_ranges_off_the_tables(page):
    """``(field, bits in the prose, bits in the tables)`` for every field a page's hand-written
    **Ports** section at the defaults gives a plain bit range that no generated ports table of
    the page gives it (a single bit written either ``[a]`` or ``[a..a]``)."""
    def bits(match):
        return int(match.group(2)), int(match.group(3) or match.group(2))
    tables = {}
    for _, table in _PORT_TABLE.findall(page):
        for match in _FIELD_BITS.finditer(table):
            tables.setdefault(match.group(1), set()).add(bits(match))
    off = []
    for section in _PORTS_AT_DEFAULTS.finditer(_PORT_TABLE.sub("", page)):
        for match in _FIELD_BITS.finditer(section.group(0)):
            name = match.group(1)
            if name in tables and bits(match) not in tables[name]:
                off.append((name, bits(match), sorted(tables[name])))
    return off


def test_hand_written_port_bits_at_the_defaults_are_the_hardware_s():
    """A contract's prose and its generated ports table must not disagree (fp.md's `slot` was
    left at 8 slots' [577..579] when the default became 16 slots)."""
    page = ("**Ports** (bit ranges for the defaults):\n- `inp`: `last` [576], `slot` [577..579]."
            "\n\n**Timing** `slot` [0..2] elsewhere.\n<!-- moegen:ports x -->\n| `inp` | in, "
            "stream | 581 | `last` [576]; `slot` [577..580] |\n<!-- /moegen:ports -->\n")
    assert _prose_bit_ranges_off_the_tables(page) == [("slot", (577, 579), [(577, 580)])]
    for path in sorted((ROOT / "docs" / "blocks").glob("*.md")):
        assert _prose_bit_ranges_off_the_tables(path.read_text()) == [], path.name


_NAMED_CONSTANT = re.compile(r"`(?:golden\.(\w+)\.)?([A-Z][A-Z0-9_]+)` = (-?\d+)\b")


def _golden_constants():
    """``{name: {module: value}}`` of every upper-case integer constant of the golden models."""
    constants = {}
    for path in sorted((ROOT / "golden").glob("*.py")):
        module = importlib.import_module(f"golden.{path.stem}")
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
                constants.setdefault(name, {})[path.stem] = value
    return constants


def _named_constants_off_the_models(text, constants):
    """``(written, value in the models)`` for every ```golden.m.NAME` = N`` (or ```NAME` = N``,
    NAME a constant of the golden models) whose N is not the model's value."""
    off = []
    for match in _NAMED_CONSTANT.finditer(text):
        module, name, written = match.group(1), match.group(2), int(match.group(3))
        values = constants.get(name, {})
        if module is not None:
            values = {module: values[module]} if module in values else {module: None}
        if values and written not in values.values():
            off.append((match.group(0), values))
    return off


def test_constants_the_docs_quote_are_the_golden_models():
    """A cycle contract quotes its constants by name and value; a value left behind when the
    model changed is a false contract."""
    constants = _golden_constants()
    latency, gap = constants["DOT_LATENCY"]["fp"], constants["DOT_SLOT_GAP"]["fp"]
    text = (f"`golden.fp.DOT_LATENCY` = {latency + 1}, `DOT_SLOT_GAP` = {gap - 1}, "
            f"`golden.fp.DOT_SLOT_GAP` = {gap}")
    assert _named_constants_off_the_models(text, constants) == [
        (f"`golden.fp.DOT_LATENCY` = {latency + 1}", {"fp": latency}),
        (f"`DOT_SLOT_GAP` = {gap - 1}", {"fp": gap})]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    quoted = 0
    for page in pages:
        text = page.read_text()
        quoted += len(_NAMED_CONSTANT.findall(text))
        assert _named_constants_off_the_models(text, constants) == [], page.name
    assert quoted >= 10


_QUOTED_RANGE = re.compile(r"`(\w+)`[^()`\n.;]{0,20}\((\d+)\.\.(\d+)(?:, default (\d+))?")


def _quoted_ranges_off_the_parameters(text, blocks):
    """``(quote, ranges the blocks give that name)`` for every ```name` ... (lo..hi`` (and
    ``, default d``) in prose, name a parameter of some block, that no block's range of
    that name is (for a list, ``1..max_len`` counts its entries)."""
    ranges = {}
    for block in blocks:
        for field in dataclasses.fields(block.config):
            meta, default = field.metadata, field.default
            if meta.get("kind") == "int":
                ranges.setdefault(field.name, []).append((meta["lo"], meta["hi"], default))
            elif meta.get("kind") == "int_list":
                ranges.setdefault(field.name, []).append((1, meta["max_len"], None))
                ranges.setdefault(field.name, []).append((meta["lo"], meta["hi"], None))
    off = []
    for match in _QUOTED_RANGE.finditer(text):
        name = match.group(1)
        lo, hi = int(match.group(2)), int(match.group(3))
        default = None if match.group(4) is None else int(match.group(4))
        if name in ranges and not any(
                (lo, hi) == (r_lo, r_hi) and default in (None, r_default)
                for r_lo, r_hi, r_default in ranges[name]):
            off.append((match.group(0), ranges[name]))
    return off


def test_parameter_ranges_the_prose_quotes_are_the_blocks():
    """The generated parameter tables are right by construction; the prose's own quotes of a
    range (```neurons` N (1..128, default 16)``) must agree with them."""
    blocks = list(all_blocks())
    wrong = "`neurons` N (1..64, default 16); `x_width` (2..32, default 8); `k` (1..8, ≤ E)"
    assert [quote for quote, _ in _quoted_ranges_off_the_parameters(wrong, blocks)] == [
        "`neurons` N (1..64, default 16", "`x_width` (2..32, default 8"]
    generated = re.compile(r"<!-- moegen:params.*?<!-- /moegen:params -->", re.S)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = generated.sub("", page.read_text())
        assert _quoted_ranges_off_the_parameters(text, blocks) == [], page.name


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15 * 1024
    assert "make demo" in text and "make test" in text
    for family in families():
        assert f"docs/blocks/{family}.md" in text
