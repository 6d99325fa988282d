//! The X-engine correlator oracle (seed 001; facts §1.4, §1.9 "X heap", §1.10).
//!
//! Input: int8 complex dual-polarisation samples from every antenna, laid out as the F heaps
//! arrive, **(antenna, channel, spectrum, pol, re/im)**. For every baseline a1 ≤ a2, in
//! katgpucbf's order (baseline index `a2·(a2+1)/2 + a1`), and every product
//! `p1 + 2·p2` (aa, ba, ab, bb) the visibility is
//!
//! ```text
//! V[c][bl][p1 + 2·p2] = Σ_t x[a1][c][t][p1] · conj(x[a2][c][t][p2])
//! ```
//!
//! accumulated in i64 across batches, then reduced to i32 with saturation to ±(2³¹ − 1) and a
//! clip count. Baselines touched by missing input are set to (−2³¹, 1), katgpucbf's marker.
//! 4-bit input (one byte per complex value, real in the high nibble) is also supported
//! (katgpucbf lacks it, NGC-1104).
#![deny(unsafe_code)]

/// Number of baselines (autos included) for `n_ants` antennas.
pub fn n_baselines(n_ants: usize) -> usize {
    n_ants * (n_ants + 1) / 2
}

/// katgpucbf's baseline index for a1 ≤ a2.
pub fn baseline_index(a1: usize, a2: usize) -> usize {
    debug_assert!(a1 <= a2);
    a2 * (a2 + 1) / 2 + a1
}

/// Shape of one correlation batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorrShape {
    pub n_ants: usize,
    pub channels: usize,
    pub spectra: usize,
}

impl CorrShape {
    /// int8 values in one input batch: ants × channels × spectra × 2 pols × 2.
    pub fn input_len(&self) -> usize {
        self.n_ants * self.channels * self.spectra * 4
    }

    /// Values in the visibility buffer: channels × baselines × 4 products × 2 (re, im).
    pub fn vis_len(&self) -> usize {
        self.channels * n_baselines(self.n_ants) * 8
    }
}

/// Accumulate one batch into `acc` (i64, `shape.vis_len()`, layout (channel, baseline,
/// product, re/im)): **accumulates**, never overwrites.
pub fn correlate_accumulate(shape: CorrShape, x: &[i8], acc: &mut [i64]) {
    assert_eq!(x.len(), shape.input_len());
    assert_eq!(acc.len(), shape.vis_len());
    for c in 0..shape.channels {
        for a2 in 0..shape.n_ants {
            for a1 in 0..=a2 {
                accumulate_baseline(shape, x, c, a1, a2, acc);
            }
        }
    }
}

/// Accumulate one baseline a1 ≤ a2 of channel `c` of one batch into `acc` (as
/// [`correlate_accumulate`], which is this over every baseline): all four products, each
/// Σ_t x[a1][p1] · conj(x[a2][p2]) at `((c · baselines + bl) · 4 + p1 + 2·p2) · 2`. A
/// self-test checks a sample of baselines of a call too long to correlate whole on the host.
pub fn accumulate_baseline(
    shape: CorrShape,
    x: &[i8],
    c: usize,
    a1: usize,
    a2: usize,
    acc: &mut [i64],
) {
    let CorrShape {
        n_ants,
        channels,
        spectra,
    } = shape;
    let at =
        |a: usize, c: usize, t: usize, p: usize| ((a * channels + c) * spectra + t) * 4 + p * 2;
    let bl = baseline_index(a1, a2);
    for p2 in 0..2 {
        for p1 in 0..2 {
            let (mut re, mut im) = (0i64, 0i64);
            for t in 0..spectra {
                let i = at(a1, c, t, p1);
                let j = at(a2, c, t, p2);
                let (xr, xi) = (i64::from(x[i]), i64::from(x[i + 1]));
                let (yr, yi) = (i64::from(x[j]), i64::from(x[j + 1]));
                // x · conj(y)
                re += xr * yr + xi * yi;
                im += xi * yr - xr * yi;
            }
            let o = ((c * n_baselines(n_ants) + bl) * 4 + p1 + 2 * p2) * 2;
            acc[o] += re;
            acc[o + 1] += im;
        }
    }
}

/// Unpack 4-bit complex input (real in the high nibble) to the int8 layout.
pub fn unpack_4bit(packed: &[u8], out: &mut [i8]) {
    for (o, &b) in out.chunks_exact_mut(2).zip(packed) {
        o[0] = (b as i8) >> 4;
        o[1] = ((b << 4) as i8) >> 4;
    }
}

/// The marker katgpucbf writes into baselines touched by missing data.
pub const MISSING: (i32, i32) = (i32::MIN, 1);

