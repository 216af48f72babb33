"""Published checkpoint families (Huginn-0125, retrofitted Recurrent-Llama-3.2) scaled down: tiny
random checkpoints in each family's published file layout, key and tensor names, shared by the
checkpoint-loading, config-mapping and prompt-format tests.

Facts encoded below, and where they come from:
- config keys/values: huginn-0125 config.json and seal-rg/recurrent-pretraining
  recpre/raven_config_minimal.py (n_embd, n_heads, num_key_value_heads, head_dim,
  n_layers_in_prelude/recurrent_block/coda, block_size, rope_base, qk_bias, tie_embeddings,
  init_values{std, embed_scale, ...}); the retrofitting converter (convert_llama.py) adds
  rope_theta, rope_scaling (llama3), max_position_embeddings, embed_scale 1.0 and keeps Huginn's
  special ids.
- Huginn's files: persistent freqs_cis buffer, two copies of the tied embedding (model card).
"""
import json
import math

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

H, HEADS, D, INTER, VOCAB, N, T = 64, 4, 16, 96, 320, 12, 4
HUGINN_STD = math.sqrt(2 / (5 * 5280))  # published init_values.std, kept by the converter
HUGINN_SPECIALS = {"<|begin_text|>": 300, "<|end_text|>": 301, "<|begin_header|>": 302,
                   "<|end_header|>": 303, "<|end_turn|>": 304, "<|pad|>": 305}
LLAMA_SPECIALS = {"<|begin_of_text|>": 300, "<|end_of_text|>": 301, "<|eot_id|>": 309}


# -- published layouts, scaled down -----------------------------------------------------------

def huginn_config(**changes) -> dict:
    cfg = {
        "architectures": ["RavenForCausalLM"],
        "auto_map": {"AutoConfig": "raven_config_minimal.RavenConfig",
                     "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"},
        "model_type": "huginn_raven", "architecture_class_name": "RecurrentGPT",
        "block_class_name": "SandwichBlock", "norm_class_name": "RMSNorm_llama",
        "mlp_class_name": "GatedMLP", "nonlin_name": "SiLU", "bias": False,
        "n_embd": H, "n_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": D,
        "intermediate_size": INTER, "n_layers": 4, "n_layers_in_prelude": 1,
        "n_layers_in_recurrent_block": 2, "n_layers_in_coda": 1, "vocab_size": VOCAB,
        "padded_vocab_size": VOCAB, "padding_multiple": 4096, "block_size": 64, "norm_eps": 1e-6,
        "rope_base": 50000, "qk_bias": True, "tie_embeddings": True, "injection_type": "linear",
        "state_init": "like-init", "init_strategy": "takase", "init_orthogonal": False,
        "mean_recurrence": 32, "mean_backprop_depth": 8, "sampling_scheme": "poisson-lognormal-filling",
        "activation_checkpoint_impl": "per-iteration", "effective_expected_depth": 132,
        "init_values": {"std": HUGINN_STD, "out_proj": 0.0005, "embedding": HUGINN_STD,
                        "embed_scale": math.sqrt(H)},
        "bos_token_id": 300, "eos_token_id": 301, "pad_token_id": 305,
        "torch_dtype": "bfloat16", "transformers_version": "4.44.2",
    }
    cfg.update(changes)
    return cfg


def llama_config(**changes) -> dict:
    # What convert_llama.py writes: Huginn's config with the Llama fields set over it, Huginn's
    # (stale) special ids kept.
    cfg = huginn_config(
        num_key_value_heads=2, norm_eps=1e-5, qk_bias=False, tie_embeddings=False,
        tie_word_embeddings=False, rope_base=500000.0, rope_theta=10000.0,
        rope_scaling={"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64, "rope_type": "llama3"},
        max_position_embeddings=256,
        init_values={"std": HUGINN_STD, "out_proj": 0.0005, "embedding": HUGINN_STD, "embed_scale": 1.0},
        bos_token_id=65504, eos_token_id=65505, pad_token_id=65509)
    cfg.update(changes)
    return cfg


def random_state(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=0.05: torch.randn(*shape, generator=g) * s
    h, heads, kv, inter = cfg["n_embd"], cfg["n_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    d = h // heads
    sandwich = cfg["block_class_name"] == "SandwichBlock" and "rope_theta" not in cfg
    state = {"transformer.wte.weight": rnd(cfg["padded_vocab_size"], h, s=0.5),
             "transformer.adapter.weight": rnd(h, 2 * h, s=0.1),
             "transformer.ln_f.weight": 1 + rnd(h, s=0.1)}
    groups = {"prelude": cfg["n_layers_in_prelude"], "core_block": cfg["n_layers_in_recurrent_block"],
              "coda": cfg["n_layers_in_coda"]}
    for group, count in groups.items():
        for i in range(count):
            p = f"transformer.{group}.{i}"
            for j in range(1, 5 if sandwich else 3):
                state[f"{p}.norm_{j}.weight"] = 1 + rnd(h, s=0.1)
            state[f"{p}.attn.Wqkv.weight"] = rnd((heads + 2 * kv) * d, h, s=0.15)
            state[f"{p}.attn.proj.weight"] = rnd(h, heads * d)
            state[f"{p}.mlp.fc.weight"] = rnd(2 * inter, h, s=0.1)
            state[f"{p}.mlp.proj.weight"] = rnd(h, inter)
            if cfg["qk_bias"]:
                state[f"{p}.attn.qk_bias"] = rnd(2, 1, heads, d, s=0.3)
    if cfg["tie_embeddings"]:
        state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # the published duplicate
    else:
        state["lm_head.weight"] = rnd(cfg["padded_vocab_size"], h, s=0.2)
    if sandwich:  # Huginn's persistent RoPE buffer, computed as its modeling file does (fp32)
        inv = 1.0 / (cfg["rope_base"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(cfg["block_size"], dtype=torch.float32), inv)
        state["freqs_cis"] = torch.stack([freqs.cos()[None, :, None], freqs.sin()[None, :, None]], dim=4)
    return state


def write_tokenizer(folder, specials: dict[str, int], bos: str, eos: str, pad: str | None) -> None:
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 300)}}
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    tok.save(str(folder / "tokenizer.json"))
    tc = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if pad:
        tc["pad_token"] = pad
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))


def write_checkpoint(folder, cfg: dict, state: dict, shards: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(state)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[k::shards]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


def published_huginn(tmp_path):
    cfg = huginn_config()
    state = {k: v.to(torch.bfloat16) for k, v in random_state(cfg, seed=1).items()
             if k != "freqs_cis"}  # weights stored in bf16 as published; the RoPE table stays fp32
    state["freqs_cis"] = random_state(cfg, seed=1)["freqs_cis"]
    folder = tmp_path / "huginn-0125"
    write_checkpoint(folder, cfg, state, shards=3)
    write_tokenizer(folder, HUGINN_SPECIALS, "<|begin_text|>", "<|end_text|>", "<|pad|>")
    return folder, cfg, state


def published_llama(tmp_path, **changes):
    cfg = llama_config(**changes)
    state = random_state(cfg, seed=2)
    folder = tmp_path / "Recurrent-Llama-3.2-train-recurrence-32"
    write_checkpoint(folder, cfg, state)
    write_tokenizer(folder, LLAMA_SPECIALS, "<|begin_of_text|>", "<|end_of_text|>", None)
    return folder, cfg, state
