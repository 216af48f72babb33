"""wise-chain: a recurrent-depth model whose weights are computed, not trained, so its routing is
known by construction (the calibration model of the default run; the card in ``card_text``).

Architecture: the project's own (`RecurrentDepthModel`, pre-norm blocks, one head of 64, RoPE
base 1e30), 3 prelude layers, 1 core layer applied T times, no coda. On ``synthchain`` prompts:

* prelude (once): layer 1 copies each row's previous token into the row (a RoPE offset-1 head),
  layer 2 the token three back (offset 3), layer 3 lets the question rows fetch the start entity
  s and the refinement count m from the ``+m`` row. So a fact's target row ``y`` of
  ``x : -> y .`` holds x as its key, y as its value and whether the arrow was terminal (``=>``).
* core step t: the question rows' query is their pointer p; a key matching p scores 300 logits,
  a *sink* (the ``->``/``=>``/``.`` rows and BOS) 270, anything else far less. So with Full
  attention a question row puts >= 0.999 of its mass on the fact whose source is p (step t attends
  the fact of hop t); the MLP moves p to the attended target. At the terminal fact (z => z) the
  pointer stays and, while the remaining count is >= 1, the answer register r is advanced by the
  successor map (a rotation of the code, so linear) and the count decremented.
* rows that are not question rows have no pointer and attend BOS. A question row whose next fact
  is not visible (a restricted support) reads a sink (zero value) and changes nothing.
* readout: the logit of entity e is 100 * code(e) . r; the row after ``Answer:`` emits EOS.

So with Full attention the answer after T steps is right exactly when T >= L + m; routing at the
question rows moves every step up to L + 1 and is constant from there; the state changes up to
step L + max(m, 1) and is constant after. Entities are Fourier codes over their position in the
benchmark's successor cycle (``synthchain.cycle_position``): code(i) = [cos(2π f_k i / N),
sin(2π f_k i / N)]_k / sqrt(K), frequencies f_k drawn by a seeded search for low coherence, so
successor = the rotation by 2π f_k / N in each pair.

Register layout: the residual stream has a constant coordinate (2**15) that dominates its RMS, and
every RMSNorm weight is 2**15 / sqrt(hidden), so each norm is the identity up to ~1e-8 and its
scale does not move when registers change (so a settled row's attention is bit-identical from step
to step). Gates are pairs of SiLU units in their linear / zero regimes, exact in float32 (float16
to ~0.1%; bfloat16 is too coarse for the gate arithmetic).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wise.data import synthchain as sc
from wise.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from wise.models.config import RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel

NAME = "wise-chain"
HEAD_DIM = 64
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


@dataclass(frozen=True)
class ChainSpec:
    """The small config the weights are a function of (with the benchmark's vocabulary)."""

    seed: int = 0  # seeds the frequency search of the entity codes
    code_pairs: int = 12  # K: entity codes have 2K dims
    max_refine: int = 8  # refinement counts the counter represents (0..max_refine)
    max_positions: int = 8192
    frequency_trials: int = 300

    def __post_init__(self) -> None:
        if not 1 <= self.code_pairs <= HEAD_DIM // 2 - POSITION_PAIRS - 1:
            raise ValueError(f"code_pairs must be in 1..{HEAD_DIM // 2 - POSITION_PAIRS - 1}, got {self.code_pairs}")
        if not 0 <= self.max_refine <= sc.MAX_REFINE_TOKEN:
            raise ValueError(f"max_refine must be in 0..{sc.MAX_REFINE_TOKEN}, got {self.max_refine}")
        if self.max_positions < 64 or self.frequency_trials < 1:
            raise ValueError("max_positions must be >= 64 and frequency_trials >= 1")


# -- entity codes --------------------------------------------------------------------------------
def code_frequencies(spec: ChainSpec) -> np.ndarray:
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
                 answer=1, bos=1,
                 b1_code=D, b1_arrow=1, b1_term=1, b1_answer=1,  # layer 1: the previous token
                 b3_code=D, b3_qmark=1,  # layer 2: the token three back
                 fetch_code=D, fetch_m=R)  # layer 3: the question's start entity and count


def core_slots(D: int, R: int) -> Slots:
    """The recurrent block's stream x = adapter([s, e]). p = pi + p_d (pointer), r = p + q (answer),
    rem = remi + rem_d (refinements left, one-hot). `vy` holds the row's value before attention
    and the attention output after it (a row is never both a fact target and a question row)."""
    return Slots(const=1, is_q=1, arrow_b1=1, sink=1, bos=1, eos=1, kx=D, pi=D, p_d=D, q=D, vy=D,
                 v_term=1, v_match=1, remi=R, rem_d=R)


