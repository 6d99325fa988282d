//! fsim's configuration (katgpucbf fsim's flags, facts §1.5, with fgpu's send options §1.2),
//! validated at start-up with errors that name the flag at fault, and the plan derived from
//! it: the heap layout, the timestamp step, the pacing and which F-engines to leave out.
#![deny(unsafe_code)]

use std::net::SocketAddrV4;
use std::time::Duration;

use super::fsim::{FsimLayout, Payload, PATTERN_BATCHES};
use crate::engine::control::ControlConfig;
use crate::engine::send::{SendTransport, StreamSpec};
use crate::engine::{check_rate_factor, check_sample_rate, check_seconds, unix_now, ConfigError};
use crate::spead::send::SendStreamConfig;
use crate::spead::Flavour;

/// Bytes in front of each packet's payload: the 8-byte header and 8 item pointers (the 4
/// every packet has and the F heap's 4, repeated in every packet), katgpucbf's
/// `PREAMBLE_SIZE`.
pub const PREAMBLE: usize = 72;

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65507;

/// Largest rendered pattern (it is held in memory for the whole run).
const MAX_PATTERN_BYTES: usize = 16 << 30;

/// Everything an fsim is built from (one field per `cbf fsim` flag).
#[derive(Debug, Clone)]
pub struct FsimConfig {
    pub array_size: usize,
    /// Channels of the whole band (sets the rate and the default spectrum spacing).
    pub channels: usize,
    pub channels_per_substream: usize,
    /// `None` = 2 × channels (wideband).
    pub samples_between_spectra: Option<usize>,
    pub jones_per_batch: usize,
    pub adc_sample_rate: f64,
    /// UNIX time of timestamp 0; not in the future.
    pub sync_time: f64,
    /// Multiple of the real rate to send at (0 = unpaced).
    pub send_rate_factor: f64,
    /// Payload bytes per packet.
    pub send_packet_payload: usize,
    pub send_interfaces: Vec<String>,
    /// UDP sockets or DPDK ports (`--send-transport`).
    pub send_transport: SendTransport,
    pub send_ttl: u32,
    /// Stop after this many heaps per F-engine and destination (batches).
    pub max_heaps: Option<u64>,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Send one batch and stop (katgpucbf `--run-once`).
    pub run_once: bool,
    pub payload: Payload,
    /// 8, or 4 (packed, real in the high nibble).
    pub sample_bits: u32,
    /// F-engines whose heaps are not sent.
    pub missing_fengines: Vec<usize>,
    /// Leave them out only for timestamps in [start, end); `None` = always.
    pub missing_timestamps: Option<(u64, u64)>,
    /// One destination per X-engine: destination d gets channels [d·cps, (d+1)·cps).
    pub dests: Vec<SocketAddrV4>,
    pub control: ControlConfig,
}

/// Everything fsim needs to run, validated.
#[derive(Debug, Clone)]
pub struct FsimPlan {
    pub config: FsimConfig,
    pub layout: FsimLayout,
    pub samples_between_spectra: usize,
    /// ADC samples between consecutive batches: spectra_per_heap × samples_between_spectra.
    pub timestamp_step: u64,
    /// Batches to send (`--max-heaps`, or 1 with `--run-once`).
    pub max_batches: Option<u64>,
    /// Per F-engine: is it left out (within `missing_timestamps`)?
    pub missing: Vec<bool>,
}

