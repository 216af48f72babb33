#!/usr/bin/env bash
# Issue 52 (decoding at its floor, time per output token, the lone condition) on one H200, in one call
# of at most 480 s, everything under $OUT/decode-latency-h200/<UTC date>/:
#   gpu_tests.log             the decode path's GPU tests: own supports, CUDA graphs (skipped if no pytest)
#   huginn.log, decode_latency_huginn.parquet   Huginn shape, 4K/8K/16K/32K x batch 1/4 (cells that do
#                             not fit are skipped with the memory they need, printed before each cell)
#   bench_conditions.log/.json  the lone-condition line (Full vs WISE alone, planted density 0.13)
#   rllama.log, decode_latency_rllama.parquet   Recurrent-Llama shape, 8K/32K x batch 1/4
#   gpu.txt                   nvidia-smi's line
# Each part has its own time limit (timeout: 50, 175 and 130 s, the last part what is left of 470 s), so one
# that overruns leaves the others' files; decode_latency writes its Parquet after every cell, the target
# cells (8K x 4, 32K x 1) first. No network, no checkpoint: the preset sources are random-init models of
# the shapes. Needs python with torch, triton and pyarrow.
#   device:  OUT=... scripts/decode_latency_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 DVC_NO_ANALYTICS=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
dir="${OUT:?set OUT}/decode-latency-h200/$(date -u +%F)"
mkdir -p "$dir"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$dir/gpu.txt" 2>&1

run() {  # run LIMIT NAME COMMAND...: time-limited, output to $dir/NAME.log, one status line here
    local limit=$1 name=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$dir/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)$([ $rc = 124 ] && echo ', timed out')"
    tail -n 3 "$dir/$name.log"
}

if $py -c "import pytest" 2>/dev/null; then
    run 50 gpu_tests $py -m pytest -q -m gpu -p no:cacheprovider tests/test_own_blocks.py \
        tests/test_sparse_late_rows.py tests/test_graph_decode.py
else
    echo "gpu_tests: skipped (no pytest in this python)" | tee "$dir/gpu_tests.log"
fi
run 175 huginn $py -m benchmarks.decode_latency --presets huginn-0125 --n 8192 32768 4096 16384 --batch 4 1 \
    --max-prefill-tokens 131072 --out "$dir/decode_latency_huginn.parquet"
run 130 bench_conditions $py -m scripts.bench_conditions --params params/huginn-paper.yaml \
    --source preset:huginn-0125@0 --context 4096 --n 2 --skip-today --plant-density 0.13 \
    --conditions full,wise,truncate --json "$dir/bench_conditions.json"
left=$((470 - SECONDS))
run $((left > 10 ? left : 10)) rllama $py -m benchmarks.decode_latency --presets recurrent-llama-3.2 \
    --n 8192 32768 --batch 1 4 --max-prefill-tokens 131072 --out "$dir/decode_latency_rllama.parquet"
ls -l "$dir"
