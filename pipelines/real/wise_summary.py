"""Summaries of stage real_wise (``pipelines.real.wise_study``): each condition against Full over paired
examples, and the mechanism's convergence loops.

Conditions, per (T, t_d, w, task, length, condition):
- QA: accuracy (greedy emits the city) with its percentile-bootstrap CI, the paired difference
  to Full with its CI, exact McNemar against Full, mean EM / F1 (SQuAD normalisation) and the
  fraction of answers that changed against Full;
- both tasks: mean NLL of the scored tokens (QA: the city; text: the window's last tokens) and the
  paired difference to Full (Δ NLL > 0: the condition is worse) with its CI;
- the late support's mean density and retained future mass (the supports derived from the trace).

Mechanism, per (T, task, length) and over all tasks ("all"): median convergence loop of S
(top-k token support Jaccard), S_block (the eta-mass block supports WISE uses), A (attention
JS), H (hidden state), O (attention output); the fraction of examples whose routing settles
before their representation (gap = min(tau_H, tau_O) - max(tau_S, tau_A) > 0) and the mean gap.
A loop count of T + 1 means "not within T loops".
"""
from __future__ import annotations

import numpy as np

from wise.analysis.stats import compare_paired, paired_bootstrap

KEYS = ("T", "t_d", "w", "task", "length")


def condition_summary(rows: list[dict], resamples: int, seed: int, level: float,
                      supports: list[dict] | None = None) -> list[dict]:
    groups: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in KEYS), {}).setdefault(r["condition"], {})[r["example_id"]] = r
    support = {}
    for s in supports or []:
        support.setdefault(tuple(s[k] for k in KEYS) + (s["condition"],), []).append(s)
    out = []
    for key, by_cond in groups.items():
        full = by_cond["full"]
        for cond, by_id in by_cond.items():
            what = f"{dict(zip(KEYS, key))}: {cond} against full"
            late = None if cond == "full" else resamples
            of = lambda rows, col: {i: r[col] for i, r in rows.items()}  # noqa: E731
            nll = compare_paired(of(full, "nll"), of(by_id, "nll"), n_resamples=late, seed=seed, level=level,
                                 binary=False, what=what)
            ids = nll.ids
            row = {**dict(zip(KEYS, key)), "condition": cond, "n": nll.n,
                   "mean_nll": nll.mean_other, "delta_nll": None, "delta_nll_low": None, "delta_nll_high": None,
                   "accuracy": None, "accuracy_low": None, "accuracy_high": None, "delta_accuracy": None,
                   "delta_accuracy_low": None, "delta_accuracy_high": None, "mcnemar_p": None, "em": None,
                   "f1": None, "answers_changed": None,
                   "mean_discovery_step": float(np.mean([by_id[i]["discovery_step"] for i in ids]))}
            if cond != "full":
                row["delta_nll"], row["delta_nll_low"], row["delta_nll_high"] = \
                    nll.delta, nll.delta_low, nll.delta_high
            if key[3] == "qa":
                correct = lambda rows: {i: float(bool(r["correct"])) for i, r in rows.items()}  # noqa: E731
                acc = compare_paired(correct(full), correct(by_id), n_resamples=late, seed=seed, level=level,
                                     binary=True, what=what)
                row["accuracy"], row["accuracy_low"], row["accuracy_high"] = \
                    paired_bootstrap(acc.other, resamples, seed, level)
                row["em"] = float(np.mean([by_id[i]["em"] for i in ids]))
                row["f1"] = float(np.mean([by_id[i]["f1"] for i in ids]))
                row["answers_changed"] = float(np.mean([by_id[i]["answer_change"] != "unchanged" for i in ids]))
                if cond != "full":
                    row["delta_accuracy"], row["delta_accuracy_low"], row["delta_accuracy_high"] = \
                        acc.delta, acc.delta_low, acc.delta_high
                    row["mcnemar_p"] = acc.mcnemar_p
            kept = support.get(key + (cond,), [])
            row["density"] = float(np.mean([s["density"] for s in kept])) if kept else None
            row["retained_future_mass"] = float(np.mean([s["retained_future_mass"] for s in kept])) if kept else None
            out.append(row)
    return out


def mechanism_summary(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["T"], r["task"], r["length"]), []).append(r)
        groups.setdefault((r["T"], "all", r["length"]), []).append(r)
    out = []
    for (T, task, length), g in sorted(groups.items()):
        gap = np.array([r["gap"] for r in g], dtype=float)
        out.append({"T": T, "task": task, "length": length, "n": len(g),
                    **{f"median_{k}": float(np.median([r[k] for r in g]))
                       for k in ("tau_S", "tau_S_block", "tau_A", "tau_H", "tau_O")},
                    "mean_gap": float(gap.mean()), "routing_first": float((gap > 0).mean()),
                    "mean_tokens": float(np.mean([r["n_tokens"] for r in g]))})
    return out


def working_set_table(supports: list[dict], condition: str = "wise") -> list[dict]:
    """Density and retained future mass of one condition's support per (T, t_d, w, length)."""
    groups: dict[tuple, list[dict]] = {}
    for s in supports:
        if s["condition"] == condition:
            groups.setdefault((s["T"], s["t_d"], s["w"], s["length"]), []).append(s)
    return [{"T": T, "t_d": t_d, "w": w, "length": n, "n": len(g),
             "density": float(np.mean([s["density"] for s in g])),
             "density_min": float(np.min([s["density"] for s in g])),
             "density_max": float(np.max([s["density"] for s in g])),
             "retained_future_mass": float(np.mean([s["retained_future_mass"] for s in g])),
             "retained_min": float(np.min([s["retained_future_mass"] for s in g]))}
            for (T, t_d, w, n), g in sorted(groups.items())]
