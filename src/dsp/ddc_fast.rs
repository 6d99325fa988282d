//! The CPU backend's fast narrowband down-conversion: the contract of the oracle
//! [`super::ddc::ddc`] (seed 000 §Down-conversion kernel, seed 002) — same inputs, `out`
//! overwritten — in f32, within katgpucbf's DDC tolerances of it (the tests below), at about
//! fifteen times its speed per core (`bench/RESULTS.md`).
//!
//! How it is fast:
//! - **Mixer folded into the taps once per configuration** ([`FastDdc::new`]), as the CUDA
//!   kernel does: y_b = e^{2πj·f·(t₀ + S·b)} · Σ_k x[S·b + k]·z_k, z_k = h_k·e^{2πj·f·k}
//!   (`dsp::ddc`'s factorisation, exact in the 32-bit fixed-point phase), computed in f64 with
//!   the oracle's phase and rounded to f32 once.
//! - **Symmetric filters fold pairs of taps.** A real h with h_k = h_{T−1−k} (every Remez design
//!   the engine makes; checked exactly, tap by tap) gives z_{T−1−k} = e^{jφ}·conj(z_k) with
//!   φ = f·(T − 1) (exact in the fixed-point phase too), so with w_k = z_k·e^{−jφ/2} a pair of
//!   samples u = x[S·b + k], v = x[S·b + T−1−k] contributes
//!   e^{jφ/2}·((u + v)·Re w_k + j·(u − v)·Im w_k): two multiply-adds per pair instead of four
//!   (a middle tap of an odd filter is a pair with itself at half weight). e^{jφ/2} joins the
//!   output rotation. Any other filter takes the plain form, two multiply-adds per tap.
//! - **Polyphase rows, outputs across the vector.** A tile of outputs b₀ + m has its input
//!   converted once into S rows of f32, row q holding x[S·(b₀ + m) + q] (tap k = p·S + q
//!   reads row q at m + p), so that one tap applied to a block of consecutive outputs (32, or
//!   64 with AVX-512) is a multiply-add of a broadcast weight by a contiguous slice of a row:
//!   the compiler keeps the block's sums in vector registers, and each weight load serves the
//!   whole block. A tile is about 8192 input samples, so its rows stay in the L1/L2 cache
//!   while every tap sweeps them.
//! - **Rotation from the fixed-point phase** of the absolute sample (`mixer_phase`, as the
//!   oracle), once per block: e^{2πj·phase/2³²} = `coarse[phase >> 20]`·e^{jε}, a table of
//!   4096 f64-computed values times a cubic in ε < 2π·2⁻¹² (its error, ε⁴/24 < 3·10⁻¹³, is far
//!   below f32's); output i of the block then turns by a further e^{2πj·f·S·i}, from a table
//!   computed in f64 with the fixed-point phase.
//! - **Vector instructions picked at run time**: AVX-512 where the CPU has it, else AVX2 with
//!   FMA, else whatever the target has (the same code in each; `f32::mul_add` is one
//!   instruction wherever FMA exists).
//!
//! Error against the f64 oracle (the tests): worst 1–6·10⁻⁷·2^bits, RMS 2·10⁻⁸–2·10⁻⁷·2^bits
//! (the larger at 8192 taps), ten to a hundred times inside katgpucbf's bounds.
#![deny(unsafe_code)]

use std::f64::consts::PI;

use num_complex::{Complex32, Complex64};

use super::ddc::{cis, mixer_phase};

/// Outputs summed together in one pass over the taps with AVX2 (and without): four vector
/// registers of sums per real and imaginary part, eight independent chains of fused
/// multiply-adds to cover their latency, in half of the sixteen registers.
const BLOCK: usize = 32;
/// The same with AVX-512: four registers per part again (two would leave the multiply-add
/// units idle half the time waiting for the previous sum), of the thirty-two.
const BLOCK_AVX512: usize = 64;
/// Runs may be split at multiples of this many outputs without changing any value: a run over
/// `x[S·k ..]` from sample `t_first + S·k` gives outputs k, k + 1, … bit for bit as the whole
/// run does when k is a multiple of it (every block starts at the same outputs, so every
/// output has the same sums and the same rotation).
pub const SPLIT: usize = BLOCK_AVX512;
/// Input samples per tile: its rows (4 bytes a sample) fit a 32–48 KiB L1 cache.
const TILE_SAMPLES: usize = 8192;
/// Bits of the mixer phase resolved by the coarse rotation table.
const COARSE_BITS: u32 = 12;
const FINE_BITS: u32 = 32 - COARSE_BITS;
/// Radians per unit of the 32-bit phase.
const RADIANS_PER_UNIT: f32 = (2.0 * PI / 4_294_967_296.0) as f32;

