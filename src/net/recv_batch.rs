//! The receive batch every transport fills ([`RecvBatch`]): caller-owned slots the datagrams
//! are copied or received into, or, for a transport whose kernel writes into memory of its own
//! (io_uring's provided buffers), that memory *lent* to the batch until it is cleared, so that
//! the payload is not copied once more on its way to the chunk.
//!
//! Lending ([`Lender`]): a transport that lends puts each filled buffer's id in the batch with
//! [`RecvBatch::push_lent`]; the batch's packets are then read in the lender's memory, which the
//! batch keeps alive (an `Arc`), and the ids go back to the lender when the batch is cleared
//! (every receive call clears it first) or dropped. Until then the kernel cannot write into
//! those buffers, since only the lender gives buffers to the kernel and it gives only those it
//! got back. A batch holds either copied or lent packets, never both.

use std::fmt;
use std::sync::Arc;

use super::numa;

/// Memory a transport lends to batches: buffers in one allocation, each filled by the kernel
/// and handed to a batch whole.
pub(crate) trait Lender: Send + Sync + fmt::Debug {
    /// The first byte of the buffer memory (the batch's packet offsets count from it).
    fn base(&self) -> *const u8;
    /// Bytes of buffer memory (for checking offsets).
    fn len(&self) -> usize;
    /// Buffers `ids` are no longer read by any batch; `ids` is left empty.
    fn give_back(&self, ids: &mut Vec<u16>);
}

