//! Receive sockets as both UDP receivers open them ([`super::udp`]'s `recvmmsg` one and
//! [`super::uring`]'s): binding and multicast joins, SO_RCVBUF, UDP GRO, the kernel's drop
//! count (`SO_RXQ_OVFL`) and the control data that carries it. socket2 covers the common
//! options; the rest are integer `setsockopt` calls through `libc`.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockAddr, Socket, Type};

use super::udp::{resolve_interface, GRO_SLOT, POLL_INTERVAL};

/// Set an integer socket option (socket2 has no call for SO_RCVBUFFORCE, UDP_GRO or
/// SO_RXQ_OVFL); false where the kernel refuses it.
fn set_int_option(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> bool {
    // SAFETY: setsockopt reads an int from a valid pointer for the given length.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Set SO_RCVBUF to `bytes`, past `net.core.rmem_max` where the process may (SO_RCVBUFFORCE
/// needs CAP_NET_ADMIN): high-rate receivers need tens of MiB to ride out scheduling hiccups.
fn set_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    if !set_int_option(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v) {
        socket.set_recv_buffer_size(bytes)?;
    }
    let got = socket.recv_buffer_size()?;
    if got < bytes {
        tracing::warn!(
            requested = bytes,
            got,
            "socket receive buffer capped (raise net.core.rmem_max)"
        );
    }
    Ok(())
}

/// Turn UDP GRO on; false where the kernel lacks it.
pub(crate) fn enable_gro(socket: &Socket) -> bool {
    set_int_option(socket, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Ask the kernel to attach its count of packets dropped on this socket (receive buffer
/// full) to every datagram received after a drop; false where it cannot.
fn enable_drop_count(socket: &Socket) -> bool {
    set_int_option(socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)
}

/// What a received message's control data says: the GRO segment size (0 if none) and the
/// socket's drop count when the datagram was queued (`SO_RXQ_OVFL`; the kernel attaches it
/// only once it is non-zero).
pub(crate) fn control_data(hdr: &libc::msghdr) -> (usize, Option<u32>) {
    let mut segment = 0;
    let mut drops = None;
    // SAFETY: the kernel filled msg_control/msg_controllen for this message; the CMSG macros
    // walk within that buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    segment = usize::try_from(v).unwrap_or(0);
                }
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                    drops = Some(std::ptr::read_unaligned(data as *const u32));
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    (segment, drops)
}

/// A socket's drop count as the kernel reports it (`SO_RXQ_OVFL`: a u32 that wraps), kept
/// as a total that does not.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DropCount {
    last: u32,
    total: u64,
}

impl DropCount {
    /// The drops of every socket.
    pub(crate) fn sum(counts: &[DropCount]) -> u64 {
        counts.iter().map(|d| d.total).sum()
    }

    pub(crate) fn update(&mut self, seen: u32) {
        self.total += u64::from(seen.wrapping_sub(self.last));
        self.last = seen;
    }
}

/// The batch slot for datagrams of up to `max_packet` bytes: 64 KiB where the sockets coalesce
/// packets (UDP GRO).
pub(crate) fn slot_for(gro: bool, max_packet: usize) -> usize {
    if gro {
        GRO_SLOT.max(max_packet)
    } else {
        max_packet
    }
}

/// Receive sockets for `endpoints`, one per distinct port: unicast endpoints bind their address;
/// multicast groups are joined on `interface` (a name or an address; the default route when
/// `None`). `buffer` is SO_RCVBUF in bytes (the kernel may cap it at `net.core.rmem_max`).
/// Each socket reports its drops (`SO_RXQ_OVFL`) and times out reads after [`POLL_INTERVAL`].
/// Shared by the `recvmmsg` receiver and the io_uring one (`net::uring`).
pub(crate) fn open_recv_sockets(
    endpoints: &[SocketAddrV4],
    interface: Option<&str>,
    buffer: usize,
) -> io::Result<Vec<Socket>> {
    let iface = interface.map(resolve_interface).transpose()?;
    let mut ports: Vec<u16> = endpoints.iter().map(|e| e.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    let mut sockets = Vec::new();
    for port in ports {
        let eps: Vec<&SocketAddrV4> = endpoints.iter().filter(|e| e.port() == port).collect();
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_address(true)?;
        set_recv_buffer(&socket, buffer)?;
        if !enable_drop_count(&socket) {
            tracing::warn!(
                port,
                "the kernel will not report socket drops (SO_RXQ_OVFL)"
            );
        }
        socket.set_read_timeout(Some(POLL_INTERVAL))?;
        let groups: Vec<Ipv4Addr> = eps
            .iter()
            .map(|e| *e.ip())
            .filter(Ipv4Addr::is_multicast)
            .collect();
        let bind_ip = match (eps.len(), groups.len()) {
            (1, _) => *eps[0].ip(),
            _ if groups.is_empty() && eps.iter().all(|e| e.ip() == eps[0].ip()) => *eps[0].ip(),
            _ => Ipv4Addr::UNSPECIFIED,
        };
        socket.bind(&SockAddr::from(SocketAddrV4::new(bind_ip, port)))?;
        if !groups.is_empty() {
            // Only the groups joined here, not every group any socket on the host joined.
            socket.set_multicast_all_v4(false)?;
        }
        for g in groups {
            let via = match iface {
                Some((index, _)) => InterfaceIndexOrAddress::Index(index),
                None => InterfaceIndexOrAddress::Address(Ipv4Addr::UNSPECIFIED),
            };
            socket.join_multicast_v4_n(&g, &via)?;
        }
        sockets.push(socket);
    }
    if sockets.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no endpoints to receive on",
        ));
    }
    Ok(sockets)
}

/// The local address of the first socket (useful when binding port 0 in tests).
pub(crate) fn first_local_addr(sockets: &[Socket]) -> io::Result<SocketAddrV4> {
    sockets[0]
        .local_addr()?
        .as_socket_ipv4()
        .ok_or_else(|| io::Error::other("not an IPv4 socket"))
}
