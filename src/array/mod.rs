//! Array plans: from one description of a whole correlator (antennas, bands, nodes with their
//! NICs, GPUs and NUMA layout) to every engine it needs — where it runs, on which GPU, NIC and
//! cores, with which multicast groups, ports, feng-id, channel range and sync time, and its
//! full command line — checked for consistency; and the plan rendered for orchestrators that
//! exist (systemd units, Kubernetes manifests). cbf does not schedule anything itself.
//!
//! - [`config`]: the TOML description, parsed with serde (unknown keys refused).
//! - [`check`]: value checks of the description, each error naming its key
//!   (`bands[0].channels`), and the shape each band derives from them.
//! - [`groups`]: the multicast allocation.
//! - [`place`]: engines onto GPU or CPU slots, NUMA-local cores, NICs and control ports.
//! - [`plan`]: the plan, and the rate checks (NICs, PCIe) and the F→X check on it;
//!   `engines` builds each engine's command line.
//! - [`rates`]: the stream rates those checks use, from the formats.
//! - [`systemd`], [`kubernetes`]: renderings of a plan.
#![deny(unsafe_code)]

pub mod check;
pub mod config;
mod engines;
pub mod groups;
pub mod kubernetes;
pub mod launch;
pub mod local;
pub mod place;
pub mod plan;
pub mod rates;
pub mod status;
pub mod systemd;
mod yaml;

pub use config::ArrayConfig;
pub use plan::{EngineKind, EnginePlan, Plan};

use std::path::Path;

/// Why a description could not be read or planned, or a rendering written.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// TOML syntax, a missing or unknown key, a value of the wrong type (the message names
    /// the key and the line).
    #[error("{0}")]
    Parse(String),
    /// A value or a combination of values that cannot make a working array.
    #[error("{key}: {message}")]
    Config { key: String, message: String },
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

impl ArrayError {
    pub fn config(key: impl Into<String>, message: impl std::fmt::Display) -> ArrayError {
        ArrayError::Config {
            key: key.into(),
            message: message.to_string(),
        }
    }

    /// The config key at fault, for a [`ArrayError::Config`].
    pub fn key(&self) -> Option<&str> {
        match self {
            ArrayError::Config { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Parse a description from TOML text.
pub fn parse(text: &str) -> Result<ArrayConfig, ArrayError> {
    toml::from_str(text).map_err(|e| ArrayError::Parse(e.to_string()))
}

/// Read, parse and plan the description at `path`.
pub fn plan_file(path: &Path) -> Result<Plan, ArrayError> {
    let text = std::fs::read_to_string(path).map_err(|source| ArrayError::Read {
        path: path.display().to_string(),
        source,
    })?;
    plan::plan(&parse(&text)?)
}

/// Write `text` to `path`, creating its directory.
fn write_file(path: &Path, text: &str) -> Result<(), ArrayError> {
    let err = |source| ArrayError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(path, text).map_err(err)
}
