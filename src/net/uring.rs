//! UDP through io_uring (issue 15; seed 000 §Network receive): the same sockets as
//! `net::recv_socket` (`open_recv_sockets`: multicast joins, SO_RCVBUF, SO_RXQ_OVFL), read by one
//! *multishot* `recvmsg` per socket into a ring of kernel-provided buffers
//! (`IORING_REGISTER_PBUF_RING`). One submission keeps a socket receiving for as long as the ring
//! has buffers, and a batch is collected from the completion queue in shared memory.
//!
//! Per batch: no system call at all while completions are queued, and one `io_uring_enter` to
//! wait when none are, or to re-arm a request that ended. The kernel's work for arriving
//! datagrams (copying each into a buffer and posting its completion) is deferred to that call
//! (`DEFER_TASKRUN`, Linux 6.1, with `SINGLE_ISSUER`): it runs in one go when this thread asks
//! for completions, not at whatever kernel entry or interrupt return comes next, which
//! `COOP_TASKRUN` (the fallback on Linux 5.19–6.0) allows and which `perf` showed running
//! under `exit_to_user_mode_loop`, between this thread's own work. The ring is created
//! disabled and enabled by the receive thread's first call, so that the thread that receives
//! is its single issuer (receivers are made on the main thread and moved). Each completion names the buffer
//! the kernel filled, and that buffer is *lent* to the caller's [`RecvBatch`] rather than
//! copied into it (`net::recv_batch`): the packets are read where the kernel wrote them, and
//! the buffers go back to the ring when the batch is cleared (at the start of the next receive
//! call). So the payload is copied once by the kernel and once into the chunk, as on the
//! `recvmmsg` path; an earlier version copied it into the batch as well, and lost to `recvmmsg`
//! by 40–100 % per packet on a prefilled socket (`bench/RESULTS.md`, issue 15).
//!
//! With UDP GRO (as the `recvmmsg` path has it) the kernel may coalesce a flow's packets into
//! one 64 KiB datagram with the segment size in a control message; the batch splits it, exactly
//! as for `recvmmsg`. Without GRO a multishot receive costs a trip through the stack per
//! packet, which on loopback from a GSO sender (dsim) took 2.5 times the CPU of `recvmmsg` +
//! GRO. Zero-copy send is `net::uring_send`. Not here yet (issue 15): SQPOLL, receiving straight
//! into registered chunk memory (that needs the chunk, not a batch, to own the buffers).
//!
//! The `io-uring` crate provides the ring, the opcodes and the `recvmsg` output parser; the
//! provided-buffer ring itself (page-aligned entries and a tail the kernel reads) has no safe
//! wrapper in it, so [`BufRing`] is written here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::types::{BufRingEntry, Fd, Napi, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, IoUring};
use socket2::Socket;

use super::numa::NumaError;
use super::recv_batch::Lender;
use super::recv_socket::{
    control_data, enable_gro, errno_name, first_local_addr, open_recv_sockets, slot_for, DropCount,
};
use super::udp::POLL_INTERVAL;
use super::{PacketReceiver, Received, RecvBatch};

