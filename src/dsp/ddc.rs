//! Narrowband digital down-conversion (seed 000 §Narrowband, seed 002): mixer, low-pass FIR and
//! subsampling in one step, the DDC filter design, and the narrowband channeliser (complex PFB
//! FIR, then a complex FFT whose channels around DC are kept, DC at the centre).
//!
//! With input x, real filter h of T taps, subsampling factor S and mixer frequency f (cycles
//! per digitiser sample), output b starting at absolute sample t₀ is (seed 000, DDC equation)
//!
//! ```text
//! y_b = Σ_{k<T} x[S·b + k] · h_k · e^{2πj·f·(t₀ + S·b + k)}
//!     = e^{2πj·f·(t₀ + S·b)} · Σ_{k<T} x[S·b + k] · z_k,     z_k = h_k · e^{2πj·f·k}
//! ```
//!
//! The mixer phase is a 32-bit fixed-point fraction of a cycle (seed 002 §Mixer signal): the
//! phase of sample t is `(step · t) mod 2³²` with `step = round(f · 2³²)`, so wrap-around drops
//! whole cycles only and the factorisation above is exact in the fixed-point phase.
#![deny(unsafe_code)]

use std::f64::consts::TAU;
use std::sync::Arc;

use num_complex::{Complex32, Complex64};
use pm_remez::{constant, pm_parameters, pm_remez, BandSetting, ParametersBuilder};
use rustfft::{Fft, FftPlanner};

/// Why a DDC filter cannot be designed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DdcError {
    #[error("subsampling factor {0} must be at least 2")]
    Subsampling(usize),
    #[error("pass_fraction {0} must be in (0, 1)")]
    PassFraction(f64),
    #[error("filter design failed: {0}")]
    Design(String),
}

/// The fixed-point mixer step for `frequency` cycles per sample (any real; taken mod 1).
pub fn mixer_step(frequency: f64) -> u32 {
    ((frequency.rem_euclid(1.0) * 4_294_967_296.0).round() as u64 & 0xffff_ffff) as u32
}

/// The mixer phase of absolute sample `t`, in 2⁻³² cycles.
#[inline]
pub fn mixer_phase(step: u32, t: u64) -> u32 {
    step.wrapping_mul(t as u32)
}

/// e^{2πj·phase/2³²}.
#[inline]
pub fn cis(phase: u32) -> Complex64 {
    Complex64::from_polar(1.0, TAU * f64::from(phase) / 4_294_967_296.0)
}

