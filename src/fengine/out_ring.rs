//! Which output slot of the F-engine's CUDA backend is filled next, and when a slot may be
//! written again (`cuda_back`; seed 000 §PeerDirect). Slots are filled in ring order, `batch`
//! heaps each; heaps are taken back in submission order. A slot starts a new batch only once
//! every heap of its previous one has been taken and, when its heaps are sent from device
//! memory (`--use-peerdirect`), once every lease on it is back from the send thread, that is,
//! once the NIC is done with them ([`crate::engine::lease`]). Kept apart from the device code
//! so that this rule is tested without a GPU.
//!
//! The wait for a lent slot is bounded ([`OutRing::wait_returned`]): a send path that keeps a
//! slot past the limit has stopped making progress (every wait of the send thread is bounded
//! well below it), and rather than stall, or stop, the engine then drops the heap it was about
//! to compute (the caller counts it) and logs once; while the slot stays out, later heaps are
//! dropped without waiting again, so the input keeps flowing; when the slot comes back the
//! recovery is logged with the number dropped.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::lease::{Lease, Ledger};

pub struct OutRing {
    batch: usize,
    /// The slot being filled, and how many heaps it holds so far (not yet launched).
    fill: usize,
    pending: usize,
    /// Per slot: heaps of its current launch not yet taken.
    untaken: Vec<usize>,
    /// (slot, heap in the slot) of every heap submitted and not yet taken.
    in_flight: VecDeque<(usize, usize)>,
    /// With heaps sent from device memory: the leases out on each slot.
    ledger: Option<Ledger>,
    /// A wait for the filling slot ran out and it has not come back since: heaps dropped
    /// meanwhile.
    overdue: Option<u64>,
}

/// A heap taken back.
pub struct Taken {
    pub slot: usize,
    pub heap: usize,
    /// Whether it was its slot's last untaken heap.
    pub last: bool,
    /// The hold on its slot while it is sent from there (`--use-peerdirect`).
    pub lease: Option<Lease>,
}

impl OutRing {
    /// `slots` slots of `batch` heaps; `lent`: heaps are sent from the slots themselves.
    pub fn new(slots: usize, batch: usize, lent: bool) -> OutRing {
        OutRing {
            batch,
            fill: 0,
            pending: 0,
            untaken: vec![0; slots],
            in_flight: VecDeque::with_capacity(slots * batch),
            ledger: lent.then(|| Ledger::new(slots)),
            overdue: None,
        }
    }

    /// Most heaps lent to the send thread at once: every heap of every slot.
    pub fn lendable(&self) -> usize {
        if self.ledger.is_some() {
            self.untaken.len() * self.batch
        } else {
            0
        }
    }

    pub fn fill(&self) -> usize {
        self.fill
    }

    /// Heaps in the batch being filled.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Whether submitting one more heap fills the batch.
    pub fn fills_batch(&self) -> bool {
        self.pending + 1 == self.batch
    }

    /// The filling slot has room: it has heaps already, or it is free (all taken, all
    /// returned).
    pub fn ready(&self) -> bool {
        self.pending > 0
            || (self.untaken[self.fill] == 0
                && !self.ledger.as_ref().is_some_and(|l| l.lent(self.fill)))
    }

    /// Wait, at most `limit`, for the send thread to return the filling slot (nothing to
    /// wait for without a ledger); not at all while an earlier wait has run out and the slot
    /// is still out. False when it is still lent: the heap about to be computed must be
    /// dropped (the module doc says why).
    pub fn wait_returned(&mut self, limit: Duration) -> bool {
        let Some(l) = &self.ledger else {
            return true;
        };
        let limit = if self.overdue.is_some() {
            Duration::ZERO
        } else {
            limit
        };
        match l.wait_returned(self.fill, limit) {
            Ok(()) => {
                self.recovered();
                true
            }
            Err(e) => {
                match &mut self.overdue {
                    Some(dropped) => *dropped += 1,
                    None => {
                        tracing::warn!(error = %e, "the send path holds every output slot: heaps are dropped (output_stalled_heaps) until it gives one back");
                        self.overdue = Some(1);
                    }
                }
                false
            }
        }
    }

    /// Log the end of an overdue wait.
    fn recovered(&mut self) {
        if let Some(dropped) = self.overdue.take() {
            tracing::info!(
                slot = self.fill,
                dropped,
                "the send path gave the output slot back: heaps are computed again"
            );
        }
    }

    /// Record a heap submitted into the filling slot; true when the batch is now full.
    pub fn submit(&mut self) -> bool {
        self.recovered();
        self.untaken[self.fill] += 1;
        self.in_flight.push_back((self.fill, self.pending));
        self.pending += 1;
        self.pending == self.batch
    }

    /// The filling slot's batch was launched: fill the next one.
    pub fn launched(&mut self) {
        self.fill = (self.fill + 1) % self.untaken.len();
        self.pending = 0;
    }

    /// (slot, heap) of the oldest heap not yet taken.
    pub fn oldest(&self) -> Option<(usize, usize)> {
        self.in_flight.front().copied()
    }

