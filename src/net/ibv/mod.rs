//! The ibverbs transport (cargo feature `ibv`): UDP over IPv4 through a raw-packet queue pair
//! on an NVIDIA (Mellanox) NIC, bypassing the kernel's stack, as spead2's `udp_ibv` readers
//! and writer do (facts §2: IPv4 only, no VLAN, options or fragments; CAP_NET_RAW needed).
//!
//! - Receive ([`IbvReceiver`]): one queue pair per receive thread; one steering rule per
//!   `--src` endpoint (destination IP and port, and the group's multicast MAC, since some NICs
//!   need an Ethernet match) sends the matching frames there and nowhere else; the kernel
//!   socket only joins the groups, so that IGMP tells the switch to forward them. Each frame is
//!   checked by `net::frame::parse` and lent to the caller's [`RecvBatch`](super::RecvBatch)
//!   where the NIC wrote it (the payload is copied once, by the chunk stream into the chunk);
//!   its memory goes back to the NIC when the batch is cleared (the next receive call) or
//!   dropped, a refused frame's at once. The receive memory is bound to the device's NUMA
//!   node (or `--recv-numa-node`) before it is registered (`placement`). The receive queue is
//!   chosen at start-up and logged (`--recv-ibv-mprq`, [`StridingRq`]):
//!   - a *striding* (multi-packet) queue where the device has one (mlx5dv: ConnectX-4 and
//!     later), as spead2's `udp_ibv` reader uses: 1 MiB buffers of 64-byte strides, each
//!     posted as one request that the NIC packs frames into, behind an RSS queue pair
//!     (`mprq_verbs`, `ffi/ibv_mprq_shim.c`); completions through an extended completion queue
//!     give each frame's strides and bytes, and a buffer goes back only when the NIC has
//!     finished it and every frame lent from it is back (`mprq_ledger`, `recv_mprq`);
//!   - else a ring of frame-sized slots, one request per frame, which every verbs NIC supports
//!     (`recv_slots`).
//! - Send ([`IbvSender`]): one queue pair per interface with a ring of frame-sized slots (bound
//!   to the device's NUMA node before it is registered, `placement`); each
//!   packet is written into a slot behind `net::frame`'s Ethernet/IPv4/UDP headers (one copy,
//!   as the kernel path makes), the batch is posted as one chain with only its last request
//!   signalled, and slots come back when that completion is reaped. With `--use-peerdirect`
//!   a packet's payload stays in GPU memory: the slot holds only its headers and the NIC
//!   gathers the payload from a registered region of device memory (`send`, `send_frames`;
//!   `peer` makes the start-up probe's trial registration). A link that fails under posted
//!   requests (an error completion, no progress, or the kernel saying the link is down) resets
//!   the queue pair, so that the NIC reads none of their memory again, and is reported as a
//!   link error counting the packets lost (`send_queue`): the send stream moves the
//!   interface's share to the others.
//! - Completions ([`CompMode`]): `--recv-comp-vector`/`--send-comp-vector` ≥ 0 puts the
//!   completion queue on that interrupt vector (modulo the device's count) and a thread with
//!   nothing to do sleeps on the completion channel; a negative value polls (a core spins, for
//!   the lowest latency), katgpucbf's meanings.
//!
//! No RDMA hardware was available to run any of this: the tests cover the refusals, device
//! lookup through a fake sysfs, the structure layouts against the C compiler's, the work
//! requests and frames built as data, the receive slots' lending and giving back and the send
//! ring's failures driven by completions given as data (`recv_slots`, `send_queue`), the
//! striding queue's sizes from device capabilities given as data (`mprq_verbs::plan`), and its
//! buffers' lending and reposting driven by completion words given as data and by a model NIC
//! (`mprq_ledger`, `recv_mprq`). Not exercised: every verbs and mlx5dv call itself, among them
//! the striding work queue's creation, the requests the shim writes into its ring and the
//! doorbell, the extended completion queue's byte count words on a real NIC, the fallback when
//! a device that reports striding queues refuses one, and a real NIC's behaviour when its link
//! goes down under posted sends.