/// One tap of the plain form: row offset within a tile, and z_k.
#[derive(Debug, Clone, Copy)]
struct Tap {
    at: usize,
    re: f32,
    im: f32,
}

/// One pair of taps (k, T−1−k) of the symmetric form: their row offsets and w_k.
#[derive(Debug, Clone, Copy)]
struct Pair {
    u: usize,
    v: usize,
    re: f32,
    im: f32,
}

#[derive(Debug)]
enum Terms {
    Plain(Vec<Tap>),
    Symmetric(Vec<Pair>),
}

/// A down-converter for one filter, subsampling factor and mixer (one narrowband output). It
/// keeps its tile buffer between calls; [`FastDdc::run`] allocates nothing.
#[derive(Debug)]
pub struct FastDdc {
    subsampling: usize,
    taps: usize,
    step: u32,
    /// Outputs per tile (a multiple of every block size) and samples per polyphase row.
    tile: usize,
    row_len: usize,
    terms: Terms,
    /// e^{2πj·(i·2²⁰)/2³²} for the plain form, times e^{jφ/2} for the symmetric one.
    coarse: Vec<Complex32>,
    /// The mixer's turn from a block's first output to its output i: e^{2πj·f·S·i}, real and
    /// imaginary parts, for i < the largest block.
    turn_re: Vec<f32>,
    turn_im: Vec<f32>,
    /// The tile's polyphase rows: S × `row_len` f32, row-major.
    rows: Vec<f32>,
}

impl FastDdc {
    /// The down-converter for real taps `weights` (T of them), subsampling factor `subsampling`
    /// (≥ 1) and the mixer's fixed-point step `step` (`dsp::ddc::mixer_step`).
    pub fn new(weights: &[f32], subsampling: usize, step: u32) -> FastDdc {
        assert!(subsampling > 0, "the subsampling factor must be positive");
        let (s, taps) = (subsampling, weights.len());
        let tile = (TILE_SAMPLES / s / BLOCK_AVX512).max(1) * BLOCK_AVX512;
        // Tap k = p·S + q reads row q at output offset p, p < ⌈T/S⌉.
        let row_len = tile + taps.div_ceil(s).saturating_sub(1);
        let at = |k: usize| (k % s) * row_len + k / s;
        let z = |k: usize| cis(mixer_phase(step, k as u64)) * f64::from(weights[k]);
        let symmetric = taps > 0 && (0..taps / 2).all(|k| weights[k] == weights[taps - 1 - k]);
        let (terms, turn) = if symmetric {
            // e^{jφ/2}, φ the mixer phase of tap T − 1 (any half of it: w_k and the output
            // rotation use the same one).
            let phi = mixer_phase(step, taps as u64 - 1);
            let half = Complex64::from_polar(1.0, PI * f64::from(phi) / 4_294_967_296.0);
            let pairs = (0..taps.div_ceil(2))
                .map(|k| {
                    let own = if 2 * k + 1 == taps { 0.5 } else { 1.0 };
                    let w = z(k) * half.conj() * own;
                    Pair {
                        u: at(k),
                        v: at(taps - 1 - k),
                        re: w.re as f32,
                        im: w.im as f32,
                    }
                })
                .collect();
            (Terms::Symmetric(pairs), half)
        } else {
            let plain = (0..taps)
                .map(|k| {
                    let v = z(k);
                    Tap {
                        at: at(k),
                        re: v.re as f32,
                        im: v.im as f32,
                    }
                })
                .collect();
            (Terms::Plain(plain), Complex64::new(1.0, 0.0))
        };
        let coarse = (0..1u32 << COARSE_BITS)
            .map(|i| {
                let v = cis(i << FINE_BITS) * turn;
                Complex32::new(v.re as f32, v.im as f32)
            })
            .collect();
        let turns: Vec<Complex64> = (0..BLOCK_AVX512)
            .map(|i| cis(mixer_phase(step, (s * i) as u64)))
            .collect();
        FastDdc {
            turn_re: turns.iter().map(|v| v.re as f32).collect(),
            turn_im: turns.iter().map(|v| v.im as f32).collect(),
            subsampling,
            taps,
            step,
            tile,
            row_len,
            terms,
            coarse,
            rows: vec![0.0; s * row_len],
        }
    }