/// Receive memory: `capacity` slots of `slot_size` bytes each. A transport fills slot `i`
/// with one datagram, or with several equal-sized packets coalesced by the kernel (UDP GRO);
/// [`RecvBatch::iter`] yields the packets either way. A lending transport fills the slots'
/// bookkeeping only, the bytes staying in its buffers (see the module doc).
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
    /// (start, length) of every packet, in order: in `buf`, or in the lender's memory.
    packets: Vec<(usize, usize)>,
    /// The transport whose buffers hold the packets, while they are lent.
    lender: Option<Arc<dyn Lender>>,
    /// The ids of the buffers lent.
    loans: Vec<u16>,
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
            lender: None,
            loans: Vec::with_capacity(capacity),
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

    /// Empty the batch, giving lent buffers back.
    pub fn clear(&mut self) {
        self.filled = 0;
        self.packets.clear();
        if let Some(lender) = self.lender.take() {
            lender.give_back(&mut self.loans);
        }
    }

    /// The bytes at `start .. start + len` of the batch's memory or the lender's.
    fn bytes(&self, (start, len): (usize, usize)) -> &[u8] {
        match &self.lender {
            None => &self.buf[start..start + len],
            // SAFETY: `push_lent` checked that the range lies within the lender's memory, which
            // the Arc keeps allocated; the buffer holding it is lent to this batch, so nothing
            // writes into it until the batch gives it back (`clear`, which takes `&mut self`).
            Some(lender) => unsafe { std::slice::from_raw_parts(lender.base().add(start), len) },
        }
    }

    /// Packet `i` of the batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        self.bytes(self.packets[i])
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.packets.iter().map(|&p| self.bytes(p))
    }

    /// Copy a packet into the next slot (for transports that do not receive in place); false
    /// when full. Packets longer than a slot are truncated (and will fail SPEAD parsing).
    pub fn push(&mut self, packet: &[u8]) -> bool {
        self.push_segmented(packet, 0)
    }

    /// Copy a datagram into the next slot, as [`RecvBatch::push`]; a non-zero `segment` says
    /// it holds packets of that size coalesced by the kernel (UDP GRO), which the batch splits.
    /// False when full or holding lent packets.
    pub fn push_segmented(&mut self, datagram: &[u8], segment: usize) -> bool {
        if self.filled == self.capacity() || self.lender.is_some() {
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

    /// Take buffer `id` of `lender` as the next slot: its datagram is the `len` bytes at
    /// `start` of the lender's memory (cut into `segment`-byte packets when non-zero, as
    /// [`RecvBatch::push_segmented`]). The buffer is the batch's until it is cleared. False
    /// (the buffer not taken) when full, when the batch holds copied packets or another
    /// lender's, or when the range lies outside the lender's memory.
    pub(crate) fn push_lent(
        &mut self,
        lender: &Arc<dyn Lender>,
        id: u16,
        start: usize,
        len: usize,
        segment: usize,
    ) -> bool {
        let fits = start
            .checked_add(len)
            .is_some_and(|end| end <= lender.len());
        let same = match &self.lender {
            Some(l) => Arc::ptr_eq(l, lender),
            None => self.filled == 0,
        };
        if self.filled == self.capacity() || !same || !fits {
            return false;
        }
        if self.lender.is_none() {
            self.lender = Some(Arc::clone(lender));
        }
        self.loans.push(id);
        self.slots[self.filled] = (len, segment);
        self.filled += 1;
        self.split_slot(start, len, segment);
        true
    }

    /// Append bytes `start .. start + len` to the packet list, cut into `segment`-byte
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

    /// Bind the slot memory to NUMA node `node` (the receiving NIC's; [`numa`]). A lending
    /// transport's buffers are bound with the transport (`PacketReceiver::bind_memory`).
    pub fn bind_to_node(&self, node: u32) -> Result<(), numa::NumaError> {
        numa::bind_area(&self.buf, node)
    }

    /// Declare the first `n` slots filled and split them into packets.
    pub(crate) fn set_filled(&mut self, n: usize) {
        self.clear();
        self.filled = n.min(self.capacity());
        for i in 0..self.filled {
            let (len, seg) = self.slots[i];
            self.split_slot(i * self.slot_size, len.min(self.slot_size), seg);
        }
    }
}

impl Drop for RecvBatch {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

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

    /// A lender over a plain vector that records what comes back.
    #[derive(Debug)]
    struct Pool {
        mem: Vec<u8>,
        back: Mutex<Vec<u16>>,
    }

    impl Lender for Pool {
        fn base(&self) -> *const u8 {
            self.mem.as_ptr()
        }
        fn len(&self) -> usize {
            self.mem.len()
        }
        fn give_back(&self, ids: &mut Vec<u16>) {
            self.back.lock().unwrap().append(ids);
        }
    }

    /// Lent packets read as the lender's bytes (split by segment as copied ones are); every
    /// id comes back exactly once, on clear or drop; a lent batch takes no copies, ranges
    /// outside the lender's memory or past the capacity are refused.
    #[test]
    fn lent_buffers_are_read_in_place_and_come_back_once() {
        let pool = Arc::new(Pool {
            mem: (0..=255).collect(),
            back: Mutex::new(Vec::new()),
        });
        let lender: Arc<dyn Lender> = pool.clone();
        let mut b = RecvBatch::new(2, 0);
        assert!(b.push_lent(&lender, 7, 10, 5, 0));
        assert!(b.push_lent(&lender, 3, 100, 25, 10));
        assert!(!b.push_lent(&lender, 4, 0, 1, 0), "full");
        let got: Vec<Vec<u8>> = b.iter().map(<[u8]>::to_vec).collect();
        let want: Vec<Vec<u8>> = vec![
            (10..15).collect(),
            (100..110).collect(),
            (110..120).collect(),
            (120..125).collect(),
        ];
        assert_eq!(got, want);
        assert!(!b.push(&[1]), "no copies into a lent batch");
        assert!(
            pool.back.lock().unwrap().is_empty(),
            "nothing back while lent"
        );
        b.clear();
        assert_eq!(*pool.back.lock().unwrap(), [7, 3]);
        assert!(b.is_empty());
        b.clear();
        assert_eq!(pool.back.lock().unwrap().len(), 2, "given back once");
        assert!(
            !b.push_lent(&lender, 1, 250, 7, 0),
            "past the lender's memory"
        );
        assert!(
            !b.push_lent(&lender, 1, usize::MAX, 2, 0),
            "overflowing range"
        );
        assert!(b.push_lent(&lender, 9, 0, 1, 0));
        drop(b);
        assert_eq!(*pool.back.lock().unwrap(), [7, 3, 9], "given back on drop");
        let mut copied = RecvBatch::new(2, 8);
        assert!(copied.push(&[1, 2]));
        assert!(
            !copied.push_lent(&lender, 1, 0, 1, 0),
            "no loans into a copied batch"
        );
    }
}
