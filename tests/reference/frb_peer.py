#!/usr/bin/env python3
"""spead2 + numpy + aiokatcp as the independent peer of cbf's FRB beamformer tests.

It plays every F-engine of an array with spead2 (int8 F heaps, some withheld), sets the
`--frb-beam` outputs' dish weights with aiokatcp `?frb-weights`, receives their heaps with
spead2, and compares them with the definition of the beamformed intensity (seed 004 eq. 2, 3
with weights, both polarisations), computed here as a direct sum in complex128 over the very
data it sent -- no FFT, no resampling:

    E~[t, beam] = sum over dishes d of w[c, d, pol] E[d, t, pol] exp(2 pi i (m_d theta / M + n_d theta' / N))
    J[slow, beam] = sum over the slow time's T_ds spectra and both pols of |E~|^2

with w the weights per (channel c, dish, pol) the test set. Missing heaps contribute zero. A heap's frb_raw is float16 (channel, slow time, beam) of
scale * J; beam centres of `beams=PxQ` are theta_i = M (i - P//2) / P, theta'_j = N (j - Q//2) / Q,
beam i*Q + j (the README's definition, recomputed here).

Modes: "random" (uniform int8 voltages) and "point" (one sky direction: every dish sees a
common random signal with the phase exp(-2 pi i (m theta0 / M + n theta0' / N)), so the
intensity peaks in the beam pointing at (theta0, theta0')).

Re-pointing (tracking beams): with "split" and "requests2", the batches before "split" are sent,
then, once every output with "list2" has sent a heap (formed with the old beams), "requests2"
(`?frb-beams`), then the rest. An output with "list2" reads its `{name}.beams`
sensor at the end, "(timestamp, theta0, theta'0, ...)": the positions must be "list2" and every
heap from that timestamp on is checked against "list2", every earlier one against "list".

Usage: frb_peer.py CONFIG_JSON; prints one JSON line with the verdicts.
"""
import asyncio
import json
import os
import sys
import time

import aiokatcp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xb_peer import Collector, fengine_streams, katcp, send_batches  # noqa: E402

TIMESTAMP, FREQUENCY, BEAM_ANTS, FRB_RAW = 0x1600, 0x4103, 0x5004, 0x5100


