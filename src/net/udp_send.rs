//! UDP send over the kernel stack (`net::udp` has the receive side): the socket every kernel
//! sender uses, the batch turned into `sendmsg` messages with UDP GSO, and [`UdpSender`], which
//! hands them to `sendmmsg`. `net::uring_send` hands the same messages to io_uring's zero-copy
//! `sendmsg` instead.
//!
//! GSO: consecutive packets of a batch with the same destination and size go down as one
//! message with a `UDP_SEGMENT` control message; if the kernel refuses GSO, the sender falls
//! back to one message per packet for good (as spead2 does, `doc/dev-send-gso.rst`).

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::udp::{resolve_interface, MsgScratch};
use super::{PacketSender, SendBatch};

/// Most packets and bytes one GSO message may carry.
const GSO_MAX_SEGMENTS: usize = 64;
const GSO_MAX_BYTES: usize = 65000;

/// Most messages built at once (one `sendmmsg` call, or one round of io_uring requests).
pub(super) const SEND_CHUNK: usize = 256;

/// A send socket: `buffer` bytes of SO_SNDBUF, multicast `ttl` and loopback, and, with
/// `interface` (a name or an address), bound to its address and sending multicast through it;
/// with the destinations as socket addresses.
pub(super) fn open_send_socket(
    dests: &[SocketAddrV4],
    interface: Option<&str>,
    ttl: u32,
    buffer: usize,
) -> io::Result<(Socket, Vec<SockAddr>)> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_send_buffer_size(buffer)?;
    socket.set_multicast_ttl_v4(ttl)?;
    socket.set_multicast_loop_v4(true)?;
    if let Some(name) = interface {
        let (_, addr) = resolve_interface(name)?;
        socket.bind(&SockAddr::from(SocketAddrV4::new(addr, 0)))?;
        socket.set_multicast_if_v4(&addr)?;
    }
    if dests.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no destinations to send to",
        ));
    }
    Ok((socket, dests.iter().map(|d| SockAddr::from(*d)).collect()))
}

/// A batch's packets as `sendmsg` messages, each one packet or a GSO run (packets to one
/// destination, all of one size except that the last may be shorter), whose iovecs are the
/// packets' headers and borrowed payload slices, in order. The arrays are reused, so the hot
/// path does not allocate once they have grown.
#[derive(Default)]
pub(super) struct Messages {
    /// Most pages one message's iovecs may touch: a zero-copy send's packet holds each page as
    /// a fragment, at most `MAX_SKB_FRAGS` (17) of them, and the kernel refuses a message that
    /// needs more (`EMSGSIZE`) rather than copying it. `None`: no limit (a copying send).
    max_pages: Option<usize>,
    scratch: MsgScratch,
    /// Try GSO; cleared for good the first time the kernel refuses it.
    no_gso: bool,
    /// Packets in each message of the current round, and (with `max_pages`) the pages each
    /// touches.
    counts: Vec<usize>,
    pages: Vec<usize>,
    /// Per message: (first iovec, iovecs, destination, segment size).
    runs: Vec<(usize, usize, usize, usize)>,
}

impl Messages {
    /// Messages of at most `max_pages` pages each (`None`: no limit).
    pub(super) fn new(max_pages: Option<usize>) -> Messages {
        Messages {
            max_pages,
            ..Messages::default()
        }
    }

