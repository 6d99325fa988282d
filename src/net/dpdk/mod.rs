//! Kernel-bypass transport through DPDK (issue 15; seed 000 §Network receive and §Network
//! transmit): the NIC's queues are polled from user space, so a packet costs no system call
//! and no trip through the kernel's stack. Behind the same [`PacketReceiver`]/[`PacketSender`]
//! traits as the socket transports, so heap assembly, chunking and rate limiting above are
//! unchanged.
//!
//! - The EAL is initialised once per process from `--dpdk-args` (whitespace-separated EAL
//!   arguments, e.g. `-l 0 --no-huge --no-pci -m 256 --vdev=net_ring0`); a second,
//!   different set of arguments is refused, so an engine's DPDK receive and DPDK send share it.
//!   A port (an index or a device name) is started once with one RX queue and one TX queue per
//!   sender ([`plan_senders`] says how many before it starts; one otherwise); one receiver
//!   holds the RX queue and each sender a TX queue of its own, no lock between them (see
//!   `eal`), so one process can receive and send on one port (`net_ring` loops frames back)
//!   or on several.
//! - Receive: RX bursts; each frame is parsed by [`crate::net::frame`] and kept only if it is a
//!   datagram to one of the receiver's endpoints (others are counted as `not_ours`, malformed
//!   ones by cause, and freed at once); the frames kept are lent to the caller's
//!   [`RecvBatch`](crate::net::RecvBatch) in their mbufs, which go back to the pool when the
//!   batch is cleared, so the payload is copied once, into the chunk. The port's pool is sized
//!   for every holder of mbufs at once, lent ones included (`eal::PoolNeed`, checked when the
//!   port starts), so that the RX queue never runs dry for want of them.
//!   Multicast groups' MACs go into the port's filter list where the PMD has one, else all
//!   multicast is let in; the software filter applies either way. The port's `imissed` and
//!   `rx_nombuf` are reported as the transport's drops; `ierrors` with the port's counters.
//! - Send: each packet is copied once into an mbuf behind the headers [`crate::net::frame`]
//!   builds for its destination (multicast MACs mapped; unicast needs `--dpdk-dst-mac`), from
//!   the port's MAC and `--dpdk-src`. The engines reach it through `--send-transport dpdk`
//!   (`engine::send`), above which the rate limit and multi-port balancing are the UDP path's;
//!   a TX queue that stays full for a second is reported as the link being down (ENETDOWN).
//!
//! The C side is `ffi/dpdk_shim.c`, compiled by `build.rs` only with cargo feature `dpdk`
//! (DPDK's burst calls are inline functions in its headers). Without the feature the opening
//! functions refuse with [`DpdkError::NotBuilt`], which the engines report against the flag.
//! Not here (yet): several RX queues with RSS or `rte_flow` steering (one receive thread per
//! port); receiving into chunk memory through external mbufs (no copy at all: the payload is
//! copied once, from the mbuf into the chunk).

use std::net::SocketAddrV4;

use super::frame::{FrameError, Mac};
use super::{PacketReceiver, PacketSender};

#[cfg(feature = "dpdk")]
mod eal;
#[cfg(feature = "dpdk")]
mod eal_affinity;
#[cfg(feature = "dpdk")]
mod ffi;
#[cfg(feature = "dpdk")]
mod recv;
#[cfg(feature = "dpdk")]
mod send;

#[cfg(feature = "dpdk")]
pub use ffi::DpdkStats;
#[cfg(feature = "dpdk")]
pub use recv::DpdkReceiver;
#[cfg(feature = "dpdk")]
pub use send::DpdkSender;

/// Whether this build has the DPDK transport (cargo feature `dpdk`).
pub const AVAILABLE: bool = cfg!(feature = "dpdk");

/// The EAL and the port (`--dpdk-args`, `--dpdk-port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkConfig {
    /// EAL arguments, whitespace-separated (no quoting).
    pub eal_args: String,
    /// A port index (`0`) or a device name (`net_ring0`).
    pub port: String,
}

/// What frames are sent from (`--dpdk-src`, `--dpdk-dst-mac`, `--ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpdkSendConfig {
    /// Source address and UDP port written into every frame.
    pub src: SocketAddrV4,
    /// The next hop's MAC for unicast destinations (multicast ones map to their own).
    pub dst_mac: Option<Mac>,
    pub ttl: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DpdkError {
    #[error("this build has no DPDK transport: build with `cargo build --features dpdk` (needs libdpdk-dev)")]
    NotBuilt,
    #[error("DPDK EAL: {0}")]
    Eal(String),
    #[error("the DPDK EAL is already initialised with {first:?}; one EAL per process, so {second:?} cannot be used too")]
    EalTwice { first: String, second: String },
    #[error("no DPDK port {port:?} ({count} ports found; check the EAL's --vdev/-a arguments)")]
    NoPort { port: String, count: u16 },
    #[error("DPDK port {port}: {error}")]
    Port { port: String, error: String },
    #[error("DPDK port {port}: its receive queue is already in use (one receiver per port)")]
    QueueTaken { port: String },
    #[error("DPDK port {port}: {senders} senders need a TX queue each, but its driver has at most {max} (net_af_packet: raise qpairs= in its --vdev)")]
    TxQueues {
        port: String,
        senders: u16,
        max: u16,
    },
    #[error("DPDK port {port}: its {queues} TX queue(s) are all held (one per sender, counted when the port started)")]
    TxQueuesTaken { port: String, queues: u16 },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Plan the TX queues of ports before they start (see `eal`): each `(port, senders)` says that
/// up to `senders` senders of this process will send through the port at once, each on a TX
/// queue of its own. Refused where the port's driver has fewer queues.
pub fn plan_senders(eal_args: &str, ports: &[(String, u16)]) -> Result<(), DpdkError> {
    #[cfg(feature = "dpdk")]
    {
        eal::plan_tx(eal_args, ports)
    }
    #[cfg(not(feature = "dpdk"))]
    {
        let _ = (eal_args, ports);
        Err(DpdkError::NotBuilt)
    }
}

/// A receiver for `endpoints` on the configured port.
pub fn open_receiver(
    cfg: &DpdkConfig,
    endpoints: &[SocketAddrV4],
) -> Result<Box<dyn PacketReceiver>, DpdkError> {
    #[cfg(feature = "dpdk")]
    {
        Ok(Box::new(DpdkReceiver::open(cfg, endpoints)?))
    }
    #[cfg(not(feature = "dpdk"))]
    {
        let _ = (cfg, endpoints);
        Err(DpdkError::NotBuilt)
    }
}

/// A sender to `dests` on the configured port.
pub fn open_sender(
    cfg: &DpdkConfig,
    send: &DpdkSendConfig,
    dests: &[SocketAddrV4],
) -> Result<Box<dyn PacketSender>, DpdkError> {
    #[cfg(feature = "dpdk")]
    {
        Ok(Box::new(DpdkSender::open(cfg, send, dests)?))
    }
    #[cfg(not(feature = "dpdk"))]
    {
        let _ = (cfg, send, dests);
        Err(DpdkError::NotBuilt)
    }
}
