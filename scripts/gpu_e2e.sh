#!/usr/bin/env bash
# The whole pipeline on a GPU, end to end: `dvc repro` with params/gpu-e2e.yaml (the calibration
# model wise-chain at 1K and 2K tokens, late steps through the Triton kernel in float32, one Ray
# actor per GPU, timing on) in a scratch copy of this checkout, then the GPU tests. Writes to LOG_DIR:
#
#   summary.txt      per-stage wall times, EM against the expected EM per condition and context
#                    length, the run spec (device, dtype, backend), sweeps, timing rows, GPU memory
#                    peaks, test result
#   dvc_repro.log    `dvc repro` output, every line prefixed with its Unix time
#   stage_times.tsv  stage, seconds (from "Running stage" to DVC's lock-file update)
#   gpu_memory.csv   nvidia-smi samples (every 0.5 s) while `dvc repro` ran
#   pytest.log       `python -m pytest -m gpu -q`
#   env.txt, params.yaml, metrics.json, summary.md, report.md   what ran, and the statistics stage's outputs
#
# Usage:  scripts/gpu_e2e.sh [--cpu] [--tests MARKEXPR | --no-tests] [-S key=value]... [LOG_DIR]
#   LOG_DIR     default: $OUT if set, else ./gpu-e2e-logs
#   --cpu       no GPU: backend gather, device cpu and tiny sizes (checks the script and the pipeline)
#   --tests     the pytest marker expression (default "gpu"; "gpu and not slow" is the 2-minute subset)
#   -S k=v      override one params key after the preset (as `dvc exp run -S`), e.g. -S cohorts.examples_per_benchmark=16
#   PYTHON=...  the interpreter (default: python3 on PATH). No venv is assumed: packages installed with
#               `pip install --target DIR` work through PYTHONPATH=DIR.
#   WISE_E2E_DEVICE=cpu is the same as --cpu.
# Exit status: 0 when `dvc repro` and the tests pass and every answer is the expected one, else 1.
set -uo pipefail  # no -e: a failed step is recorded and the later steps still report

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${WISE_E2E_DEVICE:-gpu}
TESTS=gpu
OVERRIDES=()
LOG_DIR=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) MODE=cpu ;;
    --tests) TESTS=$2; shift ;;
    --no-tests) TESTS= ;;
    -S) OVERRIDES+=("$2"); shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_e2e: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) LOG_DIR=$1 ;;
  esac
  shift
done
LOG_DIR=${LOG_DIR:-${OUT:-./gpu-e2e-logs}}
mkdir -p "$LOG_DIR" && LOG_DIR=$(cd "$LOG_DIR" && pwd)
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
PYTHON=$(command -v "$PYTHON")
FAILED=()
say() { echo "gpu_e2e: $*" | tee -a "$LOG_DIR/summary.txt"; }
: >"$LOG_DIR/summary.txt"

# CPU mode: the same stages on two cores in a few minutes (prompts of 256 tokens, two examples).
CPU_OVERRIDES=(model.device=cpu conditions.backend=gather 'cohorts.context_lengths=[256]'
               cohorts.examples_per_benchmark=2 'timing.context_lengths=[256]' sweeps.context_length=256
               sweeps.examples_per_benchmark=1 statistics.bootstrap_resamples=200)
[ "$MODE" = cpu ] && OVERRIDES=("${CPU_OVERRIDES[@]}" "${OVERRIDES[@]}")

