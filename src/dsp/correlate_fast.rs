//! The CPU backend's fast X-engine correlator: the same contract as the oracle
//! [`super::correlate::correlate_accumulate`] (seed 001; facts §1.4, §1.9 "X heap"), bit for bit,
//! at tens of times its speed per core, for small arrays on hosts without a GPU.
//!
//! Layouts are the oracle's: input **(antenna, channel, spectrum, pol, re/im)** int8 (or 4-bit,
//! one byte per complex value, real in the high nibble), visibilities **(channel, baseline
//! `a2·(a2+1)/2 + a1`, product `p1 + 2·p2`, re/im)** i64, **accumulated** into, never
//! overwritten.
//!
//! How it is fast:
//! - **Staging.** For one channel and one block of `L` spectra, every signal `s = 2·antenna + pol`
//!   is copied into two i16 rows of `2·L`: `P[s] = (xr, xi, xr, xi, …)` and
//!   `Q[s] = (xi, −xr, xi, −xr, …)`, zero-padded to a multiple of 16 values. Then for signals
//!   `i`, `j`: `Re V = Σ P[i]·P[j]` and `Im V = Σ Q[i]·P[j]` (x · conj(y)): i16 dot products,
//!   the shape of AVX2's `vpmaddwd` (16 multiplies and 8 pairwise adds into i32 per instruction).
//! - **Register tiles.** One antenna pair (a1, a2) is a 2 × 2 tile of signals: six staged rows
//!   feed eight dot products in one pass, eight vector accumulators plus six loads, which fits
//!   the sixteen AVX2 registers (the next larger tile, 2 × 4, needs 24).
//! - **Intrinsics for the tile.** LLVM turns a single i16 dot product into `vpmaddwd`, but the
//!   eight of a tile in one loop into sign extensions and `vpmulld` (checked in the assembly,
//!   rustc 1.95), so the tile is written with `std::arch` (`avx2`); the same tile in plain
//!   Rust (`antenna_pair`) serves every other CPU.
//! - **Exact i32 partial sums.** Each term of a dot product is a product of two values in
//!   [−128, 128], so `|Σ| ≤ 2·128²·L = 2¹⁵·L`; `L ≤` [`MAX_BLOCK`] `= 4096` keeps every partial sum
//!   below 2²⁷, far from 2³¹. Each block's sums are flushed into the i64 accumulator.
//! - **Cache blocking.** `L` is chosen so a block's staged rows (`16·n_ants·L` bytes) fit in
//!   about 256 KiB (an L2 cache), so the inner loop streams from L2, not memory.
//! - **Threads over disjoint output.** Within a channel, baselines are ordered by row `a2`, so the
//!   sequence of (channel, row) pairs maps to consecutive, disjoint ranges of `acc`. The
//!   [`Correlator`] splits that sequence into `threads` contiguous parts of equal work (row `a2`
//!   costs `a2 + 1` tiles) and runs them under `std::thread::scope`: no locks, no atomics, and
//!   the split works even for a single channel.
//!
//! The `unsafe` is confined to entering the AVX2 code after the CPU has been checked for AVX2 at
//! run time. Hand-written because no crate correlates int8 complex signals (BLAS has no integer
//! Hermitian rank-k update).

use std::ops::Range;

use super::correlate::{baseline_index, n_baselines, CorrShape, MISSING};

/// The largest spectrum block: keeps every i32 partial sum below 2²⁷ (see the module doc).
pub const MAX_BLOCK: usize = 4096;

/// Bytes of staged rows one block may occupy (about one L2 cache).
const STAGE_BYTES: usize = 256 * 1024;

/// i16 values per vector step; staged rows are padded to a multiple of it (one AVX2 register).
const LANES: usize = 16;

/// A correlator for one batch shape. It keeps its staging buffers between calls (a call
/// allocates only a few slice handles and spawns `threads − 1` scoped threads).
#[derive(Debug)]
pub struct Correlator {
    shape: CorrShape,
    /// Spectra per staged block (`L`).
    block: usize,
    /// Contiguous ranges of global rows `g = channel·n_ants + a2`, one per thread.
    parts: Vec<Range<usize>>,
    /// Staged rows, one buffer per part.
    scratch: Vec<Stage>,
}

