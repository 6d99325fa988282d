//! The narrowband PFB FIR for a batch of spectra (seed 000 §Narrowband step 4): the CPU
//! backend's form of [`super::ddc::complex_pfb_fir`], bit for bit the same frames, without
//! reading the input from memory once per spectrum and tap.
//!
//! One spectrum at a time reads taps·fft_len complex inputs from memory for each spectrum, and
//! consecutive spectra (fft_len DDC outputs apart) share all but fft_len of them: at 16 taps
//! and 65536 points that is 8 MiB of input per spectrum, and the narrowband chunk was bound by
//! the memory traffic. Here the spectra are swept together a few columns at a time: each
//! spectrum's sums over all taps stay in registers and are stored once, the columns' weights
//! stay in the L1 cache, and each line of input is read from memory once for the batch (the
//! same line serves every spectrum whose window covers it, one after another).
//!
//! The weights come as [`pair_weights`] (each weight twice), so that a complex row is a plain
//! f32 row and the multiply-add needs no shuffles; the sums are a product then an add per tap,
//! in tap order from 0, exactly as `complex_pfb_fir` does them.
#![deny(unsafe_code)]

use num_complex::Complex32;

/// f32 columns (real and imaginary parts) summed together: four AVX-512 registers of
/// independent sums, one 64-byte cache line of each input row per register.
const LANES: usize = 64;

/// The PFB weights (`taps·fft_len`, `dsp::pfb::pfb_weights` with step `fft_len`) with each
/// weight written twice, once for the real and once for the imaginary part of the sample it
/// scales.
pub fn pair_weights(weights: &[f32]) -> Vec<f32> {
    weights.iter().flat_map(|&w| [w, w]).collect()
}

/// The FIR of several spectra of the complex DDC output `x`: spectrum i starts at DDC output
/// `spectra[i].0` and goes to frame slot `spectra[i].1`, that is
/// `frames[slot·fft_len ..][..fft_len]`, **overwritten** (slots distinct; other slots are left
/// alone). `pairs` is [`pair_weights`] of `taps·fft_len` weights; `x` must hold
/// `start + taps·fft_len` values for every start.
pub fn complex_pfb_firs(
    x: &[Complex32],
    pairs: &[f32],
    fft_len: usize,
    spectra: &[(usize, usize)],
    frames: &mut [Complex32],
) {
    let x: &[f32] = bytemuck::cast_slice(x);
    let frames: &mut [f32] = bytemuck::cast_slice_mut(frames);
    firs(x, pairs, 2 * fft_len, spectra, frames);
}

/// [`complex_pfb_firs`] on f32 rows of `row` values, in the widest vectors this CPU has.
#[allow(unsafe_code)]
fn firs(x: &[f32], pairs: &[f32], row: usize, spectra: &[(usize, usize)], frames: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature `firs_avx512` is compiled for (checked).
            unsafe { firs_avx512(x, pairs, row, spectra, frames) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the feature `firs_avx2` is compiled for (checked).
            unsafe { firs_avx2(x, pairs, row, spectra, frames) };
            return;
        }
    }
    firs_any(x, pairs, row, spectra, frames);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn firs_avx512(
    x: &[f32],
    pairs: &[f32],
    row: usize,
    spectra: &[(usize, usize)],
    frames: &mut [f32],
) {
    firs_any(x, pairs, row, spectra, frames);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn firs_avx2(x: &[f32], pairs: &[f32], row: usize, spectra: &[(usize, usize)], frames: &mut [f32]) {
    firs_any(x, pairs, row, spectra, frames);
}

/// [`LANES`] columns at a time, every spectrum, every tap, the sums in registers; then the
/// last columns one at a time. Each sum starts at zero and adds x·w tap by tap, as
/// `complex_pfb_fir` does.
#[inline(always)]
fn firs_any(x: &[f32], pairs: &[f32], row: usize, spectra: &[(usize, usize)], frames: &mut [f32]) {
    let taps = pairs.len() / row;
    let mut c = 0;
    while c + LANES <= row {
        for &(start, slot) in spectra {
            let mut acc = [0f32; LANES];
            for t in 0..taps {
                let xs: &[f32; LANES] = x[2 * start + t * row + c..][..LANES].try_into().unwrap();
                let ws: &[f32; LANES] = pairs[t * row + c..][..LANES].try_into().unwrap();
                for i in 0..LANES {
                    acc[i] += xs[i] * ws[i];
                }
            }
            frames[slot * row + c..][..LANES].copy_from_slice(&acc);
        }
        c += LANES;
    }
    for c in c..row {
        for &(start, slot) in spectra {
            let mut acc = 0f32;
            for t in 0..taps {
                acc += x[2 * start + t * row + c] * pairs[t * row + c];
            }
            frames[slot * row + c] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::ddc::complex_pfb_fir;
    use crate::dsp::pfb::{pfb_weights, Window};

    /// Every spectrum's frame bit for bit as the one-spectrum FIR gives it, for starts in any
    /// order, overlapping or not, and a length that is not a whole number of column blocks;
    /// slots not named are left alone.
    #[test]
    fn equals_one_spectrum_at_a_time_bit_for_bit() {
        let (m, taps) = (3 * LANES + 10, 5);
        let w = pfb_weights(m, taps, 1.0, Window::Hann);
        let x: Vec<Complex32> = (0..m * (taps + 4))
            .map(|i| Complex32::new((i % 201) as f32 - 100.0, (i % 77) as f32 * 0.3))
            .collect();
        let spectra = [(3 * m, 0), (0, 3), (m, 1), (m + 17, 4)];
        let untouched = Complex32::new(9.0, 9.0);
        let mut frames = vec![untouched; 6 * m];
        complex_pfb_firs(&x, &pair_weights(&w), m, &spectra, &mut frames);
        let mut want = vec![Complex32::default(); m];
        for &(start, slot) in &spectra {
            complex_pfb_fir(&x, &w, m, start, &mut want);
            assert!(frames[slot * m..(slot + 1) * m] == want[..], "slot {slot}");
        }
        for slot in [2, 5] {
            assert!(frames[slot * m..(slot + 1) * m]
                .iter()
                .all(|&v| v == untouched));
        }
    }
}
