//! Accumulations, dumps and auto-resync (seed 001 §Accumulations, Dumps and Auto-resync), as a
//! pure state machine over chunks: a dump spans `heap_accumulation_threshold` batches and starts
//! at a multiple of its own span (so after any gap the dumps line up again by themselves); a
//! dump boundary may fall inside a chunk, which then correlates in several batch ranges.
//!
//! Presence follows katgpucbf xbgpu's `gpu_proc_loop` and `_flush_accumulation` (engine.py at
//! 1e38bdc): a range of batches in which no heap at all arrived is not correlated and does not
//! count; otherwise an antenna stays present only if it is present in every batch of the range;
//! a dump that did not see all its batches has every antenna marked missing; a dump that saw no
//! batch at all is never emitted (its time simply passes). Which dumps are then sent, skipped
//! (no antenna present) or counted incomplete is the sender's decision ([`Dump::verdict`]).
#![deny(unsafe_code)]

use std::ops::Range;

/// One finished accumulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// Timestamp of its first batch (a multiple of the dump span).
    pub timestamp: u64,
    /// Batches correlated into it.
    pub batches: u64,
    /// Per antenna: present in every batch of the dump.
    pub present: Vec<bool>,
}

/// What the sender does with a dump (katgpucbf's `skipped_accs` / `incomplete_accs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every antenna present.
    Complete,
    /// Sent, with the baselines of the missing antennas flagged.
    Incomplete,
    /// No antenna present: not sent.
    Skipped,
}

impl Dump {
    pub fn verdict(&self) -> Verdict {
        if self.present.iter().all(|&p| p) {
            Verdict::Complete
        } else if self.present.iter().any(|&p| p) {
            Verdict::Incomplete
        } else {
            Verdict::Skipped
        }
    }
}

/// One step of work for a chunk, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Correlate these batches of the chunk into the current accumulation.
    Correlate(Range<usize>),
    /// The current accumulation is finished: reduce, emit, and start afresh.
    Dump(Dump),
}

/// The accumulation state of one `--corrprod` output.
#[derive(Debug, Clone)]
pub struct Accumulator {
    n_ants: usize,
    heap_step: u64,
    threshold: u64,
    /// Timestamp of the accumulation being filled (`None` before the first chunk).
    timestamp: Option<u64>,
    batches: u64,
    present: Vec<bool>,
}

impl Accumulator {
    pub fn new(n_ants: usize, heap_step: u64, threshold: u64) -> Accumulator {
        Accumulator {
            n_ants,
            heap_step,
            threshold,
            timestamp: None,
            batches: 0,
            present: vec![true; n_ants],
        }
    }

    /// Timestamp span of one dump.
    pub fn span(&self) -> u64 {
        self.heap_step * self.threshold
    }

    /// The steps for a chunk whose first batch has timestamp `first` and whose heap presence
    /// is `present` (batch-major, `n_ants` per batch, non-zero = present).
    pub fn chunk(&mut self, first: u64, present: &[u8]) -> Vec<Step> {
        let batches = present.len() / self.n_ants;
        let span = self.span();
        let mut acc_ts = *self.timestamp.get_or_insert(first / span * span);
        let mut steps = Vec::new();
        let mut from = 0;
        for i in 0..batches {
            let ts = first + i as u64 * self.heap_step;
            if ts / span != acc_ts / span {
                self.correlate(from..i, present, &mut steps);
                from = i;
                self.flush(ts / span * span, &mut steps);
                acc_ts = ts / span * span;
            }
        }
        self.correlate(from..batches, present, &mut steps);
        // A chunk that ends exactly at a dump boundary flushes now rather than at the next
        // chunk (katgpucbf does the same).
        let end = first + batches as u64 * self.heap_step;
        if end / span != acc_ts / span {
            self.flush(end / span * span, &mut steps);
        }
        steps
    }

    fn correlate(&mut self, range: Range<usize>, present: &[u8], steps: &mut Vec<Step>) {
        let n = self.n_ants;
        let cells = &present[range.start * n..range.end * n];
        if range.is_empty() || cells.iter().all(|&p| p == 0) {
            return;
        }
        for (a, p) in self.present.iter_mut().enumerate() {
            *p &= cells.chunks_exact(n).all(|batch| batch[a] != 0);
        }
        self.batches += range.len() as u64;
        steps.push(Step::Correlate(range));
    }

