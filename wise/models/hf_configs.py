"""Published ``config.json`` of the recurrent-depth checkpoint families -> ``RecurrentConfig``.

Both families ship the Raven config format (``model_type: "huginn_raven"``, the class in
seal-rg/recurrent-pretraining ``recpre/raven_config_minimal.py``):

* Huginn-0125 (``tomg-group-umd/huginn-0125``): sandwich blocks, RoPE on interleaved pairs from a
  ``block_size``-long table with ``rope_base``, learned qk bias, embeddings scaled by sqrt(n_embd)
  (its modeling file computes the scale from ``n_embd`` and never reads
  ``init_values.embed_scale``, so a config whose ``embed_scale`` differs is refused rather than
  loaded with a scale the published code would not use), ``ln_f`` applied after the recurrence.
* Retrofitted Llama (``smcleish/Recurrent-Llama-3.2-*`` and siblings): the Huginn config with
  Llama fields written over it by the converter (mcleish7 retrofitting-recurrence,
  ``convert_pretrained_model/convert_llama.py``): ``num_key_value_heads`` (GQA), ``rope_theta``,
  ``rope_scaling`` (llama3), ``max_position_embeddings``, ``init_values.embed_scale = 1``,
  untied head, no qk bias. Its modeling file keeps the class name ``SandwichBlock`` for a
  pre-norm Llama block (norm_1/norm_2 only), uses transformers' rotate-half RoPE and does not
  apply ``ln_f`` after the recurrence. The converter is the only writer of the ``rope_*`` /
  ``max_position_embeddings`` keys, so their presence is what tells the families apart. The
  retrofitting code's config class also writes ``initial_state_mode`` (default ``"random"``, the
  truncated-normal state both modeling files draw) into every checkpoint it trains; only that
  value is implemented.

The converter copied Huginn's ``bos/eos/pad_token_id`` (65504/65505/65509) into the retrofitted
configs unchanged, so special ids are taken from the checkpoint's own tokenizer files
(``tokenizer_config.json`` names the tokens, ``tokenizer.json`` gives their ids) and only fall
back to the family's published ids when no tokenizer ships beside the weights.

Every key is accounted for: used, required to hold the one value implemented here, or listed as
known and irrelevant to inference. Anything else is an error that names the key.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from wise.models.config import RecurrentConfig

RAVEN_MODEL_TYPE = "huginn_raven"
HUGINN, RETROFIT = "huginn", "retrofitted-llama"

# Keys that only the retrofitting converter writes (see the module docstring).
_RETROFIT_MARKERS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")

# Known keys that do not change inference: training recipe (init, depth sampling, checkpointing),
# bookkeeping of transformers / the training registry, and the total layer count (informational:
# the three per-group counts are what the modeling code builds).
IGNORED_KEYS = frozenset({
    "architectures", "auto_map", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "name", "hf_config", "use_cache", "padding_multiple", "init_strategy", "init_orthogonal",
    "sampling_scheme", "mean_backprop_depth", "activation_checkpoint_impl",
    "effective_expected_depth", "n_layers", "num_hidden_layers", "test_time_noise_type",
    "_attn_implementation_autoset", "attn_implementation",  # written by some transformers 4.x
})
# Keys whose value selects a component; only these values are implemented.
REQUIRED_VALUES: dict[str, Any] = {
    "architecture_class_name": "RecurrentGPT",
    "block_class_name": "SandwichBlock",  # both modeling files use this name (see docstring)
    "norm_class_name": "RMSNorm_llama",
    "mlp_class_name": "GatedMLP",
    "nonlin_name": "SiLU",
    "injection_type": "linear",  # adapter(cat[state, embeds])
    "state_init": "like-init",  # truncated normal with init_values.std
    "bias": False,
    "test_time_noise": 0,
    "initial_state_mode": "random",  # written by the retrofitting code's config class
}
# Keys that carry the architecture; each is read below.
USED_KEYS = frozenset({
    "model_type", "n_embd", "hidden_size", "n_heads", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "n_layers_in_prelude", "n_layers_in_recurrent_block",
    "n_layers_in_coda", "vocab_size", "padded_vocab_size", "norm_eps", "rope_base", "block_size",
    "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "tie_embeddings",
    "tie_word_embeddings", "qk_bias", "mean_recurrence", "init_values", "bos_token_id",
    "eos_token_id", "pad_token_id",
})
REQUIRED_KEYS = ("n_layers_in_prelude", "n_layers_in_recurrent_block", "n_layers_in_coda",
                 "intermediate_size", "vocab_size", "norm_eps", "tie_embeddings", "qk_bias",
                 "mean_recurrence", "init_values")
_INIT_VALUE_KEYS = {"std", "embed_scale", "out_proj", "embedding"}  # out_proj/embedding: init only

# Special tokens by name (tokenizer_config.json of huginn-0125; the Llama-3 tokenizer), and the
# published ids used when a checkpoint folder has no tokenizer files.
_SPECIALS = {
    HUGINN: {"bos": "<|begin_text|>", "eos": "<|end_text|>", "pad": "<|pad|>",
             "stops": ("<|end_turn|>",)},
    RETROFIT: {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": None,
               "stops": ("<|eot_id|>",)},
}
_DEFAULT_IDS = {
    HUGINN: {"bos": 65504, "eos": 65505, "pad": 65509, "stops": (65508,)},
    RETROFIT: {"bos": 128000, "eos": 128001, "pad": 128001, "stops": (128009,)},  # Llama-3 vocab
}
_LLAMA3_VOCAB = 128256


class ConfigKeyError(ValueError):
    """A config.json key is unknown, missing or holds an unsupported value; names the key."""


def family_of(raw: dict[str, Any]) -> str:
    return RETROFIT if any(k in raw for k in _RETROFIT_MARKERS) else HUGINN


def config_from_raven(raw: dict[str, Any], folder: str | Path | None = None,
                      source: str = "config.json") -> RecurrentConfig:
    """Map a published Raven ``config.json`` (already parsed) onto ``RecurrentConfig``.
    ``folder`` is where tokenizer files are looked up for the special ids."""
    def fail(key: str, why: str) -> ConfigKeyError:
        return ConfigKeyError(f"{source}: {key}: {why}")

    if raw.get("model_type") != RAVEN_MODEL_TYPE:
        raise fail("model_type", f"{raw.get('model_type')!r} is not {RAVEN_MODEL_TYPE!r}")
    unknown = sorted(set(raw) - USED_KEYS - IGNORED_KEYS - set(REQUIRED_VALUES))
    if unknown:
        raise fail(unknown[0], f"unknown key(s) {unknown} for the {RAVEN_MODEL_TYPE} format "
                               "(not implemented here; refusing to guess)")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise fail(missing[0], f"missing required key(s) {missing}")
    for key, value in REQUIRED_VALUES.items():
        if key in raw and raw[key] != value:
            raise fail(key, f"{raw[key]!r} is not supported (only {value!r} is implemented)")

    def alias(*keys: str) -> Any:
        present = [k for k in keys if k in raw]
        if not present:
            also = f" (or {', '.join(keys[1:])})" if len(keys) > 1 else ""
            raise fail(keys[0], f"missing required key{also}")
        if len({json.dumps(raw[k]) for k in present}) > 1:
            raise fail(present[1], f"disagrees with {present[0]}: {raw[present[1]]!r} vs {raw[present[0]]!r}")
        return raw[present[0]]

    family = family_of(raw)
    hidden = int(alias("n_embd", "hidden_size"))
    heads = int(alias("n_heads", "num_attention_heads"))
    kv_heads = int(raw.get("num_key_value_heads", heads))
    # The modeling files split q/k/v with head_dim = n_embd // n_heads whatever head_dim says.
    head_dim = hidden // heads
    if hidden % heads or raw.get("head_dim", head_dim) != head_dim:
        raise fail("head_dim", f"{raw.get('head_dim')!r} != n_embd // n_heads = {hidden}/{heads}")
    vocab = int(raw.get("padded_vocab_size", raw["vocab_size"]))  # wte/lm_head rows
    if vocab < raw["vocab_size"]:
        raise fail("padded_vocab_size", f"{vocab} < vocab_size {raw['vocab_size']}")
    tie = bool(raw["tie_embeddings"])
    if "tie_word_embeddings" in raw and bool(raw["tie_word_embeddings"]) != tie:
        raise fail("tie_word_embeddings", f"disagrees with tie_embeddings={tie}")

    init = raw["init_values"]
    if not isinstance(init, dict) or not {"std", "embed_scale"} <= set(init):
        raise fail("init_values", f"must give std and embed_scale, got {init!r}")
    if set(init) - _INIT_VALUE_KEYS:
        raise fail(f"init_values.{sorted(set(init) - _INIT_VALUE_KEYS)[0]}", "unknown key")
    embed_scale = float(init["embed_scale"])

    if family == HUGINN:
        # The Huginn modeling file scales embeddings (and the initial state) by sqrt(n_embd)
        # whatever init_values.embed_scale says; follow it, and refuse a config where they differ.
        if not math.isclose(embed_scale, math.sqrt(hidden), rel_tol=1e-6):
            raise fail("init_values.embed_scale",
                       f"{embed_scale} but Huginn's modeling code scales embeddings by sqrt(n_embd) = "
                       f"{math.sqrt(hidden):.6g} and ignores this key; refusing a config whose two disagree")
        embed_scale = math.sqrt(hidden)
        rope = dict(rope_style="interleaved", rope_base=float(alias("rope_base")), rope_scaling=None,
                    max_positions=int(alias("block_size")))  # length of the published freqs_cis table
        layout = dict(block_style="sandwich", ln_f_after_recurrence=True)
    else:
        rope = dict(rope_style="half", **_retrofit_rope(raw, fail))
        layout = dict(block_style="prenorm", ln_f_after_recurrence=False)
        if embed_scale != 1.0:  # the retrofitted modeling file hard-codes emb_scale = 1
            raise fail("init_values.embed_scale", f"{embed_scale} (retrofitted Llama checkpoints use 1.0)")

    ids = _special_ids(raw, family, Path(folder) if folder is not None else None, vocab, fail)
    try:
        return RecurrentConfig(
            vocab_size=vocab, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            intermediate=int(raw["intermediate_size"]), n_prelude=int(raw["n_layers_in_prelude"]),
            n_core=int(raw["n_layers_in_recurrent_block"]), n_coda=int(raw["n_layers_in_coda"]),
            norm_eps=float(raw["norm_eps"]), embed_scale=embed_scale, tie_embeddings=tie,
            qk_bias=bool(raw["qk_bias"]), init_state_std=float(init["std"]),
            # Both modeling files multiply the drawn state by emb_scale when it is not 1.
            init_state_scale=embed_scale, mean_recurrence=int(raw["mean_recurrence"]),
            # A hub download lives in a snapshot folder named by commit hash, so name the family.
            name=family, **rope, **layout, **ids)
    except ValueError as exc:
        raise ConfigKeyError(f"{source}: {exc}") from exc


def _retrofit_rope(raw: dict[str, Any], fail) -> dict[str, Any]:
    """rope_theta / rope_scaling (transformers 4 layout) or rope_parameters (transformers 5)."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or (params if params.get("rope_type") not in (None, "default") else None)
    theta = raw.get("rope_theta", params.get("rope_theta", raw.get("rope_base")))
    if theta is None:
        raise fail("rope_theta", "missing (no rope_theta, rope_parameters.rope_theta or rope_base)")
    out: dict[str, Any] = {"rope_base": float(theta), "rope_scaling": None,
                           "max_positions": int(raw.get("max_position_embeddings", raw.get("block_size", 0)))}
    if not out["max_positions"]:
        raise fail("max_position_embeddings", "missing")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise fail("rope_scaling.rope_type", f"{kind!r} is not supported (only 'llama3')")
        try:
            out["rope_scaling"] = {
                "factor": float(scaling["factor"]),
                "low_freq_factor": float(scaling["low_freq_factor"]),
                "high_freq_factor": float(scaling["high_freq_factor"]),
                "original_max_position": int(scaling["original_max_position_embeddings"]),
            }
        except KeyError as exc:
            raise fail(f"rope_scaling.{exc.args[0]}", "missing") from None
    return out


