//! `cbf-ddc-bench`: the narrowband down-conversion kernel against the device's own ceilings,
//! measured in the same run (METHOD.md "two numbers first"): the device-to-device copy
//! bandwidth (the memory ceiling: packed input read + complex64 output written) and a
//! saturating fp32 FMA loop (the arithmetic ceiling: 2 FMAs per tap per output). For each shape
//! (MeerKAT's narrowband decimations, discard and no-discard, 16 × S taps as katgpucbf's
//! default, the taps' values arbitrary) it times the default mapping and a grid of mappings (seed 002 §Performance tuning),
//! and prints input samples per second, the fraction of each ceiling, and how many full-rate
//! MeerKAT L-band antennas (1712 MS/s per polarisation, both polarisations) that is.
//!
//! Run `cbf selftest --gpu` first: a figure counts only when that passed in the same run.
//! Usage: `cbf-ddc-bench [--quick]` (`--quick`: four shapes, the default mapping only).

use cbf::gpu::compile::Kernel;
use cbf::gpu::ddc::{DdcPlan, DdcShape, DdcTuning};
use cbf::gpu::ddc_tune::time_mapping;
use cbf::gpu::{Gpu, GpuError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

#[path = "timing.rs"]
mod timing;
use timing::{copy_ceiling, timed};

/// Shapes (sample bits, subsampling) timed over the whole grid of mappings.
const GRID_SHAPES: [(u32, usize); 3] = [(10, 8), (10, 16), (8, 64)];

/// One antenna's samples per second, both polarisations (MeerKAT L-band).
const ANTENNA_RATE: f64 = 2.0 * 1712e6;

/// fp32 fused multiply-adds per second (`kernels/fma_peak.cu`).
fn fma_ceiling(gpu: &Gpu) -> Result<f64, GpuError> {
    let f = gpu.function(Kernel::FmaPeak, &vec![])?;
    let blocks = gpu.sm_count()? * 16;
    let mut out = gpu.compute.alloc_zeros::<f32>(blocks * 256)?;
    let (seed, iters) = (1.5f32, 1 << 16);
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let t = timed::<GpuError>(gpu, 5, &mut || {
        let mut l = gpu.compute.launch_builder(&f);
        l.arg(&mut out).arg(&seed).arg(&iters);
        // SAFETY: fma_peak(float*, float, int) with one output per thread.
        unsafe { l.launch(cfg) }?;
        Ok(())
    })?;
    Ok((blocks * 256) as f64 * iters as f64 * 8.0 / t)
}

struct Measured {
    tuning: DdcTuning,
    seconds: f64,
}

/// The median time of one launch over `n_in` samples of each polarisation (`None`: the
/// mapping does not fit this shape).
fn time_shape(
    gpu: &Gpu,
    shape: DdcShape,
    tuning: DdcTuning,
    n_in: usize,
) -> Result<Option<Measured>, GpuError> {
    if DdcPlan::new(shape, tuning).is_err() {
        return Ok(None);
    }
    // A mapping ptxas cannot build without a spill is not a candidate (the compile check refuses
    // it); say so and go on with the others.
    match time_mapping(gpu, shape, tuning, n_in, 10) {
        Ok(seconds) => Ok(Some(Measured { tuning, seconds })),
        Err(e @ GpuError::Compile { .. }) => {
            println!("  (skipped {tuning:?}: {e})");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn main() -> Result<(), GpuError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let gpu = Gpu::open(0)?;
    let copy = copy_ceiling(&gpu, 1 << 26)?;
    let fma = fma_ceiling(&gpu)?;
    println!(
        "ceilings: copy {:.0} GB/s (read + write), fp32 FMA {:.2} T/s",
        copy / 1e9,
        fma / 1e12
    );
    // (sample bits, subsampling): discard decimations 8..64 (S = decimation) and no-discard
    // 8 and 32 (S = 2 × decimation).
    let shapes: &[(u32, usize)] = if quick {
        &[(10, 8), (10, 16), (8, 64), (10, 128)]
    } else {
        &[
            (10, 8),
            (10, 16),
            (10, 32),
            (10, 64),
            (8, 8),
            (8, 64),
            (16, 8),
            (10, 128),
        ]
    };
    let n_in = 1 << 25;
    println!(
        "{:>4} {:>4} {:>5} | {:>13} {:>8} | {:>7} {:>6} {:>6} {:>6} | best mapping",
        "bits", "S", "taps", "mapping", "us", "GS/s", "%mem", "%fma", "ants"
    );
    for &(bits, s) in shapes {
        let shape = DdcShape {
            sample_bits: bits,
            subsampling: s,
            taps: 16 * s,
        };
        let default = DdcTuning::default_for(shape);
        // The grid on the shapes that span the range (it costs a compile per mapping).
        let tunings = if quick || !GRID_SHAPES.contains(&(bits, s)) {
            vec![default]
        } else {
            let mut g = DdcTuning::grid();
            if !g.contains(&default) {
                g.push(default);
            }
            g
        };
        let mut results = Vec::new();
        for t in tunings {
            if let Some(m) = time_shape(&gpu, shape, t, n_in)? {
                results.push(m);
            }
        }
        let Some(best) = results
            .iter()
            .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
        else {
            continue;
        };
        let dflt = results.iter().find(|m| m.tuning == default).unwrap_or(best);
        for (label, m) in [("default", dflt), ("best", best)] {
            let samples = 2.0 * n_in as f64;
            let n_out = ((n_in - shape.taps) / s + 1) as f64;
            let bytes = samples * f64::from(bits) / 8.0 + 2.0 * n_out * 8.0;
            let fmas = 2.0 * 2.0 * n_out * shape.taps as f64;
            let t = m.tuning;
            println!(
                "{bits:>4} {s:>4} {:>5} | {label:>13} {:>8.1} | {:>7.1} {:>6.1} {:>6.1} {:>6.0} | C{} G{} SG{}",
                shape.taps,
                m.seconds * 1e6,
                samples / m.seconds / 1e9,
                100.0 * bytes / m.seconds / copy,
                100.0 * fmas / m.seconds / fma,
                samples / m.seconds / ANTENNA_RATE,
                t.coarsen,
                t.groups,
                t.subgroup
            );
        }
    }
    Ok(())
}
