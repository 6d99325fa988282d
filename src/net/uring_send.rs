//! UDP send through io_uring's zero-copy `sendmsg` (`IORING_OP_SENDMSG_ZC`; issue 15, seed 000
//! §Network transmit): the socket and the GSO messages of `net::udp_send`, each message one
//! request, the kernel reading the packets' payload straight from the heaps' memory instead of
//! copying it into socket buffers as `sendmmsg` does.
//!
//! Zero copy means the kernel holds the pages until the NIC has sent them: each request's
//! completion is followed by a *notification* once the kernel no longer needs its memory.
//! The stream reuses a batch's header buffer, and a heap's memory may be freed, as soon as
//! [`PacketSender::send_batch`] returns, so a round of requests is never left behind: the call
//! returns only after every request it submitted has completed and every notification has
//! come, whatever else fails (a wait that cannot be made at all aborts the process rather than
//! return with the kernel holding the memory). That wait is as long as the NIC takes to send;
//! past a second a warning says so, every second. A round's requests are linked (`IO_LINK`) so
//! that they go out in the batch's order, and a failure cancels the rest of the round, which
//! then counts as not sent, as `sendmmsg` reports a partial send.
//!
//! A zero-copy message holds each page it touches as one fragment of the packet, at most
//! `MAX_SKB_FRAGS` (17), and a SPEAD packet's header and payload are separate pieces, so GSO
//! runs are cut shorter than `sendmmsg`'s ([`MAX_PAGES`]); a lone packet that needs more pages
//! goes as an ordinary `sendmsg` in the same chain.
//!
//! Where the kernel cannot send from user memory (loopback, a NIC without scatter-gather) it
//! copies after all and says so in the notification (`IORING_SEND_ZC_REPORT_USAGE`, Linux 6.2,
//! which [`probe`] checks with one real send): logged once, and counted
//! ([`UringSender::copied`]).

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring};
use socket2::{SockAddr, Socket};

use super::udp_send::{open_send_socket, Messages, SEND_CHUNK};
use super::{PacketSender, SendBatch};

/// `IORING_SEND_ZC_REPORT_USAGE` (in the request's `ioprio`): the notification says whether
/// the kernel copied after all, by `IORING_NOTIF_USAGE_ZC_COPIED` in its result. The `io-uring`
/// crate does not export them.
const REPORT_USAGE: u16 = 1 << 3;
const USAGE_ZC_COPIED: u32 = 1 << 31;

/// Pages one zero-copy message may hold: Linux's `MAX_SKB_FRAGS` is 17 unless built larger,
/// and a message needing more fails with `EMSGSIZE` (`Messages::over_pages`). A GSO run is cut
/// there, so zero-copy messages carry fewer packets than `sendmmsg`'s: about five of 1472
/// bytes, four of 8 KiB (a header page and three of payload each).
const MAX_PAGES: usize = 17;

/// How long one wait for completions lasts before it is counted (and, past the first, warned
/// about).
const WAIT: Duration = Duration::from_secs(1);

/// Whether this kernel sends through io_uring's zero-copy `sendmsg` with its usage reported
/// (Linux 6.2; io_uring may also be absent or disabled: `kernel.io_uring_disabled`): one real
/// send to a socket of this process over loopback. The error says why not.
pub fn probe() -> io::Result<()> {
    let rx = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let std::net::SocketAddr::V4(dst) = rx.local_addr()? else {
        return Err(io::Error::other("loopback gave an IPv6 address"));
    };
    let mut tx = UringSender::new(&[dst], None, 1, 1 << 16)?;
    let payload = [0u8; 64];
    let mut batch = SendBatch::default();
    batch.push_packet(&payload, 0);
    tx.send_batch(&batch).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("io_uring zero-copy sendmsg with its usage reported (Linux 6.2): {e}"),
        )
    })
}

/// A UDP sender through io_uring's zero-copy `sendmsg`: one socket (as
/// [`super::udp::UdpSender`]'s) and one ring.
pub struct UringSender {
    socket: Socket,
    dests: Vec<SockAddr>,
    messages: Messages,
    ring: ZcRing,
}

/// The ring, with what a round needs beside the messages.
struct ZcRing {
    ring: IoUring,
    /// The round's requests, built before any is queued.
    entries: Vec<squeue::Entry>,
    /// Sends whose notification said the kernel copied the data, and all sends notified.
    copied: u64,
    notified: u64,
}

