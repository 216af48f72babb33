"""The real-model report says what its numbers mean (issue 54, item 6): each table's sentence is computed
from the table (change the numbers and the sentence changes), n stands beside every interval with a
visible warning under 10, loop counts past the trained depth are marked, a convergence loop of T + 1
reads "did not converge", a small default run is labelled a smoke test, and the committed GPU study's
tables stand beside it."""
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.reports.real_findings import (accuracy_sentence, conditions_sentence, converged_cell, mechanism_sentence,
                                             nll_sentence, working_set_sentence)
from pipelines.reports.real_model_report import curve_lines, halting_lines, small_sample_label
from pipelines.reports.real_wise_report import condition_lines, mechanism_lines

ROOT = Path(__file__).resolve().parents[1]
TRAINED = (2, 8)


def curves(nll: dict[int, float], acc: dict[int, float], n_text: int = 2, n_needle: int = 12) -> list[dict]:
    """base at T = 1 and the LMA retrofit at each T, intervals +-0.1 around the mean."""
    rows = []
    for variant, points in (("base", {1: nll[1]}), ("lma", nll)):
        for T, x in points.items():
            a = acc[1] if variant == "base" else acc[T]
            rows.append({"variant": variant, "task": "text", "T": T, "n": n_text, "mean_nll": x, "nll_low": x - 0.1,
                         "nll_high": x + 0.1, "accuracy": None, "accuracy_low": None, "accuracy_high": None})
            rows.append({"variant": variant, "task": "needle", "T": T, "n": n_needle, "mean_nll": None, "nll_low": None,
                         "nll_high": None, "accuracy": a, "accuracy_low": a - 0.1, "accuracy_high": min(1.0, a + 0.1)})
    return rows


def test_the_nll_sentence_is_computed_from_the_table():
    rising = curves({1: 2.6, 2: 2.5, 4: 3.0, 16: 4.0}, {1: 0.5, 2: 1.0, 4: 1.0, 16: 0.3})
    said = nll_sentence(rising, TRAINED)
    assert "for the LMA retrofit NLL rises with loops past T = 2 (2.500 → 4.000 at T = 16)" in said
    assert "no looped variant beats" not in said  # 2.5 at T = 2 beats the base's 2.6
    falling = curves({1: 2.6, 2: 2.7, 4: 2.8, 8: 2.9}, {1: 0.5, 2: 0.5, 4: 0.5, 8: 0.5})
    said = nll_sentence(falling, TRAINED)
    assert "rises with loops past T = 2" not in said and "no looped variant beats the base's 2.600" in said


def test_the_accuracy_sentence_names_the_ceiling_and_the_fall():
    said = accuracy_sentence(curves({1: 2.6, 2: 2.5, 4: 3.0, 16: 4.0}, {1: 0.5, 2: 1.0, 4: 1.0, 16: 0.3}))
    assert "falls below the base's 0.500 (0.300 at T = 16)" in said
    assert "at the ceiling (1.000) at T = 2, 4" in said
    said = accuracy_sentence(curves({1: 2.6, 2: 2.5}, {1: 0.5, 2: 0.75}))
    assert "no variant falls below the base or reaches the ceiling" in said


def test_n_beside_every_interval_a_warning_under_ten_and_t_past_the_trained_depth():
    small = curve_lines(curves({1: 2.6, 2: 2.5, 16: 4.0}, {1: 0.5, 2: 1.0, 16: 0.3}, n_text=2, n_needle=12), TRAINED)
    text = "\n".join(small)
    assert "| variant | n | T = 1 | T = 2 | T = 16 † |" in text
    assert "| LMA retrofit | 2 | 2.600 [2.500, 2.700] |" in text and "| LMA retrofit | 12 | 0.500" in text
    assert text.count("**⚠ n = 2") == 1  # the text table (n = 2) warns; the needle table (n = 12) does not
    assert "† past the retrofit's trained depth (trained on 2–8 loops): T = 16." in text
    large = "\n".join(curve_lines(curves({1: 2.6, 2: 2.5}, {1: 0.5, 2: 1.0}, n_text=32, n_needle=128), TRAINED))
    assert "⚠" not in large and "†" not in large
    assert small_sample_label(curves({1: 2.6, 2: 2.5}, {1: 0.5, 2: 1.0}), [])[0].startswith(
        "**Small sample — a smoke test of the pipeline, not a measurement of the model**: n = 2 (text)")
    assert small_sample_label(curves({1: 2.6, 2: 2.5}, {1: 0.5, 2: 1.0}, n_text=32, n_needle=128), []) == []


def test_halting_table_has_n_and_its_sentence_compares_with_the_best_fixed_depth():
    rows = [{"method": m, "kind": k, "n": 12, "accuracy": a, "accuracy_low": a - 0.1, "accuracy_high": a,
             "mean_loops": l, "nll": 0.1, "best_fixed": "fixed@2", "mcnemar_best_p": p, "matched_fixed": "fixed@2",
             "mcnemar_matched_p": p, "only_method_right": 0, "only_matched_right": 1}
            for m, k, a, l, p in (("fixed@2", "fixed", 1.0, 2, 1.0), ("halting", "adaptive", 0.75, 1.5, 0.25))]
    text = "\n".join(halting_lines(rows))
    assert "Where it fails: below the best fixed depth's 1.000: halting (0.750); no difference has p < 0.05." in text
    assert "| halting | 12 | 0.750 [0.650, 0.750] |" in text and "**⚠ n = 12" not in text


