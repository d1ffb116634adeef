#!/usr/bin/env bash
# Installs what the build needs when it is missing (Debian packages, PyPI),
# then configures and builds everything into ${BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! python3 -c "import nanobind, numpy, pytest" 2>/dev/null; then
  echo "[setup] pip install nanobind numpy pytest"
  python3 -m pip install -q nanobind numpy pytest
fi
# cuDNN frontend headers (header-only; a copy in .carry/ serves machines without network).
if [ ! -f .carry/cudnn_frontend/include/cudnn_frontend.h ] &&
   ! python3 -c "import importlib.metadata as m; m.distribution('nvidia-cudnn-frontend')" 2>/dev/null; then
  echo "[setup] pip install nvidia-cudnn-frontend (cuDNN frontend headers)"
  python3 -m pip install -q --no-deps nvidia-cudnn-frontend ||
    echo "[setup] warning: no cuDNN frontend headers; the cuDNN attention engine is left out"
fi
# CUTLASS/CuTe headers (header-only; the grouped GEMM's sm_90a backend; a copy in .carry/ serves machines without network).
if [ ! -f .carry/cutlass/include/cutlass/cutlass.h ] &&
   ! python3 -c "import importlib.metadata as m; m.distribution('nvidia-cutlass')" 2>/dev/null; then
  echo "[setup] pip install nvidia-cutlass (CUTLASS headers)"
  python3 -m pip install -q --no-deps nvidia-cutlass ||
    echo "[setup] warning: no CUTLASS headers; the CUTLASS grouped GEMM backend is left out"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/baracuda-ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true  # cache hits across clones at other paths
jobs=${JOBS:-$(nproc)}
# Without a GPU nothing here runs the device code: it is compiled as a check
# only, at cicc/ptxas -O1 (src/loss/fp8.cu: 295 -> 61 s on one core); a GPU
# machine builds it at -O3. BARACUDA_DEVICE_COMPILE_CHECK=ON/OFF overrides.
check_only=${BARACUDA_DEVICE_COMPILE_CHECK:-}
if [ -z "$check_only" ]; then
  if [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1; then check_only=OFF; else check_only=ON; fi
fi
[ "$check_only" = ON ] && echo "[setup] no GPU found: device code built as a compile check (-O1)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBARACUDA_DEVICE_COMPILE_CHECK="$check_only" \
  ${CMAKE_ARGS:-} >/dev/null
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$jobs"
echo "[setup] build took $(( $(date +%s) - start )) s with $jobs jobs"
