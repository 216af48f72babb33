"""Write a seeded random-init checkpoint with the project's tokenizer beside it.

    python -m wise.models.make_random --preset tiny-random --seed 0 --out data/models/wise-tiny-random

Used for the walking-skeleton default and for tests; the trained embedded model replaces it as
the default once it exists. The tokenizer is trained on the generated benchmarks' train split.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from wise.data.corpus import corpus_for_tokenizer
from wise.data.tokenizer import save_tokenizer, train_tokenizer
from wise.models.checkpoint import save_checkpoint
from wise.models.config import RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel, init_weights


def make_random_checkpoint(out: str | Path, preset: str = "tiny-random", seed: int = 0,
                           tokenizer_seed: int = 0, tokenizer_examples: int = 400) -> Path:
    config = RecurrentConfig.from_name(preset)
    tok = train_tokenizer(corpus_for_tokenizer(tokenizer_seed, tokenizer_examples),
                          vocab_size=config.vocab_size)
    if tok.get_vocab_size() > config.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, model only {config.vocab_size}")
    model = init_weights(RecurrentDepthModel(config), seed)
    out = save_checkpoint(model, out, metadata={"seed": str(seed), "preset": preset})
    save_tokenizer(tok, out)
    card = (f"# {out.name}\n\nSeeded random-init `{preset}` weights (seed {seed}) with the project's "
            f"byte-level BPE tokenizer ({tok.get_vocab_size()} tokens, trained on {tokenizer_examples} "
            f"train-split examples per generated benchmark, seed {tokenizer_seed}).\n\n"
            "Random weights do not route attention meaningfully: this checkpoint exercises every code "
            "path of the pipeline, it does not answer questions.\n\nReproduce with:\n\n"
            f"    python -m wise.models.make_random --preset {preset} --seed {seed} "
            f"--tokenizer-seed {tokenizer_seed} --out {out}\n")
    (out / "README.md").write_text(card)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-seed", type=int, default=0)
    ap.add_argument("--tokenizer-examples", type=int, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    path = make_random_checkpoint(args.out, args.preset, args.seed, args.tokenizer_seed,
                                  args.tokenizer_examples)
    print(json.dumps({"checkpoint": str(path)}))


if __name__ == "__main__":
    main()
