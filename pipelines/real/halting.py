"""Halting on the real model's LMA retrofit (part of stage real_eval; wise.halting does the work).

Trajectories of hop items (``wise.data.real_hops``) (every loop read: NLL and correctness of the city, top-1 confidence,
the pooled block state z) on the train split fit the three heads (the oracle-distilled halting
head on eq. 6 labels, ACT, PonderNet); on the held-out split the fixed-depth curve gives the best
fixed depth and the NLL reference, and the thresholds τ (halting head) and λ (confidence) are the
smallest mean depth that loses no held-out likelihood (``wise.halting.rules.select_threshold``).
On the test items every method is replayed on the same trajectories the loop curves came from.
Each method's accuracy gets a bootstrap CI, and an exact McNemar test pairs it with the best
held-out fixed depth and with the fixed depth nearest its own mean loops (matched compute), over
all test items (hops null) and again within each hop count (the same thresholds, the matched depth
taken from the method's mean loops on that hop count).
"""
from __future__ import annotations

from pipelines.config.params import RealModelParams, StatisticsParams


def nearest_fixed(mean_loops: float, t_max: int) -> int:
    """The fixed depth a method's mean loops matches (ties: the smaller)."""
    return min(range(1, t_max + 1), key=lambda T: (abs(T - mean_loops), T))


def method_summary(examples: list[dict], best: int, t_max: int, st: StatisticsParams) -> list[dict]:
    """Rows per method over all examples (hops None), then per hop count: ``hop_summary`` of each."""
    counts = sorted({r["hops"] for r in examples if r.get("hops") is not None})
    return hop_summary(examples, best, t_max, st, None) + [
        row for h in counts for row in hop_summary([r for r in examples if r["hops"] == h], best, t_max, st, h)]


def hop_summary(examples: list[dict], best: int, t_max: int, st: StatisticsParams, hops: int | None) -> list[dict]:
    """One row per method: accuracy with its bootstrap CI, NLL, mean loops, and the exact McNemar
    test of the method against the best fixed depth and against the fixed depth nearest its mean
    loops, each paired on example id (``wise.analysis.stats.compare_paired``)."""
    from wise.analysis.stats import compare_paired, paired_bootstrap

    def correct(method: str) -> dict:
        return {r["example_id"]: float(r["correct"]) for r in examples if r["method"] == method}

    summary = []
    for method in dict.fromkeys(r["method"] for r in examples):
        g = [r for r in examples if r["method"] == method]
        mean_loops = sum(r["depth"] for r in g) / len(g)
        acc = paired_bootstrap([float(r["correct"]) for r in g], st.bootstrap_resamples, st.bootstrap_seed, st.ci_level)
        refs = {"best": f"fixed@{best}", "matched": f"fixed@{nearest_fixed(mean_loops, t_max)}"}
        tests = {key: compare_paired(correct(ref), correct(method), n_resamples=None, binary=True,
                                     what=f"real_eval halting: {method} against {ref}") for key, ref in refs.items()}
        summary.append({"method": method, "kind": g[0]["kind"], "threshold": g[0]["threshold"], "hops": hops,
                        "n": len(g),
                        "accuracy": acc[0], "accuracy_low": acc[1], "accuracy_high": acc[2],
                        "nll": sum(r["nll"] for r in g) / len(g), "mean_loops": mean_loops,
                        "best_fixed": refs["best"], "mcnemar_best_p": tests["best"].mcnemar_p,
                        "matched_fixed": refs["matched"], "mcnemar_matched_p": tests["matched"].mcnemar_p,
                        "only_method_right": tests["matched"].only_other_right,
                        "only_matched_right": tests["matched"].only_reference_right})
    return summary


def run_halting(p: RealModelParams, st: StatisticsParams, model, tokenizer, corpus, test_trajs):
    """(summary rows, example rows, card) of every method on the test trajectories (loops 1..halting_t_max)."""
    from pipelines.real.model import hop_rows
    from wise.halting import heads as H
    from wise.halting import rules as R
    from wise.halting.trajectory import stacked, trajectories

    T = p.halting_t_max
    fit = {}
    for split, n in (("train", p.halting_train), ("heldout", p.halting_heldout)):
        print(f"real_eval: halting: {n} {split} trajectories of {T} loops", flush=True)
        fit[split] = trajectories(model, hop_rows(tokenizer, corpus, p, split, n), T, "mean")
    test = list(test_trajs)  # read at every loop 1..T by real_eval
    data = stacked(fit["train"])
    opt = dict(steps=p.halting_steps, lr=p.halting_lr, l2=p.halting_l2)
    heads = {"halting": H.fit_halting(data["z"], data["nll"], p.halting_t_min, p.halting_delta, **opt)[0],
             "act": H.fit_act(data["z"], data["gold_logprob"], data["mask"], p.halting_act_epsilon,
                              p.halting_act_ponder_cost, **opt)[0],
             "pondernet": H.fit_pondernet(data["z"], data["nll"], p.halting_pondernet_beta,
                                          p.halting_pondernet_prior, **opt)[0]}
    held = fit["heldout"]
    fixed = R.fixed_curve(held)
    ref_T, ref_nll = R.reference_nll(fixed, p.halting_t_min, T)
    best = R.best_fixed_depth(fixed)
    chosen = {}

    def halting(th):
        return R.Halting(heads["halting"], th, p.halting_t_min)

    for rule, grid, make in (("halting", p.halting_tau_grid, halting),
                             ("confidence", p.halting_confidence_grid, lambda th: R.Confidence(th, p.halting_t_min))):
        curve = R.curve(make, grid, held)
        pick, feasible = R.select_threshold(curve, ref_nll, p.halting_nll_tolerance)
        chosen[rule] = {**curve[pick], "feasible": feasible}
    card = {"t_min": p.halting_t_min, "t_max": T, "tau": chosen["halting"]["threshold"],
            "confidence_threshold": chosen["confidence"]["threshold"], "act_epsilon": p.halting_act_epsilon,
            "seed": p.seed, "best_fixed_depth": best, "reference": {"T": ref_T, "nll": ref_nll},
            "selected": chosen, "examples": {k: len(v) for k, v in fit.items()} | {"test": len(test)}}
    examples = []
    for rule in R.method_rules(heads, card):
        for tr in test:
            d = R.replay(rule, tr)
            s = R.outcome(tr, d)
            examples.append({"example_id": tr.example_id, "benchmark": tr.benchmark, "hops": tr.hops,
                             "method": rule.name,
                             "kind": rule.kind, "threshold": rule.threshold, "depth": d.depth,
                             "correct": s.correct, "nll": s.nll})
    summary = method_summary(examples, best, T, st)
    return summary, [{k: v for k, v in r.items() if k != "benchmark"} for r in examples], card
