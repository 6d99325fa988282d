//! `cbf-frb-bench`: the FRB beamformer's first stage (issue 17; seed 004 §4) on the five cases
//! of seed 004 Table 3, as a percentage of real time on this GPU, with Smith's A40 estimates
//! beside them, writing float32 intensities (the float32 second stage's input) and fp16 ones
//! (the fp16 second stage's operand, the engine's default: half the bytes written). Run CHORD's
//! kernel (`../shared/peers/chord_frb_bench`, case 5) in the same device call for the ratio. Also printed: the device-to-device copy ceiling measured here
//! (the input is read once: its share of the time at that rate) and the tensor-core rate the
//! kernel's MMAs reach (fp16 `mma.sync` m16n8k16, counted as issued, padding included). The
//! second stage (`gpu::frb_resample`, cuBLAS in float32 and in fp16, the latter on fp16 input as
//! the first stage writes it) is timed apart at case 5,
//! and so is a re-point of its 5760 listed beams (`gpu::frb_weights`: W built on the device,
//! 4MN·B entries written), beside the host's build of the same table on one core (what a
//! re-point cost before, without its upload).
//!
//! Input lives in device memory (random bytes: any byte is a valid sample); every time is the
//! median of event-timed calls after warm-ups. Run `cbf selftest --gpu` first: a figure counts
//! only when that passed in the same run.
//! The kernel is the op's choice (`wgmma` on sm_90 at 24×24, else `mma.sync`:
//! `gpu::frb_wgmma::WgmmaShape::preferred`) or the one `--kernel` names (`wgmma`: sm_90, the
//! shapes `gpu::frb_wgmma` takes); the TFLOPS figure counts the `mma.sync` kernel's products (at 24×24
//! the useful ones: neither kernel pads there).
//! Usage: `cbf-frb-bench [--quick] [--case K [--kernel mma|wgmma] [--tb N] [--groups R]
//! [--b2 regs|shared]]`.

use std::sync::Arc;

use cbf::dsp::frb::DishGrid;
use cbf::dsp::frb_resample::{w_table, FrbBeams};
use cbf::gpu::frb::{FrbConfig, FrbIntensities, FrbKernel, FrbStage1, FrbTuning, Stage2Table};
use cbf::gpu::frb_half::f16_from_f32;
use cbf::gpu::frb_resample::{FrbResampler, Precision};
use cbf::gpu::{pow2_scale, Gpu, GpuError};
use num_complex::Complex32;

#[path = "timing.rs"]
mod timing;
use timing::{copy_ceiling, timed};

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One of seed 004 Table 3's cases.
struct Case {
    name: &'static str,
    dishes: usize,
    rows: usize,
    cols: usize,
    channels: usize,
    /// Input sampling time (µs), after upchannelisation.
    t_s: f64,
    t_ds: usize,
    /// Smith's estimate for the first kernel on an A40 (% of the GPU).
    smith_a40: f64,
}

const CASES: [Case; 5] = [
    Case {
        name: "case 1 (pathfinder, square)",
        dishes: 64,
        rows: 8,
        cols: 8,
        channels: 2048,
        t_s: 27.3067,
        t_ds: 40,
        smith_a40: 9.2,
    },
    Case {
        name: "case 2 (pathfinder, rect.)",
        dishes: 64,
        rows: 8,
        cols: 12,
        channels: 2048,
        t_s: 27.3067,
        t_ds: 40,
        smith_a40: 14.1,
    },
    Case {
        name: "case 3 (HIRAX, square)",
        dishes: 256,
        rows: 16,
        cols: 16,
        channels: 1024,
        t_s: 40.96,
        t_ds: 25,
        smith_a40: 12.4,
    },
    Case {
        name: "case 4 (HIRAX, rect.)",
        dishes: 256,
        rows: 16,
        cols: 20,
        channels: 1024,
        t_s: 40.96,
        t_ds: 25,
        smith_a40: 18.9,
    },
    Case {
        name: "case 5 (full CHORD)",
        dishes: 512,
        rows: 24,
        cols: 24,
        channels: 256,
        t_s: 27.3067,
        t_ds: 40,
        smith_a40: 14.4,
    },
];

/// MMAs one time sample of one channel issues (per pol: stage 1 for every 16 values of q and
/// 8 of m, stage 2 for every 16 of q, 4 of p and 8 of m; padding included).
fn mmas_per_sample(rows: usize, cols: usize) -> usize {
    let up = |v: usize, k: usize| v.div_ceil(k) * k;
    let (k1, k2, qw, nt2) = (
        up(cols, 8) / 8,
        up(rows, 8) / 8,
        up(2 * cols, 16) / 16,
        up(2 * rows, 4) / 4,
    );
    2 * qw * (2 * k2 * k1 + nt2 * k2)
}

