#!/usr/bin/env python3
"""spead2's receiver beside cbf's in bench/net_transports.rs (issue 15), on the same traffic.

The Rust benchmark starts this script, reads the UDP port it prints, fills that socket with
its packets (1 MiB heaps, immediate 0x1600 = heap number n), then writes the packet count
on stdin. Only then is the socket handed to spead2: a ChunkRingStream (spead2's C++ chunk
receiver, as katgpucbf uses it) with one worker thread pinned to the receive core, heaps placed
8 to an 8 MiB chunk (chunk n // 8, slot n % 8) by a place callback compiled from C here (native,
as katgpucbf's numba cfunc is; a Python callback would be timed too). The worker thread's CPU
time (/proc/self/task/TID/schedstat, ns) from the hand-over until the stream has counted every
packet is the receive core's cost of draining the socket, as cbf's is measured. Prints one JSON
line: packets, heaps complete, cpu_s, wall_s, spead2's version.

Usage: spead2_recv_chunks.py CORE   (run by `cargo bench --bench net_transports`)
"""
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import scipy
import spead2
import spead2.recv

HEAPS_PER_CHUNK = 8
HEAP_BYTES = 1 << 20
BUFFER = 1 << 30

PLACE_C = r"""
#include <stddef.h>
#include <stdint.h>
/* The leading fields of spead2's chunk_place_data (recv_chunk_stream.h), which it keeps stable. */
struct place_data {
    const uint8_t *packet;
    size_t packet_size;
    const int64_t *items;
    int64_t chunk_id;
    size_t heap_index;
    size_t heap_offset;
};
void place(void *data, size_t size)
{
    struct place_data *d = data;
    int64_t n = d->items[0]; /* item 0x1600; -1 when absent: the heap is discarded */
    (void)size;
    if (n < 0)
        return;
    d->chunk_id = n / %(per)d;
    d->heap_index = (size_t)(n %% %(per)d);
    d->heap_offset = d->heap_index * %(bytes)d;
}
""" % {"per": HEAPS_PER_CHUNK, "bytes": HEAP_BYTES}


def place_callback(tmp):
    src = os.path.join(tmp, "place.c")
    lib = os.path.join(tmp, "place.so")
    with open(src, "w") as f:
        f.write(PLACE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    so = ctypes.CDLL(lib)
    so.place.restype = None
    so.place.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return so, scipy.LowLevelCallable(so.place, signature="void (void *, size_t)")


def tasks():
    return set(os.listdir("/proc/self/task"))


def cpu_ns(tids):
    total = 0
    for t in tids:
        with open(f"/proc/self/task/{t}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def main():
    core = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        so, place = place_callback(tmp)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, 33, BUFFER)  # SO_RCVBUFFORCE (root)
        sock.bind(("127.0.0.1", 0))
        print(sock.getsockname()[1], flush=True)
        expected = int(sys.stdin.readline())

        before = tasks()
        pool = spead2.ThreadPool(1, [core])
        workers = tasks() - before
        config = spead2.recv.StreamConfig(max_heaps=8)
        chunk_config = spead2.recv.ChunkStreamConfig(items=[0x1600], max_chunks=2, place=place)
        data_ring = spead2.recv.ChunkRingbuffer(4)
        free_ring = spead2.recv.ChunkRingbuffer(4)
        stream = spead2.recv.ChunkRingStream(pool, config, chunk_config, data_ring, free_ring)
        for _ in range(4):
            # Written once now, as cbf's chunks are: first-touch faults are not receive work.
            data = np.empty(HEAPS_PER_CHUNK * HEAP_BYTES, np.uint8)
            data.fill(0)
            stream.add_free_chunk(
                spead2.recv.Chunk(present=np.zeros(HEAPS_PER_CHUNK, np.uint8), data=data)
            )
        def consume():
            for chunk in data_ring:
                stream.add_free_chunk(chunk)

        consumer = threading.Thread(target=consume)
        consumer.start()
        cpu0 = cpu_ns(workers)
        t0 = time.monotonic()
        stream.add_udp_reader(sock, max_size=9200)
        packets = 0
        while time.monotonic() - t0 < 60:
            packets = stream.stats["packets"]
            if packets >= expected:
                break
            time.sleep(0.0005)
        wall = time.monotonic() - t0
        cpu = cpu_ns(workers) - cpu0
        stream.stop()
        consumer.join()
        stats = stream.stats
        # As cbf counts them (its stop discards the chunks still in the window, so the
        # chunks' presence flags would miss the last two).
        complete = (
            stats["heaps"] - stats["incomplete_heaps_evicted"] - stats["incomplete_heaps_flushed"]
        )
        print(
            json.dumps(
                {
                    "packets": packets,
                    "heaps_complete": complete,
                    "cpu_s": cpu / 1e9,
                    "wall_s": wall,
                    "spead2": spead2.__version__,
                }
            ),
            flush=True,
        )
        del so


if __name__ == "__main__":
    main()
