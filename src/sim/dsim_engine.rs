//! The digitiser simulator as a library type (katgpucbf dsim, facts §1.5): built from a
//! validated [`DsimConfig`], it renders the `--signals` pattern once, opens its sockets and its
//! katcp and Prometheus servers, then [`Dsim::run`] replays the pattern as digitiser heaps,
//! paced at the ADC rate × `--send-rate-factor` on `--send-threads` threads
//! ([`super::dsim_send`]), one destination list per polarisation (heaps of a polarisation go
//! round-robin over its list), descriptors every 5 s, until a limit or shutdown. A test can run it in-process.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use super::dsim::DigitiserHeaps;
use super::dsim_config::{DsimConfig, DsimPlan};
use super::dsim_control::{DsimControl, SignalChange};
use super::dsim_send::send_loop;
use crate::control::katcp::Sensors;
use crate::engine::control::ControlAddrs;
use crate::engine::metrics::Metrics;
use crate::engine::{unix_now, ConfigError, EngineError, Shutdown};
use crate::net::NetSender;
use crate::spead::send::SendStream;

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
    /// One per send thread.
    streams: Vec<SendStream<NetSender>>,
    changes: Receiver<SignalChange>,
    addrs: ControlAddrs,
    metrics: DsimMetrics,
    shutdown: Shutdown,
}

