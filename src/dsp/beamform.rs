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
//! then dithered (U(−½, ½) per part, counter-based) and quantised with saturation to ±127,
//! counting clipped complex values per beam (once if either part clipped, as in `postproc`). Missing antennas are excluded and the number present is
//! returned (`beam_ants`). Output **(beam, channel, spectrum, re/im)** int8, overwritten.
#![deny(unsafe_code)]

use num_complex::Complex64;

use super::postproc::quantise;
use super::random::{dither_f32, mix};

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

/// The dither of beam `b`'s part `part` at (spectrum timestamp, channel).
pub fn beam_dither(seed: u64, beam: usize, timestamp: i64, channel: usize, part: usize) -> f32 {
    dither_f32(mix(
        seed.wrapping_add(beam as u64),
        ((timestamp as u64) << 1) | part as u64,
        channel as u64,
    ))
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
                let u = |part| dither.map_or(0.0, |seed| beam_dither(seed, b, ts, c, part));
                let (v0, v1) = (acc.re as f32, acc.im as f32);
                let (u0, u1) = (u(0), u(1));
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
}
