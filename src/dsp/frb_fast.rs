//! The CPU backend's FFT ("FRB") beamformer: the contract of the f64 oracle [`super::frb`]
//! (seed 004 §2, §4.1, §5) in f32, over a whole XB-engine chunk, on several threads.
//!
//! Input is the chunk the correlator reads: **(batch, antenna, channel, spectrum, pol, re/im)**
//! int8, with per batch and antenna a presence flag (absent antennas contribute zero). Dish d
//! is antenna d, placed on the M×N grid by a [`DishGrid`] and multiplied by its complex weight
//! w_d (both polarisations). Output is **(channel, slow time, beam)** f32, overwritten: slow
//! time s sums the chunk's fast spectra s·T_ds … (s+1)·T_ds − 1 (counted across batches), so
//! T_ds must divide the chunk's spectra.
//!
//! Stage 1 (eq. 4, 5, 50, 51), per channel, spectrum and polarisation: grid, zero-pad to
//! (2M, 2N), 2-D FFT with the e^{+2πi…} sign (rustfft's unnormalised inverse, planned once),
//! and |Ẽ|² added into I (slow time, p, q). The grid is kept transposed, (n, m), so that the
//! first FFT runs over the N occupied rows only (length 2M) and a transpose into (p, q) feeds
//! the 2M row FFTs of length 2N. Stage 2 resamples with the main theorem (eq. 6): for a
//! Cartesian product of beam coordinates (§5.3, eq. 141–144) as V = Uᵀ I then J = V U′ per
//! slow time; for arbitrary beams (§5.2, eq. 138–140) as J = I · W over blocks of
//! [`SLOW_BLOCK`] slow times, so each row of W is read once per block. U, U′ and W are
//! computed once (in f64 by eq. 7, then rounded to f32).
//!
//! Threads take contiguous ranges of channels under `std::thread::scope`, each with its own
//! scratch; every buffer is allocated at construction, a call allocates nothing but the
//! scoped threads. The cost per fast spectrum and channel is two polarisations of N FFTs of
//! length 2M and 2M FFTs of length 2N; stage 2 is suppressed by 1/T_ds (seed 004 eq. 11).
#![deny(unsafe_code)]

use std::ops::Range;
use std::sync::Arc;

use num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use super::frb::{u_sum, DishGrid};

/// Slow times resampled together in the non-factorisable stage 2.
pub const SLOW_BLOCK: usize = 16;

/// The beam centres of an FRB output, in the normalised sky coordinates of seed 004 eq. 1
/// (θ = M n̂·σ/λ, θ′ = N n̂·σ′/λ; J is periodic in θ with period M and in θ′ with period N).
#[derive(Debug, Clone, PartialEq)]
pub enum FrbBeams {
    /// The Cartesian product {θ_i} × {θ′_j} (factorisable, §5.3); beam β = i·Q + j.
    Product { thetas: Vec<f64>, thetas2: Vec<f64> },
    /// Arbitrary (θ, θ′) pairs (non-factorisable, §5.2), in beam order.
    List(Vec<(f64, f64)>),
}

/// "P×Q beam grid" or "B listed beams", for reports.
impl std::fmt::Display for FrbBeams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrbBeams::List(b) => write!(f, "{} listed beams", b.len()),
            FrbBeams::Product { thetas, thetas2 } => {
                write!(f, "{}×{} beam grid", thetas.len(), thetas2.len())
            }
        }
    }
}

