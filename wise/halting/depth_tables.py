"""The adaptive-depth tables from per-(example, method) rows.

A row: example_id, benchmark, method, depth, loops_computed, correct, nll, correct_at_1 (the
example's answer after one loop: "hard" items are wrong there). Groups are each benchmark and
"all" (every example). McNemar pairs every method with the best fixed depth on example id
(``wise.analysis.stats.mcnemar``: exact, two-sided).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from wise.analysis.stats import discordant_counts, mcnemar

ALL = "all"


def _groups(rows: Sequence[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        for bench in (r["benchmark"], ALL):
            out[(bench, r["method"])].append(r)
    return out


def paired(rows: Sequence[dict], method: str, other: str, benchmark: str = ALL) -> tuple[list[bool], list[bool]]:
    """Correctness of `method` and `other` on the examples both ran, in example-id order."""
    def of(m):
        return {r["example_id"]: r["correct"] for r in rows
                if r["method"] == m and benchmark in (ALL, r["benchmark"])}
    a, b = of(method), of(other)
    if set(a) != set(b):
        raise ValueError(f"methods {method} and {other} ran on different examples")
    ids = sorted(a)
    return [a[i] for i in ids], [b[i] for i in ids]


def summarize(rows: Sequence[dict], best: str, order: Sequence[str],
              seconds: dict[tuple[str, str], list[float]] | None = None) -> list[dict]:
    """One row per (benchmark, method): n, accuracy, mean NLL, mean loops (the depth answered
    from) and mean loops computed, how many online runs timed it (`seconds[(benchmark, method)]`; their
    wall time is a measurement that differs run to run, so it is not a column: ``wall_ms``), and
    McNemar against `best`."""
    seconds = seconds or {}
    rank = {m: i for i, m in enumerate(order)}
    groups = _groups(rows)
    out = []
    for (bench, method), g in sorted(groups.items(), key=lambda kv: (kv[0][0] == ALL, kv[0][0],
                                                                      rank.get(kv[0][1], len(rank)))):
        mine, ref = paired(rows, method, best, bench)
        only_mine, only_ref = discordant_counts(mine, ref)
        secs = seconds.get((bench, method), [])
        out.append({"benchmark": bench, "method": method, "kind": g[0]["kind"], "threshold": g[0]["threshold"],
                    "n": len(g), "accuracy": sum(r["correct"] for r in g) / len(g),
                    "nll": sum(r["nll"] for r in g) / len(g),
                    "mean_loops": sum(r["depth"] for r in g) / len(g),
                    "mean_loops_computed": sum(r["loops_computed"] for r in g) / len(g),
                    "timed": len(secs),
                    "best_fixed": best, "mcnemar_p": mcnemar(mine, ref),
                    "only_method_right": only_mine, "only_best_right": only_ref})
    return out


def wall_ms(seconds: dict[tuple[str, str], list[float]], benchmark: str = ALL) -> dict[str, float]:
    """Mean wall milliseconds per example of each method's online runs on `benchmark`."""
    return {method: 1000 * sum(secs) / len(secs) for (bench, method), secs in seconds.items()
            if bench == benchmark and secs}


def depth_vs_difficulty(rows: Sequence[dict], methods: Sequence[str]) -> list[dict]:
    """Mean loops of the items wrong after one loop ("hard") and right after one loop ("easy")."""
    out = []
    for (bench, method), g in sorted(_groups([r for r in rows if r["method"] in methods]).items(),
                                     key=lambda kv: (kv[0][0] == ALL, kv[0][0], list(methods).index(kv[0][1]))):
        for group, right in (("hard", False), ("easy", True)):
            sub = [r for r in g if r["correct_at_1"] == right]
            out.append({"benchmark": bench, "method": method, "difficulty": group, "n": len(sub),
                        "mean_loops": sum(r["depth"] for r in sub) / len(sub) if sub else None,
                        "accuracy": sum(r["correct"] for r in sub) / len(sub) if sub else None})
    return out


def histogram(rows: Sequence[dict], methods: Sequence[str], t_max: int) -> list[dict]:
    """How many examples each method answered after each loop count 1..t_max (zeros included)."""
    out = []
    for (bench, method), g in sorted(_groups([r for r in rows if r["method"] in methods]).items(),
                                     key=lambda kv: (kv[0][0] == ALL, kv[0][0], list(methods).index(kv[0][1]))):
        counts = defaultdict(int)
        for r in g:
            counts[r["depth"]] += 1
        out += [{"benchmark": bench, "method": method, "loops": t, "count": counts[t]} for t in range(1, t_max + 1)]
    return out


def wise_summary(rows: Sequence[dict]) -> list[dict]:
    """WISE-adaptive vs Full-adaptive per (benchmark and all, method): accuracy, NLL, mean loops
    and attention tiles of each, the share of tiles WISE saved, how many rows ran late loops (past
    t_d) and their support density, agreement and McNemar (paired on example)."""
    out = []
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    order: list[str] = []
    for r in rows:
        if r["method"] not in order:
            order.append(r["method"])
        by[(r["benchmark"], r["method"])].append(r)
        by[(ALL, r["method"])].append(r)
    for bench, method in sorted(by, key=lambda k: (k[0] == ALL, k[0], order.index(k[1]))):
        g = sorted(by[(bench, method)], key=lambda r: r["example_id"])
        full, wise = [r["full_correct"] for r in g], [r["wise_correct"] for r in g]
        ft, wt = sum(r["full_tiles"] for r in g), sum(r["wise_tiles"] for r in g)
        late = [r for r in g if r["late_loops"] > 0]
        out.append({"benchmark": bench, "method": method, "n": len(g), "full_accuracy": sum(full) / len(g),
                    "wise_accuracy": sum(wise) / len(g),
                    "full_nll": sum(r["full_nll"] for r in g) / len(g),
                    "wise_nll": sum(r["wise_nll"] for r in g) / len(g),
                    "full_mean_loops": sum(r["full_depth"] for r in g) / len(g),
                    "wise_mean_loops": sum(r["wise_depth"] for r in g) / len(g),
                    "full_tiles_per_example": ft / len(g), "wise_tiles_per_example": wt / len(g),
                    "tiles_saved": 1 - wt / ft if ft else 0.0,
                    "with_late_loops": len(late),
                    "late_density": (sum(r["late_density"] for r in late) / len(late)) if late else None,
                    "same_prediction": sum(r["same_prediction"] for r in g) / len(g),
                    "mcnemar_p": mcnemar(wise, full)})
    return out
