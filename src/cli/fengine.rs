//! `cbf fengine`: the wideband F-engine on the CPU or CUDA backend (katgpucbf fgpu's flags, facts §1.2,
//! §1.3). One stream receives both polarisations into chunks (pol from the digitiser_id LSB);
//! each `--wideband` output has its own pipeline and send stream; output heaps touched by lost
//! input are not sent and are counted.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use num_complex::Complex32;

use super::CliError;
use crate::control::katcp::{self, Sensors};
use crate::dsp::postproc::OutputBits;
use crate::dsp::samples::{packed_len, valid_sample_bits};
use crate::engine::Shutdown;
use crate::fengine::control::{parse_complex, EngineControl, OutputState};
use crate::fengine::heaps::{descriptor_heap, f_heap};
use crate::fengine::output::WidebandOutput;
use crate::fengine::pipeline::{tail_samples, OutputHeap, Pipeline, PipelineConfig};
use crate::fengine::place::{InputLayout, ITEMS, REJECT_REASONS};
use crate::gpu::fengine::{default_batch, default_unzip, GpuBackend, GpuConfig};
use crate::gpu::Gpu;
use crate::net::pcap::PcapReceiver;
use crate::net::udp::{UdpReceiver, UdpSender};
use crate::net::{parse_endpoints, PacketReceiver, Received, RecvBatch};
use crate::spead::recv::{ChunkGroup, ChunkGroupConfig, ChunkStream, StatsSnapshot};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

/// Where the F-engine's DSP runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Args)]
pub struct FengineArgs {
    /// Digitiser streams (A.B.C.D[+N]:port[,...], both polarisations) or a pcap file.
    #[arg(long)]
    pub src: String,
    /// Interface on which to receive (multicast joins).
    #[arg(long)]
    pub recv_interface: Option<String>,
    /// Socket receive buffer in bytes.
    #[arg(long, default_value_t = 128 << 20)]
    pub recv_buffer: usize,
    /// Receive threads; the --src endpoints are dealt round-robin between them.
    #[arg(long, default_value_t = 1)]
    pub recv_threads: usize,
    /// ADC sample rate in Hz.
    #[arg(long)]
    pub adc_sample_rate: f64,
    /// This F-engine's index in the array.
    #[arg(long, default_value_t = 0)]
    pub feng_id: u64,
    /// Number of F-engines in the array (the heap counter step).
    #[arg(long, default_value_t = 65536)]
    pub array_size: u64,
    /// Bits per digitiser sample.
    #[arg(long, default_value_t = 10)]
    pub dig_sample_bits: u32,
    /// Samples per digitiser heap.
    #[arg(long, default_value_t = 4096)]
    pub recv_packet_samples: usize,
    /// Samples per polarisation in an input chunk.
    #[arg(long, default_value_t = 1 << 25)]
    pub recv_chunk_samples: usize,
    /// Compute backend: `cpu` (src/dsp on the host) or `cuda` (the GPU kernels; needs a CUDA
    /// driver, NVRTC and cuFFT).
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// Complex values (channels × spectra) per output heap batch.
    #[arg(long, default_value_t = 1 << 20)]
    pub jones_per_batch: usize,
    /// Largest coarse-delay difference between the polarisations, in samples.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_delay_diff: usize,
    /// Output rate as a multiple of the data rate (0 = unlimited).
    #[arg(long, default_value_t = 1.1)]
    pub send_rate_factor: f64,
    /// Bits per output sample (real or imaginary part): 8, or 4 (packed, real in the high nibble).
    #[arg(long, default_value_t = 8)]
    pub send_sample_bits: u32,
    /// Payload bytes per output packet.
    #[arg(long, default_value_t = 8192)]
    pub send_packet_payload: usize,
    /// Interface to send from (name or address).
    #[arg(long)]
    pub send_interface: Option<String>,
    /// Multicast TTL of the output.
    #[arg(long, default_value_t = 4)]
    pub send_ttl: u32,
    /// Initial complex gain of every channel (e.g. 1.0 or 0.5+0.5j).
    #[arg(long, default_value = "1.0")]
    pub gain: String,
    /// Seed of the output dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// A wideband output: name=…,channels=…,dst=…[,taps=16,w_cutoff=1.0,window_function=hann,dither=uniform,jones_per_batch=…]; repeatable.
    #[arg(long, required = true)]
    pub wideband: Vec<String>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// UNIX time of timestamp 0 (for `?delays` start times) [default: now].
    #[arg(long)]
    pub sync_time: Option<f64>,
    /// katcp port (`?gain`, `?gain-all`, `?delays`, `?capture-start/stop`, sensors); 0 picks one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp and Prometheus servers listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: std::net::IpAddr,
    /// Serve Prometheus metrics (katgpucbf's fgpu names) at /metrics on this port.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
}

