"""Published checkpoint families (Huginn-0125, retrofitted Recurrent-Llama-3.2) load into the
project's model: tiny random checkpoints in each family's published file layout and key/tensor
names, checked against a straightforward forward pass written here from the raw tensors (float64,
plain torch ops, none of the project's modules); plus config-key, tensor and prompt-format errors.
Over 400 lines on purpose: the independent float64 reference forward is written out here in full,
so that it shares no code with the model it checks.

Facts encoded below, and where they come from:
- config keys/values: huginn-0125 config.json and seal-rg/recurrent-pretraining
  recpre/raven_config_minimal.py (n_embd, n_heads, num_key_value_heads, head_dim,
  n_layers_in_prelude/recurrent_block/coda, block_size, rope_base, qk_bias, tie_embeddings,
  init_values{std, embed_scale, ...}); the retrofitting converter (convert_llama.py) adds
  rope_theta, rope_scaling (llama3), max_position_embeddings, embed_scale 1.0 and keeps Huginn's
  special ids.
- Huginn modeling: sandwich block, qk_bias added before RoPE, RoPE on (x[2i], x[2i+1]) pairs,
  ln_f after the recurrence and before the head, state std * embed_scale, persistent freqs_cis
  buffer, two copies of the tied embedding in the files (model card).
- retrofitted modeling: pre-norm block with norm_1/norm_2, transformers' rotate-half RoPE with
  llama3 scaling, GQA, no ln_f after the recurrence, untied head.
Over 400 lines on purpose: the two reference forward passes (the first ~280 lines) must share no
code with the model they check, so they live here and not in a helper of the project's.
"""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from wise.data.examples import Example, Passage
from wise.data.prompts import format_prompt
from wise.data.tokenizer import load_tokenizer
from wise.models import RecurrentConfig, load_checkpoint
from wise.models.checkpoint import load_config
from wise.models.hf_configs import ConfigKeyError, config_from_raven

H, HEADS, D, INTER, VOCAB, N, T = 64, 4, 16, 96, 320, 12, 4
HUGINN_STD = math.sqrt(2 / (5 * 5280))  # published init_values.std, kept by the converter

# The chat_template string of huginn-0125's tokenizer_config.json.
HUGINN_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set start_content = "
    "'<|begin_header|>' %}{% set end_content = message['content'] | trim  + '<|end_turn|>' %}{% if "
    "loop.index0 == 0 %}{% set start_content = bos_token + start_content %}{% endif %}{% if "
    "message['role'] == 'Huginn' or message['role'] == 'assistant' %}{% set start_content = "
    "start_content + 'Huginn<|end_header|>\\n\\n' %}{{ start_content }}{% generation %}{{ end_content "
    "}}{% endgeneration %}{% else %}{% set start_content = start_content + message['role'] + "
    "'<|end_header|>\\n\\n' %}{{ start_content }}{{ end_content }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|begin_header|>Huginn<|end_header|>\\n\\n' }}{% else %}{{ "
    "'<|end_text|>' }}{% endif %}")

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


# -- the independent forward pass -------------------------------------------------------------