impl FrbBeams {
    /// P × Q beams evenly spaced over one period of the field of an M×N grid:
    /// θ_i = M·(i − ⌊P/2⌋)/P for i < P, θ′_j = N·(j − ⌊Q/2⌋)/Q for j < Q. The set covers
    /// [−M/2, M/2) × [−N/2, N/2) with zenith (0, 0) among the beams; P = 2M, Q = 2N gives the
    /// half-integer grid of stage 1 itself.
    pub fn even(rows: usize, cols: usize, p: usize, q: usize) -> FrbBeams {
        let axis = |side: usize, k: usize| -> Vec<f64> {
            (0..k)
                .map(|i| side as f64 * (i as f64 - (k / 2) as f64) / k as f64)
                .collect()
        };
        FrbBeams::Product {
            thetas: axis(rows, p),
            thetas2: axis(cols, q),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FrbBeams::Product { thetas, thetas2 } => thetas.len() * thetas2.len(),
            FrbBeams::List(l) => l.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (θ, θ′) of every beam, in beam order.
    pub fn positions(&self) -> Vec<(f64, f64)> {
        match self {
            FrbBeams::Product { thetas, thetas2 } => thetas
                .iter()
                .flat_map(|&a| thetas2.iter().map(move |&b| (a, b)))
                .collect(),
            FrbBeams::List(l) => l.clone(),
        }
    }
}

/// The chunk an FRB beamformer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrbChunkShape {
    pub n_ants: usize,
    pub channels: usize,
    /// Spectra per batch.
    pub spectra: usize,
    pub batches: usize,
    /// Fast spectra per slow time; divides `spectra × batches`.
    pub t_ds: usize,
}

impl FrbChunkShape {
    /// Slow times per chunk.
    pub fn slow(&self) -> usize {
        self.spectra * self.batches / self.t_ds
    }

    /// int8 values of a chunk.
    pub fn input_len(&self) -> usize {
        self.batches * self.n_ants * self.channels * self.spectra * 4
    }
}

/// Stage 2's matrices (seed 004 §5), from U evaluated in f64 by `dsp::frb::u_sum` and rounded
/// to f32 once; the GPU's second stage (`gpu::frb_resample`) uploads the same tables.
#[derive(Debug)]
pub enum Resample {
    /// U (2M × P) and U′ (2N × Q), row-major.
    Product {
        u: Vec<f32>,
        u2: Vec<f32>,
        p: usize,
        q: usize,
    },
    /// W ((2M·2N) × B), row-major.
    General { w: Vec<f32>, beams: usize },
}

impl Resample {
    /// The tables for `beams` of an `m` × `n` dish grid.
    pub fn new(m: usize, n: usize, beams: &FrbBeams) -> Resample {
        let (pm, pn) = (2 * m, 2 * n);
        let u = |side: usize, thetas: &[f64]| -> Vec<f32> {
            (0..2 * side)
                .flat_map(|p| thetas.iter().map(move |&t| u_sum(p, side, t) as f32))
                .collect()
        };
        match beams {
            FrbBeams::Product { thetas, thetas2 } => Resample::Product {
                u: u(m, thetas),
                u2: u(n, thetas2),
                p: thetas.len(),
                q: thetas2.len(),
            },
            FrbBeams::List(list) => Resample::General {
                w: (0..pm * pn)
                    .flat_map(|r| {
                        let (p, q) = (r / pn, r % pn);
                        list.iter()
                            .map(move |&(a, b)| (u_sum(p, m, a) * u_sum(q, n, b)) as f32)
                    })
                    .collect(),
                beams: list.len(),
            },
        }
    }
}

/// One thread's buffers.
#[derive(Debug, Default)]
struct Scratch {
    /// The weighted grid, transposed and padded: (n < N, m < 2M).
    grid: Vec<Complex32>,
    /// After the first FFT and the transpose: (p < 2M, q < 2N).
    field: Vec<Complex32>,
    fft: Vec<Complex32>,
    /// I of up to [`SLOW_BLOCK`] slow times: (slow, p, q).
    intensity: Vec<f32>,
    /// V = Uᵀ I of one slow time: (P, 2N).
    v: Vec<f32>,
}

/// An FRB beamformer for one chunk shape, dish grid and beam set.
pub struct FrbBeamformer {
    plan: Plan,
    parts: Vec<Range<usize>>,
    scratch: Vec<Scratch>,
}

/// The beamformer's fixed part (geometry, stage-2 matrices, FFT plans), shared by the threads.
struct Plan {
    shape: FrbChunkShape,
    rows: usize,
    cols: usize,
    /// Per dish: its index n·2M + m in the transposed grid.
    cells: Vec<usize>,
    beams: usize,
    resample: Resample,
    fft_rows: Arc<dyn Fft<f32>>,
    fft_cols: Arc<dyn Fft<f32>>,
}

impl FrbBeamformer {
    /// A beamformer for `shape` (its antennas are `grid`'s dishes) forming `beams`, on
    /// `threads` threads (0 is taken as 1; more threads than channels are not used).
    pub fn new(shape: FrbChunkShape, grid: &DishGrid, beams: &FrbBeams, threads: usize) -> Self {
        assert_eq!(grid.dishes(), shape.n_ants, "one dish per antenna");
        assert!(shape.t_ds > 0 && (shape.spectra * shape.batches) % shape.t_ds == 0);
        let (m, n) = (grid.rows, grid.cols);
        let (pm, pn) = (2 * m, 2 * n);
        let cells = grid.cells().iter().map(|&c| (c % n) * pm + c / n).collect();
        let resample = Resample::new(m, n, beams);
        let mut planner = FftPlanner::<f32>::new();
        // Eq. 4's sign is e^{+2πi…}: rustfft's (unnormalised) inverse transform.
        let fft_rows = planner.plan_fft_inverse(pm);
        let fft_cols = planner.plan_fft_inverse(pn);
        let fft_len = fft_rows
            .get_inplace_scratch_len()
            .max(fft_cols.get_inplace_scratch_len());
        let threads = threads.clamp(1, shape.channels.max(1));
        let parts: Vec<Range<usize>> = (0..threads)
            .map(|i| shape.channels * i / threads..shape.channels * (i + 1) / threads)
            .collect();
        let p_rows = match beams {
            FrbBeams::Product { thetas, .. } => thetas.len(),
            FrbBeams::List(_) => 0,
        };
        let scratch = parts
            .iter()
            .map(|_| Scratch {
                grid: vec![Complex32::default(); n * pm],
                field: vec![Complex32::default(); pm * pn],
                fft: vec![Complex32::default(); fft_len],
                intensity: vec![0.0; SLOW_BLOCK * pm * pn],
                v: vec![0.0; p_rows * pn],
            })
            .collect();
        FrbBeamformer {
            plan: Plan {
                shape,
                rows: m,
                cols: n,
                cells,
                beams: beams.len(),
                resample,
                fft_rows,
                fft_cols,
            },
            parts,
            scratch,
        }
    }

