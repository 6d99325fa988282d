#!/usr/bin/env python3
"""spead2 + numpy + aiokatcp as the independent peer of cbf's XB-engine tests.

It plays every F-engine of an array with spead2 (random int8 or packed 4-bit F heaps, some
heaps withheld), steers the beams over katcp with aiokatcp, receives the X and beam heaps with
spead2, and compares them with numpy references computed here from the very data it sent:

- X heaps: V[c, bl, p1 + 2 p2] = sum over the dump's batches and spectra of
  x[a1, c, t, p1] * conj(x[a2, c, t, p2]) (bl = a2 (a2 + 1) / 2 + a1), saturated to
  +-(2**31 - 1); baselines touching an antenna missing from any batch of the dump are
  (-2**31, 1). Must match exactly.
- Beam heaps (dither off): y = sum over present antennas of
  w g exp(j (phi - 2 pi df (c0 + c - N/2) tau)) x[a, c, t, pol], rounded half-even and
  clipped to +-127: each part within 1 LSB; beam_ants exact.

Usage: xb_peer.py CONFIG_JSON   (keys below, in `run`); prints one JSON line with the verdicts.
"""
import asyncio
import json
import sys
import threading
import time

import aiokatcp
import numpy as np
import spead2
import spead2.recv
import spead2.send

F48 = spead2.Flavour(4, 64, 48, 0)
TIMESTAMP, FENG_ID, FREQUENCY, FENG_RAW = 0x1600, 0x4101, 0x4103, 0x4300
XENG_RAW, BF_RAW, BEAM_ANTS = 0x1800, 0x5000, 0x5004
MISSING = (-(2**31), 1)


class Collector:
    """Receive heaps on a port in a thread; keep (items by id, is-descriptor-only) per heap."""

    def __init__(self, port):
        self.stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(max_heaps=16))
        self.stream.add_udp_reader(port, bind_hostname="127.0.0.1", buffer_size=32 << 20)
        self.heaps = []
        self.error = None
        self.ig = spead2.ItemGroup()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for heap in self.stream:
                items = {it.id: (it.immediate_value if it.is_immediate else bytes(memoryview(it))) for it in heap.get_items()}
                if heap.get_descriptors():
                    self.ig.update(heap)
                if items:
                    self.heaps.append(items)
        except Exception as e:  # reported, never swallowed: the test then fails on it
            self.error = repr(e)

    def wait(self, n, timeout, descriptor=None):
        """Until `n` data heaps (and the descriptor of item `descriptor`, sent every 5 s) came."""
        deadline = time.time() + timeout
        while (len(self.heaps) < n or (descriptor and descriptor not in self.ig)) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        self.stream.stop()
        self.thread.join(5)
        if self.error:
            raise RuntimeError(f"receiver failed: {self.error}")
        return self.heaps


