//! The transmit side every engine shares (seed 000 §Network transmit): each output's send
//! stream is owned by its own thread, so rate-limited sends (paced at `--send-rate-factor` × the
//! data rate, hence busy most of real time by design) never hold up the compute. Finished output
//! buffers are copied into one of a few preallocated buffers that circulate between the engine
//! and the thread; when all are in flight the engine waits (back-pressure instead of loss).
//! What a buffer becomes on the wire is the engine's [`HeapFormat`]; descriptors go out on a
//! timer, unpaced, as katgpucbf sends them. The thread and its buffers are `send_sink`'s
//! ([`HeapSink`]); this module opens the streams.
//!
//! With `--use-peerdirect` (seed 000 §PeerDirect) nothing is copied: the engine hands the
//! thread a [`DevicePayload`] — where the heaps' bytes lie in GPU memory and a lease
//! (`engine::lease`) on the buffer holding them — the packets gather their payload from there
//! (`net::ibv`), and the lease is dropped, giving the buffer back, only once the NIC is done
//! with every packet (`SendStream::wait_sent`): sent, or taken back from a link that failed
//! under them, which is counted and absorbed like any other interface failure (`send_sink`).

use std::net::SocketAddrV4;
use std::sync::Arc;

pub use super::send_dpdk::DpdkSend;
use super::send_dpdk::{open_dpdk_senders, plan_dpdk_senders};
pub use super::send_sink::{
    BufferPool, DescriptorSchedule, DevicePayload, HeapSink, InterfaceCounters, SendThread,
    SinkCounters,
};
use super::ConfigError;
use crate::net::udp::UdpSender;
use crate::net::uring_send::{self, UringSender};
use crate::net::{DeviceBytes, DeviceMemory, NetSender};
use crate::spead::send::{Heap, SendStream, SendStreamConfig};

/// How an engine's finished buffers become heaps: one heap per substream (destination) of each
/// buffer, plus the stream's descriptors.
pub trait HeapFormat: Send + Sync + 'static {
    /// What travels with a buffer besides its bytes (a timestamp, `beam_ants`, ...).
    type Meta: Send + 'static;
    /// Substreams (destinations) a buffer is split over.
    fn substreams(&self) -> usize;
    /// The heap for `substream` of one buffer, or `None` to send nothing there this time
    /// (a beam whose capture is stopped).
    fn heap<'a>(&self, data: &'a [u8], meta: &Self::Meta, substream: usize) -> Option<Heap<'a>>;
    /// [`HeapFormat::heap`] for a buffer whose bytes stay in device memory
    /// (`--use-peerdirect`); an error where this format has no such form (the engines refuse
    /// the flag before that can happen).
    fn device_heap(
        &self,
        data: DeviceBytes,
        meta: &Self::Meta,
        substream: usize,
    ) -> Result<Option<Heap<'static>>, String> {
        let _ = (data, meta, substream);
        Err("this stream cannot send from device memory".into())
    }
    /// The descriptor heap sent to `substream`.
    fn descriptors(&self, substream: usize) -> Heap<'static>;
}

/// How an output's packets leave the host (`--send-transport`, `--send-ibv`,
/// `--send-comp-vector`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SendTransport {
    /// Kernel UDP sockets (`net::udp`).
    #[default]
    Udp,
    /// The same sockets through io_uring's zero-copy `sendmsg` (`net::uring_send`).
    Uring,
    /// ibverbs raw-packet queue pairs (`net::ibv`, cargo feature `ibv`), one per interface,
    /// completions on `comp_vector` (negative: polling).
    Ibv { comp_vector: i32 },
    /// DPDK ports polled from user space (`net::dpdk`, cargo feature `dpdk`), one per
    /// interface; see [`super::send_dpdk`].
    Dpdk(DpdkSend),
}

impl SendTransport {
    /// Say, before any transport starts, that the process will open `streams` send streams
    /// over this transport, each with a sender per interface: DPDK ports then start with a TX
    /// queue per sender (`send_dpdk`). `count_flag` names what set `streams` when that is
    /// the flag to blame for too many (dsim's `--send-threads`). Nothing for other transports.
    pub fn plan(
        &self,
        interfaces: &[String],
        streams: usize,
        flags: SendFlags,
        count_flag: Option<&'static str>,
    ) -> Result<(), ConfigError> {
        match self {
            SendTransport::Dpdk(cfg) => {
                plan_dpdk_senders(interfaces, streams, cfg, flags, count_flag)
            }
            SendTransport::Udp | SendTransport::Uring | SendTransport::Ibv { .. } => Ok(()),
        }
    }
}

/// The flags an error of [`open_senders`] names, which differ between the engines and dsim
/// (katgpucbf dsim's send flags carry no `send-` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendFlags {
    /// The interface list.
    pub interface: &'static str,
    /// The ibverbs switch.
    pub ibv: &'static str,
    /// The multicast TTL.
    pub ttl: &'static str,
}

impl SendFlags {
    /// fengine's, xbengine's and fsim's names.
    pub const ENGINE: SendFlags = SendFlags {
        interface: "--send-interface",
        ibv: "--send-ibv",
        ttl: "--send-ttl",
    };
    /// dsim's names.
    pub const DSIM: SendFlags = SendFlags {
        interface: "--interface",
        ibv: "--ibv",
        ttl: "--ttl",
    };
}

/// One sender per interface (one on the default route when none is named), each knowing
/// every destination of `dst`, over `transport`. ibverbs needs named interfaces; DPDK takes
/// its ports from them (or `--dpdk-port`).
pub fn open_senders(
    dst: &[SocketAddrV4],
    interfaces: &[String],
    ttl: u32,
    buffer: usize,
    max_packet: usize,
    transport: &SendTransport,
    flags: SendFlags,
) -> Result<Vec<NetSender>, ConfigError> {
    let wire = Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    };
    open_gathering(wire, transport, flags, &[])
}

