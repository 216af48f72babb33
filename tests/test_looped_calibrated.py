"""The RecurTrace calibrated case: the constructed Llama base, its known-depth items, and every
measured number against the value derived from the items alone (wise.looped.calibrated_expectations).

The planted faults (oracle labels shifted one loop, the head reading the wrong pooled row, the
LMA gate forced shut) must each make a check fail: ``checks`` returns the failed checks, and the
mutation tests assert it is not empty under each fault.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from wise.looped import calibrated_expectations as C
from wise.halting import batched_trajectories
from params_files import retrofit_params
from pipelines.recurtrace.calibrated_cell import items_and_rows, run_cell
from pipelines.recurtrace.wise_reuse import WiseReuse
from wise.looped.chain_base import HOP_LAYER, ChainBaseSpec, build_chain_base, save_chain_base
from wise.looped.known_depth import make_items

SMALL = dict(n=60, fit_n=60, bimodal_n=40, lma_steps=0, wise_n=0)  # the LMA retrofit and WISE: their own tests below


def checks(cell: dict) -> list[str]:
    """The calibrated case's claims on a cell; the names of those that fail."""
    s, mix = cell["summary"], cell["chosen"]["mixed"]
    failed = []
    if s["fixed_mismatch"] != 0:
        failed.append(f"fixed_mismatch={s['fixed_mismatch']}")
    for variant, ch in cell["chosen"].items():
        for method in ("oracle", "oracle_correct", "confidence", "stability"):
            r = ch[method]
            if abs(r["accuracy"] - r["expected_accuracy"]) > 1e-9 \
                    or abs(r["mean_loops"] - r["expected_mean_loops"]) > 1e-9:
                failed.append(f"{variant} {method} measured != expected")
    if not (abs(mix["halting"]["accuracy"] - mix["oracle"]["expected_accuracy"]) <= 0.02
            and mix["halting"]["mean_loops"] - mix["oracle"]["expected_mean_loops"] <= 0.5):
        failed.append("halting head not within 0.5 loops of the oracle at equal accuracy")
    if not s["head_auc"] >= 0.95:
        failed.append(f"head_auc={s['head_auc']}")
    act = [r["mean_loops"] for r in cell["points"]
           if r["variant"] == "bimodal" and r["method"] == "act" and r["value"] > 0]
    if not min(act) <= 2.05:  # collapse: every item stopped by loop 2, the deep mode (d = 6) abandoned
        failed.append("ACT did not collapse on the bimodal items")
    if s["plain_after_d"] != 0:
        failed.append("plain looping kept answers past d")
    if not math.isnan(s["lma_latch"]) and not s["lma_latch"] > s["plain_after_d"] + 0.2:
        failed.append(f"lma_latch={s['lma_latch']} not above plain")
    return failed


def cell_params(**changes):
    """params.yaml's recurtrace.calibrated with `changes` (its checks run again)."""
    return dataclasses.replace(retrofit_params().calibrated, **changes)


@functools.lru_cache(maxsize=None)
def _cell(**kw) -> dict:
    return run_cell(cell_params(seed=0, **kw), log=lambda m: None)


def test_base_is_a_llama_saved_and_loaded_by_the_retrofit_loader(tmp_path):
    from transformers import LlamaForCausalLM

    from wise.models.looped.base import load_base
    from wise.model_files.fingerprint import base_fingerprint
    from wise.models.looped.model import build_looped, check_safe_floor

    folder = save_chain_base(tmp_path / "recurtrace-chain")
    base = load_base(folder)
    assert isinstance(base, LlamaForCausalLM)
    assert "constructed" in (folder / "README.md").read_text() and "not trained" in (folder / "README.md").read_text()
    assert base_fingerprint(folder)
    built, _ = build_chain_base()
    for (name, a), b in zip(built.state_dict().items(), base.state_dict().values()):
        assert torch.equal(a, b), name
    check_safe_floor(build_looped(base, use_lma=True, block_start=HOP_LAYER, block_layers=1))


def test_probe_picks_the_hop_layer():
    from pipelines.recurtrace.calibrated import _probe_batch
    from wise.looped.probe import block_distances

    base, _ = build_chain_base()
    _, rows = items_and_rows(cell_params(n=16), "validation", "mixed", 16)
    table = block_distances(base, [_probe_batch(rows)], 1, min_prefix=1, min_suffix=1)
    assert [r["start"] for r in table if r["chosen"]] == [HOP_LAYER]


