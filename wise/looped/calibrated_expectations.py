"""Expected outcomes on the constructed base (``wise.looped.chain_base``) for known-depth items
(``wise.looped.known_depth``), derived from the items alone: nothing here runs a model, so a bug
in the retrofit, the looped model or a halting rule shows up as a mismatch with these.

After loop t of the hop layer the question's answer register holds nothing for t < L (the
pointer is still on the chain; a = 0, the argmax is token 0) and succ^k(z) for t >= L, with
k = t - L when the base overshoots (plain looping: right only at t = d = L + m) and
k = min(t - L, m) when it latches (the ideal: right at every t >= d). An item with a missing hop
fact never gets an answer. From that:

- fixed@T accuracy: the share of reachable items with d = T (overshoot) or d <= T (latched);
- the loss oracle's labels on a latched trajectory: continue (1) while t < d for a reachable
  item, stop (0) at once for an unreachable one; the oracle rule stops at max(d, t_min)
  (reachable) or t_min (unreachable): its mean loops and accuracy;
- the correctness-oracle ceiling: stops at d when reachable, runs to t_max and fails otherwise;
- the confidence rule (least top-1 probability of the answer's tokens >= λ, for any λ between
  1/V and the construction's ~1): confident from loop L on (an answer register is set), never
  before and never on unreachable items;
- the stability rule (stop when loop t+1 predicts what loop t did): simulated on the predicted
  tokens.
"""
from __future__ import annotations

from typing import Sequence

from wise.data import synthchain as sc
from wise.looped.known_depth import KnownItem


def prediction(item: KnownItem, t: int, overshoot: bool) -> str | None:
    """The entity the base answers after t loops of the hop layer (None: no answer register)."""
    if t < 1:
        raise ValueError(f"t must be >= 1, got {t}")
    if not item.reachable or t < item.hops:
        return None
    k = t - item.hops if overshoot else min(t - item.hops, item.refine)
    return sc.successor(item.chain[-1], k)


def correct(item: KnownItem, t: int, overshoot: bool) -> bool:
    return prediction(item, t, overshoot) == item.answer


def fixed_accuracy(items: Sequence[KnownItem], T: int, overshoot: bool) -> float:
    return sum(correct(it, T, overshoot) for it in items) / len(items)


def oracle_labels(item: KnownItem, t_max: int) -> list[int]:
    """y_t for t = 1..t_max-1 on the latched trajectory: 1 iff a later loop lowers the loss."""
    return [int(item.reachable and t < item.depth) for t in range(1, t_max)]


def oracle_depth(item: KnownItem, t_min: int, t_max: int) -> int:
    return min(t_max, max(t_min, item.depth)) if item.reachable else t_min


def ceiling_depth(item: KnownItem, t_max: int) -> int:
    return item.depth if item.reachable and item.depth <= t_max else t_max


def confidence_depth(item: KnownItem, t_min: int, t_max: int) -> int:
    return min(t_max, max(t_min, item.hops)) if item.reachable else t_max


def stability_depth(item: KnownItem, t_min: int, t_max: int, overshoot: bool) -> tuple[int, int]:
    """(depth answered from, loops computed): stops after loop t when prediction(t) equals
    prediction(t-1) and t-1 >= t_min (the token-mismatch look-ahead); else the budget."""
    for t in range(2, t_max + 1):
        if t - 1 >= t_min and prediction(item, t, overshoot) == prediction(item, t - 1, overshoot):
            return t - 1, t
    return t_max, t_max


def _summary(items, depths, overshoot: bool) -> dict:
    picked = [correct(it, d, overshoot) for it, d in zip(items, depths)]
    return {"accuracy": sum(picked) / len(items), "mean_loops": sum(depths) / len(items)}


def expected_table(items: Sequence[KnownItem], t_min: int, t_max: int, overshoot: bool) -> dict[str, dict]:
    """Method -> {accuracy, mean_loops} expected on `items` (overshoot: which base is looped)."""
    if not items:
        raise ValueError("no items")
    out = {f"fixed@{T}": {"accuracy": fixed_accuracy(items, T, overshoot), "mean_loops": float(T)}
           for T in range(1, t_max + 1)}
    out["oracle"] = _summary(items, [oracle_depth(it, t_min, t_max) for it in items], overshoot)
    out["oracle_correct"] = _summary(items, [ceiling_depth(it, t_max) for it in items], overshoot)
    out["confidence"] = _summary(items, [confidence_depth(it, t_min, t_max) for it in items], overshoot)
    out["stability"] = _summary(items, [stability_depth(it, t_min, t_max, overshoot)[0] for it in items], overshoot)
    return out


def shares(items: Sequence[KnownItem], t_max: int) -> dict:
    """The item mix: share unreachable, share per depth d (reachable items), mean d."""
    reach = [it for it in items if it.reachable]
    return {"n": len(items), "unreachable": 1 - len(reach) / len(items),
            "depth": {d: sum(it.depth == d for it in reach) / len(items) for d in range(1, t_max + 1)},
            "mean_depth_reachable": sum(it.depth for it in reach) / max(1, len(reach))}


# WISE under adaptive depth on the latched base, the depth chosen by the loss oracle (d for a
# reachable item). Loop t of the hop layer reads, on the question row (the prompt's last row), the
# fact whose source is x_min(t, L) (the chain's nodes, then the terminal fact again while m counts
# down): all its mass on that fact's target-token row. The other rows of the question row's query
# block put all theirs on BOS (block 0). The support of that query block at a discovery loop is
# the fewest blocks, largest mass first, whose mass reaches eta of the block's (the question row:
# 1 of k rows); the working set is the union over loops t_d-w+1..t_d. A late loop t in t_d+1..d
# answers as under Full iff its fact's block is in the working set; otherwise the question row's
# attention falls on what is left, the pointer does not move to the fact's target, and the answer
# is lost.
def fact_target_rows(tokens: Sequence[str]) -> dict[str, int]:
    """Row of each fact's target token (``x : -> y .``, ``z : => z .``), by its source x."""
    return {tokens[i]: i + 3 for i in range(len(tokens) - 3)
            if tokens[i + 1] == sc.COLON and tokens[i + 2] in (sc.ARROW, sc.TERMINAL_ARROW)}


def question_block_support(fact_block: int, rows_in_block: int, eta: float) -> set[int]:
    """Blocks kept for the question row's query block at one loop (its k rows: the question row
    reading `fact_block`, the others reading block 0)."""
    mass: dict[int, float] = {0: float(rows_in_block - 1)}
    mass[fact_block] = mass.get(fact_block, 0.0) + 1.0
    kept, total = set(), 0.0
    for block, m in sorted(mass.items(), key=lambda kv: -kv[1]):
        if m <= 0 or total >= eta * rows_in_block:
            break
        kept.add(block)
        total += m
    return kept


def wise_correct(item: KnownItem, tokens: Sequence[str], discovery_step: int, window: int, block_size: int,
                 eta: float) -> bool:
    """Whether WISE (t_d, w, B, eta) keeps the latched base's answer at the oracle's depth d."""
    if not item.reachable:
        return False
    if item.depth <= discovery_step:  # the rule stops before any loop reuses the working set
        return True
    rows = fact_target_rows(tokens)
    n = len(tokens)
    k = n - (n - 1) // block_size * block_size  # rows in the question row's (the last) query block
    block = lambda t: rows[item.chain[min(t, item.hops)]] // block_size
    working = set().union(*(question_block_support(block(t), k, eta)
                            for t in range(max(1, discovery_step - window + 1), discovery_step + 1)))
    return all(block(t) in working for t in range(discovery_step + 1, item.depth + 1))
