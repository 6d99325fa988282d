#!/usr/bin/env bash
# What one device call runs (bench/RESULTS.md quotes its output): the GPU self-test, then, only
# if it passed, the kernel and whole-path benchmarks and the end-to-end engine over loopback
# (dsim → fengine --backend cuda → capture). Binaries come from `cargo build --release
# --no-default-features` (the device may lack libhwloc) on
# the development machine, stripped into .dev/ (ignored by git, carried to the device).
# Usage: bench/device-run.sh [--quick] [--skip-bench] [--skip-e2e]; logs go to $OUT if set.
# Environment: CBF_E2E_RATES, CBF_E2E_ANTS (antenna counts to try), CBF_E2E_SECS,
# CBF_DSIM_THREADS (dsim send threads per antenna), CBF_E2E_LAYOUTS (DESTS:RECV pairs: loopback
# addresses per pol, as a digitiser spreads a pol over several groups, and the engine's receive
# threads; default 1:2), CBF_E2E_PIN (1: dsim on its own cores), CBF_BACKEND (cuda; cpu for a dry run),
# CBF_FENG_EXTRA (more fengine flags, e.g. "--send-sample-bits 4"), CBF_E2E_CAPTURE (0: no capture
# of the engine's output; its packets go to a port nobody reads), CBF_CHANNELS (the wideband
# output's channels; default 4096). dsim starts once every engine has logged its output: on a
# fresh machine the engine's start-up (driver, NVRTC) took ~2 s, and a dsim started with it
# lost that much to a window jump and heaps too old (bench/e2e-2026-11-28-s19.txt).
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
# End to end over loopback: per antenna, 2 pols × rate × 10 bits in (one dsim with
# CBF_DSIM_THREADS send threads), one fengine --backend cuda, CBF_CHANNELS channels out to a capture.
# CBF_E2E_ANTS antennas run at once, each its own processes (as katgpucbf runs one fgpu per
# antenna), all on the one GPU.
rcvbuf_errors() { awk '/^Udp:/ { if (h) print $6; h = 1 }' /proc/net/snmp; }
# The engine runs until SIGINT (a graceful stop: flush, summary); dsim renders its signal
# pattern before sending (seconds for wgn), so the clock starts at its "sending" line.
e2e() {
    local rate=$1 secs=$2 ants=$3 threads=${CBF_DSIM_THREADS:-1}
    local dests=${4%:*} recv=${4#*:}
    local drops_before sync a tag p0 p1 pin_dsim="" pin_rest=""
    # CBF_E2E_PIN=1: dsim's send threads on cores 0.., the engines and captures on the rest
    # (unpinned, a busy send thread and a receive thread can share a core and fall behind).
    if [ "${CBF_E2E_PIN:-0}" = 1 ]; then
        pin_rest="taskset -c $((ants * threads))-$(($(nproc) - 1))"
    fi
    local -a fengs dsims caps
    drops_before=$(rcvbuf_errors)
    sync=$(date +%s)
    for ((a = 0; a < ants; a++)); do
        tag="$rate-n$ants-$dests-$recv-a$a"
        p0="127.0.0.1+$((dests - 1)):$((7101 + 2 * a))" p1="127.0.0.1+$((dests - 1)):$((7102 + 2 * a))"
        $pin_rest "$bin/cbf" fengine --backend "${CBF_BACKEND:-cuda}" --src "$p0,$p1" \
            --recv-threads "$recv" --adc-sample-rate "$rate" --sync-time "$sync" --katcp-port 0 \
            --wideband "name=wide,channels=${CBF_CHANNELS:-4096},dst=127.0.0.1:$((7200 + a))" ${CBF_FENG_EXTRA:-} \
            > "$out/fengine-$tag.txt" 2>&1 &
        fengs+=($!)
    done
    for ((a = 0; a < ants; a++)); do
        tag="$rate-n$ants-$dests-$recv-a$a"
        until grep -q 'kind="wideband"' "$out/fengine-$tag.txt" || ! kill -0 "${fengs[a]}" 2>/dev/null; do sleep 0.2; done
    done
    for ((a = 0; a < ants; a++)); do
        tag="$rate-n$ants-$dests-$recv-a$a"
        p0="127.0.0.1+$((dests - 1)):$((7101 + 2 * a))" p1="127.0.0.1+$((dests - 1)):$((7102 + 2 * a))"
        [ -n "$pin_rest" ] && pin_dsim="--affinity=$(seq -s, $((a * threads)) $((a * threads + threads - 1)))"
        "$bin/cbf" dsim $pin_dsim --adc-sample-rate "$rate" --sync-time "$sync" --duration "$secs" --katcp-port 0 \
            --send-threads "$threads" --dither-seed "$a" --signals "cw(0.2, 1.0e8); wgn(0.05);" \
            "$p0" "$p1" > "$out/dsim-$tag.txt" 2>&1 &
        dsims+=($!)
    done
    for ((a = 0; a < ants; a++)); do
        tag="$rate-n$ants-$dests-$recv-a$a"
        until grep -q sending "$out/dsim-$tag.txt" || ! kill -0 "${dsims[a]}" 2>/dev/null; do sleep 0.2; done
        [ "${CBF_E2E_CAPTURE:-1}" = 0 ] && continue
        $pin_rest "$bin/cbf" capture --stats --duration $((secs + 3)) "127.0.0.1:$((7200 + a))" > "$out/capture-$tag.txt" 2>&1 &
        caps+=($!)
    done
    wait "${dsims[@]}"
    sleep 3
    kill -INT "${fengs[@]}"; wait "${fengs[@]}"; [ ${#caps[@]} -gt 0 ] && wait "${caps[@]}"
    local drops_after
    drops_after=$(rcvbuf_errors)
    echo "== e2e at $rate S/s per pol, $ants antenna(s), $threads dsim send thread(s), $dests destination(s) per pol, $recv receive thread(s), pinned ${CBF_E2E_PIN:-0}: UDP receive-buffer errors before $drops_before, after $drops_after (+$((drops_after - drops_before)))"
    for ((a = 0; a < ants; a++)); do
        tag="$rate-n$ants-$dests-$recv-a$a"
        echo "-- antenna $a"
        grep 'dsim: sent' "$out/dsim-$tag.txt"; grep '^fengine:' "$out/fengine-$tag.txt"
        [ -f "$out/capture-$tag.txt" ] && tail -n 1 "$out/capture-$tag.txt" | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|too_old_heaps|gbps)"' | tr '\n' ' '; echo
    done
}
for ants in ${CBF_E2E_ANTS:-1}; do
    for layout in ${CBF_E2E_LAYOUTS:-1:2}; do
        for rate in ${CBF_E2E_RATES:-428e6 856e6 1712e6}; do
            e2e "$rate" "${CBF_E2E_SECS:-8}" "$ants" "$layout"
        done
    done
done
