//! The DPDK flags: the EAL and port every DPDK-using command shares (`--dpdk-args`,
//! `--dpdk-port`), turned into a [`DpdkConfig`] for `--recv-transport dpdk` and
//! `--send-transport dpdk`, and the send side's own (`--send-transport`, `--dpdk-src`,
//! `--dpdk-dst-mac`; cbf's flags, katgpucbf has no DPDK). Both transports of one process
//! take the same `--dpdk-args`, so they share its one EAL (`net::dpdk`).
//!
//! Combinations that cannot work are refused here, naming the flag: DPDK send without the
//! `dpdk` feature, with the ibverbs switch, or without the EAL's arguments or a source
//! address; `--dpdk-src`/`--dpdk-dst-mac` without `--send-transport dpdk` (refused, not
//! ignored). A unicast destination without `--dpdk-dst-mac` is refused when the senders open
//! (`engine::send`), where the destinations are known.

use clap::{Args, ValueEnum};

use super::CliError;
use crate::engine::send::{DpdkSend, SendTransport};
use crate::net::dpdk::{self, DpdkConfig, DpdkError};
use crate::net::frame::parse_mac;

#[derive(Debug, Clone, Args)]
pub struct DpdkArgs {
    /// EAL arguments for `--recv-transport dpdk` and `--send-transport dpdk` (one EAL per
    /// process, shared by both), whitespace-separated (no quoting), e.g. "-l 2 -a
    /// 0000:17:00.0" for a NIC or "-l 0 --no-huge --no-pci --vdev=net_ring0". Needs a build
    /// with `--features dpdk`.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub dpdk_args: Option<String>,
    /// DPDK port to receive on, and to send from when no send interface is named: an index,
    /// or a device name such as net_af_packet0.
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

/// `--send-transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum SendTransportKind {
    /// Kernel UDP sockets (`sendmmsg` with GSO), or ibverbs with the ibverbs switch.
    #[default]
    Udp,
    /// The same sockets through io_uring's zero-copy `sendmsg` (Linux 6.2).
    Uring,
    /// DPDK ports polled from user space (`--dpdk-args`, `--dpdk-src`; a build with
    /// `--features dpdk`).
    Dpdk,
}

/// The send side's transport flags (fengine, xbengine, dsim, fsim).
#[derive(Debug, Clone, Default, Args)]
pub struct SendTransportArgs {
    /// How outputs leave the host: `udp` (kernel sockets), `uring` (the same sockets through
    /// io_uring's zero-copy sendmsg, Linux 6.2) or `dpdk` (DPDK ports: the send interfaces
    /// name ports, else --dpdk-port; needs --dpdk-args and --dpdk-src, and a build with
    /// `--features dpdk`).
    #[arg(long, value_enum, default_value_t)]
    pub send_transport: SendTransportKind,
    /// With --send-transport dpdk: the frames' source, A.B.C.D[:port] (port 7148 if not
    /// given); one for every send port, or one per port in order (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub dpdk_src: Vec<String>,
    /// With --send-transport dpdk: the next hop's MAC (aa:bb:cc:dd:ee:ff), needed for unicast
    /// destinations (multicast ones map to their group's MAC).
    #[arg(long, value_name = "MAC")]
    pub dpdk_dst_mac: Option<String>,
}

/// Source UDP port of DPDK frames when `--dpdk-src` names none (receivers ignore it).
const DEFAULT_SRC_PORT: u16 = 7148;

