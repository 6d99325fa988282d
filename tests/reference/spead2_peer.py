#!/usr/bin/env python3
"""spead2 as the independent peer for cbf's SPEAD tests.

Each *case* is a list of heaps built with spead2's own API (`spead2.send.Heap`, `spead2.Item`,
`spead2.Descriptor`); tests/spead2_interop.rs builds the same heaps with cbf's API. The
expected bytes and decoded values therefore come from spead2 4.5.1, never from cbf.

Usage:
  spead2_peer.py encode CASE            hex of spead2's bytes (BytesStream), one line per packet
  spead2_peer.py send-udp CASE HOST PORT [--shuffle SEED]
                                        send the case's packets over UDP (optionally reordered
                                        within each heap), then a stop heap
  spead2_peer.py recv-fheaps PORT N     receive F-engine heaps with spead2 until N data heaps
                                        have been decoded through their descriptors; one JSON
                                        line per heap: timestamp, feng_id, frequency, feng_raw
                                        shape and dtype, peak channel per pol
  spead2_peer.py recv-fsim SECONDS ANTS STEP BITS PAYLOAD SEED PORT...
                                        receive cbf fsim's F heaps on each PORT (one
                                        spead2 stream each) for SECONDS; one JSON line per
                                        heap: port, cnt, timestamp, feng_id, frequency,
                                        feng_raw shape and dtype, and whether feng_raw equals
                                        numpy's recomputation of the PAYLOAD formula
                                        (katgpucbf or random)
  spead2_peer.py recv-udp PORT N        receive N heaps with spead2 and print one JSON line
                                        per heap: cnt, raw items by id (immediate value
                                        or payload hex), ItemGroup-decoded values of
                                        described items, descriptors
"""
import json
import random
import socket
import sys
import time

import numpy as np
import spead2
import spead2.recv
import spead2.send

F48 = spead2.Flavour(4, 64, 48, 0)
F40 = spead2.Flavour(4, 64, 40, 0)


def item(id_, value, flavour=F48, shape=(), fmt=None, dtype=None, name=None, desc=""):
    if fmt is None and dtype is None:
        fmt = [("u", flavour.heap_address_bits)]
    it = spead2.Item(id_, name or f"item_{id_:x}", desc, shape, format=fmt, dtype=dtype)
    it.value = value
    return it


def case(name):
    """Return (flavour, max_packet_size, cnt_sequence or None, [heaps])."""
    if name == "immediates":
        h = spead2.send.Heap(F48)
        h.add_item(item(0x1600, 0x123456789A))
        h.add_item(item(0x3101, 3))
        h.add_item(item(0x3102, 0x100000002))
        return F48, 1472, None, [h]
    if name == "addressed":
        a = item(0x1000, (np.arange(1000) % 256 - 128).astype(np.int8), shape=(1000,), dtype=np.dtype("i1"), name="raw", desc="int8 samples")
        b = item(0x1001, (np.arange(35, dtype=np.uint32) * 3 + 1).reshape(5, 7), shape=(5, 7), dtype=np.dtype(">u4"), name="table", desc="u32 table")
        h = spead2.send.Heap(F48)
        for it in (a, b):
            h.add_descriptor(it)
            h.add_item(it)
        return F48, 1472, None, [h]
    if name == "multipacket_repeat":
        h = spead2.send.Heap(F48)
        h.repeat_pointers = True
        h.add_item(item(0x1600, 0xABCDEF))
        h.add_item(item(0x4300, (np.arange(20000) % 251).astype(np.int8), shape=(20000,), dtype=np.dtype("i1")))
        return F48, 8192 + 72, None, [h]
    if name == "descriptors":
        h = spead2.send.Heap(F48)
        h.add_descriptor(item(0x1600, 0, name="timestamp", desc="ADC sample count"))
        h.add_descriptor(spead2.Item(0x4300, "feng_raw", "channelised", (512, 256, 2, 2), dtype=np.dtype("i1")))
        h.add_descriptor(spead2.Item(0x1234, "varlen", "variable", (None, 3), format=[("i", 8), ("f", 32)]))
        return F48, 1472, None, [h]
    if name == "start":
        h = spead2.send.Heap(F48)
        h.add_start()
        return F48, 1472, None, [h]
    if name == "stop":
        h = spead2.send.Heap(F48)
        h.add_end()
        return F48, 1472, None, [h]
    if name == "empty":
        return F48, 1472, None, [spead2.send.Heap(F48)]
    if name == "cnt_sequence":
        heaps = []
        for i in range(3):
            h = spead2.send.Heap(F48)
            h.add_item(item(0x1600, 1000 + i))
            heaps.append(h)
        return F48, 1472, (10, 7), heaps
    if name == "many_pointers":
        h = spead2.send.Heap(F48)
        for i in range(200):
            h.add_item(item(0x2000 + i, i * 1001))
        h.add_item(item(0x1000, np.arange(100, dtype=np.uint8), shape=(100,), dtype=np.dtype("u1")))
        return F48, 256, None, [h]
    if name == "flavour40":
        h = spead2.send.Heap(F40)
        h.add_item(item(0x7FFF, 0xFFFFFFFF, flavour=F40))
        h.add_item(item(0x1000, np.arange(300, dtype=np.uint16), flavour=F40, shape=(300,), dtype=np.dtype(">u2")))
        return F40, 1000, None, [h]
    raise SystemExit(f"unknown case {name}")


