#!/usr/bin/env bash
# WISE on the real model's LMA retrofit on one GPU machine that has no registry, no Ray, no DVC, no DuckDB and
# no corpus text (issue 51, item 5): the study (stage real_wise with params/real-wise-gpu.yaml: 512-8160 tokens,
# 64 QA prompts and 32 text windows per length, T = 8, t_d = 3, w = 2, the kernel backend, in-process workers),
# then the kernel on the real supports that study saved (data/real/wise/layouts.parquet), each beside random
# layouts of the same density and dense flash / cuDNN / FlexAttention in the same run:
#   - SmolLM2's geometry (GQA 9 / 3, d = 64), query blocks packed 1 and 2 per tile;
#   - Huginn-0125's geometry (55 heads, d = 96), the real heads redrawn to 55;
#   - the whole Huginn-shape forward (random init) on those layouts.
# The study reads the test split's documents and token ids (data/real/corpus.parquet, tokens_test.npy, built
# here by `dvc repro real_corpus`); `pack` writes them (test split only) in chunks that fit a device call.
#
#   here:    scripts/real_model_gpu.sh pack     # the GGUF and the gguf wheel (.real-gpu/call-NN)
#   here:    scripts/real_wise_gpu.sh pack      # -> .real-wise-gpu/call-NN/ + .real-wise-gpu/plan.txt
#   device:  scripts/real_model_gpu.sh receive  # carry .real-gpu/call-NN, one call each: the base in
#                                                           # /tmp/wise-real/smollm2-135m-instruct
#   device:  scripts/real_wise_gpu.sh study     # carry .real-wise-gpu/call-NN (the last one with it)
#
# `study` takes in the carried chunks (checked by sha256), puts the test split under data/real/ and links the
# converted base into data/models/, then writes to $OUT (else ./real-wise-gpu-logs): run.log (walls), gpu.txt,
# study.log, the study's tables (real_wise.md, summary / mechanism / supports / layouts parquet, ...) and the
# three benchmark tables. Without CUDA the benchmark steps are skipped with a message (the study runs on CPU
# with PARAMS=<a tiny params file>). PARAMS (default params/real-wise-gpu.yaml), WORK (default /tmp/wise-real).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
params=${PARAMS:-params/real-wise-gpu.yaml}
work=${WORK:-/tmp/wise-real}
carry=.real-wise-gpu  # ignored (.gitignore): it travels only when a call carries it
tree_mib() {  # what a device call sends besides its carried paths
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print int(s / 1048576) + 1}'
}