def llama3_inv_freq(inv: list[float], factor, low, high, original) -> list[float]:
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(f)
        elif wavelen > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def reference_logits(cfg: dict, raw_state: dict, ids: torch.Tensor, s0: torch.Tensor, steps: int) -> torch.Tensor:
    W = {k: v.double() for k, v in raw_state.items()}
    h, heads, kv = cfg["n_embd"], cfg["n_heads"], cfg["num_key_value_heads"]
    d, eps, n = h // heads, cfg["norm_eps"], ids.shape[0]
    huginn = "rope_theta" not in cfg
    base = cfg["rope_base"] if huginn else cfg["rope_theta"]
    inv = [base ** (-(2 * i) / d) for i in range(d // 2)]
    if not huginn and cfg.get("rope_scaling"):
        s = cfg["rope_scaling"]
        inv = llama3_inv_freq(inv, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                              s["original_max_position_embeddings"])
    ang = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(inv, dtype=torch.float64)[None]

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):  # x [n, heads, d]
        if huginn:  # (x[2i], x[2i+1]) as one complex number, times e^{i angle}
            xc = torch.view_as_complex(x.reshape(n, x.shape[1], d // 2, 2).contiguous())
            return torch.view_as_real(xc * torch.polar(torch.ones_like(ang), ang)[:, None]).reshape(x.shape)
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]  # transformers' rotate_half convention
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
        rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rotated * sin

    def attn(x, p):
        q, k, v = (x @ W[f"{p}.Wqkv.weight"].T).split([heads * d, kv * d, kv * d], -1)
        q, k, v = q.reshape(n, heads, d), k.reshape(n, kv, d), v.reshape(n, kv, d)
        if f"{p}.qk_bias" in W:
            q, k = q + W[f"{p}.qk_bias"][0, 0], k + W[f"{p}.qk_bias"][1, 0]
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * d)
        return out @ W[f"{p}.proj.weight"].T

    def mlp(x, p):
        gate, up = (x @ W[f"{p}.fc.weight"].T).chunk(2, -1)
        return (F.silu(gate) * up) @ W[f"{p}.proj.weight"].T

    def block(x, p):
        if huginn:
            x = rms(attn(rms(x, W[f"{p}.norm_1.weight"]), f"{p}.attn") + x, W[f"{p}.norm_2.weight"])
            return rms(mlp(rms(x, W[f"{p}.norm_3.weight"]), f"{p}.mlp") + x, W[f"{p}.norm_4.weight"])
        x = x + attn(rms(x, W[f"{p}.norm_1.weight"]), f"{p}.attn")
        return x + mlp(rms(x, W[f"{p}.norm_2.weight"]), f"{p}.mlp")

    e = W["transformer.wte.weight"][ids] * cfg["init_values"]["embed_scale"]
    for i in range(cfg["n_layers_in_prelude"]):
        e = block(e, f"transformer.prelude.{i}")
    s = s0.double()
    for _ in range(steps):
        s = torch.cat([s, e], -1) @ W["transformer.adapter.weight"].T
        for i in range(cfg["n_layers_in_recurrent_block"]):
            s = block(s, f"transformer.core_block.{i}")
    x = rms(s, W["transformer.ln_f.weight"]) if huginn else s
    for i in range(cfg["n_layers_in_coda"]):
        x = block(x, f"transformer.coda.{i}")
    head = W["transformer.wte.weight"] if cfg["tie_embeddings"] else W["lm_head.weight"]
    return rms(x, W["transformer.ln_f.weight"]) @ head.T


def initial_state(cfg: dict, n: int, seed: int) -> torch.Tensor:
    """Truncated normal (+-3 std) with the config's init std, times its embed_scale."""
    std, scale = cfg["init_values"]["std"], cfg["init_values"]["embed_scale"]
    s0 = torch.empty(1, n, cfg["n_embd"])
    torch.nn.init.trunc_normal_(s0, 0.0, std, -3 * std, 3 * std, generator=torch.Generator().manual_seed(seed))
    return s0[0] * scale


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.fixture
def ids():
    return torch.randint(0, 300, (N,), generator=torch.Generator().manual_seed(11))


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


# -- loading against the reference ------------------------------------------------------------

def test_huginn_sharded_bf16_checkpoint_matches_reference_forward(tmp_path, ids):
    folder, cfg, state = published_huginn(tmp_path)
    model = load_checkpoint(str(folder), dtype=torch.float32)
    # bf16 weights upcast exactly; the duplicated head is the embedding
    assert torch.equal(model.transformer.wte.weight, state["transformer.wte.weight"].float())
    assert model.lm_head.weight is model.transformer.wte.weight
    got = model(ids[None], num_steps=T, generator=torch.Generator().manual_seed(5))[0]
    want = reference_logits(cfg, state, ids, initial_state(cfg, N, seed=5), T)
    assert rel_err(got, want) < 1e-4

    low = load_checkpoint(str(folder), dtype=torch.bfloat16)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low.transformer.core_block[1].attn.Wqkv.weight,
                       state["transformer.core_block.1.attn.Wqkv.weight"])
    got_bf16 = low(ids[None], num_steps=T, generator=torch.Generator().manual_seed(5))[0]
    assert rel_err(got_bf16, want) < 0.1


