//! The CPU backend's fast coherent beamformer: the contract of the oracle
//! [`super::beamform::beamform`] (seed 003; facts §1.4, §1.10), **bit for bit** (dither on or
//! off), at many times its speed, for small arrays on hosts without a GPU.
//!
//! Layouts are the oracle's: input **(antenna, channel, spectrum, pol, re/im)** int8, output
//! **(beam, channel, spectrum, re/im)** int8, overwritten; returns (clipped values per beam,
//! antennas present).
//!
//! Why the results are identical: every output is the same sequence of f64 operations as in the
//! oracle — the coefficient `W_abc = w_ab · e^{jπ·c·d_ab}` from the same `Complex64`
//! expression, then `y += W·x` over the present antennas in increasing order, with the complex
//! product written out as `num_complex` writes it — only spread over SIMD lanes, one spectrum per
//! lane. Rust never fuses a multiply and an add into an FMA unless asked, so each lane rounds as
//! the scalar code does; the f32 cast, dither and quantisation are the oracle's own functions.
//!
//! How it is fast: per channel and block of [`BLOCK`] spectra the present antennas' samples
//! are converted once to planar f64 (re and im rows per antenna and polarisation), then each
//! beam accumulates eight spectra at a time in registers over the antennas (the inner loop is
//! plain Rust that LLVM vectorises; an AVX2 copy of it is chosen at run time). The sine and
//! cosine per (beam, channel, antenna) are computed once per channel, not per spectrum.
//! Threads take contiguous ranges of channels under `std::thread::scope`; each writes its own
//! channels' part of every beam's output. Hand-written because this is a complex
//! matrix–vector product per spectrum with int8 input and per-channel phase ramps, which no
//! BLAS crate offers with the oracle's rounding.

use std::ops::Range;

use num_complex::Complex64;

use super::beamform::{beam_dither_at, beam_dither_key, spectrum_word, Beam, BeamShape};
use super::postproc::quantise;

/// Spectra staged at once per channel (a multiple of `LANES`, the spectra summed together in
/// registers).
pub const BLOCK: usize = 64;

/// Spectra accumulated together in registers.
const LANES: usize = 8;

/// A beamformer for one batch shape. It keeps its staging buffers between calls (a call
/// allocates only small per-beam lists and spawns `threads − 1` scoped threads).
#[derive(Debug)]
pub struct Beamformer {
    shape: BeamShape,
    /// Contiguous channel ranges, one per thread.
    parts: Vec<Range<usize>>,
    scratch: Vec<Scratch>,
}

/// One thread's staged samples and coefficients.
#[derive(Debug, Default)]
struct Scratch {
    /// Per present antenna and pol: `BLOCK` real parts then `BLOCK` imaginary parts.
    x: Vec<f64>,
    /// Per beam and present antenna: the channel's coefficient.
    coeff: Vec<Complex64>,
}

/// What every thread reads.
struct Job<'a> {
    shape: BeamShape,
    x: &'a [i8],
    /// The present antennas, in increasing order (the oracle's summation order).
    ants: &'a [usize],
    beams: &'a [Beam],
    timestamps: &'a [i64],
    dither: Option<u64>,
}

impl Beamformer {
    /// A beamformer for `shape` on `threads` threads (0 is taken as 1; more threads than
    /// channels are not used).
    pub fn new(shape: BeamShape, threads: usize) -> Self {
        let n = threads.clamp(1, shape.channels.max(1));
        let parts: Vec<Range<usize>> = (0..n)
            .map(|i| shape.channels * i / n..shape.channels * (i + 1) / n)
            .collect();
        let scratch = parts.iter().map(|_| Scratch::default()).collect();
        Self {
            shape,
            parts,
            scratch,
        }
    }

