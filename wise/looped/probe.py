"""Block choice: the angular-distance probe.

For every candidate block of k consecutive layers s..s+k-1, the mean angular distance
arccos(cos(x_s, x_{s+k})) / pi between the hidden state entering layer s and the one leaving
layer s+k-1, over the tokens of a calibration set (the first token of each row is left out: it is
the attention sink, whose state is an outlier in most decoders). The block is the eligible
candidate with the smallest distance (representations change least there, so looping it
perturbs the rest of the network least); eligible blocks leave at least `min_prefix` layers before
and `min_suffix` after.

    python -m wise.looped.probe --base data/models/recurtrace-base --layers 2 --out probe.parquet
"""
from __future__ import annotations

import argparse
import collections
import math
import sys
from typing import Iterable, Sequence

import torch

from wise.models.looped.base import apply_layer, decoder_parts, positions


def angular_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[..., h] x [..., h] -> [...] in [0, 1]."""
    cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


@torch.no_grad()
def block_distances(base, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], block_layers: int,
                    min_prefix: int = 1, min_suffix: int = 1) -> list[dict]:
    """One row per candidate block: start, end (inclusive), mean_angular_distance, n_tokens,
    eligible, chosen. `batches` yields (ids [b, n], mask [b, n] bool of real tokens)."""
    parts = decoder_parts(base)
    L, k = len(parts.layers), block_layers
    if not 1 <= k <= L - min_prefix - min_suffix:
        raise ValueError(f"a block of {k} layers with {min_prefix} before and {min_suffix} after does not "
                         f"fit a base of {L} layers")
    device, dtype = parts.lm_head.weight.device, parts.lm_head.weight.dtype
    sums = torch.zeros(L - k + 1, dtype=torch.float64)
    tokens = 0
    for ids, mask in batches:
        ids, valid = ids.to(device), mask.to(device).clone()
        valid[:, 0] = False
        pos = positions(parts, ids.shape[1], device, dtype)
        h = parts.embed(ids)
        recent = collections.deque([h], maxlen=k + 1)  # states entering layers i-k..i
        for i, layer in enumerate(parts.layers):
            h = apply_layer(layer, h, pos)
            recent.append(h)
            if i + 1 >= k:  # the block (i+1-k)..i is complete
                sums[i + 1 - k] += float(angular_distance(recent[0], recent[-1])[valid].double().sum())
        tokens += int(valid.sum())
    if tokens == 0:
        raise ValueError("the calibration set has no tokens to probe (every row is one token long)")
    rows = [{"start": s, "end": s + k - 1, "layers": k, "mean_angular_distance": float(sums[s]) / tokens,
             "n_tokens": tokens, "eligible": min_prefix <= s and s + k <= L - min_suffix}
            for s in range(L - k + 1)]
    best = choose_block(rows)
    for r in rows:
        r["chosen"] = r["start"] == best
    return rows


def choose_block(rows: Sequence[dict]) -> int:
    """Start of the eligible block with the smallest distance (ties: the earlier block)."""
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        raise ValueError("no eligible block")
    return min(eligible, key=lambda r: (r["mean_angular_distance"], r["start"]))["start"]


def calibration_batches(tok, special, benchmarks: Sequence[str], n: int, context: int, seed: int,
                        batch_rows: int = 8, split: str = "validation", sources: dict | None = None):
    """(ids, mask) batches of benchmark prompts (validation split: never a test world)."""
    from wise.looped.data import prompt_rows

    rows = [r for b in benchmarks
            for r in prompt_rows(tok, special, b, split, n, seed, context, (sources or {}).get(b))]
    if not rows:
        raise ValueError(f"no calibration prompt of {list(benchmarks)} fits {context} tokens")
    for i in range(0, len(rows), batch_rows):
        chunk = [list(r.prompt_ids) for r in rows[i:i + batch_rows]]
        width = max(map(len, chunk))
        ids = torch.full((len(chunk), width), special.pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.bool)
        for j, seq in enumerate(chunk):
            ids[j, :len(seq)] = torch.tensor(seq)
            mask[j, :len(seq)] = True
        yield ids, mask


def probe_base(base, tokenizer_path, block_layers: int, benchmarks: Sequence[str], n: int, context: int,
               seed: int, min_prefix: int = 1, min_suffix: int = 1, sources: dict | None = None) -> list[dict]:
    """The probe table of a loaded base on generated-benchmark prompts, tokenized for it."""
    from wise.data.tokenizer import load_tokenizer
    from wise.models.looped.base import base_facts
    from wise.looped.data import SpecialIds, check_vocab

    tok = load_tokenizer(tokenizer_path)
    check_vocab(tok, base.config.vocab_size, str(tokenizer_path))
    special = SpecialIds.of(base_facts(base.config))
    batches = calibration_batches(tok, special, benchmarks, n, context, seed, sources=sources)
    return block_distances(base, batches, block_layers, min_prefix, min_suffix)


def format_table(rows: Sequence[dict]) -> str:
    lines = ["| block | mean angular distance | eligible | chosen |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['start']}-{r['end']} | {r['mean_angular_distance']:.4f} | {r['eligible']} | "
              f"{'<-' if r['chosen'] else ''} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    from wise.models.looped.base import load_base, resolve_base
    from wise.looped.table_writers import write_parquet

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="hub id or local folder of a Qwen3 / Llama decoder")
    ap.add_argument("--layers", type=int, required=True, help="k, the block size")
    ap.add_argument("--benchmarks", nargs="+", default=["syntharith", "synthhop"])
    ap.add_argument("--n", type=int, default=32, help="calibration prompts per benchmark")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-prefix", type=int, default=1)
    ap.add_argument("--min-suffix", type=int, default=1)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the base folder's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--out", default=None, help="write the table as Parquet here")
    args = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    folder = resolve_base(args.base)
    base = load_base(folder, dtype=getattr(torch, args.dtype), device=device)
    rows = probe_base(base, args.tokenizer or folder / "tokenizer.json", args.layers, args.benchmarks,
                      args.n, args.context, args.seed, args.min_prefix, args.min_suffix)
    print(format_table(rows))
    chosen = next(r for r in rows if r["chosen"])
    print(f"chosen block: layers {chosen['start']}-{chosen['end']} "
          f"(mean angular distance {chosen['mean_angular_distance']:.4f}, {chosen['n_tokens']} tokens)")
    if args.out:
        write_parquet(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
