"""The recurrent backbone: shapes, both block styles, GQA, RoPE styles, checkpoint round trip and
strict loading errors that name the tensor."""
import json

import pytest
import torch

from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights, load_checkpoint, save_checkpoint
from wise.models.recurrent import Rotary


def tiny(**changes) -> RecurrentDepthModel:
    cfg = RecurrentConfig.from_name("tiny-random").replace(**changes)
    return init_weights(RecurrentDepthModel(cfg), seed=0).eval()


def test_forward_shapes_and_seeded_state_is_reproducible():
    model = tiny()
    ids = torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(1))
    a = model(ids, num_steps=4, generator=torch.Generator().manual_seed(7))
    b = model(ids, num_steps=4, generator=torch.Generator().manual_seed(7))
    c = model(ids, num_steps=4, generator=torch.Generator().manual_seed(8))
    assert a.shape == (2, 40, 2048)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_prenorm_gqa_half_rope_with_llama3_scaling_runs_and_is_causal():
    model = tiny(block_style="prenorm", heads=4, kv_heads=2, rope_style="half", qk_bias=False,
                 tie_embeddings=False, ln_f_after_recurrence=False,
                 rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position": 64})
    ids = torch.randint(0, 2048, (1, 30), generator=torch.Generator().manual_seed(2))
    full = model(ids, num_steps=3, generator=torch.Generator().manual_seed(0))
    # Changing a later token must not change earlier logits (causality through every step).
    ids2 = ids.clone()
    ids2[0, 20] = (ids2[0, 20] + 1) % 2048
    # the initial state is drawn for the whole sequence shape; same generator -> same s0
    other = model(ids2, num_steps=3, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(full[0, :20], other[0, :20], atol=1e-5)
    assert not torch.allclose(full[0, 20:], other[0, 20:])


def test_rotary_tables_are_cached_per_device_and_equal_fresh_ones():
    model = tiny(max_positions=4096, rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position": 64})
    for n in (5, 700, 40, 2000, 4096, 1):
        cached = model.rotary(n)
        fresh = Rotary(model.config, n, torch.device("cpu"))
        assert torch.equal(cached.cos, fresh.cos) and torch.equal(cached.sin, fresh.sin), n
        assert cached.cos.is_contiguous() and cached.style == fresh.style
    # later calls slice the kept tables: no new tables (and no host-to-GPU copy on CUDA)
    assert model.rotary(300).cos.data_ptr() == model.rotary(4000).cos.data_ptr()
    with pytest.raises(ValueError, match="exceeds the model's 4096 positions"):
        model.rotary(4097)


def test_rope_styles_rotate_different_pairs():
    cfg = RecurrentConfig.from_name("tiny-random")
    x = torch.randn(1, 5, 2, cfg.head_dim, generator=torch.Generator().manual_seed(0))
    inter = Rotary(cfg, 5, torch.device("cpu")).apply(x)
    half = Rotary(cfg.replace(rope_style="half"), 5, torch.device("cpu")).apply(x)
    # position 0 is the identity for both; norms are preserved; the pairing differs
    assert torch.allclose(inter[:, 0], x[:, 0]) and torch.allclose(half[:, 0], x[:, 0])
    assert torch.allclose(inter.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(inter[:, 3], half[:, 3])
    # interleaved: the pair (x0, x1) at position p rotates by angle p * inv_freq[0] = p
    p = 3
    c, s = torch.cos(torch.tensor(float(p))), torch.sin(torch.tensor(float(p)))
    x0, x1 = x[0, p, 0, 0], x[0, p, 0, 1]
    assert torch.allclose(inter[0, p, 0, 0], x0 * c - x1 * s, atol=1e-5)
    assert torch.allclose(inter[0, p, 0, 1], x0 * s + x1 * c, atol=1e-5)


def test_checkpoint_round_trip_uses_published_names(tmp_path):
    model = tiny()
    save_checkpoint(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "wise_recurrent" and cfg["hidden"] == 64
    names = set(model.state_dict())
    for expected in ("transformer.wte.weight", "transformer.prelude.0.attn.Wqkv.weight",
                     "transformer.core_block.1.attn.qk_bias", "transformer.core_block.0.norm_4.weight",
                     "transformer.coda.0.mlp.fc.weight", "transformer.adapter.weight",
                     "transformer.ln_f.weight"):
        assert expected in names
    loaded = load_checkpoint(str(tmp_path))
    ids = torch.arange(20)[None]
    g = lambda: torch.Generator().manual_seed(3)
    assert torch.equal(loaded(ids, 3, generator=g()), model(ids, 3, generator=g()))
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # tied


def test_missing_or_misshaped_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    save_checkpoint(tiny(), tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    broken = dict(state)
    del broken["transformer.core_block.1.mlp.proj.weight"]
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="transformer.core_block.1.mlp.proj.weight"):
        load_checkpoint(str(tmp_path))
    broken = dict(state)
    broken["transformer.adapter.weight"] = torch.zeros(3, 3)
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="transformer.adapter.weight"):
        load_checkpoint(str(tmp_path))


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="bogus_key"):
        RecurrentConfig.from_dict({"bogus_key": 1})
    with pytest.raises(ValueError, match="heads"):
        RecurrentConfig(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="unknown model preset"):
        RecurrentConfig.from_name("nope")


def test_sequence_longer_than_positions_is_rejected():
    model = tiny(max_positions=16)
    with pytest.raises(ValueError, match="exceeds the model's 16 positions"):
        model(torch.zeros(1, 17, dtype=torch.long), num_steps=1)
