//! The ibverbs receive ring's slots and who holds each (issue 15: the payload copied once, into
//! the chunk). A slot is *posted* (the NIC may write a frame into it), *lent* to a receive batch
//! (its frame is read where the NIC wrote it, `net::recv_batch`), or *given back* by the batch
//! and waiting for the receiver's next call to post it again. So the NIC never writes a slot a
//! batch reads, and no slot is lost: each completion's slot is lent or else listed to post again
//! in the same call, and each slot given back is posted in the next call.
//!
//! This is the part of the receiver that needs no device: [`RecvSlots`] owns the memory (which
//! the receiver registers, and which the batches holding its slots keep alive, so a batch may
//! outlive the receiver), and [`lend_completed`] turns one poll's completions into loans and
//! slots to post, so that the bookkeeping is tested as data. The striding queue (`recv_mprq`)
//! keeps its buffers in a [`RecvSlots`] too, one buffer a slot, lending many frames from each
//! (`mprq_ledger` says when a buffer goes back).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::verbs::Region;
use crate::net::frame::{self, FrameDrops, UdpChecksum};
use crate::net::recv_batch::Lender;
use crate::net::RecvBatch;

/// One receive completion: the slot its request named (`wr_id`), and the frame's length, or
/// `None` when the request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub slot: u64,
    pub len: Option<usize>,
}

/// Where the first slot starts: on a page, so that every slot (a multiple of 64 bytes long) and
/// every stride of a striding queue's buffers starts on a cache line, as the NIC writes them.
const SLOT_ALIGN: usize = 4096;

/// The ring's memory, `count` slots of `slot_len` bytes, and the slots batches gave back. The
/// handles lent are slot indices.
#[derive(Debug)]
pub struct RecvSlots {
    /// The allocation (a boxed slice, freed in Drop); only the NIC writes into it.
    mem: NonNull<u8>,
    len: usize,
    /// Bytes before the first slot (to [`SLOT_ALIGN`]).
    start: usize,
    count: usize,
    slot_len: usize,
    returned: Mutex<Vec<usize>>,
}

// SAFETY: the memory is owned by this value and freed once, in Drop; which slot may be written
// (by the NIC) or read (by a batch) is the protocol of the module doc; `returned` is locked.
unsafe impl Send for RecvSlots {}
// SAFETY: as above; `&RecvSlots` gives the address, reads of completed slots, and the lock.
unsafe impl Sync for RecvSlots {}

impl RecvSlots {
    /// Bytes to allocate for `count` slots of `slot_len` bytes (room to align the first).
    pub fn bytes_for(count: usize, slot_len: usize) -> usize {
        count * slot_len + SLOT_ALIGN
    }

    /// `count` slots of `slot_len` bytes (> 0) over `mem` (allocated and placed by the
    /// caller, `placement::ring_memory`, [`RecvSlots::bytes_for`] bytes), the first at the
    /// first page boundary in it; fewer if `mem` is shorter.
    pub fn new(mem: Vec<u8>, slot_len: usize, count: usize) -> Arc<RecvSlots> {
        let slot_len = slot_len.max(1);
        let start = mem.as_ptr().align_offset(SLOT_ALIGN).min(mem.len());
        let count = count.min((mem.len() - start) / slot_len);
        // A vec![0; n] has no spare capacity, so this keeps the allocation (and its binding).
        let mem = Box::into_raw(mem.into_boxed_slice());
        Arc::new(RecvSlots {
            // SAFETY: Box::into_raw never gives a null pointer.
            mem: unsafe { NonNull::new_unchecked(mem.cast::<u8>()) },
            len: mem.len(),
            start,
            count,
            slot_len,
            returned: Mutex::new(Vec::with_capacity(count)),
        })
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// The address of slot `slot`'s first byte (what a receive request names).
    pub fn slot_addr(&self, slot: usize) -> u64 {
        self.mem.as_ptr() as u64 + (self.start + slot * self.slot_len) as u64
    }

    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Bytes of the whole ring.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The `len` bytes at `offset` in slot `slot` (< count), cut to the slot: a frame the NIC
    /// wrote there.
    ///
    /// # Safety
    /// Those bytes' completion must have been polled, and the slot not posted again: nothing
    /// writes them while the slice lives.
    pub(super) unsafe fn frame(&self, slot: usize, offset: usize, len: usize) -> &[u8] {
        let offset = offset.min(self.slot_len);
        std::slice::from_raw_parts(
            self.mem
                .as_ptr()
                .add(self.start + slot * self.slot_len + offset),
            len.min(self.slot_len - offset),
        )
    }

    /// Move the slots batches gave back into `to_post`.
    pub fn take_returned(&self, to_post: &mut Vec<usize>) {
        to_post.append(&mut self.returned.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl Lender for RecvSlots {
    fn give_back(&self, handles: &mut Vec<usize>) {
        self.returned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append(handles);
    }
}

// SAFETY: the allocation stays where it is and allocated while any Arc to it lives, and the
// registration holds one.
unsafe impl Region for Arc<RecvSlots> {
    fn region(&self) -> (*mut u8, usize) {
        (self.mem.as_ptr(), self.len)
    }
}

impl Drop for RecvSlots {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw in `new` with this length; the last owner is gone (the
        // registration and every batch holding a slot each held an Arc).
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.mem.as_ptr(),
                self.len,
            )))
        }
    }
}

