#!/usr/bin/env python3
"""Time katgpucbf's XB-engine beamformer kernel on one NVIDIA GPU, beside a device copy ceiling.

Runs from the folder that ``render.py`` filled (``manifest.json`` and the rendered ``*.cu`` files
next to this script). Needs python3 with numpy and cupy, and nvcc; no network, Mako or
katsdpsigproc. ``--dry-run`` needs numpy only (no cupy import).

Steps (README.md says more):

1. build: ``nvcc --cubin -arch=sm_XX -std=c++17 -lineinfo -Xptxas -v`` for every rendered file
   (katsdpsigproc compiles through PyCUDA with ``-lineinfo``); registers and spills printed;
2. copy ceiling: device-to-device ``cudaMemcpyAsync`` of 1 GiB, median of 20, counting bytes
   read + written; measured at the start and at the end, the larger is used;
3. correctness on small fresh random inputs (numpy reference, float64) for every kernel used;
4. for each case: fresh random buffers; the whole output of one launch checked against a float64
   reference computed on the device with CuPy (matmul), a numpy spot check of 256 points, the
   saturation counts and (with dither) the saved random states; then timing with CUDA events:
   5 warm-ups, 30 launches each with its own event pair (median, min-max), rotating 3 input
   buffers; and one event pair around 30 back-to-back launches ("batch mean");
5. a table, printed last. Exit status 1 if any check failed.

Bytes "moved" are counted as cbf counts them: input bytes read + output bytes written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

DITHER_SCALE = np.float32(2.3282709e-10)  # katgpucbf kernels/dither.mako (== 0xffff7f00p-64)
XORWOW_D_STEP = 362437  # curand's XORWOW Weyl increment
RAND_STATE_SIZE = 24  # sizeof(randState_t): uint2 raw[3] = {d, v0}, {v1, v2}, {v3, v4}
RAND_WGS = 256
U32 = 2.0**-24  # float32 unit roundoff
QMAX = 127
QUICK_CASES = ["a80_s256x4_b8_nodither", "a80_s256x4_b8_dither", "a80_s32x32_b8_dither", "a80_s256x4_b256_dither",
               "a256_s256x2_b8_dither"]


def divup(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------
# Manifest, geometry, bytes
# --------------------------------------------------------------------------------------------
def load_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def geometry(n_ants: int, channels: int, spectra: int, batches: int, n_beams: int) -> dict:
    """Launch geometry, written from beamform.py's _run (checked against the manifest)."""
    block = min(128, spectra)  # BeamformTemplate.block_spectra
    grid = (divup(spectra, block), channels, batches)  # global (roundup(S, block), C, B) / local
    scal = [
        spectra,  # out_stride: out.padded_shape[3]
        channels * spectra,  # out_beam_stride
        n_beams * channels * spectra,  # out_batch_stride
        spectra,  # in_stride: in.padded_shape[3]
        channels * spectra,  # in_antenna_stride
        n_ants * channels * spectra,  # in_batch_stride
        n_ants,
        spectra,
    ]
    return dict(block=(block, 1, 1), grid=grid, scalars=scal, n_states=batches * channels * spectra)


SCALAR_NAMES = ["out_stride", "out_beam_stride", "out_batch_stride", "in_stride", "in_antenna_stride",
                "in_batch_stride", "n_ants", "n_spectra"]


def case_bytes(c: dict) -> dict:
    A, C, S, B, K = c["n_ants"], c["channels"], c["spectra_per_batch"], c["batches"], c["n_beams"]
    inp = B * A * C * S * 2 * 2  # int8, 2 pols, re/im
    out = B * K * C * S * 2  # int8 re/im per single-pol beam
    params = A * K * (8 + 4) + K * 4  # weights complex64, delays float32, saturation counters
    states = 2 * RAND_STATE_SIZE * B * C * S if c["dither"] else 0  # read + written
    return dict(input=inp, output=out, moved=inp + out, params=params, states=states,
                all=inp + out + params + states)


def verify_files(folder: Path, man: dict) -> list[str]:
    problems = []
    for fname, ent in man["files"].items():
        p = folder / fname
        if not p.exists():
            problems.append(f"{fname} missing")
            continue
        if hashlib.sha256(p.read_bytes()).hexdigest() != ent["sha256_file"]:
            problems.append(f"{fname} sha256 differs from manifest")
    for name, c in man["cases"].items():
        g = geometry(c["n_ants"], c["channels"], c["spectra_per_batch"], c["batches"], c["n_beams"])
        if list(g["grid"]) != c["grid"] or list(g["block"]) != c["block"]:
            problems.append(f"{name}: grid/block {g['grid']}/{g['block']} != manifest {c['grid']}/{c['block']}")
        if g["scalars"] != [c["scalars"][k] for k in SCALAR_NAMES]:
            problems.append(f"{name}: scalars differ from manifest")
        if max(g["scalars"]) >= 2**31 or g["grid"][1] > 65535 or g["grid"][2] > 65535:
            problems.append(f"{name}: int32/grid limits exceeded")
        f = man["files"].get(c["file"], {})
        if f.get("n_beams") != c["n_beams"] or f.get("dither") != c["dither"] or \
                f.get("block_spectra") != g["block"][0]:
            problems.append(f"{name}: kernel file {c['file']} does not match the case")
        if f.get("beam_pols") != [b % 2 for b in range(c["n_beams"])]:
            problems.append(f"{name}: beam pols are not b % 2")
    return problems


# --------------------------------------------------------------------------------------------
# Reference (written from the kernel's documented semantics, not from its code)
#   out[b, k, c, s] = Q( sum_a w[a, k] * exp(j*pi*c*d[a, k]) * x[b, a, c, s, pol(k)]  (+ dither) )
#   Q: round to nearest (ties to even), clamp to [-127, 127]; a complex value counts as saturated
#   (per beam) when |re| or |im| exceeds 127 before clamping. Dither: uniform in (-0.5, 0.5),
#   one curand XORWOW draw per component (re then im, beams in order) from the state of
#   thread (b, c, s), which is saved back.
# --------------------------------------------------------------------------------------------
def quant(xp, u):
    return xp.clip(xp.rint(u), -QMAX, QMAX)


def xorwow_dither(xp, states_u32, n_draws: int, with_int_float: bool = False):
    """Emulate n_draws curand() calls per state and katgpucbf's dither mapping.

    states_u32: (N, 6) uint32 as stored by randState_t: d, v0, v1, v2, v3, v4.
    Returns (dither (N, n_draws) float32, final states (N, 6) uint32) and, with with_int_float,
    the float32 values of the integers before scaling (for the fused multiply-add candidate).
    """
    st = xp.asarray(states_u32, dtype=xp.uint32)
    d = st[:, 0].copy()
    v = [st[:, 1 + i].copy() for i in range(5)]
    out = xp.empty((st.shape[0], n_draws), dtype=xp.float32)
    fx = xp.empty((st.shape[0], n_draws), dtype=xp.float32) if with_int_float else None
    two, four, one, step = xp.uint32(2), xp.uint32(4), xp.uint32(1), xp.uint32(XORWOW_D_STEP)
    for k in range(n_draws):
        t = v[0] ^ (v[0] >> two)
        new = (v[4] ^ (v[4] << four)) ^ (t ^ (t << one))
        v = v[1:] + [new]
        d = d + step
        r = (new + d).view(xp.int32)
        r = r - (r >> 31)  # add 1 to negative values (zero-mean)
        rf = r.astype(xp.float32)
        out[:, k] = rf * DITHER_SCALE
        if with_int_float:
            fx[:, k] = rf
    final = xp.stack([d] + v, axis=1)
    return (out, final, fx) if with_int_float else (out, final)


