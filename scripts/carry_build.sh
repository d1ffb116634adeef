#!/usr/bin/env bash
# Builds the library, the tests and the CLI for the GPU machine here (sm_90a
# machine code only, zstd-compressed: no PTX, ~67 MB instead of ~296 MB) into
# ${BUILD_DIR:-build-dev} and packs them into $BUILD_DIR/carry.tar.xz (~27 MB),
# which fits the device tool's carry. There, with that file carried:
#   BUILD_DIR=build-dev SKIP_BUILD=1 ./scripts/gpu_check.sh
# unpacks it and builds only the Python module against it. The build costs no
# device time; the device machine's own build took ~400 s of it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-dev}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/baracuda-ccache}
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBARACUDA_PYTHON=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real "-DCMAKE_CUDA_FLAGS=-compress-mode=size" > /dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
(cd "$BUILD_DIR" && tar -cf - libbaracuda.so tests/baracuda_tests tests/baracuda_capi_test baracuda | xz -6 -T0 > carry.tar.xz)
ls -l "$BUILD_DIR/carry.tar.xz"
