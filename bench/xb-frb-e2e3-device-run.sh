#!/usr/bin/env bash
# The FRB e2e three ways (bench/RESULTS.md, FRB "Since branch frb17"): the new binary with FRB,
# without FRB (the engine refuses a configuration with no output: it exits), an older binary
# (.dev-corr/old/cbf) with FRB; each engine started before its senders and waited for.
set -uo pipefail
one() { # bin tag frbflag
  bin=$1; tag=$2; shift 2
  sync=$(date +%s)
  "$bin" xbengine --backend cuda --array-size 80 --channels 32768 \
    --samples-between-spectra 65536 --adc-sample-rate 1712e6 --channels-per-substream 512 \
    --sync-time $sync --send-enabled --katcp-port 0 --recv-threads 4 --recv-buffer 536870912 \
    "$@" 127.0.0.1:7150,127.0.0.1:7151,127.0.0.1:7152,127.0.0.1:7153 > $OUT/xb-$tag.txt 2>&1 &
  xb=$!
  for i in $(seq 1 100); do grep -q "katcp server listening" $OUT/xb-$tag.txt && break; sleep 0.2; done
  pids=""
  for part in 0 1 2 3; do
    missing=$(seq 0 79 | awk -v p=$part '$1 < 20*p || $1 >= 20*p+20' | paste -sd,)
    .dev-corr/cbf fsim --array-size 80 --sync-time $sync --payload katgpucbf --send-rate-factor 1.0 \
        --duration 8 --katcp-port 0 --missing-fengines "$missing" 127.0.0.1:$((7150 + part)) > $OUT/fsim-$tag-$part.txt 2>&1 &
    pids="$pids $!"
  done
  wait $pids; sleep 2
  kill -INT $xb; wait $xb
  echo "== $tag"; grep -E "^xbengine: (input|frb)" $OUT/xb-$tag.txt
}
python3 -c "
for a in range(80): print(a // 10, a % 10)" > /tmp/map
F="--frb-beam name=frb0,dst=127.0.0.1:7320,grid=8x10,dish_map=/tmp/map,t_ds=32,beams=16x20"
one .dev-corr/cbf new-frb $F
one .dev-corr/cbf new-nofrb
one .dev-corr/old/cbf old-frb $F