    pub fn shape(&self) -> FrbChunkShape {
        self.plan.shape
    }

    pub fn beams(&self) -> usize {
        self.plan.beams
    }

    /// f32 values of one chunk's output.
    pub fn output_len(&self) -> usize {
        self.plan.shape.channels * self.plan.shape.slow() * self.plan.beams
    }

    /// Form every beam of chunk `x` into `out` (channel, slow time, beam). `present` is
    /// (batch, antenna), non-zero where the antenna's heap arrived; `weights` one per dish.
    pub fn form(&mut self, x: &[i8], present: &[u8], weights: &[Complex32], out: &mut [f32]) {
        let shape = self.plan.shape;
        assert_eq!(x.len(), shape.input_len());
        assert_eq!(present.len(), shape.batches * shape.n_ants);
        assert_eq!(weights.len(), shape.n_ants);
        assert_eq!(out.len(), self.output_len());
        let per_channel = shape.slow() * self.plan.beams;
        let job = Job {
            bf: &self.plan,
            x,
            present,
            weights,
        };
        let mut outs = Vec::with_capacity(self.parts.len());
        let mut rest = out;
        for part in &self.parts {
            let (mine, tail) = rest.split_at_mut(part.len() * per_channel);
            outs.push(mine);
            rest = tail;
        }
        let mut jobs = self.parts.iter().zip(&mut self.scratch).zip(outs);
        let ((first, scratch), out) = jobs.next().expect("at least one part");
        std::thread::scope(|s| {
            let job = &job;
            let handles: Vec<_> = jobs
                .map(|((part, scratch), out)| {
                    s.spawn(move || job.channels(part.clone(), scratch, out))
                })
                .collect();
            job.channels(first.clone(), scratch, out);
            for h in handles {
                h.join().expect("FRB beamformer thread panicked");
            }
        });
    }
}

/// What every thread reads.
struct Job<'a> {
    bf: &'a Plan,
    x: &'a [i8],
    present: &'a [u8],
    weights: &'a [Complex32],
}

