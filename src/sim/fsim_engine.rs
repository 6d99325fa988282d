//! The F-engine simulator as a library type (katgpucbf fsim, facts §1.5): built from a
//! validated [`FsimConfig`], it renders the payload pattern once, opens one send stream per
//! destination (X-engine) and its katcp and Prometheus servers; [`Fsim::run`] then starts one
//! send thread per destination, each replaying the pattern as F heaps (one per F-engine per
//! batch, packets interleaved round-robin as katgpucbf sends them) with only the timestamp
//! changed, until `--max-heaps`, `--duration` or shutdown. A test can run it in-process.
//!
//! Heap counters: F-engine f's heap of the j-th batch sent has cnt f + j·array_size, so
//! cnt mod array_size = feng_id (an XB-engine receives with one substream per F-engine);
//! descriptor heaps (every 5 s, unpaced, first at the start) take cnts from 2⁴⁷ up, never
//! met by data heaps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::dsim_engine::DESCRIPTOR_INTERVAL;
use super::fsim::{set_timestamp, FsimPattern, Payload, PATTERN_BATCHES};
use super::fsim_config::{FsimConfig, FsimPlan};
use crate::control::katcp::{Handler, Sensors};
use crate::engine::control::ControlAddrs;
use crate::engine::metrics::Metrics;
use crate::engine::{unix_now, EngineError, Shutdown};
use crate::fengine::heaps::descriptor_heap;
use crate::net::NetSender;
use crate::spead::send::stream::{sleep_until_or, SendError};
use crate::spead::send::{HeapRef, SendMode, SendStream};

/// First cnt of the descriptor heaps.
const DESCRIPTOR_CNT: u64 = 1 << 47;

/// What a destination's send thread has done so far (read by the metrics from `run`).
#[derive(Debug, Default)]
struct StreamCounters {
    batches: AtomicU64,
    heaps: AtomicU64,
    /// Heap payload bytes (katgpucbf fsim's `output_bytes`).
    payload_bytes: AtomicU64,
    /// Bytes on the wire, packet headers and descriptors included.
    wire_bytes: AtomicU64,
    packets: AtomicU64,
    /// The thread stopped on a send error (the others are then stopped too).
    failed: AtomicBool,
}

/// What an fsim run did, all destinations together.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsimReport {
    /// Batches sent to each destination (the smallest over destinations).
    pub batches: u64,
    /// Data heaps sent.
    pub heaps: u64,
    pub payload_bytes: u64,
    pub wire_bytes: u64,
    pub packets: u64,
    pub first_timestamp: u64,
    pub elapsed: Duration,
}

/// A running F-engine simulator.
pub struct Fsim {
    plan: FsimPlan,
    pattern: Arc<FsimPattern>,
    streams: Vec<SendStream<NetSender>>,
    addrs: ControlAddrs,
    metrics: Metrics,
    time_error: prometheus::GaugeVec,
    shutdown: Shutdown,
}

impl Fsim {
    /// Validate `config`, render the pattern and open the streams and control servers.
    pub fn new(config: FsimConfig, shutdown: Shutdown) -> Result<Fsim, EngineError> {
        let plan = config.validate()?;
        let pattern = Arc::new(FsimPattern::new(plan.layout, config.payload));
        // A DPDK port starts with a TX queue per destination's stream.
        config.send_transport.plan(
            &config.send_interfaces,
            config.dests.len(),
            crate::engine::send::SendFlags::ENGINE,
            None,
        )?;
        let streams = (0..config.dests.len())
            .map(|d| plan.stream_spec(d).open())
            .collect::<Result<Vec<_>, _>>()?;
        let metric_err = |e: prometheus::Error| EngineError::Backend(e.to_string());
        let metrics = Metrics::new(
            "fsim",
            &[
                ("output_heaps", "F heaps sent", &[]),
                ("output_bytes", "Heap payload bytes sent", &[]),
            ],
        )
        .map_err(metric_err)?;
        let time_error = prometheus::GaugeVec::new(
            prometheus::Opts::new(
                "time_error_s",
                "Wall-clock time minus the time of the data sent",
            ),
            &["stream"],
        )
        .map_err(metric_err)?;
        metrics
            .registry
            .register(Box::new(time_error.clone()))
            .map_err(metric_err)?;
        let addrs = crate::engine::control::serve(
            config.control,
            "cbf-fsim",
            settings_sensors(&plan),
            Arc::new(FsimControl),
            metrics.registry.clone(),
            &shutdown,
            vec![],
        )?;
        Ok(Fsim {
            plan,
            pattern,
            streams,
            addrs,
            metrics,
            time_error,
            shutdown,
        })
    }

