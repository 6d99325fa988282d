//! The XB-engine's `--frb-beam` output on the CUDA backend against the CPU backend (issue 17),
//! through the [`XbBackend`] trait as the engine drives it: three chunks of fresh random input
//! with a missing heap zeroed (as the engine zeroes them), each chunk's heap collected after
//! the next chunk is started (the asynchronous copy back) and the last one after the loop (the
//! engine's flush at stop), the dish weights changed at every chunk (a new version, so a chunk
//! collected late must keep its own weights' scaling), sets below and far above the GPU first
//! stage's fp16 range limit (so the backend's power-of-two weight scaling is exercised both
//! ways), weights
//! that differ per (channel, dish, pol) with channels 64× apart in magnitude (each channel
//! scaled on its own), a partly filled grid, and both beam-set forms (a Cartesian product and a
//! list, which is also re-pointed before the second chunk while the first is still outstanding,
//! so that chunk must keep the old beams and the later ones form the new), with heap buffers
//! page-locked through `pin` (the device writes them, as in the engine) and not (staged). Errors are taken
//! relative to each channel's peak, so a weak channel is judged as strictly as a strong one.
//!
//! This is a wiring check — heap layout, weights, scaling, versioning, both second-stage
//! precisions (the fp16 one fed by the first stage's fp16 output) — not the numeric one: each GPU stage is checked against its derived error bound
//! by [`super::frb`]. Their worst cases (stage 1: ≤ 8.2·2⁻¹¹ of the field's Σ|W·E| per value of
//! Ẽ; stage 2 float32, or fp16 within about 4·2⁻¹¹ of Σ|U|·I·|U′| ≤ 3.1·max I on this grid;
//! float16 encoding 2⁻¹¹) are sums of roundings random in sign, so the errors seen (RMS about
//! 2·10⁻⁴ of the value in `super::frb`'s stage-1 checks) are far below the limit used here, 1 %
//! of the channel's largest value, which any layout, weight or scale mistake exceeds by orders
//! of magnitude.

use std::sync::Arc;

use half::f16;
use num_complex::Complex32;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::frb::DishGrid;
use crate::dsp::frb_fast::{FrbBeamformer, FrbChunkShape};
use crate::dsp::frb_resample::{FrbBeams, Resample};
use crate::gpu::frb::{FrbConfig, FrbIntensities, FrbTuning};
use crate::gpu::{Gpu, GpuError};
use crate::xbengine::backend::{CpuBackend, FrbChunk, FrbRepoint, XbBackend, XbShape};
use crate::xbengine::cuda::CudaBackend;
use crate::xbengine::cuda_frb::CudaFrbSpec;

/// Relative to each channel's largest value.
const LIMIT: f64 = 1e-2;

fn decode(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(2)
        .map(|b| f64::from(f16::from_le_bytes([b[0], b[1]]).to_f32()))
        .collect()
}

