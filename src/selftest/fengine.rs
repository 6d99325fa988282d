//! The F-engine's CUDA kernels and backend against their `src/dsp` oracle on fresh random inputs
//! and on the edge cases (full-scale input, every sample width, unzip factors 1, 2 and 4, a
//! coarse-delay change inside a heap, both output widths, with and without dither), with
//! katgpucbf's tolerances: PFB output within rtol 1e-5 (the kernel rounds as the oracle does, so
//! it is expected to be exact), digitiser power exact, post-processed values within ±1 LSB,
//! clip counts exact up to the values whose pre-quantisation magnitude lies within float
//! rounding of the clip level.

use std::sync::Arc;

use num_complex::Complex32;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::backends::{drive_both, heap_inputs, values};
use super::Check;
use crate::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft, Window};
use crate::dsp::postproc::{correct, dither, OutputBits, SpectrumDelay};
use crate::dsp::samples::pack;
use crate::fengine::backend::{Backend, ChunkInput, CpuBackend};
use crate::fengine::cuda::{default_unzip, GpuBackend, GpuConfig};
use crate::fengine::output::WidebandOutput;
use crate::gpu::{Gpu, GpuError};

/// One backend comparison's shape.
#[derive(Clone, Copy)]
struct Shape {
    channels: usize,
    taps: usize,
    bits: u32,
    unzip: usize,
    /// Spectra per heap, heaps, heaps per back-end launch.
    spectra: usize,
    heaps: usize,
    batch: usize,
    out_bits: OutputBits,
    dither: bool,
    full_scale: bool,
    gain: f32,
}

fn output(channels: usize, taps: usize, dither: bool) -> WidebandOutput {
    WidebandOutput {
        name: "selftest".into(),
        channels,
        dst: vec![],
        taps,
        w_cutoff: 1.0,
        window: Window::Hann,
        dither,
        jones_per_batch: None,
    }
}

/// Random samples of `bits` (all ±full scale if `full_scale`), packed per polarisation.
fn random_input(rng: &mut SmallRng, n: usize, bits: u32, full_scale: bool) -> (Vec<i32>, Vec<u8>) {
    let lo = -(1i32 << (bits - 1));
    let hi = (1i32 << (bits - 1)) - 1;
    let x: Vec<i32> = (0..n)
        .map(|_| {
            if full_scale {
                if rng.random::<bool>() {
                    hi
                } else {
                    lo
                }
            } else {
                rng.random_range(lo..=hi)
            }
        })
        .collect();
    let mut packed = vec![0u8; n * bits as usize / 8];
    pack(&x, bits, &mut packed);
    (x, packed)
}

/// Window starts of `spectra` spectra of each pol: consecutive steps, with a coarse-delay jump
/// half way through (different per pol, so the two runs stop lining up) and a differential
/// delay between the pols.
fn starts(step: usize, spectra: usize) -> [Vec<usize>; 2] {
    let jump = [3usize, 11];
    let base = [7usize, 2];
    [0, 1].map(|p| {
        (0..spectra)
            .map(|j| base[p] + j * step + if j >= spectra / 2 { jump[p] } else { 0 })
            .collect()
    })
}

/// Every spectrum of `starts` through `b`'s front end, pols interleaved as the pipeline does.
fn front_ends(b: &mut dyn Backend, starts: &[Vec<usize>; 2]) -> Result<(), GpuError> {
    for (k, (&s0, &s1)) in starts[0].iter().zip(&starts[1]).enumerate() {
        b.front_end(0, s0, k)?;
        b.front_end(1, s1, k)?;
    }
    Ok(())
}

/// Chunk of `body` samples per pol and its successor, as the backends take them.
pub(super) struct Chunks {
    pub samples: [Vec<i32>; 2],
    pub data: Vec<u8>,
    pub next: Vec<u8>,
}

pub(super) fn chunks(
    rng: &mut SmallRng,
    body: usize,
    tail: usize,
    bits: u32,
    full_scale: bool,
) -> Chunks {
    let mut data = Vec::new();
    let mut next = Vec::new();
    let mut samples = [Vec::new(), Vec::new()];
    for s in &mut samples {
        let (x, packed) = random_input(rng, body, bits, full_scale);
        let (y, packed_next) = random_input(rng, body, bits, full_scale);
        data.extend_from_slice(&packed);
        next.extend_from_slice(&packed_next);
        *s = x;
        s.extend_from_slice(&y[..tail]);
    }
    Chunks {
        samples,
        data,
        next,
    }
}

