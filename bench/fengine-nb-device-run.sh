#!/usr/bin/env bash
# One device call for the F-engine with several outputs on one input (issue 16; seed 000
# §Multiple outputs): the GPU self-test (figures count only if it passes; its "shared input"
# checks drive one wideband and two narrowband CUDA outputs over the same device slots against
# their CPU backends, and its DDC checks cover every mapping the start-up tuner may pick), then
# cbf-gpu-bench --outputs-only (one wideband + two narrowband outputs, pinned chunks → heaps,
# against the H2D and PCIe bounds measured in the same run), then two short starts of
# `cbf fengine --backend cuda` with the same three outputs over loopback, the second of which
# must read the DDC mappings the first tuned from --tuning-cache.
# Binaries from `cargo build --release --no-default-features` (the device may lack libhwloc)
# stripped into .dev/ (BIN overrides).
# Usage: bench/fengine-nb-device-run.sh [--quick] [--timeline]; logs go to $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.dev}
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
"$bin/cbf" selftest --gpu > "$out/selftest.txt" 2>&1
rc=$?
grep -iE "shared input|ddc 10-bit S (8|16) taps|passed|FAIL|WRONG|TOO MANY|BIASED" "$out/selftest.txt" | tail -40
[ "$rc" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
"$bin/cbf-gpu-bench" --outputs-only "$@" 2>&1 | tee "$out/bench.txt"
# The engine itself: dsim at a quarter of L-band's rate over loopback, one wideband and two
# narrowband outputs (their bands inside 0–214 MHz), each to its own capture; twice, with one
# tuning cache.
cache="$out/ddc-tuning.json"
rm -f "$cache"
for run in 1 2; do
    sync=$(date +%s)
    "$bin/cbf" fengine --backend cuda --src 127.0.0.1:7101,127.0.0.1:7102 --recv-threads 2 \
        --adc-sample-rate 428e6 --sync-time "$sync" --katcp-port 0 --tuning-cache "$cache" \
        --wideband "name=wide,channels=4096,dst=127.0.0.1:7200" \
        --narrowband "name=nb8,channels=32768,centre_frequency=100e6,decimation=8,dst=127.0.0.1:7201" \
        --narrowband "name=nb16,channels=32768,centre_frequency=150e6,decimation=16,dst=127.0.0.1:7202" \
        > "$out/fengine-$run.txt" 2>&1 &
    feng=$!
    caps=()
    for port in 7200 7201 7202; do
        "$bin/cbf" capture --stats --duration 14 "127.0.0.1:$port" > "$out/capture-$run-$port.txt" 2>&1 &
        caps+=($!)
    done
    "$bin/cbf" dsim --adc-sample-rate 428e6 --sync-time "$sync" --duration 8 --katcp-port 0 \
        --signals "cw(0.2, 1.0e8); wgn(0.05);" 127.0.0.1:7101 127.0.0.1:7102 > "$out/dsim-$run.txt" 2>&1
    sleep 3
    kill -INT "$feng"; wait "$feng"; echo "== fengine run $run exit $?"
    wait "${caps[@]}"
    grep 'dsim: sent' "$out/dsim-$run.txt"
    grep -E "^fengine:|DDC mapping|tuning cache|input slots|error|Error" "$out/fengine-$run.txt" | head -20
    for port in 7200 7201 7202; do
        echo -n "capture $port: "
        tail -n 1 "$out/capture-$run-$port.txt" | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|too_old_heaps|gbps)"' | tr '\n' ' '; echo
    done
done
echo "== tuning cache"; cat "$cache"