def _special_ids(raw: dict[str, Any], family: str, folder: Path | None, vocab: int,
                 fail) -> dict[str, Any]:
    names = _SPECIALS[family]
    vocab_ids = _tokenizer_vocab(folder) if folder is not None else None
    if vocab_ids is None:
        if family == RETROFIT and vocab != _LLAMA3_VOCAB:
            raise fail("vocab_size", f"{vocab}: no tokenizer.json beside the weights to read the "
                                     "special ids from (the config's ids are Huginn's, not this tokenizer's)")
        ids = dict(_DEFAULT_IDS[family])
        if family == HUGINN:  # Huginn's own config ids are right for its tokenizer
            ids.update({k: int(raw[f"{k}_token_id"]) for k in ("bos", "eos", "pad")
                        if raw.get(f"{k}_token_id") is not None})
    else:
        declared = _declared_tokens(folder)
        ids = {}
        for role in ("bos", "eos", "pad"):
            token = declared.get(role) or names[role]
            if token is None:
                continue
            if token not in vocab_ids:
                raise fail(f"{role}_token", f"{token!r} is not in {folder / 'tokenizer.json'}")
            ids[role] = vocab_ids[token]
        ids.setdefault("pad", ids["eos"])  # Llama-3 base has no pad token
        ids["stops"] = tuple(vocab_ids[t] for t in names["stops"] if t in vocab_ids)
        if family == HUGINN:
            for role in ("bos", "eos", "pad"):
                given = raw.get(f"{role}_token_id")
                if given is not None and given != ids[role]:
                    raise fail(f"{role}_token_id", f"{given} but the tokenizer has {ids[role]}")
    out = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"],
           "extra_eos_token_ids": tuple(s for s in ids["stops"] if s != ids["eos"])}
    for key, value in out.items():
        for v in (value if isinstance(value, tuple) else (value,)):
            if not 0 <= v < vocab:
                raise fail(key, f"{v} outside the vocabulary of {vocab}")
    return out


def _tokenizer_vocab(folder: Path) -> dict[str, int] | None:
    """content -> id from tokenizer.json (model vocab, then added tokens, which win)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    tok = json.loads(path.read_text(encoding="utf-8"))
    vocab = tok.get("model", {}).get("vocab")
    out = dict(vocab) if isinstance(vocab, dict) else {}
    out.update({t["content"]: int(t["id"]) for t in tok.get("added_tokens", [])})
    return out


def _declared_tokens(folder: Path) -> dict[str, str]:
    """bos/eos/pad token strings that tokenizer_config.json declares (str or {content: ...})."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    cfg = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for role in ("bos", "eos", "pad"):
        value = cfg.get(f"{role}_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[role] = value
    return out
