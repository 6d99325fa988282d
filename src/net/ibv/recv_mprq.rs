//! Receiving through a striding (multi-packet) receive queue, on devices that have one (mlx5:
//! ConnectX-4 and later; chosen by `recv`, `--recv-ibv-mprq`). Instead of one posted request
//! per frame, each request is a buffer of many strides (1 MiB of 64-byte strides, `mprq_verbs`)
//! that the NIC packs frames into, so the receive loop posts one request per buffer rather
//! than per frame, and a frame wastes less than a stride of memory rather than the rest of a
//! 9 KiB slot (what spead2's `udp_ibv` reader gains from it).
//!
//! Frames are lent to the caller's batch where the NIC wrote them, as with the slot queue
//! (`recv_slots`), under their buffer's number: a buffer lends many frames, and goes back to
//! the NIC only once the NIC has finished it and every frame lent from it is back
//! (`mprq_ledger`, which also says where each completion's frame lies). The buffers are the
//! slots of a [`RecvSlots`] (one buffer a slot), whose lender queues what batches give back
//! until the next receive call releases it in the ledger.

use std::io;
use std::sync::Arc;

use super::mprq_ledger::{Ledger, StrideCompletion};
use super::mprq_verbs::{CqEx, IndTable, StrideWc, StridingPlan, StridingWq};
use super::recv::{poll_within, POLL_BATCH};
use super::recv_slots::{lend_frame, RecvSlots};
use super::verbs::{Channel, Context, Mr, Pd, Qp};
use super::{CompMode, IbvError};
use crate::net::frame::FrameDrops;
use crate::net::recv_batch::Lender;
use crate::net::RecvBatch;

/// Completions that did not become frames for a reason other than the frame itself.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StrideTally {
    /// Completions with an error status (skipped, their strides not counted, as spead2 does).
    pub failed: u64,
    /// Completions and give-backs that broke the ledger's protocol (`mprq_ledger::LedgerFault`).
    pub faults: u64,
}

/// A striding work queue behind an RSS queue pair, with its buffers' registration and ledger.
/// Fields drop in order: queue pair, indirection table, work queue, completion queue,
/// registration.
pub struct StridingQueue {
    qp: Qp,
    _table: IndTable,
    wq: StridingWq,
    cq: CqEx,
    mr: Mr<Arc<RecvSlots>>,
    plan: StridingPlan,
    ledger: Ledger,
    wcs: Vec<StrideWc>,
    /// Buffers batches gave back (one entry per frame), buffers to post, and their addresses
    /// (kept, so that receiving does not allocate).
    returned: Vec<usize>,
    to_post: Vec<usize>,
    addrs: Vec<u64>,
    tally: StrideTally,
}

impl StridingQueue {
    /// A striding queue of `plan`'s sizes, completing on a queue on `on` (a channel and
    /// vector) or polled, its buffers in memory from `memory` (count, bytes each); every
    /// buffer posted. The receive memory comes back with it.
    pub fn open(
        ctx: &Context,
        pd: &Pd,
        on: Option<(&Channel, u32)>,
        plan: &StridingPlan,
        memory: &impl Fn(usize, usize) -> Result<Arc<RecvSlots>, IbvError>,
    ) -> Result<(StridingQueue, Arc<RecvSlots>), IbvError> {
        let ring = memory(plan.buffers, plan.buffer_len())?;
        let cq = CqEx::new(ctx, plan.cqe(), on)?;
        let wq = StridingWq::new(ctx, pd, &cq, plan)?;
        let table = IndTable::new(ctx, &wq)?;
        let qp = table.rss_qp(ctx, pd)?;
        let mr = Mr::new(pd, Arc::clone(&ring))?;
        // The ring has `plan.buffers` buffers (`RecvSlots::bytes_for`); the ledger counts those
        // it has, so that no buffer it posts lies outside.
        let buffers = ring.count();
        let mut q = StridingQueue {
            qp,
            _table: table,
            wq,
            cq,
            mr,
            plan: *plan,
            ledger: Ledger::new(buffers, plan.strides(), plan.stride_len()),
            wcs: vec![StrideWc::default(); POLL_BATCH],
            returned: Vec::with_capacity(POLL_BATCH),
            // The ledger starts with every buffer at the NIC, in this order.
            to_post: (0..buffers).collect(),
            addrs: Vec::with_capacity(buffers),
            tally: StrideTally::default(),
        };
        q.post(&ring);
        Ok((q, ring))
    }

    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The queue's shape, for the start-up log.
    pub fn describe(&self) -> String {
        let p = &self.plan;
        format!(
            "striding: {} buffers of {} strides of {} bytes",
            self.ledger.buffers(),
            p.strides(),
            p.stride_len()
        )
    }

