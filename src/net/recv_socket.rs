//! Receive sockets as both UDP receivers open them ([`super::udp`]'s `recvmmsg` one and
//! [`super::uring`]'s): binding and multicast joins, SO_RCVBUF, UDP GRO, the kernel's drop
//! count (`SO_RXQ_OVFL`, the control data that carries it, and `SO_MEMINFO` to read it
//! without a datagram), busy polling (`SO_BUSY_POLL`). socket2 covers the common
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

    /// Take a reading of the kernel's count. Readings come from two places that can arrive
    /// out of order: a datagram carries the count as it was when the datagram was *queued*,
    /// and [`DropCount::refresh`] reads it *now*, so a datagram queued before a refresh brings
    /// an older reading. One that is behind the last (by the wrapping distance: fewer than
    /// 2^31 drops between two readings) is ignored rather than counted as a wrap.
    pub(crate) fn update(&mut self, seen: u32) {
        let ahead = seen.wrapping_sub(self.last);
        if ahead < 1 << 31 {
            self.total += u64::from(ahead);
            self.last = seen;
        }
    }

    /// Read each socket's drop count now, without a datagram (`SO_MEMINFO`, one `getsockopt`
    /// each): a receive thread that is not receiving (waiting for a free chunk) still sees the
    /// kernel drop packets. A socket that refuses it (a kernel before 4.6) keeps the count its
    /// datagrams bring.
    pub(crate) fn refresh(counts: &mut [DropCount], sockets: &[Socket]) {
        for (d, s) in counts.iter_mut().zip(sockets) {
            if let Ok(seen) = current_drops(s) {
                d.update(seen);
            }
        }
    }
}

/// `SO_MEMINFO` (asm-generic/socket.h; the same number on every architecture cbf builds on).
const SO_MEMINFO: libc::c_int = 55;

/// The socket's drop count now: `SO_MEMINFO`'s `SK_MEMINFO_DROPS` entry (Linux 4.6) is
/// `sk_drops`, the counter `SO_RXQ_OVFL` attaches to datagrams, read with one `getsockopt`.
fn current_drops(socket: &Socket) -> io::Result<u32> {
    // SK_MEMINFO_VARS is 9 today; the kernel copies at most the length it is given.
    let mut mem = [0u32; 16];
    let mut len = std::mem::size_of_val(&mem) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `mem`, which is that long, and
    // stores the length written in `len`.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            mem.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let drops = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (drops + 1) * std::mem::size_of::<u32>() {
        return Err(io::Error::other("SO_MEMINFO without the drop count"));
    }
    Ok(mem[drops])
}

/// The errno's name where a busy-poll refusal is likely to carry one (the message names it for
/// the operator: EPERM means CAP_NET_ADMIN is missing).
pub(crate) fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EACCES) => "EACCES",
        Some(libc::ENOPROTOOPT) => "ENOPROTOOPT",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        _ => "error",
    }
}

/// Set SO_BUSY_POLL to `micros` on every socket and read it back (`getsockopt`): the value the
/// kernel holds, or its refusal with the errno named. Raising it above `net.core.busy_read`
/// (0 by default) needs CAP_NET_ADMIN (EPERM otherwise). What it does is in
/// [`super::udp::UdpReceiver::set_busy_poll`].
pub(crate) fn set_busy_poll(sockets: &[Socket], micros: u32) -> io::Result<u32> {
    let v = libc::c_int::try_from(micros).unwrap_or(libc::c_int::MAX);
    let mut applied = u32::MAX;
    for socket in sockets {
        // SAFETY: setsockopt reads an int from a valid pointer for the given length.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BUSY_POLL,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (needs CAP_NET_ADMIN)"
            } else {
                ""
            };
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "SO_BUSY_POLL {micros} µs refused: {} {e}{hint}",
                    errno_name(&e)
                ),
            ));
        }
        applied = applied.min(busy_poll_of(socket)?);
    }
    Ok(applied)
}

/// A socket's SO_BUSY_POLL in µs.
pub(crate) fn busy_poll_of(socket: &Socket) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a valid int.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(v).unwrap_or(0))
}

/// Run `f` on a thread whose system call `nr` fails with `errno` whenever its arguments match
/// `args` (argument index, low 32 bits), through a seccomp filter on that thread alone: how a
/// test sees the refusal of a kernel that refuses (SO_BUSY_POLL without CAP_NET_ADMIN on kernels
/// that check it, IORING_REGISTER_NAPI before Linux 6.9) on a kernel that does not.
#[cfg(test)]
pub(crate) fn with_syscall_refused<T: Send + 'static>(
    nr: libc::c_long,
    args: Vec<(u32, u32)>,
    errno: u16,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    // Classic BPF over `struct seccomp_data` (nr at 0, args[i] at 16 + 8i, little-endian).
    const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const MODE_FILTER: libc::c_ulong = 2;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    std::thread::spawn(move || {
        // Every check jumps to the final ALLOW when it fails.
        let checks = 1 + args.len();
        let mut prog = vec![
            op(LD_ABS, 0, 0, 0),
            op(JEQ_K, 0, (2 * checks - 1) as u8, nr as u32),
        ];
        for (k, &(index, value)) in args.iter().enumerate() {
            let left = (2 * (checks - 2 - k) + 1) as u8;
            prog.push(op(LD_ABS, 0, 0, 16 + 8 * index));
            prog.push(op(JEQ_K, 0, left, value));
        }
        prog.push(op(RET_K, 0, 0, RET_ERRNO | u32::from(errno)));
        prog.push(op(RET_K, 0, 0, RET_ALLOW));
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: no_new_privs and a seccomp filter bind only this thread, which ends with `f`;
        // the program is valid for the call and copied by the kernel.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            let r = libc::prctl(libc::PR_SET_SECCOMP, MODE_FILTER, &fprog as *const _);
            assert_eq!(r, 0, "seccomp: {}", io::Error::last_os_error());
        }
        f()
    })
    .join()
    .unwrap()
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

#[cfg(test)]
mod tests {
    use super::DropCount;

    #[test]
    fn drop_count_goes_through_a_wrap_and_ignores_older_readings() {
        let mut d = DropCount::default();
        // Readings fewer than 2^31 apart, as any two are (a socket drops far fewer between
        // two receive calls).
        d.update((1 << 31) - 1);
        d.update(u32::MAX - 2);
        // A datagram queued before that reading brings an older one: not a wrap of 2^32.
        d.update(u32::MAX - 10);
        assert_eq!(DropCount::sum(&[d]), u64::from(u32::MAX - 2));
        // A real wrap: 3 to reach 2^32, then 5 more.
        d.update(5);
        assert_eq!(DropCount::sum(&[d]), u64::from(u32::MAX) + 6);
    }
}
