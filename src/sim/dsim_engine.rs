//! The digitiser simulator as a library type (katgpucbf dsim, facts §1.5): built from a
//! validated [`DsimConfig`], it renders the `--signals` pattern once, opens its sockets and its
//! katcp and Prometheus servers, then [`Dsim::run`] replays the pattern as digitiser heaps,
//! paced at the ADC rate × `--send-rate-factor`, one destination list per polarisation (heaps
//! of a polarisation go round-robin over its list), descriptors every 5 s, until a limit or
//! shutdown. A test can run it in-process.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::dsim::DigitiserHeaps;
use super::dsim_config::{DsimConfig, DsimPlan};
use super::dsim_control::{DsimControl, SignalChange};
use crate::control::katcp::Sensors;
use crate::engine::control::ControlAddrs;
use crate::engine::metrics::Metrics;
use crate::engine::{unix_now, ConfigError, EngineError, Shutdown};
use crate::net::udp::UdpSender;
use crate::net::PacketSender;
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream};

/// Interval between descriptor heaps (katgpucbf `DESCRIPTOR_INTERVAL`).
pub const DESCRIPTOR_INTERVAL: Duration = Duration::from_secs(5);

/// What a dsim run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct DsimReport {
    /// Data heaps, all polarisations together.
    pub heaps: u64,
    pub packets: u64,
    pub bytes: u64,
    pub first_timestamp: u64,
    pub elapsed: Duration,
}

/// A running digitiser simulator.
pub struct Dsim {
    plan: DsimPlan,
    heaps: Arc<DigitiserHeaps>,
    stream: SendStream<UdpSender>,
    changes: Receiver<SignalChange>,
    addrs: ControlAddrs,
    metrics: DsimMetrics,
    shutdown: Shutdown,
}

impl Dsim {
    /// Validate `config`, render the pattern and start the sockets and control servers.
    pub fn new(config: DsimConfig, shutdown: Shutdown) -> Result<Dsim, EngineError> {
        let plan = config.validate()?;
        tracing::info!(
            signals = %plan.signals.iter().map(ToString::to_string).collect::<String>(),
            dither_seed = plan.config.dither_seed,
            period = plan.config.period,
            "rendering the signal pattern"
        );
        let heaps = Arc::new(DigitiserHeaps::new(plan.config.clone(), &plan.signals));
        let senders = open_senders(&plan, &config.interfaces, config.ttl, config.send_buffer)?;
        let mut stream = SendStream::new(plan.send_config(), senders)
            .map_err(|e| EngineError::Send(e.to_string()))?;
        stream.set_hurry(shutdown.flag());
        let (changes_tx, changes) = crossbeam_channel::bounded(1);
        let sensors = Arc::new(Sensors::default());
        let control = Arc::new(DsimControl::new(
            &plan,
            &config.signals,
            Arc::clone(&sensors),
            changes_tx,
        ));
        let metrics = DsimMetrics::new().map_err(|e| EngineError::Backend(e.to_string()))?;
        let addrs = crate::engine::control::serve(
            config.control,
            "cbf-dsim",
            sensors,
            control,
            metrics.metrics.registry.clone(),
            &shutdown,
            vec![],
        )?;
        Ok(Dsim {
            plan,
            heaps,
            stream,
            changes,
            addrs,
            metrics,
            shutdown,
        })
    }

    pub fn plan(&self) -> &DsimPlan {
        &self.plan
    }

    pub fn katcp_addr(&self) -> SocketAddr {
        self.addrs.katcp
    }

    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.addrs.prometheus
    }

    /// Send from the next heap boundary until `--max-heaps`, `--duration` or shutdown; logs
    /// progress and refreshes the metrics about once a second.
    pub fn run(mut self) -> Result<DsimReport, EngineError> {
        let ts0 = self.plan.start_timestamp();
        tracing::info!(
            first_timestamp = ts0,
            rate_gbps = self.plan.rate() * 8e-9,
            "sending"
        );
        let (plan, metrics) = (&self.plan, &self.metrics);
        let report = send_loop(
            plan,
            Arc::clone(&self.heaps),
            Some(&self.changes),
            &mut self.stream,
            ts0,
            &self.shutdown,
            |r| {
                let gbps = r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64() / 1e9;
                let time_error = metrics.update(plan, r);
                tracing::info!(
                    heaps = r.heaps,
                    gbps = format!("{gbps:.3}"),
                    time_error_s = format!("{time_error:.4}"),
                    "progress"
                );
            },
        )?;
        self.metrics.update(&self.plan, &report);
        Ok(report)
    }
}

