#!/usr/bin/env bash
# cbf fsim's send throughput on loopback, unpaced, with 1, 2, 4 and 8 destinations (one send
# thread each) and paced at its default rate, beside the peers in the same run: `cbf dsim`
# unpaced (the project's reference sender, bench/RESULTS.md) and, where spead2 is installed,
# katgpucbf fsim's sending method with spead2's C++ sender (bench/fsim_spead2_send.py).
# Destinations are sockets bound and never read. Usage: bench/fsim-bench.sh [CBF] (SECS=5).
set -u
cbf=${1:-target/release/cbf}
secs=${SECS:-5}
python=${PYTHON:-python3}
echo "date: $(date -u +%FT%TZ)"
echo "host: $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), Linux $(uname -r)"
echo "load average (other work on this machine): $(cut -d" " -f1-3 /proc/loadavg)"
ports=(49001 49002 49003 49004 49005 49006 49007 49008 49009 49010)
"$python" - 3600 "${ports[@]}" <<'PY' &
import socket, sys, time
held = []
for p in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", int(p)))
    held.append(s)
time.sleep(float(sys.argv[1]))
PY
holder=$!
sleep 1
run() {
    echo "\$ $*"
    "$@" 2>/dev/null
}
for n in 1 2 4 8; do
    dests=()
    for ((i = 0; i < n; i++)); do dests+=("127.0.0.1:${ports[$i]}"); done
    run "$cbf" fsim --send-rate-factor 0 --duration "$secs" --katcp-port 0 "${dests[@]}"
done
run "$cbf" fsim --duration "$secs" --katcp-port 0 "127.0.0.1:${ports[0]}"
run "$cbf" dsim --adc-sample-rate 1712e6 --send-rate-factor 0 --duration "$secs" --katcp-port 0 \
    --period 4194304 "127.0.0.1:${ports[8]}" "127.0.0.1:${ports[9]}"
if "$python" -c 'import spead2' 2>/dev/null; then
    run "$python" "$(dirname "$0")/fsim_spead2_send.py" "${ports[0]}" "$secs"
else
    echo "spead2 not installed for $python: no spead2 peer on this machine"
fi
kill "$holder"
