#!/usr/bin/env bash
# On a CUDA machine with no network whose python3 already has torch, triton, numpy, matplotlib
# and pytest: install tilewise without fetching anything, run the GPU tests, run the benchmarks
# named as arguments (default: pointwise), write logs/JSON/PNG under $OUT (default ./out) and
# print a short summary table last.
#   usage: [GPU_TESTS="tests/test_x.py ..." | GPU_TEST_IDS=FILE] [GPU_TEST_TIMEOUT=300]
#          [GPU_TEST_JOBS=8] [GPU_TEST_SHARDS=3] scripts/gpu_check.sh [--no-tests] [BENCH ...]
#   (test files run one at a time, or GPU_TEST_JOBS at once, each under its own timeout; the
#   summary has a line per file; the files measured slower on an H100 get longer limits, see
#   slow_limit below)
#   GPU_TEST_DEADLINE=S: no test runs past S seconds after the script started (each unit's limit
#   shrinks to fit; units not started by then are reported as such), so that a bundle and the
#   summary still come back inside the device call's limit
#   BUNDLE=1: everything is written to a scratch folder and packed into $OUT/gpu_check.tgz, one
#   file (the device tool brings back at most 8 files per call)
#   BENCH in: none ceilings pointwise quick gconv gconv-insitu gconv-quick (both gconv studies, quick)
#             gconv-sweep (every config beside cuDNN) mlp (quick grid) mlp-full (no compile)
set -uo pipefail
script_start=$(date +%s)
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
FINAL_OUT=$OUT
if [ -n "${BUNDLE:-}" ]; then
  OUT=$(mktemp -d)
fi
export PYTHONUNBUFFERED=1
# a Triton compile cache from an earlier call (device_call.sh's bundle), carried as a tarball
if [ -f .triton-cache.tgz ]; then
  export TRITON_CACHE_DIR=$PWD/.triton-cache
  # gzip or xz (session 51): Python's tarfile reads either, with no xz binary needed
  python3 -c "
import tarfile
with tarfile.open('.triton-cache.tgz') as t:
    try:
        t.extractall(filter='tar')
    except TypeError:  # a Python without extraction filters
        t.extractall()
"
fi
PY=${PYTHON:-python3}

run_tests=1
benches=()
for a in "$@"; do
  case "$a" in
    --no-tests) run_tests=0 ;;
    *) benches+=("$a") ;;
  esac
