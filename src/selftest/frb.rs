//! The FRB beamformer's first stage (`gpu::frb`) against `dsp::frb::intensities` (f64) on fresh
//! random input: every intensity within the error bound derived in `gpu::frb` (fp16 operands,
//! fp32 sums), computed per value from the exact field of a separate f64 FFT. Cases cover the
//! seed's grid shapes (8×12, 16×20, 24×24), an odd tiny grid (5×3), 12×16, 4×8 and 16×16, and
//! partly filled grids,
//! random dish maps, `t_ds` 1, 3, 7 and 40 with slow samples running across calls (each case
//! makes two or three calls whose lengths `t_ds` does not divide), several batches per call,
//! −128 in the input, and weights of varied magnitude per (channel, dish, pol). On the same input,
//! the first stage built for fp16 output must write, bit for bit, the host's rounding of the
//! float32 output (`gpu::frb_half::f16_from_f32`, `half`'s round-to-nearest from f32) at three
//! scales: the engine's a-priori one, one that saturates the largest values and one that puts
//! most in fp16's subnormals. The second stage
//! (`gpu::frb_resample`) is checked against `dsp::frb`'s resampling, beam lists and beam grids,
//! in float32 and in fp16 (inputs rounded to fp16 on the host, as the first stage writes them),
//! each against its own derived bound (for a list, with the device-built
//! W's deviation Δ per entry added, `gpu::frb_weights`), lists also after a re-point from other
//! positions (tracking beams) and with beams on the half-integer grid.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use num_complex::{Complex32, Complex64};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::frb::{
    intensities, resample, resample_factorised, u_sum, DishGrid, FieldTransform, FrbShape,
};
use crate::dsp::frb_resample::FrbBeams;
use crate::gpu::frb::{
    error_bound, FrbConfig, FrbIntensities, FrbKernel, FrbStage1, FrbTuning, Stage2Table,
};
use crate::gpu::frb_half::{dot_bound, f16_from_f32, rounded, v_bound, F16_MAX};
use crate::gpu::frb_resample::{FrbResampler, Precision};
use crate::gpu::frb_weights::deviation;
use crate::gpu::{pow2_scale, Gpu, GpuError};

struct Case {
    rows: usize,
    cols: usize,
    dishes: usize,
    t_ds: usize,
    channels: usize,
    spectra: usize,
    batches: usize,
    calls: usize,
    /// Warp groups, stage 2's table and pairs per warp (`FrbTuning`; None: the defaults).
    tuning: FrbTuning,
}

/// |Ẽ| per (time, pol, p, q) and B = Σ|W·E| per (time, pol), in f64, for one channel.
fn fields(grid: &DishGrid, e: &[Complex64], w: &[Complex64], times: usize) -> (Vec<f64>, Vec<f64>) {
    let (mn, d) = (grid.rows * grid.cols, grid.dishes());
    let mut transform = FieldTransform::new(grid);
    let mut field = vec![Complex64::default(); 4 * mn];
    let mut abs = Vec::with_capacity(times * 2 * 4 * mn);
    let mut b = vec![0.0; times * 2];
    for tp in 0..times * 2 {
        let (pol, dishes) = (tp % 2, &e[tp * d..(tp + 1) * d]);
        let wp = &w[pol * mn..(pol + 1) * mn];
        transform.field(grid, dishes, wp, &mut field);
        abs.extend(field.iter().map(|v| v.norm()));
        b[tp] = grid
            .cells()
            .iter()
            .zip(dishes)
            .map(|(&c, x)| (wp[c] * x).norm())
            .sum();
    }
    (abs, b)
}

/// The first stage built for fp16 output beside the float32 one, at one scale choice.
struct HalfOutput {
    op: FrbStage1,
    out: CudaSlice<u16>,
    /// Values whose bits differed from the host's rounding, and values compared.
    mismatches: usize,
    compared: usize,
    /// Values saturated (±65504) and subnormal (nonzero) among them.
    saturated: usize,
    subnormal: usize,
}

