//! The XB-engine's `--frb-beam` outputs (seed 004): per output a send stream and thread
//! (one substream, [`FrbHeapFormat`]), paced at one heap per chunk; the engine starts every
//! captured output's FFT beamformer on a chunk after its beams ([`start`]) and sends the
//! previous chunk's heaps once this chunk's other work is queued ([`finish`]), so that a GPU's
//! FRB stages and copy back run beside the next chunk (at most [`FRB_SLOTS`] per output are
//! with the backend); when the input pauses or stops, the engine's flush sends the last.
//! `?frb-weights` reaches the backend at the next chunk; so does `?frb-beams` ([`repoint`],
//! every output, captured or not, with the table and sensor text the request handler built),
//! and `{name}.beams` then shows that chunk's timestamp: the beams are in force from it.

use std::collections::VecDeque;

use num_complex::Complex32;

use super::backend::{FrbChunk, FrbRepoint, XbBackend, FRB_SLOTS};
use super::config::{Plan, XbengineConfig};
use super::control::{Capture, FrbSetup, XbControl};
use super::cuda_frb::CudaFrbSpec;
use super::frb_output::FrbBeamOutput;
use super::frb_pointing;
use super::heaps::{FrbHeapFormat, FrbMeta};
use super::metrics::{self, FrbTotals};
use super::outputs::{rate, spawn_sink, stream_spec};
use crate::control::katcp::Status;
use crate::dsp::frb_fast::{FrbBeamformer, FrbChunkShape};
use crate::engine::metrics::Metrics;
use crate::engine::send::HeapSink;
use crate::engine::{EngineError, Shutdown};
use crate::fengine::BackendKind;
use crate::gpu::frb::{FrbConfig, FrbIntensities, FrbTuning};

/// Bytes of packet header and item pointers per packet (8 pointers, as a beam heap's).
const FRB_PREAMBLE: usize = 72;

/// One `--frb-beam` output.
pub(super) struct FrbOutput {
    pub(super) name: String,
    sink: HeapSink<FrbMeta>,
    heap_bytes: usize,
    weights_version: u64,
    weights: Vec<Complex32>,
    /// The version of the beam centres the backend forms.
    beams_version: u64,
    pub(super) totals: FrbTotals,
    /// The heaps started on the backend and not yet sent, oldest first.
    started: VecDeque<FrbMeta>,
}

impl FrbOutput {
    /// Bring its send interfaces' counters in `m` up to its sink's (all zero at start-up).
    pub(super) fn report_send(&self, m: &Metrics) {
        crate::engine::metrics::send(m, &self.name, &self.sink.counters());
    }

    pub(super) fn join(&mut self) -> Result<(), EngineError> {
        self.sink.join()
    }
}

/// The shape of chunk the FRB beamformers read.
fn chunk_shape(config: &XbengineConfig, plan: &Plan, f: &FrbBeamOutput) -> FrbChunkShape {
    FrbChunkShape {
        n_ants: config.array_size,
        channels: config.channels_per_substream,
        spectra: plan.spectra_per_heap,
        batches: plan.layout.batches,
        t_ds: f.t_ds,
    }
}

/// The CPU backend's beamformers and float16 scales, one per output.
pub(super) fn cpu_formers(config: &XbengineConfig, plan: &Plan) -> Vec<(FrbBeamformer, f32)> {
    config
        .frb_beams
        .iter()
        .map(|f| {
            let shape = chunk_shape(config, plan, f);
            let former = FrbBeamformer::new(shape, &f.grid, &f.beams, config.cpu_threads);
            (former, f.scale() as f32)
        })
        .collect()
}

/// The outputs as the control side needs them: the CPU backend's re-point tables are built
/// by the `?frb-beams` handler, the CUDA backend builds its own.
pub(super) fn control_setups(config: &XbengineConfig) -> Vec<FrbSetup> {
    let host_tables = matches!(config.backend, BackendKind::Cpu);
    config
        .frb_beams
        .iter()
        .map(|f| FrbSetup {
            name: f.name.clone(),
            beams: f.beams.clone(),
            host_grid: host_tables.then_some((f.grid.rows, f.grid.cols)),
        })
        .collect()
}

/// The CUDA backend's FRB stages, one spec per output.
pub(super) fn cuda_specs(config: &XbengineConfig, plan: &Plan) -> Vec<CudaFrbSpec> {
    config
        .frb_beams
        .iter()
        .map(|f| CudaFrbSpec {
            config: FrbConfig {
                rows: f.grid.rows,
                cols: f.grid.cols,
                dishes: config.array_size,
                t_ds: f.t_ds,
                channels: config.channels_per_substream,
                spectra: plan.spectra_per_heap,
                batches: plan.layout.batches,
                tuning: FrbTuning::default(),
                // The second stage's operand type (`stage2=`).
                output: if f.stage2_f32 {
                    FrbIntensities::Float32
                } else {
                    FrbIntensities::Float16
                },
            },
            grid: f.grid.clone(),
            beams: f.beams.clone(),
            scale: f.scale() as f32,
        })
        .collect()
}

