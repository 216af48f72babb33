#!/usr/bin/env bash
# WISE on the real model's LMA retrofit on one GPU machine that has no registry, no Ray, no DVC, no DuckDB and
# no corpus text (issue 51, item 5): the study (stage real_wise with params/real-wise-gpu.yaml: 512-8160 tokens,
# 64 QA prompts and 32 text windows per length, T = 8, t_d = 3, w = 2, the kernel backend, in-process workers),
# then the kernel on the real supports that study saved (data/real/wise/layouts.parquet), each beside random
# layouts of the same density and dense flash / cuDNN / FlexAttention in the same run:
#   - SmolLM2's geometry (GQA 9 / 3, d = 64), query blocks packed 1 and 2 per tile;
#   - Huginn-0125's geometry (55 heads, d = 96), the real heads redrawn to 55;
#   - the whole Huginn-shape forward (random init) on those layouts;
#   - time to first token and per output token of the LMA retrofit itself, Full vs WISE on its own discovered
#     supports over the test split's windows (benchmarks.decode_latency --retrofit; T = 8, t_d = 3, w = 2).
# The study reads the test split's documents and token ids (data/real/corpus.parquet, tokens_test.npy, built
# here by `dvc repro real_corpus`); `pack` writes them (test split only) in chunks that fit a device call.
#
#   here:    BASE_ONLY=1 scripts/real_model_gpu.sh pack     # the GGUF and the gguf wheel (.real-gpu/call-NN)
#   here:    scripts/real_wise_gpu.sh pack      # -> .real-wise-gpu/call-NN/ + .real-wise-gpu/plan.txt
#   device:  scripts/real_model_gpu.sh receive  # carry .real-gpu/call-NN, one call each: the base in
#                                                           # /tmp/wise-real/smollm2-135m-instruct
#   device:  scripts/real_wise_gpu.sh study --lengths 512,1024,2048   # carry .real-wise-gpu/call-NN
#   device:  scripts/real_wise_gpu.sh study --lengths 4096            # (the machine still warm)
#   device:  scripts/real_wise_gpu.sh study --lengths 8160 --shard 1/3   # then 2/3, 3/3: joins, benchmarks
#            (two shards in one call: OUT=$OUT/a ... --shard 2/3; ... --shard 3/3: each sends back its own part)
#   here:    tar -xzf $OUT/real_wise.tar.gz -C benchmarks/results/real-wise-gpu-h200/<date>/
# (`study` without --lengths runs every length in one call.) `FROM=<a committed study's folder> ... pack` also
# writes that study's lengths as finished parts into .real-wise-parts/ (stages.real_wise --split: its rows
# checked against PARAMS), so that the calls study only the lengths it lacks and the last one joins them all;
# `KEEP="<folders>"` adds the parts-*.tar.gz an earlier session's calls sent back (shards of a length included).
# If the machine went cold between the two calls:
# copy the first call's parts-length-*.tar.gz into .real-wise-parts/ and carry it with the second call (after
# the receives again), or join here: `scripts/real_wise_gpu.sh summary <folders holding the parts' tars>`
# (CPU, seconds; no duckdb needed) and run `bench` on a warm machine carrying data/real/wise/layouts.parquet.
#
# `study` takes in the carried chunks (scripts/carry.sh: sha256 checked), puts the test split under data/real/
# and links the converted base into data/models/, then runs stage real_wise one length at a time
# (`--parts`, pipelines/real/wise_parts.py) under $WORK/wise-parts, skipping lengths already done with the
# same params: a call cut short is resumed by calling it again. The stage is stopped after STUDY_LIMIT_S
# (default 450) so that what is finished comes back: $OUT (else ./real-wise-gpu-logs; 8 files at most) gets
# run.log (walls), study.log, parts-length-N.tar.gz per length this call finished and, once all are done,
# real_wise.tar.gz: the joined tables (as one run writes them: real_wise.md, summary / mechanism / supports /
# layouts parquet, ...), gpu.txt, checkpoints.txt (the retrofits' sha256sum), and the three benchmark tables with bench.log (BENCH=0 leaves them to
# `bench`). Without CUDA the benchmark steps are skipped with a message (the study runs on CPU with
# PARAMS=<a tiny params file>). PARAMS (default params/real-wise-gpu.yaml), WORK (default /tmp/wise-real),
# LAYOUTS (what `bench` times: default the study joined under WORK/wise-results, else data/real/wise's).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
params=${PARAMS:-params/real-wise-gpu.yaml}
work=${WORK:-/tmp/wise-real}
carry=.real-wise-gpu  # ignored (.gitignore): it travels only when a call carries it
parts=.real-wise-parts  # ignored: an earlier call's $OUT/parts, carried when the machine went cold between calls
source scripts/carry.sh  # carry_pack, carry_receive: the chunked transfer both GPU scripts share

