#!/usr/bin/env bash
# The vLLM backend on one GPU, under 10 minutes (bench/gpu_smoke.py says what it checks and reports), after the
# CUDA-only tests: the flex tree-attention kernel's log-probs and gradients against the flat forward
# (tests/train/test_packing.py; torch has no flex backward on CPU, so only a GPU runs them).
#   bash bench/gpu_smoke.sh --model /path/to/local/model --sandbox strict|weak [--dtype float32] [--prompts 8]
# Needs a CUDA machine with pip install -e '.[lm,envs,vllm,dev]'. The model is a local directory (no hub access);
# the sandbox of the math tool is an explicit choice (strict needs bubblewrap). The interpreter is $PYTHON, else
# the repository's .venv-vllm (scripts/install_vllm_env.sh), else the python on PATH: the one that has vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi: this needs a CUDA GPU" >&2; exit 2; }
PY=${PYTHON:-}
[ -z "$PY" ] && [ -x .venv-vllm/bin/python ] && PY=.venv-vllm/bin/python
PY=${PY:-python}
"$PY" -c "import vllm" 2>/dev/null || { echo "gpu_smoke: vllm is not installed in $PY (pip install -e '.[vllm]', or set PYTHON)" >&2; exit 2; }
"$PY" -c "import pytest" 2>/dev/null || { echo "gpu_smoke: pytest is not installed in $PY (pip install -e '.[dev]')" >&2; exit 2; }
echo "gpu_smoke: $PY; the CUDA-only tests first (flex kernel forward and backward against the flat forward)"
timeout 120 "$PY" -m pytest -q -x tests/train/test_packing.py -k cuda -p no:cacheprovider \
  || { echo "gpu_smoke: FAIL: the CUDA-only packing tests (above)" >&2; exit 1; }
# vLLM's worker processes import trace_rl (the weight-loader extension): put the source tree on their path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1  # a local model only
exec timeout 480 "$PY" bench/gpu_smoke.py "$@"
