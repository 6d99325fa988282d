//! UDP over the kernel stack: `recvmmsg`/`sendmmsg` batches, large socket buffers, IPv4
//! multicast joined on a named interface.
//!
//! The receive side writes datagrams straight into the caller's [`RecvBatch`] slots (one
//! copy, kernel to user), with UDP GRO: the kernel may hand over several equal-sized packets
//! of one flow in one 64 KiB slot, with their segment size in a control message, which saves a
//! trip through the stack per packet (and, on loopback, lets a GSO sender skip segmentation).
//! The send side is `net::udp_send`, with GSO the same way. `socket2` handles socket options;
//! the batch calls and their control messages are not in any maintained crate with
//! caller-owned buffers, so they are made through `libc` here.

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::Socket;

use super::recv_socket::{
    control_data, enable_gro, first_local_addr, open_recv_sockets, set_busy_poll, slot_for,
    DropCount,
};
pub use super::udp_send::UdpSender;
use super::{PacketReceiver, Received, RecvBatch};

/// How long a receive call waits before returning [`Received::Idle`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Resolve an interface given by name (`eth0`, `lo`) or by IPv4 address to (index, address).
pub fn resolve_interface(name: &str) -> io::Result<(u32, Ipv4Addr)> {
    let mut found = None;
    // SAFETY: getifaddrs allocates a list we walk read-only and free exactly once.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || i32::from((*ifa.ifa_addr).sa_family) != libc::AF_INET {
                continue;
            }
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            let ifname = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy();
            if ifname == name || addr.to_string() == name {
                let index = libc::if_nametoindex(ifa.ifa_name);
                found = Some((index, addr));
                break;
            }
        }
        libc::freeifaddrs(head);
    }
    found.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no IPv4 interface named or addressed {name:?}"),
        )
    })
}

/// Slot size when GRO may coalesce packets: the largest UDP datagram.
pub const GRO_SLOT: usize = 65536;
/// Room for two control messages carrying an int each, UDP_GRO and SO_RXQ_OVFL
/// (CMSG_SPACE(4) is 24 on 64-bit Linux).
const CONTROL_WORDS: usize = 6;

/// Reusable `mmsghdr`/`iovec`/control arrays for the batch calls, so that the hot path does
/// not allocate. The pointers inside are rewritten before every call and mean nothing between
/// calls.
#[derive(Default)]
pub(super) struct MsgScratch {
    pub(super) iovecs: Vec<libc::iovec>,
    pub(super) msgs: Vec<libc::mmsghdr>,
    /// One 8-byte-aligned control buffer per message.
    pub(super) controls: Vec<[u64; CONTROL_WORDS]>,
}

// SAFETY: the raw pointers are only dereferenced by the kernel during a call made by the
// owning thread, after being rewritten for that call.
unsafe impl Send for MsgScratch {}

impl MsgScratch {
    /// Size for `n` messages (allocates only when growing). The sender's iovec list is
    /// rebuilt per call and may hold several iovecs per message.
    pub(super) fn prepare(&mut self, n: usize) {
        if self.msgs.len() < n {
            // SAFETY: mmsghdr is plain old data; zeroed is a valid empty header.
            self.msgs
                .resize_with(n, || unsafe { MaybeUninit::zeroed().assume_init() });
            self.iovecs.resize(
                n,
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
            );
            self.controls.resize(n, [0; CONTROL_WORDS]);
        }
    }
}

/// A UDP receiver over one or more sockets (one per distinct port).
pub struct UdpReceiver {
    sockets: Vec<Socket>,
    /// poll() table, one entry per socket, reused every call.
    fds: Vec<libc::pollfd>,
    next: usize,
    scratch: MsgScratch,
    gro: bool,
    /// Per socket, the kernel's drop count.
    drops: Vec<DropCount>,
    /// The receiving NIC's NUMA node, where known.
    node: Option<u32>,
}

impl UdpReceiver {
    /// Bind to every endpoint: unicast endpoints bind their address; multicast groups are
    /// joined on `interface` (a name or an address; the default route when `None`).
    /// `buffer` is SO_RCVBUF in bytes (the kernel may cap it at `net.core.rmem_max`).
    pub fn bind(
        endpoints: &[SocketAddrV4],
        interface: Option<&str>,
        buffer: usize,
    ) -> io::Result<Self> {
        let sockets = open_recv_sockets(endpoints, interface, buffer)?;
        let gro = sockets.iter().all(enable_gro);
        Ok(UdpReceiver {
            fds: vec![
                libc::pollfd {
                    fd: -1,
                    events: 0,
                    revents: 0
                };
                sockets.len()
            ],
            drops: vec![DropCount::default(); sockets.len()],
            sockets,
            next: 0,
            scratch: MsgScratch::default(),
            gro,
            node: super::numa::nic_node(interface),
        })
    }

    /// The local address of the first socket (useful when binding port 0 in tests).
    pub fn local_addr(&self) -> io::Result<SocketAddrV4> {
        first_local_addr(&self.sockets)
    }

