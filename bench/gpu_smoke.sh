#!/usr/bin/env bash
# The vLLM backend on one GPU, under 8 minutes (bench/gpu_smoke.py says what it checks and reports).
#   bash bench/gpu_smoke.sh --model /path/to/local/model --sandbox strict|weak [--dtype float32] [--prompts 8]
# Needs a CUDA machine with pip install -e '.[lm,envs,vllm]'. The model is a local directory (no hub access);
# the sandbox of the math tool is an explicit choice (strict needs bubblewrap).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi: this needs a CUDA GPU" >&2; exit 2; }
python -c "import vllm" 2>/dev/null || { echo "gpu_smoke: vllm is not installed (pip install -e '.[vllm]')" >&2; exit 2; }
# vLLM's worker processes import trace_rl (the weight-loader extension): put the source tree on their path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1  # a local model only
exec timeout 480 python bench/gpu_smoke.py --device cuda "$@"
