"""Published checkpoint families (Huginn-0125, retrofitted Recurrent-Llama-3.2) load into the
project's model: tiny random checkpoints in each family's published file layout
(published_checkpoints.py), checked against a straightforward forward pass written here from the
raw tensors (float64, plain torch ops, none of the project's modules); plus missing, misshaped and
damaged tensors named, and hub downloads pinned to a revision.

Facts the reference forward encodes, and where they come from:
- Huginn modeling: sandwich block, qk_bias added before RoPE, RoPE on (x[2i], x[2i+1]) pairs,
  ln_f after the recurrence and before the head, state std * embed_scale.
- retrofitted modeling: pre-norm block with norm_1/norm_2, transformers' rotate-half RoPE with
  llama3 scaling, GQA, no ln_f after the recurrence, untied head.
The reference forward passes share no code with the model they check, so they live here and not in
a helper of the project's.
"""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from wise.models import load_checkpoint

from published_checkpoints import (HUGINN_SPECIALS, LLAMA_SPECIALS, N, T, huginn_config, llama_config,
                                   published_huginn, published_llama, random_state, write_checkpoint,
                                   write_tokenizer)


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


# -- tensors, damaged weights and hub revisions: errors that name the culprit -------------------

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