/// The fused decode + PFB kernel against `dsp::pfb::pfb_fir` for one sample width.
fn check_pfb(
    gpu: &Arc<Gpu>,
    rng: &mut SmallRng,
    bits: u32,
    channels: usize,
    taps: usize,
) -> Result<Check, GpuError> {
    let step = 2 * channels;
    let spectra = 40;
    let tail = (taps + 1) * step;
    let body = (spectra + 2) * step;
    let c = chunks(rng, body, tail, bits, false);
    let out = output(channels, taps, false);
    let mut gb = GpuBackend::new(
        Arc::clone(gpu),
        &out,
        GpuConfig {
            sample_bits: bits,
            body,
            tail,
            spectra_per_heap: spectra,
            out_bits: OutputBits::Eight,
            unzip: default_unzip(channels),
            batch: 1,
            depth: 1,
            peer: false,
        },
    )?;
    gb.set_section(7); // several sections per column, and a ragged last one
    gb.load(ChunkInput {
        id: 0,
        data: &c.data,
        next: Some(&c.next),
    })?;
    let st = starts(step, spectra);
    front_ends(&mut gb, &st)?;
    let frames = gb.read_frames()?;
    let power = gb.read_power()?;
    let w = pfb_weights(step, taps, out.w_cutoff, out.window);
    let mut worst = 0f64;
    let mut exact = true;
    let mut power_ok = true;
    for p in 0..2 {
        let mut want = vec![0f32; spectra * step];
        let pw: i64 = pfb_fir(&c.samples[p], &w, step, &st[p], &mut want)
            .iter()
            .sum();
        power_ok &= pw == power[p];
        let got = &frames[p * spectra * step..(p + 1) * spectra * step];
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        for (g, r) in got.iter().zip(&want) {
            exact &= g.to_bits() == r.to_bits();
            worst = worst.max(f64::from((g - r).abs()) / scale);
        }
    }
    Ok(Check {
        name: format!("pfb {bits:>2}-bit {channels} ch {taps} taps"),
        measured: worst,
        limit: 1e-5,
        pass: worst <= 1e-5 && power_ok,
        note: format!(
            "{}; power {}",
            if exact { "bit-exact" } else { "within rtol" },
            if power_ok { "exact" } else { "WRONG" }
        ),
    })
}

/// Values whose pre-quantisation magnitude is within float rounding of the clip level: the
/// CPU and GPU may decide them differently. Mirrors `postproc_heap`'s arithmetic in f32.
fn ambiguous_clips(
    frames: &[Vec<f32>; 2],
    sh: &Shape,
    gains: &[Vec<Complex32>; 2],
    delays: &[Vec<SpectrumDelay>; 2],
    ts: &[i64],
    seed: Option<u64>,
) -> u64 {
    let n = sh.channels;
    let mut fft = ChannelFft::new(2 * n);
    let mut spectra = vec![Complex32::default(); sh.spectra * n];
    let mut y = vec![Complex32::default(); n];
    let qmax = sh.out_bits.qmax();
    let mut count = 0;
    for p in 0..2 {
        fft.run(&frames[p], &mut spectra);
        for (s, &t) in ts.iter().enumerate() {
            correct(
                &spectra[s * n..(s + 1) * n],
                &gains[p],
                &delays[p][s],
                &mut y,
            );
            for (k, v) in y.iter().enumerate() {
                let (u0, u1) = seed.map_or((0.0, 0.0), |sd| dither(sd, t, k, p));
                let near = |x: f32| (x.abs() - qmax).abs() <= 1e-4 * qmax.max(x.abs());
                count += u64::from(near(v.re + u0) || near(v.im + u1));
            }
        }
    }
    count
}

