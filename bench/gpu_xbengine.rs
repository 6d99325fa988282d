//! `cbf-xb-bench`: the whole GPU XB path of `cbf xbengine --backend cuda` (issue 13), through
//! the engine's own [`CudaBackend`] and in the engine's order of calls: receive chunks in
//! page-locked host memory (pinned by the backend, as the engine pins its chunks) → copy in →
//! correlate → beamform → beams to pinned memory and into heap buffers every chunk, X dumps to
//! host memory at MeerKAT's accumulation length. Beside it, in the same run: the host-to-device
//! bound (the same chunk copied from the same pinned memory) and the correlator op's own rate on
//! device-resident input, so the path's rate is stated as a fraction of whichever bounds it.
//!
//! With `--frb`, instead, the share of the GPU's time per chunk an `--frb-beam` output takes
//! beside the correlator and the beamformer (`gpu_xbengine_frb.rs`, seed 004's case 5).
//!
//! Run `cbf selftest --gpu` first: a figure counts only when that passed in the same run.
//! Usage: `cbf-xb-bench [--quick] [--beamformer-only | --frb]` (the second skips the whole
//! path).

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use cbf::dsp::beamform::Beam;
use cbf::dsp::correlate::CorrShape;
use cbf::gpu::beamform::{BeamformConfig, Beamformer};
use cbf::gpu::correlate::{CorrConfig, CorrPath, Correlator};
use cbf::gpu::Gpu;
use cbf::xbengine::backend::{BeamChunk, XbBackend, XbShape, BEAM_SLOTS};
use cbf::xbengine::cuda::CudaBackend;
use num_complex::Complex64;

#[path = "gpu_xbengine_frb.rs"]
mod frb_share;
#[path = "timing.rs"]
mod timing;
use timing::{median, timed, timed_behind, Pad, PAD_BYTES};

/// MeerKAT L-band: spectra per second per channel for 32768 channels at 1712 MS/s.
const SPECTRA_PER_S: f64 = 1712e6 / 65536.0;
/// Spectra per dump: katgpucbf's 0.5 s accumulation (52 heaps of 256 spectra, 416 of 32).
const ACC_SPECTRA: usize = 13312;

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

struct Shape {
    n_ants: usize,
    channels: usize,
    spectra: usize,
    batches: usize,
    beams: usize,
}

/// The device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer:
/// the beamformer's ceiling, as it is DRAM-bound at few beams (seed 003).
fn copy_bandwidth(gpu: &Arc<Gpu>) -> Result<f64, Box<dyn Error>> {
    let n = 1usize << 30;
    let src = gpu.compute.alloc_zeros::<u8>(n)?;
    let mut dst = gpu.compute.alloc_zeros::<u8>(n)?;
    let t = timed::<Box<dyn Error>>(gpu, 5, &mut || {
        Ok(gpu.compute.memcpy_dtod(&src, &mut dst)?)
    })?;
    Ok(2.0 * n as f64 / t)
}

