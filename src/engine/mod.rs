//! What every engine shares (DESIGN "engine/"): receive threads that fill a chunk stream group
//! ([`recv`]), send threads fed from a pool of heap buffers and paced by the SPEAD rate limiter
//! ([`send`]), receive memory on the NIC's NUMA node ([`recv_numa`]), the katcp and Prometheus wiring ([`control`], [`metrics`]), the health sensors
//! ([`health`]), thread pinning ([`affinity`]), start-up errors that
//! name the flag at fault ([`ConfigError`]) and clean shutdown ([`Shutdown`]). The F-engine,
//! the XB-engine and the simulators are built from these pieces, so each exists once.

pub mod affinity;
pub mod control;
pub mod health;
pub mod lease;
pub mod metrics;
pub mod recv;
pub mod recv_numa;
pub mod send;
mod send_dpdk;
mod send_sink;
mod shutdown;

pub use shutdown::{terminate, Shutdown};

/// A configuration the engine refuses at start-up, naming the command-line flag (or config
/// key) at fault, as katgpucbf's argument checks do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(flag: &'static str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError {
            flag,
            message: message.to_string(),
        }
    }
}

/// Why a running engine stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("receive failed: {0}")]
    Receive(String),
    #[error("send failed: {0}")]
    Send(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error("{0} thread panicked")]
    Panicked(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The longest duration-like flag accepted, in seconds (about 31 years): no run lasts longer,
/// and `Duration` conversions of much larger values overflow (`--duration 1e300` panicked).
pub const MAX_SECONDS: f64 = 1e9;

/// A duration-like flag: a finite number of seconds, at most [`MAX_SECONDS`], positive (or
/// also zero with `zero_ok`).
pub fn check_seconds(
    flag: &'static str,
    seconds: f64,
    zero_ok: bool,
) -> Result<std::time::Duration, ConfigError> {
    let low_ok = if zero_ok {
        seconds >= 0.0
    } else {
        seconds > 0.0
    };
    if !(seconds.is_finite() && low_ok && seconds <= MAX_SECONDS) {
        return Err(ConfigError::new(
            flag,
            format!(
                "{seconds} is not a {} number of seconds up to {MAX_SECONDS:e}",
                if zero_ok { "non-negative" } else { "positive" }
            ),
        ));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Largest receive chunk (all its heaps) accepted, in bytes: beyond it the chunk sizes are
/// a typo, and their products overflow or exhaust memory at start-up.
pub const MAX_CHUNK_BYTES: u64 = 8 << 30;

/// Sample rates accepted, in Hz: beyond them pacing intervals vanish or overflow (`cbf fsim
/// --adc-sample-rate 1e-300` panicked in its send thread; `cbf dsim --adc-sample-rate 1e300`
/// paced at an infinite rate, that is not at all).
pub const SAMPLE_RATE_RANGE: std::ops::RangeInclusive<f64> = 1.0..=1e12;

/// An ADC sample rate flag, within [`SAMPLE_RATE_RANGE`].
pub fn check_sample_rate(flag: &'static str, hz: f64) -> Result<(), ConfigError> {
    if SAMPLE_RATE_RANGE.contains(&hz) {
        Ok(())
    } else {
        Err(ConfigError::new(
            flag,
            format!("{hz} Hz is outside 1 Hz to 1 THz"),
        ))
    }
}

/// `--send-rate-factor`: 0 (as fast as possible) or 10⁻⁶ to 10³ times the real rate (outside,
/// the paced rate is zero or infinite for practical purposes, and the pacing arithmetic
/// overflows).
pub fn check_rate_factor(flag: &'static str, factor: f64) -> Result<(), ConfigError> {
    if factor == 0.0 || (1e-6..=1e3).contains(&factor) {
        Ok(())
    } else {
        Err(ConfigError::new(
            flag,
            format!("{factor} is neither 0 (unpaced) nor within 1e-6 to 1e3"),
        ))
    }
}

/// Seconds since the UNIX epoch now (the default `--sync-time`, and sensor timestamps).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
