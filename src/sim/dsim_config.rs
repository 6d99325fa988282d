//! dsim's configuration (katgpucbf dsim's flags, facts §1.5), validated at start-up with errors
//! that name the flag at fault, and the plan derived from it: the rendered digitiser layout,
//! the parsed signals, the destinations and the send rate.
#![deny(unsafe_code)]

use std::net::SocketAddrV4;
use std::time::Duration;

use super::dsim::DigitiserConfig;
use super::dsim_send::GROUP_STEPS;
use super::signal::{self, Signal};
use crate::dsp::samples::valid_sample_bits;
use crate::engine::affinity::allowed_cores;
use crate::engine::control::ControlConfig;
use crate::engine::{check_rate_factor, check_sample_rate, check_seconds, unix_now, ConfigError};
use crate::spead::send::SendStreamConfig;
use crate::spead::Flavour;

/// Largest UDP payload: a digitiser heap is one packet.
const MAX_DATAGRAM: usize = 65507;

/// Everything a dsim is built from (one field per `cbf dsim` flag).
#[derive(Debug, Clone)]
pub struct DsimConfig {
    pub adc_sample_rate: f64,
    pub sample_bits: u32,
    pub heap_samples: usize,
    /// Signal program as given: one `;`-terminated expression per polarisation (or one for all).
    pub signals: String,
    /// UNIX time of timestamp 0; not in the future.
    pub sync_time: f64,
    /// digitiser_id of polarisation 0.
    pub first_id: u64,
    pub dither_seed: u64,
    /// Samples in the replayed pattern; `None` = `max_period`.
    pub period: Option<usize>,
    pub max_period: usize,
    /// Stop after this many heaps per polarisation.
    pub max_heaps: Option<u64>,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Multiple of the ADC rate to send at (0 = unpaced).
    pub send_rate_factor: f64,
    /// Sending interfaces (names or addresses); empty = the default route.
    pub interfaces: Vec<String>,
    pub ttl: u32,
    /// Socket send buffer in bytes.
    pub send_buffer: usize,
    /// Kernel UDP or ibverbs (`--ibv`, `--comp-vector`).
    pub send_transport: crate::engine::send::SendTransport,
    /// Send a stop heap to every destination at the end.
    pub send_stop: bool,
    /// Send threads; `None` = one per `affinity` core, or one.
    pub send_threads: Option<usize>,
    /// Cores the send threads are pinned to, one per thread; empty = not pinned.
    pub affinity: Vec<usize>,
    /// One destination list per polarisation (the positional `dest` arguments).
    pub dests: Vec<Vec<SocketAddrV4>>,
    pub control: ControlConfig,
}

/// Everything `dsim` needs to run, validated.
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
    /// One entry per send thread: the core it is pinned to, if any.
    pub send_cores: Vec<Option<usize>>,
}

impl DsimConfig {
    /// Check every flag and how they combine; parse the signals (unseeded noise gets a
    /// random seed here, which the `signals` sensor then shows).
    pub fn validate(&self) -> Result<DsimPlan, ConfigError> {
        check_sample_rate("--adc-sample-rate", self.adc_sample_rate)?;
        if !valid_sample_bits(self.sample_bits) {
            return Err(ConfigError::new(
                "--sample-bits",
                format!("{} is not one of 2–10, 12, 16", self.sample_bits),
            ));
        }
        if self.heap_samples == 0 || self.heap_samples % 8 != 0 {
            return Err(ConfigError::new(
                "--heap-samples",
                "must be a positive multiple of 8",
            ));
        }
        if self.heap_samples * self.sample_bits as usize / 8 + 72 > MAX_DATAGRAM {
            return Err(ConfigError::new(
                "--heap-samples",
                "heap does not fit in one UDP datagram",
            ));
        }
        if self.max_period == 0 || self.max_period % self.heap_samples != 0 {
            return Err(ConfigError::new(
                "--max-period",
                format!(
                    "must be a positive multiple of --heap-samples ({})",
                    self.heap_samples
                ),
            ));
        }
        let period = self.period.unwrap_or(self.max_period);
        check_period(period, self.heap_samples, self.max_period)
            .map_err(|e| ConfigError::new("--period", e))?;
        check_rate_factor("--send-rate-factor", self.send_rate_factor)?;
        if let Some(d) = self.duration {
            check_seconds("--duration", d, true)?;
        }
        if self.dests.is_empty() || self.dests.iter().any(Vec::is_empty) {
            return Err(ConfigError::new(
                "dest",
                "give one destination list per polarisation",
            ));
        }
        let signals = signal::parse(&self.signals, self.dests.len(), &mut rand::random::<u64>)
            .map_err(|e| ConfigError::new("--signals", e))?;
        signal::check_render_cost(&signals, period as u64)
            .map_err(|e| ConfigError::new("--signals", e))?;
        if !self.sync_time.is_finite() || self.sync_time > unix_now() {
            return Err(ConfigError::new("--sync-time", "is in the future"));
        }
        let send_cores = self.send_cores()?;
        Ok(DsimPlan {
            config: DigitiserConfig {
                adc_sample_rate: self.adc_sample_rate,
                sample_bits: self.sample_bits,
                heap_samples: self.heap_samples,
                period,
                first_id: self.first_id,
                dither_seed: self.dither_seed,
            },
            signals,
            dests: self.dests.clone(),
            sync_time: self.sync_time,
            max_period: self.max_period,
            rate_factor: self.send_rate_factor,
            max_heaps: self.max_heaps,
            duration: self.duration.map(Duration::from_secs_f64),
            send_stop: self.send_stop,
            send_cores,
        })
    }

