"""The two training recipes share one dataclass of their common keys (wise.typed_params.TrainingRecipe):
same names, same params keys accepted, one set of range checks naming each recipe's own section."""
from __future__ import annotations

import dataclasses

import pytest

from wise.looped.training_config import BaseTraining, RetrofitTraining, Training
from wise.training.config import TrainConfig
from wise.typed_params import TrainingRecipe, from_mapping

SHARED = [f.name for f in dataclasses.fields(TrainingRecipe)]


def test_both_recipes_extend_the_shared_keys():
    assert len(SHARED) == 16
    for cls in (TrainConfig, Training, RetrofitTraining, BaseTraining):
        assert issubclass(cls, TrainingRecipe) and set(SHARED) <= {f.name for f in dataclasses.fields(cls)}
    # each recipe keeps its own defaults for the keys whose defaults differ
    assert (TrainConfig().lr, Training().lr, RetrofitTraining().lr, BaseTraining().lr) == (2e-3, 1e-3, 2e-3, 3e-3)


@pytest.mark.parametrize("cls, section", [(TrainConfig, "train"), (RetrofitTraining, "recurtrace.train"),
                                          (BaseTraining, "recurtrace.base_train")])
@pytest.mark.parametrize("key, bad", [("lr", 0.0), ("beta2", 1.0), ("data_workers", -2), ("weight_decay", -0.1),
                                      ("log_every", 0)])
def test_a_bad_shared_key_is_refused_naming_its_section(cls, section, key, bad):
    with pytest.raises(ValueError, match=rf"^{section}\.{key} = "):
        from_mapping(cls, {key: bad}, section)


def test_the_shared_keys_parse_into_either_recipe():
    raw = {"seed": 3, "max_steps": 7, "min_lr_ratio": 0.5, "beta1": 0.8, "grad_clip": 2, "data_workers": 0}
    for cls, section in ((TrainConfig, "train"), (RetrofitTraining, "recurtrace.train")):
        got = from_mapping(cls, raw, section)
        assert {k: getattr(got, k) for k in raw} == raw and isinstance(got.grad_clip, float)
