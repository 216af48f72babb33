#!/usr/bin/env bash
# The real retrofits (LMA, plain, the same-budget T = 1 baseline t1) trained on one GPU machine
# that has no registry, no DVC and no corpus text: the GGUF of SmolLM2-135M-Instruct, the gguf wheel,
# the train split's token-id export and the held-out evaluation windows travel in chunks that fit
# beside the working tree (64 MiB a call), are put together under /tmp/wise-real (kept while the
# machine stays warm), and each `train` call trains one variant and scores NLL vs loops of it and
# of the base (scripts/real_train_gpu.py); `eval` runs stage real_eval (NLL and hop-item
# accuracy vs loops, the halting table) on the committed checkpoints. Every command prints what it did.
#
#   here:       scripts/real_model_gpu.sh pack            # -> .real-gpu/call-NN/ + .real-gpu/plan.txt
#               (BASE_ONLY=1: the GGUF and the wheel alone, all that real_wise_gpu.sh's study needs of them)
#   device:     scripts/real_model_gpu.sh receive         # carry .real-gpu/call-NN, one call each
#   device:     scripts/real_model_gpu.sh train lma       # then plain, then t1 (they match lma)
#   here:       python -m scripts.real_train_gpu table <files>/nll_*.parquet
#
# The evaluation on the H200 (<= 5 minutes; the retrofits are committed under data/models/):
#   here:       scripts/real_model_gpu.sh pack            # (needs data/real/ from dvc repro real_corpus)
#   device:     scripts/real_model_gpu.sh receive         # once per .real-gpu/call-NN (carry it)
#   device:     PARAMS=params/real-model-gpu.yaml scripts/real_model_gpu.sh eval
#   here:       tar -xzf $OUT/real_eval.tar.gz -C benchmarks/results/real-h200/<dated folder>/ (loops, curves,
#               halting, halting_examples parquet, real_model.{md,json}, nll_vs_loops.png, real_eval.log and
#               checkpoints.txt; the journal cites them)
# `eval` needs python with torch, transformers, pyarrow, pyyaml, numpy, scipy and matplotlib (checked
# first, one line if one is missing); no ray, dvc or duckdb. It puts the carried corpus files
# (corpus.parquet, corpus_manifest.json, tokens_test.npy: what real_eval reads) under data/real/ and the
# converted base at data/models/smollm2-135m-instruct of the device's copy of the tree, runs
# `python -m stages.real_eval --params $PARAMS` and writes the outputs, real_eval.log and nvidia-smi's
# line under $OUT. Run on an H200 without ray, dvc or duckdb (journal 2026-12-04 (d)).
#
# `receive` and `train` first take in whatever .real-gpu/call-NN folder the call carried; the base is
# converted as soon as the GGUF and the wheel are complete. `train VARIANT` writes $OUT/<name>-VARIANT.tar
# (the checkpoint: `tar -xf` it into data/models/ and `dvc commit train_real_retrofit@VARIANT`),
# $OUT/nll_VARIANT.parquet, $OUT/train_VARIANT.log, train_summary_VARIANT.json and a line of
# checkpoints.txt (the retrofit's sha256sum; `eval` writes one too: the report labels a study that ran on
# other retrofits than the committed ones, pipelines/real/gpu_study.py); plain and t1 take LMA's block and step count
# from /tmp/wise-real/lma_summary.json (or MATCH=<train_summary.json>, which LMA takes too) so all three
# see the same tokens and steps; `eval` runs on the variants this machine trained where it kept them. Training keys: params.yaml's real_model (PARAMS=... to change); DEPTHS="1 2 4"
# narrows the loop counts scored (default 1 2 3 4 6 8 12 16 32); EVAL_WINDOWS (default 64) held-out
# windows of train_window_tokens from the test split, evenly spaced, none overlapping.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
params=${PARAMS:-params.yaml}
work=${WORK:-/tmp/wise-real}
name=smollm2-135m
base="$work/$name-instruct"
source scripts/carry.sh  # carry_pack, carry_receive: the chunked transfer both GPU scripts share

pack() {  # here: the files the device needs, in chunks that fit one call each beside the tree
  local out=.real-gpu gguf  # ignored (.gitignore): it travels only when a call carries it
  carry_check 4
  rm -rf "$out" && mkdir -p "$out/files"
  gguf=$($py -c "from wise.model_files.packaged_gguf import PACKAGED, locate; print(locate(PACKAGED['smollm2-135m-instruct']))")
  cp "$gguf" "$out/files/model.gguf"
  cp "${WHEEL:-.whl/gguf-0.19.0-py3-none-any.whl}" "$out/files/"
  if [ "${BASE_ONLY:-0}" = 1 ]; then  # what real_wise_gpu.sh needs of these: the base (it packs its own text)
    carry_pack "$out" 4 "carry one folder per device call (receive); BASE_ONLY=1: the base alone:"
    return
  fi
  $py -m scripts.real_train_gpu export --split train --params "$params" --out "$out/files/tokens_train.npy"
  $py -m scripts.real_train_gpu windows --split test --n "${EVAL_WINDOWS:-64}" --params "$params" \
    --out "$out/files/eval_windows.npy"
  for f in $EVAL_FILES; do  # what stage real_eval reads of the corpus (eval)
    [ -f "data/real/$f" ] || { echo "pack: data/real/$f is missing: run dvc repro real_corpus"; exit 1; }
    cp "data/real/$f" "$out/files/"
  done
  carry_pack "$out" 4 "carry one folder per device call (receive), then train:"
}

