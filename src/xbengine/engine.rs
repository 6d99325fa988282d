//! The XB-engine as a library type (seed 001, seed 003): built from a validated
//! [`XbengineConfig`], it receives F heaps into chunks of `--heaps-per-fengine-per-chunk`
//! batches through the shared receive threads, correlates each `--corrprod` output into its own
//! accumulator with dumps at their own multiples ([`super::accum`]), forms every `--beam` per
//! batch and every `--frb-beam` per chunk ([`super::frb`]), and hands X, beam and FRB heaps to
//! send threads. A test can run it in-process.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::accum::{Step, Verdict};
use super::backend::{BeamChunk, CpuBackend, XbBackend, XbShape, BEAM_SLOTS};
use super::config::{Plan, XbengineConfig};
use super::control::{OutputNames, XbControl};
use super::cuda::CudaBackend;
use super::frb::{self, FrbOutput};
use super::heaps::BeamMeta;
use super::metrics::{self, BTotals, FrbTotals, InputTotals, XTotals};
use super::outputs::{band, beam_outputs, x_output, BeamOutputs, XOutput};
use super::place::{ITEMS, REJECT_REASONS};
use crate::control::katcp::{Sensors, Status};
use crate::engine::affinity::on_cores;
use crate::engine::control::ControlAddrs;
use crate::engine::health;
use crate::engine::metrics::Metrics;
use crate::engine::recv::{open_sources, ChunkGaps, Receivers};
use crate::engine::recv_numa::bind_chunks;
use crate::engine::{ConfigError, EngineError, Shutdown};
use crate::fengine::BackendKind;
use crate::gpu::Gpu;
use crate::spead::recv::{Chunk, ChunkGroup, ChunkGroupConfig, PlaceInput, StatsSnapshot};

/// A chunk's beams, formed (or being formed) by the backend and sent once the next chunk's
/// work has been queued, so that the backend's copies overlap its compute.
struct PendingBeams {
    slot: usize,
    /// Per batch of the chunk: what its heaps carry, or `None` where no heap is sent (no
    /// antenna present, or no beam capturing).
    batches: Vec<Option<BeamMeta>>,
}

