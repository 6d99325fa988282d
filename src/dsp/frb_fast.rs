//! The CPU backend's FFT ("FRB") beamformer: the contract of the f64 oracle [`super::frb`]
//! (seed 004 §2, §4.1, §5) in f32, over a whole XB-engine chunk, on several threads.
//!
//! Input is the chunk the correlator reads: **(batch, antenna, channel, spectrum, pol, re/im)**
//! int8, with per batch and antenna a presence flag (absent antennas contribute zero). Dish d
//! is antenna d, placed on the M×N grid by a [`DishGrid`] and multiplied by its complex weight
//! for the channel and polarisation, **(channel, dish, pol)** (seed 004 eq. 51's W_{fπmn}, f the
//! channel). Output is **(channel, slow time, beam)** f32, overwritten: slow
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
//! computed once (in f64 by eq. 7, then rounded to f32) by [`super::frb_resample`]; a
//! re-point ([`FrbBeamformer::repoint`]) swaps in a list's W built by the caller, off the data
//! path (its cost is dominated by 2(M + N)·B cosine sums).
//!
//! Threads take contiguous ranges of channels under `std::thread::scope`, each with its own
//! scratch; every buffer is allocated at construction, a call allocates nothing but the
//! scoped threads. The cost per fast spectrum and channel is two polarisations of N FFTs of
//! length 2M and 2M FFTs of length 2N; stage 2 is suppressed by 1/T_ds (seed 004 eq. 11).
#![deny(unsafe_code)]

use half::slice::HalfFloatSliceExt;
use std::ops::Range;
use std::sync::Arc;

use num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use super::frb::DishGrid;
use super::frb_resample::{resample, FrbBeams, RepointError, Resample};

/// Slow times resampled together in the non-factorisable stage 2.
pub const SLOW_BLOCK: usize = 16;

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

/// One thread's transform buffers.
#[derive(Debug, Default)]
struct FieldScratch {
    /// The weighted grid, transposed and padded: (n < N, m < 2M).
    grid: Vec<Complex32>,
    /// After the first FFT and the transpose: (p < 2M, q < 2N).
    field: Vec<Complex32>,
    fft: Vec<Complex32>,
}

/// One thread's buffers.
#[derive(Debug, Default)]
struct Scratch {
    field: FieldScratch,
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
    resample: Arc<Resample>,
    fft_rows: Arc<dyn Fft<f32>>,
    fft_cols: Arc<dyn Fft<f32>>,
}

