#!/usr/bin/env bash
# One device call for the correlator's figures (bench/RESULTS.md "CUDA correlator"): the GPU
# self-test (figures count only if it passes), cbf-corr-bench, a cuBLAS int8 GEMM through
# torch, and the TCC peer. Set up on the development machine: build
# `cargo build --release --no-default-features --bin cbf --bin cbf-corr-bench` (the device may
# lack libhwloc), copy both binaries (stripped), this
# script, bench/corr_cublas_int8.py (as cublas_int8.py) and ../shared/peers/tcc_bench into one
# git-ignored folder of the checkout that travels (e.g. .dev-corr), and run
# `bash .dev-corr/run.sh` on the device with that folder carried. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
./cbf selftest --gpu 2>&1 | tee "$out/selftest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
./cbf-corr-bench "$@" 2>&1 | tee "$out/bench.txt"
python3 cublas_int8.py 2>&1 | tee "$out/cublas.txt"
# The TCC at every size of cbf-corr-bench's table that it can run (its own input layout, so no
# corner turn; its numpy check on three channels; the all-channel GPU reference skipped).
# tcc NAME ARGS…: one run of the harness, its log in $out/tcc_NAME.txt, its table printed.
tcc() {
    TCC_BENCH_OUT="$out/tcc_$1" bash tcc_bench/run.sh "${@:2}" --reps 10 --no-gpu-ref > "$out/tcc_$1.txt" 2>&1
    grep -A 12 '^receivers' "$out/tcc_$1.txt"
}
tcc 480 4 16 64 128 256 576
tcc 1024 1024 --channels 120
tcc 12288 64 128 256 576 --channels 120 --samples 12288
tcc katgpucbf 80 --channels 512 --samples 8192
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