impl Dsim {
    /// Validate `config`, render the pattern and start the sockets and control servers.
    pub fn new(config: DsimConfig, shutdown: Shutdown) -> Result<Dsim, EngineError> {
        let plan = config.validate()?;
        // The senders first: a transport refused at start-up (a DPDK flag, an interface) is
        // reported before seconds of rendering a long pattern. A DPDK port starts with a TX
        // queue per send thread.
        config.send_transport.plan(
            &config.interfaces,
            plan.send_cores.len(),
            crate::engine::send::SendFlags::DSIM,
            Some("--send-threads"),
        )?;
        let streams = (0..plan.send_cores.len())
            .map(|t| {
                let senders = open_senders(&plan, &config)?;
                let mut stream = SendStream::new(plan.send_config(t), senders)
                    .map_err(|e| EngineError::Send(e.to_string()))?;
                stream.set_hurry(shutdown.flag());
                Ok(stream)
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        tracing::info!(
            signals = %plan.signals.iter().map(ToString::to_string).collect::<String>(),
            dither_seed = plan.config.dither_seed,
            period = plan.config.period,
            "rendering the signal pattern"
        );
        let heaps = Arc::new(DigitiserHeaps::new(plan.config.clone(), &plan.signals));
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
            streams,
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
            threads = self.streams.len(),
            "sending"
        );
        let (plan, metrics) = (&self.plan, &self.metrics);
        let report = send_loop(
            plan,
            Arc::clone(&self.heaps),
            Some(&self.changes),
            &mut self.streams,
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

/// Open one sender per interface (or one on the default route), each knowing every
/// destination. dsim opens its senders itself rather than through `engine::send::StreamSpec`
/// because its flags are katgpucbf dsim's unprefixed `--interface`/`--ttl`/`--send-buffer`/
/// `--ibv`.
pub fn open_senders(plan: &DsimPlan, config: &DsimConfig) -> Result<Vec<NetSender>, ConfigError> {
    let all: Vec<SocketAddrV4> = plan.dests.iter().flatten().copied().collect();
    crate::engine::send::open_senders(
        &all,
        &config.interfaces,
        config.ttl,
        config.send_buffer,
        plan.send_config(0).max_packet_size,
        &config.send_transport,
        crate::engine::send::SendFlags::DSIM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::control::ControlConfig;
    use crate::sim::dsim_send::GROUP_STEPS;
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
            send_transport: crate::engine::send::SendTransport::Udp,
            send_stop: false,
            send_threads: None,
            affinity: vec![],
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

    /// Three paced send threads together send every (polarisation, timestamp) heap of the
    /// run exactly once, with distinct even heap counters, the pattern's samples, and no
    /// heap more than a couple of groups out of timestamp order (10-bit heaps, whose group
    /// is larger than the default burst, as a MeerKAT digitiser's are).
    #[test]
    fn send_threads_share_the_heaps_exactly_once() {
        use crate::net::udp::UdpReceiver;
        use crate::net::{PacketReceiver, Received, RecvBatch};
        use crate::spead::items::{ItemValue, ADC_SAMPLES_ID, DIGITISER_ID_ID, TIMESTAMP_ID};
        use crate::spead::recv::{HeapStream, HeapStreamConfig};
        // A buffer that holds the whole run (200 heaps of 5 KiB), so the reader may be late.
        let mut rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 16 << 20).unwrap();
        let mut c = config(rx.local_addr().unwrap());
        c.sample_bits = 10;
        // One group of 8 heaps lasts 16 ms: far above a loaded machine's scheduling jitter.
        c.adc_sample_rate = 2e6;
        c.max_heaps = Some(100);
        c.send_threads = Some(3);
        c.send_stop = true;
        let dsim = Dsim::new(c, Shutdown::manual()).unwrap();
        let want: Vec<u8> = dsim.heaps.patterns[1].packed[5120..10240].to_vec();
        let reader = std::thread::spawn(move || {
            let mut batch = RecvBatch::new(64, rx.slot_size(9200));
            let mut stream = HeapStream::new(HeapStreamConfig::default());
            let mut heaps = vec![];
            // Until the stop heap (or a generous deadline, for a test that must end).
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !stream.is_stopped() && std::time::Instant::now() < deadline {
                if let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
                    for p in batch.iter() {
                        stream.add_packet(p, &mut heaps);
                    }
                }
            }
            heaps
        });
        let report = dsim.run().unwrap();
        assert_eq!(report.heaps, 200);
        let heaps = reader.join().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let mut cnts = std::collections::BTreeSet::new();
        let mut order = vec![];
        for h in &heaps {
            let (Some(ItemValue::Immediate(ts)), Some(ItemValue::Immediate(id))) =
                (h.item(TIMESTAMP_ID), h.item(DIGITISER_ID_ID))
            else {
                continue;
            };
            assert!(seen.insert((id, ts)), "({id}, {ts}) twice");
            assert!(h.cnt % 2 == 0 && cnts.insert(h.cnt), "cnt {}", h.cnt);
            if id == 1 && (ts / 4096) % 2 == 1 {
                assert_eq!(h.item(ADC_SAMPLES_ID), Some(ItemValue::Bytes(&want)));
            }
            order.push(ts);
        }
        assert_eq!(seen.len(), 200, "{} heaps received", heaps.len());
        let first = order.iter().min().unwrap();
        let expected: std::collections::BTreeSet<_> = (0..2u64)
            .flat_map(|p| (0..100).map(move |k| (p, first + k * 4096)))
            .collect();
        assert_eq!(seen, expected);
        // Thread t starts t groups late and sends a group as one burst, so arrivals stay
        // within two groups of sorted order (one burst per group of 16 heaps of 5192 bytes,
        // above the default 64 KiB burst).
        let mut sorted = order.clone();
        sorted.sort_unstable();
        let out_of_order = order
            .iter()
            .zip(&sorted)
            .map(|(a, b)| a.abs_diff(*b) / 4096)
            .max()
            .unwrap();
        assert!(
            out_of_order <= 2 * GROUP_STEPS,
            "{out_of_order} heaps out of order"
        );
        // Descriptors and the stop heaps carry the odd counters.
        assert!(heaps.iter().filter(|h| h.cnt % 2 == 1).count() >= 2);
    }

    /// `?signals` from outside: a pattern whose render cost is over the bound fails at once
    /// (it rendered for hours on every core), and a second request while one renders fails
    /// instead of rendering beside it.
    #[test]
    fn signals_requests_are_bounded_and_one_at_a_time() {
        use crate::control::katcp::Handler;
        use crate::sim::dsim_control::DsimControl;
        let (_rx, dest) = receiver();
        let mut c = config(dest);
        c.max_period = 1 << 27;
        let plan = c.validate().unwrap();
        let (tx, changes) = crossbeam_channel::bounded(1);
        let control = DsimControl::new(&plan, "0.5;", Arc::new(Sensors::default()), tx);
        let ask = |text: &str| {
            control
                .handle("signals", &[text.to_string(), (1usize << 27).to_string()])
                .unwrap()
        };
        let t0 = std::time::Instant::now();
        let err = ask("multicw(4096, 0.001, 0, 1e6, 1e3);").unwrap_err();
        assert!(err.contains("render cost"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let held = control.render.lock().unwrap();
        let err = ask("0.25;").unwrap_err();
        assert!(err.contains("another ?signals"), "{err}");
        drop(held);
        assert!(changes.is_empty(), "nothing reached the sender");
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