/// Open every output's send stream and thread.
pub(super) fn frb_outputs(
    config: &XbengineConfig,
    plan: &Plan,
    backend: &mut dyn XbBackend,
    shutdown: &Shutdown,
) -> Result<Vec<FrbOutput>, EngineError> {
    let chunk_s = plan.layout.chunk_step() as f64 / config.adc_sample_rate;
    // Send threads after the corrprods' and the beams'.
    let first = config.corrprods.len() + usize::from(!config.beams.is_empty());
    config
        .frb_beams
        .iter()
        .enumerate()
        .map(|(j, f)| {
            let format = FrbHeapFormat {
                channels_per_substream: config.channels_per_substream,
                slow: chunk_shape(config, plan, f).slow(),
                beams: f.beams.len(),
                channel_offset: config.channel_offset_value,
            };
            let heap_bytes = format.heap_bytes();
            let r = rate(config, heap_bytes, FRB_PREAMBLE, chunk_s);
            let stream = stream_spec(config, vec![f.dst], FRB_PREAMBLE, r).open()?;
            tracing::info!(output = %f.name, beams = f.beams.len(), t_ds = f.t_ds, rate_gbps = r * 8e-9, "FRB beams");
            // The backend writes the heaps straight into these (page-locked on the CUDA backend).
            let mut pin = |b: &mut [u8]| backend.pin(b).map_err(|e| format!("FRB heap buffer: {e}"));
            // One heap with the backend per slot, one with the send thread.
            let sink = spawn_sink(
                config,
                first + j,
                &f.name,
                stream,
                format,
                (FRB_SLOTS + 1, heap_bytes, &mut pin),
                shutdown,
            )?;
            Ok(FrbOutput {
                name: f.name.clone(),
                sink,
                heap_bytes,
                weights_version: 0,
                weights: Vec::new(),
                beams_version: frb_pointing::CONFIGURED,
                totals: FrbTotals::default(),
                started: VecDeque::with_capacity(FRB_SLOTS),
            })
        })
        .collect()
}

/// Re-point every output whose beams `?frb-beams` moved since the last chunk, before the
/// loaded chunk (first timestamp `first`) is formed, and show it in `{name}.beams`. The
/// request was checked (a list, as many beams, positions in range), so the backend refusing
/// is a fault of the engine's and stops it.
pub(super) fn repoint(
    outputs: &mut [FrbOutput],
    backend: &mut dyn XbBackend,
    control: &XbControl,
    first: u64,
) -> Result<(), EngineError> {
    for (i, f) in outputs.iter_mut().enumerate() {
        if let Some(p) = control.frb_beams_if_changed(i, f.beams_version) {
            // Built by the request handler: this thread only swaps them in.
            let repoint = FrbRepoint {
                positions: &p.positions,
                table: p.table,
            };
            backend
                .frb_repoint(i, repoint)
                .map_err(|e| EngineError::Backend(e.to_string()))?;
            f.beams_version = p.version;
            control.frb_beams_applied(i, first, &p.listing);
            tracing::debug!(output = %f.name, timestamp = first, beams = p.positions.len(), "FRB beams re-pointed");
        }
    }
    Ok(())
}

/// Start every captured output on the loaded chunk (first timestamp `first`, presence
/// `present`, batch-major with `n_ants` per batch); a chunk with no antenna sends nothing.
pub(super) fn start(
    outputs: &mut [FrbOutput],
    backend: &mut dyn XbBackend,
    control: &XbControl,
    capture: &[Capture],
    first: u64,
    present: &[u8],
    n_ants: usize,
) -> Result<(), EngineError> {
    if !present.iter().any(|&p| p != 0) {
        return Ok(());
    }
    let beam_ants = (0..n_ants)
        .filter(|&a| present.chunks_exact(n_ants).all(|batch| batch[a] != 0))
        .count() as u64;
    for (i, (f, c)) in outputs.iter_mut().zip(capture).enumerate() {
        if !c.sends(first) {
            continue;
        }
        if let Some(w) = control.frb_weights_if_changed(i, f.weights_version) {
            f.weights = w.weights;
            f.weights_version = w.version;
        }
        let buf = f
            .sink
            .buffer()
            .ok_or_else(|| EngineError::Send("FRB send thread stopped".into()))?;
        let input = FrbChunk {
            version: f.weights_version,
            weights: &f.weights,
            present,
        };
        backend
            .frb(i, &input, buf)
            .map_err(|e| EngineError::Backend(e.to_string()))?;
        f.started.push_back(FrbMeta {
            timestamp: first,
            beam_ants,
        });
    }
    Ok(())
}

/// Send the heaps [`start`] began, except the one of the chunk at timestamp `keep` (the
/// chunk just started, sent after the next; `None` sends every one); `chunk_step` is a
/// chunk's span of timestamps.
pub(super) fn finish(
    outputs: &mut [FrbOutput],
    backend: &mut dyn XbBackend,
    control: &XbControl,
    m: &Metrics,
    chunk_step: u64,
    keep: Option<u64>,
) -> Result<(), EngineError> {
    for (i, f) in outputs.iter_mut().enumerate() {
        while let Some(&meta) = f.started.front() {
            if Some(meta.timestamp) == keep {
                break;
            }
            f.started.pop_front();
            send(i, f, backend, control, m, chunk_step, meta)?;
        }
    }
    Ok(())
}

/// Collect output `i`'s oldest heap from the backend and send it.
fn send(
    i: usize,
    f: &mut FrbOutput,
    backend: &mut dyn XbBackend,
    control: &XbControl,
    m: &Metrics,
    chunk_step: u64,
    meta: FrbMeta,
) -> Result<(), EngineError> {
    let (buf, clips) = backend
        .frb_formed(i)
        .map_err(|e| EngineError::Backend(e.to_string()))?;
    let t = &mut f.totals;
    t.heaps += 1;
    t.bytes += f.heap_bytes as u64;
    t.samples += (f.heap_bytes / 2) as u64;
    t.clipped += clips;
    let s = &control.sensors;
    s.set(
        &format!("{}.frb-clip-cnt", f.name),
        t.clipped,
        Status::Nominal,
    );
    s.set(
        &format!("{}.tx.next-timestamp", f.name),
        meta.timestamp + chunk_step,
        Status::Nominal,
    );
    f.sink.send(buf, meta);
    f.sink.check()?;
    metrics::frb_output(m, &f.name, &f.totals);
    f.report_send(m);
    Ok(())
}
