//! Packet transports: each moves *batches* of packets between the wire and caller-owned
//! memory, and nothing else. Decoding, heap assembly and rate limiting live above, once
//! (`crate::spead`). Transports: [`udp`] (recvmmsg/sendmmsg), [`uring`] (the same sockets
//! through io_uring's multishot receive), [`dpdk`] (kernel bypass, cargo feature `dpdk`),
//! `ibv` (raw-packet queue pairs on RDMA NICs, cargo feature `ibv`), [`mem`] (in-process, for
//! tests), [`pcap`] (replay and capture), with [`fault`] injecting seeded loss, reordering, duplication
//! and corruption in front of any receiver. [`frame`] parses and builds the Ethernet/IPv4/UDP
//! headers that the kernel handles for the socket transports and frame-level ones must handle
//! themselves. [`numa`] finds the NIC's NUMA node and binds receive memory to it; [`cpu_set`]
//! reads and sets a thread's CPU affinity mask (for the engines' pinning and the DPDK EAL).
//! [`recv_batch`] holds what one receive call produced, copied or lent; [`link`] how a sender
//! reports packets its NIC had taken and lost when the link failed.

pub mod cpu_set;
pub mod device_memory;
pub mod dpdk;
pub mod endpoint;
pub mod fault;
pub mod frame;
#[cfg(feature = "ibv")]
pub mod ibv;
pub mod link;
pub mod mem;
pub mod numa;
pub mod pcap;
pub mod recv_batch;
pub(crate) mod recv_socket;
pub mod udp;
pub mod udp_send;
pub mod uring;
pub mod uring_send;

use std::io;

pub use device_memory::{DeviceBytes, DeviceMemory};
pub use endpoint::{parse_endpoints, EndpointError};
pub use link::{lost_in_flight, LinkDown, MAX_IN_FLIGHT};
pub use recv_batch::RecvBatch;

/// Why an ibverbs flag is refused by a build without the `ibv` feature.
pub const IBV_NOT_BUILT: &str = "this cbf was built without ibverbs support: rebuild with \
     `cargo build --release --features ibv` (needs cmake, libclang-dev and libibverbs-dev)";

/// A sender of any transport, as the engines hold them (one per `--send-interface`).
pub type NetSender = Box<dyn PacketSender>;

/// What one receive call produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// This many packets are in the batch.
    Packets(usize),
    /// Nothing arrived within the transport's poll interval; call again.
    Idle,
    /// The source is exhausted (a finished pcap file, a closed in-memory queue).
    End,
}

/// Receive a batch of packets into caller-owned memory.
pub trait PacketReceiver: Send {
    /// Replace the batch's contents with up to `batch.capacity()` datagrams.
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received>;

    /// The slot size a [`RecvBatch`] needs for packets of up to `max_packet` bytes (larger
    /// where the transport coalesces packets).
    fn slot_size(&self, max_packet: usize) -> usize {
        max_packet
    }

    /// Packets the kernel dropped before this receiver could take them (socket buffer full),
    /// as far as the transport knows; 0 where it cannot tell. The sockets' count
    /// (`SO_RXQ_OVFL`) is of datagrams: with UDP GRO one dropped datagram may have held up to
    /// 64 KiB of coalesced packets, so the packets lost can be more (the chunks' missing heaps
    /// count them whole).
    fn kernel_drops(&self) -> u64 {
        0
    }

    /// Bring [`PacketReceiver::kernel_drops`] up to date without receiving: a receive thread
    /// that cannot receive (waiting for a free chunk) calls it so that the drops this causes
    /// are seen while they happen. The socket transports otherwise learn the count only with
    /// a datagram, DPDK every few batches. Costs a system call or two; nothing where the
    /// transport cannot tell.
    fn refresh_kernel_drops(&mut self) {}

    /// Frames the transport itself refused, by cause: those that see whole frames (DPDK)
    /// parse them; socket transports leave that to the kernel and report none.
    fn frame_drops(&self) -> frame::FrameDrops {
        frame::FrameDrops::default()
    }

    /// The NUMA node of the NIC this receiver reads, where known ([`numa`]): where the memory
    /// it writes into belongs.
    fn numa_node(&self) -> Option<u32> {
        None
    }

    /// Bind the memory the transport itself receives into (a buffer ring) to `node`; nothing
    /// for transports that write straight into the caller's batch.
    fn bind_memory(&mut self, node: u32) -> Result<(), numa::NumaError> {
        let _ = node;
        Ok(())
    }
}

impl<R: PacketReceiver + ?Sized> PacketReceiver for Box<R> {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        (**self).recv_batch(batch)
    }

    fn slot_size(&self, max_packet: usize) -> usize {
        (**self).slot_size(max_packet)
    }

    fn kernel_drops(&self) -> u64 {
        (**self).kernel_drops()
    }

    fn refresh_kernel_drops(&mut self) {
        (**self).refresh_kernel_drops()
    }

    fn frame_drops(&self) -> frame::FrameDrops {
        (**self).frame_drops()
    }

    fn numa_node(&self) -> Option<u32> {
        (**self).numa_node()
    }

    fn bind_memory(&mut self, node: u32) -> Result<(), numa::NumaError> {
        (**self).bind_memory(node)
    }
}

/// Packets to send, without copying payload: each packet is its header bytes (in `headers`)
/// followed by payload slices borrowed from the heaps being sent, and last, for payload that
/// stays in GPU memory ([`device_memory`]), at most one slice of device bytes; plus a
/// destination index.
#[derive(Debug, Default)]
pub struct SendBatch<'a> {
    headers: Vec<u8>,
    parts: Vec<&'a [u8]>,
    packets: Vec<OutPacket>,
    bytes: usize,
    /// Packets with a device slice.
    gathered: usize,
}

