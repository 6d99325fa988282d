//! The polyphase filter bank front end and the channelising FFT (seed 000 §Polyphase Filter
//! Bank, §FFT, §Digitiser sample statistics).
//!
//! With `step = 2·channels` samples per spectrum and `taps` taps, spectrum `s` starting at input
//! sample `o_s` is
//!
//! ```text
//! y_s[i]  = Σ_{t < taps} w[t·step + i] · x[o_s + t·step + i]          0 ≤ i < step
//! X_s[k]  = Σ_{i < step} y_s[i] · e^{−2πj·i·k/step}                   0 ≤ k < channels
//! P_s     = Σ_{i < step} x[o_s + (taps−1)·step + i]²                  (int64)
//! ```
//!
//! The FFT phase is referenced to the first sample of the window (fengine_delay_convention.md
//! §2); the Nyquist bin is dropped; `P_s` counts the last `step` samples of each window so that,
//! with consecutive spectra, every input sample is counted exactly once. Coarse delay is simply
//! a different `o_s` per spectrum.
#![deny(unsafe_code)]

use std::sync::Arc;

use num_complex::Complex32;
use realfft::{RealFftPlanner, RealToComplex};

/// PFB window function (katgpucbf `--wideband window_function=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// sin²(π·i/(L−1)) over the L = taps·step samples of the filter.
    Hann,
    Rect,
}

/// The PFB prototype filter, katgpucbf's `generate_pfb_weights` re-derived from facts §1.3:
/// window × sinc(w_cutoff·((i + ½)/step − taps/2)), normalised so that Σw² = 1, computed in
/// f64 and rounded to f32 once. `taps = 1, w_cutoff = 0, Rect` gives a plain DFT
/// (all weights 1/√step). Returns `taps·step` weights, tap-major (`w[t·step + i]`).
pub fn pfb_weights(step: usize, taps: usize, w_cutoff: f64, window: Window) -> Vec<f32> {
    let len = step * taps;
    let w: Vec<f64> = (0..len)
        .map(|i| {
            let win = match window {
                Window::Hann if len > 1 => (std::f64::consts::PI * i as f64 / (len - 1) as f64)
                    .sin()
                    .powi(2),
                Window::Hann | Window::Rect => 1.0,
            };
            win * sinc(w_cutoff * ((i as f64 + 0.5) / step as f64 - taps as f64 / 2.0))
        })
        .collect();
    let norm = w.iter().map(|v| v * v).sum::<f64>().sqrt();
    w.iter().map(|v| (v / norm) as f32).collect()
}

/// The normalised sinc, sin(πx)/(πx), as numpy's `np.sinc`.
pub fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let px = std::f64::consts::PI * x;
        px.sin() / px
    }
}

/// The PFB FIR for several spectra (the oracle of the GPU's fused decode + FIR).
///
/// - `x`: decoded input samples (i32, any width up to 16 bits), indexed by sample.
/// - `weights`: `taps·step` f32 from [`pfb_weights`].
/// - `starts[s]`: first input sample of spectrum `s` (its window is `starts[s] .. + taps·step`,
///   which must lie inside `x`).
/// - `out`: `starts.len() × step` f32, spectrum-major; **overwritten**.
/// - returns the digitiser power `P_s` of each spectrum (int64).
///
/// Arithmetic is f32 fused multiply-adds in tap order from 0 (one rounding per tap), as the
/// GPU kernel does them (half the floating-point instructions of a separate multiply and add,
/// which bound the kernel), so the two agree bit for bit; the tests compare it with an f64
/// direct sum (rtol 1e-5, katgpucbf's PFB tolerance).
pub fn pfb_fir(
    x: &[i32],
    weights: &[f32],
    step: usize,
    starts: &[usize],
    out: &mut [f32],
) -> Vec<i64> {
    let taps = weights.len() / step;
    assert_eq!(
        weights.len(),
        taps * step,
        "weights must hold taps·step values"
    );
    assert_eq!(
        out.len(),
        starts.len() * step,
        "out must hold one step per spectrum"
    );
    let mut power = Vec::with_capacity(starts.len());
    for (s, &o) in starts.iter().enumerate() {
        let window = &x[o..o + taps * step];
        let y = &mut out[s * step..(s + 1) * step];
        y.fill(0.0);
        for t in 0..taps {
            fma_row(
                y,
                &weights[t * step..(t + 1) * step],
                &window[t * step..(t + 1) * step],
            );
        }
        let last = &window[(taps - 1) * step..];
        power.push(last.iter().map(|&v| i64::from(v) * i64::from(v)).sum());
    }
    power
}

