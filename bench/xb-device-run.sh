#!/usr/bin/env bash
# One device call for the GPU XB-engine (issue 13; bench/RESULTS.md "GPU XB-engine"): the GPU
# self-test (figures count only if it passes), cbf-xb-bench (the beamformer kernel against the
# device copy bandwidth; the whole GPU XB path against the H2D bound and the correlator op, same
# run), then end to end over loopback at MeerKAT's real rate for 80 antennas: four `cbf fsim`
# processes (20 F-engines each, one port each; together facts §1.5's 34.24 Gb/s × 1.1) →
# `cbf xbengine --backend cuda` (8 beams, a 0.5 s corrprod and a 64-heap one) → `cbf capture`;
# then the same input at 2 % of the rate into `--backend cpu` (the 64-heap corrprod only), whose
# complete X dumps must carry the bytes of the CUDA run's (crc32 of xeng_raw; fsim's katgpucbf
# payload repeats every batch, so every complete dump of an output is the same).
# Binaries from `cargo build --release --no-default-features` (the device may lack libhwloc)
# stripped into .dev/
# Usage: bench/xb-device-run.sh [--quick] [--skip-bench] [--skip-e2e]; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.dev
final=${OUT:-/tmp}
# Logs in a scratch folder, packed into one archive in $OUT at the end (few files come back).
out=$(mktemp -d)
trap 'tar czf "$final/xb-logs.tar.gz" -C "$out" . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
"$bin/cbf" selftest --gpu 2>&1 | tee "$out/selftest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED: no figures count"; exit 1; }
if [[ " $* " != *" --skip-bench "* ]]; then
    "$bin/cbf-xb-bench" "$@" 2>&1 | tee "$out/xb-bench.txt"
fi
[[ " $* " == *" --skip-e2e "* ]] && exit 0

rcvbuf_errors() { awk '/^Udp:/ { if (h) print $6; h = 1 }' /proc/net/snmp; }
ants=80
# 0.5 s dumps: 1712e6 / 65536 spectra/s / 32 spectra per heap × 0.5 s.
acc=408
beams=""
beam_dsts=""
for b in 0 1 2 3 4 5 6 7; do
    beams="$beams --beam name=beam$b,dst=127.0.0.1:$((7310 + b)),pol=$((b % 2))"
    beam_dsts="$beam_dsts${beam_dsts:+,}127.0.0.1:$((7310 + b))"
done
# e2e BACKEND RATE_FACTOR SECONDS OUTPUTS: fsim ×4 → xbengine → capture (X as JSON, one beam
# as stats).
e2e() {
    local backend=$1 factor=$2 secs=$3 outputs=$4
    local tag="$backend"
    local sync drops_before
    sync=$(date +%s)
    drops_before=$(rcvbuf_errors)
    "$bin/cbf" xbengine --backend "$backend" --array-size $ants --channels 32768 \
        --samples-between-spectra 65536 --adc-sample-rate 1712e6 \
        --channels-per-substream 512 --sync-time "$sync" --send-enabled --katcp-port 0 \
        --recv-threads 4 --recv-buffer 536870912 $outputs \
        127.0.0.1:7150,127.0.0.1:7151,127.0.0.1:7152,127.0.0.1:7153 \
        > "$out/xbengine-$tag.txt" 2>&1 &
    local xb=$!
    # The engine starts its katcp server once it is built (kernels compiled, outputs ready):
    # start the senders then, not after a fixed wait (3 s was too short on a cold H200 in the
    # twenty-fourth session: 4.6 s to build, and the input that came first was lost).
    local waited=0
    until grep -q 'katcp server listening' "$out/xbengine-$tag.txt" 2>/dev/null; do
        kill -0 $xb 2>/dev/null || { echo "xbengine exited at start-up"; cat "$out/xbengine-$tag.txt"; exit 1; }
        (( waited++ < 600 )) || { echo "xbengine not ready within 60 s"; exit 1; }
        sleep 0.1
    done
    "$bin/cbf" capture --duration $((secs + 4)) 127.0.0.1:7301 > "$out/x-$tag.jsonl" 2> "$out/x-$tag.err" &
    local capx=$!
    "$bin/cbf" capture --stats --duration $((secs + 4)) 127.0.0.1:7310 > "$out/beams-$tag.txt" 2>&1 &
    local capb=$!
    local pids=""
    for part in 0 1 2 3; do
        # This process sends F-engines [20·part, 20·part + 20): the others are left out.
        local missing
        missing=$(seq 0 $((ants - 1)) | awk -v p=$part '$1 < 20*p || $1 >= 20*p+20' | paste -sd,)
        "$bin/cbf" fsim --array-size $ants --sync-time "$sync" --payload katgpucbf \
            --send-rate-factor "$factor" --duration "$secs" --katcp-port 0 \
            --missing-fengines "$missing" 127.0.0.1:$((7150 + part)) > "$out/fsim-$tag-$part.txt" 2>&1 &
        pids="$pids $!"
    done
    wait $pids
    sleep 3
    kill -INT $xb; wait $xb; wait $capx $capb
    echo "== e2e $backend at ${factor}× real rate for ${secs} s: UDP receive-buffer drops $(( $(rcvbuf_errors) - drops_before ))"
    grep -h 'fsim: sent' "$out"/fsim-$tag-*.txt
    grep -E '^xbengine: (input|corrprod|beam beam0)' "$out/xbengine-$tag.txt"
    echo "64-heap X heaps captured: $(grep -c 0x1800 "$out/x-$tag.jsonl" || true)"
    echo -n "beam0 capture: "; tail -n 1 "$out/beams-$tag.txt" | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|too_old_heaps|gbps)"' | tr '\n' ' '; echo
}
x_main="--corrprod name=baseline-correlation-products,dst=127.0.0.1:7300,heap_accumulation_threshold=$acc"
x_cmp="--corrprod name=bcp-64,dst=127.0.0.1:7301,heap_accumulation_threshold=64"
e2e cuda 1.1 20 "$x_main $x_cmp $beams"
e2e cpu 0.02 45 "$x_cmp"
python3 - "$out/x-cuda.jsonl" "$out/x-cpu.jsonl" <<'EOF'
import collections, json, sys
def crcs(path):
    c = collections.Counter()
    for line in open(path):
        h = json.loads(line)
        for it in h.get("items", []):
            if it.get("id") == "0x1800" and h.get("complete"):
                c[it.get("crc32")] += 1
    return c
g, c = crcs(sys.argv[1]), crcs(sys.argv[2])
print("cuda 64-heap X dumps by crc32:", dict(g))
print("cpu  64-heap X dumps by crc32:", dict(c))
if g and c and g.most_common(1)[0][0] == c.most_common(1)[0][0]:
    print("X heaps: the complete dumps of the CUDA and CPU backends are identical (crc32", g.most_common(1)[0][0] + ")")
else:
    print("X heaps: CUDA and CPU backends DIFFER")
    sys.exit(1)
EOF
