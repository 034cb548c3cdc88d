"""Validated, frozen block configurations.

Every block's constructor takes one frozen dataclass built from :func:`int_param` and
:func:`choice_param` fields. The dataclass checks itself in ``__post_init__`` (via
:func:`validate`) and raises :class:`ParamError`, a :class:`ValueError` whose message is one line
naming the parameter, the value given and what is allowed. The same field metadata drives
``moegen list`` and the parsing of ``-p key=value`` on the command line, so a range is written
exactly once. Rules between fields (``k <= experts``) raise through :func:`param_error`, so
every message has the same form.

:class:`ConfiguredComponent` is how every block holds its config: ``self.config``, read-only.
"""

import dataclasses

from amaranth.lib import wiring

__all__ = ["ParamError", "int_param", "like_param", "choice_param", "int_list_param", "validate",
           "describe", "parse_params", "format_value", "param_error", "ConfiguredComponent"]


def format_value(value):
    """A parameter value as written on the command line (``4,4`` for a tuple)."""
    return ",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


class ParamError(ValueError):
    """A parameter value is not allowed. ``str(err)`` is the one-line message for the user."""


def param_error(name, value, allowed):
    """The :class:`ParamError` for parameter ``name`` given ``value`` where ``allowed`` holds
    (a rule that involves other fields: ``allowed`` names them and their values)."""
    return ParamError(f"parameter '{name}': got {format_value(value)}; allowed: {allowed}")


class ConfiguredComponent(wiring.Component):
    """A block's component: built from one frozen config, exposed read-only as ``config``.

    Parameters
    ----------
    config : frozen dataclass
        The block's validated config.
    members : dict or wiring.Signature
        The block's ports.
    """

    def __init__(self, config, members):
        self._config = config
        super().__init__(members)

    @property
    def config(self):
        return self._config


class TieredComponent(ConfiguredComponent):
    """A block built whole (2D, ``tier=None``: its bottom-tier parts are submodules) or as its
    top tier alone (``tier="top"``: the bottom tier's ports become ports ``bottom__*``, for the
    two-tier 3D build of :mod:`flows.threed`).

    Parameters
    ----------
    config
        The block's config (``self.config``).
    members : dict
        The block's own ports.
    bottom : wiring.Signature
        The bottom tier's signature, as the bottom tier sees it.
    tier : None or "top"
    """

    def __init__(self, config, members, bottom, tier=None):
        self._tier = tier
        if tier == "top":
            members["bottom"] = wiring.In(bottom)      # flipped: what the bottom takes, we drive
        super().__init__(config, members)

    @property
    def tier(self):
        return self._tier


def int_param(default, lo, hi, doc, *, check=None, check_doc=None):
    """An integer parameter allowed in ``lo..hi`` (inclusive).

    Parameters
    ----------
    default : int
        Value used when the parameter is not given.
    lo, hi : int
        Inclusive bounds.
    doc : str
        One-line description shown by ``moegen list``.
    check : callable, optional
        Extra predicate ``check(value) -> bool`` (for example "power of two").
    check_doc : str, optional
        How the extra predicate reads in the allowed-range text.
    """
    allowed = f"an integer in {lo}..{hi}" + (f", {check_doc}" if check_doc else "")
    return dataclasses.field(default=default, metadata={
        "kind": "int", "lo": lo, "hi": hi, "doc": doc, "check": check, "allowed": allowed})


def like_param(config_cls, name, default=None):
    """A parameter declared as ``config_cls`` declares it (range and help written once),
    optionally with another default."""
    field = config_cls.__dataclass_fields__[name]
    return dataclasses.field(default=field.default if default is None else default,
                             metadata=field.metadata)


def choice_param(default, choices, doc):
    """A string parameter that must be one of ``choices``."""
    allowed = "one of " + ", ".join(repr(c) for c in choices)
    return dataclasses.field(default=default, metadata={
        "kind": "choice", "choices": tuple(choices), "doc": doc, "allowed": allowed})


def int_list_param(default, lo, hi, max_len, doc):
    """A tuple of 1..``max_len`` integers, each in ``lo..hi``; ``4,4`` on the command line."""
    allowed = f"1..{max_len} comma-separated integers, each in {lo}..{hi}"
    return dataclasses.field(default=tuple(default), metadata={
        "kind": "int_list", "lo": lo, "hi": hi, "max_len": max_len, "doc": doc,
        "allowed": allowed})


def _int_ok(value, lo, hi):
    # bool is an int subclass; True for `rows` is a caller bug, not 1.
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _check_field(field, value):
    meta = field.metadata
    if meta["kind"] == "int_list":
        ok = (isinstance(value, tuple) and 1 <= len(value) <= meta["max_len"]
              and all(_int_ok(v, meta["lo"], meta["hi"]) for v in value))
        if not ok:
            shown = ",".join(str(v) for v in value) if isinstance(value, tuple) else repr(value)
            raise ParamError(f"parameter '{field.name}': got {shown}; allowed: {meta['allowed']}")
        return
    if meta["kind"] == "int":
        ok = (_int_ok(value, meta["lo"], meta["hi"])
              and (meta["check"] is None or meta["check"](value)))
    else:
        ok = isinstance(value, str) and value in meta["choices"]
    if not ok:
        raise ParamError(f"parameter '{field.name}': got {value!r}; allowed: {meta['allowed']}")


def validate(config):
    """Check every field of a config dataclass against its metadata; raise :class:`ParamError`."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.metadata["kind"] == "int_list" and isinstance(value, list):
            # A manifest stores tuples as JSON lists; the frozen config keeps a hashable tuple.
            value = tuple(value)
            object.__setattr__(config, field.name, value)
        _check_field(field, value)


def describe(config_cls):
    """Rows of ``(name, default, allowed, doc)`` for every parameter of ``config_cls``."""
    return [(f.name, format_value(f.default), f.metadata["allowed"], f.metadata["doc"])
            for f in dataclasses.fields(config_cls)]


def parse_params(config_cls, pairs):
    """Build ``config_cls`` from ``["key=value", ...]`` strings as given on the command line.

    Raises
    ------
    ParamError
        For a malformed pair, an unknown key, a value of the wrong type or out of range.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    kwargs = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ParamError(f"parameter {pair!r}: expected key=value")
        if key not in fields:
            raise ParamError(f"parameter '{key}': unknown; allowed: {', '.join(fields)}")
        field = fields[key]
        if field.metadata["kind"] == "int_list":
            try:
                value = tuple(int(part, 0) for part in text.split(","))
            except ValueError:
                raise ParamError(f"parameter '{key}': got {text!r}; allowed: "
                                 f"{field.metadata['allowed']}") from None
        elif field.metadata["kind"] == "int":
            try:
                value = int(text, 0)
            except ValueError:
                raise ParamError(f"parameter '{key}': got {text!r}; allowed: "
                                 f"{field.metadata['allowed']}") from None
        else:
            value = text
        kwargs[key] = value
    return config_cls(**kwargs)
