"""The exit_criteria stage's table on a GPU machine without Ray or DVC: every exit criterion of
params.yaml beside its fixed depths, under each condition, on a cohort file's prompts of one length,
on the calibration model, with the construction's expected EM and steps per token beside the
measured ones, per late-attention backend.

    python -m scripts.exit_criteria_gpu --cohort data/cohorts/examples.parquet \
        --context 512 --backends kernel reference --out exits_gpu.parquet

It calls the stage's own pieces (``pipelines.exit_criteria.runs_of`` / ``exit_row``) in process and
scores EM as the stage does. Exit status 1 when any measured value differs from its expectation.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

from pipelines.exit_criteria import exit_row, format_table, runs_of
from wise.analysis.calibration import parse_layout
from wise.analysis.calibration_exits import expected_exits
from wise.analysis.metrics import exact_match
from wise.data.synthchain import build_tokenizer
from wise.engine.decoding import evaluate_examples
from wise.engine.exit_criteria import ExitCriterion
from wise.engine.runner import WiseSettings, state_seed
from wise.models.construct import build_chain_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohort", default="data/cohorts/examples.parquet")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--backends", nargs="+", default=["kernel", "reference"])
    ap.add_argument("--out", default="exits_gpu.parquet")
    args = ap.parse_args(argv)
    raw = yaml.safe_load(open(args.params))
    x, w, T = raw["exit_criteria"], raw["wise"], raw["recurrence"]["steps"]
    tok = build_tokenizer()
    rows = [r for r in pq.read_table(args.cohort).to_pylist()
            if r["context_length"] == args.context and r["benchmark"] == "synthchain"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_chain_model()[0].to(device)
    layouts = [parse_layout([tok.id_to_token(i) for i in r["token_ids"]]) for r in rows]
    examples = [(r["token_ids"], r["answer_ids"], state_seed(r["example_id"], raw["recurrence"]["init_seed"]))
                for r in rows]
    out, ok = [], True
    for backend in args.backends:
        base = WiseSettings(steps=T, discovery_step=w["discovery_step"], window=w["window"],
                            block_size=w["block_size"], eta=w["eta"], backend=backend)
        table = []
        for run in runs_of(base, [ExitCriterion(**c) for c in x["criteria"]], list(x["depths"])):
            s = run[3]
            for condition in x["conditions"]:
                start = time.perf_counter()
                got = evaluate_examples(model, examples, [condition], s, raw["conditions"]["max_new_tokens"], {1})
                secs = time.perf_counter() - start
                measured = [(exact_match(tok.decode(g[condition].tokens).strip(), r["answers"], r["benchmark"]) == 1.0,
                             g[condition].tokens, g[condition].token_steps) for r, g in zip(rows, got)]
                want = [expected_exits(lay, condition, s, s.exit_criterion) for lay in layouts]
                row = exit_row(run, condition, measured, [(e.token_steps, e.correct) for e in want])
                table.append(row)
                ok &= row.em == row.expected_em and (row.expected_steps is None or row.mean_steps == row.expected_steps)
                out.append({**dataclasses.asdict(row), "backend": backend, "device": device,
                            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                            "context_length": args.context, "seconds": round(secs, 3)})
        print(f"backend {backend} ({device}), {len(rows)} prompts of {args.context} tokens:\n{format_table(table)}\n",
              flush=True)
    pq.write_table(pa.Table.from_pylist(out), args.out)
    print("every value as expected" if ok else "MISMATCH: a measured value differs from its expectation")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
