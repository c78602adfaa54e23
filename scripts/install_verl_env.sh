#!/usr/bin/env bash
# Create .venv-verl: trace-rl with verl 0.9.1, for the verl integration and its tests. Idempotent.
#   VENV        where to build it (default .venv-verl)
#   TORCH_SPEC  torch requirement (default torch==2.13.0, the CPU build; on a GPU cluster install verl's own
#               stack instead: pip install "verl[vllm]==0.9.1", which pins torch 2.11 and vLLM 0.24)
# Why a second environment: verl 0.9.1 requires transformers>=5.5.3,<5.11 (not 5.6.0) and, through hydra-core,
# omegaconf<2.4, which trace-rl's command line cannot use (docs/integrations.md has the measurements). verl itself
# declares no torch; TransferQueue and the small servers below are what its V1 trainer imports beyond its
# install_requires (verl's own "verl-core" extra lists them with GPU-only packages we skip).
set -euo pipefail
. "$(dirname "$0")/lib_env.sh" .venv-verl  # cd to the root, the venv, PIP, TORCH_SPEC
$PIP "$TORCH_SPEC"
$PIP "verl==0.9.1" "TransferQueue>=0.1.10" cachetools uvicorn fastapi pyzmq msgspec
# the project on top without its own requirements: verl's hydra-core pins omegaconf<2.4 while trace-rl's command
# line needs 2.4 (PEP 585 list[...] settings); the integration never reads a trace-rl config, so the pin wins here.
# What the integration and its tests import is installed explicitly, held to verl's transformers range.
$PIP --no-deps -e .
$PIP pytest "transformers>=5.5.3,<5.11,!=5.6.0" tokenizers accelerate tqdm
# the example's reward (examples/verl/reward.py -> trace_rl.envs.math_env) grades answers with math-verify
$PIP "math-verify>=0.7"
"$VENV/bin/python" -c "import verl, transformers, math_verify; print('verl', verl.__version__, 'transformers', transformers.__version__)"