    /// The send threads and their cores: `--send-threads` (1 to [`MAX_SEND_THREADS`]) and
    /// `--affinity` (one core per thread, each one this process may run on) must agree when
    /// both are given.
    fn send_cores(&self) -> Result<Vec<Option<usize>>, ConfigError> {
        if !self.affinity.is_empty() {
            let allowed = allowed_cores().map_err(|e| ConfigError::new("--affinity", e))?;
            if let Some(c) = self.affinity.iter().find(|c| !allowed.contains(c)) {
                return Err(ConfigError::new(
                    "--affinity",
                    format!("core {c} is not one this process may run on ({allowed:?})"),
                ));
            }
        }
        let threads = match (self.send_threads, self.affinity.len()) {
            (Some(n), _) if n == 0 || n > MAX_SEND_THREADS => {
                return Err(ConfigError::new(
                    "--send-threads",
                    format!("{n} is not 1 to {MAX_SEND_THREADS}"),
                ))
            }
            (Some(n), k) if k > 0 && k != n => {
                return Err(ConfigError::new(
                    "--affinity",
                    format!("gives {k} cores for {n} --send-threads"),
                ))
            }
            (Some(n), _) => n,
            (None, k) if k > MAX_SEND_THREADS => {
                return Err(ConfigError::new(
                    "--affinity",
                    format!("{k} cores: at most {MAX_SEND_THREADS} send threads"),
                ))
            }
            (None, k) => k.max(1),
        };
        Ok((0..threads)
            .map(|t| self.affinity.get(t).copied())
            .collect())
    }
}

/// Most send threads a dsim runs (each has its own sockets and a share of the rate).
pub const MAX_SEND_THREADS: usize = 64;

/// A pattern length `?signals` or `--period` may ask for: a positive multiple of the heap size,
/// at most the maximum period (the memory set aside at start-up).
pub fn check_period(period: usize, heap_samples: usize, max_period: usize) -> Result<(), String> {
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

impl DsimPlan {
    /// Bytes per second on the wire at the configured rate factor (0 = unlimited).
    pub fn rate(&self) -> f64 {
        let heaps_per_s =
            self.config.adc_sample_rate / self.config.heap_samples as f64 * self.dests.len() as f64;
        heaps_per_s * self.config.packet_bytes() as f64 * self.rate_factor
    }

    /// Bytes on the wire for one group of [`GROUP_STEPS`] heap timestamps, every polarisation
    /// (the unit the send threads deal out, `dsim_send`).
    pub fn group_bytes(&self) -> usize {
        GROUP_STEPS as usize * self.dests.len() * self.config.packet_bytes()
    }

    /// The first timestamp: the next heap boundary at or after now.
    pub fn start_timestamp(&self) -> u64 {
        let samples =
            ((unix_now() - self.sync_time).max(0.0) * self.config.adc_sample_rate).ceil() as u64;
        let hs = self.config.heap_samples as u64;
        samples.div_ceil(hs) * hs
    }

    /// Seconds per heap timestamp step at the configured rate factor; None: unpaced (factor
    /// 0). The send threads pace each group by it against the clock (`dsim_send::Pacer`).
    pub fn step_seconds(&self) -> Option<f64> {
        (self.rate_factor > 0.0).then(|| {
            self.config.heap_samples as f64 / (self.config.adc_sample_rate * self.rate_factor)
        })
    }

    /// The send stream of send thread `thread`: one packet per heap, unpaced (the thread
    /// paces each group against the sample clock itself, `dsim_send::Pacer`), and even heap
    /// counters interleaved between the threads (thread t of T takes 2 + 2t, 2 + 2t + 2T, …),
    /// so that together they count 2, 4, 6, … as one stream does; descriptors take the odd
    /// ones (facts §1.9 "Digitiser heap").
    pub fn send_config(&self, thread: usize) -> SendStreamConfig {
        let threads = self.send_cores.len().max(1);
        let defaults = SendStreamConfig::default();
        // One burst per group of heap timestamps, so that a thread's group leaves at once and
        // the threads' groups interleave in timestamp order (`dsim_send`).
        SendStreamConfig {
            flavour: Flavour::SPEAD_64_48,
            max_packet_size: self.config.packet_bytes().max(1472),
            rate: 0.0,
            burst_size: defaults.burst_size.max(self.group_bytes()),
            cnt_first: 2 + 2 * thread as u64,
            cnt_step: 2 * threads as u64,
            ..defaults
        }
    }
}
