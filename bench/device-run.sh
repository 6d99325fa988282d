#!/usr/bin/env bash
# What one device call runs (bench/RESULTS.md quotes its output): the GPU self-test, then, only
# if it passed, the kernel and whole-path benchmarks and the end-to-end engine over loopback
# (dsim → fengine --backend cuda → capture). Binaries come from `cargo build --release` on
# the development machine, stripped into .dev/ (ignored by git, carried to the device).
# Usage: bench/device-run.sh [--quick] [--skip-bench] [--skip-e2e]; logs go to $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.dev
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
"$bin/cbf" selftest --gpu 2>&1 | tee "$out/selftest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
if [[ " $* " != *" --skip-bench "* ]]; then
    "$bin/cbf-gpu-bench" "$@" 2>&1 | tee "$out/bench.txt"
fi
[[ " $* " == *" --skip-e2e "* ]] && exit 0
# End to end over loopback: 2 pols × rate × 10 bits in, 4096 channels out.
rcvbuf_errors() { awk '/^Udp:/ { if (h) print $6; h = 1 }' /proc/net/snmp; }
# The engine runs until SIGINT (a graceful stop: flush, summary); dsim renders its signal
# pattern before sending (seconds for wgn), so the clock starts at its "sending" line.
e2e() {
    local rate=$1 secs=$2
    local drops_before sync
    drops_before=$(rcvbuf_errors)
    sync=$(date +%s)
    "$bin/cbf" fengine --backend cuda --src 127.0.0.1:7101,127.0.0.1:7102 --recv-threads 2 \
        --adc-sample-rate "$rate" --sync-time "$sync" --katcp-port 0 \
        --wideband name=wide,channels=4096,dst=127.0.0.1:7200 > "$out/fengine-$rate.txt" 2>&1 &
    local feng=$!
    "$bin/cbf" dsim --adc-sample-rate "$rate" --sync-time "$sync" --duration "$secs" --katcp-port 0 \
        --signals "cw(0.2, 1.0e8); wgn(0.05);" 127.0.0.1:7101 127.0.0.1:7102 > "$out/dsim-$rate.txt" 2>&1 &
    local dsim=$!
    until grep -q sending "$out/dsim-$rate.txt" || ! kill -0 $dsim 2>/dev/null; do sleep 0.2; done
    "$bin/cbf" capture --stats --duration $((secs + 3)) 127.0.0.1:7200 > "$out/capture-$rate.txt" 2>&1 &
    local cap=$!
    wait $dsim
    sleep 3
    kill -INT $feng; wait $feng; wait $cap
    echo "== e2e at $rate S/s per pol: UDP receive-buffer drops during the run: $(( $(rcvbuf_errors) - drops_before ))"
    grep 'dsim: sent' "$out/dsim-$rate.txt"; grep '^fengine:' "$out/fengine-$rate.txt"
    tail -n 1 "$out/capture-$rate.txt" | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|too_old_heaps|gbps)"' | tr '\n' ' '; echo
}
for rate in ${CBF_E2E_RATES:-428e6 856e6 1712e6}; do e2e "$rate" 8; done