# Fail early, naming what is missing, rather than deep inside a stage.
"$PYTHON" - "$MODE" <<'EOF' || exit 1
import importlib.util, sys
missing = [m for m in ("torch", "ray", "dvc", "duckdb", "pyarrow", "yaml", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_e2e: {sys.executable} cannot import {', '.join(missing)} (install them, or set PYTHON / PYTHONPATH)")
import torch
if sys.argv[1] == "gpu" and not torch.cuda.is_available():
    sys.exit("gpu_e2e: no CUDA device visible to torch (--cpu runs the CPU path)")
EOF

# Offline and quiet (see the README's environment notes): no hub requests, no DVC analytics
# daemon, no Ray usage stats or auth token. Ray's cloud-metadata probe is stopped by the pool
# itself (pipelines/compute/ray_runtime.py starts Ray with a private HOME holding
# ray_bootstrap_config.yaml), so nothing is needed here for it.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 DVC_NO_ANALYTICS=1 RAY_USAGE_STATS_ENABLED=0 \
       RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# Ray's unix sockets live under RAY_TMPDIR: keep the path short (socket paths are limited to ~107 bytes).
export RAY_TMPDIR=${RAY_TMPDIR:-$(mktemp -d /tmp/wrXXXX)}

# A scratch copy, so the run never touches this checkout's outputs: the files git tracks or would
# track (no venv, no earlier outputs; the committed checkpoints and RecurTrace outputs come along,
# so with their lock entries DVC keeps them). Without git, everything but .git and caches.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wise-e2e-XXXX")
REPO=$WORK/repo
mkdir -p "$REPO" "$WORK/bin"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -r cp -P --parents -t "$REPO" 2>/dev/null)
  SOURCE="$(git -C "$ROOT" rev-parse HEAD) ($(git -C "$ROOT" status --porcelain | wc -l) changed files)"
else
  tar -C "$ROOT" --exclude=.git --exclude=.venv --exclude=.dvc/tmp --exclude=.dvc/cache \
      --exclude=__pycache__ -cf - . | tar -C "$REPO" -xf -
  SOURCE="$ROOT (not a git checkout)"
fi
# tracked files deleted in the working tree are listed but absent: cp skips them (stderr hidden)

# The preset is the scratch copy's params.yaml: DVC reads params.yaml only.
cp "$ROOT/params/gpu-e2e.yaml" "$REPO/params.yaml"
if [ ${#OVERRIDES[@]} -gt 0 ]; then
  "$PYTHON" - "$REPO/params.yaml" "${OVERRIDES[@]}" <<'EOF'
import sys, yaml
path, sets = sys.argv[1], sys.argv[2:]
params = yaml.safe_load(open(path))
for item in sets:
    key, _, value = item.partition("=")
    *parents, leaf = key.split(".")
    node = params
    for k in parents:
        node = node.get(k) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:  # a typo must not add a key no stage reads
        sys.exit(f"gpu_e2e: -S {item}: no key {key} in params")
    node[leaf] = yaml.safe_load(value)
yaml.safe_dump(params, open(path, "w"), sort_keys=False)
EOF
  [ $? -eq 0 ] || { rm -rf "$WORK"; exit 1; }
fi
cp "$REPO/params.yaml" "$LOG_DIR/params.yaml"

# DVC wants a git repository (a commit also gives the result rows a code_commit); without git
# it runs with core.no_scm.
cd "$REPO"
if command -v git >/dev/null; then
  git init -q && git add -A && git -c user.name=gpu-e2e -c user.email=gpu-e2e@localhost commit -qm scratch
else
  "$PYTHON" -m dvc config --local core.no_scm true
fi

# Stage commands say `python -m stages.X`: make `python` this interpreter (a wrapper, not a symlink:
# a venv's python found through a symlink elsewhere loses its venv), and this copy's code importable
# first (an editable install of the original checkout must not shadow it).
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PYTHON" >"$WORK/bin/python" && chmod +x "$WORK/bin/python"
export PATH="$WORK/bin:$PATH" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "source: $SOURCE"; echo "scratch: $REPO"; echo "mode: $MODE"; echo "python: $PYTHON"
  echo "overrides: ${OVERRIDES[*]:-none}"; echo "RAY_TMPDIR (Ray's session logs): $RAY_TMPDIR"
  python -c "import torch, ray, dvc, duckdb, wise; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'| ray', ray.__version__, '| dvc', dvc.__version__, '| duckdb', duckdb.__version__, '| wise from', wise.__file__)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
} >"$LOG_DIR/env.txt" 2>&1
say "scratch copy $REPO; logs in $LOG_DIR"

# GPU memory: the stages run in Ray actors (other processes), and the pipeline records
# torch.cuda.max_memory_allocated only in the timing stage's whole-model rows (peak_gib), so the
# device-level peak comes from sampling nvidia-smi while `dvc repro` runs.
SAMPLER=
if [ "$MODE" = gpu ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader,nounits \
      -lms 500 >"$LOG_DIR/gpu_memory.csv" 2>/dev/null &
  SAMPLER=$!
elif [ "$MODE" = gpu ]; then
  say "no nvidia-smi: the GPU memory peak is not sampled (the timing rows' peak_gib remains)"
fi

# The pipeline. Every output line gets its time, so per-stage wall times come from DVC's own
# "Running stage" lines (DVC runs stages one at a time).
say "dvc repro ..."
T0=$EPOCHREALTIME
python -m dvc repro 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done \
  | tee "$LOG_DIR/dvc_repro.log" | cut -d' ' -f2-
REPRO_RC=${PIPESTATUS[0]}
T1=$EPOCHREALTIME
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null && wait "$SAMPLER" 2>/dev/null
[ "$REPRO_RC" -eq 0 ] || FAILED+=("dvc repro (exit $REPRO_RC)")

# A stage's time runs from its "Running stage" line to DVC's lock-file update after it (or to the
# next stage / the end): the command itself plus DVC hashing its outputs.
python - "$LOG_DIR/dvc_repro.log" "$T0" "$T1" >"$LOG_DIR/stage_times.tsv" <<'EOF'
import re, sys
t0, t1 = float(sys.argv[2]), float(sys.argv[3])
stages, skipped = [], []  # [name, start, end]
for raw in open(sys.argv[1], newline="\n"):  # progress bars' carriage returns stay inside a line
    stamp, _, text = raw.rstrip("\n").partition(" ")
    t, start = float(stamp), re.match(r"Running stage '(.+)':", text)
    if stages and stages[-1][2] is None and (start or re.match(r"(Updating|Generating) lock file", text)):
        stages[-1][2] = t
    if start:
        stages.append([start.group(1), t, None])
    elif skip := re.match(r"Stage '(.+)' didn't change, skipping", text):
        skipped.append(skip.group(1))
print("stage\tseconds")
for name, start, end in stages:
    print(f"{name}\t{(end or t1) - start:.1f}")
print(f"total (dvc repro)\t{t1 - t0:.1f}")
for name in skipped:
    print(f"{name}\tskipped (up to date)")
EOF
say "per-stage wall time (s):"
awk -F'\t' 'NR > 1 { printf "  %-28s %s\n", $1, $2 }' "$LOG_DIR/stage_times.tsv" | tee -a "$LOG_DIR/summary.txt"

# What the run produced, through the SQL views the statistics stage publishes (data/wise.duckdb).
query() { say "$1"; python -m pipelines.store.query "$2" 2>&1 | tee -a "$LOG_DIR/summary.txt"; }
if [ "$REPRO_RC" -eq 0 ]; then
  query "run spec of the result rows:" \
    "SELECT DISTINCT model, device, device_name, dtype, backend, generation FROM results"
  query "EM against the expected EM (wise-chain's answers are derived from its construction):" \
    "SELECT condition, count(*) AS n, avg(em) AS em, avg(expected_em) AS expected_em,
            count(*) FILTER (WHERE em IS DISTINCT FROM expected_em) AS mismatches
     FROM results GROUP BY condition ORDER BY condition"
  query "... per context length:" \
    "SELECT context_length, condition, count(*) AS n, avg(em) AS em, avg(expected_em) AS expected_em,
            count(*) FILTER (WHERE em IS DISTINCT FROM expected_em) AS mismatches, avg(density) AS density
     FROM results GROUP BY ALL ORDER BY context_length, condition"
  query "sweeps:" \
    "SELECT axis, count(*) AS n, avg(em) AS em, count(*) FILTER (WHERE em IS DISTINCT FROM expected_em) AS mismatches
     FROM sweeps GROUP BY axis ORDER BY axis"
  query "timing (ms; status says what was not measured; peak_gib: torch's peak of a whole-model row):" \
    "SELECT source, label, n, block_size, status, flash_ms, kernel_ms, full_ms, wise_ms, ratio, peak_gib
     FROM timing ORDER BY source, label, n, block_size"
  cp data/metrics.json data/report/summary.md data/report/report.md "$LOG_DIR/" 2>/dev/null  # report.md: its timing tables
  MISMATCHES=$(python -c "import json; print(json.load(open('data/metrics.json')).get('expected_mismatches'))")
  say "expected mismatches (data/metrics.json): $MISMATCHES"
  [ "$MISMATCHES" = 0 ] || FAILED+=("$MISMATCHES answers differ from the expected ones")
fi
if [ -s "$LOG_DIR/gpu_memory.csv" ]; then
  say "GPU memory peak while dvc repro ran (nvidia-smi, MiB used of total):"
  awk -F', ' '{ if ($3 > peak[$2]) peak[$2] = $3; total[$2] = $4 }
              END { for (g in peak) printf "  GPU %s: %d of %d MiB\n", g, peak[g], total[g] }' \
      "$LOG_DIR/gpu_memory.csv" | sort | tee -a "$LOG_DIR/summary.txt"
fi

# The GPU tests, on the same copy (kernels, routing backends, whole model; without CUDA they skip).
if [ -n "$TESTS" ]; then
  say "python -m pytest -m \"$TESTS\" ..."
  T2=$EPOCHREALTIME
  python -m pytest -m "$TESTS" -q -p no:cacheprovider >"$LOG_DIR/pytest.log" 2>&1
  TEST_RC=$?
  say "pytest: $(tail -n 1 "$LOG_DIR/pytest.log") (exit $TEST_RC, $(python -c "print(round($EPOCHREALTIME - $T2))") s)"
  [ "$TEST_RC" -eq 0 ] || FAILED+=("pytest -m \"$TESTS\" (exit $TEST_RC)")
fi

say "wall time $(python -c "print(round($EPOCHREALTIME - $T0))") s from dvc repro to the end; scratch copy kept at $REPO"
if [ ${#FAILED[@]} -gt 0 ]; then
  say "FAILED: $(IFS=';'; echo "${FAILED[*]}")"
  exit 1
fi
say "OK"
