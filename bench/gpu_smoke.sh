#!/usr/bin/env bash
# GPU smoke test of the vLLM backend: one GPU, under 10 minutes (see bench/gpu_smoke.py for what it checks).
#   bash bench/gpu_smoke.sh [--model ORG/NAME] [--dtype bfloat16|float32] [--prompts 8]
# Needs: pip install -e '.[lm,envs,vllm]' on a CUDA machine; network or a warm Hugging Face cache for the model.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi: this needs a CUDA GPU" >&2; exit 2; }
python -c "import vllm" 2>/dev/null || { echo "gpu_smoke: vllm is not installed (pip install -e '.[vllm]')" >&2; exit 2; }
# vLLM's worker processes import trace_rl (the weight-loader extension): put the source tree on their path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 600 python bench/gpu_smoke.py "$@"
