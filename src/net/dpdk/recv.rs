//! Receive through a DPDK port: RX bursts of frames, parsed by `net::frame`, filtered to the
//! endpoints this receiver listens on, payloads copied into the caller's [`RecvBatch`].

use std::io;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use super::eal::{self, QueueLease};
use super::ffi::{self, DpdkStats, Mbuf, RxFrame};
use super::{DpdkConfig, DpdkError};
use crate::net::frame::{self, FrameDrop, FrameDrops, Mac, UdpChecksum};
use crate::net::udp::POLL_INTERVAL;
use crate::net::{PacketReceiver, Received, RecvBatch};

/// Most frames one RX burst takes (DPDK's customary burst is 32; a batch may take several).
const BURST: usize = 64;
/// Empty polls before the receiver starts sleeping between polls: DPDK's way is to spin, but
/// a spinning thread on an idle link starves the rest of a small host.
const SPIN_POLLS: u32 = 2000;
const NAP: Duration = Duration::from_micros(20);
/// Batches between reads of the port's counters (a register read on real NICs).
const STATS_EVERY: u32 = 256;

/// Endpoints as sorted `(address << 16) | port` keys: a binary search per frame.
struct EndpointFilter(Vec<u64>);

impl EndpointFilter {
    fn new(endpoints: &[SocketAddrV4]) -> Self {
        let mut v: Vec<u64> = endpoints.iter().map(|e| Self::key(*e)).collect();
        v.sort_unstable();
        v.dedup();
        EndpointFilter(v)
    }

    #[inline]
    fn key(e: SocketAddrV4) -> u64 {
        (u64::from(u32::from(*e.ip())) << 16) | u64::from(e.port())
    }

    #[inline]
    fn contains(&self, e: SocketAddrV4) -> bool {
        self.0.binary_search(&Self::key(e)).is_ok()
    }
}

/// A receiver on a DPDK port's RX queue.
pub struct DpdkReceiver {
    lease: QueueLease,
    filter: EndpointFilter,
    mbufs: Vec<*mut Mbuf>,
    frames: Vec<RxFrame>,
    drops: FrameDrops,
    /// The port's counters when this receiver took the queue, and lately.
    base: DpdkStats,
    stats: DpdkStats,
    batches: u32,
}

// SAFETY: the mbuf pointers are only held during one recv_batch call, by the owning thread.
unsafe impl Send for DpdkReceiver {}

impl DpdkReceiver {
    /// A receiver for `endpoints` on the configured port (see the module doc).
    pub fn open(cfg: &DpdkConfig, endpoints: &[SocketAddrV4]) -> Result<Self, DpdkError> {
        let lease = eal::lease(cfg, eal::Queue::Rx)?;
        DpdkReceiver::new(lease, endpoints).map_err(|e| DpdkError::Port {
            port: cfg.port.clone(),
            error: e.to_string(),
        })
    }

    fn new(lease: QueueLease, endpoints: &[SocketAddrV4]) -> io::Result<Self> {
        let mut macs: Vec<Mac> = endpoints
            .iter()
            .filter_map(|e| frame::multicast_mac(*e.ip()))
            .collect();
        macs.sort_unstable();
        macs.dedup();
        if !macs.is_empty() {
            // SAFETY: macs holds macs.len() six-byte arrays for the call.
            let r = unsafe { ffi::cbf_dpdk_join(lease.port.id, macs.as_ptr(), macs.len() as u32) };
            if r < 0 {
                return Err(io::Error::other(format!(
                    "DPDK port {}: cannot let multicast in: {}",
                    lease.port.name,
                    ffi::strerror(r)
                )));
            }
        }
        let base = eal::stats(&lease.port);
        let mut r = DpdkReceiver {
            lease,
            filter: EndpointFilter::new(endpoints),
            mbufs: vec![std::ptr::null_mut(); BURST],
            frames: vec![RxFrame::EMPTY; BURST],
            drops: FrameDrops::default(),
            base,
            stats: base,
            batches: 0,
        };
        r.discard_queued();
        Ok(r)
    }

    /// Drop what an earlier holder of the queue left in it.
    fn discard_queued(&mut self) {
        while self.burst(BURST) > 0 {}
    }

