//! The coherent beamformer oracle (seed 003; facts §1.4, §1.10).
//!
//! Input as for the correlator, **(antenna, channel, spectrum, pol, re/im)** int8. Each beam is
//! single-polarisation and has, per antenna, a complex weight `w_ab` (the CPU folds weight ×
//! quantisation gain × fringe phase into it) and a delay `d_ab` scaled so that the coefficient
//! for channel c (counted from this engine's first channel) is
//!
//! ```text
//! W_abc = w_ab · e^{jπ·c·d_ab}
//! y_b[c][t] = Σ_{a present} W_abc · x[a][c][t][pol_b]
//! ```
//!
//! then dithered (U(−½, ½) per part, counter-based: [`beam_dither`]) and quantised with
//! saturation to ±127,
//! counting clipped complex values per beam (once if either part clipped, as in `postproc`). Missing antennas are excluded and the number present is
//! returned (`beam_ants`). Output **(beam, channel, spectrum, re/im)** int8, overwritten.
#![deny(unsafe_code)]

use num_complex::Complex64;

use super::postproc::quantise;
use super::random::{dither_pair16, hash32, mix};

/// One single-polarisation beam.
#[derive(Debug, Clone, PartialEq)]
pub struct Beam {
    pub pol: usize,
    /// Per antenna: weight × quantisation gain × fringe, complex.
    pub weights: Vec<Complex64>,
    /// Per antenna: delay in units of the phase slope per channel / π.
    pub delays: Vec<f64>,
}

/// Shape of one beamformer batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeamShape {
    pub n_ants: usize,
    pub channels: usize,
    pub spectra: usize,
}

/// The dither of beam `beam`'s (real, imaginary) parts at (channel, spectrum timestamp): a pure
/// function, so a GPU produces the same bits. The same construction as the F-engine's
/// (`dsp::postproc::dither`) with the roles turned to suit a beamformer, which holds a channel
/// and runs over spectra: a 32-bit key per (beam, channel) from the 64-bit [`mix`]
/// ([`beam_dither_key`], once per beam and channel), then per value one [`hash32`] of key +
/// [`spectrum_word`]. Two 32-bit multiplies per complex value instead of the six 64-bit ones of
/// a [`mix`] per part, which made the dither the largest cost of the GPU kernel
/// (bench/xbengine-notes.md, v10).
///
/// Two beams whose keys differ by a multiple of the timestamp step share a sequence shifted by
/// (difference / step) spectra, typically 10⁵ or more: a correlation of two beams' outputs at
/// that lag, at one channel, in one case in 2¹³ for 8192-sample spectra. Beams are not
/// correlated against each other at such lags.
pub fn beam_dither(seed: u64, beam: usize, timestamp: i64, channel: usize) -> (f32, f32) {
    beam_dither_at(
        beam_dither_key(seed, beam, channel),
        spectrum_word(timestamp),
    )
}

/// [`beam_dither`] from its two halves, for loops that hold them.
#[inline]
pub fn beam_dither_at(key: u32, word: u32) -> (f32, f32) {
    dither_pair16(hash32(key.wrapping_add(word)))
}

/// The (beam, channel) half of [`beam_dither`]'s input: the top 32 bits of SplitMix64 keyed on
/// seed + beam (so that beams differ) over the channel.
#[inline]
pub fn beam_dither_key(seed: u64, beam: usize, channel: usize) -> u32 {
    (mix(seed.wrapping_add(beam as u64), channel as u64, 0) >> 32) as u32
}

/// The spectrum's half: the timestamp's low 32 bits plus its high 32 bits times ⌊2³²/φ⌋. Within
/// one span of 2³² samples distinct spectra give distinct words, hence distinct hash inputs;
/// across spans the sequence moves by an odd offset, which a power-of-two timestamp step never
/// matches, so the dither does not repeat with the 32-bit wrap of the timestamp.
#[inline]
pub fn spectrum_word(timestamp: i64) -> u32 {
    let t = timestamp as u64;
    (t as u32).wrapping_add(((t >> 32) as u32).wrapping_mul(0x9e37_79b9))
}

