//! `--send-transport dpdk` for every engine and simulator (issue 15; seed 000 §Network
//! transmit): one [`net::dpdk`](crate::net::dpdk) sender per send interface, each a DPDK port
//! (`--send-interface` / dsim's `--interface` name ports here: an index or a device name; none
//! named means `--dpdk-port`). The senders go into the same `SendStream` as UDP sockets do, so
//! the rate limit and the balancing over interfaces (`spead::send::balance`) are the UDP path's.
//!
//! The EAL comes from `--dpdk-args`, the same string a DPDK receiver in the process uses, so
//! that receive and send share the process's one EAL (`net::dpdk::eal`), on one port (the
//! receiver holds its RX queue, each sender a TX queue of its own) or on several.
//!
//! Each sender has a TX queue of its own on its port (`net::dpdk::eal`), so a process that will
//! open several senders on one port (several outputs, dsim's send threads) plans them first,
//! before any DPDK transport starts the port ([`plan_dpdk_senders`]); the engines do that
//! before they open their receivers. A port whose driver has fewer TX queues than the process
//! has senders on it is refused at start-up, naming the flag that made the senders.
//!
//! Frames carry headers cbf builds itself, since no kernel is there to route: the source
//! address is `--dpdk-src` (one for every port, or one per port in order), multicast
//! destinations map to their group MAC, and a unicast destination needs the next hop's MAC
//! (`--dpdk-dst-mac`; nothing here speaks ARP). Every refusal happens at start-up, naming the
//! flag, before the EAL is touched where the flags alone show the fault.

use std::net::SocketAddrV4;

use super::send::SendFlags;
use super::ConfigError;
use crate::net::dpdk::{self, DpdkConfig, DpdkError, DpdkSendConfig};
use crate::net::frame::{self, Mac};
use crate::net::NetSender;

/// The DPDK side of an output (`--dpdk-args`, `--dpdk-port`, `--dpdk-src`, `--dpdk-dst-mac`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkSend {
    /// The EAL's arguments and the port used when no send interface is named.
    pub eal: DpdkConfig,
    /// Source address and UDP port of the frames: one for every port, or one per port.
    pub src: Vec<SocketAddrV4>,
    /// The next hop's MAC, for unicast destinations.
    pub dst_mac: Option<Mac>,
}

/// The flag a DPDK failure of a send port is the fault of (`port_flag`: the interface list,
/// or `--dpdk-port` when the list is empty).
fn send_flag(e: &DpdkError, port_flag: &'static str) -> &'static str {
    match e {
        DpdkError::NotBuilt => "--send-transport",
        DpdkError::Eal(_) | DpdkError::EalTwice { .. } => "--dpdk-args",
        DpdkError::NoPort { .. }
        | DpdkError::Port { .. }
        | DpdkError::QueueTaken { .. }
        | DpdkError::TxQueues { .. }
        | DpdkError::TxQueuesTaken { .. } => port_flag,
        DpdkError::Frame(_) => "--dpdk-dst-mac",
    }
}

/// The send ports: those `interfaces` name, or `--dpdk-port`; and the flag that named them.
fn send_ports<'a>(
    interfaces: &'a [String],
    cfg: &'a DpdkSend,
    flags: SendFlags,
) -> (Vec<&'a str>, &'static str) {
    if interfaces.is_empty() {
        (vec![cfg.eal.port.as_str()], "--dpdk-port")
    } else {
        (
            interfaces.iter().map(String::as_str).collect(),
            flags.interface,
        )
    }
}

/// Plan the TX queues for `streams` send streams, each with one sender per send port, before
/// any DPDK port starts: a port then starts with a TX queue for each of its senders. Where its
/// driver has fewer, refused naming `count_flag` (what set the number of streams, such as
/// dsim's `--send-threads`), or else the flag that named the port.
pub fn plan_dpdk_senders(
    interfaces: &[String],
    streams: usize,
    cfg: &DpdkSend,
    flags: SendFlags,
    count_flag: Option<&'static str>,
) -> Result<(), ConfigError> {
    if !dpdk::AVAILABLE {
        return Err(ConfigError::new("--send-transport", DpdkError::NotBuilt));
    }
    let (ports, port_flag) = send_ports(interfaces, cfg, flags);
    let streams = u16::try_from(streams).unwrap_or(u16::MAX);
    let plan: Vec<(String, u16)> = ports.iter().map(|p| (p.to_string(), streams)).collect();
    dpdk::plan_senders(&cfg.eal.eal_args, &plan).map_err(|e| {
        let flag = match e {
            DpdkError::TxQueues { .. } => count_flag.unwrap_or(port_flag),
            _ => send_flag(&e, port_flag),
        };
        ConfigError::new(flag, e)
    })
}

