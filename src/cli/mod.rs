//! The `cbf` command line: one file per subcommand, named after katgpucbf's programs, with
//! katgpucbf's flag names (facts §1.2, §1.5).

pub mod affinity;
pub mod array;
mod array_run;
pub mod capture;
pub mod demo;
pub mod dpdk;
pub mod dsim;
pub mod fengine;
pub mod fsim;
mod ibv;
mod katgpucbf;
mod pinning;
pub mod selftest;
pub mod xbengine;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cbf",
    version,
    propagate_version = true,
    about = "GPU correlator-beamformer for radio telescopes"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the chain on loopback with defaults (dsim → capture) and print rates and a summary.
    Demo(demo::DemoArgs),
    /// Digitiser simulator: signal language, 2–16-bit samples, paced at the ADC rate.
    Dsim(dsim::DsimArgs),
    /// F-engine simulator: F heaps from many simulated F-engines to one destination per X-engine.
    Fsim(fsim::FsimArgs),
    /// Wideband F-engine (CPU or CUDA backend): digitiser heaps in, channelised F heaps out.
    Fengine(Box<fengine::FengineArgs>),
    /// XB-engine (correlator and beamformer): F heaps in, correlation products and beams out.
    Xbengine(Box<xbengine::XbengineArgs>),
    /// Check the CUDA kernels against their CPU oracles on fresh random inputs.
    Selftest(selftest::SelftestArgs),
    /// Receive any SPEAD stream: one JSON line per heap, or statistics; optional pcap dump.
    Capture(capture::CaptureArgs),
    /// A whole array from one description: `plan` (every engine, where, with which flags)
    /// and `render` (systemd units, Kubernetes manifests), `run --local` and `status`.
    Array(array::ArrayArgs),
    /// NUMA nodes, cores, GPUs and NICs of this host (or an hwloc XML export), and where each
    /// engine should run, with the flags for it.
    Affinity(affinity::AffinityArgs),
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{fmt, reload, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Reloadable, so that katcp's `?log-level` changes the level of a running engine.
    let (filter, level) = reload::Layer::new(filter);
    // Colour only for a person at a terminal: files, pipes and journald get plain text.
    let plain = fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Human => registry.with(plain).init(),
        LogFormat::Json => registry.with(plain.json()).init(),
    }
    crate::control::katcp::set_log_level_hook(move |directive| {
        level
            .modify(|f| *f = EnvFilter::new(directive))
            .map_err(|e| e.to_string())
    });
}

/// Parse arguments, run the subcommand, map errors to a message and exit status 1
/// (2 for bad arguments, from clap).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Dsim(a) => dsim::run(a),
        Command::Capture(a) => capture::run(a),
        Command::Fengine(a) => fengine::run(*a),
        Command::Xbengine(a) => xbengine::run(*a),
        Command::Fsim(a) => fsim::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Array(a) => array::run(a),
        Command::Affinity(a) => affinity::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cbf: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A start-up error that names the flag at fault, or a run-time failure.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    #[error("{0}")]
    Run(String),
}

impl CliError {
    pub fn flag(flag: &'static str, message: impl std::fmt::Display) -> CliError {
        CliError::Flag {
            flag,
            message: message.to_string(),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::Run(e.to_string())
    }
}

impl From<crate::engine::ConfigError> for CliError {
    fn from(e: crate::engine::ConfigError) -> Self {
        CliError::Flag {
            flag: e.flag,
            message: e.message,
        }
    }
}

impl From<crate::engine::EngineError> for CliError {
    fn from(e: crate::engine::EngineError) -> Self {
        match e {
            crate::engine::EngineError::Config(c) => c.into(),
            other => CliError::Run(other.to_string()),
        }
    }
}
