"""recurtrace-chain: a non-looped Llama decoder whose weights are computed, not trained, so the
depth a synthchain question needs is known (the RecurTrace calibration base; card: ``card_text``).

Hugging Face Llama layout (``LlamaForCausalLM``, saved with ``save_pretrained``, loaded by the
retrofit loader ``wise.models.looped.base.load_base`` like any Qwen3 / Llama base), 5 layers, 2 heads of
64, RoPE theta 1e30 (pairs 0..7 locate offsets, pairs >= 8 do not rotate), the synthchain
word-level tokenizer. On a prompt ``... x : -> y . ... Question : s +m ? Answer :``:

* layer 0 (index): a RoPE offset-1 head copies each row's previous token into the row, so a fact
  target row ``y`` knows its arrow (``->`` or the terminal ``=>``);
* layer 1 (index): an offset-3 head copies the token three back (the target row ``y`` gets its
  source ``x``: its key); a second offset-3 head, on the question row only (the ``:`` after ``Answer``),
  fetches the start s and the count m from the ``+m`` row. Every other row attends BOS;
* layer 2 (first hop): the hop below, once, and the fact index kx (a copy of the key) that the
  hop layer reads;
* layer 3 (the hop layer, the retrofit block): the question row's query is its pointer p; the
  fact whose source is p scores 300 logits, BOS 270 (a zero-value sink: no fact matches when a hop
  fact is missing), anything else far less. The MLP then, on the question row: a non-terminal
  fact moves p to its target; the first terminal fact (``z : => z .``) copies z into the
  answer register a and sets ``term_seen``; every later terminal read applies the successor map to a (a rotation of the
  entity code) and counts m down. So after loop t there is no answer for t < L (a = 0) and
  succ^(t-L)(z) from t = L: right exactly when t = L + m = d. ``overshoot: false`` builds the
  latched variant (the successor is applied only while the count lasts: right whenever t >= d),
  the ideal curve;
* layer 4 (coda): identity (zero weights); ``lm_head`` reads a: logit(e) = 100 code(e) . a, and
  EOS on the row after the answer.

Flags the hop layer writes on the question row every loop: ``stuck`` (no fact matched: a hop fact
is missing, and no depth will help) and ``done`` (term_seen and the count at 0: t >= d), so a
linear halting head on that row can read both. ``hold`` is an input the base never writes: it
scales the successor step by (1 - hold) (linear in hold on [0, 1], so a gradient reaches it); Loop
Memory Attention can learn to write it once ``done`` is set, which latches the answer.

Residual stream: a constant coordinate CONST dominates the RMS, every RMSNorm weight is
CONST / sqrt(hidden), so each norm is the identity to ~1e-3 (small enough for every margin,
large enough that the angular-distance probe resolves the layers in float32). Gates are pairs of
SiLU units in their linear / zero regimes (exact in float32).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from wise.data import synthchain as sc
from wise.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from wise.models.construct import (Slots, code_frequencies, entity_codes, max_code_correlation, position_weights,
                                   successor_rotation)

NAME = "recurtrace-chain"
HEAD_DIM, HEADS, LAYERS, HOP_LAYER = 64, 2, 5, 3
ROPE_THETA = 1e30
POSITION_PAIRS = 8
CONST = 128.0
MATCH_LOGIT, SINK_LOGIT, BOS_LOGIT, PENALTY_LOGIT = 300.0, 270.0, 50.0, 1000.0
POSITION_MARGIN = 40.0
GATE_SLOPE, LINEAR_GATE = 400.0, 40.0
READOUT_SCALE, EOS_LOGIT = 100.0, 200.0


@dataclass(frozen=True)
class ChainBaseSpec:
    """The small config the weights are a function of (with the synthchain vocabulary)."""

    seed: int = 0  # seeds the frequency search of the entity codes
    code_pairs: int = 8  # entity codes have 2 x code_pairs dims
    max_refine: int = 2  # refinement counts m the counter holds (0..max_refine)
    max_positions: int = 512
    overshoot: bool = True  # false: the successor stops when the count is spent (the latched, ideal base)
    frequency_trials: int = 300  # draws of the entity-code frequency search (wise.models.chain_parts.code_frequencies)

    def __post_init__(self) -> None:
        if not 1 <= self.code_pairs <= HEAD_DIM // 2 - POSITION_PAIRS - 1:
            raise ValueError(f"code_pairs must be in 1..{HEAD_DIM // 2 - POSITION_PAIRS - 1}, got {self.code_pairs}")
        if not 0 <= self.max_refine <= sc.MAX_REFINE_TOKEN:
            raise ValueError(f"max_refine must be in 0..{sc.MAX_REFINE_TOKEN}, got {self.max_refine}")
        if not 64 <= self.max_positions <= 4096:
            raise ValueError(f"max_positions must be in 64..4096, got {self.max_positions}")


def stream(D: int, R: int) -> Slots:
    """Named coordinates of the residual stream."""
    return Slots(const=1, own=D, entity=1, arrow=1, term=1, refine=1, m=R, qmark=1, answer=1, bos=1,
                 b1_code=D, b1_arrow=1, b1_term=1, b1_answer=1, b3_code=D, b3_qmark=1, kx=D,
                 p=D, a=D, cnt=R, term_seen=1, done=1, stuck=1, hold=1, att_y=D, att_term=1, att_match=1)


def _pair(i: int) -> tuple[int, int]:
    return i, i + HEAD_DIM // 2  # rotate_half: dims i and i + d/2 rotate together


class _Layer:
    """One Llama layer's weights (rows: output dims, columns: residual dims), float64."""

    def __init__(self, h: int, inter: int):
        self.q, self.k, self.v = (np.zeros((HEADS * HEAD_DIM, h)) for _ in range(3))
        self.o = np.zeros((h, HEADS * HEAD_DIM))
        self.gate, self.up, self.down = np.zeros((inter, h)), np.zeros((inter, h)), np.zeros((h, inter))
        self.unit = 0

    def offset_head(self, head: int, S: Slots, offset: int, pos: tuple, copy, only_question: bool = False) -> None:
        """Head `head` attends `offset` rows back (RoPE pairs 0..7, from the constant alone) and
        copies slots (source, destination); with only_question, rows that are not the question row
        attend BOS (zero value) instead."""
        weights, gap = pos
        scale = POSITION_MARGIN / gap
        root = math.sqrt(HEAD_DIM)
        theta = 1.0 / ROPE_THETA ** (np.arange(0, HEAD_DIM, 2)[:POSITION_PAIRS] / HEAD_DIM)
        base = head * HEAD_DIM
        for i in range(POSITION_PAIRS):
            a, b = (base + d for d in _pair(i))
            amp = math.sqrt(scale * weights[i] * root)
            psi = -offset * theta[i]  # the score peaks at key position j = l - offset
            self.q[a, S.at("const")] = amp * math.cos(psi) / CONST
            self.q[b, S.at("const")] = amp * math.sin(psi) / CONST
            self.k[a, S.at("const")] = amp / CONST
        if only_question:  # non-question rows: BOS beats every positional score (range 2 * scale)
            a, _ = (base + d for d in _pair(POSITION_PAIRS))
            self.q[a, S.at("const")] = 1.0 / CONST
            self.q[a, S.at("b1_answer")] = -1.0
            self.k[a, S.at("bos")] = (2 * scale + 2 * POSITION_MARGIN) * root
        d = 0
        for src, dst in copy:
            for s, t in zip(S[src], S[dst], strict=True):
                self.v[base + d, s] = 1.0
                self.o[t, base + d] = 1.0
                d += 1
        assert d <= HEAD_DIM

    def hop_head(self, S: Slots, key: str) -> None:
        """Head 0: the question row's pointer p against the key `key` of fact target rows."""
        root = math.sqrt(HEAD_DIM)
        amp = math.sqrt(MATCH_LOGIT * root)
        content = [d for i in range(POSITION_PAIRS + 1, POSITION_PAIRS + 1 + len(S["p"]) // 2) for d in _pair(i)]
        for j, d in enumerate(content):
            self.q[d, S["p"][j]] = amp
            self.k[d, S[key][j]] = amp
        a, b = _pair(POSITION_PAIRS)
        self.q[a, S.at("const")] = 1.0 / CONST  # pair a: rows that are not fact targets lose PENALTY
        self.k[a, S.at("const")] = -PENALTY_LOGIT * root / CONST
        self.k[a, S.at("b1_arrow")] = PENALTY_LOGIT * root
        self.k[a, S.at("bos")] = (PENALTY_LOGIT + BOS_LOGIT) * root
        self.q[b, S.at("b1_answer")] = 1.0  # pair b: the question row's sink (BOS) scores SINK
        self.k[b, S.at("bos")] = (SINK_LOGIT - BOS_LOGIT) * root
        d = 0
        for src, dst in (("own", "att_y"), ("b1_term", "att_term"), ("entity", "att_match")):
            for s, t in zip(S[src], S[dst], strict=True):
                self.v[d, s] = 1.0
                self.o[t, d] = 1.0
                d += 1

    def gate_pair(self, S: Slots, terms: dict, offset: float, up: dict, target: int) -> None:
        """Adds f(c) * up(x) to `target`, c = sum terms + offset: f = 1 for c >= 1/4, 0 for c <= -1/4,
        linear between (two SiLU units, A(c + 1/4) and A(c - 1/4))."""
        for sign, shift in ((1.0, 0.25), (-1.0, -0.25)):
            for i, coef in terms.items():
                self.gate[self.unit, i] += GATE_SLOPE * coef
            self.gate[self.unit, S.at("const")] += GATE_SLOPE * (offset + shift) / CONST
            for i, coef in up.items():
                self.up[self.unit, i] += sign * coef
            self.down[target, self.unit] = 2.0 / GATE_SLOPE
            self.unit += 1

    def linear(self, S: Slots, up: dict, target: int) -> None:
        """Adds up(x) to `target` on every row (a SiLU unit held in its linear regime)."""
        self.gate[self.unit, S.at("const")] = LINEAR_GATE / CONST
        for i, coef in up.items():
            self.up[self.unit, i] += coef
        self.down[target, self.unit] = 1.0 / LINEAR_GATE
        self.unit += 1

    def hop_mlp(self, S: Slots, rotation: np.ndarray, overshoot: bool) -> None:
        one = S.at("const")
        c1 = 1.0 / CONST  # coefficient that reads "1" off the constant coordinate
        D = len(S["p"])
        qm = {S.at("att_match"): 1.0, S.at("b1_answer"): 1.0}
        move = {**qm, S.at("att_term"): -1.0}  # a non-terminal fact matched on the question row
        for j in range(D):
            self.gate_pair(S, move, -1.5, {S["att_y"][j]: 1.0, S["p"][j]: -1.0}, S["p"][j])
        terminal = {**qm, S.at("att_term"): 1.0}
        first = {**terminal, S.at("term_seen"): -1.0}  # the first terminal read: a <- z
        for j in range(D):
            self.gate_pair(S, first, -2.5, {S["att_y"][j]: 1.0, S["a"][j]: -1.0}, S["a"][j])
        # successor: a later terminal read (term_seen); (1 - hold) enters linearly: c = 1/4 - hold/2
        rot = {**terminal, S.at("term_seen"): 1.0, S.at("hold"): -0.5}
        if not overshoot:
            rot[S["cnt"][0]] = -1.0
        M = rotation - np.eye(D)
        for j in range(D):
            self.gate_pair(S, rot, -3.75, {S["a"][jj]: M[j, jj] for jj in range(D) if M[j, jj]}, S["a"][j])
        count = {**terminal, S.at("term_seen"): 1.0, S["cnt"][0]: -1.0}
        R = len(S["cnt"])
        for k in range(1, R):  # one-hot k -> k - 1
            self.gate_pair(S, count, -3.5, {S["cnt"][k]: -1.0, S["cnt"][k - 1]: 1.0}, S["cnt"][k])
            self.gate_pair(S, count, -3.5, {S["cnt"][k]: 1.0}, S["cnt"][k - 1])
        self.gate_pair(S, terminal, -2.5, {one: c1, S.at("term_seen"): -1.0}, S.at("term_seen"))
        # done after this loop: count already 0 at a terminal read, or 1 at a later terminal read
        self.linear(S, {S.at("done"): -1.0}, S.at("done"))
        self.gate_pair(S, {**terminal, S["cnt"][0]: 1.0}, -3.5, {one: c1}, S.at("done"))
        if R > 1:
            self.gate_pair(S, {**terminal, S.at("term_seen"): 1.0, S["cnt"][1]: 1.0}, -4.5, {one: c1}, S.at("done"))
        self.linear(S, {S.at("b1_answer"): 1.0, S.at("att_match"): -1.0, S.at("stuck"): -1.0}, S.at("stuck"))
        for name in ("att_y", "att_term", "att_match", "hold"):  # scratch and this loop's hold are spent
            for i in S[name]:
                self.linear(S, {i: -1.0}, i)

    def load(self, layer, norm_weight: float) -> None:
        t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
        attn, mlp = layer.self_attn, layer.mlp
        with torch.no_grad():
            attn.q_proj.weight.copy_(t(self.q))
            attn.k_proj.weight.copy_(t(self.k))
            attn.v_proj.weight.copy_(t(self.v))
            attn.o_proj.weight.copy_(t(self.o))
            mlp.gate_proj.weight.copy_(t(self.gate))
            mlp.up_proj.weight.copy_(t(self.up))
            mlp.down_proj.weight.copy_(t(self.down))
            layer.input_layernorm.weight.fill_(norm_weight)
            layer.post_attention_layernorm.weight.fill_(norm_weight)


def sizes(spec: ChainBaseSpec) -> tuple[Slots, int]:
    S = stream(2 * spec.code_pairs, spec.max_refine + 1)
    D, R = 2 * spec.code_pairs, spec.max_refine + 1
    inter = 2 * (2 * D) + 2 * D + 4 * (R - 1) + 2 + 1 + 4 + 1 + (D + 3) + D
    return S, inter


def llama_config(spec: ChainBaseSpec):
    from transformers import LlamaConfig

    S, inter = sizes(spec)
    return LlamaConfig(
        vocab_size=sc.build_tokenizer().get_vocab_size(), hidden_size=S.size, intermediate_size=inter,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM,
        max_position_embeddings=spec.max_positions, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)


def build_chain_base(spec: ChainBaseSpec = ChainBaseSpec()):
    """(LlamaForCausalLM float32 eval, facts of the construction)."""
    from transformers import LlamaForCausalLM

    S, inter = sizes(spec)
    config = llama_config(spec)
    model = LlamaForCausalLM(config).double()
    h = S.size
    norm_w = CONST / math.sqrt(h)
    freqs = code_frequencies(spec)  # the same seeded search as wise-chain's, over this spec's code pairs
    codes, rotation = entity_codes(freqs), successor_rotation(freqs)
    vocab = sc.build_tokenizer().get_vocab()
    position = sc.cycle_position()

    wte = np.zeros((config.vocab_size, h))
    wte[:, S.at("const")] = CONST
    for e in sc.ENTITIES:
        wte[vocab[e], S["own"]] = codes[position[e]]
        wte[vocab[e], S.at("entity")] = 1.0
    for word, flags in {sc.ARROW: ("arrow",), sc.TERMINAL_ARROW: ("arrow", "term"), sc.QMARK: ("qmark",),
                        sc.ANSWER_WORD: ("answer",), "<bos>": ("bos",)}.items():
        for f in flags:
            wte[vocab[word], S.at(f)] = 1.0
    for m in range(sc.MAX_REFINE_TOKEN + 1):
        wte[vocab[f"+{m}"], S.at("refine")] = 1.0
        if m <= spec.max_refine:  # larger counts have no counter state
            wte[vocab[f"+{m}"], S["m"][m]] = 1.0

    pos = position_weights(ROPE_THETA, spec.max_positions)
    layers = [_Layer(h, inter) for _ in range(LAYERS)]
    layers[0].offset_head(0, S, 1, pos, [("own", "b1_code"), ("arrow", "b1_arrow"), ("term", "b1_term"),
                                         ("answer", "b1_answer")])
    layers[1].offset_head(0, S, 3, pos, [("own", "b3_code"), ("qmark", "b3_qmark")])
    layers[1].offset_head(1, S, 3, pos, [("b1_code", "p"), ("m", "cnt")], only_question=True)
    layers[2].hop_head(S, "b3_code")
    layers[2].hop_mlp(S, rotation, spec.overshoot)
    for s, t in zip(S["b3_code"], S["kx"], strict=True):  # the fact index the hop layer reads
        layers[2].linear(S, {s: 1.0}, t)
    layers[HOP_LAYER].hop_head(S, "kx")
    layers[HOP_LAYER].hop_mlp(S, rotation, spec.overshoot)
    for layer, w in zip(model.model.layers, layers):
        assert w.unit <= inter, (w.unit, inter)
        w.load(layer, norm_w)

    lm = np.zeros((config.vocab_size, h))
    for e in sc.ENTITIES:
        lm[vocab[e], S["a"]] = READOUT_SCALE * codes[position[e]]
    lm[EOS_ID, S.at("b3_qmark")] = EOS_LOGIT  # the row after the answer: 3 back is "?"
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.tensor(wte))
        model.model.norm.weight.fill_(norm_w)
        model.lm_head.weight.copy_(torch.tensor(lm))
    facts = {"frequencies": [int(f) for f in freqs], "max_code_correlation": max_code_correlation(freqs),
             "position_gap_logits": POSITION_MARGIN, "hop_layer": HOP_LAYER, "layers": LAYERS,
             "hidden": h, "intermediate": inter, "slots": {k: [r.start, r.stop] for k, r in S.ranges.items()}}
    return model.float().eval(), facts


def card_text(spec: ChainBaseSpec, facts: dict) -> str:
    latch = ("a loop past d keeps applying the successor map, so looping it is right only at T = d"
             if spec.overshoot
             else "the successor stops when the count is spent (the latched variant): right at every T >= d")
    return f"""# {NAME}{'' if spec.overshoot else ' (latched)'}: a constructed Llama decoder (not trained)

Every weight of this model is computed from a small config and a seed by
`wise/looped/chain_base.py` (spec: `{json.dumps(asdict(spec))}`); nothing was trained. It is
the calibration base of the RecurTrace half of the project: on synthchain-format questions its
depth need is known. Layers 0-1 index the facts and fetch the question's start and count, layer 2
makes the first hop, layer {HOP_LAYER} (the hop layer, the block a retrofit loops) moves the
question's pointer one hop per application and then applies the successor map, layer 4 is the
identity, and the LM head reads the answer register. Looping layer {HOP_LAYER} t times answers
right exactly when t = L + m (L hops, m refinements); {latch}. A question whose hop fact is missing
is never answered (the pointer sticks, the `stuck` flag is set).

Facts of this build: hidden {facts['hidden']}, intermediate {facts['intermediate']}, entity-code
frequencies {facts['frequencies']} (max code correlation {facts['max_code_correlation']:.3f}),
offset-head margin {facts['position_gap_logits']} logits. Layout of the residual stream
(name: [start, stop)): {json.dumps(facts['slots'])}.
"""


def save_chain_base(out: str | Path, spec: ChainBaseSpec = ChainBaseSpec()) -> Path:
    """Build and write the base folder: config.json + model.safetensors (save_pretrained),
    tokenizer.json, construction.json, README.md (the model card). Written aside, then renamed."""
    import shutil
    import tempfile

    out = Path(out)
    model, facts = build_chain_base(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        sc.build_tokenizer().save(str(tmp / "tokenizer.json"))
        (tmp / "construction.json").write_text(json.dumps({"name": NAME, "spec": asdict(spec), **facts},
                                                          indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(card_text(spec, facts))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out
