//! Receive statistics by cause, after spead2's stream statistics (`doc/recv-stats.rst`).
//!
//! Counters are relaxed atomics so that the control plane can read them while a receive
//! thread runs; each receive thread owns one [`StreamStats`], and a group sums snapshots.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::spead::wire::DropReason;

/// Most reasons a placement function may name.
pub const MAX_REJECT_REASONS: usize = 8;

#[derive(Debug, Default)]
pub struct StreamStats {
    /// Packets handed to the stream (valid or not).
    pub packets: AtomicU64,
    /// Payload bytes accepted.
    pub bytes: AtomicU64,
    /// Batches received from the transport.
    pub batches: AtomicU64,
    /// Largest batch seen.
    pub max_batch: AtomicU64,
    /// Complete heaps.
    pub heaps: AtomicU64,
    pub incomplete_heaps_evicted: AtomicU64,
    pub incomplete_heaps_flushed: AtomicU64,
    /// Heaps whose chunk had already left the window.
    pub too_old_heaps: AtomicU64,
    /// Heaps so far ahead of the window that one would have flushed it, dropped until enough
    /// heaps in a row agree (chunk path only; see `chunk.rs`).
    pub far_future_heaps: AtomicU64,
    /// Far jumps of the window that enough heaps confirmed.
    pub window_jumps: AtomicU64,
    /// Backward resynchronisations of the window after persistent too-old input.
    pub resyncs: AtomicU64,
    /// Heaps the placement function refused, by its reason index.
    pub rejected_heaps: [AtomicU64; MAX_REJECT_REASONS],
    /// Packets whose bytes were already received (duplicates, overlaps).
    pub duplicate_packets: AtomicU64,
    /// Packets that disagree with their heap (length mismatch, placement out of the chunk,
    /// no HEAP_LENGTH where the chunk path needs one).
    pub inconsistent_packets: AtomicU64,
    /// Malformed packets by [`DropReason`].
    pub malformed: [AtomicU64; DropReason::ALL.len()],
    /// Stop heaps seen.
    pub stops: AtomicU64,
    /// Packets the kernel dropped before the transport could take them (socket buffer
    /// full), as the transport reports it; set, not added to, by the receive thread.
    pub kernel_drops: AtomicU64,
    /// Times the stream waited for a free chunk: the consumer had every chunk (spead2's
    /// `worker_blocked`). While it waits the stream receives nothing, so the kernel drops.
    pub worker_blocked: AtomicU64,
    /// Nanoseconds spent in those waits, added at each `FREE_POLL` so that it moves during a
    /// long wait.
    pub worker_blocked_ns: AtomicU64,
}

impl StreamStats {
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    #[inline]
    pub fn malformed(&self, reason: DropReason) {
        self.malformed[reason.index()].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let ld = |c: &AtomicU64| c.load(Relaxed);
        StatsSnapshot {
            packets: ld(&self.packets),
            bytes: ld(&self.bytes),
            batches: ld(&self.batches),
            max_batch: ld(&self.max_batch),
            heaps: ld(&self.heaps),
            incomplete_heaps_evicted: ld(&self.incomplete_heaps_evicted),
            incomplete_heaps_flushed: ld(&self.incomplete_heaps_flushed),
            too_old_heaps: ld(&self.too_old_heaps),
            far_future_heaps: ld(&self.far_future_heaps),
            window_jumps: ld(&self.window_jumps),
            resyncs: ld(&self.resyncs),
            rejected_heaps: self.rejected_heaps.each_ref().map(ld),
            duplicate_packets: ld(&self.duplicate_packets),
            inconsistent_packets: ld(&self.inconsistent_packets),
            malformed: self.malformed.each_ref().map(ld),
            stops: ld(&self.stops),
            kernel_drops: ld(&self.kernel_drops),
            worker_blocked: ld(&self.worker_blocked),
            worker_blocked_ns: ld(&self.worker_blocked_ns),
        }
    }
}