    /// `x`: input samples, `x[0]` being absolute sample `t_first`; `out`: n complex outputs,
    /// **overwritten**, output b being the filter over x[S·b ..] mixed with the phase of
    /// sample t_first + S·b; needs `x.len() ≥ S·(n − 1) + T` (as the oracle).
    pub fn run(&mut self, x: &[i32], t_first: u64, out: &mut [Complex32]) {
        let s = self.subsampling;
        assert!(
            out.is_empty() || x.len() >= s * (out.len() - 1) + self.taps,
            "input too short for the outputs"
        );
        self.run_tiles(x, t_first, out);
    }

    /// Every tile, in the widest vector instructions this CPU has.
    #[allow(unsafe_code)]
    fn run_tiles(&mut self, x: &[i32], t_first: u64, out: &mut [Complex32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has the features `tiles_avx512` is compiled for (checked).
                unsafe { self.tiles_avx512(x, t_first, out) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has the features `tiles_avx2` is compiled for (checked).
                unsafe { self.tiles_avx2(x, t_first, out) };
                return;
            }
        }
        self.tiles::<BLOCK>(x, t_first, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn tiles_avx512(&mut self, x: &[i32], t_first: u64, out: &mut [Complex32]) {
        self.tiles::<BLOCK_AVX512>(x, t_first, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tiles_avx2(&mut self, x: &[i32], t_first: u64, out: &mut [Complex32]) {
        self.tiles::<BLOCK>(x, t_first, out);
    }

    /// Every tile, `B` outputs at a time.
    #[inline(always)]
    fn tiles<const B: usize>(&mut self, x: &[i32], t_first: u64, out: &mut [Complex32]) {
        let s = self.subsampling;
        for (t, tile_out) in out.chunks_mut(self.tile).enumerate() {
            let b0 = t * self.tile;
            fill_rows(x, s, b0, self.row_len, &mut self.rows);
            for (j, ys) in tile_out.chunks_mut(B).enumerate() {
                let first = j * B;
                let (re, im) = match &self.terms {
                    Terms::Plain(taps) => plain_sums::<B>(&self.rows, taps, first),
                    Terms::Symmetric(pairs) => symmetric_sums::<B>(&self.rows, pairs, first),
                };
                let b = (b0 + first) as u64;
                let r = self.rotation(mixer_phase(self.step, t_first.wrapping_add(s as u64 * b)));
                let turns = self.turn_re[..B].iter().zip(&self.turn_im[..B]);
                for (((y, &re), &im), (&cr, &ci)) in ys.iter_mut().zip(&re).zip(&im).zip(turns) {
                    let c = Complex32::new(r.re * cr - r.im * ci, r.re * ci + r.im * cr);
                    *y = Complex32::new(re, im) * c;
                }
            }
        }
    }

    /// e^{2πj·phase/2³²} (times e^{jφ/2} for a symmetric filter): the coarse table's entry
    /// times e^{jε} to third order in ε.
    #[inline(always)]
    fn rotation(&self, phase: u32) -> Complex32 {
        let e = (phase & ((1 << FINE_BITS) - 1)) as f32 * RADIANS_PER_UNIT;
        let e2 = e * e;
        let fine = Complex32::new(1.0 - 0.5 * e2, e - e * e2 * (1.0 / 6.0));
        self.coarse[(phase >> FINE_BITS) as usize] * fine
    }
}

/// The tile's polyphase rows: row q (of `row_len` values at q·`row_len`) holds
/// x[S·(b0 + m) + q] for m < `row_len`, zero past the end of `x`.
#[inline(always)]
fn fill_rows(x: &[i32], s: usize, b0: usize, row_len: usize, rows: &mut [f32]) {
    for (q, row) in rows.chunks_exact_mut(row_len).enumerate() {
        let src = x.get(s * b0 + q..).unwrap_or(&[]);
        let n = src.len().div_ceil(s).min(row_len);
        let mut m = 0;
        while m + 16 <= n {
            let from = &src[m * s..m * s + 15 * s + 1];
            let to: &mut [f32; 16] = (&mut row[m..m + 16]).try_into().unwrap();
            for i in 0..16 {
                to[i] = from[i * s] as f32;
            }
            m += 16;
        }
        if m < n {
            for (r, &v) in row[m..n].iter_mut().zip(src[m * s..].iter().step_by(s)) {
                *r = v as f32;
            }
        }
        row[n..].fill(0.0);
    }
}

/// The `B` filter sums of outputs `first ..` of the tile, plain form: Σ_k row·z_k.
#[inline(always)]
fn plain_sums<const B: usize>(rows: &[f32], taps: &[Tap], first: usize) -> ([f32; B], [f32; B]) {
    let (mut re, mut im) = ([0f32; B], [0f32; B]);
    for t in taps {
        let u: &[f32; B] = rows[t.at + first..t.at + first + B].try_into().unwrap();
        for i in 0..B {
            re[i] = u[i].mul_add(t.re, re[i]);
            im[i] = u[i].mul_add(t.im, im[i]);
        }
    }
    (re, im)
}

/// The `B` filter sums of outputs `first ..` of the tile, symmetric form:
/// Σ (u + v)·Re w_k + j·(u − v)·Im w_k.
#[inline(always)]
fn symmetric_sums<const B: usize>(
    rows: &[f32],
    pairs: &[Pair],
    first: usize,
) -> ([f32; B], [f32; B]) {
    let (mut re, mut im) = ([0f32; B], [0f32; B]);
    for p in pairs {
        let u: &[f32; B] = rows[p.u + first..p.u + first + B].try_into().unwrap();
        let v: &[f32; B] = rows[p.v + first..p.v + first + B].try_into().unwrap();
        for i in 0..B {
            re[i] = (u[i] + v[i]).mul_add(p.re, re[i]);
            im[i] = (u[i] - v[i]).mul_add(p.im, im[i]);
        }
    }
    (re, im)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::ddc::{ddc, ddc_weights_discard, ddc_weights_no_discard, mixer_step};
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// katgpucbf's DDC tolerances (its `test_ddc`), in units of 2^bits, as `cbf selftest
    /// --gpu` applies them to the CUDA kernel: every output within `ATOL`, RMS below `RMS`.
    const ATOL: f64 = 2e-5;
    const RMS: f64 = 2e-6;

    /// Random taps at a real filter's scale (Σ|h| ≈ 1.5·√S, as a Remez design normalised to
    /// gain √S has), mirrored into a symmetric filter if `symmetric`.
    fn random_taps(rng: &mut SmallRng, taps: usize, s: usize, symmetric: bool) -> Vec<f32> {
        let a = 3.0 * (s as f32).sqrt() / taps as f32;
        let mut h: Vec<f32> = (0..taps).map(|_| rng.random_range(-a..a)).collect();
        if symmetric {
            for k in 0..taps / 2 {
                h[taps - 1 - k] = h[k];
            }
        }
        h
    }

    /// The fast DDC against the f64 oracle on random full-scale `bits`-bit input with some
    /// samples to spare, both as this CPU runs it and in the 32-output blocks of AVX2 and
    /// other CPUs: (worst error, RMS error) in units of 2^bits.
    fn errors(
        rng: &mut SmallRng,
        h: &[f32],
        s: usize,
        bits: u32,
        t_first: u64,
        n_out: usize,
    ) -> (f64, f64) {
        let step = mixer_step(rng.random_range(-0.5..0.5));
        let n_in = s * (n_out - 1) + h.len() + rng.random_range(0..2 * s);
        let (lo, hi) = (-(1i32 << (bits - 1)), (1i32 << (bits - 1)) - 1);
        let x: Vec<i32> = (0..n_in).map(|_| rng.random_range(lo..=hi)).collect();
        let mut want = vec![Complex32::default(); n_out];
        ddc(&x, h, s, step, t_first, &mut want);
        // Overwritten, not accumulated into.
        let mut got = vec![Complex32::new(f32::NAN, 1e30); n_out];
        let mut d = FastDdc::new(h, s, step);
        d.run(&x, t_first, &mut got);
        let mut narrow = vec![Complex32::new(f32::NAN, 1e30); n_out];
        d.tiles::<BLOCK>(&x, t_first, &mut narrow);
        let (mut worst, mut sq) = (0f64, 0f64);
        for (g, w) in got.iter().zip(&want).chain(narrow.iter().zip(&want)) {
            let d = f64::from((g - w).norm());
            worst = worst.max(d);
            sq += d * d;
        }
        let full = f64::from(1u32 << bits);
        (worst / full, (sq / (2 * n_out) as f64).sqrt() / full)
    }

    fn assert_within(case: &str, (worst, rms): (f64, f64)) {
        assert!(
            worst <= ATOL && rms <= RMS,
            "{case}: worst {worst:.2e} (limit {ATOL:.0e}), rms {rms:.2e} (limit {RMS:.0e})"
        );
    }

    /// The engine's own filters (katgpucbf's designs at 16·S taps, discard and no-discard, at
    /// decimation 8 and 16) are exactly symmetric in f32, so the engine takes the folded form.
    #[test]
    fn the_engines_filters_take_the_symmetric_form() {
        for s in [8, 16, 32] {
            for h in [
                ddc_weights_discard(16 * s, s, 0.005).unwrap(),
                ddc_weights_no_discard(16 * s, s, 0.8, 0.005).unwrap(),
            ] {
                let d = FastDdc::new(&h, s, mixer_step(0.3));
                assert!(matches!(d.terms, Terms::Symmetric(_)), "S {s}");
            }
        }
    }

    /// Every sample width on the engine's filters, and on random filters of both forms over
    /// subsampling factors that are odd, not powers of two and large, odd tap counts, filters
    /// shorter than one phase, several tiles with a ragged last block, and absolute
    /// timestamps past 2⁴⁰ (the fixed-point mixer keeps only their low 32 bits).
    #[test]
    fn matches_the_oracle_within_katgpucbf_tolerances() {
        let mut rng = SmallRng::seed_from_u64(0xddc_fa57);
        let big = |rng: &mut SmallRng| (1u64 << 40) + rng.random_range(0..1u64 << 40);
        for s in [8, 16] {
            let h = ddc_weights_discard(16 * s, s, 0.005).unwrap();
            for bits in 2..=16 {
                let t = big(&mut rng);
                assert_within(
                    &format!("discard S {s} {bits}-bit"),
                    errors(&mut rng, &h, s, bits, t, 2500),
                );
            }
            let h = ddc_weights_no_discard(16 * s, s, 0.8, 0.005).unwrap();
            let t = big(&mut rng);
            assert_within(
                &format!("no-discard S {s}"),
                errors(&mut rng, &h, s, 10, t, 1500),
            );
        }
        for (s, taps, bits, n_out) in [
            (1, 17, 8, 700),
            (2, 1, 10, 300),
            (3, 7, 16, 1000),
            (4, 3, 10, 1000),
            (5, 81, 12, 1300),
            (6, 96, 10, 2500),
            (8, 123, 10, 2000),
            (10, 155, 4, 1500),
            (12, 200, 12, 1000),
            (24, 384, 8, 700),
            (100, 1601, 10, 300),
            (512, 8192, 10, 90),
        ] {
            for symmetric in [false, true] {
                let h = random_taps(&mut rng, taps, s, symmetric);
                let t = big(&mut rng);
                assert_within(
                    &format!("S {s} taps {taps} {bits}-bit symmetric {symmetric}"),
                    errors(&mut rng, &h, s, bits, t, n_out),
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any subsampling factor, tap count, width, output count, timestamp and either form.
        #[test]
        fn any_shape_matches_the_oracle(
            s in 1usize..40,
            taps in 1usize..300,
            bits in 2u32..=16,
            n_out in 1usize..400,
            t_first in 0u64..1 << 62,
            symmetric in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            let h = random_taps(&mut rng, taps, s, symmetric);
            let (worst, rms) = errors(&mut rng, &h, s, bits, t_first, n_out);
            prop_assert!(worst <= ATOL && rms <= RMS, "worst {worst:.2e}, rms {rms:.2e}");
        }
    }
}