struct Plan {
    layout: InputLayout,
    outputs: Vec<(WidebandOutput, usize)>,
    gain: Complex32,
}

impl FengineArgs {
    fn plan(&self) -> Result<Plan, CliError> {
        if !(self.adc_sample_rate.is_finite() && self.adc_sample_rate > 0.0) {
            return Err(CliError::flag(
                "--adc-sample-rate",
                "must be a positive number of Hz",
            ));
        }
        if !valid_sample_bits(self.dig_sample_bits) {
            return Err(CliError::flag(
                "--dig-sample-bits",
                format!("{} is not one of 2–10, 12, 16", self.dig_sample_bits),
            ));
        }
        let hs = self.recv_packet_samples;
        if hs == 0 || hs % 8 != 0 {
            return Err(CliError::flag(
                "--recv-packet-samples",
                "must be a positive multiple of 8",
            ));
        }
        if self.recv_chunk_samples == 0 || self.recv_chunk_samples % hs != 0 {
            return Err(CliError::flag(
                "--recv-chunk-samples",
                format!("must be a positive multiple of --recv-packet-samples ({hs})"),
            ));
        }
        if self.feng_id >= self.array_size {
            return Err(CliError::flag(
                "--feng-id",
                format!("must be less than --array-size ({})", self.array_size),
            ));
        }
        if !matches!(self.send_sample_bits, 4 | 8) {
            return Err(CliError::flag(
                "--send-sample-bits",
                format!("{} is not 4 or 8", self.send_sample_bits),
            ));
        }
        if !(self.send_rate_factor.is_finite() && self.send_rate_factor >= 0.0) {
            return Err(CliError::flag("--send-rate-factor", "must be ≥ 0"));
        }
        let gain = parse_complex(&self.gain)
            .filter(|g| g.re.is_finite() && g.im.is_finite())
            .ok_or_else(|| {
                CliError::flag(
                    "--gain",
                    format!("{:?} is not a finite complex number", self.gain),
                )
            })?;
        let mut outputs = Vec::new();
        for text in &self.wideband {
            let o = WidebandOutput::parse(text).map_err(|e| CliError::flag("--wideband", e))?;
            let sph = o.spectra_per_heap(self.jones_per_batch).map_err(|e| {
                CliError::flag("--jones-per-batch", format!("output {}: {e}", o.name))
            })?;
            let span = sph * 2 * o.channels;
            if self.recv_chunk_samples % span != 0 {
                return Err(CliError::flag(
                    "--recv-chunk-samples",
                    format!(
                        "must be a multiple of output {}'s heap span ({span} samples)",
                        o.name
                    ),
                ));
            }
            if tail_samples(o.taps, 2 * o.channels, self.max_delay_diff, hs)
                > self.recv_chunk_samples
            {
                return Err(CliError::flag(
                    "--max-delay-diff",
                    format!(
                        "with output {}'s PFB footprint it exceeds --recv-chunk-samples",
                        o.name
                    ),
                ));
            }
            outputs.push((o, sph));
        }
        Ok(Plan {
            layout: InputLayout {
                heap_samples: hs as u64,
                heap_bytes: packed_len(hs, self.dig_sample_bits) as u64,
                chunk_samples: self.recv_chunk_samples as u64,
            },
            outputs,
            gain,
        })
    }
}

/// A pipeline and its send stream.
struct Output {
    pipeline: Pipeline,
    sink: HeapSink,
    gains_version: u64,
}

