"""Benchmarks as data: examples, prompts, context-length variants, the registry, the tokenizer.

    from wise.data import load_examples, build_cohort_variants, format_prompt
    examples = load_examples("synthhop", "test", n=200, seed=123)
    prompts = build_prompts(tok, "synthhop", 512, 200, 123, max_positions=4096, max_new_tokens=8)

build_prompts (probes.py) gives the tokenized evaluation prompts the scoring and the lens read.

Generated benchmarks: synthhop (multi-hop QA over a generated world) and syntharith (arithmetic
word problems). Nothing here imports ray, dvc or duckdb, and all randomness comes from seeds.
"""
from wise.data.context import ContextVariants, build_context_variants
from wise.data.examples import Example, Passage, example_from_dict, example_to_dict
from wise.data.probes import Prompt, build_prompts
from wise.data.prompts import (PROMPT_STYLES, answer_continuation, format_passage, format_prompt,
                               register_prompt_style)
from wise.data.registry import (BENCHMARKS, Benchmark, build_cohort_variants, distractor_pool,
                                get_benchmark, load_examples, register_benchmark)
from wise.data.splits import SPLITS

__all__ = [
    "BENCHMARKS", "Benchmark", "ContextVariants", "Example", "PROMPT_STYLES", "Passage", "Prompt",
    "SPLITS", "answer_continuation", "build_cohort_variants", "build_context_variants",
    "build_prompts", "distractor_pool", "example_from_dict", "example_to_dict", "format_passage",
    "format_prompt", "get_benchmark", "load_examples", "register_benchmark", "register_prompt_style",
]
