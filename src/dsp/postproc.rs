//! F-engine post-processing after the channelising FFT (seed 000 §Postprocessing;
//! `../shared/reference/fengine_delay_convention.md` §3, §6): fine delay, phase and complex
//! gain, dither, saturating quantisation with clip counts, and the partial transpose to the F
//! heap layout (channel, spectrum, pol, re/im).
//!
//! For channel k of a spectrum with coarse delay c, fine delay δ and phase φ:
//!
//! ```text
//! θ_k = −π·δ·(k − N/2)/N + φ + (π/2)·(c mod 4)
//! Y_k = g_k · e^{jθ_k} · X_k
//! q   = round_half_even(clamp(Y + u, −qmax, qmax)),  u ~ U(−½, ½) per part (if dithered)
//! ```
//!
//! The slope pivots on the centre channel N/2, and the (π/2)(c mod 4) term makes the net phase
//! at the centre channel exactly φ however the delay splits into coarse and fine.
//!
//! Narrowband ([`PhaseConvention::Narrowband`], convention §3) differs in three ways: output
//! channel j is the signed FFT index j − N/2 (the mixer puts the centre at DC), the fine delay
//! (in digitiser samples, and up to about S/2 since the coarse delay is a multiple of the
//! subsampling S) is divided by the decimation, as the band is that much narrower, and there
//! is no π/2 term (a coarse shift moves the mixed-down centre frequency, DC, by nothing):
//!
//! ```text
//! θ_j = −π·(δ/decimation)·(j − N/2)/N + φ
//! ```
//!
//! katgpucbf writes the same slope as −π·(δ/D_int)·k/M over the M-point FFT with internal
//! decimation D_int; M·D_int = N·decimation in both modes. qmax is 127
//! for 8-bit output and 7 for 4-bit, so −128 (−8) is never produced. A complex value counts as
//! clipped once if either part lay outside [−qmax, qmax].
#![deny(unsafe_code)]

use std::f64::consts::PI;

use num_complex::{Complex32, Complex64};

use super::random::{dither_pair16, hash32, mix};

/// The delay terms of one spectrum of one polarisation (from `dsp::delay`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SpectrumDelay {
    pub coarse: i64,
    pub fine: f64,
    pub phase: f64,
}

/// Which output the phase terms are for (module doc: wideband or narrowband θ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseConvention {
    Wideband,
    Narrowband { decimation: usize },
}

impl PhaseConvention {
    /// (slope's fine delay, phase added to every channel) of one spectrum.
    pub fn terms(self, d: &SpectrumDelay) -> (f64, f64) {
        match self {
            PhaseConvention::Wideband => {
                (d.fine, d.phase + PI / 2.0 * d.coarse.rem_euclid(4) as f64)
            }
            PhaseConvention::Narrowband { decimation } => (d.fine / decimation as f64, d.phase),
        }
    }
}

/// θ_k for all channels, in f64 (the oracle; a GPU uses sincospi in f32).
pub fn phase_slope(
    convention: PhaseConvention,
    channels: usize,
    d: &SpectrumDelay,
) -> impl Iterator<Item = f64> {
    let n = channels as f64;
    let (fine, fixed) = convention.terms(d);
    (0..channels).map(move |k| -PI * fine * (k as f64 - n / 2.0) / n + fixed)
}

/// Y_k = g_k·e^{jθ_k}·X_k for one wideband spectrum ([`correct_as`]).
pub fn correct(x: &[Complex32], gains: &[Complex32], d: &SpectrumDelay, out: &mut [Complex32]) {
    correct_as(PhaseConvention::Wideband, x, gains, d, out);
}

