"""Published checkpoint configs (Huginn-0125, retrofitted Recurrent-Llama-3.2) map onto the
project's RecurrentConfig: per-family block, RoPE and special-id choices, the full-size published
configs onto the presets, the retrofit's initial_state_mode and Huginn's embedding scale; and a
config key the model cannot honour is refused with an error that names it.
"""
import json
import math

import pytest

from wise.models import RecurrentConfig
from wise.models.checkpoint import load_config
from wise.models.hf_configs import ConfigKeyError, config_from_raven

from published_checkpoints import (H, HUGINN_SPECIALS, HUGINN_STD, huginn_config, llama_config, published_huginn,
                                   published_llama, write_tokenizer)


# -- mapping per family and onto the presets ----------------------------------------------------

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


# -- retrofit config keys, Huginn's embedding scale ---------------------------------------------

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
