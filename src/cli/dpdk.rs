//! The DPDK flags every receiving command shares (`--dpdk-args`, `--dpdk-port`), turned into
//! a [`DpdkConfig`] for `--recv-transport dpdk`.

use clap::Args;

use crate::net::dpdk::DpdkConfig;

#[derive(Debug, Clone, Args)]
pub struct DpdkArgs {
    /// EAL arguments for `--recv-transport dpdk`, whitespace-separated (no quoting), e.g.
    /// "-l 2 -a 0000:17:00.0" for a NIC or "-l 0 --no-huge --no-pci --vdev=net_ring0".
    /// Needs a build with `--features dpdk`.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub dpdk_args: Option<String>,
    /// DPDK port to receive on: an index, or a device name such as net_af_packet0.
    #[arg(long, default_value = "0")]
    pub dpdk_port: String,
}

impl DpdkArgs {
    /// The EAL and port, when `--dpdk-args` was given.
    pub fn config(&self) -> Option<DpdkConfig> {
        self.dpdk_args.as_ref().map(|a| DpdkConfig {
            eal_args: a.clone(),
            port: self.dpdk_port.clone(),
        })
    }
}
