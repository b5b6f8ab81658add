#!/usr/bin/env bash
# One device-tool call: the environment the grouped-conv calls share (written in session 21,
# which had no device time: not yet run), then the steps named as
# arguments (functions below). Everything is written to a scratch folder and packed into
# $OUT/bundle.tgz (the tool brings back at most 8 files); the autotune cache travels in
# .tw-cache (carried both ways).
#   usage: bash scripts/device_call.sh STEP [STEP ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src TILEWISE_CACHE_DIR=$PWD/.tw-cache PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton-cache
[ -f .triton-cache.tgz ] && tar xzf .triton-cache.tgz
R=$(mktemp -d)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
pack() {
  cp .tw-cache/autotune.json "$R/" 2>/dev/null
  tar czf "$OUT/bundle.tgz" -C "$R" .
}
TW=(python -m tilewise.cli)
study() {  # study NAME LIMIT ARGS...: a gconv study into $R, its exit code and table printed
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "${TW[@]}" bench gconv --impls tilewise cudnn --no-progress --plot \
    --study "$name" --out "$R" "$@" >"$R/$name.log" 2>&1
  echo "rc $? $(($(date +%s) - start)) s: $name"
  pack
  grep -E "^C=|^shape" "$R/$name.log" | cut -c1-230
}
gpu_tests() {  # gpu_tests LIMIT PYTEST-ARGS...
  local limit=$1 start
  shift
  start=$(date +%s)
  timeout "$limit" python -m pytest -m gpu -q -p no:cacheprovider --tb=short "$@" \
    >>"$R/tests.log" 2>&1
  echo "rc $? $(($(date +%s) - start)) s: pytest $*"
  grep -E "passed|failed|error" "$R/tests.log" | tail -n 2
  grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
  pack
}

nvidia-smi -L
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
for step in "$@"; do
  echo "=== $step"
  case "$step" in
    tests-new)  # session 21's unrun code: cuDNN as a candidate, the wide-kernel row-pair tiles
      gpu_tests 300 tests/test_gconv_library.py tests/test_gconv_cuda.py \
        -k "library or wide_kernel or every_tile_fprop or dependent or lean" ;;
    tests-par)  # the same tests in 4 processes at once (NVRTC compiles dominate: one core each)
      start=$(date +%s)
      T=tests/test_gconv_cuda.py
      P=(timeout 290 python -m pytest -m gpu -q -p no:cacheprovider --tb=short)
      "${P[@]}" $T -k "every_tile_fprop and float16" >"$R/tests-1.log" 2>&1 &
      "${P[@]}" $T -k "every_tile_fprop and bfloat16" >"$R/tests-2.log" 2>&1 &
      "${P[@]}" $T -k "wide_kernel or lean or dependent" >"$R/tests-3.log" 2>&1 &
      "${P[@]}" tests/test_gconv_library.py >"$R/tests-4.log" 2>&1 &
      wait
      echo "$(($(date +%s) - start)) s: tests-par"
      tail -qn 1 "$R"/tests-*.log
      grep -hE "^(FAILED|ERROR)" "$R"/tests-*.log | head
      pack ;;
    nan-probe)  # where row-pair tiles' NaN/Inf patterns differ from PyTorch's
      timeout 150 python scripts/nan_probe.py >"$R/nan-probe.log" 2>&1
      echo "rc $?: nan-probe"
      grep -vE " nan 0 inf 0$" "$R/nan-probe.log" | cut -c1-200 | head -40
      grep -c " nan 0 inf 0$" "$R/nan-probe.log"
      pack ;;
    tests-wide)  # the wide-kernel tiles (offered by default since session 22) and every tile
      start=$(date +%s)
      T=tests/test_gconv_cuda.py
      P=(timeout 240 python -m pytest -m gpu -q -p no:cacheprovider --tb=short)
      "${P[@]}" $T -k "every_tile_fprop and float16" >"$R/tests-1.log" 2>&1 &
      "${P[@]}" $T -k "every_tile_fprop and bfloat16" >"$R/tests-2.log" 2>&1 &
      "${P[@]}" $T -k "wide_kernel or lean or dependent" >"$R/tests-3.log" 2>&1 &
      "${P[@]}" tests/test_gconv.py -k "not wgrad" >"$R/tests-4.log" 2>&1 &
      wait
      echo "$(($(date +%s) - start)) s: tests-wide"
      tail -qn 1 "$R"/tests-*.log
      grep -hE "^(FAILED|ERROR)" "$R"/tests-*.log | head
      pack ;;
    mlp-diag)  # which impl faults at 8 layers, batch 8, hidden 8192, fp32 (session 22)
      i=0
      for impls in tilewise strassen "graph" compile; do
        i=$((i + 1))
        # shellcheck disable=SC2086
        CUDA_LAUNCH_BLOCKING=1 timeout 100 "${TW[@]}" bench mlp --dtypes fp32 --layers 8 \
          --batches 8 --hiddens 8192 --impls eager $impls --no-train --no-progress \
          --study "mlp-diag-$i" --out "$R" >"$R/mlp-diag-$i.log" 2>&1
        echo "rc $? impls eager $impls"
        grep -E "^ *8 +8192|rror" "$R/mlp-diag-$i.log" | grep -v Warning | tail -n 3
      done
      pack ;;
    k7-big)  # 7x7 at N = 128, 256 with the wide tiles offered
      TILEWISE_EXPERIMENTAL_FPROP=1 study gconv-s22-k7-big 265 --channels 64 --kernels 7 \
        --extra-kernels --n 128 256 --passes fprop dgrad ;;
    k57-small)  # 5x5/7x7 at N = 1, 8 (where cuDNN was faster), the wide tiles offered
      TILEWISE_EXPERIMENTAL_FPROP=1 study gconv-s21-k57-small 240 --channels 64 --kernels 5 7 \
        --extra-kernels --n 1 8 ;;
    k57-big)
      TILEWISE_EXPERIMENTAL_FPROP=1 study gconv-s21-k57-big 420 --channels 64 --kernels 5 7 \
        --extra-kernels --n 32 128 256 --passes fprop dgrad ;;
    small-fp16) study gconv-s21-small-fp16 200 --n 1 8 32 --extra-kernels --dtypes fp16 ;;
    small-bf16) study gconv-s21-small-bf16 200 --n 1 8 32 --extra-kernels --dtypes bf16 ;;
    big) study gconv-s21-big 420 --n 128 256 --extra-kernels ;;
    mlp-compile-fp32 | mlp-compile-fp16 | mlp-compile-bf16)
      # issue 4's compile column at 8 layers, every batch x hidden (63 cells), beside graph and
      # tilewise; the cells' max-autotune builds first, in 10 processes (--compile-warm-jobs)
      dt=${step##*-}
      start=$(date +%s)
      # shellcheck disable=SC2086
      timeout 560 "${TW[@]}" bench mlp --dtypes "$dt" --layers 8 ${MLP_BATCHES:+--batches $MLP_BATCHES} \
        --impls ${MLP_IMPLS:-eager graph compile tilewise strassen} --compile-warm-jobs 10 --no-train \
        --no-progress --plot --study "mlp-compile-L8-$dt${MLP_BATCHES:+-b${MLP_BATCHES// /-}}" --out "$R" >"$R/mlp-compile-$dt.log" 2>&1
      echo "rc $? $(($(date +%s) - start)) s: mlp-compile-$dt"
      pack
      grep -E "compile warm-up|not built" "$R/mlp-compile-$dt.log"
      ;;
    *) echo "unknown step $step" ;;
  esac
done
pack