/// y[i] = fma(w[i], x[i], y[i]): with the CPU's FMA instructions where it has them (the same
/// correctly rounded result, vectorised), else through `f32::mul_add` (libm's `fmaf`).
#[allow(unsafe_code)]
fn fma_row(y: &mut [f32], w: &[f32], x: &[i32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the features `fma_row_x86` is compiled for (checked above).
        unsafe { fma_row_x86(y, w, x) };
        return;
    }
    fma_row_any(y, w, x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
fn fma_row_x86(y: &mut [f32], w: &[f32], x: &[i32]) {
    fma_row_any(y, w, x);
}

#[inline(always)]
fn fma_row_any(y: &mut [f32], w: &[f32], x: &[i32]) {
    for ((acc, &w), &v) in y.iter_mut().zip(w).zip(x) {
        *acc = w.mul_add(v as f32, *acc);
    }
}

/// Copy the head of the next chunk (`next`, packed samples) into the tail of `chunk`, whose
/// first `body_bytes` hold this chunk's own samples (seed 000 §Polyphase Filter Bank: "copy the
/// start of the next chunk to the end of the current one"). The tail must cover the PFB
/// footprint (taps·step samples) plus the largest differential coarse delay
/// (`--max-delay-diff`); presence flags of the copied heaps travel with it (the caller ANDs
/// them in, `dsp::presence`).
pub fn extend_tail(chunk: &mut [u8], body_bytes: usize, next: &[u8]) {
    let tail = &mut chunk[body_bytes..];
    let n = tail.len().min(next.len());
    tail[..n].copy_from_slice(&next[..n]);
}

/// The channelising FFT: a real-to-complex transform of each `step`-sample spectrum, keeping
/// bins `0 .. step/2` (the Nyquist bin is dropped). Plan once, run many times.
pub struct ChannelFft {
    step: usize,
    plan: Arc<dyn RealToComplex<f32>>,
    scratch: Vec<Complex32>,
    input: Vec<f32>,
    spectrum: Vec<Complex32>,
}

impl ChannelFft {
    /// `step` = 2·channels, even.
    pub fn new(step: usize) -> ChannelFft {
        let plan = RealFftPlanner::<f32>::new().plan_fft_forward(step);
        ChannelFft {
            step,
            scratch: plan.make_scratch_vec(),
            input: plan.make_input_vec(),
            spectrum: plan.make_output_vec(),
            plan,
        }
    }

    /// `frames`: `n × step` f32 (PFB output, spectrum-major). `out`: `n × step/2` complex,
    /// spectrum-major, channel-minor; **overwritten**. Unnormalised (numpy's `rfft`).
    pub fn run(&mut self, frames: &[f32], out: &mut [Complex32]) {
        let channels = self.step / 2;
        assert_eq!(frames.len() % self.step, 0);
        assert_eq!(out.len(), frames.len() / self.step * channels);
        for (frame, dst) in frames
            .chunks_exact(self.step)
            .zip(out.chunks_exact_mut(channels))
        {
            self.input.copy_from_slice(frame);
            // Cannot fail: the buffers were made by the plan itself.
            let _ = self.plan.process_with_scratch(
                &mut self.input,
                &mut self.spectrum,
                &mut self.scratch,
            );
            dst.copy_from_slice(&self.spectrum[..channels]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    fn random_samples(n: usize, bits: u32, seed: u64) -> Vec<i32> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let lim = 1i32 << (bits - 1);
        (0..n).map(|_| rng.random_range(-lim + 1..lim)).collect()
    }

    #[test]
    fn plain_dft_when_one_rect_tap() {
        let w = pfb_weights(16, 1, 0.0, Window::Rect);
        assert!(w.iter().all(|&v| (v - 0.25).abs() < 1e-7));
    }

    #[test]
    fn weights_are_normalised_and_symmetric() {
        for (step, taps, cut, win) in [
            (64, 16, 1.0, Window::Hann),
            (32, 4, 0.9, Window::Rect),
            (8, 3, 1.0, Window::Hann),
        ] {
            let w = pfb_weights(step, taps, cut, win);
            let ss: f64 = w.iter().map(|&v| f64::from(v).powi(2)).sum();
            assert!((ss - 1.0).abs() < 1e-6, "{ss}");
            // sinc is symmetric about (L−1)/2 only approximately (the +½): check the peak sits
            // in the middle tap, where the channel response is formed.
            let peak = w
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0;
            assert_eq!(peak / step, taps / 2, "{step} {taps}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The FIR against a direct sum in f64, with a different start (coarse delay) per spectrum.
        #[test]
        fn fir_matches_f64_direct_sum(taps in 1usize..6, log_step in 2u32..7, bits in prop::sample::select(vec![2u32, 8, 10, 12, 16]), seed in any::<u64>()) {
            let step = 1usize << log_step;
            let w = pfb_weights(step, taps, 1.0, Window::Hann);
            let x = random_samples(step * (taps + 8), bits, seed);
            let starts = [0, step, 2 * step + 1, 3 * step - 2, 5 * step];
            let mut out = vec![0.0f32; starts.len() * step];
            let power = pfb_fir(&x, &w, step, &starts, &mut out);
            let scale = f64::from(1i32 << (bits - 1));
            for (s, &o) in starts.iter().enumerate() {
                for i in 0..step {
                    let want: f64 = (0..taps).map(|t| f64::from(w[t * step + i]) * f64::from(x[o + t * step + i])).sum();
                    // katgpucbf's test: rtol 1e-5, atol 1e-6·2^bits.
                    let got = f64::from(out[s * step + i]);
                    prop_assert!((got - want).abs() <= 1e-5 * want.abs() + 1e-6 * 2.0 * scale, "{got} vs {want}");
                }
                let p: i64 = x[o + (taps - 1) * step..o + taps * step].iter().map(|&v| i64::from(v).pow(2)).sum();
                prop_assert_eq!(power[s], p);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Linearity of the channeliser: ch(a·x + b·y) = a·ch(x) + b·ch(y) (within f32).
        #[test]
        fn channeliser_is_linear(seed in any::<u64>(), a in -3i32..4, b in -3i32..4) {
            let (step, taps) = (64usize, 4usize);
            let w = pfb_weights(step, taps, 1.0, Window::Hann);
            let x = random_samples(step * taps, 8, seed);
            let y = random_samples(step * taps, 8, seed ^ 7);
            let z: Vec<i32> = x.iter().zip(&y).map(|(&p, &q)| a * p + b * q).collect();
            let run = |v: &[i32]| {
                let mut f = vec![0.0; step];
                pfb_fir(v, &w, step, &[0], &mut f);
                let mut o = vec![Complex32::default(); step / 2];
                ChannelFft::new(step).run(&f, &mut o);
                o
            };
            let (cx, cy, cz) = (run(&x), run(&y), run(&z));
            let peak = cz.iter().map(|c| c.norm()).fold(1.0f32, f32::max);
            for k in 0..step / 2 {
                let lin = cx[k] * a as f32 + cy[k] * b as f32;
                prop_assert!((cz[k] - lin).norm() <= 1e-5 * peak * 8.0, "k{}: {} vs {}", k, cz[k], lin);
            }
        }
    }

    /// A PFB window that crosses a chunk boundary: with the head of the next chunk copied to
    /// the tail of this one ([`super::extend_tail`]), spectra near the end of the chunk equal
    /// those computed on the continuous stream.
    #[test]
    fn footprint_across_chunk_boundary() {
        use crate::dsp::samples::{pack, packed_len, unpack};
        let (step, taps, bits) = (32usize, 4usize, 10u32);
        let chunk = 8 * step; // samples per chunk
        let tail = taps * step + 8; // PFB footprint plus a differential coarse delay of 8
        let stream = random_samples(3 * chunk, bits, 21);
        let mut packed = vec![0u8; packed_len(stream.len(), bits)];
        pack(&stream, bits, &mut packed);
        let cb = packed_len(chunk, bits);
        // Chunk 1 with its tail filled from chunk 2.
        let mut chunk1 = vec![0u8; packed_len(chunk + tail, bits)];
        chunk1[..cb].copy_from_slice(&packed[cb..2 * cb]);
        super::extend_tail(&mut chunk1, cb, &packed[2 * cb..3 * cb]);
        let mut local = vec![0i32; chunk + tail];
        unpack(&chunk1, bits, &mut local);
        let w = pfb_weights(step, taps, 1.0, Window::Hann);
        // Spectra starting in the last step of chunk 1, and one pushed 8 samples past its end
        // by the differential coarse delay: every window reaches into the copied tail.
        let starts: Vec<usize> = vec![chunk - step, chunk - step + 3, chunk + 7];
        let mut a = vec![0.0; starts.len() * step];
        let pa = pfb_fir(&local, &w, step, &starts, &mut a);
        let global: Vec<usize> = starts.iter().map(|s| s + chunk).collect();
        let mut b = vec![0.0; starts.len() * step];
        let pb = pfb_fir(&stream, &w, step, &global, &mut b);
        assert_eq!(a, b);
        assert_eq!(pa, pb);
    }

    /// With one rect tap the filter bank is a plain DFT: compare with the definition in f64.
    #[test]
    fn single_tap_rect_is_the_dft() {
        let step = 64;
        let x = random_samples(step * 3, 10, 9);
        let w = pfb_weights(step, 1, 0.0, Window::Rect);
        let starts = [0, 17, 128];
        let mut frames = vec![0.0; starts.len() * step];
        pfb_fir(&x, &w, step, &starts, &mut frames);
        let mut out = vec![Complex32::default(); starts.len() * step / 2];
        ChannelFft::new(step).run(&frames, &mut out);
        for (s, &o) in starts.iter().enumerate() {
            for k in 0..step / 2 {
                let (mut re, mut im) = (0.0f64, 0.0f64);
                for i in 0..step {
                    let a = -2.0 * std::f64::consts::PI * (i * k) as f64 / step as f64;
                    re += f64::from(x[o + i]) * a.cos();
                    im += f64::from(x[o + i]) * a.sin();
                }
                let norm = (step as f64).sqrt(); // the weights are 1/√step
                let got = out[s * step / 2 + k];
                assert!(
                    (f64::from(got.re) - re / norm).abs() < 1e-3
                        && (f64::from(got.im) - im / norm).abs() < 1e-3,
                    "s{s} k{k}: {got} vs {} {}",
                    re / norm,
                    im / norm
                );
            }
        }
    }

    /// Parseval for one rect tap: Σ|X_k|² over all bins (the dropped Nyquist bin and the
    /// mirrored half restored) equals step·Σy².
    #[test]
    fn parseval() {
        let step = 128;
        let x = random_samples(step, 8, 3);
        let y: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let mut plan = ChannelFft::new(step);
        let mut out = vec![Complex32::default(); step / 2];
        plan.run(&y, &mut out);
        let nyquist: f64 = y
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if i % 2 == 0 {
                    f64::from(v)
                } else {
                    -f64::from(v)
                }
            })
            .sum();
        let spectral = f64::from(out[0].norm_sqr())
            + 2.0
                * out[1..]
                    .iter()
                    .map(|c| f64::from(c.norm_sqr()))
                    .sum::<f64>()
            + nyquist * nyquist;
        let temporal = step as f64 * y.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
        assert!(
            (spectral / temporal - 1.0).abs() < 1e-5,
            "{spectral} vs {temporal}"
        );
    }

    /// A tone at a channel centre lands in that channel with the amplitude the normalisation
    /// predicts, and leaks less than −53 dB two channels away (16 taps, Hann).
    #[test]
    fn tone_at_channel_centre() {
        let (channels, taps) = (256usize, 16usize);
        let step = 2 * channels;
        let w = pfb_weights(step, taps, 1.0, Window::Hann);
        let k0 = 37usize;
        let amp = 1000.0;
        let n = step * (taps + 4);
        let x: Vec<i32> = (0..n)
            .map(|t| {
                (amp * (2.0 * std::f64::consts::PI * (k0 * t) as f64 / step as f64).cos()).round()
                    as i32
            })
            .collect();
        let starts: Vec<usize> = (0..4).map(|s| s * step).collect();
        let mut frames = vec![0.0; starts.len() * step];
        pfb_fir(&x, &w, step, &starts, &mut frames);
        let mut out = vec![Complex32::default(); starts.len() * channels];
        ChannelFft::new(step).run(&frames, &mut out);
        // A tone a·cos at bin k0 gives |X| = a/2 · Σ_t Σ_i w[t·step+i] (the window's DC gain).
        let gain: f64 = w.iter().map(|&v| f64::from(v)).sum();
        let expect = amp / 2.0 * gain;
        for s in 0..starts.len() {
            let spec = &out[s * channels..(s + 1) * channels];
            let peak = f64::from(spec[k0].norm());
            assert!((peak / expect - 1.0).abs() < 1e-3, "{peak} vs {expect}");
            for k in (0..channels).filter(|k| k.abs_diff(k0) >= 2) {
                let db = 20.0 * (f64::from(spec[k].norm()) / peak).log10();
                assert!(db < -53.0, "channel {k}: {db:.1} dB");
            }
        }
    }
}