/// What a call computes per channel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stages {
    /// Stage 1 only: I (slow, p, q).
    Intensities,
    /// Both stages: J (slow, beam).
    Beams,
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
                field: FieldScratch {
                    grid: vec![Complex32::default(); n * pm],
                    field: vec![Complex32::default(); pm * pn],
                    fft: vec![Complex32::default(); fft_len],
                },
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
                resample: Arc::new(resample),
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

    /// Re-point a beam list (tracking beams, issue 17): stage 2 uses `table` (a list's W for
    /// this grid and as many beams, `Resample::new` of the new positions) from the next call.
    /// The caller builds it: its f64 evaluation takes ~0.5 s for thousands of beams, which
    /// must not stall the data path. Returns the table replaced, for the caller to drop where
    /// freeing it costs nothing. A grid of beams, or a table of another shape, is refused.
    pub fn repoint(&mut self, table: Arc<Resample>) -> Result<Arc<Resample>, RepointError> {
        let (
            Resample::General { w, beams },
            Resample::General {
                w: new,
                beams: given,
            },
        ) = (&*self.plan.resample, &*table)
        else {
            return Err(RepointError::Grid);
        };
        if given != beams {
            return Err(RepointError::Count {
                given: *given,
                beams: *beams,
            });
        }
        if new.len() != w.len() {
            return Err(RepointError::Cells {
                given: new.len() / (*given).max(1),
                cells: w.len() / (*beams).max(1),
            });
        }
        Ok(std::mem::replace(&mut self.plan.resample, table))
    }

    pub fn beams(&self) -> usize {
        self.plan.beams
    }

    /// f32 values of one chunk's output.
    pub fn output_len(&self) -> usize {
        self.plan.shape.channels * self.plan.shape.slow() * self.plan.beams
    }

    /// f32 values of one chunk's intensities ([`FrbBeamformer::intensities`]).
    pub fn intensities_len(&self) -> usize {
        self.plan.shape.channels * self.plan.shape.slow() * 4 * self.plan.rows * self.plan.cols
    }

    /// Form every beam of chunk `x` into `out` (channel, slow time, beam). `present` is
    /// (batch, antenna), non-zero where the antenna's heap arrived; `weights` is
    /// (channel, dish, pol): dish d's weight in channel c for polarisation π is
    /// `weights[(c·D + d)·2 + π]` (seed 004's W_{fπmn} at d's (m, n)).
    pub fn form(&mut self, x: &[i8], present: &[u8], weights: &[Complex32], out: &mut [f32]) {
        assert_eq!(out.len(), self.output_len());
        self.run(x, present, weights, out, Stages::Beams);
    }

    /// Stage 1 alone (for benchmarks and tests): the intensities on the half-integer grid,
    /// `out` (channel, slow time, p < 2M, q < 2N), overwritten; inputs as for
    /// [`FrbBeamformer::form`].
    pub fn intensities(
        &mut self,
        x: &[i8],
        present: &[u8],
        weights: &[Complex32],
        out: &mut [f32],
    ) {
        assert_eq!(out.len(), self.intensities_len());
        self.run(x, present, weights, out, Stages::Intensities);
    }

    fn run(
        &mut self,
        x: &[i8],
        present: &[u8],
        weights: &[Complex32],
        out: &mut [f32],
        stages: Stages,
    ) {
        let shape = self.plan.shape;
        assert_eq!(x.len(), shape.input_len());
        assert_eq!(present.len(), shape.batches * shape.n_ants);
        assert_eq!(weights.len(), shape.channels * shape.n_ants * 2);
        let per_channel = out.len() / shape.channels.max(1);
        let job = Job {
            bf: &self.plan,
            x,
            present,
            weights,
            stages,
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
    stages: Stages,
}

impl Job<'_> {
    /// Channels `part` into `out` (those channels' (slow, beam) or (slow, p, q) rows).
    fn channels(&self, part: Range<usize>, s: &mut Scratch, out: &mut [f32]) {
        let bf = self.bf;
        let shape = bf.shape;
        let slow = shape.slow();
        let cells = 4 * bf.rows * bf.cols;
        for (k, c) in part.enumerate() {
            if self.stages == Stages::Intensities {
                let out = &mut out[k * slow * cells..(k + 1) * slow * cells];
                out.fill(0.0);
                for (sl, acc) in out.chunks_exact_mut(cells).enumerate() {
                    self.add_slow_time(c, sl, &mut s.field, acc);
                }
                continue;
            }
            let out = &mut out[k * slow * bf.beams..(k + 1) * slow * bf.beams];
            for s0 in (0..slow).step_by(SLOW_BLOCK) {
                let nb = SLOW_BLOCK.min(slow - s0);
                let block = &mut s.intensity[..nb * cells];
                block.fill(0.0);
                for (sb, acc) in block.chunks_exact_mut(cells).enumerate() {
                    self.add_slow_time(c, s0 + sb, &mut s.field, acc);
                }
                let out = &mut out[s0 * bf.beams..(s0 + nb) * bf.beams];
                resample(&bf.resample, bf.cols, block, &mut s.v, out);
            }
        }
    }

    /// Stage 1 for channel `c` and slow time `sl`: add Σ |Ẽ|² over its fast spectra and both
    /// polarisations into `acc` (p, q).
    fn add_slow_time(&self, c: usize, sl: usize, f: &mut FieldScratch, acc: &mut [f32]) {
        let t_ds = self.bf.shape.t_ds;
        for g in sl * t_ds..(sl + 1) * t_ds {
            for pol in 0..2 {
                self.add_intensity(c, g, pol, f, acc);
            }
        }
    }

    /// Stage 1 for channel `c`, fast spectrum `g` of the chunk and polarisation `pol`: add
    /// |Ẽ|² into `acc` (p, q).
    fn add_intensity(&self, c: usize, g: usize, pol: usize, f: &mut FieldScratch, acc: &mut [f32]) {
        let bf = self.bf;
        let sh = bf.shape;
        let (pm, pn, n) = (2 * bf.rows, 2 * bf.cols, bf.cols);
        let (batch, spectrum) = (g / sh.spectra, g % sh.spectra);
        let weights = &self.weights[c * sh.n_ants * 2..(c + 1) * sh.n_ants * 2];
        f.grid.fill(Complex32::default());
        for (d, &cell) in bf.cells.iter().enumerate() {
            if self.present[batch * sh.n_ants + d] == 0 {
                continue;
            }
            let i = ((((batch * sh.n_ants + d) * sh.channels + c) * sh.spectra + spectrum) * 2
                + pol)
                * 2;
            let e = Complex32::new(f32::from(self.x[i]), f32::from(self.x[i + 1]));
            f.grid[cell] = weights[d * 2 + pol] * e;
        }
        bf.fft_rows.process_with_scratch(&mut f.grid, &mut f.fft);
        for (p, row) in f.field.chunks_exact_mut(pn).enumerate() {
            for (q, v) in row[..n].iter_mut().enumerate() {
                *v = f.grid[q * pm + p];
            }
            row[n..].fill(Complex32::default());
        }
        bf.fft_cols.process_with_scratch(&mut f.field, &mut f.fft);
        for (i, v) in acc.iter_mut().zip(&f.field) {
            *i += v.norm_sqr();
        }
    }
}