/// The whole backend (PFB, cuFFT, post-processing, copies) against `CpuBackend`, over
/// `heaps` heaps post-processed `batch` at a time (the last batch partial when they do not
/// divide), with the gains changed for heap 2 alone (each heap of a batch has its own).
fn check_backend(gpu: &Arc<Gpu>, rng: &mut SmallRng, sh: Shape) -> Result<Check, GpuError> {
    let n = sh.channels;
    let step = 2 * n;
    let hs = sh.spectra;
    let total = hs * sh.heaps;
    let tail = (sh.taps + 1) * step;
    let body = (total.max(sh.taps) + 2) * step;
    let c = chunks(rng, body, tail, sh.bits, sh.full_scale);
    let out = output(n, sh.taps, sh.dither);
    let mut gb = GpuBackend::new(
        Arc::clone(gpu),
        &out,
        GpuConfig {
            sample_bits: sh.bits,
            body,
            tail,
            spectra_per_heap: hs,
            out_bits: sh.out_bits,
            unzip: sh.unzip,
            batch: sh.batch,
            depth: 2,
            peer: false,
        },
    )?;
    let mut cb = CpuBackend::new(&out, sh.bits, body, tail, hs, sh.out_bits);
    let st = starts(step, total);
    let mut random_gains = || -> [Vec<Complex32>; 2] {
        [0, 1].map(|_| {
            (0..n)
                .map(|_| {
                    Complex32::from_polar(
                        sh.gain * rng.random_range(0.3..1.0f32),
                        rng.random_range(-3.2..3.2f32),
                    )
                })
                .collect()
        })
    };
    let (gains_a, gains_b) = (random_gains(), random_gains());
    let delays: [Vec<SpectrumDelay>; 2] = [0, 1].map(|p| {
        (0..total)
            .map(|k| SpectrumDelay {
                coarse: st[p][k] as i64 % 7 - 3,
                fine: rng.random_range(-0.5..0.5),
                phase: rng.random_range(-3.2..3.2),
            })
            .collect()
    });
    // Consecutive spectra within a heap, a gap between heaps.
    let ts: Vec<Vec<i64>> = (0..sh.heaps)
        .map(|h| {
            (0..hs)
                .map(|k| (1 << 40) + ((h * (hs + 5) + k) * step) as i64)
                .collect()
        })
        .collect();
    let seed = sh.dither.then(|| rng.random::<u64>());
    let gains_of = |h: usize| if h == 2 { &gains_b } else { &gains_a };
    let inputs = heap_inputs([&gains_a, &gains_b], &delays, &ts, hs, seed);
    let chunk = ChunkInput {
        id: 0,
        data: &c.data,
        next: Some(&c.next),
    };
    let results = drive_both(&mut gb, &mut cb, chunk, &inputs, &st, hs)?;
    let w = pfb_weights(step, sh.taps, out.w_cutoff, out.window);
    let (mut worst, mut off, mut count, mut signed) = (0, 0, 0, 0i64);
    let (mut clips_ok, mut power_ok) = (true, true);
    let (mut clips_g, mut clips_c, mut amb_total) = ([0u64; 2], [0u64; 2], 0);
    for (h, (g, c_)) in results[0].iter().zip(&results[1]).enumerate() {
        let (gv, cv) = (values(sh.out_bits, &g.0), values(sh.out_bits, &c_.0));
        worst = gv
            .iter()
            .zip(&cv)
            .map(|(a, b)| (a - b).abs())
            .fold(worst, i32::max);
        worst = worst.max(if gv.len() == cv.len() { 0 } else { 99 });
        off += gv.iter().zip(&cv).filter(|(a, b)| a != b).count();
        signed += gv
            .iter()
            .zip(&cv)
            .map(|(a, b)| i64::from(a - b))
            .sum::<i64>();
        count += gv.len();
        let frames = [0, 1].map(|p| {
            let mut f = vec![0f32; hs * step];
            pfb_fir(
                &c.samples[p],
                &w,
                step,
                &st[p][h * hs..(h + 1) * hs],
                &mut f,
            );
            f
        });
        let heap_delays = [
            delays[0][h * hs..(h + 1) * hs].to_vec(),
            delays[1][h * hs..(h + 1) * hs].to_vec(),
        ];
        let amb = ambiguous_clips(&frames, &sh, gains_of(h), &heap_delays, &ts[h], seed);
        clips_ok &= (0..2).map(|p| g.1[p].abs_diff(c_.1[p])).sum::<u64>() <= amb;
        power_ok &= g.2 == c_.2;
        for p in 0..2 {
            clips_g[p] += g.1[p];
            clips_c[p] += c_.1[p];
        }
        amb_total += amb;
    }
    let gv_len = count;
    let (few, unbiased) = lsb_statistics(off, signed, count);
    let name = format!(
        "fengine {} ch n={} ×{}/{} {}-bit in {}-bit out{}{}",
        n,
        sh.unzip,
        sh.heaps,
        sh.batch,
        sh.bits,
        if sh.out_bits == OutputBits::Four {
            4
        } else {
            8
        },
        if sh.dither { " dither" } else { "" },
        if sh.full_scale { " full-scale" } else { "" },
    );
    Ok(Check {
        name,
        measured: f64::from(worst),
        limit: 1.0,
        pass: worst <= 1 && few && unbiased && clips_ok && power_ok,
        note: format!(
            "{off}/{gv_len} values off by 1{}, sum of differences {signed}{}; clips {clips_g:?} vs {clips_c:?} (±{amb_total} allowed){}; power {}",
            if few { "" } else { " TOO MANY" },
            if unbiased { "" } else { " BIASED" },
            if clips_ok { "" } else { " WRONG" },
            if power_ok { "exact" } else { "WRONG" }
        ),
    })
}