/// Buffers in the provided-buffer ring with GRO's 64 KiB buffers (2 MiB). The kernel takes
/// buffers from the ring in the order they were put in, so every buffer is written in turn and
/// the whole ring is the working set the kernel's copy and the chunk stream's copy go through:
/// the smaller it is, the more of it is still in cache. With DEFER_TASKRUN the kernel fills
/// buffers only inside this thread's receive call, so the ring need hold no more than one call
/// takes; datagrams beyond it wait in the socket buffer (the request ends for want of buffers
/// and is re-armed on the next call; the socket's overflows are counted). 32 buffers took 2–23 %
/// less receive CPU per packet than 128 (8 MiB) on loopback, in every method and at both packet
/// sizes, and 16 or 8 no less than 32 (bench/RESULTS.md, io_uring ring-size section,
/// twenty-fourth session). One batch may hold every buffer; nothing is then received (it waits
/// in the socket buffer) until a batch is cleared, as each receive call clears its own batch
/// first: so a caller that keeps batches while receiving into others must leave buffers in the
/// ring (`tests/uring_recv.rs`).
const RING_BUFFERS_GRO: u16 = 32;
/// Buffers in the ring without GRO, where a buffer holds one packet (~9 KiB): 128 of them are
/// 1.1 MiB.
const RING_BUFFERS_PLAIN: u16 = 128;
/// Submission queue entries: one multishot request per socket is all that is ever queued.
const SQ_ENTRIES: u32 = 64;
// The kernel takes the ring's length as a power of two, and refuses a completion queue (twice
// the ring: every buffer can complete before the queue is read) smaller than the submission
// queue.
const _: () = assert!(RING_BUFFERS_GRO.is_power_of_two() && RING_BUFFERS_PLAIN.is_power_of_two());
const _: () = assert!(2 * RING_BUFFERS_GRO as u32 >= SQ_ENTRIES);
const _: () = assert!(2 * RING_BUFFERS_PLAIN as u32 >= SQ_ENTRIES);
/// The ring's buffer group (one ring per receiver, one receiver per io_uring instance).
const GROUP: u16 = 0;
/// Control-message space per datagram: SO_RXQ_OVFL and UDP_GRO, 4 bytes each behind 16-byte
/// headers.
const CONTROL_BYTES: usize = 64;
/// `struct io_uring_recvmsg_out` (four u32: name, control and payload lengths, flags), which the
/// kernel writes at the start of every buffer of a multishot `recvmsg`.
const RECVMSG_OUT: usize = 16;

/// The `recvmsg` template every multishot request points at (no name, control space only).
struct MsgTemplate(Box<libc::msghdr>);

// SAFETY: the template's pointers are all null; it is read by the kernel and by `RecvMsgOut`
// for its lengths only.
unsafe impl Send for MsgTemplate {}

/// The provided-buffer ring's entries: page-aligned memory the kernel reads buffers from, and
/// whose tail (in the first entry's reserved field) this side advances.
struct BufRing {
    entries: *mut BufRingEntry,
    /// Entries (a power of two).
    len: u16,
    layout: Layout,
    /// Entries added so far (mod 2¹⁶, as the kernel counts).
    tail: u16,
}

// SAFETY: the entries are owned by the ring and touched only by the thread that owns the
// receiver (and by the kernel, through the registration).
unsafe impl Send for BufRing {}

impl BufRing {
    fn new(len: u16) -> io::Result<BufRing> {
        debug_assert!(len.is_power_of_two());
        let bytes = usize::from(len) * std::mem::size_of::<BufRingEntry>();
        let layout = Layout::from_size_align(bytes, 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let entries = unsafe { alloc_zeroed(layout) }.cast::<BufRingEntry>();
        if entries.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "buffer ring"));
        }
        Ok(BufRing {
            entries,
            len,
            layout,
            tail: 0,
        })
    }

    /// Queue buffer `bid` (at `addr`, `len` bytes) for the kernel; visible after [`publish`].
    ///
    /// [`publish`]: BufRing::publish
    fn push(&mut self, bid: u16, addr: u64, len: u32) {
        let i = usize::from(self.tail & (self.len - 1));
        // SAFETY: i < len; the slot at the tail is not one the kernel may still read, since at
        // most len buffers are ever in the ring (each bid is pushed once at
        // the start and again only after the kernel handed it back and no batch holds it).
        let e = unsafe { &mut *self.entries.add(i) };
        e.set_addr(addr);
        e.set_len(len);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Make the pushed buffers visible to the kernel.
    fn publish(&self) {
        // SAFETY: `entries` is the ring's first entry; its tail field is a u16 the kernel reads
        // with acquire semantics, so the store releases the entries written before it.
        unsafe {
            let tail = BufRingEntry::tail(self.entries).cast::<AtomicU16>();
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the receiver unregisters the ring from
        // the kernel before its fields (this one included) are dropped.
        unsafe { dealloc(self.entries.cast(), self.layout) }
    }
}

/// The provided buffers: one per ring entry, of `size` bytes in one page-aligned allocation, each
/// either in the ring (the kernel's to fill), lent to a batch, or given back by one and waiting
/// in `returned` to go into the ring again.
#[derive(Debug)]
struct Buffers {
    mem: *mut u8,
    layout: Layout,
    size: usize,
    /// Ids given back by batches (as `usize` handles).
    returned: Mutex<Vec<usize>>,
}

// SAFETY: the memory is owned by this value and freed once, in Drop; which buffer may be read
// or written by whom is the ring/loan protocol above, and `returned` is behind a lock.
unsafe impl Send for Buffers {}
// SAFETY: as above; `&Buffers` gives only the base address and the lock.
unsafe impl Sync for Buffers {}

impl Buffers {
    fn new(count: u16, size: usize) -> io::Result<Buffers> {
        let layout =
            Layout::from_size_align(usize::from(count) * size, 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size (size > 0).
        let mem = unsafe { alloc_zeroed(layout) };
        if mem.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "provided buffers",
            ));
        }
        Ok(Buffers {
            mem,
            layout,
            size,
            returned: Mutex::new(Vec::with_capacity(usize::from(count))),
        })
    }

    /// The address of buffer `bid`.
    fn addr(&self, bid: u16) -> u64 {
        self.mem as u64 + (usize::from(bid) * self.size) as u64
    }

    /// Buffer `bid`'s bytes, for reading a completion the kernel posted for it.
    ///
    /// # Safety
    /// The kernel must have handed `bid` back (a completion named it) and it must not be in
    /// the ring again: nothing writes into it meanwhile.
    unsafe fn buffer(&self, bid: u16) -> &[u8] {
        std::slice::from_raw_parts(self.mem.add(usize::from(bid) * self.size), self.size)
    }
}

