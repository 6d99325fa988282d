//! The counter-based generator behind noise and dither: every value is a pure function of
//! (seed, stream, index), so the CPU and GPU backends (and dsim's pattern renderer) produce the
//! same bits in any order. It is SplitMix64's finaliser over a linear key, which a GPU computes
//! with three 64-bit multiplies; Philox would serve as well, but this is smaller and every
//! consumer here needs only one 64-bit draw per value.
#![deny(unsafe_code)]

/// 64 random bits for (seed, stream, index).
#[inline]
pub fn mix(seed: u64, stream: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_add(stream.wrapping_mul(0xd1b5_4a32_d192_ed03))
        .wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from the top 53 bits.
#[inline]
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Uniform in [−½, ½) in f32 from the top 24 bits (exactly representable, so a GPU gets the
/// same value bit for bit).
#[inline]
pub fn dither_f32(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / (1u32 << 24) as f32) - 0.5
}

/// A 32-bit integer hash with full avalanche (Wellons' "lowbias32" from hash-prospector:
/// xorshift-multiply twice). It turns a counter into 32 random bits with two 32-bit multiplies,
/// where [`mix`] needs three 64-bit ones (about four 32-bit multiplies each on a GPU): the
/// F-engine draws one per output value, which made the 64-bit generator the largest cost of
/// its post-processing kernel.
#[inline]
pub fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Two uniforms in [−½, ½) from 32 bits: bits 31..16 and 15..0 (16 bits each, exact in f32).
/// Sixteen bits are ample for dither: the steps of 2⁻¹⁶ LSB shift a quantiser's decision by
/// at most 2⁻¹⁷ LSB.
#[inline]
pub fn dither_pair16(bits: u32) -> (f32, f32) {
    let u = |v: u32| v as f32 * (1.0 / 65536.0) - 0.5;
    (u(bits >> 16), u(bits & 0xffff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_moments_and_range() {
        let n = 200_000u64;
        let v: Vec<f64> = (0..n)
            .map(|i| f64::from(dither_f32(mix(7, 1, i))))
            .collect();
        assert!(v.iter().all(|&x| (-0.5..0.5).contains(&x)));
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // U(−½, ½): mean 0, variance 1/12; standard errors ≈ 6.5e-4 and 1.5e-4.
        assert!(mean.abs() < 3e-3, "{mean}");
        assert!((var - 1.0 / 12.0).abs() < 1e-3, "{var}");
        // The two halves of a pair are uncorrelated uniforms, and so are neighbours along a
        // counter (the F-engine's channels) and two keys' sequences side by side.
        let pairs: Vec<(f64, f64)> = (0..n as u32)
            .map(|i| {
                let (a, b) = dither_pair16(hash32(
                    0x1234_5678u32.wrapping_add(i.wrapping_mul(0x9e37_79b9)),
                ));
                (f64::from(a), f64::from(b))
            })
            .collect();
        let other: Vec<f64> = (0..n as u32)
            .map(|i| {
                f64::from(
                    dither_pair16(hash32(
                        0x1234_5679u32.wrapping_add(i.wrapping_mul(0x9e37_79b9)),
                    ))
                    .0,
                )
            })
            .collect();
        let mean_of = |f: &dyn Fn(usize) -> f64| (0..pairs.len()).map(f).sum::<f64>() / n as f64;
        let var_a = mean_of(&|i| pairs[i].0 * pairs[i].0);
        let var_b = mean_of(&|i| pairs[i].1 * pairs[i].1);
        let cov_ab = mean_of(&|i| pairs[i].0 * pairs[i].1);
        let cov_next = (0..pairs.len() - 1)
            .map(|i| pairs[i].0 * pairs[i + 1].0)
            .sum::<f64>()
            / n as f64;
        let cov_keys = mean_of(&|i| pairs[i].0 * other[i]);
        for v in [var_a, var_b] {
            assert!((v - 1.0 / 12.0).abs() < 1e-3, "{v}");
        }
        for c in [cov_ab, cov_next, cov_keys] {
            // Standard error of a product mean of independent U(−½, ½): 1/12/√n ≈ 1.9e-4.
            assert!(c.abs() < 1e-3, "{c}");
        }
        assert!(pairs
            .iter()
            .all(|&(a, b)| (-0.5..0.5).contains(&a) && (-0.5..0.5).contains(&b)));
        // Every 16-bit value is reachable and none is favoured: a χ² over 256 bins of the
        // top byte (255 degrees of freedom: mean 255, sd 22.6; 400 is 6.4 sd out).
        let mut bins = [0u64; 256];
        for &(a, _) in &pairs {
            bins[((a + 0.5) * 256.0) as usize] += 1;
        }
        let e = n as f64 / 256.0;
        let chi2: f64 = bins.iter().map(|&b| (b as f64 - e).powi(2) / e).sum();
        assert!(chi2 < 400.0, "{chi2}");
        // Streams and seeds are independent draws.
        assert_ne!(mix(7, 1, 5), mix(7, 2, 5));
        assert_ne!(mix(7, 1, 5), mix(8, 1, 5));
    }
}
