//! The receive batch every transport fills ([`RecvBatch`]): caller-owned slots the datagrams
//! are copied or received into, or, for a transport whose NIC or kernel writes into memory of
//! its own (io_uring's provided buffers, DPDK's mbufs, an ibverbs receive ring), that memory
//! *lent* to the batch until it is cleared, so that the payload is not copied once more on its
//! way to the chunk (issue 15: one copy per byte, into chunk memory).
//!
//! Lending ([`Lender`]): a transport that lends puts each filled buffer in the batch with
//! [`RecvBatch::push_lent`]: where its packet bytes lie (a pointer and a length) and an opaque
//! handle for the buffer (a provided-buffer id, an mbuf, a ring slot). The batch's packets are
//! then read where the transport's memory holds them; the batch keeps the lender alive (an
//! `Arc`), and the handles go back to it when the batch is cleared (every receive call clears
//! it first) or dropped. Until then the producer cannot write into those buffers, since only the
//! lender gives buffers to the kernel or NIC and it gives only those it got back. A batch holds
//! either copied or lent packets, never both, and lent ones of one lender only.

use std::fmt;
use std::sync::Arc;

use super::numa;

/// Memory a transport lends to batches: buffers the kernel or NIC filled, each handed to a
/// batch whole (with every packet in it) under a handle of the transport's choosing.
pub(crate) trait Lender: Send + Sync + fmt::Debug {
    /// The buffers `handles` (as given to [`RecvBatch::push_lent`]) are no longer read by any
    /// batch; `handles` is left empty.
    fn give_back(&self, handles: &mut Vec<usize>);
}

/// Receive memory: `capacity` slots of `slot_size` bytes each. A transport fills slot `i`
/// with one datagram, or with several equal-sized packets coalesced by the kernel (UDP GRO);
/// [`RecvBatch::iter`] yields the packets either way. A lending transport uses the slots'
/// count only, the bytes staying in its buffers (see the module doc).
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
    /// (start in `buf`, length) of every copied packet, in order.
    packets: Vec<(usize, usize)>,
    /// (first byte, length) of every lent packet, in order, in the lender's memory.
    lent: Vec<(*const u8, usize)>,
    /// The transport whose buffers hold the packets, while they are lent.
    lender: Option<Arc<dyn Lender>>,
    /// The handles of the buffers lent.
    loans: Vec<usize>,
}

// SAFETY: the raw pointers in `lent` point into memory that the lender (held by the batch)
// keeps allocated and that nothing writes while it is lent (the `push_lent` contract); reading
// it from another thread is as safe as from this one, and `Lender` is `Send + Sync`.
unsafe impl Send for RecvBatch {}
// SAFETY: as above; `&RecvBatch` only reads the lent bytes.
unsafe impl Sync for RecvBatch {}

impl RecvBatch {
    pub fn new(capacity: usize, slot_size: usize) -> RecvBatch {
        let capacity = capacity.max(1);
        RecvBatch {
            buf: vec![0u8; capacity * slot_size],
            slot_size,
            slots: vec![(0, 0); capacity],
            filled: 0,
            packets: Vec::with_capacity(capacity),
            lent: Vec::new(),
            lender: None,
            loans: Vec::new(),
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
        self.packets.len() + self.lent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty() && self.lent.is_empty()
    }

    /// Empty the batch, giving lent buffers back.
    pub fn clear(&mut self) {
        self.filled = 0;
        self.packets.clear();
        self.lent.clear();
        if let Some(lender) = self.lender.take() {
            lender.give_back(&mut self.loans);
        }
    }

    /// Packet `i` of the batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        if self.lender.is_some() {
            let (data, len) = self.lent[i];
            // SAFETY: `push_lent`'s caller promised that `len` bytes at `data` stay allocated
            // and unwritten until the handle is given back, which happens only in `clear`
            // (taking `&mut self`, so not while this borrow lives); the Arc keeps the lender.
            unsafe { std::slice::from_raw_parts(data, len) }
        } else {
            let (start, len) = self.packets[i];
            &self.buf[start..start + len]
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.packet(i))
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
        split(start, n, segment, |p| self.packets.push(p));
        true
    }

    /// Take a buffer of `lender` (`handle`, the lender's name for it) as the next slot: its
    /// datagram is the `len` bytes at `data` (cut into `segment`-byte packets when non-zero, as
    /// [`RecvBatch::push_segmented`]). The buffer is the batch's until it is cleared, when
    /// `handle` goes back to the lender. False (the buffer not taken: it is still the caller's)
    /// when full, or when the batch holds copied packets or another lender's.
    ///
    /// # Safety
    /// The `len` bytes at `data` must be valid for reads, and stay allocated and unwritten
    /// until `lender` gets `handle` back through [`Lender::give_back`].
    pub(crate) unsafe fn push_lent(
        &mut self,
        lender: &Arc<dyn Lender>,
        handle: usize,
        data: *const u8,
        len: usize,
        segment: usize,
    ) -> bool {
        let same = match &self.lender {
            Some(l) => Arc::ptr_eq(l, lender),
            None => self.filled == 0,
        };
        if self.filled == self.capacity() || !same {
            return false;
        }
        if self.lender.is_none() {
            self.lender = Some(Arc::clone(lender));
        }
        self.loans.push(handle);
        self.filled += 1;
        // Offsets from `data` stay within the `len` bytes the caller vouched for.
        split(0, len, segment, |(off, l)| {
            self.lent.push((data.wrapping_add(off), l))
        });
        true
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
            let len = len.min(self.slot_size);
            split(i * self.slot_size, len, seg, |p| self.packets.push(p));
        }
    }
}

