//! Send through a DPDK port: each packet of a [`SendBatch`] becomes one mbuf holding the
//! headers `net::frame` builds for its destination and its pieces copied after them (the one
//! copy on this path), sent in TX bursts.

use std::io;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use super::eal::{self, QueueLease};
use super::ffi::{self, Mbuf};
use super::{DpdkConfig, DpdkError, DpdkSendConfig};
use crate::net::frame::{self, FrameError, FrameHeaders, HEADERS_LEN};
use crate::net::{PacketSender, SendBatch};

/// Packets per TX burst.
pub(super) const BURST: usize = 32;
/// How long the sender waits for mbufs or for room in the TX queue before it gives up on a
/// batch: a port whose queue never drains (a ring nobody reads, a link down) must not hang the
/// send thread. A full TX queue is then reported as the link being down (ENETDOWN).
const STALL: Duration = Duration::from_secs(1);

/// A sender on a DPDK port's TX queue of its own.
pub struct DpdkSender {
    lease: QueueLease,
    headers: Vec<FrameHeaders>,
    mbufs: Vec<*mut Mbuf>,
    ident: u16,
}

// SAFETY: the mbuf pointers are only held during one send_batch call, by the owning thread.
unsafe impl Send for DpdkSender {}

impl DpdkSender {
    /// A sender to `dests` on the configured port; a unicast destination without
    /// `send.dst_mac` is refused before the port is touched.
    pub fn open(
        cfg: &DpdkConfig,
        send: &DpdkSendConfig,
        dests: &[SocketAddrV4],
    ) -> Result<Self, DpdkError> {
        for d in dests {
            frame::dest_mac(*d.ip(), send.dst_mac)?;
        }
        let lease = eal::lease(cfg, eal::Queue::Tx)?;
        Ok(DpdkSender::new(lease, send, dests)?)
    }

    fn new(
        lease: QueueLease,
        cfg: &DpdkSendConfig,
        dests: &[SocketAddrV4],
    ) -> Result<Self, FrameError> {
        let headers = dests
            .iter()
            .map(|d| {
                let mac = frame::dest_mac(*d.ip(), cfg.dst_mac)?;
                Ok(FrameHeaders::new(lease.port.mac, cfg.src, mac, *d, cfg.ttl))
            })
            .collect::<Result<Vec<_>, FrameError>>()?;
        Ok(DpdkSender {
            lease,
            headers,
            mbufs: vec![std::ptr::null_mut(); BURST],
            ident: 0,
        })
    }

    /// Largest UDP payload one frame may carry (an mbuf's data room less the headers).
    pub fn max_payload() -> usize {
        usize::from(eal::DATA_ROOM) - HEADERS_LEN
    }

