#!/usr/bin/env bash
# A/B of two builds of the library in one call on the GPU machine: the same
# Python module and command run against each build's libbaracuda.so in turn,
# ROUNDS times (default 2), every output line prefixed by the build's tag
# (base, new), so that drift between calls (clocks, the machine) falls on
# both alike. A kernel change measured this way moves by ~1% between rounds;
# across calls the spread is several times that.
#
# Usage, after scripts/gpu_check.sh has unpacked the carried build here
# (BUILD_DIR=build-dev SKIP_BUILD=1 STEPS='' or any steps):
#   tools/ab_libs.sh BASE_LIB_XZ COMMAND [ARGS...]
# BASE_LIB_XZ: the other build's library, xz-compressed (~30 MB), made here
# before the change and carried beside build-dev/carry.tar.xz:
#   xz -T0 -c build-dev/libbaracuda.so > scratch/base.so.xz
# COMMAND sees AB_TAG (base or new); e.g.
#   tools/ab_libs.sh scratch/base.so.xz python3 bench/bench_attention.py --only bespoke
set -uo pipefail
cd "$(dirname "$0")/.."
base_xz=${1:?the base library, xz-compressed}; shift
[ $# -gt 0 ] || { echo "usage: tools/ab_libs.sh BASE_LIB_XZ COMMAND [ARGS...]"; exit 2; }
BUILD_DIR=${BUILD_DIR:-build-dev}
lib="$PWD/$BUILD_DIR/libbaracuda.so"
[ -f "$lib" ] || { echo "no $lib: run scripts/gpu_check.sh first"; exit 2; }
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py="$PWD/$BUILD_DIR-py/python"
[ -d "$py" ] || py="$PWD/$BUILD_DIR/python"
export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"

work=$(mktemp -d)
cp "$lib" "$work/new.so"
xz -dc "$base_xz" > "$work/base.so" || { echo "cannot read $base_xz"; exit 2; }
trap 'cp "$work/new.so" "$lib"; rm -rf "$work"' EXIT  # the new build stays in place afterwards
for round in $(seq "${ROUNDS:-2}"); do
  for tag in base new; do
    cp "$work/$tag.so" "$lib"
    AB_TAG=$tag "$@" 2>&1 | sed "s/^/[$tag $round] /"
  done
done
