//! The XB-engine's whole CUDA back end against its CPU back end (issue 13), through the
//! [`XbBackend`] trait the engine drives, in the engine's order of calls: two chunks of fresh
//! random input, a dump falling mid-chunk, a second output accumulating across both chunks,
//! missing antennas (one batch with none at all), and the beams' coefficients changed between
//! the chunks (a new steering version). X dumps must be identical (values and clip counts); beams
//! within ±1 LSB, few and unbiased ([`lsb_statistics`]), with clip counts differing by at most
//! the number of values that differ plus those the f64 oracle ([`beamform::beamform`]) puts
//! within [`beamform::CLIP_MARGIN`] of the clip level, where the GPU's and the f64 sums may
//! rightly disagree on the flag while both output ±127.

use std::sync::Arc;

use num_complex::Complex64;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::fengine::lsb_statistics;
use super::Check;
use crate::dsp::beamform::{self, Beam, BeamShape};
use crate::dsp::correlate::unpack_4bit;
use crate::gpu::{Gpu, GpuError};
use crate::xbengine::backend::{BackendError, BeamChunk, CpuBackend, XbBackend, XbShape};
use crate::xbengine::cuda::CudaBackend;

#[derive(Clone, Copy)]
struct Case {
    n_ants: usize,
    channels: usize,
    spectra: usize,
    batches: usize,
    bits: u32,
    beams: usize,
}

const CASES: [Case; 4] = [
    Case {
        n_ants: 4,
        channels: 16,
        spectra: 256,
        batches: 3,
        bits: 8,
        beams: 2,
    },
    // Heaps shorter than the correlator's time step (merged in groups; ranges end inside one).
    Case {
        n_ants: 19,
        channels: 33,
        spectra: 40,
        batches: 5,
        bits: 4,
        beams: 3,
    },
    Case {
        n_ants: 80,
        channels: 32,
        spectra: 256,
        batches: 4,
        bits: 8,
        beams: 8,
    },
    Case {
        n_ants: 130,
        channels: 8,
        spectra: 128,
        batches: 2,
        bits: 8,
        beams: 64,
    },
];

fn draw_beams(rng: &mut SmallRng, case: &Case) -> Vec<Beam> {
    // Weights of modulus up to 2/√n so that some sums reach full scale and saturate.
    let scale = 2.0 / (case.n_ants as f64).sqrt();
    (0..case.beams)
        .map(|b| Beam {
            pol: b % 2,
            weights: (0..case.n_ants)
                .map(|_| {
                    Complex64::from_polar(rng.random_range(0.0..scale), rng.random_range(-3.2..3.2))
                })
                .collect(),
            delays: (0..case.n_ants)
                .map(|_| rng.random_range(-0.05..0.05))
                .collect(),
        })
        .collect()
}

/// The beams of both backends for one chunk: (worst |Δ|, values off by one, signed sum of
/// differences, values compared, clip counts consistent).
fn compare_beams(
    gpu_b: &mut dyn XbBackend,
    cpu_b: &mut dyn XbBackend,
    formed: &Formed,
    case: &Case,
) -> Result<(u32, usize, i64, usize, bool), GpuError> {
    let present = &formed.present;
    let g = gpu_b.beams(formed.slots.0).map_err(step("beams (cuda)"))?;
    let c = cpu_b.beams(formed.slots.1).map_err(step("beams (cpu)"))?;
    let per_beam = case.channels * case.spectra * 2;
    let (mut worst, mut off, mut signed, mut count, mut clips_ok) = (0, 0, 0i64, 0, true);
    for batch in 0..case.batches {
        if !present[batch * case.n_ants..(batch + 1) * case.n_ants].contains(&1) {
            continue; // nothing formed, nothing sent
        }
        for beam in 0..case.beams {
            let i = batch * case.beams + beam;
            let range = i * per_beam..(i + 1) * per_beam;
            let mut beam_off = 0u64;
            for (&a, &b) in g.data[range.clone()].iter().zip(&c.data[range]) {
                let d = i32::from(a as i8) - i32::from(b as i8);
                worst = worst.max(d.unsigned_abs());
                if d != 0 {
                    off += 1;
                    beam_off += 1;
                    signed += i64::from(d);
                }
                count += 1;
            }
            let diff = g.clips[i].abs_diff(c.clips[i]);
            clips_ok &= diff <= beam_off || diff <= beam_off + near_clip(formed, case, batch, beam);
        }
    }
    Ok((worst, off, signed, count, clips_ok))
}

