"""The Ray task boundary takes typed contexts (pipelines.compute.tasks.contexts): a missing field is a
TypeError naming it when the driver builds the context, a bad value is refused naming its field, a
task refuses a plain dict in one line, and a context survives pickling (Ray's ``ray.put``). No
model is loaded: every refusal comes before a task touches one."""
from __future__ import annotations

import pickle

import pytest

from pipelines.compute.tasks.contexts import ConditionsContext, SweepContext, TraceContext
from pipelines.compute.work import get_task
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.runner import PAPER_SETTINGS, WiseSettings

SETTINGS = PAPER_SETTINGS.replace(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9,
                        adaptive=AdaptiveDiscovery(threshold=0.5, min_step=2, max_step=3, window=2))
DECODING = dict(settings=SETTINGS, init_seed=0, max_new_tokens=3, stop_ids=[1, 2], generation="cached")
CONTEXTS = [
    TraceContext(settings=SETTINGS, init_seed=0, topk=16, diagnostics=True),
    ConditionsContext(conditions=["full", "wise"], **DECODING),
    SweepContext(axis="eta", values=[0.8, 0.9], adaptive_key=None, **DECODING),
    SweepContext(axis="adaptive_threshold", values=[0.5, 1.0], adaptive_key="threshold", **DECODING),
]


def test_a_missing_field_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="topk"):
        TraceContext(settings=SETTINGS, init_seed=0, diagnostics=True)
    with pytest.raises(TypeError, match="generation"):
        ConditionsContext(settings=SETTINGS, init_seed=0, conditions=["full"], max_new_tokens=3, stop_ids=[1])
    with pytest.raises(TypeError, match="adaptive_key"):
        SweepContext(axis="eta", values=[0.9], **DECODING)


@pytest.mark.parametrize("change, error, field", [
    ({"generation": "greedy"}, ValueError, "ConditionsContext.generation"),
    ({"settings": {"steps": 4}}, TypeError, "ConditionsContext.settings"),  # a dict, as the stages sent before
    ({"init_seed": -1}, ValueError, "ConditionsContext.init_seed"),
    ({"max_new_tokens": 0}, ValueError, "ConditionsContext.max_new_tokens"),
    ({"stop_ids": [1, "2"]}, TypeError, "ConditionsContext.stop_ids"),
    ({"conditions": "full"}, TypeError, "ConditionsContext.conditions"),  # a name, not a list of names
    ({"conditions": []}, ValueError, "ConditionsContext.conditions"),
])
def test_a_bad_value_is_refused_in_one_line_naming_its_field(change, error, field):
    with pytest.raises(error) as err:
        ConditionsContext(**{**DECODING, "conditions": ["full"], **change})
    assert str(err.value).startswith(field + " must be") and "\n" not in str(err.value), str(err.value)


def test_trace_and_sweep_fields_are_checked_too():
    with pytest.raises(TypeError, match=r"TraceContext\.diagnostics"):
        TraceContext(settings=SETTINGS, init_seed=0, topk=16, diagnostics="yes")
    with pytest.raises(ValueError, match=r"SweepContext\.axis must be a field of WiseSettings"):
        SweepContext(axis="etta", values=[0.9], adaptive_key=None, **DECODING)
    with pytest.raises(ValueError, match=r"SweepContext\.adaptive_key must be a field of AdaptiveDiscovery"):
        SweepContext(axis="adaptive_threshold", values=[0.9], adaptive_key="theta", **DECODING)
    with pytest.raises(ValueError, match=r"SweepContext\.values"):
        SweepContext(axis="eta", values=[], adaptive_key=None, **DECODING)


def test_sequences_are_stored_as_tuples():
    ctx = CONTEXTS[1]
    assert ctx.conditions == ("full", "wise") and ctx.stop_ids == (1, 2)
    assert CONTEXTS[2].values == (0.8, 0.9)


@pytest.mark.parametrize("task, expected", [("trace", "TraceContext"), ("conditions", "ConditionsContext"),
                                            ("sweep", "SweepContext")])
def test_a_task_refuses_a_plain_dict_in_one_line(task, expected):
    with pytest.raises(TypeError) as err:
        get_task(task)(None, {"example_id": "e", "token_ids": [3, 4]}, {"settings": {}, "init_seed": 0})
    message = str(err.value)
    assert (f"work item {task!r} takes a pipelines.compute.tasks.contexts.{expected}" in message
            and message.endswith("got dict") and "\n" not in message), message


def test_a_task_refuses_another_tasks_context():
    with pytest.raises(TypeError, match="takes a .*ConditionsContext as its context, got TraceContext"):
        get_task("conditions")(None, {"examples": []}, CONTEXTS[0])


@pytest.mark.parametrize("ctx", CONTEXTS, ids=lambda c: type(c).__name__)
def test_a_context_round_trips_through_pickle(ctx):
    back = pickle.loads(pickle.dumps(ctx))
    assert back == ctx and type(back) is type(ctx)
    assert isinstance(back.settings, WiseSettings) and back.settings.adaptive == SETTINGS.adaptive


def test_wise_settings_refuse_an_untyped_adaptive_rule():
    with pytest.raises(TypeError, match="AdaptiveDiscovery"):
        PAPER_SETTINGS.replace(adaptive={"criterion": "jaccard_min", "threshold": 1.0})