mod device;
mod mprq_ledger;
mod mprq_verbs;
mod peer;
mod placement;
mod recv;
mod recv_mprq;
mod recv_slots;
mod send;
mod send_frames;
mod send_queue;
mod verbs;

use std::fmt;

pub use device::{find, rdma_devices, IbvDevice};
pub use peer::try_register;
pub use recv::IbvReceiver;
pub use send::IbvSender;

/// Why an ibverbs transport could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum IbvError {
    /// No RDMA device, or no kernel support for RDMA, on this host.
    #[error("no RDMA device: {0} (ibverbs needs an RDMA-capable NIC such as an NVIDIA ConnectX and its kernel driver; use the udp transport)")]
    NoDevice(String),
    /// The interface named is unknown or has no RDMA device.
    #[error("interface {0:?} {1}")]
    Interface(String, String),
    /// A verbs call failed.
    #[error("{0}")]
    Verbs(#[from] std::io::Error),
    #[error("{0}")]
    Config(String),
    /// The receive ring could not be bound to the NUMA node asked for (`--recv-numa-node`).
    #[error("receive ring: {0}")]
    Numa(#[from] crate::net::numa::NumaError),
    /// A striding receive queue was demanded (`--recv-ibv-mprq on`) of a device without one.
    #[error("no striding (multi-packet) receive queue: {0}")]
    NoStridingRq(String),
}

/// Which receive queue an [`IbvReceiver`] uses (`--recv-ibv-mprq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StridingRq {
    /// A striding queue where the device has one, else one slot per frame.
    #[default]
    Auto,
    /// A striding queue, or an error.
    On,
    /// One slot per frame.
    Off,
}

/// How a queue's completions are waited for (katgpucbf's `--*-comp-vector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompMode {
    /// Spin on the completion queue (comp vector < 0).
    Polling,
    /// Sleep on a completion channel whose interrupts go to this vector (modulo the device's
    /// vector count).
    Interrupt(u32),
}

impl CompMode {
    /// katgpucbf's convention: a negative vector means polling.
    pub fn from_vector(v: i32) -> CompMode {
        u32::try_from(v).map_or(CompMode::Polling, CompMode::Interrupt)
    }
}

impl fmt::Display for CompMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompMode::Polling => write!(f, "polling"),
            CompMode::Interrupt(v) => write!(f, "interrupts on vector {v}"),
        }
    }
}

/// Most frame slots one queue may have (a bound on registered memory: 65536 × 9 KiB =
/// 576 MiB; devices cap it lower still, `max_qp_wr`, e.g. 32768 on ConnectX-5); also the
/// most packets a sender can lose in flight (`net::MAX_IN_FLIGHT`).
pub const MAX_SLOTS: usize = crate::net::MAX_IN_FLIGHT;

