"""One cell of the RecurTrace calibrated case: measured beside expected on the constructed base.

    python -m pipelines.recurtrace.calibrated_cell --seed S --n N

builds ``recurtrace-chain`` (``wise.looped.chain_base``; overshooting and latched), draws N
known-depth test items (``wise.looped.known_depth``; mixed depths), ``--fit-n`` train and validation
items, and the bimodal d in {1, 6} variant's three splits, and measures on the test items of seed S:

- fixed@T accuracy of the base's own looping (the retrofit at initialisation, no memory: plain
  looping), of the latched base (the ideal) and of the LMA retrofit (``--lma``: the checkpoint the
  stage recurtrace_calibrated trained on the CPU, only the added modules, variable depth,
  ``wise.looped.latch``; or ``--lma-steps N`` trains a fresh one), each against
  ``wise.looped.calibrated_expectations`` (fixed_mismatch counts the (item, T) cells that disagree);
- every halting method on the loops of the latched model (or of the LMA retrofit when it latches):
  the oracle-distilled head (τ), confidence (λ), ACT (ponder cost), PonderNet (β): a curve of
  accuracy vs mean loops over each knob; the stability rule, the loss oracle and the correctness
  ceiling; the head's AUC against the oracle labels; exact McNemar of each method at its chosen
  knob against the fixed depth of matched mean loops. τ and λ are chosen on the validation items:
  the smallest mean depth whose accuracy is within ``margin`` (recurtrace.calibrated.margin) of the
  best on that curve (the paper's "smallest mean depth without losing accuracy", with the
  tolerance stated).

- WISE under adaptive depth (``wise.halting.online.wise_adaptive``) on the latched base at the
  oracle's depth (d for a reachable item, t_min otherwise) for the first ``wise_n`` test items:
  Full-adaptive and WISE-adaptive answers beside ``wise.looped.calibrated_expectations.wise_correct`` (which
  late loops need a fact outside the discovered working set).

It prints per method measured and expected accuracy and mean loops, and ends with the line
``fixed_mismatch=.. lma_latch=.. plain_after_d=.. head_auc=.. oracle_gap=..``.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from wise.looped import calibrated_expectations as C
from pipelines.recurtrace.calibrated_params import CellParams


def models(base_seed: int = 0):
    """(plain looping of the overshooting base, the latched base looped), block = the hop layer."""
    from wise.looped.chain_base import HOP_LAYER, ChainBaseSpec, build_chain_base
    from wise.models.looped.model import build_looped

    out = []
    for overshoot in (True, False):
        base, _ = build_chain_base(ChainBaseSpec(seed=base_seed, overshoot=overshoot))
        out.append(build_looped(base, use_lma=False, block_start=HOP_LAYER, block_layers=1, name=f"chain-{overshoot}"))
    return tuple(out)


def items_and_rows(p: CellParams, split: str, variant: str, n: int):
    from wise.data.synthchain import build_tokenizer
    from wise.looped.data import SpecialIds
    from wise.looped.known_depth import make_items, prompt_rows
    from wise.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

    items = make_items(split, p.seed, variant, n, p.context, p.max_hops, p.max_refine, p.unreachable)
    return items, prompt_rows(items, build_tokenizer(), SpecialIds(BOS_ID, EOS_ID, PAD_ID))


def fixed_rows(items, trajs, overshoot: bool, model: str, t_max: int) -> list[dict]:
    """One row per (item, T): measured and expected correctness."""
    return [{"model": model, "example_id": it.example_id, "T": T, "hops": it.hops, "refine": it.refine,
             "depth": it.depth, "reachable": it.reachable, "correct": tr.signals[T - 1].correct,
             "expected": C.correct(it, T, overshoot)} for it, tr in zip(items, trajs) for T in range(1, t_max + 1)]


def auc(scores, labels) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half); nan without both classes."""
    from scipy.stats import rankdata

    pos = sum(labels)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((sum(r for r, y in zip(ranks, labels) if y) - pos * (pos + 1) / 2) / (pos * neg))