def mech_row(T, n, **taus):
    return {"T": T, "task": "qa", "length": 512, "n": n, "mean_tokens": 400, "mean_gap": 0.0, "routing_first": 0.5,
            **{f"median_tau_{q}": taus.get(q, 3) for q in ("S_block", "S", "A", "H", "O")}}


def test_a_convergence_loop_of_t_plus_one_reads_did_not_converge():
    assert converged_cell(9, 8) == "9 (did not converge)" and converged_cell(8, 8) == "8"
    mech = [mech_row(8, 3, H=9, O=9), mech_row(16, 3, S=14)]
    said = mechanism_sentence(mech)
    assert "at T = 8 the median H, O did not converge within 8 loops (median T + 1 = 9)" in said
    assert "T = 16" not in said.split("Where it fails:")[1]  # every T = 16 median converged
    text = "\n".join(mechanism_lines(mech))
    assert "| 9 (did not converge) | 9 (did not converge) |" in text and "**⚠ n = 3 prompts" in text
    assert "routing settled before the representation in 50% of prompts per row" in said  # one value, no 50%–50%
    assert "in 25%–50% of prompts" in mechanism_sentence([mech_row(8, 3), {**mech_row(16, 3), "routing_first": 0.25}])


def test_a_working_set_range_reads_as_one_value_where_its_ends_agree():
    row = {"T": 8, "length": 512, "density": 0.442, "retained_min": 0.977}
    assert "It keeps 0.442 of the blocks on average" in working_set_sentence([row, {**row, "density": 0.4421}])
    assert "It keeps 0.424–0.442 of the blocks" in working_set_sentence([row, {**row, "density": 0.424}])


def condition(cond, T, acc, nll, d, lo, n=12):
    return {"T": T, "t_d": 3, "w": 1, "task": "qa", "length": 512, "condition": cond, "n": n, "mean_nll": nll,
            "delta_nll": d, "delta_nll_low": lo, "delta_nll_high": None if d is None else d + 0.1, "accuracy": acc,
            "accuracy_low": acc, "accuracy_high": acc, "delta_accuracy": 0.0, "delta_accuracy_low": 0.0,
            "delta_accuracy_high": 0.0, "mcnemar_p": 1.0, "em": acc, "f1": acc, "answers_changed": 0.0,
            "mean_discovery_step": 3.0, "density": 0.4, "retained_future_mass": 0.97}


def test_the_conditions_sentence_says_ceiling_worse_conditions_and_depth_past_training():
    at_ceiling = [condition("full", 8, 1.0, 0.1, None, None), condition("wise", 8, 1.0, 0.2, 0.1, 0.05)]
    said = conditions_sentence(at_ceiling, "qa", {}, TRAINED)
    assert "accuracy is 1.00 for every condition, at the ceiling, so none differs from Full here" in said
    assert "NLL above Full with the interval above 0 for wise (largest: wise, +0.1)" in said
    deeper = [condition("full", 16, 0.5, 3.5, None, None), condition("truncate", 16, 1.0, 0.1, -3.4, -3.5)]
    said = conditions_sentence(deeper, "qa", {8: 0.1}, TRAINED)
    assert "above it truncate 1.00" in said and "no condition's NLL is above Full" in said
    assert "T = 16 is past the trained depth (8): Full's own NLL is 3.5 here against 0.1 at T = 8" in said
    text = "\n".join(condition_lines(at_ceiling + deeper, TRAINED, [(8, 3, 1)], ["full", "wise", "truncate"]))
    assert "**Conditions, T = 16 † past the trained depth (2–8 loops)" in text
    assert "| wise | 12 | 1.00 [1.00, 1.00] |" in text and "⚠" not in text


def test_the_report_shows_the_committed_gpu_study_beside_the_default_run(monkeypatch):
    pytest.importorskip("duckdb")  # pipelines.real.gpu_study reads through pipelines.store
    from pipelines.config.params import load_params
    from pipelines.real.gpu_study import REAL_MODEL, REAL_WISE, gpu_study_markdown, latest_run

    if latest_run(ROOT / REAL_MODEL[0], REAL_MODEL[1]) is None or latest_run(ROOT / REAL_WISE[0], REAL_WISE[1]) is None:
        pytest.skip("no committed GPU study under benchmarks/results")
    md = gpu_study_markdown(load_params(ROOT / "params.yaml"), ROOT)
    assert "**Real model, GPU study** (`benchmarks/results/real-h200/" in md
    run = latest_run(ROOT / REAL_MODEL[0], REAL_MODEL[1])
    curves = pq.read_table(run / "curves.parquet").to_pylist()
    n = {task: next(r["n"] for r in curves if (r["variant"], r["task"]) == ("lma", task) and r.get("hops") is None)
         for task in ("text", "needle")}
    assert f"| LMA retrofit | {n['text']} |" in md and f"| LMA retrofit | {n['needle']} |" in md  # n beside its CIs
    assert "is at the ceiling (1.000)" not in md.split("**Needle accuracy**")[1].split("|")[0]  # over all items
    assert "**WISE on the real model, GPU study**" in md and "(did not converge)" in md
    assert "Where it fails:" in md