impl Job<'_> {
    /// Channels `part` into `out` (those channels' (slow, beam) rows).
    fn channels(&self, part: Range<usize>, s: &mut Scratch, out: &mut [f32]) {
        let bf = self.bf;
        let shape = bf.shape;
        let slow = shape.slow();
        let cells = 4 * bf.rows * bf.cols;
        for (k, c) in part.enumerate() {
            let out = &mut out[k * slow * bf.beams..(k + 1) * slow * bf.beams];
            for s0 in (0..slow).step_by(SLOW_BLOCK) {
                let nb = SLOW_BLOCK.min(slow - s0);
                s.intensity[..nb * cells].fill(0.0);
                for sb in 0..nb {
                    for g in (s0 + sb) * shape.t_ds..(s0 + sb + 1) * shape.t_ds {
                        for pol in 0..2 {
                            self.add_intensity(c, g, pol, s, sb * cells);
                        }
                    }
                }
                let out = &mut out[s0 * bf.beams..(s0 + nb) * bf.beams];
                resample(
                    &bf.resample,
                    bf.cols,
                    &s.intensity[..nb * cells],
                    &mut s.v,
                    out,
                );
            }
        }
    }

    /// Stage 1 for channel `c`, fast spectrum `g` of the chunk and polarisation `pol`: add
    /// |Ẽ|² into `s.intensity[at..]` (p, q).
    fn add_intensity(&self, c: usize, g: usize, pol: usize, s: &mut Scratch, at: usize) {
        let bf = self.bf;
        let sh = bf.shape;
        let (pm, pn, n) = (2 * bf.rows, 2 * bf.cols, bf.cols);
        let (batch, spectrum) = (g / sh.spectra, g % sh.spectra);
        s.grid.fill(Complex32::default());
        for (d, &cell) in bf.cells.iter().enumerate() {
            if self.present[batch * sh.n_ants + d] == 0 {
                continue;
            }
            let i = ((((batch * sh.n_ants + d) * sh.channels + c) * sh.spectra + spectrum) * 2
                + pol)
                * 2;
            let e = Complex32::new(f32::from(self.x[i]), f32::from(self.x[i + 1]));
            s.grid[cell] = self.weights[d] * e;
        }
        bf.fft_rows.process_with_scratch(&mut s.grid, &mut s.fft);
        for (p, row) in s.field.chunks_exact_mut(pn).enumerate() {
            for (q, v) in row[..n].iter_mut().enumerate() {
                *v = s.grid[q * pm + p];
            }
            row[n..].fill(Complex32::default());
        }
        bf.fft_cols.process_with_scratch(&mut s.field, &mut s.fft);
        for (i, v) in s.intensity[at..at + pm * pn].iter_mut().zip(&s.field) {
            *i += v.norm_sqr();
        }
    }
}