receive() {  # device: take in the carried chunks, put complete files together, convert the base
  local missing=0
  carry_receive .real-gpu "$work/incoming" "$work/files" || missing=$?
  [ "$missing" -ne 2 ] || { echo "receive: nothing carried yet (carry .real-gpu/call-NN)"; exit 1; }
  local wheel; wheel=$(ls "$work"/files/gguf-*.whl 2> /dev/null || true)
  if [ ! -f "$base/config.json" ] && [ -f "$work/files/model.gguf" ] && [ -n "$wheel" ]; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$wheel"
    PYTHONPATH="$work/site:${PYTHONPATH:-}" $py -m scripts.real_train_gpu base \
      --gguf "$work/files/model.gguf" --out "$base"
  fi
  [ -f "$base/config.json" ] && echo "receive: base $base ready"
  return $missing
}

train() {  # device: one variant, then NLL vs loops of it and of the base
  local variant=$1 out=${OUT:?the device sets OUT} match=() log
  receive || { echo "train: files are still missing (above)"; exit 1; }
  if [ -n "${MATCH:-}" ]; then match=(--match "$MATCH")  # any variant, LMA included: a finished run's block and steps
  elif [ "$variant" != lma ]; then match=(--match "$work/lma_summary.json"); fi
  log="$out/train_$variant.log"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } | tee "$log"
  cp "$log" "$out/gpu.txt"  # the GPU's line, which the report names
  $py -m scripts.real_train_gpu train "$variant" --base "$base" --tokens "$work/files/tokens_train.npy" \
    --windows "$work/files/eval_windows.npy" --params "$params" --out "$out/$name-$variant" --quiet \
    ${DEPTHS:+--depths $DEPTHS} "${match[@]}" 2>&1 | tee -a "$log"
  cp "$out/$name-$variant/train_summary.json" "$work/${variant}_summary.json"
  cp "$out/$name-$variant/train_summary.json" "$out/train_summary_$variant.json"
  (cd "$out" && sha256sum "$name-$variant/retrofit.safetensors") | sed "s#  #  data/models/#" >> "$out/checkpoints.txt"
  # the checkpoint as one tar (a call returns 8 files at most), and a copy kept while the machine stays warm
  rm -rf "${work:?}/$name-$variant" && cp -r "$out/$name-$variant" "$work/"
  tar -cf "$out/$name-$variant.tar" -C "$out" "$name-$variant" && rm -rf "${out:?}/$name-$variant"
}

evaluate() {  # device: stage real_eval on the committed retrofits, everything under $OUT
  local out=${OUT:?the device sets OUT} f v
  receive || { echo "eval: files are still missing (above)"; exit 1; }
  $py -c "import numpy, pyarrow, scipy, matplotlib, torch, transformers, yaml" \
    || { echo "eval: a package real_eval needs is missing (above)"; exit 1; }
  for v in lma plain t1; do  # a variant this machine trained (kept under $work) replaces the committed one
    if [ -f "$work/$name-$v/retrofit.safetensors" ]; then
      rm -rf "data/models/$name-$v" && cp -r "$work/$name-$v" data/models/ && echo "eval: $v as trained here ($work)"
    fi
    [ -f "data/models/$name-$v/retrofit.safetensors" ] || { echo "eval: data/models/$name-$v is missing"; exit 1; }
  done
  mkdir -p data/real
  for f in $EVAL_FILES; do
    [ -f "$work/files/$f" ] || { echo "eval: $f was not carried (pack again)"; exit 1; }
    cp "$work/files/$f" data/real/
  done
  rm -rf "data/models/$name-instruct" && cp -r "$base" "data/models/$name-instruct"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } \
    | tee "$out/real_eval.log"
  local start=$SECONDS
  if ! $py -m stages.real_eval --params "$params" 2>&1 | tee -a "$out/real_eval.log"; then
    echo "eval: real_eval failed (above)"; exit 1
  fi
  echo "eval: real_eval took $((SECONDS - start)) s wall" | tee -a "$out/real_eval.log"
  local res="$work/real_eval" # one tar: a call returns 8 files at most
  rm -rf "$res" && mkdir -p "$res"
  sha256sum data/models/$name-{lma,plain,t1}/retrofit.safetensors > "$res/checkpoints.txt"  # what it ran on
  for f in loops.parquet curves.parquet halting.parquet halting_examples.parquet real_model.md real_model.json \
           nll_vs_loops.png; do
    cp "data/real/$f" "$res/"
  done
  cp "$out/real_eval.log" "$res/"
  tar -czf "$out/real_eval.tar.gz" -C "$res" .
  echo "eval: outputs in $out/real_eval.tar.gz"
}

EVAL_FILES=${EVAL_FILES-"corpus.parquet corpus_manifest.json tokens_test.npy"}  # EVAL_FILES= packs for training only
case "${1:-}" in
  pack) pack ;;
  receive) receive || true ;;
  train) train "${2:?train lma|plain|t1}" ;;
  eval) evaluate ;;
  *) echo "usage: $0 pack | receive | train lma|plain|t1 | eval"; exit 2 ;;
esac
