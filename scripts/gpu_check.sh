#!/usr/bin/env bash
# For a GPU machine, in one go: build with every core, run the GPU tests, run
# them again under compute-sanitizer memcheck, run the standard suite and the
# benchmark against PyTorch, then print a summary table last.
# Full logs go to $OUT (or ./gpu-out). Environment: STEPS (names below; empty:
# build only), SKIP_BUILD=1 (a second call on a machine that kept the build),
# GTEST_FILTER, MEMCHECK_FILTER, PYTEST_ARGS, BENCH_*_ARGS, SCRIPT (a Python
# script for the `script` step), STEP_TIMEOUT (seconds a step).
# A build carried from another machine (scripts/carry_build.sh; then
# BUILD_DIR=build-dev SKIP_BUILD=1): its pack is unpacked, the library is
# found through LD_LIBRARY_PATH, and where its Python module does not load
# here (another Python version) only the module is built, against the
# carried library, into $BUILD_DIR-py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
export PATH=/usr/local/cuda/bin:$PATH

t0=$(date +%s)
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: a second call on a machine that kept $BUILD_DIR
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1
  if ! cmake --build "$BUILD_DIR" -j "$(nproc)" > "$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -40
    exit 1
  fi
fi
# A carried pack (scripts/carry_build.sh) is unpacked first, and again when
# it is newer than what a warm machine kept from an earlier call.
if [ -n "${SKIP_BUILD:-}" ] && [ -f "$BUILD_DIR/carry.tar.xz" ] &&
  { [ ! -f "$BUILD_DIR/libbaracuda.so" ] || [ "$BUILD_DIR/carry.tar.xz" -nt "$BUILD_DIR/libbaracuda.so" ]; }; then
  tar -xmJf "$BUILD_DIR/carry.tar.xz" -C "$BUILD_DIR"
fi
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PY_DIR="$BUILD_DIR/python"
if [ -n "${SKIP_BUILD:-}" ] && ! PYTHONPATH="$PY_DIR" python3 -c "import baracuda" > /dev/null 2>&1; then
  PY_DIR="$BUILD_DIR-py/python"
  { cmake -S . -B "$BUILD_DIR-py" -G Ninja -DBARACUDA_PREBUILT_LIBRARY="$PWD/$BUILD_DIR/libbaracuda.so" &&
    cmake --build "$BUILD_DIR-py" --target _baracuda -j "$(nproc)"; } > "$OUT/build-py.log" 2>&1 ||
    { echo "python module build failed"; tail -20 "$OUT/build-py.log"; }
fi
export PYTHONPATH="$PY_DIR${PYTHONPATH:+:$PYTHONPATH}"  # the Python steps' module
build_s=$(( $(date +%s) - t0 ))
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1

step() {  # name, command...
  local name=$1; shift
  local s=$(date +%s)
  timeout "${STEP_TIMEOUT:-1800}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >> "$OUT/steps.txt"
  return $rc
}
: > "$OUT/steps.txt"
STEPS=${STEPS-gpu_tests capi memcheck pytest suite bench bench_rows bench_gemm bench_attention bench_decode bench_rope}
for name in $STEPS; do
  case $name in
    gpu_tests) step gpu_tests "$BUILD_DIR/tests/baracuda_tests" --gtest_filter="${GTEST_FILTER:-*}" ;;
    capi) step capi "$BUILD_DIR/tests/baracuda_capi_test" ;;
    memcheck)  # every CUDA plan at the quick sizes (each launcher path), graph capture, misaligned, the fuzz
      filter="Ops/*.CudaMatchesReference/*:Ops/Gemm.BespokeCuda*:Ops/Gemm.CublasLt*:GemmExact.*:GemmLayouts.*:CudaElementwise.Graph*:CudaElementwise.Misaligned*:CudaReduce.*:Ops/Attention.BespokeCuda*:Ops/Attention.Cudnn*:Attention*.*:*Rope*:*KvAppend*:*Decode*:GroupedGemm*:ScaledMm*:GemmBiasGrad.*:Ops/Scan.CudaMatchesReference/*:Ops/Loss.CudaMatchesReference/linear_cross_entropy*:FuzzCuda.*"
      BARACUDA_TEST_QUICK=1 step memcheck compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$BUILD_DIR/tests/baracuda_tests" --gtest_filter="${MEMCHECK_FILTER:-$filter}" ;;
    pytest) step pytest python3 -m pytest -q ${PYTEST_ARGS:-python/tests} ;;
    suite) step suite "$BUILD_DIR/baracuda" suite ;;
    bench) step bench python3 bench/bench_elementwise.py ${BENCH_ARGS:-} ;;
    bench_rows) step bench_rows python3 bench/bench_rows.py ${BENCH_ROWS_ARGS:-} ;;
    bench_gemm) step bench_gemm python3 bench/bench_gemm.py ${BENCH_GEMM_ARGS:-} ;;
    bench_attention) step bench_attention python3 bench/bench_attention.py ${BENCH_ATTENTION_ARGS:-} ;;
    bench_decode) step bench_decode python3 bench/bench_decode.py ${BENCH_DECODE_ARGS:-} ;;
    bench_rope) step bench_rope python3 bench/bench_rope.py ${BENCH_ROPE_ARGS:-} ;;
    bench_norm_widths) step bench_norm_widths python3 bench/bench_norm_widths.py ;;
    bench_softmax_widths) step bench_softmax_widths python3 bench/bench_softmax_widths.py ;;
    bench_narrow_rows) step bench_narrow_rows python3 bench/bench_narrow_rows.py ;;
    bench_ce) step bench_ce python3 bench/bench_cross_entropy.py ${BENCH_CE_ARGS:-} ;;
    bench_linear_ce) step bench_linear_ce python3 bench/bench_linear_ce.py ${BENCH_LINEAR_CE_ARGS:-} ;;
    bench_overhead) step bench_overhead python3 bench/bench_overhead.py --number 2000 ;;
    script) step script python3 ${SCRIPT:?SCRIPT names the python script} ;;
  esac
done

echo "================ summary (build ${build_s}s) ================"
cat "$OUT/gpu.txt"
cat "$OUT/steps.txt"
show() {  # step name, lines: the log's tail, when the step ran
  [ -f "$OUT/$1.log" ] && { echo "--- $1"; tail -"$2" "$OUT/$1.log"; }
  return 0
}
[ -f "$OUT/gpu_tests.log" ] && { echo "--- gpu_tests"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$OUT/gpu_tests.log" | head -20; }
[ -f "$OUT/memcheck.log" ] && { echo "--- memcheck"; grep -E "ERROR SUMMARY|tests? ran|FAILED" "$OUT/memcheck.log" | tail -5; }
[ -f "$OUT/suite.log" ] && { echo "--- suite"; grep -E "FAIL|^suite:" "$OUT/suite.log" | tail -15; }
show pytest 3
show bench 32
show bench_rows 40
show bench_gemm 20
for b in bench_attention bench_decode bench_rope bench_overhead bench_linear_ce script; do show $b 24; done
show bench_ce 12
show bench_norm_widths 40
show bench_softmax_widths 60
show bench_narrow_rows 90
