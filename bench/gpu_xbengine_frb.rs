//! `cbf-xb-bench --frb`: what share of the GPU's time per chunk an `--frb-beam` output takes in
//! the XB-engine's CUDA path (issue 17), at seed 004 Table 3's case 5 (full CHORD: 512 dishes
//! on a 24×24 grid, 256 channels per GPU, t_ds 40, t_s 27.3 µs), beside the correlator and the
//! coherent beamformer the same engine runs on the same chunks.
//!
//! The engine's own [`CudaBackend`] in the engine's order of calls per chunk (load, correlate,
//! an X dump every 0.5 s of data taken back at the next chunk, 8 coherent beams read two chunks
//! late, the FRB output started and the previous chunk's collected, release), its receive
//! chunks and X heap buffer page-locked as the engine's are. Every copy and launch is timed by
//! CUDA events on the stream it runs on ([`CudaBackend::record_timeline`], as
//! `cbf-gpu-bench --timeline` times the F-engine's): per chunk, the GPU time of FRB stage 1,
//! stage 2 and the copy back beside the correlator's, the reduce's and the beamformer's, each
//! against the chunk's real-time span, and the FRB stages' share of the compute stream's busy
//! time. No host timer is put around asynchronous work; one is put around the engine thread's
//! collection of each FRB heap (`frb_formed`, which blocks: it waits for the copy, which the
//! device makes into the page-locked heap buffer), reported apart as host time.
//!
//! Adapted to the engine: its chunks are (batch, antenna, channel, spectrum, pol, re/im) with
//! 8-bit samples (CHORD's are 4+4-bit: the copy in is twice CHORD's), t_ds must divide a
//! chunk's spectra (5 heaps of 256 spectra: 1280 = 32 slow samples of 40, 34.95 ms), and the
//! beams are seed 004 Table 4's: the 96×96 grid (4M × 4N, factorisable) and, in a second run,
//! 5760 = 10·MN listed beams, both with the default fp16 second stage. The dish map is a
//! shuffled 512 of the 576 cells.

use std::error::Error;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cbf::dsp::beamform::Beam;
use cbf::dsp::frb::DishGrid;
use cbf::dsp::frb_resample::FrbBeams;
use cbf::gpu::frb::{FrbConfig, FrbIntensities, FrbTuning};
use cbf::gpu::timeline::LabelSummary;
use cbf::gpu::Gpu;
use cbf::xbengine::backend::{BeamChunk, FrbChunk, XbBackend, XbShape, BEAM_SLOTS};
use cbf::xbengine::cuda::CudaBackend;
use cbf::xbengine::cuda_frb::CudaFrbSpec;
use cbf::xbengine::frb_output::FrbBeamOutput;
use num_complex::{Complex32, Complex64};

/// Seed 004 Table 3, case 5.
const DISHES: usize = 512;
const GRID: (usize, usize) = (24, 24);
const CHANNELS: usize = 256;
const T_DS: usize = 40;
/// Input sampling time after upchannelisation (s).
const T_S: f64 = 27.3067e-6;
/// The engine's chunk: heaps of 256 spectra, 5 per chunk (t_ds must divide 1280).
const SPECTRA: usize = 256;
const BATCHES: usize = 5;
/// Coherent beams formed beside the FRB output (MeerKAT's count).
const BEAMS: usize = 8;
/// X dumps every 0.5 s of data, as katgpucbf's default accumulation.
const DUMP_S: f64 = 0.5;
/// Receive chunks in the ring (page-locked, 671 MB each).
const RING: usize = 3;
/// Chunks run before the timed ones.
const WARM: usize = 3;