/// One thread's staged rows: `P` and `Q` for every signal, `stride` i16 values each.
#[derive(Debug, Default)]
struct Stage {
    p: Vec<i16>,
    q: Vec<i16>,
}

/// Input samples, 8-bit or packed 4-bit, in the oracle's layout.
#[derive(Clone, Copy)]
enum Input<'a> {
    Eight(&'a [i8]),
    /// One byte per complex value, real in the high nibble (as `unpack_4bit` reads it).
    Four(&'a [u8]),
}

/// One byte of 4-bit input as (real, imaginary): high nibble, low nibble, each signed (as
/// [`super::correlate::unpack_4bit`] reads it).
#[inline(always)]
fn nibbles(b: u8) -> (i16, i16) {
    (i16::from((b as i8) >> 4), i16::from(((b << 4) as i8) >> 4))
}

impl Correlator {
    /// A correlator for `shape` running on `threads` threads (0 is taken as 1; more threads
    /// than rows of work are not used).
    pub fn new(shape: CorrShape, threads: usize) -> Self {
        let per_block = STAGE_BYTES / (16 * shape.n_ants.max(1));
        let block = (per_block / LANES * LANES)
            .clamp(LANES, MAX_BLOCK)
            .min(shape.spectra.max(1));
        let parts = split_rows(shape, threads.max(1));
        let scratch = parts.iter().map(|_| Stage::default()).collect();
        Self {
            shape,
            block,
            parts,
            scratch,
        }
    }

    /// The batch shape this correlator was made for.
    pub fn shape(&self) -> CorrShape {
        self.shape
    }

    /// Accumulate one batch of int8 input (`shape.input_len()`) into `acc`
    /// (`shape.vis_len()`), exactly as [`super::correlate::correlate_accumulate`] does.
    pub fn accumulate(&mut self, x: &[i8], acc: &mut [i64]) {
        assert_eq!(x.len(), self.shape.input_len());
        self.run(Input::Eight(x), acc);
    }

    /// Accumulate one batch of 4-bit input (`shape.input_len() / 2` bytes, one per complex
    /// value, real in the high nibble), exactly as unpacking it with
    /// [`super::correlate::unpack_4bit`] and correlating the result does.
    pub fn accumulate_4bit(&mut self, packed: &[u8], acc: &mut [i64]) {
        assert_eq!(packed.len(), self.shape.input_len() / 2);
        self.run(Input::Four(packed), acc);
    }

    fn run(&mut self, x: Input, acc: &mut [i64]) {
        assert_eq!(acc.len(), self.shape.vis_len());
        if acc.is_empty() {
            return; // no antennas or no channels: nothing to correlate
        }
        let (shape, block) = (self.shape, self.block);
        let mut rest = acc;
        let mut pieces = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let len = row_offset(shape, part.end) - row_offset(shape, part.start);
            let (piece, tail) = rest.split_at_mut(len);
            pieces.push(piece);
            rest = tail;
        }
        let mut jobs = self.parts.iter().zip(&mut self.scratch).zip(pieces);
        // The calling thread takes the first part itself and spawns one thread per other part.
        let ((rows, stage), piece) = jobs.next().expect("at least one part");
        std::thread::scope(|s| {
            for ((rows, stage), piece) in jobs {
                s.spawn(move || correlate_rows(shape, block, x, rows.clone(), stage, piece));
            }
            correlate_rows(shape, block, x, rows.clone(), stage, piece);
        });
    }
}

/// [`super::correlate::reduce`] (i64 → i32 with saturation to ±(2³¹ − 1), the clip count, and
/// [`MISSING`] on baselines with an absent antenna), with the same results, in one pass over
/// the buffers in memory order: the oracle walks them baseline by baseline, a channel's stride
/// apart, which misses the cache and the TLB on every access once the buffer is large. `out`
/// is **overwritten**. Returns the clip count.
pub fn reduce(shape: CorrShape, acc: &[i64], present: &[bool], out: &mut [i32]) -> u64 {
    assert_eq!(acc.len(), shape.vis_len());
    assert_eq!(out.len(), acc.len());
    assert_eq!(present.len(), shape.n_ants);
    let per_channel = n_baselines(shape.n_ants) * 8;
    let mut clips = 0;
    for (acc, out) in acc
        .chunks_exact(per_channel)
        .zip(out.chunks_exact_mut(per_channel))
    {
        // Baselines in buffer order are (a1, a2) for a2 = 0, 1, … and a1 = 0..=a2.
        let pairs = (0..shape.n_ants).flat_map(|a2| (0..=a2).map(move |a1| (a1, a2)));
        for ((a1, a2), (acc, out)) in pairs.zip(acc.chunks_exact(8).zip(out.chunks_exact_mut(8))) {
            if present[a1] && present[a2] {
                for (o, &v) in out.iter_mut().zip(acc) {
                    let c = v.clamp(-i64::from(i32::MAX), i64::from(i32::MAX));
                    clips += u64::from(c != v);
                    *o = c as i32;
                }
            } else {
                for pair in out.chunks_exact_mut(2) {
                    pair.copy_from_slice(&[MISSING.0, MISSING.1]);
                }
            }
        }
    }
    clips
}