fn check(
    gpu: &Arc<Gpu>,
    rng: &mut SmallRng,
    beams: FrbBeams,
    stage2_f32: bool,
    repoint: Option<Vec<(f64, f64)>>,
) -> Result<Check, GpuError> {
    // 10 dishes on a 3×4 grid (two cells empty), 8 channels, 2 batches of 64 spectra, t_ds 16.
    let (rows, cols, channels, spectra, batches, t_ds) = (3, 4, 8, 64, 2, 16);
    let cells: Vec<(usize, usize)> = (0..rows * cols)
        .filter(|c| *c != 5 && *c != 10)
        .map(|c| (c / cols, c % cols))
        .collect();
    let n_ants = cells.len();
    let grid = DishGrid::new(rows, cols, &cells).map_err(|e| GpuError::Backend(e.to_string()))?;
    // Peaks of a few thousand at the second set's weights (below float16's 65504).
    let w_max = 500.0;
    let scale = (1e4 / (t_ds as f64 * 2.0 * n_ants as f64 * (w_max * 181.0f64).powi(2))) as f32;
    let shape = XbShape {
        n_ants,
        channels,
        spectra,
        sample_bits: 8,
        outputs: 0,
        threads: 2,
    };
    let chunk_shape = FrbChunkShape {
        n_ants,
        channels,
        spectra,
        batches,
        t_ds,
    };
    let mut cpu = CpuBackend::new(shape, batches).with_frb(vec![(
        FrbBeamformer::new(chunk_shape, &grid, &beams, 2),
        scale,
    )]);
    let spec = CudaFrbSpec {
        config: FrbConfig {
            rows,
            cols,
            dishes: n_ants,
            t_ds,
            channels,
            spectra,
            batches,
            tuning: FrbTuning::default(),
            output: if stage2_f32 {
                FrbIntensities::Float32
            } else {
                FrbIntensities::Float16
            },
        },
        grid: grid.clone(),
        beams: beams.clone(),
        scale,
    };
    // The CUDA backend's heap buffers for chunks 0 and 2 are page-locked through `pin`, as
    // the engine's are (the device copies into them), chunk 1's is not (staged). Declared
    // before the backend so they outlive its registrations.
    let frb_heap_bytes = channels * (spectra * batches / t_ds) * beams.len() * 2;
    let mut locked: Vec<Vec<u8>> = vec![vec![0; frb_heap_bytes]; 2];
    let mut returned: Vec<Vec<u8>> = Vec::new();
    let mut cuda = CudaBackend::new(Arc::clone(gpu), shape, batches, 0)?.with_frb(&[spec])?;
    for b in &mut locked {
        cuda.pin(b)?;
    }
    let heap_bytes = n_ants * channels * spectra * 4;
    let (mut worst, mut values) = (0.0f64, 0usize);
    // Per back end, the decoded heaps in chunk order.
    let mut heaps: [Vec<Vec<f64>>; 2] = Default::default();
    let sets = [(1u64, 20.0f32), (2, w_max as f32), (3, 100.0)];
    // The CPU backend's re-point table, built beforehand as the request handler does.
    let table = repoint.as_ref().map(|m| {
        Arc::new(Resample::new(
            grid.rows,
            grid.cols,
            &FrbBeams::List(m.clone()),
        ))
    });
    for (k, &(version, magnitude)) in sets.iter().enumerate() {
        let mut chunk: Vec<u8> = (0..batches * heap_bytes).map(|_| rng.random()).collect();
        let mut present = vec![1u8; batches * n_ants];
        // Batch 1's heap of antenna 3 is missing: zero, as the engine leaves it.
        present[n_ants + 3] = 0;
        let at = (n_ants + 3) * heap_bytes / n_ants;
        chunk[at..at + heap_bytes / n_ants].fill(0);
        // (channel, dish, pol), channel c at 4^−(c mod 4) of the set's magnitude.
        let weights: Vec<Complex32> = (0..channels * n_ants * 2)
            .map(|k| {
                let level = 0.25f32.powi((k / (2 * n_ants) % 4) as i32);
                Complex32::from_polar(
                    magnitude * level * rng.random_range(0.2..1.0f32),
                    rng.random_range(-3.2..3.2),
                )
            })
            .collect();
        let input = FrbChunk {
            version,
            weights: &weights,
            present: &present,
        };
        for (b, (backend, got)) in [&mut cuda as &mut dyn XbBackend, &mut cpu]
            .into_iter()
            .zip(&mut heaps)
            .enumerate()
        {
            if let (1, Some(moved)) = (k, &repoint) {
                let table = table.clone();
                backend.frb_repoint(
                    0,
                    FrbRepoint {
                        positions: moved,
                        table,
                    },
                )?;
            }
            backend.load(&chunk)?;
            let out = match (b, k) {
                (0, 0 | 2) => locked.pop().unwrap_or_default(),
                _ => Vec::new(),
            };
            backend.frb(0, &input, out)?;
            // One chunk late, as the engine collects them (after this chunk's weights).
            if k > 0 {
                let (heap, _) = backend.frb_formed(0)?;
                got.push(decode(&heap));
                returned.push(heap);
            }
            backend.release()?;
        }
    }
    // The last chunk, as the engine's flush collects it when the input stops.
    for (backend, got) in [&mut cuda as &mut dyn XbBackend, &mut cpu]
        .into_iter()
        .zip(&mut heaps)
    {
        let (heap, _) = backend.frb_formed(0)?;
        got.push(decode(&heap));
        returned.push(heap);
    }
    // Unlock the buffers before they are freed.
    drop(cuda);
    drop(returned);
    if heaps[0].len() != sets.len() || heaps[1].len() != sets.len() {
        return Err(GpuError::Backend("FRB heaps missing".into()));
    }
    for (g, c) in heaps[0].iter().zip(&heaps[1]) {
        if g.len() != c.len() {
            return Err(GpuError::Backend(format!(
                "FRB heaps of {} and {} values",
                g.len(),
                c.len()
            )));
        }
        let per_channel = g.len() / channels;
        for (gc, cc) in g.chunks_exact(per_channel).zip(c.chunks_exact(per_channel)) {
            let peak = cc.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (a, b) in gc.iter().zip(cc) {
                worst = worst.max((a - b).abs() / peak);
            }
        }
        values += g.len();
    }
    let form = match repoint {
        Some(_) => format!("{beams} re-pointed after chunk 1"),
        None => beams.to_string(),
    };
    let stage2 = if stage2_f32 { "f32" } else { "f16" };
    Ok(Check {
        name: format!(
            "xbengine frb cuda vs cpu 3×4 grid {n_ants} dishes t_ds {t_ds}, {form}, stage 2 {stage2}"
        ),
        measured: worst,
        limit: LIMIT,
        pass: worst <= LIMIT,
        note: format!(
            "3 chunks collected one late, the last at the end (weights per channel, dish and pol, changed each chunk, below and above the fp16 limit; a missing heap): worst |cuda − cpu| / channel peak over {values} values"
        ),
    })
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xf4b_c0da);
    let mut list = || -> Vec<(f64, f64)> {
        (0..7)
            .map(|_| (rng.random_range(-1.5..1.5), rng.random_range(-2.0..2.0)))
            .collect()
    };
    let (first, moved, other) = (list(), list(), list());
    // The default fp16 second stage for both forms, float32 for one and for a re-pointed list.
    [
        (FrbBeams::even(3, 4, 5, 7), false, None),
        (FrbBeams::List(first.clone()), false, Some(moved.clone())),
        (FrbBeams::List(other), false, None),
        (FrbBeams::even(3, 4, 5, 7), true, None),
        (FrbBeams::List(first), true, Some(moved)),
    ]
    .into_iter()
    .map(|(beams, f32, repoint)| check(gpu, &mut rng, beams, f32, repoint))
    .collect()
}
