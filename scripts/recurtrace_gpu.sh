#!/usr/bin/env bash
# The embedded RecurTrace case on one GPU: the four stages dvc.yaml runs for it, in its order and
# with its commands, each forced to train again (--retrain / --recompute): recurtrace_train_base,
# recurtrace_train@lma, recurtrace_train@plain, recurtrace_eval (about 7 minutes on one H200). What
# `dvc repro -f` of those stages does, for a GPU machine without DVC. Logs, seconds per stage and a
# tarball of the checkpoints and the table go to $1 (default $OUT, else ./recurtrace-gpu-logs); copy
# the folders into data/ and `dvc commit` the four stages.
#
#   scripts/recurtrace_gpu.sh [LOG_DIR] [PARAMS]      # PARAMS: default params.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
logs=${1:-${OUT:-recurtrace-gpu-logs}}
params=${2:-params.yaml}
mkdir -p "$logs"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
name=$($py -c "from pipelines.recurtrace.params import load_retrofit_params as l; print(l('$params').name)")
run() {  # stage label, then its command line
  local label=$1 t0
  shift
  t0=$(date +%s)
  "$py" -m "$@" --params "$params" 2>&1 | grep -v "it/s]" | tee "$logs/$label.log"
  echo "$label $(( $(date +%s) - t0 )) s" | tee -a "$logs/seconds.txt"
}
run recurtrace_train_base stages.recurtrace_train base --retrain --device cuda
run recurtrace_train-lma stages.recurtrace_train lma --retrain --device cuda
run recurtrace_train-plain stages.recurtrace_train plain --retrain --device cuda
run recurtrace_eval stages.recurtrace_eval --recompute --device cuda
tar -czf "$logs/recurtrace.tgz" data/models/recurtrace-base "data/models/$name-lma" "data/models/$name-plain" \
  "data/retrofit/$name"
