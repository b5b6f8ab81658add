#!/usr/bin/env bash
# Make .venv (once) and install tilewise with its dev extras into it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  # 2.13.0 is the pinned build this project is tested with (a CPU wheel on the CPU machines).
  pip_install "torch==2.13.0"
fi
pip_install -e ".[dev]"
.venv/bin/python -c "import tilewise, torch, triton; print(f'tilewise {tilewise.__version__} (torch {torch.__version__}, triton {triton.__version__}) ready in .venv')"