/// A dump started on the backend, sent once the next chunk's work has been queued.
struct PendingDump {
    output: usize,
    timestamp: u64,
    verdict: Verdict,
    sends: bool,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct XbengineReport {
    pub input: InputTotals,
    pub rx: StatsSnapshot,
    pub x: Vec<(String, XTotals)>,
    pub beams: Vec<(String, BTotals)>,
    pub frb: Vec<(String, FrbTotals)>,
}

pub struct Engine {
    /// First, so that it is dropped before the chunks it may have page-locked (fields drop in
    /// declaration order; `group` owns the chunks).
    backend: Box<dyn XbBackend>,
    config: XbengineConfig,
    plan: Plan,
    group: Arc<ChunkGroup>,
    receivers: Receivers,
    control: Arc<XbControl>,
    addrs: ControlAddrs,
    metrics: Metrics,
    x: Vec<XOutput>,
    beams: Option<BeamOutputs>,
    frb: Vec<FrbOutput>,
    /// Chunks' beams queued on the backend, oldest first (at most `BEAM_SLOTS` − 1 between
    /// chunks).
    pending: VecDeque<PendingBeams>,
    /// Dumps started during earlier chunks, and during this one.
    dumps_before: Vec<PendingDump>,
    dumps_now: Vec<PendingDump>,
    shutdown: Shutdown,
}

impl Engine {
    /// Validate `config` and start everything but the processing loop.
    pub fn new(config: XbengineConfig, shutdown: Shutdown) -> Result<Engine, EngineError> {
        let plan = config.validate()?;
        let layout = plan.layout;
        let shape = XbShape {
            n_ants: config.array_size,
            channels: config.channels_per_substream,
            spectra: plan.spectra_per_heap,
            sample_bits: config.sample_bits,
            outputs: config.corrprods.len(),
            threads: config.cpu_threads,
        };
        let mut backend: Box<dyn XbBackend> = match config.backend {
            BackendKind::Cpu => Box::new(
                CpuBackend::new(shape, layout.batches).with_frb(frb::cpu_formers(&config, &plan)),
            ),
            BackendKind::Cuda => {
                let gpu =
                    Gpu::open(config.gpu_device).map_err(|e| ConfigError::new("--backend", e))?;
                tracing::info!(gpu = %gpu.name, arch = %gpu.arch, "CUDA backend");
                Box::new(
                    CudaBackend::new(gpu, shape, layout.batches, config.beams.len())
                        .and_then(|b| b.with_frb(&frb::cuda_specs(&config, &plan)))
                        .map_err(|e| EngineError::Backend(e.to_string()))?,
                )
            }
        };
        // Before any DPDK port starts (a receiver on a send port starts it): a TX queue per
        // output stream (each corrprod, the beams together, each FRB beam set).
        let streams =
            config.corrprods.len() + usize::from(!config.beams.is_empty()) + config.frb_beams.len();
        config.send_transport.plan(
            &config.send_interfaces,
            streams,
            crate::engine::send::SendFlags::ENGINE,
            None,
        )?;
        let sources = open_sources(&config.source)?;
        // Allocated and first touched on the receive cores, so that the chunks are on their
        // NUMA node (page-locking them below keeps them there).
        let recv_cores = config.affinity.recv_cores();
        let n_streams = sources.len();
        let group = on_cores("xbengine-alloc", &recv_cores, || {
            ChunkGroup::new(ChunkGroupConfig {
                heaps_per_chunk: layout.heaps_per_chunk(),
                chunk_bytes: layout.chunk_bytes(),
                max_chunks: plan.max_chunks,
                n_chunks: plan.max_chunks + 4,
                n_streams,
                // One partial heap per F-engine at a time, as katgpucbf's substreams = n_ants.
                max_heaps: (2 * config.array_size).max(4),
                items: ITEMS.to_vec(),
                reject_reasons: REJECT_REASONS.to_vec(),
            })
        })?
        .map_err(|e| ConfigError::new("--heaps-per-fengine-per-chunk", e))?;
        // On the NIC's NUMA node (or --recv-numa-node), before they are page-locked.
        bind_chunks(&group, config.source.numa_node, &sources)?;
        // Before any receiver writes into them.
        group
            .for_each_buffer(|b| backend.pin(b))
            .map_err(backend_error)?;
        let place = Arc::new(move |p: &PlaceInput<'_>| layout.place(p));
        let receivers = Receivers::spawn(
            "xbengine",
            &group,
            place,
            sources,
            &config.affinity.recv,
            config.source.numa_node,
            &shutdown,
        )?;
        let sensors = Arc::new(Sensors::default());
        let cps = config.channels_per_substream as u64;
        let control = Arc::new(XbControl::new(
            Arc::clone(&sensors),
            config.array_size,
            OutputNames {
                corrprods: config.corrprods.iter().map(|c| c.name.clone()).collect(),
                beams: config.beams.iter().map(|b| b.name.clone()).collect(),
            },
            frb::control_setups(&config),
            config.send_enabled,
            (
                config.channel_offset_value,
                config.channel_offset_value + cps - 1,
            ),
            config.dither_seed,
        ));
        let metrics = metrics::new().map_err(|e| EngineError::Backend(e.to_string()))?;
        let rx_timeouts = health::add_rx_sensors(
            &sensors,
            &[""],
            health::rx_timeout(layout.chunk_step() as f64 / config.adc_sample_rate),
        );
        let x = config
            .corrprods
            .iter()
            .enumerate()
            .map(|(i, c)| x_output(&config, &plan, i, c, backend.as_mut(), &shutdown))
            .collect::<Result<Vec<_>, _>>()?;
        let beams = if config.beams.is_empty() {
            None
        } else {
            Some(beam_outputs(&config, &plan, &shutdown)?)
        };
        let frb = frb::frb_outputs(&config, &plan, backend.as_mut(), &shutdown)?;
        // Every family has its samples before the endpoint listens, so the first scrape
        // finds them all: the outputs (and so their send interfaces' names) exist by now.
        for c in &config.corrprods {
            metrics.touch_all("output_x_", &[&c.name]);
        }
        for b in &config.beams {
            metrics.touch_all("output_b_", &[&b.name]);
        }
        for f in &config.frb_beams {
            metrics.touch_all("output_frb_", &[&f.name]);
        }
        for o in &x {
            crate::engine::metrics::send(&metrics, &o.name, &o.sink.counters());
        }
        if let Some(b) = &beams {
            crate::engine::metrics::send(&metrics, "beams", &b.sink.counters());
        }
        for f in &frb {
            f.report_send(&metrics);
        }
        let addrs = crate::engine::control::serve(
            config.control,
            "cbf-xbengine",
            sensors,
            control.clone(),
            metrics.registry.clone(),
            &shutdown,
            rx_timeouts,
        )?;
        Ok(Engine {
            config,
            plan,
            group,
            receivers,
            control,
            addrs,
            metrics,
            backend,
            x,
            beams,
            frb,
            pending: VecDeque::with_capacity(BEAM_SLOTS),
            dumps_before: Vec::new(),
            dumps_now: Vec::new(),
            shutdown,
        })
    }

    pub fn katcp_addr(&self) -> SocketAddr {
        self.addrs.katcp
    }

    /// The request handler the katcp server serves, for in-process callers.
    pub fn control(&self) -> Arc<XbControl> {
        Arc::clone(&self.control)
    }

    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.addrs.prometheus
    }

