"""The flags of `python -m wise.evaluate`, each defined once and added to the modes that take it.

``add_model_flags``: every mode's (the checkpoint, device and dtype); ``add_shared_flags``: those
and the generated test world's (its seeds and how its prompts are asked), for every mode but text.
``add_settings_flags``: the WISE settings, generated from the fields and defaults of
``WiseSettings`` (wise.engine.runner) and of the rule it holds, wise_adaptive's
``AdaptiveDiscovery`` (wise.engine.discovery_depth, as ``--adaptive-<field>``), so a field or a
default changed there reaches the command line by itself; ``settings_from`` builds the settings back
from the parsed flags. A field typed other than int, float, str or a dataclass (an optional object,
say) has no flag and keeps its default. Only the help texts are written here.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.runner import PAPER_SETTINGS, WiseSettings

DEFAULT_MODEL = "data/models/wise-small"
CALIBRATION_MODEL = "data/models/wise-chain"  # the default where every benchmark asked is synthchain

# What each generated flag means, by its dest (a nested rule's fields carry its field name as prefix).
SETTINGS_HELP = {
    "steps": "recurrence steps T",
    "discovery_step": "t_d: last full-attention step (conditions other than full)",
    "window": "w: the steps t_d-w+1..t_d whose supports form the working set",
    "block_size": "B: tokens per attention block",
    "eta": "η: attention mass each query block's support keeps",
    "backend": "late sparse attention: auto (gather on the CPU, reference elsewhere) | reference | "
               "gather | kernel | flex",
    "adaptive_criterion": "wise_adaptive: when the supports count as settled",
    "adaptive_threshold": "wise_adaptive: Jaccard threshold θ of consecutive supports",
    "adaptive_min_step": "wise_adaptive: first step at which discovery may end",
    "adaptive_max_step": "wise_adaptive: the step discovery ends at if the supports never settle",
    "adaptive_window": "wise_adaptive: window w (consecutive steps that must agree; the working set)",
}
SETTINGS_TITLES = {
    WiseSettings: "WISE settings (defaults: wise.engine.runner.PAPER_SETTINGS)",
    AdaptiveDiscovery: "wise_adaptive's rule (defaults: wise.engine.discovery_depth.AdaptiveDiscovery, "
                       "as params.yaml wise.adaptive)",
}
STARTING_POINTS = {WiseSettings: PAPER_SETTINGS, AdaptiveDiscovery: PAPER_SETTINGS.adaptive}
# The one flag whose default is not the settings' own: the best backend depends on the device.
CLI_DEFAULTS = {"backend": "auto"}


def add_model_flags(p: argparse.ArgumentParser, model_help: str | None = None) -> None:
    """The checkpoint, device and dtype. `model_help`: --model is required, with this help."""
    model = p.add_argument_group("checkpoint and device")
    model.add_argument("--model", default=None, required=model_help is not None,
                       help=model_help or f"checkpoint folder with tokenizer.json (default: {CALIBRATION_MODEL} "
                                          f"for synthchain, else {DEFAULT_MODEL})")
    model.add_argument("--device", default="auto", help="auto | cpu | cuda")
    model.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                       help="weights and activations (the kernel backend needs float16 or bfloat16 on CUDA)")


def add_shared_flags(p: argparse.ArgumentParser) -> None:
    """The checkpoint flags and the generated test world's (every mode but text)."""
    add_model_flags(p)
    world = p.add_argument_group("test world (prompts built as the cohorts stage builds them)")
    world.add_argument("--n", type=int, default=200, help="test examples (the first n of the split)")
    world.add_argument("--seed", type=int, default=123, help="test-world seed (also orders distractors)")
    world.add_argument("--split", default="test", help="split of the generated world")
    world.add_argument("--init-seed", type=int, default=0, help="base seed of the initial state")
    world.add_argument("--max-new-tokens", type=int, default=8, help="greedy answer tokens at most")
    world.add_argument("--follow-hops", type=int, default=16,
                       help="synthchain: two-token answers whose second token's chain has 1..N hops, "
                            "as the default run asks them (0: one-token answers)")
    world.add_argument("--prompt-style", default=None,
                       help="prompt format (default: the one the checkpoint was trained with, from its "
                            "train_recipe.json; else plain)")
    world.add_argument("--ask", default=None, metavar="KIND",
                       help="ask each context one of its other questions of this kind instead of its own "
                            "(synthhop: fact, bridge, comparison; syntharith: problem)")


def add_breakdown_flags(p: argparse.ArgumentParser) -> None:
    """What a scored cell prints beside its EM, and where its scores are kept."""
    p.add_argument("--by-type", action="store_true", help="also print EM per question type")
    p.add_argument("--by-source", action="store_true",
                   help="also print where the wrong answers occur in the prompt: an evidence passage, "
                        "only a distractor passage, only the question, nowhere")
    p.add_argument("--json", default=None,
                   help="also write the scores to this JSON file (cells already there are kept unless "
                        "measured again)")


def _default(cls: type, f: dataclasses.Field):
    """A flag's default: the field's value in the named settings the CLI starts from (WiseSettings
    has no defaults of its own)."""
    return getattr(STARTING_POINTS[cls], f.name)


def _flag_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """The fields of dataclass `cls` that get flags, with their types: int, float, str, or a
    dataclass (whose fields get flags in turn)."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)
            if hints[f.name] in (int, float, str) or dataclasses.is_dataclass(hints[f.name])]


def add_settings_flags(p: argparse.ArgumentParser, only: tuple[str, ...] | None = None,
                       cls: type = WiseSettings, prefix: str = "") -> None:
    """One typed flag per field of `cls` (``--<prefix><field>``), defaulting to the field's default;
    a field that is itself a dataclass gets its own group, prefixed with its name. only: these
    fields alone."""
    group = p.add_argument_group(SETTINGS_TITLES[cls])
    for f, kind in _flag_fields(cls):
        dest = prefix + f.name
        if only is not None and f.name not in only:
            continue
        if dataclasses.is_dataclass(kind):
            add_settings_flags(p, None, kind, f"{dest}_")
        else:
            group.add_argument("--" + dest.replace("_", "-"), dest=dest, type=kind,
                               default=CLI_DEFAULTS.get(dest, _default(cls, f)), help=SETTINGS_HELP.get(dest))


def settings_from(args: argparse.Namespace, cls: type = WiseSettings, prefix: str = ""):
    """The `cls` the flags of ``add_settings_flags`` name (its checks raise ValueError)."""
    return cls(**{f.name: settings_from(args, kind, f"{prefix}{f.name}_") if dataclasses.is_dataclass(kind)
                  else getattr(args, prefix + f.name) for f, kind in _flag_fields(cls)})


def default_model(benchmarks: list[str]) -> str:
    return CALIBRATION_MODEL if set(benchmarks) == {"synthchain"} else DEFAULT_MODEL


def context_n(text: str) -> tuple[int, int]:
    """A ``CONTEXT=N`` item of --n-per-context."""
    context, sep, n = text.partition("=")
    try:
        if sep:
            return int(context), int(n)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not CONTEXT=N (e.g. 4096=100)")
