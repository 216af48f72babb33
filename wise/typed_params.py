"""The one parser of params sections: a mapping (a section of params.yaml, a stored recipe) -> a
frozen dataclass, every key checked against the type of its field's default.

    from_mapping(RetrofitParams, raw["retrofit"], "retrofit", complete=True)

Every section of the project goes through it: the WISE stages' (``pipelines.config.params``), the
RecurTrace stages' (``pipelines.recurtrace.params``) and the backbone's training recipe
(``wise.training.TrainConfig``). ``complete=True`` is what a params file gets: a missing key is an
error naming it (a silent default would run something other than what the file says);
``complete=False`` fills absent keys from the dataclass defaults (library use, stored recipes).
Errors are ``ValueError`` naming the full key (``retrofit.train.lr = 'x': must be a number``); value
ranges and relations are the dataclasses' own checks (``need`` in their ``__post_init__``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

MISSING_HINT = "a params file must give every key (params.yaml lists them all)"


def need(ok: bool, section: str, obj: Any, key: str, why: str) -> None:
    """A range / relation check of a parsed section: ``<section>.<key> = <value>: <why>``."""
    if not ok:
        raise ValueError(f"{section}.{key} = {getattr(obj, key)!r}: {why}")


def missing_keys(cls: type, raw: dict, section: str) -> list[str]:
    """Keys of dataclass `cls`, and of its nested dataclass sections, absent from `raw`."""
    defaults = cls()
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            out.append(f"{section}.{f.name}")
            continue
        sub = getattr(defaults, f.name)
        if dataclasses.is_dataclass(sub) and isinstance(raw[f.name], dict):
            out += missing_keys(type(sub), raw[f.name], f"{section}.{f.name}")
    return out


def _value(key: str, default: Any, value: Any, complete: bool) -> Any:
    """`value` checked (and normalised: lists -> tuples, ints -> floats) against `default`'s type."""
    if dataclasses.is_dataclass(default):
        return _build(type(default), value, key, complete, default)
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif default is None:
        ok, want = value is None or isinstance(value, str), "a string or null (quote a commit hash or a number)"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    elif isinstance(default, tuple):
        ok, want = isinstance(value, (list, tuple)), "a list"
        value = tuple(value) if ok else value
    elif isinstance(default, dict):
        ok, want = isinstance(value, dict), "a mapping"
    else:
        ok, want = True, ""
    if not ok:
        raise ValueError(f"{key} = {value!r}: must be {want}")
    return value


def _build(cls: type, raw: Any, section: str, complete: bool, defaults: Any = None):
    """`defaults`: the instance absent keys come from (a nested section's own default, which may
    differ from its class's: ``retrofit.adaptive.wise`` is not ``WiseSettings()``)."""
    if raw is None and not complete:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{section} must be a mapping, got {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}")
    defaults = cls() if defaults is None else defaults
    values = {name: _value(f"{section}.{name}", getattr(defaults, name), value, complete) for name, value in raw.items()}
    return dataclasses.replace(defaults, **values)


def from_mapping(cls: type, raw: Any, section: str, complete: bool = False):
    """Dataclass `cls` from mapping `raw` (the params section named `section`); see the module doc."""
    if complete and isinstance(raw, dict):
        missing = missing_keys(cls, raw, section)
        if missing:
            raise ValueError(f"missing key(s) {', '.join(missing)}: {MISSING_HINT}")
    return _build(cls, raw, section, complete)
