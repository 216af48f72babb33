"""The benchmark registry: one name -> loader (+ where its extra distractors come from).

    load_examples("synthhop", "test", n=200, seed=123)            # list[Example]
    build_cohort_variants(examples, [512, 1024], count_tokens, seed=0)

A loader is `loader(split, n, seed, **options) -> list[Example]`, deterministic in its arguments.
A benchmark may also name a `distractor_pool(example) -> passages` giving the natural passages
that longer contexts draw from; without one, the pool is the passages of the other examples
loaded with it (which is what the real QA sets use: paragraphs of other questions).

Real benchmarks (HotpotQA distractor validation, 2WikiMultihopQA dev, GSM8K test) are
registered the same way, with loaders in `public_benchmarks` (hub id or local files).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from wise.data import public_benchmarks, synthchain, syntharith, synthhop
from wise.data.context import ContextVariants, build_context_variants
from wise.data.examples import Example, Passage
from wise.data.splits import check_split

Loader = Callable[..., list[Example]]
DistractorPool = Callable[[Example], Sequence[Passage]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    loader: Loader
    distractor_pool: Optional[DistractorPool] = None
    description: str = ""
    # (question, answer, kind) triples that an example's own passages also answer (training extras)
    context_questions: Optional[Callable[[Example], list[tuple[str, str, str]]]] = None


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, loader: Loader, distractor_pool: Optional[DistractorPool] = None,
                       description: str = "", replace: bool = False,
                       context_questions: Optional[Callable] = None) -> Benchmark:
    if name in BENCHMARKS and not replace:
        raise ValueError(f"benchmark {name!r} is already registered (pass replace=True to override)")
    BENCHMARKS[name] = Benchmark(name, loader, distractor_pool, description, context_questions)
    return BENCHMARKS[name]


def get_benchmark(name: str) -> Benchmark:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ValueError(
            f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(BENCHMARKS))}"
        ) from None


def load_examples(benchmark: str, split: str, n: int, seed: int, **options) -> list[Example]:
    """The first n examples of a benchmark's split for a seed; the same arguments always give
    the same examples, and a larger n extends a smaller one."""
    spec = get_benchmark(benchmark)
    check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    examples = spec.loader(split, n, seed, **options)
    if len({e.example_id for e in examples}) != len(examples):
        raise ValueError(f"{benchmark}: loader returned duplicate example ids")
    return examples


def context_questions(example: Example) -> list[tuple[str, str, str]]:
    """Other (question, answer, kind) triples the example's passages answer; [] if the benchmark
    has none. Kinds: synthhop "fact" / "bridge" / "comparison", syntharith "problem"."""
    spec = get_benchmark(example.benchmark)
    return list(spec.context_questions(example)) if spec.context_questions else []


def distractor_pool(example: Example, cohort: Iterable[Example] = ()) -> tuple[Passage, ...]:
    """Natural passages that a longer context of `example` may add (before deduplication)."""
    spec = get_benchmark(example.benchmark)
    if spec.distractor_pool is not None:
        return tuple(spec.distractor_pool(example))
    return tuple(p for other in cohort if other.example_id != example.example_id
                 for p in other.passages)


def build_cohort_variants(examples: Sequence[Example], budgets: Sequence[int],
                          count_tokens: Callable[[str], int], seed: int,
                          style: str = "plain", reserve_tokens: int = 0) -> list[ContextVariants]:
    """`build_context_variants` for each example, with its benchmark's distractor pool."""
    return [build_context_variants(e, budgets, count_tokens, seed, pool=distractor_pool(e, examples),
                                   style=style, reserve_tokens=reserve_tokens)
            for e in examples]


register_benchmark("synthhop", synthhop.load_synthhop, synthhop.world_distractor_pool,
                   "generated HotpotQA-like multi-hop questions (bridge 2/3 hops, comparison)",
                   context_questions=synthhop.context_questions)
register_benchmark("synthchain", synthchain.load_synthchain, synthchain.world_distractor_pool,
                   "generated pointer chasing: L hops over single-token entities, then m successor "
                   "steps (the calibration benchmark of the constructed model wise-chain)")
register_benchmark("syntharith", syntharith.load_syntharith, syntharith.world_distractor_pool,
                   "generated GSM8K-like arithmetic word problems (2-4 calculations)",
                   context_questions=syntharith.context_questions)

# Real benchmarks: rows through Hugging Face `datasets` (hub id) or local files (path=...).
# Their extra distractors are paragraphs of the other examples loaded with them.
register_benchmark("hotpotqa", public_benchmarks.load_hotpotqa, None,
                   "HotpotQA distractor setting (test = the validation split)")
register_benchmark("2wikimultihopqa", public_benchmarks.load_2wikimultihopqa, None,
                   "2WikiMultihopQA (test = dev); pass path= to the official dev.json")
register_benchmark("gsm8k", public_benchmarks.load_gsm8k, None,
                   "GSM8K main (the problem is the question; no passages)")
