"""synthchain: pointer chasing over single-token entities, the calibration benchmark.

A context is a shuffled list of facts over entities ``e0000`` … ``e1023``. The facts form disjoint
chains ``x0 -> x1 -> … -> xL``; the last entity of a chain points to itself, and that fact is
marked as terminal with ``=>``. One fact is one passage titled with its source entity::

    e0417: -> e0093 .          (x -> y)
    e0093: => e0093 .          (terminal: the chain ends at e0093)

A question names a start entity s and a refinement count m (``Question: e0417 +3 ?``). The answer
is the end z of s's chain (L hops), advanced m times by a fixed successor map over the entity
vocabulary (``successor``; the model's parametric knowledge, never written in a context). The
question's chain is the evidence; longer contexts add whole distractor chains of the same world.

Two-token answers (``follow_hops`` > 0, what the default run uses): the question ends with ``??``
instead of ``?`` (``Question: e0417 +3 ??``) and asks, after the first answer a1 (as above), for
the end a2 of the chain that starts at a1: the world puts a second chain of 1..follow_hops hops at
a1 (or, when a1 already lies on the question's chain, a1's own rest of that chain), and both chains
are evidence. So the second answer token needs its own hops through the context, taken by the row
that holds a1 after the prompt. ``follow_hops`` = 0 (the loader's default) gives the one-token
benchmark, with exactly the worlds it always had.

Each example has its own world: a seeded permutation of the entities, cut into the question's
chain (L + 1 entities) and distractor chains of 1..max_hops hops, so every entity is the source of at
most one fact and every chain ends in a terminal. Defaults: L uniform on 1..16, m uniform on 0..8.
Train / validation / test never share a world (the split is hashed into the world seed).

The word-level tokenizer (``build_tokenizer``) gives every entity, arrow, marker and refinement
count one token, so a fact is exactly five tokens and the question segment seven; a budget of n
tokens holds about n / 5 facts, at most ``N_ENTITIES`` (contexts up to ~5000 tokens).
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

from wise.data.examples import Example, Passage
from wise.data.splits import derive_seed, example_id, world_seed
from wise.data.tokenizer import BOS_ID, SPECIAL_TOKENS

BENCHMARK = "synthchain"
N_ENTITIES = 1024
ENTITIES = tuple(f"e{i:04d}" for i in range(N_ENTITIES))
MAX_REFINE_TOKEN = 16  # the vocabulary has refinement tokens +0 … +16
ARROW, TERMINAL_ARROW, END, COLON, QMARK = "->", "=>", ".", ":", "?"
FOLLOW_QMARK = "??"  # ends a question whose answer is two tokens (a1, then the end of a1's chain)
QUESTION_WORD, ANSWER_WORD = "Question", "Answer"
UNK = "<unk>"
# The successor map is fixed for the benchmark (every split, every world): one cycle through all
# entities in a seeded order, so succ^k has no fixed point for 0 < k < N_ENTITIES.
SUCCESSOR_SEED = 0


@functools.lru_cache(maxsize=1)
def successor_cycle() -> tuple[str, ...]:
    """The entities in successor order: successor(cycle[i]) = cycle[(i + 1) % N_ENTITIES]."""
    order = list(ENTITIES)
    random.Random(derive_seed(BENCHMARK, "successor", SUCCESSOR_SEED)).shuffle(order)
    return tuple(order)


@functools.lru_cache(maxsize=1)
def cycle_position() -> dict[str, int]:
    """Entity -> its index in ``successor_cycle()`` (what the constructed model encodes)."""
    return {e: i for i, e in enumerate(successor_cycle())}


def successor(entity: str, k: int = 1) -> str:
    """The entity k steps further along the successor map."""
    return successor_cycle()[(cycle_position()[entity] + k) % N_ENTITIES]


def fact_passage(source: str, target: str, evidence: bool = False) -> Passage:
    """``source: -> target .``, or the terminal ``z: => z .`` when target is source."""
    arrow = TERMINAL_ARROW if target == source else ARROW
    return Passage(source, f"{arrow} {target} {END}", evidence)


def chain_passages(chain: tuple[str, ...], evidence: bool = False) -> tuple[Passage, ...]:
    """The L hop facts of a chain x0..xL and its terminal fact, in chain order."""
    facts = [fact_passage(a, b, evidence) for a, b in zip(chain, chain[1:])]
    return (*facts, fact_passage(chain[-1], chain[-1], evidence))


def question_text(start: str, refine: int, follow: bool = False) -> str:
    return f"{start} +{refine} {FOLLOW_QMARK if follow else QMARK}"


@dataclass(frozen=True)
class World:
    seed: int
    chain: tuple[str, ...]  # the question's chain x0..xL
    refine: int  # m
    distractor_chains: tuple[tuple[str, ...], ...]
    follow_chain: tuple[str, ...] = ()  # two-token answers: the chain from a1 (a new chain only)

    def follow_path(self) -> tuple[str, ...]:
        """The path from the first answer a1 to the second, a2 (its last entity)."""
        first = successor(self.chain[-1], self.refine)
        if first in self.chain:
            return self.chain[self.chain.index(first):]
        return self.follow_chain


def make_world(seed: int, max_hops: int, max_refine: int, follow_hops: int = 0) -> World:
    rng = random.Random(seed)
    hops = rng.randint(1, max_hops)
    refine = rng.randint(0, max_refine)
    entities = list(ENTITIES)
    rng.shuffle(entities)
    chain, rest = tuple(entities[:hops + 1]), entities[hops + 1:]
    follow: tuple[str, ...] = ()
    first = successor(chain[-1], refine)
    if follow_hops and first not in chain:  # drawn after the one-token world's draws
        length = random.Random(seed ^ 0x5EC0_4D).randint(1, follow_hops)
        rest.remove(first)
        follow, rest = (first, *rest[:length]), rest[length:]
    distractors = []
    while len(rest) >= 2:  # a chain needs at least one hop
        length = min(rng.randint(1, max_hops), len(rest) - 1)
        distractors.append(tuple(rest[:length + 1]))
        rest = rest[length + 1:]
    return World(seed, chain, refine, tuple(distractors), follow)


def load_synthchain(split: str, n: int, seed: int, *, max_hops: int = 16,
                    max_refine: int = 8, follow_hops: int = 0) -> list[Example]:
    """n synthchain examples of a split; deterministic in (split, seed, options); a larger n
    extends a smaller one. follow_hops > 0: two-token answers (module docstring)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= max_hops <= 64:
        raise ValueError(f"max_hops must be in 1..64, got {max_hops}")
    if not 0 <= max_refine <= MAX_REFINE_TOKEN:
        raise ValueError(f"max_refine must be in 0..{MAX_REFINE_TOKEN} (the refinement tokens), got {max_refine}")
    if not 0 <= follow_hops <= 64:
        raise ValueError(f"follow_hops must be in 0..64 (0: one-token answers), got {follow_hops}")
    examples = []
    for index in range(n):
        ws = world_seed(BENCHMARK, split, seed, index)
        world = make_world(ws, max_hops, max_refine, follow_hops)
        start, end = world.chain[0], world.chain[-1]
        first = successor(end, world.refine)
        meta = {"type": "chain", "hops": len(world.chain) - 1, "refine": world.refine,
                "start": start, "end": end, "chain": list(world.chain), "world_seed": ws,
                "max_hops": max_hops, "max_refine": max_refine,
                "supporting_titles": list(world.chain + world.follow_chain)}
        answer = first
        if follow_hops:
            path = world.follow_path()
            answer = f"{first} {path[-1]}"
            meta.update(follow_hops=follow_hops, follow=list(path))
        examples.append(Example(
            example_id=example_id(BENCHMARK, split, seed, index),
            benchmark=BENCHMARK,
            question=question_text(start, world.refine, bool(follow_hops)),
            passages=chain_passages(world.chain, evidence=True) + (
                chain_passages(world.follow_chain, evidence=True) if world.follow_chain else ()),
            answers=(answer,),
            meta=meta,
        ))
    return examples


def world_distractor_pool(example: Example) -> tuple[tuple[Passage, ...], ...]:
    """The example's distractor chains, each a group of facts added to a context whole."""
    world = make_world(int(example.meta["world_seed"]), int(example.meta["max_hops"]),
                       int(example.meta["max_refine"]), int(example.meta.get("follow_hops", 0)))
    return tuple(chain_passages(c) for c in world.distractor_chains)


def build_tokenizer() -> Tokenizer:
    """Word level: specials (<bos>=0, <eos>=1, <pad>=2), <unk>, the markers, +0..+16, the entities.
    Words split at whitespace, and a colon is its own token ("e0417:" -> "e0417", ":")."""
    vocab = [*SPECIAL_TOKENS, UNK, COLON, ARROW, TERMINAL_ARROW, END, QMARK, QUESTION_WORD,
             ANSWER_WORD, *(f"+{k}" for k in range(MAX_REFINE_TOKEN + 1)), *ENTITIES,
             FOLLOW_QMARK]  # added last, so every older id stays
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(":"), behavior="isolated")])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    return tok