    /// Process chunks until the input ends, the duration passes or shutdown is asked for;
    /// then let the send threads drain, stop the receivers and report.
    pub fn run(self) -> Result<XbengineReport, EngineError> {
        // On its own thread, named and bound to --main-affinity; the caller waits.
        let cores = self.config.affinity.main.clone();
        on_cores("xbengine-main", &cores, move || self.run_here())
            .map_err(|e| ConfigError::new("--main-affinity", e))?
    }

    fn run_here(mut self) -> Result<XbengineReport, EngineError> {
        let result = self.process();
        self.group.stop();
        let mut tail = Ok(());
        for x in &mut self.x {
            tail = tail.and(x.sink.join());
        }
        if let Some(b) = &mut self.beams {
            tail = tail.and(b.sink.join());
        }
        for f in &mut self.frb {
            tail = tail.and(f.join());
        }
        let rx = self.receivers.join();
        let input = result?;
        tail?;
        Ok(XbengineReport {
            input,
            rx: rx?,
            x: self.x.iter().map(|x| (x.name.clone(), x.totals)).collect(),
            beams: self
                .beams
                .iter()
                .flat_map(|b| b.names.iter().cloned().zip(b.totals.iter().copied()))
                .collect(),
            frb: self
                .frb
                .iter()
                .map(|f| (f.name.clone(), f.totals))
                .collect(),
        })
    }

