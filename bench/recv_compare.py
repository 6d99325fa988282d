#!/usr/bin/env python3
"""Receive and send benchmarks on loopback, cbf beside spead2's C++ tools, in one run.

receive: spead2_send (C++) sends N heaps of 1 MiB at a paced rate to 127.0.0.1; the receiver
is either `cbf capture --stats` or `spead2_recv --quiet --mem-pool` (both with the same socket
buffer, pinned to the other core). For each packet size the rate ladder finds the highest rate
each receiver takes with zero loss; an unpaced run shows each one's ceiling.

send: `cbf dsim --send-rate-factor 0` against `spead2_send --rate 0` with the same packet size
(5192 B, a 10-bit 4096-sample digitiser packet), into a socket nobody reads; packets/s from the
sender's own count.

Usage: bench/recv_compare.py [--quick]  (needs bench/build-spead2-tools and a release build)
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CBF = os.path.join(ROOT, "target/release/cbf")
TOOLS = os.path.join(ROOT, "build/spead2-tools")
HEAP = 1 << 20
BUFFER = 32 << 20
SECONDS = 3.0


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def receiver_cmd(kind, port, packet):
    if kind == "cbf":
        return ["taskset", "-c", "1", CBF, "capture", f"127.0.0.1:{port}", "--stats", "--buffer", str(BUFFER),
                "--packet-size", str(packet + 64), "--max-heaps", "4", "--duration", "30"]
    return ["taskset", "-c", "1", os.path.join(TOOLS, "spead2_recv"), "--quiet", "--mem-pool", "--buffer", str(BUFFER),
            "--packet", str(packet + 64), f"127.0.0.1:{port}"]


def parse_received(kind, out):
    if kind == "cbf":
        last = json.loads(out.strip().splitlines()[-1])
        return last["heaps"] - last["incomplete_heaps_evicted"] - last["incomplete_heaps_flushed"] + 0 * last["packets"]
    m = re.search(r"Received (\d+) heaps", out)
    return int(m.group(1)) if m else -1


def run_receive(kind, packet, gbps):
    port = free_port()
    n = max(8, int(gbps * 1e9 / 8 * SECONDS / HEAP)) if gbps > 0 else 3000
    rx = subprocess.Popen(receiver_cmd(kind, port, packet), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    t0 = time.time()
    subprocess.run(["taskset", "-c", "0", os.path.join(TOOLS, "spead2_send"), "--addr-bits", "48", "--packet", str(packet),
                    "--heap-size", str(HEAP), "--heaps", str(n), "--rate", str(gbps), "--buffer", str(4 << 20),
                    f"127.0.0.1:{port}"], check=True, stdout=subprocess.DEVNULL)
    send_s = time.time() - t0
    try:
        out, err = rx.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        rx.kill()
        out, err = rx.communicate()
    got = parse_received(kind, out)
    # spead2_recv counts complete heaps only; the stop heap is not a data heap in either.
    return n, got, send_s


def ladder(kind, packet, rates, trials=2):
    """Rates in ascending order, `trials` runs each. A rate counts as lossless when every
    trial lost nothing; the result is the highest rate lossless together with all below it.
    The ladder stops after two consecutive rates with loss (the machine is shared and noisy,
    so one lossy trial does not end it)."""
    best, clean, failures = 0.0, True, 0
    rows = []
    for r in rates:
        ok = True
        for _ in range(trials):
            n, got, secs = run_receive(kind, packet, r)
            rows.append((r, n, got, n * HEAP * 8 / secs / 1e9))
            ok &= got == n
        if ok and clean:
            best = r
        clean &= ok
        failures = 0 if ok else failures + 1
        if failures == 2:
            break
    return best, rows


def run_send(kind, packet_payload=5120):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    port = sink.getsockname()[1]
    if kind == "cbf":
        heaps = 400_000
        t0 = time.time()
        out = subprocess.run(["taskset", "-c", "0", CBF, "dsim", "--adc-sample-rate", "1712e6", "--send-rate-factor", "0",
                              "--period", str(1 << 22), "--max-heaps", str(heaps // 2), "--send-buffer", str(4 << 20),
                              f"127.0.0.1:{port}", f"127.0.0.1:{port}"], check=True, capture_output=True, text=True).stdout
        secs = time.time() - t0
        m = re.search(r"sent (\d+) heaps, (\d+) packets, (\d+) bytes in ([\d.]+) s", out)
        packets, nbytes, secs = int(m.group(2)), int(m.group(3)), float(m.group(4))
    else:
        heaps = 400_000
        t0 = time.time()
        subprocess.run(["taskset", "-c", "0", os.path.join(TOOLS, "spead2_send"), "--addr-bits", "48", "--packet", "5200",
                        "--heap-size", str(packet_payload), "--heaps", str(heaps), "--rate", "0", "--buffer", str(4 << 20),
                        f"127.0.0.1:{port}"], check=True, stdout=subprocess.DEVNULL)
        secs = time.time() - t0
        packets, nbytes = heaps, heaps * (packet_payload + 48)
    sink.close()
    return packets / secs, nbytes * 8 / secs / 1e9


def main():
    quick = "--quick" in sys.argv
    print(f"# receive: 1 MiB heaps, socket buffer {BUFFER >> 20} MiB, sender core 0, receiver core 1, {SECONDS} s per step")
    for packet, rates in [(8192, [4, 8, 12, 16, 20, 24, 28, 32]), (1472, [2, 4, 6, 8, 10, 12, 14, 16])]:
        if quick:
            rates = rates[:3]
        for kind in ("spead2", "cbf"):
            best, rows = ladder(kind, packet, rates)
            for r, n, got, sent_gbps in rows:
                print(f"{kind:7} packet {packet:5} rate {r:4.0f} Gb/s: {got}/{n} heaps (sender achieved {sent_gbps:.2f} Gb/s)")
            print(f"{kind:7} packet {packet:5} highest lossless paced rate: {best} Gb/s")
        for kind in ("spead2", "cbf"):
            n, got, secs = run_receive(kind, packet, 0)
            print(f"{kind:7} packet {packet:5} unpaced: {got}/{n} heaps, sender {n * HEAP * 8 / secs / 1e9:.2f} Gb/s")
    print("# send: 5192-byte packets, unpaced, into an unread socket")
    for kind in ("spead2", "cbf"):
        pps, gbps = run_send(kind)
        print(f"{kind:7} send: {pps:,.0f} packets/s, {gbps:.2f} Gb/s")


if __name__ == "__main__":
    main()
