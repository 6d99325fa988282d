#!/usr/bin/env bash
# One device call for the FRB beamformer's figures (bench/RESULTS.md "FRB beamformer"): the GPU
# self-test (figures count only if it passes), cbf-frb-bench, the FRB output's share of the
# XB-engine's GPU time per chunk (cbf-xb-bench --frb, seed 004's case 5), and CHORD's kernel (the
# peer) in the same call. Set up on the development machine: build
# `cargo build --release --no-default-features --bin cbf --bin cbf-frb-bench --bin cbf-xb-bench`
# (the device may lack libhwloc), copy the three binaries (stripped), this
# script (as run.sh) and ../shared/peers/chord_frb_bench into one git-ignored folder of the
# checkout that travels (e.g. .dev-frb), and run `bash .dev-frb/run.sh` on the device with that
# folder carried. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
./cbf selftest --gpu 2>&1 | tee "$out/selftest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
./cbf-frb-bench "$@" 2>&1 | tee "$out/frb-bench.txt"
quick=""
[[ " $* " == *" --quick "* ]] && quick=--quick
./cbf-xb-bench --frb $quick 2>&1 | tee "$out/xb-frb-share.txt"
BENCH_OUT="$out/chord" bash chord_frb_bench/run.sh --variants design > "$out/chord.txt" 2>&1
tail -n 14 "$out/chord.txt"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
