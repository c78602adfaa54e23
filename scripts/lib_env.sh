# The start every install script shares; sourced, never run:  . "$(dirname "$0")/lib_env.sh" DEFAULT_VENV
# Moves to the repository root, creates the venv $VENV (default: the argument) with $PYTHON (default python3)
# unless it exists, upgrades its pip, and sets
#   PIP         its quiet `pip install`
#   TORCH_SPEC  the torch requirement, default torch==2.13.0 (the CPU build every environment here pins;
#               on a GPU machine set it, with your CUDA index)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-${1:?lib_env.sh: give the default venv directory}}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
$PIP --upgrade pip
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