def xorwow_scalar(state):
    """Marsaglia's xorwow with curand's Weyl counter, one draw in plain Python (self-test only)."""
    d, x, y, z, w, v = state
    t = (x ^ (x >> 2)) & 0xFFFFFFFF
    x, y, z, w = y, z, w, v
    v = ((v ^ ((v << 4) & 0xFFFFFFFF)) ^ (t ^ ((t << 1) & 0xFFFFFFFF))) & 0xFFFFFFFF
    d = (d + XORWOW_D_STEP) & 0xFFFFFFFF
    return (v + d) & 0xFFFFFFFF, (d, x, y, z, w, v)


def dither_layout(D, B, C, S, K):
    """(N = B*C*S threads, 2K draws) -> (B, K, C, S, 2): draw 2k is beam k's re, 2k+1 its im."""
    return D.reshape(B, C, S, K, 2).transpose(0, 3, 1, 2, 4)


def sincospi(x):
    """(sin(pi x), cos(pi x)) in float64, exact at multiples of 1/2 (reduction by quarter turns)."""
    x = np.asarray(x, np.float64)
    n = np.rint(2 * x)
    r = x - 0.5 * n  # exact
    s, c = np.sin(np.pi * r), np.cos(np.pi * r)
    k = np.mod(n, 4).astype(np.int64)
    sin = np.choose(k, [s, c, -s, -c])
    cos = np.choose(k, [c, -s, -c, s])
    return sin, cos


def beam_weights(w: np.ndarray, d: np.ndarray, channels: int) -> np.ndarray:
    """W[c, a, k] = w[a, k] exp(j pi c d[a, k]) in float64 (complex128)."""
    c = np.arange(channels, dtype=np.float64)[:, None, None]
    sin, cos = sincospi(c * d.astype(np.float64)[None])  # c*d is exact (the harness picks such d)
    return w.astype(np.complex128)[None] * (cos + 1j * sin)


def reference_np(x: np.ndarray, w: np.ndarray, d: np.ndarray, pols: np.ndarray):
    """float64 beam sums and per-output error scale. x: int8 (B, A, C, S, 2, 2).

    Returns v (B, K, C, S, 2) float64 (re, im) and M (B, K, C, S): sum_a |w|(|x_re| + |x_im|).
    """
    B, A, C, S = x.shape[:4]
    K = w.shape[1]
    W = beam_weights(w, d, C)  # (C, A, K)
    xf = x.astype(np.float64)
    v = np.zeros((B, K, C, S), np.complex128)
    M = np.zeros((B, K, C, S))
    for p in (0, 1):
        ks = np.nonzero(pols == p)[0]
        if ks.size == 0:
            continue
        xc = xf[..., p, 0] + 1j * xf[..., p, 1]  # (B, A, C, S)
        v[:, ks] = np.einsum("cak,bacs->bkcs", W[:, :, ks], xc, optimize=True)
        mag = np.abs(xf[..., p, 0]) + np.abs(xf[..., p, 1])
        M[:, ks] = np.einsum("ak,bacs->bkcs", np.abs(w[:, ks]).astype(np.float64), mag, optimize=True)
    return np.stack([v.real, v.imag], axis=-1), M


def sum_tolerance(n_ants: int, M):
    """Bound on |float32 kernel sum - float64 reference| (sincospif, cmul, n_ants cmads, dither add)."""
    return U32 * ((2 * n_ants + 16) * M + 2 * 128)


def check_interval(xp, dev, u_lo, u_hi, beam_axis: int = 1) -> dict:
    """dev must lie in [Q(u_lo), Q(u_hi)]; saturation-count bounds per beam.

    dev: int8 (..., 2); u_lo/u_hi: float64 (..., 2) bounds of the value the kernel quantises.
    """
    devf = dev.astype(xp.float64)
    q_lo, q_hi = quant(xp, u_lo), quant(xp, u_hi)
    bad = (devf < q_lo) | (devf > q_hi)
    nominal = quant(xp, 0.5 * (u_lo + u_hi))
    ambiguous = q_lo != q_hi
    minabs = xp.where((u_lo <= 0) & (u_hi >= 0), 0.0, xp.minimum(xp.abs(u_lo), xp.abs(u_hi)))
    maxabs = xp.maximum(xp.abs(u_lo), xp.abs(u_hi))
    sat_lo = ((minabs[..., 0] > QMAX) | (minabs[..., 1] > QMAX)).astype(xp.int64)
    sat_hi = ((maxabs[..., 0] > QMAX) | (maxabs[..., 1] > QMAX)).astype(xp.int64)
    axes = tuple(i for i in range(sat_lo.ndim) if i != beam_axis)
    return dict(
        n_values=int(dev.size),
        n_bad=int(bad.sum()),
        n_unwritten=int((dev == -128).sum()),
        n_ambiguous=int(ambiguous.sum()),
        n_diff_nominal=int((devf != nominal).sum()),
        max_abs_diff_nominal=float(xp.abs(devf - nominal).max()) if dev.size else 0.0,
        sat_lo=np.asarray(_host(xp, sat_lo.sum(axis=axes))),
        sat_hi=np.asarray(_host(xp, sat_hi.sum(axis=axes))),
        n_sat_values_nominal=int((xp.abs(nominal) == QMAX).sum()),
        n_exact_ties=int(((u_lo == u_hi) & (xp.abs(u_lo) < QMAX) & (u_lo - xp.floor(u_lo) == 0.5)).sum()),
    )


def dither_stats(xp, dev, v) -> dict:
    """Dither-agnostic statistics on unsaturated values (|v| < 126): the rounding error of uniform
    dither has mean 0; it moves a value off round(v) with probability 1/4 on average."""
    devf = dev.astype(xp.float64)
    m = xp.abs(v) < QMAX - 1
    n = int(m.sum())
    err = (devf - v)[m]
    off = (devf != xp.rint(v))[m]
    return dict(n_unsat=n, mean_err=float(err.mean()) if n else 0.0,
                frac_off_round=float(off.mean()) if n else 0.0)


def _host(xp, a):
    return a.get() if hasattr(a, "get") and xp is not np else a


def merge(acc: dict | None, r: dict) -> dict:
    if acc is None:
        return dict(r)
    out = {}
    for k, v in r.items():
        if k.startswith("max_"):
            out[k] = max(acc[k], v)
        else:
            out[k] = acc[k] + v
    return out


