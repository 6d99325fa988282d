//! UDP send through io_uring's zero-copy `sendmsg` (`IORING_OP_SENDMSG_ZC`, Linux 6.1; issue 15,
//! seed 000 §Network transmit): the socket and the GSO messages of `net::udp_send`, each message
//! one request, the kernel reading the packets' payload straight from the heaps' memory
//! instead of copying it into socket buffers as `sendmmsg` does.
//!
//! Zero copy means the kernel holds the pages until the NIC has sent them: each request's
//! completion is followed by a *notification* once the kernel no longer needs its memory.
//! The stream reuses a batch's header buffer, and a heap's memory may be freed, as soon as
//! [`PacketSender::send_batch`] returns, so the call returns only after every notification of
//! its messages has come. A round's requests are linked (`IO_LINK`) so that they go out in the
//! batch's order, and a failure cancels the rest of the round, which then counts as not sent,
//! as `sendmmsg` reports a partial send.
//!
//! Where the kernel cannot send from user memory (loopback, a NIC without scatter-gather) it
//! copies after all and says so in the notification (`IORING_SEND_ZC_REPORT_USAGE`):
//! [`UringSender::copied`] counts those sends.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;

use io_uring::{cqueue, opcode, squeue, types::Fd, IoUring};
use socket2::{SockAddr, Socket};

use super::udp_send::{open_send_socket, Messages, SEND_CHUNK};
use super::{PacketSender, SendBatch};

/// `IORING_SEND_ZC_REPORT_USAGE` (in the request's `ioprio`): the notification says whether
/// the kernel copied after all, by `IORING_NOTIF_USAGE_ZC_COPIED` in its result. The `io-uring`
/// crate does not export them.
const REPORT_USAGE: u16 = 1 << 3;
const USAGE_ZC_COPIED: u32 = 1 << 31;

/// Pages one zero-copy message may hold: Linux's `MAX_SKB_FRAGS` is 17 unless built larger,
/// and a message needing more fails with `EMSGSIZE` (`Messages::max_pages`). A GSO run is cut
/// there, so zero-copy messages carry fewer packets than `sendmmsg`'s: about five of 1472
/// bytes (a header and a payload slice each), three of 8 KiB.
const MAX_PAGES: usize = 17;

/// A UDP sender through io_uring's zero-copy `sendmsg`: one socket (as [`super::udp::UdpSender`]'s)
/// and one ring.
pub struct UringSender {
    socket: Socket,
    dests: Vec<SockAddr>,
    messages: Messages,
    ring: IoUring,
    /// Sends whose notification said the kernel copied the data, and all sends notified.
    copied: u64,
    notified: u64,
}

/// Whether this kernel lets the process make an io_uring for sending (it may lack io_uring or
/// have it disabled: `kernel.io_uring_disabled`), with the reason when not.
pub fn probe() -> io::Result<()> {
    ring().map(drop)
}

/// A ring for one round of requests and their notifications.
fn ring() -> io::Result<IoUring> {
    IoUring::builder()
        .setup_cqsize(2 * SEND_CHUNK as u32)
        .build(SEND_CHUNK as u32)
        .map_err(|e| io::Error::new(e.kind(), format!("io_uring (send): {e}")))
}

impl UringSender {
    /// As `UdpSender::new`, with a ring of its own ([`probe`] says whether the kernel gives
    /// one).
    pub fn new(
        dests: &[SocketAddrV4],
        interface: Option<&str>,
        ttl: u32,
        buffer: usize,
    ) -> io::Result<UringSender> {
        let (socket, dests) = open_send_socket(dests, interface, ttl, buffer)?;
        let ring = ring()?;
        Ok(UringSender {
            socket,
            dests,
            messages: Messages::new(Some(MAX_PAGES)),
            ring,
            copied: 0,
            notified: 0,
        })
    }

    /// (sends the kernel copied after all, sends notified): on loopback every one is copied.
    pub fn copied(&self) -> (u64, u64) {
        (self.copied, self.notified)
    }

    /// Send messages `..n` of the current round, linked, and wait for every completion and
    /// notification. Returns how many were sent before the first failure, with the failure.
    fn send_round(&mut self, n: usize) -> io::Result<(usize, Option<io::Error>)> {
        let fd = Fd(self.socket.as_raw_fd());
        for k in 0..n {
            let sqe = opcode::SendMsgZc::new(fd, self.messages.header(k))
                .ioprio(REPORT_USAGE)
                .build()
                .user_data(k as u64);
            let sqe = if k + 1 < n {
                sqe.flags(squeue::Flags::IO_LINK)
            } else {
                sqe
            };
            // SAFETY: the header, its iovecs, control buffer and destination address, and the
            // memory the iovecs point to (the batch and the heaps it borrows) stay untouched
            // until this call has seen every completion and notification, after which the
            // kernel holds no reference to any of them.
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("io_uring send queue full"))?;
        }
        let (mut completed, mut pending_notifs) = (0, 0);
        let mut first_failure: Option<(usize, io::Error)> = None;
        while completed < n || pending_notifs > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for cqe in self.ring.completion() {
                let flags = cqe.flags();
                if cqueue::notif(flags) {
                    pending_notifs -= 1;
                    self.notified += 1;
                    if cqe.result() as u32 & USAGE_ZC_COPIED != 0 {
                        self.copied += 1;
                    }
                    continue;
                }
                completed += 1;
                if cqueue::more(flags) {
                    pending_notifs += 1;
                }
                let k = cqe.user_data() as usize;
                if cqe.result() < 0 && first_failure.as_ref().is_none_or(|(f, _)| k < *f) {
                    first_failure = Some((k, io::Error::from_raw_os_error(-cqe.result())));
                }
            }
        }
        Ok(match first_failure {
            Some((k, e)) => (k, Some(e)),
            None => (n, None),
        })
    }
}

impl PacketSender for UringSender {
    fn destinations(&self) -> usize {
        self.dests.len()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        batch.host_only()?;
        let mut done = 0; // packets sent
        while done < batch.len() {
            let n = self.messages.fill(batch, done, &self.dests)?;
            let (sent, failure) = self.send_round(n)?;
            done += self.messages.packets_in(sent);
            if let Some(e) = failure {
                // As `sendmmsg` reports a partial send and fails on the next call: a round that
                // sent some messages goes on from the failed one, which fails again first.
                if sent > 0 || matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                    continue;
                }
                if !self.messages.gso_refused(&e) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "uring_send_tests.rs"]
mod tests;