pack() {  # here: the test split's documents and token ids, in chunks that fit one call each beside the tree
  local chunk; chunk=${CHUNK_MIB:-$((63 - $(tree_mib)))}
  [ "$chunk" -ge 2 ] || { echo "pack: the working tree leaves ${chunk} MiB per call (64 MiB in all; CHUNK_MIB=N overrides)"; exit 1; }
  rm -rf "$carry" && mkdir -p "$carry/files" "$carry/parts"
  $py -m scripts.real_wise_pack --out "$carry/files"
  : > "$carry/MANIFEST"
  for f in "$carry"/files/*; do
    local n; n=$(basename "$f")
    split -b "${chunk}M" -d -a 2 "$f" "$carry/parts/$n.part-"
    echo "$n $(sha256sum "$f" | cut -d' ' -f1) $(ls "$carry/parts/$n".part-* | wc -l)" >> "$carry/MANIFEST"
  done
  local i=0 used=0 size dir
  for part in $(ls "$carry"/parts/*); do  # in order; a new call when the current one is full
    size=$(( ($(stat -c %s "$part") + 1048575) / 1048576 ))
    if [ $((used + size)) -gt "$chunk" ] && [ "$used" -gt 0 ]; then i=$((i + 1)); used=0; fi
    dir=$(printf "%s/call-%02d" "$carry" "$i"); mkdir -p "$dir"
    mv "$part" "$dir/"; used=$((used + size))
  done
  for dir in "$carry"/call-*; do cp "$carry/MANIFEST" "$dir/"; done
  rm -rf "$carry/files" "$carry/parts"
  { echo "tree $(tree_mib) MiB, $chunk MiB per call; carry each folder (the last with \`study\`):"
    for dir in "$carry"/call-*; do echo "  $dir $(du -sm "$dir" | cut -f1) MiB"; done
    cat "$carry/MANIFEST"; } | tee "$carry/plan.txt"
}

receive() {  # device: take in the carried chunks; the test split under data/real/ once every part is here
  mkdir -p "$work/wise-incoming" data/real
  for dir in "$carry"/call-*; do [ -d "$dir" ] && cp "$dir"/* "$work/wise-incoming/"; done
  local n sha parts have missing=0
  if [ -f "$work/wise-incoming/MANIFEST" ]; then
    while read -r n sha parts; do
      [ -f "data/real/$n" ] && [ "$(sha256sum "data/real/$n" | cut -d' ' -f1)" = "$sha" ] && continue
      have=$(ls "$work/wise-incoming/$n".part-* 2>/dev/null | wc -l)
      if [ "$have" -lt "$parts" ]; then echo "receive: $n has $have of $parts parts"; missing=1; continue; fi
      cat "$work/wise-incoming/$n".part-* > "data/real/.$n.tmp-$$"
      [ "$(sha256sum "data/real/.$n.tmp-$$" | cut -d' ' -f1)" = "$sha" ] || { echo "receive: $n sha256 mismatch"; exit 1; }
      mv "data/real/.$n.tmp-$$" "data/real/$n" && echo "receive: data/real/$n complete"
    done < "$work/wise-incoming/MANIFEST"
  fi
  for n in corpus.parquet tokens_test.npy; do
    [ -f "data/real/$n" ] || { echo "receive: data/real/$n is missing (carry .real-wise-gpu/call-NN)"; missing=1; }
  done
  local base=data/models/smollm2-135m-instruct
  if [ ! -f "$base/config.json" ] && [ -f "$work/smollm2-135m-instruct/config.json" ]; then
    rm -rf "$base" && ln -s "$work/smollm2-135m-instruct" "$base"
  fi
  [ -f "$base/config.json" ] || { echo "receive: $base is missing (real_model_gpu.sh receive converts it)"; missing=1; }
  return $missing
}

study() {  # device (or CPU with a tiny PARAMS): the study, its tables, the benchmarks on its layouts
  local logs=${OUT:-real-wise-gpu-logs} layouts=data/real/wise/layouts.parquet start studied done_at
  mkdir -p "$logs"
  receive || { echo "study: files are still missing (above)"; exit 1; }
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } \
    | tee "$logs/gpu.txt" > "$logs/run.log"
  start=$(date +%s)
  $py -m stages.real_wise --params "$params" 2>&1 | grep --line-buffered -v "it/s]" | tee "$logs/study.log"
  studied=$(date +%s)
  cp data/real/wise/* "$logs/"
  if $py -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    $py -m benchmarks.bench --layouts "$layouts" --gqa 3 --head-dim 64 --packs 1 2 \
      --out "$logs/kernel_real_smollm2.parquet" 2>&1 | tee "$logs/bench.log"
    $py -m benchmarks.bench --layouts "$layouts" --resample-heads 55 --head-dim 96 \
      --out "$logs/kernel_real_huginn.parquet" 2>&1 | tee -a "$logs/bench.log"
    $py -m benchmarks.whole_model --layouts "$layouts" --preset huginn-0125 \
      --out "$logs/whole_real_huginn.parquet" 2>&1 | tee -a "$logs/bench.log"
  else
    echo "study: no CUDA device: the kernel and whole-model benchmarks on $layouts are skipped" | tee "$logs/bench.log"
  fi
  done_at=$(date +%s)
  echo "wall: study $((studied - start)) s, kernel benchmarks $((done_at - studied)) s ($params)" | tee -a "$logs/run.log"
}

case "${1:-}" in
  pack) pack ;;
  receive) receive ;;
  study) study ;;
  *) echo "usage: $0 pack | receive | study"; exit 2 ;;
esac
