"""The wise-chain checkpoint folder: weights, tokenizer, construction record and model card.

    python -m wise.models.chain_card data/models/wise-chain     # what the build_calibration stage runs

The folder is written under a temporary name and renamed into place, so a reader never sees a half
checkpoint. Everything in the card is either fixed by the construction or read from
``construction.json`` beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from wise.data import synthchain as sc
from wise.data.tokenizer import save_tokenizer
from wise.models.checkpoint import save_checkpoint
from wise.models.construct import (CONST, DECOY, MATCH_LOGIT, NAME, NEED_SPLIT, NOISE_DIMS, NOISE_STEP, RENORM_SPLIT,
                                   ROPE_BASE, SINK_LOGIT, ChainSpec, build_chain_model)

RECORD_NAME = "construction.json"


def write_chain_checkpoint(folder: str | os.PathLike, spec: ChainSpec = ChainSpec()) -> Path:
    folder = Path(folder)
    model, facts = build_chain_model(spec)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(model, tmp)  # one metadata key: safetensors orders several at random
    save_tokenizer(sc.build_tokenizer(), tmp, max_length=spec.max_positions)
    record = {"constructed": True, "trained": False, "spec": dataclasses.asdict(spec), **facts,
              "parameters": sum(p.numel() for p in model.parameters()),
              "hidden": model.config.hidden, "intermediate": model.config.intermediate}
    (tmp / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    (tmp / "README.md").write_text(card_text(record))
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def card_text(record: dict) -> str:
    spec = record["spec"]
    D = 2 * spec["code_pairs"]
    return f"""---
license: apache-2.0
tags: [recurrent-depth, calibration, constructed]
---
# {NAME}: a constructed (not trained) recurrent-depth model with known routing

**These weights were computed, not learned.** `wise.models.construct` writes every tensor from a
small config (`{RECORD_NAME}`: seed {spec['seed']}, {spec['code_pairs']} code frequencies,
refinement counts up to {spec['max_refine']}) and the vocabulary and successor map of the
`synthchain` benchmark. The `build_calibration` DVC stage rebuilds this folder in about a second.
It exists so that every number of the default WISE run has an expected value: its attention goes
exactly where the construction says, so a broken method shows up as a wrong number.

Architecture (the project's own `RecurrentDepthModel`, `config.json`): {record['parameters']:,}
parameters, hidden {record['hidden']}, two attention heads of 64 per layer, pre-norm blocks, RoPE
base {ROPE_BASE:g}; 3 prelude layers, 2 recurrent core layers (intermediate {record['intermediate']}),
no coda. It runs in float32 only: in float16 the state check's gate weights (400 / {NOISE_STEP} per
unit) overflow, and the split heads' shares need float32's precision at the η boundaries.

## What it computes on synthchain

A prompt lists facts `x: -> y .` (a chain's end `z: => z .`) and asks `Question: s +m ?`; the answer
is the end z of s's chain (L hops) advanced m times by the benchmark's successor map. The default
run asks `Question: s +m ??`: two tokens, that answer a1 and then the end a2 of a1's own chain (L2
hops), which the row holding a1 after the prompt chases itself.

- **Prelude** (once): a RoPE offset-1 head and an offset-3 head give each fact's target row its
  source (key), its own entity (value) and whether the arrow was `=>`; a third head lets the question
  rows (`+m`, `?`, `Answer`, `:`) fetch s and m from the `+m` row.
- **Each core step, layer 0 head 0**: a question row's query is its pointer p. A key matching p scores
  {MATCH_LOGIT:g} logits, a sink (the `->`/`=>`/`.` rows and BOS) {SINK_LOGIT:g}, everything else far
  less, so at hop t the question rows put more than 0.999 of their mass on the fact of hop t. The MLP
  of layer 0 moves p to the attended target; at the terminal fact p stays and, while the count m is
  not used up, layer 1's MLP advances the answer register by the successor map (a rotation of the
  entity code) and decrements the count. A row without a pointer attends BOS; a chasing row whose
  next fact is not visible reads a sink and changes nothing.
- **Layer 1 head 1**: the first answer row (a1, three rows after `??`) chases a1's chain the same
  way with its own pointer, through the appended rows' caches and late support when decoding.