def test_items_have_the_stated_depths():
    items = make_items("test", 0, "mixed", 400, 96)
    assert {it.depth for it in items} <= set(range(1, 9)) and {it.hops for it in items} == set(range(1, 7))
    assert 0.12 < sum(not it.reachable for it in items) / len(items) < 0.28
    bim = make_items("test", 0, "bimodal", 200, 96)
    assert {it.depth for it in bim} == {1, 6}
    assert make_items("test", 0, "mixed", 5, 96) == items[:5]  # a pure function of (split, seed, variant, index)
    with pytest.raises(ValueError, match="variant"):
        make_items("test", 0, "trimodal", 5, 96)


@pytest.mark.parametrize("overshoot", [True, False])
def test_fixed_depth_matches_the_construction(overshoot):
    from pipelines.recurtrace.calibrated_cell import models

    model = models()[0 if overshoot else 1]
    items, rows = items_and_rows(cell_params(n=40), "test", "mixed", 40)
    trajs = batched_trajectories.batched_trajectories(model, rows, 8)
    bad = [(it.example_id, T) for it, tr in zip(items, trajs) for T in range(1, 9)
           if tr.signals[T - 1].correct != C.correct(it, T, overshoot)]
    assert bad == []
    assert any(C.correct(it, it.depth, overshoot) for it in items)


def test_the_cell_meets_its_expected_values():
    assert checks(_cell(**SMALL)) == []


@pytest.mark.parametrize("fault", ["oracle_labels_shifted", "head_reads_wrong_row"])
def test_planted_faults_fail_the_checks(fault, monkeypatch):
    import wise.halting.heads as H

    if fault == "oracle_labels_shifted":
        original = H.oracle_labels

        def shifted(losses, delta):
            labels = original(losses, delta)
            return labels[1:] + [0]  # continue one loop less than the oracle says
        monkeypatch.setattr(H, "oracle_labels", shifted)
    else:
        monkeypatch.setattr(batched_trajectories, "POOLED_ROW", -2)  # the "Answer" row: no pointer, no flags
    cell = run_cell(cell_params(seed=0, **SMALL), log=lambda m: None)
    assert checks(cell) != []


def _wise_mismatches(items, rows, p) -> tuple[int, list[dict]]:
    from pipelines.recurtrace.calibrated_cell import models, wise_rows

    out = wise_rows(p, models()[1], items, rows)
    return sum((r["wise_correct"] != r["expected_wise"]) + (r["full_correct"] != r["expected_full"]) for r in out), out


def test_wise_under_adaptive_depth_matches_the_construction():
    p = cell_params(seed=1, wise_n=24)
    mismatches, rows = _wise_mismatches(*items_and_rows(p, "test", "mixed", p.wise_n), p)
    assert mismatches == 0, [r for r in rows if r["wise_correct"] != r["expected_wise"]]
    # the case must separate: some answers kept by WISE, some lost to a fact outside the working set
    assert any(r["expected_wise"] and r["depth"] > p.wise.discovery_step for r in rows)
    assert any(r["expected_full"] and not r["expected_wise"] for r in rows)


def _needs_loop(it, tokens, p, window_loops) -> bool:
    """Whether a late loop of `it` needs a fact outside the blocks read at `window_loops` (question row only)."""
    rows = C.fact_target_rows(tokens)
    block = lambda t: rows[it.chain[min(t, it.hops)]] // p.wise.block_size
    return it.reachable and not all(block(t) in {block(u) for u in window_loops} | {0}
                                    for t in range(p.wise.discovery_step + 1, it.depth + 1))


@pytest.mark.parametrize("fault", ["window_shifted", "working_set_ignored"])
def test_wise_faults_show_as_mismatches(fault, monkeypatch):
    import wise.halting.online
    import wise.engine.runner
    from wise.data.synthchain import build_tokenizer

    p = cell_params(seed=1, wise_n=3)
    td, w, tok = p.wise.discovery_step, p.wise.window, build_tokenizer()
    if fault == "window_shifted":  # discovery loops t_d-w..t_d-1
        monkeypatch.setattr(wise.engine.runner, "discovery_steps", lambda td, w: list(range(td - w, td)))
        shows = lambda it, toks: (_needs_loop(it, toks, p, range(td - w, td)) !=
                                  _needs_loop(it, toks, p, range(td - w + 1, td + 1)))
    else:  # late loops attend every key
        original = wise.halting.online.late_policy
        monkeypatch.setattr(wise.halting.online, "late_policy",
                            lambda prefix, cond, st: (None,) + tuple(original(prefix, cond, st)[1:]))
        shows = lambda it, toks: _needs_loop(it, toks, p, range(td - w + 1, td + 1))
    items, rows = items_and_rows(p, "test", "mixed", 200)
    cases = [(it, r) for it, r in zip(items, rows) if shows(it, [tok.id_to_token(i) for i in r.prompt_ids])][:3]
    assert cases
    assert _wise_mismatches([c[0] for c in cases], [c[1] for c in cases], p)[0] > 0


