#!/usr/bin/env bash
# One device-tool call: the environment the grouped-conv calls share (written in session 21,
# first run in session 22), then the steps named as
# arguments (functions below). Everything is written to a scratch folder and packed into
# $OUT/bundle.tgz (the tool brings back at most 8 files); the autotune cache travels in
# .tw-cache (carried both ways), the Triton compile cache as $OUT/triton-cache.tgz beside the
# bundle (copy it to .triton-cache.tgz and carry that: the next call extracts it), and the NVRTC
# binaries as $OUT/nvrtc-cache.tgz (carried as .nvrtc-cache.tgz).
#   usage: bash scripts/device_call.sh STEP [STEP ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src TILEWISE_CACHE_DIR=$PWD/.tw-cache PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton-cache
# the caches may be gzip or xz (session 51: xz packs each to ~1.5 MB against 12-15 MB, which kept
# the tree with both under the device tool's 64 MiB); Python's tarfile reads either
untar() {
  python - "$1" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:  # gzip or xz, as the name says nothing
    try:
        t.extractall(filter="tar")
    except TypeError:  # a Python without extraction filters
        t.extractall()
PY
}
[ -f .triton-cache.tgz ] && untar .triton-cache.tgz
# the NVRTC binaries the last call compiled (session 43: a fresh machine spent a test step's
# whole 420 s compiling), as the Triton cache: copy $OUT/nvrtc-cache.tgz to .nvrtc-cache.tgz
[ -f .nvrtc-cache.tgz ] && untar .nvrtc-cache.tgz
R=$(mktemp -d)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
pack() {  # written aside and moved: a copy taken mid-write is never half a tarball
  cp .tw-cache/autotune.json "$R/" 2>/dev/null
  local tmp="$OUT/.bundle.$BASHPID.tmp"  # the repacker and a step may pack at once
  # BUNDLE_NAME: runs of this script in a loop under one OUT each keep their own bundle
  tar czf "$tmp" -C "$R" . && mv -f "$tmp" "$OUT/${BUNDLE_NAME:-bundle}.tgz"
}
# every PACK_EVERY seconds (default 45) the bundle is packed again, so a call the device tool
# cuts at its limit (session 26, call 7: the budget left shortened it, and the step, packed
# only at its end, returned nothing) still returns the studies' partial files and logs
main_pid=$$
(
  while sleep "${PACK_EVERY:-45}" && kill -0 "$main_pid" 2>/dev/null; do pack; done
) &
repacker=$!
trap 'kill "$repacker" 2>/dev/null' EXIT
TW=(python -m tilewise.cli)
find_ncu() {  # Nsight Compute's command line, or nothing where the image has none
  command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1
}
study() {  # study NAME LIMIT ARGS...: a gconv study into $R, its exit code and table printed
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "${TW[@]}" bench gconv --impls tilewise cudnn --no-progress --plot \
    --study "$name" --out "$R" "$@" >"$R/$name.log" 2>&1
  echo "rc $? $(($(date +%s) - start)) s: $name"
  pack
  grep -E "^C=|^shape" "$R/$name.log" | cut -c1-230
  "${TW[@]}" bench gconv-bars "$R/$name"*.json 2>/dev/null | tail -n 3  # issue 3's bars, counted
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
wg_tests() {  # the wgmma kernel's quick GPU tests (WG_TESTS, TEST_LIMIT; SKIP_TESTS=1 skips)
  [ -n "${SKIP_TESTS:-}" ] || gpu_tests "${TEST_LIMIT:-240}" tests/test_gconv_cuda.py \
    -k "${WG_TESTS:-test_deep_and_experimental_wgmma_tiles or test_wgmma_tiles_over_many_tiles}" -x
}
wg_probe() {  # wg_probe NAME KERNELS [ONLY]: the wgmma tiles (experimental too) timed beside the
  # candidates, C=64 N=128 (KS, DTYPES, ONLY, PROBE_LIMIT override), into wide-probe-NAME.*
  local only=${ONLY:-${3:-}}
  timeout "${PROBE_LIMIT:-240}" python scripts/gconv_wide_probe.py --experimental \
    --kernels ${KS:-$2} --n 128 --dtypes ${DTYPES:-fp16} --json "$R/wide-probe-$1.json" \
    ${only:+--only "$only"} >"$R/wide-probe-$1.log" 2>&1
  echo "rc $?: wide probe"
  grep -E "copy:|cudnn|cudawg|cudarp" "$R/wide-probe-$1.log" | cut -c1-150
}
probe_extra() {  # probe_extra NAME "EXTRAS": the wide probe (experimental tiles too) with extra
  # tiles (CudaTile argument strings; PROBE_K, PROBE_N, PROBE_C, DTYPES, PROBE_ONLY, PROBE_LIMIT) into
  # wide-probe-NAME.*
  # shellcheck disable=SC2086
  timeout "${PROBE_LIMIT:-240}" python scripts/gconv_wide_probe.py --experimental \
    --kernels ${PROBE_K:-3} --n ${PROBE_N:-128 256} --dtypes ${DTYPES:-fp16} \
    --channels ${PROBE_C:-64} --json "$R/wide-probe-$1.json" ${PROBE_ONLY:+--only "$PROBE_ONLY"} \
    --extra $2 >"$R/wide-probe-$1.log" 2>&1
  echo "rc $?: wide probe $1"
  grep -E "copy:|cudnn|cudawg|cudarp" "$R/wide-probe-$1.log" | cut -c1-150
  pack
}
wg_ablate() {  # wg_ablate PREFIX "SETTINGS" ONLY "KERNELS" LIMIT: the probe once a
  # TILEWISE_WG_ABLATE setting, fprop and dgrad, C=64 N=128 fp16; PREFIX-SETTING.log keeps
  # every run of a setting
  local a
  for a in $2; do
    TILEWISE_WG_ABLATE=$a timeout "$5" python scripts/gconv_wide_probe.py --experimental \
      --only "$3" --kernels $4 --n 128 --dtypes fp16 >"$R/wg-ablate.tmp" 2>&1
    echo "ablate $a rc $?"
    grep -E "(fprop|dgrad).*cudawg" "$R/wg-ablate.tmp" | cut -c1-110
    cat "$R/wg-ablate.tmp" >>"$R/$1-$a.log"
  done
  rm -f "$R/wg-ablate.tmp"
}
c64_study() {  # c64_study NAME "KERNELS" [LIMIT]: fprop/dgrad at C=64 (STUDY_N, DTYPES,
  # STUDY_LIMIT over LIMIT, default 300)
  # shellcheck disable=SC2086
  study "$1${STUDY_SUFFIX:-}" "${STUDY_LIMIT:-${3:-300}}" --kernels $2 \
    --channels 64 --n ${STUDY_N:-128 256} --passes fprop dgrad --dtypes ${DTYPES:-fp16 bf16}
}
par_tests() {  # par_tests NAME (FILE KEXPR)...: one pytest process per pair, at once
  local name=$1 start k=0 pids=()
  shift
  start=$(date +%s)
  while [ $# -ge 2 ]; do
    k=$((k + 1))
    timeout "${TEST_LIMIT:-210}" python -m pytest -m gpu -q -p no:cacheprovider --tb=short "$1" ${2:+-k "$2"} \
      >"$R/$name-$k.log" 2>&1 &
    pids+=($!)
    shift 2
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    echo "rc $? $name-$((k + 1)): $(tail -n 1 "$R/$name-$((k + 1)).log")"
  done
  echo "$(($(date +%s) - start)) s: $name"
  grep -hE "^(FAILED|ERROR)" "$R/$name"-*.log | head
  pack
}

wgslot_probe() {  # wgslot_probe NAME TILES [ARGS...]: the wgrad probe at C=64 5x5 and 7x7
  local name=$1 tiles=$2 k
  shift 2
  for k in 5 7; do
    # shellcheck disable=SC2086
    timeout "${PROBE_LIMIT:-120}" python scripts/wgrad_ablate_probe.py --channels 64 \
      --kernel $k --n ${WGSLOT_N:-32 128 256} --tile $tiles "$@" \
      --json "$R/$name-k$k.json" >"$R/$name-k$k.log" 2>&1
    echo "rc $?: $name ${k}x$k"
    grep -E "^ablate|Error" "$R/$name-k$k.log"
  done
}

# (file, -k expression) pairs and study arguments the steps below share
DWCL_TESTS=(
  tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16"
  tests/test_gconv_cuda.py "(every_wgrad_tile and bfloat16) or multi_row_blocks"
  tests/test_gconv.py "wgrad or channels_last or compile"
  tests/test_gconv_library.py ""
)
GEMV_TESTS=(tests/test_gemv_cuda.py "row_chunks or every_candidate")
#: every wgrad GPU test against PyTorch in eight processes (session 47: 227 s on a fresh machine)
WGRAD_ALL_TESTS=(
  tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16"
  tests/test_gconv_cuda.py "every_wgrad_tile and bfloat16"
  tests/test_gconv_cuda.py "multi_row_blocks or row_split_wgrad_tiles or sumk_wgrad_tiles"
  tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and not bfloat16"
  tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and bfloat16"
  tests/test_gconv_cuda.py "wgmma_wgrad_over_many_units_per_cta or slot_wgrad_tiles"
  tests/test_gconv_cuda.py "experimental_wgrad or workspace_is_left_zero"
  tests/test_gconv.py "(wgrad or backward) and not compile"
)
#: the wgmma candidates at 3x3, 5x5 and 7x7 (C=64): session 40's descriptor A/B
DESC_TILES="cudawg_t8x64c32w16m1s[23]_tma|cudawg_t16x64c16w8m1s2(a3)?_tma"
WGRAD_K5_N8=(--channels 64 --kernels 5 --extra-kernels --n 8 --passes wgrad)

ncu_wgrad() {  # ncu_wgrad FILE LIMIT KERNEL SKIP METRICS CMD...: Nsight Compute on launch
  # SKIP + 1 of the kernels named KERNEL... (a regex), the stall ratios and METRICS (",m1,m2")
  local f=$1 limit=$2 kernel=$3 skip=$4 metrics=$5 ncu
  shift 5
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout "$limit" "$ncu" --clock-control none -k "regex:$kernel" --launch-skip "$skip" -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$metrics" \
    ${NCU_SECTIONS:-} "$@" >"$f" 2>&1
  echo "rc $?: $f"
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Registers Per|Executed Instructions  " "$f" | head -8
  grep -E "issue_stalled" "$f" | awk '$NF+0 >= 0.1' | sort -k3 -g -r | head -8
}

gemv_timing() {  # fp32 8 layers at batch 32/64 with the row-chunked GEMV offered and without
  local on
  for on in 0 1; do
    TILEWISE_GEMV_ROW_CHUNKS=$on timeout 120 "${TW[@]}" bench mlp --dtypes fp32 --layers 8 \
      --batches 32 64 --hiddens 128 256 512 1024 2048 --impls eager graph tilewise \
      --no-train --no-compile --no-progress --study "mlp-gemv-chunks$on-s24" --out "$R" \
      >"$R/mlp-gemv-chunks$on.log" 2>&1
    echo "rc $? TILEWISE_GEMV_ROW_CHUNKS=$on"
    grep -E "^fp32 +8 " "$R/mlp-gemv-chunks$on.log" | cut -c1-120
  done
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
      par_tests tests-par tests/test_gconv_cuda.py "every_tile_fprop and not bfloat16" \
        tests/test_gconv_cuda.py "every_tile_fprop and bfloat16" \
        tests/test_gconv_cuda.py "wide_kernel or lean or dependent" \
        tests/test_gconv_library.py "" ;;
    tests-wide)  # the wide-kernel tiles (offered by default since session 22) and every tile
      par_tests tests-wide tests/test_gconv_cuda.py "every_tile_fprop and not bfloat16" \
        tests/test_gconv_cuda.py "every_tile_fprop and bfloat16" \
        tests/test_gconv_cuda.py "wide_kernel or lean or dependent" \
        tests/test_gconv.py "not wgrad" ;;
    mlp-diag)  # which impl faults at 8 layers, batch 8, hidden 8192, fp32 (session 22)
      i=0
      for impls in tilewise strassen graph compile; do
        i=$((i + 1))
        # shellcheck disable=SC2086
        CUDA_LAUNCH_BLOCKING=1 timeout 100 "${TW[@]}" bench mlp --dtypes fp32 --layers 8 \
          --batches 8 --hiddens 8192 --impls eager $impls --no-train --no-progress \
          --study "mlp-diag-$i" --out "$R" >"$R/mlp-diag-$i.log" 2>&1
        echo "rc $? impls eager $impls"
        grep -E "^ *8 +8192|rror" "$R/mlp-diag-$i.log" | grep -v Warning | tail -n 3
      done
      pack ;;
    ncu-k357)  # session 29: Nsight Compute on the autotuner's fp16 fprop choices at C=64 64x64
      # N = 128 (3x3 8x32 64-ch, 5x5 16x16 64-ch, 7x7 16x16 2-CTA): what bounds 5x5 and 7x7;
      # NCU_SPECS="K|CudaTile args ..." picks others, NCU_STALLS=1 adds the stall reasons
      NCU=$(find_ncu)
      echo "ncu: ${NCU:-none}"
      specs=${NCU_SPECS:-"3|8,32,64,16,1,2,rowpair=True,tma=2 5|16,16,64,8,1,2,rowpair=True,tma=2 7|16,16,32,4,2,2,rowpair=True,tma=2 7|8,16,32,4,3,2,rowpair=True,tma=2"}
      stalls=()
      [ "${NCU_STALLS:-0}" = 1 ] && stalls=(--metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
      for spec in $specs; do
        k=${spec%%|*} t=${spec#*|}
        f="$R/ncu-k${k}-${t//[^0-9a-z]/_}.txt"
        timeout 150 "$NCU" --clock-control none -k regex:tw_gconv_fprop --launch-skip 2 -c 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section WarpStateStats --section Occupancy --section LaunchStats \
          --section SchedulerStats --section InstructionStats "${stalls[@]}" \
          python scripts/ncu_targets.py gconv-fprop --k "$k" --tile-spec "$t" >"$f" 2>&1
        echo "rc $? k=$k tile=$t"
        grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps|Registers Per|highest-utilized" "$f" | head -8
        grep -E "issue_stalled" "$f" | awk '$NF+0 >= 0.05' | sort -k3 -g -r | head -12
      done
      pack ;;
    k7-big)  # 7x7 at N = 128, 256 (the wide-kernel row-pair tiles)
      study gconv-s22-k7-big 265 --channels 64 --kernels 7 \
        --extra-kernels --n 128 256 --passes fprop dgrad ;;
    k57-small)  # 5x5/7x7 at N = 1, 8 (cuDNN was faster at 7x7 N = 1 until session 22)
      study gconv-s21-k57-small 240 --channels 64 --kernels 5 7 \
        --extra-kernels --n 1 8 ;;
    k57-s29)  # session 29's tall tiles (5x5, 7x7 at C=64) in the study, beside cuDNN
      study gconv-s29-k57 "${K57_LIMIT:-280}" --channels 64 --kernels 5 7 \
        --extra-kernels --n 128 256 --passes fprop dgrad ;;
    wsmem)  # session 29's weights-in-shared-memory tiles (run in session 30): every odd
      # shape and NaN/Inf (they are extra tiles of test_every_tile_fprop_and_dgrad), then timed
      # beside every row-pair candidate at 3x3/5x5/7x7
      par_tests wsmem tests/test_gconv_cuda.py "every_tile_fprop and (k7x7 or k6x7)" \
        tests/test_gconv_cuda.py "every_tile_fprop and (k3x5 or k5x5)" \
        tests/test_gconv_cuda.py "every_tile_fprop and not (k7x7 or k6x7 or k3x5 or k5x5)"
      timeout 200 python scripts/gconv_wide_probe.py --kernels 7 5 3 --n 128 --dtypes fp16 bf16 \
        --extra "16,32,32,16,1,2,rowpair=True,tma=2,wsmem=True" \
        "8,32,32,16,1,2,rowpair=True,tma=2,wsmem=True" --json "$R/wide-probe-wsmem.json" \
        >"$R/wide-probe-wsmem.log" 2>&1
      echo "rc $?: wide probe"
      grep -E "copy:|_ws_|t32x|t16x16c64|t8x32c64" "$R/wide-probe-wsmem.log" | head -60
      pack ;;
    k57-s30)  # session 30's warpgroup-MMA tiles (5x5, 7x7 at C=64) in the study, beside cuDNN
      study gconv-s30-k57 "${K57_LIMIT:-300}" --channels 64 --kernels 5 7 \
        --extra-kernels --n 128 256 --passes fprop dgrad ;;
    k3-s30)  # and at 3x3 (>= 64 MB: the bars), fprop and dgrad
      study gconv-s30-k3 "${K3_LIMIT:-300}" --channels ${K3_CHANNELS:-64 128} --kernels 3 \
        --extra-kernels --n 128 256 --passes fprop dgrad ;;
    tests-wgmma)  # the wgmma tiles' non-finite test, one process per kernel size
      par_tests tests-wgmma tests/test_gconv_cuda.py "wgmma_tiles_over_many and 3-" \
        tests/test_gconv_cuda.py "wgmma_tiles_over_many and 5-" \
        tests/test_gconv_cuda.py "wgmma_tiles_over_many and 7-" ;;
    wgmma-s31)  # session 31's EXPERIMENTAL_WGMMA_TILES timed beside every candidate, C=64
      # N=128 (PROBE_KERNELS, PROBE_DTYPES), fprop and dgrad (call 1 ran the first set: 2-4
      # CTAs an SM, 8-channel blocks, 12 rows)
      timeout "${PROBE_LIMIT:-240}" python scripts/gconv_wide_probe.py --experimental \
        --kernels ${PROBE_KERNELS:-7 5} --n ${PROBE_N:-128} --dtypes ${PROBE_DTYPES:-fp16} \
        --json "$R/wide-probe-wgmma${PROBE_TAG:-}-s31.json" >"$R/wide-probe-wgmma.log" 2>&1
      echo "rc $?: wide probe"
      grep -E "copy:|Error|cudawg|t32x|t16x16c64" "$R/wide-probe-wgmma.log" | cut -c1-120 | head -80
      pack ;;
    wgrad-wg)  # session 31's wgrad prototype on wgmma (correctness on odd shapes, then timed
      # beside cuDNN and the library's autotuned wgrad)
      timeout "${WG_LIMIT:-240}" python scripts/gconv_wgrad_wgmma_probe.py \
        --kernels ${WG_KERNELS:-7 5} --n ${WG_N:-128} --dtypes ${WG_DTYPES:-fp16} \
        ${WG_VARIANTS:+--variants $WG_VARIANTS} --json "$R/wgrad-wgmma${WG_TAG:-}-${SESSION:-s32}.json" \
        >"$R/wgrad-wgmma${WG_TAG:-}.log" 2>&1
      echo "rc $?: wgrad wgmma probe"
      grep -vE "Warn|warn" "$R/wgrad-wgmma${WG_TAG:-}.log" | cut -c1-160 | tail -n 60
      pack ;;
    wgrad-wg-s32)  # session 32's wgmma wgrad in the library (A and B in shared memory): its GPU
      # tests (odd shapes, many units a CTA, the candidates, the workspace), then every tile timed
      # beside session 31's prototype, the library's autotuned wgrad and cuDNN
      [ "${SKIP_TESTS:-0}" = 1 ] || par_tests wgwg tests/test_gconv_cuda.py \
        "wgmma_wgrad_tiles_on_odd_shapes and not bfloat16" tests/test_gconv_cuda.py \
        "wgmma_wgrad_tiles_on_odd_shapes and bfloat16" tests/test_gconv_cuda.py \
        "wgmma_wgrad_over_many_units" tests/test_gconv_cuda.py "workspace_is_left_zero"
      timeout "${WG_LIMIT:-240}" python scripts/gconv_wgrad_wgmma_probe.py --library-tiles \
        --kernels ${WG_KERNELS:-7 5 3} --n ${WG_N:-128} --dtypes ${WG_DTYPES:-fp16} --checks 1 \
        --variants ${WG_VARIANTS:-2,2,1,1,4,1} --json "$R/wgrad-wg${WG_TAG:-}-s32.json" \
        >"$R/wgrad-wg${WG_TAG:-}.log" 2>&1
      echo "rc $?: wgrad wgmma (library tiles)"
      grep -vE "Warn|warn" "$R/wgrad-wg${WG_TAG:-}.log" | cut -c1-160 | tail -n 40
      pack ;;
    wgrad-bounds-s33)  # session 33: the producer-warp wgmma wgrad tiles timed whole and in
      # WG_PROBE modes (WG_BOUNDS: bits 1 no MMAs, 2 no loads, 4 no atomics), a per-CTA timeline
      # (WG_TIMELINE modes), beside cuDNN; WG_TILES picks library tiles
      timeout "${WG_LIMIT:-200}" python scripts/gconv_wgrad_wgmma_probe.py --library-tiles \
        --bounds ${WG_BOUNDS:-1 2} --timeline ${WG_TIMELINE:-} --variants --kernels ${WG_KERNELS:-7 5} --n ${WG_N:-128} \
        --dtypes ${WG_DTYPES:-fp16} --checks 0 ${WG_TILES:+--tile-names $WG_TILES} \
        ${WG_SHAPES:+--shapes $WG_SHAPES} --json "$R/wgrad-bounds${WG_TAG:-}-s33.json" >"$R/wgrad-bounds${WG_TAG:-}.log" 2>&1
      echo "rc $?: wgrad wgmma bounds"
      grep -vE "Warn|warn" "$R/wgrad-bounds${WG_TAG:-}.log" | cut -c1-160 | tail -n 40
      pack ;;
    wgrad-check)  # session 34: the wgmma wgrad GPU tests on the tiles named by WG_CHECK (substrings)
      timeout "${WG_LIMIT:-200}" python scripts/check_wgmma_wgrad_tiles.py ${WG_CHECK:-_tma3} \
        --dtypes ${WG_DTYPES:-fp16 bf16} >"$R/wgrad-check.log" 2>&1
      echo "rc $?: wgrad tile check"
      tail -n 12 "$R/wgrad-check.log" | cut -c1-300
      pack ;;
    wgrad-k57-s34)  # session 34: two more wgmma wgrad tiles offered (16 columns x 32 channels;
      # 32 columns, 8 rows a step): the study's 5x5/7x7 wgrad cells
      study "gconv-s34-wgrad-k57${STUDY_SUFFIX:-}" "${STUDY_LIMIT:-200}" --kernels 5 7 \
        --channels ${STUDY_CHANNELS:-128 256} --n ${STUDY_N:-32 128 256} --passes wgrad \
        --dtypes ${STUDY_DTYPES:-fp16} ;;
    wgrad-k57-s33)  # session 33's wgmma wgrad (red.v4, two producer warps) in the study
      study "gconv-s33-wgrad-k57${STUDY_SUFFIX:-}" "${STUDY_LIMIT:-200}" --kernels 5 7 \
        --channels ${STUDY_CHANNELS:-64 128 256} --n ${STUDY_N:-32 128 256} --passes wgrad \
        --dtypes ${STUDY_DTYPES:-fp16} ;;
    wgrad-k57-s32)  # the wgmma wgrad tiles in the study: 5x5 and 7x7 wgrad at the three shapes
      study "gconv-s32-wgrad-k57${STUDY_SUFFIX:-}" "${STUDY_LIMIT:-200}" --kernels 5 7 \
        --channels ${STUDY_CHANNELS:-64 128 256} --n ${STUDY_N:-32 128 256} --passes wgrad \
        --dtypes ${STUDY_DTYPES:-fp16} ;;
    tests-s32)  # the wgrad tests with the wgmma wgrad tiles offered (5+ row kernels), 5 processes
      par_tests tests32 tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "every_wgrad_tile and bfloat16" \
        tests/test_gconv.py "full_size or opcheck or autotune" \
        tests/test_gconv.py "not (full_size or opcheck or autotune)" \
        tests/test_gconv_cuda.py "wgmma_wgrad or workspace_is_left_zero" ;;
    tests-s33)  # session 33: the grouped-conv op tests with the red.v4 / two-producer wgmma wgrad
      par_tests tests33 tests/test_gconv.py "full_size or opcheck or autotune" \
        tests/test_gconv.py "not (full_size or opcheck or autotune)" \
        tests/test_gconv_library.py "" tests/test_gconv_plan.py "" ;;
    tests-s34)  # session 34 (staged tiles' swizzle; offered tiles' source re-written by macros):
      # every wgrad candidate, every wgmma wgrad tile on odd shapes (fp16), the op tests
      par_tests tests34 tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "every_wgrad_tile and bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_over_many_units or workspace_is_left_zero" \
        tests/test_gconv.py "full_size or opcheck or autotune" \
        tests/test_gconv.py "not (full_size or opcheck or autotune)" ;;
    exact-s35)  # session 35: the exact recompute of tiles with non-finite outputs by per-tap
      # MMAs (row-pair and wgmma kernels): their GPU tests, then the Inf timing probe
      par_tests exact35 tests/test_gconv_cuda.py "nonfinite_blocks" \
        tests/test_gconv_cuda.py "wgmma_tiles_over_many_tiles_with_non_finite or wgmma_tiles_on_edge" \
        tests/test_gconv_cuda.py "every_tile_fprop_and_dgrad and not bfloat16" \
        tests/test_gconv_cuda.py "(every_tile_fprop_and_dgrad and bfloat16) or wide_kernel_row_pair or tma_pipeline"
      timeout "${CLIFF_LIMIT:-200}" python scripts/nonfinite_cliff_probe.py ${CLIFF_ARGS:-} \
        >"$R/nonfinite-cliff.log" 2>&1
      echo "rc $?: nonfinite cliff"
      grep -vE "Warn|warn" "$R/nonfinite-cliff.log" | cut -c1-200 | tail -n 80
      pack ;;
    exact-s35b)  # the rest of exact-s35's tests (its fourth process ran out of time in the
      # wide-kernel row-pair test)
      par_tests exact35b tests/test_gconv_cuda.py "wide_kernel_row_pair and not bfloat16" \
        tests/test_gconv_cuda.py "wide_kernel_row_pair and bfloat16" ;;
    roll-s36)  # session 36: the rolling-row wgmma tiles' tests, then timed beside the candidates
      gpu_tests "${TEST_LIMIT:-200}" tests/test_gconv_cuda.py -k "test_roll_tiles" -x
      timeout "${PROBE_LIMIT:-240}" python scripts/gconv_wide_probe.py --roll --kernels ${KS:-7 5 3} \
        --n 128 --dtypes ${DTYPES:-fp16} --json "$R/wide-probe-roll.json" \
        ${ONLY:+--only "$ONLY"} >"$R/wide-probe-roll.log" 2>&1
      echo "rc $?: wide probe"
      grep -E "copy:|cudnn|cudawr|cudawg|cudarp" "$R/wide-probe-roll.log" | cut -c1-150
      pack ;;
    wg-stages-s37)  # session 37: the wgmma tiles with three halo stages (experimental): their
      # tests, then timed beside the candidates (ONLY, KS, DTYPES)
      wg_tests
      wg_probe wgs3 "7 5 3"
      pack ;;
    wg-loop-s38)  # session 38: the group-loop wgmma tiles (a warpgroup takes 2 or 4 groups in
      # turn, epilogue under the next group's wgmmas) and three A-fragment sets (experimental):
      # their tests, then timed beside the candidates (ONLY, KS, DTYPES), then the MMA phase
      # alone (TILEWISE_WG_ABLATE=9) of the same tiles at 5x5 (LOOP_ABLATE_ONLY); SKIP_TESTS=1
      # times only
      wg_tests
      wg_probe loop "5 3 7" "cudawg_t8x64c32|cudawg_t16x64c16w8"
      wg_ablate wg-loop-ablate "${LOOP_ABLATE_SET:-9}" \
        "${LOOP_ABLATE_ONLY:-cudawg_t8x64c32|cudawg_t16x64c16w8}" 5 "${ABLATE_LIMIT:-100}"
      pack ;;
    desc-s40)  # session 40: the wgmma descriptors' base read from lane 0 (uniform datapath),
      # descriptors by an add, a column's wgmmas alternating accumulators (ABLATE 32: the old
      # order; 48 also the old opaque base; 16 the old base alone): the candidates' edge-shape
      # and many-tiles tests, then the forms whole (DESC_SET, DESC_KS) in turn, then the MMA
      # phase alone (DESC_PHASE_SET: 9 and 9 plus the bits) at 5x5
      WG_TESTS=${WG_TESTS:-test_wgmma_tiles_on_edge_shapes or test_wgmma_tiles_over_many_tiles} \
        wg_tests
      wg_ablate desc "${DESC_SET:-0 16 0 16}" "${DESC_ONLY:-$DESC_TILES}" "${DESC_KS:-5 7 3}" \
        "${ABLATE_LIMIT:-120}"
      wg_ablate desc "${DESC_PHASE_SET:-9 25}" "${DESC_ONLY:-$DESC_TILES}" 5 "${ABLATE_LIMIT:-120}"
      pack ;;
    wg-ablate-s37)  # session 37: wgmma tiles with parts switched off (TILEWISE_WG_ABLATE: 1 no
      # staging writes or TMA stores, 2 no wgmmas, 3 the halo loads alone, 4 the first halos
      # after the weights as before session 37, 8 no halo loads; 16/32, evict-first L2 hints on
      # the stores/loads, were read in call 8 and removed): what each costs
      wg_ablate wg-ablate "${ABLATE_SET:-0 1 2 3}" "${ABLATE_ONLY:-cudawg}" "${KS:-7 5}" 100
      pack ;;
    roll-ablate-s36)  # session 36: the rolling-row tiles with parts switched off (1 TMA stores,
      # 2 MMAs, 3 both; 4, no waits for rows, hangs): what each costs
      for a in ${ABLATE_SET:-0 1 2 3}; do
        TILEWISE_ROLL_ABLATE=$a timeout 100 python scripts/gconv_wide_probe.py \
          --roll --only cudawr --kernels ${KS:-7 3} --n 128 --dtypes fp16 \
          >"$R/roll-ablate-$a.log" 2>&1
        echo "ablate $a rc $?"
        grep -E "fprop.*cudawr" "$R/roll-ablate-$a.log" | cut -c1-110
      done
      pack ;;
    ncu-roll-s36)  # session 36: Nsight Compute on a rolling-row tile (NCU_K, NCU_SPEC), with
      # the source counters (where warps stall) and the SASS of the hottest lines
      NCU=$(find_ncu)
      f="$R/ncu-roll-k${NCU_K:-7}.txt"
      timeout 200 "$NCU" --clock-control none -k regex:tw_gconv_fprop --launch-skip 2 -c 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section SourceCounters --section MemoryWorkloadAnalysis_Tables \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        --export "$R/ncu-roll-k${NCU_K:-7}" \
        python scripts/ncu_targets.py gconv-fprop --k "${NCU_K:-7}" \
        --tile-spec "${NCU_SPEC:-32,64,16,4,3,4,tma=2,wgmma=True,roll=True}" >"$f" 2>&1
      echo "rc $?: $f"
      grep -E "Duration|Issued Warp|Eligible|No Eligible" "$f" | head -6
      grep -E "issue_stalled" "$f" | awk '$NF+0 >= 0.1' | sort -k3 -g -r | head -10
      "$NCU" --import "$R/ncu-roll-k${NCU_K:-7}.ncu-rep" --page source --csv --print-source sass \
        >"$R/ncu-roll-sass-k${NCU_K:-7}.csv" 2>&1
      echo "sass rc $? $(wc -l <"$R/ncu-roll-sass-k${NCU_K:-7}.csv") lines"
      pack ;;
    k357-s35)  # the fprop/dgrad study cells at C=64 N=128 fp16 after the exact-path change
      study "gconv-s35-k357${STUDY_SUFFIX:-}" "${STUDY_LIMIT:-150}" --kernels 3 5 7 \
        --channels 64 --n 128 --passes fprop dgrad --dtypes fp16 ;;
    k5-s37)  # session 37: the 5x5 fprop/dgrad cells at C=64 with the three-stage wgmma candidate
      c64_study gconv-s37-k5 5 ;;
    k57-s40)  # session 40: the 5x5 and 7x7 fprop/dgrad cells at C=64 after the wgmma
      # descriptor change
      c64_study gconv-s40-k57 "5 7" 330 ;;
    k357-s41)  # session 41 (the first H200-only session): the 3x3, 5x5 and 7x7 fprop/dgrad
      # cells at C=64 (STUDY_N, DTYPES as c64_study)
      c64_study gconv-s41-k357 "3 5 7" 420 ;;
    h200-k3-s41)  # session 41: every 3x3 fprop/dgrad tile on the H200 (the candidates, the
      # experimental wgmma tiles, three-stage forms as extras), then the wgmma candidates'
      # halo loads alone (3) and MMA phase alone (9) beside whole (0)
      X=",rowpair=True,tma=2"
      PROBE_K=3 probe_extra h200-k3 "8,64,32,16,1,3,tma=2,wgmma=True 16,16,32,4,2,3$X
        16,16,64,8,1,3$X 8,32,64,16,1,3$X 16,32,32,8,1,3$X"
      wg_ablate k3-ablate "${ABLATE_SET:-0 3 9}" "${DESC_ONLY:-$DESC_TILES}" 3 \
        "${ABLATE_LIMIT:-60}"
      pack ;;
    probe-extra)  # session 41: the wide probe with extra tiles (PROBE_EXTRA: CudaTile argument
      # strings, space-separated; PROBE_K, PROBE_N, DTYPES, PROBE_ONLY, PROBE_NAME)
      probe_extra "${PROBE_NAME:-extra}" "${PROBE_EXTRA:-}" ;;
    timer-probe-s41)  # session 41: every candidate of the C=64 3x3 fprop/dgrad read warm, briefly,
      # cold and rotated (which timer ranks as the study does, on the H200's 60 MB L2), then the
      # wgmma 3x3 tiles without stores (1) and without wgmmas (2)
      # shellcheck disable=SC2086
      timeout "${PROBE_LIMIT:-240}" python scripts/autotune_timer_probe.py --n ${PROBE_N:-128 256} \
        --kernels ${PROBE_K:-3} --dtypes ${DTYPES:-fp16} --json "$R/timer-probe.json" \
        >"$R/timer-probe.log" 2>&1
      echo "rc $?: timer probe"
      grep -E "copy:|^(fprop|dgrad)|picks" "$R/timer-probe.log"
      pack
      wg_ablate k3-ablate "${ABLATE_SET:-1 2}" "${DESC_ONLY:-$DESC_TILES}" 3 "${ABLATE_LIMIT:-60}"
      pack ;;
    rowpair-tests-s42)  # session 42: the GPU tests that launch row-pair tiles beyond
      # occupancy-s41's (wide kernels, NaN/Inf, the lean launcher, edge shapes), the module's
      # and the CUDA-graph tests, with the occupancy cap on, three processes at once
      par_tests rowpair-s42 \
        tests/test_gconv_cuda.py "wide_kernel_row_pair or nan_stays or nonfinite_blocks or lean_launcher or on_edge_shapes or edge_cases" \
        tests/test_gconv.py "" tests/test_capture.py "" ;;
    k57-s42)  # session 42: the C=64 5x5/7x7 fprop/dgrad cells with the occupancy cap on
      # (row-pair tiles are 5x5/7x7 candidates too; session 41's k357-s41 without it)
      DTYPES=${DTYPES:-fp16} c64_study gconv-s42-k57 "5 7" 300 ;;
    ncu-k3-s42)  # session 42 (prepared after its device time): where the 3x3 kernels' DRAM
      # bytes go. Nsight Compute with L2 left warm between launches (--cache-control none) on the
      # wgmma 8x64 tile whole (0), loads and stores without wgmmas (2) and loads alone (3), the
      # 4x64 64-channel wgmma tile whole and loads alone, and the row-pair 8x16 4-CTA tile, C=64
      # N=128 fp16: DRAM bytes read and written against the 134 MB compulsory (are halo rows
      # read from DRAM again?), L2 sectors read and written, L2 hit rate, DRAM throughput
      NCU=$(find_ncu)
      echo "ncu: ${NCU:-none}"
      [ -n "$NCU" ] || continue  # no Nsight Compute on this machine: the next step
      m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
      m=$m,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum
      m=$m,lts__t_sectors_op_write.sum
      # the 8x64 32-channel tile (64-byte box rows) and the 4x64 64-channel one (128-byte rows,
      # 1.55x halo against 1.29x; session 41: its loads alone 23 us against 26)
      wg8=8,64,32,16,1,2,tma=2,wgmma=True wg4=4,64,64,16,1,3,tma=2,wgmma=True
      for spec in ${NCU_SPECS:-"0|$wg8" "2|$wg8" "3|$wg8" "0|$wg4" "3|$wg4" "0|8,16,32,4,4,2,rowpair=True,tma=2"}; do
        a=${spec%%|*} t=${spec#*|}
        f="$R/ncu-k3-a$a-${t//[^0-9a-z]/_}.txt"
        # application replay: every pass a fresh run, so each pass's launch meets the L2 that
        # the three launches before it left (kernel replay's later passes would not)
        TILEWISE_WG_ABLATE=$a timeout "${NCU_LIMIT:-90}" "$NCU" --clock-control none --cache-control none \
          --replay-mode application -k regex:tw_gconv_fprop --launch-skip 3 -c 1 --metrics "$m" \
          python scripts/ncu_targets.py gconv-fprop --k 3 --tile-spec "$t" >"$f" 2>&1
        echo "rc $? ablate $a tile $t"
        grep -E "gpu__time|dram__|lts__" "$f" | head -9
      done
      pack ;;
    cut-tests-s43)  # session 43: the GPU tests the limits of sessions 42 and 43 cut (none
      # failed), and the counters' test with its shapes of many tiles a CTA (the review's mend,
      # after the device time), one process each (TEST_LIMIT; a fresh machine compiles every
      # variant they name)
      TEST_LIMIT=${TEST_LIMIT:-450} par_tests cut-s43 \
        tests/test_gconv_cuda.py "dynamic_tiles_equal" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes" \
        tests/test_gconv_cuda.py "experimental_wgrad_tiles" \
        tests/test_gconv_cuda.py "nonfinite_blocks_match_pytorch_values_too" ;;
    ncu-l2-s43)  # session 43 (prepared after its device time): is the L2 the 3x3 kernels'
      # bound? Nsight Compute's throughput breakdowns (SpeedOfLight and the memory tables, every
      # detail) of the row-pair 8x16 32-channel pick against the 64-channel row-pair tiles (whole
      # 128-byte pixels: each line looked up once, not once per channel block), C=64 3x3 N=128
      # fp16; then the 3x3 tap wgrad (its ~11 us a launch: SM-active cycles, warp states)
      NCU=$(find_ncu)
      echo "ncu: ${NCU:-none}"
      [ -n "$NCU" ] || continue
      for t in ${NCU_SPECS:-8,16,32,4,4,2,rowpair=True,tma=2 16,16,64,8,1,2,rowpair=True,tma=2 \
          8,32,64,16,1,2,rowpair=True,tma=2}; do
        f="$R/ncu-l2-${t//[^0-9a-z]/_}.txt"
        timeout "${NCU_LIMIT:-60}" "$NCU" --clock-control none --cache-control none \
          -k regex:tw_gconv_fprop --launch-skip 3 -c 1 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
          --print-details all python scripts/ncu_targets.py gconv-fprop --k 3 --tile-spec "$t" \
          >"$f" 2>&1
        echo "rc $? $t"
        grep -E "Duration|SM Active|Elapsed Cycles|DRAM Throughput|L2 Cache Throughput|lts__" "$f" \
          | head -16
      done
      f="$R/ncu-wgrad-k3.txt"
      timeout "${NCU_LIMIT:-60}" "$NCU" --clock-control none --cache-control none \
        -k regex:tw_gconv_wgrad --launch-skip 3 -c 1 --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section SchedulerStats \
        python scripts/ncu_targets.py gconv-wgrad --k 3 --tile-spec "16,16,64,8,1,2,tma=1" \
        >"$f" 2>&1
      echo "rc $?: wgrad"
      grep -E "Duration|SM Active|Elapsed Cycles|DRAM Throughput|L2 Cache|Grid Size|Waves" "$f"
      pack ;;
    op-tests-s44)  # session 44: the op's and the CUDA-graph GPU tests with the 64-channel
      # row-pair tiles among the autotuner's candidates, four processes
      TEST_LIMIT=${TEST_LIMIT:-280} par_tests op-s44 \
        tests/test_gconv.py "wgrad" \
        tests/test_gconv.py "not wgrad and (autotune or opcheck)" \
        tests/test_gconv.py "not wgrad and not autotune and not opcheck" \
        tests/test_capture.py "" ;;
    cut-tests-s44)  # session 44: the GPU tests sessions 42-44 cut by their limits (none failed: a
      # fresh machine spends minutes compiling their variants), six processes at once
      TEST_LIMIT=${TEST_LIMIT:-540} par_tests cut-s44 \
        tests/test_gconv_cuda.py "nonfinite_blocks_match_pytorch_values_too and 3-" \
        tests/test_gconv_cuda.py "nonfinite_blocks_match_pytorch_values_too and 5-" \
        tests/test_gconv_cuda.py "nonfinite_blocks_match_pytorch_values_too and 7-" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and bfloat16" \
        tests/test_gconv_cuda.py "experimental_wgrad_tiles" ;;
    tail-s45)  # session 45: the last round of tiles. The C=64 3x3 pick (8x8 64-channel, 4 CTAs
      # an SM: 528 persistent CTAs) takes 8192 tiles at N = 128, 15.5 rounds; N = 132 is 16 whole
      # rounds, N = 124 15.03. Per image the same time at 128 and 132 would say the part-used
      # last round costs its whole round
      PROBE_N="${PROBE_N:-124 128 132 256 264}" PROBE_ONLY="${PROBE_ONLY:-cudarp_t8x8c64w8m4s2_tma2}" \
        probe_extra tail-s45 "" ;;
    insitu-s45)  # session 45: the in-situ stacks (ConvFirst C=64 64x64, MBConv C=256 16x16) on
      # the H200 with the 64-channel row-pair tiles; per-kernel times by torch.profiler, then the
      # whole training step (INSITU_IMPLS, INSITU_BATCHES, INSITU_NAME, INSITU_LIMIT)
      start=$(date +%s)
      name=${INSITU_NAME:-gconv-insitu-s45-h200}
      # shellcheck disable=SC2086
      timeout "${INSITU_LIMIT:-360}" "${TW[@]}" bench gconv-insitu --no-progress --plot \
        --batches ${INSITU_BATCHES:-32 64 128 192 256} --impls ${INSITU_IMPLS:-tilewise eager} \
        --study "$name" --out "$R" >"$R/$name.log" 2>&1
      echo "rc $? $(($(date +%s) - start)) s: $name"
      grep -vE "^\s*$" "$R/$name.log" | grep -vE "^(\[|W[0-9]|  warnings)" | tail -n 60 | cut -c1-200
      pack ;;
    attr-s45)  # session 45: the in-situ attribution's launch check (a kernel booked only to the op
      # holding its runtime launch record): its GPU tests, then ConvFirst at the batches where the
      # fprop launches read 4.4-5.1 an iteration against 4
      gpu_tests "${TEST_LIMIT:-120}" tests/test_models.py -k "insitu_attribution"
      start=$(date +%s)
      name=gconv-insitu-s45-check
      # shellcheck disable=SC2086
      timeout "${INSITU_LIMIT:-180}" "${TW[@]}" bench gconv-insitu --no-progress --blocks convfirst \
        --batches ${INSITU_BATCHES:-128 192 256} --impls tilewise eager --study "$name" \
        --out "$R" >"$R/$name.log" 2>&1
      echo "rc $? $(($(date +%s) - start)) s: $name"
      grep -E "^convfirst|^block" "$R/$name.log" | cut -c1-200
      python - "$R/$name"__*.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["records"]:
    if r.get("record") == "pass":
        print(r["impl"], r["batch"], r["pass"], r["launches"], r["expected_launches"], r.get("note"))