/// Where and how [`open_senders`]' senders send.
#[derive(Clone, Copy)]
struct Wire<'a> {
    dst: &'a [SocketAddrV4],
    interfaces: &'a [String],
    ttl: u32,
    buffer: usize,
    max_packet: usize,
}

/// [`open_senders`] whose packets may gather payload from `device` memory, which only ibverbs
/// can (`--use-peerdirect`; the engines refuse the flag on other transports first).
fn open_gathering(
    wire: Wire<'_>,
    transport: &SendTransport,
    flags: SendFlags,
    device: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    let Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    } = wire;
    if !device.is_empty() && !matches!(transport, SendTransport::Ibv { .. }) {
        return Err(ConfigError::new(
            "--use-peerdirect",
            format!("needs {}", flags.ibv),
        ));
    }
    match transport {
        SendTransport::Udp => interfaces_or_default(interfaces)
            .into_iter()
            .map(|i| UdpSender::new(dst, i, ttl, buffer).map(|s| Box::new(s) as NetSender))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError::new(flags.interface, e)),
        SendTransport::Uring => {
            // A kernel without io_uring is the transport's fault, not an interface's.
            uring_send::probe().map_err(|e| ConfigError::new("--send-transport", e))?;
            tracing::info!(
                interfaces = interfaces.len().max(1),
                "sending through io_uring's zero-copy sendmsg"
            );
            interfaces_or_default(interfaces)
                .into_iter()
                .map(|i| UringSender::new(dst, i, ttl, buffer).map(|s| Box::new(s) as NetSender))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::new(flags.interface, e))
        }
        SendTransport::Ibv { comp_vector } => open_ibv(wire, *comp_vector, flags, device),
        SendTransport::Dpdk(cfg) => open_dpdk_senders(dst, interfaces, ttl, max_packet, cfg, flags),
    }
}

/// One entry per named interface, or the default route's.
fn interfaces_or_default(interfaces: &[String]) -> Vec<Option<&str>> {
    if interfaces.is_empty() {
        vec![None]
    } else {
        interfaces.iter().map(|s| Some(s.as_str())).collect()
    }
}

#[cfg(feature = "ibv")]
fn open_ibv(
    wire: Wire<'_>,
    comp_vector: i32,
    flags: SendFlags,
    device: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    let Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    } = wire;
    let (iface_flag, ibv_flag) = (flags.interface, flags.ibv);
    use crate::net::ibv::{rdma_devices, IbvSender};
    // First whether this host has RDMA at all, so that the refusal says so.
    rdma_devices().map_err(|e| ConfigError::new(ibv_flag, e))?;
    if interfaces.is_empty() {
        return Err(ConfigError::new(
            iface_flag,
            format!("{ibv_flag} needs the interface(s) to send from"),
        ));
    }
    interfaces
        .iter()
        .map(|i| {
            IbvSender::open(dst, i, ttl, buffer, max_packet, comp_vector, device)
                .map(|s| Box::new(s) as NetSender)
                .map_err(|e| ConfigError::new(ibv_flag, e))
        })
        .collect()
}

#[cfg(not(feature = "ibv"))]
fn open_ibv(
    _: Wire<'_>,
    _: i32,
    flags: SendFlags,
    _: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    Err(ConfigError::new(flags.ibv, crate::net::IBV_NOT_BUILT))
}

/// The wire side of one output: destinations, interface, TTL and the send stream's settings.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub dst: Vec<SocketAddrV4>,
    /// Interfaces (names or addresses) to send from; several share the rate (multi-NIC).
    pub interfaces: Vec<String>,
    pub ttl: u32,
    /// Socket send buffer (`--send-buffer`), or the ibverbs ring of frames.
    pub buffer: usize,
    pub transport: SendTransport,
    pub config: SendStreamConfig,
}

impl StreamSpec {
    /// Open the senders (one per interface, or one on the default route).
    pub fn open(&self) -> Result<SendStream<NetSender>, ConfigError> {
        self.open_with(&[])
    }

    /// [`StreamSpec::open`] with `device` memory registered with every sender, for heaps
    /// sent from it (`--use-peerdirect`; ibverbs only).
    pub fn open_with(
        &self,
        device: &[Arc<dyn DeviceMemory>],
    ) -> Result<SendStream<NetSender>, ConfigError> {
        let wire = Wire {
            dst: &self.dst,
            interfaces: &self.interfaces,
            ttl: self.ttl,
            buffer: self.buffer,
            max_packet: self.config.max_packet_size,
        };
        let senders = open_gathering(wire, &self.transport, SendFlags::ENGINE, device)?;
        let mut stream = SendStream::new(self.config, senders)
            .map_err(|e| ConfigError::new(SendFlags::ENGINE.interface, e))?;
        stream.set_interface_names(&self.interfaces);
        Ok(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::recv::{assert_ibv_refusal, rdma_available};

    /// `--send-ibv` (dsim `--ibv`) is refused at start-up, by the flag the caller names.
    #[test]
    fn ibv_without_rdma_is_refused_by_name() {
        if rdma_available() {
            eprintln!("skipped: this host has RDMA devices");
            return;
        }
        let dst = ["239.10.10.10:7148".parse().unwrap()];
        for flags in [SendFlags::ENGINE, SendFlags::DSIM] {
            let ibv = SendTransport::Ibv { comp_vector: 0 };
            let Err(e) = open_senders(&dst, &["lo".into()], 4, 1 << 20, 8264, &ibv, flags) else {
                panic!("opened an ibverbs sender without RDMA")
            };
            assert_ibv_refusal(&e, flags.ibv);
        }
    }
}
