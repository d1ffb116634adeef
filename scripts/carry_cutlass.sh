#!/usr/bin/env bash
# Copies the CUTLASS/CuTe headers (the nvidia-cutlass pip package) into
# .carry/cutlass/include, which travels with the working tree to machines
# without network, where CMake finds them first.
set -euo pipefail
cd "$(dirname "$0")/.."

locate='import importlib.metadata as m; print(m.distribution("nvidia-cutlass").locate_file("cutlass_library/source/include"))'
src=$(python3 -c "$locate" 2>/dev/null || true)
if [ -z "$src" ] || [ ! -f "$src/cutlass/cutlass.h" ]; then
  echo "[carry] installing nvidia-cutlass (headers only)"
  python3 -m pip install -q --no-deps nvidia-cutlass
  src=$(python3 -c "$locate")
fi
dst=.carry/cutlass/include
rm -rf "$dst"
mkdir -p "$dst"
cp -r "$src/cutlass" "$src/cute" "$dst/"
echo "[carry] CUTLASS headers in $dst ($(du -sh "$dst" | cut -f1))"
