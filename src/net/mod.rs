//! Packet transports: each moves *batches* of packets between the wire and caller-owned
//! memory, and nothing else. Decoding, heap assembly and rate limiting live above, once
//! (`crate::spead`). Transports: [`udp`] (recvmmsg/sendmmsg), [`uring`] (the same sockets
//! through io_uring's multishot receive), [`dpdk`] (kernel bypass, cargo feature `dpdk`),
//! `ibv` (raw-packet queue pairs on RDMA NICs, cargo feature `ibv`), [`mem`] (in-process, for
//! tests), [`pcap`] (replay and capture), with [`fault`] injecting seeded loss, reordering, duplication
//! and corruption in front of any receiver. [`frame`] parses and builds the Ethernet/IPv4/UDP
//! headers that the kernel handles for the socket transports and frame-level ones must handle
//! themselves. [`numa`] finds the NIC's NUMA node and binds receive memory to it.

pub mod dpdk;
pub mod endpoint;
pub mod fault;
pub mod frame;
#[cfg(feature = "ibv")]
pub mod ibv;
pub mod mem;
pub mod numa;
pub mod pcap;
pub(crate) mod recv_socket;
pub mod udp;
pub mod uring;

use std::io;

pub use endpoint::{parse_endpoints, EndpointError};

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

/// Caller-owned receive memory: `capacity` slots of `slot_size` bytes each. A transport fills
/// slot `i` with one datagram, or with several equal-sized packets coalesced by the kernel
/// (UDP GRO); [`RecvBatch::iter`] yields the packets either way.
///
/// A datagram longer than a slot is truncated to the slot, and the SPEAD parser then refuses
/// it (its payload length points past the packet), so oversized packets are counted rather
/// than silently cut.
#[derive(Debug)]
pub struct RecvBatch {
    buf: Vec<u8>,
    slot_size: usize,
    /// Bytes in each filled slot, and the segment size when the slot holds coalesced packets
    /// (0 = one packet).
    slots: Vec<(usize, usize)>,
    filled: usize,
    /// (start, length) of every packet, in order.
    packets: Vec<(usize, usize)>,
}

impl RecvBatch {
    pub fn new(capacity: usize, slot_size: usize) -> RecvBatch {
        let capacity = capacity.max(1);
        RecvBatch {
            buf: vec![0u8; capacity * slot_size],
            slot_size,
            slots: vec![(0, 0); capacity],
            filled: 0,
            packets: Vec::with_capacity(capacity),
        }
    }

    /// Slots (datagrams) per batch.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Packets in the batch.
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    pub fn clear(&mut self) {
        self.filled = 0;
        self.packets.clear();
    }

    /// Packet `i` of the batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        let (start, len) = self.packets[i];
        &self.buf[start..start + len]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.packets.iter().map(|&(s, l)| &self.buf[s..s + l])
    }

    /// Copy a packet into the next slot (for transports that do not receive in place); false
    /// when full. Packets longer than a slot are truncated (and will fail SPEAD parsing).
    pub fn push(&mut self, packet: &[u8]) -> bool {
        self.push_segmented(packet, 0)
    }

    /// Copy a datagram into the next slot, as [`RecvBatch::push`]; a non-zero `segment` says
    /// it holds packets of that size coalesced by the kernel (UDP GRO), which the batch splits.
    pub fn push_segmented(&mut self, datagram: &[u8], segment: usize) -> bool {
        if self.filled == self.capacity() {
            return false;
        }
        let n = datagram.len().min(self.slot_size);
        let start = self.filled * self.slot_size;
        self.buf[start..start + n].copy_from_slice(&datagram[..n]);
        self.slots[self.filled] = (n, segment);
        self.filled += 1;
        self.split_slot(start, n, segment);
        true
    }

    /// Append slot bytes `start .. start + len` to the packet list, cut into `segment`-byte
    /// packets when it holds coalesced ones (`segment` 0: one packet).
    fn split_slot(&mut self, start: usize, len: usize, segment: usize) {
        if segment == 0 || segment >= len {
            self.packets.push((start, len));
        } else {
            let mut off = 0;
            while off < len {
                let l = segment.min(len - off);
                self.packets.push((start + off, l));
                off += l;
            }
        }
    }

    /// The raw slot memory and the (length, segment size) table, for transports that receive
    /// in place; call [`RecvBatch::set_filled`] afterwards.
    pub(crate) fn raw_parts(&mut self) -> (&mut [u8], &mut [(usize, usize)], usize) {
        (&mut self.buf, &mut self.slots, self.slot_size)
    }

    /// Bind the slot memory to NUMA node `node` (the receiving NIC's; [`numa`]).
    pub fn bind_to_node(&self, node: u32) -> Result<(), numa::NumaError> {
        numa::bind_area(&self.buf, node)
    }

    /// Declare the first `n` slots filled and split them into packets.
    pub(crate) fn set_filled(&mut self, n: usize) {
        self.filled = n.min(self.capacity());
        self.packets.clear();
        for i in 0..self.filled {
            let (len, seg) = self.slots[i];
            self.split_slot(i * self.slot_size, len.min(self.slot_size), seg);
        }
    }
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
    /// as far as the transport knows; 0 where it cannot tell.
    fn kernel_drops(&self) -> u64 {
        0
    }

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
/// followed by payload slices borrowed from the heaps being sent, plus a destination index.
#[derive(Debug, Default)]
pub struct SendBatch<'a> {
    headers: Vec<u8>,
    parts: Vec<&'a [u8]>,
    packets: Vec<OutPacket>,
    bytes: usize,
}

