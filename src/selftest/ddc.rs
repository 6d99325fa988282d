//! The narrowband down-conversion kernel against `dsp::ddc::ddc` (the f64 oracle) on fresh
//! random input with katgpucbf's DDC tolerances (its `test_ddc`): every output within
//! 2·10⁻⁵·2^bits and the RMS error below 2·10⁻⁶·2^bits. The cases cover every sample width,
//! odd tap counts and filters shorter than one phase, subsampling factors that are not powers
//! of two, the largest factor the F-engine accepts (512), filters longer than one register
//! block, each mapping the kernel takes (coarsening 1–8, 1–8 phases in parallel) and every one
//! the start-up tuner may pick for decimation 8 and 16, and absolute
//! timestamps past 2³² with a different one per polarisation (the fixed-point mixer).

use std::sync::Arc;

use num_complex::Complex32;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::ddc::{ddc, mixer_step};
use crate::dsp::samples::{pack, packed_len};
use crate::gpu::ddc::{Ddc, DdcPlan, DdcRun, DdcShape, DdcTuning};
use crate::gpu::ddc_tune::candidates;
use crate::gpu::{Gpu, GpuError};

/// katgpucbf's DDC tolerances, in units of 2^bits.
const ATOL: f64 = 2e-5;
const RMS: f64 = 2e-6;

struct Case {
    bits: u32,
    subsampling: usize,
    taps: usize,
    outputs: usize,
    /// `None`: the F-engine's default mapping.
    tuning: Option<DdcTuning>,
}

fn check(gpu: &Arc<Gpu>, rng: &mut SmallRng, case: &Case) -> Result<Check, GpuError> {
    let (s, bits) = (case.subsampling, case.bits);
    let shape = DdcShape {
        sample_bits: bits,
        subsampling: s,
        taps: case.taps,
    };
    let tuning = case.tuning.unwrap_or(DdcTuning::default_for(shape));
    let plan = DdcPlan::new(shape, tuning)?;
    let op = Ddc::new(gpu, plan)?;
    // Random taps at a real filter's scale (Σ|h| ≈ 1.5·√S, as a remez design normalised to
    // gain √S has): the kernel does not depend on the filter's shape, and a remez design of
    // a long filter for a small S can take minutes.
    let a = 3.0 * (s as f32).sqrt() / case.taps as f32;
    let h: Vec<f32> = (0..case.taps).map(|_| rng.random_range(-a..a)).collect();
    let step = mixer_step(rng.random_range(-0.5..0.5));
    // Enough samples for every output and a ragged tail; a multiple of 8 so that every width
    // packs to whole bytes.
    let n_in = (s * (case.outputs - 1) + case.taps + 5).next_multiple_of(8);
    let t_first = [
        (1u64 << 40) + rng.random_range(0..1u64 << 33),
        rng.random_range(0..1u64 << 36),
    ];
    let (lo, hi) = (-(1i32 << (bits - 1)), (1i32 << (bits - 1)) - 1);
    let pol_bytes = packed_len(n_in, bits);
    let pol_stride = pol_bytes + 1 + rng.random_range(0..4);
    let mut bytes = vec![0u8; 2 * pol_stride];
    let mut want = vec![Complex32::default(); 2 * case.outputs];
    for p in 0..2 {
        let x: Vec<i32> = (0..n_in).map(|_| rng.random_range(lo..=hi)).collect();
        pack(
            &x,
            bits,
            &mut bytes[p * pol_stride..p * pol_stride + pol_bytes],
        );
        let out = &mut want[p * case.outputs..(p + 1) * case.outputs];
        ddc(&x, &h, s, step, t_first[p], out);
    }
    let input = gpu.compute.clone_htod(&bytes)?;
    let z = gpu.compute.clone_htod(&plan.mixed_weights(&h, step))?;
    let out_stride = case.outputs + 3;
    let mut out = gpu
        .compute
        .alloc_zeros::<f32>(2 * (out_stride + case.outputs))?;
    op.launch(
        &gpu.compute,
        &mut out,
        &input,
        &z,
        DdcRun {
            pols: 2,
            n_in,
            pol_stride,
            n_out: case.outputs,
            out_stride,
            t_first,
            step,
        },
    )?;
    let got = gpu.compute.clone_dtoh(&out)?;
    let (mut worst, mut sq) = (0f64, 0f64);
    for p in 0..2 {
        for (b, w) in want[p * case.outputs..(p + 1) * case.outputs]
            .iter()
            .enumerate()
        {
            let at = 2 * (p * out_stride + b);
            let d = (Complex32::new(got[at], got[at + 1]) - w).norm() as f64;
            worst = worst.max(d);
            sq += d * d;
        }
    }
    let full = f64::from(1u32 << bits);
    let rms = (sq / (2 * case.outputs) as f64).sqrt() / full;
    let worst = worst / full;
    Ok(Check {
        name: format!(
            "ddc {bits:>2}-bit S {s} taps {} C{} G{} SG{}",
            case.taps, tuning.coarsen, tuning.groups, tuning.subgroup
        ),
        measured: worst,
        limit: ATOL,
        pass: worst <= ATOL && rms <= RMS,
        note: format!("rms {rms:.1e} (limit {RMS:.0e}) × 2^bits"),
    })
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xddc0_5eed);
    let t = |coarsen, groups, subgroup| {
        Some(DdcTuning {
            coarsen,
            groups,
            subgroup,
        })
    };
    let c = |bits, subsampling, taps, outputs, tuning| Case {
        bits,
        subsampling,
        taps,
        outputs,
        tuning,
    };
    let mut cases: Vec<Case> = [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16]
        .iter()
        .map(|&bits| c(bits, 8, 128, 3000, None))
        .collect();
    cases.extend([
        c(10, 8, 123, 2000, None),
        c(10, 4, 3, 1000, None),
        c(10, 6, 96, 2500, None),
        c(10, 10, 155, 1500, None),
        c(8, 24, 384, 700, None),
        c(10, 100, 1601, 300, None),
        c(10, 512, 8192, 90, None),
        c(10, 2, 1000, 2000, None),
        c(10, 16, 256, 2000, t(1, 32, 1)),
        c(10, 16, 256, 2000, t(2, 64, 8)),
        c(10, 16, 256, 2000, t(8, 32, 2)),
        c(10, 16, 256, 2000, t(4, 256, 4)),
        c(12, 12, 200, 1000, t(8, 128, 3)),
        // Spans decoded in tiles of phases (S = 128, no-discard decimation 64): the default
        // mapping, and three phases in parallel (tiles of 27 rows, the last one of 20).
        c(10, 128, 2048, 600, None),
        c(10, 128, 2048, 600, t(4, 64, 3)),
    ]);
    // Every mapping the start-up tuner may pick (`gpu::ddc_tune::candidates`) for MeerKAT's
    // discard shapes at decimation 8 and 16.
    for s in [8, 16] {
        let shape = DdcShape {
            sample_bits: 10,
            subsampling: s,
            taps: 16 * s,
        };
        cases.extend(
            candidates(shape)
                .into_iter()
                .map(|t| c(10, s, 16 * s, 1500, Some(t))),
        );
    }
    cases
        .iter()
        .map(|case| check(gpu, &mut rng, case))
        .collect()
}