/// How close to the clip level a dithered value must be for rounding to decide whether it
/// clips: a GPU's sums (with weights rounded to 22 bits, taken to float) differ from these f64
/// sums by far less. A value that near ±127 is 127 either way, but only one side counts it clipped.
pub const CLIP_MARGIN: f32 = 1.0 / 64.0;

/// What [`beamform`] reports besides the samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formed {
    /// Per beam: complex values with a part clipped.
    pub clips: Vec<u64>,
    /// Per beam: complex values with a part within [`CLIP_MARGIN`] of the clip level, whose
    /// clip flag another implementation may rightly set the other way.
    pub near_clip: Vec<u64>,
    /// Antennas present.
    pub ants: usize,
}

/// Form every beam.
pub fn beamform(
    shape: BeamShape,
    x: &[i8],
    present: &[bool],
    beams: &[Beam],
    timestamps: &[i64],
    dither: Option<u64>,
    out: &mut [i8],
) -> Formed {
    let BeamShape {
        n_ants,
        channels,
        spectra,
    } = shape;
    assert_eq!(x.len(), n_ants * channels * spectra * 4);
    assert_eq!(present.len(), n_ants);
    assert_eq!(timestamps.len(), spectra);
    assert_eq!(out.len(), beams.len() * channels * spectra * 2);
    let mut clips = vec![0u64; beams.len()];
    let mut near_clip = vec![0u64; beams.len()];
    let near = |v: f32, u: f32| ((v + u).abs() - 127.0).abs() <= CLIP_MARGIN;
    for (b, beam) in beams.iter().enumerate() {
        for c in 0..channels {
            let coeff: Vec<Complex64> = (0..n_ants)
                .map(|a| {
                    beam.weights[a]
                        * Complex64::from_polar(
                            1.0,
                            std::f64::consts::PI * c as f64 * beam.delays[a],
                        )
                })
                .collect();
            for (t, &ts) in timestamps.iter().enumerate() {
                let mut acc = Complex64::new(0.0, 0.0);
                for a in (0..n_ants).filter(|&a| present[a]) {
                    let i = ((a * channels + c) * spectra + t) * 4 + beam.pol * 2;
                    acc += coeff[a] * Complex64::new(f64::from(x[i]), f64::from(x[i + 1]));
                }
                let (u0, u1) = dither.map_or((0.0, 0.0), |seed| beam_dither(seed, b, ts, c));
                let (v0, v1) = (acc.re as f32, acc.im as f32);
                let (re, c0) = quantise(v0, u0, 127.0);
                let (im, c1) = quantise(v1, u1, 127.0);
                let o = ((b * channels + c) * spectra + t) * 2;
                out[o] = re;
                out[o + 1] = im;
                clips[b] += u64::from(c0 || c1);
                near_clip[b] += u64::from(near(v0, u0) || near(v1, u1));
            }
        }
    }
    Formed {
        clips,
        near_clip,
        ants: present.iter().filter(|&&p| p).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_weights_sum_antennas_and_missing_ones_are_excluded() {
        let shape = BeamShape {
            n_ants: 3,
            channels: 2,
            spectra: 2,
        };
        let mut x = vec![0i8; 3 * 2 * 2 * 4];
        for a in 0..3 {
            for c in 0..2 {
                for t in 0..2 {
                    let i = ((a * 2 + c) * 2 + t) * 4;
                    x[i] = (a + 1) as i8 * 10; // pol 0 re
                    x[i + 3] = -(a as i8) - 1; // pol 1 im
                }
            }
        }
        let beam = |pol| Beam {
            pol,
            weights: vec![Complex64::new(1.0, 0.0); 3],
            delays: vec![0.0; 3],
        };
        let mut out = vec![0i8; 2 * 2 * 2 * 2];
        let Formed { clips, ants, .. } = beamform(
            shape,
            &x,
            &[true, false, true],
            &[beam(0), beam(1)],
            &[0, 1],
            None,
            &mut out,
        );
        assert_eq!(ants, 2);
        assert_eq!(clips, [0, 0]);
        assert_eq!(&out[..2], &[40, 0], "10 + 30, antenna 1 excluded");
        assert_eq!(&out[8..10], &[0, -4], "beam 1 on pol 1: −1 − 3");
    }

    #[test]
    fn delay_is_a_phase_slope_across_channels() {
        let shape = BeamShape {
            n_ants: 1,
            channels: 4,
            spectra: 1,
        };
        let mut x = vec![0i8; 4 * 4];
        for c in 0..4 {
            x[c * 4] = 100;
        }
        let beam = Beam {
            pol: 0,
            weights: vec![Complex64::new(1.0, 0.0)],
            delays: vec![0.5],
        };
        let mut out = vec![0i8; 4 * 2];
        beamform(shape, &x, &[true], &[beam], &[0], None, &mut out);
        // e^{jπ·c/2}: 1, j, −1, −j.
        assert_eq!(out, [100, 0, 0, 100, -100, 0, 0, -100]);
    }

    #[test]
    fn saturation_is_counted_once_per_value() {
        let shape = BeamShape {
            n_ants: 2,
            channels: 1,
            spectra: 1,
        };
        let x = vec![127i8; 8];
        let beam = Beam {
            pol: 0,
            weights: vec![Complex64::new(1.0, 0.0); 2],
            delays: vec![0.0; 2],
        };
        let mut out = vec![0i8; 2];
        let f = beamform(shape, &x, &[true, true], &[beam], &[0], Some(1), &mut out);
        assert_eq!(out, [127, 127]);
        assert_eq!(f.clips, [1]);
        // 254 + dither is far from the clip level.
        assert_eq!(f.near_clip, [0]);
        // 127 + 0 is exactly at it: not clipped, but near.
        let half = Beam {
            pol: 0,
            weights: vec![Complex64::new(0.5, 0.0); 2],
            delays: vec![0.0; 2],
        };
        let f = beamform(shape, &x, &[true, true], &[half], &[0], None, &mut out);
        assert_eq!((f.clips[0], f.near_clip[0]), (0, 1));
    }

    /// The dither a beam draws along its spectra is a run of independent U(−½, ½) values, also
    /// where the timestamp crosses a multiple of 2³² (where a 32-bit counter would wrap and
    /// repeat its sequence), and two beams' runs at one channel are uncorrelated.
    #[test]
    fn beam_dither_is_white_along_spectra_and_across_a_32_bit_wrap() {
        let step = 8192i64;
        let n = 100_000i64;
        // Centred on 3·2³², so half the run lies past the wrap.
        let t0 = (3i64 << 32) - n / 2 * step;
        let run = |beam: usize| -> Vec<(f64, f64)> {
            (0..n)
                .map(|i| {
                    let (a, b) = beam_dither(11, beam, t0 + i * step, 5);
                    (f64::from(a), f64::from(b))
                })
                .collect()
        };
        let (r0, r1) = (run(0), run(1));
        let mean = |f: &dyn Fn(usize) -> f64| (0..n as usize).map(f).sum::<f64>() / n as f64;
        // U(−½, ½): variance 1/12; products of independent ones have standard error 1/12/√n
        // ≈ 2.6e-4, so 1.3e-3 is five of them.
        for v in [mean(&|i| r0[i].0 * r0[i].0), mean(&|i| r0[i].1 * r0[i].1)] {
            assert!((v - 1.0 / 12.0).abs() < 1.3e-3, "{v}");
        }
        let lag1 = mean(&|i| r0[i].0 * r0[(i + 1) % n as usize].0);
        let parts = mean(&|i| r0[i].0 * r0[i].1);
        let beams = mean(&|i| r0[i].0 * r1[i].0);
        for c in [lag1, parts, beams] {
            assert!(c.abs() < 1.3e-3, "{c}");
        }
        // The sequence does not repeat with period 2³² samples, as a 32-bit counter would: the
        // spectra 2³² samples apart draw different values (a chance coincidence of both 16-bit
        // parts has probability 2⁻³² per spectrum).
        let repeats = (0..n)
            .filter(|&i| {
                let t = t0 + i * step;
                beam_dither(11, 0, t, 5) == beam_dither(11, 0, t + (1 << 32), 5)
            })
            .count();
        assert_eq!(repeats, 0);
    }
}
