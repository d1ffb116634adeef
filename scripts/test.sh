#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suite (ctest; CUDA tests
# report themselves skipped without a GPU), the C ABI test and the Python tests.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
BUILD_DIR=${BUILD_DIR:-build}
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${JOBS:-$(nproc)}") || status=1
if [ -d "$BUILD_DIR/python/baracuda" ]; then
  PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q python/tests || status=1
else
  echo "[test] python module not built"; status=1
fi
exit $status