/// Where one packet of a [`SendBatch`] lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutPacket {
    header: (usize, usize),
    parts: (usize, usize),
    /// The payload's last piece, in device memory.
    pub device: Option<DeviceBytes>,
    /// Total bytes on the wire (header and payload).
    pub len: usize,
    pub dest: usize,
}

impl<'a> SendBatch<'a> {
    pub fn clear(&mut self) {
        self.headers.clear();
        self.parts.clear();
        self.packets.clear();
        self.bytes = 0;
        self.gathered = 0;
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Bytes of all packets.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Header bytes written so far; the next packet's header is appended here.
    pub fn header_buf(&mut self) -> &mut Vec<u8> {
        &mut self.headers
    }

    /// Payload slices so far; the next packet's slices are appended here.
    pub fn parts_buf(&mut self) -> &mut Vec<&'a [u8]> {
        &mut self.parts
    }

    /// Both buffers at once, for a generator that writes a header and its payload slices.
    pub fn bufs(&mut self) -> (&mut Vec<u8>, &mut Vec<&'a [u8]>) {
        (&mut self.headers, &mut self.parts)
    }

    /// The same (empty) batch for borrows of another lifetime, keeping its allocations:
    /// how a sender reuses one batch across calls whose heaps live for different times.
    pub fn reuse<'b>(mut self) -> SendBatch<'b> {
        self.parts.clear();
        SendBatch {
            headers: {
                self.headers.clear();
                self.headers
            },
            // An empty Vec<&'a [u8]> becomes an empty Vec<&'b [u8]>; collecting a by-value
            // iterator of the same layout reuses the allocation.
            parts: self
                .parts
                .into_iter()
                .map(|_| -> &'b [u8] { &[] })
                .collect(),
            packets: {
                self.packets.clear();
                self.packets
            },
            bytes: 0,
            gathered: 0,
        }
    }

    /// Close the packet whose header starts at `header_start` and whose payload slices start
    /// at `parts_start`.
    pub fn finish_packet(&mut self, header_start: usize, parts_start: usize, dest: usize) {
        self.finish_gathered(header_start, parts_start, None, dest);
    }

    /// [`SendBatch::finish_packet`] for a packet whose payload ends with `device` bytes.
    pub fn finish_gathered(
        &mut self,
        header_start: usize,
        parts_start: usize,
        device: Option<DeviceBytes>,
        dest: usize,
    ) {
        let header = (header_start, self.headers.len() - header_start);
        let parts = (parts_start, self.parts.len() - parts_start);
        let len = header.1
            + self.parts[parts_start..]
                .iter()
                .map(|p| p.len())
                .sum::<usize>()
            + device.map_or(0, |d| d.len);
        self.packets.push(OutPacket {
            header,
            parts,
            device,
            len,
            dest,
        });
        self.bytes += len;
        self.gathered += usize::from(device.is_some());
    }

    /// Refuse a batch with device payload: what every transport that copies packets (all but
    /// ibverbs) checks first.
    pub fn host_only(&self) -> io::Result<()> {
        if self.gathered == 0 {
            Ok(())
        } else {
            Err(device_memory::not_gathered())
        }
    }

    /// Append a packet given as one contiguous slice.
    pub fn push_packet(&mut self, bytes: &'a [u8], dest: usize) {
        let (h, p) = (self.headers.len(), self.parts.len());
        self.parts.push(bytes);
        self.finish_packet(h, p, dest);
    }

    pub fn packet(&self, i: usize) -> &OutPacket {
        &self.packets[i]
    }

    /// The host pieces of packet `i` in wire order: its header, then its payload slices (then,
    /// not among them, its device slice, [`OutPacket::device`]).
    pub fn pieces(&self, i: usize) -> impl Iterator<Item = &[u8]> {
        let p = &self.packets[i];
        std::iter::once(&self.headers[p.header.0..p.header.0 + p.header.1])
            .chain(self.parts[p.parts.0..p.parts.0 + p.parts.1].iter().copied())
    }

    /// Packet `i`'s host pieces copied into one buffer (for transports that need contiguous
    /// bytes, after [`SendBatch::host_only`]).
    pub fn to_vec(&self, i: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.packets[i].len);
        for piece in self.pieces(i) {
            v.extend_from_slice(piece);
        }
        v
    }
}

/// Send a batch of packets. Destinations are indices into the transport's destination list.
pub trait PacketSender: Send {
    /// Number of destinations this sender knows.
    fn destinations(&self) -> usize;
    /// Send every packet of the batch (blocking until the kernel or device took them). A link
    /// error (the interface is down) means none of the batch counts as sent; it may say that
    /// packets of earlier calls were lost too ([`link`]).
    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()>;
    /// Block until the NIC is done with every packet sent so far, so that payload the packets
    /// point into (device slices, [`OutPacket::device`]) may be rewritten: it has sent them,
    /// or its link failed and the sender took them back, which it reports as a link error
    /// saying how many were lost ([`LinkDown`]). Bounded: a NIC that makes no progress counts
    /// as failed. Transports that copy each packet before [`PacketSender::send_batch`] returns
    /// have nothing to wait for.
    fn wait_sent(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: PacketSender + ?Sized> PacketSender for Box<S> {
    fn destinations(&self) -> usize {
        (**self).destinations()
    }
    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        (**self).send_batch(batch)
    }
    fn wait_sent(&mut self) -> io::Result<()> {
        (**self).wait_sent()
    }
}