fn remez(
    taps: usize,
    bands: &[(f64, f64, f64, f64)],
    subsampling: usize,
) -> Result<Vec<f32>, DdcError> {
    // scipy's band edges are in units of fs = subsampling; pm-remez's are cycles per sample.
    let s = subsampling as f64;
    let settings = bands
        .iter()
        .map(|&(lo, hi, want, weight)| {
            BandSetting::with_weight(lo / s, hi / s, constant(want), constant(weight))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DdcError::Design(e.to_string()))?;
    let mut params = pm_parameters(taps, &settings).map_err(|e| DdcError::Design(e.to_string()))?;
    params.set_max_iterations(1000);
    let design = pm_remez(&params).map_err(|e| DdcError::Design(e.to_string()))?;
    // Gain 1 after subsampling (katgpucbf normalises by √S).
    Ok(design
        .impulse_response
        .iter()
        .map(|&v: &f64| (v * s.sqrt()) as f32)
        .collect())
}

/// Discard-mode filter (katgpucbf `_generate_ddc_weights_discard`): flat over the inner half
/// of the retained band ([0, ¼] in units of the subsampled rate), zero over every band that
/// aliases into it ([x, x + ½] for x = ¾, 1¾, …), free elsewhere; passband weight `weight_pass`
/// against stopband weight 1.
pub fn ddc_weights_discard(
    taps: usize,
    subsampling: usize,
    weight_pass: f64,
) -> Result<Vec<f32>, DdcError> {
    if subsampling < 2 {
        return Err(DdcError::Subsampling(subsampling));
    }
    let half = 0.5 * subsampling as f64;
    let mut bands = vec![(0.0, 0.25, 1.0, weight_pass)];
    let mut x = 0.75;
    while x < half {
        bands.push((x, (x + 0.5).min(half), 0.0, 1.0));
        x += 1.0;
    }
    remez(taps, &bands, subsampling)
}

/// No-discard filter (katgpucbf `_generate_ddc_weights_no_discard`): flat over
/// `pass_fraction` of the subsampled band, zero from 1 − pass_fraction/2 up.
pub fn ddc_weights_no_discard(
    taps: usize,
    subsampling: usize,
    pass_fraction: f64,
    weight_pass: f64,
) -> Result<Vec<f32>, DdcError> {
    if subsampling < 2 {
        return Err(DdcError::Subsampling(subsampling));
    }
    if !(pass_fraction > 0.0 && pass_fraction < 1.0) {
        return Err(DdcError::PassFraction(pass_fraction));
    }
    let half = 0.5 * subsampling as f64;
    remez(
        taps,
        &[
            (0.0, 0.5 * pass_fraction, 1.0, weight_pass),
            (1.0 - 0.5 * pass_fraction, half, 0.0, 1.0),
        ],
        subsampling,
    )
}

/// The DDC oracle. `x`: input samples, `x[0]` being absolute sample `t_first`; `weights`: T
/// real taps; `out`: `n` complex outputs, **overwritten**, needing
/// `x.len() ≥ S·(n − 1) + T`. f64 arithmetic throughout. The CPU backend runs
/// [`super::ddc_fast::FastDdc`], tested against this.
pub fn ddc(
    x: &[i32],
    weights: &[f32],
    subsampling: usize,
    step: u32,
    t_first: u64,
    out: &mut [Complex32],
) {
    let taps = weights.len();
    assert!(
        out.is_empty() || x.len() >= subsampling * (out.len() - 1) + taps,
        "input too short for the outputs"
    );
    let z: Vec<Complex64> = weights
        .iter()
        .enumerate()
        .map(|(k, &h)| cis(mixer_phase(step, k as u64)) * f64::from(h))
        .collect();
    for (b, y) in out.iter_mut().enumerate() {
        let base = subsampling * b;
        let acc: Complex64 = z
            .iter()
            .zip(&x[base..base + taps])
            .map(|(zk, &v)| zk * f64::from(v))
            .sum();
        let v = cis(mixer_phase(step, t_first + base as u64)) * acc;
        *y = Complex32::new(v.re as f32, v.im as f32);
    }
}

/// The narrowband PFB FIR of one spectrum after the DDC (seed 000 §Narrowband step 4): the
/// real weights `weights` (`taps·fft_len`, [`crate::dsp::pfb::pfb_weights`] with step
/// `fft_len`) applied to the complex subsampled signal, real and imaginary parts alike:
/// `frame[i] = Σ_{t<taps} weights[t·fft_len + i] · x[start + t·fft_len + i]`. `frame` is
/// `fft_len` long, **overwritten**; `x` must hold `start + taps·fft_len` samples.
pub fn complex_pfb_fir(
    x: &[Complex32],
    weights: &[f32],
    fft_len: usize,
    start: usize,
    frame: &mut [Complex32],
) {
    let taps = weights.len() / fft_len;
    frame.fill(Complex32::default());
    for t in 0..taps {
        let w = &weights[t * fft_len..(t + 1) * fft_len];
        let v = &x[start + t * fft_len..start + (t + 1) * fft_len];
        for ((f, &w), &v) in frame.iter_mut().zip(w).zip(v) {
            *f += v * w;
        }
    }
}

/// The narrowband channelising FFT: a complex FFT of `fft_len` points, of which the `channels`
/// around DC are kept with DC at the centre (seed 000 §Narrowband step 5; katgpucbf's
/// `wrap_index`): output channel j is FFT bin (j − channels/2) mod fft_len. Discard mode uses
/// `fft_len = 2·channels` (the outer half is dropped); no-discard uses `fft_len = channels`.
pub struct NarrowbandFft {
    fft_len: usize,
    channels: usize,
    plan: Arc<dyn Fft<f32>>,
    scratch: Vec<Complex32>,
}

impl NarrowbandFft {
    pub fn new(fft_len: usize, channels: usize) -> NarrowbandFft {
        assert!(channels <= fft_len && channels % 2 == 0);
        let plan = FftPlanner::new().plan_fft_forward(fft_len);
        NarrowbandFft {
            fft_len,
            channels,
            scratch: vec![Complex32::default(); plan.get_inplace_scratch_len()],
            plan,
        }
    }

    /// Transform `frame` (`fft_len` values, transformed in place) and write its `channels`
    /// output channels to `out` (**overwritten**).
    pub fn run(&mut self, frame: &mut [Complex32], out: &mut [Complex32]) {
        self.plan.process_with_scratch(frame, &mut self.scratch);
        let half = self.channels / 2;
        for (j, o) in out.iter_mut().enumerate().take(self.channels) {
            *o = frame[(j + self.fft_len - half) % self.fft_len];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::pfb::{pfb_weights, Window};

    #[test]
    fn fixed_point_mixer_wraps_whole_cycles_only() {
        let step = mixer_step(0.123_456_789);
        assert!((f64::from(step) / 4_294_967_296.0 - 0.123_456_789).abs() < 2.4e-10);
        for t in [0u64, 1, 12345, (1 << 32) - 1] {
            assert_eq!(mixer_phase(step, t), mixer_phase(step, t + (1 << 32)));
            assert_eq!(
                mixer_phase(step, t + 7),
                mixer_phase(step, t).wrapping_add(mixer_phase(step, 7))
            );
        }
        assert_eq!(mixer_step(-0.25), mixer_step(0.75));
        assert_eq!(mixer_step(1.0), 0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert_eq!(
            ddc_weights_discard(32, 1, 0.005),
            Err(DdcError::Subsampling(1))
        );
        assert_eq!(
            ddc_weights_no_discard(32, 4, 1.0, 0.005),
            Err(DdcError::PassFraction(1.0))
        );
    }

    /// A tone at a narrowband channel centre, mixed down and channelised, lands in that
    /// channel; discard mode keeps DC at channel N/2.
    #[test]
    fn tone_lands_in_its_narrowband_channel() {
        let (decimation, channels, taps) = (4usize, 64usize, 8usize);
        let subsampling = decimation; // discard mode
        let fft = 2 * channels;
        let h = ddc_weights_discard(16 * subsampling, subsampling, 0.005).unwrap();
        let centre = 0.3; // cycles per digitiser sample
                          // Narrowband channel spacing: 1/(S·fft) cycles per sample; tone 5 channels above centre.
        let tone = centre + 5.0 / (subsampling * fft) as f64;
        let n_out = fft * (taps + 2);
        let n_in = subsampling * (n_out - 1) + h.len();
        let x: Vec<i32> = (0..n_in)
            .map(|t| (400.0 * (TAU * tone * t as f64).cos()).round() as i32)
            .collect();
        let mut y = vec![Complex32::default(); n_out];
        ddc(&x, &h, subsampling, mixer_step(-centre), 0, &mut y);
        let w = pfb_weights(fft, taps, 1.0, Window::Hann);
        let mut frame = vec![Complex32::default(); fft];
        complex_pfb_fir(&y, &w, fft, 0, &mut frame);
        let mut out = vec![Complex32::default(); channels];
        NarrowbandFft::new(fft, channels).run(&mut frame, &mut out);
        let peak = out
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.norm().total_cmp(&b.1.norm()))
            .unwrap()
            .0;
        assert_eq!(peak, channels / 2 + 5);
    }
}