    /// Post the buffers on `to_post`, in order.
    fn post(&mut self, ring: &RecvSlots) {
        if self.to_post.is_empty() {
            return;
        }
        self.addrs.clear();
        self.addrs
            .extend(self.to_post.iter().map(|&b| ring.slot_addr(b)));
        // SAFETY: each buffer is a slot of `ring`, registered under this lkey and kept
        // allocated by the registration's Arc; the ledger put it on `to_post` only when the NIC
        // had finished it and no frame of it was lent (or at start), so nothing reads it and
        // it is not posted already; at most `plan.buffers` are ever posted.
        unsafe {
            self.wq
                .post(&self.addrs, self.plan.buffer_len() as u32, self.mr.lkey())
        };
        self.to_post.clear();
    }

    /// Fill `batch` (cleared) with the frames of one poll, posting the buffers that are free.
    pub fn receive(
        &mut self,
        ring: &RecvSlots,
        lender: &Arc<dyn Lender>,
        mode: CompMode,
        batch: &mut RecvBatch,
        drops: &mut FrameDrops,
    ) -> io::Result<()> {
        ring.take_returned(&mut self.returned);
        for b in self.returned.drain(..) {
            if let Err(f) = self.ledger.release(b, &mut self.to_post) {
                fault(&mut self.tally, f);
            }
        }
        let cap = batch.capacity().min(self.wcs.len());
        let n = poll_within(mode, self.cq.cq(), || self.cq.poll(&mut self.wcs[..cap]));
        // Buffers freed above go back even when polling failed.
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                self.post(ring);
                return Err(e);
            }
        };
        lend_strides(
            ring,
            lender,
            &mut self.ledger,
            &self.wcs[..n],
            batch,
            drops,
            &mut self.to_post,
            &mut self.tally,
        );
        self.post(ring);
        Ok(())
    }
}

fn fault(tally: &mut StrideTally, f: super::mprq_ledger::LedgerFault) {
    if tally.faults == 0 {
        tracing::warn!(fault = %f, "ibverbs striding queue: completion out of step (logged once)");
    }
    tally.faults += 1;
}

