#!/usr/bin/env python3
"""Independent reference for cbf's PFB front end, in numpy (float64).

Weights follow katgpucbf's generate_pfb_weights as the facts file states it: window
(Hann = sin^2(pi i/(L-1)) or rect) times np.sinc(w_cutoff*((i+0.5)/step - taps/2)),
normalised so the sum of squares is 1. Each spectrum s is the weighted sum of its window
starting at starts[s], then np.fft.rfft without the Nyquist bin.

Usage: pfb_reference.py STEP TAPS W_CUTOFF hann|rect START... < int32 samples (little-endian)
Writes to stdout: the weights (float64, taps*step), then the spectra (complex128,
len(starts) x step/2), raw little-endian.
"""
import sys

import numpy as np


def weights(step, taps, w_cutoff, window):
    size = step * taps
    idx = np.arange(size)
    win = np.square(np.sin(np.pi * idx / (size - 1))) if window == "hann" else np.ones(size)
    w = win * np.sinc(w_cutoff * ((idx + 0.5) / step - taps / 2))
    return w / np.sqrt(np.sum(np.square(w)))


def main():
    step, taps, cut, window = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    starts = [int(s) for s in sys.argv[5:]]
    x = np.frombuffer(sys.stdin.buffer.read(), dtype="<i4").astype(np.float64)
    w = weights(step, taps, cut, window)
    # The f32 weights cbf uses: the reference applies the same rounding, so that only the
    # filter and FFT arithmetic is compared.
    w32 = w.astype(np.float32).astype(np.float64)
    spectra = []
    for o in starts:
        frame = (x[o : o + taps * step] * w32).reshape(taps, step).sum(axis=0)
        spectra.append(np.fft.rfft(frame)[: step // 2])
    sys.stdout.buffer.write(w.astype("<f8").tobytes())
    sys.stdout.buffer.write(np.array(spectra, dtype="<c16").tobytes())


main()