/// The output's pipeline on the chosen backend (one GPU context shared by every output).
fn make_pipeline(
    args: &FengineArgs,
    gpu: &mut Option<Arc<Gpu>>,
    output: WidebandOutput,
    cfg: PipelineConfig,
) -> Result<Pipeline, CliError> {
    match args.backend {
        BackendKind::Cpu => Ok(Pipeline::new(output, cfg)),
        BackendKind::Cuda => {
            let gpu = match gpu {
                Some(g) => Arc::clone(g),
                None => {
                    let g =
                        Gpu::open(args.gpu_device).map_err(|e| CliError::flag("--backend", e))?;
                    tracing::info!(device = %g.name, arch = %g.arch, "CUDA backend");
                    gpu.insert(g).clone()
                }
            };
            let backend = GpuBackend::new(
                gpu,
                &output,
                GpuConfig {
                    sample_bits: cfg.sample_bits,
                    body: cfg.layout.chunk_samples as usize,
                    tail: cfg.tail(&output),
                    spectra_per_heap: cfg.spectra_per_heap,
                    out_bits: cfg.out_bits,
                    unzip: default_unzip(output.channels),
                    batch: default_batch(cfg.spectra_per_heap),
                    // About 8 heaps in flight kept the copies busy in every run
                    // (bench/RESULTS.md), in at least two slots.
                    depth: (8 / default_batch(cfg.spectra_per_heap)).max(2),
                },
            )
            .map_err(|e| CliError::flag("--backend", e))?;
            Ok(Pipeline::with_backend(output, cfg, Box::new(backend)))
        }
    }
}

/// An output's transmit side (seed 000 §Network transmit): its own thread owns the send
/// stream, so the rate-limited sends (paced at `--send-rate-factor` × the data rate, so busy
/// most of real time) never hold up the compute. Finished heaps are copied into one of a few
/// preallocated buffers that circulate between the engine and the thread; when all are in
/// flight the engine waits (back-pressure instead of loss).
struct HeapSink {
    heaps: crossbeam_channel::Sender<(Vec<u8>, u64)>,
    free: crossbeam_channel::Receiver<Vec<u8>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    counters: Arc<SinkCounters>,
    /// `?capture-start` / `?capture-stop` state at the last chunk.
    capture: bool,
    skipped: u64,
    clipped: [u64; 2],
}

#[derive(Default)]
struct SinkCounters {
    sent: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

/// What the send thread needs to build F heaps and descriptors.
struct SinkConfig {
    feng_id: u64,
    channels: usize,
    spectra_per_heap: usize,
    sample_bits: u32,
    /// First descriptor time and period (katgpucbf's stagger by feng_id).
    descriptors: (Instant, Duration),
}

impl HeapSink {
    const BUFFERS: usize = 8;

    fn new(mut stream: SendStream<UdpSender>, cfg: SinkConfig, heap_bytes: usize) -> HeapSink {
        let (heaps, rx) = crossbeam_channel::bounded::<(Vec<u8>, u64)>(Self::BUFFERS);
        let (give, free) = crossbeam_channel::bounded(Self::BUFFERS);
        for _ in 0..Self::BUFFERS {
            // Cannot fail: the channel has room for every buffer.
            let _ = give.send(Vec::with_capacity(heap_bytes));
        }
        let counters = Arc::new(SinkCounters::default());
        let c = Arc::clone(&counters);
        let thread = std::thread::spawn(move || -> Result<(), String> {
            let n_dst = stream.destinations();
            let value_bytes = if cfg.sample_bits == 4 { 2 } else { 4 };
            let (mut next_desc, period) = cfg.descriptors;
            loop {
                if Instant::now() >= next_desc {
                    let d = descriptor_heap(
                        cfg.channels / n_dst,
                        cfg.spectra_per_heap,
                        cfg.sample_bits,
                    );
                    let refs: Vec<HeapRef> = (0..n_dst)
                        .map(|i| HeapRef {
                            heap: &d,
                            cnt: None,
                            substream: i,
                            unpaced: true,
                        })
                        .collect();
                    stream
                        .send_heaps(&refs, SendMode::RoundRobin)
                        .map_err(|e| e.to_string())?;
                    next_desc += period;
                }
                let (data, timestamp) = match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(h) => h,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(()),
                };
                let heaps: Vec<Heap<'_>> = (0..n_dst)
                    .map(|d| {
                        f_heap(
                            &data,
                            value_bytes,
                            timestamp,
                            cfg.feng_id,
                            d,
                            cfg.channels / n_dst,
                            cfg.spectra_per_heap,
                        )
                    })
                    .collect();
                let refs: Vec<HeapRef> = heaps
                    .iter()
                    .enumerate()
                    .map(|(d, heap)| HeapRef::new(heap, d))
                    .collect();
                stream
                    .send_heaps(&refs, SendMode::RoundRobin)
                    .map_err(|e| e.to_string())?;
                drop(heaps);
                c.sent.fetch_add(1, Ordering::Relaxed);
                c.bytes.store(stream.counters().bytes, Ordering::Relaxed);
                // The engine may have gone: then the buffer is simply dropped.
                let _ = give.send(data);
            }
        });
        HeapSink {
            heaps,
            free,
            thread: Some(thread),
            counters,
            capture: true,
            skipped: 0,
            clipped: [0; 2],
        }
    }

