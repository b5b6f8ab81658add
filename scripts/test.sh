#!/usr/bin/env bash
# Set up .venv and run the CPU test suite (real Triton kernels through the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
exec .venv/bin/python -m pytest -m "not gpu" -q -p no:cacheprovider "$@"