pack() {  # here: the test split's documents and token ids, in chunks that fit one call each beside the tree
  carry_check 2
  rm -rf "$carry" && mkdir -p "$carry/files"
  $py -m scripts.real_wise_pack --out "$carry/files"
  carry_pack "$carry" 2 "carry each folder (the last with \`study\`):"
  [ -z "${FROM:-}" ] || from_study "$FROM"
  [ -z "${KEEP:-}" ] || keep_parts $KEEP
}

keep_parts() {  # here: finished parts (parts-length-N[-shard-I-of-K].tar.gz) that an earlier call sent back and
  # a results folder keeps, into $parts beside FROM's: the calls then study only what is still missing
  local d f n=0
  mkdir -p "$parts"
  for d in "$@"; do
    for f in "$d"/parts-*.tar.gz; do [ -f "$f" ] && cp "$f" "$parts/" && n=$((n + 1)); done
  done
  [ "$n" -gt 0 ] || { echo "pack: KEEP=$* holds no parts-*.tar.gz"; exit 1; }
  echo "pack: $n finished parts from $* in $parts/"
}

from_study() {  # here: a committed joined study's lengths as finished parts in $parts (carried with `study`)
  local split; split=$(mktemp -d)
  $py -m stages.real_wise --params "$params" --split "$1" --parts "$split"
  rm -rf "$parts" && mkdir -p "$parts"
  for d in "$split"/length-*; do tar -czf "$parts/parts-$(basename "$d").tar.gz" -C "$split" "$(basename "$d")"; done
  rm -rf "$split"
  echo "pack: $(ls "$parts" | wc -l) finished lengths of $1 in $parts/ (carry it with each \`study\` call)"
}

