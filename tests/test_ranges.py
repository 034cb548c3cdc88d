"""Every accepted value works: the ends of every parameter range of every block.

For each parameter of each registered block, each end of its range (both bounds of an integer,
every choice, the shortest and longest lists) is paired with the fewest other parameters moved
to their own ends that make a configuration the cross-field rules accept (``pmu lanes=32`` needs
``banks=32``). `make test` checks that every end is reachable so; `make sweep` generates each
such configuration within a time limit and runs its whole cocotb suite on both simulators,
once per distinct configuration.
"""

import dataclasses
import itertools
import re
import resource

import pytest

from conftest import SIMULATORS, config_id, run_block
from flows.verilog import convert
from hw.params import ParamError
from hw.registry import all_blocks, get_block

GENERATE_SECONDS = 120          # "promptly": CPU seconds of this machine's cores


def _cpu_seconds():
    """CPU time of this process and its finished children (Yosys): unlike the wall clock, it
    does not count the time `make sweep`'s other worker holds the core (``moe_layer -p
    fanouts=16`` generates in 78 s alone and took over 120 s beside another test)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _ends(field):
    meta = field.metadata
    if meta["kind"] == "int":
        return [meta["lo"], meta["hi"]]
    if meta["kind"] == "int_list":
        return [(meta["lo"],), (meta["hi"],), (meta["lo"],) * meta["max_len"]]
    return list(meta["choices"])


def _candidates(field):
    """Values another parameter may take to make an end reachable: its own ends, for an
    integer also the value above its low end (``topk_router groups=64`` needs 256 experts,
    hence the serial router, scanning at most E/G = 4 lanes: ``scan_lanes=1``), the widths of
    BF16 and FP32 (``nop_tree combine_dtype=fp32`` needs ``acc_width=32``) and, for a
    list, the widest first entry over the longest tail of smallest ones ((16, 2, 2): the most
    leaves a tree may have)."""
    values = _ends(field)
    meta = field.metadata
    if meta["kind"] == "int" and meta["hi"] > meta["lo"] + 1:
        values.append(meta["lo"] + 1)
    if meta["kind"] == "int":
        # The floating-point formats' widths (nop combine_dtype=fp32 needs acc_width=32).
        values += [w for w in (16, 32) if meta["lo"] < w < meta["hi"] and w not in values]
    if meta["kind"] == "int_list":
        values += [(meta["hi"],) + (meta["lo"],) * n for n in range(1, meta["max_len"])]
    return values


def _accepted(block, params):
    try:
        block.config(**params)
    except ParamError:
        return False
    return True


def _exhaustive(block, fields, name, value, most):
    """The first accepted configuration with ``name=value`` and the fewest (up to ``most``)
    other parameters moved to :func:`_candidates` values, trying every combination."""
    others = [f for f in fields if f != name]
    for count in range(most + 1):
        for chosen in itertools.combinations(others, count):
            for values in itertools.product(*(_candidates(fields[o]) for o in chosen)):
                params = {name: value, **dict(zip(chosen, values))}
                if _accepted(block, params):
                    return params
    return None


def _guided(block, fields, name, value, most):
    """Breadth first, up to ``most`` other parameters moved, each step moving only a
    parameter the last rejection names (its culprit, or a field its message gives the rule
    in terms of; at the start every field if it names none, later a dead end):
    ``expert_chiplet dtype=bf16`` needs four (in_width, w_width, combine_dtype,
    combine_width), where trying every combination of four of its 30 fields would take
    hours."""
    frontier, seen = [{name: value}], set()
    for _ in range(most + 1):
        following = []
        for params in frontier:
            try:
                block.config(**params)
                return params
            except ParamError as error:
                message = str(error)
            named = re.findall(r"[a-z_]+", message.replace("allowed:", " "))
            moves = [f for f in dict.fromkeys(named) if f in fields and f not in params]
            if not moves and len(params) > 1:
                continue                 # a rule among moved fields only: a dead end
            for field in moves or [f for f in fields if f not in params]:
                for candidate in _candidates(fields[field]):
                    moved = {**params, field: candidate}
                    key = tuple(sorted(moved.items()))
                    if key not in seen:
                        seen.add(key)
                        following.append(moved)
        frontier = following
    return None


def range_ends():
    """``(block name, end label, params or None)`` for every end of every parameter range:
    the fewest other parameters moved, trying every combination of up to two; else
    :func:`_guided`'s, up to four; else every combination of three (the rules whose
    messages do not name the fields they need, ``data_width=2``'s; a rule that needs four
    would make trying every combination of three take minutes)."""
    rows = []
    for block in all_blocks():
        fields = {f.name: f for f in dataclasses.fields(block.config)}
        for name, field in fields.items():
            for value in _ends(field):
                found = _exhaustive(block, fields, name, value, 2) or \
                    _guided(block, fields, name, value, 4) or \
                    _exhaustive(block, fields, name, value, 3)
                rows.append((block.name, f"{name}={value}", found))
    return rows


RANGE_ENDS = range_ends()


def test_every_range_end_is_accepted_in_some_configuration():
    unreachable = [(name, end) for name, end, params in RANGE_ENDS if params is None]
    assert not unreachable, f"range ends no configuration accepts: {unreachable}"
    assert len(RANGE_ENDS) > 100


def _config_key(name, params):
    """A block's configuration with every field, defaults included: two ends that need the
    same configuration have the same key."""
    return name, repr(sorted(dataclasses.asdict(get_block(name).config(**params)).items()))


def _distinct(ends):
    """``(block name, params)`` once per distinct configuration: different ends can need the
    same one (``moe_layer``'s defaults stand for several), and each runs a whole suite on both
    simulators."""
    chosen = {}
    for name, _, params in ends:
        if params is not None:
            chosen.setdefault(_config_key(name, params), (name, params))
    return list(chosen.values())


SWEEP = _distinct(RANGE_ENDS)


def test_each_accepted_end_is_in_a_swept_configuration():
    """The sweep runs each configuration once, and every accepted end is in one of them."""
    swept = {_config_key(name, params) for name, params in SWEEP}
    assert len(swept) == len(SWEEP)
    for name, end, params in RANGE_ENDS:
        if params is not None:
            assert _config_key(name, params) in swept, f"{name} {end}: not swept"


@pytest.mark.sweep
@pytest.mark.parametrize("name, params", SWEEP,
                         ids=[f"{name}-{config_id(params)}" for name, params in SWEEP])
def test_range_end_generates_promptly_and_simulates(name, params):
    block = get_block(name)
    started = _cpu_seconds()
    convert(block.build(block.config(**params)), name)
    spent = _cpu_seconds() - started
    assert spent < GENERATE_SECONDS, f"{name} {params}: generated in {spent:.0f} CPU seconds"
    for simulator in SIMULATORS:
        assert run_block(name, params, simulator).tests > 0