def loss_oracle_depth(traj, t_min: int, delta: float) -> int:
    """The loss oracle as a rule: stop at the first t >= t_min whose label is 0 (no later loop
    lowers the loss by more than delta)."""
    from wise.halting.heads import oracle_labels

    labels = oracle_labels([s.nll for s in traj.signals], delta)
    for t in range(t_min, traj.loops):
        if not labels[t - 1]:
            return t
    return traj.loops


def run_rule(rule, trajs) -> tuple[list[int], list[bool]]:
    from wise.halting.rules import outcome, replay

    decisions = [replay(rule, tr) for tr in trajs]
    return [d.depth for d in decisions], [outcome(tr, d).correct for tr, d in zip(trajs, decisions)]


def point(method: str, knob, value, depths, correct, **extra) -> dict:
    return {"method": method, "knob": knob, "value": None if value is None else float(value),
            "accuracy": sum(correct) / len(correct), "mean_loops": sum(depths) / len(depths), **extra}


def choose(curve: list[dict], margin: float) -> dict:
    """Smallest mean loops whose accuracy is within `margin` of the curve's best (ties: higher accuracy)."""
    best = max(r["accuracy"] for r in curve)
    return min((r for r in curve if r["accuracy"] >= best - margin), key=lambda r: (r["mean_loops"], -r["accuracy"]))