impl FsimConfig {
    /// Check every flag and how they combine.
    pub fn validate(&self) -> Result<FsimPlan, ConfigError> {
        let positive = |v: usize, flag: &'static str| {
            if v == 0 {
                Err(ConfigError::new(flag, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive(self.array_size, "--array-size")?;
        positive(self.channels, "--channels")?;
        positive(self.channels_per_substream, "--channels-per-substream")?;
        if self.channels % self.channels_per_substream != 0 {
            return Err(ConfigError::new(
                "--channels-per-substream",
                format!("must divide --channels ({})", self.channels),
            ));
        }
        let sbs = self.samples_between_spectra.unwrap_or(2 * self.channels);
        positive(sbs, "--samples-between-spectra")?;
        if self.jones_per_batch < self.channels || self.jones_per_batch % self.channels != 0 {
            return Err(ConfigError::new(
                "--jones-per-batch",
                format!(
                    "must be a positive multiple of --channels ({})",
                    self.channels
                ),
            ));
        }
        check_sample_rate("--adc-sample-rate", self.adc_sample_rate)?;
        if !self.sync_time.is_finite() || self.sync_time > unix_now() {
            return Err(ConfigError::new("--sync-time", "is in the future"));
        }
        check_rate_factor("--send-rate-factor", self.send_rate_factor)?;
        let p = self.send_packet_payload;
        if p == 0 || p % 8 != 0 || p + PREAMBLE > MAX_DATAGRAM {
            return Err(ConfigError::new(
                "--send-packet-payload",
                format!(
                    "must be a positive multiple of 8 of at most {}",
                    MAX_DATAGRAM - PREAMBLE
                ),
            ));
        }
        if self.sample_bits != 8 && self.sample_bits != 4 {
            return Err(ConfigError::new(
                "--sample-bits",
                format!("{} is not 8 or 4", self.sample_bits),
            ));
        }
        if self.max_heaps == Some(0) {
            return Err(ConfigError::new("--max-heaps", "must be at least 1"));
        }
        if self.run_once && self.max_heaps.is_some() {
            return Err(ConfigError::new(
                "--run-once",
                "is one batch: do not combine it with --max-heaps",
            ));
        }
        if let Some(d) = self.duration {
            check_seconds("--duration", d, true)?;
        }
        let mut missing = vec![false; self.array_size];
        for &f in &self.missing_fengines {
            *missing.get_mut(f).ok_or_else(|| {
                ConfigError::new(
                    "--missing-fengines",
                    format!(
                        "F-engine {f} is not below --array-size ({})",
                        self.array_size
                    ),
                )
            })? = true;
        }
        if let Some((start, end)) = self.missing_timestamps {
            if start >= end {
                return Err(ConfigError::new(
                    "--missing-timestamps",
                    format!("{start}:{end} is empty (START must be below END)"),
                ));
            }
            if self.missing_fengines.is_empty() {
                return Err(ConfigError::new(
                    "--missing-timestamps",
                    "needs --missing-fengines",
                ));
            }
        }
        if self.dests.is_empty() {
            return Err(ConfigError::new(
                "dest",
                "give one destination per X-engine",
            ));
        }
        if self.dests.len() * self.channels_per_substream > self.channels {
            return Err(ConfigError::new(
                "dest",
                format!(
                    "{} destinations × {} channels exceed --channels ({})",
                    self.dests.len(),
                    self.channels_per_substream,
                    self.channels
                ),
            ));
        }
        let layout = FsimLayout {
            array_size: self.array_size,
            channels_per_substream: self.channels_per_substream,
            spectra_per_heap: self.jones_per_batch / self.channels,
            destinations: self.dests.len(),
            sample_bits: self.sample_bits,
        };
        let pattern = layout
            .array_size
            .checked_mul(layout.channels_per_substream)
            .and_then(|v| v.checked_mul(layout.spectra_per_heap))
            .and_then(|v| {
                v.checked_mul(layout.destinations * layout.jones_bytes() * PATTERN_BATCHES)
            });
        if pattern.is_none_or(|b| b > MAX_PATTERN_BYTES) {
            return Err(ConfigError::new(
                "--jones-per-batch",
                format!(
                    "the replayed pattern ({PATTERN_BATCHES} batches × --array-size × \
                     destinations × heap bytes) exceeds {} GiB",
                    MAX_PATTERN_BYTES >> 30
                ),
            ));
        }
        Ok(FsimPlan {
            config: self.clone(),
            layout,
            samples_between_spectra: sbs,
            timestamp_step: (layout.spectra_per_heap * sbs) as u64,
            max_batches: if self.run_once {
                Some(1)
            } else {
                self.max_heaps
            },
            missing,
        })
    }
}

impl FsimPlan {
    /// Is F-engine `feng`'s heap at `timestamp` left out?
    pub fn is_missing(&self, feng: usize, timestamp: u64) -> bool {
        self.missing[feng]
            && self
                .config
                .missing_timestamps
                .is_none_or(|(start, end)| (start..end).contains(&timestamp))
    }

    /// Bytes of one heap on the wire, packet preambles included.
    pub fn heap_wire_bytes(&self) -> usize {
        let payload = self.layout.heap_bytes();
        payload + payload.div_ceil(self.config.send_packet_payload) * PREAMBLE
    }

    /// Batches per second at the real rate: one every `timestamp_step` ADC samples.
    pub fn batches_per_second(&self) -> f64 {
        self.config.adc_sample_rate / self.timestamp_step as f64
    }

    /// Bytes per second to each destination (every F-engine's heaps) at the rate factor;
    /// 0 = unpaced. With the defaults this is katgpucbf's adc · 2 pols · 8 bits · ants ·
    /// cps / channels × (1 + 72/8192) (34.24 Gb/s before the overhead, facts §1.5).
    pub fn rate(&self) -> f64 {
        self.batches_per_second()
            * (self.layout.array_size * self.heap_wire_bytes()) as f64
            * self.config.send_rate_factor
    }

    /// Wall-clock time between batches at the rate factor; `None` when unpaced. Batches are
    /// started on this schedule as well as paced by the rate limiter, so that leaving
    /// F-engines out does not make the others run ahead of real time.
    pub fn batch_period(&self) -> Option<Duration> {
        (self.config.send_rate_factor > 0.0).then(|| {
            Duration::from_secs_f64(
                1.0 / (self.batches_per_second() * self.config.send_rate_factor),
            )
        })
    }

    /// The first timestamp: the next batch boundary at or after now.
    pub fn start_timestamp(&self) -> u64 {
        let samples = ((unix_now() - self.config.sync_time).max(0.0) * self.config.adc_sample_rate)
            .ceil() as u64;
        samples.div_ceil(self.timestamp_step) * self.timestamp_step
    }

    /// The send stream of destination `dest`: its own socket(s) and rate, as katgpucbf
    /// gives each X-engine's stream its own spead2 stream.
    pub fn stream_spec(&self, dest: usize) -> StreamSpec {
        StreamSpec {
            dst: vec![self.config.dests[dest]],
            interfaces: self.config.send_interfaces.clone(),
            ttl: self.config.send_ttl,
            buffer: 4 << 20,
            transport: self.config.send_transport.clone(),
            config: SendStreamConfig {
                flavour: Flavour::SPEAD_64_48,
                max_packet_size: self.config.send_packet_payload + PREAMBLE,
                rate: self.rate(),
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// katgpucbf fsim's defaults, one destination.
    fn good() -> FsimConfig {
        FsimConfig {
            array_size: 80,
            channels: 32768,
            channels_per_substream: 512,
            samples_between_spectra: None,
            jones_per_batch: 1 << 20,
            adc_sample_rate: 1712e6,
            sync_time: unix_now() - 10.0,
            send_rate_factor: 1.0,
            send_packet_payload: 8192,
            send_interfaces: vec![],
            send_transport: SendTransport::Udp,
            send_ttl: 4,
            max_heaps: None,
            duration: None,
            run_once: false,
            payload: Payload::Katgpucbf,
            sample_bits: 8,
            missing_fengines: vec![],
            missing_timestamps: None,
            dests: vec![SocketAddrV4::new(Ipv4Addr::new(239, 10, 11, 0), 7148)],
            control: ControlConfig {
                host: Ipv4Addr::LOCALHOST.into(),
                katcp_port: 0,
                prometheus_port: None,
            },
        }
    }

    fn flag(edit: impl FnOnce(&mut FsimConfig)) -> &'static str {
        let mut c = good();
        edit(&mut c);
        match c.validate() {
            Err(e) => e.flag,
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn defaults_give_katgpucbfs_rate_and_step() {
        let p = good().validate().unwrap();
        assert_eq!(p.layout.spectra_per_heap, 32);
        assert_eq!(p.timestamp_step, 32 * 65536);
        // facts §1.5: 34.24 Gb/s per destination, plus 72 B per 8192 B packet.
        let want = 34.24e9 / 8.0 * (1.0 + 72.0 / 8192.0);
        assert!((p.rate() / want - 1.0).abs() < 1e-12, "{}", p.rate());
        let period = p.batch_period().unwrap().as_secs_f64();
        assert!((period - 32.0 * 65536.0 / 1712e6).abs() < 1e-9);
        assert_eq!(p.start_timestamp() % p.timestamp_step, 0);
    }

    #[test]
    fn missing_fengines_within_their_range() {
        let mut c = good();
        c.missing_fengines = vec![3, 7];
        c.missing_timestamps = Some((100, 200));
        let p = c.validate().unwrap();
        assert!(p.is_missing(3, 100) && p.is_missing(7, 199));
        assert!(!p.is_missing(3, 200) && !p.is_missing(3, 99) && !p.is_missing(4, 150));
        c.missing_timestamps = None;
        assert!(c.validate().unwrap().is_missing(7, 1 << 40));
    }

    /// One test per validation error: `name`, the flag it must name, the edit that breaks it.
    macro_rules! bad_flag {
        ($($name:ident: $flag:literal, |$c:ident| $edit:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(flag(|$c| $edit), $flag);
            }
        )*};
    }

    bad_flag! {
        no_antennas: "--array-size", |c| c.array_size = 0;
        no_channels: "--channels", |c| c.channels = 0;
        no_channels_per_substream: "--channels-per-substream", |c| c.channels_per_substream = 0;
        substreams_not_dividing: "--channels-per-substream", |c| c.channels_per_substream = 500;
        no_samples_between_spectra: "--samples-between-spectra",
            |c| c.samples_between_spectra = Some(0);
        jones_not_a_multiple: "--jones-per-batch", |c| c.jones_per_batch = 1000;
        jones_below_channels: "--jones-per-batch", |c| c.jones_per_batch = 16384;
        negative_adc_rate: "--adc-sample-rate", |c| c.adc_sample_rate = -1.0;
        future_sync_time: "--sync-time", |c| c.sync_time = unix_now() + 1e6;
        nan_rate_factor: "--send-rate-factor", |c| c.send_rate_factor = f64::NAN;
        payload_not_multiple_of_8: "--send-packet-payload", |c| c.send_packet_payload = 100;
        payload_over_a_datagram: "--send-packet-payload", |c| c.send_packet_payload = 65536;
        ten_bit_samples: "--sample-bits", |c| c.sample_bits = 10;
        zero_max_heaps: "--max-heaps", |c| c.max_heaps = Some(0);
        run_once_with_max_heaps: "--run-once", |c| {
            c.run_once = true;
            c.max_heaps = Some(3);
        };
        negative_duration: "--duration", |c| c.duration = Some(-1.0);
        huge_duration: "--duration", |c| c.duration = Some(1e300);
        nan_duration: "--duration", |c| c.duration = Some(f64::NAN);
        tiny_adc_rate: "--adc-sample-rate", |c| c.adc_sample_rate = 1e-300;
        huge_adc_rate: "--adc-sample-rate", |c| c.adc_sample_rate = 1e300;
        huge_rate_factor: "--send-rate-factor", |c| c.send_rate_factor = 1e300;
        tiny_rate_factor: "--send-rate-factor", |c| c.send_rate_factor = 1e-300;
        missing_feng_out_of_range: "--missing-fengines", |c| c.missing_fengines = vec![80];
        empty_missing_range: "--missing-timestamps", |c| {
            c.missing_fengines = vec![1];
            c.missing_timestamps = Some((5, 5));
        };
        missing_range_without_fengines: "--missing-timestamps",
            |c| c.missing_timestamps = Some((0, 5));
        no_destination: "dest", |c| c.dests.clear();
        more_destinations_than_channels: "dest", |c| c.dests = vec![c.dests[0]; 65];
        pattern_too_large: "--jones-per-batch", |c| c.array_size = 1 << 20;
    }
}
