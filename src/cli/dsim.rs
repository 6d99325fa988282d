//! `cbf dsim`: the digitiser simulator and soak-test packet generator (katgpucbf's dsim,
//! facts §1.5): renders the `--signals` pattern once, then replays it as digitiser heaps,
//! paced at the ADC rate × `--send-rate-factor`, one destination list per polarisation
//! (heaps of a polarisation go round-robin over its list), descriptors every 5 s.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use crossbeam_channel::{Receiver, Sender};

use super::CliError;
use crate::control::katcp::{self, Handler, Sensors, Status};
use crate::dsp::samples::valid_sample_bits;
use crate::engine::Shutdown;
use crate::net::udp::UdpSender;
use crate::net::{parse_endpoints, PacketSender};
use crate::sim::dsim::{DigitiserConfig, DigitiserHeaps};
use crate::sim::signal::{self, Signal};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};
use crate::spead::Flavour;

/// Interval between descriptor heaps (katgpucbf `DESCRIPTOR_INTERVAL`).
pub const DESCRIPTOR_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Args)]
pub struct DsimArgs {
    /// ADC sample rate in Hz.
    #[arg(long)]
    pub adc_sample_rate: f64,
    /// Bits per sample: 2–10, 12 or 16.
    #[arg(long, default_value_t = 10)]
    pub sample_bits: u32,
    /// Samples per heap.
    #[arg(long, default_value_t = 4096)]
    pub heap_samples: usize,
    /// Signal program: one `;`-terminated expression per polarisation (or one for all).
    #[arg(long, default_value = "cw(1.0, 232101234.0);")]
    pub signals: String,
    /// UNIX time of timestamp 0 [default: now].
    #[arg(long)]
    pub sync_time: Option<f64>,
    /// digitiser_id of the first polarisation (polarisation p sends first-id + p).
    #[arg(long, default_value_t = 0)]
    pub first_id: u64,
    /// Seed of the LSB dither [default: random].
    #[arg(long)]
    pub dither_seed: Option<u64>,
    /// Samples in the replayed pattern (a multiple of --heap-samples) [default: --max-period].
    #[arg(long)]
    pub period: Option<usize>,
    /// Largest pattern `?signals` may ask for, in samples.
    #[arg(long, default_value_t = 1 << 27)]
    pub max_period: usize,
    /// Stop after this many heaps per polarisation.
    #[arg(long)]
    pub max_heaps: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Send at this multiple of the ADC rate (0 = as fast as possible).
    #[arg(long, default_value_t = 1.0)]
    pub send_rate_factor: f64,
    /// Sending interfaces (names or addresses, comma-separated); heaps go to the least loaded.
    #[arg(long, value_delimiter = ',')]
    pub interface: Vec<String>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 4)]
    pub ttl: u32,
    /// Socket send buffer in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub send_buffer: usize,
    /// Send a stop heap to every destination when done.
    #[arg(long)]
    pub send_stop: bool,
    /// katcp port (`?signals`, `?time`, sensors); 0 picks a free one.
    #[arg(long, default_value_t = 7147)]
    pub katcp_port: u16,
    /// Address the katcp server listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub katcp_host: std::net::IpAddr,
    /// Serve Prometheus metrics (`dsim_output_heaps`, `dsim_output_bytes`,
    /// `dsim_time_error_s`) at http://HOST:PORT/metrics.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    /// One destination list per polarisation: A.B.C.D[+N]:port[,...].
    #[arg(required = true)]
    pub dest: Vec<String>,
}

/// Everything `dsim` needs, validated.
#[derive(Debug, Clone)]
pub struct DsimPlan {
    pub config: DigitiserConfig,
    pub signals: Vec<Signal>,
    /// Destination lists, one per polarisation.
    pub dests: Vec<Vec<SocketAddrV4>>,
    pub sync_time: f64,
    pub max_period: usize,
    pub rate_factor: f64,
    pub max_heaps: Option<u64>,
    pub duration: Option<Duration>,
    pub send_stop: bool,
}

