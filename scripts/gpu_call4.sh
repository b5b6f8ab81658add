#!/usr/bin/env bash
# one-off GPU call: the shipped fast gconv kernel's sweep, then the gconv GPU tests
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1
timeout 300 python3 benchmarks/sweep_gconv.py --all --problems c64_64x64_n128 c256_16x16_n128 c64_64x64_n8 c64_64x64_n128_k7 --out "$OUT" 2>&1 | tee "$OUT/sweep.log" | grep -v "^   [pm]"
timeout 230 python3 -m pytest -m gpu -x -q -p no:cacheprovider --tb=short --durations=10 tests/test_gconv.py -k "not full_size" >"$OUT/t_gconv.log" 2>&1
echo "gconv tests rc=$?"; tail -25 "$OUT/t_gconv.log"
TRITON_INTERPRET=0 timeout 40 python3 -m pytest -x -q -p no:cacheprovider tests/test_gconv.py -k "nan_inf or every_fprop or every_wgrad" 2>&1 | tail -3
