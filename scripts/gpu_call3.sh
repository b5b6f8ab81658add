#!/usr/bin/env bash
# one-off GPU call: failing GPU tests with tracebacks, then the fprop/dgrad variant sweep
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1
timeout 100 python3 -m pytest -m gpu -x -q -p no:cacheprovider --tb=short tests/test_models.py >"$OUT/t_models.log" 2>&1
echo "models rc=$?"; grep -E "Error|assert|passed|failed" "$OUT/t_models.log" | head -20
timeout 330 python3 benchmarks/sweep_gconv.py --problems c64_64x64_n128 c256_16x16_n128 c64_64x64_n8 --passes fprop dgrad --out "$OUT" 2>&1 | tee "$OUT/sweep.log" | grep -v "^   [pm]"
timeout 120 python3 -m pytest -m gpu -x -v -p no:cacheprovider --tb=short --durations=8 tests/test_linear.py >"$OUT/t_linear.log" 2>&1
echo "linear rc=$?"; grep -E "PASS|FAIL|Error|passed|failed|s call" "$OUT/t_linear.log" | tail -25