    pub fn plan(&self) -> &FsimPlan {
        &self.plan
    }

    pub fn katcp_addr(&self) -> SocketAddr {
        self.addrs.katcp
    }

    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.addrs.prometheus
    }

    /// Send from the next batch boundary until a limit or shutdown; logs progress and
    /// refreshes the metrics about once a second.
    pub fn run(mut self) -> Result<FsimReport, EngineError> {
        let ts0 = self.plan.start_timestamp();
        tracing::info!(
            first_timestamp = ts0,
            gbps_per_destination = self.plan.rate() * 8e-9,
            destinations = self.streams.len(),
            "sending"
        );
        let start = Instant::now();
        let deadline = self
            .plan
            .config
            .duration
            .map(|d| start + Duration::from_secs_f64(d));
        let counters: Vec<Arc<StreamCounters>> = (0..self.plan.config.dests.len())
            .map(|_| Arc::default())
            .collect();
        let mut threads: Vec<JoinHandle<Result<(), SendError>>> = Vec::new();
        // Raised when a send thread fails, so that the others stop rather than run on.
        let stop = Shutdown::manual();
        for (dest, stream) in std::mem::take(&mut self.streams).into_iter().enumerate() {
            let job_counters = Arc::clone(&counters[dest]);
            let job = SendJob {
                plan: self.plan.clone(),
                pattern: Arc::clone(&self.pattern),
                dest,
                first_timestamp: ts0,
                start,
                deadline,
                shutdown: [self.shutdown.clone(), stop.clone()],
                counters: Arc::clone(&counters[dest]),
            };
            let spawned = std::thread::Builder::new()
                .name(format!("fsim-send-{dest}"))
                .spawn(move || {
                    let result = job.run(stream);
                    job_counters
                        .failed
                        .store(result.is_err(), Ordering::Relaxed);
                    result
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Stop the threads already started before reporting.
                    stop.request();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e.into());
                }
            }
        }
        let report = |elapsed| summarise(&counters, ts0, elapsed);
        let mut last_progress = start;
        while !threads.iter().all(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(50));
            if counters.iter().any(|c| c.failed.load(Ordering::Relaxed)) {
                stop.request();
            }
            if last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                let r = report(start.elapsed());
                self.update_metrics(&r, &counters, ts0);
                tracing::info!(
                    batches = r.batches,
                    heaps = r.heaps,
                    gbps = format!(
                        "{:.3}",
                        r.wire_bytes as f64 * 8e-9 / r.elapsed.as_secs_f64()
                    ),
                    "progress"
                );
            }
        }
        let mut result = Ok(());
        for t in threads {
            let outcome = match t.join() {
                Ok(r) => r.map_err(|e| EngineError::Send(e.to_string())),
                Err(_) => Err(EngineError::Panicked("fsim send")),
            };
            result = result.and(outcome);
        }
        let r = report(start.elapsed());
        self.update_metrics(&r, &counters, ts0);
        result.map(|()| r)
    }

    fn update_metrics(&self, r: &FsimReport, counters: &[Arc<StreamCounters>], ts0: u64) {
        self.metrics.set("output_heaps", &[], r.heaps);
        self.metrics.set("output_bytes", &[], r.payload_bytes);
        let cfg = &self.plan.config;
        for (d, c) in counters.iter().enumerate() {
            let end = ts0 + c.batches.load(Ordering::Relaxed) * self.plan.timestamp_step;
            let data_time = cfg.sync_time + end as f64 / cfg.adc_sample_rate;
            if let Ok(g) = self
                .time_error
                .get_metric_with_label_values(&[&d.to_string()])
            {
                g.set(unix_now() - data_time);
            }
        }
    }
}