    fn heap(&mut self, h: &OutputHeap<'_>) {
        if !h.valid {
            self.skipped += 1;
            return;
        }
        if !self.capture {
            return;
        }
        self.clipped[0] += h.clips[0];
        self.clipped[1] += h.clips[1];
        // A closed channel means the send thread stopped on an error, which check() reports.
        let Ok(mut buf) = self.free.recv() else {
            return;
        };
        buf.clear();
        buf.extend_from_slice(h.data);
        let _ = self.heaps.send((buf, h.timestamp));
    }

    fn sent(&self) -> u64 {
        self.counters.sent.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.counters.bytes.load(Ordering::Relaxed)
    }

    /// A send failure, if the thread stopped on one.
    fn check(&mut self) -> Result<(), CliError> {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            return self.join();
        }
        Ok(())
    }

    /// Let the thread send what is queued, and stop it.
    fn join(&mut self) -> Result<(), CliError> {
        let (dead, _) = crossbeam_channel::bounded(1);
        drop(std::mem::replace(&mut self.heaps, dead));
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Err(CliError::Run(format!("send failed: {e}"))),
            Some(Err(_)) => Err(CliError::Run("send thread panicked".into())),
            _ => Ok(()),
        }
    }
}

/// fgpu's Prometheus metrics, with katgpucbf's names (facts §1.8; namespace `fgpu`).
struct FengineMetrics {
    registry: prometheus::Registry,
    counters: std::collections::HashMap<&'static str, prometheus::IntCounterVec>,
}

/// (name, help, labels) of every metric.
const METRICS: [(&str, &str, &[&str]); 11] = [
    ("input_heaps", "Digitiser heaps received", &["pol"]),
    (
        "input_missing_heaps",
        "Digitiser heaps missing from processed chunks",
        &["pol"],
    ),
    (
        "input_clipped_samples",
        "Digitiser samples saturated (digitiser_status)",
        &["pol"],
    ),
    ("input_chunks", "Input chunks processed", &[]),
    (
        "input_too_old_heaps",
        "Heaps that arrived after their chunk left the window",
        &[],
    ),
    (
        "input_metadata_heaps",
        "Heaps without samples or timestamp",
        &[],
    ),
    (
        "input_bad_timestamp_heaps",
        "Heaps with a timestamp off the heap grid",
        &[],
    ),
    ("output_heaps", "Heaps sent", &["stream"]),
    ("output_bytes", "Bytes sent", &["stream"]),
    (
        "output_skipped_heaps",
        "Output heaps not sent because input was missing",
        &["stream"],
    ),
    (
        "output_clipped_samples",
        "Output values saturated",
        &["stream", "pol"],
    ),
];

