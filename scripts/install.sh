#!/usr/bin/env bash
# Create .venv and install trace-rl with its test tools. Idempotent; rerun after pulling.
# EXTRAS=lm scripts/install.sh also installs the LM stack (torch pinned to the CPU build 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${EXTRAS:-}" = "lm" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[dev,lm]"
else
  .venv/bin/python -m pip install -q -e ".[dev]"
fi