def encode(name):
    flavour, size, seq, heaps = case(name)
    s = spead2.send.BytesStream(spead2.ThreadPool(), spead2.send.StreamConfig(max_packet_size=size))
    if seq:
        s.set_cnt_sequence(*seq)
    for h in heaps:
        s.send_heap(h)
    return split_packets(s.getvalue())


def split_packets(data):
    out = []
    pos = 0
    while pos < len(data):
        n = int.from_bytes(data[pos + 6 : pos + 8], "big")
        addr_bits = data[pos + 3] * 8
        plen = None
        for i in range(n):
            p = int.from_bytes(data[pos + 8 + 8 * i : pos + 16 + 8 * i], "big")
            if p >> 63 and (p >> addr_bits) & ((1 << (63 - addr_bits)) - 1) == 4:
                plen = p & ((1 << addr_bits) - 1)
        size = 8 + 8 * n + plen
        out.append(data[pos : pos + size])
        pos += size
    return out


def jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, bytes):
        return v.hex()
    return v


def text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def fsim_expected(payload, seed, ants, bits, feng, frequency, k, shape):
    """The fsim payload of one heap, computed from its definition (src/sim/fsim.rs module doc)
    with numpy: shape (channels, spectra, pol, re/im)."""
    cps, sph = shape[0], shape[1]
    m = 127 if bits == 8 else 7
    c = np.arange(cps)[:, None]
    s = k * sph + np.arange(sph)[None, :]
    out = np.empty((cps, sph, 2, 2), np.int64)
    for p in range(2):
        if payload == "katgpucbf":
            amp = ((s + 10 * c) % m).astype(np.float64)
            theta = 2 * np.pi * (2 * feng + p) / (2 * ants)
            for j, f in enumerate((np.cos, np.sin)):
                x = amp * f(theta)
                r = np.round(x)
                # Truncation toward zero of the exact value: snap near-integers first.
                out[:, :, p, j] = np.where(np.abs(x - r) < 1e-6, r, np.trunc(x))
        else:
            index = ((frequency + c).astype(np.uint64) << np.uint64(32)) | s.astype(np.uint64)
            with np.errstate(over="ignore"):
                z = (np.uint64(seed) + np.uint64(2 * feng + p) * np.uint64(0xD1B54A32D192ED03)
                     + index * np.uint64(0x9E3779B97F4A7C15))
                z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                z = z ^ (z >> np.uint64(31))
            span = np.uint64(2 * m + 1)
            out[:, :, p, 0] = ((z >> np.uint64(32)) % span).astype(np.int64) - m
            out[:, :, p, 1] = ((z & np.uint64(0xFFFFFFFF)) % span).astype(np.int64) - m
    return out


