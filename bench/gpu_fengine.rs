//! `cbf-gpu-bench`: the CUDA F-engine's speed against the device's own ceilings, all measured
//! in one run (METHOD.md): device-to-device copy bandwidth, pinned host↔device bandwidth
//! alone and both ways at once (at the engine's 1.25 B in : 1 B out per sample), the PFB and
//! post-processing kernels in bytes moved per second (katgpucbf's byte formulas,
//! h100_measured.md), cuFFT between them, and the whole path from pinned chunks to 8-bit heaps
//! in pinned memory through the engine's own `Pipeline` in input samples per second: one
//! wideband output, then one wideband and two narrowband outputs sharing each chunk's upload
//! (`outputs`, against the PCIe bounds measured just before).
//!
//! Run `cbf selftest --gpu` first: a figure counts only when that passed in the same run.
//! Usage: `cbf-gpu-bench [--quick] [--scan] [--timeline] [--kernels-only CHANNELS]
//! [--launch-only [--launch-heaps K]...] [--outputs-only]` (`--outputs-only`: the ceilings and
//! the three-output case alone).

use std::sync::Arc;
use std::time::Instant;

use cbf::dsp::pfb::Window;
use cbf::dsp::postproc::{OutputBits, SpectrumDelay};
use cbf::fengine::backend::{BackEndInput, Backend, ChunkInput};
use cbf::fengine::cuda::{
    default_batch, default_depth, default_unzip, wideband_batch, GpuBackend, GpuConfig,
};
use cbf::fengine::output::WidebandOutput;
use cbf::fengine::pipeline::{ChunkView, Pipeline, PipelineConfig};
use cbf::fengine::place::InputLayout;
use cbf::gpu::memory::HostRegistrations;
use cbf::gpu::timeline::Timeline;
use cbf::gpu::{Gpu, GpuError};
use cudarc::driver::PinnedHostSlice;
use num_complex::Complex32;

#[path = "gpu_fengine_outputs.rs"]
mod outputs;
#[path = "timing.rs"]
mod timing;
use timing::{copy_at_size, copy_ceiling, median, Pad, PAD_BYTES};

const GB: f64 = 1e9;

/// Random bytes (any byte string is a valid packed sample stream).
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn pinned(gpu: &Gpu, len: usize, seed: u64) -> Result<PinnedHostSlice<u8>, GpuError> {
    // SAFETY: filled before use.
    let mut p = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(len, 0) }?;
    fill(p.as_mut_slice()?, seed);
    Ok(p)
}

fn output(channels: usize, dither: bool) -> WidebandOutput {
    WidebandOutput {
        name: "bench".into(),
        channels,
        dst: vec![],
        taps: 16,
        w_cutoff: 1.0,
        window: Window::Hann,
        dither,
        jones_per_batch: None,
    }
}

struct Ceilings {
    copy: f64,
    h2d: f64,
    d2h: f64,
    both_h2d: f64,
    both_d2h: f64,
}

fn ceilings(gpu: &Arc<Gpu>) -> Result<Ceilings, GpuError> {
    let copy = copy_ceiling(gpu, 1 << 27)? / GB; // 2 GiB each way
                                                 // Pinned copies: 1.25 GiB in and 1 GiB out, the engine's ratio.
    let (bin, bout) = (5usize << 28, 1usize << 30);
    let hin = pinned(gpu, bin, 1)?;
    let mut hout = pinned(gpu, bout, 2)?;
    let mut din = gpu.h2d.alloc_zeros::<u8>(bin)?;
    let dout = gpu.d2h.alloc_zeros::<u8>(bout)?;
    let time = |f: &mut dyn FnMut() -> Result<(), GpuError>| -> Result<f64, GpuError> {
        let mut v = Vec::new();
        for _ in 0..5 {
            gpu.ctx.synchronize()?;
            let t = Instant::now();
            f()?;
            gpu.ctx.synchronize()?;
            v.push(t.elapsed().as_secs_f64());
        }
        Ok(median(v))
    };
    let t_in = time(&mut || Ok(gpu.h2d.memcpy_htod(&hin, &mut din)?))?;
    let t_out = time(&mut || Ok(gpu.d2h.memcpy_dtoh(&dout, &mut hout)?))?;
    let (both_h2d, both_d2h) = both_ways(gpu, &hin, &mut hout, &mut din, &dout)?;
    Ok(Ceilings {
        copy,
        h2d: bin as f64 / t_in / GB,
        d2h: bout as f64 / t_out / GB,
        both_h2d,
        both_d2h,
    })
}