impl DsimArgs {
    /// Check every flag; errors name the flag.
    pub fn plan(&self) -> Result<DsimPlan, CliError> {
        if !(self.adc_sample_rate.is_finite() && self.adc_sample_rate > 0.0) {
            return Err(CliError::flag(
                "--adc-sample-rate",
                "must be a positive number of Hz",
            ));
        }
        if !valid_sample_bits(self.sample_bits) {
            return Err(CliError::flag(
                "--sample-bits",
                format!("{} is not one of 2–10, 12, 16", self.sample_bits),
            ));
        }
        if self.heap_samples == 0 || self.heap_samples % 8 != 0 {
            return Err(CliError::flag(
                "--heap-samples",
                "must be a positive multiple of 8",
            ));
        }
        if self.heap_samples * self.sample_bits as usize / 8 + 72 > 65507 {
            return Err(CliError::flag(
                "--heap-samples",
                "heap does not fit in one UDP datagram",
            ));
        }
        if self.max_period == 0 || self.max_period % self.heap_samples != 0 {
            return Err(CliError::flag(
                "--max-period",
                format!(
                    "must be a positive multiple of --heap-samples ({})",
                    self.heap_samples
                ),
            ));
        }
        let period = self.period.unwrap_or(self.max_period);
        if let Err(e) = check_period(period, self.heap_samples, self.max_period) {
            return Err(CliError::flag("--period", e));
        }
        if !(self.send_rate_factor.is_finite() && self.send_rate_factor >= 0.0) {
            return Err(CliError::flag("--send-rate-factor", "must be ≥ 0"));
        }
        if let Some(d) = self.duration {
            if !(d.is_finite() && d >= 0.0) {
                return Err(CliError::flag(
                    "--duration",
                    "must be a non-negative number of seconds",
                ));
            }
        }
        let dests = self
            .dest
            .iter()
            .map(|d| parse_endpoints(d).map_err(|e| CliError::flag("dest", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut seeds = rand::random::<u64>;
        let signals = signal::parse(&self.signals, dests.len(), &mut seeds)
            .map_err(|e| CliError::flag("--signals", e))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let sync_time = self.sync_time.unwrap_or(now);
        if sync_time > now {
            return Err(CliError::flag("--sync-time", "is in the future"));
        }
        Ok(DsimPlan {
            config: DigitiserConfig {
                adc_sample_rate: self.adc_sample_rate,
                sample_bits: self.sample_bits,
                heap_samples: self.heap_samples,
                period,
                first_id: self.first_id,
                dither_seed: self.dither_seed.unwrap_or_else(rand::random),
            },
            signals,
            dests,
            sync_time,
            max_period: self.max_period,
            rate_factor: self.send_rate_factor,
            max_heaps: self.max_heaps,
            duration: self.duration.map(Duration::from_secs_f64),
            send_stop: self.send_stop,
        })
    }
}

fn check_period(period: usize, heap_samples: usize, max_period: usize) -> Result<(), String> {
    if period == 0 || period % heap_samples != 0 {
        return Err(format!(
            "period {period} is not a positive multiple of the heap size ({heap_samples})"
        ));
    }
    if period > max_period {
        return Err(format!(
            "period {period} exceeds the maximum period ({max_period})"
        ));
    }
    Ok(())
}

/// A new pattern from `?signals`, and where to report the timestamp it starts at.
pub struct SignalChange {
    pub heaps: Arc<DigitiserHeaps>,
    pub started: Sender<u64>,
}

/// dsim's katcp requests (katgpucbf dsim: `?signals spec [period]`, `?time`) and sensors.
pub struct DsimControl {
    plan: DsimPlan,
    sensors: Arc<Sensors>,
    changes: Sender<SignalChange>,
}

impl DsimControl {
    /// Register the sensors that describe the output (saving them reproduces it exactly).
    pub fn new(
        plan: &DsimPlan,
        signals_orig: &str,
        sensors: Arc<Sensors>,
        changes: Sender<SignalChange>,
    ) -> DsimControl {
        let c = &plan.config;
        let canonical: String = plan.signals.iter().map(ToString::to_string).collect();
        sensors.add(
            "signals",
            "Signal program, canonical (with every seed)",
            "",
            "string",
            canonical,
        );
        sensors.add(
            "signals-orig",
            "Signal program as given",
            "",
            "string",
            signals_orig,
        );
        sensors.add(
            "period",
            "Samples in the replayed pattern",
            "samples",
            "integer",
            c.period,
        );
        sensors.add(
            "max-period",
            "Largest period ?signals accepts",
            "samples",
            "integer",
            plan.max_period,
        );
        sensors.add(
            "dither-seed",
            "Seed of the LSB dither",
            "",
            "integer",
            c.dither_seed,
        );
        sensors.add(
            "adc-sample-rate",
            "ADC sample rate",
            "Hz",
            "float",
            c.adc_sample_rate,
        );
        sensors.add(
            "sample-bits",
            "Bits per sample",
            "",
            "integer",
            c.sample_bits,
        );
        sensors.add(
            "sync-time",
            "UNIX time of timestamp 0",
            "s",
            "float",
            plan.sync_time,
        );
        DsimControl {
            plan: plan.clone(),
            sensors,
            changes,
        }
    }

    fn signals(&self, args: &[String]) -> Result<Vec<String>, String> {
        let (text, period) = match args {
            [t] => (t, self.plan.config.period),
            [t, p] => (
                t,
                p.parse::<usize>()
                    .map_err(|_| format!("period {p:?} is not an integer"))?,
            ),
            _ => return Err("usage: ?signals spec [period]".into()),
        };
        check_period(period, self.plan.config.heap_samples, self.plan.max_period)?;
        let signals = signal::parse(text, self.plan.dests.len(), &mut rand::random::<u64>)
            .map_err(|e| e.to_string())?;
        let config = DigitiserConfig {
            period,
            ..self.plan.config.clone()
        };
        let heaps = Arc::new(DigitiserHeaps::new(config, &signals));
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.changes
            .send(SignalChange { heaps, started: tx })
            .map_err(|_| "dsim is shutting down".to_string())?;
        let ts = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "the sender did not take the new signal".to_string())?;
        self.sensors.set(
            "signals",
            signals.iter().map(ToString::to_string).collect::<String>(),
            Status::Nominal,
        );
        self.sensors.set("signals-orig", text, Status::Nominal);
        self.sensors.set("period", period, Status::Nominal);
        Ok(vec![ts.to_string()])
    }
}

impl Handler for DsimControl {
    fn requests(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("signals", "Change the signals: ?signals spec [period]; replies with the first timestamp sent with them"),
            ("time", "The current UNIX time"),
        ]
    }

    fn handle(&self, name: &str, args: &[String]) -> Option<Result<Vec<String>, String>> {
        match name {
            "signals" => Some(self.signals(args)),
            "time" => Some(Ok(vec![format!(
                "{:.6}",
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64()
            )])),
            _ => None,
        }
    }
}

/// What a dsim run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct DsimReport {
    pub heaps: u64,
    pub packets: u64,
    pub bytes: u64,
    pub first_timestamp: u64,
    pub elapsed: Duration,
}