    fn flush(&mut self, next: u64, steps: &mut Vec<Step>) {
        let timestamp = self.timestamp.replace(next).unwrap_or(next);
        if self.batches == 0 {
            return;
        }
        if self.batches != self.threshold {
            self.present.fill(false);
        }
        steps.push(Step::Dump(Dump {
            timestamp,
            batches: self.batches,
            present: std::mem::replace(&mut self.present, vec![true; self.n_ants]),
        }));
        self.batches = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: u64 = 1000;

    fn dump(timestamp: u64, batches: u64, present: &[bool]) -> Step {
        Step::Dump(Dump {
            timestamp,
            batches,
            present: present.to_vec(),
        })
    }

    #[test]
    fn a_dump_boundary_inside_a_chunk_splits_the_correlation() {
        // 2 antennas, 4 batches per chunk, dumps of 3 batches: chunk 0 holds batches 0–3, so
        // dump 0 is batches 0–2 and batch 3 starts dump 1, which ends inside chunk 1.
        let mut acc = Accumulator::new(2, STEP, 3);
        let all = [1u8; 8];
        assert_eq!(
            acc.chunk(0, &all),
            vec![
                Step::Correlate(0..3),
                dump(0, 3, &[true, true]),
                Step::Correlate(3..4)
            ]
        );
        assert_eq!(
            acc.chunk(4 * STEP, &all),
            vec![
                Step::Correlate(0..2),
                dump(3 * STEP, 3, &[true, true]),
                Step::Correlate(2..4)
            ]
        );
        // Batches 6, 7 so far; batch 8 (chunk 2's first) completes dump 2 and the chunk's end
        // (batch 12 = dump 4's start) flushes dump 3 at once.
        assert_eq!(
            acc.chunk(8 * STEP, &all),
            vec![
                Step::Correlate(0..1),
                dump(6 * STEP, 3, &[true, true]),
                Step::Correlate(1..4),
                dump(9 * STEP, 3, &[true, true]),
            ]
        );
    }

    #[test]
    fn first_dump_joined_late_is_flagged_and_gaps_resync() {
        let mut acc = Accumulator::new(2, STEP, 4);
        // The engine starts at batch 2: dump 0 sees 2 of its 4 batches: all antennas missing.
        assert_eq!(
            acc.chunk(2 * STEP, &[1; 4]),
            vec![Step::Correlate(0..2), dump(0, 2, &[false, false])]
        );
        // A gap: the next chunk starts at batch 13. Dump 1 (batches 4–7) and 2 saw nothing and
        // are never emitted; dump 3 (12–15) misses batch 12.
        assert_eq!(acc.chunk(13 * STEP, &[1; 4]), vec![Step::Correlate(0..2)]);
        assert_eq!(
            acc.chunk(15 * STEP, &[1; 4]),
            vec![
                Step::Correlate(0..1),
                dump(12 * STEP, 3, &[false, false]),
                Step::Correlate(1..2)
            ]
        );
    }

    #[test]
    fn a_missing_heap_flags_its_antenna_for_the_dump() {
        let mut acc = Accumulator::new(3, STEP, 2);
        // Antenna 1 misses batch 1 of dump 0; dump 1 complete.
        let present = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1];
        let steps = acc.chunk(0, &present);
        assert_eq!(
            steps,
            vec![
                Step::Correlate(0..2),
                dump(0, 2, &[true, false, true]),
                Step::Correlate(2..4),
                dump(2 * STEP, 2, &[true, true, true]),
            ]
        );
        let Step::Dump(d) = &steps[1] else { panic!() };
        assert_eq!(d.verdict(), Verdict::Incomplete);
        let Step::Dump(d) = &steps[3] else { panic!() };
        assert_eq!(d.verdict(), Verdict::Complete);
    }

    #[test]
    fn a_batch_with_no_heap_is_not_correlated() {
        // Dump 0's batches: batch 0 all present, batch 1 nothing at all. The empty batch sits
        // in the same range as batch 0 (one range per dump), so the range has some presence,
        // is correlated whole, and flags every antenna (katgpucbf's `present.all(axis=0)`).
        let mut acc = Accumulator::new(2, STEP, 2);
        assert_eq!(
            acc.chunk(0, &[1, 1, 0, 0]),
            vec![Step::Correlate(0..2), dump(0, 2, &[false, false])]
        );
        // A whole dump with nothing in it: no correlation, no dump.
        assert_eq!(acc.chunk(2 * STEP, &[0, 0, 0, 0]), vec![]);
        assert_eq!(
            acc.chunk(4 * STEP, &[1, 1, 1, 1]),
            vec![Step::Correlate(0..2), dump(4 * STEP, 2, &[true, true])]
        );
        let d = Dump {
            timestamp: 0,
            batches: 2,
            present: vec![false, false],
        };
        assert_eq!(d.verdict(), Verdict::Skipped);
    }
}
