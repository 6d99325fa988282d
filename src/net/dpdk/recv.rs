//! Receive through a DPDK port: RX bursts of frames, parsed by `net::frame`, filtered to the
//! endpoints this receiver listens on; the frames kept are *lent* to the caller's
//! [`RecvBatch`] (`net::recv_batch`) in their mbufs, so that the payload is copied once, by the
//! chunk stream into the chunk, and the mbufs go back to the pool when the batch is cleared (the
//! next receive call) or dropped. Frames refused (not ours, bad checksums, truncated, malformed)
//! are freed at once. The receiver lends at most [`MAX_LENT`] mbufs at a time, whatever the
//! batches' capacity, so that the pool (sized for it: `eal::PoolNeed`) can always refill the RX
//! queue.

use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::eal::{self, QueueLease};
use super::ffi::{self, DpdkStats, Mbuf, RxFrame};
use super::{DpdkConfig, DpdkError};
use crate::net::frame::{self, FrameDrop, FrameDrops, Mac, UdpChecksum};
use crate::net::recv_batch::Lender;
use crate::net::udp::POLL_INTERVAL;
use crate::net::{PacketReceiver, Received, RecvBatch};

/// Most frames one RX burst takes (DPDK's customary burst is 32; a batch may take several).
const BURST: usize = 64;
/// Most mbufs lent to batches at once (four bursts; cbf's receive loops use batches of 64): a
/// receive call takes no more frames while this many are out, and the port's pool counts them
/// (`eal::PoolNeed`).
pub(super) const MAX_LENT: usize = 256;
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

/// Lends received mbufs to batches: a handle is an mbuf's address; given back, the mbufs are
/// freed to the port's pool (DPDK's pools take frees from any thread).
#[derive(Debug, Default)]
struct MbufLender {
    /// mbufs lent and not yet given back.
    out: AtomicUsize,
}

impl MbufLender {
    /// mbufs that may still be lent before [`MAX_LENT`] are out.
    fn room(&self) -> usize {
        MAX_LENT.saturating_sub(self.out.load(Ordering::Relaxed))
    }
}

impl Lender for MbufLender {
    fn give_back(&self, handles: &mut Vec<usize>) {
        // SAFETY: every handle is an mbuf received by this lender's receiver and lent once
        // (exposed as an address in `take_burst`); it comes back once and is freed once.
        unsafe { ffi::cbf_dpdk_free_handles(handles.as_ptr(), handles.len()) };
        self.out.fetch_sub(handles.len(), Ordering::Relaxed);
        handles.clear();
    }
}

/// A receiver on a DPDK port's RX queue.
pub struct DpdkReceiver {
    lease: QueueLease,
    filter: EndpointFilter,
    mbufs: Vec<*mut Mbuf>,
    frames: Vec<RxFrame>,
    /// The lender batches hold (`lender`) and its counter (`lent`): one object.
    lent: Arc<MbufLender>,
    lender: Arc<dyn Lender>,
    drops: FrameDrops,
    /// The port's counters when this receiver took the queue, and lately.
    base: DpdkStats,
    stats: DpdkStats,
    batches: u32,
}

