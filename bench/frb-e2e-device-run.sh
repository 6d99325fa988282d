#!/usr/bin/env bash
# FRB on the CUDA XB-engine: selftest, then 80 antennas on an 8×10 grid at MeerKAT's real rate
# (4 fsim processes, 20 F-engines each) → cbf xbengine --backend cuda --frb-beam → capture.
set -uo pipefail
bin=${BIN:-.dev-frb}
"$bin/cbf" selftest --gpu 2>&1 | tee $OUT/selftest.txt | grep -E "frb|xbengine|selftest:"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "selftest FAILED"; exit 1; }
python3 -c "
for a in range(80): print(a // 10, a % 10)" > /tmp/map
sync=$(date +%s)
"$bin/cbf" xbengine --backend cuda --array-size 80 --channels 32768 \
    --samples-between-spectra 65536 --adc-sample-rate 1712e6 --channels-per-substream 512 \
    --sync-time $sync --send-enabled --katcp-port 0 --recv-threads 4 --recv-buffer 536870912 \
    --frb-beam name=frb0,dst=127.0.0.1:7320,grid=8x10,dish_map=/tmp/map,t_ds=32,beams=16x20 \
    127.0.0.1:7150,127.0.0.1:7151,127.0.0.1:7152,127.0.0.1:7153 > $OUT/xb.txt 2>&1 &
xb=$!
sleep 3
"$bin/cbf" capture --stats --duration 16 127.0.0.1:7320 > $OUT/frb-cap.txt 2>&1 &
cap=$!
pids=""
for part in 0 1 2 3; do
    missing=$(seq 0 79 | awk -v p=$part '$1 < 20*p || $1 >= 20*p+20' | paste -sd,)
    "$bin/cbf" fsim --array-size 80 --sync-time $sync --payload katgpucbf --send-rate-factor 1.0 \
        --duration 12 --katcp-port 0 --missing-fengines "$missing" 127.0.0.1:$((7150 + part)) > $OUT/fsim-$part.txt 2>&1 &
    pids="$pids $!"
done
wait $pids; sleep 3
kill -INT $xb; wait $xb; echo "xbengine exit $?"; wait $cap
grep -h "fsim: sent" $OUT/fsim-*.txt
grep -E "^xbengine: (input|frb)|error|Error" $OUT/xb.txt | head
tail -n 1 $OUT/frb-cap.txt | tr ',' '\n' | grep -E '"(heaps|incomplete_heaps_evicted|too_old_heaps|gbps)"' | tr '\n' ' '; echo