impl FengineMetrics {
    fn new() -> Result<FengineMetrics, CliError> {
        let err = |e: prometheus::Error| CliError::Run(format!("metrics: {e}"));
        let registry = prometheus::Registry::new_custom(Some("fgpu".into()), None).map_err(err)?;
        let mut counters = std::collections::HashMap::new();
        for (name, help, labels) in METRICS {
            let c = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), labels)
                .map_err(err)?;
            registry.register(Box::new(c.clone())).map_err(err)?;
            counters.insert(name, c);
        }
        Ok(FengineMetrics { registry, counters })
    }

    /// Bring a counter up to `value` (the engine keeps totals; counters only move forward).
    fn set(&self, name: &str, labels: &[&str], value: u64) {
        if let Some(c) = self.counters.get(name) {
            let c = c.with_label_values(labels);
            c.inc_by(value.saturating_sub(c.get()));
        }
    }

    fn input(
        &self,
        chunks: u64,
        heaps: [u64; 2],
        missing: [u64; 2],
        clipped: [u64; 2],
        rx: &StatsSnapshot,
    ) {
        self.set("input_chunks", &[], chunks);
        for pol in 0..2 {
            let p = pol.to_string();
            self.set("input_heaps", &[&p], heaps[pol]);
            self.set("input_missing_heaps", &[&p], missing[pol]);
            self.set("input_clipped_samples", &[&p], clipped[pol]);
        }
        self.set("input_too_old_heaps", &[], rx.too_old_heaps);
        self.set("input_metadata_heaps", &[], rx.rejected_heaps[0]);
        self.set("input_bad_timestamp_heaps", &[], rx.rejected_heaps[1]);
    }

    fn update(&self, stream: &str, heaps: u64, bytes: u64, skipped: u64, clipped: [u64; 2]) {
        self.set("output_heaps", &[stream], heaps);
        self.set("output_bytes", &[stream], bytes);
        self.set("output_skipped_heaps", &[stream], skipped);
        for (pol, v) in clipped.iter().enumerate() {
            self.set("output_clipped_samples", &[stream, &pol.to_string()], *v);
        }
    }
}

/// The receive transports: one for a pcap file; for endpoints, `threads` receivers, the
/// endpoints dealt round-robin between them (each thread its own sockets and groups, as
/// katgpucbf gives each stream-group member a share of the multicast groups).
fn open_sources(
    src: &str,
    interface: Option<&str>,
    buffer: usize,
    threads: usize,
) -> Result<Vec<Box<dyn PacketReceiver>>, CliError> {
    if Path::new(src).is_file() {
        if threads != 1 {
            return Err(CliError::flag(
                "--recv-threads",
                "a pcap file is read by one thread",
            ));
        }
        return Ok(vec![Box::new(
            PcapReceiver::open(Path::new(src), &[]).map_err(|e| CliError::flag("--src", e))?,
        )]);
    }
    let eps = parse_endpoints(src)
        .map_err(|e| CliError::flag("--src", format!("{e} (and no such file)")))?;
    if threads == 0 || threads > eps.len() {
        return Err(CliError::flag(
            "--recv-threads",
            format!(
                "must be between 1 and the number of --src endpoints ({})",
                eps.len()
            ),
        ));
    }
    (0..threads)
        .map(|t| {
            let mine: Vec<_> = eps.iter().skip(t).step_by(threads).copied().collect();
            UdpReceiver::bind(&mine, interface, buffer)
                .map(|r| Box::new(r) as Box<dyn PacketReceiver>)
                .map_err(|e| CliError::flag("--src", e))
        })
        .collect()
}

