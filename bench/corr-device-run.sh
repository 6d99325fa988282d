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
bash tcc_bench/run.sh 64 256 576 > "$out/tcc.txt" 2>&1; tail -n 12 "$out/tcc.txt"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