done
[ ${#benches[@]} -eq 0 ] && benches=(pointwise)

if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1; then
  echo "pip install without network failed (see install.log); using PYTHONPATH=src"
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
TW=("$PY" -m tilewise.cli)
nvidia-smi -L || true
"$PY" -c "import torch, triton, tilewise; print('torch', torch.__version__, 'triton', triton.__version__, 'tilewise', tilewise.__version__, torch.cuda.get_device_name())"

test_status=" not run"
if [ "$run_tests" = 1 ]; then
  # GPU_TESTS selects test files (default: every tests/test_*.py). Each file runs on its own under
  # a time limit of its own (slow_limit, or GPU_TEST_TIMEOUT), so one slow file cannot swallow the
  # others' results; a file cut off by its limit is reported as such with what it had run.
  files=${GPU_TESTS:-$(ls tests/test_*.py)}
  test_status=""
  # seconds the slow files took on an H100 with cold compile caches (session 12: test_linear
  # 474 s, test_gconv_cuda ~430 s over four calls; session 11: test_gconv 240, test_layernorm 211),
  # with headroom; GPU_TEST_TIMEOUT, when set, is the limit for every file
  slow_limit() {
    case "$(basename "$1")" in
      test_linear.py | test_gconv_cuda.py) echo 720 ;;
      test_gconv.py | test_layernorm.py | test_bias_act.py) echo 420 ;;
      *) echo 300 ;;
    esac
  }
  # one unit (a file, or a shard of one: FILE@K with its node ids in $OUT/shards/NAME.ids): its
  # log, and its summary line in a .status file (units may run at once)
  unit_log() { echo "$OUT/gpu_tests__$(basename "${1%@*}" .py)${1##*.py}.log"; }
  run_test_file() {
    local u=$1 f=${1%@*} log rc last finished limit args
    log=$(unit_log "$u")
    limit=${GPU_TEST_TIMEOUT:-$(slow_limit "$f")}
    if [ -n "${GPU_TEST_DEADLINE:-}" ]; then
      local left=$((script_start + GPU_TEST_DEADLINE - $(date +%s)))
      if [ "$left" -lt 20 ]; then
        echo "  $u: not started (GPU_TEST_DEADLINE=$GPU_TEST_DEADLINE s reached)" >"${log%.log}.status"
        return
      fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    if [ "$u" != "$f" ]; then
      mapfile -t args <"$OUT/shards/$(basename "$log" .log).ids"
    else
      args=("$f")
    fi
    TILEWISE_TEST_TIMES="${log%.log}.times" timeout "$limit" "$PY" -m pytest -m gpu -q \
      -p no:cacheprovider --tb=short "${args[@]}" >"$log" 2>&1
    rc=$?
    last=$(grep -E "passed|failed|error|skipped|deselected|no tests ran" "$log" | tail -n 1)
    finished=$(grep -E "(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s" "$log" | tail -n 1)
    if [ "$rc" = 124 ] && [ -n "$finished" ]; then
      last="$finished (pytest finished; the $limit s limit hit during exit)"
    elif [ "$rc" = 124 ]; then
      last="TIMED OUT after $limit s; progress: $(grep -E '^[.FEsx]+' "$log" | tr -d ' \n' | cut -c1-80)"
    fi
    echo "  $u: ${last:-no summary} (exit $rc)" >"${log%.log}.status"
  }
  # GPU_TEST_SHARDS=N (default 1) splits each slow file (a limit above 300 s) into N units, so
  # that its NVRTC/Triton compiles spread over N cores (session 23: 8 files at once left
  # test_linear and test_gconv_cuda cut at 530 s each, the rest done): scripts/shard_tests.py
  # deals the cases, longest first by tests/gpu_durations.txt. The slow files' units start first;
  # each unit's test times are gathered below into $OUT/gpu_durations.txt.
  shards=${GPU_TEST_SHARDS:-1}
  rm -rf "$OUT/shards"  # an earlier run's units (OUT=./out is reused) are not this run's
  units=()
  later=()  # the files not sharded, started after the shards
  # longest known total first (tests/gpu_durations.txt), so no slow file's units wait for a slot
  if [ "$shards" -gt 1 ]; then
    ordered=$("$PY" scripts/shard_tests.py --order $files) && [ -n "$ordered" ] && files=$ordered
  fi
  # GPU_TEST_IDS=FILE: the node ids in FILE instead of whole files (e.g. an earlier run's
  # gpu_remaining.ids), dealt over max(GPU_TEST_SHARDS, GPU_TEST_JOBS) units "rerun.py@J"
  if [ -n "${GPU_TEST_IDS:-}" ]; then
    mkdir -p "$OUT/shards"
    rerun=$((shards > ${GPU_TEST_JOBS:-1} ? shards : ${GPU_TEST_JOBS:-1}))
    n=$("$PY" scripts/shard_tests.py --split "$GPU_TEST_IDS" "$rerun" "$OUT/shards/gpu_tests__rerun")
    for ((j = 0; j < ${n:-0}; j++)); do units+=("rerun.py@$j"); done
    files=""
  fi
  for f in $files; do
    if [ "$shards" -gt 1 ] && [ "$(slow_limit "$f")" -gt 300 ]; then
      mkdir -p "$OUT/shards"
      n=$("$PY" scripts/shard_tests.py "$f" "$shards" "$OUT/shards/gpu_tests__$(basename "$f" .py)")
      for ((j = 0; j < ${n:-0}; j++)); do units+=("$f@$j"); done
      [ "${n:-0}" -gt 0 ] || units+=("$f")
    else
      later+=("$f")
    fi
  done
  units+=(${later[@]+"${later[@]}"})  # (set -u: an empty array is unbound in bash < 4.4)
  # GPU_TEST_JOBS files at once (default 1): the slow files spend their time compiling NVRTC
  # and Triton kernels on one CPU core each, so 4 at once fit one 10-minute device call
  jobs_max=${GPU_TEST_JOBS:-1}
  for u in "${units[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    run_test_file "$u" &
  done
  wait
  for u in "${units[@]}"; do
    log=$(unit_log "$u")
    test_status+=$'\n'"$(cat "${log%.log}.status" 2>/dev/null || echo "  $u: no status")"
    grep -sE "^(FAILED|ERROR) " "$log" | head -n 5 | sed 's/^/    /'
  done
  # the shards' cases that never finished (cut by a limit or the deadline, or never started):
  # the next call runs them with GPU_TEST_IDS=gpu_remaining.ids (carry the file)
  "$PY" scripts/shard_tests.py --remaining "$OUT" >"$OUT/gpu_remaining.ids" 2>/dev/null || true
  left=$(grep -c . "$OUT/gpu_remaining.ids" 2>/dev/null || true)
  [ "${left:-0}" -gt 0 ] && test_status+=$'\n'"  $left cases never finished: gpu_remaining.ids"
fi

for b in "${benches[@]}"; do
  case "$b" in
    ceilings) "${TW[@]}" bench ceilings --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    pointwise) "${TW[@]}" bench pointwise --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    quick) "${TW[@]}" bench pointwise --quick --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    gconv) "${TW[@]}" bench gconv --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    gconv-insitu) "${TW[@]}" bench gconv-insitu --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    gconv-quick)
      "${TW[@]}" bench gconv --quick --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log"
      "${TW[@]}" bench gconv-insitu --quick --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    gconv-sweep) "$PY" benchmarks/sweep_gconv.py --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    mlp) "${TW[@]}" bench mlp --quick --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    mlp-full) "${TW[@]}" bench mlp --no-compile --plot --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
    none) ;;
    *) echo "unknown benchmark '$b'" ;;
  esac
done

# every test's seconds (from each unit's .times file; a test its unit's limit cut off counts to
# the cut, at least) over those of tests/gpu_durations.txt, for the next run's sharding (copy
# $OUT/gpu_durations.txt to tests/gpu_durations.txt)
"$PY" scripts/shard_tests.py --gather "$OUT" >"$OUT/gpu_durations.txt" 2>>"$OUT/bench.log" || true

# the kernel-config choices this run made or used, to ship back (`tilewise cache import FILE`)
"$PY" -m tilewise.cli cache export "$OUT/autotune-cache.json" >>"$OUT/bench.log" 2>&1 || true

echo
echo "================ summary ================"
echo "GPU tests:$test_status"
"$PY" -m tilewise.cli bench report "$OUT" || true
# issue 3's bars, counted over the isolated grouped-conv studies of this run
for f in "$OUT"/gconv*.json; do
  case "$(basename "$f")" in gconv-insitu*) continue ;; esac
  [ -f "$f" ] || continue
  echo "$(basename "$f"):"
  "$PY" -m tilewise.cli bench gconv-bars "$f" | tail -n 3
done
if [ -n "${BUNDLE:-}" ]; then
  tar czf "$FINAL_OUT/gpu_check.tgz" -C "$OUT" . && echo "packed $OUT into $FINAL_OUT/gpu_check.tgz"
fi
