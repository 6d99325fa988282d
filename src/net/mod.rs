//! Packet transports: each moves *batches* of packets between the wire and caller-owned
//! memory, and nothing else. Decoding, heap assembly and rate limiting live above, once
//! (`crate::spead`). Transports: [`udp`] (recvmmsg/sendmmsg), [`mem`] (in-process, for tests),
//! [`pcap`] (replay and capture), with [`fault`] injecting seeded loss, reordering, duplication
//! and corruption in front of any receiver.

pub mod endpoint;
pub mod fault;
pub mod mem;
pub mod pcap;
pub mod udp;

use std::io;

pub use endpoint::{parse_endpoints, EndpointError};

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

/// Caller-owned receive memory: `capacity` slots of `slot_size` bytes each, plus lengths.
///
/// A transport writes packet `i` into slot `i`. A datagram longer than a slot is truncated to
/// the slot, and the SPEAD parser then refuses it (its payload length points past the packet),
/// so oversized packets are counted rather than silently cut.
#[derive(Debug)]
pub struct RecvBatch {
    buf: Vec<u8>,
    slot_size: usize,
    lens: Vec<usize>,
    len: usize,
}

impl RecvBatch {
    pub fn new(capacity: usize, slot_size: usize) -> RecvBatch {
        let capacity = capacity.max(1);
        RecvBatch {
            buf: vec![0u8; capacity * slot_size],
            slot_size,
            lens: vec![0; capacity],
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Packet `i` of the batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        let start = i * self.slot_size;
        &self.buf[start..start + self.lens[i]]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len).map(|i| self.packet(i))
    }

    /// Copy a packet into the next slot (for transports that do not DMA); false when full.
    /// Packets longer than a slot are truncated (and will fail SPEAD parsing).
    pub fn push(&mut self, packet: &[u8]) -> bool {
        if self.len == self.capacity() {
            return false;
        }
        let n = packet.len().min(self.slot_size);
        let start = self.len * self.slot_size;
        self.buf[start..start + n].copy_from_slice(&packet[..n]);
        self.lens[self.len] = n;
        self.len += 1;
        true
    }

    /// The raw slots and length table, for transports that receive in place.
    pub(crate) fn raw_parts(&mut self) -> (&mut [u8], &mut [usize], usize) {
        (&mut self.buf, &mut self.lens, self.slot_size)
    }

    pub(crate) fn set_len(&mut self, n: usize) {
        self.len = n.min(self.capacity());
    }
}

/// Receive a batch of packets into caller-owned memory.
pub trait PacketReceiver: Send {
    /// Replace the batch's contents with up to `batch.capacity()` packets.
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received>;
}

impl<R: PacketReceiver + ?Sized> PacketReceiver for Box<R> {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        (**self).recv_batch(batch)
    }
}

/// Packets to send: contiguous bytes, each packet with a destination index.
#[derive(Debug, Default)]
pub struct SendBatch {
    pub buf: Vec<u8>,
    /// (start, length, destination index) per packet.
    pub packets: Vec<(usize, usize, usize)>,
}

impl SendBatch {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.packets.clear();
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn packet(&self, i: usize) -> (&[u8], usize) {
        let (start, len, dest) = self.packets[i];
        (&self.buf[start..start + len], dest)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], usize)> {
        (0..self.packets.len()).map(|i| self.packet(i))
    }
}

/// Send a batch of packets. Destinations are indices into the transport's destination list.
pub trait PacketSender: Send {
    /// Number of destinations this sender knows.
    fn destinations(&self) -> usize;
    /// Send every packet of the batch (blocking until the kernel or device took them).
    fn send_batch(&mut self, batch: &SendBatch) -> io::Result<()>;
}

impl<S: PacketSender + ?Sized> PacketSender for Box<S> {
    fn destinations(&self) -> usize {
        (**self).destinations()
    }
    fn send_batch(&mut self, batch: &SendBatch) -> io::Result<()> {
        (**self).send_batch(batch)
    }
}