PY
      pack ;;
    timers-s46)  # session 46 (call 2 ran it inside its finish-s46 step at 4105d17; the finish and
      # fence steps were taken out once their changes were: see gpu_log-s46.log): the
      # autotuner's timers on MBConv's C=1024 16x16 N=256 fprop in rounds, with the clocks
      for w in ${TIMER_WEIGHTS:-contiguous channels_last}; do
        timeout "${TIMER_LIMIT:-90}" python scripts/autotune_timer_probe.py --channels 1024 --side 16 \
          --n 256 --passes fprop --weight "$w" --rounds "${TIMER_ROUNDS:-3}" --clocks \
          --timers screen warm rotated --only "${TIMER_ONLY:-t8x8c64w8m4s2_tma2|t8x16c32w4m[46]s2_tma2}" \
          --json "$R/timers-$w.json" >"$R/timers-$w.log" 2>&1
        echo "rc $?: timers $w"
        grep -E "round|picks" "$R/timers-$w.log" | cut -c1-160
      done
      pack ;;
    stamps-s47)  # session 47: the 3x3 wgrad pick's phases by clock stamps. Calls 2 and 3 ran it at
      # 0da4bd2 / 4f9d1ef, when the order switch was TILEWISE_GCONV_WGRAD_FINISH_WS (0: dw_out,
      # 1: workspace; STAMP_SETS then WS:ABLATE:CL) and call 2 also ran the wgrad tests call 1 had
      # left with it on. STAMP_SETS: ORDER:ABLATE:CL tokens (ORDER a finish order, CL "cl": a
      # channels_last dw)
      for set in ${STAMP_SETS:-pairs:0: dw_out:0:}; do
        IFS=: read -r order ab cl <<<"$set"
        tag=$order${ab:+-ab$ab}${cl:+-$cl}
        # shellcheck disable=SC2086
        TILEWISE_GCONV_WGRAD_FINISH_ORDER=$order TILEWISE_GCONV_WGRAD_ABLATE=${ab:-0} \
          timeout "${PROBE_LIMIT:-90}" python scripts/wgrad_stamp_probe.py \
          --n ${PROBE_N:-8 128} ${cl:+--dw-cl} --json "$R/stamps-$tag.json" \
          >"$R/stamps-$tag.log" 2>&1
        echo "rc $?: stamps $tag"
        grep -E "^stamps" "$R/stamps-$tag.log" | grep -vE "ctas|last start|first at|median at"
      done
      pack ;;
    final-s48)  # session 48's final code: the sumk tiles (now their own list and test), the
      # experimental tiles and workspace test (cut at 300 s in call 5, the sumk tiles among
      # them then), every wgrad candidate in fp16 (default: one copy of the workspace)
      TEST_LIMIT=${TEST_LIMIT:-270} par_tests final-tests \
        tests/test_gconv_cuda.py "sumk_wgrad_tiles and not bfloat16" \
        tests/test_gconv_cuda.py "sumk_wgrad_tiles and bfloat16" \
        tests/test_gconv_cuda.py "experimental_wgrad or workspace_is_left_zero" \
        tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" ;;
    copies-s48)  # session 48: the 3x3 pick with its reductions spread over 1, 2, 4 or 8 copies
      # of the workspace (TILEWISE_GCONV_WGRAD_COPIES; C=64 all four, C=128 and 256 1 and 4), one
      # process a setting; the stamps at 4; then every wgrad tile's GPU tests (at 4 copies in
      # session 48's call 5, when 4 was the default; the default is 1 since)
      for spec in 64:1 64:2 64:4 64:8 128:1 128:4 256:1 256:4; do
        c=${spec%%:*} cp=${spec#*:}
        case $c in 64) ns="8 32 128" ;; 128) ns="32 128" ;; *) ns="32 256" ;; esac
        # shellcheck disable=SC2086
        TILEWISE_GCONV_WGRAD_COPIES=$cp timeout "${PROBE_LIMIT:-60}" python \
          scripts/wgrad_ablate_probe.py --channels "$c" --n $ns \
          --json "$R/copies-c$c-$cp.json" >"$R/copies-c$c-$cp.log" 2>&1
        echo "rc $?: copies $cp C=$c"
        grep -E "^ablate|Error" "$R/copies-c$c-$cp.log"
      done
      TILEWISE_GCONV_WGRAD_COPIES=4 timeout "${PROBE_LIMIT:-60}" python \
        scripts/wgrad_stamp_probe.py --n 8 128 --json "$R/stamps-copies4.json" \
        >"$R/stamps-copies4.log" 2>&1
      echo "rc $?: stamps copies 4"
      grep -E "^stamps|Error" "$R/stamps-copies4.log" | grep -vE "ctas|last start|first at"
      pack
      [ -n "${SKIP_TESTS:-}" ] || TEST_LIMIT=${TEST_LIMIT:-300} par_tests copies-tests \
        "${WGRAD_ALL_TESTS[@]:0:6}" tests/test_gconv.py "(wgrad or backward) and not compile" \
        tests/test_gconv_cuda.py "experimental_wgrad or workspace_is_left_zero" ;;
    stamps-s48)  # session 48: where the N = 8 count's wait goes. Stamps (now with each CTA's
      # main-loop end) of the 3x3 pick with its reductions, with plain stores in their place
      # (ablation bit 128), and of the sum2 tile; then graph-replay times of the pick with bits
      # 128 and 1 (no atomics). STAMP48_SETS: TILE:ABLATE tokens (TILE a suffix of the pick's name)
      base=cuda_t16x16c64w8m1s2_tma1
      for set in ${STAMP48_SETS:-:0 :128 _sum2:0}; do
        IFS=: read -r suffix ab <<<"$set"
        tag=${suffix#_}${suffix:+-}ab$ab
        TILEWISE_GCONV_WGRAD_ABLATE=$ab timeout "${PROBE_LIMIT:-90}" \
          python scripts/wgrad_stamp_probe.py --n 8 128 --tile "$base$suffix" \
          --json "$R/stamps-$tag.json" >"$R/stamps-$tag.log" 2>&1
        echo "rc $?: stamps $tag"
        grep -E "^stamps|Error" "$R/stamps-$tag.log" | grep -vE "ctas|last start|first at"
      done
      for ab in 128 1; do
        TILEWISE_GCONV_WGRAD_ABLATE=$ab timeout "${PROBE_LIMIT:-90}" python \
          scripts/wgrad_ablate_probe.py --n 8 32 128 --json "$R/ablate-$ab.json" \
          >"$R/ablate-$ab.log" 2>&1
        echo "rc $?: ablate $ab"
        grep -E "^ablate|Error" "$R/ablate-$ab.log"
      done
      pack ;;
    slots-s49)  # session 49: the slot tiles (a slot of sums per CTA, then a dependent slot-sum
      # kernel; the deterministic wgrad's CUDA tiles): their GPU tests first, then their graph-
      # replay times beside the 3x3 pick at the issue's shapes where it is picked, one process a C
      TEST_LIMIT=${TEST_LIMIT:-240} par_tests slot-tests \
        tests/test_gconv_cuda.py "slot_wgrad_tiles and not bfloat16" \
        tests/test_gconv_cuda.py "slot_wgrad_tiles and bfloat16" \
        tests/test_gconv.py "wgrad or backward or determinis" \
        tests/test_gconv_cuda.py "sumk_wgrad_tiles"
      base=cuda_t16x16c64w8m1s2_tma1
      for spec in "64:${SLOT_N64:-8 32 128}" "128:${SLOT_N128:-32 128}" "256:${SLOT_N256:-32 256}"; do
        c=${spec%%:*}
        # shellcheck disable=SC2086
        timeout "${PROBE_LIMIT:-120}" python scripts/wgrad_ablate_probe.py --channels "$c" \
          --n ${spec#*:} --tile $base ${base}_slot cuda_t8x16c32w4m4s2_tma1_slot \
          --json "$R/slots-c$c.json" >"$R/slots-c$c.log" 2>&1
        echo "rc $?: slots C=$c"
        grep -E "^ablate|Error" "$R/slots-c$c.log"
      done
      pack ;;
    trigger-s49)  # session 49, last call: the slot tiles' GPU test (the trigger moved after the
      # slot's stores; a row-split slot tile; the slots poisoned), then the slot pick with the
      # trigger late (default) and early: graph replay and the profiler's kernel times
      TEST_LIMIT=${TEST_LIMIT:-100} par_tests slot-only tests/test_gconv_cuda.py \
        "slot_wgrad_tiles and not bfloat16" tests/test_gconv_cuda.py "slot_wgrad_tiles and bfloat16"
      for trig in late early; do
        TILEWISE_GCONV_SLOT_TRIGGER=$trig timeout "${PROBE_LIMIT:-45}" python \
          scripts/wgrad_ablate_probe.py --channels 64 --n 8 128 --profile \
          --tile cuda_t16x16c64w8m1s2_tma1_slot cuda_t16x16c64w8m1s2_tma1 \
          --json "$R/trigger-$trig.json" >"$R/trigger-$trig.log" 2>&1
        echo "rc $?: trigger $trig"
        grep -E "^ablate|profiler|Error" "$R/trigger-$trig.log"
      done
      pack ;;
    slot-only-s49)  # session 49 (call 3): the slot tiles' GPU test alone (fp16, bf16)
      TEST_LIMIT=${TEST_LIMIT:-150} par_tests slot-only tests/test_gconv_cuda.py \
        "slot_wgrad_tiles and not bfloat16" tests/test_gconv_cuda.py "slot_wgrad_tiles and bfloat16" ;;
    slot-tests-s49)  # session 49: every wgrad GPU test (eight groups) with the slot forms among
      # the candidates (group 3 has the cluster-sum tiles' test, its C=32 shape fixed to loop)
      TEST_LIMIT=${TEST_LIMIT:-300} par_tests all-wgrad-tests "${WGRAD_ALL_TESTS[@]}" ;;
    grid-s51)  # session 51: persistent grids cut to the CTAs the GPU holds at once. Each
      # candidate whose grid changed, timed with both grids (and checked against PyTorch) at
      # MBConv's C=1024 16x16 3x3 and issue 3's C=256 16x16 5x5/7x7 (GRID_CELLS: probe
      # invocations "SHAPES|KERNELS|N|PASSES" split on ';')
      IFS=';' read -ra cells <<<"${GRID_CELLS:-1024:16|3|64 256|fprop wgrad;256:16|5 7|64 256|wgrad fprop}"
      k=0
      for cell in "${cells[@]}"; do
        k=$((k + 1))
        IFS='|' read -r shapes kernels ns passes <<<"$cell"
        # shellcheck disable=SC2086
        timeout "${PROBE_LIMIT:-200}" python scripts/resident_grid_probe.py --shapes $shapes \
          --kernels $kernels --n $ns --passes $passes ${GRID_ARGS:-} \
          --json "$R/grid-probe-$k.json" >"$R/grid-probe-$k.log" 2>&1
        echo "rc $?: grid probe $k ($cell)"
        grep -E "^best|^\*|Error" "$R/grid-probe-$k.log" | cut -c1-200
        pack
      done ;;
    tests-s51)  # session 51: the grouped conv's GPU tests with the persistent grids cut
      # (resident_grid_x): fprop/dgrad tiles, the many-tiles tests, every wgrad group, the op
      # tests (full sizes, 200 training steps) and the capture tests, one process a group
      TEST_LIMIT=${TEST_LIMIT:-420} par_tests tests-s51 \
        tests/test_gconv_cuda.py "every_tile_fprop_and_dgrad and not bfloat16" \
        tests/test_gconv_cuda.py "every_tile_fprop_and_dgrad and bfloat16" \
        tests/test_gconv_cuda.py "over_many_tiles or tma_pipeline or dependent_launches or dynamic_tiles or edge_shapes" \
        tests/test_gconv.py "not compile" \
        tests/test_capture.py "" \
        "${WGRAD_ALL_TESTS[@]:0:12}" ;;
    slotsum-s51)  # session 51: the slot sum with 16-byte loads (4 slots a warp at once, one
      # batch): both slot tests (fp16), then the 3x3 pick's slot form at C=64 N = 8/32 with the
      # profiler's kernel times (session 49: the slot sum 2.2 us at N = 8)
      TEST_LIMIT=${TEST_LIMIT:-130} par_tests slotsum-tests \
        tests/test_gconv_cuda.py "test_slot_wgrad_tiles and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_slot_wgrad_tiles and not bfloat16"
      timeout "${PROBE_LIMIT:-60}" python scripts/wgrad_ablate_probe.py --channels 64 --n 8 32 \
        --tile cuda_t16x16c64w8m1s2_tma1 cuda_t16x16c64w8m1s2_tma1_slot --profile \
        --json "$R/slotsum-c64.json" >"$R/slotsum-c64.log" 2>&1
      echo "rc $?: slot sum probe"
      grep -E "^ablate|profiler|Error" "$R/slotsum-c64.log"
      pack ;;
    tests3-s51)  # session 51: the 12 tests of tests-s51's group 3 that its 420 s limit cut
      TEST_LIMIT=${TEST_LIMIT:-300} par_tests tests3-s51 \
        tests/test_gconv_cuda.py "(edge_shapes and n3c16 and bfloat16) or tma_pipeline or dependent_launches" \
        tests/test_gconv_cuda.py "dynamic_tiles or (wide_kernel_row_pair and not bfloat16)" \
        tests/test_gconv_cuda.py "wide_kernel_row_pair and bfloat16" ;;
    grid-study-s51)  # session 51: the GPU tests of the cut grids, then issue 3's C=256 16x16
      # 3x3 cells (every pass, fp16) with the grids cut (rule on) and as before
      # (TILEWISE_GCONV_RESIDENT_GRID=0), one study each in the same call, against cuDNN
      gpu_tests "${TEST_LIMIT:-120}" tests/test_gconv_grid.py
      for rule in 1 0; do
        # shellcheck disable=SC2086
        TILEWISE_GCONV_RESIDENT_GRID=$rule study "gconv-s51-c256-grid$rule" \
          "${STUDY_LIMIT:-170}" --channels 256 --kernels 3 --n ${STUDY_N:-8 32 64 128 256} \
          --dtypes fp16
      done ;;
    wgslot-s50)  # session 50: the warpgroup wgrad's slot forms (the deterministic mode's 5x5
      # and 7x7 tiles): their GPU tests, then graph replay beside the atomic forms the fast mode
      # picked in session 49's grid (C=64 5x5/7x7, N = 32, 128, 256), one process a kernel size
      TEST_LIMIT=${TEST_LIMIT:-300} par_tests wgslot-tests \
        tests/test_gconv_cuda.py "wgmma_slot_wgrad_tiles and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_slot_wgrad_tiles and bfloat16" \
        tests/test_gconv_cuda.py "test_slot_wgrad_tiles and not bfloat16"
      tiles=""
      for t in cudawg_t4x64c16w10m2s4_ws cudawg_t2x64c16w9m2s8_ws cudawg_t4x64c16w9m2s4_ws; do
        tiles="$tiles $t ${t}_slot"
      done
      wgslot_probe wgslot "$tiles"
      pack ;;
    wgslot-dwcl-s50)  # session 50: the same probe with dw written channels_last (the studies'
      # layout; call 2's probe wrote it contiguous: the atomic forms read 4-27 us slower there
      # than in the study, the slot forms as fast)
      tiles=""
      for t in cudawg_t4x64c16w10m2s4_ws cudawg_t2x64c16w9m2s8_ws; do tiles="$tiles $t ${t}_slot"; done
      WGSLOT_N=${WGSLOT_N:-32 128} wgslot_probe wgslot-dwcl "$tiles" --dw-cl
      WGSLOT_N=${WGSLOT_N:-32 128} wgslot_probe wgslot-dwcont "$tiles"
      pack ;;
    det57-s50)  # session 50: the deterministic mode at C=64 5x5/7x7 (the warpgroup slot forms
      # among its candidates) beside cuDNN
      # shellcheck disable=SC2086
      study gconv-s50-det57 "${STUDY_LIMIT:-300}" --channels 64 --kernels 5 7 --extra-kernels \
        --passes wgrad --dtypes ${DTYPES:-fp16} --deterministic ;;
    wgrad57-s50)  # session 50: issue 3's C=64 5x5/7x7 wgrad cells (fast mode: the warpgroup
      # slot forms first among the candidates) beside cuDNN, against session 49's call 3
      # shellcheck disable=SC2086
      study gconv-s50-wgrad57 "${STUDY_LIMIT:-300}" --channels 64 --kernels 5 7 --extra-kernels \
        --passes wgrad --dtypes ${DTYPES:-fp16 bf16} ;;
    slot-final-s50)  # session 50, last call: both slot tests (tap and warpgroup, fp16) at the
      # final host code (the slot buffer's size bound once)
      TEST_LIMIT=${TEST_LIMIT:-150} par_tests slot-final \
        tests/test_gconv_cuda.py "test_slot_wgrad_tiles and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_slot_wgrad_tiles and not bfloat16" ;;
    wgrad-rest-s50)  # session 50: the wgrad GPU test groups 4-7 that session 49's call 2 cut at
      # 280 s while they compiled (the warpgroup wgrad, the experimental tiles, the workspace)
      TEST_LIMIT=${TEST_LIMIT:-400} par_tests wgrad-rest-tests "${WGRAD_ALL_TESTS[@]:6:8}" ;;
    wgrad-study-s49)  # session 49: issue 3's wgrad grid (3x3 C=64/128/256 and C=64 5x5/7x7,
      # N = 1-256, fp16 and bf16) against cuDNN, the slot forms among the candidates
      # shellcheck disable=SC2086
      study gconv-s49-wgrad "${STUDY_LIMIT:-420}" --channels 64 128 256 --kernels 3 \
        --passes wgrad --dtypes ${DTYPES:-fp16 bf16} ;;
    det-study-s49)  # session 49: issue 3's 3x3 wgrad grid with tilewise's deterministic wgrad
      # (its choice among the slot tiles and the Triton configs) beside cuDNN
      # shellcheck disable=SC2086
      study gconv-s49-det "${STUDY_LIMIT:-300}" --channels 64 128 256 --kernels 3 \
        --passes wgrad --dtypes ${DTYPES:-fp16} --deterministic ;;
    sumk-s48)  # session 48: the 3x3 TMA wgrad pick against the same tile with its CTAs' sums
      # added up in clusters of 2 and 4 before the atomics (sumk), at the issue's shapes where it
      # is picked (C=64 N = 8, 32, 128; C=128 N = 32, 128; C=256 N = 32, 256), one process a C;
      # then every wgrad tile's GPU tests (the sumk tiles were candidates at cecd950; since
      # 61ebcb8 they are SUMK_WGRAD_TILES, tested by test_sumk_wgrad_tiles) and test_gconv's wgrad
      base=cuda_t16x16c64w8m1s2_tma1
      for spec in "64:${SUMK_N64:-8 32 128}" "128:${SUMK_N128:-32 128}" "256:${SUMK_N256:-32 256}"; do
        c=${spec%%:*}
        # shellcheck disable=SC2086
        timeout "${PROBE_LIMIT:-120}" python scripts/wgrad_ablate_probe.py --channels "$c" \
          --n ${spec#*:} --tile $base ${base}_sum2 ${base}_sum4 \
          --json "$R/sumk-c$c.json" >"$R/sumk-c$c.log" 2>&1
        echo "rc $?: sumk C=$c"
        grep -E "^ablate|Error" "$R/sumk-c$c.log"
      done
      pack
      [ -n "${SKIP_TESTS:-}" ] || TEST_LIMIT=${TEST_LIMIT:-300} par_tests sumk-tests \
        "${WGRAD_ALL_TESTS[@]:0:4}" tests/test_gconv.py "(wgrad or backward) and not compile" \
        tests/test_gconv_cuda.py "workspace_is_left_zero" ;;
    wgrad-study-s47)  # session 47 (prepared after its device time): issue 3's wgrad grid (3x3,
      # C=64/128/256, N = 1-256, fp16 and bf16, against cuDNN) with the pairs' finish, beside
      # the GPU tests the session left (run finish-stage-s47 with SKIP_TESTS unset first)
      # shellcheck disable=SC2086
      study gconv-s47-wgrad "${STUDY_LIMIT:-420}" --channels 64 128 256 --kernels 3 \
        --passes wgrad --dtypes ${DTYPES:-fp16 bf16} ;;
    finish-stage-s47)  # session 47, after call 4: the pairs' finish with a contiguous dw_out
      # staged in shared memory (its stores had taken 1.5 us of 1.9 at N = 128), the pick at C=64
      # N = 8, 32, 128 in both layouts; its stamps; every wgrad GPU test
      for cl in "" --dw-cl; do
        # shellcheck disable=SC2086
        timeout "${PROBE_LIMIT:-60}" python scripts/wgrad_ablate_probe.py \
          --n ${PROBE_N:-8 32 128} $cl --json "$R/stage$cl.json" >"$R/stage$cl.log" 2>&1
        echo "rc $?: finish staged $cl"
        grep -E "^ablate" "$R/stage$cl.log"
      done
      timeout "${PROBE_LIMIT:-60}" python scripts/wgrad_stamp_probe.py --n 8 128 \
        --json "$R/stamps-stage.json" >"$R/stamps-stage.log" 2>&1
      echo "rc $?: stamps staged"
      grep -E "^stamps" "$R/stamps-stage.log" | grep -vE "ctas|last start|first at|median at"
      pack
      [ -n "${SKIP_TESTS:-}" ] || TEST_LIMIT=${TEST_LIMIT:-400} par_tests stage-tests \
        "${WGRAD_ALL_TESTS[@]}" ;;
    finish-pairs-s47)  # session 47: the finish's pass over channel pairs (the new default) against
      # the dw_out order before it, the pick at C=64 N = 8, 32, 128 in both dw layouts, one
      # process each, alone on the GPU; the pairs with four-wide atomics; then every wgrad GPU
      # test against PyTorch (every tile, the warpgroup wgrads, the row splits; eight processes)
      for order in pairs dw_out; do
        for cl in "" --dw-cl; do
          # shellcheck disable=SC2086
          TILEWISE_GCONV_WGRAD_FINISH_ORDER=$order timeout "${PROBE_LIMIT:-60}" \
            python scripts/wgrad_ablate_probe.py --n ${PROBE_N:-8 32 128} $cl \
            --json "$R/finish-$order$cl.json" >"$R/finish-$order$cl.log" 2>&1
          echo "rc $?: finish $order $cl"
          grep -E "^ablate" "$R/finish-$order$cl.log"
        done
      done
      # shellcheck disable=SC2086
      TILEWISE_GCONV_WGRAD_RED4=1 timeout "${PROBE_LIMIT:-60}" python scripts/wgrad_ablate_probe.py \
        --n ${PROBE_N:-8 32 128} --json "$R/finish-pairs-red4.json" >"$R/finish-pairs-red4.log" 2>&1
      echo "rc $?: finish pairs red4"
      grep -E "^ablate" "$R/finish-pairs-red4.log"
      pack
      [ -n "${SKIP_TESTS:-}" ] || TEST_LIMIT=${TEST_LIMIT:-400} par_tests pairs-tests \
        "${WGRAD_ALL_TESTS[@]}" ;;
    wgrad-ablate-s45)  # session 45 (prepared after its device time): where the 3x3 tap wgrad's
      # ~11.5 us a launch goes: the pick at C=64 N = 8, 32, 128 with parts switched off
      # (TILEWISE_GCONV_WGRAD_ABLATE: 1 no atomics, 2 no finish, 4 no MMAs, 8 no loads), one
      # process each, graph replay
      for bits in ${ABLATE_SETS:-0 1 2 3 4 8 12 15}; do
        # shellcheck disable=SC2086
        TILEWISE_GCONV_WGRAD_ABLATE=$bits timeout "${PROBE_LIMIT:-60}" \
          python scripts/wgrad_ablate_probe.py --n ${PROBE_N:-8 32 128} \
          --json "$R/wgrad-ablate-$bits.json" >"$R/wgrad-ablate-$bits.log" 2>&1
        echo "rc $?: wgrad ablate $bits"
        grep -E "^ablate" "$R/wgrad-ablate-$bits.log"
      done
      pack ;;
    picks-s45)  # session 45 (prepared after its device time; next session's item 01): does the
      # autotuner's pick for MBConv's grouped conv (C=1024 16x16, batch 256) move between fresh
      # choices on one machine? The in-situ MBConv stack at batch 256, tilewise only, PICK_RUNS
      # times, each with an empty autotune cache; then each run's C=1024 fprop/dgrad choice and
      # its stored readings (the chosen candidate and the next fastest). Session 46 ran it twice
      # (call 1 at 66a7157 without PICK_TAG, call 4 with PICK_TAG=s46 and near-ties from 0.05
      # ms; their files renamed picks-before-*/picks-after-* in benchmarks/results/s46/).
      # PICK_BATCHES: other batch sizes (a small stack's picks)
      for run in $(seq 1 "${PICK_RUNS:-3}"); do
        start=$(date +%s)
        TILEWISE_CACHE_DIR="$R/picks-cache-$run" timeout "${PICK_LIMIT:-150}" "${TW[@]}" \
          bench gconv-insitu --no-progress --blocks mbconv --batches ${PICK_BATCHES:-256} --impls tilewise \
          --study "gconv-insitu-picks-${PICK_TAG:-s45}-$run" --out "$R" \
          >"$R/picks-${PICK_TAG:-s45}-$run.log" 2>&1
        echo "rc $? $(($(date +%s) - start)) s: picks run $run"
        grep -E "^mbconv" "$R/picks-${PICK_TAG:-s45}-$run.log" | cut -c1-120
        python - "$R/picks-cache-$run/autotune.json" <<'PY'