    /// Build up to [`SEND_CHUNK`] messages from `batch`'s packets `from..`; returns how many.
    /// Their headers ([`Messages::header`]) point into `batch`, `dests` and `self`, so they are
    /// valid until any of the three changes.
    pub(super) fn fill(
        &mut self,
        batch: &SendBatch<'_>,
        from: usize,
        dests: &[SockAddr],
    ) -> io::Result<usize> {
        self.scratch.prepare(SEND_CHUNK);
        self.scratch.iovecs.clear();
        self.counts.clear();
        self.pages.clear();
        self.runs.clear();
        let mut p = from;
        while p < batch.len() && self.counts.len() < SEND_CHUNK {
            let first = *batch.packet(p);
            if first.dest >= dests.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("destination {} out of range", first.dest),
                ));
            }
            let pages_of = |q: usize| batch.pieces(q).map(pages_spanned).sum::<usize>();
            let (mut n, mut bytes) = (1, first.len);
            let mut pages = if self.max_pages.is_some() {
                pages_of(p)
            } else {
                0
            };
            while !self.no_gso && p + n < batch.len() && n < GSO_MAX_SEGMENTS {
                let next = batch.packet(p + n);
                let prev = batch.packet(p + n - 1).len;
                if next.dest != first.dest
                    || next.len > first.len
                    || prev != first.len
                    || bytes + next.len > GSO_MAX_BYTES
                {
                    break;
                }
                if let Some(max) = self.max_pages {
                    let more = pages_of(p + n);
                    if pages + more > max {
                        break;
                    }
                    pages += more;
                }
                bytes += next.len;
                n += 1;
            }
            let iov_start = self.scratch.iovecs.len();
            for q in p..p + n {
                for piece in batch.pieces(q) {
                    self.scratch.iovecs.push(libc::iovec {
                        iov_base: piece.as_ptr() as *mut libc::c_void,
                        iov_len: piece.len(),
                    });
                }
            }
            self.runs.push((
                iov_start,
                self.scratch.iovecs.len() - iov_start,
                first.dest,
                first.len,
            ));
            self.counts.push(n);
            self.pages.push(pages);
            p += n;
        }
        // The iovec array is complete (no more reallocation): point the headers into it.
        for (k, &(iov_start, iov_len, dest, seg)) in self.runs.iter().enumerate() {
            let addr = &dests[dest];
            let m = &mut self.scratch.msgs[k];
            m.msg_hdr.msg_name = addr.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = addr.len();
            m.msg_hdr.msg_iov = self.scratch.iovecs[iov_start..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = iov_len as _;
            if self.counts[k] > 1 {
                m.msg_hdr.msg_control = self.scratch.controls[k].as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE(2) (16 bytes) fits the 48-byte, 8-byte-aligned buffer; the header
                // and the u16 segment size are written through the CMSG macros.
                unsafe {
                    m.msg_hdr.msg_controllen = libc::CMSG_SPACE(2) as _;
                    let c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg as u16);
                }
            } else {
                m.msg_hdr.msg_control = std::ptr::null_mut();
                m.msg_hdr.msg_controllen = 0;
            }
        }
        Ok(self.counts.len())
    }

    /// Send `batch` round by round: `round(messages, n)` sends messages `..n` of the round just
    /// built and says how many went before the first failure, with it. As `sendmmsg` reports
    /// a partial send and fails on the next call: a round that sent some goes on from the
    /// failed message (which fails again first); EINTR and EAGAIN are tried again; a refused
    /// GSO message turns GSO off and the round is built again.
    pub(super) fn send_all(
        &mut self,
        batch: &SendBatch<'_>,
        dests: &[SockAddr],
        mut round: impl FnMut(&mut Messages, usize) -> (usize, Option<io::Error>),
    ) -> io::Result<()> {
        batch.host_only()?;
        let mut done = 0; // packets sent
        while done < batch.len() {
            let n = self.fill(batch, done, dests)?;
            let (sent, failure) = round(self, n);
            done += self.counts[..sent].iter().sum::<usize>();
            if let Some(e) = failure {
                if sent > 0 || matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                    continue;
                }
                if !self.gso_refused(&e) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Message `k`'s header.
    pub(super) fn header(&self, k: usize) -> &libc::msghdr {
        &self.scratch.msgs[k].msg_hdr
    }

    /// Whether message `k` touches more pages than `max_pages` allows: a lone packet that
    /// does (a GSO run is cut before it would) must be sent some other way.
    pub(super) fn over_pages(&self, k: usize) -> bool {
        self.max_pages.is_some_and(|max| self.pages[k] > max)
    }

    /// The current round's headers as `sendmmsg` takes them.
    fn mmsghdrs(&mut self) -> *mut libc::mmsghdr {
        self.scratch.msgs.as_mut_ptr()
    }

    /// Whether `e`, returned for the current round, is the kernel refusing GSO: if so GSO is
    /// off from now on (a warning says so) and the round should be built again.
    fn gso_refused(&mut self, e: &io::Error) -> bool {
        let refused = matches!(
            e.raw_os_error(),
            Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP)
        ) && !self.no_gso
            && self.counts.iter().any(|&c| c > 1);
        if refused {
            tracing::warn!(error = %e, "UDP GSO refused; one packet per message from now on");
            self.no_gso = true;
        }
        refused
    }
}

/// Pages of 4 KiB that `piece` touches (0 when empty).
fn pages_spanned(piece: &[u8]) -> usize {
    if piece.is_empty() {
        return 0;
    }
    let start = piece.as_ptr() as usize;
    (start + piece.len() - 1) / 4096 - start / 4096 + 1
}

/// A UDP sender: one socket (optionally bound to an interface) and a destination list, each
/// round of messages sent by one `sendmmsg`.
pub struct UdpSender {
    socket: Socket,
    dests: Vec<SockAddr>,
    messages: Messages,
}

impl UdpSender {
    /// `interface` (name or address) selects the source address and multicast interface.
    pub fn new(
        dests: &[SocketAddrV4],
        interface: Option<&str>,
        ttl: u32,
        buffer: usize,
    ) -> io::Result<Self> {
        let (socket, dests) = open_send_socket(dests, interface, ttl, buffer)?;
        Ok(UdpSender {
            socket,
            dests,
            messages: Messages::default(),
        })
    }
}

impl PacketSender for UdpSender {
    fn destinations(&self) -> usize {
        self.dests.len()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let fd = self.socket.as_raw_fd();
        self.messages.send_all(batch, &self.dests, |messages, n| {
            // SAFETY: every pointer in the messages refers to memory alive across the call
            // (the batch's headers and the heaps it borrows, the scratch arrays, dests); the
            // kernel only reads it.
            let r = unsafe { libc::sendmmsg(fd, messages.mmsghdrs(), n as u32, 0) };
            if r < 0 {
                (0, Some(io::Error::last_os_error()))
            } else {
                (r as usize, None)
            }
        })
    }
}
