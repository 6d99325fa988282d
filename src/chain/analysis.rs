//! What the demo chain measures, as pure functions over what it received.
//!
//! Delay from the cross-correlation phase slope: with x₁(t) = x₀(t − n) (antenna 1 delayed by
//! n samples) and channel k at baseband frequency k·fs/(2N), X₁ₖ = X₀ₖ·e^{−jπkn/N}, so the
//! baseline's visibility V₀₁ = X₀·conj(X₁) has phase +πkn/N: the mean phase step between
//! adjacent channels, arg Σₖ Vₖ·conj(Vₖ₋₁), is πn/N, independent of wraps.
#![deny(unsafe_code)]

use num_complex::Complex64;

/// The delay in samples implied by the phase slope of `v` (one visibility per channel of an
/// N-channel wideband stream).
pub fn delay_from_phase_slope(v: &[Complex64]) -> f64 {
    let n = v.len() as f64;
    let step: Complex64 = v.windows(2).map(|w| w[1] * w[0].conj()).sum();
    step.arg() * n / std::f64::consts::PI
}

/// Mean power of a beam's int8 (re, im) samples.
pub fn mean_power(raw: &[u8]) -> f64 {
    let sum: f64 = raw
        .chunks_exact(2)
        .map(|c| {
            let (re, im) = (f64::from(c[0] as i8), f64::from(c[1] as i8));
            re * re + im * im
        })
        .sum();
    sum / (raw.len() / 2).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pure_delay_is_recovered_through_wraps() {
        // A noise-free delayed tone comb: V_k = |X|² e^{jπkn/N} for n = 3.25 over 256 channels
        // (the phase wraps several times across the band).
        let (n, ch) = (3.25, 256);
        let v: Vec<Complex64> = (0..ch)
            .map(|k| {
                Complex64::from_polar(
                    1.0 + (k % 7) as f64,
                    std::f64::consts::PI * k as f64 * n / ch as f64,
                )
            })
            .collect();
        assert!((delay_from_phase_slope(&v) - n).abs() < 1e-9);
        let neg: Vec<Complex64> = v.iter().map(|z| z.conj()).collect();
        assert!((delay_from_phase_slope(&neg) + n).abs() < 1e-9);
    }

    #[test]
    fn beam_power_of_known_samples() {
        let raw = [3u8, 4, 0, 0, (-3i8) as u8, (-4i8) as u8, 1, 0];
        assert_eq!(mean_power(&raw), (25.0 + 0.0 + 25.0 + 1.0) / 4.0);
    }
}