/// Largest magnitude written by [`encode_f16`]: float16's largest finite value.
pub const F16_MAX: f32 = 65504.0;

/// Values [`encode_f16`] converts per pass (on the stack: 6 KiB).
const ENCODE_BLOCK: usize = 1024;

/// `j · scale` as float16 little-endian into `out` (2 bytes per value), saturated at
/// ±[`F16_MAX`]; returns how many values saturated. Round to nearest even, as
/// `half::f16::from_f32`. A block at a time: scaled, clamped and counted in a loop the
/// compiler vectorises, then converted by `half`'s slice conversion (the CPU's F16C
/// instructions where it has them). Value by value it took 1.7 ns each on the development
/// machine (0.30 ns now, `cargo bench --bench dsp -- frb_cpu/encode`) and 2.7 ns on the
/// device's host, where one chunk's 75 M beam values at seed 004 case 5 took 200 ms, six times
/// the chunk's span (bench/RESULTS.md, FRB share of the chunk time).
pub fn encode_f16(j: &[f32], scale: f32, out: &mut [u8]) -> u64 {
    assert_eq!(out.len(), 2 * j.len());
    let mut clips = 0u64;
    let mut scaled = [0f32; ENCODE_BLOCK];
    let mut halves = [half::f16::ZERO; ENCODE_BLOCK];
    for (jc, oc) in j.chunks(ENCODE_BLOCK).zip(out.chunks_mut(2 * ENCODE_BLOCK)) {
        let (scaled, halves) = (&mut scaled[..jc.len()], &mut halves[..jc.len()]);
        let mut over = 0u32;
        for (x, &v) in scaled.iter_mut().zip(jc) {
            let y = v * scale;
            over += u32::from(y.abs() > F16_MAX);
            *x = y.clamp(-F16_MAX, F16_MAX);
        }
        clips += u64::from(over);
        halves.convert_from_f32_slice(scaled);
        let bits: &[u16] = halves.reinterpret_cast();
        for (o, &h) in oc.chunks_exact_mut(2).zip(bits) {
            o.copy_from_slice(&h.to_le_bytes());
        }
    }
    clips
}

#[cfg(test)]
mod tests;
