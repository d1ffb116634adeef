#!/usr/bin/env bash
# Builds the host backend alone (no CUDA) with AddressSanitizer and
# UndefinedBehaviorSanitizer into ${BUILD_DIR:-build-asan} and runs the bent-
# descriptor fuzz (tests/test_fuzz.cpp) and the bad-input tests under them:
# an out-of-bounds access the plain build would miss stops the run with a
# report. Extra arguments replace the default gtest filter.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/baracuda-ccache}
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBARACUDA_CUDA=OFF -DBARACUDA_PYTHON=OFF \
  "-DCMAKE_CXX_FLAGS=$sanitize" "-DCMAKE_EXE_LINKER_FLAGS=$sanitize" "-DCMAKE_SHARED_LINKER_FLAGS=$sanitize" > /dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target baracuda_tests
filter=${1:-Fuzz.*:*Errors*:*BadInput*}
ASAN_OPTIONS=detect_leaks=0 "$BUILD_DIR/tests/baracuda_tests" --gtest_filter="$filter"