/// Offset in the visibility buffer of global row `g = channel·n_ants + a2` (its baseline
/// `(0, a2)`); `row_offset(channels·n_ants)` is the buffer's length.
fn row_offset(shape: CorrShape, g: usize) -> usize {
    let (c, a2) = (g / shape.n_ants, g % shape.n_ants);
    (c * n_baselines(shape.n_ants) + baseline_index(0, a2)) * 8
}

/// Split the global rows into at most `threads` contiguous ranges of about equal work (row
/// `a2` has `a2 + 1` baselines); empty ranges are dropped.
fn split_rows(shape: CorrShape, threads: usize) -> Vec<Range<usize>> {
    let rows = shape.channels * shape.n_ants;
    let total = shape.channels * n_baselines(shape.n_ants);
    let mut parts = Vec::with_capacity(threads);
    let (mut start, mut done) = (0, 0);
    for g in 0..rows {
        done += g % shape.n_ants + 1;
        // Cut when this part has reached its share of the total work.
        if done * threads >= total * (parts.len() + 1) {
            parts.push(start..g + 1);
            start = g + 1;
        }
    }
    if start < rows {
        parts.push(start..rows);
    }
    parts
}

/// Correlate global rows `rows` into `acc` (their slice of the visibility buffer), with the
/// AVX2 tile where the CPU has AVX2.
fn correlate_rows(
    shape: CorrShape,
    block: usize,
    x: Input,
    rows: Range<usize>,
    stage: &mut Stage,
    acc: &mut [i64],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `correlate_rows_avx2` requires AVX2, checked on the line above.
        unsafe { correlate_rows_avx2(shape, block, x, rows, stage, acc) };
        return;
    }
    correlate_rows_body(shape, block, x, rows, stage, acc, antenna_pair);
}

/// [`correlate_rows_body`] compiled for AVX2, with the AVX2 tile.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn correlate_rows_avx2(
    shape: CorrShape,
    block: usize,
    x: Input,
    rows: Range<usize>,
    stage: &mut Stage,
    acc: &mut [i64],
) {
    correlate_rows_body(shape, block, x, rows, stage, acc, |s, stride, a1, a2| {
        // SAFETY: this closure runs only inside `correlate_rows_avx2`, whose caller checked
        // that the CPU supports AVX2.
        unsafe { avx2::antenna_pair(s, stride, a1, a2) }
    });
}

#[inline(always)]
fn correlate_rows_body(
    shape: CorrShape,
    block: usize,
    x: Input,
    rows: Range<usize>,
    stage: &mut Stage,
    acc: &mut [i64],
    tile: impl Fn(&Stage, usize, usize, usize) -> [i32; 8],
) {
    let n_ants = shape.n_ants;
    let base = row_offset(shape, rows.start);
    let mut g = rows.start;
    while g < rows.end {
        let c = g / n_ants;
        let (lo, hi) = (g % n_ants, (g % n_ants + rows.end - g).min(n_ants));
        for t0 in (0..shape.spectra).step_by(block) {
            let len = block.min(shape.spectra - t0);
            let stride = stage_block(shape, x, c, t0..t0 + len, hi, stage);
            for a2 in lo..hi {
                let row = row_offset(shape, c * n_ants + a2) - base;
                for a1 in 0..=a2 {
                    let v = tile(stage, stride, a1, a2);
                    for (o, s) in acc[row + a1 * 8..][..8].iter_mut().zip(v) {
                        *o += i64::from(s);
                    }
                }
            }
        }
        g += hi - lo;
    }
}