def _pair_dims(i: int, style: str) -> tuple[int, int]:
    """The two head dims RoPE rotates together at frequency index i."""
    return (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + HEAD_DIM // 2)


def position_weights(config: RecurrentConfig) -> np.ndarray:
    """Per-pair weights W_i >= 0 (sum 1) of a RoPE offset head: the LP that maximises the gap between
    score(offset) = sum_i W_i and every other causal offset delta, sum_i W_i cos((delta - k) theta_i).
    The gap does not depend on k; returns (weights, gap per unit weight)."""
    from scipy.optimize import linprog

    theta = 1.0 / config.rope_base ** (np.arange(0, HEAD_DIM, 2)[:POSITION_PAIRS] / HEAD_DIM)
    delta = np.arange(1, config.max_positions)  # |offset - target| over a causal row, both sides
    gap = 1 - np.cos(np.outer(delta, theta))
    n = POSITION_PAIRS
    res = linprog(np.r_[np.zeros(n), -1.0], A_ub=np.hstack([-gap, np.ones((len(delta), 1))]),
                  b_ub=np.zeros(len(delta)), A_eq=np.r_[np.ones(n), 0.0][None], b_eq=[1.0],
                  bounds=[(0, None)] * n + [(None, None)], method="highs")
    if not res.success:  # pragma: no cover - the LP is feasible for any base
        raise RuntimeError(f"positional-head LP failed: {res.message}")
    return res.x[:n], float(res.x[n])


# -- the weights ---------------------------------------------------------------------------------
def chain_config(spec: ChainSpec, vocab_size: int) -> RecurrentConfig:
    D, R = 2 * spec.code_pairs, spec.max_refine + 1
    hidden = max(prelude_slots(D, R).size, core_slots(D, R).size)
    intermediate = 2 * D + 2 * (D + R)  # gate pairs: the move (D) and the refinement (D + R)
    return RecurrentConfig(
        vocab_size=vocab_size, hidden=hidden, heads=1, kv_heads=1, head_dim=HEAD_DIM,
        intermediate=intermediate, n_prelude=3, n_core=1, n_coda=0, block_style="prenorm",
        norm_eps=1e-6, rope_style="half", rope_base=ROPE_BASE, max_positions=spec.max_positions,
        embed_scale=1.0, ln_f_after_recurrence=False, tie_embeddings=False, qk_bias=False,
        mean_recurrence=32, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, name=NAME)


class _Writer:
    """Fills one block's weights; q/k/v rows are head dims, columns residual dims."""

    def __init__(self, h: int, I: int = 0):
        self.q, self.k, self.v = (np.zeros((HEAD_DIM, h)) for _ in range(3))
        self.proj = np.zeros((h, HEAD_DIM))
        self.gate, self.up, self.down = np.zeros((I, h)), np.zeros((I, h)), np.zeros((h, I))

    def load(self, block, norm_weight: float) -> None:
        t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
        with torch.no_grad():
            block.attn.Wqkv.weight.copy_(t(np.concatenate([self.q, self.k, self.v])))
            block.attn.proj.weight.copy_(t(self.proj))
            block.mlp.fc.weight.copy_(t(np.concatenate([self.gate, self.up])))
            block.mlp.proj.weight.copy_(t(self.down))
            block.norm_1.weight.fill_(norm_weight)
            block.norm_2.weight.fill_(norm_weight)


def _offset_head(w: _Writer, E: Slots, offset: int, pos_w: np.ndarray, scale: float, style: str,
                 copy: list[tuple[str, str]]) -> None:
    """A head attending `offset` rows back (from the constant alone, so the same q and k on every
    row; RoPE supplies the position) and copying slots (source, destination) of that row."""
    # q_i . R((l - j) theta_i) k_i with k_i = (kappa, 0), q_i = omega (cos psi, sin psi):
    # omega kappa cos((l - j) theta_i - psi); psi = -offset theta_i peaks at l = j - offset.
    theta = 1.0 / ROPE_BASE ** (np.arange(0, HEAD_DIM, 2)[:POSITION_PAIRS] / HEAD_DIM)
    for i in range(POSITION_PAIRS):
        a, b = _pair_dims(i, style)
        amp = math.sqrt(scale * pos_w[i] * math.sqrt(HEAD_DIM))  # logit = q.k / sqrt(d)
        psi = -offset * theta[i]
        w.q[a, E.at("const")] = amp * math.cos(psi) / CONST
        w.q[b, E.at("const")] = amp * math.sin(psi) / CONST
        w.k[a, E.at("const")] = amp / CONST
    d = 0
    for src, dst in copy:
        for s_dim, t_dim in zip(E[src], E[dst], strict=True):
            w.v[d, s_dim] = 1.0
            w.proj[t_dim, d] = 1.0
            d += 1
    assert d <= HEAD_DIM


def build_weights(model: RecurrentDepthModel, spec: ChainSpec) -> dict:
    """Write the construction into `model` (float64 arithmetic, cast by the caller). Returns facts
    the card reports (frequencies, code correlation, positional gap)."""
    cfg = model.config
    D, R = 2 * spec.code_pairs, spec.max_refine + 1
    E, X = prelude_slots(D, R), core_slots(D, R)
    h, I = cfg.hidden, cfg.intermediate
    norm_w = CONST / math.sqrt(h)
    freqs = code_frequencies(spec)
    codes = entity_codes(freqs)
    rot = successor_rotation(freqs)
    tok = sc.build_tokenizer()
    vocab = tok.get_vocab()
    position = sc.cycle_position()

    # Embedding: the constant, the entity code, token-type flags.
    wte = np.zeros((cfg.vocab_size, h))
    wte[:, E.at("const")] = CONST
    for e in sc.ENTITIES:
        wte[vocab[e], E["own"]] = codes[position[e]]
        wte[vocab[e], E.at("entity")] = 1.0
    for word, flags in {sc.ARROW: ("arrow", "sink"), sc.TERMINAL_ARROW: ("arrow", "term", "sink"),
                        sc.END: ("sink",), sc.QMARK: ("qmark",), sc.ANSWER_WORD: ("answer",),
                        "<bos>": ("bos",)}.items():
        for f in flags:
            wte[vocab[word], E.at(f)] = 1.0
    for m in range(sc.MAX_REFINE_TOKEN + 1):
        wte[vocab[f"+{m}"], E.at("refine")] = 1.0
        if m < R:  # counts above max_refine have no counter state: the question is not refined
            wte[vocab[f"+{m}"], E["m"][m]] = 1.0

    pos_w, pos_gap = position_weights(cfg)
    pos_scale = POSITION_MARGIN / pos_gap
    writers = [_Writer(h, I) for _ in range(3)]
    _offset_head(writers[0], E, 1, pos_w, pos_scale, cfg.rope_style,
                 [("own", "b1_code"), ("arrow", "b1_arrow"), ("term", "b1_term"), ("answer", "b1_answer")])
    _offset_head(writers[1], E, 3, pos_w, pos_scale, cfg.rope_style, [("own", "b3_code"), ("qmark", "b3_qmark")])
    # Layer 3, fetch: question rows (+m, ?, Answer and the ':' after it) attend the +m row, which
    # holds s (its previous token) and m. Rotation-free pair POSITION_PAIRS; others attend BOS.
    w = writers[2]
    a, b = _pair_dims(POSITION_PAIRS, cfg.rope_style)
    root = math.sqrt(HEAD_DIM)
    w.q[a, E.at("const")] = 1.0 / CONST
    w.k[a, E.at("bos")] = FETCH_BOS_LOGIT * root
    for flag in ("refine", "qmark", "answer", "b1_answer"):
        w.q[b, E.at(flag)] = 1.0
    w.k[b, E.at("refine")] = FETCH_LOGIT * root
    d = 0
    for src, dst in (("b1_code", "fetch_code"), ("m", "fetch_m")):
        for s_dim, t_dim in zip(E[src], E[dst], strict=True):
            w.v[d, s_dim] = 1.0
            w.proj[t_dim, d] = 1.0
            d += 1
    for block, wr in zip(model.transformer.prelude, writers):
        wr.load(block, norm_w)

    # Adapter: carry the recurrent registers (p_d, q, rem_d) from s; everything else fresh from e.
    adapter = np.zeros((h, 2 * h))
    for name in ("p_d", "q", "rem_d"):
        for i in X[name]:
            adapter[i, i] = 1.0
    links = {"const": ["const"], "is_q": ["refine", "qmark", "answer", "b1_answer"],
             "arrow_b1": ["b1_arrow"], "sink": ["sink"], "bos": ["bos"], "eos": ["b3_qmark"],
             "v_term": ["b1_term"], "v_match": ["entity"]}
    for dst, srcs in links.items():
        for src in srcs:
            adapter[X.at(dst), h + E.at(src)] = 1.0
    for dst, src, scale in (("kx", "b3_code", 1.0), ("kx", "b1_code", SINK_CONTENT),
                            ("pi", "fetch_code", 1.0), ("remi", "fetch_m", 1.0), ("vy", "own", 1.0)):
        for t_dim, s_dim in zip(X[dst], E[src], strict=True):
            adapter[t_dim, h + s_dim] += scale

    # Core layer. Content (pointer vs key) in rotation-free pairs after the constant pair.
    core = _Writer(h, I)
    content_pairs = range(POSITION_PAIRS + 1, POSITION_PAIRS + 1 + spec.code_pairs)
    dims = [d for i in content_pairs for d in _pair_dims(i, cfg.rope_style)]
    amp = math.sqrt(MATCH_LOGIT * root)
    for j, d in enumerate(dims):
        core.q[d, X["pi"][j]] = amp
        core.q[d, X["p_d"][j]] = amp
        core.k[d, X["kx"][j]] = amp
    a, b = _pair_dims(POSITION_PAIRS, cfg.rope_style)
    # Pair a: c * k_const with c = 1 (from the constant); pair b: is_q * k_chase.
    core.q[a, X.at("const")] = 1.0 / CONST
    core.q[b, X.at("is_q")] = 1.0
    k_const = {"const": -PENALTY_LOGIT, "arrow_b1": PENALTY_LOGIT, "sink": PENALTY_LOGIT,
               "bos": PENALTY_LOGIT + BOS_LOGIT}
    for src, logit in k_const.items():
        core.k[a, X.at(src)] = logit * root / (CONST if src == "const" else 1.0)
    core.k[b, X.at("sink")] = SINK_LOGIT * root
    core.k[b, X.at("bos")] = (SINK_LOGIT - BOS_LOGIT) * root
    d = 0
    for name in ("vy", "v_term", "v_match"):
        for i in X[name]:
            core.v[d, i] = 1.0
            core.proj[i, d] = 1.0
            d += 1

    # MLP gate pairs. A condition c (linear in x) is +1/2 when the update applies and <= -1/2
    # otherwise; units silu(A(c + 1/4)) - silu(A(c - 1/4)) give A/2 or 0, times `up`, over A/2.
    unit = 0

    def gate_pair(terms: dict[int, float], offset: float, up: dict[int, float], target: int) -> None:
        nonlocal unit
        for sign, shift in ((1.0, 0.25), (-1.0, -0.25)):
            for i, coef in terms.items():
                core.gate[unit, i] += GATE_SLOPE * coef
            core.gate[unit, X.at("const")] += GATE_SLOPE * (offset + shift) / CONST
            for i, coef in up.items():
                core.up[unit, i] += sign * coef
            core.down[target, unit] = 2.0 / GATE_SLOPE
            unit += 1

    # move: matched, not terminal, a question row: c = match - terminal + is_q - 3/2
    move = {X.at("v_match"): 1.0, X.at("v_term"): -1.0, X.at("is_q"): 1.0}
    for j in range(D):  # p_d <- attended code - pi, so p = pi + p_d is the attended target
        gate_pair(move, -1.5, {X["vy"][j]: 1.0, X["pi"][j]: -1.0, X["p_d"][j]: -1.0}, X["p_d"][j])
    # refine: matched, terminal, a question row, a count left: c = match + terminal + is_q
    # + (1 - rem_0) - 7/2; then r <- R r (q += (R - I) r, r = pi + p_d + q) and rem shifts down.
    refine = {X.at("v_match"): 1.0, X.at("v_term"): 1.0, X.at("is_q"): 1.0,
              X["remi"][0]: -1.0, X["rem_d"][0]: -1.0}
    M = rot - np.eye(D)
    for j in range(D):
        up = {X[reg][jj]: M[j, jj] for reg in ("pi", "p_d", "q") for jj in range(D) if M[j, jj]}
        gate_pair(refine, -2.5, up, X["q"][j])
    for k in range(R):  # one-hot k -> k - 1
        up = {X["remi"][k]: -1.0, X["rem_d"][k]: -1.0}
        if k + 1 < R:
            up.update({X["remi"][k + 1]: 1.0, X["rem_d"][k + 1]: 1.0})
        gate_pair(refine, -2.5, up, X["rem_d"][k])
    assert unit == I, (unit, I)
    core.load(model.transformer.core_block[0], norm_w)

    lm = np.zeros((cfg.vocab_size, h))
    for e in sc.ENTITIES:
        for reg in ("pi", "p_d", "q"):
            lm[vocab[e], X[reg]] = READOUT_SCALE * codes[position[e]]
    lm[EOS_ID, X.at("eos")] = EOS_LOGIT
    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.tensor(wte))
        model.transformer.adapter.weight.copy_(torch.tensor(adapter))
        model.transformer.ln_f.weight.fill_(norm_w)
        model.lm_head.weight.copy_(torch.tensor(lm))
    return {"frequencies": [int(f) for f in freqs], "max_code_correlation": max_code_correlation(freqs),
            "position_gap_logits": POSITION_MARGIN, "position_weights": [float(x) for x in pos_w]}


def build_chain_model(spec: ChainSpec = ChainSpec()) -> tuple[RecurrentDepthModel, dict]:
    """The constructed model (float32, eval mode) and the facts of its construction."""
    vocab_size = sc.build_tokenizer().get_vocab_size()
    config = chain_config(spec, vocab_size)
    model = RecurrentDepthModel(config).double()
    facts = build_weights(model, spec)
    return model.float().eval(), facts
