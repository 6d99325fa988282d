//! katgpucbf flags that cbf accepts on its command lines but cannot honour yet: each is
//! refused at start-up with a message naming it and saying why, so that a katgpucbf command
//! line never starts with a setting silently ignored.

use clap::Args;

use super::CliError;

const MAIN_AFFINITY: &str = "cbf's katcp threads render ?signals patterns on every core, so \
     they are not bound to one (--affinity binds the send threads)";
const MONITOR: &str = "cbf has no asyncio monitor (it is not Python)";

/// The first of `given` that is set, refused with its reason.
fn refuse_first(given: &[(&'static str, bool, &str)]) -> Result<(), CliError> {
    match given.iter().find(|(_, on, _)| *on) {
        Some((flag, _, why)) => Err(CliError::flag(flag, format!("not supported: {why}"))),
        None => Ok(()),
    }
}

/// aiomonitor's flags, which every katgpucbf program takes.
#[derive(Debug, Clone, Default, Args)]
pub struct Monitor {
    #[arg(long, hide = true)]
    aiomonitor: bool,
    #[arg(long, hide = true)]
    aiomonitor_host: Option<String>,
    #[arg(long, hide = true)]
    aiomonitor_port: Option<String>,
    #[arg(long, hide = true)]
    aioconsole_port: Option<String>,
}

impl Monitor {
    fn refuse(&self) -> Result<(), CliError> {
        refuse_first(&[
            ("--aiomonitor", self.aiomonitor, MONITOR),
            ("--aiomonitor-host", self.aiomonitor_host.is_some(), MONITOR),
            ("--aiomonitor-port", self.aiomonitor_port.is_some(), MONITOR),
            ("--aioconsole-port", self.aioconsole_port.is_some(), MONITOR),
        ])
    }
}

/// The engines' (fgpu, xbgpu) flags cbf cannot honour.
#[derive(Debug, Clone, Default, Args)]
pub struct Unsupported {
    #[arg(long, hide = true)]
    monitor_log: Option<String>,
    #[command(flatten)]
    monitor: Monitor,
}

impl Unsupported {
    /// The first flag given, refused with its reason.
    pub fn refuse(&self) -> Result<(), CliError> {
        refuse_first(&[(
            "--monitor-log",
            self.monitor_log.is_some(),
            "the queue-trace log is not implemented; use the Prometheus metrics",
        )])?;
        self.monitor.refuse()
    }
}

/// dsim's flags cbf cannot honour (its send options carry no `send-` prefix).
#[derive(Debug, Clone, Default, Args)]
pub struct DsimUnsupported {
    #[arg(long, hide = true, allow_hyphen_values = true)]
    main_affinity: Option<String>,
    #[command(flatten)]
    monitor: Monitor,
}

impl DsimUnsupported {
    /// The first flag given, refused with its reason.
    pub fn refuse(&self) -> Result<(), CliError> {
        refuse_first(&[(
            "--main-affinity",
            self.main_affinity.is_some(),
            MAIN_AFFINITY,
        )])?;
        self.monitor.refuse()
    }
}
