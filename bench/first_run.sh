#!/usr/bin/env bash
# The first training run on one GPU (bench/first_run.py says what it runs and checks), under 10 minutes.
#   bash bench/first_run.sh --model /path/to/local/model [--dtype bfloat16|float32]
# Needs a CUDA machine with pip install -e '.[lm,vllm]'. The model is a local directory (no hub access).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "first_run: no nvidia-smi: this needs a CUDA GPU" >&2; exit 2; }
python -c "import vllm" 2>/dev/null || { echo "first_run: vllm is not installed (pip install -e '.[vllm]')" >&2; exit 2; }
# vLLM's worker processes import trace_rl (the weight-loader extension): put the source tree on their path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1  # a local model only
exec timeout 600 python bench/first_run.py "$@"
