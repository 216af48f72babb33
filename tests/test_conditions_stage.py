"""The conditions stage's work items: examples of one prompt length go to a worker together, and a
batched item gives each example the rows it gets alone."""

import pytest
import torch

from pipelines.conditions import work_items
from pipelines.compute.tasks.conditions import run_conditions
from pipelines.compute.tasks.contexts import ConditionsContext
from wise.analysis.calibration import CONDITIONS
from wise.engine.conditions import ADAPTIVE
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from wise.engine.runner import PAPER_SETTINGS, WiseSettings


def row(i, n):
    ids = torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(i)).tolist()
    return {"example_id": f"ex{i}", "token_ids": ids, "answer_ids": ids[:2], "benchmark": "x"}


def test_work_items_group_prompts_of_one_length_up_to_the_batch_size():
    cohort = [row(i, n) for i, n in enumerate([40, 41, 40, 40, 41, 40, 39])]
    items = work_items(cohort, 3)
    assert [[e["example_id"] for e in it["examples"]] for it in items] == [
        ["ex0", "ex2", "ex3"], ["ex5"], ["ex1", "ex4"], ["ex6"]]
    assert all(len({len(e["token_ids"]) for e in it["examples"]}) == 1 for it in items)
    assert [len(it["examples"]) for it in work_items(cohort, 1)] == [1] * len(cohort)
    assert set(items[0]["examples"][0]) == {"example_id", "token_ids", "answer_ids"}  # only what workers need


def test_a_batched_item_gives_every_example_its_own_rows():
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    model = init_weights(RecurrentDepthModel(cfg), seed=0).eval()
    # wise_adaptive: the random model's supports hold from step 1, so it settles at min_step
    settings = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6,
                            adaptive=AdaptiveDiscovery(threshold=0.5, min_step=2, max_step=7, window=2))
    context = ConditionsContext(settings=settings, init_seed=0, conditions=(*CONDITIONS, ADAPTIVE), max_new_tokens=3,
                                stop_ids=(1,), generation="cached")
    cohort = [row(i, 48) for i in range(3)]
    (item,) = work_items(cohort, 8)
    batched = run_conditions(model, item, context)["examples"]
    assert [b["example_id"] for b in batched] == ["ex0", "ex1", "ex2"]
    assert [b["rows"][-1]["discovery_step"] for b in batched] == [2, 2, 2]  # its own depth, not t_d = 4
    for b, alone_item in zip(batched, work_items(cohort, 1)):
        (alone,) = run_conditions(model, alone_item, context)["examples"]
        for x, y in zip(b["rows"], alone["rows"]):
            assert (x["condition"], x["prediction_ids"], x["state_hash_td"], x["layout_bits"], x["discovery_step"]) == (
                y["condition"], y["prediction_ids"], y["state_hash_td"], y["layout_bits"], y["discovery_step"])
            assert x["gold_logprob"] == pytest.approx(y["gold_logprob"], abs=1e-5)
