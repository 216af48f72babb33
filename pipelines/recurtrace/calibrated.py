"""Stage recurtrace_calibrated: the RecurTrace calibrated case (``recurtrace.calibrated``).

Writes the constructed base ``data/models/<name>`` (``wise.looped.chain_base``: save_pretrained,
tokenizer, card), loads it back through the retrofit loader (``wise.models.looped.base.load_base``, as a
Qwen3 / Llama base is loaded), checks that the angular-distance probe picks the hop layer (the
pinned block), and runs one cell (``pipelines.recurtrace.calibrated_cell.run_cell``) per seed. Outputs, all under
``data/retrofit/<name>/`` (so no other retrofit's tables are touched):

    fixed.parquet     per (seed, model, T): accuracy measured and expected, mismatching items
    points.parquet    per (seed, variant, method, knob value): accuracy and mean loops (the curves)
    chosen.parquet    per (seed, variant, method) at its chosen knob: measured, expected, McNemar
    summary.parquet   per seed: the CLI's summary line (and WISE's)
    wise.parquet      per (seed, item) of the first wise_n test items: Full- and WISE-adaptive at the
                      oracle's depth, answers measured and expected, attention tiles
    probe.parquet     the probe's table

With ``lma_steps > 0`` the LMA retrofit is trained once (the first seed's train items; CPU) and
saved as a retrofit checkpoint ``data/models/<name>-lma`` with its recipe (train_recipe.json) and
training log (train_log.json); a later run keeps a checkpoint whose recipe matches. Every cell then
measures that retrofit on its own test items.
    <name>/calibrated.md   the report's section (measured beside expected, spread over seeds)
    calibrated.json   headline metrics (dvc metrics show)
    figures/          accuracy vs T (plain, LMA, ideal, expected); accuracy vs mean loops per method
"""
from __future__ import annotations

import statistics as st
from dataclasses import replace
from pathlib import Path

from pipelines.config import schemas
from pipelines.recurtrace.params import RetrofitParams
from pipelines.store.artifacts import write_json, write_parquet, write_text

MODELS = ("plain", "lma", "ideal")


def out_dir(params: RetrofitParams) -> Path:
    return Path("data/retrofit") / params.calibrated.name


def base_dir(params: RetrofitParams) -> Path:
    return Path("data/models") / params.calibrated.name


def _spread(values) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    return f"{st.mean(values):.3f}" + (f" ({min(values):.3f}–{max(values):.3f})" if len(values) > 1 else "")