impl DsimPlan {
    /// Bytes per second on the wire at the configured rate factor (0 = unlimited).
    pub fn rate(&self) -> f64 {
        let heaps_per_s =
            self.config.adc_sample_rate / self.config.heap_samples as f64 * self.dests.len() as f64;
        heaps_per_s * self.config.packet_bytes() as f64 * self.rate_factor
    }

    /// The first timestamp: the next heap boundary at or after now.
    pub fn start_timestamp(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let samples = ((now - self.sync_time).max(0.0) * self.config.adc_sample_rate).ceil() as u64;
        let hs = self.config.heap_samples as u64;
        samples.div_ceil(hs) * hs
    }

    pub fn send_config(&self) -> SendStreamConfig {
        SendStreamConfig {
            flavour: Flavour::SPEAD_64_48,
            max_packet_size: self.config.packet_bytes().max(1472),
            rate: self.rate(),
            cnt_first: 2,
            cnt_step: 2,
            ..Default::default()
        }
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
) -> Result<DsimReport, CliError> {
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
    let send_err = |e| CliError::Run(format!("send failed: {e}"));
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
    registry: prometheus::Registry,
    heaps: prometheus::IntCounter,
    bytes: prometheus::IntCounter,
    time_error: prometheus::Gauge,
}

impl DsimMetrics {
    fn new() -> Result<DsimMetrics, CliError> {
        let err = |e: prometheus::Error| CliError::Run(format!("metrics: {e}"));
        let registry = prometheus::Registry::new_custom(Some("dsim".into()), None).map_err(err)?;
        let heaps = prometheus::IntCounter::new("output_heaps", "Heaps sent").map_err(err)?;
        let bytes = prometheus::IntCounter::new("output_bytes", "Bytes sent, headers included")
            .map_err(err)?;
        let time_error = prometheus::Gauge::new(
            "time_error_s",
            "Wall-clock time minus the time of the data being sent",
        )
        .map_err(err)?;
        for m in [
            Box::new(heaps.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(bytes.clone()),
            Box::new(time_error.clone()),
        ] {
            registry.register(m).map_err(err)?;
        }
        Ok(DsimMetrics {
            registry,
            heaps,
            bytes,
            time_error,
        })
    }

    /// Bring the metrics up to `r`; returns the time error in seconds (positive: behind).
    fn update(&self, plan: &DsimPlan, r: &DsimReport) -> f64 {
        self.heaps.inc_by(r.heaps.saturating_sub(self.heaps.get()));
        self.bytes.inc_by(r.bytes.saturating_sub(self.bytes.get()));
        let per_pol = r.heaps / plan.dests.len() as u64;
        let data_time = plan.sync_time
            + (r.first_timestamp + per_pol * plan.config.heap_samples as u64) as f64
                / plan.config.adc_sample_rate;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.time_error.set(now - data_time);
        now - data_time
    }
}

/// Open one UDP sender per interface (or one on the default route), each knowing every destination.
pub fn open_senders(
    plan: &DsimPlan,
    interfaces: &[String],
    ttl: u32,
    buffer: usize,
) -> Result<Vec<UdpSender>, CliError> {
    let all: Vec<SocketAddrV4> = plan.dests.iter().flatten().copied().collect();
    if interfaces.is_empty() {
        return Ok(vec![
            UdpSender::new(&all, None, ttl, buffer).map_err(|e| CliError::flag("dest", e))?
        ]);
    }
    interfaces
        .iter()
        .map(|i| {
            UdpSender::new(&all, Some(i), ttl, buffer).map_err(|e| CliError::flag("--interface", e))
        })
        .collect()
}

pub fn run(args: DsimArgs) -> Result<(), CliError> {
    let plan = args.plan()?;
    let shutdown = Shutdown::install();
    tracing::info!(
        signals = %plan.signals.iter().map(ToString::to_string).collect::<String>(),
        dither_seed = plan.config.dither_seed,
        period = plan.config.period,
        "rendering the signal pattern"
    );
    let heaps = Arc::new(DigitiserHeaps::new(plan.config.clone(), &plan.signals));
    let senders = open_senders(&plan, &args.interface, args.ttl, args.send_buffer)?;
    let (changes_tx, changes_rx) = crossbeam_channel::bounded(1);
    let sensors = Arc::new(Sensors::default());
    let control = Arc::new(DsimControl::new(
        &plan,
        &args.signals,
        Arc::clone(&sensors),
        changes_tx,
    ));
    let katcp_addr = katcp::serve(
        SocketAddr::new(args.katcp_host, args.katcp_port),
        sensors,
        control,
        "cbf-dsim",
    )
    .map_err(|e| CliError::flag("--katcp-port", e))?;
    tracing::info!(%katcp_addr, "katcp server listening");
    let mut stream =
        SendStream::new(plan.send_config(), senders).map_err(|e| CliError::Run(e.to_string()))?;
    let ts0 = plan.start_timestamp();
    tracing::info!(
        first_timestamp = ts0,
        rate_gbps = plan.rate() * 8e-9,
        "sending"
    );
    let metrics = DsimMetrics::new()?;
    if let Some(port) = args.prometheus_port {
        let addr = crate::control::metrics::serve(
            SocketAddr::new(args.katcp_host, port),
            metrics.registry.clone(),
        )
        .map_err(|e| CliError::flag("--prometheus-port", e))?;
        tracing::info!(%addr, "Prometheus metrics at /metrics");
    }
    let report = send_loop(
        &plan,
        heaps,
        Some(&changes_rx),
        &mut stream,
        ts0,
        &shutdown,
        |r| {
            let gbps = r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64() / 1e9;
            let time_error = metrics.update(&plan, r);
            tracing::info!(
                heaps = r.heaps,
                gbps = format!("{gbps:.3}"),
                time_error_s = format!("{time_error:.4}"),
                "progress"
            );
        },
    )?;
    metrics.update(&plan, &report);
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "dsim: sent {} heaps, {} packets, {} bytes in {:.3} s ({:.3} Gb/s, {:.0} packets/s)",
        report.heaps,
        report.packets,
        report.bytes,
        secs,
        report.bytes as f64 * 8.0 / secs / 1e9,
        report.packets as f64 / secs
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: DsimArgs,
    }