/// An error of backend call `what`, saying which call it was.
fn step(what: &'static str) -> impl FnOnce(BackendError) -> GpuError {
    move |e| GpuError::Backend(format!("{what}: {}", e.0))
}

/// Timestamp step between spectra in the check's chunks.
const SPECTRUM_STEP: i64 = 2048;

/// One chunk's beams in flight on both backends, with what the oracle needs to form them again.
struct Formed {
    slots: (usize, usize),
    present: Vec<u8>,
    chunk: Vec<u8>,
    beams: Vec<Beam>,
    dither: Vec<Option<u64>>,
    first: i64,
}

/// The timestamps of a batch's spectra as the check's [`BeamChunk`] gives them.
fn batch_timestamps(first: i64, case: &Case, batch: usize) -> Vec<i64> {
    let t0 = first + (batch * case.spectra) as i64 * SPECTRUM_STEP;
    (0..case.spectra)
        .map(|s| t0 + s as i64 * SPECTRUM_STEP)
        .collect()
}

/// Values of `beam` in `batch` that the f64 oracle puts within [`beamform::CLIP_MARGIN`] of the
/// clip level: only run where the backends' clip counts disagree beyond the values that differ.
fn near_clip(formed: &Formed, case: &Case, batch: usize, beam: usize) -> u64 {
    let shape = BeamShape {
        n_ants: case.n_ants,
        channels: case.channels,
        spectra: case.spectra,
    };
    let n = case.n_ants * case.channels * case.spectra * 4;
    let mut x = vec![0i8; n];
    if case.bits == 4 {
        unpack_4bit(&formed.chunk[batch * n / 2..(batch + 1) * n / 2], &mut x);
    } else {
        x.copy_from_slice(bytemuck::cast_slice(
            &formed.chunk[batch * n..(batch + 1) * n],
        ));
    }
    let present: Vec<bool> = formed.present[batch * case.n_ants..][..case.n_ants]
        .iter()
        .map(|&p| p != 0)
        .collect();
    // One beam with seed + b draws beam b's dither, as the CPU backend forms it.
    let seed = formed.dither[beam].map(|s| s.wrapping_add(beam as u64));
    let mut out = vec![0i8; case.channels * case.spectra * 2];
    let oracle = beamform::beamform(
        shape,
        &x,
        &present,
        std::slice::from_ref(&formed.beams[beam]),
        &batch_timestamps(formed.first, case, batch),
        seed,
        &mut out,
    );
    oracle.near_clip[0]
}