/// The scales of the three fp16 outputs for one call, from its float32 intensities: the
/// engine's a-priori one (`a_priori`), one putting the largest into (2, 4]·65504 (the largest
/// saturate) and one putting the median into (2⁻¹⁷, 2⁻¹⁶] (fp16's subnormals are below 2⁻¹⁴);
/// all three the a-priori one for a call that completed no slow sample.
fn half_scales(a_priori: f64, values: &[f32]) -> [f32; 3] {
    let mut v: Vec<f64> = values.iter().map(|&x| f64::from(x)).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return [a_priori as f32; 3];
    }
    let (median, top) = (v[v.len() / 2], v[v.len() - 1]);
    [
        a_priori,
        4.0 * pow2_scale(top, F16_MAX),
        pow2_scale(median, 2f64.powi(-16)),
    ]
    .map(|s| s as f32)
}

impl HalfOutput {
    /// Compare the fp16 output of a call that wrote `rows` rows per channel at `scale` with
    /// the host's rounding of the float32 one, `host` (the whole output buffer).
    fn compare(
        &mut self,
        gpu: &Gpu,
        cfg: &FrbConfig,
        host: &[f32],
        rows: usize,
        scale: f32,
    ) -> Result<(), GpuError> {
        let bits = gpu.compute.clone_dtoh(&self.out)?;
        let per_channel = cfg.out_rows() * 4 * cfg.rows * cfg.cols;
        let used = rows * 4 * cfg.rows * cfg.cols;
        for (b, h) in bits
            .chunks_exact(per_channel)
            .zip(host.chunks_exact(per_channel))
        {
            for (&got, &x) in b[..used].iter().zip(&h[..used]) {
                self.mismatches += usize::from(got != f16_from_f32(x, scale));
                self.saturated += usize::from(got & 0x7fff == 0x7bff);
                self.subnormal += usize::from(got & 0x7c00 == 0 && got & 0x3ff != 0);
                self.compared += 1;
            }
        }
        Ok(())
    }
}

