//! The F-engine as a library type (seed 000): built from a validated [`FengineConfig`], it opens
//! its sources, starts the receive threads, one send thread per output, the katcp and
//! Prometheus servers, then [`Engine::run`] turns ready chunks into output heaps until the input
//! ends, the duration passes or shutdown is asked for. A test can run it in-process.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::HeapData;
use super::config::{BackendKind, FengineConfig, Plan};
use super::control::{EngineControl, OutputState};
use super::heaps::FHeapFormat;
use super::metrics::{self, InputTotals, OutputTotals};
use super::output::OutputSpec;
use super::pipeline::{OutputHeap, Pipeline};
use super::pipelines::{make_pipeline, open_gpu, pipeline_config, CudaShared};
use super::place::{InputLayout, ITEMS, REJECT_REASONS};
use super::{peerdirect, vkgdr};
use crate::control::katcp::{Sensors, Status};
use crate::engine::affinity::on_cores;
use crate::engine::control::ControlAddrs;
use crate::engine::health;
use crate::engine::metrics::Metrics;
use crate::engine::recv::{open_sources, ChunkGaps, Receivers};
use crate::engine::recv_numa::bind_chunks;
use crate::engine::send::{DescriptorSchedule, HeapSink, SendFlags, SendThread, StreamSpec};
use crate::engine::{ConfigError, EngineError, Shutdown};
use crate::gpu::memory::HostRegistrations;
use crate::spead::recv::{Chunk, ChunkGroup, ChunkGroupConfig, PlaceInput, StatsSnapshot};
use crate::spead::send::SendStreamConfig;

/// Heap buffers circulating between the engine and each output's send thread.
const SEND_BUFFERS: usize = 8;

