"""Typed training params (the ``train:`` section of params.yaml), validated before any work starts.

A bad value raises ``ValueError`` naming the key (``train.lr = -1: must be > 0``). Missing keys
take the defaults below, which are the settings the shipped ``wise-small`` checkpoint used.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from wise.data.prompts import PROMPT_STYLES
from wise.models.config import PRESETS, RecurrentConfig
from wise.typed_params import TrainingRecipe, from_mapping, need as need_in_section


# The order the recipe is listed in (the model card): by topic, the shared keys among the backbone's
# own, as the card has always shown them (fields of a subclass come after its base's, so field order can't).
RECIPE_ORDER = (
    "preset", "model", "init_std", "tokenizer_seed", "tokenizer_examples", "tokenizer_split_digits", "seed",
    "benchmarks", "context_lengths", "context_weights", "short_steps", "short_context", "tokens_per_batch",
    "answer_reserve", "evidence_only_steps", "evidence_only_frac", "prompt_style", "extra_questions",
    "extra_reserve", "recurrence_mean", "recurrence_sigma", "recurrence_max", "recurrence_ramp_steps",
    "backprop_steps", "lm_loss_weight", "max_steps", "time_limit_s", "lr", "min_lr_ratio", "warmup_steps",
    "weight_decay", "beta1", "beta2", "grad_clip", "compile", "data_workers", "prefetch", "log_every",
    "eval_every", "eval_n", "eval_context", "eval_steps")


@dataclass(frozen=True)
class TrainConfig(TrainingRecipe):
    """The backbone's recipe: the shared keys (``wise.typed_params.TrainingRecipe``: seed, max_steps, the
    optimiser's betas, grad_clip, log_every, data_workers with their defaults there) and its own below."""

    # -- model and tokenizer ----------------------------------------------------------------------
    preset: str = "wise-small"  # architecture preset (wise/models/config.py)
    # architecture fields changed on top of the preset, e.g. {"n_core": 2} (RecurrentConfig names);
    # the checkpoint's config.json holds the result, so loading needs nothing else
    model: dict = field(default_factory=dict)
    init_std: float = 0.02  # std of the seeded normal weight init
    tokenizer_seed: int = 0  # BPE trained on corpus_for_tokenizer(tokenizer_seed, tokenizer_examples)
    tokenizer_examples: int = 400
    tokenizer_split_digits: bool = True  # one token per digit (see wise.data.tokenizer)
    # -- data (train split, generated on the fly, deterministic from seed and batch index) -------
    benchmarks: dict = field(default_factory=lambda: {"synthhop": 0.7, "syntharith": 0.3})
    context_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)  # prompt token budgets
    context_weights: tuple[float, ...] = (0.25, 0.3, 0.2, 0.15, 0.1)  # sampling weight per batch
    short_steps: int = 300  # curriculum: the first batches use only budgets <= short_context
    short_context: int = 512
    tokens_per_batch: int = 65536  # batch size = tokens_per_batch // budget (one budget per batch)
    answer_reserve: int = 8  # prompt budget minus this leaves room for answer + EOS
    # curriculum: during the first evidence_only_steps batches every row shows only its evidence
    # passages (no distractors); afterwards a fraction evidence_only_frac of rows still does.
    evidence_only_steps: int = 0
    evidence_only_frac: float = 0.0
    # how a row's prompt is written (a wise.data prompt style); evaluation reads it back from the
    # checkpoint's train_recipe.json, so a model is always asked the way it was trained
    prompt_style: str = "plain"
    # extra questions: after its own answer, a row asks up to extra_questions more questions that
    # its passages answer (one-hop facts, other bridges and comparisons; other problems), each
    # "Question: ...\nAnswer: <answer><eos>", inside extra_reserve tokens kept free for them.
    extra_questions: int = 8
    extra_reserve: int = 160
    # -- recurrence -------------------------------------------------------------------------------
    recurrence_mean: float = 24.0  # mean of the Poisson-lognormal step count
    recurrence_sigma: float = 0.5
    recurrence_max: int = 48
    recurrence_ramp_steps: int = 3000  # the mean grows linearly from 4 to recurrence_mean
    backprop_steps: int = 10  # truncated backprop: gradients through the last k steps only
    # -- loss and optimisation --------------------------------------------------------------------
    lm_loss_weight: float = 1.0  # next-token loss on the prompt text, besides the answer loss
    time_limit_s: float = 720.0  # 0: none; else stop (and save) after this many seconds of training
    lr: float = 2e-3
    warmup_steps: int = 150
    weight_decay: float = 0.1
    # -- execution --------------------------------------------------------------------------------
    # torch.compile each transformer block (dynamic shapes; the recurrence loop stays in Python);
    # falls back to eager when compilation fails on this stack. Off: on an H200 (torch 2.11) the
    # first 40 s of the shipped recipe made 248 steps compiled vs 337 eager (shape recompiles).
    compile: bool = False
    prefetch: int = 32  # batches generated ahead
    # quick held-out check during training: greedy EM on the first eval_n validation examples of
    # each benchmark at eval_context tokens, T = eval_steps, every eval_every batches (0: off)
    eval_every: int = 1000
    eval_n: int = 64
    eval_context: int = 512
    eval_steps: int = 32

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, why: str) -> None:
            need_in_section(ok, "train", self, key, why)

        need(self.preset in PRESETS, "preset", f"unknown preset; known: {sorted(PRESETS)}")
        fields = {f.name for f in dataclasses.fields(RecurrentConfig)} - {"name"}
        need(isinstance(self.model, dict) and set(self.model) <= fields, "model",
             f"keys must be RecurrentConfig fields; unknown: {sorted(set(self.model) - fields)}"
             if isinstance(self.model, dict) else "must be a mapping of RecurrentConfig fields")
        try:
            arch = self.architecture()
        except (TypeError, ValueError) as err:
            raise ValueError(f"train.model = {self.model!r}: {err}") from None
        need(bool(self.benchmarks) and all(w > 0 for w in self.benchmarks.values()),
             "benchmarks", "needs at least one benchmark with a positive weight")
        need(len(self.context_lengths) == len(self.context_weights), "context_weights",
             "must have one weight per context length")
        need(all(b > self.answer_reserve for b in self.context_lengths), "context_lengths",
             "every budget must exceed answer_reserve")
        need(max(self.context_lengths) <= arch.max_positions, "context_lengths",
             f"must fit the model's {arch.max_positions} positions")
        need(all(w >= 0 for w in self.context_weights) and sum(self.context_weights) > 0,
             "context_weights", "must be >= 0 with a positive sum")
        need(any(b <= self.short_context for b in self.context_lengths) or self.short_steps == 0,
             "short_context", "no context length is that short")
        need(self.tokens_per_batch >= max(self.context_lengths), "tokens_per_batch",
             "must hold at least one sequence of the longest budget")
        need(self.evidence_only_steps >= 0, "evidence_only_steps", "must be >= 0")
        need(0 <= self.evidence_only_frac <= 1, "evidence_only_frac", "must be in [0, 1]")
        need(all(b > self.answer_reserve + self.extra_reserve for b in self.context_lengths),
             "extra_reserve", "every budget must exceed answer_reserve + extra_reserve")
        need(self.recurrence_mean >= 1, "recurrence_mean", "must be >= 1")
        need(self.recurrence_sigma >= 0, "recurrence_sigma", "must be >= 0")
        need(self.recurrence_max >= self.recurrence_mean, "recurrence_max", "must be >= recurrence_mean")
        need(self.backprop_steps >= 1, "backprop_steps", "must be >= 1")
        need(self.prompt_style in PROMPT_STYLES, "prompt_style",
             f"must be one of {', '.join(sorted(PROMPT_STYLES))}")
        need(self.eval_every >= 0, "eval_every", "must be >= 0")
        need(self.eval_n >= 1, "eval_n", "must be >= 1")
        need(self.answer_reserve < self.eval_context <= arch.max_positions,
             "eval_context", "must fit the model's positions")
        need(self.eval_steps >= 1, "eval_steps", "must be >= 1")
        self.check_recipe("train")

    def architecture(self) -> RecurrentConfig:
        """The model to train: the preset with `model` applied."""
        base = RecurrentConfig.from_name(self.preset)
        # a changed architecture must not pass for the preset in config.json
        return base.replace(**self.model, name=f"{self.preset}-custom") if self.model else base

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a mapping, keys in RECIPE_ORDER."""
        d = dataclasses.asdict(self)
        if set(d) != set(RECIPE_ORDER):  # a new field must get its place in the card
            raise KeyError(f"RECIPE_ORDER (wise/training/config.py) differs from the fields: "
                           f"{sorted(set(d) ^ set(RECIPE_ORDER))}")
        d = {key: d[key] for key in RECIPE_ORDER}
        d["context_lengths"], d["context_weights"] = list(self.context_lengths), list(self.context_weights)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, complete: bool = False) -> "TrainConfig":
        """The ``train:`` section (or a stored recipe) through the project's one parser."""
        return from_mapping(cls, d, "train", complete)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
