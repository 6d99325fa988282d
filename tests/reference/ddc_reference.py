#!/usr/bin/env python3
"""Independent references for cbf's narrowband DDC (scipy/numpy, float64).

weights discard TAPS S WEIGHT_PASS            -> float64 taps: scipy.signal.remez with katgpucbf's
                                                 discard-mode bands (fs=S), times sqrt(S)
weights nodiscard TAPS S PASS WEIGHT_PASS     -> the no-discard design likewise
ddc S STEP T_FIRST N_OUT NX < int32 x[NX], float32 h  -> complex128 y[N_OUT]:
    y_b = sum_k x[S b + k] h_k exp(2 pi j phase(t_first + S b + k)),
    phase(t) = ((STEP * t) mod 2^32) / 2^32 exactly (Python integers, like katgpucbf's
    Fraction-based mixer reference), one sample at a time with no factorisation.
"""
import sys

import numpy as np
import scipy.signal


def main():
    a = sys.argv[1:]
    if a[0] == "weights":
        if a[1] == "discard":
            taps, s, wp = int(a[2]), int(a[3]), float(a[4])
            edges, desired, weights = [0.0, 0.25], [1.0], [wp]
            for x in np.arange(0.75, 0.5 * s):
                edges += [x, min(x + 0.5, 0.5 * s)]
                desired.append(0.0)
                weights.append(1.0)
        else:
            taps, s, pf, wp = int(a[2]), int(a[3]), float(a[4]), float(a[5])
            edges, desired, weights = [0.0, 0.5 * pf, 1.0 - 0.5 * pf, 0.5 * s], [1.0, 0.0], [wp, 1.0]
        h = scipy.signal.remez(taps, edges, desired, weight=weights, fs=s, maxiter=1000) * np.sqrt(s)
        sys.stdout.buffer.write(h.astype("<f8").tobytes())
    else:
        s, step, t_first, n_out, nx = (int(v) for v in a[1:6])
        data = sys.stdin.buffer.read()
        x = np.frombuffer(data[: 4 * nx], "<i4").astype(np.float64)
        h = np.frombuffer(data[4 * nx :], "<f4").astype(np.float64)
        taps = len(h)
        t = np.arange(nx, dtype=object) + t_first
        phase = np.array([((step * int(v)) % (1 << 32)) / float(1 << 32) for v in t])
        mixed = x * np.exp(2j * np.pi * phase)
        y = np.array([np.sum(mixed[s * b : s * b + taps] * h) for b in range(n_out)])
        sys.stdout.buffer.write(y.astype("<c16").tobytes())


main()
