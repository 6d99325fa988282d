#!/usr/bin/env bash
# A late start of the XB-engine under load, on loopback with the CPU backend (bench/RESULTS.md,
# "late start"). Four `cbf fsim` (two F-engines each, one port each) feed `cbf xbengine` with
# four receive threads; chunks of 8 batches, --recv-reorder-tol TOL chunk steps (max_chunks =
# TOL + 1). MODE=late: the engine is SIGSTOPped once its receivers run, for PAUSE s after the
# senders start, so that every socket fills with a backlog of old heaps before the first read
# (as the CUDA engine's kernel compiles did on the device); MODE=early: no pause. Prints the
# engine's input chunks (and far-future heaps) every 0.5 s from the first read, then its
# summary. STACKS=1: the engine's threads' stacks (gdb) once the senders finish.
#   BIN=target/debug/cbf MODE=late TOL=8 RATE=107e6 DUR=6 bash bench/late-start.sh
set -u
BIN=${BIN:-target/debug/cbf}
MODE=${MODE:-late}; PAUSE=${PAUSE:-2}; TOL=${TOL:-8}; RATE=${RATE:-107e6}; DUR=${DUR:-6}
OUT=${OUT:-/tmp/cbf-late-start-$MODE-$TOL}; mkdir -p "$OUT"; rm -f "$OUT"/*
sync=$(date +%s)
step=$((64 * 2048 * 8)) # ticks per chunk: 64 spectra per heap × 2048 samples × 8 batches
COMMON="--array-size 8 --channels 1024 --channels-per-substream 64 --samples-between-spectra 2048
  --jones-per-batch 65536 --adc-sample-rate $RATE --sync-time $sync"
$BIN xbengine $COMMON --heaps-per-fengine-per-chunk 8 --recv-reorder-tol $((TOL * step)) \
  --recv-threads 4 --recv-buffer 33554432 --katcp-port 0 --prometheus-port 9464 \
  --duration $((DUR + 4)) --send-enabled \
  --corrprod name=x0,dst=127.0.0.1:7400,heap_accumulation_threshold=64 \
  127.0.0.1:7150,127.0.0.1:7151,127.0.0.1:7152,127.0.0.1:7153 > "$OUT/xb.txt" 2>&1 &
xb=$!
for _ in $(seq 1 100); do grep -q "katcp server listening" "$OUT/xb.txt" && break; sleep 0.1; done
[ "$MODE" = late ] && kill -STOP $xb
pids=""
for part in 0 1 2 3; do
  missing=$(seq 0 7 | awk -v p=$part '$1 < 2*p || $1 >= 2*p+2' | paste -sd,)
  $BIN fsim $COMMON --payload katgpucbf --send-rate-factor 1.0 --duration "$DUR" --katcp-port 0 \
    --missing-fengines "$missing" 127.0.0.1:$((7150 + part)) > "$OUT/fsim-$part.txt" 2>&1 &
  pids="$pids $!"
done
[ "$MODE" = late ] && { sleep "$PAUSE"; kill -CONT $xb; }
metric() { curl -s localhost:9464/metrics | awk -v m="$1" '$1 == m {print $2}'; }
for i in $(seq 1 $((2 * DUR))); do
  sleep 0.5
  echo "$(echo "$i * 0.5" | bc) s: chunks $(metric xbgpu_input_chunks_total)," \
    "far future $(metric xbgpu_input_far_future_heaps_total)" >> "$OUT/chunks.txt"
done
wait $pids
[ -n "${STACKS:-}" ] && gdb -p $xb -batch -ex "thread apply all bt 12" > "$OUT/stacks.txt" 2>&1
wait $xb
grep -h "fsim: sent" "$OUT"/fsim-0.txt
paste -sd' ' "$OUT/chunks.txt"
grep -E "^xbengine: input" "$OUT/xb.txt"
