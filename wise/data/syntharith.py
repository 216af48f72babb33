"""syntharith: GSM8K-like arithmetic word problems, 2-4 calculations, numeric answers.

Each problem follows one person's count of one kind of item through additions, subtractions,
multiplications and even divisions, with one or two irrelevant sentences mixed in (another
person's items, the person's other items, an age, a distance). Numbers stay small (operands
under 50, every intermediate and the answer at most `max_value`, default 999) so that a small
model can learn the arithmetic.

The problem is one evidence passage titled with the person's name; the question asks for that
person's count. Problems are grouped in worlds whose people all have distinct names, and the
distractor passages are other problems of the same world, so no distractor mentions the asked
person (a distractor from another world could reuse the name and make the question ambiguous).
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from wise.data.examples import Example, Passage
from wise.data.names import WordSource
from wise.data.splits import derive_seed, example_id, world_seed

BENCHMARK = "syntharith"
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cookies",
         "cards", "stamps", "buttons", "beads")


@dataclass(frozen=True)
class Problem:
    name: str  # the person asked about; unique in the world
    item: str
    sentences: tuple[str, ...]  # in passage order
    question: str
    answer: int
    ops: tuple[str, ...]  # "add" / "sub" / "mul" / "div" / "groups", one per calculation
    solution: tuple[str, ...]  # one "a op b = c" line per calculation

    @property
    def passage(self) -> Passage:
        return Passage(self.name, " ".join(self.sentences))


def _start(rng, name, item, friend, calc) -> tuple[int, str]:
    if calc:  # bags of items: the first calculation
        bags, each = rng.randint(2, 6), rng.randint(2, 12)
        return bags * each, rng.choice([
            f"{name} buys {bags} bags of {item} with {each} {item} in each bag.",
            f"{name} has {bags} boxes, and each box holds {each} {item}.",
        ]), f"{bags} * {each} = {bags * each}"
    count = rng.randint(2, 50)
    return count, rng.choice([f"{name} has {count} {item}.", f"{name} starts with {count} {item}."]), None


def _step(rng, state, name, item, friend, max_value):
    """One calculation applied to the running count: (op, new count, sentence, solution line)."""
    feasible = []
    # Operands of at least 2 keep the item nouns plural ("loses 1 beads" would be wrong).
    if state + 2 <= max_value:
        feasible.append("add")
    if state >= 3:
        feasible.append("sub")
    if state * 2 <= max_value:
        feasible.append("mul")
    if any(state % k == 0 for k in (2, 3, 4, 5)) and state >= 4:
        feasible.append("div")
    op = rng.choice(feasible)
    if op == "add":
        b = rng.randint(2, min(30, max_value - state))
        text = rng.choice([f"{name} buys {b} more {item}.", f"{friend} gives {name} {b} {item}.",
                           f"{name} finds {b} more {item}."])
        return op, state + b, text, f"{state} + {b} = {state + b}"
    if op == "sub":
        b = rng.randint(2, min(30, state - 1))
        text = rng.choice([f"{name} gives {b} {item} to {friend}.", f"{name} loses {b} {item}.",
                           f"{name} sells {b} {item}."])
        return op, state - b, text, f"{state} - {b} = {state - b}"
    if op == "mul":
        k = rng.choice([k for k in (2, 3, 4) if state * k <= max_value])
        text = {2: f"Then the number of {item} that {name} has doubles.",
                3: f"Then the number of {item} that {name} has triples.",
                4: f"Then {name} has 4 times as many {item} as before."}[k]
        return op, state * k, text, f"{state} * {k} = {state * k}"
    k = rng.choice([k for k in (2, 3, 4, 5) if state % k == 0])
    text = (f"{name} gives away half of the {item}." if k == 2 else
            f"{name} puts the {item} into {k} equal groups and keeps only one group.")
    return op, state // k, text, f"{state} / {k} = {state // k}"


def _irrelevant(rng, name, item, friend, count) -> list[str]:
    """`count` distinct irrelevant sentences (distinct templates, so no fact is stated twice)."""
    other = rng.choice([i for i in ITEMS if i != item])
    return rng.sample([
        f"{friend} has {rng.randint(2, 60)} {other}.",
        f"{name} also has {rng.randint(2, 60)} {other}.",
        f"{name} is {rng.randint(7, 70)} years old.",
        f"{friend} lives {rng.randint(2, 40)} miles away.",
        f"It takes {name} {rng.randint(5, 50)} minutes to walk to the store.",
    ], count)


def generate_problem(rng: random.Random, words: WordSource, calculations: int,
                     max_value: int) -> Problem:
    name, friend = words.word(), words.word()
    item = rng.choice(ITEMS)
    grouped_start = rng.random() < 0.3
    state, first, line = _start(rng, name, item, friend, grouped_start)
    ops, solution, steps = (["groups"], [line], []) if grouped_start else ([], [], [])
    while len(ops) < calculations:
        op, state, text, line = _step(rng, state, name, item, friend, max_value)
        ops.append(op)
        solution.append(line)
        steps.append(text)
    # Irrelevant sentences go anywhere after the opening one, so the order of the relevant
    # sentences (which the arithmetic depends on) is kept.
    for sentence in _irrelevant(rng, name, item, friend, rng.randint(1, 2)):
        steps.insert(rng.randint(0, len(steps)), sentence)
    question = rng.choice([f"How many {item} does {name} have now?",
                           f"How many {item} does {name} have at the end?"])
    return Problem(name, item, (first, *steps), question, state, tuple(ops), tuple(solution))


@functools.lru_cache(maxsize=64)
def generate_world(seed: int, problems: int, min_steps: int, max_steps: int,
                   max_value: int) -> tuple[Problem, ...]:
    """A world: problems about distinct people; the first ones are asked, all serve as distractors."""
    rng = random.Random(seed)
    words = WordSource(rng)
    return tuple(generate_problem(rng, words, rng.randint(min_steps, max_steps), max_value)
                 for _ in range(problems))


def load_syntharith(split: str, n: int, seed: int, *, questions_per_world: int = 8,
                    world_problems: int = 100, min_steps: int = 2, max_steps: int = 4,
                    max_value: int = 999, distractors: int = 3) -> list[Example]:
    """n syntharith examples of a split; deterministic in (split, seed, options)."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if not 1 <= questions_per_world <= world_problems or n < 0 or distractors < 0:
        raise ValueError("need n >= 0, distractors >= 0 and 1 <= questions_per_world <= world_problems")
    if max_value < 60:
        raise ValueError(f"max_value must be at least 60 (operands go up to 50), got {max_value}")
    world_options = {"world_problems": world_problems, "min_steps": min_steps,
                     "max_steps": max_steps, "max_value": max_value}
    examples: list[Example] = []
    for world_index in range((n + questions_per_world - 1) // questions_per_world):
        ws = world_seed(BENCHMARK, split, seed, world_index)
        world = generate_world(ws, world_problems, min_steps, max_steps, max_value)
        rng = random.Random(derive_seed(ws, "contexts"))
        for i, problem in enumerate(world[:min(questions_per_world, n - len(examples))]):
            others = rng.sample([p for j, p in enumerate(world) if j != i], min(distractors, len(world) - 1))
            passages = [Passage(problem.name, problem.passage.text, True)] + [p.passage for p in others]
            rng.shuffle(passages)
            examples.append(Example(
                example_id=example_id(BENCHMARK, split, seed, len(examples)),
                benchmark=BENCHMARK,
                question=problem.question,
                passages=tuple(passages),
                answers=(str(problem.answer),),
                meta={"type": "arithmetic", "hops": len(problem.ops), "relation": "+".join(problem.ops),
                      "answer_kind": "number", "solution": list(problem.solution),
                      "world_seed": ws, "world_index": world_index, "world_options": world_options,
                      "supporting_titles": [problem.name]},
            ))
    return examples


def world_distractor_pool(example: Example) -> tuple[Passage, ...]:
    """Every problem of the example's world as a passage (the example's own one included; the
    variant builder skips passages already in the context)."""
    opts = example.meta["world_options"]
    world = generate_world(int(example.meta["world_seed"]), opts["world_problems"],
                           opts["min_steps"], opts["max_steps"], opts["max_value"])
    return tuple(p.passage for p in world)


def context_questions(example: Example) -> list[tuple[str, str, str]]:
    """(question, answer, "problem") for every other problem in the example's context (each
    passage is a complete problem of the example's world). Used as extra training questions."""
    opts = example.meta["world_options"]
    world = generate_world(int(example.meta["world_seed"]), opts["world_problems"],
                           opts["min_steps"], opts["max_steps"], opts["max_value"])
    by_name = {p.name: p for p in world}
    present = sorted({p.title for p in example.passages} & set(by_name))
    out = [(by_name[n].question, str(by_name[n].answer), "problem") for n in present]
    return [qa for qa in out if qa[:2] != (example.question, example.answer)]