/// The totals over every destination.
fn summarise(counters: &[Arc<StreamCounters>], ts0: u64, elapsed: Duration) -> FsimReport {
    let sum = |f: fn(&StreamCounters) -> &AtomicU64| {
        counters
            .iter()
            .map(|c| f(c).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    FsimReport {
        batches: counters
            .iter()
            .map(|c| c.batches.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0),
        heaps: sum(|c| &c.heaps),
        payload_bytes: sum(|c| &c.payload_bytes),
        wire_bytes: sum(|c| &c.wire_bytes),
        packets: sum(|c| &c.packets),
        first_timestamp: ts0,
        elapsed,
    }
}

/// One destination's send thread.
struct SendJob {
    plan: FsimPlan,
    pattern: Arc<FsimPattern>,
    dest: usize,
    first_timestamp: u64,
    start: Instant,
    deadline: Option<Instant>,
    /// The user's shutdown and fsim's own stop (another send thread failed).
    shutdown: [Shutdown; 2],
    counters: Arc<StreamCounters>,
}

impl SendJob {
    fn run(self, mut stream: SendStream<NetSender>) -> Result<(), SendError> {
        stream.set_hurry(self.shutdown[0].flag());
        let plan = &self.plan;
        let l = plan.layout;
        let n_ants = l.array_size as u64;
        let step = plan.timestamp_step;
        let period = plan.batch_period();
        // Every heap of the pattern, built once; only their timestamps change.
        let mut heaps: Vec<_> = (0..PATTERN_BATCHES)
            .map(|k| self.pattern.heaps(k, self.dest))
            .collect();
        let descriptors =
            descriptor_heap(l.channels_per_substream, l.spectra_per_heap, l.sample_bits);
        let mut next_descriptors = Instant::now();
        let mut descriptor_cnt = DESCRIPTOR_CNT;
        for j in 0u64.. {
            let now = Instant::now();
            if self.shutdown.iter().any(Shutdown::requested)
                || plan.max_batches.is_some_and(|m| j >= m)
                || self.deadline.is_some_and(|d| now >= d)
            {
                break;
            }
            if now >= next_descriptors {
                let d = HeapRef {
                    heap: &descriptors,
                    cnt: Some(descriptor_cnt),
                    substream: 0,
                    unpaced: true,
                };
                stream.send_heaps_first(&[d], SendMode::RoundRobin)?;
                descriptor_cnt += 1;
                next_descriptors = now + DESCRIPTOR_INTERVAL;
            }
            if let Some(p) = period {
                let stop = || self.shutdown.iter().any(Shutdown::requested);
                if !sleep_until_or(self.start + p.mul_f64(j as f64), stop) {
                    break;
                }
            }
            let timestamp = self.first_timestamp + j * step;
            let batch = &mut heaps[((timestamp / step) % PATTERN_BATCHES as u64) as usize];
            for h in batch.iter_mut() {
                set_timestamp(h, timestamp);
            }
            let refs: Vec<HeapRef> = batch
                .iter()
                .enumerate()
                .filter(|&(f, _)| !plan.is_missing(f, timestamp))
                .map(|(f, heap)| HeapRef {
                    heap,
                    cnt: Some(f as u64 + j * n_ants),
                    substream: 0,
                    unpaced: false,
                })
                .collect();
            stream.send_heaps(&refs, SendMode::RoundRobin)?;
            let c = &self.counters;
            c.heaps.fetch_add(refs.len() as u64, Ordering::Relaxed);
            c.payload_bytes
                .fetch_add((refs.len() * l.heap_bytes()) as u64, Ordering::Relaxed);
            let sc = stream.counters();
            c.wire_bytes.store(sc.bytes, Ordering::Relaxed);
            c.packets.store(sc.packets, Ordering::Relaxed);
            c.batches.store(j + 1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// fsim serves only the standard katcp requests; its settings are sensors.
struct FsimControl;

impl Handler for FsimControl {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![]
    }

    fn handle(&self, _name: &str, _args: &[String]) -> Option<Result<Vec<String>, String>> {
        None
    }
}

/// One sensor per setting, so that saving them reproduces the output.
fn settings_sensors(plan: &FsimPlan) -> Arc<Sensors> {
    let s = Sensors::default();
    let c = &plan.config;
    let int = |name: &str, what: &str, v: u64| s.add(name, what, "", "integer", v);
    int("array-size", "F-engines simulated", c.array_size as u64);
    int("n-chans", "Channels of the whole band", c.channels as u64);
    int(
        "n-chans-per-substream",
        "Channels per destination (X-engine)",
        c.channels_per_substream as u64,
    );
    int(
        "spectra-per-heap",
        "Spectra in each F heap",
        plan.layout.spectra_per_heap as u64,
    );
    int(
        "samples-between-spectra",
        "ADC samples between spectra",
        plan.samples_between_spectra as u64,
    );
    int(
        "sample-bits",
        "Bits per real value",
        u64::from(c.sample_bits),
    );
    s.add(
        "adc-sample-rate",
        "ADC sample rate",
        "Hz",
        "float",
        c.adc_sample_rate,
    );
    s.add(
        "sync-time",
        "UNIX time of timestamp 0",
        "s",
        "float",
        c.sync_time,
    );
    s.add(
        "send-rate-factor",
        "Multiple of the real rate sent at (0 = unpaced)",
        "",
        "float",
        c.send_rate_factor,
    );
    let (payload, seed) = match c.payload {
        Payload::Katgpucbf => ("katgpucbf", String::new()),
        Payload::Random { seed } => ("random", seed.to_string()),
    };
    s.add("payload", "Payload pattern", "", "string", payload);
    s.add("seed", "Seed of the random payload", "", "string", seed);
    let missing: Vec<String> = c.missing_fengines.iter().map(ToString::to_string).collect();
    s.add(
        "missing-fengines",
        "F-engines whose heaps are left out",
        "",
        "string",
        missing.join(","),
    );
    s.add(
        "missing-timestamps",
        "Timestamps [start, end) over which they are left out (empty: always)",
        "",
        "string",
        c.missing_timestamps
            .map_or(String::new(), |(a, b)| format!("{a}:{b}")),
    );
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::control::ControlConfig;
    use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

    fn config(dest: SocketAddrV4) -> FsimConfig {
        FsimConfig {
            array_size: 3,
            channels: 64,
            channels_per_substream: 32,
            samples_between_spectra: None,
            jones_per_batch: 64 * 4,
            adc_sample_rate: 1e6,
            sync_time: unix_now() - 1.0,
            send_rate_factor: 1.0,
            send_packet_payload: 256,
            send_interfaces: vec![],
            send_transport: crate::engine::send::SendTransport::Udp,
            send_ttl: 1,
            max_heaps: None,
            duration: None,
            run_once: false,
            payload: Payload::Katgpucbf,
            sample_bits: 8,
            missing_fengines: vec![],
            missing_timestamps: None,
            dests: vec![dest],
            control: ControlConfig {
                host: Ipv4Addr::LOCALHOST.into(),
                katcp_port: 0,
                prometheus_port: None,
            },
        }
    }

    fn receiver() -> (UdpSocket, SocketAddrV4) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let SocketAddr::V4(a) = rx.local_addr().unwrap() else {
            unreachable!()
        };
        (rx, a)
    }

    #[test]
    fn run_once_sends_one_batch() {
        let (rx, dest) = receiver();
        let mut c = config(dest);
        c.run_once = true;
        let report = Fsim::new(c, Shutdown::manual()).unwrap().run().unwrap();
        assert_eq!((report.batches, report.heaps), (1, 3));
        // 3 heaps of 32 channels × 4 spectra × 4 bytes = 512 bytes: 2 packets of 256 each,
        // with cnts 0, 1, 2 (the first item pointer, HEAP_CNT, 48 bits); the descriptor
        // heap's packets carry cnt 2^47.
        let mut buf = vec![0u8; 65536];
        let mut cnts = vec![];
        while let Ok(n) = rx.recv(&mut buf) {
            let pointer = u64::from_be_bytes(buf[8..16].try_into().unwrap());
            let cnt = pointer & ((1 << 48) - 1);
            if cnt != DESCRIPTOR_CNT {
                assert_eq!(n, 256 + 72);
                cnts.push(cnt);
            }
        }
        cnts.sort_unstable();
        assert_eq!(cnts, [0, 0, 1, 1, 2, 2]);
        assert_eq!(report.payload_bytes, 3 * 512);
    }

    #[test]
    fn shutdown_stops_an_unbounded_run() {
        let (_rx, dest) = receiver();
        let shutdown = Shutdown::manual();
        let fsim = Fsim::new(config(dest), shutdown.clone()).unwrap();
        let t = std::thread::spawn(move || fsim.run());
        std::thread::sleep(Duration::from_millis(300));
        shutdown.request();
        let report = t.join().unwrap().unwrap();
        // Paced at the real rate: 1e6 / 512 batches per second, so about 590 in 0.3 s.
        assert!(report.batches > 100 && report.batches < 2000, "{report:?}");
    }
}