def test_wise_expectation_follows_eta_and_the_block_size():
    # the question row is 1 of k rows of its query block; the others read BOS (block 0)
    assert C.question_block_support(5, 2, 0.95) == {0, 5}
    assert C.question_block_support(5, 8, 0.95) == {0, 5}
    assert C.question_block_support(5, 8, 0.85) == {0}  # 7/8 of the mass already past eta
    assert C.question_block_support(0, 8, 0.95) == {0}
    assert C.question_block_support(3, 1, 0.95) == {3}
    with pytest.raises(ValueError, match=r"recurtrace\.calibrated\.wise\.block_size"):
        cell_params(wise=WiseReuse(discovery_step=3, window=2, block_size=16, eta=0.95))


LMA_CHECKPOINT = "data/models/recurtrace-chain-lma"  # stage recurtrace_calibrated (committed)


def latch_accuracy(model, n: int = 60) -> float:
    """Accuracy after t_max = 8 loops on the reachable test items with d < 8."""
    items, rows = items_and_rows(cell_params(seed=0), "test", "mixed", n)
    trajs = batched_trajectories.batched_trajectories(model, rows, 8)
    sel = [tr for it, tr in zip(items, trajs) if it.reachable and it.depth < 8]
    return sum(tr.signals[7].correct for tr in sel) / len(sel)


@pytest.mark.parametrize("gate", ["open", "forced_shut"])
def test_lma_retrofit_latches_unless_its_gate_is_shut(gate, monkeypatch):
    from pipelines.recurtrace.calibrated_cell import models
    from wise.models.looped.checkpoint import load_retrofit
    from wise.models.looped.lma import LoopMemoryAttention

    lma = load_retrofit(LMA_CHECKPOINT)
    plain = latch_accuracy(models()[0])
    if gate == "forced_shut":
        monkeypatch.setattr(LoopMemoryAttention, "forward",
                            lambda self, memory, distance: torch.zeros_like(memory[:, :, 0]))
    latched = latch_accuracy(lma) > plain + 0.2
    assert latched == (gate == "open")


def test_calibrated_metrics_are_seed_means_and_missing_points_are_a_sentence(tmp_path):
    """calibrated.json holds one number per summary quantity (the mean over seeds; the spread is in
    summary.parquet), leaving out one that is nan in every cell; a figure with no rows is a sentence
    in calibrated.md, not an empty chart, and its stale PNG is removed."""
    from pipelines.recurtrace.calibrated import figures, headline_metrics

    nan = float("nan")
    summary = [{"seed": s, "fixed_mismatch": 0, "lma_latch": latch, "plain_after_d": 0.0, "head_auc": nan,
                "oracle_gap": gap} for s, latch, gap in ((0, 0.25, 0.1), (1, 0.75, 0.3))]
    got = headline_metrics(summary)
    assert set(got) == {"fixed_mismatch", "lma_latch", "plain_after_d", "oracle_gap"}
    assert got["lma_latch"] == 0.5 and got["oracle_gap"] == pytest.approx(0.2)
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "accuracy_vs_loops_bimodal.png").write_bytes(b"an earlier run's figure")
    fixed = [{"model": "plain", "T": t, "accuracy": 0.5, "expected": 0.5} for t in (1, 2)]
    points = [{"seed": 0, "variant": "mixed", "method": "halting", "accuracy": 0.5, "mean_loops": 1.5}]
    lines = figures(fixed, points, folder)
    assert lines["accuracy_vs_T"] == "![accuracy_vs_T](figures/accuracy_vs_T.png)"
    assert lines["loops_mixed"] == "![loops_mixed](figures/accuracy_vs_loops_mixed.png)"
    assert lines["loops_bimodal"].startswith("Accuracy vs mean loops (bimodal items): no halting points")
    assert sorted(p.name for p in folder.iterdir()) == ["accuracy_vs_T.png", "accuracy_vs_loops_mixed.png"]


def test_wise_reuse_keys_are_wise_settings_keys():
    """retrofit.*.wise names, types and defaults are WiseSettings' (written out so parsing imports no engine)."""
    import dataclasses

    from wise.engine.runner import WiseSettings

    engine = {f.name: (f.type, f.default) for f in dataclasses.fields(WiseSettings)}
    reuse = {f.name: (f.type, f.default) for f in dataclasses.fields(WiseReuse)}
    assert reuse == {k: engine[k] for k in ("discovery_step", "window", "block_size", "eta")}