    /// One RX burst of up to `n` frames into `self.frames`; the frames' mbufs must be freed.
    fn burst(&mut self, n: usize) -> usize {
        let n = n.min(BURST) as u16;
        // SAFETY: mbufs and frames hold BURST entries, n ≤ BURST.
        let got = unsafe {
            ffi::cbf_dpdk_rx(
                self.lease.port.id,
                0,
                self.mbufs.as_mut_ptr(),
                self.frames.as_mut_ptr(),
                n,
            )
        };
        usize::from(got)
    }

    fn free(&mut self, n: usize) {
        // SAFETY: the first n mbufs came from the last burst and are freed exactly once.
        unsafe { ffi::cbf_dpdk_free(self.mbufs.as_mut_ptr(), n as u16) }
    }

    /// Take one frame into the batch, or count why not.
    fn take(&mut self, f: RxFrame, batch: &mut RecvBatch) {
        if f.pkt_len != f.data_len {
            // Scattered over mbufs: only frames larger than an mbuf's data room (eal::DATA_ROOM).
            self.drops.add(FrameDrop::Truncated);
            return;
        }
        if f.ip_bad != 0 {
            self.drops.add(FrameDrop::IpChecksum);
            return;
        }
        if f.l4_bad != 0 {
            self.drops.add(FrameDrop::UdpChecksum);
            return;
        }
        // SAFETY: the PMD filled data_len bytes at data, in an mbuf held until `free`.
        let bytes = unsafe { std::slice::from_raw_parts(f.data, f.data_len as usize) };
        // The UDP checksum is the NIC's to check (l4_bad above): summing every payload byte
        // here would cost as much as the copy (see net::frame).
        match frame::parse(bytes, UdpChecksum::Skip) {
            Ok(d) if self.filter.contains(d.dst) => {
                batch.push(d.payload);
            }
            Ok(_) => self.drops.add(FrameDrop::NotOurs),
            Err(cause) => self.drops.add(cause),
        }
    }

    /// The port's counters since this receiver took the queue.
    pub fn port_stats(&self) -> DpdkStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DpdkStats {
            ipackets: d(self.stats.ipackets, self.base.ipackets),
            opackets: d(self.stats.opackets, self.base.opackets),
            imissed: d(self.stats.imissed, self.base.imissed),
            ierrors: d(self.stats.ierrors, self.base.ierrors),
            oerrors: d(self.stats.oerrors, self.base.oerrors),
            rx_nombuf: d(self.stats.rx_nombuf, self.base.rx_nombuf),
        }
    }

    fn refresh_stats(&mut self) {
        self.stats = eal::stats(&self.lease.port);
    }
}

impl PacketReceiver for DpdkReceiver {
    fn slot_size(&self, max_packet: usize) -> usize {
        max_packet.min(usize::from(eal::DATA_ROOM) - frame::HEADERS_LEN)
    }

    /// Frames the port dropped before this receiver saw them: RX queue full (`imissed`) and no
    /// mbuf to receive into (`rx_nombuf`). Erroneous frames (`ierrors`) are in `port_stats`.
    fn kernel_drops(&self) -> u64 {
        let s = self.port_stats();
        s.imissed + s.rx_nombuf
    }

    /// One read of the port's counters (`rte_eth_stats_get`).
    fn refresh_kernel_drops(&mut self) {
        self.refresh_stats();
    }

    fn frame_drops(&self) -> FrameDrops {
        self.drops
    }

    /// The port's NUMA node. The frames themselves land in the port's mempool, which DPDK
    /// allocated on that node from its own (huge-page) memory, so there is nothing to bind.
    fn numa_node(&self) -> Option<u32> {
        self.lease.port.numa_node
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        self.batches = self.batches.wrapping_add(1);
        if self.batches % STATS_EVERY == 0 {
            self.refresh_stats();
        }
        let start = Instant::now();
        let mut empty = 0u32;
        loop {
            let n = self.burst(batch.capacity() - batch.len());
            for i in 0..n {
                let f = self.frames[i];
                self.take(f, batch);
            }
            self.free(n);
            if !batch.is_empty() && (n == 0 || batch.len() == batch.capacity()) {
                return Ok(Received::Packets(batch.len()));
            }
            if n == 0 {
                empty += 1;
                if start.elapsed() >= POLL_INTERVAL {
                    self.refresh_stats();
                    return Ok(Received::Idle);
                }
                if empty > SPIN_POLLS {
                    std::thread::sleep(NAP);
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}