// SAFETY: the mbuf pointers in `mbufs` are only held during one recv_batch call, by the owning
// thread; lent ones belong to the batches they were lent to.
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
        let lent = Arc::new(MbufLender::default());
        let mut r = DpdkReceiver {
            lease,
            filter: EndpointFilter::new(endpoints),
            mbufs: vec![std::ptr::null_mut(); BURST],
            frames: vec![RxFrame::EMPTY; BURST],
            lender: Arc::clone(&lent) as Arc<dyn Lender>,
            lent,
            drops: FrameDrops::default(),
            base,
            stats: base,
            batches: 0,
        };
        r.discard_queued();
        Ok(r)
    }

    /// Drop what an earlier holder of the queue left in it: at most the pool's size of frames,
    /// since no more can be queued (and a port that makes frames up, `net_null`, never runs
    /// out of them).
    fn discard_queued(&mut self) {
        let mut left = self.lease.port.pool_size as usize;
        while left > 0 {
            let n = self.burst(left);
            if n == 0 {
                return;
            }
            self.free(n);
            left -= n;
        }
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
        // SAFETY: the first n entries are mbufs of the last burst that were not lent; each is
        // freed exactly once.
        unsafe { ffi::cbf_dpdk_free(self.mbufs.as_mut_ptr(), n as u16) }
    }

    /// Lend the last burst's first `n` frames that are datagrams to our endpoints to `batch`,
    /// count the others by cause and free their mbufs; how many were lent.
    fn take_burst(&mut self, n: usize, batch: &mut RecvBatch) -> usize {
        // The mbufs not lent are gathered at the front of `mbufs` (`refused` ≤ i) and freed.
        let mut refused = 0;
        let mut lent = 0;
        for i in 0..n {
            let m = self.mbufs[i];
            let taken = match self.accept(self.frames[i]) {
                // SAFETY: the payload lies in mbuf `m`, which is not freed (and so not filled
                // again by the port) until the batch gives its handle back; the mempool, and
                // with it the memory, is never freed.
                Some((payload, len)) => unsafe {
                    batch.push_lent(&self.lender, m.expose_provenance(), payload, len, 0)
                },
                None => false,
            };
            if taken {
                lent += 1;
            } else {
                self.mbufs[refused] = m;
                refused += 1;
            }
        }
        self.lent.out.fetch_add(lent, Ordering::Relaxed);
        self.free(refused);
        lent
    }

    /// Where the UDP payload of a frame to one of our endpoints lies in its mbuf (first byte,
    /// length), or `None` with the cause counted.
    fn accept(&mut self, f: RxFrame) -> Option<(*const u8, usize)> {
        if f.pkt_len != f.data_len {
            // Scattered over mbufs: only frames larger than an mbuf's data room (eal::DATA_ROOM).
            self.drops.add(FrameDrop::Truncated);
            return None;
        }
        if f.ip_bad != 0 {
            self.drops.add(FrameDrop::IpChecksum);
            return None;
        }
        if f.l4_bad != 0 {
            self.drops.add(FrameDrop::UdpChecksum);
            return None;
        }
        // SAFETY: the PMD filled data_len bytes at data, in an mbuf this receiver holds until
        // the caller frees or lends it.
        let bytes = unsafe { std::slice::from_raw_parts(f.data, f.data_len as usize) };
        // The UDP checksum is the NIC's to check (l4_bad above): summing every payload byte
        // here would cost as much as the copy (see net::frame).
        match frame::parse(bytes, UdpChecksum::Skip) {
            Ok(d) if self.filter.contains(d.dst) => Some((d.payload.as_ptr(), d.payload.len())),
            Ok(_) => {
                self.drops.add(FrameDrop::NotOurs);
                None
            }
            Err(cause) => {
                self.drops.add(cause);
                None
            }
        }
    }

    /// mbufs free in the port's pool now (`rte_mempool_avail_count`): with every batch this
    /// receiver filled cleared, and nothing queued or being sent, the pool's whole size.
    pub fn pool_free(&self) -> u32 {
        // SAFETY: the port's pool, never freed.
        unsafe { ffi::cbf_dpdk_pool_avail(self.lease.port.pool.0) }
    }

    /// Whether `bytes` lie in the port's mbuf pool (DPDK's list of its memory chunks), that
    /// is in the frames' own memory: how a lent packet is told from a copied one.
    pub fn in_pool(&self, bytes: &[u8]) -> bool {
        // SAFETY: the port's pool, never freed; the shim only compares addresses.
        unsafe {
            ffi::cbf_dpdk_pool_contains(self.lease.port.pool.0, bytes.as_ptr(), bytes.len()) != 0
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
        // Slots of the batch taken (one frame each): every frame lent takes one.
        let mut taken = 0;
        loop {
            // No burst at all while MAX_LENT mbufs are out (other batches hold them): the
            // frames wait in the RX queue, and the pool keeps what refills it.
            let room = (batch.capacity() - taken).min(self.lent.room());
            let n = if room > 0 { self.burst(room) } else { 0 };
            taken += self.take_burst(n, batch);
            if taken > 0 && (n == 0 || taken == batch.capacity()) {
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
