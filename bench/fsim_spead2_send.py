#!/usr/bin/env python3
"""The peer of `cbf fsim` in bench/RESULTS.md: katgpucbf fsim's sending method with spead2
4.5.1's C++ sender, written here from its description (facts §1.5, §1.9): one batch is
ANTS F heaps (timestamp, feng_id, frequency, feng_raw (CPS, SPH, 2, 2) int8, every pointer in
every packet), sent with `send_heaps(..., ROUND_ROBIN)` from a `HeapReferenceList`, unpaced,
8 batches in flight as katgpucbf keeps them, to one UDP destination nobody reads.

Usage: fsim_spead2_send.py PORT SECONDS [ANTS CPS SPH PAYLOAD]
Prints one line: batches, heaps, packets, wire bytes, seconds, Gb/s, packets/s.
"""
import os
import sys
import time

import numpy as np
import spead2
import spead2.send

port, seconds = int(sys.argv[1]), float(sys.argv[2])
ants, cps, sph, payload = (int(v) for v in (sys.argv[3:7] or [80, 512, 32, 8192]))
flavour = spead2.Flavour(4, 64, 48, 0)
queue = 8
data = np.ones((queue, ants, cps, sph, 2, 2), np.int8)
config = spead2.send.StreamConfig(max_packet_size=payload + 72, rate=0.0, max_heaps=queue * ants)
stream = spead2.send.UdpStream(spead2.ThreadPool(1), [("127.0.0.1", port)], config, 4 << 20)


def immediate(id_, value):
    item = spead2.Item(id_, "", "", (), format=[("u", 48)])
    item.value = value
    return item


frames = []
for i in range(queue):
    heaps = []
    for f in range(ants):
        h = spead2.send.Heap(flavour)
        h.repeat_pointers = True
        h.add_item(immediate(0x1600, i))
        h.add_item(immediate(0x4101, f))
        h.add_item(immediate(0x4103, 0))
        h.add_item(spead2.Item(0x4300, "", "", data[i, f].shape, dtype=np.int8, value=data[i, f]))
        heaps.append(spead2.send.HeapReference(h))
    frames.append(spead2.send.HeapReferenceList(heaps))
heap_bytes = cps * sph * 4
packets_per_heap = -(-heap_bytes // payload)
wire_per_heap = heap_bytes + 72 * packets_per_heap
start = time.monotonic()
batches = 0
while time.monotonic() - start < seconds:
    stream.send_heaps(frames[batches % queue], spead2.send.GroupMode.ROUND_ROBIN)
    batches += 1
secs = time.monotonic() - start
heaps = batches * ants
print(
    f"spead2 fsim-method: {batches} batches, {heaps} heaps, {heaps * packets_per_heap} packets, "
    f"{heaps * wire_per_heap} bytes in {secs:.3f} s "
    f"({heaps * wire_per_heap * 8 / secs / 1e9:.3f} Gb/s, {heaps * packets_per_heap / secs:.0f} packets/s)"
)
sys.stdout.flush()
# spead2's stream teardown can block at interpreter exit; the measurement is done.
os._exit(0)