impl SendTransportArgs {
    /// The send transport from these flags, the ibverbs choice (`ibv`, from the switch named
    /// `ibv_flag`) and the EAL flags.
    pub fn transport(
        &self,
        ibv: SendTransport,
        ibv_flag: &'static str,
        eal: &DpdkArgs,
    ) -> Result<SendTransport, CliError> {
        if self.send_transport != SendTransportKind::Dpdk {
            if !self.dpdk_src.is_empty() {
                return Err(CliError::flag("--dpdk-src", "needs --send-transport dpdk"));
            }
            if self.dpdk_dst_mac.is_some() {
                return Err(CliError::flag(
                    "--dpdk-dst-mac",
                    "needs --send-transport dpdk",
                ));
            }
            if self.send_transport == SendTransportKind::Udp {
                return Ok(ibv);
            }
            if ibv != SendTransport::Udp {
                return Err(CliError::flag(
                    ibv_flag,
                    "conflicts with --send-transport uring",
                ));
            }
            return Ok(SendTransport::Uring);
        }
        if !dpdk::AVAILABLE {
            return Err(CliError::flag("--send-transport", DpdkError::NotBuilt));
        }
        if ibv != SendTransport::Udp {
            return Err(CliError::flag(
                ibv_flag,
                "conflicts with --send-transport dpdk",
            ));
        }
        let eal = eal.config().ok_or_else(|| {
            CliError::flag(
                "--dpdk-args",
                "--send-transport dpdk needs the EAL's arguments (e.g. \"-l 0 -a 0000:17:00.0\")",
            )
        })?;
        if self.dpdk_src.is_empty() {
            return Err(CliError::flag(
                "--dpdk-src",
                "--send-transport dpdk needs the frames' source address (no kernel picks one)",
            ));
        }
        let src = self
            .dpdk_src
            .iter()
            .map(|s| {
                parse_src(s).ok_or_else(|| {
                    CliError::flag("--dpdk-src", format!("{s:?} is not A.B.C.D[:port]"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dst_mac = self
            .dpdk_dst_mac
            .as_deref()
            .map(parse_mac)
            .transpose()
            .map_err(|e| CliError::flag("--dpdk-dst-mac", e))?;
        Ok(SendTransport::Dpdk(DpdkSend { eal, src, dst_mac }))
    }
}

/// `A.B.C.D` or `A.B.C.D:port`.
fn parse_src(text: &str) -> Option<std::net::SocketAddrV4> {
    let text = text.trim();
    text.parse().ok().or_else(|| {
        text.parse()
            .ok()
            .map(|ip| std::net::SocketAddrV4::new(ip, DEFAULT_SRC_PORT))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eal(args: Option<&str>) -> DpdkArgs {
        DpdkArgs {
            dpdk_args: args.map(str::to_string),
            dpdk_port: "net_ring0".into(),
        }
    }

    fn dpdk(src: &[&str], mac: Option<&str>) -> SendTransportArgs {
        SendTransportArgs {
            send_transport: SendTransportKind::Dpdk,
            dpdk_src: src.iter().map(|s| s.to_string()).collect(),
            dpdk_dst_mac: mac.map(str::to_string),
        }
    }

    fn flag_of(r: Result<SendTransport, CliError>) -> &'static str {
        match r {
            Err(CliError::Flag { flag, .. }) => flag,
            other => panic!("expected a flag error, got {other:?}"),
        }
    }

    #[test]
    fn uring_is_its_own_transport_and_refuses_ibverbs_and_dpdk_flags() {
        let uring = SendTransportArgs {
            send_transport: SendTransportKind::Uring,
            ..Default::default()
        };
        assert_eq!(
            uring
                .transport(SendTransport::Udp, "--send-ibv", &eal(None))
                .unwrap(),
            SendTransport::Uring
        );
        let r = uring.transport(
            SendTransport::Ibv { comp_vector: 0 },
            "--send-ibv",
            &eal(None),
        );
        assert_eq!(flag_of(r), "--send-ibv");
        let orphan_src = SendTransportArgs {
            dpdk_src: vec!["10.0.0.1".into()],
            ..uring.clone()
        };
        let r = orphan_src.transport(SendTransport::Udp, "--send-ibv", &eal(None));
        assert_eq!(flag_of(r), "--dpdk-src");
        let orphan_mac = SendTransportArgs {
            dpdk_dst_mac: Some("02:00:00:00:00:01".into()),
            ..uring
        };
        let r = orphan_mac.transport(SendTransport::Udp, "--send-ibv", &eal(None));
        assert_eq!(flag_of(r), "--dpdk-dst-mac");
    }

    #[test]
    fn udp_passes_the_ibverbs_choice_and_refuses_orphan_dpdk_flags() {
        let udp = SendTransportArgs::default();
        let ibv = SendTransport::Ibv { comp_vector: 1 };
        assert_eq!(
            udp.transport(ibv.clone(), "--send-ibv", &eal(None))
                .unwrap(),
            ibv
        );
        let orphan_src = SendTransportArgs {
            dpdk_src: vec!["10.0.0.1".into()],
            ..Default::default()
        };
        let r = orphan_src.transport(SendTransport::Udp, "--send-ibv", &eal(None));
        assert_eq!(flag_of(r), "--dpdk-src");
        let orphan_mac = SendTransportArgs {
            dpdk_dst_mac: Some("02:00:00:00:00:01".into()),
            ..Default::default()
        };
        let r = orphan_mac.transport(SendTransport::Udp, "--send-ibv", &eal(None));
        assert_eq!(flag_of(r), "--dpdk-dst-mac");
    }

    #[test]
    fn dpdk_is_built_from_its_flags_or_refused_by_name() {
        let good = dpdk(&["10.0.0.1", "10.0.0.2:9000"], Some("02:00:00:00:00:01"));
        let r = good.transport(SendTransport::Udp, "--send-ibv", &eal(Some("-l 0")));
        if !dpdk::AVAILABLE {
            assert_eq!(flag_of(r), "--send-transport");
            return;
        }
        let SendTransport::Dpdk(d) = r.unwrap() else {
            panic!("not DPDK")
        };
        assert_eq!(d.eal.eal_args, "-l 0");
        assert_eq!(d.eal.port, "net_ring0");
        let want: Vec<std::net::SocketAddrV4> = vec![
            "10.0.0.1:7148".parse().unwrap(),
            "10.0.0.2:9000".parse().unwrap(),
        ];
        assert_eq!(d.src, want);
        assert_eq!(d.dst_mac, Some([2, 0, 0, 0, 0, 1]));
        let ibv = SendTransport::Ibv { comp_vector: 0 };
        assert_eq!(
            flag_of(good.transport(ibv, "--ibv", &eal(Some("-l 0")))),
            "--ibv"
        );
        let r = good.transport(SendTransport::Udp, "--send-ibv", &eal(None));
        assert_eq!(flag_of(r), "--dpdk-args");
        for (args, flag) in [
            (dpdk(&[], None), "--dpdk-src"),
            (dpdk(&["10.0.0.300"], None), "--dpdk-src"),
            (dpdk(&["10.0.0.1"], Some("02:00")), "--dpdk-dst-mac"),
        ] {
            let r = args.transport(SendTransport::Udp, "--send-ibv", &eal(Some("-l 0")));
            assert_eq!(flag_of(r), flag);
        }
    }
}
