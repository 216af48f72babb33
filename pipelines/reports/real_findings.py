"""What each real-model table shows and where the model fails, in one plain sentence computed from the
table itself (never written by hand), plus the marks every such table carries: n beside its
intervals, a visible warning when n < 10, loop counts past the retrofit's trained depth, and a
convergence loop of T + 1 spelled out as "did not converge"."""
from __future__ import annotations

from collections.abc import Sequence

SMALL_N = 10  # below this many examples a bootstrap interval says little about the model
PAST = "†"  # marks a loop count past the retrofit's trained depth
LABELS = {"base": "base (T = 1)", "loop": "plain loop (untrained)", "plain": "plain retrofit", "lma": "LMA retrofit",
          "t1": "same-budget T = 1 baseline"}


def small_n_warning(n: int, what: str) -> list[str]:
    """A bold line for a table over fewer than SMALL_N examples (empty otherwise)."""
    if n >= SMALL_N:
        return []
    return [f"**⚠ n = {n} {what} (< {SMALL_N}) in this table: a small sample; its means and intervals rest on "
            f"{n} example{'s' if n != 1 else ''} and cannot tell the variants apart.**", ""]


def loops_label(T: int, trained: tuple[int, int]) -> str:
    return f"T = {T} {PAST}" if T > trained[1] else f"T = {T}"


def past_note(depths: Sequence[int], trained: tuple[int, int]) -> list[str]:
    past = [T for T in depths if T > trained[1]]
    if not past:
        return []
    return [f"{PAST} past the retrofit's trained depth (trained on {trained[0]}–{trained[1]} loops): "
            f"T = {', '.join(map(str, past))}.", ""]


def converged_cell(value: float, T: int) -> str:
    """A median convergence loop; T + 1 (the censoring value) is written out."""
    return f"{value:g} (did not converge)" if value >= T + 1 else f"{value:g}"


def _series(table: list[dict], variant: str, task: str, key: str) -> list[tuple[int, float]]:
    return sorted((r["T"], r[key]) for r in table if (r["variant"], r["task"]) == (variant, task)
                  and r[key] is not None)


def nll_sentence(table: list[dict], trained: tuple[int, int]) -> str:
    """The held-out text NLL table: where each looped variant's NLL is lowest and whether it rises after."""
    n = max((r["n"] for r in table if r["task"] == "text"), default=0)
    base = _series(table, "base", "text", "mean_nll")
    parts = []
    for variant in ("loop", "plain", "lma"):
        s = _series(table, variant, "text", "mean_nll")
        if len(s) < 2:
            continue
        best_T, best = min(s, key=lambda x: x[1])
        last_T, last = s[-1]
        if last > best:
            parts.append(f"for the {LABELS[variant]} NLL rises with loops past T = {best_T} "
                         f"({best:.3f} → {last:.3f} at T = {last_T})")
        else:
            parts.append(f"the {LABELS[variant]} is lowest at T = {best_T} ({best:.3f})")
    beats = [v for v in ("loop", "plain", "lma") if base and any(x < base[0][1] for T, x in
                                                                  _series(table, v, "text", "mean_nll") if T > 1)]
    tail = "; no looped variant beats the base's " + f"{base[0][1]:.3f} at any T > 1" if base and not beats else ""
    return (f"Mean NLL per token of {n} held-out text windows at each loop count (lower is better). "
            f"Where it fails: {'; '.join(parts) or 'one loop count only, nothing to compare'}{tail}"
            f"{' (T past the trained depth marked ' + PAST + ')' if any(r['T'] > trained[1] for r in table) else ''}.")


def accuracy_sentence(table: list[dict]) -> str:
    """The needle accuracy table: which variants fall below the base, which sit at the ceiling."""
    n = max((r["n"] for r in table if r["task"] == "needle"), default=0)
    base = _series(table, "base", "needle", "accuracy")
    parts = []
    for variant in ("loop", "plain", "lma"):
        s = [(T, a) for T, a in _series(table, variant, "needle", "accuracy") if T > 1]
        if not s:
            continue
        worst_T, worst = min(s, key=lambda x: x[1])
        if base and worst < base[0][1]:
            parts.append(f"the {LABELS[variant]} falls below the base's {base[0][1]:.3f} "
                         f"({worst:.3f} at T = {worst_T})")
        ceiling = [T for T, a in s if a >= 1.0]
        if ceiling:
            parts.append(f"the {LABELS[variant]} is at the ceiling (1.000) at T = {', '.join(map(str, ceiling))}, "
                         "where the task cannot show a gain")
    return (f"Fraction of {n} hop items whose greedy answer starts with the city at the chain's end, per loop count. "
            f"Where it fails: {'; '.join(parts) or 'no variant falls below the base or reaches the ceiling'}.")