fn check(gpu: &Arc<Gpu>, rng: &mut SmallRng, case: &Case) -> Result<[Check; 2], GpuError> {
    let (m, n) = (case.rows, case.cols);
    let mut cells: Vec<(usize, usize)> = (0..m * n).map(|c| (c / n, c % n)).collect();
    cells.shuffle(rng);
    cells.truncate(case.dishes);
    let grid = DishGrid::new(m, n, &cells).map_err(|e| GpuError::Backend(e.to_string()))?;
    let cfg = FrbConfig {
        rows: m,
        cols: n,
        dishes: case.dishes,
        t_ds: case.t_ds,
        channels: case.channels,
        spectra: case.spectra,
        batches: case.batches,
        tuning: case.tuning,
        output: FrbIntensities::Float32,
    };
    let mut op = FrbStage1::new(Arc::clone(gpu), cfg, &grid)?;
    let half_cfg = FrbConfig {
        output: FrbIntensities::Float16,
        ..cfg
    };
    let mut halves = (0..3)
        .map(|_| {
            Ok(HalfOutput {
                op: FrbStage1::new(Arc::clone(gpu), half_cfg, &grid)?,
                out: gpu.compute.alloc_zeros(cfg.output_len())?,
                mismatches: 0,
                compared: 0,
                saturated: 0,
                subnormal: 0,
            })
        })
        .collect::<Result<Vec<_>, GpuError>>()?;
    let d = case.dishes;
    // Weights of varied magnitude, as float32 (the oracle gets the same values).
    let weights: Vec<Complex32> = (0..case.channels * d * 2)
        .map(|_| Complex32::from_polar(rng.random_range(0.05..1.5), rng.random_range(-3.2..3.2)))
        .collect();
    op.set_weights(&weights)?;
    for h in &mut halves {
        h.op.set_weights(&weights)?;
    }
    let largest = weights
        .iter()
        .map(|w| f64::from(w.norm()))
        .fold(0.0, f64::max);
    // The engine's scale: fixed by the bound on every intensity at these weights.
    let a_priori = pow2_scale(cfg.max_intensity(largest), F16_MAX);

    let times = cfg.times();
    let per_call = cfg.input_bytes();
    let plane = 4 * m * n;
    // Per channel: E (time, pol, dish) over all calls, and the GPU's rows in order.
    let mut e_all = vec![Vec::<Complex64>::new(); case.channels];
    let mut got = vec![Vec::<f32>::new(); case.channels];
    let mut out = gpu.compute.alloc_zeros::<f32>(cfg.output_len())?;
    let mut rows_ok = true;
    for _ in 0..case.calls {
        let bytes: Vec<u8> = (0..per_call)
            .map(|_| {
                if rng.random_range(0..50) == 0 {
                    0x80
                } else {
                    rng.random()
                }
            })
            .collect();
        let input = gpu.compute.clone_htod(&bytes)?;
        let rows = op.run(&input.as_view(), &mut out)?;
        let host = gpu.compute.clone_dtoh(&out)?;
        let written: Vec<f32> = host
            .chunks_exact(cfg.out_rows() * plane)
            .flat_map(|c| c[..rows * plane].iter().copied())
            .collect();
        // Every call, so the fp16 stages' carries hold what the float32 one's does.
        for (h, scale) in halves.iter_mut().zip(half_scales(a_priori, &written)) {
            let half_rows = h.op.run_half(&input.as_view(), &mut h.out, scale)?;
            rows_ok &= half_rows == rows;
            h.compare(gpu, &cfg, &host, rows, scale)?;
        }
        for (f, e) in e_all.iter_mut().enumerate() {
            for t in 0..times {
                let (batch, s) = (t / case.spectra, t % case.spectra);
                for pol in 0..2 {
                    for dish in 0..d {
                        let at = (((batch * d + dish) * case.channels + f) * case.spectra + s) * 4
                            + 2 * pol;
                        e.push(Complex64::new(
                            f64::from(bytes[at] as i8),
                            f64::from(bytes[at + 1] as i8),
                        ));
                    }
                }
            }
            got[f].extend_from_slice(&host[f * cfg.out_rows() * plane..][..rows * plane]);
        }
    }

    let total = times * case.calls;
    let shape = FrbShape {
        times: total,
        t_ds: case.t_ds,
    };
    let (mut worst, mut rms, mut count) = (0.0f64, 0.0f64, 0usize);
    for f in 0..case.channels {
        let mut wg = vec![Complex64::default(); 2 * m * n];
        for (dish, (r, c)) in grid.positions().enumerate() {
            for pol in 0..2 {
                let w = weights[(f * d + dish) * 2 + pol];
                wg[(pol * m + r) * n + c] = Complex64::new(f64::from(w.re), f64::from(w.im));
            }
        }
        let want = intensities(&grid, shape, &e_all[f], &wg);
        rows_ok &= got[f].len() == want.len();
        let (abs, b) = fields(&grid, &e_all[f], &wg, total);
        let bound = error_bound(&grid, case.t_ds, &b, &abs, &want);
        for ((g, w), lim) in got[f].iter().zip(&want).zip(&bound) {
            let err = (f64::from(*g) - w).abs();
            worst = worst.max(err / lim);
            rms += (err / w.max(1e-30)).powi(2);
            count += 1;
        }
    }
    let rms = (rms / count.max(1) as f64).sqrt();
    let t = case.tuning;
    let groups = [
        Some(format!(", {:?}", op.kernel().0)),
        t.groups.map(|g| format!(", {g} warp groups")),
        t.table.map(|b| format!(", stage-2 table in {b:?}")),
    ]
    .into_iter()
    .flatten()
    .collect::<String>();
    let shape = format!(
        "{m:>2}×{n:<2} {d:>3} dishes t_ds {:>2} {} ch {} t ×{} ×{} calls{groups}",
        case.t_ds, case.channels, case.spectra, case.batches, case.calls
    );
    let wrong_rows = if rows_ok {
        ""
    } else {
        "; WRONG number of slow samples"
    };
    let sum = |f: fn(&HalfOutput) -> usize| halves.iter().map(f).sum::<usize>();
    let (mismatches, compared) = (sum(|h| h.mismatches), sum(|h| h.compared));
    let (saturated, subnormal) = (sum(|h| h.saturated), sum(|h| h.subnormal));
    Ok([
        Check {
            name: format!("frb stage 1 {shape}"),
            measured: worst,
            limit: 1.0,
            pass: rows_ok && count > 0 && worst <= 1.0,
            note: format!(
                "largest error / derived bound {worst:.3}; RMS relative error {rms:.2e} over {count} intensities{wrong_rows}"
            ),
        },
        Check {
            name: format!("frb stage 1 fp16 out {shape}"),
            measured: mismatches as f64,
            limit: 0.0,
            // Every scale's values compared, the saturation and subnormal paths taken.
            pass: rows_ok
                && mismatches == 0
                && halves.iter().all(|h| h.compared > 0)
                && saturated > 0
                && subnormal > 0,
            note: format!(
                "fp16 values whose bits differ from the host's rounding of the float32 output: {mismatches} of {compared} ({saturated} saturated, {subnormal} subnormal), at the a-priori scale, one saturating the largest and one making the median subnormal{wrong_rows}"
            ),
        },
    ])
}