/// Pinned H2D and D2H at once (1.25 GiB in, 1 GiB out), each timed by its own events: GB/s.
fn both_ways(
    gpu: &Arc<Gpu>,
    hin: &PinnedHostSlice<u8>,
    hout: &mut PinnedHostSlice<u8>,
    din: &mut cudarc::driver::CudaSlice<u8>,
    dout: &cudarc::driver::CudaSlice<u8>,
) -> Result<(f64, f64), GpuError> {
    let mut both = (Vec::new(), Vec::new());
    for _ in 0..5 {
        gpu.ctx.synchronize()?;
        let ev = || {
            gpu.ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        let (a0, a1, b0, b1) = (ev()?, ev()?, ev()?, ev()?);
        a0.record(&gpu.h2d)?;
        b0.record(&gpu.d2h)?;
        gpu.h2d.memcpy_htod(hin, din)?;
        gpu.d2h.memcpy_dtoh(dout, hout)?;
        a1.record(&gpu.h2d)?;
        b1.record(&gpu.d2h)?;
        gpu.ctx.synchronize()?;
        both.0.push(f64::from(a0.elapsed_ms(&a1)?) * 1e-3);
        both.1.push(f64::from(b0.elapsed_ms(&b1)?) * 1e-3);
    }
    Ok((
        hin.len() as f64 / median(both.0) / GB,
        dout.len() as f64 / median(both.1) / GB,
    ))
}

/// The PCIe bound for 10-bit in, 8-bit out, in samples/s, measured now.
fn pcie_bound(gpu: &Arc<Gpu>) -> Result<f64, GpuError> {
    let (bin, bout) = (5usize << 28, 1usize << 30);
    let hin = pinned(gpu, bin, 1)?;
    let mut hout = pinned(gpu, bout, 2)?;
    let mut din = gpu.h2d.alloc_zeros::<u8>(bin)?;
    let dout = gpu.d2h.alloc_zeros::<u8>(bout)?;
    let (h, d) = both_ways(gpu, &hin, &mut hout, &mut din, &dout)?;
    Ok((h / 1.25).min(d) * GB)
}

struct KernelFigures {
    channels: usize,
    dither: bool,
    section: usize,
    pfb: f64,
    fft: f64,
    post: f64,
    samples: f64,
}

/// The three kernels on ~2^28 samples per pol (katgpucbf's "large" case), event-timed,
/// median of 10 after warm-up; the PFB's section length swept.
fn kernels(
    gpu: &Arc<Gpu>,
    channels: usize,
    dither: bool,
    sections: &[usize],
) -> Result<Vec<KernelFigures>, GpuError> {
    kernels_at(
        gpu,
        channels,
        (1usize << 28) / (2 * channels),
        dither,
        sections,
    )
}

/// The kernels on `spectra` spectra per call (the engine calls them once per heap).
fn kernels_at(
    gpu: &Arc<Gpu>,
    channels: usize,
    spectra: usize,
    dither: bool,
    sections: &[usize],
) -> Result<Vec<KernelFigures>, GpuError> {
    let step = 2 * channels;
    let taps = 16;
    let body = (spectra + taps) * step;
    let out = output(channels, dither);
    let mut gb = GpuBackend::new(
        Arc::clone(gpu),
        &out,
        GpuConfig {
            sample_bits: 10,
            body,
            tail: step * taps,
            spectra_per_heap: spectra,
            out_bits: OutputBits::Eight,
            unzip: default_unzip(channels),
            batch: 1,
            depth: 1,
            peer: false,
        },
    )?;
    let mut data = vec![0u8; 2 * body * 10 / 8];
    fill(&mut data, 3);
    gb.load(ChunkInput {
        id: 0,
        data: &data,
        next: Some(&data),
    })?;
    // The chunk stays loaded until every section is timed: `release` lets go of its slot
    // (and the front end refuses to run without one).
    let gains = vec![Complex32::new(0.02, 0.01); channels];
    let delays = vec![
        SpectrumDelay {
            coarse: 0,
            fine: 0.3,
            phase: 0.2
        };
        spectra
    ];
    let ts: Vec<i64> = (0..spectra as i64).map(|k| k * step as i64).collect();
    let input = BackEndInput {
        gains: [&gains, &gains],
        gains_version: 0,
        delays: [&delays, &delays],
        timestamps: &ts,
        dither: dither.then_some(7),
    };
    let samples = (2 * spectra * step) as f64;
    gb.stage(&input)?;
    // A device copy queued before the first event keeps the compute stream busy while the
    // host issues the launches, so that the events time the kernels alone: on an idle
    // stream the PFB's start event fired at once and its span held the host's ~15 µs launch
    // call too, a quarter of a launch-size PFB (bench/gpu-notes.md v17).
    let mut pad = Pad::new(gpu, PAD_BYTES)?;
    let mut figs = Vec::new();
    for &section in sections {
        gb.set_section(section);
        let (mut tp, mut tf, mut tq) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..12 {
            // The runs are gathered on the host first (no launch until flush_runs), so that
            // the PFB's time is the kernel's, not the host loop's over every spectrum (0.5–1 ms
            // at 4096 channels: the 2026-11-24 PFB figures at 4096 channels include it).
            for k in 0..spectra {
                for p in 0..2 {
                    gb.front_end(p, k * step, k)?;
                }
            }
            pad.queue(gpu)?;
            let e0 = gb.mark()?;
            gb.flush_runs()?;
            let e1 = gb.mark()?;
            gb.fft()?;
            let e2 = gb.mark()?;
            gb.postproc(input.dither)?;
            let e3 = gb.mark()?;
            e3.synchronize()?;
            if rep >= 2 {
                tp.push(f64::from(e0.elapsed_ms(&e1)?) * 1e-3);
                tf.push(f64::from(e1.elapsed_ms(&e2)?) * 1e-3);
                tq.push(f64::from(e2.elapsed_ms(&e3)?) * 1e-3);
            }
        }
        let (tp, tf, tq) = (median(tp), median(tf), median(tq));
        figs.push(KernelFigures {
            channels,
            dither,
            section,
            // katgpucbf's formulas (h100_measured.md): PFB as `pfb_bytes`; FFT = complex64
            // read + written; post-processing = complex64 in + int8 out + gains.
            pfb: pfb_bytes(2 * spectra * step, step, taps) / tp / GB,
            fft: samples * 8.0 / tf / GB,
            post: (samples * 4.0 + samples + (2 * channels * 8) as f64) / tq / GB,
            samples: samples / (tp + tf + tq),
        });
    }
    gb.release()?;
    Ok(figs)
}

/// Bytes the PFB moves for `samples` output samples (both pols) of `step` per spectrum, by
/// katgpucbf's formula (h100_measured.md): the packed 10-bit input read once with the filter
/// history, the float32 output, the weights.
fn pfb_bytes(samples: usize, step: usize, taps: usize) -> f64 {
    (samples + 2 * (taps - 1) * step) as f64 * 1.25
        + samples as f64 * 4.0
        + (taps * step * 4) as f64
}

/// The engine path: `Pipeline` on `GpuBackend` over pinned chunks (10-bit, both pols),
/// 8-bit heaps to pinned memory; input samples per second (both pols).
/// `shape` = (channels, log2 of the chunk's samples per pol, taps).
/// `slots`: output slots of a launch's heaps each (the engine's: `default_depth`). With
/// `timeline`, every copy and launch is timed and summarised per label after the run.
fn whole_path(
    gpu: &Arc<Gpu>,
    shape: (usize, u32, usize),
    chunks: usize,
    slots: usize,
    timeline: bool,
) -> Result<(f64, u64), GpuError> {
    let (channels, chunk_log2, taps) = shape;
    let layout = InputLayout {
        heap_samples: 4096,
        heap_bytes: 4096 * 10 / 8,
        chunk_samples: 1 << chunk_log2,
        mask_timestamp: false,
    };
    let out = WidebandOutput {
        taps,
        ..output(channels, true)
    };
    let sph = (1usize << 20) / channels;
    let cfg = PipelineConfig {
        layout,
        sample_bits: 10,
        spectra_per_heap: sph,
        max_delay_diff: 0,
        gain: Complex32::new(0.05, 0.0),
        dither_seed: 9,
        out_bits: OutputBits::Eight,
    };
    let backend = GpuBackend::new(
        Arc::clone(gpu),
        &out,
        GpuConfig {
            sample_bits: 10,
            body: layout.chunk_samples as usize,
            tail: cfg.tail(out.shape()),
            spectra_per_heap: sph,
            out_bits: OutputBits::Eight,
            unzip: default_unzip(channels),
            // As the engine: at most one chunk's heaps (`fengine::pipelines`).
            batch: wideband_batch(sph, channels, 1 << chunk_log2),
            depth: slots,
            peer: false,
        },
    )?;
    let mut backend = backend;
    let tl = timeline.then(|| backend.record_timeline());
    let mut pipeline = Pipeline::with_backend(out.into(), cfg, Box::new(backend));
    // Chunks as the engine has them: ordinary heap memory, page-locked in place
    // (`HostRegistrations`, as `fengine::Engine` does with its receive chunks).
    let bytes = 2 * layout.pol_bytes();
    let mut bufs: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let mut b = vec![0u8; bytes];
            fill(&mut b, 10 + i);
            b
        })
        .collect();
    let mut pins = HostRegistrations::new(Arc::clone(gpu));
    for b in &mut bufs {
        // SAFETY: `bufs` outlives `pins` (dropped first, below) and is never resized.
        unsafe { pins.register(b) }?;
    }
    let present = vec![1u8; 2 * layout.heaps_per_pol()];
    let mut heaps = 0u64;
    let mut check = 0u64;
    let warm = 4;
    let mut t0 = Instant::now();
    for id in 0..chunks + warm {
        if id == warm {
            t0 = Instant::now();
        }
        let view = |i: usize| -> Result<ChunkView<'_>, GpuError> {
            Ok(ChunkView {
                chunk_id: i as u64,
                data: &bufs[i % 3],
                present: &present,
            })
        };
        pipeline.process(view(id)?, Some(view(id + 1)?), |h| {
            heaps += 1;
            if let Some(d) = h.data.host() {
                check = check.wrapping_add(u64::from(d[d.len() / 2]));
            }
        })?;
    }
    pipeline.flush(|_| heaps += 1)?;
    let t = t0.elapsed().as_secs_f64();
    std::hint::black_box(check);
    drop(pipeline);
    drop(pins);
    if let Some(tl) = tl {
        print_timeline(&tl)?;
    }
    Ok(((chunks as u64 * 2 * layout.chunk_samples) as f64 / t, heaps))
}