def judge(r: dict, dev_sat: np.ndarray, dither: bool, exact: bool) -> tuple[bool, list[str]]:
    why = []
    if r["n_unwritten"]:
        why.append(f"{r['n_unwritten']} outputs left at -128")
    if r["n_bad"]:
        why.append(f"{r['n_bad']} outputs outside the reference interval")
    if not ((r["sat_lo"] <= dev_sat).all() and (dev_sat <= r["sat_hi"]).all()):
        bad = np.nonzero((dev_sat < r["sat_lo"]) | (dev_sat > r["sat_hi"]))[0]
        why.append(f"saturation counts out of bounds at beams {bad[:8].tolist()}: dev "
                   f"{dev_sat[bad[:4]].tolist()} vs [{r['sat_lo'][bad[:4]].tolist()}, {r['sat_hi'][bad[:4]].tolist()}]")
    if "agnostic_bad" in r and r["agnostic_bad"]:
        why.append(f"{r['agnostic_bad']} outputs outside [Q(v-0.5), Q(v+0.5)]")
    if dither and "n_unsat" in r and r["n_unsat"] > 20000:
        n = r["n_unsat"]
        if abs(r["mean_err"]) > 6 * 0.29 / np.sqrt(n) + 1e-3:
            why.append(f"dither mean error {r['mean_err']:.2e} not ~0")
        if abs(r["frac_off_round"] - 0.25) > 0.02:
            why.append(f"fraction off round(v) {r['frac_off_round']:.4f} not ~0.25")
    if r.get("states_bad"):
        why.append(f"{r['states_bad']} saved random states differ from the emulation")
    return not why, why


def evaluate(xp, dev, v, M, n_ants, D=None, exact=False, dev_states=None, final_states=None, c1_c2=None,
             beam_axis: int = 1):
    """Run all value checks for one block of outputs. v, M, D already in (..., K, C, S[, 2]) layout."""
    if exact:
        # The sums are exact in float32; the kernel adds the float32 dither either as mul+add
        # (c1) or fused (c2). Both candidates are allowed; no other tolerance.
        if D is None:
            u_lo = u_hi = v
        else:
            u_lo, u_hi = c1_c2
    else:
        tol = sum_tolerance(n_ants, M)[..., None]
        u = v if D is None else v + D.astype(xp.float64)
        u_lo, u_hi = u - tol, u + tol
    r = check_interval(xp, dev, u_lo, u_hi, beam_axis=beam_axis)
    if D is not None:
        tol_a = 0.0 if exact else sum_tolerance(n_ants, M)[..., None]
        qa_lo, qa_hi = quant(xp, v - tol_a - 0.5), quant(xp, v + tol_a + 0.5)
        devf = dev.astype(xp.float64)
        r["agnostic_bad"] = int(((devf < qa_lo) | (devf > qa_hi)).sum())
        r.update(dither_stats(xp, dev, v))
    if dev_states is not None:
        r["states_bad"] = int((dev_states != final_states).any(axis=1).sum())
    return r


def exact_candidates(xp, v, D, FX):
    """Bounds of what the kernel can quantise when v (an exact float32 sum) gets dither added.

    c1 = fl32(v + fl32(fx * scale)) (multiply, then add); fused: fl32(v + fx * scale) with one
    rounding. The fused sum s = v + fx*scale is formed in float64 (fx*scale is exact there, the
    sum may round), so both float32 roundings of s -/+ 2^-50|s| are taken. Returns (lo, hi).
    """
    c1 = (v.astype(xp.float32) + D).astype(xp.float64)
    s = v + FX.astype(xp.float64) * float(DITHER_SCALE)
    eps = xp.abs(s) * 2.0**-50
    c2a = (s - eps).astype(xp.float32).astype(xp.float64)
    c2b = (s + eps).astype(xp.float32).astype(xp.float64)
    return xp.minimum(xp.minimum(c1, c2a), c2b), xp.maximum(xp.maximum(c1, c2a), c2b)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
def make_small_inputs(rng, B, A, C, S, K, kind: str):
    """kind 'exact': dyadic weights and quarter-turn phases (float32 sums exact; ties exercised);
    kind 'random': float weights, delays k*2^-16 (c*d exact in float32)."""
    x = rng.integers(-128, 128, size=(B, A, C, S, 2, 2), dtype=np.int8)
    if kind == "exact":
        lim = int(0.2 * 2**7 * np.sqrt(21 / A)) + 1
        w = (rng.integers(-lim, lim + 1, (A, K)) + 1j * rng.integers(-lim, lim + 1, (A, K))) / 2**7
        d = rng.integers(-3, 4, (A, K)) * 0.5
    else:
        s = 0.95 / np.sqrt(A)
        w = rng.uniform(-s, s, (A, K)) + 1j * rng.uniform(-s, s, (A, K))
        d = rng.integers(-(2**13), 2**13, (A, K)) * 2.0**-16
    return x, w.astype(np.complex64), d.astype(np.float32)


# --------------------------------------------------------------------------------------------
# numpy emulation of the kernel's float32 arithmetic (dry-run self-test of the checkers only)
# --------------------------------------------------------------------------------------------
def emulate_kernel(x, w, d, pols, states=None, fused=False):
    B, A, C, S = x.shape[:4]
    K = w.shape[1]
    cd = (np.arange(C, dtype=np.float32)[:, None, None] * d[None]).astype(np.float32)  # fl32(c*d)
    sin, cos = sincospi(cd)
    rot_re, rot_im = cos.astype(np.float32), sin.astype(np.float32)
    wr, wi = w.real.astype(np.float32)[None], w.imag.astype(np.float32)[None]
    Wr = wr * rot_re - wi * rot_im  # (C, A, K) float32
    Wi = wr * rot_im + wi * rot_re
    xf = x.astype(np.float32)
    acc = np.zeros((B, K, C, S, 2), np.float32)
    for a in range(A):
        for k in range(K):
            p = pols[k]
            xr, xi = xf[:, a, :, :, p, 0], xf[:, a, :, :, p, 1]  # (B, C, S)
            wr_, wi_ = Wr[:, a, k][None, :, None], Wi[:, a, k][None, :, None]
            acc[:, k, :, :, 0] = acc[:, k, :, :, 0] + wr_ * xr - wi_ * xi
            acc[:, k, :, :, 1] = acc[:, k, :, :, 1] + wr_ * xi + wi_ * xr
    final = None
    if states is not None:
        D, final, FX = xorwow_dither(np, states, 2 * K, with_int_float=True)
        if fused:  # fl32(acc + fx * scale) with one rounding (float64 holds fx * scale exactly)
            acc = (acc.astype(np.float64) + dither_layout(FX, B, C, S, K).astype(np.float64)
                   * float(DITHER_SCALE)).astype(np.float32)
        else:
            acc = acc + dither_layout(D, B, C, S, K)
    clamped = np.clip(acc, -QMAX, QMAX)
    out = np.rint(clamped).astype(np.int8)
    sat = (clamped != acc).any(axis=-1).sum(axis=(0, 2, 3)).astype(np.uint32)
    return out, sat, final


def small_reference(x, w, d, pols, kind, states=None):
    B, A, C, S = x.shape[:4]
    K = w.shape[1]
    v, M = reference_np(x, w, d, pols)
    D = final = c12 = None
    if states is not None:
        D, final, FX = xorwow_dither(np, states, 2 * K, with_int_float=True)
        D, FX = dither_layout(D, B, C, S, K), dither_layout(FX, B, C, S, K)
        if kind == "exact":
            c12 = exact_candidates(np, v, D, FX)
    return v, M, D, final, c12