/// Lend the frames of one poll's completions `wcs` from `ring`'s buffers to `batch` (`lender`
/// is `ring` as the batch holds it): `ledger` says where each frame lies; each that
/// `net::frame::parse` accepts and the batch takes is lent under its buffer's number, a
/// refused one counted in `drops` by cause. Buffers that became free go on `to_post`; failed
/// completions and ledger faults are counted in `tally` (each kind logged once).
#[allow(clippy::too_many_arguments)]
pub fn lend_strides(
    ring: &RecvSlots,
    lender: &Arc<dyn Lender>,
    ledger: &mut Ledger,
    wcs: &[StrideWc],
    batch: &mut RecvBatch,
    drops: &mut FrameDrops,
    to_post: &mut Vec<usize>,
    tally: &mut StrideTally,
) {
    for wc in wcs {
        if !wc.ok() {
            if tally.failed == 0 {
                tracing::warn!(status = wc.status, "ibverbs receive completion failed");
            }
            tally.failed += 1;
            continue;
        }
        let c = StrideCompletion::from_byte_cnt(wc.byte_cnt);
        let placed = ledger.complete(
            c,
            |f| {
                if f.buffer >= ring.count() {
                    return false;
                }
                // SAFETY: the NIC completed these strides and writes only strides after them
                // until the buffer is posted again, which the ledger does only after this
                // frame, if lent, is given back.
                let bytes = unsafe { ring.frame(f.buffer, f.offset, f.len) };
                // SAFETY: as above: unwritten until the lender gets the buffer's number back
                // for this frame and the ledger releases it.
                unsafe { lend_frame(bytes, lender, f.buffer, batch, drops) }
            },
            to_post,
        );
        if let Err(f) = placed {
            fault(tally, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::frame::{FrameDrop, FrameHeaders, HEADERS_LEN};
    use std::net::SocketAddrV4;

    /// Buffers of 8 strides of 64 bytes.
    const STRIDES: u32 = 8;
    const STRIDE: usize = 64;
    const BUFFER: usize = STRIDES as usize * STRIDE;

    /// Two buffers with frames written where a NIC packs them, each `(buffer, offset,
    /// payload bytes, good)`: a good frame's payload bytes all equal its payload length; a bad
    /// one carries an IPv6 ethertype.
    fn ring(frames: &[(usize, usize, usize, bool)]) -> Arc<RecvSlots> {
        let mut mem = vec![0u8; RecvSlots::bytes_for(2, BUFFER)];
        let start = mem.as_ptr().align_offset(4096);
        let dst: SocketAddrV4 = "239.1.2.3:7148".parse().unwrap();
        let src: SocketAddrV4 = "10.0.0.1:7148".parse().unwrap();
        for &(b, off, payload, good) in frames {
            let at = start + b * BUFFER + off;
            let s = &mut mem[at..at + HEADERS_LEN + payload];
            FrameHeaders::new([2; 6], src, [1, 0, 0x5e, 1, 2, 3], dst, 4)
                .emit(s, payload, 0)
                .unwrap();
            s[HEADERS_LEN..].fill(payload as u8);
            if !good {
                s[12] = 0x86;
            }
        }
        let r = RecvSlots::new(mem, BUFFER, 2);
        assert_eq!(r.count(), 2);
        r
    }

    /// A completion as the NIC writes it (mlx5 byte count word, written out from the layout:
    /// bytes 0–15, strides 16–29, filler 31).
    fn wc(strides: u32, bytes: usize) -> StrideWc {
        StrideWc {
            byte_cnt: (strides << 16) | bytes as u32,
            status: 0,
        }
    }

    /// Buffer 0 gets a good frame (30 bytes of payload: 2 strides), a refused one (2), a
    /// failed completion, a good one (100 bytes: 3 strides) and a filler for its last stride;
    /// buffer 1 a good frame. The good frames are lent where the NIC wrote them, the refused
    /// one counted; buffer 0 goes back only when the batch gives back both its frames, and
    /// buffer 1, still being filled, not even then.
    #[test]
    fn frames_are_lent_in_their_buffers_which_go_back_when_all_are_returned() {
        let frames = [
            (0, 0, 30, true),
            (0, 128, 40, false),
            (0, 256, 100, true),
            (1, 0, 50, true),
        ];
        let ring = ring(&frames);
        let lender: Arc<dyn Lender> = ring.clone();
        let mut ledger = Ledger::new(2, STRIDES, STRIDE);
        let mut batch = RecvBatch::new(8, 0);
        let (mut drops, mut to_post, mut tally) = Default::default();
        let wcs = [
            wc(2, HEADERS_LEN + 30),
            wc(2, HEADERS_LEN + 40),
            StrideWc {
                byte_cnt: 0xdead_beef,
                status: 5,
            },
            wc(3, HEADERS_LEN + 100),
            StrideWc {
                byte_cnt: 0x8001_0000,
                status: 0,
            },
            wc(2, HEADERS_LEN + 50),
        ];
        lend_strides(
            &ring,
            &lender,
            &mut ledger,
            &wcs,
            &mut batch,
            &mut drops,
            &mut to_post,
            &mut tally,
        );
        let drops: FrameDrops = drops;
        assert_eq!(drops.get(FrameDrop::NotIpv4), 1);
        assert_eq!(
            tally,
            StrideTally {
                failed: 1,
                faults: 0
            }
        );
        let good = [(0usize, 0usize, 30usize), (0, 256, 100), (1, 0, 50)];
        assert_eq!(batch.len(), good.len());
        for (p, &(b, off, n)) in batch.iter().zip(&good) {
            assert_eq!(p, &vec![n as u8; n][..]);
            assert_eq!(
                p.as_ptr() as u64,
                ring.slot_addr(b) + (off + HEADERS_LEN) as u64,
                "read where the NIC wrote it"
            );
        }
        assert!(to_post.is_empty(), "buffer 0 is lent, buffer 1 at the NIC");
        batch.clear();
        let mut back = Vec::new();
        ring.take_returned(&mut back);
        back.sort_unstable();
        assert_eq!(back, [0, 0, 1], "one entry per frame");
        for b in back {
            ledger.release(b, &mut to_post).unwrap();
        }
        assert_eq!(to_post, [0]);
    }

    /// Frames the batch cannot take are not lent, so a finished buffer holding only those goes
    /// straight back, and one holding a lent frame waits for it; a completion that consumed no
    /// stride is a fault, counted, that moves nothing.
    #[test]
    fn a_buffer_whose_frames_were_not_taken_goes_back_at_once() {
        let ring = ring(&[(0, 0, 30, true), (0, 128, 30, true), (1, 0, 30, true)]);
        let lender: Arc<dyn Lender> = ring.clone();
        let mut ledger = Ledger::new(2, STRIDES, STRIDE);
        let mut batch = RecvBatch::new(1, 0);
        let (mut drops, mut to_post, mut tally) = Default::default();
        let filler = |strides: u32| StrideWc {
            byte_cnt: 0x8000_0000 | (strides << 16),
            status: 0,
        };
        let wcs = [
            wc(2, HEADERS_LEN + 30),
            wc(2, HEADERS_LEN + 30),
            filler(4),
            wc(0, 10),
            wc(2, HEADERS_LEN + 30),
            filler(6),
        ];
        lend_strides(
            &ring,
            &lender,
            &mut ledger,
            &wcs,
            &mut batch,
            &mut drops,
            &mut to_post,
            &mut tally,
        );
        let drops: FrameDrops = drops;
        assert_eq!(drops.total(), 0);
        assert_eq!(batch.len(), 1, "the batch holds one");
        assert_eq!(tally.faults, 1, "the completion of no strides");
        assert_eq!(
            to_post,
            [1],
            "buffer 1 lent nothing; buffer 0 lends one frame"
        );
        batch.clear();
        let mut back = Vec::new();
        ring.take_returned(&mut back);
        for b in back {
            ledger.release(b, &mut to_post).unwrap();
        }
        assert_eq!(to_post, [1, 0]);
    }
}
