"""wise-chain: a recurrent-depth model whose weights are computed, not trained, so its routing is
known by construction (the calibration model of the default run; the card in ``chain_card``).

Architecture: the project's own (`RecurrentDepthModel`, pre-norm blocks, two heads of 64 per layer,
RoPE base 1e30), 3 prelude layers, 2 core layers applied T times, no coda (the pieces:
``wise.models.chain_parts``). On ``synthchain`` prompts:

* prelude (once): layer 1 copies each row's previous token into the row (a RoPE offset-1 head),
  layer 2 the token three back (offset 3), layer 3 lets the question rows fetch the start entity
  s and the refinement count m from the ``+m`` row, and its MLP gives the row three after ``??``
  (the first answer token a1 of a two-token question) a pointer at its own entity. So a fact's
  target row ``y`` of ``x : -> y .`` holds x as its key, y as its value and whether the arrow was
  terminal (``=>``).
* core step t, layer 0 head 0: the question rows' query is their pointer p; a key matching p
  scores 300 logits, a *sink* (the ``->``/``=>``/``.`` rows and BOS) 270, anything else far less.
  So with Full attention a question row puts >= 0.999 of its mass on the fact whose source is p
  (step t attends the fact of hop t); layer 0's MLP moves p to the attended target. At the terminal
  fact (z => z) the pointer stays and, while the remaining count is >= 1, layer 1's MLP advances
  the answer register r by the successor map (a rotation of the code, so linear) and decrements
  the count.
* layer 1 head 1: the first answer row chases a1's chain the same way with its own pointer (layer
  1's MLP moves it), so the second answer token comes from routing after the prompt, through the
  appended rows' caches and late supports; it runs T steps of its own.
* layer 1 head 0 and layer 0 head 1 split each question row's mass between BOS and the ``+m`` row
  (1 : 1 and 15 : 1; at step 1 the first also gives the first hop's fact twice the +m row's share);
  the refinement needs the +m row read in the first (so eta decides whether a question still
  refining after t_d is answered, and a support cut from step 1 can lose it) and the weights to sum
  to 1 in the second (so Freeze-A must renormalise). Head 1 of layer 0 also carries BOS's initial
  state to the rows that do not chase, for the check that a row's initial state is its own (see
  build_weights). Rows that
  do not chase in a head attend BOS there; a chasing row whose next fact is not visible (a restricted support)
  reads a sink (zero value) and changes nothing.
* readout: the logit of entity e is 100 * code(e) . (r + the answer row's pointer); the row after
  the answer (three after ``?``, or three after ``Answer`` for ``??``) emits EOS.

So with Full attention the first token after T steps is right exactly when T >= L + m and the
second when T >= L2 (its chain's hops); routing at the question rows moves every step up to L + 1
and is constant from there; their state changes up to step L + max(m, 1) and is constant after.
Entities are Fourier codes over their position in the benchmark's successor cycle
(``synthchain.cycle_position``), frequencies drawn by a seeded search for low coherence, so
successor = the rotation by 2π f_k / N in each pair.

Register layout: the residual stream has a constant coordinate (2**15) that dominates its RMS, and
every RMSNorm weight is 2**15 / sqrt(hidden), so each norm is the identity up to ~1e-8 and its
scale does not move when registers change (so a settled row's attention is bit-identical from step
to step). Gates are pairs of SiLU units in their linear / zero regimes, exact in float32. Float32
only: in float16 the state check's gate weights (GATE_SLOPE / NOISE_STEP) overflow, and the split
heads' shares sit exactly on mass-support boundaries (1 - 2/r = eta) that need float32's precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from wise.data import synthchain as sc
from wise.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from wise.models.chain_parts import (  # noqa: F401 (re-exported: the construction's public names)
    BOS_LOGIT, CONST, EOS_LOGIT, FETCH_BOS_LOGIT, FETCH_LOGIT, GATE_SLOPE, HEAD_DIM, HEADS, MATCH_LOGIT,
    DECOY, NEED_SPLIT, NOISE_DIMS, NOISE_STEP, PENALTY_LOGIT, POSITION_MARGIN, POSITION_PAIRS, READOUT_SCALE,
    RENORM_SPLIT, ROPE_BASE, SINK_CONTENT, SINK_LOGIT, Slots, chase_head, first_step_decoy, offset_head, pair_dims,
    split_head, Writer, code_frequencies, core_slots, entity_codes, max_code_correlation, position_weights,
    prelude_slots, successor_rotation)
from wise.models.config import RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel

NAME = "wise-chain"
# the names these pieces had when they lived in this module
_Writer, _offset_head, _pair_dims = Writer, offset_head, pair_dims


@dataclass(frozen=True)
class ChainSpec:
    """The small config the weights are a function of (with the benchmark's vocabulary)."""

    seed: int = 0  # seeds the frequency search of the entity codes
    code_pairs: int = 12  # K: entity codes have 2K dims
    max_refine: int = 8  # refinement counts the counter represents (0..max_refine)
    max_positions: int = 8192
    frequency_trials: int = 300

    def __post_init__(self) -> None:
        # content pairs follow the positional pairs and one more (the chase's constant terms); the
        # last two pairs hold layer 1 head 0's split and its decoy's constant terms
        if not 1 <= self.code_pairs <= HEAD_DIM // 2 - POSITION_PAIRS - 3:
            raise ValueError(f"code_pairs must be in 1..{HEAD_DIM // 2 - POSITION_PAIRS - 3}, got {self.code_pairs}")
        if not 0 <= self.max_refine <= sc.MAX_REFINE_TOKEN:
            raise ValueError(f"max_refine must be in 0..{sc.MAX_REFINE_TOKEN}, got {self.max_refine}")
        if self.max_positions < 64 or self.frequency_trials < 1:
            raise ValueError("max_positions must be >= 64 and frequency_trials >= 1")
        # The MLP width is what core layer 1 needs (chain_config); core layer 0 needs 2 D units for
        # the pointer move, 4 per state-check dim and 2 for the step flag, so D + R >= 2 NOISE_DIMS - 3
        # (D = 2 code_pairs, R = max_refine + 1). Below that, build_weights would run out of MLP units.
        least = 2 * NOISE_DIMS - 4
        if 2 * self.code_pairs + self.max_refine < least:
            raise ValueError(f"2 * code_pairs + max_refine must be >= {least} (core layer 0's MLP: the "
                             f"{NOISE_DIMS}-dim state check), got code_pairs={self.code_pairs}, "
                             f"max_refine={self.max_refine}")


def chain_config(spec: ChainSpec, vocab_size: int) -> RecurrentConfig:
    D, R = 2 * spec.code_pairs, spec.max_refine + 1
    hidden = max(prelude_slots(D, R).size, core_slots(D, R).size)
    # gate pairs of core layer 1: move2 (D), refinement (D + R), the state check (2), the step flag (2)
    intermediate = 2 * D + 2 * (D + R) + 8
    return RecurrentConfig(
        vocab_size=vocab_size, hidden=hidden, heads=HEADS, kv_heads=HEADS, head_dim=HEAD_DIM,
        intermediate=intermediate, n_prelude=3, n_core=2, n_coda=0, block_style="prenorm",
        norm_eps=1e-6, rope_style="half", rope_base=ROPE_BASE, max_positions=spec.max_positions,
        embed_scale=1.0, ln_f_after_recurrence=False, tie_embeddings=False, qk_bias=False,
        mean_recurrence=32, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, name=NAME)


def build_weights(model: RecurrentDepthModel, spec: ChainSpec) -> dict:
    """Write the construction into `model` (float64 arithmetic, cast by the caller). Returns facts
    the card reports (frequencies, code correlation, positional gap)."""
    cfg = model.config
    D, R = 2 * spec.code_pairs, spec.max_refine + 1
    E, X = prelude_slots(D, R), core_slots(D, R)
    h, I, H = cfg.hidden, cfg.intermediate, cfg.heads
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
                        sc.END: ("sink",), sc.QMARK: ("qmark",), sc.FOLLOW_QMARK: ("qmark", "follow"),
                        sc.ANSWER_WORD: ("answer",), "<bos>": ("bos",)}.items():
        for f in flags:
            wte[vocab[word], E.at(f)] = 1.0
    for m in range(sc.MAX_REFINE_TOKEN + 1):
        wte[vocab[f"+{m}"], E.at("refine")] = 1.0
        if m < R:  # counts above max_refine have no counter state: the question is not refined
            wte[vocab[f"+{m}"], E["m"][m]] = 1.0

    pos_w, pos_gap = position_weights(cfg.rope_base, cfg.max_positions)
    pos_scale = POSITION_MARGIN / pos_gap
    writers = [Writer(h, I, H) for _ in range(3)]
    offset_head(writers[0], E, 1, pos_w, pos_scale, cfg.rope_style,
                 [("own", "b1_code"), ("arrow", "b1_arrow"), ("term", "b1_term"), ("answer", "b1_answer")])
    offset_head(writers[1], E, 3, pos_w, pos_scale, cfg.rope_style,
                 [("own", "b3_code"), ("qmark", "b3_qmark"), ("follow", "b3_follow"), ("answer", "b3_answer")])
    # Layer 3, fetch: question rows (+m, ?, Answer and the ':' after it) attend the +m row, which
    # holds s (its previous token) and m. Rotation-free pair POSITION_PAIRS; others attend BOS.
    w = writers[2]
    a, b = pair_dims(POSITION_PAIRS, cfg.rope_style)
    root = math.sqrt(HEAD_DIM)
    w.q[a, E.at("const")] = 1.0 / CONST
    w.k[a, E.at("bos")] = FETCH_BOS_LOGIT * root
    for flag in ("refine", "qmark", "answer", "b1_answer"):
        w.q[b, E.at(flag)] = 1.0
    w.k[b, E.at("refine")] = FETCH_LOGIT * root
    w.copy(0, [(s_dim, t_dim) for src, dst in (("b1_code", "fetch_code"), ("m", "fetch_m"))
               for s_dim, t_dim in zip(E[src], E[dst], strict=True)])
    # ... and its MLP: the row three after "??" (the first answer token, a1) points at itself.
    for j in range(D):
        w.gate_pair(E.at("const"), {E.at("b3_follow"): 1.0}, -0.5, {E["own"][j]: 1.0}, E["fetch2"][j])
    for block, wr in zip(model.transformer.prelude, writers):  # head 1 has no role (value zero)
        wr.load(block, norm_w)

    # Adapter: carry the recurrent registers (p_d, q, rem_d, p_d2) from s; everything else from e.
    adapter = np.zeros((h, 2 * h))
    for name in ("p_d", "q", "rem_d", "p_d2", "noise", "same", "seen"):
        for i in X[name]:
            adapter[i, i] = 1.0
    # eos: the row after the answer (three after "?", or three after "Answer" for a "??" question)
    links = {"const": ["const"], "is_q": ["refine", "qmark", "answer", "b1_answer"], "is_q2": ["b3_follow"],
             "arrow_b1": ["b1_arrow"], "sink": ["sink"], "bos": ["bos"], "is_m": ["refine"],
             "eos": ["b3_qmark", "b3_answer"], "v_term": ["b1_term"], "v_match": ["entity"]}
    for dst, srcs in links.items():
        for src in srcs:
            adapter[X.at(dst), h + E.at(src)] = 1.0
    adapter[X.at("eos"), h + E.at("b3_follow")] = -1.0
    for dst, src, scale in (("kx", "b3_code", 1.0), ("kx", "b1_code", SINK_CONTENT), ("pi", "fetch_code", 1.0),
                            ("remi", "fetch_m", 1.0), ("vy", "own", 1.0), ("pi2", "fetch2", 1.0)):
        for t_dim, s_dim in zip(X[dst], E[src], strict=True):
            adapter[t_dim, h + s_dim] += scale

    # Core layer 0: head 0 chases the question rows' pointer, head 1 has no role; the MLP moves
    # the pointer. Core layer 1: head 0 has no role, head 1 chases the first answer row's pointer;
    # the MLP moves that pointer and refines the question rows' answer. So every (layer, head) has
    # its own support, and one read through another's support changes answers.
    core = [Writer(h, I, H), Writer(h, I, H)]
    chase_head(core[0], X, 0, ("pi", "p_d"), "is_q", ("ay", "a_term", "a_match"), cfg.rope_style, spec.code_pairs)
    # Two heads split each question row's mass between BOS and the +m row, so attention that is not
    # one-hot decides answers (a mass support at eta keeps the +m row's block only when its share is
    # needed to reach eta; in the answer row's query block of r rows that share is 4 / ((ratio + 1) r)):
    # * layer 1 head 0, NEED_SPLIT : 1: the +m row's value okm = 1, BOS's 0, so what a question row
    #   reads is 1 / (NEED_SPLIT + 1) while the +m row is visible and 0 once a support drops it; the
    #   refinement needs it. So the late support's eta decides whether a question still refining
    #   after t_d is answered: at eta = 0.88 / 0.9 / 0.92 the block is dropped from r >= 17 / 20 / 25,
    #   at 0.95 never (r <= B = 32).
    #   At step 1 only, the first hop's fact takes DECOY times the +m row's mass there too: step 1's
    #   ranking puts that block above the +m row's, so a support cut from step 1 at the mass the
    #   WISE row holds (MassMatched) or at its size (SizeMatched) keeps the decoy and loses the +m row
    #   when WISE keeps it, and a control with a wrong target answers differently.
    # * layer 0 head 1, RENORM_SPLIT : 1: both rows carry ok = 1, so what it reads is 1 whenever the
    #   weights inside the row's support sum to 1, and the refinement needs it. Its +m share is
    #   smaller, so a support can drop the +m row's block here and keep it in layer 1 head 0 (at 0.95:
    #   r >= 5): every correct rule is then left alone, and Freeze-A's refinement stops if its
    #   frozen weights are not renormalised (ok = RENORM_SPLIT / (RENORM_SPLIT + 1)). The head also
    #   carries BOS's initial noise (only rows that do not chase use it, see below).
    split_head(core[0], X, 1, RENORM_SPLIT, cfg.rope_style)
    core[0].copy(1, list(zip(X["noise"], X["bos_noise"])) + [(X.at("bos"), X.at("ok")), (X.at("is_m"), X.at("ok"))])
    split_head(core[1], X, 0, NEED_SPLIT, cfg.rope_style)
    first_step_decoy(core[1], X, 0, cfg.rope_style, spec.code_pairs)
    core[1].copy(0, [(X.at("is_m"), X.at("okm"))])
    # The step flag the decoy needs: `seen` is carried and set to 1 by layer 1's MLP at every step
    # (at step 1 it holds the initial state's noise, |.| ~ 0.01); layer 0's MLP turns it into a clean
    # `later` (0 at step 1, 1 after), which the decoy's keys read.
    core[0].gate_pair(X.at("const"), {X.at("seen"): 1.0}, -0.5, {X.at("const"): 1.0 / CONST}, X.at("later"))
    core[1].gate_pair(X.at("const"), {}, 0.5, {X.at("const"): 1.0 / CONST}, X.at("seen"))
    core[1].gate_pair(X.at("const"), {}, 0.5, {X.at("seen"): -1.0}, X.at("seen"))  # set, not add
    chase_head(core[1], X, 1, ("pi2", "p_d2"), "is_q2", ("ay2", "a_term2", "a_match2"), cfg.rope_style,
                spec.code_pairs)
    const = X.at("const")
    # move: matched, not terminal, a chasing row: c = match - terminal + chasing - 3/2; then
    # p_d <- attended code - pi, so p = pi + p_d is the attended target.
    for wr, (y, term, match, chasing, pi, pd) in ((core[0], ("ay", "a_term", "a_match", "is_q", "pi", "p_d")),
                                                   (core[1], ("ay2", "a_term2", "a_match2", "is_q2", "pi2", "p_d2"))):
        move = {X.at(match): 1.0, X.at(term): -1.0, X.at(chasing): 1.0}
        if chasing == "is_q2":  # ... and not a row whose initial state is BOS's: see below
            move[X.at("same")] = -2.0
        for j in range(D):
            wr.gate_pair(const, move, -1.5, {X[y][j]: 1.0, X[pi][j]: -1.0, X[pd][j]: -1.0}, X[pd][j])
    # refine (layer 1, on what layer 0 read): matched, terminal, a question row, a count left, the
    # weights summing to 1 (ok = 1) and the +m row read (okm = 1 / (NEED_SPLIT + 1)): c = match +
    # terminal + is_q - rem_0 + (RENORM_SPLIT + 1) ok + (NEED_SPLIT + 1) okm - 39/2 at the default
    # ratios; then r <- R r (q += (R - I) r, r = pi + p_d + q) and rem shifts down.
    refine = {X.at("a_match"): 1.0, X.at("a_term"): 1.0, X.at("is_q"): 1.0,
              X["remi"][0]: -1.0, X["rem_d"][0]: -1.0,
              X.at("ok"): RENORM_SPLIT + 1.0,  # an unrenormalised ok fails by 1
              X.at("okm"): NEED_SPLIT + 1.0}  # so does a +m row the support dropped (okm = 0)
    REFINE_OFFSET = 0.5 - (3.0 + (RENORM_SPLIT + 1.0) + 1.0)  # every term at its "yes" value
    M = rot - np.eye(D)
    for j in range(D):
        up = {X[reg][jj]: M[j, jj] for reg in ("pi", "p_d", "q") for jj in range(D) if M[j, jj]}
        core[1].gate_pair(const, refine, REFINE_OFFSET, up, X["q"][j])
    for k in range(R):  # one-hot k -> k - 1
        up = {X["remi"][k]: -1.0, X["rem_d"][k]: -1.0}
        if k + 1 < R:
            up.update({X["remi"][k + 1]: 1.0, X["rem_d"][k + 1]: 1.0})
        core[1].gate_pair(const, refine, REFINE_OFFSET, up, X["rem_d"][k])
    # The check that a row's initial state is its own (each row's is seeded by its position): the
    # registers `noise` carry the initial state's first NOISE_DIMS dims unchanged through every
    # step, and layer 0 head 1 reads BOS's. spread = number of dims that differ by >= NOISE_STEP
    # (layer 0's MLP); same = 1 when none does (layer 1's MLP, carried to the next step), and then
    # the first answer row stops moving. A decoder that gives a new row BOS's initial state (row 0's)
    # loses the second answer token; with states of their own, 16 dims all closer than NOISE_STEP
    # happen with probability ~1e-12.
    for j in range(NOISE_DIMS):
        for sign in (1.0, -1.0):
            diff = {X["noise"][j]: sign / NOISE_STEP, X["bos_noise"][j]: -sign / NOISE_STEP}
            core[0].gate_pair(const, diff, -0.75, {const: 1.0 / CONST}, X.at("spread"))
    core[1].gate_pair(const, {X.at("spread"): -1.0}, 0.5, {const: 1.0 / CONST}, X.at("same"))
    core[1].gate_pair(const, {}, 0.5, {X.at("same"): -1.0}, X.at("same"))  # set, not add
    assert core[1].units == I and core[0].units <= I, (core[0].units, core[1].units, I)
    for block, wr in zip(model.transformer.core_block, core):
        wr.load(block, norm_w)

    lm = np.zeros((cfg.vocab_size, h))
    for e in sc.ENTITIES:
        for reg in ("pi", "p_d", "q", "pi2", "p_d2"):
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