/// The handles are buffer ids (`bid`).
impl Lender for Buffers {
    fn give_back(&self, handles: &mut Vec<usize>) {
        self.returned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append(handles);
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the last owner is gone (the receiver
        // unregistered the ring and closed its file first, and no batch holds a loan).
        unsafe { dealloc(self.mem, self.layout) }
    }
}

/// A UDP receiver over one or more sockets, through io_uring.
pub struct UringReceiver {
    // Declared first: dropped (its file closed) before the memory the kernel writes into.
    ring: IoUring,
    ring_buffers: BufRing,
    /// The buffers, lent to batches; `lender` is the same object, as batches hold it.
    buffers: Arc<Buffers>,
    lender: Arc<dyn Lender>,
    buf_size: usize,
    /// Every socket coalesces (UDP GRO): batches need 64 KiB slots.
    gro: bool,
    msghdr: MsgTemplate,
    sockets: Vec<Socket>,
    /// Per socket: its multishot request is live.
    armed: Vec<bool>,
    /// The ring awaits `register_enable_rings` from the thread that receives (`DEFER_TASKRUN`).
    disabled: bool,
    drops: Vec<DropCount>,
    /// The receiving NIC's NUMA node, where known.
    node: Option<u32>,
}

impl UringReceiver {
    /// Bind to every endpoint as [`super::udp::UdpReceiver::bind`] does, for datagrams of up to
    /// `max_packet` bytes. Fails where the kernel lacks multishot `recvmsg` (Linux 6.0).
    pub fn bind(
        endpoints: &[SocketAddrV4],
        interface: Option<&str>,
        buffer: usize,
        max_packet: usize,
    ) -> io::Result<UringReceiver> {
        let sockets = open_recv_sockets(endpoints, interface, buffer)?;
        let gro = sockets.iter().all(enable_gro);
        let payload = slot_for(gro, max_packet);
        let count = if gro {
            RING_BUFFERS_GRO
        } else {
            RING_BUFFERS_PLAIN
        };
        // Every buffer can complete before the queue is read. The kernel's receive work runs
        // when this thread asks for completions (module doc): DEFER_TASKRUN where the kernel
        // has it, else COOP_TASKRUN.
        let cq = 2 * u32::from(count);
        let (ring, disabled) = match IoUring::builder()
            .setup_cqsize(cq)
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_r_disabled()
            .build(SQ_ENTRIES)
        {
            Ok(ring) => (ring, true),
            Err(_) => (
                IoUring::builder()
                    .setup_cqsize(cq)
                    .setup_coop_taskrun()
                    .build(SQ_ENTRIES)?,
                false,
            ),
        };
        let buf_size = (RECVMSG_OUT + CONTROL_BYTES + payload).next_multiple_of(64);
        let buffers = Arc::new(Buffers::new(count, buf_size)?);
        let mut ring_buffers = BufRing::new(count)?;
        for bid in 0..count {
            ring_buffers.push(bid, buffers.addr(bid), buf_size as u32);
        }
        ring_buffers.publish();
        // SAFETY: the entries stay allocated (and the buffers they point into) until Drop
        // unregisters the ring.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                ring_buffers.entries as u64,
                count,
                GROUP,
                0,
            )
        }
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("io_uring provided-buffer ring (needs Linux 5.19): {e}"),
            )
        })?;
        // SAFETY: an all-zero msghdr is valid (no name, no iovec, no control).
        let mut msghdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msghdr.msg_controllen = CONTROL_BYTES as _;
        let n = sockets.len();
        Ok(UringReceiver {
            ring,
            ring_buffers,
            lender: Arc::clone(&buffers) as Arc<dyn Lender>,
            buffers,
            buf_size,
            gro,
            msghdr: MsgTemplate(msghdr),
            sockets,
            armed: vec![false; n],
            disabled,
            drops: vec![DropCount::default(); n],
            node: super::numa::nic_node(interface),
        })
    }

    /// Busy-poll for `micros` µs (`--recv-busy-poll`) through io_uring's own NAPI busy polling
    /// (`IORING_REGISTER_NAPI`, Linux 6.9, dynamic tracking); the timeout the ring holds (read
    /// back by registering the same settings again, which returns the ones in force), or the
    /// kernel's refusal naming the errno.
    ///
    /// What it does: while this receiver's thread waits in `io_uring_enter` for completions,
    /// the kernel polls the NAPI contexts (RX queues) of the sockets with requests in flight
    /// for up to `micros` before it sleeps. What it does not do: SO_BUSY_POLL (the socket
    /// option of the `recvmmsg` path) is not set, because a multishot receive never blocks in
    /// the socket, so it would change nothing here; there is no busy polling while completions
    /// are already queued (none is needed); and a device without NAPI (loopback, most veths)
    /// has nothing to poll, so there the setting is held but changes nothing.
    pub fn set_busy_poll(&mut self, micros: u32) -> io::Result<u32> {
        let settings = Napi::new().set_busy_poll_timeout(micros);
        let refused = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!(
                    "io_uring NAPI busy polling (IORING_REGISTER_NAPI, Linux 6.9) refused: {} {e}",
                    errno_name(&e)
                ),
            )
        };
        let mut napi = settings;
        self.ring
            .submitter()
            .register_napi(&mut napi)
            .map_err(refused)?;
        let mut held = settings;
        self.ring
            .submitter()
            .register_napi(&mut held)
            .map_err(refused)?;
        Ok(held.busy_poll_timeout())
    }

    /// The local address of the first socket (useful when binding port 0 in tests).
    pub fn local_addr(&self) -> io::Result<SocketAddrV4> {
        first_local_addr(&self.sockets)
    }

    /// Submit a multishot `recvmsg` for every socket without a live one (at the start, and
    /// after the kernel ended one: its buffers ran out, or an error).
    fn arm(&mut self) -> io::Result<()> {
        for (i, (s, armed)) in self.sockets.iter().zip(&mut self.armed).enumerate() {
            if *armed {
                continue;
            }
            let sqe = opcode::RecvMsgMulti::new(Fd(s.as_raw_fd()), &*self.msghdr.0, GROUP)
                .build()
                .user_data(i as u64);
            // SAFETY: the msghdr is boxed in `self` and outlives the request (the ring is
            // closed first on drop); the buffers come from the registered group.
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            *armed = true;
        }
        Ok(())
    }

    /// Put the buffers batches gave back into the ring again.
    fn take_back(&mut self) {
        let mut back = self
            .buffers
            .returned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for handle in back.drain(..) {
            // Only ids lent below come back, each below the ring's length.
            let bid = handle as u16;
            self.ring_buffers
                .push(bid, self.buffers.addr(bid), self.buf_size as u32);
        }
    }

    /// One pass: arm, wait up to a poll interval for a completion unless some are queued, and
    /// lend what is queued to `batch` (empty: a second pass comes only after a first that
    /// took nothing, so every completion taken finds room). False when no datagram came but a
    /// request ended (try again at once).
    fn take(&mut self, batch: &mut RecvBatch) -> io::Result<bool> {
        if self.disabled {
            // This thread becomes the ring's single issuer.
            self.ring.submitter().register_enable_rings()?;
            self.disabled = false;
        }
        self.take_back();
        self.ring_buffers.publish();
        self.arm()?;
        if self.ring.completion().is_empty() {
            let ts = Timespec::new().nsec(POLL_INTERVAL.as_nanos() as u32);
            let args = SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::ETIME)
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        } else if !self.ring.submission().is_empty() {
            self.ring.submit()?;
        }
        let mut ended = false;
        let mut failure = None;
        let mut refused = 0;
        for cqe in self.ring.completion().take(batch.capacity()) {
            let socket = cqe.user_data() as usize;
            let flags = cqe.flags();
            if !cqueue::more(flags) {
                self.armed[socket] = false;
                ended = true;
            }
            let Some(bid) = cqueue::buffer_select(flags) else {
                // No buffer: the request ended (ENOBUFS when the ring ran dry, re-armed on the
                // next call while the socket buffer holds the traffic) or failed.
                match -cqe.result() {
                    0 | libc::ENOBUFS | libc::EINTR | libc::EAGAIN => {}
                    errno => failure = Some(io::Error::from_raw_os_error(errno)),
                }
                continue;
            };
            // SAFETY: the completion hands `bid` back from the kernel; it goes into the ring
            // again only when the batch gives it back, or below.
            let buf = unsafe { self.buffers.buffer(bid) };
            let lent = match RecvMsgOut::parse(buf, &self.msghdr.0) {
                Ok(msg) => {
                    let control = msg.control_data();
                    // SAFETY: an all-zero msghdr is valid; it only points control_data at
                    // `control`.
                    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
                    hdr.msg_control = control.as_ptr().cast_mut().cast();
                    hdr.msg_controllen = control.len() as _;
                    let (segment, dropped) = control_data(&hdr);
                    if let Some(d) = dropped {
                        self.drops[socket].update(d);
                    }
                    // A datagram cut short by the buffer fails SPEAD parsing and is counted
                    // there.
                    let payload = msg.payload_data();
                    // SAFETY: the payload lies in buffer `bid`, which stays allocated while
                    // the lender (held by the batch) lives and goes into the ring again only
                    // after the batch gives it back (`take_back`).
                    unsafe {
                        batch.push_lent(
                            &self.lender,
                            usize::from(bid),
                            payload.as_ptr(),
                            payload.len(),
                            segment,
                        )
                    }
                }
                Err(()) => false,
            };
            if !lent {
                refused += 1;
                self.ring_buffers
                    .push(bid, self.buffers.addr(bid), self.buf_size as u32);
            }
        }
        if refused > 0 {
            self.ring_buffers.publish();
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(!batch.is_empty() || !ended)
    }
}

impl Drop for UringReceiver {
    fn drop(&mut self) {
        // No buffer may be picked once the memory behind it is freed.
        let _ = self.ring.submitter().unregister_buf_ring(GROUP);
    }
}

impl PacketReceiver for UringReceiver {
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

    /// The provided buffers the kernel writes datagrams into (the ring's entries are one page).
    fn bind_memory(&mut self, node: u32) -> Result<(), NumaError> {
        // SAFETY: the allocation's whole extent, alive while `self` is; mbind reads only its
        // address range (the bytes themselves are neither read nor written here).
        let all =
            unsafe { std::slice::from_raw_parts(self.buffers.mem, self.buffers.layout.size()) };
        super::numa::bind_area(all, node)
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        // A pass that only found requests ending (the ring ran dry while datagrams waited in the
        // socket) re-arms them and waits again, rather than reporting an idle interval.
        for _ in 0..2 {
            if self.take(batch)? {
                break;
            }
        }
        Ok(if batch.is_empty() {
            Received::Idle
        } else {
            Received::Packets(batch.len())
        })
    }
}

#[cfg(test)]
#[path = "uring_tests.rs"]
mod tests;
