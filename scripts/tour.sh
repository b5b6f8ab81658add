#!/usr/bin/env bash
# Set up .venv and run the tour: tilewise's headline workloads against PyTorch on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tilewise tour "$@"