    /// Form every beam, exactly as [`super::beamform::beamform`] does. Returns (clipped values
    /// per beam, antennas present).
    pub fn form(
        &mut self,
        x: &[i8],
        present: &[bool],
        beams: &[Beam],
        timestamps: &[i64],
        dither: Option<u64>,
        out: &mut [i8],
    ) -> (Vec<u64>, usize) {
        let BeamShape {
            n_ants,
            channels,
            spectra,
        } = self.shape;
        assert_eq!(x.len(), n_ants * channels * spectra * 4);
        assert_eq!(present.len(), n_ants);
        assert_eq!(timestamps.len(), spectra);
        assert_eq!(out.len(), beams.len() * channels * spectra * 2);
        for beam in beams {
            assert!(beam.pol < 2, "beam polarisation {}", beam.pol);
            assert_eq!(beam.weights.len(), n_ants);
            assert_eq!(beam.delays.len(), n_ants);
        }
        let ants: Vec<usize> = (0..n_ants).filter(|&a| present[a]).collect();
        let job = Job {
            shape: self.shape,
            x,
            ants: &ants,
            beams,
            timestamps,
            dither,
        };
        // Each part's slice of every beam's output: beam b's channels `part` are contiguous.
        let per_beam = channels * spectra * 2;
        let mut outs: Vec<Vec<&mut [i8]>> = self.parts.iter().map(|_| Vec::new()).collect();
        for mut beam_out in out.chunks_mut(per_beam.max(1)).take(beams.len()) {
            for (part, outs) in self.parts.iter().zip(&mut outs) {
                let (mine, rest) = beam_out.split_at_mut(part.len() * spectra * 2);
                outs.push(mine);
                beam_out = rest;
            }
        }
        let mut clips = vec![0u64; beams.len()];
        let mut jobs = self.parts.iter().zip(&mut self.scratch).zip(outs);
        // The calling thread takes the first part itself and spawns one thread per other part.
        let ((part, scratch), mut outs) = jobs.next().expect("at least one part");
        let mut add = |c: Vec<u64>| clips.iter_mut().zip(c).for_each(|(a, b)| *a += b);
        std::thread::scope(|s| {
            let job = &job;
            let handles: Vec<_> = jobs
                .map(|((part, scratch), mut outs)| {
                    s.spawn(move || form_channels(job, part.clone(), scratch, &mut outs))
                })
                .collect();
            add(form_channels(job, part.clone(), scratch, &mut outs));
            for h in handles {
                add(h.join().expect("beamformer thread panicked"));
            }
        });
        (clips, ants.len())
    }
}

/// Form channels `part` of every beam into `outs` (per beam, those channels' output); returns
/// the clip count per beam. Runs the AVX2 copy where the CPU has AVX2.
fn form_channels(
    job: &Job,
    part: Range<usize>,
    s: &mut Scratch,
    outs: &mut [&mut [i8]],
) -> Vec<u64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `form_channels_avx2` requires AVX2, checked on the line above.
        return unsafe { form_channels_avx2(job, part, s, outs) };
    }
    form_channels_body(job, part, s, outs)
}

/// [`form_channels_body`] compiled for AVX2 (without FMA, which would change the rounding).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn form_channels_avx2(
    job: &Job,
    part: Range<usize>,
    s: &mut Scratch,
    outs: &mut [&mut [i8]],
) -> Vec<u64> {
    form_channels_body(job, part, s, outs)
}

#[inline(always)]
fn form_channels_body(
    job: &Job,
    part: Range<usize>,
    s: &mut Scratch,
    outs: &mut [&mut [i8]],
) -> Vec<u64> {
    let spectra = job.shape.spectra;
    let n_present = job.ants.len();
    s.x.resize(n_present * 2 * 2 * BLOCK, 0.0);
    s.coeff
        .resize(job.beams.len() * n_present, Complex64::default());
    let mut clips = vec![0u64; job.beams.len()];
    for c in part.clone() {
        // The oracle's coefficient expression, once per (beam, channel, antenna).
        for (b, beam) in job.beams.iter().enumerate() {
            for (k, &a) in job.ants.iter().enumerate() {
                s.coeff[b * n_present + k] = beam.weights[a]
                    * Complex64::from_polar(1.0, std::f64::consts::PI * c as f64 * beam.delays[a]);
            }
        }
        for t0 in (0..spectra).step_by(BLOCK) {
            let len = BLOCK.min(spectra - t0);
            stage(job, c, t0..t0 + len, &mut s.x);
            for (b, beam) in job.beams.iter().enumerate() {
                let coeff = &s.coeff[b * n_present..(b + 1) * n_present];
                let key = job.dither.map(|seed| beam_dither_key(seed, b, c));
                let out = &mut outs[b][((c - part.start) * spectra + t0) * 2..][..len * 2];
                for l0 in (0..len).step_by(LANES) {
                    let (re, im) = accumulate(&s.x, beam.pol, coeff, l0);
                    for l in 0..LANES.min(len - l0) {
                        let t = t0 + l0 + l;
                        let (u0, u1) = key.map_or((0.0, 0.0), |k| {
                            beam_dither_at(k, spectrum_word(job.timestamps[t]))
                        });
                        let (qr, c0) = quantise(re[l] as f32, u0, 127.0);
                        let (qi, c1) = quantise(im[l] as f32, u1, 127.0);
                        out[(l0 + l) * 2] = qr;
                        out[(l0 + l) * 2 + 1] = qi;
                        clips[b] += u64::from(c0 || c1);
                    }
                }
            }
        }
    }
    clips
}