    /// Busy-poll for `micros` µs (`--recv-busy-poll`, SO_BUSY_POLL on every socket); the value
    /// the kernel holds (read back), or its refusal naming the errno (EPERM without
    /// CAP_NET_ADMIN).
    ///
    /// What it does: when a blocking receive finds the socket empty, the kernel polls the
    /// receiving device's NAPI context (its RX queue) for up to `micros` before it sleeps, so
    /// that a datagram arriving meanwhile is taken without an interrupt and a wake-up. That
    /// is this receiver's one-socket path (a blocking `recvmmsg`). What it does not do: with
    /// several sockets (endpoints on several ports) the receiver waits in `poll()`, which
    /// busy-polls only when the sysctl `net.core.busy_poll` is set (for its duration, not this
    /// one); a device without NAPI (loopback, a veth without XDP or GRO) has nothing to poll,
    /// so there the option is held but changes nothing; and it is no kernel bypass: each
    /// datagram still crosses the stack.
    pub fn set_busy_poll(&mut self, micros: u32) -> io::Result<u32> {
        set_busy_poll(&self.sockets, micros)
    }

    fn recvmmsg(
        socket: &Socket,
        scratch: &mut MsgScratch,
        batch: &mut RecvBatch,
        flags: libc::c_int,
        drops: &mut DropCount,
    ) -> io::Result<()> {
        let cap = batch.capacity();
        scratch.prepare(cap);
        let (buf, slots, slot) = batch.raw_parts();
        for i in 0..cap {
            scratch.iovecs[i] = libc::iovec {
                iov_base: buf[i * slot..].as_mut_ptr().cast(),
                iov_len: slot,
            };
            let m = &mut scratch.msgs[i];
            m.msg_hdr.msg_iov = &mut scratch.iovecs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_name = std::ptr::null_mut();
            m.msg_hdr.msg_namelen = 0;
            m.msg_hdr.msg_control = scratch.controls[i].as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = std::mem::size_of::<[u64; CONTROL_WORDS]>() as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        // SAFETY: each iovec points into a distinct slot of `buf` and each control pointer into
        // its own buffer, all alive for the call.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                scratch.msgs.as_mut_ptr(),
                cap as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for (entry, m) in slots.iter_mut().zip(&scratch.msgs).take(n) {
            let (segment, dropped) = control_data(&m.msg_hdr);
            *entry = ((m.msg_len as usize).min(slot), segment);
            if let Some(d) = dropped {
                drops.update(d);
            }
        }
        batch.set_filled(n);
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

impl PacketReceiver for UdpReceiver {
    fn slot_size(&self, max_packet: usize) -> usize {
        slot_for(self.gro, max_packet)
    }

    fn kernel_drops(&self) -> u64 {
        DropCount::sum(&self.drops)
    }

    fn refresh_kernel_drops(&mut self) {
        DropCount::refresh(&mut self.drops, &self.sockets);
    }

    fn numa_node(&self) -> Option<u32> {
        self.node
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        if self.sockets.len() == 1 {
            // Block (up to the socket timeout) for the first datagram, then take what is queued.
            return match Self::recvmmsg(
                &self.sockets[0],
                &mut self.scratch,
                batch,
                libc::MSG_WAITFORONE,
                &mut self.drops[0],
            ) {
                Ok(()) => Ok(Received::Packets(batch.len())),
                Err(e) if is_timeout(&e) => Ok(Received::Idle),
                Err(e) => Err(e),
            };
        }
        for (fd, s) in self.fds.iter_mut().zip(&self.sockets) {
            *fd = libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
        }
        let fds = &mut self.fds;
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let r = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                POLL_INTERVAL.as_millis() as i32,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if is_timeout(&e) {
                Ok(Received::Idle)
            } else {
                Err(e)
            };
        }
        // Round-robin over ready sockets so that one busy socket cannot starve the others.
        let n_sock = self.sockets.len();
        for k in 0..n_sock {
            let i = (self.next + k) % n_sock;
            if fds[i].revents & libc::POLLIN != 0 {
                self.next = (i + 1) % n_sock;
                return match Self::recvmmsg(
                    &self.sockets[i],
                    &mut self.scratch,
                    batch,
                    libc::MSG_DONTWAIT,
                    &mut self.drops[i],
                ) {
                    Ok(()) => Ok(Received::Packets(batch.len())),
                    Err(e) if is_timeout(&e) => Ok(Received::Idle),
                    Err(e) => Err(e),
                };
            }
        }
        Ok(Received::Idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::recv_socket::{busy_poll_of, with_syscall_refused};

    fn receiver() -> UdpReceiver {
        UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 1 << 16).unwrap()
    }

    /// `--recv-busy-poll`: SO_BUSY_POLL is on every socket afterwards (read back here with
    /// `getsockopt`).
    #[test]
    fn busy_poll_is_applied_to_every_socket() {
        let mut r = receiver();
        assert_eq!(r.set_busy_poll(50).unwrap(), 50);
        for s in &r.sockets {
            assert_eq!(busy_poll_of(s).unwrap(), 50);
        }
    }

    /// A kernel that refuses SO_BUSY_POLL (EPERM without CAP_NET_ADMIN where it checks that;
    /// Linux 6.18 does not, so the refusal is made by a seccomp filter) is reported with the
    /// errno named.
    #[test]
    fn a_refused_busy_poll_names_the_errno() {
        let so_busy_poll = vec![(1, libc::SOL_SOCKET as u32), (2, libc::SO_BUSY_POLL as u32)];
        let refused = with_syscall_refused(
            libc::SYS_setsockopt,
            so_busy_poll,
            libc::EPERM as u16,
            || receiver().set_busy_poll(50),
        );
        let e = refused.expect_err("SO_BUSY_POLL refused by the filter");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("EPERM") && text.contains("CAP_NET_ADMIN"),
            "{text}"
        );
    }
}