fn measure(
    gpu: &Arc<Gpu>,
    case: &Case,
    tuning: FrbTuning,
    output: FrbIntensities,
    copy: f64,
    reps: usize,
) -> Result<(), GpuError> {
    // CHORD's call length (2064 samples = 51.6 slots of 40); for t_ds 25 the same span.
    let times = if case.t_ds == 40 { 2064 } else { 2050 };
    let cfg = FrbConfig {
        rows: case.rows,
        cols: case.cols,
        dishes: case.dishes,
        t_ds: case.t_ds,
        channels: case.channels,
        spectra: times,
        batches: 1,
        tuning,
        output,
    };
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    // A random dish map: the first D cells of a shuffled grid.
    let mut cells: Vec<(usize, usize)> = (0..case.rows * case.cols)
        .map(|c| (c / case.cols, c % case.cols))
        .collect();
    for k in (1..cells.len()).rev() {
        cells.swap(k, (xorshift(&mut seed) % (k as u64 + 1)) as usize);
    }
    cells.truncate(case.dishes);
    let grid = DishGrid::new(case.rows, case.cols, &cells).expect("a valid map");
    let mut op = FrbStage1::new(Arc::clone(gpu), cfg, &grid)?;
    let weights: Vec<Complex32> = (0..case.channels * case.dishes * 2)
        .map(|_| {
            let a = (xorshift(&mut seed) % 6283) as f32 * 1e-3;
            Complex32::from_polar(0.5, a)
        })
        .collect();
    op.set_weights(&weights)?;
    let bytes: Vec<u8> = (0..cfg.input_bytes())
        .map(|_| (xorshift(&mut seed) >> 32) as u8)
        .collect();
    let input = gpu.compute.clone_htod(&bytes)?;
    let (regs, smem, blocks) = op.occupancy()?;
    let (t, width) = match output {
        FrbIntensities::Float32 => {
            let mut out = gpu.compute.alloc_zeros::<f32>(cfg.output_len())?;
            let t = timed::<GpuError>(gpu, reps, &mut || {
                op.run(&input.as_view(), &mut out)?;
                Ok(())
            })?;
            (t, 4)
        }
        FrbIntensities::Float16 => {
            let mut out = gpu.compute.alloc_zeros::<u16>(cfg.output_len())?;
            // The engine's scale at these weights (any power of two times the same).
            let scale = pow2_scale(cfg.max_intensity(0.5), 65504.0) as f32;
            let t = timed::<GpuError>(gpu, reps, &mut || {
                op.run_half(&input.as_view(), &mut out, scale)?;
                Ok(())
            })?;
            (t, 2)
        }
    };
    let real = times as f64 * case.t_s * 1e-6;
    let out_bytes = case.channels * (times / case.t_ds) * 4 * case.rows * case.cols * width;
    let bytes_moved = (cfg.input_bytes() + out_bytes) as f64;
    let tflops = (case.channels * times * mmas_per_sample(case.rows, case.cols) * 4096) as f64 / t;
    println!(
        "RESULT frb_stage1 {:<28} out {:<3} TB {:<4} R {:<4} {:<15} {:>8.3} ms per {:>6.2} ms of data = {:>6.2} % of real time \
         (Smith A40 estimate {:>4.1} %) | bytes {:>6.1} MB, {:>5.1} % of copy | mma {:>5.1} TFLOPS \
         | {regs} regs, {} KiB shared, {blocks} blocks/SM",
        case.name,
        if width == 4 { "f32" } else { "f16" },
        tuning
            .time_block
            .map_or("auto".to_string(), |v| v.to_string()),
        tuning.groups.map_or("auto".to_string(), |v| v.to_string()),
        match op.kernel() {
            (FrbKernel::Wgmma, _) => "wgmma".to_string(),
            (FrbKernel::Mma, Some(table)) => format!("mma B2 {table:?}"),
            (FrbKernel::Mma, None) => "mma".to_string(),
        },
        t * 1e3,
        real * 1e3,
        100.0 * t / real,
        case.smith_a40,
        bytes_moved / 1e6,
        100.0 * bytes_moved / t / copy,
        tflops / 1e12,
        smem / 1024,
    );
    Ok(())
}