/// One output: its pipeline, its send thread and what its requests set.
struct Output {
    pipeline: Pipeline,
    sink: HeapSink<u64>,
    gains_version: u64,
    /// `?capture-start` / `?capture-stop` state at the last chunk.
    capture: bool,
    totals: OutputTotals,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct FengineReport {
    pub input: InputTotals,
    pub rx: StatsSnapshot,
    /// Per output: (name, totals).
    pub outputs: Vec<(String, OutputTotals)>,
}

pub struct Engine {
    config: FengineConfig,
    layout: InputLayout,
    /// The receive chunks page-locked for the GPU's copies (CUDA backend); declared before
    /// `group` so that they are unlocked before its memory can go.
    _pinned: Option<HostRegistrations>,
    group: Arc<ChunkGroup>,
    receivers: Receivers,
    control: Arc<EngineControl>,
    addrs: ControlAddrs,
    metrics: Metrics,
    outputs: Vec<Output>,
    shutdown: Shutdown,
}

impl Engine {
    /// Validate `config` and start everything but the processing loop.
    pub fn new(config: FengineConfig, shutdown: Shutdown) -> Result<Engine, EngineError> {
        let Plan { layout, outputs } = config.validate()?;
        let per_pol = layout.heaps_per_pol();
        // Before any DPDK port starts (a receiver on a send port starts it): a TX queue per
        // output.
        config.send_transport.plan(
            &config.send_interfaces,
            outputs.len(),
            SendFlags::ENGINE,
            None,
        )?;
        let sources = open_sources(&config.source)?;
        let n_streams = sources.len();
        let chunk_config = ChunkGroupConfig {
            heaps_per_chunk: 2 * per_pol,
            chunk_bytes: 2 * layout.pol_bytes(),
            // Three chunks in flight: the polarisations may arrive out of step by up to a
            // chunk.
            max_chunks: 3,
            n_chunks: 8,
            n_streams,
            max_heaps: 16,
            items: ITEMS.to_vec(),
            reject_reasons: REJECT_REASONS.to_vec(),
        };
        let mut gpu = None;
        if config.use_peerdirect {
            // What GPUDirect RDMA send needs on this host, before anything is sent from GPU
            // memory (`peerdirect`).
            let interface =
                peerdirect::probe_host(&config.send_interfaces, std::path::Path::new("/sys"))?;
            peerdirect::probe_registration(&*open_gpu(&config, &mut gpu)?, &interface)?;
        }
        let (group, pinned, device_chunks) = if config.use_vkgdr {
            // In GPU memory: nothing to page-lock or bind to a NUMA node.
            let (group, memory) = vkgdr::chunk_group(&*open_gpu(&config, &mut gpu)?, chunk_config)?;
            (group, None, Some(memory))
        } else {
            // Allocated and first touched on the receive cores, so that the chunks are on their
            // NUMA node (the page-locking below keeps them there).
            let recv_cores = config.affinity.recv_cores();
            let group = on_cores("fengine-alloc", &recv_cores, || {
                ChunkGroup::new(chunk_config)
            })?
            .map_err(|e| ConfigError::new("--recv-chunk-samples", e))?;
            // On the NIC's NUMA node (or --recv-numa-node), before they are page-locked.
            bind_chunks(&group, config.source.numa_node, &sources)?;
            let pinned = match config.backend {
                BackendKind::Cpu => None,
                BackendKind::Cuda => {
                    // Before any receiver writes into the chunks: the chunks are the copies'
                    // source, so they copy at the link's rate, as in `cbf-gpu-bench`.
                    let mut pins = HostRegistrations::new(open_gpu(&config, &mut gpu)?);
                    group
                        .for_each_buffer(|b| {
                            // SAFETY: the chunks live in `group` and never move; `pins` is
                            // dropped before it (field order of `Engine`).
                            unsafe { pins.register(b) }
                        })
                        .map_err(|e| ConfigError::new("--recv-chunk-samples", e))?;
                    tracing::info!(
                        chunks = pins.len(),
                        "receive chunks page-locked and mapped for the device"
                    );
                    Some(pins)
                }
            };
            (group, pinned, None)
        };
        let place = Arc::new(move |p: &PlaceInput<'_>| layout.place(p));
        let receivers = Receivers::spawn(
            "fengine",
            &group,
            place,
            sources,
            &config.affinity.recv,
            config.source.numa_node,
            &shutdown,
        )?;
        let sensors = Arc::new(Sensors::default());
        let control = Arc::new(EngineControl::new(
            outputs
                .iter()
                .map(|(o, _)| OutputState {
                    name: o.name().to_string(),
                    channels: o.channels(),
                    gains: [
                        vec![config.gain; o.channels()],
                        vec![config.gain; o.channels()],
                    ],
                    gains_version: 0,
                    new_delays: [Vec::new(), Vec::new()],
                    capture: true,
                    default_gain: config.gain,
                })
                .collect(),
            Arc::clone(&sensors),
            config.adc_sample_rate,
            config.sync_time,
            layout.chunk_samples,
        ));
        let metrics = metrics::new().map_err(|e| EngineError::Backend(e.to_string()))?;
        let rx_timeouts = health::add_rx_sensors(
            &sensors,
            &["input0.", "input1."],
            health::rx_timeout(layout.chunk_samples as f64 / config.adc_sample_rate),
        );
        for (o, _) in &outputs {
            // The seed reproduces the dither: logged and shown (katgpucbf `dither-seed`).
            tracing::info!(output = %o.name(), dither_seed = config.dither_seed, "dither");
            sensors.add(
                &format!("{}.dither-seed", o.name()),
                "Random seed used in dithering for quantisation",
                "",
                "integer",
                config.dither_seed,
            );
            for p in 0..2 {
                sensors.add(
                    &format!("{}.input{p}.feng-clip-cnt", o.name()),
                    "Number of output samples that are saturated",
                    "",
                    "integer",
                    0,
                );
            }
        }
        let mut cuda = match &gpu {
            Some(g) => Some(CudaShared::new(
                &config,
                layout,
                &outputs,
                g,
                device_chunks,
            )?),
            None => None,
        };
        let mut built = Vec::new();
        for (i, (o, sph)) in outputs.into_iter().enumerate() {
            built.push(Self::output(
                &config,
                layout,
                cuda.as_mut(),
                i,
                o,
                sph,
                &shutdown,
            )?);
        }
        // Every family has its samples before the endpoint listens, so the first scrape
        // finds them all: the outputs (and so their send interfaces' names) exist by now.
        for pol in ["0", "1"] {
            metrics.touch_all("input_", &[pol]);
            for o in &built {
                metrics.touch("output_clipped_samples", &[o.pipeline.output.name(), pol]);
            }
        }
        for o in &built {
            metrics.touch_all("output_", &[o.pipeline.output.name()]);
            crate::engine::metrics::send(&metrics, o.pipeline.output.name(), &o.sink.counters());
        }
        let addrs = crate::engine::control::serve(
            config.control,
            "cbf-fengine",
            sensors,
            control.clone(),
            metrics.registry.clone(),
            &shutdown,
            rx_timeouts,
        )?;
        Ok(Engine {
            config,
            layout,
            _pinned: pinned,
            group,
            receivers,
            control,
            addrs,
            metrics,
            outputs: built,
            shutdown,
        })
    }

    /// Output `index`'s send stream, thread and pipeline.
    fn output(
        cfg: &FengineConfig,
        layout: InputLayout,
        cuda: Option<&mut CudaShared>,
        index: usize,
        o: OutputSpec,
        sph: usize,
        shutdown: &Shutdown,
    ) -> Result<Output, EngineError> {
        let (n_dst, channels) = (o.dst().len(), o.channels());
        let value_bytes = if cfg.send_sample_bits == 4 { 2 } else { 4 };
        let payload = channels / n_dst * sph * value_bytes;
        let packets = payload.div_ceil(cfg.send_packet_payload);
        let span = sph * o.shape().spectra_samples;
        let heaps_per_s = cfg.adc_sample_rate / span as f64 * n_dst as f64;
        let rate = heaps_per_s * (payload + packets * 72) as f64 * cfg.send_rate_factor;
        // The pipeline first: with --use-peerdirect its output slots are the device memory the
        // senders register.
        let pcfg = pipeline_config(cfg, layout, sph);
        let pipeline = make_pipeline(cfg, cuda, o.clone(), pcfg)?;
        // --send-threads streams, each with its own sockets, an equal share of the rate and
        // every T-th of the heap counters (thread t: feng_id + t·array_size, stepping
        // T·array_size), so that together they count as one stream would.
        let threads = cfg.send_threads;
        let mut senders = Vec::with_capacity(threads);
        for t in 0..threads {
            let stream = StreamSpec {
                dst: o.dst().to_vec(),
                interfaces: cfg.send_interfaces.clone(),
                ttl: cfg.send_ttl,
                buffer: cfg.send_buffer,
                transport: cfg.send_transport.clone(),
                config: SendStreamConfig {
                    max_packet_size: cfg.send_packet_payload + 72,
                    rate: rate / threads as f64,
                    cnt_first: cfg.feng_id + t as u64 * cfg.array_size,
                    cnt_step: cfg.array_size * threads as u64,
                    ..Default::default()
                },
            }
            .open_with(&pipeline.peer_memory())?;
            // One thread keeps katgpucbf's name; several are told apart by a suffix.
            let name = if threads == 1 {
                format!("fengine-tx{index}")
            } else {
                format!("fengine-tx{index}.{t}")
            };
            let thread = SendThread {
                name,
                core: cfg.affinity.send_core(index * threads + t),
            };
            tracing::info!(output = %o.name(), thread = %thread.name, core = ?thread.core, "send thread");
            senders.push((thread, stream));
        }
        tracing::info!(output = %o.name(), kind = o.kind(), channels, destinations = n_dst, rate_gbps = rate * 8e-9, "output");
        let format = FHeapFormat {
            feng_id: cfg.feng_id,
            channels,
            destinations: n_dst,
            spectra_per_heap: sph,
            sample_bits: cfg.send_sample_bits,
        };
        // Descriptors every array_size × 5 s, the first after (feng_id + 1) × 5 s (katgpucbf's
        // stagger).
        let schedule = DescriptorSchedule {
            first: Instant::now() + Duration::from_secs(5 * (cfg.feng_id + 1).min(1 << 20)),
            period: Duration::from_secs(5 * cfg.array_size.min(1 << 20)),
        };
        // With --use-peerdirect the heaps are sent from the device: no host buffers, and room
        // in the queue for every heap the pipeline can lend, so that handing one over never
        // waits (the engine's only wait is for a lease, bounded: `out_ring`).
        let (buffers, buffer_bytes) = if cfg.use_peerdirect {
            (SEND_BUFFERS.max(pipeline.lendable_heaps()), 0)
        } else {
            (SEND_BUFFERS.max(2 * threads), channels * sph * value_bytes)
        };
        let sink =
            HeapSink::spawn_threads(senders, format, schedule, buffers, buffer_bytes, shutdown)?;
        Ok(Output {
            pipeline,
            sink,
            gains_version: 0,
            capture: true,
            totals: OutputTotals::default(),
        })
    }

    pub fn katcp_addr(&self) -> SocketAddr {
        self.addrs.katcp
    }

    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.addrs.prometheus
    }