/// A plain copy of [`StreamStats`], summable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub packets: u64,
    pub bytes: u64,
    pub batches: u64,
    pub max_batch: u64,
    pub heaps: u64,
    pub incomplete_heaps_evicted: u64,
    pub incomplete_heaps_flushed: u64,
    pub too_old_heaps: u64,
    pub far_future_heaps: u64,
    pub window_jumps: u64,
    pub resyncs: u64,
    pub rejected_heaps: [u64; MAX_REJECT_REASONS],
    pub duplicate_packets: u64,
    pub inconsistent_packets: u64,
    pub malformed: [u64; DropReason::ALL.len()],
    pub stops: u64,
    pub kernel_drops: u64,
    pub worker_blocked: u64,
    pub worker_blocked_ns: u64,
}

impl StatsSnapshot {
    pub fn malformed(&self, reason: DropReason) -> u64 {
        self.malformed[reason.index()]
    }

    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().sum()
    }

    /// Element-wise sum (max for `max_batch`).
    pub fn merge(&mut self, o: &StatsSnapshot) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.batches += o.batches;
        self.max_batch = self.max_batch.max(o.max_batch);
        self.heaps += o.heaps;
        self.incomplete_heaps_evicted += o.incomplete_heaps_evicted;
        self.incomplete_heaps_flushed += o.incomplete_heaps_flushed;
        self.too_old_heaps += o.too_old_heaps;
        self.far_future_heaps += o.far_future_heaps;
        self.window_jumps += o.window_jumps;
        self.resyncs += o.resyncs;
        for (a, b) in self.rejected_heaps.iter_mut().zip(o.rejected_heaps) {
            *a += b;
        }
        self.duplicate_packets += o.duplicate_packets;
        self.inconsistent_packets += o.inconsistent_packets;
        for (a, b) in self.malformed.iter_mut().zip(o.malformed) {
            *a += b;
        }
        self.stops += o.stops;
        self.kernel_drops += o.kernel_drops;
        self.worker_blocked += o.worker_blocked;
        self.worker_blocked_ns += o.worker_blocked_ns;
    }

    /// Seconds the streams waited for a free chunk (summed over streams).
    pub fn worker_blocked_seconds(&self) -> f64 {
        self.worker_blocked_ns as f64 * 1e-9
    }

    /// `name=value` pairs for every counter, malformed ones by reason; for logs and `--stats`.
    pub fn fields(&self, reject_names: &[&str]) -> Vec<(String, u64)> {
        let mut v = vec![
            ("packets".to_string(), self.packets),
            ("bytes".into(), self.bytes),
            ("batches".into(), self.batches),
            ("max_batch".into(), self.max_batch),
            ("heaps".into(), self.heaps),
            (
                "incomplete_heaps_evicted".into(),
                self.incomplete_heaps_evicted,
            ),
            (
                "incomplete_heaps_flushed".into(),
                self.incomplete_heaps_flushed,
            ),
            ("too_old_heaps".into(), self.too_old_heaps),
            ("far_future_heaps".into(), self.far_future_heaps),
            ("window_jumps".into(), self.window_jumps),
            ("resyncs".into(), self.resyncs),
            ("duplicate_packets".into(), self.duplicate_packets),
            ("inconsistent_packets".into(), self.inconsistent_packets),
            ("stops".into(), self.stops),
            ("kernel_drops".into(), self.kernel_drops),
            ("worker_blocked".into(), self.worker_blocked),
            ("worker_blocked_ns".into(), self.worker_blocked_ns),
        ];
        for (i, name) in reject_names.iter().enumerate().take(MAX_REJECT_REASONS) {
            v.push((format!("rejected_{name}"), self.rejected_heaps[i]));
        }
        for r in DropReason::ALL {
            v.push((format!("malformed_{}", r.name()), self.malformed(r)));
        }
        v
    }
}
