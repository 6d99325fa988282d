//! The XB-engine's send side (seed 001 §Output, facts §1.9): one send stream and thread per
//! `--corrprod` output, paced over its dump interval, and one for every `--beam` (a substream
//! per beam), paced at the beams' data rate; descriptors every 5 s.

use std::time::{Duration, Instant};

use super::accum::Accumulator;
use super::backend::XbBackend;
use super::beams::{Band, Steering};
use super::config::{Plan, XbengineConfig};
use super::heaps::{BeamHeapFormat, BeamMeta, XHeapFormat};
use super::metrics::{BTotals, XTotals};
use super::output::CorrprodOutput;
use crate::dsp::beamform::Beam;
use crate::dsp::correlate::n_baselines;
use crate::engine::send::{
    BufferPool, DescriptorSchedule, HeapFormat, HeapSink, SendThread, StreamSpec,
};
use crate::engine::{EngineError, Shutdown};
use crate::net::NetSender;
use crate::spead::send::{SendStream, SendStreamConfig};

/// katgpucbf's descriptor interval.
pub(super) const DESCRIPTOR_PERIOD: Duration = Duration::from_secs(5);
/// Bytes of packet header and item pointers per packet of X and beam heaps (facts §1.9).
const X_PREAMBLE: usize = 64;
const B_PREAMBLE: usize = 72;

/// Send thread `index` (corrprods first, then the beams, then the FRB beams), for output
/// `name`: named `xbengine-tx{index}` (Linux keeps 15 bytes of a name, too few for output names),
/// bound to its `--send-affinity` core, descriptors every [`DESCRIPTOR_PERIOD`] from one period
/// after start, the heap buffers of `pool`.
pub(super) fn spawn_sink<M: Send + 'static, F: HeapFormat<Meta = M> + Send + 'static>(
    config: &XbengineConfig,
    index: usize,
    name: &str,
    stream: SendStream<NetSender>,
    format: F,
    pool: BufferPool<'_>,
    shutdown: &Shutdown,
) -> std::io::Result<HeapSink<M>> {
    let thread = SendThread {
        name: format!("xbengine-tx{index}"),
        core: config.affinity.send_core(index),
    };
    tracing::info!(output = name, thread = %thread.name, core = ?thread.core, "send thread");
    HeapSink::spawn_with(
        thread,
        stream,
        format,
        DescriptorSchedule {
            first: Instant::now() + DESCRIPTOR_PERIOD,
            period: DESCRIPTOR_PERIOD,
        },
        pool,
        shutdown,
    )
}

/// One `--corrprod` output.
pub(super) struct XOutput {
    pub(super) name: String,
    pub(super) acc: Accumulator,
    pub(super) sink: HeapSink<u64>,
    pub(super) heap_bytes: usize,
    /// The buffer a dump that is not sent is reduced into (its accumulator must be reset).
    pub(super) scratch: Option<Vec<u8>>,
    pub(super) totals: XTotals,
}

/// Every `--beam` output (one send stream, one substream per beam).
pub(super) struct BeamOutputs {
    pub(super) names: Vec<String>,
    pub(super) pols: Vec<usize>,
    pub(super) dither: Vec<Option<u64>>,
    pub(super) sink: HeapSink<BeamMeta>,
    pub(super) heap_bytes: usize,
    pub(super) steering_version: u64,
    pub(super) coeffs: Vec<Beam>,
    pub(super) totals: Vec<BTotals>,
}

impl BeamOutputs {
    /// Take the coefficients of steering `s` (katcp's weights, delays and gains).
    pub(super) fn steer(&mut self, s: &Steering, band: Band) {
        self.coeffs = self
            .pols
            .iter()
            .enumerate()
            .map(|(b, &pol)| s.beam(b, pol, band))
            .collect();
        self.steering_version = s.version;
    }
}

pub(super) fn band(config: &XbengineConfig, plan: &Plan) -> Band {
    Band {
        channel_spacing: plan.channel_spacing,
        channel_offset: config.channel_offset_value,
        channels: config.channels as u64,
    }
}

/// The wire rate of heaps of `heap_bytes` every `seconds`, with `preamble` bytes per packet.
pub(super) fn rate(
    config: &XbengineConfig,
    heap_bytes: usize,
    preamble: usize,
    seconds: f64,
) -> f64 {
    let packets = heap_bytes.div_ceil(config.send_packet_payload);
    (heap_bytes + packets * preamble) as f64 / seconds * config.send_rate_factor
}

