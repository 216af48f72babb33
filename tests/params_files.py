"""params.yaml as the tests start from it: the params dataclasses carry no defaults (params.yaml is
their one home), so a test takes params.yaml's values and overlays what it varies, section by
section, the way a params file would give them."""
from __future__ import annotations

import copy
import dataclasses
import typing
from functools import lru_cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def _raw() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def params_yaml() -> dict:
    """params.yaml's parsed YAML (a fresh copy to edit)."""
    return copy.deepcopy(_raw())


def overlay(cls: type, raw: dict, changes: dict) -> dict:
    """`raw` (a section of dataclass `cls`) with `changes` applied: a key whose field is a nested
    dataclass section is overlaid in turn, any other key replaced."""
    hints = typing.get_type_hints(cls)
    out = dict(raw)
    for key, value in changes.items():
        kind = hints.get(key)
        nested = kind is not None and dataclasses.is_dataclass(kind) and isinstance(value, dict)
        out[key] = overlay(kind, raw.get(key) or {}, value) if nested else value
    return out


def parse_over(changes: dict):
    """Typed params (not yet validated) of params.yaml with `changes` ({section: {key: value}})."""
    from pipelines.config.params import Params, parse

    return parse(overlay(Params, params_yaml(), changes))


def default_params():
    """params.yaml, parsed and validated (``load_params``)."""
    from pipelines.config.params import load_params

    return load_params(ROOT / "params.yaml")


def retrofit_params(changes: dict | None = None):
    """params.yaml's ``recurtrace:`` section with `changes`, parsed (its checks raise ValueError)."""
    from pipelines.recurtrace.params import RetrofitParams
    from wise.typed_params import from_mapping

    return from_mapping(RetrofitParams, overlay(RetrofitParams, _raw()["recurtrace"], changes or {}), "recurtrace",
                        complete=True)