    /// Process chunks until the input ends, the duration passes or shutdown is asked for;
    /// then flush the heaps in flight, stop the threads and report.
    pub fn run(self) -> Result<FengineReport, EngineError> {
        // On its own thread, named and bound to --main-affinity; the caller waits.
        let cores = self.config.affinity.main.clone();
        on_cores("fengine-main", &cores, move || self.run_here())
            .map_err(|e| ConfigError::new("--main-affinity", e))?
    }

    fn run_here(mut self) -> Result<FengineReport, EngineError> {
        let result = self.process();
        // Whatever happened, stop the receivers and let the send threads drain.
        self.group.stop();
        let mut tail: Result<(), EngineError> = Ok(());
        for out in &mut self.outputs {
            let Output {
                pipeline,
                sink,
                totals,
                capture,
                ..
            } = out;
            if result.is_ok() && tail.is_ok() {
                tail = pipeline
                    .flush(|h| emit(sink, totals, *capture, h))
                    .map_err(|e| EngineError::Backend(e.to_string()));
            }
            let joined = sink.join();
            tail = tail.and(joined);
            totals.heaps = sink.sent() * pipeline.output.dst().len() as u64;
            totals.stalled = pipeline.stalled_heaps();
            totals.bytes = sink.bytes();
            totals.samples = sink.sent() * pipeline.heap_span();
        }
        let outcome = result.and_then(|input| tail.map(|()| input));
        let rx = self.receivers.join();
        let input = outcome?;
        Ok(FengineReport {
            input,
            rx: rx?,
            outputs: self
                .outputs
                .iter()
                .map(|o| (o.pipeline.output.name().to_string(), o.totals))
                .collect(),
        })
    }

