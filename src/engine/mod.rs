//! What every engine shares (DESIGN "engine/"): receive threads that fill a chunk stream group
//! ([`recv`]), send threads fed from a pool of heap buffers and paced by the SPEAD rate limiter
//! ([`send`]), the katcp and Prometheus wiring ([`control`], [`metrics`]), start-up errors that
//! name the flag at fault ([`ConfigError`]) and clean shutdown ([`Shutdown`]). The F-engine,
//! the XB-engine and the simulators are built from these pieces, so each exists once.

pub mod control;
pub mod metrics;
pub mod recv;
pub mod send;
mod shutdown;

pub use shutdown::Shutdown;

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

/// Seconds since the UNIX epoch now (the default `--sync-time`, and sensor timestamps).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