/// Stage spectra `t` of channel `c` for antennas `0..n_ants_used` into `P` and `Q` rows (see the
/// module doc); returns the row stride in i16 values (a multiple of [`LANES`]).
#[inline(always)]
fn stage_block(
    shape: CorrShape,
    x: Input,
    c: usize,
    t: Range<usize>,
    n_ants_used: usize,
    stage: &mut Stage,
) -> usize {
    let stride = (2 * t.len()).div_ceil(LANES) * LANES;
    let n = 2 * n_ants_used * stride;
    if stage.p.len() < n {
        stage.p.resize(n, 0);
        stage.q.resize(n, 0);
    }
    let len = t.len();
    for a in 0..n_ants_used {
        // Index of the block's first value in the 8-bit layout.
        let first = ((a * shape.channels + c) * shape.spectra + t.start) * 4;
        let (p0, p1) = stage.p[2 * a * stride..][..2 * stride].split_at_mut(stride);
        let (q0, q1) = stage.q[2 * a * stride..][..2 * stride].split_at_mut(stride);
        // Each spectrum's two complex values `v = [re0, im0, re1, im1]` into its four pairs; one
        // pass per input format so that LLVM vectorises the loop.
        let mut put = |k: usize, v: [i16; 4]| {
            p0[2 * k..2 * k + 2].copy_from_slice(&[v[0], v[1]]);
            q0[2 * k..2 * k + 2].copy_from_slice(&[v[1], -v[0]]);
            p1[2 * k..2 * k + 2].copy_from_slice(&[v[2], v[3]]);
            q1[2 * k..2 * k + 2].copy_from_slice(&[v[3], -v[2]]);
        };
        match x {
            Input::Eight(x) => {
                for (k, v) in x[first..first + 4 * len].chunks_exact(4).enumerate() {
                    put(k, [v[0], v[1], v[2], v[3]].map(i16::from));
                }
            }
            Input::Four(x) => {
                for (k, v) in x[first / 2..first / 2 + 2 * len]
                    .chunks_exact(2)
                    .enumerate()
                {
                    let (re0, im0) = nibbles(v[0]);
                    let (re1, im1) = nibbles(v[1]);
                    put(k, [re0, im0, re1, im1]);
                }
            }
        }
        for row in [p0, p1, q0, q1] {
            row[2 * len..].fill(0);
        }
    }
    stride
}

/// The six staged rows of antenna pair (a1, a2): `P` and `Q` of a1's two signals, `P` of
/// a2's, each `stride` values.
#[inline(always)]
fn tile_rows<'a>(stage: &'a Stage, stride: usize, a1: usize, a2: usize) -> [&'a [i16]; 6] {
    let (p, q) = (&stage.p[..], &stage.q[..]);
    let row = |v: &'a [i16], s: usize| &v[s * stride..(s + 1) * stride];
    [
        row(p, 2 * a1),
        row(p, 2 * a1 + 1),
        row(q, 2 * a1),
        row(q, 2 * a1 + 1),
        row(p, 2 * a2),
        row(p, 2 * a2 + 1),
    ]
}

/// The 2 × 2 signal tile of antennas (a1, a2): `[Re, Im]` of products `p1 + 2·p2`, in the
/// visibility buffer's order. Exact in i32 for `stride ≤ 2·MAX_BLOCK` (module doc). The
/// portable form: LLVM vectorises it with `pmulld`, but not with `pmaddwd` (it does so for a
/// single i16 dot product, not for eight in one loop), hence the AVX2 form in [`avx2`].
#[inline(always)]
fn antenna_pair(stage: &Stage, stride: usize, a1: usize, a2: usize) -> [i32; 8] {
    let [x0, x1, q0, q1, y0, y1] = tile_rows(stage, stride, a1, a2);
    let (mut r00, mut r10, mut r01, mut r11) = (0i32, 0i32, 0i32, 0i32);
    let (mut i00, mut i10, mut i01, mut i11) = (0i32, 0i32, 0i32, 0i32);
    for k in 0..stride {
        let (a0, a1, b0, b1) = (
            i32::from(x0[k]),
            i32::from(x1[k]),
            i32::from(q0[k]),
            i32::from(q1[k]),
        );
        let (c0, c1) = (i32::from(y0[k]), i32::from(y1[k]));
        r00 += a0 * c0;
        r10 += a1 * c0;
        r01 += a0 * c1;
        r11 += a1 * c1;
        i00 += b0 * c0;
        i10 += b1 * c0;
        i01 += b0 * c1;
        i11 += b1 * c1;
    }
    [r00, i00, r10, i10, r01, i01, r11, i11]
}