/// Stage spectra `t` of channel `c` for the present antennas as planar f64: row
/// `(k·2 + pol)·2·BLOCK` holds `BLOCK` real parts then `BLOCK` imaginary parts (zero past
/// `t.len()`). One pass over each antenna's bytes fills its four rows (a loop LLVM vectorises).
#[inline(always)]
fn stage(job: &Job, c: usize, t: Range<usize>, x: &mut [f64]) {
    let BeamShape {
        n_ants: _,
        channels,
        spectra,
    } = job.shape;
    for (k, &a) in job.ants.iter().enumerate() {
        let src = &job.x[((a * channels + c) * spectra + t.start) * 4..][..t.len() * 4];
        let rows = &mut x[k * 4 * BLOCK..][..4 * BLOCK];
        let (re0, rest) = rows.split_at_mut(BLOCK);
        let (im0, rest) = rest.split_at_mut(BLOCK);
        let (re1, im1) = rest.split_at_mut(BLOCK);
        for (l, v) in src.chunks_exact(4).enumerate() {
            re0[l] = f64::from(v[0]);
            im0[l] = f64::from(v[1]);
            re1[l] = f64::from(v[2]);
            im1[l] = f64::from(v[3]);
        }
        for row in [re0, im0, re1, im1] {
            row[t.len()..].fill(0.0);
        }
    }
}

/// One beam's sums for spectra `l0..l0 + LANES` of the staged block: `Σ_k coeff[k]·x[k]` in the
/// oracle's order and rounding, one spectrum per lane.
#[inline(always)]
fn accumulate(
    x: &[f64],
    pol: usize,
    coeff: &[Complex64],
    l0: usize,
) -> ([f64; LANES], [f64; LANES]) {
    let (mut re, mut im) = ([0.0f64; LANES], [0.0f64; LANES]);
    for (k, w) in coeff.iter().enumerate() {
        let row = &x[(k * 2 + pol) * 2 * BLOCK..][..2 * BLOCK];
        let xr: &[f64; LANES] = row[l0..l0 + LANES].try_into().unwrap();
        let xi: &[f64; LANES] = row[BLOCK + l0..BLOCK + l0 + LANES].try_into().unwrap();
        for l in 0..LANES {
            // num_complex's product (w.re·x.re − w.im·x.im, w.re·x.im + w.im·x.re), then +=.
            re[l] += w.re * xr[l] - w.im * xi[l];
            im[l] += w.re * xi[l] + w.im * xr[l];
        }
    }
    (re, im)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::beamform::beamform;
    use crate::dsp::random::{mix, unit};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Bit for bit the oracle's output, clip counts and antenna count, over blocks of
        /// spectra with a partial last one, absent antennas, both polarisations, weights large
        /// enough to clip, dither on and off, and 1 to 3 threads.
        #[test]
        fn matches_the_oracle_exactly(
            n_ants in 1usize..=12,
            channels in 1usize..=4,
            spectra in 1usize..=150,
            n_beams in 0usize..=4,
            absent in any::<u16>(),
            dither in proptest::option::of(any::<u64>()),
            threads in 1usize..=3,
            seed in any::<u64>(),
        ) {
            let shape = BeamShape { n_ants, channels, spectra };
            let x: Vec<i8> = (0..n_ants * channels * spectra * 4)
                .map(|i| mix(seed, 1, i as u64) as i8)
                .collect();
            let present: Vec<bool> = (0..n_ants).map(|a| absent >> a & 1 == 0).collect();
            let r = |stream, i| unit(mix(seed, stream, i as u64));
            let beams: Vec<Beam> = (0..n_beams)
                .map(|b| Beam {
                    pol: b % 2,
                    weights: (0..n_ants)
                        .map(|a| Complex64::new(r(2, b * 64 + a) - 0.5, r(3, b * 64 + a) - 0.5))
                        .collect(),
                    delays: (0..n_ants).map(|a| 4.0 * r(4, b * 64 + a) - 2.0).collect(),
                })
                .collect();
            let ts: Vec<i64> = (0..spectra as i64).map(|t| 1000 + 7 * t).collect();
            let mut want = vec![0i8; n_beams * channels * spectra * 2];
            let mut got = vec![0x55i8; want.len()];
            let oracle = beamform(shape, &x, &present, &beams, &ts, dither, &mut want);
            let fast = Beamformer::new(shape, threads).form(&x, &present, &beams, &ts, dither, &mut got);
            prop_assert_eq!(fast, (oracle.clips, oracle.ants));
            prop_assert!(got == want);
        }
    }
}