/// Cut the `len` bytes at `start` into `segment`-byte packets when they hold coalesced ones
/// (`segment` 0: one packet), handing each (start, length) to `push` in order.
fn split(start: usize, len: usize, segment: usize, mut push: impl FnMut((usize, usize))) {
    if segment == 0 || segment >= len {
        push((start, len));
    } else {
        let mut off = 0;
        while off < len {
            let l = segment.min(len - off);
            push((start + off, l));
            off += l;
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
        back: Mutex<Vec<usize>>,
    }

    impl Lender for Pool {
        fn give_back(&self, handles: &mut Vec<usize>) {
            self.back.lock().unwrap().append(handles);
        }
    }

    /// Lend `len` bytes at `start` of the pool as buffer `handle`.
    fn lend(b: &mut RecvBatch, pool: &Arc<Pool>, handle: usize, start: usize, len: usize) -> bool {
        lend_segmented(b, pool, handle, start, len, 0)
    }

    fn lend_segmented(
        b: &mut RecvBatch,
        pool: &Arc<Pool>,
        handle: usize,
        start: usize,
        len: usize,
        segment: usize,
    ) -> bool {
        let lender: Arc<dyn Lender> = pool.clone();
        let bytes = &pool.mem[start..start + len];
        // SAFETY: the pool's memory lives in the Arc the batch keeps, and nothing writes it.
        unsafe { b.push_lent(&lender, handle, bytes.as_ptr(), len, segment) }
    }

    /// Lent packets read as the lender's bytes, in place (split by segment as copied ones
    /// are); every handle comes back exactly once, on clear or drop; a lent batch takes no
    /// copies and a copied one no loans; the capacity counts lent buffers.
    #[test]
    fn lent_buffers_are_read_in_place_and_come_back_once() {
        let pool = Arc::new(Pool {
            mem: (0..=255).collect(),
            back: Mutex::new(Vec::new()),
        });
        let mut b = RecvBatch::new(2, 0);
        assert!(lend(&mut b, &pool, 7, 10, 5));
        assert!(lend_segmented(&mut b, &pool, 3, 100, 25, 10));
        assert!(!lend(&mut b, &pool, 4, 0, 1), "full");
        let got: Vec<Vec<u8>> = b.iter().map(<[u8]>::to_vec).collect();
        let want: Vec<Vec<u8>> = vec![
            (10..15).collect(),
            (100..110).collect(),
            (110..120).collect(),
            (120..125).collect(),
        ];
        assert_eq!(got, want);
        let mem = pool.mem.as_ptr_range();
        assert!(
            b.iter().all(|p| mem.contains(&p.as_ptr())),
            "read where the lender holds them"
        );
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
        assert!(lend(&mut b, &pool, 9, 0, 1));
        drop(b);
        assert_eq!(*pool.back.lock().unwrap(), [7, 3, 9], "given back on drop");
        let mut copied = RecvBatch::new(2, 8);
        assert!(copied.push(&[1, 2]));
        assert!(
            !lend(&mut copied, &pool, 1, 0, 1),
            "no loans into a copied batch"
        );
        let other = Arc::new(Pool {
            mem: vec![0; 4],
            back: Mutex::new(Vec::new()),
        });
        let mut b = RecvBatch::new(4, 0);
        assert!(lend(&mut b, &pool, 1, 0, 1));
        assert!(!lend(&mut b, &other, 2, 0, 1), "one lender per batch");
        drop(b);
        assert!(other.back.lock().unwrap().is_empty());
        assert_eq!(*pool.back.lock().unwrap(), [7, 3, 9, 1]);
    }
}
