#!/usr/bin/env bash
# Time katgpucbf's XB-engine beamformer kernel beside a device copy ceiling (see README.md).
# Run from the folder render.py filled (rendered .cu files + manifest.json + this script).
# Needs python3 with numpy and cupy, and nvcc. Extra arguments go to bench.py, e.g.
#   ./run.sh              full run (12 cases; about a minute on an H200 once warm)
#   ./run.sh --quick      5 cases, 10 timed launches each
#   ./run.sh --dry-run    no GPU: files, geometry, byte counts, reference self-tests
# Results (bench_results.json, bench_log.txt) go to $BENCH_OUT, else $OUT, else ./results.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE" || exit 1
export PYTHONUNBUFFERED=1
OUTDIR="${BENCH_OUT:-${OUT:-$HERE/results}}"
mkdir -p "$OUTDIR" 2>/dev/null || OUTDIR="$(mktemp -d)"
python3 bench.py --out "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/bench_log.txt"
exit "${PIPESTATUS[0]}"