pub(super) fn stream_spec(
    config: &XbengineConfig,
    dst: Vec<std::net::SocketAddrV4>,
    preamble: usize,
    rate: f64,
) -> StreamSpec {
    let cps = config.channels_per_substream as u64;
    StreamSpec {
        dst,
        interfaces: config.send_interfaces.clone(),
        ttl: config.send_ttl,
        buffer: config.send_buffer,
        transport: config.send_transport.clone(),
        config: SendStreamConfig {
            max_packet_size: config.send_packet_payload + preamble,
            rate,
            // Unique across the X-engines of a band (facts §1.9).
            cnt_first: config.channel_offset_value / cps,
            cnt_step: config.channels as u64 / cps,
            ..Default::default()
        },
    }
}

/// `--corrprod` output `index` (also its send thread's index).
pub(super) fn x_output(
    config: &XbengineConfig,
    plan: &Plan,
    index: usize,
    c: &CorrprodOutput,
    backend: &mut dyn XbBackend,
    shutdown: &Shutdown,
) -> Result<XOutput, EngineError> {
    let format = XHeapFormat {
        channels_per_substream: config.channels_per_substream,
        n_baselines: n_baselines(config.array_size),
        channel_offset: config.channel_offset_value,
    };
    let heap_bytes = format.heap_bytes();
    let acc = Accumulator::new(
        config.array_size,
        plan.layout.heap_step,
        c.heap_accumulation_threshold,
    );
    // Paced over the dump interval (facts §1.9).
    let dump_s = acc.span() as f64 / config.adc_sample_rate;
    let r = rate(config, heap_bytes, X_PREAMBLE, dump_s);
    let stream = stream_spec(config, vec![c.dst], X_PREAMBLE, r).open()?;
    tracing::info!(output = %c.name, dump_s, heap_mib = heap_bytes as f64 / (1 << 20) as f64, rate_gbps = r * 8e-9, "correlation products");
    // The backend's dump writes straight into these (page-locked on the CUDA backend).
    let mut pin = |b: &mut [u8]| backend.pin(b).map_err(|e| format!("X heap buffer: {e}"));
    let sink = spawn_sink(
        config,
        index,
        &c.name,
        stream,
        format,
        (2, heap_bytes, &mut pin),
        shutdown,
    )?;
    Ok(XOutput {
        name: c.name.clone(),
        acc,
        sink,
        heap_bytes,
        scratch: None,
        totals: XTotals::default(),
    })
}

pub(super) fn beam_outputs(
    config: &XbengineConfig,
    plan: &Plan,
    shutdown: &Shutdown,
) -> Result<BeamOutputs, EngineError> {
    let format = BeamHeapFormat {
        beams: config.beams.len(),
        channels_per_substream: config.channels_per_substream,
        spectra_per_heap: plan.spectra_per_heap,
        channel_offset: config.channel_offset_value,
    };
    let heap_bytes = format.heap_bytes();
    let batch_s = plan.layout.heap_step as f64 / config.adc_sample_rate;
    let r = rate(config, heap_bytes, B_PREAMBLE, batch_s) * config.beams.len() as f64;
    let dst = config.beams.iter().map(|b| b.dst).collect();
    let stream = stream_spec(config, dst, B_PREAMBLE, r).open()?;
    let per_buffer = heap_bytes * config.beams.len();
    // Two chunks' worth of batches in flight, within 1 GiB.
    let buffers = (2 * plan.layout.batches)
        .min((1usize << 30) / per_buffer.max(1))
        .max(4);
    tracing::info!(beams = config.beams.len(), rate_gbps = r * 8e-9, "beams");
    // The send thread after the corrprods'.
    let index = config.corrprods.len();
    let mut nothing = |_: &mut [u8]| Ok(());
    let sink = spawn_sink(
        config,
        index,
        "beams",
        stream,
        format,
        (buffers, per_buffer, &mut nothing),
        shutdown,
    )?;
    let mut beams = BeamOutputs {
        names: config.beams.iter().map(|b| b.name.clone()).collect(),
        pols: config.beams.iter().map(|b| b.pol).collect(),
        dither: config
            .beams
            .iter()
            .map(|b| b.dither.then_some(config.dither_seed))
            .collect(),
        sink,
        heap_bytes,
        steering_version: 0,
        coeffs: Vec::new(),
        totals: vec![BTotals::default(); config.beams.len()],
    };
    beams.steer(
        &Steering::new(config.beams.len(), config.array_size),
        band(config, plan),
    );
    Ok(beams)
}
