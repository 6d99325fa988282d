#!/usr/bin/env bash
# `--use-vkgdr` on the device (issue 15). First the GPU self-test: its `vkgdr` family is the
# identity check (host writes reach the device bit for bit, device writes read back, and the
# F-engine pipeline's heaps from chunks in vkgdr memory byte-identical to those from the same
# chunks in host memory, through the engine's own Pipeline, GpuBackend and input slots). Then
# the engine live, as bench/device-run.sh runs it (dsim → fengine --backend cuda → capture over
# loopback), without and with --use-vkgdr at the same rate: both must keep up, and the second
# must log its chunks in GPU memory. Outputs of two live runs are not compared byte for byte
# (loopback may drop, and the runs start at different timestamps): the self-test does that.
# Binaries from `cargo build --release --no-default-features` in .dev/ (as bench/device-run.sh).
# Usage: bench/vkgdr-device-run.sh [--skip-selftest]; logs go to $OUT if set.
# Environment: CBF_VKGDR_RATES (default "1712e6"), CBF_VKGDR_SECS (default 8).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${CBF_BIN:-.dev}
out=${OUT:-/tmp}
status=0
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv
nvidia-smi -q | grep -A3 'BAR1 Memory Usage'
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null
if [[ " $* " != *" --skip-selftest "* ]]; then
    "$bin/cbf" selftest --gpu 2>&1 | tee "$out/selftest.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED"; status=1; }
    echo "== vkgdr family:"; grep -E '^vkgdr' "$out/selftest.txt"
fi
# One live run: 2 pols at $rate from one dsim, one engine, 4096 channels out to a capture.
live() {
    local rate=$1 secs=$2 tag=$3; shift 3
    local sync feng dsim cap
    sync=$(date +%s)
    "$bin/cbf" fengine --backend cuda "$@" --src 127.0.0.1:7401,127.0.0.1:7402 --recv-threads 2 \
        --adc-sample-rate "$rate" --sync-time "$sync" --katcp-port 0 \
        --wideband "name=wide,channels=4096,dst=127.0.0.1:7410" > "$out/vkgdr-fengine-$tag.txt" 2>&1 &
    feng=$!
    "$bin/cbf" dsim --adc-sample-rate "$rate" --sync-time "$sync" --duration "$secs" --katcp-port 0 \
        --dither-seed 7 --signals "cw(0.2, 1.0e8); wgn(0.05);" 127.0.0.1:7401 127.0.0.1:7402 \
        > "$out/vkgdr-dsim-$tag.txt" 2>&1 &
    dsim=$!
    until grep -q sending "$out/vkgdr-dsim-$tag.txt" || ! kill -0 "$dsim" 2>/dev/null; do sleep 0.2; done
    "$bin/cbf" capture --stats --duration $((secs + 3)) 127.0.0.1:7410 > "$out/vkgdr-capture-$tag.txt" 2>&1 &
    cap=$!
    wait "$dsim"
    sleep 3
    kill -INT "$feng" 2>/dev/null; wait "$feng"; local rc=$?
    wait "$cap"
    echo "-- $tag at $rate S/s per pol (fengine exit $rc)"
    grep -E 'vkgdr|GPU memory|error' "$out/vkgdr-fengine-$tag.txt" | head -n 5
    grep 'dsim: sent' "$out/vkgdr-dsim-$tag.txt"; grep '^fengine:' "$out/vkgdr-fengine-$tag.txt"
    tail -n 1 "$out/vkgdr-capture-$tag.txt" | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|gbps)"' | tr '\n' ' '; echo
    [ "$rc" -eq 0 ] || status=1
}
for rate in ${CBF_VKGDR_RATES:-1712e6}; do
    live "$rate" "${CBF_VKGDR_SECS:-8}" "default-$rate"
    live "$rate" "${CBF_VKGDR_SECS:-8}" "vkgdr-$rate" --use-vkgdr
    grep -q 'receive chunks in GPU memory' "$out/vkgdr-fengine-vkgdr-$rate.txt" \
        || { echo "== --use-vkgdr run did not put its chunks in GPU memory"; status=1; }
done
exit $status
