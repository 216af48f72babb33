"""What the constructed model wise-chain must do on a synthchain prompt, derived from its construction
and the block-level definitions — never from running it (an oracle the tests and the report compare
measured results against).

The construction (``wise.models.construct``) fixes the attention of every row in each of its
four (core layer, head) pairs. Layer 0 head 0: the question rows (``+m``, ``?``, ``Answer`` and the
final ``:``) attend at step t the target row of the fact of hop t while t <= L (fact x_{t-1} ->
x_t) and the terminal fact's target row from step L + 1 on; every other row attends BOS (row 0).
Layer 1 head 1: on a two-token question (``??``) the row that holds the first answer a1 after the
prompt chases a1's chain the same way (L2 hops, no refinement) and gives the second token; every
prompt row attends BOS there. Layer 1 head 0 and layer 0 head 1 split each question row's mass
between BOS and the ``+m`` row (NEED_SPLIT : 1, and at step 1 also the first hop's fact DECOY times
the +m row; RENORM_SPLIT : 1 at every step; other rows attend BOS); a refinement needs the +m row
read in layer 1 head 0 (the other split only checks that weights inside a support sum to 1, which
every correct rule keeps). A chasing row advances only
when the row it needs is visible; a pointer move or a refinement is one step; a token is right iff
its row made all its moves, and the answer iff every token is. From that, per condition
(DESIGN §4), each token through its own (layer, head):

* masses: r[q, b] = share of query block q's real rows whose attended row lies in key block b
  (a row split between two rows counts each share);
  the appended answer row's own masses are one-hot (one row, |I_q| = 1), and its late support is
  its block's row of the prompt's support (layer 1 head 1: BOS only) unioned with its own
  (``wise.engine.appended_rows``); it runs T steps (t_d under Truncate);
* a mass support takes blocks by decreasing mass (ties: lower index) until η of the row total;
* WISE = union of the mass supports of steps t_d-w+1..t_d; Static-95 = the step-1 support at 0.95;
  MassMatched = the step-1 ranking cut at the step-1 mass inside the WISE row; SizeMatched = the
  step-1 top-|WISE row| (zero-mass blocks by index); Freeze-A reuses the step-t_d attention, so its
  late steps read the same fact every step; Truncate stops at t_d.

Small attention leaks (sinks, ~1e-4 of a question row's mass) are ignored, so the expectations hold
for η < 0.999. This module re-implements the support rules on purpose (in plain Python over the few
blocks that carry mass) instead of calling ``wise.engine.support``: a bug there must show up as a
mismatch, not cancel out.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from wise.data import synthchain as sc
from wise.engine.runner import WiseSettings
from wise.models.chain_parts import DECOY, NEED_SPLIT, RENORM_SPLIT

CONDITIONS = ("full", "wise", "static95", "mass_matched", "size_matched", "freeze_a", "truncate")


@dataclass(frozen=True)
class ChainLayout:
    """Where things are in a tokenised synthchain prompt (rows = token positions, BOS = row 0)."""

    n: int  # rows of the sequence (a prompt, or a prompt plus appended answer tokens)
    answer_row: int  # the last prompt row (":" after "Answer"), whose logits give the answer
    question_rows: tuple[int, ...]  # the rows that chase the pointer
    question_span: tuple[int, ...]  # the question text's rows through the end of the prompt
    hop_rows: tuple[int, ...]  # hop_rows[t-1]: target row of the fact read at step t (t = 1..L)
    terminal_row: int  # target row of the terminal fact z => z
    hops: int  # L
    refine: int  # m
    follow: "Chase | None" = None  # two-token questions: the first answer row's chase of a1's chain

    @property
    def chase(self) -> "Chase":
        return Chase(self.hop_rows, self.terminal_row, self.refine)

    def attended(self, step: int) -> int:
        """The row every question row attends at a Full step."""
        return self.chase.attended(step)


@dataclass(frozen=True)
class Chase:
    """What one chasing row reads: the fact of each hop, then the terminal fact (refine times more)."""

    hop_rows: tuple[int, ...]
    terminal_row: int
    refine: int

    @property
    def hops(self) -> int:
        return len(self.hop_rows)

    def attended(self, step: int) -> int:
        return self.hop_rows[step - 1] if step <= self.hops else self.terminal_row


def parse_layout(tokens: list[str], prompt_len: int | None = None) -> ChainLayout:
    """`tokens`: the sequence as token strings (BOS first); `prompt_len`: rows of the prompt if
    answer tokens were appended. Raises ValueError when the prompt is not a synthchain prompt."""
    n = len(tokens)
    end = n if prompt_len is None else prompt_len
    if end < 8 or tokens[end - 3] not in (sc.QMARK, sc.FOLLOW_QMARK) or \
            tokens[end - 2:end] != [sc.ANSWER_WORD, sc.COLON] or \
            tokens[end - 7:end - 5] != [sc.QUESTION_WORD, sc.COLON]:
        raise ValueError("not a synthchain prompt: it must end with 'Question: <s> +<m> ?' (or '??') 'Answer:'")
    start, refine_tok = tokens[end - 5], tokens[end - 4]
    refine = int(refine_tok[1:])
    facts = {}
    for i in range(1, end - 4):
        if tokens[i] == sc.COLON and i + 3 < end and tokens[i + 3] == sc.END \
                and tokens[i + 1] in (sc.ARROW, sc.TERMINAL_ARROW):
            facts[tokens[i - 1]] = (i + 2, tokens[i + 2], tokens[i + 1] == sc.TERMINAL_ARROW)
    hop_rows, terminal_row, end_entity = _walk(facts, start)
    follow = None
    if tokens[end - 3] == sc.FOLLOW_QMARK:  # the row of a1 chases a1's chain
        follow = Chase(*_walk(facts, sc.successor(end_entity, refine))[:2], 0)
    return ChainLayout(n=n, answer_row=end - 1, question_rows=(end - 4, end - 3, end - 2, end - 1),
                       question_span=tuple(range(end - 5, end)), hop_rows=hop_rows,
                       terminal_row=terminal_row, hops=len(hop_rows), refine=refine, follow=follow)


def _walk(facts: dict, start: str) -> tuple[tuple[int, ...], int, str]:
    """(hop target rows, terminal target row, end entity) of the chain from `start`."""
    hop_rows, x = [], start
    while True:
        if x not in facts:
            raise ValueError(f"chain of {start} breaks at {x}: no fact with that source")
        row, target, terminal = facts[x]
        if terminal:
            return tuple(hop_rows), row, x
        hop_rows.append(row)
        x = target
        if len(hop_rows) > len(facts):
            raise ValueError(f"chain of {start} does not end in a terminal")


# -- block masses and the support rules on them --------------------------------------------------
def block_masses(layout: ChainLayout, step: int, block_size: int, query_block: int) -> dict[int, float]:
    """Key block -> mass for one query block at a Full step (only blocks with mass)."""
    rows = range(query_block * block_size, min(layout.n, (query_block + 1) * block_size))
    masses: dict[int, float] = {}
    chasing = set(layout.question_rows)
    for i in rows:
        target = layout.attended(step) if i in chasing else 0
        masses[target // block_size] = masses.get(target // block_size, 0.0) + 1.0 / len(rows)
    return masses


def _ranked(masses: dict[int, float], query_block: int) -> list[int]:
    """Causal key blocks by decreasing mass, ties (and zero-mass blocks) to the lower index."""
    return sorted(range(query_block + 1), key=lambda b: (-masses.get(b, 0.0), b))


def _prefix(masses: dict[int, float], query_block: int, target: float) -> set[int]:
    kept, total = set(), 0.0
    for b in _ranked(masses, query_block):
        if kept and total >= target * (1 - 1e-6):
            break
        kept.add(b)
        total += masses.get(b, 0.0)
    return kept


def mass_support_row(masses: dict[int, float], query_block: int, eta: float) -> set[int]:
    return _prefix(masses, query_block, eta * sum(masses.values()))


def support_row(condition: str, masses_at, q: int, s: WiseSettings) -> set[int] | None:
    """One query block's late support under `condition` (None: unrestricted), from its Full block
    masses at each step (``masses_at(step)``: key block -> mass)."""
    if condition in ("full", "truncate"):
        return None
    window = range(s.discovery_step - s.window + 1, s.discovery_step + 1)
    wise = set().union(*(mass_support_row(masses_at(t), q, s.eta) for t in window))
    step1 = masses_at(1)
    rules = {
        "wise": lambda: wise,
        "freeze_a": lambda: wise,  # Freeze-A reads inside the WISE support (its weights frozen)
        "static95": lambda: mass_support_row(step1, q, 0.95),
        "mass_matched": lambda: _prefix(step1, q, sum(step1.get(b, 0.0) for b in wise)),
        "size_matched": lambda: set(_ranked(step1, q)[:len(wise)]),
    }
    if condition not in rules:
        raise ValueError(f"no late support for condition {condition!r}")
    return rules[condition]()


def visible_blocks(layout: ChainLayout, condition: str, s: WiseSettings) -> set[int] | None:
    """Key blocks the answer row may attend in late steps (None: unrestricted)."""
    q = layout.answer_row // s.block_size
    return support_row(condition, lambda t: block_masses(layout, t, s.block_size, q), q, s)


def split_masses(layout: ChainLayout, block_size: int, query_block: int,
                 shares: tuple[tuple[int, float], ...]) -> dict[int, float]:
    """Key block -> mass for one query block in a head where each question row puts `shares`
    ((row, share), ...) of its mass and every other row attends BOS."""
    rows = range(query_block * block_size, min(layout.n, (query_block + 1) * block_size))
    masses: dict[int, float] = {}
    for i in rows:
        for target, share in (shares if i in layout.question_rows else ((0, 1.0),)):
            masses[target // block_size] = masses.get(target // block_size, 0.0) + share / len(rows)
    return masses


def need_shares(layout: ChainLayout, step: int) -> tuple[tuple[int, float], ...]:
    """A question row's attention in layer 1 head 0 at `step`: BOS and the +m row NEED_SPLIT : 1,
    and at step 1 also the first hop's fact (the row step 1 attends), DECOY times the +m row."""
    m_row = layout.question_rows[0]
    if step == 1:
        total = NEED_SPLIT + 1.0 + DECOY
        return (0, NEED_SPLIT / total), (m_row, 1.0 / total), (layout.attended(1), DECOY / total)
    return (0, NEED_SPLIT / (NEED_SPLIT + 1.0)), (m_row, 1.0 / (NEED_SPLIT + 1.0))


