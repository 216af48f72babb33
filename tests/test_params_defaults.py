"""params.yaml is the one home of every default: the params dataclasses carry none, a key missing
from a params file is a one-line error naming it (raised while parsing, before any work), and the
engine's settings have no defaults for the values a run depends on."""
from __future__ import annotations

import copy
import dataclasses
import typing

import pytest

from params_files import params_yaml
from pipelines.config.params import Params, ParamsError, parse
from pipelines.recurtrace.params import RetrofitParams
from stages.validate import check_retrofit, check_train
from wise.training.config import TrainConfig

# Section -> its dataclass, as the parsers read them (pipelines.config.params, stages/validate.py).
SECTIONS = {**typing.get_type_hints(Params), "train": TrainConfig, "recurtrace": RetrofitParams}
# Dataclasses of the wise floor shared with library use and stored recipes (a checkpoint's
# train_recipe.json is read back with them), parsed complete from a params file like every section.
LIBRARY_RECIPES = ("TrainConfig", "RetrofitTraining", "BaseTraining")


def leaf_keys(cls: type, prefix: str) -> list[str]:
    """Every key of dataclass `cls` down to the values (a nested dataclass section is walked)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        out += leaf_keys(hints[f.name], key) if dataclasses.is_dataclass(hints[f.name]) else [key]
    return out


ALL_KEYS = [key for name, cls in SECTIONS.items() for key in leaf_keys(cls, name)]


def parse_params_file(raw: dict) -> None:
    """What the validate stage parses: every section (no model, no library checks)."""
    parse(raw)
    check_train(raw, "params.yaml")
    check_retrofit(raw, "params.yaml")


def test_params_yaml_gives_every_key_the_parsers_know_and_parses():
    raw = params_yaml()
    for key in ALL_KEYS:
        node = raw
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"params.yaml lacks {key}"
            node = node[part]
    parse_params_file(raw)


def test_a_missing_key_is_a_one_line_error_naming_it():
    raw = params_yaml()
    assert len(ALL_KEYS) > 300  # every section, nested ones included
    for key in ALL_KEYS:
        cut = copy.deepcopy(raw)
        *path, last = key.split(".")
        node = cut
        for part in path:
            node = node[part]
        del node[last]
        with pytest.raises(ParamsError) as err:
            parse_params_file(cut)
        message = str(err.value)
        assert message.startswith(f"params.yaml: missing key {key}: ") and "\n" not in message, (key, message)


def _dataclasses_under(cls: type, seen: dict[str, type]) -> dict[str, type]:
    seen[cls.__name__] = cls
    for kind in typing.get_type_hints(cls).values():
        if dataclasses.is_dataclass(kind) and kind.__name__ not in seen:
            _dataclasses_under(kind, seen)
    return seen


def test_no_params_dataclass_field_has_a_default():
    classes = {"Params": Params}
    for cls in SECTIONS.values():
        _dataclasses_under(cls, classes)
    checked = {name: cls for name, cls in classes.items() if name not in LIBRARY_RECIPES}
    assert {"Params", "WiseParams", "RetrofitParams", "CellParams", "WiseReuse", "HaltingParams"} <= set(checked)
    with_default = [f"{name}.{f.name}" for name, cls in sorted(checked.items()) for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert with_default == []


def test_wise_settings_are_built_whole():
    from wise.engine.runner import PAPER_SETTINGS, WiseSettings

    required = [f.name for f in dataclasses.fields(WiseSettings) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    assert required == ["steps", "discovery_step", "window", "block_size", "eta", "backend"]
    with pytest.raises(TypeError, match="backend"):
        WiseSettings(steps=32, discovery_step=12, window=4, block_size=32, eta=0.95)
    assert PAPER_SETTINGS.replace(eta=0.9).eta == 0.9 and PAPER_SETTINGS.full_only(8).discovery_step == 8