impl UringSender {
    /// As `UdpSender::new`, with a ring of its own ([`probe`] says whether the kernel gives
    /// one that works).
    pub fn new(
        dests: &[SocketAddrV4],
        interface: Option<&str>,
        ttl: u32,
        buffer: usize,
    ) -> io::Result<UringSender> {
        let (socket, dests) = open_send_socket(dests, interface, ttl, buffer)?;
        let ring = IoUring::builder()
            .setup_cqsize(2 * SEND_CHUNK as u32)
            .build(SEND_CHUNK as u32)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring (send): {e}")))?;
        Ok(UringSender {
            socket,
            dests,
            messages: Messages::new(Some(MAX_PAGES)),
            ring: ZcRing {
                ring,
                entries: Vec::with_capacity(SEND_CHUNK),
                copied: 0,
                notified: 0,
            },
        })
    }

    /// (sends the kernel copied after all, sends notified): on loopback every one is copied.
    pub fn copied(&self) -> (u64, u64) {
        (self.ring.copied, self.ring.notified)
    }
}

impl ZcRing {
    /// Send messages `..n` of the round just built, linked, on socket `fd`, and wait for every
    /// completion and notification (module doc). Returns how many were sent before the first
    /// failure, with the failure.
    fn round(&mut self, fd: Fd, messages: &Messages, n: usize) -> (usize, Option<io::Error>) {
        self.entries.clear();
        for k in 0..n {
            let header = messages.header(k);
            let sqe = if messages.over_pages(k) {
                opcode::SendMsg::new(fd, header).build()
            } else {
                opcode::SendMsgZc::new(fd, header)
                    .ioprio(REPORT_USAGE)
                    .build()
            };
            let sqe = sqe.user_data(k as u64);
            self.entries.push(if k + 1 < n {
                sqe.flags(squeue::Flags::IO_LINK)
            } else {
                sqe
            });
        }
        // Every earlier round was waited out, so the queues are empty and hold a round.
        debug_assert!(self.ring.submission().is_empty() && self.ring.completion().is_empty());
        // SAFETY: the headers, their iovecs, control buffers and destination addresses, and the
        // memory the iovecs point to (the batch and the heaps it borrows) stay untouched until
        // the loop below has seen every completion and notification of these requests, after
        // which the kernel holds no reference to any of them. All or none are queued.
        if let Err(e) = unsafe { self.ring.submission().push_multiple(&self.entries) } {
            return (
                0,
                Some(io::Error::other(format!("io_uring send queue: {e}"))),
            );
        }
        let (mut completed, mut pending_notifs) = (0, 0i64);
        let mut first_failure: Option<(usize, io::Error)> = None;
        let started = Instant::now();
        let mut refusals = 0;
        while completed < n || pending_notifs > 0 {
            let ts = Timespec::from(WAIT);
            match self
                .ring
                .submitter()
                .submit_with_args(1, &SubmitArgs::new().timespec(&ts))
            {
                Ok(_) => refusals = 0,
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => tracing::warn!(
                    waited_s = started.elapsed().as_secs(),
                    "zero-copy send: the kernel still holds a batch's memory (a NIC slow to send?)"
                ),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // Requests may be in flight with pointers into the caller's memory, so
                    // this call cannot return; a ring that refuses every wait is broken.
                    refusals += 1;
                    if refusals > 100 {
                        tracing::error!(error = %e, "io_uring refuses to wait for a zero-copy send: aborting rather than return with the kernel holding the batch");
                        std::process::abort();
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            for cqe in self.ring.completion() {
                let flags = cqe.flags();
                if cqueue::notif(flags) {
                    pending_notifs -= 1;
                    self.notified += 1;
                    if cqe.result() as u32 & USAGE_ZC_COPIED != 0 {
                        if self.copied == 0 {
                            tracing::info!("the kernel copies zero-copy sends on this path (loopback, or a NIC without scatter-gather): no copy is saved");
                        }
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
        match first_failure {
            Some((k, e)) => (k, Some(e)),
            None => (n, None),
        }
    }
}

impl PacketSender for UringSender {
    fn destinations(&self) -> usize {
        self.dests.len()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let fd = Fd(self.socket.as_raw_fd());
        let ring = &mut self.ring;
        self.messages.send_all(batch, &self.dests, |messages, n| {
            ring.round(fd, messages, n)
        })
    }
}

#[cfg(test)]
#[path = "uring_send_tests.rs"]
mod tests;
