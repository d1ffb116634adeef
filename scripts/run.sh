#!/usr/bin/env bash
# The main job: builds everything, then runs the CLI's standard suite: every
# registered op x dtype on random data, checked against the host reference and
# timed, on the GPU when one is present, otherwise on the host backend.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec "${BUILD_DIR:-build}/baracuda" suite "$@"