    /// Take the oldest heap (after [`OutRing::oldest`] said there is one), with a lease on its
    /// slot where heaps are sent from there.
    pub fn take(&mut self) -> Option<Taken> {
        let (slot, heap) = self.in_flight.pop_front()?;
        self.untaken[slot] -= 1;
        Some(Taken {
            slot,
            heap,
            last: self.untaken[slot] == 0,
            lease: self.ledger.as_ref().map(|l| l.lend(slot)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// The engine submits a heap if the ring is ready, launching a full batch.
        Submit,
        /// The engine takes the oldest launched heap and hands it to the send thread.
        Take,
        /// The fake NIC completes the send of the `k`-th (mod count) heap the send thread holds.
        Complete(usize),
        /// A heap is taken but not sent (invalid input, capture stopped): its lease is dropped.
        Skip,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Submit),
            2 => Just(Step::Take),
            2 => (0..64usize).prop_map(Step::Complete),
            1 => Just(Step::Skip),
        ]
    }

    proptest! {
        /// Driven by a fake completion source in any order, the ring never lets a slot be
        /// written while a heap of its previous batch is untaken or unsent, and never holds one
        /// back once all are back: checked against the test's own record of what it holds
        /// (which heap is in which slot, and which sends are outstanding), not the ledger's.
        #[test]
        fn a_slot_is_rewritten_only_after_every_send_from_it_completed(
            slots in 1..5usize,
            batch in 1..4usize,
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            let mut ring = OutRing::new(slots, batch, true);
            // Model: heaps written into each slot and not yet taken; launched heaps in order.
            let mut untaken = vec![0usize; slots];
            let mut launched: VecDeque<usize> = VecDeque::new();
            let mut filling: Vec<usize> = Vec::new();
            let mut fill = 0;
            // The send thread's outstanding heaps: (slot, lease).
            let mut sending: Vec<(usize, Lease)> = Vec::new();
            for s in steps {
                match s {
                    Step::Submit => {
                        let busy = untaken[fill] > 0 || sending.iter().any(|(slot, _)| *slot == fill);
                        let free = filling.is_empty() && !busy;
                        prop_assert_eq!(ring.ready(), !filling.is_empty() || free);
                        if ring.ready() {
                            if filling.is_empty() {
                                // About to overwrite slot `fill`: nothing of it may be out.
                                prop_assert!(!busy, "slot {} rewritten early", fill);
                            }
                            prop_assert_eq!(ring.fill(), fill);
                            untaken[fill] += 1;
                            filling.push(fill);
                            if ring.submit() {
                                ring.launched();
                                launched.extend(filling.drain(..));
                                fill = (fill + 1) % slots;
                            }
                        }
                    }
                    Step::Take | Step::Skip => {
                        let Some(slot) = launched.pop_front() else { continue };
                        prop_assert_eq!(ring.oldest().map(|o| o.0), Some(slot));
                        let t = ring.take().unwrap();
                        prop_assert_eq!(t.slot, slot);
                        untaken[slot] -= 1;
                        prop_assert_eq!(t.last, untaken[slot] == 0);
                        let lease = t.lease.unwrap();
                        if matches!(s, Step::Take) {
                            sending.push((slot, lease));
                        }
                    }
                    Step::Complete(k) => {
                        if !sending.is_empty() {
                            let k = k % sending.len();
                            sending.swap_remove(k);
                        }
                    }
                }
            }
        }
    }

    /// Without a ledger (heaps copied to the host) only the taking matters, and a wait for
    /// returns is immediate; with one, a wait ends when the last lease comes back.
    #[test]
    fn waits_end_when_the_last_lease_returns() {
        let mut copied = OutRing::new(2, 1, false);
        assert!(copied.submit());
        copied.launched();
        assert!(copied.take().unwrap().lease.is_none());
        assert!(copied.wait_returned(Duration::ZERO));
        assert_eq!(copied.lendable(), 0);

        let mut ring = OutRing::new(1, 2, true);
        ring.submit();
        ring.submit();
        ring.launched();
        let a = ring.take().unwrap();
        let b = ring.take().unwrap();
        assert!(b.last && !a.last);
        let (la, lb) = (a.lease.unwrap(), b.lease.unwrap());
        let copy = la.clone();
        drop(la);
        assert!(!ring.ready());
        let nic = std::thread::spawn(move || {
            drop(lb);
            drop(copy);
        });
        assert!(ring.wait_returned(Duration::from_secs(60)));
        assert!(ring.ready());
        nic.join().unwrap();
    }

    /// A slot still lent when the wait runs out: the wait says so (the heap is dropped); while
    /// the slot stays out later waits say so at once, however long the limit (or this test
    /// would hang); once it is back a wait succeeds, the ring is ready, and a heap goes in.
    #[test]
    fn a_wait_that_runs_out_drops_heaps_without_waiting_again_until_the_slot_is_back() {
        let mut ring = OutRing::new(1, 1, true);
        assert_eq!(ring.lendable(), 1);
        assert!(ring.submit());
        ring.launched();
        let lease = ring.take().unwrap().lease.unwrap();
        assert!(!ring.wait_returned(Duration::from_millis(1)));
        for _ in 0..3 {
            assert!(!ring.wait_returned(Duration::from_secs(3600)));
        }
        assert_eq!(ring.overdue, Some(4));
        drop(lease);
        assert!(ring.wait_returned(Duration::from_secs(3600)));
        assert!(ring.ready() && ring.overdue.is_none());
        assert!(ring.submit());
    }
}