def dry_run(args, folder: Path, man: dict) -> int:
    ok = True
    print(f"katgpucbf commit {man['katgpucbf_commit']} ({man.get('katgpucbf_commit_date')}), "
          f"katsdpsigproc {man.get('katsdpsigproc_describe')}, Mako {man.get('mako_version')}")
    probs = verify_files(folder, man)
    print("== files and geometry: " + ("ok" if not probs else "PROBLEMS: " + "; ".join(probs)))
    ok &= not probs
    print("\n== cases (grid x block; bytes: moved = input + output, as cbf counts)")
    for name in select_cases(args, man):
        c = man["cases"][name]
        b = case_bytes(c)
        print(f"  {name:24s} {c['file']:32s} grid {tuple(c['grid'])} block {tuple(c['block'])} "
              f"in {b['input'] / 1e6:7.1f} MB out {b['output'] / 1e6:6.1f} MB moved {b['moved'] / 1e6:7.1f} MB "
              f"(+ params {b['params'] / 1e3:.1f} kB, states {b['states'] / 1e6:.1f} MB)"
              + (f", {c['rand_state_init']['n']} dither states" if c["dither"] else ""))

    print("\n== self-tests of the reference and checkers (numpy emulation of the kernel's float32 arithmetic)")
    rng = np.random.default_rng(args.seed)
    # xorwow emulation against a plain-Python implementation
    st = rng.integers(0, 2**32, size=(64, 6), dtype=np.uint64).astype(np.uint32)
    D, fin = xorwow_dither(np, st, 5)
    good = True
    for i in range(st.shape[0]):
        s = tuple(int(t) for t in st[i])
        for k in range(5):
            r, s = xorwow_scalar(s)
            ri = r - (1 << 32) if r >= 1 << 31 else r
            ri += 1 if ri < 0 else 0
            good &= bool(np.float32(ri) * DITHER_SCALE == D[i, k])
        good &= tuple(int(t) for t in fin[i]) == s
    big = np.float32(2**31 - 1) * DITHER_SCALE
    good &= bool(big < 0.5) and bool(np.float32(127) + big < np.float32(127.5))
    print(f"  [{'ok' if good else 'FAIL'}] xorwow emulation = scalar xorwow; max dither {big:.8f} < 0.5, "
          f"127 + max < 127.5")
    ok &= good

    B, A, C, S = 2, 21, 5, 32
    for K in (8, 20):
        pols = np.arange(K) % 2
        for kind in ("exact", "random"):
            for dither in (False, True):
                x, w, d = make_small_inputs(rng, B, A, C, S, K, kind)
                states = rng.integers(0, 2**32, size=(B * C * S, 6), dtype=np.uint64).astype(np.uint32) \
                    if dither else None
                out, sat, fin_k = emulate_kernel(x, w, d, pols, states)
                v, M, Dd, fin_r, c12 = small_reference(x, w, d, pols, kind, states)
                exact = kind == "exact"

                def run(o, s_, f_):
                    r = evaluate(np, o, v, M, A, D=Dd, exact=exact, dev_states=f_, final_states=fin_r, c1_c2=c12)
                    return judge(r, s_, dither, exact), r

                (passed, why), r = run(out, sat, fin_k)
                label = f"K={K:2d} {kind:6s} {'dither' if dither else 'no dither'}"
                if dither:
                    o_f, s_f, f_f = emulate_kernel(x, w, d, pols, states, fused=True)
                    (p_f, why_f), _ = run(o_f, s_f, f_f)
                    passed &= p_f
                    why += why_f
                    label += " (mul+add and fused)"
                print(f"  [{'ok' if passed else 'FAIL'}] emulated kernel accepted: {label}: diff-from-nominal "
                      f"{r['n_diff_nominal']}/{r['n_values']}, ambiguous {r['n_ambiguous']}, exact ties "
                      f"{r['n_exact_ties']}, saturated "
                      f"{int(sat.sum())} in [{int(r['sat_lo'].sum())}, {int(r['sat_hi'].sum())}]"
                      + ("" if passed else f" -- {why}"))
                ok &= passed
                # corruptions that must be rejected
                u = v if Dd is None else v + Dd
                nominal = quant(np, u).astype(np.int8)
                amb = quant(np, u - 1e-2) != quant(np, u + 1e-2)
                safe = np.argwhere(~amb.any(axis=-1) & (np.abs(nominal).max(axis=-1) < 120))
                bad_cases = {}
                o = out.copy(); o[:, [0, 1]] = o[:, [1, 0]]; bad_cases["beams 0,1 swapped"] = (o, sat, fin_k)
                o = out.copy(); i = tuple(safe[0]); o[i + (0,)] += 1; bad_cases["one value +1"] = (o, sat, fin_k)
                o = out.copy(); o[tuple(safe[1]) + (1,)] = -128; bad_cases["one value unwritten"] = (o, sat, fin_k)
                s2 = sat.copy(); s2[3] += 1; bad_cases["saturation count +1"] = (out, s2, fin_k)
                o = out.copy(); o[:, :, [1, 2]] = o[:, :, [2, 1]]; bad_cases["channels 1,2 swapped"] = (o, sat, fin_k)
                if exact and not dither:
                    o = np.where(np.abs(v) < QMAX, np.sign(v) * np.floor(np.abs(v) + 0.5), out).astype(np.int8)
                    bad_cases["ties rounded away from zero"] = (o, sat, fin_k)
                if dither:
                    o2, s3, _ = emulate_kernel(x, w, d, pols, None)
                    bad_cases["dither missing"] = (o2, s3, fin_k)
                    bad_cases["states not saved"] = (out, sat, states)
                else:
                    st2 = rng.integers(0, 2**32, size=(B * C * S, 6), dtype=np.uint64).astype(np.uint32)
                    o2, s3, _ = emulate_kernel(x, w, d, pols, st2)
                    bad_cases["dither unexpected"] = (o2, s3, None)
                rej = []
                for nm, (o_, s_, f_) in bad_cases.items():
                    (p_, _), _ = run(o_, s_, f_)
                    if p_:
                        rej.append(nm)
                print(f"  [{'ok' if not rej else 'FAIL'}]   corruptions rejected ({len(bad_cases)}): "
                      + ("all" if not rej else "NOT rejected: " + ", ".join(rej)))
                ok &= not rej
    print(f"\ndry run: {'all passed' if ok else 'SOME FAILED'}")
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for env in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "bin", "nvcc"))
    cands += ["/usr/local/cuda/bin/nvcc"] + sorted(str(p) for p in Path("/usr/local").glob("cuda-*/bin/nvcc"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def ptxas_summary(log: str) -> str:
    keep = [ln.replace("ptxas info    :", "").strip() for ln in log.splitlines()
            if ("Used" in ln and "registers" in ln) or "spill" in ln]
    return "; ".join(keep)


def ptxas_spills(log: str) -> dict:
    """Stack frame and spill bytes from ptxas -v (largest over the kernels in the file)."""
    import re

    st = [int(m) for m in re.findall(r"(\d+) bytes stack frame", log)]
    ss = [int(m) for m in re.findall(r"(\d+) bytes spill stores", log)]
    sl = [int(m) for m in re.findall(r"(\d+) bytes spill loads", log)]
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    return dict(stack=max(st, default=None), spill_stores=max(ss, default=None), spill_loads=max(sl, default=None),
                regs=max(regs, default=None))


def select_cases(args, man) -> list[str]:
    names = man.get("case_order") or list(man["cases"])
    if args.cases:
        unknown = [c for c in args.cases if c not in names]
        if unknown:
            raise SystemExit(f"unknown cases {unknown}; known: {names}")
        return args.cases
    if args.quick:
        return [c for c in QUICK_CASES if c in names]
    return names


class Gpu:
    """Everything that touches cupy (imported here only, so --dry-run needs no cupy)."""

    def __init__(self, args, folder: Path, man: dict):
        import cupy as cp

        self.cp = cp
        self.args = args
        self.folder = folder
        self.man = man
        self.dev = cp.cuda.Device(args.device)
        self.dev.use()
        self.stream = cp.cuda.get_current_stream()
        self.arch = args.arch or str(self.dev.compute_capability)
        self.funcs = {}
        self.compile_info = {}

    def info(self) -> dict:
        cp = self.cp
        props = cp.cuda.runtime.getDeviceProperties(self.args.device)
        name = props.get("name", b"?")
        name = name.decode() if isinstance(name, bytes) else str(name)
        info = dict(name=name, compute_capability=self.arch, sms=props.get("multiProcessorCount"),
                    l2_bytes=props.get("l2CacheSize"), total_mem=props.get("totalGlobalMem"),
                    runtime=cp.cuda.runtime.runtimeGetVersion(), driver=cp.cuda.runtime.driverGetVersion(),
                    cupy=cp.__version__, numpy=np.__version__, python=platform.python_version())
        try:
            q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit"
            p = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader", "-i",
                                str(self.args.device)], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = p.stdout.strip()
        except Exception as e:  # noqa: BLE001
            info["nvidia_smi"] = f"unavailable ({e})"
        return info

    def build(self, files: list[str]) -> None:
        cp = self.cp
        build_dir = self.folder / "build" / f"sm_{self.arch}"
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            (build_dir / ".w").write_text("")
        except OSError:
            build_dir = Path(tempfile.mkdtemp(prefix="kbf_build_"))
        nvcc = find_nvcc() if self.args.compile in ("auto", "nvcc") else None
        if self.args.compile == "nvcc" and not nvcc:
            raise RuntimeError("nvcc not found (set $NVCC or put it on PATH)")
        pending = list(files)
        if nvcc:
            vers = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
            print(f"compiling with {nvcc} ({vers[-1] if vers else '?'}) -> {build_dir}")

            def job(fname):
                cubin = build_dir / (Path(fname).stem + ".cubin")
                cmd = [nvcc, "--cubin", f"-arch=sm_{self.arch}", "-std=c++17", "-lineinfo", "-Xptxas", "-v",
                       "-o", str(cubin), str(self.folder / fname)]
                cmd[1:1] = os.environ.get("NVCC_EXTRA_FLAGS", "").split()
                t0 = time.time()
                p = subprocess.run(cmd, capture_output=True, text=True)
                return fname, cubin, p.returncode == 0, p.stdout + p.stderr, cmd, time.time() - t0

            t0 = time.time()
            with ThreadPoolExecutor(max_workers=min(12, os.cpu_count() or 1)) as ex:
                results = list(ex.map(job, pending))
            for fname, cubin, ok, log, cmd, dt in results:
                if ok:
                    self.funcs[fname] = cp.RawModule(path=str(cubin)).get_function(self.kernel_name(fname))
                    self.compile_info[fname] = dict(method="nvcc", cmd=" ".join(cmd), ptxas=ptxas_summary(log),
                                                    spills=ptxas_spills(log), compile_s=round(dt, 1))
                    pending.remove(fname)
                else:
                    print(f"  nvcc failed for {fname}:\n{log[-3000:]}")
            print(f"  nvcc: {len(results) - len(pending)}/{len(results)} modules in {time.time() - t0:.1f} s")
        if pending and self.args.compile in ("auto", "cupy"):
            for fname in list(pending):
                try:
                    mod = cp.RawModule(code=(self.folder / fname).read_text(), options=("-std=c++17", "-lineinfo"),
                                       backend="nvcc")
                    self.funcs[fname] = mod.get_function(self.kernel_name(fname))
                    self.compile_info[fname] = dict(method="cupy.RawModule(code, backend='nvcc')", ptxas="")
                    pending.remove(fname)
                except Exception as e:  # noqa: BLE001
                    print(f"  cupy nvcc backend failed for {fname}: {e}")
        if pending:
            raise RuntimeError(f"could not build: {pending}")
        for fname in files:
            f = self.funcs[fname]
            attrs = {}
            for a in ("num_regs", "local_size_bytes", "shared_size_bytes", "max_threads_per_block"):
                try:
                    attrs[a] = int(getattr(f, a))
                except Exception:  # noqa: BLE001
                    pass
            self.compile_info[fname]["attributes"] = attrs
            print(f"  {fname:34s} regs {attrs.get('num_regs')}, local {attrs.get('local_size_bytes')} B, "
                  f"shared {attrs.get('shared_size_bytes')} B | {self.compile_info[fname]['ptxas']}")

    @staticmethod
    def kernel_name(fname: str) -> str:
        return "rand_state_init" if fname.startswith("rand_state_init") else "beamform"

    def sync(self):
        self.stream.synchronize()

    def free(self):
        self.sync()
        self.cp.get_default_memory_pool().free_all_blocks()

    def time_launches(self, launch, n_sets: int, warm: int, reps: int) -> dict:
        cp = self.cp
        for i in range(warm):
            launch(i % n_sets)
        starts = [cp.cuda.Event() for _ in range(reps)]
        ends = [cp.cuda.Event() for _ in range(reps)]
        for i in range(reps):
            s = (warm + i) % n_sets
            starts[i].record(self.stream)
            launch(s)
            ends[i].record(self.stream)
        ends[-1].synchronize()
        times = np.array([cp.cuda.get_elapsed_time(a, b) for a, b in zip(starts, ends)])
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(self.stream)
        for i in range(reps):
            launch((warm + i) % n_sets)
        e1.record(self.stream)
        e1.synchronize()
        batch = cp.cuda.get_elapsed_time(e0, e1) / reps
        return dict(time_ms=float(np.median(times)), time_min_ms=float(times.min()),
                    time_max_ms=float(times.max()), batch_ms=float(batch), times_ms=times.round(5).tolist())

    def copy_ceiling(self, nbytes: int) -> dict:
        cp = self.cp
        src = cp.empty(nbytes, np.uint8)
        dst = cp.empty(nbytes, np.uint8)
        src.fill(1)
        dst.fill(0)
        kind = cp.cuda.runtime.memcpyDeviceToDevice

        def launch(_):
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, self.stream.ptr)

        t = self.time_launches(launch, 1, 3, self.args.copy_reps)
        ok = bool((dst[:: 1 << 20] == 1).all())
        del src, dst
        self.free()
        return dict(bytes=2 * nbytes, gbps=2 * nbytes / (t["time_ms"] * 1e-3) / 1e9, copied_ok=ok, **t)

    def launch(self, fname, grid, block, args):
        self.funcs[fname](tuple(grid), tuple(block), tuple(args))

    def init_states(self, n: int, seed: int):
        cp = self.cp
        states = cp.empty(n * RAND_STATE_SIZE, np.uint8)  # randState_t[n], 24 B each, 8-byte aligned
        self.launch("rand_state_init.cu", (divup(n, RAND_WGS), 1, 1), (RAND_WGS, 1, 1),
                    (states, np.uint64(seed), np.uint64(0), np.uint64(1), np.uint64(0), np.uint32(n)))
        return states

    def beam_args(self, c, out, sat, inp, w, d, states):
        g = geometry(c["n_ants"], c["channels"], c["spectra_per_batch"], c["batches"], c["n_beams"])
        args = [out, sat, inp, w, d] + ([states] if c["dither"] else []) + [np.int32(s) for s in g["scalars"]]
        return g, args

    # ---- small fresh inputs: numpy reference ----------------------------------------------
    def check_small(self, c: dict, kind: str, rng) -> dict:
        cp = self.cp
        K, S = c["n_beams"], c["spectra_per_batch"]
        B, A, C = 2, 21, 5
        case = dict(c, n_ants=A, channels=C, batches=B)
        pols = np.arange(K) % 2
        x, w, d = make_small_inputs(rng, B, A, C, S, K, kind)
        d_in, d_w, d_d = cp.asarray(x), cp.asarray(w), cp.asarray(d)
        d_out = cp.full((B, K, C, S, 2), -128, np.int8)
        d_sat = cp.zeros(K, np.uint32)
        d_states = states_before = None
        if c["dither"]:
            d_states = self.init_states(B * C * S, int(rng.integers(0, 2**63)))
            self.sync()
            states_before = d_states.get().view(np.uint32).reshape(-1, 6).copy()
        g, args = self.beam_args(case, d_out, d_sat, d_in, d_w, d_d, d_states)
        self.launch(c["file"], g["grid"], g["block"], args)
        self.sync()
        out, sat = d_out.get(), d_sat.get()
        states_after = d_states.get().view(np.uint32).reshape(-1, 6) if c["dither"] else None
        v, M, D, fin, c12 = small_reference(x, w, d, pols, kind, states_before)
        exact = kind == "exact"
        r = evaluate(np, out, v, M, A, D=D, exact=exact, dev_states=states_after, final_states=fin, c1_c2=c12)
        ok, why = judge(r, sat, c["dither"], exact)
        r.update(ok=ok, why=why, sat_dev=int(sat.sum()), sat_lo=int(r["sat_lo"].sum()), sat_hi=int(r["sat_hi"].sum()),
                 shape=f"{B} batches x {A} ants x {C} ch x {S} spectra, {K} beams")
        return r

    # ---- a timed case ------------------------------------------------------------------------
    def bench_case(self, name: str, c: dict, rng) -> tuple[dict, dict]:
        cp = self.cp
        A, C, S, B, K = c["n_ants"], c["channels"], c["spectra_per_batch"], c["batches"], c["n_beams"]
        pols = np.arange(K) % 2
        n_sets = self.args.sets
        seed = int(rng.integers(0, 2**31))
        ins = []
        for i in range(n_sets):
            g = cp.random.RandomState(seed + i)
            a = cp.empty((B, A, C, S, 2, 2), np.int8)
            for b in range(B):  # per batch, to keep the float temporary small
                a[b] = (cp.floor(g.random_sample((A, C, S, 2, 2), dtype=np.float32) * 256) - 128).astype(np.int8)
            ins.append(a)
        s = 0.95 / np.sqrt(A)
        w = (rng.uniform(-s, s, (A, K)) + 1j * rng.uniform(-s, s, (A, K))).astype(np.complex64)
        d = (rng.integers(-(2**13), 2**13, (A, K)) * 2.0**-16).astype(np.float32)
        d_w, d_d = cp.asarray(w), cp.asarray(d)
        d_out = cp.full((B, K, C, S, 2), -128, np.int8)
        d_sat = cp.zeros(K, np.uint32)
        d_states = None
        if c["dither"]:
            d_states = self.init_states(B * C * S, int(rng.integers(0, 2**63)))
        self.sync()
        states_before = d_states.copy() if c["dither"] else None
        g, args0 = self.beam_args(c, d_out, d_sat, ins[0], d_w, d_d, d_states)
        self.launch(c["file"], g["grid"], g["block"], args0)
        self.sync()
        check = self.full_check(c, ins[0], d_out, d_sat, w, d, pols, states_before, d_states, rng)

        arg_sets = [self.beam_args(c, d_out, d_sat, ins[i], d_w, d_d, d_states)[1] for i in range(n_sets)]
        f = self.funcs[c["file"]]
        grid, block = tuple(g["grid"]), tuple(g["block"])

        def launch(i):
            f(grid, block, tuple(arg_sets[i]))

        t = self.time_launches(launch, n_sets, self.args.warmup, self.args.reps)
        del ins, arg_sets, d_out, d_states, states_before
        self.free()
        return check, t

    def full_check(self, c, d_in, d_out, d_sat, w, d, pols, states_before, states_after, rng) -> dict:
        """Every output of the launch against a float64 reference computed with CuPy, plus a numpy spot check."""
        cp = self.cp
        A, C, S, B, K = c["n_ants"], c["channels"], c["spectra_per_batch"], c["batches"], c["n_beams"]
        W = cp.asarray(beam_weights(w, d, C))  # (C, A, K) complex128
        absw = cp.asarray(np.abs(w).astype(np.float64))  # (A, K)
        acc = None
        st_b = st_a = None
        if c["dither"]:
            st_b = states_before.view(cp.uint32).reshape(B, C * S, 6)
            st_a = states_after.view(cp.uint32).reshape(B, C * S, 6)
        for b in range(B):
            xb = d_in[b].astype(cp.float64)  # (A, C, S, 2, 2)
            v = cp.empty((K, C, S, 2), cp.float64)
            M = cp.empty((K, C, S), cp.float64)
            for p in (0, 1):
                ks = np.nonzero(pols == p)[0]
                if ks.size == 0:
                    continue
                xc = (xb[..., p, 0] + 1j * xb[..., p, 1]).transpose(1, 0, 2)  # (C, A, S)
                Wp = W[:, :, ks].transpose(0, 2, 1)  # (C, Kp, A)
                vp = cp.matmul(Wp, xc)  # (C, Kp, S)
                v[ks] = cp.stack([vp.real, vp.imag], axis=-1).transpose(1, 0, 2, 3)
                mag = (cp.abs(xb[..., p, 0]) + cp.abs(xb[..., p, 1])).reshape(A, C * S)
                M[ks] = (absw[:, ks].T @ mag).reshape(ks.size, C, S)
            D = fin = None
            if c["dither"]:
                Dn, fin = xorwow_dither(cp, st_b[b], 2 * K)
                D = Dn.reshape(C, S, K, 2).transpose(2, 0, 1, 3)
            r = evaluate(cp, d_out[b], v, M, A, D=D, exact=False,
                         dev_states=st_a[b] if c["dither"] else None, final_states=fin, beam_axis=0)
            r["sat_lo"], r["sat_hi"] = r["sat_lo"].astype(np.int64), r["sat_hi"].astype(np.int64)
            if "n_unsat" in r:  # weighted means across batches
                r["mean_err"] *= r["n_unsat"]
                r["frac_off_round"] *= r["n_unsat"]
            acc = merge(acc, r)
            del xb, v, M, D
        if "n_unsat" in acc and acc["n_unsat"]:
            acc["mean_err"] /= acc["n_unsat"]
            acc["frac_off_round"] /= acc["n_unsat"]
        dev_sat = d_sat.get().astype(np.int64)
        ok, why = judge(acc, dev_sat, c["dither"], False)
        # numpy spot check: 256 random (batch, channel, spectrum) points, all beams
        npts = 256
        pb, pc, ps = rng.integers(0, B, npts), rng.integers(0, C, npts), rng.integers(0, S, npts)
        xg = d_in[cp.asarray(pb), :, cp.asarray(pc), cp.asarray(ps)].get()  # (npts, A, 2, 2)
        og = d_out[cp.asarray(pb), :, cp.asarray(pc), cp.asarray(ps)].get()  # (npts, K, 2)
        Wg = beam_weights(w, d, C)[pc]  # (npts, A, K)
        xcg = xg[..., 0].astype(np.float64) + 1j * xg[..., 1].astype(np.float64)  # (npts, A, 2)
        vg = np.einsum("nak,nak->nk", Wg, xcg[:, :, pols])
        Mg = np.einsum("ak,nak->nk", np.abs(w).astype(np.float64),
                       (np.abs(xg[..., 0].astype(np.float64)) + np.abs(xg[..., 1].astype(np.float64)))[:, :, pols])
        vg = np.stack([vg.real, vg.imag], axis=-1)
        Dg = None
        if c["dither"]:
            idx = (pb * C + pc) * S + ps
            sg = states_before.view(cp.uint32).reshape(-1, 6)[cp.asarray(idx)].get()
            Dg, _ = xorwow_dither(np, sg, 2 * K)
            Dg = Dg.reshape(npts, K, 2)
        tol = sum_tolerance(A, Mg)[..., None]
        u = vg if Dg is None else vg + Dg
        spot = check_interval(np, og, u - tol, u + tol, beam_axis=1)
        if spot["n_bad"] or spot["n_unwritten"]:
            ok = False
            why.append(f"spot check: {spot['n_bad']} bad, {spot['n_unwritten']} unwritten of {spot['n_values']}")
        out = dict(ok=ok, why=why, n_values=acc["n_values"], n_bad=acc["n_bad"], n_unwritten=acc["n_unwritten"],
                   n_ambiguous=acc["n_ambiguous"], n_diff_nominal=acc["n_diff_nominal"],
                   max_abs_diff_nominal=acc["max_abs_diff_nominal"], sat_dev=int(dev_sat.sum()),
                   sat_lo=int(acc["sat_lo"].sum()), sat_hi=int(acc["sat_hi"].sum()),
                   spot_n=spot["n_values"], spot_bad=spot["n_bad"], spot_diff_nominal=spot["n_diff_nominal"])
        for k in ("agnostic_bad", "n_unsat", "mean_err", "frac_off_round", "states_bad"):
            if k in acc:
                out[k] = acc[k]
        return out


