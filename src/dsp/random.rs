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

/// Two uniforms in [−½, ½) from one draw: bits 63..40 and 39..16 (24 bits each, exact in
/// f32). The F-engine dithers the real and imaginary parts of a value with one draw, which
/// halves the 64-bit arithmetic a GPU spends on it.
#[inline]
pub fn dither_pair_f32(bits: u64) -> (f32, f32) {
    (
        dither_f32(bits),
        dither_f32((bits << 24) & 0xffff_ff00_0000_0000),
    )
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
        // The two halves of a pair are uncorrelated uniforms.
        let pairs: Vec<(f64, f64)> = (0..n)
            .map(|i| {
                let (a, b) = dither_pair_f32(mix(9, 3, i));
                (f64::from(a), f64::from(b))
            })
            .collect();
        let cov = pairs.iter().map(|(a, b)| a * b).sum::<f64>() / n as f64;
        let var_b = pairs.iter().map(|(_, b)| b * b).sum::<f64>() / n as f64;
        assert!(cov.abs() < 1e-3, "{cov}");
        assert!((var_b - 1.0 / 12.0).abs() < 1e-3, "{var_b}");
        assert!(pairs
            .iter()
            .all(|&(a, b)| (-0.5..0.5).contains(&a) && (-0.5..0.5).contains(&b)));
        // Streams and seeds are independent draws.
        assert_ne!(mix(7, 1, 5), mix(7, 2, 5));
        assert_ne!(mix(7, 1, 5), mix(8, 1, 5));
    }
}