/// What a run is built from, made and checked without a GPU.
pub struct Setup {
    pub shape: XbShape,
    pub spec: CudaFrbSpec,
    /// (channel, dish, pol) FRB weights.
    pub weights: Vec<Complex32>,
    /// The chunk's span of real time (s) and the chunks between X dumps.
    pub span: f64,
    pub dump_every: usize,
    pub chunk_bytes: usize,
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Case 5 with `beams`, checked as `cbf xbengine` checks an `--frb-beam` output at start-up
/// and as the first stage checks its shape; `Err` says what does not fit.
pub fn setup(beams: FrbBeams) -> Result<Setup, String> {
    let (rows, cols) = GRID;
    let mut seed = 0x5eed_f4b5_u64;
    let mut cells: Vec<(usize, usize)> = (0..rows * cols).map(|c| (c / cols, c % cols)).collect();
    for k in (1..cells.len()).rev() {
        cells.swap(k, (xorshift(&mut seed) % (k as u64 + 1)) as usize);
    }
    cells.truncate(DISHES);
    let grid = DishGrid::new(rows, cols, &cells).map_err(|e| e.to_string())?;
    let output = FrbBeamOutput {
        name: "frb".into(),
        dst: SocketAddrV4::new([239, 10, 11, 0].into(), 7148),
        grid: grid.clone(),
        t_ds: T_DS,
        beams: beams.clone(),
        scale: None,
        stage2_f32: false,
    };
    output.check(DISHES, SPECTRA * BATCHES, CHANNELS)?;
    let config = FrbConfig {
        rows,
        cols,
        dishes: DISHES,
        t_ds: T_DS,
        channels: CHANNELS,
        spectra: SPECTRA,
        batches: BATCHES,
        tuning: FrbTuning::default(),
        output: FrbIntensities::Float16,
    };
    config.builds().map_err(|e| e.to_string())?;
    let shape = XbShape {
        n_ants: DISHES,
        channels: CHANNELS,
        spectra: SPECTRA,
        sample_bits: 8,
        outputs: 1,
        threads: 1,
    };
    let weights = (0..CHANNELS * DISHES * 2)
        .map(|_| Complex32::from_polar(1.0, (xorshift(&mut seed) % 6283) as f32 * 1e-3))
        .collect();
    let span = (SPECTRA * BATCHES) as f64 * T_S;
    Ok(Setup {
        shape,
        spec: CudaFrbSpec {
            config,
            grid,
            beams,
            scale: output.scale() as f32,
        },
        weights,
        span,
        dump_every: (DUMP_S / span).ceil() as usize,
        chunk_bytes: shape.batch_bytes() * BATCHES,
    })
}

/// One label's time per chunk (ms): its busy time over `chunks`.
fn per_chunk(labels: &[LabelSummary], label: &str, chunks: usize) -> f64 {
    labels
        .iter()
        .filter(|l| l.label == label)
        .map(|l| l.busy_ms)
        .sum::<f64>()
        / chunks as f64
}

/// Spans of the compute stream, and of the FRB output among them.
const COMPUTE: [&str; 6] = [
    "correlate",
    "reduce",
    "beamform",
    "frb stage 1",
    "frb stage 2",
    "frb encode",
];
const FRB: [&str; 3] = ["frb stage 1", "frb stage 2", "frb encode"];
const COPIES: [&str; 4] = ["h2d chunk", "d2h vis", "d2h beams", "d2h frb"];

/// The report's lines from the timeline's summary over `chunks` chunks of `span_ms` each
/// (`window_ms`: first event to last).
pub fn report(labels: &[LabelSummary], window_ms: f64, chunks: usize, span_ms: f64) -> Vec<String> {
    let pct = |ms: f64| 100.0 * ms / span_ms;
    let mut lines = vec![format!(
        "  per chunk ({chunks} chunks, GPU event time; the chunk's real-time span {span_ms:.2} ms):"
    )];
    for label in COMPUTE.iter().chain(&COPIES) {
        let ms = per_chunk(labels, label, chunks);
        let n = labels
            .iter()
            .find(|l| l.label == *label)
            .map_or(0, |l| l.count);
        lines.push(format!(
            "    {label:<12} {ms:>8.3} ms = {:>6.2} % of real time ({n} spans)",
            pct(ms)
        ));
    }
    let compute: f64 = COMPUTE.iter().map(|l| per_chunk(labels, l, chunks)).sum();
    let frb: f64 = FRB.iter().map(|l| per_chunk(labels, l, chunks)).sum();
    let frb_copy = per_chunk(labels, "d2h frb", chunks);
    let d2h: f64 = COPIES[1..]
        .iter()
        .map(|l| per_chunk(labels, l, chunks))
        .sum();
    lines.push(format!(
        "  compute stream busy {compute:.3} ms per chunk = {:.2} % of real time; the FRB stages {frb:.3} ms = {:.2} % of real time, {:.1} % of the compute stream's busy time",
        pct(compute),
        pct(frb),
        100.0 * frb / compute.max(f64::MIN_POSITIVE)
    ));
    lines.push(format!(
        "  device-to-host busy {d2h:.3} ms per chunk; the FRB copy back {frb_copy:.3} ms = {:.2} % of real time, {:.1} % of the copies out",
        pct(frb_copy),
        100.0 * frb_copy / d2h.max(f64::MIN_POSITIVE)
    ));
    lines.push(format!(
        "  all streams, first event to last: {:.3} ms per chunk = {:.1} % of real time",
        window_ms / chunks as f64,
        pct(window_ms / chunks as f64)
    ));
    lines
}

/// Run case 5 with `beams` for `chunks` timed chunks after warm-ups and print the report.
fn run_case(
    gpu: &Arc<Gpu>,
    name: &str,
    beams: FrbBeams,
    chunks: usize,
) -> Result<(), Box<dyn Error>> {
    let s = setup(beams)?;
    let batches = BATCHES;
    // Before the backend, so that it is dropped after it (the backend unlocks what it pinned).
    let mut ring: Vec<Vec<u8>> = (0..RING)
        .map(|i| {
            let mut v = vec![0u8; s.chunk_bytes];
            let mut x = 0x9e37_79b9_u64 + i as u64;
            for c in v.chunks_mut(8) {
                c.copy_from_slice(&xorshift(&mut x).to_le_bytes()[..c.len()]);
            }
            v
        })
        .collect();
    // FRB heap buffers, page-locked and reused as the engine's send pool's (the device writes
    // the heaps into them).
    let cfg = &s.spec.config;
    let frb_bytes = cfg.channels * cfg.out_rows() * s.spec.beams.len() * 2;
    let mut frb_bufs: Vec<Vec<u8>> = vec![vec![0u8; frb_bytes]; 2];
    let mut backend = CudaBackend::new(Arc::clone(gpu), s.shape, batches, BEAMS)?
        .with_frb(std::slice::from_ref(&s.spec))?;
    for c in ring.iter_mut().chain(&mut frb_bufs) {
        backend.pin(c)?;
    }
    let n_ants = s.shape.n_ants;
    let present = vec![1u8; batches * n_ants];
    let present_all = vec![true; n_ants];
    // The X heap buffer, page-locked and reused as the engine's send pool's.
    backend.dump(0, &present_all, Vec::new())?;
    let mut first = backend.dumped(0)?.0;
    backend.pin(&mut first)?;
    let mut x_heap = Some(first);
    let coherent: Vec<Beam> = (0..BEAMS)
        .map(|b| Beam {
            pol: b % 2,
            weights: vec![Complex64::new(0.05, 0.01); n_ants],
            delays: vec![0.01; n_ants],
        })
        .collect();
    let dither = vec![Some(1u64); BEAMS];
    let frb_input = FrbChunk {
        version: 1,
        weights: &s.weights,
        present: &present,
    };
    let mut beam_slots = std::collections::VecDeque::new();
    let mut dump_pending = false;
    // Host time in `frb_formed` (a blocking call: the wait for the copy into the heap), for
    // the timed chunks.
    let mut collect = Duration::ZERO;
    let mut step = |k: usize, backend: &mut CudaBackend| -> Result<(), Box<dyn Error>> {
        backend.load(&ring[k % RING])?;
        backend.correlate(0, 0..batches)?;
        if dump_pending {
            x_heap = Some(backend.dumped(0)?.0);
            dump_pending = false;
        }
        if (k + 1) % s.dump_every == 0 {
            backend.dump(0, &present_all, x_heap.take().unwrap_or_default())?;
            dump_pending = true;
        }
        beam_slots.push_back(backend.beamform(&BeamChunk {
            version: 1,
            beams: &coherent,
            dither: &dither,
            first: (k * batches * SPECTRA) as i64,
            batch_step: SPECTRA as i64,
            spectrum_step: 1,
            present: &present,
        })?);
        backend.frb(0, &frb_input, frb_bufs.pop().unwrap_or_default())?;
        if beam_slots.len() >= BEAM_SLOTS {
            let slot = beam_slots.pop_front().unwrap_or_default();
            std::hint::black_box(backend.beams(slot)?.data[0]);
        }
        // The previous chunk's FRB heap, as the engine collects it.
        if k > 0 {
            let t = Instant::now();
            let (buf, _clips) = backend.frb_formed(0)?;
            if k >= WARM {
                collect += t.elapsed();
            }
            frb_bufs.push(buf);
        }
        backend.release()?;
        Ok(())
    };
    for k in 0..WARM {
        step(k, &mut backend)?;
    }
    let timeline = backend.record_timeline();
    for k in WARM..WARM + chunks {
        step(k, &mut backend)?;
    }
    let (window, labels) = timeline.summarise()?;
    // What is still outstanding, as the engine's flush collects it (kept until the backend has
    // unlocked it).
    frb_bufs.push(backend.frb_formed(0)?.0);
    if dump_pending {
        // The pinned heap buffer: kept until the backend has unlocked it (below).
        x_heap = Some(backend.dumped(0)?.0);
    }
    println!(
        "FRB share, seed 004 case 5 ({DISHES} dishes on {}×{}, {CHANNELS} channels, t_ds {T_DS}), {name}, fp16 second stage; \
         chunks of {BATCHES} × {SPECTRA} spectra ({:.0} MB, 8-bit), {BEAMS} coherent beams, an X dump every {} chunks:",
        GRID.0,
        GRID.1,
        s.chunk_bytes as f64 * 1e-6,
        s.dump_every
    );
    for line in report(&labels, window, chunks, s.span * 1e3) {
        println!("{line}");
    }
    let host_ms = collect.as_secs_f64() * 1e3 / chunks as f64;
    println!(
        "  host, engine thread: collecting the previous chunk's FRB heap (waiting for the device's copy of {} float16 values into it) {host_ms:.3} ms per chunk = {:.1} % of real time",
        s.spec.config.channels * s.spec.config.out_rows() * s.spec.beams.len(),
        100.0 * host_ms / (s.span * 1e3)
    );
    // The backend unlocks the pinned chunks and heap buffers: before they are freed.
    drop(backend);
    drop(x_heap);
    drop(frb_bufs);
    Ok(())
}

/// Both of seed 004 Table 4's case-5 beam sets.
pub fn run(gpu: &Arc<Gpu>, quick: bool) -> Result<(), Box<dyn Error>> {
    let chunks = if quick { 12 } else { 30 };
    let (rows, cols) = GRID;
    run_case(
        gpu,
        "96×96 beam grid",
        FrbBeams::even(rows, cols, 96, 96),
        chunks,
    )?;
    let mut seed = 0x1234_5678_u64;
    let mut theta = |side: usize| (xorshift(&mut seed) % (2000 * side as u64)) as f64 * 1e-3;
    let list = (0..10 * rows * cols)
        .map(|_| (theta(rows), theta(cols)))
        .collect();
    run_case(gpu, "5760 listed beams", FrbBeams::List(list), chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both beam sets fit the engine's start-up checks and the first stage's shape limits.
    #[test]
    fn case_5_is_a_configuration_the_engine_accepts() {
        let s = setup(FrbBeams::even(24, 24, 96, 96)).unwrap();
        assert_eq!(s.chunk_bytes, 512 * 256 * 256 * 4 * 5);
        assert_eq!(s.spec.config.out_rows(), 32);
        assert_eq!(s.dump_every, 15);
        assert!((s.span - 34.95e-3).abs() < 1e-5, "{}", s.span);
        let list = FrbBeams::List(vec![(0.5, 0.5); 5760]);
        assert!(setup(list).is_ok());
    }

    /// Per-chunk means and shares from a made-up summary: 10 chunks of 20 ms.
    #[test]
    fn the_report_divides_by_chunks_and_span() {
        let label = |label: &'static str, busy_ms: f64| LabelSummary {
            label,
            count: 10,
            busy_ms,
            mean_ms: busy_ms / 10.0,
            max_ms: busy_ms / 10.0,
            idle_ms: 0.0,
            max_gap_ms: 0.0,
        };
        let labels = [
            label("correlate", 40.0),
            label("frb stage 1", 8.0),
            label("frb stage 2", 2.0),
            label("d2h frb", 5.0),
            label("d2h beams", 5.0),
        ];
        let lines = report(&labels, 150.0, 10, 20.0);
        let all = lines.join("\n");
        assert!(all.contains("frb stage 1     0.800 ms =   4.00 %"), "{all}");
        assert!(
            all.contains("the FRB stages 1.000 ms = 5.00 % of real time, 20.0 %"),
            "{all}"
        );
        assert!(
            all.contains("the FRB copy back 0.500 ms = 2.50 % of real time, 50.0 %"),
            "{all}"
        );
        assert!(all.contains("15.000 ms per chunk = 75.0 %"), "{all}");
    }
}