/// Stage 2 of a block of slow times: `intensity` (slow, p < 2M, q < 2N) → `out` (slow, beam).
fn resample(r: &Resample, cols: usize, intensity: &[f32], v: &mut [f32], out: &mut [f32]) {
    let pn = 2 * cols;
    match r {
        Resample::Product { u, u2, p, q } => {
            let (gp, gq) = (*p, *q);
            let cells = u.len() / gp.max(1) * pn;
            for (i, j) in intensity
                .chunks_exact(cells)
                .zip(out.chunks_exact_mut(gp * gq))
            {
                // V (γ, q) = Σ_p U (p, γ) I (p, q)  (eq. 143)
                v.fill(0.0);
                for (irow, urow) in i.chunks_exact(pn).zip(u.chunks_exact(gp)) {
                    for (vrow, &uw) in v.chunks_exact_mut(pn).zip(urow) {
                        for (a, &b) in vrow.iter_mut().zip(irow) {
                            *a += uw * b;
                        }
                    }
                }
                // J (γ, γ′) = Σ_q V (γ, q) U′ (q, γ′)  (eq. 144)
                j.fill(0.0);
                for (jrow, vrow) in j.chunks_exact_mut(gq).zip(v.chunks_exact(pn)) {
                    for (&vq, u2row) in vrow.iter().zip(u2.chunks_exact(gq)) {
                        for (a, &b) in jrow.iter_mut().zip(u2row) {
                            *a += vq * b;
                        }
                    }
                }
            }
        }
        Resample::General { w, beams } => {
            // J (slow, β) = Σ_ρ I (slow, ρ) W (ρ, β)  (eq. 140), each row of W once per block.
            let cells = w.len() / (*beams).max(1);
            out.fill(0.0);
            for (rho, wrow) in w.chunks_exact(*beams).enumerate() {
                for (i, j) in intensity
                    .chunks_exact(cells)
                    .zip(out.chunks_exact_mut(*beams))
                {
                    let x = i[rho];
                    for (a, &b) in j.iter_mut().zip(wrow) {
                        *a += x * b;
                    }
                }
            }
        }
    }
}

/// Largest magnitude written by [`encode_f16`]: float16's largest finite value.
pub const F16_MAX: f32 = 65504.0;

