//! The beamformer (`gpu::beamform`) against `dsp::beamform` on fresh random input: every value
//! within ±1 LSB, few and unbiased ([`lsb_statistics`]; the kernel's weights are rounded to 22
//! bits and its exact integer sums taken to float, where the oracle sums in double), clip counts
//! differing by at most the number of values that differ. Cases cover 1 to 300 antennas (300:
//! several antenna batches, and 36-spectrum heaps whose warps span batches), 1 to 130 beams (several beam batches, one partial), odd channel and spectrum
//! counts, 8- and 4-bit input, full-scale input that saturates, missing antennas (and a batch with
//! none), dither on some beams and off on others, and the coefficient versioning: a second call
//! with new beams under the same version must still use the old ones, a third with a new version
//! the new ones.

use std::sync::Arc;

use num_complex::Complex64;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::correlate::draw_samples;
use super::fengine::lsb_statistics;
use super::Check;
use crate::dsp::beamform::{beamform, Beam, BeamShape};
use crate::gpu::beamform::{BeamformConfig, Beamformer};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy)]
struct Case {
    cfg: BeamformConfig,
    /// Input only from {−128, −127, 127}: sums saturate.
    extremes: bool,
}

fn draw_beams(rng: &mut SmallRng, cfg: &BeamformConfig) -> Vec<Beam> {
    let scale = 2.0 / (cfg.n_ants as f64).sqrt();
    (0..cfg.beams)
        .map(|b| Beam {
            // Runs of three beams per polarisation, starting on either (with the channel
            // count): uneven splits, tiles of padding, and a case of polarisation 1 only.
            pol: (b / 3 + cfg.channels) % 2,
            weights: (0..cfg.n_ants)
                .map(|_| {
                    Complex64::from_polar(rng.random_range(0.0..scale), rng.random_range(-3.2..3.2))
                })
                .collect(),
            delays: (0..cfg.n_ants)
                .map(|_| rng.random_range(-0.02..0.02))
                .collect(),
        })
        .collect()
}

/// The oracle's output and clips for one call: (batch, beam, channel, spectrum, re/im) and
/// (batch, beam).
#[allow(clippy::too_many_arguments)]
fn oracle(
    cfg: &BeamformConfig,
    x: &[i8],
    present: &[u8],
    beams: &[Beam],
    first: i64,
    batch_step: i64,
    spectrum_step: i64,
    dither: &[Option<u64>],
) -> (Vec<i8>, Vec<u64>, Vec<u64>) {
    let shape = BeamShape {
        n_ants: cfg.n_ants,
        channels: cfg.channels,
        spectra: cfg.spectra,
    };
    let per_batch = cfg.n_ants * cfg.channels * cfg.spectra * 4;
    let per_beam = cfg.channels * cfg.spectra * 2;
    let mut out = vec![0i8; cfg.output_len()];
    let mut clips = vec![0u64; cfg.batches * cfg.beams];
    let mut near = vec![0u64; cfg.batches * cfg.beams];
    for batch in 0..cfg.batches {
        let p: Vec<bool> = present[batch * cfg.n_ants..][..cfg.n_ants]
            .iter()
            .map(|&v| v != 0)
            .collect();
        let ts: Vec<i64> = (0..cfg.spectra)
            .map(|t| first + batch as i64 * batch_step + t as i64 * spectrum_step)
            .collect();
        for (b, beam) in beams.iter().enumerate() {
            // One beam at a time so that each has its own dither choice: beam b's bits are
            // the oracle's for seed + b at index 0.
            let i = batch * cfg.beams + b;
            let f = beamform(
                shape,
                &x[batch * per_batch..(batch + 1) * per_batch],
                &p,
                std::slice::from_ref(beam),
                &ts,
                dither[b].map(|s| s.wrapping_add(b as u64)),
                &mut out[i * per_beam..(i + 1) * per_beam],
            );
            (clips[i], near[i]) = (f.clips[0], f.near_clip[0]);
        }
    }
    (out, clips, near)
}