/// Send digitiser heaps until a limit or shutdown. `progress` is called about once a second.
pub fn send_loop<S: PacketSender>(
    plan: &DsimPlan,
    mut heaps: Arc<DigitiserHeaps>,
    changes: Option<&Receiver<SignalChange>>,
    stream: &mut SendStream<S>,
    start_timestamp: u64,
    shutdown: &Shutdown,
    mut progress: impl FnMut(&DsimReport),
) -> Result<DsimReport, EngineError> {
    const STEPS_PER_CALL: usize = 8;
    let n_pols = plan.dests.len();
    let offsets: Vec<usize> = plan
        .dests
        .iter()
        .scan(0, |acc, d| {
            let o = *acc;
            *acc += d.len();
            Some(o)
        })
        .collect();
    let hs = plan.config.heap_samples as u64;
    let start = Instant::now();
    let mut last_progress = start;
    let mut last_descriptors: Option<Instant> = None;
    let mut descriptor_cnt = 1u64;
    let descriptor_heap = heaps.descriptor_heap();
    let mut report = DsimReport {
        first_timestamp: start_timestamp,
        ..Default::default()
    };
    let mut step = 0u64;
    let send_err = |e: crate::spead::send::stream::SendError| EngineError::Send(e.to_string());
    loop {
        let now = Instant::now();
        if shutdown.requested()
            || plan.max_heaps.is_some_and(|m| step >= m)
            || plan.duration.is_some_and(|d| now - start >= d)
        {
            break;
        }
        if last_descriptors.is_none_or(|t| now - t >= DESCRIPTOR_INTERVAL) {
            descriptor_cnt =
                to_every_destination(stream, &descriptor_heap, descriptor_cnt).map_err(send_err)?;
            last_descriptors = Some(now);
        }
        if let Some(change) = changes.and_then(|c| c.try_recv().ok()) {
            heaps = change.heaps;
            let _ = change.started.send(start_timestamp + step * hs);
        }
        let steps = plan.max_heaps.map_or(STEPS_PER_CALL as u64, |m| {
            (m - step).min(STEPS_PER_CALL as u64)
        });
        // Grouped by destination (polarisation, then its destinations in turn) so that the
        // packets of one destination are adjacent and the UDP sender can hand them to the
        // kernel as one GSO message. Receivers place heaps by timestamp; the polarisations get
        // at most STEPS_PER_CALL heaps (32768 samples at 4096 per heap) out of step, well
        // inside a receiver's chunk window.
        let mut batch: Vec<(Heap<'_>, usize)> = Vec::with_capacity(steps as usize * n_pols);
        for (p, dests) in plan.dests.iter().enumerate() {
            let n_dest = dests.len() as u64;
            for d in 0..n_dest {
                for s in (step..step + steps).filter(|s| s % n_dest == d) {
                    batch.push((
                        heaps.heap(p, start_timestamp + s * hs),
                        offsets[p] + d as usize,
                    ));
                }
            }
        }
        let refs: Vec<HeapRef> = batch.iter().map(|(h, d)| HeapRef::new(h, *d)).collect();
        stream
            .send_heaps(&refs, SendMode::Serial)
            .map_err(send_err)?;
        step += steps;
        report.heaps = step * n_pols as u64;
        if now - last_progress >= Duration::from_secs(1) {
            let c = stream.counters();
            report.packets = c.packets;
            report.bytes = c.bytes;
            report.elapsed = now - start;
            progress(&report);
            last_progress = now;
        }
    }
    if plan.send_stop {
        let mut stop = Heap::new();
        stop.add_end();
        to_every_destination(stream, &stop, descriptor_cnt).map_err(send_err)?;
    }
    let c = stream.counters();
    report.packets = c.packets;
    report.bytes = c.bytes;
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Send `heap` once to every destination, unpaced, on the first interface, each copy with its
/// own odd cnt from `first_cnt` (a receiver joined to several destinations must see distinct
/// heaps); returns the next free cnt.
fn to_every_destination<S: PacketSender>(
    stream: &mut SendStream<S>,
    heap: &Heap<'_>,
    first_cnt: u64,
) -> Result<u64, crate::spead::send::stream::SendError> {
    let refs: Vec<HeapRef> = (0..stream.destinations())
        .map(|d| HeapRef {
            heap,
            cnt: Some(first_cnt + 2 * d as u64),
            substream: d,
            unpaced: true,
        })
        .collect();
    stream.send_heaps_first(&refs, SendMode::RoundRobin)?;
    Ok(first_cnt + 2 * refs.len() as u64)
}

/// dsim's Prometheus metrics, with katgpucbf's names (facts §1.8).
struct DsimMetrics {
    metrics: Metrics,
    time_error: prometheus::Gauge,
}

impl DsimMetrics {
    fn new() -> Result<DsimMetrics, prometheus::Error> {
        let metrics = Metrics::new(
            "dsim",
            &[
                ("output_heaps", "Heaps sent", &[]),
                ("output_bytes", "Bytes sent, headers included", &[]),
            ],
        )?;
        let time_error = prometheus::Gauge::new(
            "time_error_s",
            "Wall-clock time minus the time of the data being sent",
        )?;
        metrics.registry.register(Box::new(time_error.clone()))?;
        Ok(DsimMetrics {
            metrics,
            time_error,
        })
    }

    /// Bring the metrics up to `r`; returns the time error in seconds (positive: behind).
    fn update(&self, plan: &DsimPlan, r: &DsimReport) -> f64 {
        self.metrics.set("output_heaps", &[], r.heaps);
        self.metrics.set("output_bytes", &[], r.bytes);
        let per_pol = r.heaps / plan.dests.len() as u64;
        let data_time = plan.sync_time
            + (r.first_timestamp + per_pol * plan.config.heap_samples as u64) as f64
                / plan.config.adc_sample_rate;
        let error = unix_now() - data_time;
        self.time_error.set(error);
        error
    }
}

/// Open one UDP sender per interface (or one on the default route), each knowing every
/// destination. dsim keeps its own socket set-up rather than `engine::send::StreamSpec`
/// because its flags are katgpucbf dsim's unprefixed `--interface`/`--ttl`/`--send-buffer`.
pub fn open_senders(
    plan: &DsimPlan,
    interfaces: &[String],
    ttl: u32,
    buffer: usize,
) -> Result<Vec<UdpSender>, ConfigError> {
    let all: Vec<SocketAddrV4> = plan.dests.iter().flatten().copied().collect();
    if interfaces.is_empty() {
        return Ok(vec![
            UdpSender::new(&all, None, ttl, buffer).map_err(|e| ConfigError::new("dest", e))?
        ]);
    }
    interfaces
        .iter()
        .map(|i| {
            UdpSender::new(&all, Some(i), ttl, buffer)
                .map_err(|e| ConfigError::new("--interface", e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::control::ControlConfig;
    use std::net::{Ipv4Addr, UdpSocket};

    fn config(dest: SocketAddrV4) -> DsimConfig {
        DsimConfig {
            adc_sample_rate: 1e6,
            sample_bits: 8,
            heap_samples: 4096,
            signals: "0.5;".into(),
            sync_time: unix_now() - 1.0,
            first_id: 0,
            dither_seed: 1,
            period: None,
            max_period: 8192,
            max_heaps: None,
            duration: None,
            send_rate_factor: 1.0,
            interfaces: vec![],
            ttl: 1,
            send_buffer: 1 << 20,
            send_stop: false,
            dests: vec![vec![dest], vec![dest]],
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
    fn max_heaps_stops_it_with_exactly_that_many_heaps_per_pol() {
        let (rx, dest) = receiver();
        let mut c = config(dest);
        c.max_heaps = Some(5);
        c.send_rate_factor = 0.0;
        let dsim = Dsim::new(c, Shutdown::manual()).unwrap();
        assert_ne!(dsim.katcp_addr().port(), 0);
        let report = dsim.run().unwrap();
        assert_eq!(report.heaps, 10);
        // Every datagram is one heap: 2 descriptor heaps and 10 data heaps of 4096 + 72 bytes.
        let mut buf = vec![0u8; 65536];
        let mut sizes = vec![];
        while let Ok(n) = rx.recv(&mut buf) {
            sizes.push(n);
        }
        assert_eq!(sizes.iter().filter(|&&n| n == 4096 + 72).count(), 10);
        assert_eq!(sizes.len(), 12, "{sizes:?}");
    }

    #[test]
    fn shutdown_stops_an_unbounded_run() {
        let (_rx, dest) = receiver();
        let shutdown = Shutdown::manual();
        let dsim = Dsim::new(config(dest), shutdown.clone()).unwrap();
        let t = std::thread::spawn(move || dsim.run());
        std::thread::sleep(Duration::from_millis(300));
        shutdown.request();
        let report = t.join().unwrap().unwrap();
        assert!(report.heaps > 0);
    }

    #[test]
    fn a_taken_katcp_port_is_a_config_error_naming_the_flag() {
        let (_rx, dest) = receiver();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = config(dest);
        c.control.katcp_port = taken.local_addr().unwrap().port();
        match Dsim::new(c, Shutdown::manual()) {
            Err(EngineError::Config(e)) => assert_eq!(e.flag, "--katcp-port"),
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("bound a taken port"),
        }
    }
}