/// Whether the ±1 LSB differences are (few, unbiased): a value may round the other way only
/// where its pre-quantisation value lies within float rounding of a half-integer, which is rare
/// (measured: at most 1 in 10⁵ on the H100), so at most 1 in 10⁴ values (and 16 in any case) may
/// differ; and rounding slips fall either way, so the sum of the signed differences must look
/// like a ±1 random walk (|Σd| ≤ 3√off + 3): a systematic bias (a kernel that rounds half
/// up, or truncates) makes |Σd| ≈ off and fails.
pub fn lsb_statistics(off: usize, signed: i64, count: usize) -> (bool, bool) {
    let few = off <= (count / 10_000).max(16);
    let unbiased = (signed.unsigned_abs() as f64) <= 3.0 * (off as f64).sqrt() + 3.0;
    (few, unbiased)
}

/// Every F-engine check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut checks = Vec::new();
    for bits in [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16] {
        checks.push(check_pfb(gpu, &mut rng, bits, 256, 16)?);
    }
    checks.push(check_pfb(gpu, &mut rng, 10, 4096, 4)?);
    checks.push(check_pfb(gpu, &mut rng, 10, 4, 16)?);
    // 2 channels of 3-bit samples: rows of 12 bits, the decode's general path.
    checks.push(check_pfb(gpu, &mut rng, 3, 2, 16)?);
    let base = Shape {
        channels: 64,
        taps: 16,
        bits: 10,
        unzip: 4,
        spectra: 48,
        heaps: 1,
        batch: 1,
        out_bits: OutputBits::Eight,
        dither: true,
        full_scale: false,
        gain: 0.1,
    };
    for sh in [
        Shape { unzip: 1, ..base },
        Shape { unzip: 2, ..base },
        base,
        Shape {
            dither: false,
            ..base
        },
        Shape {
            channels: 4096,
            spectra: 64,
            ..base
        },
        // Enough blocks for the wide post-processing tile (32 values of s per block).
        Shape {
            channels: 4096,
            spectra: 2048,
            ..base
        },
        Shape {
            channels: 32768,
            spectra: 8,
            dither: false,
            ..base
        },
        Shape {
            channels: 1024,
            spectra: 40,
            out_bits: OutputBits::Four,
            gain: 0.01,
            ..base
        },
        Shape {
            channels: 1024,
            spectra: 40,
            bits: 8,
            full_scale: true,
            gain: 1.0,
            ..base
        },
        Shape {
            channels: 8,
            spectra: 33,
            bits: 12,
            ..base
        },
        Shape {
            channels: 4,
            unzip: 2,
            spectra: 100,
            bits: 4,
            gain: 2.0,
            ..base
        },
        Shape {
            channels: 2,
            unzip: 1,
            spectra: 100,
            bits: 16,
            gain: 0.001,
            ..base
        },
        // Several heaps per launch: full batches, gains changed for one heap inside a batch,
        // and a partial batch launched at the end.
        Shape {
            spectra: 12,
            heaps: 7,
            ..base
        },
        Shape {
            spectra: 12,
            heaps: 2,
            batch: 2,
            ..base
        },
        Shape {
            spectra: 12,
            heaps: 2,
            batch: 2,
            dither: false,
            ..base
        },
        Shape {
            spectra: 12,
            heaps: 7,
            batch: 3,
            ..base
        },
        Shape {
            channels: 32768,
            spectra: 8,
            heaps: 5,
            batch: 4,
            ..base
        },
        Shape {
            channels: 1024,
            spectra: 8,
            heaps: 6,
            batch: 4,
            bits: 8,
            full_scale: true,
            gain: 1.0,
            ..base
        },
        // PFB launches across a batch's heaps (heaps of at least TAPS spectra): heap
        // boundaries inside a group of TAPS spectra and inside a block's section, each heap's
        // power to its own counter; staged (256 columns) and direct (64 columns) kernels.
        Shape {
            channels: 4096,
            spectra: 40,
            heaps: 5,
            batch: 3,
            ..base
        },
        Shape {
            taps: 4,
            spectra: 6,
            heaps: 7,
            batch: 4,
            ..base
        },
    ] {
        checks.push(check_backend(gpu, &mut rng, sh)?);
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::lsb_statistics;

    #[test]
    fn a_systematic_rounding_bias_fails_and_random_slips_pass() {
        // 97 of 33 M values off by one, as measured on the H100, either way at random.
        assert_eq!(lsb_statistics(97, 9, 33_554_432), (true, true));
        // The same count all one way: a bias.
        assert_eq!(lsb_statistics(97, 97, 33_554_432), (true, false));
        // Too many slips even if balanced.
        assert_eq!(lsb_statistics(5000, 0, 1_048_576), (false, true));
        assert_eq!(lsb_statistics(0, 0, 100), (true, true));
    }
}