fn check(gpu: &Arc<Gpu>, rng: &mut SmallRng, case: Case) -> Result<Check, GpuError> {
    let cfg = case.cfg;
    let mut bf = Beamformer::new(Arc::clone(gpu), cfg)?;
    let st = &gpu.compute;
    let dither: Vec<Option<u64>> = (0..cfg.beams)
        .map(|b| (b % 4 != 1).then(|| rng.random()))
        .collect();
    let beams_a = draw_beams(rng, &cfg);
    let beams_b = draw_beams(rng, &cfg);
    let mut out = st.alloc_zeros::<i8>(cfg.output_len())?;
    let mut clips = st.alloc_zeros::<u64>(cfg.batches * cfg.beams)?;
    let (mut worst, mut off, mut signed, mut count, mut clips_ok) =
        (0u32, 0usize, 0i64, 0usize, true);
    // (version, beams uploaded, beams the oracle must use).
    let calls = [
        (1, &beams_a, &beams_a),
        (1, &beams_b, &beams_a),
        (2, &beams_b, &beams_b),
    ];
    for &(version, given, used) in &calls {
        let n = cfg.batches * cfg.n_ants * cfg.channels * cfg.spectra * 4;
        let (bytes, x) = draw_samples(rng, cfg.in_bits, case.extremes, n);
        let mut present: Vec<u8> = (0..cfg.batches * cfg.n_ants)
            .map(|_| u8::from(!rng.random_ratio(1, 6)))
            .collect();
        if cfg.batches > 1 {
            present[cfg.n_ants..2 * cfg.n_ants].fill(0); // batch 1: no antenna at all
        }
        let first = rng.random_range(0..1i64 << 40);
        let (batch_step, spectrum_step) = ((cfg.spectra * 8192) as i64, 8192);
        let input = st.clone_htod(&bytes)?;
        bf.set_beams(version, given)?;
        bf.form(
            &input.as_view(),
            &present,
            first,
            batch_step,
            spectrum_step,
            &dither,
            &mut out,
            &mut clips,
        )?;
        let got = st.clone_dtoh(&out)?;
        let got_clips = st.clone_dtoh(&clips)?;
        let (want, want_clips, near) = oracle(
            &cfg,
            &x,
            &present,
            used,
            first,
            batch_step,
            spectrum_step,
            &dither,
        );
        let per_beam = cfg.channels * cfg.spectra * 2;
        for i in 0..cfg.batches * cfg.beams {
            let mut here = 0u64;
            for (&g, &w) in got[i * per_beam..(i + 1) * per_beam]
                .iter()
                .zip(&want[i * per_beam..(i + 1) * per_beam])
            {
                let d = i32::from(g) - i32::from(w);
                worst = worst.max(d.unsigned_abs());
                if d != 0 {
                    here += 1;
                    signed += i64::from(d);
                }
            }
            off += here as usize;
            count += per_beam;
            // A value off by one may clip on one side only, and so may one within
            // CLIP_MARGIN of the clip level (127 either way): seen once in ~10 runs.
            clips_ok &= got_clips[i].abs_diff(want_clips[i]) <= here + near[i];
        }
    }
    let (few, unbiased) = lsb_statistics(off, signed, count);
    Ok(Check {
        name: format!(
            "beamform {:>3} ants {:>2} ch {:>3} t ×{} {:>3} beams {}-bit{}",
            cfg.n_ants,
            cfg.channels,
            cfg.spectra,
            cfg.batches,
            cfg.beams,
            cfg.in_bits,
            if case.extremes { " extremes" } else { "" }
        ),
        measured: f64::from(worst),
        limit: 1.0,
        pass: worst <= 1 && few && unbiased && clips_ok,
        note: format!(
            "3 calls (a version kept, a version changed): {off}/{count} values off by 1{}, sum of differences {signed}{}; clips {}",
            if few { "" } else { " TOO MANY" },
            if unbiased { "" } else { " BIASED" },
            if clips_ok { "consistent" } else { "WRONG" },
        ),
    })
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xbea4_f0e3);
    let c = |n_ants, channels, spectra, batches, beams, in_bits, extremes| Case {
        cfg: BeamformConfig {
            n_ants,
            channels,
            spectra,
            batches,
            beams,
            in_bits,
        },
        extremes,
    };
    [
        c(1, 3, 1, 1, 1, 8, false),
        c(3, 5, 37, 2, 8, 8, false),
        c(80, 16, 256, 3, 8, 8, false),
        c(80, 8, 64, 2, 8, 8, true),
        c(19, 7, 33, 3, 64, 8, false),
        c(130, 4, 100, 2, 130, 4, false),
        c(300, 4, 36, 2, 8, 8, false),
        // 4-bit input over five batches with the last block partly past the end, and 160
        // antennas (a lane's presence bits in a u64) over 24 batches of 32 spectra.
        c(40, 4, 128, 5, 6, 4, false),
        c(160, 2, 32, 24, 8, 8, false),
    ]
    .into_iter()
    .map(|case| check(gpu, &mut rng, case))
    .collect()
}
