//! `cbf-corr-bench`: the CUDA correlator's speed (issue 12) against the device's int8
//! tensor-core ceiling measured in the same run (a saturating `mma.sync` loop; the 1,979 TOPS
//! dense datasheet peak beside it). Useful operations per call are the peers' count,
//! 8 × 4 × N(N+1)/2 × F × T (correlator_hopper.md "Counting"); the corner turn's time is
//! reported apart and in the total. Input lives in device memory (random bytes), as in the
//! peers' figures; every time is the median of event-timed calls after a warm-up.
//!
//! Run `cbf selftest --gpu` first: a figure counts only when that passed in the same run.
//! Usage: `cbf-corr-bench [--quick] [--fused] [--turn-ahead ITEMS]… [--ants N]… [--size
//! N,F,T,B]… [--window T]…`:
//! - `--fused`: only the plans whose kernel turns the chunk itself, fused or riding, to compare
//!   builds of its producers;
//! - `--turn-ahead`: time a riding plan once per value instead of at its default
//!   (`Correlator::set_turn_ahead`);
//! - `--ants` and `--size`: only the sizes of N antennas, or only those of the table below
//!   named exactly (e.g. one launch under Nsight Compute; a size not in the table is refused);
//! - `--window T`: time the `wgmma` plans once per launch length of T times
//!   (`Correlator::set_launch_times`).

use std::sync::Arc;