/// Lend the frames of the `completed` slots to `batch` (`lender` is `slots` as the batch holds
/// it): each frame that `net::frame::parse` accepts is lent in its slot; the slots of failed
/// completions, of refused frames (counted in `drops` by cause, logged once per cause) and of
/// frames the batch cannot take go on `to_post`, to go back to the NIC at once. A slot number
/// outside the ring (no request of ours) is skipped. Returns the failed completions.
pub fn lend_completed(
    slots: &RecvSlots,
    lender: &Arc<dyn Lender>,
    completed: &[Completion],
    batch: &mut RecvBatch,
    drops: &mut FrameDrops,
    to_post: &mut Vec<usize>,
) -> usize {
    let mut failed = 0;
    for c in completed {
        let Some(slot) = usize::try_from(c.slot).ok().filter(|&s| s < slots.count()) else {
            continue;
        };
        let Some(len) = c.len else {
            failed += 1;
            to_post.push(slot);
            continue;
        };
        // SAFETY: the slot completed and is not posted again before the batch gives it back
        // (lent below) or the receiver posts it from `to_post` after this loop.
        let frame = unsafe { slots.frame(slot, 0, len) };
        // SAFETY: the frame lies in slot `slot`, which is posted again only after the batch
        // gives it back (`take_returned`) or, not lent, from `to_post`.
        let lent = unsafe { lend_frame(frame, lender, slot, batch, drops) };
        if !lent {
            to_post.push(slot);
        }
    }
    failed
}