def make_input(cfg, rng):
    """(batches, ants, chans, spectra, pol) complex int values and the wire bytes per heap."""
    shape = (cfg["batches"] + cfg["extra"], cfg["ants"], cfg["cps"], cfg["sph"], 2)
    lim = 7 if cfg["bits"] == 4 else 127
    re = rng.integers(-lim, lim + 1, size=shape)
    im = rng.integers(-lim, lim + 1, size=shape)
    # Full scale on purpose in one antenna's first batch (+-127 is legal input; -128 is not).
    re[0, 0, :, : cfg["sph"] // 2, 0] = lim
    im[0, 0, :, : cfg["sph"] // 2, 1] = -lim
    if cfg["bits"] == 4:
        wire = ((re & 0xF) << 4 | (im & 0xF)).astype(np.uint8)  # (..., pol) one byte per value
    else:
        wire = np.stack([re, im], axis=-1).astype(np.int8)  # (..., pol, re/im)
    return re + 1j * im, wire


async def katcp(port, requests):
    client = await asyncio.wait_for(aiokatcp.Client.connect("127.0.0.1", port), 10)
    out = []
    try:
        for name, *args in requests:
            try:
                reply, _ = await client.request(name, *args)
                out.append(["ok"] + [a.decode() for a in reply])
            except aiokatcp.FailReply as e:
                out.append(["fail", str(e)])
        sensor = await client.request("sensor-value", "steady-state-timestamp")
        steady = int(sensor[1][0].arguments[4])
    finally:
        client.close()
        await client.wait_closed()
    return out, steady


def send_batches(cfg, wire, batches, missing):
    pool = spead2.ThreadPool()
    streams = []
    for a in range(cfg["ants"]):
        s = spead2.send.UdpStream(
            pool, [("127.0.0.1", cfg["in_port"])],
            spead2.send.StreamConfig(max_packet_size=cfg["packet"] + 72, rate=cfg["rate"]),
        )
        s.set_cnt_sequence(a, cfg["ants"])
        streams.append(s)
    heap_step = cfg["sph"] * cfg["sbs"]
    for b in batches:
        for a in range(cfg["ants"]):
            if [b, a] in missing:
                continue
            h = spead2.send.Heap(F48)
            h.repeat_pointers = True
            for id_, v in ((TIMESTAMP, (cfg["first_batch"] + b) * heap_step), (FENG_ID, a), (FREQUENCY, cfg["c0"])):
                it = spead2.Item(id_, f"i{id_:x}", "", (), format=[("u", 48)])
                it.value = v
                h.add_item(it)
            raw = np.ascontiguousarray(wire[b, a])
            it = spead2.Item(FENG_RAW, "feng_raw", "", raw.shape, dtype=raw.dtype)
            it.value = raw
            h.add_item(it)
            streams[a].send_heap(h)


def x_reference(cfg, x, missing, dump_batches):
    ants, cps = cfg["ants"], cfg["cps"]
    n_bl = ants * (ants + 1) // 2
    acc = np.zeros((cps, n_bl, 4, 2), dtype=np.int64)
    present = np.ones(ants, dtype=bool)
    for b in dump_batches:
        for a in range(ants):
            if [b, a] in missing:
                present[a] = False
        xb = x[b]  # (ant, chan, t, pol)
        for a2 in range(ants):
            for a1 in range(a2 + 1):
                bl = a2 * (a2 + 1) // 2 + a1
                v = np.einsum("ctp,ctq->cpq", xb[a1], np.conj(xb[a2]))
                for p1 in range(2):
                    for p2 in range(2):
                        acc[:, bl, p1 + 2 * p2, 0] += np.rint(v[:, p1, p2].real).astype(np.int64)
                        acc[:, bl, p1 + 2 * p2, 1] += np.rint(v[:, p1, p2].imag).astype(np.int64)
    lim = 2**31 - 1
    out = np.clip(acc, -lim, lim)
    for a2 in range(ants):
        for a1 in range(a2 + 1):
            if not (present[a1] and present[a2]):
                bl = a2 * (a2 + 1) // 2 + a1
                out[:, bl, :, 0], out[:, bl, :, 1] = MISSING
    return out, present


def beam_reference(cfg, x, b, beam, steering, missing):
    """Pre-quantisation complex beam (chan, t) of batch b, and beam_ants."""
    ants = cfg["ants"]
    df = cfg["bandwidth"] / cfg["channels"]
    c = cfg["c0"] + np.arange(cfg["cps"])
    y = np.zeros((cfg["cps"], cfg["sph"]), dtype=complex)
    n = 0
    for a in range(ants):
        if [b, a] in missing:
            continue
        n += 1
        w = steering["weights"][a] * steering["gain"]
        tau, phi = steering["delays"][a]
        coeff = w * np.exp(1j * (phi - 2 * np.pi * df * (c - cfg["channels"] / 2) * tau))
        y += coeff[:, None] * x[b, a, :, :, beam["pol"]]
    return y, n


def run(cfg):
    rng = np.random.default_rng(cfg["seed"])
    x, wire = make_input(cfg, rng)
    missing = cfg["missing"]
    xs = Collector(cfg["x_port"]) if cfg.get("x_port") else None
    bs = [Collector(beam["port"]) for beam in cfg["beams"]]
    heap_step = cfg["sph"] * cfg["sbs"]
    # Phase 1: the first half of the batches with the first steering; then a katcp change;
    # phase 2: the rest.
    replies, steady1 = asyncio.run(katcp(cfg["katcp_port"], cfg["requests1"]))
    half = cfg["split"]
    send_batches(cfg, wire, range(half), missing)
    time.sleep(0.5)
    replies2, steady2 = asyncio.run(katcp(cfg["katcp_port"], cfg["requests2"]))
    send_batches(cfg, wire, range(half, cfg["batches"]), missing)
    # Batches beyond the checked ones push the engine's receive window past them (it emits a
    # chunk once later chunks arrive); their outputs are not checked.
    send_batches(cfg, wire, range(cfg["batches"], cfg["batches"] + cfg["extra"]), [])
    result = {"katcp": replies + replies2, "steady": [steady1, steady2]}
    T = cfg["threshold"]
    first = cfg["first_batch"]
    if xs:
        heaps = xs.wait(cfg["expect_dumps"], 20, "xeng_raw")
        got = {}
        for h in heaps:
            if XENG_RAW in h:
                got[h[TIMESTAMP]] = (h[FREQUENCY], np.frombuffer(h[XENG_RAW], dtype="<i4"))
        dumps = []
        # Dumps of the absolute batch grid, over the batches sent.
        for d in range(first // T, (first + cfg["batches"] + T - 1) // T):
            rel = [b for b in range(d * T - first, (d + 1) * T - first) if 0 <= b < cfg["batches"]]
            ts = d * T * heap_step
            want, present = x_reference(cfg, x, missing, rel)
            if len(rel) != T:
                present[:] = False
            entry = {"timestamp": ts, "batches": len(rel), "present": present.tolist()}
            if ts not in got:
                entry["received"] = False
            else:
                freq, v = got[ts]
                if len(rel) != T:
                    want[..., 0], want[..., 1] = MISSING
                v = v.reshape(want.shape)
                entry.update(received=True, frequency=int(freq), mismatches=int(np.count_nonzero(v != want)),
                             flagged_baselines=int(np.count_nonzero(np.all(v[0, :, :, 0] == MISSING[0], axis=1))))
            dumps.append(entry)
        desc = xs.ig["xeng_raw"] if "xeng_raw" in xs.ig else None
        result["x"] = {"dumps": dumps, "received": len(got),
                       "descriptor": None if desc is None else [list(desc.shape), str(desc.dtype)]}
    per_beam = []
    for beam, col in zip(cfg["beams"], bs):
        heaps = col.wait(cfg["expect_beam_heaps"], 20)
        pb = {"heaps": 0, "max_err": 0.0, "bad_ants": 0, "after_steady": 0, "bad_after_steady": 0,
              "neither": 0, "frequency_ok": True}
        for h in heaps:
            if BF_RAW not in h:
                continue
            ts = h[TIMESTAMP]
            raw = np.frombuffer(h[BF_RAW], dtype=np.int8).reshape(cfg["cps"], cfg["sph"], 2)
            b = ts // heap_step - first
            if b >= cfg["batches"]:
                continue
            errs = {}
            for which in ("steering1", "steering2"):
                y, n = beam_reference(cfg, x, b, beam, beam[which], missing)
                q = np.clip(np.rint(np.stack([y.real, y.imag], axis=-1)), -127, 127)
                errs[which] = float(np.max(np.abs(q - raw)))
            pb["heaps"] += 1
            pb["frequency_ok"] &= h[FREQUENCY] == cfg["c0"]
            pb["bad_ants"] += int(h[BEAM_ANTS] != n)
            if ts >= steady2:
                # From the steady-state timestamp on, only the new steering may show.
                pb["after_steady"] += 1
                pb["bad_after_steady"] += int(errs["steering2"] > 1)
                pb["max_err"] = max(pb["max_err"], errs["steering2"])
            else:
                e = min(errs.values())
                pb["neither"] += int(e > 1)
                pb["max_err"] = max(pb["max_err"], e)
        per_beam.append(pb)
    result["beams"] = per_beam
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