def halting_sentence(halting: list[dict]) -> str:
    if not halting:
        return "No halting rows."
    n = halting[0]["n"]
    best = halting[0]["best_fixed"]
    best_acc = next((r["accuracy"] for r in halting if r["method"] == best), None)
    adaptive = [r for r in halting if r["kind"] != "fixed"]
    worse = [f"{r['method']} ({r['accuracy']:.3f})" for r in adaptive
             if best_acc is not None and r["accuracy"] < best_acc]
    significant = [r["method"] for r in adaptive if r["mcnemar_best_p"] is not None and r["mcnemar_best_p"] < 0.05]
    fails = (f"below the best fixed depth's {best_acc:.3f}: {', '.join(worse)}" if worse else
             f"no rule is less accurate than the best fixed depth ({best_acc:.3f})" if best_acc is not None else
             "no best fixed depth in the table")
    return (f"Accuracy and mean loops of each halting rule beside the fixed depths on {n} hop test items "
            f"(McNemar against {best}). Where it fails: {fails}; "
            + (f"differences with p < 0.05: {', '.join(significant)}." if significant
               else "no difference has p < 0.05."))


def _span(values, fmt: str) -> str:
    """'lo–hi' of values as `fmt` formats them, one value where both ends read the same."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def mechanism_sentence(mech: list[dict]) -> str:
    """The convergence table: which quantities did not converge within T loops, and how often routing led."""
    censored: dict[int, set[str]] = {}
    for m in mech:
        for q in ("S_block", "S", "A", "H", "O"):
            if m[f"median_tau_{q}"] >= m["T"] + 1:
                censored.setdefault(m["T"], set()).add(q)
    order = ["S_block", "S", "A", "H", "O"]
    fails = "; ".join(f"at T = {T} the median {', '.join(q for q in order if q in qs)} did not converge within "
                      f"{T} loops (median T + 1 = {T + 1})" for T, qs in sorted(censored.items()))
    first = [m["routing_first"] for m in mech if m["routing_first"] is not None]
    lead = f"; routing settled before the representation in {_span(first, '.0%')} of prompts per row" if first else ""
    return ("Median loop at which each quantity converges per (T, task, length); T + 1 means it did not converge "
            f"within T loops. Where it fails: {fails or 'every median converged within T loops'}{lead}.")


def working_set_sentence(working: list[dict]) -> str:
    if not working:
        return "No working-set rows."
    low = min(working, key=lambda s: s["retained_min"])
    return (f"Fraction of causal key blocks the deployed working set keeps and the share of the late loops' Full "
            f"attention mass inside it. It keeps {_span([s['density'] for s in working], '.3f')} of the blocks on "
            f"average; where it loses most: "
            f"{low['retained_min']:.3f} of the mass kept for one prompt at T = {low['T']}, length {low['length']}.")


def conditions_sentence(rows: list[dict], task: str, others_full: dict[int, float], trained: tuple[int, int]) -> str:
    """One conditions table (one setting, task, length); `others_full`: Full's NLL at the other
    settings' T on the same task and length, to say how looping deeper moves Full itself."""
    full = next((r for r in rows if r["condition"] == "full"), None)
    if full is None:
        return "No Full row to compare against."
    T = full["T"]
    parts = []
    if task == "qa":
        what = (f"Accuracy (greedy answer starts with the city) and NLL of the city's tokens per condition on "
                f"{full['n']} QA prompts")
        accs = {r["condition"]: r["accuracy"] for r in rows}
        if len(set(accs.values())) == 1:
            parts.append(f"accuracy is {full['accuracy']:.2f} for every condition"
                         + (", at the ceiling" if full["accuracy"] >= 1.0 else "") + ", so none differs from Full here")
        else:
            below = [f"{c} {a:.2f}" for c, a in accs.items() if a < full["accuracy"]]
            above = [f"{c} {a:.2f}" for c, a in accs.items() if a > full["accuracy"]]
            sides = [f"below it {', '.join(below)}" if below else "", f"above it {', '.join(above)}" if above else ""]
            parts.append(f"against Full's {full['accuracy']:.2f}: " + "; ".join(x for x in sides if x))
    else:
        what = f"NLL of the last tokens of {full['n']} held-out windows per condition"
    worse = [r for r in rows if r["condition"] != "full" and r["delta_nll_low"] is not None and r["delta_nll_low"] > 0]
    if worse:
        top = max(worse, key=lambda r: r["delta_nll"])
        parts.append(f"NLL above Full with the interval above 0 for {', '.join(r['condition'] for r in worse)} "
                     f"(largest: {top['condition']}, +{top['delta_nll']:.3g})")
    else:
        parts.append("no condition's NLL is above Full with its interval above 0")
    shallower = {t: x for t, x in others_full.items() if t < T}
    if shallower and T > trained[1]:
        t0 = max(shallower)
        parts.append(f"T = {T} is past the trained depth ({trained[1]}): Full's own NLL is {full['mean_nll']:.3g} "
                     f"here against {shallower[t0]:.3g} at T = {t0}")
    return f"{what}, against Full. Where it fails: {'; '.join(parts)}."