/// `j · scale` as float16 little-endian into `out` (2 bytes per value), saturated at
/// ±[`F16_MAX`]; returns how many values saturated.
pub fn encode_f16(j: &[f32], scale: f32, out: &mut [u8]) -> u64 {
    assert_eq!(out.len(), 2 * j.len());
    let mut clips = 0;
    for (o, &v) in out.chunks_exact_mut(2).zip(j) {
        let x = v * scale;
        let x = if x.abs() > F16_MAX {
            clips += 1;
            F16_MAX.copysign(x)
        } else {
            x
        };
        o.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
    }
    clips
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::frb::{direct, FrbShape};
    use crate::dsp::random::{mix, unit};
    use num_complex::Complex64;

    /// A random chunk, its presence and weights, for `grid` and `shape`.
    fn inputs(shape: FrbChunkShape, seed: u64) -> (Vec<i8>, Vec<u8>, Vec<Complex32>) {
        let x = (0..shape.input_len() as u64)
            .map(|i| (mix(seed, 1, i) % 255) as i8)
            .map(|v| v.max(-127))
            .collect();
        // Antenna 1 misses batch 0.
        let present = (0..shape.batches * shape.n_ants)
            .map(|i| u8::from(i != 1))
            .collect();
        let w = (0..shape.n_ants as u64)
            .map(|i| {
                Complex32::new(
                    unit(mix(seed, 2, i)) as f32 - 0.5,
                    unit(mix(seed, 3, i)) as f32 - 0.5,
                )
            })
            .collect();
        (x, present, w)
    }

    /// The oracle's direct beamforming (eq. 2, 3) of channel `c`: J (slow, beam) in f64.
    fn oracle(
        grid: &DishGrid,
        shape: FrbChunkShape,
        (x, present, w): &(Vec<i8>, Vec<u8>, Vec<Complex32>),
        c: usize,
        beams: &[(f64, f64)],
    ) -> Vec<f64> {
        let (d, times) = (shape.n_ants, shape.batches * shape.spectra);
        let mut e = vec![Complex64::default(); times * 2 * d];
        for t in 0..times {
            let (b, s) = (t / shape.spectra, t % shape.spectra);
            for pol in 0..2 {
                for a in 0..d {
                    if present[b * d + a] == 0 {
                        continue;
                    }
                    let i =
                        ((((b * d + a) * shape.channels + c) * shape.spectra + s) * 2 + pol) * 2;
                    e[(t * 2 + pol) * d + a] = Complex64::new(x[i].into(), x[i + 1].into());
                }
            }
        }
        let mut weights = vec![Complex64::default(); 2 * grid.rows * grid.cols];
        for (a, &cell) in grid.cells().iter().enumerate() {
            for pol in 0..2 {
                weights[pol * grid.rows * grid.cols + cell] =
                    Complex64::new(w[a].re.into(), w[a].im.into());
            }
        }
        let fs = FrbShape {
            times,
            t_ds: shape.t_ds,
        };
        direct(grid, fs, &e, &weights, beams)
    }

    fn check(grid: &DishGrid, shape: FrbChunkShape, beams: &FrbBeams, threads: usize) {
        let data = inputs(shape, 99 + shape.t_ds as u64);
        let mut bf = FrbBeamformer::new(shape, grid, beams, threads);
        let mut out = vec![f32::NAN; bf.output_len()];
        bf.form(&data.0, &data.1, &data.2, &mut out);
        let b = beams.len();
        let positions = beams.positions();
        for c in 0..shape.channels {
            let want = oracle(grid, shape, &data, c, &positions);
            let got = &out[c * shape.slow() * b..(c + 1) * shape.slow() * b];
            let top = want.iter().fold(0.0f64, |a, &v| a.max(v));
            for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-5 * top,
                    "channel {c} value {k}: {g} vs {w} (max {top})"
                );
            }
        }
    }

    fn partial_grid(m: usize, n: usize, skip: &[usize]) -> DishGrid {
        let cells: Vec<(usize, usize)> = (0..m * n)
            .rev()
            .filter(|c| !skip.contains(c))
            .map(|c| (c / n, c % n))
            .collect();
        DishGrid::new(m, n, &cells).unwrap()
    }

    #[test]
    fn arbitrary_beams_equal_direct_beamforming() {
        let grid = partial_grid(3, 4, &[0, 5, 11]);
        let beams = FrbBeams::List(
            (0..7u64)
                .map(|i| {
                    (
                        unit(mix(5, 1, i)) * 8.0 - 4.0,
                        unit(mix(5, 2, i)) * 10.0 - 5.0,
                    )
                })
                .collect(),
        );
        for t_ds in [1, 3, 6] {
            let shape = FrbChunkShape {
                n_ants: grid.dishes(),
                channels: 3,
                spectra: 3,
                batches: 2,
                t_ds,
            };
            check(&grid, shape, &beams, 2);
        }
    }

    #[test]
    fn beam_grids_equal_direct_beamforming() {
        let grid = partial_grid(2, 5, &[3]);
        // A slow time longer than a batch, and more slow times than SLOW_BLOCK elsewhere.
        for (t_ds, spectra, p, q) in [(4, 2, 3, 4), (1, 20, 4, 10), (5, 5, 1, 2)] {
            let shape = FrbChunkShape {
                n_ants: grid.dishes(),
                channels: 2,
                spectra,
                batches: 2,
                t_ds,
            };
            check(&grid, shape, &FrbBeams::even(2, 5, p, q), 3);
        }
    }

    #[test]
    fn even_beams_cover_one_period_around_zenith() {
        let FrbBeams::Product { thetas, thetas2 } = FrbBeams::even(4, 3, 8, 3) else {
            panic!()
        };
        assert_eq!(thetas, [-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
        assert_eq!(thetas2, [-1.0, 0.0, 1.0]);
        assert_eq!(FrbBeams::even(4, 3, 8, 3).positions()[4], (-1.5, 0.0));
    }

    #[test]
    fn float16_encoding_saturates_and_counts() {
        let mut out = [0u8; 8];
        let clips = encode_f16(&[1.5, -0.25, 1e6, -7e4], 2.0, &mut out);
        assert_eq!(clips, 2);
        // 3.0, −0.5, 65504, −65504 in IEEE binary16.
        assert_eq!(out, [0x00, 0x42, 0x00, 0xb8, 0xff, 0x7b, 0xff, 0xfb]);
    }
}
