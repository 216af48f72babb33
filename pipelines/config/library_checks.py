"""Checks of params against the library: names the engine, the data registry and the model presets
define (conditions, benchmarks, prompt styles, the adaptive and exit rules, packaged models), the
configured model's own facts (positions, head_dim for the kernel) and the cohort's prompt lengths.

They import the engine, the models and the data code, so they are not part of params parsing
(``pipelines.config.params`` stays light, and a stage's code deps hold only what the stage runs):
the DVC stage ``validate`` runs them, after the value checks of ``pipelines.config.validate``,
before any other stage (each lists its stamp as a dependency). Each raises ``ParamsError`` naming
the key.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pipelines.config.params import Params, load_params
from pipelines.config.paths import CALIBRATION_MODEL
from pipelines.config.validate import ParamsError, require
from wise.data import BENCHMARKS, PROMPT_STYLES
from wise.engine.conditions import ADAPTIVE, ALL_CONDITIONS
from wise.engine.discovery_depth import CRITERIA, AdaptiveDiscovery
from wise.models.checkpoint import is_hub_id


def check_params_file(path: str | Path, check_model: bool = True) -> Params:
    """``load_params`` (every key present, typed, in range), then the checks against the library
    and, with `check_model`, against the model ``model.source`` names; errors name `path`."""
    params = load_params(path)
    try:
        check_against_library(params)
        if check_model:
            check_model_source(params)
    except ParamsError as exc:
        raise ParamsError(str(exc).replace("params.yaml:", f"{path}:", 1)) from None
    return params


def check_against_library(p) -> None:
    """`p` (a Params): every name it gives is one the library knows, and the rules build."""
    c = p.cohorts
    unknown_b = [b for b in c.benchmarks if b not in BENCHMARKS]
    require(not unknown_b, "cohorts.benchmarks", list(c.benchmarks),
            f"unknown benchmark(s) {unknown_b}; known: {sorted(BENCHMARKS)}")
    require(c.prompt_style in PROMPT_STYLES, "cohorts.prompt_style", c.prompt_style,
            f"known styles: {sorted(PROMPT_STYLES)}")
    unknown = [n for n in p.conditions.names if n not in ALL_CONDITIONS]
    require(not unknown, "conditions.names", list(p.conditions.names),
            f"unknown condition(s) {unknown}; known: {list(ALL_CONDITIONS)}")
    from wise.models.config import PRESETS

    t = p.timing
    require(t.model_preset is None or t.model_preset in PRESETS, "timing.model_preset", t.model_preset,
            f"must be null (the configured model's shape) or one of {sorted(PRESETS)}")
    validate_adaptive(p)
    check_real_model(p.real_model)
    check_real_wise(p.real_wise)
    validate_exit_criteria(p)


def validate_adaptive(p) -> None:
    """wise.adaptive (condition wise_adaptive): every key present, each in range, the relations
    2 <= window <= min_step <= max_step < recurrence.steps; sweeps.adaptive_threshold in (0, 1]."""
    a, T = p.wise.adaptive, p.recurrence.steps
    keys = [f.name for f in dataclasses.fields(AdaptiveDiscovery)]
    unknown, missing = sorted(set(a) - set(keys)), [k for k in keys if k not in a]
    if unknown or missing:
        raise ParamsError(f"params.yaml: wise.adaptive: unknown key(s) {unknown}, missing key(s) {missing}; "
                          f"it takes {keys}")
    require(a["criterion"] in CRITERIA, "wise.adaptive.criterion", a["criterion"], f"must be one of {list(CRITERIA)}")
    th = a["threshold"]
    require(isinstance(th, (int, float)) and not isinstance(th, bool) and 0 < th <= 1, "wise.adaptive.threshold",
            th, "must be a number in (0, 1]")
    for k in ("min_step", "max_step", "window"):
        require(isinstance(a[k], int) and not isinstance(a[k], bool), f"wise.adaptive.{k}", a[k],
                "must be an integer")
    require(a["window"] >= 2, "wise.adaptive.window", a["window"], "must be >= 2 (consecutive steps compared)")
    require(a["window"] <= a["min_step"], "wise.adaptive.min_step", a["min_step"],
            f"must be >= wise.adaptive.window ({a['window']})")
    require(a["min_step"] <= a["max_step"] < T, "wise.adaptive.max_step", a["max_step"],
            f"must satisfy wise.adaptive.min_step ({a['min_step']}) <= max_step < recurrence.steps ({T})")
    sw = p.sweeps.adaptive_threshold
    require(len(sw) > 0 and len(set(sw)) == len(sw) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in sw),
        "sweeps.adaptive_threshold", list(sw), "must be a non-empty list of distinct numbers in (0, 1]")
    require(ADAPTIVE not in p.conditions.names or p.conditions.generation == "cached", "conditions.names",
            list(p.conditions.names), f"{ADAPTIVE} runs only with conditions.generation = cached")


def model_facts(source: str) -> dict | None:
    """Config facts of the configured model read cheaply (config.json or preset), None if unknown
    here (a hub id not downloaded yet)."""
    from wise.models.config import RecurrentConfig

    if source.startswith("preset:"):
        name = source[len("preset:"):].partition("@")[0]
        if name == "wise-chain":
            from wise.models.construct import ChainSpec, chain_config
            from wise.data.synthchain import build_tokenizer

            return _facts(chain_config(ChainSpec(), build_tokenizer().get_vocab_size()))
        return _facts(RecurrentConfig.from_name(name))
    if (Path(source) / "config.json").is_file():
        from wise.models.checkpoint import load_config

        try:  # the checkpoint's own mapping (wise, Huginn or Recurrent-Llama config.json)
            cfg = load_config(source)
        except (KeyError, ValueError) as exc:
            raise ParamsError(f"params.yaml: model.source = {source!r}: {exc}") from exc
        return _facts(cfg)
    return None


def _facts(cfg) -> dict:
    return {"max_positions": cfg.max_positions, "head_dim": cfg.head_dim, "heads": cfg.heads,
            "kv_heads": cfg.kv_heads, "family": cfg.name}


def check_backend(p, facts: dict | None) -> None:
    if p.conditions.backend != "kernel":
        return
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise ParamsError("params.yaml: conditions.backend = 'kernel': needs a CUDA device "
                          "(or TRITON_INTERPRET=1 to run the kernel in Triton's CPU interpreter)")
    if facts and facts.get("head_dim") not in (64, 96, 128):
        raise ParamsError(f"params.yaml: conditions.backend = 'kernel': the kernel supports head_dim "
                          f"64, 96 or 128, model {p.model.source} has {facts.get('head_dim')}; "
                          "use 'reference' or 'flex'")


def validate_exit_criteria(p) -> None:
    """exit_criteria: every criterion a valid ExitCriterion, conditions known (wise_adaptive picks
    its own depth per example, so exits are not applied to it)."""
    from wise.engine.exit_criteria import ExitCriterion

    x = p.exit_criteria
    require(len(x.criteria) > 0, "exit_criteria.criteria", list(x.criteria), "must not be empty")
    for i, c in enumerate(x.criteria):
        key = f"exit_criteria.criteria[{i}]"
        require(isinstance(c, dict) and set(c) == {"name", "threshold", "min_step"}, key, c,
                "must be a mapping of name, threshold, min_step")
        try:
            ExitCriterion(**c)
        except (TypeError, ValueError) as exc:
            raise ParamsError(f"params.yaml: {key} = {c!r}: {exc}") from None
    usable = [c for c in ALL_CONDITIONS if c != ADAPTIVE]
    require(len(x.conditions) > 0 and all(c in usable for c in x.conditions), "exit_criteria.conditions",
            list(x.conditions), f"must be a non-empty list of {usable}")


def check_real_model(m) -> None:
    """`real_model:`: a packaged base, needle facts the real-text generator has names for."""
    from wise.data.doc_text import CITIES, NAMES
    from wise.model_files.packaged_gguf import PACKAGED, packaged

    require(packaged(m.base) is not None, "real_model.base", m.base,
            f"must name a packaged preset: {', '.join('preset:' + n for n in sorted(PACKAGED))}")
    most = min(len(NAMES), len(CITIES))
    require(m.needle_facts <= most, "real_model.needle_facts", m.needle_facts, f"must be in 1..{most}")


def check_real_wise(r) -> None:
    """`real_wise:`: wise_adaptive's rule buildable and below the smallest T (the conditions it runs
    are conditions.names, checked with the rest of the conditions section)."""
    k = "real_wise."
    a = r.adaptive
    keys = [f.name for f in dataclasses.fields(AdaptiveDiscovery)]
    require(isinstance(a, dict) and sorted(a) == sorted(keys), k + "adaptive", a, f"must give exactly {keys}")
    try:
        AdaptiveDiscovery(**{**a, "threshold": float(a["threshold"])})
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: {k}adaptive = {a!r}: {exc}") from None
    smallest = min(T for T, _, _ in r.settings)
    require(a["max_step"] < smallest, k + "adaptive.max_step", a["max_step"],
            f"must be below the smallest T of real_wise.settings ({smallest})")


def check_model_source(p) -> dict | None:
    """The configured model exists (a folder, a preset, or a hub id to download), its positions hold
    every context length, and the kernel backend can serve it; its facts (None for a hub id). An
    unknown preset or a malformed source is refused first, in one line listing what is known."""
    from pipelines.config.model_source import check_model_source as check_source_form

    check_source_form(p.model.source)
    facts = model_facts(p.model.source)
    if facts is None and not is_hub_id(p.model.source):
        raise ParamsError(f"params.yaml: model.source = {p.model.source!r}: no such folder or preset")
    if facts is not None:
        too_long = [n for n in p.cohorts.context_lengths if n > facts["max_positions"]]
        require(not too_long, "cohorts.context_lengths", list(p.cohorts.context_lengths),
                f"{too_long} exceed the model's {facts['max_positions']} positions")
    check_backend(p, facts)
    return facts


def prompt_tokenizer(p):
    """The tokenizer the cohorts stage will use, when it can be had without a download: the
    calibration model's (built from code; its folder may not exist yet) or a local folder's."""
    if Path(p.model.source) == CALIBRATION_MODEL:
        from wise.data.synthchain import build_tokenizer

        return build_tokenizer()
    path = Path(p.model.source) / "tokenizer.json"
    if path.is_file():
        from wise.data.tokenizer import load_tokenizer

        return load_tokenizer(path)
    return None


def check_context_lengths(p, tok) -> None:
    """Each of ``cohorts.context_lengths`` must fit at least one prompt of each generated
    benchmark (public benchmarks load in the cohorts stage, which makes the same check)."""
    from wise.data import build_cohort_variants, load_examples, public_benchmarks

    c = p.cohorts

    def count_tokens(text: str) -> int:
        return 1 + len(tok.encode(text, add_special_tokens=False).ids)  # + BOS

    for bench in c.benchmarks:
        if bench in public_benchmarks.SPLIT_NAMES:
            continue
        examples = load_examples(bench, c.split, c.examples_per_benchmark, c.seed, **dict(c.sources.get(bench, {})))
        variants = build_cohort_variants(examples, list(c.context_lengths), count_tokens, c.seed, style=c.prompt_style)
        empty = [n for n in c.context_lengths if not any(n in cv.variants for cv in variants)]
        if empty:
            raise ParamsError(f"params.yaml: cohorts.context_lengths = {list(c.context_lengths)}: {empty} fit no "
                              f"{bench} prompt of this cohort (a prompt keeps its question and all its gold "
                              "evidence, never cut)")