/// Y_k = g_k·e^{jθ_k}·X_k for one spectrum: `x`, `gains`, `out` are `channels` long; `out` is
/// overwritten. θ_k is linear in k, so e^{jθ_k} is formed by a complex recurrence in f64
/// (one sin/cos pair per spectrum; the rounding drift over 32768 channels is ~1e-12 rad).
pub fn correct_as(
    convention: PhaseConvention,
    x: &[Complex32],
    gains: &[Complex32],
    d: &SpectrumDelay,
    out: &mut [Complex32],
) {
    let mut thetas = phase_slope(convention, x.len(), d);
    let Some(theta0) = thetas.next() else { return };
    let mut rot = Complex64::from_polar(1.0, theta0);
    let step = Complex64::from_polar(1.0, -PI * convention.terms(d).0 / x.len() as f64);
    for ((o, &xk), &g) in out.iter_mut().zip(x).zip(gains) {
        *o = g * Complex32::new(rot.re as f32, rot.im as f32) * xk;
        rot *= step;
    }
}

/// Output sample width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputBits {
    Eight,
    /// Packed two's complement nibbles, real in the high nibble, imaginary in the low.
    Four,
}

impl OutputBits {
    pub fn qmax(self) -> f32 {
        match self {
            OutputBits::Eight => 127.0,
            OutputBits::Four => 7.0,
        }
    }
}

/// Saturating quantisation of one part with dither `u`: (value, clipped).
#[inline]
pub fn quantise(v: f32, u: f32, qmax: f32) -> (i8, bool) {
    let x = v + u;
    let clipped = !(-qmax..=qmax).contains(&x);
    (round_ties_even(x.clamp(-qmax, qmax)) as i8, clipped)
}

/// Round to nearest, ties to even, for |x| < 2²²: adding and removing 1.5·2²³ leaves the
/// integer part in the mantissa's last place under IEEE round-to-nearest-even, which is exactly
/// the rounding wanted. `f32::round_ties_even` is a libm call on baseline x86-64 (no SSE4.1
/// `roundss`) and cost a third of the post-processing time.
#[inline]
fn round_ties_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// The dither of the (real, imaginary) parts for (seed, spectrum timestamp, channel, pol): a
/// pure function, so a GPU produces the same values. A 32-bit key per (spectrum, pol) comes
/// from the 64-bit [`mix`] (a GPU computes it once per spectrum); each channel then costs one
/// [`hash32`] of key + channel·⌊2³²/φ⌋. Two keys that collide (chance 2⁻³² for a pair of
/// spectra) repeat a dither sequence, and two that differ by a multiple of the channel step
/// share values at *different* channels, which a correlator never multiplies together.
#[inline]
pub fn dither(seed: u64, timestamp: i64, channel: usize, pol: usize) -> (f32, f32) {
    dither_at(dither_key(seed, timestamp, pol), channel)
}

/// [`dither`] from its (spectrum, pol) key, for loops that hold the key.
#[inline]
pub fn dither_at(key: u32, channel: usize) -> (f32, f32) {
    dither_pair16(hash32(
        key.wrapping_add((channel as u32).wrapping_mul(0x9e37_79b9)),
    ))
}

/// The (spectrum, pol) half of [`dither`]'s key.
#[inline]
pub fn dither_key(seed: u64, timestamp: i64, pol: usize) -> u32 {
    let stream = ((timestamp as u64) << 1) | pol as u64;
    (mix(seed, stream, 0) >> 32) as u32
}