/// The beamformer kernel alone on device-resident input: bytes moved (input read + beams
/// written) per second against the copy bandwidth, and beams formed per second.
fn beamformer(
    gpu: &Arc<Gpu>,
    copy: f64,
    cfg: BeamformConfig,
    dither: bool,
) -> Result<(), Box<dyn Error>> {
    let mut bf = Beamformer::new(Arc::clone(gpu), cfg)?;
    let mut bytes = vec![0u8; cfg.input_bytes()];
    fill(&mut bytes, 3);
    let input = gpu.compute.clone_htod(&bytes)?;
    let mut out = gpu.compute.alloc_zeros::<i8>(cfg.output_len())?;
    let mut clips = gpu.compute.alloc_zeros::<u64>(cfg.batches * cfg.beams)?;
    let beams: Vec<Beam> = (0..cfg.beams)
        .map(|b| Beam {
            pol: b % 2,
            weights: vec![Complex64::new(0.05, 0.01); cfg.n_ants],
            delays: vec![0.01; cfg.n_ants],
        })
        .collect();
    bf.set_beams(1, &beams)?;
    let present = vec![1u8; cfg.batches * cfg.n_ants];
    let seeds = vec![dither.then_some(1u64); cfg.beams];
    // A device copy queued before each timed call keeps the compute stream busy while the host
    // issues the call, as the correlator does in the engine: on an idle stream the events also
    // timed the host's launch and the wait for the call's parameter copies, about 25 µs of a
    // 105 µs call at MeerKAT's shape (bench/xbengine-notes.md v13).
    let mut pad = Pad::new(gpu, PAD_BYTES)?;
    let t = timed_behind::<Box<dyn Error>>(gpu, 10, &mut || Ok(pad.queue(gpu)?), &mut || {
        bf.form(
            &input.as_view(),
            &present,
            0,
            (cfg.spectra * 65536) as i64,
            65536,
            &seeds,
            &mut out,
            &mut clips,
        )?;
        Ok(())
    })?;
    let moved = (cfg.input_bytes() + cfg.output_len()) as f64;
    let beam_samples = (cfg.output_len() / 2) as f64;
    println!(
        "beamformer {:>4} ants {:>4} ch {:>3} spectra ×{:>2} batches {:>3} beams{}{}: {:>7.1} µs, {:>6.0} GB/s moved = {:>5.1} % of copy | {:.2} G beam-samples/s, {:.1} G antenna-beam MACs/s",
        cfg.n_ants,
        cfg.channels,
        cfg.spectra,
        cfg.batches,
        cfg.beams,
        if dither { "" } else { ", no dither" },
        if cfg.in_bits == 8 { "" } else { ", 4-bit input" },
        t * 1e6,
        moved / t * 1e-9,
        100.0 * moved / t / copy,
        beam_samples / t * 1e-9,
        beam_samples * cfg.n_ants as f64 / t * 1e-9,
    );
    Ok(())
}