def test_recurrent_llama_checkpoint_matches_reference_forward(tmp_path, ids):
    folder, cfg, state = published_llama(tmp_path)
    model = load_checkpoint(str(folder))
    assert model.lm_head.weight is not model.transformer.wte.weight
    got = model(ids[None], num_steps=T, generator=torch.Generator().manual_seed(6))[0]
    want = reference_logits(cfg, state, ids, initial_state(cfg, N, seed=6), T)
    assert rel_err(got, want) < 1e-4
    # the reference is sensitive to what was mapped: without llama3 scaling it disagrees
    unscaled = reference_logits({**cfg, "rope_scaling": None}, state, ids, initial_state(cfg, N, seed=6), T)
    assert rel_err(unscaled, want) > 1e-3


def test_config_mapping_and_special_ids_per_family(tmp_path):
    hug = load_config(published_huginn(tmp_path)[0])
    assert (hug.block_style, hug.rope_style, hug.ln_f_after_recurrence, hug.tie_embeddings) == \
        ("sandwich", "interleaved", True, True)
    assert hug.embed_scale == hug.init_state_scale == math.sqrt(H) and hug.init_state_std == HUGINN_STD
    assert (hug.bos_token_id, hug.eos_token_id, hug.pad_token_id, hug.extra_eos_token_ids) == (300, 301, 305, (304,))

    lla = load_config(published_llama(tmp_path)[0])
    assert (lla.block_style, lla.rope_style, lla.ln_f_after_recurrence, lla.tie_embeddings, lla.qk_bias) == \
        ("prenorm", "half", False, False, False)
    assert lla.kv_heads == 2 and lla.rope_base == 10000.0  # rope_theta, not the copied rope_base
    assert lla.rope_scaling == {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position": 64}
    assert lla.embed_scale == lla.init_state_scale == 1.0 and lla.max_positions == 256
    # Huginn's ids copied into the config are ignored; the tokenizer's are used
    assert (lla.bos_token_id, lla.eos_token_id, lla.pad_token_id, lla.extra_eos_token_ids) == (300, 301, 301, (309,))


def _same_config(a: RecurrentConfig, b: RecurrentConfig, skip=("name",)) -> None:
    for field, value in a.__dict__.items():
        if field in skip:
            continue
        other = getattr(b, field)
        if isinstance(value, float):
            assert math.isclose(value, other, rel_tol=1e-5), field
        else:
            assert value == other, field


def test_full_size_published_configs_map_onto_the_presets():
    # Key names and values of the published huginn-0125 config.json (no tokenizer: published ids).
    huginn = huginn_config(n_embd=5280, n_heads=55, num_key_value_heads=55, head_dim=96,
                           intermediate_size=17920, n_layers=8, n_layers_in_prelude=2,
                           n_layers_in_recurrent_block=4, n_layers_in_coda=2, vocab_size=65536,
                           padded_vocab_size=65536, block_size=4096,
                           init_values={"std": HUGINN_STD, "out_proj": 0.0005356869554443541,
                                        "embedding": HUGINN_STD, "embed_scale": 72.6636084983398},
                           bos_token_id=65504, eos_token_id=65505, pad_token_id=65509)
    _same_config(config_from_raven(huginn), RecurrentConfig.from_name("huginn-0125"))
    # What the converter writes for Llama-3.2-1B with the (4, 6, 4) split.
    llama = llama_config(n_embd=2048, n_heads=32, num_key_value_heads=8, head_dim=64,
                         intermediate_size=8192, n_layers=16, n_layers_in_prelude=4,
                         n_layers_in_recurrent_block=6, n_layers_in_coda=4, vocab_size=128256,
                         padded_vocab_size=128256, rope_base=500000.0, rope_theta=500000.0,
                         rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                         max_position_embeddings=131072)
    mapped = config_from_raven(llama)
    _same_config(mapped, RecurrentConfig.from_name("recurrent-llama-3.2"), skip=("name", "extra_eos_token_ids"))
    assert mapped.extra_eos_token_ids == (128009,)  # <|eot_id|>


# -- errors that name the culprit -------------------------------------------------------------

@pytest.mark.parametrize("change, key", [
    ({"qk_norm": True}, "qk_norm"),  # OLMo-style retrofits: not implemented, so refused
    ({"injection_type": "add"}, "injection_type"),
    ({"head_dim": 32}, "head_dim"),
    ({"n_heads": None, "num_attention_heads": 4, "hidden_size": 64, "n_embd": 32}, "hidden_size"),
])
def test_config_key_errors_name_the_key(change, key):
    cfg = {k: v for k, v in huginn_config(**change).items() if v is not None}
    with pytest.raises(ConfigKeyError, match=key):
        config_from_raven(cfg)


def test_missing_config_key_is_named():
    cfg = huginn_config()
    del cfg["n_layers_in_coda"]
    with pytest.raises(ConfigKeyError, match="n_layers_in_coda"):
        config_from_raven(cfg)


def test_unknown_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'"):
        load_config(tmp_path)


def test_missing_or_misshaped_tensor_is_named(tmp_path):
    cfg = llama_config()
    state = random_state(cfg, seed=3)
    del state["transformer.core_block.1.mlp.proj.weight"]
    write_checkpoint(tmp_path / "missing", cfg, state)
    write_tokenizer(tmp_path / "missing", LLAMA_SPECIALS, "<|begin_of_text|>", "<|end_of_text|>", None)
    with pytest.raises(KeyError, match=r"transformer\.core_block\.1\.mlp\.proj\.weight"):
        load_checkpoint(str(tmp_path / "missing"))

    state = random_state(cfg, seed=3)
    state["transformer.coda.0.attn.Wqkv.weight"] = state["transformer.coda.0.attn.Wqkv.weight"][:-16]
    write_checkpoint(tmp_path / "misshaped", cfg, state)
    write_tokenizer(tmp_path / "misshaped", LLAMA_SPECIALS, "<|begin_of_text|>", "<|end_of_text|>", None)
    with pytest.raises(ValueError, match=r"transformer\.coda\.0\.attn\.Wqkv\.weight"):
        load_checkpoint(str(tmp_path / "misshaped"))


def test_sharded_index_listing_a_tensor_no_shard_holds_is_named(tmp_path):
    folder, _, _ = published_huginn(tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["transformer.core_block.0.norm_5.weight"] = "model-00001-of-00003.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(KeyError, match=r"transformer\.core_block\.0\.norm_5\.weight"):
        load_checkpoint(str(folder))


def test_huginn_rope_table_that_disagrees_with_the_config_is_refused(tmp_path):
    cfg = huginn_config()
    state = random_state({**cfg, "rope_base": 10000}, seed=1)  # freqs_cis of another base
    write_checkpoint(tmp_path / "h", cfg, state)
    write_tokenizer(tmp_path / "h", HUGINN_SPECIALS, "<|begin_text|>", "<|end_text|>", "<|pad|>")
    with pytest.raises(ValueError, match="freqs_cis"):
        load_checkpoint(str(tmp_path / "h"))


# -- prompt formats and the shipped tokenizer -------------------------------------------------

EXAMPLE = Example("hotpot-1", "hotpotqa", "Which city hosts  the fair? ",
                  (Passage("Fair", "The fair is held in Oslo."), Passage("Oslo", "Oslo is a city.", True)),
                  ("Oslo",))


def test_huginn_chat_prompt_is_the_published_template(tmp_path):
    import jinja2

    # {% generation %} is a transformers extension that only marks assistant text; drop it.
    source = HUGINN_CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    prompt = format_prompt(EXAMPLE, "huginn_chat")
    user = prompt.split("<|begin_header|>user<|end_header|>\n\n")[1].split("<|end_turn|>")[0]
    rendered = jinja2.Environment().from_string(source).render(
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": user}],
        bos_token="<|begin_text|>", add_generation_prompt=True)
    # the BOS token is prepended by id in the pipeline; "Answer:" prefills the open assistant turn
    assert "<|begin_text|>" + prompt == rendered + "Answer:"
    assert "Fair: The fair is held in Oslo." in user and user.endswith("Question: Which city hosts  the fair?")

    folder, _, _ = published_huginn(tmp_path)
    ids = load_tokenizer(folder).encode(prompt, add_special_tokens=False).ids
    assert ids.count(302) == 3 and ids.count(303) == 3 and ids.count(304) == 2  # specials stay single tokens


def test_llama_completion_prompt_is_fixed_plain_completion():
    prompt = format_prompt(EXAMPLE, "llama_completion")
    assert prompt.startswith("Answer the question based on the passages below.\n\nFair: The fair")
    assert prompt.endswith("Question: Which city hosts  the fair? \nAnswer:")
    no_context = format_prompt(EXAMPLE.with_passages(()), "llama_completion")
    assert no_context == "Answer the question.\n\nQuestion: Which city hosts  the fair? \nAnswer:"


# -- retrofit config keys, Huginn's embedding scale, damaged weights, pinned hub revisions -----

def test_retrofit_initial_state_mode_random_is_accepted_and_others_refused():
    # The retrofitting code's config class writes initial_state_mode into every checkpoint.
    llama3 = dict(vocab_size=128256, padded_vocab_size=128256)  # no tokenizer: published ids
    mapped = config_from_raven(llama_config(initial_state_mode="random", **llama3))
    assert mapped.init_state_std == HUGINN_STD and mapped.init_state_scale == 1.0
    with pytest.raises(ConfigKeyError, match=r"initial_state_mode: 'zero' is not supported"):
        config_from_raven(llama_config(initial_state_mode="zero", **llama3))


def test_huginn_embed_scale_follows_n_embd_and_a_disagreeing_config_is_refused(tmp_path):
    # Huginn's modeling code scales by sqrt(n_embd) and never reads init_values.embed_scale.
    write_tokenizer(tmp_path, HUGINN_SPECIALS, "<|begin_text|>", "<|end_text|>", "<|pad|>")
    hug = config_from_raven(huginn_config(), folder=tmp_path)
    assert hug.embed_scale == hug.init_state_scale == math.sqrt(H)
    init = {"std": HUGINN_STD, "out_proj": 0.0005, "embedding": HUGINN_STD, "embed_scale": 1.0}
    with pytest.raises(ConfigKeyError, match=r"init_values\.embed_scale: 1\.0 but .*sqrt\(n_embd\) = 8"):
        config_from_raven(huginn_config(init_values=init), folder=tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garble_header"])
def test_damaged_safetensors_names_the_file_and_model_source(tmp_path, damage):
    import shutil

    from wise.models.checkpoint import CorruptCheckpointError

    folder = tmp_path / "wise-tiny-random"
    shutil.copytree("data/models/wise-tiny-random", folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    # truncate: an interrupted copy (the header promises more bytes than the file holds)
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:8] + b"{x" + data[10:])
    with pytest.raises(CorruptCheckpointError) as err:
        load_checkpoint(str(folder))
    msg = str(err.value)
    assert str(weights) in msg and f"model.source = {str(folder)!r}" in msg


def test_hub_download_is_pinned_to_model_revision(monkeypatch, tmp_path):
    import huggingface_hub

    from wise.models.checkpoint import resolve_model_source

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **kw: calls.append((repo, kw)) or str(tmp_path))
    assert resolve_model_source("owner/model", revision="0123abc") == tmp_path
    assert calls[0][0] == "owner/model" and calls[0][1]["revision"] == "0123abc"
    with pytest.raises(ValueError, match="model.revision .* local folder"):
        resolve_model_source(str(tmp_path), revision="0123abc")
    with pytest.raises(ValueError, match="model.revision = 123: must be a string"):
        resolve_model_source("owner/model", revision=123)