/// One F heap's worth of post-processing.
pub struct HeapInput<'a> {
    /// Per pol: `spectra × channels` FFT output, spectrum-major.
    pub spectra: [&'a [Complex32]; 2],
    /// Per pol: `channels` complex gains.
    pub gains: [&'a [Complex32]; 2],
    /// Per pol: one [`SpectrumDelay`] per spectrum.
    pub delays: [&'a [SpectrumDelay]; 2],
    /// Timestamp of each spectrum (dither key).
    pub timestamps: &'a [i64],
    /// Dither seed, or no dither.
    pub dither: Option<u64>,
}

/// [`postproc_heap_as`] for a wideband output.
pub fn postproc_heap(
    input: &HeapInput<'_>,
    channels: usize,
    bits: OutputBits,
    out: &mut [i8],
) -> [u64; 2] {
    postproc_heap_as(PhaseConvention::Wideband, input, channels, bits, out)
}

/// Correct, dither, quantise and transpose one heap. `out` is `channels × spectra × 2 pols × 2`
/// int8 (re, im), channel-major, **overwritten**, each value within ±qmax of `bits` (for
/// 4-bit output, [`pack_4bit`] then packs the pairs). Returns the clipped-value count per pol.
pub fn postproc_heap_as(
    convention: PhaseConvention,
    input: &HeapInput<'_>,
    channels: usize,
    bits: OutputBits,
    out: &mut [i8],
) -> [u64; 2] {
    let n_spectra = input.timestamps.len();
    assert_eq!(out.len(), channels * n_spectra * 4);
    let qmax = bits.qmax();
    let mut clips = [0u64; 2];
    let mut y = vec![Complex32::default(); channels];
    for (pol, clipped) in clips.iter_mut().enumerate() {
        for (s, &ts) in input.timestamps.iter().enumerate() {
            let x = &input.spectra[pol][s * channels..(s + 1) * channels];
            correct_as(
                convention,
                x,
                input.gains[pol],
                &input.delays[pol][s],
                &mut y,
            );
            let key = input.dither.map(|seed| dither_key(seed, ts, pol));
            for (k, v) in y.iter().enumerate() {
                let (u0, u1) = key.map_or((0.0, 0.0), |key| dither_at(key, k));
                let (re, c0) = quantise(v.re, u0, qmax);
                let (im, c1) = quantise(v.im, u1, qmax);
                let at = ((k * n_spectra + s) * 2 + pol) * 2;
                out[at] = re;
                out[at + 1] = im;
                *clipped += u64::from(c0 || c1);
            }
        }
    }
    clips
}

/// Pack (re, im) pairs already quantised to ±7 into bytes, real in the high nibble.
pub fn pack_4bit(pairs: &[i8], out: &mut [u8]) {
    for (o, p) in out.iter_mut().zip(pairs.chunks_exact(2)) {
        *o = ((p[0] as u8) << 4) | (p[1] as u8 & 0x0f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::delay::LinearDelayModel;
    use crate::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft, Window};

    #[test]
    fn quantiser_rounds_ties_to_even_and_saturates_symmetrically() {
        assert_eq!(quantise(0.5, 0.0, 127.0), (0, false));
        assert_eq!(quantise(1.5, 0.0, 127.0), (2, false));
        assert_eq!(quantise(-2.5, 0.0, 127.0), (-2, false));
        assert_eq!(quantise(127.4, 0.0, 127.0), (127, true));
        assert_eq!(quantise(-1000.0, 0.0, 127.0), (-127, true));
        assert_eq!(quantise(-7.6, 0.0, 7.0), (-7, true));
        assert_eq!(quantise(126.8, 0.3, 127.0), (127, true));
    }

    #[test]
    fn fast_rounding_matches_the_standard_library() {
        for i in -40_000..40_000 {
            let x = i as f32 * 0.003_906_25; // includes every half-integer in ±156
            assert_eq!(round_ties_even(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn dithered_values_stay_within_one_lsb() {
        for i in 0..10_000 {
            let v = (i as f32 - 5000.0) * 0.0123;
            let u = dither(99, i, 5, i as usize % 2).0;
            let (q, _) = quantise(v, u, 127.0);
            assert!((f32::from(q) - v).abs() <= 1.0, "{v} → {q}");
        }
    }

    #[test]
    fn four_bit_packing() {
        let mut out = [0u8; 2];
        pack_4bit(&[-7, 7, 3, -1], &mut out);
        assert_eq!(out, [0x97, 0x3f]);
    }

    #[test]
    fn four_bit_heaps_saturate_at_seven() {
        let x = [Complex32::new(6.6, -9.0), Complex32::new(-2.5, 0.4)];
        let g = [Complex32::new(1.0, 0.0); 2];
        let d = [SpectrumDelay::default()];
        let input = HeapInput {
            spectra: [&x, &x],
            gains: [&g, &g],
            delays: [&d, &d],
            timestamps: &[0],
            dither: None,
        };
        let mut out = vec![0i8; 2 * 4];
        let clips = postproc_heap(&input, 2, OutputBits::Four, &mut out);
        assert_eq!(&out[..4], &[7, -7, 7, -7]);
        assert_eq!(&out[4..], &[-2, 0, -2, 0]);
        assert_eq!(clips, [1, 1]);
    }

    /// The heap layout is (channel, spectrum, pol, re/im), and gains act before quantisation.
    #[test]
    fn transpose_layout_and_gain() {
        let (channels, spectra) = (4, 3);
        let x: Vec<Complex32> = (0..channels * spectra)
            .map(|i| Complex32::new(i as f32, -(i as f32)))
            .collect();
        let g1 = vec![Complex32::new(1.0, 0.0); channels];
        let g2 = vec![Complex32::new(2.0, 0.0); channels];
        let d = vec![SpectrumDelay::default(); spectra];
        let input = HeapInput {
            spectra: [&x, &x],
            gains: [&g1, &g2],
            delays: [&d, &d],
            timestamps: &[0, 8, 16],
            dither: None,
        };
        let mut out = vec![0i8; channels * spectra * 4];
        let clips = postproc_heap(&input, channels, OutputBits::Eight, &mut out);
        assert_eq!(clips, [0, 0]);
        for k in 0..channels {
            for s in 0..spectra {
                let at = ((k * spectra + s) * 2) * 2;
                let v = (s * channels + k) as i8;
                assert_eq!(&out[at..at + 4], &[v, -v, 2 * v, -2 * v], "k{k} s{s}");
            }
        }
    }

    /// The convention's net effect (fengine_delay_convention.md §4): for a tone at the centre of
    /// channel k, arg Y_k(D, p) − arg Y_k(0, 0) = p − π·D·(k − N/2)/N, whatever D is.
    #[test]
    fn delay_and_phase_give_the_katgpucbf_phase_slope() {
        let (channels, taps) = (64usize, 4usize);
        let step = 2 * channels;
        let w = pfb_weights(step, taps, 1.0, Window::Hann);
        let tones = [3usize, 17, 32, 45, 60];
        let n_in = step * (taps + 200);
        let x: Vec<i32> = (0..n_in)
            .map(|t| {
                tones
                    .iter()
                    .map(|&k| 300.0 * (2.0 * PI * (k * t) as f64 / step as f64 + k as f64).cos())
                    .sum::<f64>()
                    .round() as i32
            })
            .collect();
        let gains = vec![Complex32::new(1.0, 0.0); channels];
        let mut fft = ChannelFft::new(step);
        let spectrum = |model: &LinearDelayModel, t: i64, fft: &mut ChannelFft| -> Vec<Complex32> {
            let (c, fine, phase) = model.at(t);
            let start = (t - c) as usize;
            let mut frame = vec![0.0; step];
            pfb_fir(&x, &w, step, &[start], &mut frame);
            let mut xk = vec![Complex32::default(); channels];
            fft.run(&frame, &mut xk);
            let mut y = vec![Complex32::default(); channels];
            correct(
                &xk,
                &gains,
                &SpectrumDelay {
                    coarse: c,
                    fine,
                    phase,
                },
                &mut y,
            );
            y
        };
        let t = (step * 100) as i64;
        let reference = spectrum(&LinearDelayModel::ZERO, t, &mut fft);
        for (d, p) in [
            (3.4, 0.3),
            (0.0, -1.0),
            (-42.0, 2.0),
            (2.5, 0.0),
            (8192.3, 1.5),
            (0.5, -3.0),
            (-3.6, 0.7),
        ] {
            let model = LinearDelayModel {
                delay: d,
                phase: p,
                ..LinearDelayModel::ZERO
            };
            let y = spectrum(&model, t, &mut fft);
            for &k in &tones {
                let got = f64::from((y[k] / reference[k]).arg());
                let want = p - PI * d * (k as f64 - channels as f64 / 2.0) / channels as f64;
                let err = crate::dsp::delay::wrap_angle(got - want);
                assert!(err.abs() < 2e-3, "D={d} p={p} k={k}: {got} vs {want}");
                assert!((y[k].norm() / reference[k].norm() - 1.0).abs() < 1e-3);
            }
        }
    }
}
