"""The GPU study's real-model tables beside the default run's small sample: the report (statistics stage)
renders the committed H200 results under benchmarks/results with the same tables, sentences and marks
as the default run's sections (pipelines.reports.real_model_report, real_wise_report), so a reader
sees both samples and their n side by side.

Each study folder lists the retrofits it ran on (``checkpoints.txt``, ``sha256sum`` lines of
``data/models/<name>-<variant>/retrofit.safetensors``); a study whose list differs from the committed
checkpoints is labelled so, since its numbers then describe retrofits that are no longer the repo's."""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from pipelines.config.params import Params
from pipelines.real.wise_summary import working_set_table
from pipelines.reports.real_model_report import curve_lines, halting_lines
from pipelines.reports.real_wise_report import condition_lines, mechanism_lines, working_set_lines
from pipelines.store.artifacts import read_parquet

# Each study: its folder under benchmarks/results (one dated subfolder per run) and the tables it needs.
REAL_TRAIN = (Path("benchmarks/results/real-train-h200"),
              ("nll_lma.parquet", "nll_plain.parquet", "nll_t1.parquet", "checkpoints.txt"))
REAL_MODEL = (Path("benchmarks/results/real-h200"), ("curves.parquet", "halting.parquet"))
REAL_WISE = (Path("benchmarks/results/real-wise-gpu-*"),  # one folder per GPU kind (-h200, -h100)
             ("summary.parquet", "mechanism_summary.parquet", "supports.parquet"))
# what `scripts/real_wise_gpu.sh bench` adds to a real-WISE run folder (a table each, when present)
REAL_WISE_BENCH = ("kernel_real_smollm2.parquet", "kernel_real_huginn.parquet", "whole_real_huginn.parquet")


def latest_run(folder: Path, files: tuple[str, ...]) -> Path | None:
    """The newest dated run folder (by name) that holds every one of `files`; None when there is none.
    A `folder` whose name is a glob pattern takes the runs of every folder it matches."""
    folders = sorted(folder.parent.glob(folder.name)) if "*" in folder.name else [folder]
    runs = sorted((d for f in folders for d in f.glob("*") if d.is_dir() and all((d / x).is_file() for x in files)),
                  key=lambda d: d.name)
    return runs[-1] if runs else None


def _device(run: Path) -> str:
    gpu = run / "gpu.txt"
    return gpu.read_text().strip().split(",")[0] if gpu.is_file() else "a GPU"


def _sha256(path: Path) -> str:
    stat = path.stat()  # the key: a file rewritten in place is hashed again
    return _sha256_of(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)  # each study's section checks the same three checkpoints
