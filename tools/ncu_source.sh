#!/usr/bin/env bash
# Source-level ncu of one kernel on the GPU machine, and where its warps wait
# (tools/ncu_phases.py). Usage, after scripts/gpu_check.sh has built the
# Python module (STEPS='' is enough):
#   tools/ncu_source.sh KERNEL_REGEX PYTHON_SCRIPT [ARGS...]
# The script should launch the kernel at least once; the first launch whose
# name matches is profiled (clocks not locked). The report, the details page
# and the SASS source CSV go to ${OUT:-gpu-out}/ncu_source.*.
set -euo pipefail
cd "$(dirname "$0")/.."
kernel=$1; shift
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-dev}
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD/$BUILD_DIR-py/python${PYTHONPATH:+:$PYTHONPATH}"
ncu --clock-control none -k "regex:$kernel" -c 1 --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters \
  -f -o "$OUT/ncu_source" python3 "$@" > "$OUT/ncu_source.log" 2>&1
ncu --import "$OUT/ncu_source.ncu-rep" --page details > "$OUT/ncu_source.txt"
ncu --import "$OUT/ncu_source.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv"
grep -E "Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per Scheduler" "$OUT/ncu_source.txt" || true
python3 tools/ncu_phases.py "$OUT/ncu_source.csv"