/// Slots for a buffer of `bytes` with frames of `frame` bytes: at least 2, at most
/// [`MAX_SLOTS`].
pub fn slots_for(bytes: usize, frame: usize) -> usize {
    (bytes / frame.max(1)).clamp(2, MAX_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::verbs::{chain_send, fill_recv, FlowRule, Gather};
    use super::*;
    use ibverbs_sys as ffi;
    use std::net::{Ipv4Addr, SocketAddrV4};

    #[test]
    fn comp_vector_sign_chooses_the_mode() {
        assert_eq!(CompMode::from_vector(-1), CompMode::Polling);
        assert_eq!(CompMode::from_vector(0), CompMode::Interrupt(0));
        assert_eq!(CompMode::from_vector(7), CompMode::Interrupt(7));
        assert_eq!(slots_for(128 << 20, 9242), 14_522);
        assert_eq!(slots_for(1, 9242), 2);
        assert_eq!(slots_for(usize::MAX, 64), MAX_SLOTS);
    }

    /// bindgen's layouts (what Rust builds and reads) against the C compiler's (what
    /// libibverbs reads and writes).
    #[test]
    fn rust_and_c_agree_on_layouts() {
        let mut c = [0usize; 5];
        // SAFETY: the shim writes five sizes.
        unsafe { verbs::cbf_ibv_layout(c.as_mut_ptr()) };
        let rust = [
            std::mem::size_of::<ffi::ibv_send_wr>(),
            std::mem::size_of::<ffi::ibv_recv_wr>(),
            std::mem::size_of::<ffi::ibv_sge>(),
            std::mem::size_of::<ffi::ibv_wc>(),
            FlowRule::udp(1, [0; 6], SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 1))
                .bytes()
                .len(),
        ];
        assert_eq!(rust, c);
    }

    /// A steering rule for a multicast endpoint read back at the C compiler's offsets: the
    /// group's MAC (RFC 1112: 01:00:5e and the low 23 bits), the address and port in network
    /// order, full masks; for an unspecified address only the port is matched.
    #[test]
    fn flow_rule_matches_mac_ip_and_port() {
        let mut off = [0usize; 6];
        // SAFETY: the shim writes six offsets.
        unsafe { verbs::cbf_ibv_flow_rule_offsets(off.as_mut_ptr()) };
        let mac = [0x01, 0x00, 0x5e, 0x0a, 0x0a, 0x0b];
        let ep = SocketAddrV4::new(Ipv4Addr::new(239, 10, 10, 11), 7148);
        let r = FlowRule::udp(2, mac, ep);
        let b = r.bytes();
        assert_eq!(&b[off[0]..off[0] + 6], &mac);
        assert_eq!(&b[off[1]..off[1] + 4], &[239, 10, 10, 11]);
        assert_eq!(&b[off[2]..off[2] + 2], &7148u16.to_be_bytes());
        assert_eq!(&b[off[3]..off[3] + 6], &[0xff; 6]);
        assert_eq!(&b[off[4]..off[4] + 4], &[0xff; 4]);
        assert_eq!(&b[off[5]..off[5] + 2], &[0xff; 2]);
        // ibv_flow_attr: size (u16 at 8) is the whole rule, 3 specs (u8 at 12), port (u8 at 13).
        assert_eq!(usize::from(u16::from_ne_bytes([b[8], b[9]])), b.len());
        assert_eq!((b[12], b[13]), (3, 2));
        let any = FlowRule::udp(1, mac, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7148));
        let a = any.bytes();
        assert_eq!(&a[off[3]..off[3] + 6], &[0; 6]);
        assert_eq!(&a[off[4]..off[4] + 4], &[0; 4]);
        assert_eq!(&a[off[5]..off[5] + 2], &[0xff; 2]);
    }

    #[test]
    fn send_requests_chain_in_order_and_signal_the_last() {
        let mut wrs = vec![ffi::ibv_send_wr::default(); 4];
        let mut sges = vec![ffi::ibv_sge::default(); 8];
        let frames = [(0x1000, 100), (0x2000, 200), (0x3000, 300)].map(|frame| Gather {
            frame,
            device: None,
        });
        chain_send(&mut wrs, &mut sges, &frames, 77);
        for i in 0..3 {
            let w = &wrs[i];
            assert_eq!(w.num_sge, 1);
            assert_eq!(w.opcode, ffi::ibv_wr_opcode::IBV_WR_SEND);
            assert!(std::ptr::eq(w.sg_list, &sges[2 * i]));
            assert_eq!(
                (sges[2 * i].addr, sges[2 * i].length, sges[2 * i].lkey),
                (frames[i].frame.0, frames[i].frame.1, 77)
            );
            let signalled = w.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            assert_eq!(signalled, i == 2);
            if i < 2 {
                assert!(std::ptr::eq(w.next, &wrs[i + 1]));
            } else {
                assert!(w.next.is_null());
                assert_eq!(w.wr_id, 3, "the last request carries the count");
            }
        }
    }

    #[test]
    fn receive_requests_point_at_their_slots() {
        let mut wr = ffi::ibv_recv_wr::default();
        let mut sge = ffi::ibv_sge::default();
        fill_recv(&mut wr, &mut sge, 0x10_0000, 5, 9216, 3);
        assert_eq!(
            (sge.addr, sge.length, sge.lkey),
            (0x10_0000 + 5 * 9216, 9216, 3)
        );
        assert_eq!((wr.wr_id, wr.num_sge), (5, 1));
        assert!(wr.next.is_null() && std::ptr::eq(wr.sg_list, &sge));
    }
}
