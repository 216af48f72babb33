"""The angular-distance block probe on constructed bases whose answer is known: layers made exact
identities (zero attention and MLP output projections) change nothing, so a block of them has
distance 0 and must be chosen, unless the prefix/suffix constraints exclude it."""
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from wise.models.looped.base import build_base
from wise.looped.probe import angular_distance, block_distances, choose_block

FIELDS = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 128,
          "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


def base_with_identities(identity_layers, family="qwen3", **changes):
    base = build_base(family, 0, **{**FIELDS, **changes}).eval()
    with torch.no_grad():
        for i in identity_layers:
            base.model.layers[i].self_attn.o_proj.weight.zero_()
            base.model.layers[i].mlp.down_proj.weight.zero_()
    return base


def batches():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (3, 17), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 12:] = False  # a right-padded row: its pads are not counted
    return [(ids, mask), (ids[:2, :9], mask[:2, :9])]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_probe_picks_the_block_of_identity_layers(family):
    rows = block_distances(base_with_identities([2, 3], family), batches(), block_layers=2)
    assert [r["start"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["eligible"] for r in rows] == [False, True, True, True, False]
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["start"] == 2 and chosen[0]["end"] == 3
    assert chosen[0]["mean_angular_distance"] == pytest.approx(0.0, abs=1e-4)
    assert min(r["mean_angular_distance"] for r in rows if r["start"] != 2) > 0.01
    assert rows[0]["n_tokens"] == 3 * 16 - 5 + 2 * 8  # real tokens, first of each row left out


def test_probe_respects_the_prefix_and_suffix_it_must_leave():
    base = base_with_identities([0, 1])
    rows = block_distances(base, batches(), block_layers=2, min_prefix=1)
    assert choose_block(rows) != 0 and not rows[0]["eligible"]
    rows = block_distances(base, batches(), block_layers=2, min_prefix=0)
    assert choose_block(rows) == 0
    with pytest.raises(ValueError, match="does not fit"):
        block_distances(base, batches(), block_layers=5)


def test_angular_distance():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0]])
    assert torch.allclose(angular_distance(x, y), torch.tensor([0.0, 0.5, 1.0]), atol=1e-6)


def test_probe_cli_writes_its_table(tmp_path):
    base = base_with_identities([3], vocab_size=2048, max_position_embeddings=256)  # the tokenizer's ids
    base.save_pretrained(tmp_path / "base")
    import shutil

    shutil.copyfile("data/models/wise-tiny-random/tokenizer.json", tmp_path / "base" / "tokenizer.json")
    out = tmp_path / "probe.parquet"
    proc = subprocess.run([sys.executable, "-m", "wise.looped.probe", "--base", str(tmp_path / "base"),
                           "--layers", "1", "--benchmarks", "syntharith", "--n", "2", "--context", "128",
                           "--device", "cpu", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "chosen block: layers 3-3" in proc.stdout
    table = pq.read_table(out).to_pylist()
    assert [r["start"] for r in table if r["chosen"]] == [3]
