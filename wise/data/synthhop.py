"""synthhop: HotpotQA-like multi-hop questions over a generated world (see synthhop_world).

Question types:
- bridge (2 hops): follow two attributes from a named entity, e.g. film -> director -> birth city;
- bridge (3 hops): three attributes, e.g. film -> studio -> founder -> birth city;
- comparison: which of two entities of one kind has the earlier / later year (never a tie).

Answers are entity names, country names or years, always written verbatim in the last evidence
passage (comparisons: the answer is one of the two names in the question). Each question names
an entity that is unique in its world, so exactly one answer is correct. The example's own
context is the evidence plus hard distractors: same-kind entities sharing a name part or an
attribute value with the evidence. Longer contexts draw more passages from the same world
(`world_distractor_pool`), never from another world, whose facts could contradict this one.

Example i of (split, seed) lives in world i // questions_per_world; worlds and questions are
generated in order, so the first n examples do not depend on how many are loaded.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from wise.data.examples import Example, Passage
from wise.data.splits import derive_seed, example_id, world_seed
from wise.data.synthhop_world import Entity, World, WorldSize, cached_world

BENCHMARK = "synthhop"


@dataclass(frozen=True)
class Bridge:
    start: str  # kind of the entity the question names
    path: tuple[str, ...]  # attributes followed from it; all but the last lead to an entity
    templates: tuple[str, ...]  # "{x}" is the named entity
    answer_kind: str  # "name" or "year"


@dataclass(frozen=True)
class Comparison:
    kind: str
    attr: str  # a year attribute
    earlier: tuple[str, ...]  # templates with "{a}" and "{b}"
    later: tuple[str, ...]


BRIDGES_2 = (
    Bridge("film", ("director", "birth_city"),
           ("Where was the director of {x} born?", "In which city was the director of {x} born?"), "name"),
    Bridge("film", ("director", "birth_year"), ("In what year was the director of {x} born?",), "year"),
    Bridge("film", ("studio", "headquarters"),
           ("In which city is the studio that produced {x} headquartered?",), "name"),
    Bridge("film", ("studio", "founded"), ("In what year was the studio that produced {x} founded?",), "year"),
    Bridge("company", ("founder", "birth_city"), ("Where was the founder of {x} born?",), "name"),
    Bridge("company", ("founder", "alma_mater"), ("Which university did the founder of {x} attend?",), "name"),
    Bridge("company", ("headquarters", "country"), ("In which country is {x} headquartered?",), "name"),
    Bridge("person", ("alma_mater", "city"), ("In which city is the university that {x} attended?",), "name"),
    Bridge("person", ("birth_city", "founded"), ("In what year was the birthplace of {x} founded?",), "year"),
    Bridge("university", ("city", "country"), ("In which country is {x} located?",), "name"),
)
BRIDGES_3 = (
    Bridge("film", ("director", "alma_mater", "city"),
           ("In which city is the university attended by the director of {x}?",), "name"),
    Bridge("film", ("studio", "founder", "birth_city"),
           ("Where was the founder of the studio that produced {x} born?",), "name"),
    Bridge("company", ("founder", "birth_city", "country"),
           ("In which country was the founder of {x} born?",), "name"),
    Bridge("film", ("director", "birth_city", "country"),
           ("In which country was the director of {x} born?",), "name"),
)
COMPARISONS = (
    Comparison("company", "founded", ("Which company was founded earlier, {a} or {b}?",),
               ("Which company was founded later, {a} or {b}?",)),
    Comparison("university", "founded", ("Which university was founded earlier, {a} or {b}?",),
               ("Which university was founded later, {a} or {b}?",)),
    Comparison("city", "founded", ("Which city was founded earlier, {a} or {b}?",),
               ("Which city was founded later, {a} or {b}?",)),
    Comparison("person", "birth_year", ("Who was born earlier, {a} or {b}?",),
               ("Who was born later, {a} or {b}?",)),
    Comparison("film", "released", ("Which film was released earlier, {a} or {b}?",),
               ("Which film was released later, {a} or {b}?",)),
)
DEFAULT_TYPE_WEIGHTS = {"bridge2": 0.45, "bridge3": 0.2, "comparison": 0.35}


@dataclass(frozen=True)
class _Question:
    text: str
    answer: str
    evidence: tuple[Entity, ...]
    meta: dict


def _ask_bridge(world: World, rng: random.Random, bridge: Bridge) -> tuple[_Question, tuple]:
    start = rng.choice(world.of_kind(bridge.start))
    hops, value = [start], start.name
    for i, attr in enumerate(bridge.path):
        value = world.entities[value].attrs[attr]
        if i < len(bridge.path) - 1:
            hops.append(world.entities[value])
    meta = {"type": "bridge", "hops": len(bridge.path),
            "relation": ".".join((bridge.start, *bridge.path)), "answer_kind": bridge.answer_kind}
    text = rng.choice(bridge.templates).format(x=start.name)
    return _Question(text, str(value), tuple(hops), meta), (meta["relation"], start.name)


def _ask_comparison(world: World, rng: random.Random, comp: Comparison) -> tuple[_Question, tuple]:
    candidates = world.of_kind(comp.kind)
    a = rng.choice(candidates)
    # Never a tie: the other entity must have a different year.
    b = rng.choice([e for e in candidates if e.attrs[comp.attr] != a.attrs[comp.attr]])
    direction = rng.choice(("earlier", "later"))
    pick = min if direction == "earlier" else max
    answer = pick((a, b), key=lambda e: e.attrs[comp.attr]).name
    text = rng.choice(getattr(comp, direction)).format(a=a.name, b=b.name)
    meta = {"type": "comparison", "hops": 2,
            "relation": f"compare.{comp.kind}.{comp.attr}.{direction}", "answer_kind": "name"}
    return _Question(text, answer, (a, b), meta), (meta["relation"], *sorted((a.name, b.name)))


def _hard_distractors(world: World, rng: random.Random, question: _Question,
                      count: int) -> list[Entity]:
    """Same-kind entities that share a name part or an attribute value with an evidence entity,
    taken round-robin over the evidence so each hop gets its look-alikes. Sharing the answer
    does not count: it would make the answer the most repeated value in the context, a
    shortcut around the hops."""
    evidence = question.evidence
    chosen: list[Entity] = []
    taken = {e.name for e in evidence}
    ranked_per_hop = []
    for ev in evidence:
        parts = set(ev.name.split()) - {"The"}
        values = {v for v in ev.attrs.values() if v is not None and str(v) != question.answer}

        def score(other: Entity) -> float:
            shared_name = len(parts & set(other.name.split()))
            shared_attr = len(values & {v for v in other.attrs.values() if v is not None})
            return 2 * shared_name + shared_attr + rng.random()  # random part breaks ties

        others = [e for e in world.of_kind(ev.kind) if e.name not in taken]
        ranked_per_hop.append(sorted(others, key=score, reverse=True))
    while len(chosen) < count and any(ranked_per_hop):
        for ranked in ranked_per_hop:
            while ranked and ranked[0].name in taken:
                ranked.pop(0)
            if ranked and len(chosen) < count:
                entity = ranked.pop(0)
                taken.add(entity.name)
                chosen.append(entity)
    return chosen


def _world_questions(world: World, n: int, distractors: int, type_weights: dict[str, float]):
    """The first n distinct questions of a world, each with its hard distractors."""
    rng = random.Random(derive_seed(world.seed, "questions"))
    kinds = sorted(type_weights)
    weights = [type_weights[k] for k in kinds]
    seen: set[tuple] = set()
    out = []
    for _attempt in range(50 * n + 50):
        if len(out) == n:
            break
        kind = rng.choices(kinds, weights)[0]
        if kind == "comparison":
            question, key = _ask_comparison(world, rng, rng.choice(COMPARISONS))
        else:
            question, key = _ask_bridge(world, rng, rng.choice(BRIDGES_2 if kind == "bridge2" else BRIDGES_3))
        if key in seen:
            continue
        seen.add(key)
        out.append((question, _hard_distractors(world, rng, question, distractors),
                    rng.getrandbits(64)))
    if len(out) < n:  # pragma: no cover - only with absurdly small worlds
        raise ValueError(f"world {world.seed} has fewer than {n} distinct questions")
    return out


def load_synthhop(split: str, n: int, seed: int, *, questions_per_world: int = 8,
                  world_scale: float = 1.0, distractors: int = 6,
                  type_weights: dict[str, float] | None = None) -> list[Example]:
    """n synthhop examples of a split; deterministic in (split, seed, options)."""
    if n < 0 or questions_per_world < 1 or distractors < 0:
        raise ValueError("n and distractors must be >= 0 and questions_per_world >= 1")
    type_weights = dict(type_weights or DEFAULT_TYPE_WEIGHTS)
    if set(type_weights) - set(DEFAULT_TYPE_WEIGHTS):
        raise ValueError(f"type_weights keys must be among {sorted(DEFAULT_TYPE_WEIGHTS)}")
    size = WorldSize().scaled(world_scale)
    examples: list[Example] = []
    for world_index in range((n + questions_per_world - 1) // questions_per_world):
        ws = world_seed(BENCHMARK, split, seed, world_index)
        world = cached_world(ws, size)
        wanted = min(questions_per_world, n - len(examples))
        for question, hard, order_seed in _world_questions(world, wanted, distractors, type_weights):
            passages = [Passage(e.name, world.passages[e.name].text, True) for e in question.evidence]
            passages += [world.passages[e.name] for e in hard]
            random.Random(order_seed).shuffle(passages)  # evidence positions are seeded too
            examples.append(Example(
                example_id=example_id(BENCHMARK, split, seed, len(examples)),
                benchmark=BENCHMARK,
                question=question.text,
                passages=tuple(passages),
                answers=(question.answer,),
                meta={**question.meta, "world_seed": ws, "world_index": world_index,
                      "world_scale": world_scale,
                      "supporting_titles": [e.name for e in question.evidence]},
            ))
    return examples


# One-hop fact questions, used as extra training questions (`context_questions`); the benchmark
# itself asks only the multi-hop types above. Phrasings differ from the bridge templates.
FACTS = {
    "city": (("country", "Which country is the city of {x} in?"),
             ("founded", "In what year was the city of {x} founded?")),
    "university": (("city", "In which city is {x}?"), ("founded", "When was {x} established?")),
    "person": (("birth_city", "Where was {x} born?"), ("birth_year", "In what year was {x} born?"),
               ("alma_mater", "Which university did {x} attend?"),
               ("occupation", "What is the occupation of {x}?")),
    "company": (("founder", "Who founded {x}?"), ("headquarters", "Where is {x} headquartered?"),
                ("founded", "In what year was {x} founded?")),
    "film": (("director", "Who directed {x}?"), ("studio", "Which company produced {x}?"),
             ("released", "In what year was {x} released?")),
}


def context_questions(example: Example) -> list[tuple[str, str, str]]:
    """Every (question, answer, kind) the example's own passages answer, besides its question: one-hop
    facts of each passage, bridges whose whole path is present, comparisons of present pairs.
    Deterministic (sorted); the training batches draw extra questions per row from it, which
    multiplies the answer supervision per context token."""
    size = WorldSize().scaled(example.meta.get("world_scale", 1.0))
    world = cached_world(int(example.meta["world_seed"]), size)
    present = {p.title for p in example.passages} & set(world.entities)
    ents = [world.entities[name] for name in sorted(present)]
    out: set[tuple[str, str, str]] = set()
    for e in ents:
        for attr, template in FACTS[e.kind]:
            if e.attrs.get(attr) is not None:
                out.add((template.format(x=e.name), str(e.attrs[attr]), "fact"))
    for question, answer in _present_bridges(world, ents, present):
        out.add((question, answer, "bridge"))
    for comp in COMPARISONS:
        same = [e for e in ents if e.kind == comp.kind]
        for i, a in enumerate(same):
            for b in same[i + 1:]:
                if a.attrs[comp.attr] == b.attrs[comp.attr]:
                    continue
                first, last = sorted((a, b), key=lambda x: x.attrs[comp.attr])
                out.add((comp.earlier[0].format(a=a.name, b=b.name), first.name, "comparison"))
                out.add((comp.later[0].format(a=b.name, b=a.name), last.name, "comparison"))
    return sorted(qa for qa in out if qa[:2] != (example.question, example.answer))


def _present_bridges(world: World, ents: list[Entity], present: set[str]):
    """(question, answer) of every bridge whose whole path (each entity it passes through before
    the answer) is among the present passages."""
    for bridge in BRIDGES_2 + BRIDGES_3:
        for e in ents:
            if e.kind != bridge.start:
                continue
            value = e.name
            for i, attr in enumerate(bridge.path):
                value = world.entities[value].attrs[attr]
                if i < len(bridge.path) - 1 and value not in present:
                    break
            else:
                yield bridge.templates[0].format(x=e.name), str(value)


def world_distractor_pool(example: Example) -> tuple[Passage, ...]:
    """Every passage of the example's world (regenerated from its seed): the natural source of
    extra distractors for longer contexts. The variant builder drops the ones already present."""
    size = WorldSize().scaled(example.meta.get("world_scale", 1.0))
    return tuple(cached_world(int(example.meta["world_seed"]), size).passages.values())