/// Lend the payload of `frame` to `batch` under `handle` if `net::frame::parse` accepts it and
/// the batch takes it; a refused frame is counted in `drops` by cause (logged once per cause).
/// Whether it was lent.
///
/// # Safety
/// `frame` lies in `lender`'s memory, and nothing writes it until the lender gets `handle`
/// back (`RecvBatch::push_lent`).
pub(super) unsafe fn lend_frame(
    frame: &[u8],
    lender: &Arc<dyn Lender>,
    handle: usize,
    batch: &mut RecvBatch,
    drops: &mut FrameDrops,
) -> bool {
    match frame::parse(frame, UdpChecksum::Skip) {
        Ok(d) => batch.push_lent(lender, handle, d.payload.as_ptr(), d.payload.len(), 0),
        Err(cause) => {
            if drops.get(cause) == 0 {
                tracing::warn!(%cause, "ibverbs: frame dropped (logged once per cause)");
            }
            drops.add(cause);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::frame::{FrameDrop, FrameHeaders, HEADERS_LEN};
    use std::net::SocketAddrV4;

    const SLOT: usize = 256;

    /// A ring of `n` slots holding, in slot `i`, a frame with a payload of `10 + i` bytes of
    /// value `i`, or garbage where `bad` says.
    fn ring(n: usize, bad: &[usize]) -> (Arc<RecvSlots>, Vec<usize>) {
        let mut mem = vec![0u8; RecvSlots::bytes_for(n, SLOT)];
        let start = mem.as_ptr().align_offset(4096);
        let dst: SocketAddrV4 = "239.1.2.3:7148".parse().unwrap();
        let src: SocketAddrV4 = "10.0.0.1:7148".parse().unwrap();
        let mut lens = Vec::new();
        for (i, s) in mem[start..].chunks_mut(SLOT).take(n).enumerate() {
            let payload = 10 + i;
            FrameHeaders::new([2; 6], src, [1, 0, 0x5e, 1, 2, 3], dst, 4)
                .emit(s, payload, 0)
                .unwrap();
            s[HEADERS_LEN..HEADERS_LEN + payload].fill(i as u8);
            if bad.contains(&i) {
                s[12] = 0x86; // an IPv6 ethertype
            }
            lens.push(HEADERS_LEN + payload);
        }
        let slots = RecvSlots::new(mem, SLOT, n);
        assert_eq!(slots.count(), n);
        let first = slots.slot_addr(0);
        assert_eq!(first % 4096, 0, "the first slot on a page");
        assert_eq!(first - slots.region().0 as u64, start as u64);
        (slots, lens)
    }

    fn done(slot: u64, len: usize) -> Completion {
        Completion {
            slot,
            len: Some(len),
        }
    }

    /// One poll's completions: good frames are lent (read in the ring, their slots not posted),
    /// failed completions and refused frames are posted at once, slots outside the ring are
    /// skipped; the lent slots come back, each once, when the batch is cleared. Every slot of
    /// the ring ends up posted exactly once, now or after the batch.
    #[test]
    fn completed_slots_are_lent_or_posted_never_both_never_lost() {
        let (slots, lens) = ring(6, &[2]);
        let lender: Arc<dyn Lender> = slots.clone();
        let mut batch = RecvBatch::new(8, 0);
        let mut drops = FrameDrops::default();
        let mut to_post = Vec::new();
        let completed = [
            done(0, lens[0]),
            Completion { slot: 1, len: None },
            done(2, lens[2]),
            done(99, 60),
            done(3, lens[3]),
            done(5, lens[5]),
        ];
        let failed = lend_completed(
            &slots,
            &lender,
            &completed,
            &mut batch,
            &mut drops,
            &mut to_post,
        );
        assert_eq!(failed, 1);
        assert_eq!(to_post, [1, 2], "the failed request and the refused frame");
        assert_eq!(drops.get(FrameDrop::NotIpv4), 1);
        assert_eq!(drops.total(), 1);
        let got: Vec<Vec<u8>> = batch.iter().map(<[u8]>::to_vec).collect();
        let want: Vec<Vec<u8>> = [0usize, 3, 5]
            .iter()
            .map(|&i| vec![i as u8; 10 + i])
            .collect();
        assert_eq!(got, want);
        for (p, i) in batch.iter().zip([0usize, 3, 5]) {
            assert_eq!(
                p.as_ptr() as u64,
                slots.slot_addr(i) + HEADERS_LEN as u64,
                "slot {i}'s payload read where the NIC wrote it"
            );
        }
        let mut back = Vec::new();
        slots.take_returned(&mut back);
        assert!(
            back.is_empty(),
            "nothing to post while the batch holds them"
        );
        batch.clear();
        slots.take_returned(&mut back);
        assert_eq!(back, [0, 3, 5]);
        batch.clear();
        slots.take_returned(&mut back);
        assert_eq!(back, [0, 3, 5], "given back once");
        let mut all: Vec<usize> = to_post.iter().chain(&back).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3, 5], "each completed slot posted once");
    }

    /// A frame the batch cannot take (full, or holding another transport's copies) is not
    /// lost: its slot is posted again at once. A batch dropped gives its slots back, and the
    /// memory outlives the ring's other owners while a batch holds it.
    #[test]
    fn a_frame_the_batch_refuses_goes_back_to_the_nic() {
        let (slots, lens) = ring(3, &[]);
        let lender: Arc<dyn Lender> = slots.clone();
        let mut drops = FrameDrops::default();
        let mut to_post = Vec::new();
        let mut small = RecvBatch::new(1, 0);
        let completed = [done(0, lens[0]), done(1, lens[1])];
        lend_completed(
            &slots,
            &lender,
            &completed,
            &mut small,
            &mut drops,
            &mut to_post,
        );
        assert_eq!(small.len(), 1);
        assert_eq!(to_post, [1], "no room: posted again");
        let mut copies = RecvBatch::new(4, 64);
        assert!(copies.push(&[7; 5]));
        to_post.clear();
        lend_completed(
            &slots,
            &lender,
            &[done(2, lens[2])],
            &mut copies,
            &mut drops,
            &mut to_post,
        );
        assert_eq!(copies.len(), 1, "only the copy");
        assert_eq!(to_post, [2], "a copied batch takes no loan: posted again");
        let weak = Arc::downgrade(&slots);
        drop((slots, lender));
        assert_eq!(small.packet(0), &[0u8; 10][..], "still readable");
        assert!(weak.upgrade().is_some());
        drop(small);
        assert!(weak.upgrade().is_none(), "freed with the last batch");
        assert_eq!(drops.total(), 0);
    }
}