fn check(gpu: &Arc<Gpu>, rng: &mut SmallRng, case: Case) -> Result<Check, GpuError> {
    let shape = XbShape {
        n_ants: case.n_ants,
        channels: case.channels,
        spectra: case.spectra,
        sample_bits: case.bits,
        outputs: 2,
        threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
    };
    let mut cpu = CpuBackend::new(shape, case.batches);
    let mut cuda = CudaBackend::new(Arc::clone(gpu), shape, case.batches, case.beams)
        .map_err(|e| GpuError::Backend(format!("building the CUDA backend: {e}")))?;
    let chunk_bytes = shape.batch_bytes() * case.batches;
    let dither: Vec<Option<u64>> = (0..case.beams)
        .map(|b| (b % 3 != 2).then(|| rng.random()))
        .collect();
    let mut x_equal = true;
    let mut dumps = 0;
    let (mut worst, mut off, mut signed, mut count, mut clips_ok) = (0, 0, 0i64, 0, true);
    let mut pending: Option<Formed> = None;
    // A dump after this many batches of the first chunk.
    let split = case.batches / 2 + 1;
    for chunk_no in 0..2u64 {
        let chunk: Vec<u8> = (0..chunk_bytes).map(|_| rng.random()).collect();
        let mut present = vec![1u8; case.batches * case.n_ants];
        for p in present.iter_mut() {
            if rng.random_ratio(1, 8) {
                *p = 0;
            }
        }
        present[..case.n_ants].fill(0); // batch 0: no antenna at all
        let beams = draw_beams(rng, &case);
        let mut slots = (0, 0);
        for b in [&mut cuda as &mut dyn XbBackend, &mut cpu] {
            b.load(&chunk).map_err(step("load"))?;
        }
        // Output 0 dumps mid-chunk in chunk 0 and at the end of chunk 1; output 1 at the end.
        let ranges = if chunk_no == 0 {
            vec![(0, split), (split, case.batches)]
        } else {
            vec![(0, case.batches)]
        };
        for (k, &(start, end)) in ranges.iter().enumerate() {
            let mut outs = Vec::new();
            for b in [&mut cuda as &mut dyn XbBackend, &mut cpu] {
                b.correlate(0, start..end).map_err(step("correlate"))?;
                if chunk_no == 0 && k == 0 {
                    let dump_present: Vec<bool> = (0..case.n_ants).map(|a| a % 5 != 3).collect();
                    // A buffer with stale bytes: the dump must overwrite all of it.
                    b.dump(0, &dump_present, vec![0x5a; 7])
                        .map_err(step("dump"))?;
                    outs.push(b.dumped(0).map_err(step("dumped"))?);
                }
            }
            if let [g, c] = &outs[..] {
                x_equal &= g == c;
                dumps += 1;
            }
        }
        for b in [&mut cuda as &mut dyn XbBackend, &mut cpu] {
            b.correlate(1, 0..case.batches).map_err(step("correlate"))?;
        }
        let first = (chunk_no * 1_000_000 + 12_345) as i64;
        let input = BeamChunk {
            version: chunk_no + 1,
            beams: &beams,
            dither: &dither,
            first,
            batch_step: case.spectra as i64 * SPECTRUM_STEP,
            spectrum_step: SPECTRUM_STEP,
            present: &present,
        };
        slots.0 = cuda.beamform(&input).map_err(step("beamform (cuda)"))?;
        slots.1 = cpu.beamform(&input).map_err(step("beamform (cpu)"))?;
        if let Some(f) = pending.take() {
            let r = compare_beams(&mut cuda, &mut cpu, &f, &case)?;
            worst = worst.max(r.0);
            (off, signed, count, clips_ok) =
                (off + r.1, signed + r.2, count + r.3, clips_ok && r.4);
        }
        pending = Some(Formed {
            slots,
            present,
            chunk,
            beams,
            dither: dither.clone(),
            first,
        });
        for b in [&mut cuda as &mut dyn XbBackend, &mut cpu] {
            b.release().map_err(step("release"))?;
        }
    }
    if let Some(f) = pending {
        let r = compare_beams(&mut cuda, &mut cpu, &f, &case)?;
        worst = worst.max(r.0);
        (off, signed, count, clips_ok) = (off + r.1, signed + r.2, count + r.3, clips_ok && r.4);
    }
    let present_all = vec![true; case.n_ants];
    for output in 0..2 {
        let mut outs = Vec::new();
        for b in [&mut cuda as &mut dyn XbBackend, &mut cpu] {
            b.dump(output, &present_all, Vec::new())
                .map_err(step("dump"))?;
            outs.push(b.dumped(output).map_err(step("dumped"))?);
        }
        x_equal &= outs[0] == outs[1];
        dumps += 1;
    }
    let (few, unbiased) = lsb_statistics(off, signed, count);
    Ok(Check {
        name: format!(
            "xbengine cuda vs cpu {} ants {} ch {} spectra ×{} {}-bit {} beams",
            case.n_ants, case.channels, case.spectra, case.batches, case.bits, case.beams
        ),
        measured: f64::from(worst),
        limit: 1.0,
        pass: x_equal && worst <= 1 && few && unbiased && clips_ok,
        note: format!(
            "{dumps} X dumps {}; beams: {off}/{count} values off by 1{}, sum of differences {signed}{}; clips {}",
            if x_equal { "identical" } else { "DIFFER" },
            if few { "" } else { " TOO MANY" },
            if unbiased { "" } else { " BIASED" },
            if clips_ok { "consistent" } else { "WRONG" },
        ),
    })
}

/// Every XB back-end check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5842_656e_6769_6e65);
    CASES.iter().map(|&c| check(gpu, &mut rng, c)).collect()
}