use cbf::dsp::correlate::{n_baselines, CorrShape};
use cbf::gpu::compile::Kernel;
use cbf::gpu::correlate::{CorrConfig, CorrPath, Correlator};
use cbf::gpu::{Gpu, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

#[path = "timing.rs"]
mod timing;
use timing::timed;

/// Random bytes (any byte string is valid int8 input).
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

const DENSE_PEAK: f64 = 1979e12;

/// The saturating `mma.sync` loop: int8 operations per second.
fn mma_peak(gpu: &Arc<Gpu>) -> Result<f64, GpuError> {
    let f = gpu.function(Kernel::CorrPeak, &vec![])?;
    let sms = gpu.ctx.attribute(
        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )? as usize;
    let blocks = sms * 4;
    let mut out = gpu.compute.alloc_zeros::<i32>(blocks * 256)?;
    let iters = 20000i32;
    let seed = 0x9e37_79b9u32;
    let t = timed::<GpuError>(gpu, 10, &mut || {
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = gpu.compute.launch_builder(&f);
        l.arg(&mut out).arg(&seed).arg(&iters);
        // SAFETY: corr_peak_mma(int *out, u32, int) writes one int per thread of the grid.
        unsafe { l.launch(cfg) }?;
        Ok(())
    })?;
    let ops = (blocks * 8) as f64 * f64::from(iters) * 8.0 * (16 * 8 * 32 * 2) as f64;
    Ok(ops / t)
}

struct Figure {
    /// "Fused" or "Ride" where the kernel turns the chunk itself, else the path's name.
    label: String,
    clusters: u32,
    turn: f64,
    corr: f64,
    useful: f64,
}

/// One plan's figures: with `fuse`, the plan `Correlator::new` builds (the corner turn fused
/// into the `wgmma` kernel, or riding in its launch, where it can be: the whole call is timed
/// as "corr", "turn" is 0), else the corner turn and the correlator timed apart.
fn measure(
    gpu: &Arc<Gpu>,
    cfg: CorrConfig,
    input: &CudaSlice<u8>,
    fuse: bool,
    ahead: Option<i32>,
    window: Option<usize>,
    reps: usize,
) -> Result<Figure, GpuError> {
    let mut c = if fuse && ahead.is_some() {
        Correlator::riding(Arc::clone(gpu), cfg)?
    } else if fuse {
        Correlator::new(Arc::clone(gpu), cfg)?
    } else {
        Correlator::with_turn(Arc::clone(gpu), cfg)?
    };
    if let Some(items) = ahead {
        c.set_turn_ahead(items);
    }
    if let Some(times) = window {
        assert!(
            c.set_launch_times(times),
            "--window takes a multiple of 128 times up to 65536 (wgmma plans only)"
        );
    }
    let mut acc = gpu.compute.alloc_zeros::<i64>(cfg.acc_len())?;
    let view = input.as_view();
    let label = if c.fused() {
        "Fused".to_string()
    } else if c.rides() {
        ahead.map_or("Ride".to_string(), |a| format!("Ride/{a}"))
    } else {
        format!("{:?}", cfg.path)
    } + &window.map_or(String::new(), |t| format!("@{t}"));
    let (turn, corr) = if c.fused() || c.rides() {
        let call = timed::<GpuError>(gpu, reps, &mut || Ok(c.correlate(&view, &mut acc)?))?;
        (0.0, call)
    } else {
        (
            timed::<GpuError>(gpu, reps, &mut || Ok(c.corner_turn(&view)?))?,
            timed::<GpuError>(gpu, reps, &mut || Ok(c.correlate_planar(&mut acc)?))?,
        )
    };
    let s = cfg.shape;
    let useful = 32.0
        * n_baselines(s.n_ants) as f64
        * s.channels as f64
        * s.spectra as f64
        * cfg.batches as f64;
    Ok(Figure {
        label,
        clusters: c.resident_clusters(),
        turn,
        corr,
        useful,
    })
}

fn main() -> Result<(), GpuError> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let fused_only = args.iter().any(|a| a == "--fused");
    let aheads: Vec<i32> = args
        .windows(2)
        .filter(|w| w[0] == "--turn-ahead")
        .map(|w| {
            w[1].parse()
                .expect("--turn-ahead takes a count of work items")
        })
        .collect();
    // `--ants N` (repeatable): only the sizes of N antennas (e.g. one size under Nsight Compute).
    let only: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--ants")
        .map(|w| w[1].parse().expect("--ants takes an antenna count"))
        .collect();
    let windows: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--window")
        .map(|w| w[1].parse().expect("--window takes a count of times"))
        .collect();
    let exact: Vec<(usize, usize, usize, usize)> = args
        .windows(2)
        .filter(|w| w[0] == "--size")
        .map(|w| {
            let v: Vec<usize> = w[1]
                .split(',')
                .map(|x| x.parse().expect("--size takes N,F,T,B"))
                .collect();
            assert!(v.len() == 4, "--size takes N,F,T,B");
            (v[0], v[1], v[2], v[3])
        })
        .collect();
    let gpu = Gpu::open(0)?;
    println!("# cbf-corr-bench on {} ({})", gpu.name, gpu.arch);
    let peak = mma_peak(&gpu)?;
    println!(
        "ceiling: saturating mma.sync m16n8k32 s8 loop {:.0} TOPS ({:.0}% of the {:.0} TOPS dense datasheet peak)",
        peak / 1e12,
        100.0 * peak / DENSE_PEAK,
        DENSE_PEAK / 1e12
    );
    let reps = if quick { 5 } else { 20 };
    // (N, F, T, batches): the peers' sizes (F = 480, T = 3072) where the buffers fit,
    // katgpucbf's defaults (80 antennas, 512 channels, 256 spectra per heap, 32 heaps per chunk)
    // and two longer-row sizes.
    let sizes: &[(usize, usize, usize, usize)] = &[
        (4, 480, 3072, 1),
        (16, 480, 3072, 1),
        (64, 480, 3072, 1),
        (128, 480, 3072, 1),
        (256, 480, 3072, 1),
        (576, 480, 3072, 1),
        (1024, 120, 3072, 1),
        (80, 512, 256, 32),
        // The XB-engine's correlator calls as `cbf-xb-bench` makes them (four 256-spectrum
        // heaps a chunk, merged into rows of 1024 times).
        (256, 128, 256, 4),
        (576, 64, 256, 4),
        (1024, 32, 256, 4),
        // The same bytes as the peers' size in 4× longer rows: the int64 accumulators (read
        // and written once per call) weigh a quarter as much per operation.
        (64, 120, 12288, 1),
        (128, 120, 12288, 1),
        (256, 120, 12288, 1),
        (576, 120, 12288, 1),
        // 16× the peers' rows (the same bytes again): where the accumulators no longer count.
        (256, 30, 49152, 1),
        (576, 30, 49152, 1),
    ];
    if let Some(missing) = exact.iter().find(|s| !sizes.contains(s)) {
        panic!("--size {missing:?} is not one of the benchmark's sizes: {sizes:?}");
    }
    // (path, fused): the `wgmma` path with its corner turn apart, and fused where it fuses.
    let mut paths = vec![(CorrPath::Mma, false)];
    if CorrPath::best_for(&gpu) == CorrPath::Wgmma {
        paths.extend([(CorrPath::Wgmma, false), (CorrPath::Wgmma, true)]);
    }
    println!(
        "{:>12} {:>5} {:>4} {:>5} {:>3}  {:>9} {:>9}  {:>10} {:>6}  {:>10}  {:>8}",
        "path",
        "N",
        "F",
        "T",
        "B",
        "turn ms",
        "corr ms",
        "corr TOPS",
        "% peak",
        "+turn TOPS",
        "clusters"
    );
    for &(n_ants, channels, spectra, batches) in sizes {
        if (!only.is_empty() && !only.contains(&n_ants))
            || (!exact.is_empty() && !exact.contains(&(n_ants, channels, spectra, batches)))
        {
            continue;
        }
        // One random input per size, shared by its plans.
        let shape = CorrShape {
            n_ants,
            channels,
            spectra,
        };
        let mut host = vec![0u8; shape.input_len() * batches];
        fill(&mut host, 0x5eed ^ n_ants as u64);
        let input = gpu.compute.clone_htod(&host)?;
        drop(host);
        for &(path, fuse) in &paths {
            let cfg = CorrConfig {
                shape,
                batches,
                in_bits: 8,
                path,
            };
            // The kernel's own turn only where `Correlator::new` fuses or rides
            // (`CorrConfig::can_fuse`, `can_ride`).
            let own =
                cfg.can_fuse() || cfg.can_ride() || (cfg.ride_allowed() && !aheads.is_empty());
            if (fuse && !own) || (fused_only && !fuse) {
                continue;
            }
            // A riding plan once per --turn-ahead value, else once at its default.
            // (With a sweep, wherever the kernel allows the ride, not only where the plan takes
            // it.)
            let sweep: Vec<Option<i32>> = if fuse && cfg.ride_allowed() && !aheads.is_empty() {
                aheads.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            // The wgmma plans once per --window value, else at the default launch length.
            let lengths: Vec<Option<usize>> = if path == CorrPath::Wgmma && !windows.is_empty() {
                windows.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            for (ahead, window) in sweep
                .iter()
                .flat_map(|&a| lengths.iter().map(move |&w| (a, w)))
            {
                let f = measure(&gpu, cfg, &input, fuse, ahead, window, reps)?;
                println!(
                "{:>12} {:>5} {:>4} {:>5} {:>3}  {:>9.3} {:>9.3}  {:>10.0} {:>5.1}%  {:>10.0}  {:>8}",
                f.label,
                n_ants,
                channels,
                spectra,
                batches,
                f.turn * 1e3,
                f.corr * 1e3,
                f.useful / f.corr / 1e12,
                100.0 * f.useful / f.corr / DENSE_PEAK,
                f.useful / (f.corr + f.turn) / 1e12,
                f.clusters
            );
            }
        }
    }
    Ok(())
}