    fn process(&mut self) -> Result<InputTotals, EngineError> {
        let deadline = self
            .config
            .duration
            .map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut input = InputTotals::default();
        let mut gaps = ChunkGaps::default();
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) || self.shutdown.requested() {
                self.group.stop();
            }
            let mut chunk = match self.group.ready().recv_timeout(Duration::from_millis(100)) {
                Ok(c) => c,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // No chunk for 100 ms: nothing to overlap with, so send what is held
                    // (the last chunks' beams and dumps would otherwise wait for the next
                    // chunk, or for shutdown when the input has stopped).
                    self.flush()?;
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    self.flush()?;
                    return Ok(input);
                }
            };
            input.chunks += 1;
            let present = chunk.present.iter().filter(|&&p| p != 0).count() as u64;
            input.heaps += present;
            input.samples += present
                * self.plan.spectra_per_heap as u64
                * self.config.channels_per_substream as u64
                * 2;
            input.missing +=
                (gaps.skipped_before(chunk.chunk_id) + 1) * chunk.present.len() as u64 - present;
            let result = self.process_chunk(&mut chunk);
            // The chunk's memory may be read by the backend until release returns.
            let released = self.backend.release().map_err(backend_error);
            self.group.free(chunk);
            result?;
            released?;
            metrics::input(&self.metrics, &input, &self.receivers.snapshot());
        }
    }

    fn process_chunk(&mut self, chunk: &mut Chunk) -> Result<(), EngineError> {
        let layout = self.plan.layout;
        let first = chunk.chunk_id * layout.chunk_step();
        // Requests made from here on are picked up by the next chunk (katgpucbf's
        // `_weights_steady`).
        self.control.steady.store(
            first + layout.chunk_step(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let sensors = &self.control.sensors;
        let unix = self.config.sync_time + first as f64 / self.config.adc_sample_rate;
        sensors.set("rx.timestamp", first, Status::Nominal);
        sensors.set("rx.unixtime", format!("{unix:.6}"), Status::Nominal);
        if chunk.present.contains(&0) {
            sensors.set("rx.missing-unixtime", format!("{unix:.6}"), Status::Error);
        }
        // Missing heaps hold stale bytes from the chunk's last use: zero them so the beams'
        // sums see nothing there (seed 003 §Missing data handling); their baselines are
        // flagged anyway.
        for (i, &p) in chunk.present.iter().enumerate() {
            if p == 0 {
                chunk.data[i * layout.heap_bytes..(i + 1) * layout.heap_bytes].fill(0);
            }
        }
        self.backend.load(&chunk.data).map_err(backend_error)?;
        let capture = self.control.capture();
        for (i, output_capture) in capture.iter().enumerate().take(self.x.len()) {
            let steps = self.x[i].acc.chunk(first, &chunk.present);
            for step in steps {
                match step {
                    Step::Correlate(r) => self.backend.correlate(i, r).map_err(backend_error)?,
                    Step::Dump(d) => {
                        // The backend holds one dump per output: send an unsent one first.
                        let mut waiting = Vec::new();
                        for list in [&mut self.dumps_before, &mut self.dumps_now] {
                            if let Some(k) = list.iter().position(|p| p.output == i) {
                                waiting.push(list.remove(k));
                            }
                        }
                        for p in waiting {
                            self.send_dump(p)?;
                        }
                        let verdict = d.verdict();
                        let sends =
                            verdict != Verdict::Skipped && output_capture.sends(d.timestamp);
                        // The backend fills the heap's own buffer (no copy), or a scratch one
                        // for a dump that is not sent (its accumulator must still be reset).
                        let x = &mut self.x[i];
                        let buf = if sends {
                            x.sink
                                .buffer()
                                .ok_or_else(|| EngineError::Send("X send thread stopped".into()))?
                        } else {
                            x.scratch.take().unwrap_or_default()
                        };
                        self.backend
                            .dump(i, &d.present, buf)
                            .map_err(backend_error)?;
                        self.dumps_now.push(PendingDump {
                            output: i,
                            timestamp: d.timestamp,
                            verdict,
                            sends,
                        });
                    }
                }
            }
        }
        let n_beams = self.config.beams.len();
        let beam_capture = &capture[self.x.len()..self.x.len() + n_beams];
        let formed = self.beamform(chunk, first, beam_capture)?;
        self.pending.extend(formed);
        frb::repoint(&mut self.frb, self.backend.as_mut(), &self.control, first)?;
        frb::start(
            &mut self.frb,
            self.backend.as_mut(),
            &self.control,
            &capture[self.x.len() + n_beams..],
            first,
            &chunk.present,
            layout.n_ants,
        )?;
        // Beams of two chunks back, while this chunk's copy runs: by then the backend has
        // long finished them (one chunk back, the engine waited behind that chunk's
        // correlation and idled the copy engine).
        if self.pending.len() >= BEAM_SLOTS {
            self.send_beams()?;
        }
        for d in std::mem::take(&mut self.dumps_before) {
            self.send_dump(d)?;
        }
        self.dumps_before = std::mem::take(&mut self.dumps_now);
        for x in &mut self.x {
            x.sink.check()?;
            metrics::x_output(&self.metrics, &x.name, &x.totals);
            crate::engine::metrics::send(&self.metrics, &x.name, &x.sink.counters());
        }
        // The previous chunk's FRB heaps; this chunk's go out after the next is queued.
        frb::finish(
            &mut self.frb,
            self.backend.as_mut(),
            &self.control,
            &self.metrics,
            layout.chunk_step(),
            Some(first),
        )
    }

    /// Send every beam heap, dump and FRB heap still held for overlap.
    fn flush(&mut self) -> Result<(), EngineError> {
        while !self.pending.is_empty() {
            self.send_beams()?;
        }
        let dumps: Vec<PendingDump> = self
            .dumps_before
            .drain(..)
            .chain(self.dumps_now.drain(..))
            .collect();
        for d in dumps {
            self.send_dump(d)?;
        }
        frb::finish(
            &mut self.frb,
            self.backend.as_mut(),
            &self.control,
            &self.metrics,
            self.plan.layout.chunk_step(),
            None,
        )
    }

    /// Send (or drop, if not captured) a dump the backend has reduced.
    fn send_dump(&mut self, p: PendingDump) -> Result<(), EngineError> {
        let x = &mut self.x[p.output];
        let (buf, clips) = self.backend.dumped(p.output).map_err(backend_error)?;
        let sensors = &self.control.sensors;
        sensors.set(
            &format!("{}.rx.synchronised", x.name),
            u8::from(p.verdict == Verdict::Complete),
            Status::Nominal,
        );
        match p.verdict {
            Verdict::Skipped => {
                tracing::warn!(output = %x.name, timestamp = p.timestamp, "no antenna present for a whole accumulation: not sent");
                x.totals.skipped_accs += 1;
            }
            Verdict::Incomplete => x.totals.incomplete_accs += 1,
            Verdict::Complete => {}
        }
        if !p.sends {
            x.scratch = Some(buf);
            return Ok(());
        }
        x.totals.heaps += 1;
        x.totals.bytes += x.heap_bytes as u64;
        x.totals.visibilities += (x.heap_bytes / 8) as u64;
        x.totals.clipped += clips;
        sensors.set(
            &format!("{}.xeng-clip-cnt", x.name),
            x.totals.clipped,
            Status::Nominal,
        );
        sensors.set(
            &format!("{}.tx.next-timestamp", x.name),
            p.timestamp + x.acc.span(),
            Status::Nominal,
        );
        x.sink.send(buf, p.timestamp);
        Ok(())
    }

    /// Queue every beam of every batch of the chunk on the backend; the heaps are sent by
    /// [`Engine::send_beams`] after the next chunk's work is queued.
    fn beamform(
        &mut self,
        chunk: &Chunk,
        first: u64,
        capture: &[super::control::Capture],
    ) -> Result<Option<PendingBeams>, EngineError> {
        let layout = self.plan.layout;
        let Some(b) = &mut self.beams else {
            return Ok(None);
        };
        if let Some(s) = self.control.steering_if_changed(b.steering_version) {
            b.steer(&s, band(&self.config, &self.plan));
        }
        let n_ants = layout.n_ants;
        let batches: Vec<Option<BeamMeta>> = (0..layout.batches)
            .map(|batch| {
                let beam_ants = chunk.present[batch * n_ants..(batch + 1) * n_ants]
                    .iter()
                    .filter(|&&p| p != 0)
                    .count() as u64;
                let timestamp = first + batch as u64 * layout.heap_step;
                let send: Vec<bool> = capture.iter().map(|c| c.sends(timestamp)).collect();
                // katgpucbf sends no beam heap for a batch without any antenna.
                (beam_ants > 0 && send.contains(&true)).then_some(BeamMeta {
                    timestamp,
                    beam_ants,
                    send,
                })
            })
            .collect();
        if batches.iter().all(Option::is_none) {
            return Ok(None);
        }
        let slot = self
            .backend
            .beamform(&BeamChunk {
                version: b.steering_version,
                beams: &b.coeffs,
                dither: &b.dither,
                first: first as i64,
                batch_step: layout.heap_step as i64,
                spectrum_step: self.config.samples_between_spectra as i64,
                present: &chunk.present,
            })
            .map_err(backend_error)?;
        Ok(Some(PendingBeams { slot, batches }))
    }

    /// Send the heaps of the oldest beams queued by [`Engine::beamform`], if any.
    fn send_beams(&mut self) -> Result<(), EngineError> {
        let (Some(pending), Some(b)) = (self.pending.pop_front(), &mut self.beams) else {
            return Ok(());
        };
        let result = self.backend.beams(pending.slot).map_err(backend_error)?;
        let n_beams = b.names.len();
        let per_batch = b.heap_bytes * n_beams;
        let heap_step = self.plan.layout.heap_step;
        let sensors = &self.control.sensors;
        for (batch, meta) in pending.batches.into_iter().enumerate() {
            let Some(meta) = meta else { continue };
            let mut buf = b
                .sink
                .buffer()
                .ok_or_else(|| EngineError::Send("beam send thread stopped".into()))?;
            buf.clear();
            buf.extend_from_slice(&result.data[batch * per_batch..(batch + 1) * per_batch]);
            let clips = &result.clips[batch * n_beams..(batch + 1) * n_beams];
            for (i, t) in b.totals.iter_mut().enumerate() {
                if !meta.send[i] {
                    continue;
                }
                t.heaps += 1;
                t.bytes += b.heap_bytes as u64;
                t.samples += (b.heap_bytes / 2) as u64;
                t.clipped += clips[i];
                sensors.set(
                    &format!("{}.beng-clip-cnt", b.names[i]),
                    t.clipped,
                    Status::Nominal,
                );
                sensors.set(
                    &format!("{}.tx.next-timestamp", b.names[i]),
                    meta.timestamp + heap_step,
                    Status::Nominal,
                );
            }
            b.sink.send(buf, meta);
        }
        b.sink.check()?;
        for (name, t) in b.names.iter().zip(&b.totals) {
            metrics::b_output(&self.metrics, name, t);
        }
        // One send stream carries every beam: its interface counters go under "beams".
        crate::engine::metrics::send(&self.metrics, "beams", &b.sink.counters());
        Ok(())
    }
}

fn backend_error(e: super::backend::BackendError) -> EngineError {
    EngineError::Backend(e.to_string())
}
