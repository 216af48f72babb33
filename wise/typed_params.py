"""The one parser of params sections: a mapping (a section of params.yaml, a stored recipe) -> a
frozen dataclass, every key checked against its field's annotated type.

    from_mapping(RetrofitParams, raw["recurtrace"], "recurtrace", complete=True)

Every section of the project goes through it: the WISE stages' (``pipelines.config.params``), the
RecurTrace stages' (``pipelines.recurtrace.params``) and the backbone's training recipe
(``wise.training.TrainConfig``). ``complete=True`` is what a params file gets: a missing key is an
error naming it (a silent default would run something other than what the file says);
``complete=False`` fills absent keys from the dataclass defaults where a class has them (the
training recipes stored beside checkpoints); the params sections' dataclasses have none (params.yaml
is the one home of their values), so an absent key is an error there too.
Errors are ``ValueError`` naming the full key (``recurtrace.train.lr = 'x': must be a number``); value
ranges and relations are the dataclasses' own checks (``need`` in their ``__post_init__``).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

MISSING_HINT = "a params file must give every key (params.yaml lists them all)"


def need(ok: bool, section: str, obj: Any, key: str, why: str) -> None:
    """A range / relation check of a parsed section: ``<section>.<key> = <value>: <why>``."""
    if not ok:
        raise ValueError(f"{section}.{key} = {getattr(obj, key)!r}: {why}")


def _hints(cls: type) -> dict[str, Any]:
    """Field name -> type, the annotations evaluated (the modules use ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def missing_keys(cls: type, raw: dict, section: str) -> list[str]:
    """Keys of dataclass `cls`, and of its nested dataclass sections, absent from `raw`."""
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            out.append(f"{section}.{f.name}")
        elif dataclasses.is_dataclass(hints[f.name]) and isinstance(raw[f.name], dict):
            out += missing_keys(hints[f.name], raw[f.name], f"{section}.{f.name}")
    return out


def missing_error(missing: list[str]) -> ValueError:
    """The one-line error of absent keys: ``missing key wise.eta: ...``."""
    return ValueError(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}: {MISSING_HINT}")


def _value(key: str, kind: Any, value: Any, complete: bool, default: Any) -> Any:
    """`value` checked (and normalised: lists -> tuples, ints -> floats) against the field's type
    `kind`; `default`: a nested section's instance that absent keys come from (library use)."""
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, key, complete, default)
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return value
        kind = next(a for a in args if a is not type(None))
        if kind is str and not isinstance(value, str):
            raise ValueError(f"{key} = {value!r}: must be a string or null (quote a commit hash or a number)")
    origin = typing.get_origin(kind) or kind
    if kind is bool:
        ok, want = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif kind is float:
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    elif kind is str:
        ok, want = isinstance(value, str), "a string"
    elif origin is tuple:
        ok, want = isinstance(value, (list, tuple)), "a list"
        value = tuple(value) if ok else value
    elif origin is dict:
        ok, want = isinstance(value, dict), "a mapping"
    else:
        ok, want = True, ""
    if not ok:
        raise ValueError(f"{key} = {value!r}: must be {want}")
    return value


def _library_defaults(cls: type) -> Any:
    """``cls()`` where every field has a default (the training recipes), else None (the params
    sections, whose every key comes from the file)."""
    try:
        return cls()
    except TypeError:
        return None


def _build(cls: type, raw: Any, section: str, complete: bool, defaults: Any = None):
    """`defaults`: the instance absent keys come from in library use (a nested section's own
    default, which may differ from its class's)."""
    if raw is None and not complete:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{section} must be a mapping, got {type(raw).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}")
    if defaults is None and not complete:
        defaults = _library_defaults(cls)
    values = {name: _value(f"{section}.{name}", hints[name], value, complete, getattr(defaults, name, None))
              for name, value in raw.items()}
    if defaults is not None:
        return dataclasses.replace(defaults, **values)
    missing = [f"{section}.{f.name}" for f in dataclasses.fields(cls) if f.name not in values]
    if missing:
        raise missing_error(missing)
    return cls(**values)


def from_mapping(cls: type, raw: Any, section: str, complete: bool = False):
    """Dataclass `cls` from mapping `raw` (the params section named `section`); see the module doc."""
    if complete and isinstance(raw, dict):
        missing = missing_keys(cls, raw, section)
        if missing:
            raise missing_error(missing)
    return _build(cls, raw, section, complete)


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """The keys both training recipes share: the backbone's ``train:`` (``wise.training.TrainConfig``)
    and the looped family's ``retrofit.train`` / ``retrofit.base_train`` (``wise.looped.training_config``)
    extend it with the same names. The first eight have no default here: each recipe states its own
    (the backbone trains longer, on more extra questions, with weight decay and an LM loss)."""

    benchmarks: dict  # benchmark name -> sampling weight
    extra_questions: int  # further questions a row's passages answer, after its own
    extra_reserve: int  # tokens of the budget kept for them
    time_limit_s: float  # 0: none; else stop (and save) after this many seconds of training
    lr: float
    warmup_steps: int
    weight_decay: float
    lm_loss_weight: float  # next-token loss on the prompt text, besides the answer loss
    seed: int = 0  # batch i is drawn from (seed, i) alone
    max_steps: int = 100000
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    log_every: int = 20
    data_workers: int = -1  # -1: every core but two; 0: batches made in the training process

    def check_recipe(self, section: str) -> None:
        """The shared keys' range checks (a subclass's ``__post_init__`` calls it with its section)."""
        def check(ok: bool, key: str, why: str) -> None:
            need(ok, section, self, key, why)

        check(self.extra_questions >= 0, "extra_questions", "must be >= 0")
        check(self.extra_reserve >= 0, "extra_reserve", "must be >= 0")
        check(self.max_steps >= 1, "max_steps", "must be >= 1")
        check(self.time_limit_s >= 0, "time_limit_s", "must be >= 0")
        check(self.lr > 0, "lr", "must be > 0")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(0 <= self.beta1 < 1, "beta1", "must be in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", "must be in [0, 1)")
        check(self.grad_clip > 0, "grad_clip", "must be > 0")
        check(self.lm_loss_weight >= 0, "lm_loss_weight", "must be >= 0")
        check(self.log_every >= 1, "log_every", "must be >= 1")
        check(self.data_workers >= -1, "data_workers", "must be >= -1")
