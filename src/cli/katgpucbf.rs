//! katgpucbf flags that cbf accepts on its command lines but cannot honour yet: each is
//! refused at start-up with a message naming it and saying why, so that a katgpucbf command
//! line never starts with a setting silently ignored.

use clap::Args;

use super::CliError;

#[derive(Debug, Clone, Default, Args)]
pub struct Unsupported {
    #[arg(long, hide = true)]
    recv_ibv: bool,
    #[arg(long, hide = true)]
    send_ibv: bool,
    #[arg(long, hide = true)]
    recv_affinity: Option<String>,
    #[arg(long, hide = true)]
    send_affinity: Option<String>,
    #[arg(long, hide = true, allow_hyphen_values = true)]
    recv_comp_vector: Option<String>,
    #[arg(long, hide = true, allow_hyphen_values = true)]
    send_comp_vector: Option<String>,
    #[arg(long, hide = true)]
    monitor_log: Option<String>,
    #[arg(long, hide = true)]
    aiomonitor: bool,
    #[arg(long, hide = true)]
    aiomonitor_host: Option<String>,
    #[arg(long, hide = true)]
    aiomonitor_port: Option<String>,
    #[arg(long, hide = true)]
    aioconsole_port: Option<String>,
}

impl Unsupported {
    /// The first flag given, refused with its reason.
    pub fn refuse(&self) -> Result<(), CliError> {
        let network = "kernel-bypass transports and thread pinning are not implemented yet (UDP sockets only)";
        let given: [(&'static str, bool, &str); 11] = [
            ("--recv-ibv", self.recv_ibv, network),
            ("--send-ibv", self.send_ibv, network),
            ("--recv-affinity", self.recv_affinity.is_some(), network),
            ("--send-affinity", self.send_affinity.is_some(), network),
            (
                "--recv-comp-vector",
                self.recv_comp_vector.is_some(),
                network,
            ),
            (
                "--send-comp-vector",
                self.send_comp_vector.is_some(),
                network,
            ),
            (
                "--monitor-log",
                self.monitor_log.is_some(),
                "the queue-trace log is not implemented; use the Prometheus metrics",
            ),
            (
                "--aiomonitor",
                self.aiomonitor,
                "cbf has no asyncio monitor (it is not Python)",
            ),
            (
                "--aiomonitor-host",
                self.aiomonitor_host.is_some(),
                "cbf has no asyncio monitor (it is not Python)",
            ),
            (
                "--aiomonitor-port",
                self.aiomonitor_port.is_some(),
                "cbf has no asyncio monitor (it is not Python)",
            ),
            (
                "--aioconsole-port",
                self.aioconsole_port.is_some(),
                "cbf has no asyncio monitor (it is not Python)",
            ),
        ];
        match given.iter().find(|(_, on, _)| *on) {
            Some((flag, _, why)) => Err(CliError::flag(flag, format!("not supported: {why}"))),
            None => Ok(()),
        }
    }
}
