#!/usr/bin/env bash
# Copies the cuDNN frontend headers (the nvidia-cudnn-frontend pip package)
# into .carry/cudnn_frontend/include, which travels with the working tree to
# machines without network, where CMake finds them first.
set -euo pipefail
cd "$(dirname "$0")/.."

src=$(python3 -c "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))" 2>/dev/null || true)
if [ -z "$src" ] || [ ! -f "$src/cudnn_frontend.h" ]; then
  echo "[carry] installing nvidia-cudnn-frontend (headers only)"
  python3 -m pip install -q --no-deps nvidia-cudnn-frontend
  src=$(python3 -c "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))")
fi
dst=.carry/cudnn_frontend/include
rm -rf "$dst"
mkdir -p "$dst"
cp -r "$src/cudnn_frontend.h" "$src"/cudnn_frontend_*.h "$src/cudnn_backend_base.h" "$src/cudnn_frontend" "$dst/"
echo "[carry] cuDNN frontend headers in $dst ($(du -sh "$dst" | cut -f1))"