/// One DPDK sender per port of `interfaces` (or on `--dpdk-port`), each knowing every
/// destination of `dst`, each on a TX queue of its own.
pub fn open_dpdk_senders(
    dst: &[SocketAddrV4],
    interfaces: &[String],
    ttl: u32,
    max_packet: usize,
    cfg: &DpdkSend,
    flags: SendFlags,
) -> Result<Vec<NetSender>, ConfigError> {
    if !dpdk::AVAILABLE {
        return Err(ConfigError::new("--send-transport", DpdkError::NotBuilt));
    }
    let ttl = u8::try_from(ttl)
        .map_err(|_| ConfigError::new(flags.ttl, format!("{ttl} is more than 255 hops")))?;
    for d in dst {
        frame::dest_mac(*d.ip(), cfg.dst_mac).map_err(|e| ConfigError::new("--dpdk-dst-mac", e))?;
    }
    let (ports, port_flag) = send_ports(interfaces, cfg, flags);
    let src = match cfg.src.len() {
        1 => vec![cfg.src[0]; ports.len()],
        n if n == ports.len() => cfg.src.clone(),
        n => {
            return Err(ConfigError::new(
                "--dpdk-src",
                format!(
                    "{n} source addresses for {} DPDK send ports: give one, or one per port",
                    ports.len()
                ),
            ))
        }
    };
    check_packet_size(max_packet)?;
    ports
        .iter()
        .zip(src)
        .map(|(port, src)| {
            let eal = DpdkConfig {
                eal_args: cfg.eal.eal_args.clone(),
                port: port.to_string(),
            };
            let send = DpdkSendConfig {
                src,
                dst_mac: cfg.dst_mac,
                ttl,
            };
            dpdk::open_sender(&eal, &send, dst)
                .map_err(|e| ConfigError::new(send_flag(&e, port_flag), e))
        })
        .collect()
}

/// Packets of `max_packet` bytes must fit one mbuf with their headers.
#[cfg(feature = "dpdk")]
fn check_packet_size(max_packet: usize) -> Result<(), ConfigError> {
    let most = dpdk::DpdkSender::max_payload();
    if max_packet > most {
        return Err(ConfigError::new(
            "--send-transport",
            format!("packets of up to {max_packet} bytes exceed DPDK's {most}-byte frames"),
        ));
    }
    Ok(())
}

#[cfg(not(feature = "dpdk"))]
fn check_packet_size(_: usize) -> Result<(), ConfigError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(src: &[&str], dst_mac: Option<Mac>) -> DpdkSend {
        DpdkSend {
            eal: DpdkConfig {
                eal_args: "-l 0 --no-huge --no-pci -m 64 --vdev=net_null0".into(),
                port: "0".into(),
            },
            src: src.iter().map(|s| s.parse().unwrap()).collect(),
            dst_mac,
        }
    }

    fn flag(dst: &str, ifaces: &[&str], ttl: u32, c: &DpdkSend, flags: SendFlags) -> &'static str {
        let dst = [dst.parse().unwrap()];
        let ifaces: Vec<String> = ifaces.iter().map(|s| s.to_string()).collect();
        match open_dpdk_senders(&dst, &ifaces, ttl, 8264, c, flags) {
            Err(e) => e.flag,
            Ok(_) => panic!("opened DPDK senders for a refused configuration"),
        }
    }

    /// Refusals that the flags alone decide name their flag, with the engines' names and
    /// dsim's, and none of them starts the EAL (which a unit test process must not).
    #[test]
    fn refusals_name_their_flag_before_the_eal_starts() {
        let one = cfg(&["10.0.0.1:7148"], None);
        for flags in [SendFlags::ENGINE, SendFlags::DSIM] {
            if !dpdk::AVAILABLE {
                assert_eq!(
                    flag("239.1.2.3:7148", &[], 4, &one, flags),
                    "--send-transport"
                );
                continue;
            }
            assert_eq!(flag("10.0.0.2:7148", &[], 4, &one, flags), "--dpdk-dst-mac");
            assert_eq!(flag("239.1.2.3:7148", &[], 300, &one, flags), flags.ttl);
            let two = cfg(&["10.0.0.1:7148", "10.0.0.2:7148"], None);
            assert_eq!(
                flag("239.1.2.3:7148", &["0", "1", "2"], 4, &two, flags),
                "--dpdk-src"
            );
        }
    }

    #[test]
    fn eal_and_port_failures_are_blamed_on_their_flags() {
        let port = DpdkError::NoPort {
            port: "net_x".into(),
            count: 1,
        };
        assert_eq!(send_flag(&port, "--send-interface"), "--send-interface");
        assert_eq!(send_flag(&port, "--dpdk-port"), "--dpdk-port");
        assert_eq!(
            send_flag(&DpdkError::Eal("x".into()), "--interface"),
            "--dpdk-args"
        );
        assert_eq!(
            send_flag(&DpdkError::NotBuilt, "--interface"),
            "--send-transport"
        );
    }
}