/// Reduce an accumulation to i32: saturate to ±(2³¹ − 1) and count clipped values (each
/// re or im part counted once); baselines whose antennas are not all `present` get
/// [`MISSING`]. `out` is i32 in the same layout, **overwritten**. Returns the clip count.
pub fn reduce(shape: CorrShape, acc: &[i64], present: &[bool], out: &mut [i32]) -> u64 {
    assert_eq!(acc.len(), shape.vis_len());
    assert_eq!(out.len(), acc.len());
    assert_eq!(present.len(), shape.n_ants);
    let n_bl = n_baselines(shape.n_ants);
    let mut clips = 0;
    for a2 in 0..shape.n_ants {
        for a1 in 0..=a2 {
            let bl = baseline_index(a1, a2);
            let ok = present[a1] && present[a2];
            for c in 0..shape.channels {
                let o = (c * n_bl + bl) * 8;
                for pair in 0..4 {
                    let (re, im) = (o + pair * 2, o + pair * 2 + 1);
                    if ok {
                        for i in [re, im] {
                            let v = acc[i].clamp(-i64::from(i32::MAX), i64::from(i32::MAX));
                            clips += u64::from(v != acc[i]);
                            out[i] = v as i32;
                        }
                    } else {
                        out[re] = MISSING.0;
                        out[im] = MISSING.1;
                    }
                }
            }
        }
    }
    clips
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn random_input(shape: CorrShape, seed: u64) -> Vec<i8> {
        (0..shape.input_len() as u64)
            .map(|i| ((crate::dsp::random::mix(seed, 0, i) % 255) as i16 - 127) as i8)
            .collect()
    }

    #[test]
    fn baseline_order_is_katgpucbfs() {
        let order: Vec<(usize, usize)> = (0..3)
            .flat_map(|a2| (0..=a2).map(move |a1| (a1, a2)))
            .collect();
        let idx: Vec<usize> = order.iter().map(|&(a, b)| baseline_index(a, b)).collect();
        assert_eq!(idx, [0, 1, 2, 3, 4, 5]);
        assert_eq!(baseline_index(0, 1), 1);
        assert_eq!(baseline_index(1, 1), 2);
        assert_eq!(n_baselines(80), 3240);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Autocorrelations are real and non-negative; the cross-pol autos are conjugates
        /// (V_ab = conj(V_ba) on a1 = a2); correlating two batches one after the other equals
        /// correlating their concatenation in time (linearity of accumulation).
        #[test]
        fn hermitian_and_accumulating(n_ants in 1usize..5, channels in 1usize..4, spectra in 1usize..9, seed in any::<u64>()) {
            let shape = CorrShape { n_ants, channels, spectra };
            let a = random_input(shape, seed);
            let b = random_input(shape, seed ^ 1);
            let mut acc = vec![0i64; shape.vis_len()];
            correlate_accumulate(shape, &a, &mut acc);
            correlate_accumulate(shape, &b, &mut acc);
            // The concatenation in time: per (antenna, channel), a's spectra then b's.
            let double = CorrShape { spectra: 2 * spectra, ..shape };
            let mut cat = Vec::with_capacity(double.input_len());
            for ant in 0..n_ants {
                for c in 0..channels {
                    let r = ((ant * channels + c) * spectra * 4)..((ant * channels + c + 1) * spectra * 4);
                    cat.extend_from_slice(&a[r.clone()]);
                    cat.extend_from_slice(&b[r]);
                }
            }
            let mut whole = vec![0i64; double.vis_len()];
            correlate_accumulate(double, &cat, &mut whole);
            prop_assert_eq!(&acc, &whole);
            let n_bl = n_baselines(n_ants);
            for c in 0..channels {
                for ant in 0..n_ants {
                    let o = (c * n_bl + baseline_index(ant, ant)) * 8;
                    for p in [0, 3] {
                        prop_assert_eq!(acc[o + 2 * p + 1], 0);
                        prop_assert!(acc[o + 2 * p] >= 0);
                    }
                    prop_assert_eq!((acc[o + 2], acc[o + 3]), (acc[o + 4], -acc[o + 5]));
                }
            }
        }
    }

    #[test]
    fn saturation_and_missing_marker() {
        let shape = CorrShape {
            n_ants: 2,
            channels: 1,
            spectra: 1,
        };
        let mut acc = vec![0i64; shape.vis_len()];
        acc[0] = 1 << 40;
        acc[1] = -(1 << 40);
        acc[2] = 5;
        let mut out = vec![0i32; acc.len()];
        assert_eq!(reduce(shape, &acc, &[true, true], &mut out), 2);
        assert_eq!(&out[..3], &[i32::MAX, -i32::MAX, 5]);
        let clips = reduce(shape, &acc, &[true, false], &mut out);
        assert_eq!(clips, 2, "baseline (0,0) is still reduced");
        // Baselines (0,1) and (1,1) are touched by antenna 1.
        for bl in [1, 2] {
            for pair in 0..4 {
                assert_eq!(
                    (out[bl * 8 + pair * 2], out[bl * 8 + pair * 2 + 1]),
                    MISSING
                );
            }
        }
    }

    #[test]
    fn full_scale_input_does_not_overflow_i64() {
        let shape = CorrShape {
            n_ants: 2,
            channels: 1,
            spectra: 4096,
        };
        let x = vec![127i8; shape.input_len()];
        let mut acc = vec![0i64; shape.vis_len()];
        correlate_accumulate(shape, &x, &mut acc);
        assert_eq!(acc[0], 4096 * 2 * 127 * 127);
    }

    #[test]
    fn four_bit_unpacking() {
        let mut out = [0i8; 4];
        unpack_4bit(&[0x97, 0x3f], &mut out);
        assert_eq!(out, [-7, 7, 3, -1]);
    }
}