- **Layer 1 head 0, layer 0 head 1**: each question row splits its mass between BOS and the `+m`
  row, {NEED_SPLIT:g} : 1 and {RENORM_SPLIT:g} : 1 (attention that is not one-hot); at step 1 only, the first
  head also gives the fact of the first hop {DECOY:g} times the `+m` row's share. Every other row
  attends BOS. A refinement needs what both read: the `+m` row's value in layer 1 head 0 (a support
  that drops its block stops refining) and, in layer 0 head 1, weights that sum to 1 (Freeze-A's
  frozen weights must be renormalised inside the support). Head 1 of layer 0 also carries BOS's
  initial state to the rows that do not chase, and a row whose initial state equals BOS's (a
  decoder that gives a new token row 0's initial state) stops its chase after one hop; rows with
  their own states (each row's is seeded by its position) differ from BOS's by more than
  {NOISE_STEP} in some of {NOISE_DIMS} dims (all closer: ~1e-12).
- **Readout**: entity logits are 100 × code(e) · (r + the first answer row's pointer); the row after
  the answer (three after `?`, or after `Answer` for `??`) emits EOS.

Entity codes: entity e at position i of the successor cycle has the {D}-dim code
[cos(2π f_k i / {sc.N_ENTITIES}), sin(2π f_k i / {sc.N_ENTITIES})]_k / √{spec['code_pairs']} with
frequencies f = {record['frequencies']} (the best of {spec['frequency_trials']} seeded draws; largest
correlation between two codes {record['max_code_correlation']:.3f}), so the successor is the rotation
by 2π f_k / {sc.N_ENTITIES} in each pair. The residual stream carries a constant {CONST:g} that
dominates its RMS, so every RMSNorm is the identity to ~1e-8 and its scale is bit-stable.

## Expected behaviour, derived (asserted by `tests/test_calibration.py`)

With Full attention, after T steps the first answer token is right exactly when **T ≥ L + m**
(for the default distribution, L uniform on 1..16 and m on 0..8: 0.25 at T=8, 0.50 at T=12, 1.0
from T=24) and the second when T ≥ L2 (its row runs T steps of its own). The
question rows' attention moves every step up to L + 1 and is constant after (routing settles); the
state moves up to step L + max(m, 1) (representations settle later, by m). With T=32, t_d=12, w=4,
B=32, η=0.95, per question (`wise.analysis.calibration.expected_outcome`, which re-derives each support from
the block-level definitions):

- the answer row's query block attends, at each step, the BOS block (its rows without a pointer) and
  the block of the current fact; a mass support at η < 0.999 keeps exactly those blocks;
- in layer 1 head 0 that query block (r rows, the four question rows among them) puts 2 / r of its
  mass on the `+m` row's block after step 1, so a mass support keeps that block iff 1 − 2/r < η
  (at η = 0.9: r < 20; at 0.92: r < 25; from 0.9375 always), and only then do late steps refine.
  At step 1
  the first hop's fact outranks it there, so the supports cut from step 1 (Static-95, MassMatched at
  the WISE row's step-1 mass, SizeMatched at its size) keep that fact's block before the `+m` row's;
- **Truncate@t_d**: right iff L + m ≤ t_d (and L2 ≤ t_d: a new token's row runs t_d steps);
- **WISE** keeps the fact blocks of steps t_d−w+1..t_d: right iff every fact a late step needs lies
  in one of them. A question with L + m ≤ t_d needs none; with L + 1 ≤ t_d it needs only the
  terminal fact, attended from step L + 1 and so in the working set: right, including when its
  refinement runs past t_d (which Truncate loses) if the `+m` row's block is kept (above). \
With L ≥ t_d (and L + m > t_d) it needs facts first
  attended after t_d: lost, unless they happen to share a block with the working set;
- **Static-95, MassMatched, SizeMatched** keep the step-1 blocks (the first hop's fact): right iff
  L + m ≤ t_d, or the facts still needed happen to share those blocks (more often at short contexts,
  where a block holds a larger share of the facts);
- **Freeze-A** re-reads the fact attended at step t_d: equal to WISE when L + 1 ≤ t_d (it keeps
  refining at the terminal, under the same `+m` condition), and right for L ≥ t_d only when
  L = t_d and m = 0;
- **the second token** (two-token questions) follows the same rules on its own row through layer 1
  head 1: its late support is its own one-row support (one-hot masses: the fact blocks of its own
  discovery steps) unioned with its block's row of the prompt's support in that head (BOS only);
  the answer is right iff both tokens are;
- **mechanism at the question rows** (the question text through the end of the prompt):
  τ_S = L + 2, τ_A = τ_O = L + 2, τ_H = L + max(m, 1) + 1 (the first transition of three that meet the
  criterion), so the representation lag τ_H − τ_S = max(m, 1) − 1 and the design's gap
  G = min(τ_H, τ_O) − max(τ_S, τ_A) is 0 (the attention output is the attended fact's value, which
  settles with the routing). A relative criterion (A, H, O) is censored (T + 1) when at most one of
  its first four transitions moves: L = 1 for A and O, L + max(m, 1) ≤ 2 for H.

The pipeline's report prints these expectations beside the measured numbers.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wise.models.chain_card", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    for f in dataclasses.fields(ChainSpec):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = parser.parse_args(argv)
    spec = ChainSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ChainSpec)})
    path = write_chain_checkpoint(args.folder, spec)
    print(f"wrote {path} (constructed {NAME}, {spec})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