    fn process(&mut self) -> Result<InputTotals, EngineError> {
        let per_pol = self.layout.heaps_per_pol();
        let deadline = self
            .config
            .duration
            .map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut prev: Option<Box<Chunk>> = None;
        let mut input = InputTotals::default();
        let mut gaps = ChunkGaps::default();
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) || self.shutdown.requested() {
                self.group.stop();
            }
            let next = match self.group.ready().recv_timeout(Duration::from_millis(100)) {
                Ok(c) => Some(c),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => None,
            };
            if let Some(chunk) = prev.take() {
                input.chunks += 1;
                let skipped = gaps.skipped_before(chunk.chunk_id) * per_pol as u64;
                // Input statistics from the chunk: heaps present and saturation counts per pol.
                for pol in 0..2 {
                    let range = pol * per_pol..(pol + 1) * per_pol;
                    let present = chunk.present[range.clone()]
                        .iter()
                        .filter(|&&v| v != 0)
                        .count() as u64;
                    input.heaps[pol] += present;
                    input.samples[pol] += present * self.layout.heap_samples;
                    input.bytes[pol] += present * self.layout.heap_bytes;
                    input.missing[pol] += skipped + per_pol as u64 - present;
                    input.clipped[pol] += chunk.extra[range].iter().sum::<u64>();
                }
                let result = self.process_chunk(&chunk, next.as_deref(), &input);
                self.group.free(chunk);
                result?;
            }
            match next {
                Some(c) => prev = Some(c),
                None => return Ok(input),
            }
        }
    }

    /// Every output's heaps from `chunk` (its successor `next` supplies the tail).
    fn process_chunk(
        &mut self,
        chunk: &Chunk,
        next: Option<&Chunk>,
        input: &InputTotals,
    ) -> Result<(), EngineError> {
        let control = &self.control;
        for (i, out) in self.outputs.iter_mut().enumerate() {
            // Pick up requests made since the last chunk.
            let capture = match control.outputs[i].lock() {
                Ok(mut st) => {
                    if st.gains_version != out.gains_version {
                        out.pipeline.set_gains(st.gains.clone());
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
            out.capture = capture;
            let before = [
                *out.pipeline.delays[0].current(),
                *out.pipeline.delays[1].current(),
            ];
            let Output {
                pipeline,
                sink,
                totals,
                ..
            } = out;
            totals.skipped += pipeline
                .process(chunk.into(), next.map(Into::into), |h| {
                    emit(sink, totals, capture, h)
                })
                .map_err(|e| EngineError::Backend(e.to_string()))?;
            sink.check()?;
            for (pol, was) in before.iter().enumerate() {
                let now = *out.pipeline.delays[pol].current();
                if now != *was {
                    control.delay_in_effect(out.pipeline.output.name(), pol, &now);
                }
            }
            control
                .processed
                .fetch_max(out.pipeline.next_timestamp(), Ordering::Relaxed);
            out.totals.stalled = out.pipeline.stalled_heaps();
            out.totals.heaps = out.sink.sent() * out.pipeline.output.dst().len() as u64;
            out.totals.bytes = out.sink.bytes();
            out.totals.samples = out.sink.sent() * out.pipeline.heap_span();
            metrics::output(&self.metrics, out.pipeline.output.name(), &out.totals);
            crate::engine::metrics::send(
                &self.metrics,
                out.pipeline.output.name(),
                &out.sink.counters(),
            );
            for (p, clipped) in out.totals.clipped.iter().enumerate() {
                let name = format!("{}.input{p}.feng-clip-cnt", out.pipeline.output.name());
                control.sensors.set(&name, clipped, Status::Nominal);
            }
        }
        // Digitiser statistics come from the first wideband output's PFB (seed 000 §Input
        // statistics: an engine with only narrowband outputs has none).
        let power = self
            .outputs
            .iter_mut()
            .find(|o| matches!(o.pipeline.output, OutputSpec::Wideband(_)))
            .map_or([None, None], |o| o.pipeline.take_dig_power());
        let per_pol = self.layout.heaps_per_pol();
        let missing = [0, 1].map(|p| chunk.present[p * per_pol..(p + 1) * per_pol].contains(&0));
        control.input_stats(
            chunk.chunk_id * self.layout.chunk_samples,
            input.clipped,
            power,
            self.config.dig_sample_bits,
            missing,
        );
        metrics::input(&self.metrics, input, &self.receivers.snapshot());
        Ok(())
    }
}

/// Hand a finished heap to the send thread (or count it as skipped when input was missing;
/// drop it while capture is stopped).
fn emit(sink: &mut HeapSink<u64>, totals: &mut OutputTotals, capture: bool, h: &OutputHeap<'_>) {
    if !h.valid {
        totals.skipped += 1;
        return;
    }
    if !capture {
        return;
    }
    totals.clipped[0] += h.clips[0];
    totals.clipped[1] += h.clips[1];
    match &h.data {
        HeapData::Host(bytes) => {
            let Some(mut buf) = sink.buffer() else {
                return;
            };
            buf.extend_from_slice(bytes);
            sink.send(buf, h.timestamp);
        }
        // No copy: the send thread gathers from the device and drops its hold when sent.
        HeapData::Device(d) => sink.send_device(d.clone(), h.timestamp),
    }
}
