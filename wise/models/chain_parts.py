"""The pieces wise-chain's weights are written with (``wise.models.construct``): the constants of
its logits and registers, the entity codes, named ranges of the residual stream, and a writer for one
block's attention heads and MLP gate pairs (offset heads, heads that split a question row's mass
between BOS and the +m row, pointer-chasing heads).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from wise.data import synthchain as sc

HEAD_DIM = 64
# Two heads split each question row's mass between BOS and the +m row (build_weights says why):
NEED_SPLIT = 1.0  # layer 1 head 0: mass on BOS over mass on the +m row (the +m read refinement needs)
DECOY = 2.0  # ... and at step 1 only, the first hop's fact gets DECOY times the +m row's mass
RENORM_SPLIT = 15.0  # layer 0 head 1: BOS over +m, smaller, for the check that weights sum to 1
NOISE_DIMS = 16  # dims of the initial state a row compares with BOS's (see build_weights)
NOISE_STEP = 0.003  # |difference| per dim that counts as distinct (the state's std is 0.0087)
HEADS = 2  # per layer; the roles of the four (layer, head) pairs are in build_weights
ROPE_BASE = 1e30
CONST = 32768.0  # the constant coordinate (2**15): its square hides every register change from
# the RMS in float32 (ulp(2**30) = 128 > the registers' squared norm), so a norm's scale is bit-stable
# Logits (after the 1/sqrt(head_dim) scale) of the core head for a question row.
MATCH_LOGIT = 300.0  # key = the pointer's code
SINK_LOGIT = 270.0  # -> / => / . rows and BOS
BOS_LOGIT = 50.0  # what a row without a pointer gives BOS (everything else scores ~0)
PENALTY_LOGIT = 1000.0  # subtracted from every row that is neither a fact target nor a sink
SINK_CONTENT = 0.02  # "." sinks carry 0.02 x the code of their fact's target: their ranking moves
FETCH_LOGIT, FETCH_BOS_LOGIT = 100.0, 50.0
POSITION_MARGIN = 40.0  # logits between the offset a positional head targets and any other
GATE_SLOPE = 400.0  # SiLU gate pairs: A (c + 1/4) and A (c - 1/4) for a condition c in {+1/2, <= -1/2}
READOUT_SCALE, EOS_LOGIT = 100.0, 200.0
POSITION_PAIRS = 8  # RoPE pairs 0..7 rotate enough to locate offsets; pairs >= 8 are rotation-free



# -- entity codes --------------------------------------------------------------------------------
def code_frequencies(spec) -> np.ndarray:
    """K distinct frequencies in 1..N/2-1 with the lowest max code correlation among seeded draws."""
    rng = np.random.default_rng(spec.seed)
    n = sc.N_ENTITIES
    shifts = np.arange(1, n)
    best, best_f = math.inf, None
    for _ in range(spec.frequency_trials):
        f = np.sort(rng.choice(np.arange(1, n // 2), size=spec.code_pairs, replace=False))
        corr = np.cos(2 * np.pi * np.outer(shifts, f) / n).mean(1).max()
        if corr < best:
            best, best_f = corr, f
    return best_f


def entity_codes(freqs: np.ndarray) -> np.ndarray:
    """float64 [N, 2K]: unit codes of the cycle positions, pairs (cos, sin) per frequency."""
    i = np.arange(sc.N_ENTITIES)[:, None]
    angle = 2 * np.pi * i * freqs[None, :] / sc.N_ENTITIES
    code = np.stack([np.cos(angle), np.sin(angle)], axis=-1).reshape(sc.N_ENTITIES, -1)
    return code / math.sqrt(len(freqs))


def successor_rotation(freqs: np.ndarray) -> np.ndarray:
    """[2K, 2K] with code(i + 1) = R @ code(i)."""
    R = np.zeros((2 * len(freqs), 2 * len(freqs)))
    for k, f in enumerate(freqs):
        a = 2 * np.pi * f / sc.N_ENTITIES
        R[2 * k:2 * k + 2, 2 * k:2 * k + 2] = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
    return R


def max_code_correlation(freqs: np.ndarray) -> float:
    shifts = np.arange(1, sc.N_ENTITIES)
    return float(np.cos(2 * np.pi * np.outer(shifts, freqs) / sc.N_ENTITIES).mean(1).max())


# -- layouts -------------------------------------------------------------------------------------
class Slots:
    """Named ranges of the residual stream."""

    def __init__(self, **sizes: int):
        self.ranges, n = {}, 0
        for name, size in sizes.items():
            self.ranges[name] = range(n, n + size)
            n += size
        self.size = n

    def __getitem__(self, name: str) -> list[int]:
        return list(self.ranges[name])

    def at(self, name: str) -> int:
        (i,) = self.ranges[name]
        return i


def prelude_slots(D: int, R: int) -> Slots:
    """What the embedding and the prelude write (the prelude output e)."""
    return Slots(const=1, own=D, entity=1, arrow=1, term=1, sink=1, refine=1, m=R, qmark=1,
                 answer=1, bos=1, follow=1,
                 b1_code=D, b1_arrow=1, b1_term=1, b1_answer=1,  # layer 1: the previous token
                 b3_code=D, b3_qmark=1, b3_follow=1, b3_answer=1,  # layer 2: the token three back
                 fetch_code=D, fetch_m=R,  # layer 3: the question's start entity and count
                 fetch2=D)  # layer 3's MLP: the first answer row's own entity (two-token answers)


def core_slots(D: int, R: int) -> Slots:
    """The recurrent block's stream x = adapter([s, e]). Question rows: p = pi + p_d (pointer),
    r = p + q (answer), rem = remi + rem_d (refinements left, one-hot). The first answer row of a
    two-token question (is_q2): its own pointer p2 = pi2 + p_d2. (vy, v_term, v_match) is each row's
    value (its entity, whether its arrow was terminal, whether it is an entity); the chasing heads
    write what they read into (ay, a_term, a_match) (layer 0) and (ay2, a_term2, a_match2) (layer 1)."""
    return Slots(const=1, is_q=1, is_q2=1, arrow_b1=1, sink=1, bos=1, is_m=1, ok=1, okm=1, seen=1, later=1, eos=1,
                 kx=D, pi=D, p_d=D, q=D,
                 pi2=D, p_d2=D, vy=D, v_term=1, v_match=1, ay=D, a_term=1, a_match=1,
                 ay2=D, a_term2=1, a_match2=1, remi=R, rem_d=R,
                 noise=NOISE_DIMS, bos_noise=NOISE_DIMS, spread=1, same=1)


def pair_dims(i: int, style: str) -> tuple[int, int]:
    """The two head dims RoPE rotates together at frequency index i."""
    return (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + HEAD_DIM // 2)


def position_weights(rope_base: float, max_positions: int) -> tuple[np.ndarray, float]:
    """Per-pair weights W_i >= 0 (sum 1) of a RoPE offset head over pairs 0..POSITION_PAIRS-1: the LP
    that maximises the gap between score(offset) = sum_i W_i and every other causal offset delta,
    sum_i W_i cos((delta - k) theta_i). The gap does not depend on k; returns (weights, gap per unit
    weight). Both computed bases (wise-chain, ``wise.models.construct``; recurtrace-chain,
    ``wise.looped.chain_base``) place their offset heads with it."""
    from scipy.optimize import linprog

    theta = 1.0 / rope_base ** (np.arange(0, HEAD_DIM, 2)[:POSITION_PAIRS] / HEAD_DIM)
    delta = np.arange(1, max_positions)  # |offset - target| over a causal row, both sides
    gap = 1 - np.cos(np.outer(delta, theta))
    n = POSITION_PAIRS
    res = linprog(np.r_[np.zeros(n), -1.0], A_ub=np.hstack([-gap, np.ones((len(delta), 1))]),
                  b_ub=np.zeros(len(delta)), A_eq=np.r_[np.ones(n), 0.0][None], b_eq=[1.0],
                  bounds=[(0, None)] * n + [(None, None)], method="highs")
    if not res.success:  # pragma: no cover - the LP is feasible for any base
        raise RuntimeError(f"positional-head LP failed: {res.message}")
    return res.x[:n], float(res.x[n])


# -- the weights ---------------------------------------------------------------------------------
class Writer:
    """Fills one block's weights; q/k/v rows are head dims (head i: rows i*HEAD_DIM..), columns
    residual dims. `gate_pair` adds MLP units."""

    def __init__(self, h: int, I: int = 0, heads: int = 1):
        self.q, self.k, self.v = (np.zeros((heads * HEAD_DIM, h)) for _ in range(3))
        self.proj = np.zeros((h, heads * HEAD_DIM))
        self.gate, self.up, self.down = np.zeros((I, h)), np.zeros((I, h)), np.zeros((h, I))
        self.units = 0

    def load(self, block, norm_weight: float) -> None:
        t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
        with torch.no_grad():
            block.attn.Wqkv.weight.copy_(t(np.concatenate([self.q, self.k, self.v])))
            block.attn.proj.weight.copy_(t(self.proj))
            block.mlp.fc.weight.copy_(t(np.concatenate([self.gate, self.up])))
            block.mlp.proj.weight.copy_(t(self.down))
            block.norm_1.weight.fill_(norm_weight)
            block.norm_2.weight.fill_(norm_weight)

    def gate_pair(self, const: int, terms: dict[int, float], offset: float, up: dict[int, float],
                  target: int) -> None:
        """A condition c = sum(terms) + offset (linear in x) is +1/2 when the update applies and
        <= -1/2 otherwise; units silu(A(c + 1/4)) - silu(A(c - 1/4)) give A/2 or 0, times `up`,
        over A/2, added to `target`."""
        for sign, shift in ((1.0, 0.25), (-1.0, -0.25)):
            u = self.units
            for i, coef in terms.items():
                self.gate[u, i] += GATE_SLOPE * coef
            self.gate[u, const] += GATE_SLOPE * (offset + shift) / CONST
            for i, coef in up.items():
                self.up[u, i] += sign * coef
            self.down[target, u] = 2.0 / GATE_SLOPE
            self.units += 1

    def copy(self, head: int, pairs) -> None:
        """Value dims of `head` carry residual dims (source, destination) through the projection."""
        d = 0
        for src, dst in pairs:
            self.v[head * HEAD_DIM + d, src] = 1.0
            self.proj[dst, head * HEAD_DIM + d] = 1.0
            d += 1
        assert d <= HEAD_DIM


def offset_head(w: Writer, E: Slots, offset: int, pos_w: np.ndarray, scale: float, style: str,
                 copy: list[tuple[str, str]], head: int = 0) -> None:
    """A head attending `offset` rows back (from the constant alone, so the same q and k on every
    row; RoPE supplies the position) and copying slots (source, destination) of that row."""
    # q_i . R((l - j) theta_i) k_i with k_i = (kappa, 0), q_i = omega (cos psi, sin psi):
    # omega kappa cos((l - j) theta_i - psi); psi = -offset theta_i peaks at l = j - offset.
    theta = 1.0 / ROPE_BASE ** (np.arange(0, HEAD_DIM, 2)[:POSITION_PAIRS] / HEAD_DIM)
    o = head * HEAD_DIM
    for i in range(POSITION_PAIRS):
        a, b = pair_dims(i, style)
        amp = math.sqrt(scale * pos_w[i] * math.sqrt(HEAD_DIM))  # logit = q.k / sqrt(d)
        psi = -offset * theta[i]
        w.q[o + a, E.at("const")] = amp * math.cos(psi) / CONST
        w.q[o + b, E.at("const")] = amp * math.sin(psi) / CONST
        w.k[o + a, E.at("const")] = amp / CONST
    w.copy(head, [(s_dim, t_dim) for src, dst in copy for s_dim, t_dim in zip(E[src], E[dst], strict=True)])


def split_head(w: Writer, S: Slots, head: int, ratio: float, style: str) -> None:
    """Question rows (`is_q`) put 1 / (ratio + 1) of their mass on the +m row (`is_m`) and the rest
    on BOS (logits BOS_LOGIT and BOS_LOGIT - ln ratio); every other row attends BOS. The last RoPE
    pair carries both terms: its rotation is ~1e-29 rad per position, so the ratio is exact."""
    a, b = pair_dims(HEAD_DIM // 2 - 1, style)
    o, root = head * HEAD_DIM, math.sqrt(HEAD_DIM)
    w.q[o + a, S.at("const")] = 1.0 / CONST
    w.k[o + a, S.at("bos")] = BOS_LOGIT * root
    w.q[o + b, S.at("is_q")] = 1.0
    w.k[o + b, S.at("is_m")] = (BOS_LOGIT - math.log(ratio)) * root


def first_step_decoy(w: Writer, X: Slots, head: int, style: str, code_pairs: int) -> None:
    """Adds to a `split_head` (called after it): at step 1 (register `later` = 0) a question row also attends the
    target row of the fact whose source is its start entity (query: `pi`, the fetched start code),
    DECOY times as much as the +m row; from step 2 on (`later` = 1) fact targets score
    -PENALTY_LOGIT. Rows other than fact targets, BOS and the +m row score -PENALTY_LOGIT here."""
    o, root = head * HEAD_DIM, math.sqrt(HEAD_DIM)
    content_pairs = range(POSITION_PAIRS + 1, POSITION_PAIRS + 1 + code_pairs)
    dims = [d for i in content_pairs for d in pair_dims(i, style)]
    logit = BOS_LOGIT - math.log(NEED_SPLIT) + math.log(DECOY)
    amp = math.sqrt(logit * root)
    for j, d in enumerate(dims):
        w.q[o + d, X["pi"][j]] = amp
        w.k[o + d, X["kx"][j]] = amp
    # Its constant terms (+-PENALTY_LOGIT) sit on the second-to-last pair, whose rotation (~1e-28
    # rad per position) cannot mix them into the 50-logit split; pair POSITION_PAIRS would (3e-8 rad).
    a, b = pair_dims(HEAD_DIM // 2 - 2, style)
    w.q[o + a, X.at("const")] = 1.0 / CONST
    for src, value in {"const": -PENALTY_LOGIT, "arrow_b1": PENALTY_LOGIT, "bos": PENALTY_LOGIT,
                       "is_m": PENALTY_LOGIT}.items():
        w.k[o + a, X.at(src)] = value * root / (CONST if src == "const" else 1.0)
    # The +m row's key holds SINK_CONTENT x the start code (its previous token), which a question
    # row's query matches with SINK_CONTENT * logit: taken back from the split's +m term (a question
    # row's only), so the ratio stays exact.
    _, m_dim = pair_dims(HEAD_DIM // 2 - 1, style)
    w.k[o + m_dim, X.at("is_m")] -= SINK_CONTENT * logit * root
    w.q[o + b, X.at("later")] = 1.0
    w.k[o + b, X.at("arrow_b1")] = -PENALTY_LOGIT * root


def chase_head(w: Writer, X: Slots, head: int, pointer: tuple[str, str], chasing: str,
                out: tuple[str, str, str], style: str, code_pairs: int) -> None:
    """The pointer-chasing head: rows flagged `chasing` query with their pointer (the sum of the
    `pointer` registers); a fact's target row (key: the fact's source) that matches scores
    MATCH_LOGIT, a sink SINK_LOGIT, BOS SINK_LOGIT - BOS_LOGIT, every other row far less. Rows
    without a pointer reach only BOS. What it reads (value: entity code, terminal, is-entity) goes
    to the `out` registers."""
    o, root = head * HEAD_DIM, math.sqrt(HEAD_DIM)
    content_pairs = range(POSITION_PAIRS + 1, POSITION_PAIRS + 1 + code_pairs)
    dims = [d for i in content_pairs for d in pair_dims(i, style)]
    amp = math.sqrt(MATCH_LOGIT * root)
    for j, d in enumerate(dims):
        for reg in pointer:
            w.q[o + d, X[reg][j]] = amp
        w.k[o + d, X["kx"][j]] = amp
    a, b = pair_dims(POSITION_PAIRS, style)
    # Pair a: c * k_const with c = 1 (from the constant); pair b: chasing * k_chase.
    w.q[o + a, X.at("const")] = 1.0 / CONST
    w.q[o + b, X.at(chasing)] = 1.0
    k_const = {"const": -PENALTY_LOGIT, "arrow_b1": PENALTY_LOGIT, "sink": PENALTY_LOGIT,
               "bos": PENALTY_LOGIT + BOS_LOGIT}
    for src, logit in k_const.items():
        w.k[o + a, X.at(src)] = logit * root / (CONST if src == "const" else 1.0)
    w.k[o + b, X.at("sink")] = SINK_LOGIT * root
    w.k[o + b, X.at("bos")] = (SINK_LOGIT - BOS_LOGIT) * root
    w.copy(head, [(s_dim, t_dim) for src, dst in zip(("vy", "v_term", "v_match"), out)
                  for s_dim, t_dim in zip(X[src], X[dst], strict=True)])