def renorm_shares(layout: ChainLayout) -> tuple[tuple[int, float], ...]:
    """A question row's attention in layer 0 head 1 (every step): BOS and the +m row RENORM_SPLIT : 1."""
    return (0, RENORM_SPLIT / (RENORM_SPLIT + 1.0)), (layout.question_rows[0], 1.0 / (RENORM_SPLIT + 1.0))


def refine_visible(layout: ChainLayout, condition: str, s: WiseSettings) -> bool:
    """Whether the answer row still reads the +m row (layer 1 head 0) in late steps, which the
    refinement needs: its block stays in the answer row's support in that head. (Layer 0 head 1
    only checks that the weights inside a support sum to 1, which every correct rule keeps.)"""
    B = s.block_size
    q, m_block = layout.answer_row // B, layout.question_rows[0] // B
    visible = support_row(condition, lambda t: split_masses(layout, B, q, need_shares(layout, t)), q, s)
    return visible is None or m_block in visible


def follow_visible_blocks(layout: ChainLayout, condition: str, s: WiseSettings) -> set[int] | None:
    """Key blocks the first answer row (appended at row answer_row + 1) may attend in late steps
    through layer 1 head 1: its own support (one row, one-hot masses) unioned with its block's row
    of the prompt's support in that head, where every prompt row attends BOS (block 0)."""
    row, B, chase = layout.answer_row + 1, s.block_size, layout.follow
    q = row // B
    own = support_row(condition, lambda t: {chase.attended(t) // B: 1.0}, q, s)
    if own is None:
        return None
    prompt_blocks = -(-row // B)
    return own | ({0} if q < prompt_blocks else set())


@dataclass(frozen=True)
class Outcome:
    correct: bool  # every token of the answer
    hops_done: int
    refinements_done: int
    follow_hops_done: int | None = None  # two-token questions: the second token's row
    first_correct: bool | None = None


def chase_progress(chase: Chase, condition: str, s: WiseSettings, visible: set[int] | None,
                   td: int, last: int, refines: bool = True) -> tuple[int, int]:
    """(hops, refinements) a chasing row has made after its last step: Full progress through
    step td, then, per late step, one move while the row it needs is visible (a refinement also
    needs `refines`: the +m row read, ``refine_visible``)."""
    L, m = chase.hops, chase.refine
    k, j = min(td, L), min(max(td - L, 0), m)  # Full progress after the shared steps
    if condition == "freeze_a":
        # Late steps read the fact attended at step t_d: the terminal (refinement goes on) or a hop
        # fact whose target is already the pointer (nothing moves).
        if chase.attended(td) == chase.terminal_row and refines:
            j = min(m, j + (last - td))
        return k, j
    for _ in range(td + 1, last + 1):
        need = chase.hop_rows[k] if k < L else chase.terminal_row
        if visible is not None and need // s.block_size not in visible:
            break  # the needed fact is invisible at every later step too
        if k < L:
            k += 1
        elif j < m and refines:
            j += 1
        else:
            break
    return k, j


def expected_outcome(layout: ChainLayout, condition: str, s: WiseSettings) -> Outcome:
    """Progress of the chasing rows after the run and whether the answer is right."""
    if condition == ADAPTIVE:
        return expected_adaptive(layout, s)[1]
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}")
    last = s.discovery_step if condition == "truncate" else s.steps
    td = s.steps if condition == "full" else s.discovery_step  # full: nothing is restricted
    restricted = condition not in ("full", "truncate")
    k, j = chase_progress(layout.chase, condition, s, visible_blocks(layout, condition, s) if restricted else None,
                          td, last, not restricted or refine_visible(layout, condition, s))
    first = k == layout.hops and j == layout.refine
    if layout.follow is None:
        return Outcome(first, k, j)
    # The second token's row exists as the model wrote it: only a right first token makes it the
    # row whose chase is known.
    k2, _ = chase_progress(layout.follow, condition, s,
                           follow_visible_blocks(layout, condition, s) if restricted else None, td, last)
    return Outcome(first and k2 == layout.follow.hops, k, j, k2, first)


# -- the mechanism study at the question rows ----------------------------------------------------
def expected_taus(layout: ChainLayout, steps: int, run: int = 3, first: int = 4) -> dict[str, int]:
    """tau_S, tau_A, tau_O, tau_H over the question span under the diagnostics' rule (DESIGN §4:
    the first transition of a run of `run` meeting the criterion; A/H/O relative to the median of
    their first `first` finite transitions; T+1 when censored). Attention (S, A, O) changes at the
    transitions into steps 2..L+1 and is constant after; the state changes into steps
    2..L+max(m, 1). S is an absolute threshold (its hop values are far below 0.90); a relative
    criterion is censored when at most one of its first transitions is nonzero (median 0)."""
    L, m = layout.hops, layout.refine
    censored = steps + 1

    def relative(last_change: int) -> int:
        nonzero_early = max(0, min(first, last_change - 1))  # nonzero among transitions into 2..first+1
        if first - nonzero_early > first // 2:  # median of the first `first` values is 0
            return censored
        tau = last_change + 1
        return tau if tau + run - 1 <= steps else censored

    tau_s = L + 2 if L + 2 + run - 1 <= steps else censored
    return {"tau_S": tau_s, "tau_A": relative(L + 1), "tau_O": relative(L + 1),
            "tau_H": relative(L + max(m, 1))}


def expected_full_em_at(layouts: list[ChainLayout], steps: int) -> float:
    """Share of questions a Full run of `steps` steps answers: L + m <= T (and L2 <= T)."""
    def right(lay):
        return lay.hops + lay.refine <= steps and (lay.follow is None or lay.follow.hops <= steps)
    return sum(map(right, layouts)) / len(layouts) if layouts else math.nan


# -- wise_adaptive: the discovery depth each question settles at (issue 33) ----------------------
ADAPTIVE = "wise_adaptive"


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b)


def adaptive_step(layout: ChainLayout, s: WiseSettings) -> int:
    """The step wise_adaptive's criterion fires on this prompt (``jaccard_min``): the first t in
    min_step..max_step at which every pair of consecutive steps in t-w+1..t has mass supports
    with Jaccard >= threshold in every query block; max_step if none. Supports are this module's
    (mass_support_row over block_masses, and over layer 1 head 0's split, whose step-1 decoy makes
    its supports change from step 1 to 2); the other heads' masses never change with the step, so
    their supports cannot hold the criterion up."""
    rule, B = s.adaptive, s.block_size
    blocks = range(-(-layout.n // B))
    supports: dict[int, list[set[int]]] = {}

    def support(t: int) -> list[set[int]]:
        if t not in supports:
            supports[t] = [mass_support_row(block_masses(layout, t, B, q), q, s.eta) for q in blocks] + \
                [mass_support_row(split_masses(layout, B, q, need_shares(layout, t)), q, s.eta) for q in blocks]
        return supports[t]

    for t in range(rule.min_step, rule.max_step + 1):
        if t >= rule.window and all(_jaccard(a, b) >= rule.threshold
                                    for u in range(t - rule.window + 2, t + 1)
                                    for a, b in zip(support(u - 1), support(u))):
            return t
    return rule.max_step


def expected_adaptive(layout: ChainLayout, s: WiseSettings) -> tuple[int, Outcome]:
    """(t_a, outcome) of wise_adaptive: WISE with t_d = t_a and the rule's window."""
    t_a = adaptive_step(layout, s)
    wise = dataclasses.replace(s, discovery_step=t_a, window=s.adaptive.window)
    return t_a, expected_outcome(layout, "wise", wise)
