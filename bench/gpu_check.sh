#!/usr/bin/env bash
# The first GPU run in one command, at most 8 minutes on one GPU (bench/gpu_check.py says what it checks):
#   bash bench/gpu_check.sh [--model tiny|DIR] [--json PATH] [--backend hf|vllm] [--dtypes float32,bfloat16]
# The interpreter is $PYTHON, else the python3 (else python) on PATH: the environment you chose, never one of the
# repository's (.venv-vllm is CPU-only unless built otherwise). It needs a CUDA build of torch that sees a GPU
# (refused in one line otherwise, before any work), transformers, and trace-rl's imports; omegaconf, which a bare GPU
# image lacks, installs from the wheels in $GPU_CHECK_WHEELS (default bench/wheels; WHEELS in gpu_check.py lists
# them and how to fetch them). Nothing is downloaded: the model is the shipped tiny warm start or a local
# directory (HF_HUB_OFFLINE=1). The table goes to stdout and, as JSON, to --json (default runs/gpu_check/).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || {
  echo "gpu_check: no nvidia-smi on PATH: this needs a CUDA GPU (python bench/gpu_check.py --device cpu is the dry mode)" >&2
  exit 2
}
PY=${PYTHON:-$(command -v python3 || command -v python || true)}
[ -n "$PY" ] || { echo "gpu_check: no python3 or python on PATH (set PYTHON)" >&2; exit 2; }
# vLLM's worker processes import trace_rl (the weight-loader extension): the source tree goes on their path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec timeout --kill-after=10 480 "$PY" bench/gpu_check.py --device cuda "$@"