/// The second stage at case 5 (one call's slow samples for every channel): a 96×96 beam grid
/// and seed 004 Table 4's 10·MN = 5760 listed beams, each in float32 and in fp16 (tensor-core
/// GEMMs on fp16 intensities, as the first stage writes them for this path).
fn measure_stage2(gpu: &Arc<Gpu>, reps: usize, copy: f64) -> Result<(), GpuError> {
    let case = &CASES[4];
    let times = 2064;
    let rows = case.channels * (times / case.t_ds);
    let real = times as f64 * case.t_s * 1e-6;
    let plane = 4 * case.rows * case.cols;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let i: Vec<f32> = (0..rows * plane)
        .map(|_| (xorshift(&mut seed) % 1000) as f32)
        .collect();
    let input = gpu.compute.clone_htod(&i)?;
    let mut theta = |side: usize| (xorshift(&mut seed) % (2000 * side as u64)) as f64 * 1e-3;
    let grid = FrbBeams::Product {
        thetas: (0..96).map(|_| theta(case.rows)).collect(),
        thetas2: (0..96).map(|_| theta(case.cols)).collect(),
    };
    let list = FrbBeams::List(
        (0..10 * case.rows * case.cols)
            .map(|_| (theta(case.rows), theta(case.cols)))
            .collect(),
    );
    let half = Precision::Float16 {
        max_intensity: 1000.0,
    };
    for (name, set) in [("96×96 beam grid", grid), ("5760 listed beams", list)] {
        for (arith, precision) in [("f32", Precision::Float32), ("f16", half)] {
            let mut op = FrbResampler::new(gpu, case.rows, case.cols, &set, rows, precision)?;
            let mut out = gpu.compute.alloc_zeros::<f32>(rows * op.beams())?;
            let t = match op.half_scales() {
                None => timed::<GpuError>(gpu, reps, &mut || {
                    op.resample(&input.as_view(), rows, &mut out)
                })?,
                Some(s) => {
                    let bits: Vec<u16> = i
                        .iter()
                        .map(|&x| f16_from_f32(x, s.intensity as f32))
                        .collect();
                    let half = gpu.compute.clone_htod(&bits)?;
                    timed::<GpuError>(gpu, reps, &mut || {
                        op.resample_half(&half.as_view(), rows, &mut out)
                    })?
                }
            };
            println!(
                "RESULT frb_stage2 case 5 {name:<18} {arith} {rows} rows {:>8.3} ms per {:>6.2} ms of data = {:>6.2} % of real time",
                t * 1e3,
                real * 1e3,
                100.0 * t / real
            );
            if let FrbBeams::List(l) = &set {
                // Tracking beams: the same beams moved by a little each call.
                let mut moved = l.clone();
                let t = timed::<GpuError>(gpu, reps, &mut || {
                    for p in &mut moved {
                        p.0 += 1e-3;
                    }
                    op.repoint(&moved)
                })?;
                let entries = plane * l.len();
                let width = if arith == "f32" { 4 } else { 2 };
                let start = std::time::Instant::now();
                std::hint::black_box(w_table(case.rows, case.cols, l, |x| x as f32));
                let host_s = start.elapsed().as_secs_f64();
                println!(
                    "RESULT frb_repoint case 5 {name:<18} {arith} {:>8.3} ms ({entries} entries, {:.0} MB written: {:.1} % of copy at {:.0} GB/s) | host f64 build of the f32 table on one core {:.1} ms",
                    t * 1e3,
                    (entries * width) as f64 / 1e6,
                    100.0 * (entries * width) as f64 / t / copy,
                    copy / 1e9,
                    host_s * 1e3,
                );
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), GpuError> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--case K` (1–5) with `--tb N`, `--groups R` and `--b2 regs|shared`: one
    // configuration only (for profiling and comparisons).
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let gpu = Gpu::open(0)?;
    println!(
        "device: {} ({}), {} SMs",
        gpu.name,
        gpu.arch,
        gpu.sm_count()?
    );
    let copy = copy_ceiling(&gpu, 1 << 26)?;
    println!(
        "copy ceiling: {:.0} GB/s (bytes read + written)",
        copy / 1e9
    );
    let reps = if quick { 5 } else { 20 };
    let both = [FrbIntensities::Float32, FrbIntensities::Float16];
    if let Some(k) = value("--case") {
        let case = CASES.get(k.wrapping_sub(1)).expect("--case 1 to 5");
        let table = match args
            .iter()
            .position(|a| a == "--b2")
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
        {
            None => None,
            Some("regs") => Some(Stage2Table::Registers),
            Some("shared") => Some(Stage2Table::Shared),
            Some(other) => panic!("--b2 regs|shared, not {other}"),
        };
        let kernel = match args
            .iter()
            .position(|a| a == "--kernel")
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
        {
            None => None,
            Some("mma") => Some(FrbKernel::Mma),
            Some("wgmma") => Some(FrbKernel::Wgmma),
            Some(other) => panic!("--kernel mma|wgmma, not {other}"),
        };
        let tuning = FrbTuning {
            time_block: value("--tb"),
            groups: value("--groups"),
            table,
            kernel,
        };
        for output in both {
            measure(&gpu, case, tuning, output, copy, reps)?;
        }
        return Ok(());
    }
    for case in &CASES {
        for output in both {
            measure(&gpu, case, FrbTuning::default(), output, copy, reps)?;
        }
    }
    measure_stage2(&gpu, reps, copy)?;
    if !quick {
        // The engine's form (fp16 output) at other block steps.
        for (tb, groups) in [(4, 2), (8, 2), (4, 4)] {
            let tuning = FrbTuning {
                time_block: Some(tb),
                groups: Some(groups),
                ..FrbTuning::default()
            };
            measure(&gpu, &CASES[4], tuning, FrbIntensities::Float16, copy, reps)?;
        }
    }
    Ok(())
}