/// The same tile with AVX2's `vpmaddwd`: per 16 staged values (8 spectra), six loads and
/// eight multiply-adds into eight accumulators, 14 of the 16 vector registers.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_hadd_epi32, _mm256_madd_epi16, _mm256_permute2x128_si256,
        _mm256_setzero_si256,
    };

    use super::{tile_rows, Stage, LANES};

    /// See [`super::antenna_pair`]; `stride` must be a multiple of [`LANES`].
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn antenna_pair(stage: &Stage, stride: usize, a1: usize, a2: usize) -> [i32; 8] {
        let [x0, x1, q0, q1, y0, y1] = tile_rows(stage, stride, a1, a2);
        let mut acc = [_mm256_setzero_si256(); 8];
        for k in (0..stride).step_by(LANES) {
            let load = |r: &[i16]| -> __m256i {
                let v: [i16; LANES] = r[k..k + LANES].try_into().unwrap();
                bytemuck::cast(v)
            };
            let (a0, a1, b0, b1, c0, c1) =
                (load(x0), load(x1), load(q0), load(q1), load(y0), load(y1));
            // In the visibility buffer's order: Re, Im of products 0 (p1 = p2 = 0) to 3.
            for (s, (x, y)) in acc.iter_mut().zip([
                (a0, c0),
                (b0, c0),
                (a1, c0),
                (b1, c0),
                (a0, c1),
                (b0, c1),
                (a1, c1),
                (b1, c1),
            ]) {
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(x, y));
            }
        }
        // Horizontal sums of the eight accumulators into the eight lanes of one vector.
        let h = |i: usize| {
            _mm256_hadd_epi32(
                _mm256_hadd_epi32(acc[i], acc[i + 1]),
                _mm256_hadd_epi32(acc[i + 2], acc[i + 3]),
            )
        };
        let (lo, hi) = (h(0), h(4));
        let sum = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        );
        bytemuck::cast(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::correlate::correlate_accumulate;
    use crate::dsp::random::mix;

    /// The portable tile (what CPUs without AVX2 run; the integration tests reach only the
    /// AVX2 one on this machine) against the oracle, with blocks of 16 spectra so that 37 spectra
    /// make three blocks, the last one partial.
    #[test]
    fn portable_tile_matches_the_oracle() {
        let shape = CorrShape {
            n_ants: 5,
            channels: 3,
            spectra: 37,
        };
        let x: Vec<i8> = (0..shape.input_len() as u64)
            .map(|i| mix(5, 0, i) as i8)
            .collect();
        let mut want = vec![0i64; shape.vis_len()];
        correlate_accumulate(shape, &x, &mut want);
        let mut got = vec![0i64; shape.vis_len()];
        let rows = 0..shape.channels * shape.n_ants;
        let mut stage = Stage::default();
        let x = Input::Eight(&x);
        correlate_rows_body(shape, 16, x, rows, &mut stage, &mut got, antenna_pair);
        assert_eq!(got, want);
    }

    #[test]
    fn rows_split_into_contiguous_parts_of_even_work() {
        let shape = CorrShape {
            n_ants: 8,
            channels: 3,
            spectra: 1,
        };
        for threads in 1..=30 {
            let parts = split_rows(shape, threads);
            assert!(parts.len() <= threads);
            assert_eq!(parts[0].start, 0);
            assert_eq!(parts.last().unwrap().end, 24);
            for w in parts.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(!w[0].is_empty());
            }
        }
        // 108 baselines over 2 threads: the cut lands where half the work is done.
        let parts = split_rows(shape, 2);
        let work = |r: &Range<usize>| r.clone().map(|g| g % 8 + 1).sum::<usize>();
        assert_eq!(work(&parts[0]) + work(&parts[1]), 108);
        assert!(work(&parts[0]).abs_diff(54) <= 8, "{parts:?}");
    }
}