def beam_positions(out, rows, cols):
    if "grid" in out:
        p, q = out["grid"]
        th = [rows * (i - p // 2) / p for i in range(p)]
        th2 = [cols * (j - q // 2) / q for j in range(q)]
        return [(a, b) for a in th for b in th2]
    return [tuple(b) for b in out["list"]]


def make_input(cfg, rng):
    """(batches, ants, chans, spectra, pol) complex int values and their int8 wire form."""
    shape = (cfg["batches"] + cfg["extra"], cfg["ants"], cfg["cps"], cfg["sph"], 2)
    if cfg["mode"] == "random":
        lim = cfg["lim"]
        x = rng.integers(-lim, lim + 1, size=shape) + 1j * rng.integers(-lim, lim + 1, size=shape)
    else:
        rows, cols = cfg["grid"]
        th0, th1 = cfg["source"]
        m = np.array([d[0] for d in cfg["dishes"]])
        n = np.array([d[1] for d in cfg["dishes"]])
        phase = np.exp(-2j * np.pi * (m * th0 / rows + n * th1 / cols))  # per dish
        s = rng.normal(size=shape[:1] + shape[2:]) + 1j * rng.normal(size=shape[:1] + shape[2:])
        x = cfg["amplitude"] * s[:, None] * phase[None, :, None, None, None]
        x = np.rint(x.real) + 1j * np.rint(x.imag)
        x = np.clip(x.real, -127, 127) + 1j * np.clip(x.imag, -127, 127)
    wire = np.stack([x.real, x.imag], axis=-1).astype(np.int8)
    return x, wire


def direct(cfg, e, weights, beams, t_ds):
    """J (chan, slow, beam) of the chunk e (batches, ants, chans, spectra, pol), eq. 2-3, with
    weights (chan, ant, pol)."""
    rows, cols = cfg["grid"]
    m = np.array([d[0] for d in cfg["dishes"]], dtype=float)
    n = np.array([d[1] for d in cfg["dishes"]], dtype=float)
    th = np.array([b[0] for b in beams])
    th2 = np.array([b[1] for b in beams])
    phase = np.exp(2j * np.pi * (np.outer(m, th) / rows + np.outer(n, th2) / cols))  # (ant, beam)
    steer = weights[:, :, :, None] * phase[None, :, None, :]  # (chan, ant, pol, beam)
    et = np.einsum("bdcsp,cdpk->cbspk", e, steer)  # (chan, batch, spectrum, pol, beam)
    power = (np.abs(et) ** 2).sum(axis=3).reshape(e.shape[2], -1, len(beams))  # (chan, time, beam)
    return power.reshape(e.shape[2], -1, t_ds, len(beams)).sum(axis=2)


async def sensor_values(port, names):
    """The values of sensors `names`, as strings."""
    client = await asyncio.wait_for(aiokatcp.Client.connect("127.0.0.1", port), 10)
    try:
        out = {}
        for name in names:
            _, informs = await client.request("sensor-value", name)
            out[name] = informs[0].arguments[4].decode()
        return out
    finally:
        client.close()
        await client.wait_closed()


async def wait_for_heaps(port, names, timeout=20.0):
    """Until every output of `names` has sent a heap (its `tx.next-timestamp` leaves 0): the
    engine has then formed its first chunk through, re-point check included."""
    client = await asyncio.wait_for(aiokatcp.Client.connect("127.0.0.1", port), 10)
    try:
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                _, informs = await client.request("sensor-value", f"{name}.tx.next-timestamp")
                if int(informs[0].arguments[4]) > 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} sent no heap in {timeout} s")
                await asyncio.sleep(0.02)
    finally:
        client.close()
        await client.wait_closed()


def parse_beams_sensor(text):
    """(timestamp, [(theta, theta'), ...]) from "(T, a0, b0, a1, b1, ...)"."""
    parts = [p.strip() for p in text.strip("()").split(",")]
    values = [float(p) for p in parts[1:]]
    return int(parts[0]), list(zip(values[0::2], values[1::2]))


def run(cfg):
    rng = np.random.default_rng(cfg["seed"])
    x, wire = make_input(cfg, rng)
    missing = cfg["missing"]
    cols = [Collector(o["port"]) for o in cfg["outputs"]]
    replies, _ = asyncio.run(katcp(cfg["katcp_port"], cfg["requests"]))
    streams = fengine_streams(cfg)
    split = cfg.get("split", cfg["batches"])
    send_batches(cfg, streams, wire, range(split), missing)
    steady = None
    if "requests2" in cfg:
        # Re-point once the engine has formed a chunk with the old beams (after 100 ms without
        # input it sends what it holds).
        tracked = [o["name"] for o in cfg["outputs"] if "list2" in o]
        asyncio.run(wait_for_heaps(cfg["katcp_port"], tracked))
        replies2, steady = asyncio.run(katcp(cfg["katcp_port"], cfg["requests2"]))
        replies += replies2
    send_batches(cfg, streams, wire, range(split, cfg["batches"]), missing)
    send_batches(cfg, streams, wire, range(cfg["batches"], cfg["batches"] + cfg["extra"]), [])
    heap_step = cfg["sph"] * cfg["sbs"]
    bpc = cfg["batches_per_chunk"]
    first = cfg["first_batch"]
    xm = x.copy()
    for b, a in missing:
        xm[b, a] = 0
    rows, ncols = cfg["grid"]
    result = {"katcp": replies, "outputs": [], "steady": steady}
    for out, col in zip(cfg["outputs"], cols):
        heaps = col.wait(cfg["expect_heaps"], 20, "frb_raw" if cfg["descriptor"] else None)
        beams = beam_positions(out, rows, ncols)
        effective = None
        if "list2" in out:
            sensor = f"{out['name']}.beams"
            effective, shown = parse_beams_sensor(
                asyncio.run(sensor_values(cfg["katcp_port"], [sensor]))[sensor])
        weights = np.array([[[complex(w) for w in pols] for pols in chan] for chan in out["weights"]])
        t_ds = out["t_ds"]
        scale = out.get("scale", 1.0 / (2 * t_ds * cfg["ants"]))
        v = {"heaps": 0, "checked": 0, "max_err": 0.0, "bad_ants": 0, "frequency_ok": True,
             "wrong_peak": 0, "peaks": 0, "before": 0, "after": 0}
        if effective is not None:
            v["effective"] = effective
            v["sensor_positions_ok"] = shown == [tuple(b) for b in out["list2"]]
        desc = col.ig["frb_raw"] if "frb_raw" in col.ig else None
        if desc is not None:
            v["descriptor"] = [list(desc.shape), str(desc.dtype)]
        for h in heaps:
            if FRB_RAW not in h:
                continue
            v["heaps"] += 1
            b0 = h[TIMESTAMP] // heap_step - first
            if b0 < 0 or b0 + bpc > cfg["batches"]:
                continue
            v["checked"] += 1
            v["frequency_ok"] &= h[FREQUENCY] == cfg["c0"]
            ants = sum(all([b, a] not in missing for b in range(b0, b0 + bpc)) for a in range(cfg["ants"]))
            v["bad_ants"] += int(h[BEAM_ANTS] != ants)
            pointed = beams
            if effective is not None:
                # Chunks from the sensor's timestamp on were formed with the new positions.
                after = h[TIMESTAMP] >= effective
                v["after" if after else "before"] += 1
                pointed = [tuple(b) for b in out["list2"]] if after else beams
            want = scale * direct(cfg, xm[b0:b0 + bpc], weights, pointed, t_ds)
            dtype = desc.dtype if desc is not None else np.dtype("<f2")
            got = np.frombuffer(h[FRB_RAW], dtype=dtype).reshape(want.shape).astype(float)
            # float16 keeps 11 bits: relative error, floored at a small part of the heap's peak
            floor = 1e-3 * np.max(np.abs(want))
            v["max_err"] = max(v["max_err"], float(np.max(np.abs(got - want) / np.maximum(np.abs(want), floor))))
            if cfg["mode"] == "point":
                peak = np.argmax(got, axis=-1)
                v["peaks"] += int(peak.size)
                v["wrong_peak"] += int(np.count_nonzero(peak != cfg["source_beam"]))
        result["outputs"].append(v)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