def _sha256_of(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkpoint_sentence(run: Path, root: Path) -> str:
    """'' when the run lists the committed retrofits; else one sentence saying what it ran on."""
    listed = run / "checkpoints.txt"
    if not listed.is_file():
        return ("This run does not list the retrofits it ran on (no checkpoints.txt): "
                "they may not be the committed ones. ")
    for line in listed.read_text().splitlines():
        sha, path = line.split(maxsplit=1)
        current = root / path.strip()
        if not current.is_file() or _sha256(current) != sha:
            return (f"This run used retrofits other than the committed ones ({path.strip()} differs): its numbers "
                    "describe those checkpoints, not the repo's. ")
    return ""


def training_lines(run: Path, root: Path, p: Params) -> list[str]:
    """NLL vs loops of the base, the same-budget T = 1 baseline, plain and LMA on held-out windows (mean [CI]
    over windows, percentile bootstrap), LMA's best depth against its T = 1 and against the baseline (paired
    over windows) and each variant's training speed (train_summary_<variant>.json)."""
    from wise.analysis.stats import paired_bootstrap

    s = p.statistics
    rows = [r for v in ("t1", "plain", "lma") for r in read_parquet(run / f"nll_{v}.parquet").to_pylist()
            if r["variant"] != "base" or v == "t1"]
    nll = {(r["variant"], r["loops"], r["window"]): r["nll"] for r in rows}
    depths = sorted({r["loops"] for r in rows})
    windows = sorted({r["window"] for r in rows})

    def interval(values: list[float]) -> tuple[float, float, float]:
        return paired_bootstrap(values, s.bootstrap_resamples, seed=s.bootstrap_seed, level=s.ci_level)

    L = [f"**Real retrofits, GPU training** (`{run.relative_to(root).as_posix()}`, {_device(run)}): held-out NLL "
         f"(nats/token) vs loops T on {len(windows)} test-split windows, mean [{s.ci_level:.0%} CI over windows]. "
         + checkpoint_sentence(run, root), "", "| variant | " + " | ".join(f"T = {d}" for d in depths) + " |",
         "| --- |" + " --- |" * len(depths)]
    for variant in ("base", "t1", "plain", "lma"):
        cells = []
        for d in depths:
            values = [nll[variant, d, w] for w in windows if (variant, d, w) in nll]
            cells.append("{:.3f} [{:.3f}, {:.3f}]".format(*interval(values)) if values else "")
        L.append(f"| {variant} | " + " | ".join(cells) + " |")
    L.append("")
    lma_depths = [d for d in depths if all(("lma", d, w) in nll for w in windows)]
    if lma_depths and all(("t1", 1, w) in nll for w in windows):
        best = min(lma_depths, key=lambda d: np.mean([nll["lma", d, w] for w in windows]))
        for other, label in ((("lma", 1), "LMA's own T = 1 (the base)"), (("t1", 1), "the same-budget T = 1 baseline")):
            delta = [nll["lma", best, w] - nll[other[0], other[1], w] for w in windows]
            L.append("- LMA at its best depth T = {} minus {}: {:+.3f} nats [{:+.3f}, {:+.3f}] (paired over "
                     "windows).".format(best, label, *interval(delta)))
    for variant in ("lma", "plain", "t1"):
        path = run / f"train_summary_{variant}.json"
        if path.is_file():
            t = json.loads(path.read_text())
            L.append(f"- {variant}: {t['added']:,} trainable parameters, {t['steps']} steps, {t['tokens']:,} tokens in "
                     f"{t['train_seconds']:.0f} s ({t['tokens_per_s']:,.0f} tokens/s), stopped by {t['stopped_by']}.")
    return L + [""]


def wise_vs_truncate_sentence(summary: list[dict]) -> str:
    """Where WISE beats Truncate in `summary`, per (T, t_d, w, task, length): on text a lower mean NLL of the
    continuation, on QA a higher accuracy (equal accuracy: a lower answer NLL); means only, the tables give the
    CIs vs Full."""
    cells: dict[tuple, dict] = {}
    for s in summary:
        if s["condition"] in ("wise", "truncate"):
            cells.setdefault(tuple(s[k] for k in ("T", "t_d", "w", "task", "length")), {})[s["condition"]] = s
    beats, not_beats = [], []
    for (T, t_d, w, task, n), c in sorted(cells.items()):
        if len(c) < 2:
            continue
        wise, trunc = c["wise"], c["truncate"]
        if task == "qa" and wise["accuracy"] != trunc["accuracy"]:
            won = wise["accuracy"] > trunc["accuracy"]
            how = f"accuracy {wise['accuracy']:.2f} vs {trunc['accuracy']:.2f}"
        else:
            won, how = wise["mean_nll"] < trunc["mean_nll"], f"NLL {wise['mean_nll']:.3g} vs {trunc['mean_nll']:.3g}"
        (beats if won else not_beats).append(f"{task} {n} (T = {T}, t_d = {t_d}, w = {w}: {how})")
    if not beats and not not_beats:
        return "WISE vs Truncate: the table has no pair of the two conditions."
    return (f"WISE beats Truncate at {'; '.join(beats) or 'no length'}; "
            f"it does not at {'; '.join(not_beats) or 'no length'}.")


def gpu_study_markdown(p: Params, root: Path = Path(".")) -> str | None:
    """The GPU study's tables (NLL, needle accuracy, halting; WISE mechanism, working set, conditions, and the
    timings on its supports), or None when benchmarks/results holds neither study."""
    trained = (p.real_model.loops_min, p.real_model.loops_max)
    train_run = latest_run(root / REAL_TRAIN[0], REAL_TRAIN[1])
    model_run = latest_run(root / REAL_MODEL[0], REAL_MODEL[1])
    wise_run = latest_run(root / REAL_WISE[0], REAL_WISE[1])
    if model_run is None and wise_run is None and train_run is None:
        return None
    L = training_lines(train_run, root, p) if train_run is not None else []
    if model_run is not None:
        table = read_parquet(model_run / "curves.parquet").to_pylist()
        halting = read_parquet(model_run / "halting.parquet").to_pylist()
        L += [f"**Real model, GPU study** (`{model_run.relative_to(root).as_posix()}`, {_device(model_run)}; "
              "benchmarks/README.md says how it ran). " + checkpoint_sentence(model_run, root), ""]
        L += curve_lines(table, trained) + halting_lines(halting)
    if wise_run is not None:
        summary = read_parquet(wise_run / "summary.parquet").to_pylist()
        mech = read_parquet(wise_run / "mechanism_summary.parquet").to_pylist()
        working = working_set_table(read_parquet(wise_run / "supports.parquet").to_pylist())
        L += [f"**WISE on the real model, GPU study** (`{wise_run.relative_to(root).as_posix()}`, "
              f"{_device(wise_run)}). " + checkpoint_sentence(wise_run, root), ""]
        L += mechanism_lines(mech) + working_set_lines(working)
        settings = sorted({(s["T"], s["t_d"], s["w"]) for s in summary})  # the run's own, not params.yaml's
        L += [wise_vs_truncate_sentence(summary), ""]
        L += condition_lines(summary, trained, settings, list(p.conditions.names))
        L += benchmark_lines(*(read_parquet(wise_run / f).to_pylist() if (wise_run / f).is_file() else []
                               for f in REAL_WISE_BENCH))
    return "\n".join(L)


def _kind(r: dict) -> str:
    return "real" if r["label"].startswith("real") else "random"


def _fastest_per_length(rows: list[dict]) -> dict[tuple[int, str], dict]:
    """benchmarks.bench rows by (nominal length, real / random), the fastest pack of each."""
    out: dict[tuple[int, str], dict] = {}
    for r in rows:
        key = (r["nominal_length"], _kind(r))
        if r["status"] == "ok" and (key not in out or r["call_vs_cudnn"] > out[key]["call_vs_cudnn"]):
            out[key] = r
    return out


def _forward_per_length(rows: list[dict]) -> dict[tuple[int, str], dict]:
    """benchmarks.whole_model --layouts rows by (nominal length, real / random). Rows carry their nominal length;
    files written before they did (2026-12-06) name it only in the real row's label ("real:<id>@<length>"), with
    its same-density random row right after it."""
    out, length = {}, None
    for r in rows:
        if r.get("nominal_length") is not None:
            length = int(r["nominal_length"])
        elif r["label"].startswith("real:"):
            length = int(r["label"].rsplit("@", 1)[1])
        if length is not None:
            out[(length, _kind(r))] = r
    return out


def _x(r: dict | None, key: str, spec: str = ".2f") -> str:
    return "–" if r is None or r.get(key) is None else format(r[key], spec)


def benchmark_lines(smollm2: list[dict], huginn: list[dict], whole: list[dict]) -> list[str]:
    """The kernel and whole-forward timings on the study's saved supports (``scripts/real_wise_gpu.sh bench``: the
    first prompt of each length), one row per length: the SmolLM2 attention shape at its faster pack, the Huginn
    attention shape (the support's heads resampled to 55), and a whole Huginn-shape forward, each beside a random
    support of the same density."""
    small, large, forward = _fastest_per_length(smollm2), _fastest_per_length(huginn), _forward_per_length(whole)
    lengths = sorted({n for n, _ in small} | {n for n, _ in large} | {n for n, _ in forward})
    if not lengths:
        return []
    gpus = ", ".join(sorted({r["gpu"] for r in smollm2 + huginn + whole}))
    L = [f"**Kernel and whole forward on these supports** ({gpus}; `scripts/real_wise_gpu.sh bench` on each "
         "length's first prompt; in square brackets, a random support of the same density). Attention: speedup of one "
         "late-step call over cuDNN's dense attention (SmolLM2: 9 query / 3 KV heads, d 64, at its faster pack; "
         "Huginn shape: 55 heads, d 96). Whole forward: a random-init Huginn-shape T = 32 forward (12 dense + 20 "
         "WISE steps) vs Full, beside the most its attention share, density and t_d / T allow.", "",
         "| length | tokens | density | neighbour overlap | SmolLM2 attn x cuDNN | Huginn attn x cuDNN "
         "| whole forward x | bound | reached |", "| --- |" + " --- |" * 8]
    for n in lengths:
        s, h, w = small.get((n, "real")), large.get((n, "real")), forward.get((n, "real"))
        first = s or h or w
        pack = f" (pack {s['pack']})" if s else ""
        L.append(f"| {n} | {first['n']} | {_x(first, 'density', '.3f')} | {_x(s or h, 'neighbour_overlap')} | "
                 f"{_x(s, 'call_vs_cudnn')}{pack} [{_x(small.get((n, 'random')), 'call_vs_cudnn')}] | "
                 f"{_x(h, 'call_vs_cudnn')} [{_x(large.get((n, 'random')), 'call_vs_cudnn')}] | "
                 f"{_x(w, 'ratio', '.3f')} [{_x(forward.get((n, 'random')), 'ratio', '.3f')}] | "
                 f"{_x(w, 'bound', '.3f')} | {_x(w, 'bound_reached', '.0%')} |")
    return L + [""]