def recv_fsim(seconds, ants, step, bits, payload, seed, ports):
    import threading

    lock = threading.Lock()

    def serve(port, stream):
        ig = spead2.ItemGroup()
        for heap in stream:
            ig.update(heap)
            if not any(it.id == 0x4300 for it in heap.get_items()):
                continue  # a descriptor heap
            raw = np.asarray(ig["feng_raw"].value)
            ts, feng, freq = (int(ig[n].value) for n in ("timestamp", "feng_id", "frequency"))
            want = fsim_expected(payload, seed, ants, bits, feng, freq, (ts // step) % 8, raw.shape)
            out = {
                "port": port,
                "cnt": heap.cnt,
                "timestamp": ts,
                "feng_id": feng,
                "frequency": freq,
                "shape": list(raw.shape),
                "dtype": str(raw.dtype),
                "payload_ok": bool(np.array_equal(raw.astype(np.int64), want)),
            }
            with lock:
                print(json.dumps(out), flush=True)

    streams = []
    for port in ports:
        # One heap in flight per F-engine (fsim interleaves a batch's heaps), and some spare.
        stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(max_heaps=ants * 2))
        stream.add_udp_reader(port, bind_hostname="127.0.0.1", buffer_size=32 << 20)
        streams.append(stream)
    threads = [threading.Thread(target=serve, args=a) for a in zip(ports, streams)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    time.sleep(seconds)
    for stream in streams:
        stream.stop()
    for t in threads:
        t.join()


def main():
    cmd = sys.argv[1]
    if cmd == "encode":
        for p in encode(sys.argv[2]):
            print(p.hex())
    elif cmd == "send-udp":
        name, host, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
        packets = encode(name)
        if "--shuffle" in sys.argv:
            random.Random(int(sys.argv[sys.argv.index("--shuffle") + 1])).shuffle(packets)
        stop = spead2.send.Heap(F48)
        stop.add_end()
        s = spead2.send.BytesStream(spead2.ThreadPool(), spead2.send.StreamConfig())
        s.set_cnt_sequence(1 << 40, 1)
        s.send_heap(stop)
        packets += split_packets(s.getvalue())
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for p in packets:
            sock.sendto(p, (host, port))
            time.sleep(0.0005)
    elif cmd == "recv-fsim":
        seconds, ants, step, bits = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        payload, seed = sys.argv[6], int(sys.argv[7])
        recv_fsim(seconds, ants, step, bits, payload, seed, [int(p) for p in sys.argv[8:]])
    elif cmd == "recv-udp":
        port, n = int(sys.argv[2]), int(sys.argv[3])
        stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(max_heaps=8))
        stream.add_udp_reader(port, bind_hostname="127.0.0.1", buffer_size=8 << 20)
        print("ready", flush=True)
        got = 0
        for heap in stream:
            # A fresh ItemGroup per heap: the cases reuse IDs with different shapes.
            updated = spead2.ItemGroup().update(heap)
            raw = {}
            for it in heap.get_items():
                raw[str(it.id)] = int(it.immediate_value) if it.is_immediate else bytes(memoryview(it)).hex()
            out = {
                "cnt": heap.cnt,
                "raw": raw,
                "items": {str(i.id): jsonable(i.value) for i in updated.values()},
                "descriptors": [
                    {"id": d.id, "name": text(d.name), "description": text(d.description), "shape": list(d.shape)}
                    for d in heap.get_descriptors()
                ],
            }
            print(json.dumps(out), flush=True)
            got += 1
            if got == n:
                break
        stream.stop()
    elif cmd == "recv-fheaps":
        port, n = int(sys.argv[2]), int(sys.argv[3])
        stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(max_heaps=8))
        stream.add_udp_reader(port, bind_hostname="127.0.0.1", buffer_size=8 << 20)
        print("ready", flush=True)
        ig = spead2.ItemGroup()
        got = 0
        for heap in stream:
            ig.update(heap)
            if "feng_raw" not in ig or ig["feng_raw"].value is None or not heap.get_items():
                continue  # before the first descriptors, or a descriptor-only heap
            if not any(it.id == 0x4300 for it in heap.get_items()):
                continue
            raw = ig["feng_raw"].value  # (channels per substream, spectra, pol, re/im) int8
            power = (raw.astype(np.float64) ** 2).sum(axis=(1, 3))  # (channel, pol)
            out = {
                "timestamp": int(ig["timestamp"].value),
                "feng_id": int(ig["feng_id"].value),
                "frequency": int(ig["frequency"].value),
                "shape": list(raw.shape),
                "dtype": str(raw.dtype),
                "peak": [int(np.argmax(power[:, 0])), int(np.argmax(power[:, 1]))],
            }
            print(json.dumps(out), flush=True)
            got += 1
            if got == n:
                break
        stream.stop()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
