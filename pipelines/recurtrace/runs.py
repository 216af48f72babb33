"""The three RecurTrace products, each kept when its folder already holds exactly this recipe
(``dvc repro -f`` or a code change must not silently replace committed checkpoints and tables):

    ensure_base(params, out)                      # the embedded base decoder
    ensure_retrofit(params, "lma" | "plain", out) # a retrofit checkpoint
    ensure_table(params, {variant: folder}, out)  # the fixed-depth table

The DVC stages (``stages/recurtrace_train.py``, ``stages/recurtrace_eval.py``) call these; on a GPU
machine without DVC, ``scripts/recurtrace_gpu.sh`` runs those stages' commands.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from pipelines.recurtrace.params import RetrofitParams
from pipelines.config import schemas
from pipelines.store.artifacts import write_json, write_parquet, write_text

RECIPE = "train_recipe.json"
# "json" is the stage's DVC metrics file (a few headline numbers, fixed_depth_headline); "recipe"
# holds what the table was computed from (the recipe that decides whether it is kept, the safe-floor
# check, the run info), which `dvc metrics show` should not print.
TABLE_FILES = {"examples": "fixed_depth_examples.parquet", "summary": "fixed_depth.parquet",
               "json": "fixed_depth.json", "recipe": "fixed_depth_recipe.json", "markdown": "fixed_depth.md"}


def _same(path: Path, recipe: dict) -> bool:
    return path.is_file() and json.loads(path.read_text()) == json.loads(json.dumps(recipe))


def base_recipe(params: RetrofitParams) -> dict:
    return params.base_train.to_dict()


def retrofit_recipe(params: RetrofitParams, variant: str, base_folder: str | Path | None = None) -> dict:
    """The params of a variant plus, for a local base, the base's fingerprint (a retrained base
    changes the recipe)."""
    from wise.model_files.fingerprint import base_fingerprint

    recipe = params.recipe(variant)
    folder = Path(base_folder) if base_folder is not None else Path(params.base)
    if folder.is_dir():
        recipe["base_sha256"] = base_fingerprint(folder)
    return recipe


def is_current(params: RetrofitParams, what: str, out: str | Path, base_folder: str | Path | None = None) -> bool:
    """Does `out` hold the product `what` ("base" | "lma" | "plain") of exactly these params?"""
    recipe = base_recipe(params) if what == "base" else retrofit_recipe(params, what, base_folder)
    return _same(Path(out) / RECIPE, recipe)


def ensure_base(params: RetrofitParams, out: str | Path, device: str = "cpu", retrain: bool = False,
                workers: int | None = None, progress: bool = True) -> dict | None:
    """Train the embedded base into `out` unless it holds this recipe; None when kept."""
    from wise.looped.train import train_base

    out, recipe = Path(out), base_recipe(params)
    if not retrain and is_current(params, "base", out):
        return None
    summary = train_base(params.base_train, out, device=device, workers=workers, progress=progress)
    _fail_on_error(summary, out)
    write_json(recipe, out / RECIPE)
    return summary


def ensure_retrofit(params: RetrofitParams, variant: str, out: str | Path, device: str = "cpu",
                    base_folder: str | Path | None = None, retrain: bool = False,
                    workers: int | None = None, progress: bool = True) -> dict | None:
    from pipelines.recurtrace.train_retrofit import train_retrofit

    out, recipe = Path(out), retrofit_recipe(params, variant, base_folder)
    if not retrain and is_current(params, variant, out, base_folder):
        return None
    summary = train_retrofit(params, variant, out, device=device, base_folder=base_folder, workers=workers,
                             progress=progress)
    _fail_on_error(summary, out)
    write_json(recipe, out / RECIPE)
    return summary


def table_recipe(params: RetrofitParams, folders: dict) -> dict:
    from wise.models.looped.checkpoint import CONFIG_NAME, WEIGHTS_NAME
    from wise.looped.fixed_depth import checkpoint_fingerprint

    for variant, folder in sorted(folders.items()):
        absent = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (Path(folder) / n).is_file()]
        if absent:
            raise FileNotFoundError(f"retrofit {variant}: {folder} has no {', '.join(absent)}; train it first "
                                    f"(stage recurtrace_train@{variant}, or scripts/recurtrace_gpu.sh "
                                    "on a GPU)")

    return {"eval": dataclasses.asdict(params.eval), "dtype": params.dtype,
            "checkpoints": {v: checkpoint_fingerprint(f) for v, f in sorted(folders.items())}}


def fixed_depth_headline(summary: Sequence[dict]) -> dict:
    """fixed_depth.json: per retrofit, the fixed depth T with the best accuracy pooled over the
    benchmarks (weighted by n; a tie goes to the smaller T) and that accuracy. The whole table is
    fixed_depth.parquet."""
    out = {}
    for variant in sorted({r["variant"] for r in summary if r["T"] is not None}):
        pooled = {}
        for T in sorted({r["T"] for r in summary if r["variant"] == variant and r["T"] is not None}):
            rows = [r for r in summary if r["variant"] == variant and r["T"] == T]
            pooled[T] = sum(r["accuracy"] * r["n"] for r in rows) / sum(r["n"] for r in rows)
        best = max(pooled, key=lambda T: (pooled[T], -T))
        out[variant] = {"best_T": int(best), "accuracy": pooled[best]}
    return out


def _stored_table(out: Path) -> dict | None:
    """{"recipe", "floor", "info"} of the table in `out`: fixed_depth_recipe.json, or the
    fixed_depth.json of a table written before the two were split (it held them too)."""
    for name in (TABLE_FILES["recipe"], TABLE_FILES["json"]):
        path = out / name
        if path.is_file():
            stored = json.loads(path.read_text())
            if "recipe" in stored:
                return {k: stored.get(k) for k in ("recipe", "floor", "info")}
    return None


def ensure_table(params: RetrofitParams, folders: dict, out: str | Path, device: str = "cpu",
                 base_folder: str | Path | None = None, recompute: bool = False) -> dict | None:
    """Evaluate into `out` (the five TABLE_FILES) unless it holds the table of this recipe. A kept
    table gets its headline and recipe files rewritten from what is stored (a table from before
    they were split is brought to the current layout without evaluating again)."""
    import pyarrow.parquet as pq

    from wise.looped.fixed_depth import evaluate_checkpoints, markdown_table

    out, recipe = Path(out), table_recipe(params, folders)
    stored, summary_path = _stored_table(out), out / TABLE_FILES["summary"]
    if not recompute and stored is not None and stored["recipe"] == json.loads(json.dumps(recipe)) \
            and summary_path.is_file():
        write_json(stored, out / TABLE_FILES["recipe"])
        write_json(fixed_depth_headline(pq.read_table(summary_path).to_pylist()), out / TABLE_FILES["json"])
        return None
    result = evaluate_checkpoints(params, folders, device=device, base_folder=base_folder)
    write_parquet(result["examples"], out / TABLE_FILES["examples"], schemas.FIXED_DEPTH_EXAMPLES)
    write_parquet(result["summary"], out / TABLE_FILES["summary"], schemas.FIXED_DEPTH)
    table = markdown_table(result["summary"])
    write_text(table + "\n", out / TABLE_FILES["markdown"])
    write_json({"recipe": recipe, "floor": result["floor"], "info": result["info"]}, out / TABLE_FILES["recipe"])
    write_json(fixed_depth_headline(result["summary"]), out / TABLE_FILES["json"])
    return {**result, "table": table}


def _fail_on_error(summary: dict, out: Path) -> None:
    if summary["stopped_by"].startswith("error"):
        raise RuntimeError(f"training into {out} failed after {summary['steps']} steps "
                           f"({summary['stopped_by']}); no recipe written, so the next run retrains")