    /// Allocate `n` mbufs, waiting up to [`STALL`] while the pool is empty.
    fn alloc(&mut self, n: usize) -> io::Result<()> {
        let start = Instant::now();
        loop {
            // SAFETY: mbufs holds BURST ≥ n entries.
            let r = unsafe {
                ffi::cbf_dpdk_alloc(self.lease.port.pool.0, self.mbufs.as_mut_ptr(), n as u16)
            };
            if r == 0 {
                return Ok(());
            }
            if start.elapsed() > STALL {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("DPDK port {}: no free mbufs", self.lease.port.name),
                ));
            }
            std::thread::yield_now();
        }
    }

    /// Send the `n` filled mbufs on this sender's own TX queue, waiting up to [`STALL`] without
    /// progress; what is left then is freed and reported.
    fn transmit(&mut self, n: usize) -> io::Result<()> {
        let (port, queue) = (&self.lease.port, self.lease.queue);
        let mbufs = &mut self.mbufs;
        let mut sent = 0;
        let mut last = Instant::now();
        while sent < n {
            // SAFETY: mbufs[sent..n] are filled mbufs owned by this sender; the PMD takes
            // ownership of those it accepts; the lease makes this sender the queue's only user.
            let k = unsafe {
                ffi::cbf_dpdk_tx(
                    port.id,
                    queue,
                    mbufs[sent..].as_mut_ptr(),
                    (n - sent) as u16,
                )
            };
            if k > 0 {
                sent += usize::from(k);
                last = Instant::now();
            } else if last.elapsed() > STALL {
                // SAFETY: the unsent mbufs are still ours; each is freed once.
                unsafe { ffi::cbf_dpdk_free(mbufs[sent..].as_mut_ptr(), (n - sent) as u16) };
                // A queue that does not drain is a link that does not carry: reported as one
                // (ENETDOWN), so that a send stream moves this port's share to its others, as it
                // does for a socket whose interface went down (spead::send::balance).
                tracing::warn!(port = %port.name, "DPDK TX queue full for {STALL:?}: link down");
                return Err(io::Error::from_raw_os_error(libc::ENETDOWN));
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

impl DpdkSender {
    /// Send whole frames as they are, building no headers: a recording replayed, or frames a
    /// test makes defective on purpose.
    pub fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        if let Some(f) = frames
            .iter()
            .find(|f| f.len() > usize::from(eal::DATA_ROOM))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "frame of {} bytes exceeds DPDK's {}-byte mbufs",
                    f.len(),
                    eal::DATA_ROOM
                ),
            ));
        }
        for group in frames.chunks(BURST) {
            self.alloc(group.len())?;
            for (k, f) in group.iter().enumerate() {
                // SAFETY: a fresh mbuf with DATA_ROOM bytes of room, f.len() ≤ DATA_ROOM.
                unsafe {
                    let ptr = ffi::cbf_dpdk_fill(self.mbufs[k], f.len() as u16);
                    if ptr.is_null() {
                        ffi::cbf_dpdk_free(self.mbufs.as_mut_ptr(), group.len() as u16);
                        return Err(io::Error::other("mbuf smaller than its data room"));
                    }
                    std::ptr::copy_nonoverlapping(f.as_ptr(), ptr, f.len());
                }
            }
            self.transmit(group.len())?;
        }
        Ok(())
    }
}

impl PacketSender for DpdkSender {
    fn destinations(&self) -> usize {
        self.headers.len()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        batch.host_only()?;
        let max = Self::max_payload();
        for i in 0..batch.len() {
            let p = batch.packet(i);
            if p.dest >= self.headers.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("destination {} out of range", p.dest),
                ));
            }
            if p.len > max {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("packet of {} bytes exceeds DPDK's {max}-byte frames", p.len),
                ));
            }
        }
        let mut first = 0;
        while first < batch.len() {
            let n = BURST.min(batch.len() - first);
            self.alloc(n)?;
            for k in 0..n {
                let p = batch.packet(first + k);
                let len = HEADERS_LEN + p.len;
                // SAFETY: a fresh mbuf with DATA_ROOM bytes of room, len ≤ DATA_ROOM (checked
                // above); the pointer is valid for len bytes until the mbuf is sent or freed.
                let out = unsafe {
                    let ptr = ffi::cbf_dpdk_fill(self.mbufs[k], len as u16);
                    if ptr.is_null() {
                        ffi::cbf_dpdk_free(self.mbufs.as_mut_ptr(), n as u16);
                        return Err(io::Error::other("mbuf smaller than its data room"));
                    }
                    std::slice::from_raw_parts_mut(ptr, len)
                };
                if let Err(e) = self.headers[p.dest].emit(out, p.len, self.ident) {
                    // SAFETY: the burst's mbufs are still ours; each is freed once.
                    unsafe { ffi::cbf_dpdk_free(self.mbufs.as_mut_ptr(), n as u16) };
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
                }
                self.ident = self.ident.wrapping_add(1);
                let mut at = HEADERS_LEN;
                for piece in batch.pieces(first + k) {
                    out[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                }
            }
            self.transmit(n)?;
            first += n;
        }
        Ok(())
    }
}
