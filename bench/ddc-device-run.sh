#!/usr/bin/env bash
# One device call for the narrowband DDC kernel (issue 16; bench/RESULTS.md "DDC kernel"): the GPU
# self-test (figures count only if it passes), then cbf-ddc-bench (the kernel against the copy
# bandwidth and the fp32 FMA ceiling measured in the same run, over a grid of mappings).
# Binaries from `cargo build --release --no-default-features` (the device may lack libhwloc)
# stripped into .dev/
# Usage: bench/ddc-device-run.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.dev
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
"$bin/cbf" selftest --gpu > "${OUT:-/tmp}/selftest.txt" 2>&1
rc=$?
grep -iE "ddc|passed|FAIL|WRONG" "${OUT:-/tmp}/selftest.txt" | tail -40
[ "$rc" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
"$bin/cbf-ddc-bench" "$@" 2>&1