def halting_methods(p: CellParams, train, held, test, variant: str) -> tuple[list[dict], dict, dict]:
    """Curves of every method on `test` (trained on `train`, knobs chosen on `held`): (points,
    chosen per method, per-test-item decisions of the chosen knobs)."""
    from wise.halting import heads as H
    from wise.halting import rules as R
    from wise.halting.trajectory import stacked

    data = stacked(train)
    fit = dict(steps=p.head_steps, lr=p.head_lr, l2=p.head_l2)
    head, _ = H.fit_halting(data["z"], data["nll"], p.t_min, p.delta, **fit)
    points, chosen, decisions = [], {}, {}
    for method, knob, grid, make in (
            ("halting", "tau", p.tau_grid, lambda th: R.Halting(head, th, p.t_min)),
            ("confidence", "lambda", p.confidence_grid, lambda th: R.Confidence(th, p.t_min))):
        held_curve = [point(method, knob, th, *run_rule(make(th), held)) for th in grid]
        pick = choose(held_curve, p.margin)["value"]
        for th in grid:
            d, c = run_rule(make(th), test)
            points.append(point(method, knob, th, d, c, chosen=th == pick))
            if th == pick:
                decisions[method] = (d, c)
    for method, knob, grid in (("act", "ponder_cost", p.act_costs), ("pondernet", "beta", p.pondernet_betas)):
        for value in grid:  # no choice on validation: the curve is the result (the paper's collapse)
            if method == "act":
                h, _ = H.fit_act(data["z"], data["gold_logprob"], data["mask"], p.act_epsilon, value, **fit)
                rule = R.ACT(h, p.act_epsilon)
            else:
                h, _ = H.fit_pondernet(data["z"], data["nll"], value, p.pondernet_prior, **fit)
                rule = R.PonderNet(h, p.seed)
            d, c = run_rule(rule, test)
            points.append(point(method, knob, value, d, c, chosen=value == grid[len(grid) // 2]))
            if value == grid[len(grid) // 2]:
                decisions[method] = (d, c)
    for method, rule in (("stability", R.Stability(p.t_min)), ("oracle_correct", R.OracleCorrect())):
        d, c = run_rule(rule, test)
        points.append(point(method, None, None, d, c, chosen=True))
        decisions[method] = (d, c)
    d = [loss_oracle_depth(tr, p.t_min, p.delta) for tr in test]
    c = [tr.signals[k - 1].correct for tr, k in zip(test, d)]
    points.append(point("oracle", None, None, d, c, chosen=True))
    decisions["oracle"] = (d, c)
    for r in points:
        r["variant"] = variant
    scores, labels = [], []
    for tr in test:
        ys = H.oracle_labels([s.nll for s in tr.signals], p.delta)
        for t in range(p.t_min, tr.loops):
            with torch.no_grad():
                scores.append(float(head(tr.signals[t - 1].z)))
            labels.append(ys[t - 1])
    chosen = {r["method"]: r for r in points if r.get("chosen")}
    chosen["halting"]["auc"] = auc(scores, labels)
    return points, chosen, decisions


def matched_mcnemar(decisions: dict, test) -> dict:
    """Exact McNemar of each method's chosen knob against the fixed depth nearest its mean loops."""
    from wise.analysis.stats import mcnemar

    out = {}
    for method, (d, c) in decisions.items():
        T = min(len(test[0].signals), max(1, round(sum(d) / len(d))))
        fixed = [tr.signals[T - 1].correct for tr in test]
        out[method] = {"matched_T": T, "mcnemar_p": mcnemar(c, fixed)}
    return out


def run_cell(p: CellParams, log=print, looped=None, lma=None) -> dict:
    """Everything one (seed, n) cell measures, with its expected values (see the module doc).
    `looped`: (plain looping of the base, the latched base looped), default built here; `lma`: a
    trained LMA retrofit of the base (default: trained here when p.lma_steps > 0, else none)."""
    from wise.halting.batched_trajectories import batched_trajectories

    plain, latched = looped or models(p.base_seed)
    sizes = {"test": p.n, "train": p.fit_n, "validation": p.fit_n}
    sets = {(split, variant): items_and_rows(p, split, variant, sizes[split] if variant == "mixed" else p.bimodal_n)
            for split in sizes for variant in ("mixed", "bimodal")}
    test_items, test_rows = sets[("test", "mixed")]
    fixed = []
    traj = {}
    for name, model, overshoot in (("plain", plain, True), ("ideal", latched, False)):
        traj[name] = batched_trajectories(model, test_rows, p.t_max)
        fixed += fixed_rows(test_items, traj[name], overshoot, name, p.t_max)
        log(f"  {name}: fixed-depth trajectories of {len(test_rows)} test items")
    if lma is None and p.lma_steps > 0:
        from wise.looped.latch import build_retrofit, train_latch

        lma = build_retrofit(True, seed=p.seed, base_seed=p.base_seed)
        lma_log = train_latch(lma, *sets[("train", "mixed")], p.lma_steps, seed=p.seed, t_max=p.t_max, **p.lma)
        log(f"  lma: trained {lma_log['steps']} steps in {lma_log['seconds']:.0f} s")
    if lma is not None:
        traj["lma"] = batched_trajectories(lma, test_rows, p.t_max)
        fixed += fixed_rows(test_items, traj["lma"], False, "lma", p.t_max)
    latch_rows = [r for r in fixed if r["T"] == p.t_max and r["reachable"] and r["depth"] < p.t_max]
    lma_latch = (sum(r["correct"] for r in latch_rows if r["model"] == "lma") /
                 max(1, sum(r["model"] == "lma" for r in latch_rows))) if lma is not None else math.nan
    halting_on = "lma" if lma is not None and lma_latch >= 0.99 else "ideal"
    halting_model = lma if halting_on == "lma" else latched
    points, chosen, mcn = [], {}, {}
    for variant in ("mixed", "bimodal"):
        tr = {split: traj[halting_on] if (split, variant) == ("test", "mixed") else
              batched_trajectories(halting_model, sets[(split, variant)][1], p.t_max)
              for split in ("train", "validation", "test")}
        pts, ch, dec = halting_methods(p, tr["train"], tr["validation"], tr["test"], variant)
        points += pts
        chosen[variant] = ch
        mcn[variant] = matched_mcnemar(dec, tr["test"])
        exp = C.expected_table(sets[("test", variant)][0], p.t_min, p.t_max, overshoot=False)
        for method, r in ch.items():
            r.update(mcn[variant][method])
            if method in exp:
                r["expected_accuracy"], r["expected_mean_loops"] = exp[method]["accuracy"], exp[method]["mean_loops"]
        log(f"  halting methods on the {variant} items ({halting_on} trajectories)")
    mix = chosen["mixed"]
    wise = wise_rows(p, latched, test_items, test_rows) if p.wise_n else []
    if wise:
        log(f"  wise under adaptive depth: {len(wise)} items")
    summary = {
        "fixed_mismatch": sum(r["correct"] != r["expected"] for r in fixed if r["model"] in ("plain", "ideal")),
        "lma_latch": lma_latch,
        "plain_after_d": (sum(r["correct"] for r in latch_rows if r["model"] == "plain") /
                          max(1, sum(r["model"] == "plain" for r in latch_rows))),
        "head_auc": mix["halting"]["auc"],
        "oracle_gap": mix["halting"]["mean_loops"] - mix["oracle"]["mean_loops"],
        "head_accuracy_gap": mix["halting"]["accuracy"] - mix["oracle"]["accuracy"],
        "halting_on": halting_on,
        **(wise_summary(wise) if wise else {}),
    }
    return {"params": asdict(p), "summary": summary, "fixed": fixed, "points": points, "chosen": chosen, "wise": wise,
            "shares": C.shares(test_items, p.t_max)}


def fixed_table(fixed: list[dict], t_max: int) -> list[dict]:
    """Per (model, T): measured and expected accuracy, mismatching items."""
    out = []
    for model in dict.fromkeys(r["model"] for r in fixed):
        for T in range(1, t_max + 1):
            g = [r for r in fixed if r["model"] == model and r["T"] == T]
            out.append({"model": model, "T": T, "n": len(g), "accuracy": sum(r["correct"] for r in g) / len(g),
                        "expected": sum(r["expected"] for r in g) / len(g),
                        "mismatches": sum(r["correct"] != r["expected"] for r in g)})
    return out


@dataclass(frozen=True)
class OracleDepth:
    """Stops at the item's known depth: d when reachable, t_min otherwise (the loss oracle's
    depth on the latched base), without reading the loop (so it runs under WISE)."""

    depths: dict
    name = "oracle_depth"
    kind = "adaptive"
    needs_readout = False
    needs_state = False
    threshold = None

    def decide(self, t, signals, example_id):
        from wise.halting.rules import Decision

        return Decision(t, t) if t >= self.depths[example_id] else None


def wise_rows(p: CellParams, latched, items, rows) -> list[dict]:
    """Full- and WISE-adaptive at the oracle's depth on the first p.wise_n items, with expected values."""
    from wise.halting.online import wise_adaptive
    from wise.data.synthchain import build_tokenizer
    from wise.engine.runner import WiseSettings, state_seed

    tok = build_tokenizer()
    items, rows = items[:p.wise_n], rows[:p.wise_n]
    rule = OracleDepth({it.example_id: (it.depth if it.reachable else p.t_min) for it in items})
    settings = WiseSettings(steps=p.t_max, backend="reference", **asdict(p.wise))
    out = []
    for it, row in zip(items, rows):
        res = wise_adaptive(latched, row, rule, p.t_max, "last", settings, state_seed(row.example_id, p.seed))
        tokens = [tok.id_to_token(i) for i in row.prompt_ids]
        out.append({"example_id": it.example_id, "hops": it.hops, "refine": it.refine, "depth": it.depth,
                    "reachable": it.reachable, "loops": res["wise"]["decision"].depth,
                    "full_correct": res["full"]["answer"].correct, "wise_correct": res["wise"]["answer"].correct,
                    "expected_full": it.reachable,
                    "expected_wise": C.wise_correct(it, tokens, p.wise.discovery_step, p.wise.window,
                                                    p.wise.block_size, p.wise.eta),
                    "late_density": res["density"], "full_tiles": res["full"]["tiles"],
                    "wise_tiles": res["wise"]["tiles"]})
    return out


def wise_summary(rows: list[dict]) -> dict:
    n = max(1, len(rows))
    return {"wise_n": len(rows),
            "wise_mismatch": sum((r["wise_correct"] != r["expected_wise"]) + (r["full_correct"] != r["expected_full"])
                                 for r in rows),
            "wise_accuracy": sum(r["wise_correct"] for r in rows) / n,
            "wise_expected_accuracy": sum(r["expected_wise"] for r in rows) / n,
            "wise_full_accuracy": sum(r["full_correct"] for r in rows) / n,
            "wise_tiles_saved": 1 - sum(r["wise_tiles"] for r in rows) / max(1, sum(r["full_tiles"] for r in rows))}


def wise_line(s: dict) -> str:
    return (f"wise (oracle depth, {s['wise_n']} items): full_accuracy={s['wise_full_accuracy']:.3f} "
            f"wise_accuracy={s['wise_accuracy']:.3f} expected={s['wise_expected_accuracy']:.3f} "
            f"mismatches={s['wise_mismatch']} tiles_saved={s['wise_tiles_saved']:.3f}")


def summary_line(s: dict) -> str:
    return (f"fixed_mismatch={s['fixed_mismatch']} lma_latch={s['lma_latch']:.3f} "
            f"plain_after_d={s['plain_after_d']:.3f} "
            f"head_auc={s['head_auc']:.3f} oracle_gap={s['oracle_gap']:.3f}")


def report_lines(cell: dict) -> list[str]:
    p = cell["params"]
    lines = ["fixed depth (test items, mixed): accuracy measured / expected (mismatching items)"]
    for model in dict.fromkeys(r["model"] for r in cell["fixed"]):
        rows = [r for r in fixed_table(cell["fixed"], p["t_max"]) if r["model"] == model]
        lines.append(f"  {model:6s} " + "  ".join(f"T={r['T']}: {r['accuracy']:.3f}/{r['expected']:.3f}"
                                                  + (f" ({r['mismatches']})" if r["mismatches"] else "") for r in rows))
    for variant, ch in cell["chosen"].items():
        lines.append(f"halting methods ({variant} items, {cell['summary']['halting_on']} trajectories): "
                     "accuracy, mean loops [expected], McNemar p vs fixed@matched")
        for method, r in ch.items():
            exp = (f" [{r['expected_accuracy']:.3f}, {r['expected_mean_loops']:.2f}]"
                   if "expected_accuracy" in r else "")
            knob = f" {r['knob']}={r['value']:g}" if r.get("knob") else ""
            lines.append(f"  {method:15s}{knob:18s} acc {r['accuracy']:.3f}  loops {r['mean_loops']:.2f}{exp}"
                         f"  p={r['mcnemar_p']:.3g} vs fixed@{r['matched_T']}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="seeds the items (and the LMA training)")
    ap.add_argument("--n", type=int, default=500, help="test items (mixed depths)")
    ap.add_argument("--fit-n", type=int, default=100, help="train and validation items (the heads, tau, lambda)")
    ap.add_argument("--bimodal-n", type=int, default=100, help="items per split of the bimodal variant")
    ap.add_argument("--lma", default="data/models/recurtrace-chain-lma",
                    help="the LMA retrofit checkpoint to measure (stage recurtrace_calibrated); skipped when absent")
    ap.add_argument("--lma-steps", type=int, default=0, help="train a fresh LMA retrofit this many steps instead (CPU)")
    ap.add_argument("--wise-n", type=int, default=64, help="test items run under WISE at the oracle's depth (0: none)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--params", default="params.yaml",
                    help="params file whose recurtrace.calibrated gives the other keys")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lma = None
    if args.lma_steps == 0 and Path(args.lma).is_dir():
        from wise.models.looped.checkpoint import load_retrofit

        lma = load_retrofit(args.lma)
    from pipelines.recurtrace.params import load_retrofit_params  # the other keys: the params file's

    cell = run_cell(replace(load_retrofit_params(args.params).calibrated, seed=args.seed, n=args.n,
                            fit_n=args.fit_n, bimodal_n=args.bimodal_n, lma_steps=args.lma_steps,
                            wise_n=args.wise_n),
                    log=lambda m: print(m, file=sys.stderr, flush=True), lma=lma)
    print("\n".join(report_lines(cell)))
    if cell["wise"]:
        print(wise_line(cell["summary"]))
    print(summary_line(cell["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