import json, sys
for key, entry in json.load(open(sys.argv[1]))["entries"].items():
    k = json.loads(key)
    if k["problem"].get("c") == 1024 and "wgrad" not in k["op"]:
        print(k["op"][:40], "N", k["problem"].get("n"), "->", entry["config"].get("th"),
              entry["config"].get("tw"),
              entry["config"].get("cb"), f"{entry['ms'] * 1e3:.1f} us")
        for r in entry.get("readings", []):
            print("   ", r["cand"][:40], r["screen"], r["timed"], "chosen" if r.get("chosen") else "")
PY
      done
      pack ;;
    small-s45)  # session 45: issue 3's L2 bar (above copy where the problem fits in L2: 0 of 24
      # readings in session 23) on the H200 with today's candidates: 3x3 at N = 8, 16, 32, every
      # pass, the study's L2 column (one input set replayed) where in + out fit half the L2
      # shellcheck disable=SC2086
      study gconv-s45-small "${STUDY_LIMIT:-240}" --channels 64 128 256 --kernels 3 --extra-kernels \
        --n ${STUDY_N:-8 16 32} --dtypes ${DTYPES:-fp16} ;;
    tests-s44)  # session 44: the new 64-channel row-pair tiles on odd shapes (every candidate at
      # C=64 3x3 and 1x1, fp16 and bf16), beside cut-tests-s43's four (the counters' test now
      # takes the new tiles too), four processes
      TEST_LIMIT=${TEST_LIMIT:-330} par_tests s44 \
        tests/test_gconv_cuda.py "every_tile_fprop and c64 and (k3x3 or k1x1)" \
        tests/test_gconv_cuda.py "dynamic_tiles_equal" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes" \
        tests/test_gconv_cuda.py "experimental_wgrad_tiles or nonfinite_blocks_match_pytorch_values_too" ;;
    big3-s44)  # session 44: the 3x3 fprop/dgrad cells at >= 34 MB with the 64-channel row-pair
      # tiles of several CTAs an SM offered (WIDE_ROW_TILES); the TMA pipeline test over many
      # tiles a CTA first (the new tiles bitwise equal to their non-TMA twins)
      gpu_tests "${TEST_LIMIT:-150}" tests/test_gconv_cuda.py -k "tma_pipeline_over_many_tiles and not bfloat16" -x
      study gconv-s44-big3 "${STUDY_LIMIT:-400}" --channels 64 128 --kernels 3 --extra-kernels \
        --n 128 256 --passes fprop dgrad ;;
    tma-copy-s44)  # session 44: the conv's data movement alone (scripts/tma_copy_probe.py: TMA
      # tile pipelines of several box rows, stages, CTAs an SM, beside torch's copy_ of the same
      # bytes), its GPU test first; then Nsight Compute's metric names on latency and requests
      # in flight (for a later call's --metrics)
      [ -n "${SKIP_TESTS:-}" ] || gpu_tests "${TEST_LIMIT:-120}" tests/test_tma_copy.py -x
      # shellcheck disable=SC2086
      timeout "${PROBE_LIMIT:-240}" python scripts/tma_copy_probe.py --n ${PROBE_N:-128 256} \
        ${TMA_CONFIGS:+--configs $TMA_CONFIGS} ${TMA_ARGS:-} --json "$R/tma-copy.json" \
        >"$R/tma-copy.log" 2>&1
      echo "rc $?: tma copy probe"
      grep -vE "^\s*$" "$R/tma-copy.log" | cut -c1-130
      pack
      NCU=$(find_ncu)
      [ -n "$NCU" ] && [ -z "${SKIP_NCU:-}" ] || continue
      timeout 60 "$NCU" --query-metrics --chip gh100 >"$R/ncu-metrics.txt" 2>&1
      echo "rc $?: ncu metrics, $(wc -l <"$R/ncu-metrics.txt") lines"
      grep -iE "latency|inflight|in_flight|outstanding|pending" "$R/ncu-metrics.txt" | head -40
      pack ;;
    dyn-s43)  # session 43: the row-pair TMA tiles with their tiles from counters
      # (TILEWISE_GCONV_DYNAMIC_TILES=1, off by default): its GPU test (bitwise equal to the
      # static kernel, counters left zero), then four row-pair tiles and the wgmma tiles (the
      # control: not changed) read warm, cold and rotated with it off and on, C=64 3x3 N = 128
      # and 256, then Nsight Compute's SM-active cycles of the 8x16 4-CTA tile with it on
      gpu_tests "${TEST_LIMIT:-140}" tests/test_gconv_cuda.py -k dynamic_tiles_equal -x
      only="cudarp_t8x16c32w4m4s2_tma2|cudarp_t8x8c32w4m6s2_tma2|cudarp_t16x16c32w4m3s2_tma2"
      only="$only|cudarp_t8x16c32w4m5s2_tma2|cudawg"
      for dyn in 0 1; do
        # shellcheck disable=SC2086
        TILEWISE_GCONV_DYNAMIC_TILES=$dyn timeout "${PROBE_LIMIT:-110}" \
          python scripts/autotune_timer_probe.py --n ${PROBE_N:-128 256} --only "$only" \
          --json "$R/timer-probe-dyn$dyn.json" >"$R/timer-probe-dyn$dyn.log" 2>&1
        echo "dyn $dyn rc $?"
        grep -E "^(fprop|dgrad)|picks|cudarp_t8x16c32w4m4s2_tma2 |cudarp_t8x8c32w4m6s2_tma2 " \
          "$R/timer-probe-dyn$dyn.log"
        pack
      done
      NCU=$(find_ncu)
      [ -n "$NCU" ] || continue
      f="$R/ncu-sol-dyn1.txt"
      TILEWISE_GCONV_DYNAMIC_TILES=1 timeout "${NCU_LIMIT:-60}" "$NCU" --clock-control none \
        --cache-control none -k regex:tw_gconv_fprop --launch-skip 3 -c 1 --section SpeedOfLight \
        python scripts/ncu_targets.py gconv-fprop --k 3 \
        --tile-spec "8,16,32,4,4,2,rowpair=True,tma=2" >"$f" 2>&1
      echo "rc $?: ncu dyn 1"
      grep -E "Duration|Elapsed Cycles|SM Active|DRAM Throughput" "$f"
      pack ;;
    red4-s42)  # session 42 (prepared after its device time): the tap wgrad's four-wide atomics
      # (TILEWISE_GCONV_WGRAD_RED4=1, off by default): the wgrad GPU tests with it (every wgrad
      # tile, the workspace under graph replay, row splits, the op's wgrad tests), then the 3x3
      # wgrad cells with it off and on (its ~11 us of fixed cost a launch at N = 128 and 256)
      TILEWISE_GCONV_WGRAD_RED4=1 par_tests red4-s42 \
        tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "(every_wgrad_tile and bfloat16) or workspace_is_left_zero or row_split_wgrad or multi_row_blocks" \
        tests/test_gconv.py "wgrad"
      for red4 in 0 1; do
        TILEWISE_GCONV_WGRAD_RED4=$red4 study "gconv-s43-red4-$red4" "${STUDY_LIMIT:-150}" \
          --channels 64 128 --kernels 3 --extra-kernels --n ${STUDY_N:-128 256} --passes wgrad \
          --dtypes ${DTYPES:-fp16}
      done ;;
    wgrad-ubase-s42)  # session 42: the wgmma wgrad with its descriptors on the uniform
      # datapath by default (session 40's probe bit 1024): its GPU tests, then the C=64 5x5/7x7
      # wgrad cells (session 41's big3 read them without it)
      par_tests wgrad-s42 tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "(every_wgrad_tile and bfloat16) or wgmma_wgrad_tiles_on_odd" \
        tests/test_gconv_cuda.py "wgmma_wgrad_over_many or experimental_wgrad"
      study gconv-s42-wgrad-k57 "${STUDY_LIMIT:-200}" --kernels 5 7 --channels 64 \
        --n ${STUDY_N:-128 256} --passes wgrad --dtypes ${DTYPES:-fp16} ;;
    occupancy-s41)  # session 41 (prepared after its device time): the row-pair dependent
      # launches' shared-memory cap (gconv_cuda.launch_smem): its GPU tests (the PDL chain, the
      # TMA pipelines, every tile), then every C=64 3x3 candidate read warm, cold and rotated with
      # the cap off and on (autotune_timer_probe), then the >= 64 MB 3x3 cells studied with it on
      gpu_tests "${TEST_LIMIT:-200}" tests/test_gconv_cuda.py \
        -k "dependent_launches or tma_pipeline or every_tile_fprop" -x
      for cap in 0 1; do
        # shellcheck disable=SC2086
        TILEWISE_GCONV_OCCUPANCY_CAP=$cap timeout "${PROBE_LIMIT:-150}" \
          python scripts/autotune_timer_probe.py --n ${PROBE_N:-128 256} \
          --json "$R/timer-probe-cap$cap.json" >"$R/timer-probe-cap$cap.log" 2>&1
        echo "cap $cap rc $?"
        grep -E "^(fprop|dgrad)|picks|cudarp_t8x16c32w4m4s2_tma2 " "$R/timer-probe-cap$cap.log"
        pack
      done
      [ -n "${SKIP_STUDY:-}" ] || study gconv-s42-h200-big3 "${BIG3_LIMIT:-300}" --channels 64 128 \
        --kernels 3 --extra-kernels --n 128 256 ;;
    lsu-store-s41)  # session 41 (prepared after its device time): the read-only, write-only and
      # copy ceilings (scripts/stream_ceilings.py), then the wgmma tiles' output by
      # st.global from every thread (TILEWISE_WG_ABLATE 1024, exact) against the TMA store (0),
      # whole and without wgmmas (2, 1026), 3x3 and 5x5, C=64 N=128 fp16: whether the TMA unit
      # serializes the halo loads behind the stores (the probe's err column checks 1024)
      timeout 60 python scripts/stream_ceilings.py --json "$R/stream-ceilings.json" \
        >"$R/stream-ceilings.log" 2>&1
      echo "rc $?: $(tail -n 1 "$R/stream-ceilings.log")"
      wg_ablate lsu "${ABLATE_SET:-0 1024 2 1026 0 1024}" "${DESC_ONLY:-$DESC_TILES}" \
        "${KS:-3 5}" "${ABLATE_LIMIT:-80}"
      pack ;;
    k7-s38)  # session 38: the 7x7 fprop/dgrad cells at C=64 with the three-A-set 16x64 candidate
      c64_study gconv-s38-k7 7 ;;
    tests-s38)  # session 38: the GPU tests named by TESTS_S38 (node ids or files, space-separated)
      # shellcheck disable=SC2086
      gpu_tests "${TEST_LIMIT:-240}" ${TESTS_S38:?name the tests} ;;
    k3-s37)  # session 37: the 3x3 fprop/dgrad cells at C=64 (the wgmma kernel's early first halos)
      c64_study gconv-s37-k3 3 ;;
    second-run-s35)  # session 35: a program's first step in fresh processes (cold, second, no
      # NVRTC cache, PyTorch's own)
      timeout "${SECOND_LIMIT:-300}" python benchmarks/second_run.py --check --out "$R" \
        >"$R/second-run.log" 2>&1
      echo "rc $?: second_run"
      tail -n 7 "$R/second-run.log"
      pack ;;
    cliff-s35)  # session 35: the fprop tiles' time with Inf in the input (exact recompute path)
      timeout "${CLIFF_LIMIT:-200}" python scripts/nonfinite_cliff_probe.py ${CLIFF_ARGS:-} \
        >"$R/nonfinite-cliff.log" 2>&1
      echo "rc $?: nonfinite cliff"
      grep -vE "Warn|warn" "$R/nonfinite-cliff.log" | cut -c1-200 | tail -n 80
      pack ;;
    nvrtc-s35)  # session 35: the NVRTC binary cache on by default (sm_90a kernels cached too):
      # its GPU tests, the second-run study, then the op tests twice in fresh processes; the
      # second pass must add no binary (every kernel loaded from disk)
      gpu_tests 120 tests/test_nvrtc_cache.py
      timeout "${SECOND_LIMIT:-300}" python benchmarks/second_run.py --check --out "$R" \
        >"$R/second-run.log" 2>&1
      echo "rc $?: second_run"
      tail -n 6 "$R/second-run.log"
      for pass in 1 2; do
        par_tests "nvrtc$pass" tests/test_gconv.py "full_size or opcheck or autotune" \
          tests/test_gconv.py "not (full_size or opcheck or autotune)"
        echo "pass $pass: $(ls .tw-cache/nvrtc 2>/dev/null | wc -l) binaries on disk"
      done ;;
    tests-s34b)  # tests-s34 less the odd-shape run over every wgmma wgrad tile (wgrad-check runs
      # the tiles that changed): every wgrad candidate and the op tests
      par_tests tests34b tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "every_wgrad_tile and bfloat16" \
        tests/test_gconv.py "full_size or opcheck or autotune" \
        tests/test_gconv.py "not (full_size or opcheck or autotune)" ;;
    tests-s32c)  # the producer-warp tiles offered: every wgrad candidate and the wgmma tests
      par_tests tests32c tests/test_gconv_cuda.py "every_wgrad_tile and not bfloat16" \
        tests/test_gconv_cuda.py "every_wgrad_tile and bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and not bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes and bfloat16" \
        tests/test_gconv_cuda.py "wgmma_wgrad_over_many_units or workspace_is_left_zero" ;;
    tests-s32b)  # the last group of tests-s32 (past its limit in 5 processes), in 2
      par_tests tests32b tests/test_gconv_cuda.py "wgmma_wgrad_tiles_on_odd_shapes" \
        tests/test_gconv_cuda.py "wgmma_wgrad_over_many_units or workspace_is_left_zero" ;;
    ncu-wgrad)  # Nsight Compute on library wgrad tiles (NCU_SPECS "K|CudaTile args ..."), C=64
      # 64x64 N=128 fp16
      for spec in $NCU_SPECS; do
        k=${spec%%|*} t=${spec#*|}
        ncu_wgrad "$R/ncu-wgrad-k${k}-${t//[^0-9a-z]/_}.txt" "${NCU_LIMIT:-120}" tw_gconv_wgrad 2 \
          "${NCU_METRICS:+,$NCU_METRICS}" python scripts/ncu_targets.py gconv-wgrad --k "$k" \
          --tile-spec "$t"
      done
      pack ;;
    ncu-wgrad-wg)  # Nsight Compute on one wgrad-on-wgmma prototype variant (NCU_VARIANT), 7x7
      # C=64 64x64 N=128 fp16: the 7th launch of the prototype's kernel (after the checks)
      ncu_wgrad "$R/ncu-wgrad-wg-k${NCU_K:-7}-${NCU_VARIANT//,/_}.txt" "${NCU_LIMIT:-150}" \
        tw_gconv_wgrad_proto 6 \
        ",smsp__inst_executed.sum" python scripts/gconv_wgrad_wgmma_probe.py \
        --kernels "${NCU_K:-7}" --n 128 --dtypes fp16 --variants "$NCU_VARIANT" --checks 1
      pack ;;
    big3-s29)  # 3x3 at >= 64 MB (C=64, 128; N = 128, 256), all passes: the issue's bars re-read
      study gconv-s29-big3 "${BIG3_LIMIT:-420}" --channels 64 128 --kernels 3 --extra-kernels \
        --n 128 256 ;;
    big3-s41)  # session 41: the same cells on the H200 (the first session with no H100); without
      # --extra-kernels the study's 5x5/7x7 C=64 cells came along (the 420 s limit cut 7x7 bf16)
      study gconv-s41-h200-big3 "${BIG3_LIMIT:-420}" --channels 64 128 --kernels 3 --n 128 256 ;;
    k57-big)
      study gconv-s21-k57-big 420 --channels 64 --kernels 5 7 \
        --extra-kernels --n 32 128 256 --passes fprop dgrad ;;
    small-fp16) study gconv-s21-small-fp16 200 --n 1 8 32 --extra-kernels --dtypes fp16 ;;
    small-bf16) study gconv-s23-small-bf16 200 --n 1 8 32 --extra-kernels --dtypes bf16 ;;
    big) study gconv-s23-big 420 --n 128 256 --extra-kernels ;;
    mbconv-iso)  # MBConv's grouped conv alone (C=1024 16x16; in situ 0.68-0.71 from batch 96 on,
      # session 26), against the in-situ readings
      study gconv-s27-c1024 "${STUDY_LIMIT:-300}" --shapes 1024:16x16 --n 32 64 128 256 \
        --dtypes fp16 ;;
    fp32-tc)  # session 27: fp32-accurate GEMMs on tensor cores (Triton's tf32x3, bf16x3/x6)
      # against cuBLAS's SIMT SGEMM, at Strassen's 512 x 4096 cell: speed and error vs fp64
      timeout "${PROBE_LIMIT:-150}" python scripts/fp32_tc_probe.py --json "$R/fp32-tc-probe-s27.json" \
        ${PROBE_SHAPES:+--shapes $PROBE_SHAPES} >"$R/fp32-tc-probe.log" 2>&1
      echo "rc $?: fp32-tc probe"
      grep -vE "Warn|warn|failed" "$R/fp32-tc-probe.log" | tail -n 40
      grep -c "failed" "$R/fp32-tc-probe.log"
      grep "failed" "$R/fp32-tc-probe.log" | cut -c1-200 | sort -u -t: -k1,1 | head -8
      pack ;;
    strassen-tc)  # session 27: Strassen's fp32 products on tensor cores (3xTF32, timed against
      # cuBLAS per shape): the kernel's and the chain's GPU tests, then the fp32 Strassen cells
      # (layers 1-8, batch 512/4096, hidden 4096/8192) with it, and without it in the same call
      gpu_tests "${TEST_LIMIT:-90}" tests/test_gemm_fp32tc.py
      gpu_tests "${TEST_LIMIT:-150}" tests/test_strassen.py
      for tc in 1 0; do
        TILEWISE_FP32_TENSOR_CORES=$tc timeout "${MLP_TIMEOUT:-200}" "${TW[@]}" bench mlp --dtypes fp32 \
          --layers 1 2 4 8 --batches ${MLP_BATCHES:-512 4096} --hiddens 4096 8192 \
          --impls graph tilewise strassen --no-compile --no-train --no-progress --plot \
          --study "mlp-strassen-tc$tc-s27" --out "$R" >"$R/mlp-strassen-tc$tc.log" 2>&1
        echo "rc $?: mlp-strassen-tc$tc-s27"
        grep -E "^fp32 " "$R/mlp-strassen-tc$tc.log"
        pack
      done ;;
    linear-tc)  # session 27: 3xTF32 tiles offered to true-fp32 forwards of the fused linear: its
      # GPU tests, then fp32 cells at layers 1/8 with the fused chain and Strassen both offered it
      [ -n "${SKIP_TESTS:-}" ] ||
        gpu_tests "${TEST_LIMIT:-200}" tests/test_linear.py -k "tf32x3 or tf32_switch or split_k_forward"
      # shellcheck disable=SC2086
      timeout "${MLP_TIMEOUT:-300}" "${TW[@]}" bench mlp --dtypes fp32 --layers ${MLP_LAYERS:-1 8} \
        --batches ${MLP_BATCHES:-64 128 512 1024 4096} --hiddens ${MLP_HIDDENS:-1024 2048 4096 8192} \
        --impls eager graph tilewise strassen --no-compile --no-train --no-progress --plot \
        --study "mlp-linear-tc${STUDY_SUFFIX:-}-s27" --out "$R" >"$R/mlp-linear-tc.log" 2>&1
      echo "rc $?: mlp-linear-tc-s27"
      grep -E "^fp32 " "$R/mlp-linear-tc.log"
      pack ;;
    mlp-compile-fp32 | mlp-compile-fp16 | mlp-compile-bf16)
      # issue 4's compile column at 8 layers, every batch x hidden (63 cells), beside graph and
      # tilewise; the cells' max-autotune builds first, in 10 processes (--compile-warm-jobs)
      dt=${step##*-}
      start=$(date +%s)
      # MLP_LAYERS="1 2 4" (default 8); inductor keeps GEMM autotune results on disk, so the
      # extra layer counts of a cell should build faster than its first (unmeasured)
      layers=${MLP_LAYERS:-8}
      # shellcheck disable=SC2086
      timeout "${MLP_TIMEOUT:-560}" "${TW[@]}" bench mlp --dtypes "$dt" --layers $layers ${MLP_BATCHES:+--batches $MLP_BATCHES} \
        --impls ${MLP_IMPLS:-eager graph compile tilewise strassen} --compile-warm-jobs 10 --no-train \
        --no-progress --plot --study "mlp-compile-L${layers// /-}-$dt${MLP_IMPLS:+-${MLP_IMPLS// /-}}${MLP_BATCHES:+-b${MLP_BATCHES// /-}}" --out "$R" >"$R/mlp-compile-$dt.log" 2>&1
      echo "rc $? $(($(date +%s) - start)) s: mlp-compile-$dt"
      pack
      grep -E "compile warm-up|not built" "$R/mlp-compile-$dt.log"
      ;;
    tests-dwcl)  # session 23's channels_last dw (written after its device time), 4 processes
      par_tests tests-dwcl "${DWCL_TESTS[@]}" ;;
    wgrad-k5-n8)  # the cell under cuDNN since session 12 (0.90-0.94x in session 22)
      study gconv-s24-wgrad-k5-n8 200 "${WGRAD_K5_N8[@]}" ;;
    gemv-chunks)  # session 23's row-chunked GEMV (17-64 rows, TILEWISE_GEMV_ROW_CHUNKS=1): its
      # GPU tests, then fp32 8 layers at batch 32/64 with it and without, same call
      gpu_tests 200 "${GEMV_TESTS[0]}" -k "${GEMV_TESTS[1]}"
      gemv_timing ;;
    first-s24)  # everything session 23 wrote after its device time, in one call: the tests at
      # once (5 processes), the 5x5 wgrad N = 8 cell, the row-chunked GEMV against without
      par_tests first-s24 "${DWCL_TESTS[@]}" "${GEMV_TESTS[@]}"
      study gconv-s24-wgrad-k5-n8 100 "${WGRAD_K5_N8[@]}"
      gemv_timing ;;
    tests-ln)  # the long-row layer_norm backward (dweight/dbias from the kernel, session 23)
      gpu_tests 150 tests/test_layernorm.py -k "looped" ;;
    ln-replay)  # session 23's one layer_norm failure, replayed by its seed (race or ReLU mask?)
      timeout 120 python scripts/ln_failure_replay.py 2>&1 | tee "$R/ln-replay.log" | grep -v Warn ;;
    chain-probe)  # session 24: the fused fp32 chain under PyTorch + graph at large cells; which
      # forward backend it picked, and each backend as a whole chain, timed in turns
      timeout 240 python scripts/mlp_cell_probe.py --backends \
        --cells fp32:8:512:8192 fp32:8:1024:4096 fp32:8:1024:8192 >"$R/chain-probe.log" 2>&1
      echo "rc $?: chain-probe"
      grep -vE "Warn|warn" "$R/chain-probe.log" | tail -n 30
      pack ;;
    bf16-big3)  # session 24's cut cells: bf16 C=128/256 3x3 at N = 128/256
      study gconv-s25-bf16-big3 240 --kernels 3 --extra-kernels --n 128 256 --dtypes bf16 \
        --channels 128 256 ;;
    row-groups)  # session 25: fused Strassen's chain in row groups on parallel streams (written
      # after session 24's device time): its GPU tests, then 1/2/4 groups forced and chosen, in
      # turns, then the Strassen cells of the fp32 grid (layers 1-8) with the timed choice
      gpu_tests 120 tests/test_strassen.py -k "row_groups or each_products or streams or large"
      timeout 200 python scripts/mlp_cell_probe.py --row-groups --cells fp32:8:512:4096 \
        fp32:8:512:8192 fp32:8:1024:4096 fp32:8:4096:4096 >"$R/row-groups.log" 2>&1
      echo "rc $?: row-groups probe"
      grep -vE "Warn|warn" "$R/row-groups.log" | tail -n 60
      timeout 170 "${TW[@]}" bench mlp --dtypes fp32 --layers 1 2 4 8 --batches 512 4096 \
        --hiddens 4096 8192 --impls graph tilewise strassen --no-compile --no-train \
        --no-progress --plot --study mlp-strassen-rows-s25 --out "$R" >"$R/mlp-strassen.log" 2>&1
      echo "rc $?: mlp-strassen-rows-s25"
      grep -E "^fp32 " "$R/mlp-strassen.log"
      pack ;;
    host)  # issue 3: host time of the uncaptured grouped conv, piece by piece (session 28),
      # then the whole call against cuDNN and the MBConv batch-32 eager step; HOST_TAG names them
      tag=${HOST_TAG:-}
      timeout "${HOST_LIMIT:-150}" python scripts/host_breakdown.py ${HOST_ARGS:-} >"$R/host-breakdown$tag.txt" 2>&1
      echo "rc $?: host_breakdown"
      grep -vE "Warn|warn" "$R/host-breakdown$tag.txt" | head -n ${HOST_LINES:-90}
      timeout 60 python scripts/host_overhead.py >"$R/host-overhead$tag.txt" 2>&1
      echo "rc $?: host_overhead"
      tail -n 4 "$R/host-overhead$tag.txt"
      for blk in mbconv convfirst; do
        timeout 90 python scripts/host_profile_step.py --block $blk --batch 32 --top 45 \
          >"$R/host-profile$tag-${blk}32.txt" 2>&1
        echo "rc $?: host_profile_step $blk"
        grep -E "step:" "$R/host-profile$tag-${blk}32.txt"
      done
      pack ;;
    fp32tc-tests)  # session 27's tests written after its device time
      gpu_tests "${TEST_LIMIT:-120}" tests/test_gemm_fp32tc.py ;;
    *) echo "unknown step $step" ;;
  esac
done
kill "$repacker" 2>/dev/null
wait "$repacker" 2>/dev/null
# the Triton compile cache, for the next call to carry back (`.triton-cache.tgz`, extracted at
# the top): the GPU tests compile hundreds of Triton kernels, each call from nothing until now
# It travels beside the bundle, never inside it: the tool brings back files of at most 16 MiB,
# and session 25's first call lost its whole bundle to a cache packed into it.
pack
keep_cache() {  # keep_cache NAME DIR: DIR packed as $OUT/NAME.tgz, if under the tool's limit
  [ -d "$2" ] || return 0
  tar czf "$OUT/$1.tgz" -C . "$2"
  local size
  size=$(stat -c %s "$OUT/$1.tgz")
  if [ "$size" -gt $((15 * 1024 * 1024)) ]; then  # the tool's per-file limit is 16 MiB
    echo "$1 $((size / 1048576)) MiB: not kept"
    rm -f "$OUT/$1.tgz"
  fi
}
keep_cache triton-cache .triton-cache
keep_cache nvrtc-cache .tw-cache/nvrtc
