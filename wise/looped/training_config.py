"""The training recipes of the looped family: the data and optimisation shared by the base decoder
and the retrofit (``Training``), the retrofit's variable-depth loop (``RetrofitTraining``) and the
embedded base decoder (``BaseTraining``). They are sections of the RecurTrace params
(``recurtrace.train``, ``recurtrace.base_train``; ``pipelines.recurtrace.params``, parsed by
``wise.typed_params``); a bad value raises ``ValueError`` naming the key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from wise.models.dtypes import DTYPES as TORCH_DTYPES
from wise.typed_params import TrainingRecipe, need

DTYPES = tuple(TORCH_DTYPES)  # the dtype names params accept
# synthchain as pure pointer chasing (no successor refinement) over chains of 1..4 hops: with the
# project's BPE an entity is 5 tokens and a fact 18, so 4 hops and their distractors fit 256 tokens.
CHAIN_SOURCES = {"synthchain": {"max_hops": 4, "max_refine": 0}}


def check_benchmarks(section: str, obj, names, sources: dict) -> None:
    from wise.data import BENCHMARKS

    unknown = [b for b in names if b not in BENCHMARKS]
    need(not unknown, section, obj, "benchmarks", f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    stray = [b for b in sources if b not in names]
    need(not stray, section, obj, "sources", f"names benchmark(s) not in benchmarks: {stray}")
    need(all(isinstance(v, dict) for v in sources.values()), section, obj, "sources",
          "must map benchmark names to loader option mappings")


@dataclass(frozen=True)
class Training(TrainingRecipe):
    """Data and optimisation shared by the base decoder and the retrofit: the keys every training recipe
    has (``wise.typed_params.TrainingRecipe``, defaults of seed, max_steps, betas, ... there) and rows
    of a fixed context."""

    benchmarks: dict = field(default_factory=lambda: {"synthchain": 0.5, "syntharith": 0.5})  # name -> weight
    sources: dict = field(default_factory=lambda: dict(CHAIN_SOURCES))  # name -> loader options
    context: int = 256  # tokens per row (prompt + answers)
    rows: int = 64  # rows per batch
    extra_questions: int = 4  # further questions a row's passages answer, after its own
    extra_reserve: int = 64  # tokens of the budget kept for them
    time_limit_s: float = 120.0  # 0: none; the learning-rate schedule follows elapsed time
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    lm_loss_weight: float = 0.0  # next-token loss on the prompt text, besides the answer loss

    SECTION = "recurtrace.train"

    def __post_init__(self) -> None:
        s = self.SECTION
        need(bool(self.benchmarks) and all(isinstance(w, (int, float)) and w > 0 for w in self.benchmarks.values()),
              s, self, "benchmarks", "needs at least one benchmark, each with a positive weight")
        check_benchmarks(s, self, list(self.benchmarks), self.sources)
        need(self.context > self.extra_reserve + 16, s, self, "context", "must exceed extra_reserve + 16")
        need(self.rows >= 1, s, self, "rows", "must be >= 1")
        self.check_recipe(s)

    def batch_spec(self):
        from wise.looped.data import BatchSpec

        return BatchSpec(dict(self.benchmarks), dict(self.sources), self.context, self.rows,
                         self.extra_questions, self.extra_reserve, self.seed)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RetrofitTraining(Training):
    time_limit_s: float = 75.0
    lr: float = 2e-3
    loops_mean: float = 3.9  # clamped log-normal Poisson (wise.looped.depth)
    loops_sigma: float = 0.5
    loops_min: int = 2
    loops_max: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.SECTION
        need(self.loops_mean > 1, s, self, "loops_mean", "must be > 1")
        need(self.loops_sigma >= 0, s, self, "loops_sigma", "must be >= 0")
        need(2 <= self.loops_min <= self.loops_max, s, self, "loops_min",
              "must satisfy 2 <= loops_min <= loops_max (one loop trains nothing)")

    def loop_kwargs(self) -> dict:
        return {"mean": self.loops_mean, "sigma": self.loops_sigma, "min_loops": self.loops_min,
                "max_loops": self.loops_max}


@dataclass(frozen=True)
class BaseTraining(Training):
    """The embedded base decoder (trained from scratch, every weight)."""

    SECTION = "recurtrace.base_train"
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    lm_loss_weight: float = 1.0
    time_limit_s: float = 180.0
    family: str = "qwen3"  # qwen3 | llama: the transformers config class
    # config fields of that class (vocab size and special ids come from the tokenizer)
    model: dict = field(default_factory=lambda: {
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 1024, "tie_word_embeddings": True})
    tokenizer: str = "data/models/wise-small/tokenizer.json"  # the project's BPE (BOS 0, EOS 1, PAD 2)
    save_dtype: str = "bfloat16"  # weights as stored (the base everything downstream loads)

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.SECTION
        need(self.family in ("qwen3", "llama"), s, self, "family", "must be qwen3 or llama")
        need(isinstance(self.model, dict), s, self, "model", "must be a mapping of config fields")
        reserved = sorted({"vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"} & set(self.model))
        need(not reserved, s, self, "model", f"{reserved} come from the tokenizer")
        need(self.save_dtype in DTYPES, s, self, "save_dtype", f"must be one of {DTYPES}")
        need(self.context <= int(self.model.get("max_position_embeddings", 0)), s, self, "context",
              "must fit model.max_position_embeddings")
