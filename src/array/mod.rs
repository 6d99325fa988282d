//! Array plans: from one description of a whole correlator (antennas, bands, nodes with their
//! NICs, GPUs and NUMA layout) to every engine it needs — where it runs, on which GPU, NIC and
//! cores, with which multicast groups, ports, feng-id, channel range and sync time, and its
//! full command line — checked for consistency; and the plan rendered for orchestrators that
//! exist (systemd units, Kubernetes manifests). cbf does not schedule anything itself.
//!
//! - [`config`]: the description, parsed with serde from TOML or YAML (one schema; unknown
//!   keys refused in both).
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
pub mod hardware;
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
    /// TOML or YAML syntax, a missing or unknown key, a value of the wrong type (the message
    /// names the key and the line).
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

/// The largest description read from a file: the 197-antenna example is about 60 KiB.
pub const MAX_DESCRIPTION_BYTES: u64 = 16 << 20;

/// The two syntaxes of a description; one schema ([`ArrayConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    /// YAML for a `.yaml` or `.yml` file, TOML for any other.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml") => {
                Format::Yaml
            }
            _ => Format::Toml,
        }
    }
}

/// Parse a description from TOML text.
pub fn parse(text: &str) -> Result<ArrayConfig, ArrayError> {
    toml::from_str(text).map_err(|e| ArrayError::Parse(e.to_string()))
}

/// Parse a description from YAML text. serde_norway's errors name the key as a path
/// (`bands[0]: unknown field ...`) with its line, as TOML's do; aliases are expanded within
/// the library's bound (a "billion laughs" document is refused), and nesting is limited.
pub fn parse_yaml(text: &str) -> Result<ArrayConfig, ArrayError> {
    serde_norway::from_str(text).map_err(|e| ArrayError::Parse(e.to_string()))
}

/// Read and parse the description at `path`, in the syntax its extension names
/// ([`Format::of`]), refusing a file over [`MAX_DESCRIPTION_BYTES`].
pub fn read(path: &Path) -> Result<ArrayConfig, ArrayError> {
    let read_err = |source| ArrayError::Read {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_DESCRIPTION_BYTES + 1),
        &mut text,
    )
    .map_err(read_err)?;
    if text.len() as u64 > MAX_DESCRIPTION_BYTES {
        return Err(ArrayError::Parse(format!(
            "{}: larger than {} MiB, which no array description needs",
            path.display(),
            MAX_DESCRIPTION_BYTES >> 20
        )));
    }
    let mut cfg = match Format::of(path) {
        Format::Toml => parse(&text),
        Format::Yaml => parse_yaml(&text),
    }
    .map_err(|e| match e {
        ArrayError::Parse(m) => ArrayError::Parse(format!("{}: {m}", path.display())),
        other => other,
    })?;
    hardware::resolve(&mut cfg, path.parent().unwrap_or(Path::new(".")))?;
    Ok(cfg)
}

/// Read, parse and plan the description at `path`.
pub fn plan_file(path: &Path) -> Result<Plan, ArrayError> {
    plan::plan(&read(path)?)
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