def markdown(fixed, chosen, summary, seeds, c) -> str:
    from pipelines.recurtrace.calibrated_cell import summary_line

    L = [f"Constructed base `data/models/{c.name}` (weights computed, not trained; its card says how), "
         f"{c.n} test items per seed (mixed depths: L 1..{c.max_hops}, m 0..{c.max_refine}, "
         f"{c.unreachable:.0%} with a hop fact removed), seeds {list(seeds)}; every number is the mean over "
         "seeds with its range. Expected values come from the items alone "
         "(`wise/looped/calibrated_expectations.py`).", "",
         "Fixed depth: accuracy measured / expected (plain = the base's own looping, no memory; ideal = the "
         "latched base; lma = the LMA retrofit trained on the CPU, expected = ideal)", "",
         "| model | " + " | ".join(f"T={T}" for T in range(1, c.t_max + 1)) + " | mismatching items |",
         "| --- |" + " --- |" * (c.t_max + 1)]
    for model in MODELS:
        rows = [r for r in fixed if r["model"] == model]
        if not rows:
            continue
        cells = [f"{_spread([r['accuracy'] for r in rows if r['T'] == T])} / "
                 f"{_spread([r['expected'] for r in rows if r['T'] == T])}" for T in range(1, c.t_max + 1)]
        L.append(f"| {model} | " + " | ".join(cells) + f" | {sum(r['mismatches'] for r in rows)} |")
    for variant in ("mixed", "bimodal"):
        L += ["", f"Halting methods on the {variant} test items (trajectories of the latched model or of a "
              "retrofit that latches): accuracy and mean loops, measured [expected]; McNemar against the fixed "
              "depth of matched mean loops (seed of the first cell)", "",
              "| method | knob | accuracy | mean loops | expected accuracy | expected loops | McNemar p |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        methods = list(dict.fromkeys(r["method"] for r in chosen if r["variant"] == variant))
        for m in methods:
            g = [r for r in chosen if r["variant"] == variant and r["method"] == m]
            knob = f"{g[0]['knob']}={g[0]['value']:g}" if g[0]["knob"] else "–"
            ea = [r["expected_accuracy"] for r in g if r["expected_accuracy"] is not None]
            el = [r["expected_mean_loops"] for r in g if r["expected_mean_loops"] is not None]
            L.append(f"| {m} | {knob} | {_spread([r['accuracy'] for r in g])} | {_spread([r['mean_loops'] for r in g])}"
                     f" | {_spread(ea)} | {_spread(el)} | {g[0]['mcnemar_p']:.3g} (fixed@{g[0]['matched_T']}) |")
    L += ["", "τ and λ are chosen on the validation items: the smallest mean loops whose accuracy is within "
          f"{c.margin} of the best accuracy on that knob's curve. ACT and PonderNet are tabled at the middle "
          "of their knob grids; the figure draws every knob value.", "",
          "Per seed (`python -m pipelines.recurtrace.calibrated_cell --seed S --n N` prints the same line):", ""]
    L += [f"    seed {s['seed']}: {summary_line(s)}" for s in summary]
    if summary and summary[0].get("wise_n"):
        from pipelines.recurtrace.calibrated_cell import wise_line

        L += ["", f"WISE under adaptive depth on the latched base (t_d = {c.wise.discovery_step} loops, w = "
              f"{c.wise.window}, B = {c.wise.block_size}, η = {c.wise.eta}), each item stopped at the oracle's depth: "
              "an answer survives iff every fact a loop after t_d reads lies in a block the discovery loops read "
              "(`wise.looped.calibrated_expectations.wise_correct`); tiles saved = late attention tiles WISE "
              "skips over the whole run.", ""]
        L += [f"    seed {s['seed']}: {wise_line(s)}" for s in summary]
    return "\n".join(L) + "\n"


def figures(fixed, points, folder: Path) -> dict:
    """Figure name -> its markdown line: the image, or, for a figure with no rows to draw, one
    sentence saying so (an empty chart says nothing). A stale PNG of an undrawn figure is removed,
    so neither calibrated.md nor `dvc plots show` shows an old run's picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    out = {}

    def save(fig, name: str, key: str, alt: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=110)
        plt.close(fig)
        out[key] = f"![{alt}](figures/{name}.png)"

    def skip(name: str, key: str, sentence: str) -> None:
        (folder / f"{name}.png").unlink(missing_ok=True)
        out[key] = sentence

    measured = [m for m in ("plain", "lma", "ideal") if any(r["model"] == m for r in fixed)]
    if measured:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for model, style in (("plain", "o-"), ("lma", "s-"), ("ideal", "^-")):
            rows = [r for r in fixed if r["model"] == model]
            if rows:
                Ts = sorted({r["T"] for r in rows})
                ax.plot(Ts, [st.mean(r["accuracy"] for r in rows if r["T"] == T) for T in Ts], style,
                        label=f"{model} (measured)")
        for model, style in (("plain", "k:"), ("ideal", "k--")):
            rows = [r for r in fixed if r["model"] == model]
            Ts = sorted({r["T"] for r in rows})
            ax.plot(Ts, [st.mean(r["expected"] for r in rows if r["T"] == T) for T in Ts], style,
                    label=f"{model} (expected)")
        ax.set(xlabel="loops T", ylabel="accuracy (test)", title="Fixed depth on the constructed base")
        ax.legend(fontsize=7)
        save(fig, "accuracy_vs_T", "accuracy_vs_T", "accuracy_vs_T")
    else:
        skip("accuracy_vs_T", "accuracy_vs_T", "Accuracy vs T: no fixed-depth rows (fixed.parquet is empty).")
    first_seed = points[0]["seed"] if points else None
    for variant in ("mixed", "bimodal"):
        pts = [r for r in points if r["variant"] == variant and r["seed"] == first_seed]
        if not pts:
            skip(f"accuracy_vs_loops_{variant}", f"loops_{variant}",
                 f"Accuracy vs mean loops ({variant} items): no halting points for these items "
                 "(points.parquet has no rows of them).")
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for method in dict.fromkeys(r["method"] for r in pts):
            g = sorted((r for r in pts if r["method"] == method), key=lambda r: r["mean_loops"])
            ax.plot([r["mean_loops"] for r in g], [r["accuracy"] for r in g], "o-" if len(g) > 1 else "s",
                    label=method, markersize=4)
        ax.set(xlabel="mean loops", ylabel="accuracy (test)", title=f"Accuracy vs mean loops ({variant} items)")
        ax.legend(fontsize=7)
        save(fig, f"accuracy_vs_loops_{variant}", f"loops_{variant}", f"loops_{variant}")
    return out


def ensure_lma(params: RetrofitParams, base_folder: Path, log=print):
    """The trained LMA retrofit data/models/<name>-lma (trained here unless its recipe matches)."""
    import json

    from wise.models.looped.base import load_base
    from wise.model_files.fingerprint import base_fingerprint
    from pipelines.recurtrace.calibrated_cell import items_and_rows
    from wise.looped.chain_base import HOP_LAYER
    from wise.models.looped.checkpoint import base_pointer, load_retrofit, save_retrofit
    from wise.looped.latch import LMA_SHAPE, train_latch
    from wise.models.looped.model import build_looped

    c = params.calibrated
    out = Path("data/models") / f"{c.name}-lma"
    seed = c.seeds[0]
    recipe = {"lma_steps": c.lma_steps, "lma": dict(c.lma), "seed": seed, "fit_n": c.fit_n, "context": c.context,
              "max_hops": c.max_hops, "max_refine": c.max_refine, "unreachable": c.unreachable, "t_max": c.t_max,
              "base_sha256": base_fingerprint(base_folder), "shape": LMA_SHAPE}
    if (out / "train_recipe.json").is_file() and json.loads((out / "train_recipe.json").read_text()) == recipe:
        log(f"recurtrace_calibrated: {out} holds this recipe; keeping it")
        return load_retrofit(out)
    model = build_looped(load_base(base_folder), base_pointer(str(base_folder), out), recipe["base_sha256"],
                         use_lma=True, block_start=HOP_LAYER, block_layers=1, seed=seed, name=f"{c.name}-lma",
                         **LMA_SHAPE)
    items, rows = items_and_rows(replace(c, seed=seed), "train", "mixed", c.fit_n)
    train_log = train_latch(model, items, rows, c.lma_steps, seed=seed, t_max=c.t_max, log=log, **c.lma)
    save_retrofit(model, out, tokenizer_from=base_folder)
    log(f"recurtrace_calibrated: trained {train_log['steps']} steps in {train_log['seconds']:.0f} s")
    # the committed folder keeps what the recipe fixes (steps, losses), not the wall time, which differs run to run
    write_json({k: v for k, v in train_log.items() if k != "seconds"}, out / "train_log.json")
    write_json(recipe, out / "train_recipe.json")
    return model


def run(params: RetrofitParams, log=print) -> dict:
    from wise.models.looped.base import load_base
    from pipelines.recurtrace.calibrated_cell import fixed_table, items_and_rows, models, run_cell
    from wise.looped.chain_base import HOP_LAYER, ChainBaseSpec, save_chain_base
    from wise.models.looped.model import build_looped
    from wise.looped.probe import block_distances

    c = params.calibrated
    folder = save_chain_base(base_dir(params), ChainBaseSpec(seed=c.base_seed))
    base = load_base(folder)  # the retrofit loader: LlamaForCausalLM from the saved folder
    _, rows = items_and_rows(replace(c, seed=0), "validation", "mixed", 16)
    probe = block_distances(base, [_probe_batch(rows)], 1, min_prefix=1, min_suffix=1)
    picked = next(r["start"] for r in probe if r["chosen"])
    if picked != c.block_start or picked != HOP_LAYER:
        raise RuntimeError(f"the angular-distance probe picked layer {picked}, not the pinned block "
                           f"recurtrace.calibrated.block_start = {c.block_start} (the hop layer {HOP_LAYER})")
    plain = build_looped(base, use_lma=False, block_start=HOP_LAYER, block_layers=1, name=f"{c.name}-plain")
    latched = models(c.base_seed)[1]
    lma = ensure_lma(params, folder, log) if c.lma_steps > 0 else None
    fixed, points, chosen, summary, wise = [], [], [], [], []
    for seed in c.seeds:
        log(f"recurtrace_calibrated: cell seed {seed}")
        cell = run_cell(replace(c, seed=seed), log=log, looped=(plain, latched), lma=lma)
        fixed += [{"seed": seed, **r} for r in fixed_table(cell["fixed"], c.t_max)]
        points += [{"seed": seed,
                    **{k: r.get(k) for k in ("variant", "method", "knob", "value", "accuracy", "mean_loops")}}
                   for r in cell["points"]]
        for variant, ch in cell["chosen"].items():
            chosen += [{"seed": seed, "variant": variant, "method": m, "knob": r.get("knob"), "value": r.get("value"),
                        "accuracy": r["accuracy"], "mean_loops": r["mean_loops"],
                        "expected_accuracy": r.get("expected_accuracy"),
                        "expected_mean_loops": r.get("expected_mean_loops"),
                        "matched_T": r["matched_T"], "mcnemar_p": r["mcnemar_p"], "auc": r.get("auc")}
                       for m, r in ch.items()]
        summary.append({"seed": seed, **cell["summary"]})
        wise += [{"seed": seed, **r} for r in cell["wise"]]
    out = out_dir(params)
    write_parquet(fixed, out / "fixed.parquet", schemas.CALIBRATED_FIXED)
    write_parquet(points, out / "points.parquet", schemas.CALIBRATED_POINTS)
    write_parquet(chosen, out / "chosen.parquet", schemas.CALIBRATED_CHOSEN)
    write_parquet(summary, out / "summary.parquet", schemas.CALIBRATED_SUMMARY)
    write_parquet(probe, out / "probe.parquet", schemas.BLOCK_PROBE)
    write_parquet(wise, out / "wise.parquet", schemas.CALIBRATED_WISE)
    figs = figures(fixed, points, out / "figures")
    md = markdown(fixed, chosen, summary, c.seeds, c)
    md += "\n" + "\n\n".join(figs.values()) + "\n"
    write_text(md, out / "calibrated.md")
    metrics = headline_metrics(summary)
    write_json(metrics, out / "calibrated.json")
    return metrics


def headline_metrics(summary: list[dict]) -> dict:
    """calibrated.json (`dvc metrics show`): the mean over seeds of each summary number; the per-seed
    values (their spread) are in summary.parquet. A number that is nan in every cell (no LMA
    retrofit) is left out: JSON has no nan."""
    metrics = {}
    for k in ("fixed_mismatch", "lma_latch", "plain_after_d", "head_auc", "oracle_gap", "wise_mismatch"):
        vals = [float(s[k]) for s in summary if k in s and s[k] == s[k]]
        if vals:
            metrics[k] = st.mean(vals)
    return metrics


def _probe_batch(rows):
    import torch

    n = max(len(r.prompt_ids) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r.prompt_ids)] = torch.tensor(r.prompt_ids)
        mask[i, :len(r.prompt_ids)] = True
    return ids, mask