/// The second stage (`gpu::frb_resample`) against `dsp::frb::resample{,_factorised}` on random
/// intensities (a quarter of them 1 to 10⁴ times smaller), every beam within the bound of its
/// precision: float32's GEMM bound (module doc of `gpu::frb_resample`) or the fp16 path's
/// derived bound (`gpu::frb_half`), computed per value from f64 sums of magnitudes; a list's
/// bound adds Δ·Σ|I| for its device-built W. With `start`, the resampler is built for those
/// beams and re-pointed to `set`'s (a list) before it runs.
fn check_resample(
    gpu: &Arc<Gpu>,
    i: &[f32],
    (m, n): (usize, usize),
    set: &FrbBeams,
    rows: usize,
    precision: Precision,
    start: Option<&FrbBeams>,
) -> Result<Check, GpuError> {
    let (pm, pn) = (2 * m, 2 * n);
    let mut op = FrbResampler::new(gpu, m, n, start.unwrap_or(set), rows, precision)?;
    if start.is_some() {
        op.repoint(&set.positions())?;
    }
    let mut out = gpu.compute.alloc_zeros::<f32>(rows * set.len())?;
    match op.half_scales() {
        None => op.resample(&gpu.compute.clone_htod(i)?.as_view(), rows, &mut out)?,
        Some(s) => {
            // As the first stage writes them: fp16(s_I·I) rounded from float32.
            let bits: Vec<u16> = i
                .iter()
                .map(|&x| f16_from_f32(x, s.intensity as f32))
                .collect();
            op.resample_half(&gpu.compute.clone_htod(&bits)?.as_view(), rows, &mut out)?;
        }
    }
    let got = gpu.compute.clone_dtoh(&out)?;
    let exact: Vec<f64> = i.iter().map(|&v| f64::from(v)).collect();
    let u_abs = |len: usize, side: usize, t: f64| -> Vec<f64> {
        (0..len).map(|p| u_sum(p, side, t).abs()).collect()
    };
    let eps = 2f64.powi(-24);
    let half = op.half_scales();
    let (want, bound): (Vec<f64>, Vec<f64>) = match set {
        FrbBeams::List(beams) => {
            let want = resample(&exact, m, n, beams);
            let k = (pm * pn) as f64;
            let delta = deviation(m, n);
            let mut bound = vec![0.0; want.len()];
            for (b, &(t, t2)) in beams.iter().enumerate() {
                let (u, u2) = (u_abs(pm, m, t), u_abs(pn, n, t2));
                for r in 0..rows {
                    let x = &exact[r * pm * pn..(r + 1) * pm * pn];
                    let w = |rho: usize| u[rho / pn] * u2[rho % pn];
                    // W's entries err by Δ besides their rounding (`gpu::frb_weights`).
                    bound[r * beams.len() + b] = match &half {
                        None => (0..pm * pn)
                            .map(|rho| x[rho] * (delta + (k + 2.0) * eps * (w(rho) + delta)))
                            .sum(),
                        Some(s) => dot_bound((0..pm * pn).map(|rho| {
                            (
                                x[rho],
                                rounded(x[rho], s.intensity_floor()),
                                w(rho),
                                rounded(w(rho), s.table_floor()) + delta,
                            )
                        })),
                    };
                }
            }
            (want, bound)
        }
        FrbBeams::Product {
            thetas: a,
            thetas2: b,
        } => {
            let want = resample_factorised(&exact, m, n, a, b);
            let us: Vec<Vec<f64>> = a.iter().map(|&t| u_abs(pm, m, t)).collect();
            let u2s: Vec<Vec<f64>> = b.iter().map(|&t| u_abs(pn, n, t)).collect();
            let mut bound = vec![0.0; want.len()];
            for r in 0..rows {
                let x = &exact[r * pm * pn..(r + 1) * pm * pn];
                for (ia, u) in us.iter().enumerate() {
                    // (A_aq, bound on V_aq's error) per q; float32 needs only A.
                    let v: Vec<(f64, f64)> = (0..pn)
                        .map(|q| {
                            let terms = (0..pm).map(|p| (x[p * pn + q], u[p]));
                            match &half {
                                None => (terms.map(|(i, u)| i * u).sum(), 0.0),
                                Some(s) => v_bound(s, terms),
                            }
                        })
                        .collect();
                    for (ib, u2) in u2s.iter().enumerate() {
                        bound[(r * a.len() + ia) * b.len() + ib] =
                            match &half {
                                None => {
                                    (pm + pn + 4) as f64
                                        * eps
                                        * (0..pn).map(|q| v[q].0 * u2[q]).sum::<f64>()
                                }
                                Some(s) => dot_bound((0..pn).map(|q| {
                                    (v[q].0, v[q].1, u2[q], rounded(u2[q], s.table_floor()))
                                })),
                            };
                    }
                }
            }
            (want, bound)
        }
    };
    let (mut worst, mut rms) = (0.0f64, 0.0f64);
    for ((g, w), lim) in got.iter().zip(&want).zip(&bound) {
        let err = (f64::from(*g) - w).abs();
        worst = worst.max(err / lim);
        rms += (err / lim).powi(2);
    }
    let rms = (rms / want.len().max(1) as f64).sqrt();
    let kind = match start {
        Some(_) => format!("{set} re-pointed"),
        None => set.to_string(),
    };
    let (short, arith) = match precision {
        Precision::Float32 => ("f32", "float32".to_string()),
        Precision::Float16 { max_intensity } => (
            "f16",
            format!("fp16 (inputs bounded by {max_intensity:.0e})"),
        ),
    };
    Ok(Check {
        name: format!("frb stage 2 {short} {m:>2}×{n:<2} {kind} {rows} rows"),
        measured: worst,
        limit: 1.0,
        pass: got.len() == want.len() && worst <= 1.0,
        note: format!(
            "largest error / {arith} bound {worst:.3} (RMS {rms:.3}) over {} beams",
            want.len()
        ),
    })
}