    fn plan(args: &[&str]) -> Result<DsimPlan, CliError> {
        let mut v = vec!["dsim"];
        v.extend_from_slice(args);
        Wrap::try_parse_from(v).unwrap().a.plan()
    }

    fn flag_of(r: Result<DsimPlan, CliError>) -> &'static str {
        match r {
            Err(CliError::Flag { flag, .. }) => flag,
            other => panic!("expected a flag error, got {other:?}"),
        }
    }

    #[test]
    fn bad_flags_are_named() {
        let d = "127.0.0.1:7148";
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "0", d])),
            "--adc-sample-rate"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--sample-bits",
                "11",
                d
            ])),
            "--sample-bits"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--heap-samples",
                "12",
                d
            ])),
            "--heap-samples"
        );
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "1e9", "--period", "5000", d])),
            "--period"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--signals",
                "cw(1);",
                d
            ])),
            "--signals"
        );
        assert_eq!(
            flag_of(plan(&["--adc-sample-rate", "1e9", "1.2.3:4"])),
            "dest"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--sync-time",
                "9e12",
                d
            ])),
            "--sync-time"
        );
        assert_eq!(
            flag_of(plan(&[
                "--adc-sample-rate",
                "1e9",
                "--send-rate-factor=-1",
                d
            ])),
            "--send-rate-factor"
        );
    }

    #[test]
    fn rate_matches_the_adc() {
        let p = plan(&[
            "--adc-sample-rate",
            "1712e6",
            "239.0.0.1+7:7148",
            "239.0.1.1+7:7148",
        ])
        .unwrap();
        // 1712e6/4096 heaps/s per pol × 2 pols × (5120 + 72) bytes.
        assert!((p.rate() - 1712e6 / 4096.0 * 2.0 * 5192.0).abs() < 1e-3);
        assert_eq!(p.dests[1].len(), 8);
    }
}
