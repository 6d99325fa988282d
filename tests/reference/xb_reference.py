#!/usr/bin/env python3
"""Independent numpy references for cbf's X-engine correlator and beamformer.

correlate N_ANTS CHANNELS SPECTRA < int8 input (antenna, channel, spectrum, pol, re/im)
    -> int64 visibilities (channel, baseline a2*(a2+1)/2+a1, product p1+2*p2, re/im), computed
       with complex128 einsum: V = sum_t x[a1,p1] * conj(x[a2,p2]).
beamform N_ANTS CHANNELS SPECTRA < int8 input, then per beam: pol (int64), weights (complex128
       per antenna), delays (float64 per antenna)   [N_BEAMS read until EOF]
    -> complex128 pre-quantisation beams (beam, channel, spectrum):
       y = sum_a w_ab exp(j pi c d_ab) x[a, c, t, pol_b]
"""
import sys

import numpy as np


def main():
    cmd, n_ants, channels, spectra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    data = sys.stdin.buffer.read()
    n_in = n_ants * channels * spectra * 4
    raw = np.frombuffer(data[:n_in], dtype=np.int8).astype(np.float64).reshape(n_ants, channels, spectra, 2, 2)
    x = raw[..., 0] + 1j * raw[..., 1]  # (ant, chan, time, pol)
    if cmd == "correlate":
        n_bl = n_ants * (n_ants + 1) // 2
        out = np.zeros((channels, n_bl, 4, 2), dtype=np.int64)
        for a2 in range(n_ants):
            for a1 in range(a2 + 1):
                bl = a2 * (a2 + 1) // 2 + a1
                v = np.einsum("ctp,ctq->cpq", x[a1], np.conj(x[a2]))  # v[c, p1, p2]
                for p1 in range(2):
                    for p2 in range(2):
                        out[:, bl, p1 + 2 * p2, 0] = np.rint(v[:, p1, p2].real)
                        out[:, bl, p1 + 2 * p2, 1] = np.rint(v[:, p1, p2].imag)
        sys.stdout.buffer.write(out.astype("<i8").tobytes())
    else:
        rest = data[n_in:]
        per_beam = 8 + 16 * n_ants + 8 * n_ants
        beams = []
        for b in range(len(rest) // per_beam):
            chunk = rest[b * per_beam : (b + 1) * per_beam]
            pol = int(np.frombuffer(chunk[:8], "<i8")[0])
            w = np.frombuffer(chunk[8 : 8 + 16 * n_ants], "<c16")
            d = np.frombuffer(chunk[8 + 16 * n_ants :], "<f8")
            c = np.arange(channels)
            coeff = w[:, None] * np.exp(1j * np.pi * c[None, :] * d[:, None])  # (ant, chan)
            beams.append(np.einsum("ac,act->ct", coeff, x[..., pol]))
        sys.stdout.buffer.write(np.array(beams, dtype="<c16").tobytes())


main()