receive() {  # device: take in the carried chunks; the test split under data/real/ once every part is here
  local missing=0
  carry_receive "$carry" "$work/wise-incoming" data/real || missing=$?
  [ "$missing" -ne 2 ] || missing=0  # nothing carried: data/real/ may already hold the files (checked below)
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

study() {  # device (or CPU with a tiny PARAMS): [--lengths 512,1024] the study's parts, joined when all are done
  local logs=${OUT:-real-wise-gpu-logs} lengths="" shard="" start studied rc=0 f stage
  while [ $# -gt 0 ]; do
    case $1 in
      --lengths) lengths=${2:?study --lengths N,N,...}; shift 2 ;;
      --shard) shard=${2:?study --shard I/K}; shift 2 ;;
      *) echo "study: unknown option $1 (--lengths N,N,... [--shard I/K])"; exit 2 ;;
    esac
  done
  local done_parts="$work/wise-parts" res="$work/wise-results"
  mkdir -p "$logs" "$done_parts"
  receive || { echo "study: files are still missing (above)"; exit 1; }
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } \
    | tee "$work/gpu.txt" > "$logs/run.log"
  for f in "$parts"/parts-*.tar.gz; do [ -f "$f" ] && tar -xzf "$f" -C "$done_parts"; done  # a cold machine's
  local had=" "  # parts finished before this call (carried or an earlier call's): not sent back again
  for f in "$done_parts"/length-*; do [ -f "$f/part.json" ] && had+="$(basename "$f") "; done
  start=$(date +%s)
  # Stopped after STUDY_LIMIT_S (default 450 s, inside a 480-600 s call) so the finished parts are packed below;
  # a length's part counts once its part.json is written (pipelines.real.wise_parts), so a cut leaves whole parts.
  timeout "${STUDY_LIMIT_S:-450}" $py -m stages.real_wise --params "$params" --parts "$done_parts" \
    ${lengths:+--lengths "$lengths"} ${shard:+--shard "$shard"} > "$logs/study.log" 2>&1 || rc=$?
  studied=$(date +%s)
  grep -v "it/s]" "$logs/study.log" | tr '\r' '\n' | grep -v "it/s]" | tail -40
  echo "wall: study parts ${lengths:-(every length)}${shard:+ shard $shard} $((studied - start)) s, exit $rc ($params)" \
    | tee -a "$logs/run.log"
  # $OUT takes 8 files at most (16 MiB each): one gzipped tar per part this call finished, the logs, one tar of
  # the tables
  for f in "$done_parts"/length-*; do
    [[ "$had" == *" $(basename "$f") "* ]] && continue
    [ -f "$f/part.json" ] && tar -czf "$logs/.tmp.tar.gz" -C "$done_parts" "$(basename "$f")" \
      && mv "$logs/.tmp.tar.gz" "$logs/parts-$(basename "$f").tar.gz"
  done
  if ! $py -m stages.real_wise --params "$params" --join "$done_parts" >> "$logs/study.log" 2>&1; then
    tail -1 "$logs/study.log"
    echo "study: not joined yet: run the other lengths (study --lengths ...); if the machine went cold, carry" \
      "$parts/ holding this call's parts-*.tar.gz; or join here: scripts/real_wise_gpu.sh summary <folders>"
    return 0
  fi
  rm -rf "$res" && mkdir -p "$res" && cp data/real/wise/* "$work/gpu.txt" "$res/"
  sha256sum data/models/smollm2-135m-{lma,plain,t1}/retrofit.safetensors > "$res/checkpoints.txt"  # what it ran on
  if [ "${BENCH:-1}" = 1 ]; then OUT="$res" bench; else echo "study: BENCH=0: the benchmarks are left to \`bench\`"; fi
  cp "$res/bench.log" "$logs/" 2>/dev/null || true
  tar -czf "$logs/.tmp.tar.gz" -C "$res" . && mv "$logs/.tmp.tar.gz" "$logs/real_wise.tar.gz"
  echo "study: tables and benchmarks in $logs/real_wise.tar.gz (tar -xzf it into benchmarks/results/<dated folder>/)"
}

bench() {  # device: the kernel and whole-model benchmarks on the study's layouts (data/real/wise/layouts.parquet)
  local logs=${OUT:-real-wise-gpu-logs} layouts=${LAYOUTS:-$work/wise-results/layouts.parquet} start
  # the study this machine joined; else the tree's (a join here: data/real/wise is tracked, so a call's fresh
  # copy of the tree puts the default run's 512-token sample back there unless the joined one was committed)
  [ -n "${LAYOUTS:-}" ] || [ -f "$layouts" ] || layouts=data/real/wise/layouts.parquet
  mkdir -p "$logs"
  [ -f "$layouts" ] || { echo "bench: $layouts is missing (study or summary writes it)"; exit 1; }
  echo "bench: layouts $layouts, lengths $($py -c "import pyarrow.parquet as pq, sys
print(sorted(set(pq.read_table(sys.argv[1], columns=['length']).column('length').to_pylist())))" "$layouts")" \
    | tee "$logs/bench.log"
  start=$(date +%s)
  if $py -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    $py -m benchmarks.bench --layouts "$layouts" --gqa 3 --head-dim 64 --packs 1 2 \
      --out "$logs/kernel_real_smollm2.parquet" 2>&1 | tee -a "$logs/bench.log"
    $py -m benchmarks.bench --layouts "$layouts" --resample-heads 55 --head-dim 96 \
      --out "$logs/kernel_real_huginn.parquet" 2>&1 | tee -a "$logs/bench.log"
    $py -m benchmarks.whole_model --layouts "$layouts" --preset huginn-0125 \
      --out "$logs/whole_real_huginn.parquet" 2>&1 | tee -a "$logs/bench.log"
    timeout "${DECODE_LIMIT_S:-150}" $py -m benchmarks.decode_latency --presets \
      --retrofit data/models/smollm2-135m-lma --text data/real/tokens_test.npy --n 8160 4096 2048 --batch 1 4 \
      --steps 8 --dense-steps 3 --window 2 --max-prefill-tokens 32768 --ttft-repeats 3 \
      --out "$logs/decode_latency_smollm2.parquet" 2>&1 | tee -a "$logs/bench.log" || true
  else
    echo "bench: no CUDA device: the kernel and whole-model benchmarks on $layouts are skipped" \
      | tee -a "$logs/bench.log"
  fi
  echo "wall: kernel benchmarks $(($(date +%s) - start)) s" | tee -a "$logs/run.log"
}

summary() {  # here (CPU, seconds): join the parts the calls sent back into data/real/wise, as one run writes it
  [ "$#" -ge 1 ] || { echo "usage: $0 summary FOLDER... (holding parts-length-N.tar.gz or length-N/)"; exit 2; }
  local f dirs=()
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  for d in "$@"; do
    for f in "$d"/parts-*.tar.gz; do [ -f "$f" ] && tar -xzf "$f" -C "$tmp"; done
    dirs+=("$d")
  done
  $py -m stages.real_wise --params "$params" --join "$tmp" "${dirs[@]}"
}

case "${1:-}" in
  pack) pack ;;
  receive) receive ;;
  study) shift; study "$@" ;;
  bench) bench ;;
  summary) shift; summary "$@" ;;
  *) echo "usage: $0 pack | receive | study [--lengths N,N] [--shard I/K] | bench | summary PARTS_DIR..."; exit 2 ;;
esac