def fmt_row(r: dict) -> str:
    return " | ".join(str(x) for x in r)


def table(rows: list[dict], ceiling: float) -> str:
    hdr = ["case", "ants", "spectra x batches", "beams", "dither", "median (us)", "min-max (us)", "batch mean (us)",
           "moved (MB)", "GB/s", "% copy", "% copy incl. states", "beam samples/s (G)", "ant-beam MACs/s (T)",
           "regs / spills", "check"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        if r.get("time_ms") is None:
            lines.append(f"| {r['name']} | {r['n_ants']} | {r['spectra_per_batch']} x {r['batches']} | {r['n_beams']} | "
                         f"{'yes' if r['dither'] else 'no'} | - | - | - | {r['bytes']['moved'] / 1e6:.1f} | - | - | - | - "
                         f"| - | {r.get('regs', '?')} | {r.get('check', '-')} |")
            continue
        t = r["time_ms"] * 1e-3
        gbps = r["bytes"]["moved"] / t / 1e9
        gbps_all = r["bytes"]["all"] / t / 1e9
        n_bs = r["n_beams"] * r["batches"] * r["channels"] * r["spectra_per_batch"]
        lines.append(
            f"| {r['name']} | {r['n_ants']} | {r['spectra_per_batch']} x {r['batches']} | {r['n_beams']} | "
            f"{'yes' if r['dither'] else 'no'} | {r['time_ms'] * 1e3:.1f} | {r['time_min_ms'] * 1e3:.1f}-"
            f"{r['time_max_ms'] * 1e3:.1f} | {r['batch_ms'] * 1e3:.1f} | {r['bytes']['moved'] / 1e6:.1f} | {gbps:.0f} | "
            f"{100 * gbps / ceiling:.1f}% | {100 * gbps_all / ceiling:.1f}% | {n_bs / t / 1e9:.2f} | "
            f"{n_bs * r['n_ants'] / t / 1e12:.3f} | {r.get('regs', '?')} | {r.get('check', '-')} |")
    return "\n".join(lines)


def gpu_run(args, folder: Path, man: dict) -> int:
    t_start = time.time()
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        print(f"cupy is not importable ({e}); the GPU run needs numpy + cupy. Use --dry-run for CPU-only checks.")
        return 2
    names = select_cases(args, man)
    gpu = Gpu(args, folder, man)
    results = dict(args=vars(args).copy(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                   katgpucbf_commit=man["katgpucbf_commit"], katsdpsigproc=man.get("katsdpsigproc_describe"))
    info = gpu.info()
    results["device"] = info
    print(f"device: {info['name']} (sm_{info['compute_capability']}, {info['sms']} SMs, L2 "
          f"{(info['l2_bytes'] or 0) / 2**20:.0f} MiB), CUDA runtime {info['runtime']}, driver {info['driver']}, "
          f"CuPy {info['cupy']}, numpy {info['numpy']}")
    print(f"nvidia-smi: {info['nvidia_smi']}")
    print(f"katgpucbf commit {man['katgpucbf_commit']}; cases: {', '.join(names)}")
    problems = verify_files(folder, man)
    results["file_problems"] = problems
    if problems:
        print("file/geometry problems: " + "; ".join(problems))
        return 1

    print("\n== build")
    files = sorted({man["cases"][n]["file"] for n in names})
    if any(man["cases"][n]["dither"] for n in names):
        files.append("rand_state_init.cu")
    gpu.build(files)
    results["compile"] = gpu.compile_info

    print("\n== copy ceiling (device-to-device cudaMemcpyAsync, bytes read + written)")
    copy_start = gpu.copy_ceiling(args.copy_bytes)
    print(f"  start: {copy_start['gbps']:.0f} GB/s (median {copy_start['time_ms'] * 1e3:.1f} us for "
          f"{args.copy_bytes / 2**30:.2f} GiB; batch {2 * args.copy_bytes / (copy_start['batch_ms'] * 1e-3) / 1e9:.0f} GB/s)")
    results["copy_start"] = copy_start

    rng = np.random.default_rng(args.seed)
    checks_ok = True
    results["checks_small"] = []
    if not args.skip_small:
        print("\n== correctness on small fresh random inputs (2 batches x 21 antennas x 5 channels; numpy float64)")
        done = set()
        for n in names:
            c = man["cases"][n]
            if c["file"] in done:
                continue
            done.add(c["file"])
            for kind in ("exact", "random"):
                try:
                    r = gpu.check_small(c, kind, rng)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    r = dict(ok=False, why=[repr(e)])
                r = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
                results["checks_small"].append(dict(file=c["file"], kind=kind, **r))
                checks_ok &= r["ok"]
                keys = ("n_values", "n_diff_nominal", "n_ambiguous", "n_exact_ties", "sat_dev", "sat_lo", "sat_hi", "agnostic_bad",
                        "states_bad", "mean_err", "frac_off_round")
                print(f"  [{'ok' if r['ok'] else 'FAIL'}] {c['file']} {kind}: "
                      + json.dumps({k: r[k] for k in keys if k in r}) + ("" if r["ok"] else f" -- {r.get('why')}"))

    print(f"\n== cases: full-output check, then {args.warmup} warm-ups + {args.reps} timed launches "
          f"(own event pair each), {args.sets} input buffers rotated")
    rows = []
    for n in names:
        c = man["cases"][n]
        row = dict(name=n, **{k: c[k] for k in ("n_ants", "channels", "spectra_per_batch", "batches", "n_beams",
                                                "dither", "file", "grid", "block")})
        row["bytes"] = case_bytes(c)
        ci = gpu.compile_info.get(c["file"], {})
        attrs = ci.get("attributes", {})
        sp = ci.get("spills", {})
        if sp.get("spill_stores") is None:
            spill = "spills ?"
        elif sp["spill_stores"] or sp["spill_loads"]:
            spill = f"SPILLS {sp['spill_stores']}/{sp['spill_loads']} B"
        else:
            spill = "no spill"
        row["regs"] = f"{attrs.get('num_regs', '?')} / {spill}, stack {sp.get('stack', '?')} B"
        try:
            check, t = gpu.bench_case(n, c, rng)
            row.update(t)
            row["check_detail"] = check
            row["check"] = "ok" if check["ok"] else "FAIL"
            checks_ok &= check["ok"]
            gbps = row["bytes"]["moved"] / (t["time_ms"] * 1e-3) / 1e9
            print(f"  {n}: {t['time_ms'] * 1e3:.1f} us (min {t['time_min_ms'] * 1e3:.1f}, max "
                  f"{t['time_max_ms'] * 1e3:.1f}, batch {t['batch_ms'] * 1e3:.1f}), {gbps:.0f} GB/s moved = "
                  f"{100 * gbps / copy_start['gbps']:.1f}% of copy; check {row['check']} "
                  + json.dumps({k: v for k, v in check.items() if k not in ("ok",)}))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row["check"] = f"ERROR {type(e).__name__}"
            row["error"] = repr(e)
            checks_ok = False
            try:
                gpu.free()
            except Exception:  # noqa: BLE001
                pass
        rows.append(row)

    print("\n== copy ceiling again (end of run)")
    copy_end = gpu.copy_ceiling(args.copy_bytes)
    print(f"  end: {copy_end['gbps']:.0f} GB/s")
    results["copy_end"] = copy_end
    ceiling = max(copy_start["gbps"], copy_end["gbps"])
    results["copy_ceiling_gbps"] = ceiling
    for r in rows:
        if r.get("time_ms"):
            t = r["time_ms"] * 1e-3
            r["gbps_moved"] = r["bytes"]["moved"] / t / 1e9
            r["pct_copy"] = 100 * r["gbps_moved"] / ceiling
            r["pct_copy_all"] = 100 * r["bytes"]["all"] / t / 1e9 / ceiling
            r["beam_samples_per_s"] = r["n_beams"] * r["batches"] * r["channels"] * r["spectra_per_batch"] / t
    results["rows"] = rows
    results["checks_ok"] = bool(checks_ok)
    results["wall_s"] = time.time() - t_start
    if args.out:
        try:
            od = Path(args.out)
            od.mkdir(parents=True, exist_ok=True)
            (od / "bench_results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
            print(f"\nwrote {od / 'bench_results.json'}")
        except OSError as e:
            print(f"\ncould not write results: {e}")

    print(f"\n# katgpucbf beamform ({man['katgpucbf_commit'][:7]}) on {info['name']}: copy ceiling {ceiling:.0f} GB/s "
          f"(start {copy_start['gbps']:.0f}, end {copy_end['gbps']:.0f}); checks "
          f"{'all passed' if checks_ok else 'SOME FAILED (see above)'}; wall {results['wall_s']:.0f} s")
    print("# moved = input read + output written (as cbf counts); '% copy incl. states' also counts weights, delays,"
          " saturation counters and the dither states (24 B read + 24 B written per (batch, channel, spectrum))\n")
    print(table(rows, ceiling))
    return 0 if checks_ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="no GPU: files, geometry, bytes, reference self-tests")
    p.add_argument("--quick", action="store_true", help="5 cases, 3 warm-ups, 10 timed launches")
    p.add_argument("--cases", nargs="+", help="case names from manifest.json (default: all)")
    p.add_argument("--kernels", default=str(HERE), help="folder with manifest.json and the .cu files [this folder]")
    p.add_argument("--reps", type=int, default=None, help="timed launches [30; quick 10]")
    p.add_argument("--warmup", type=int, default=None, help="warm-up launches [5; quick 3]")
    p.add_argument("--sets", type=int, default=3, help="input buffers rotated [3]")
    p.add_argument("--copy-bytes", type=int, default=1 << 30, help="copy ceiling buffer [1 GiB]")
    p.add_argument("--copy-reps", type=int, default=20)
    p.add_argument("--compile", choices=["auto", "nvcc", "cupy"], default="auto")
    p.add_argument("--arch", default=None, help="compute capability digits, e.g. 90 [the device's]")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seed", type=int, default=20261128)
    p.add_argument("--skip-small", action="store_true", help="skip the small-input checks")
    p.add_argument("--out", default=os.environ.get("BENCH_OUT") or os.environ.get("OUT") or str(HERE / "results"),
                   help="folder for bench_results.json [$BENCH_OUT, else $OUT, else ./results]")
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 10 if args.quick else 30
    if args.warmup is None:
        args.warmup = 3 if args.quick else 5
    folder = Path(args.kernels).resolve()
    if not (folder / "manifest.json").exists():
        print(f"no manifest.json in {folder}: run render.py first (see README.md)")
        return 2
    man = load_manifest(folder)
    if args.dry_run:
        return dry_run(args, folder, man)
    return gpu_run(args, folder, man)


if __name__ == "__main__":
    sys.exit(main())