fn run(gpu: &Arc<Gpu>, s: &Shape, chunks: usize) -> Result<(), Box<dyn Error>> {
    let shape = XbShape {
        n_ants: s.n_ants,
        channels: s.channels,
        spectra: s.spectra,
        sample_bits: 8,
        outputs: 1,
        threads: 1,
    };
    let chunk_bytes = shape.batch_bytes() * s.batches;
    let mut backend = CudaBackend::new(Arc::clone(gpu), shape, s.batches, s.beams)?;
    // The engine's ring of receive chunks (4 here), pinned as the engine pins them.
    let mut ring: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let mut v = vec![0u8; chunk_bytes];
            fill(&mut v, 7 + i);
            v
        })
        .collect();
    for c in &mut ring {
        backend.pin(c)?;
    }
    let beams: Vec<Beam> = (0..s.beams)
        .map(|b| Beam {
            pol: b % 2,
            weights: vec![Complex64::new(0.05, 0.01); s.n_ants],
            delays: vec![0.01; s.n_ants],
        })
        .collect();
    let dither = vec![Some(1u64); s.beams];
    let present = vec![1u8; s.batches * s.n_ants];
    let present_all = vec![true; s.n_ants];
    // One X heap buffer, page-locked as the engine page-locks its send pool's (`pin`, at
    // start-up: tens of ms for 53 MB, once per buffer) and reused as the engine reuses them,
    // so the device writes into it directly. Its size is what the backend makes of a dump.
    backend.dump(0, &present_all, Vec::new())?;
    let mut first = backend.dumped(0)?.0;
    backend.pin(&mut first)?;
    let mut x_heap: Option<Vec<u8>> = Some(first);
    let beam_heaps = s.beams * s.channels * s.spectra * 2;
    let mut beam_buf = vec![0u8; beam_heaps];
    let dump_every = ACC_SPECTRA.div_ceil(s.spectra * s.batches);

    // The host-to-device bound: the same chunk copied from the same pinned memory.
    let mut dev = gpu.h2d.alloc_zeros::<u8>(chunk_bytes)?;
    let mut copies = Vec::new();
    for i in 0..12 {
        let t = Instant::now();
        gpu.h2d.memcpy_htod(&ring[i % 4][..], &mut dev)?;
        gpu.h2d.synchronize()?;
        copies.push(t.elapsed().as_secs_f64());
    }
    let pcie = chunk_bytes as f64 / median(copies[2..].to_vec());
    drop(dev);

    // The correlator op alone on device-resident input.
    let cfg = CorrConfig {
        shape: CorrShape {
            n_ants: s.n_ants,
            channels: s.channels,
            spectra: s.spectra,
        },
        batches: s.batches,
        in_bits: 8,
        path: CorrPath::best_for(gpu),
    };
    let corr_rate = {
        let mut corr = Correlator::new(Arc::clone(gpu), cfg)?;
        let input = gpu.compute.clone_htod(&ring[0])?;
        let mut acc = gpu.compute.alloc_zeros::<i64>(cfg.acc_len())?;
        let mut times = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            corr.correlate(&input.as_view(), &mut acc)?;
            gpu.compute.synchronize()?;
            times.push(t.elapsed().as_secs_f64());
        }
        chunk_bytes as f64 / median(times[2..].to_vec())
    };

    // The whole path, in the engine's order of calls; `stage` 0 copies only, 1 also
    // correlates, 2 is the engine's whole work (the first two say where time goes).
    let mut pending = std::collections::VecDeque::new();
    let mut dump_pending = false;
    // Host time spent in each call of the loop (seconds, summed): where the engine thread
    // waits. Order: load, correlate, dumped, dump, beamform, beams (wait + copy), release.
    let mut step = |k: usize,
                    stage: u8,
                    backend: &mut CudaBackend,
                    spent: &mut [f64; 7]|
     -> Result<(), Box<dyn Error>> {
        let mut t = Instant::now();
        let mut lap = |i: usize, spent: &mut [f64; 7]| {
            spent[i] += t.elapsed().as_secs_f64();
            t = Instant::now();
        };
        backend.load(&ring[k % 4])?;
        lap(0, spent);
        if stage >= 1 {
            backend.correlate(0, 0..s.batches)?;
        }
        lap(1, spent);
        // A dump is started here into a heap buffer and taken back at the next chunk, as the
        // engine does.
        if dump_pending {
            // The heap buffer comes back filled; the engine would hand it to its send thread.
            x_heap = Some(backend.dumped(0)?.0);
            dump_pending = false;
        }
        lap(2, spent);
        if stage >= 2 && (k + 1) % dump_every == 0 {
            backend.dump(0, &present_all, x_heap.take().unwrap_or_default())?;
            dump_pending = true;
        }
        lap(3, spent);
        let slot = if stage >= 2 && s.beams > 0 {
            Some(backend.beamform(&BeamChunk {
                version: 1,
                beams: &beams,
                dither: &dither,
                first: (k * s.batches * s.spectra * 65536) as i64,
                batch_step: (s.spectra * 65536) as i64,
                spectrum_step: 65536,
                present: &present,
            })?)
        } else {
            None
        };
        lap(4, spent);
        pending.extend(slot);
        // Two chunks back, as the engine does.
        if pending.len() >= BEAM_SLOTS {
            let r = backend.beams(pending.pop_front().unwrap_or_default())?;
            // Into heap buffers, as the engine copies them into its send pool.
            for batch in r.data.chunks_exact(beam_heaps) {
                beam_buf.copy_from_slice(batch);
            }
        }
        lap(5, spent);
        backend.release()?;
        lap(6, spent);
        Ok(())
    };
    let mut rates = [0.0; 3];
    let mut spent = [0.0f64; 7];
    for (stage, rate) in rates.iter_mut().enumerate() {
        for k in 0..4 {
            step(k, stage as u8, &mut backend, &mut spent)?;
        }
        spent = [0.0; 7];
        let t = Instant::now();
        for k in 4..4 + chunks {
            step(k, stage as u8, &mut backend, &mut spent)?;
        }
        gpu.ctx.synchronize()?;
        *rate = (chunks * chunk_bytes) as f64 / t.elapsed().as_secs_f64();
    }
    let path = rates[2];
    let ms = |v: f64| v * 1e3 / chunks as f64;
    println!(
        "    engine thread per chunk (ms), whole path: load {:.2}, correlate {:.2}, dumped {:.2}, dump {:.2}, beamform {:.2}, beams {:.2}, release {:.2}; H2D of a chunk {:.2}",
        ms(spent[0]),
        ms(spent[1]),
        ms(spent[2]),
        ms(spent[3]),
        ms(spent[4]),
        ms(spent[5]),
        ms(spent[6]),
        chunk_bytes as f64 / pcie * 1e3,
    );

    // 8-bit complex input: 2 bytes per sample.
    let gsps = |bytes_per_s: f64| bytes_per_s / 2.0 * 1e-9;
    let bound = pcie.min(corr_rate);
    let realtime = (s.n_ants * 2 * s.channels) as f64 * SPECTRA_PER_S;
    println!(
        "{:>4} ants {:>4} ch {:>3} spectra ×{} batches, {:>3} beams ({:.0} MB chunks, dump every {} chunks): \
         path {:.2} GS/s ({:.1} GB/s) | H2D bound {:.2} GS/s ({:.1} GB/s) | correlator {:.2} GS/s | \
         path/bound {:.1} % ({}-bound) | real time for this engine {:.2} GS/s → {:.1} engines per GPU \
         | stages: copy only {:.2} GS/s, + correlate {:.2} GS/s",
        s.n_ants,
        s.channels,
        s.spectra,
        s.batches,
        s.beams,
        chunk_bytes as f64 * 1e-6,
        dump_every,
        gsps(path),
        path * 1e-9,
        gsps(pcie),
        pcie * 1e-9,
        gsps(corr_rate),
        100.0 * path / bound,
        if pcie <= corr_rate { "PCIe" } else { "correlator" },
        realtime * 1e-9,
        gsps(path) * 1e9 / realtime,
        gsps(rates[0]),
        gsps(rates[1]),
    );
    // The backend unlocks the pinned chunks and heap buffer: before they are freed.
    drop(backend);
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let beamformer_only = std::env::args().any(|a| a == "--beamformer-only");
    let gpu = Gpu::open(0)?;
    println!(
        "{} ({}), correlator path {:?}",
        gpu.name,
        gpu.arch,
        CorrPath::best_for(&gpu)
    );
    if std::env::args().any(|a| a == "--frb") {
        return frb_share::run(&gpu, quick);
    }
    let chunks = if quick { 8 } else { 40 };
    let copy = copy_bandwidth(&gpu)?;
    println!(
        "device copy bandwidth: {:.0} GB/s (read + write)",
        copy * 1e-9
    );
    let bf = |n_ants, spectra, batches, beams| BeamformConfig {
        n_ants,
        channels: 512,
        spectra,
        batches,
        beams,
        in_bits: 8,
    };
    // 4-bit input (katgpucbf's other sample width): half the bytes per sample.
    let bf4 = |n_ants, spectra, batches, beams| BeamformConfig {
        in_bits: 4,
        ..bf(n_ants, spectra, batches, beams)
    };
    for cfg in [
        // MeerKAT: 80 antennas, 8 single-pol beams; the engine's 32 spectra × 32 batches and
        // 256 spectra × 4 batches.
        bf(80, 32, 32, 8),
        bf(80, 256, 4, 8),
        bf(80, 256, 4, 64),
        bf(80, 256, 4, 128),
        bf(80, 256, 4, 256),
        bf(256, 256, 2, 8),
        bf(256, 256, 2, 64),
        bf4(80, 256, 4, 8),
        bf4(80, 32, 32, 8),
    ] {
        beamformer(&gpu, copy, cfg, true)?;
        // The cost of the dither at MeerKAT's beams.
        if cfg.beams == 8 && cfg.n_ants == 80 {
            beamformer(&gpu, copy, cfg, false)?;
        }
    }
    if beamformer_only {
        return Ok(());
    }
    let shapes = [
        // katgpucbf's MeerKAT configuration: 80 antennas, 32768 channels over 64 engines,
        // xbgpu's defaults (--jones-per-batch 2^20: 32 spectra per heap, 32 heaps per chunk).
        Shape {
            n_ants: 80,
            channels: 512,
            spectra: 32,
            batches: 32,
            beams: 8,
        },
        // The same with 256 spectra per heap (issue 13's statement of it).
        Shape {
            n_ants: 80,
            channels: 512,
            spectra: 256,
            batches: 4,
            beams: 8,
        },
        Shape {
            n_ants: 80,
            channels: 512,
            spectra: 256,
            batches: 4,
            beams: 0,
        },
        Shape {
            n_ants: 256,
            channels: 128,
            spectra: 256,
            batches: 4,
            beams: 8,
        },
        Shape {
            n_ants: 576,
            channels: 64,
            spectra: 256,
            batches: 4,
            beams: 8,
        },
        Shape {
            n_ants: 1024,
            channels: 32,
            spectra: 256,
            batches: 4,
            beams: 8,
        },
    ];
    for s in &shapes {
        run(&gpu, s, chunks)?;
    }
    Ok(())
}