/// The second stage's beam sets: a list built for its own positions, a list built for others
/// and re-pointed, a re-pointed list on the half-integer grid, a grid of beams (θ × θ′).
#[derive(Clone, Copy)]
enum Beams {
    List(usize),
    Repointed(usize),
    OnGrid(usize),
    Product(usize, usize),
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xf4b5_7a9e);
    let c = |rows, cols, dishes, t_ds, channels, spectra, batches, calls| Case {
        rows,
        cols,
        dishes,
        t_ds,
        channels,
        spectra,
        batches,
        calls,
        tuning: FrbTuning::default(),
    };
    // Two and four warp groups (their partial sums added through shared memory at each slow
    // sample's end), where two measured faster.
    let grouped = |groups, case: Case| Case {
        tuning: FrbTuning {
            groups: Some(groups),
            ..case.tuning
        },
        ..case
    };
    // Stage 2's table in shared memory where the default keeps it in registers (24×24, two
    // warp groups at t_ds 7, a one-group grid), and large grids whose tables spill in
    // registers, which build with the default's fallback to the shared table.
    // The wgmma kernel where the device has it (elsewhere these cases are mma.sync's).
    let wgmma = |case: Case| Case {
        tuning: FrbTuning {
            kernel: (gpu.arch == "sm_90").then_some(FrbKernel::Wgmma),
            ..case.tuning
        },
        ..case
    };
    // `mma.sync` named where the default on sm_90 is now `wgmma` (24×24).
    let mma = |case: Case| Case {
        tuning: FrbTuning {
            kernel: Some(FrbKernel::Mma),
            ..case.tuning
        },
        ..case
    };
    let shared = |case: Case| Case {
        tuning: FrbTuning {
            table: Some(Stage2Table::Shared),
            ..case.tuning
        },
        ..case
    };
    let mut checks = [
        c(5, 3, 15, 1, 2, 7, 1, 2),
        c(8, 12, 64, 3, 3, 16, 2, 3),
        c(16, 20, 256, 7, 2, 24, 2, 2),
        mma(c(24, 24, 512, 40, 2, 64, 2, 3)),
        mma(c(24, 24, 400, 40, 1, 100, 1, 1)),
        // More shapes: a grid whose m padding leaves a part step (12 rows), a small one, and
        // a square grid at t_ds 1.
        c(12, 16, 150, 3, 2, 24, 2, 2),
        c(4, 8, 20, 7, 1, 16, 1, 2),
        c(16, 16, 256, 1, 1, 16, 1, 2),
        grouped(2, c(24, 24, 512, 40, 2, 64, 2, 3)),
        // `gpu::frb_wgmma` (sm_90): case 5's grid, slots ending mid-step (t_ds 1, 3, 7, 25),
        // m padded (12 rows), two and three warpgroups and tiles each, partly filled grids.
        wgmma(c(24, 24, 512, 40, 2, 64, 2, 3)),
        wgmma(c(24, 24, 400, 40, 1, 100, 1, 1)),
        wgmma(c(24, 24, 512, 7, 2, 64, 2, 3)),
        wgmma(c(24, 24, 300, 1, 1, 16, 1, 2)),
        wgmma(c(16, 16, 200, 25, 2, 100, 2, 2)),
        wgmma(c(8, 8, 50, 3, 3, 16, 2, 3)),
        wgmma(c(12, 12, 100, 24, 2, 48, 2, 2)),
        // More (channel, slot) units than a device's resident blocks: runs of two units, some
        // crossing a channel's end (101 slots a channel; 43 or 44 by phase at t_ds 3).
        wgmma(c(24, 24, 300, 1, 2, 101, 1, 2)),
        wgmma(c(24, 24, 400, 3, 4, 64, 2, 3)),
        grouped(2, c(16, 16, 200, 7, 2, 24, 2, 2)),
        grouped(4, c(8, 12, 64, 3, 3, 16, 2, 3)),
        shared(c(24, 24, 512, 40, 2, 64, 2, 3)),
        shared(grouped(2, c(16, 16, 200, 7, 2, 24, 2, 2))),
        shared(c(8, 12, 64, 3, 3, 16, 2, 3)),
        shared(grouped(1, c(5, 3, 15, 3, 2, 7, 1, 2))),
        c(30, 28, 800, 3, 1, 12, 1, 2),
        c(25, 24, 600, 7, 1, 16, 1, 1),
    ]
    .iter()
    .map(|case| check(gpu, &mut rng, case))
    .collect::<Result<Vec<_>, _>>()?
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    // Each shape in float32 and fp16, the fp16 bound on the inputs tight (their largest
    // possible value) or loose (values far below it, some subnormal once scaled).
    for (grid, beams, rows, loose) in [
        ((3, 4), Beams::Repointed(7), 5, 1.0),
        ((8, 12), Beams::Product(5, 7), 11, 1.0),
        ((24, 24), Beams::Product(48, 48), 4, 1e6),
        ((24, 24), Beams::Repointed(100), 3, 1e3),
        ((5, 3), Beams::List(9), 6, 1.0),
        ((7, 4), Beams::OnGrid(11), 3, 1.0),
    ] {
        let theta =
            |rng: &mut SmallRng, side: usize| rng.random_range(-(side as f64)..2.0 * side as f64);
        let list = |rng: &mut SmallRng, k: usize| -> Vec<(f64, f64)> {
            (0..k)
                .map(|_| (theta(rng, grid.0), theta(rng, grid.1)))
                .collect()
        };
        let (set, start) = match beams {
            Beams::List(a) => (FrbBeams::List(list(&mut rng, a)), None),
            Beams::Repointed(a) => (
                FrbBeams::List(list(&mut rng, a)),
                Some(FrbBeams::List(list(&mut rng, a))),
            ),
            Beams::OnGrid(a) => {
                let mut half = |side: usize| {
                    f64::from(rng.random_range(-2 * side as i32..4 * side as i32)) / 2.0
                };
                let on: Vec<(f64, f64)> = (0..a).map(|_| (half(grid.0), half(grid.1))).collect();
                (FrbBeams::List(on), Some(FrbBeams::List(list(&mut rng, a))))
            }
            Beams::Product(a, b) => (
                FrbBeams::Product {
                    thetas: (0..a).map(|_| theta(&mut rng, grid.0)).collect(),
                    thetas2: (0..b).map(|_| theta(&mut rng, grid.1)).collect(),
                },
                None,
            ),
        };
        let i: Vec<f32> = (0..rows * 4 * grid.0 * grid.1)
            .map(|_| {
                let dim = if rng.random_range(0..4) == 0 {
                    10f32.powf(-rng.random_range(0.0..4.0f32))
                } else {
                    1.0
                };
                rng.random_range(0.0f32..1000.0) * dim
            })
            .collect();
        for precision in [
            Precision::Float32,
            Precision::Float16 {
                max_intensity: 1000.0 * loose,
            },
        ] {
            checks.push(check_resample(
                gpu,
                &i,
                grid,
                &set,
                rows,
                precision,
                start.as_ref(),
            )?);
        }
    }
    Ok(checks)
}