/// Where one packet of a [`SendBatch`] lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutPacket {
    header: (usize, usize),
    parts: (usize, usize),
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
        }
    }

    /// Close the packet whose header starts at `header_start` and whose payload slices start
    /// at `parts_start`.
    pub fn finish_packet(&mut self, header_start: usize, parts_start: usize, dest: usize) {
        let header = (header_start, self.headers.len() - header_start);
        let parts = (parts_start, self.parts.len() - parts_start);
        let len = header.1
            + self.parts[parts_start..]
                .iter()
                .map(|p| p.len())
                .sum::<usize>();
        self.packets.push(OutPacket {
            header,
            parts,
            len,
            dest,
        });
        self.bytes += len;
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

    /// The pieces of packet `i` in wire order: its header, then its payload slices.
    pub fn pieces(&self, i: usize) -> impl Iterator<Item = &[u8]> {
        let p = &self.packets[i];
        std::iter::once(&self.headers[p.header.0..p.header.0 + p.header.1])
            .chain(self.parts[p.parts.0..p.parts.0 + p.parts.1].iter().copied())
    }

    /// Packet `i` copied into one buffer (for transports that need contiguous bytes).
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
    /// Send every packet of the batch (blocking until the kernel or device took them).
    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()>;
}

impl<S: PacketSender + ?Sized> PacketSender for Box<S> {
    fn destinations(&self) -> usize {
        (**self).destinations()
    }
    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        (**self).send_batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesced_slots_split_into_packets() {
        let mut b = RecvBatch::new(3, 100);
        {
            let (buf, slots, slot) = b.raw_parts();
            buf[..10].copy_from_slice(&[1; 10]);
            slots[0] = (10, 0);
            for (i, x) in buf[slot..slot + 25].iter_mut().enumerate() {
                *x = i as u8;
            }
            slots[1] = (25, 10); // 10 + 10 + 5
        }
        b.set_filled(2);
        let got: Vec<Vec<u8>> = b.iter().map(<[u8]>::to_vec).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], [1; 10]);
        assert_eq!(got[1], (0..10).collect::<Vec<u8>>());
        assert_eq!(got[3], (20..25).collect::<Vec<u8>>());
        b.clear();
        assert!(b.push(&[9; 200]));
        assert_eq!(b.packet(0).len(), 100);
        // A copied datagram of coalesced packets splits as one received in place does.
        let data: Vec<u8> = (0..25).collect();
        assert!(b.push_segmented(&data, 10));
        let got: Vec<Vec<u8>> = b.iter().skip(1).map(<[u8]>::to_vec).collect();
        assert_eq!(got, [&data[..10], &data[10..20], &data[20..]]);
        assert!(b.push(&[1; 5]));
        assert!(!b.push(&[2; 5]), "a full batch takes no more");
    }
}