pub fn run(args: FengineArgs) -> Result<(), CliError> {
    let plan = args.plan()?;
    let shutdown = Shutdown::install();
    let seed = args.dither_seed.unwrap_or_else(rand::random);
    let layout = plan.layout;
    let per_pol = layout.heaps_per_pol();
    let sources = open_sources(
        &args.src,
        args.recv_interface.as_deref(),
        args.recv_buffer,
        args.recv_threads,
    )?;
    let group = ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 2 * per_pol,
        chunk_bytes: 2 * layout.pol_bytes(),
        // Three chunks in flight: the polarisations may arrive out of step by up to a chunk.
        max_chunks: 3,
        n_chunks: 8,
        n_streams: sources.len(),
        max_heaps: 16,
        items: ITEMS.to_vec(),
        reject_reasons: REJECT_REASONS.to_vec(),
    })
    .map_err(|e| CliError::Run(e.to_string()))?;
    let place = Arc::new(move |p: &crate::spead::recv::PlaceInput<'_>| layout.place(p));
    let mut rx_stats = Vec::new();
    let mut receivers = Vec::new();
    for (i, mut source) in sources.into_iter().enumerate() {
        let mut stream = ChunkStream::new(Arc::clone(&group), place.clone());
        rx_stats.push(stream.stats());
        let shutdown = shutdown.clone();
        receivers.push(
            std::thread::Builder::new()
                .name(format!("fengine-rx{i}"))
                .spawn(move || -> StatsSnapshot {
                    let mut batch = RecvBatch::new(64, source.slot_size(9200));
                    while !stream.is_stopped() && !shutdown.requested() {
                        match source.recv_batch(&mut batch) {
                            Ok(Received::Packets(n)) => {
                                stream.note_batch(n);
                                for p in batch.iter() {
                                    stream.add_packet(p);
                                }
                            }
                            Ok(Received::Idle) => {}
                            Ok(Received::End) => break,
                            Err(e) => {
                                tracing::error!(error = %e, "receive failed");
                                break;
                            }
                        }
                        stream.release_old();
                    }
                    stream.finish()
                })?,
        );
    }
    let rx_snapshot = || {
        let mut total = StatsSnapshot::default();
        for s in &rx_stats {
            total.merge(&s.snapshot());
        }
        total
    };
    let sync_time = args.sync_time.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    });
    let sensors = Arc::new(Sensors::default());
    let control = Arc::new(EngineControl::new(
        plan.outputs
            .iter()
            .map(|(o, _)| OutputState {
                name: o.name.clone(),
                channels: o.channels,
                gains: [vec![plan.gain; o.channels], vec![plan.gain; o.channels]],
                gains_version: 0,
                new_delays: [Vec::new(), Vec::new()],
                capture: true,
                default_gain: plan.gain,
            })
            .collect(),
        Arc::clone(&sensors),
        args.adc_sample_rate,
        sync_time,
        layout.chunk_samples,
    ));
    let katcp_addr = katcp::serve(
        SocketAddr::new(args.katcp_host, args.katcp_port),
        Arc::clone(&sensors),
        control.clone(),
        "cbf-fengine",
    )
    .map_err(|e| CliError::flag("--katcp-port", e))?;
    tracing::info!(%katcp_addr, "katcp server listening");
    let metrics = FengineMetrics::new()?;
    if let Some(port) = args.prometheus_port {
        let addr = crate::control::metrics::serve(
            SocketAddr::new(args.katcp_host, port),
            metrics.registry.clone(),
        )
        .map_err(|e| CliError::flag("--prometheus-port", e))?;
        tracing::info!(%addr, "Prometheus metrics at /metrics");
    }
    let mut outputs = Vec::new();
    let mut gpu = None;
    for (o, sph) in plan.outputs {
        let dests = o.dst.clone();
        let tx = UdpSender::new(
            &dests,
            args.send_interface.as_deref(),
            args.send_ttl,
            4 << 20,
        )
        .map_err(|e| CliError::flag("--send-interface", e))?;
        let channels = o.channels;
        let cps = channels / dests.len();
        let value_bytes = if args.send_sample_bits == 4 { 2 } else { 4 };
        let payload = cps * sph * value_bytes;
        let max_packet = args.send_packet_payload + 72;
        let packets = payload.div_ceil(args.send_packet_payload);
        let heaps_per_s = args.adc_sample_rate / (sph * 2 * o.channels) as f64 * dests.len() as f64;
        let rate = heaps_per_s * (payload + packets * 72) as f64 * args.send_rate_factor;
        let cfg = SendStreamConfig {
            max_packet_size: max_packet,
            rate,
            cnt_first: args.feng_id,
            cnt_step: args.array_size,
            ..Default::default()
        };
        let stream = SendStream::new(cfg, vec![tx]).map_err(|e| CliError::Run(e.to_string()))?;
        tracing::info!(output = %o.name, channels = o.channels, destinations = dests.len(), rate_gbps = rate * 8e-9, "wideband output");
        let pcfg = PipelineConfig {
            layout,
            sample_bits: args.dig_sample_bits,
            spectra_per_heap: sph,
            max_delay_diff: args.max_delay_diff,
            gain: plan.gain,
            dither_seed: seed,
            out_bits: if args.send_sample_bits == 4 {
                OutputBits::Four
            } else {
                OutputBits::Eight
            },
        };
        outputs.push(Output {
            pipeline: make_pipeline(&args, &mut gpu, o, pcfg)?,
            sink: HeapSink::new(
                stream,
                SinkConfig {
                    feng_id: args.feng_id,
                    channels,
                    spectra_per_heap: sph,
                    sample_bits: args.send_sample_bits,
                    // Descriptors every array_size × 5 s, the first after (feng_id + 1) × 5 s
                    // (katgpucbf's stagger).
                    descriptors: (
                        Instant::now() + Duration::from_secs(5 * (args.feng_id + 1)),
                        Duration::from_secs(5 * args.array_size.min(1 << 20)),
                    ),
                },
                channels * sph * value_bytes,
            ),
            gains_version: 0,
        });
    }
    let start = Instant::now();
    let mut prev: Option<Box<crate::spead::recv::Chunk>> = None;
    let deadline = args.duration.map(|d| start + Duration::from_secs_f64(d));
    let mut chunks = 0u64;
    let (mut input_heaps, mut input_missing, mut dig_clipped) = ([0u64; 2], [0u64; 2], [0u64; 2]);
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || shutdown.requested() {
            group.stop();
        }
        let next = match group.ready().recv_timeout(Duration::from_millis(100)) {
            Ok(c) => Some(c),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => None,
        };
        if let Some(chunk) = prev.take() {
            chunks += 1;
            // Input statistics from the chunk: heaps present and saturation counts per pol.
            for pol in 0..2 {
                let range = pol * per_pol..(pol + 1) * per_pol;
                let present = chunk.present[range.clone()]
                    .iter()
                    .filter(|&&v| v != 0)
                    .count() as u64;
                input_heaps[pol] += present;
                input_missing[pol] += per_pol as u64 - present;
                dig_clipped[pol] += chunk.extra[range].iter().sum::<u64>();
            }
            for (i, out) in outputs.iter_mut().enumerate() {
                // Pick up requests made since the last chunk.
                let capture = match control.outputs[i].lock() {
                    Ok(mut st) => {
                        if st.gains_version != out.gains_version {
                            out.pipeline.gains = st.gains.clone();
                            out.gains_version = st.gains_version;
                        }
                        for pol in 0..2 {
                            for m in st.new_delays[pol].drain(..) {
                                out.pipeline.delays[pol].add(m);
                            }
                        }
                        st.capture
                    }
                    Err(_) => true,
                };
                let before = [
                    *out.pipeline.delays[0].current(),
                    *out.pipeline.delays[1].current(),
                ];
                let Output { pipeline, sink, .. } = out;
                sink.capture = capture;
                sink.skipped += pipeline
                    .process((&*chunk).into(), next.as_deref().map(Into::into), |h| {
                        sink.heap(h)
                    })
                    .map_err(|e| CliError::Run(format!("backend: {e}")))?;
                sink.check()?;
                for (pol, was) in before.iter().enumerate() {
                    let now = *out.pipeline.delays[pol].current();
                    if now != *was {
                        control.delay_in_effect(&out.pipeline.output.name, pol, &now);
                    }
                }
                control
                    .processed
                    .fetch_max(out.pipeline.next_timestamp(), Ordering::Relaxed);
                metrics.update(
                    &out.pipeline.output.name,
                    out.sink.sent() * out.pipeline.output.dst.len() as u64,
                    out.sink.bytes(),
                    out.sink.skipped,
                    out.sink.clipped,
                );
            }
            let power = outputs
                .first_mut()
                .map_or([None, None], |o| o.pipeline.take_dig_power());
            let full_scale = f64::from((1u32 << (args.dig_sample_bits - 1)) as f32);
            control.input_stats(
                chunk.chunk_id * layout.chunk_samples,
                dig_clipped,
                power,
                full_scale,
            );
            metrics.input(
                chunks,
                input_heaps,
                input_missing,
                dig_clipped,
                &rx_snapshot(),
            );
            group.free(chunk);
        }
        match next {
            Some(c) => prev = Some(c),
            None => break,
        }
    }
    // The heaps still in the backend.
    for out in &mut outputs {
        let Output { pipeline, sink, .. } = out;
        pipeline
            .flush(|h| sink.heap(h))
            .map_err(|e| CliError::Run(format!("backend: {e}")))?;
        sink.join()?;
    }
    let mut rx = StatsSnapshot::default();
    for r in receivers {
        rx.merge(
            &r.join()
                .map_err(|_| CliError::Run("receive thread panicked".into()))?,
        );
    }
    let reject = |i: usize| rx.rejected_heaps[i];
    println!(
        "fengine: input chunks {chunks}, heaps {}, incomplete {}, too old {}, metadata {}, bad timestamp {}, malformed {}",
        rx.heaps,
        rx.incomplete_heaps_evicted + rx.incomplete_heaps_flushed,
        rx.too_old_heaps,
        reject(0),
        reject(1),
        rx.malformed_total()
    );
    for out in &outputs {
        println!(
            "fengine: output {}: sent {} batches, skipped {}, clipped {:?}, {} bytes",
            out.pipeline.output.name,
            out.sink.sent(),
            out.sink.skipped,
            out.sink.clipped,
            out.sink.bytes()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: FengineArgs,
    }

    /// Plan with good defaults, `extra` (flag, value) pairs replacing or adding flags.
    fn flag_of(extra: &[&str]) -> &'static str {
        let mut args: Vec<(String, String)> = [
            ("--src", "127.0.0.1:7148"),
            ("--adc-sample-rate", "1712e6"),
            ("--recv-chunk-samples", "4194304"),
            ("--max-delay-diff", "0"),
            ("--wideband", "name=w,channels=1024,dst=239.0.0.1+3:7148"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for pair in extra.chunks(2) {
            match args.iter_mut().find(|(k, _)| k == pair[0]) {
                Some(slot) => slot.1 = pair[1].to_string(),
                None => args.push((pair[0].to_string(), pair[1].to_string())),
            }
        }
        let mut v = vec!["fengine".to_string()];
        for (k, val) in args {
            v.push(format!("{k}={val}"));
        }
        match Wrap::try_parse_from(v).unwrap().a.plan() {
            Err(CliError::Flag { flag, .. }) => flag,
            Err(e) => panic!("{e}"),
            Ok(_) => "ok",
        }
    }

    #[test]
    fn bad_flags_are_named() {
        assert_eq!(flag_of(&[]), "ok");
        assert_eq!(flag_of(&["--adc-sample-rate", "-1"]), "--adc-sample-rate");
        assert_eq!(flag_of(&["--dig-sample-bits", "11"]), "--dig-sample-bits");
        assert_eq!(
            flag_of(&["--recv-packet-samples", "100"]),
            "--recv-packet-samples"
        );
        assert_eq!(
            flag_of(&["--recv-chunk-samples", "1000"]),
            "--recv-chunk-samples"
        );
        assert_eq!(
            flag_of(&["--feng-id", "5", "--array-size", "4"]),
            "--feng-id"
        );
        assert_eq!(flag_of(&["--send-rate-factor", "-2"]), "--send-rate-factor");
        assert_eq!(flag_of(&["--gain", "abc"]), "--gain");
        assert_eq!(flag_of(&["--send-sample-bits", "6"]), "--send-sample-bits");
        assert_eq!(
            flag_of(&["--wideband", "name=w,channels=1000,dst=239.0.0.1:7148"]),
            "--wideband"
        );
        assert_eq!(
            flag_of(&["--wideband", "name=w,channels=1024,dst=239.0.0.1+2:7148"]),
            "--wideband"
        );
        assert_eq!(flag_of(&["--jones-per-batch", "1000"]), "--jones-per-batch");
        // A chunk too small for the heap span (1024 ch × 1024 spectra × 2 = 2 Mi samples).
        assert_eq!(
            flag_of(&["--recv-chunk-samples", "65536"]),
            "--recv-chunk-samples"
        );
        assert_eq!(
            flag_of(&["--max-delay-diff", "5000000"]),
            "--max-delay-diff"
        );
    }
}