/// Every label's spans and the host's waits, after the run.
fn print_timeline(tl: &Timeline) -> Result<(), GpuError> {
    let (window, labels) = tl.summarise()?;
    println!("  timeline over {window:.1} ms:");
    for l in labels {
        println!(
            "    {:<22} {:>5} spans, busy {:>7.1} ms ({:>3.0}%), mean {:.3} ms, max {:.3} ms; idle between {:>7.1} ms, largest gap {:.3} ms",
            l.label, l.count, l.busy_ms, 100.0 * l.busy_ms / window, l.mean_ms, l.max_ms, l.idle_ms, l.max_gap_ms
        );
    }
    for (label, n, ms) in tl.host_waits() {
        println!("    {label:<32} {n:>5} times, {ms:>7.1} ms in all");
    }
    Ok(())
}

fn main() -> Result<(), GpuError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let gpu = Gpu::open(0)?;
    println!("# cbf-gpu-bench on {} ({})", gpu.name, gpu.arch);
    let c = ceilings(&gpu)?;
    println!(
        "ceilings: d2d copy {:.0} GB/s; pinned H2D {:.1} GB/s, D2H {:.1} GB/s alone; both at once (1.25:1) H2D {:.1} GB/s, D2H {:.1} GB/s",
        c.copy, c.h2d, c.d2h, c.both_h2d, c.both_d2h
    );
    println!(
        "PCIe bound for 10-bit in, 8-bit out: {:.1} GS/s",
        (c.both_h2d / 1.25).min(c.both_d2h)
    );
    let timeline = std::env::args().any(|a| a == "--timeline");
    if std::env::args().any(|a| a == "--outputs-only") {
        return outputs::report(&gpu, quick, timeline);
    }
    // `--launch-only`: the kernels at the engine's launch size alone (one batch of
    // `default_batch` heaps per launch), for the PFB's launch-size figure and a profiler;
    // `--launch-heaps K` (repeatable) times launches of K heaps instead.
    if std::env::args().any(|a| a == "--launch-only") {
        let heaps: Vec<usize> = std::env::args()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "--launch-heaps")
            .map(|w| w[1].parse().expect("--launch-heaps takes a heap count"))
            .collect();
        for channels in [4096, 32768] {
            let sph = (1 << 20) / channels;
            let batches = if heaps.is_empty() {
                vec![default_batch(sph, true)]
            } else {
                heaps.clone()
            };
            for spectra in batches.into_iter().map(|b| b * sph) {
                // The copy ceiling at the PFB's own bytes (read + written) per launch.
                let step = 2 * channels;
                let pfb_bytes = pfb_bytes(2 * spectra * step, step, 16);
                let copy_here = copy_at_size(&gpu, (pfb_bytes / 32.0) as usize, PAD_BYTES)? / GB;
                println!(
                    "launch-size copy {channels:>5} ch: {:.1} MB read + written per launch, {copy_here:.0} GB/s ({:.0}% of the large copy)",
                    pfb_bytes * 1e-6,
                    100.0 * copy_here / c.copy
                );
                for f in kernels_at(&gpu, channels, spectra, true, &[32, 64, 128, 256])? {
                    println!(
                        "launch-size kernels {:>5} ch, {spectra:>4} spectra, section {:>3}: pfb {:>5.0} GB/s ({:>3.0}% of copy, {:>3.0}% of the copy at this size), fft {:>5.0} GB/s, postproc {:>5.0} GB/s ({:>3.0}%), chain {:>4.0} GS/s",
                        f.channels, f.section, f.pfb, 100.0 * f.pfb / c.copy, 100.0 * f.pfb / copy_here,
                        f.fft, f.post, 100.0 * f.post / c.copy, f.samples / GB
                    );
                }
            }
        }
        return Ok(());
    }
    let sections: &[usize] = if quick {
        &[32, 64, 128]
    } else {
        &[8, 16, 32, 64, 128]
    };
    // `--kernels-only CH`: the kernel figures at CH channels and nothing else (for a profiler).
    let only: Option<usize> = std::env::args()
        .skip_while(|a| a != "--kernels-only")
        .nth(1)
        .and_then(|v| v.parse().ok());
    for channels in only.map_or(vec![4096, 32768], |c| vec![c]) {
        for dither in [true, false] {
            for f in kernels(&gpu, channels, dither, sections)? {
                println!(
                    "kernels {:>5} ch dither={:<5} section {:>3}: pfb {:>6.0} GB/s ({:>3.0}% of copy), fft {:>6.0} GB/s ({:>3.0}%), postproc {:>6.0} GB/s ({:>3.0}%), chain {:>5.0} GS/s",
                    f.channels, f.dither, f.section,
                    f.pfb, 100.0 * f.pfb / c.copy,
                    f.fft, 100.0 * f.fft / c.copy,
                    f.post, 100.0 * f.post / c.copy,
                    f.samples / GB,
                );
            }
        }
    }
    if only.is_some() {
        return Ok(());
    }
    // The PCIe bound is re-measured right before each whole-path run: the machine's link is
    // shared and has been seen to vary between runs.
    for channels in [4096, 32768] {
        let sph = (1 << 20) / channels;
        let batch = wideband_batch(sph, channels, 1 << 25);
        // Two slots and the engine's four (`default_depth`).
        for slots in [2, default_depth(sph, true)] {
            let bound = pcie_bound(&gpu)?;
            let (rate, heaps) = whole_path(
                &gpu,
                (channels, 25, 16),
                if quick { 200 } else { 600 },
                slots,
                timeline,
            )?;
            println!(
                "whole path {channels:>5} ch, 16 taps, 10-bit in, 8-bit out, {slots} slots of {batch} heaps: {:.1} GS/s = {:.0}% of the PCIe bound measured just before ({:.1} GS/s; {heaps} heaps)",
                rate / GB,
                100.0 * rate / bound,
                bound / GB,
            );
        }
    }
    outputs::report(&gpu, quick, timeline)?;
    // Where the whole path falls short of the bound: the same path over other shapes (the
    // tail a chunk carries is taps × 2·channels samples), and the kernels at the engine's
    // heap size (2^20 values: one call per heap).
    if std::env::args().any(|a| a == "--scan") {
        for channels in [4096, 16384, 32768] {
            let sph = (1 << 20) / channels;
            for (what, spectra) in [("heap", sph), ("launch", sph * default_batch(sph, true))] {
                for f in kernels_at(&gpu, channels, spectra, true, &[32, 64])? {
                    println!(
                        "{what}-size kernels {:>5} ch, {spectra:>4} spectra, section {:>2}: pfb {:>5.0} GB/s, fft {:>5.0} GB/s, postproc {:>5.0} GB/s, chain {:>4.0} GS/s",
                        f.channels, f.section, f.pfb, f.fft, f.post, f.samples / GB
                    );
                }
            }
        }
        for shape in [
            (8192, 25, 16),
            (16384, 25, 16),
            (32768, 26, 16),
            (32768, 25, 4),
            (4096, 24, 16),
        ] {
            let bound = pcie_bound(&gpu)?;
            let depth = default_depth((1 << 20) / shape.0, true);
            let (rate, _) = whole_path(&gpu, shape, 100, depth, false)?;
            println!(
                "scan {:>5} ch, 2^{} samples per chunk, {:>2} taps: {:.1} GS/s = {:.0}% of {:.1}",
                shape.0,
                shape.1,
                shape.2,
                rate / GB,
                100.0 * rate / bound,
                bound / GB
            );
        }
    }
    Ok(())
}
