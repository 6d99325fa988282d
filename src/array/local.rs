//! The plan of a local run (`cbf array run --local`): the same planner, with what a run of the
//! whole array as processes on this one host needs instead of the description's network.
//!
//! - Every group becomes its **loopback twin**: the multicast group `a.b.c.d` becomes the
//!   unicast address `127.b.c.d` (the whole of 127.0.0.0/8 is this host's), on the same port.
//!   Multicast does not work on the loopback interface of the root network namespace (the
//!   kernel routes it out of the default interface: `reference/dependencies.md`), and a
//!   unicast stream has one receiver, which is all a plan's streams need: a digitiser stream
//!   goes to one F-engine, an F→X group to one XB-engine. Each receiver binds its own address,
//!   so all share the description's port. Two descriptions with different prefixes run side by
//!   side.
//! - Each antenna's digitiser stream is **one** loopback address for both polarisations: the
//!   F-engine tells them apart by the digitiser_id's LSB (facts §1.9), and one address keeps
//!   its receive socket bound to that address (a list of several unicast addresses would bind
//!   the wildcard address and take every F-engine's traffic on the port).
//! - A dsim per antenna is always planned: it is the run's source.
//! - The k-th engine of the plan listens for katcp on `network.katcp_port_base` + k and
//!   serves Prometheus on `network.prometheus_port_base` + k, on 127.0.0.1 only, so that
//!   engines placed on different nodes of the description do not meet on one port here.
//! - Nothing is pinned (the description's cores are its nodes', not this host's), every
//!   engine sends and receives through 127.0.0.1, argv\[0\] is this host's `cbf`, and the sync
//!   time is the run's start (a run starts its own digitisers).
//! - Explicit streams of the description (`antennas[].digitiser`, `bands[].fx_dst`) belong to
//!   its network and are not used; the described NICs and PCIe links carry nothing, so their
//!   loads are not checked.
#![deny(unsafe_code)]

use std::net::Ipv4Addr;

use super::config::ArrayConfig;
use super::groups::Groups;
use super::place::Placement;
use super::ArrayError;

/// Most engines (processes) a local run starts: a launcher for tests and demos on one host,
/// not a scheduler. The 4-antenna example (4 dsims, 4 F-engines, 2 XB-engines) fits.
pub const MAX_LOCAL_ENGINES: usize = 16;

/// What a local run sets that the description does not.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalRun {
    /// This host's `cbf` (argv\[0\] of every engine).
    pub binary: String,
    /// UNIX time of timestamp 0 for every engine.
    pub sync_time: f64,
}

/// The address every local engine sends, receives and serves control on.
pub const LOCAL_ADDRESS: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The loopback twin of a multicast group: `127` and the group's low 24 bits.
pub fn loopback(addr: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(addr) & 0x00ff_ffff) | 0x7f00_0000)
}

/// `g` with every group replaced by its loopback twin. The twins stay consecutive: a prefix
/// of /8 or longer lies within one low-24-bit block, and a shorter one starts at its zero.
/// The network address (127.0.0.0) and the broadcast address (127.255.255.255) of the
/// loopback network are refused, naming the prefix.
pub(super) fn loopback_groups(g: Groups) -> Result<Groups, ArrayError> {
    let twin = Groups {
        first: loopback(g.first),
        ..g
    };
    for (group, a) in g.addrs().zip(twin.addrs()) {
        let ip = *a.ip();
        let edge = match ip.octets() {
            [_, 0, 0, 0] => "network",
            [_, 255, 255, 255] => "broadcast",
            _ => continue,
        };
        return Err(ArrayError::config(
            "network.multicast",
            format!(
                "a local run sends group {} to its loopback twin {ip}, the loopback network's {edge} address: start the prefix elsewhere",
                group.ip()
            ),
        ));
    }
    Ok(twin)
}

/// Engines a local run of `cfg` starts: per band a dsim and an F-engine per antenna and the
/// XB-engines; refused over [`MAX_LOCAL_ENGINES`] before anything is placed.
pub(super) fn check_size(cfg: &ArrayConfig) -> Result<usize, ArrayError> {
    let n = cfg.bands.iter().map(|b| b.x_engines).fold(
        cfg.antennas.len().saturating_mul(2 * cfg.bands.len()),
        usize::saturating_add,
    );
    if n > MAX_LOCAL_ENGINES {
        return Err(ArrayError::config(
            "antennas",
            format!(
                "a local run starts at most {MAX_LOCAL_ENGINES} processes; {} antennas (a dsim and an F-engine each) and bands[].x_engines = {:?} make {n}",
                cfg.antennas.len(),
                cfg.bands.iter().map(|b| b.x_engines).collect::<Vec<_>>()
            ),
        ));
    }
    let net = &cfg.network;
    let (k, p) = (
        usize::from(net.katcp_port_base),
        usize::from(net.prometheus_port_base),
    );
    if k == 0 || p == 0 || k.max(p) + n > 65536 || k.abs_diff(p) < n {
        return Err(ArrayError::config(
            "network.prometheus_port_base",
            format!(
                "a local run of {n} engines needs katcp ports {k}–{} and Prometheus ports {p}–{}, which must not overlap, start at 0 or pass 65535",
                k + n - 1,
                p + n - 1
            ),
        ));
    }
    Ok(n)
}

/// The placement of the `k`-th engine of a local run: the described node's slot (its core
/// count sizes the engine's threads), with this run's ports. [`check_size`] has bounded them.
pub(super) fn relocate(cfg: &ArrayConfig, at: Placement, k: usize) -> Placement {
    let port = |base: u16| base.saturating_add(k as u16);
    Placement {
        katcp_port: port(cfg.network.katcp_port_base),
        prometheus_port: port(cfg.network.prometheus_port_base),
        ..at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_twins_keep_the_low_bits_and_refuse_the_edges() {
        assert_eq!(
            loopback(Ipv4Addr::new(239, 10, 0, 7)),
            Ipv4Addr::new(127, 10, 0, 7)
        );
        let g = Groups {
            first: Ipv4Addr::new(239, 10, 0, 254),
            count: 3,
            port: 7148,
        };
        let t = loopback_groups(g).unwrap();
        assert_eq!(t.endpoint(), "127.10.0.254+2:7148");
        let edge = Groups {
            first: Ipv4Addr::new(239, 0, 0, 0),
            count: 1,
            port: 7148,
        };
        let e = loopback_groups(edge).unwrap_err();
        assert_eq!(e.key(), Some("network.multicast"));
        assert!(e.to_string().contains("239.0.0.0"), "{e}");
        let top = Groups {
            first: Ipv4Addr::new(224, 255, 255, 255),
            count: 1,
            port: 7148,
        };
        assert!(loopback_groups(top).is_err());
    }
}
