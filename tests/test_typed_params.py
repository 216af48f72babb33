"""The one parser of params sections (wise.typed_params): what every section of params.yaml, the
RecurTrace recipe and the backbone's training recipe go through."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from wise.typed_params import from_mapping, need


@dataclass(frozen=True)
class Inner:
    a: int = 1
    b: float = 0.5

    def __post_init__(self) -> None:
        need(self.a >= 0, "outer.inner", self, "a", "must be >= 0")


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    flag: bool = False
    grid: tuple = (1, 2)
    options: dict = field(default_factory=dict)
    revision: str | None = None
    inner: Inner = field(default_factory=lambda: Inner(a=7, b=0.25))  # not Inner()'s defaults


def test_values_are_typed_and_normalised():
    got = from_mapping(Outer, {"name": "y", "flag": True, "grid": [3], "options": {"k": 1}, "revision": "abc",
                               "inner": {"a": 2, "b": 1}}, "outer", complete=True)
    assert got == Outer("y", True, (3,), {"k": 1}, "abc", Inner(2, 1.0))
    assert isinstance(got.inner.b, float) and isinstance(got.grid, tuple)


def test_a_partial_nested_section_keeps_its_own_defaults_in_library_use():
    assert from_mapping(Outer, {"inner": {"b": 2}}, "outer").inner == Inner(a=7, b=2.0)
    assert from_mapping(Outer, None, "outer") == Outer()


@pytest.mark.parametrize("raw, message", [
    ({"nme": "y"}, r"unknown key\(s\) outer\.nme"),
    ({"inner": {"c": 1}}, r"unknown key\(s\) outer\.inner\.c"),
    ({"flag": 1}, r"outer\.flag = 1: must be true or false"),
    ({"grid": 3}, r"outer\.grid = 3: must be a list"),
    ({"inner": {"a": 1.5}}, r"outer\.inner\.a = 1\.5: must be an integer"),
    ({"inner": {"a": True}}, r"outer\.inner\.a = True: must be an integer"),
    ({"inner": {"b": "fast"}}, r"outer\.inner\.b = 'fast': must be a number"),
    ({"revision": 12}, r"outer\.revision = 12: must be a string or null"),
    ({"options": [1]}, r"outer\.options = \[1\]: must be a mapping"),
    ({"inner": 3}, r"outer\.inner must be a mapping"),
    ({"inner": {"a": -1}}, r"outer\.inner\.a = -1: must be >= 0"),
])
def test_a_bad_value_names_its_full_key(raw, message):
    with pytest.raises(ValueError, match=message):
        from_mapping(Outer, raw, "outer")


def test_a_params_file_must_give_every_key_nested_ones_too():
    whole = {"name": "y", "flag": True, "grid": [3], "options": {}, "revision": None, "inner": {"a": 2, "b": 1}}
    from_mapping(Outer, whole, "outer", complete=True)
    with pytest.raises(ValueError, match=r"missing key outer\.inner\.b: a params file must give every key"):
        from_mapping(Outer, {**whole, "inner": {"a": 2}}, "outer", complete=True)
    with pytest.raises(ValueError, match=r"missing keys outer\.flag, outer\.revision"):
        from_mapping(Outer, {k: v for k, v in whole.items() if k not in ("flag", "revision")}, "outer", complete=True)


@dataclass(frozen=True)
class Section:
    """A params section as the pipelines declare them: no defaults (params.yaml holds the values)."""

    steps: int
    rate: float
    inner: Inner


def test_a_section_without_defaults_takes_its_types_from_the_annotations_and_needs_every_key():
    got = from_mapping(Section, {"steps": 3, "rate": 1, "inner": {"a": 2, "b": 1}}, "section")
    assert got == Section(3, 1.0, Inner(2, 1.0)) and isinstance(got.rate, float)
    with pytest.raises(ValueError, match=r"^missing key section\.rate: "):
        from_mapping(Section, {"steps": 3, "inner": {"a": 2, "b": 1}}, "section")  # no defaults to fill it
    with pytest.raises(ValueError, match=r"section\.steps = 2\.5: must be an integer"):
        from_mapping(Section, {"steps": 2.5, "rate": 1, "inner": {}}, "section")
