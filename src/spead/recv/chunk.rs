//! Chunk assembly: the spead2 chunk-stream-group model (`doc/recv-chunk.rst`), the path the
//! engines receive on.
//!
//! A *chunk* is one preallocated buffer holding many heaps, with one presence byte and one
//! `extra` word per heap. A caller-supplied placement function maps a heap's immediates to
//! (chunk id, heap index, byte offset) or to a numbered reason to drop it; payload bytes are
//! copied once, from the packet straight into chunk memory.
//!
//! A [`ChunkGroup`] owns a window of at most `max_chunks` chunks in flight, shared by several
//! [`ChunkStream`]s (one per receive thread, each with its own sockets) that fill disjoint
//! heaps of the same chunks. Chunk ids only move forward: a heap for a chunk past the window
//! slides the window, and chunks that fall out of it are handed to the ready queue, in id
//! order, once no stream is still writing into them. Heaps for chunks below the window are
//! counted as too old. Chunks circulate between a free queue and a ready queue and are never
//! allocated after start-up. Chunks inside the window that no packet touched are still
//! delivered (all heaps absent), so consumers see every id except across jumps larger than
//! the window.
//!
//! Lifecycle of a chunk: free → (first packet for its id) in the window, `writers` counting
//! the streams that hold it → (window moved past it) evicting → (writers reach 0) ready →
//! (consumer done) free. Streams release chunks below the group head at every batch, so an
//! idle stream cannot hold the group back for longer than its receive timeout, and before and
//! while they wait for a free chunk, so that a waiting stream never keeps from the consumer
//! the chunks whose return it waits for.
//!
//! One packet cannot wedge the window (issue 11). A heap whose chunk would slide the window by
//! more than its own length is *far ahead*: it is counted (`far_future_heaps`) and dropped
//! unless [`confirm_heaps`] distinct heaps in a row agree that the stream really moved, and
//! the streams whose latest heap was far ahead are at least as many as those whose latest heap
//! fell in the window; then it counts as a `window_jumps`. "In a row" means with no chunk
//! brought in normally, in between, by a stream whose heaps are in the run. Likewise, as many
//! distinct too-old heaps in a row (a digitiser resync, or a bogus first packet that set the
//! head), while every other stream's latest heap was too old as well or its transport has
//! gone quiet ([`ChunkStream::note_idle`]), resynchronise the window to them: every chunk in
//! flight is delivered, the head moves back and `resyncs` counts it, so chunk ids delivered
//! after a resync start again lower. Heaps of a run agree if each is within a window of the
//! one before. So a stream still draining a socket backlog can neither hold the window back
//! from the live heaps of the others nor drag it back to its own (a late start,
//! `doc/dev-recv-chunk.md`). Each kind is logged once.
//!
//! `doc/dev-recv-chunk.md` explains the threading and why the window lock is taken per chunk,
//! never per packet.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::chunk_data::ChunkData;
pub use super::chunk_group::ChunkGroup;
use super::chunk_group::{Acquired, ChunkPtrs, Holds, Latest};
use super::ranges::{PayloadRanges, RecentCnts};
use super::stats::{StatsSnapshot, StreamStats, MAX_REJECT_REASONS};
use crate::spead::wire::ParsedPacket;

/// Fewest distinct heaps in a row that confirm a far jump or a resync (the bound grows to one
/// chunk's worth of heaps, so that one lagging stream among several cannot trigger it).
pub const MIN_CONFIRM_HEAPS: usize = 8;

/// Distinct heaps in a row that confirm a far jump or a resync for `config`.
pub fn confirm_heaps(config: &ChunkGroupConfig) -> usize {
    config.heaps_per_chunk.max(MIN_CONFIRM_HEAPS)
}

/// Shape of the chunk machinery, fixed at start-up.
#[derive(Debug, Clone)]
pub struct ChunkGroupConfig {
    pub heaps_per_chunk: usize,
    pub chunk_bytes: usize,
    /// Chunks in flight (the window; spead2 `max_chunks`).
    pub max_chunks: usize,
    /// Chunks allocated in all: the window plus what the consumer holds.
    pub n_chunks: usize,
    /// Streams (receive threads) in the group.
    pub n_streams: usize,
    /// Heaps in flight per stream before the oldest is evicted.
    pub max_heaps: usize,
    /// Immediate item IDs handed to the placement function, in this order.
    pub items: Vec<u64>,
    /// Names of the placement function's reject reasons (index = reason), for counters.
    pub reject_reasons: Vec<&'static str>,
}

/// Why a [`ChunkGroupConfig`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkConfigError {
    #[error("chunk group needs at least one {0}")]
    Zero(&'static str),
    #[error("n_chunks ({n_chunks}) must exceed max_chunks ({max_chunks})")]
    TooFewChunks { n_chunks: usize, max_chunks: usize },
    #[error("at most {MAX_REJECT_REASONS} reject reasons are supported")]
    TooManyReasons,
    #[error("{given} buffers of {bytes} bytes lent for {n_chunks} chunks of {chunk_bytes} bytes")]
    Buffers {
        given: usize,
        bytes: usize,
        n_chunks: usize,
        chunk_bytes: usize,
    },
}

impl ChunkGroupConfig {
    pub fn validate(&self) -> Result<(), ChunkConfigError> {
        for (v, name) in [
            (self.heaps_per_chunk, "heap per chunk"),
            (self.chunk_bytes, "byte per chunk"),
            (self.max_chunks, "chunk in the window"),
            (self.n_streams, "stream"),
            (self.max_heaps, "live heap"),
        ] {
            if v == 0 {
                return Err(ChunkConfigError::Zero(name));
            }
        }
        if self.n_chunks <= self.max_chunks {
            return Err(ChunkConfigError::TooFewChunks {
                n_chunks: self.n_chunks,
                max_chunks: self.max_chunks,
            });
        }
        if self.reject_reasons.len() > MAX_REJECT_REASONS {
            return Err(ChunkConfigError::TooManyReasons);
        }
        Ok(())
    }
}

/// One chunk of heaps.
#[derive(Debug)]
pub struct Chunk {
    pub chunk_id: u64,
    /// `chunk_bytes` of heap payload at the offsets the placement function chose.
    pub data: ChunkData,
    /// 1 where the heap arrived complete, 0 otherwise.
    pub present: Box<[u8]>,
    /// Per heap, the `extra` value the placement function returned (complete heaps only).
    pub extra: Box<[u64]>,
}

impl Chunk {
    pub(super) fn new(config: &ChunkGroupConfig) -> Chunk {
        let mut data = vec![0u8; config.chunk_bytes].into_boxed_slice();
        // Fault every page in now: the zeroed allocation is lazily mapped, and first-touch page
        // faults on the receive path cost more than the copy itself.
        for page in data.chunks_mut(4096) {
            // SAFETY: a valid, exclusive byte of `data`; volatile so the store is not elided.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 0) };
        }
        Chunk::with_data(config, ChunkData::Owned(data))
    }

    /// A chunk whose payload lives in `data` (`chunk_bytes` long).
    pub(super) fn with_data(config: &ChunkGroupConfig, data: ChunkData) -> Chunk {
        Chunk {
            chunk_id: 0,
            data,
            present: vec![0u8; config.heaps_per_chunk].into_boxed_slice(),
            extra: vec![0u64; config.heaps_per_chunk].into_boxed_slice(),
        }
    }
}

/// What the placement function sees of a heap (from its first packet).
#[derive(Debug, Clone, Copy)]
pub struct PlaceInput<'a> {
    /// Values of the configured immediates, `None` where absent.
    pub items: &'a [Option<u64>],
    pub heap_cnt: u64,
    pub heap_length: u64,
}

/// The placement function's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Heap {
        chunk_id: u64,
        heap_index: usize,
        /// Byte offset of the heap's payload in the chunk.
        heap_offset: usize,
        extra: u64,
    },
    /// Drop the heap, counted under reason `n` of `ChunkGroupConfig::reject_reasons`.
    Reject(usize),
}

/// The placement policy, a small pure function supplied by the engine.
pub type PlaceFn = dyn Fn(&PlaceInput<'_>) -> Placement + Send + Sync;

#[derive(Debug)]
struct LiveHeap {
    cnt: u64,
    ptrs: ChunkPtrs,
    heap_index: usize,
    base: usize,
    heap_length: u64,
    received: u64,
    extra: u64,
    ranges: PayloadRanges,
}

/// One member of a chunk stream group: the state of one receive thread.
pub struct ChunkStream {
    group: Arc<ChunkGroup>,
    place: Arc<PlaceFn>,
    cache: Holds,
    live: VecDeque<LiveHeap>,
    spare: Vec<PayloadRanges>,
    values: Vec<Option<u64>>,
    stats: Arc<StreamStats>,
    recent: RecentCnts,
    /// Where this stream's latest heap fell, and the group's copy of it (written on change).
    latest: Latest,
    shared_latest: Arc<AtomicU8>,
    /// A stop heap arrived or the group stopped while this stream waited for a chunk.
    done: bool,
    /// `stream_done` has been called.
    finished: bool,
}

impl ChunkStream {
    pub fn new(group: Arc<ChunkGroup>, place: Arc<PlaceFn>) -> ChunkStream {
        let max_heaps = group.config.max_heaps;
        let n_items = group.config.items.len();
        let stats = Arc::new(StreamStats::default());
        let (cache, shared_latest) = group.register();
        ChunkStream {
            group,
            place,
            cache,
            live: VecDeque::with_capacity(max_heaps),
            spare: (0..max_heaps).map(|_| PayloadRanges::default()).collect(),
            values: vec![None; n_items],
            stats,
            recent: RecentCnts::new(2 * max_heaps),
            latest: Latest::Quiet,
            shared_latest,
            done: false,
            finished: false,
        }
    }

    /// Counters, shareable with the control plane while the stream runs.
    pub fn stats(&self) -> Arc<StreamStats> {
        Arc::clone(&self.stats)
    }

    pub fn group(&self) -> &Arc<ChunkGroup> {
        &self.group
    }

    /// True once the group was stopped (by the consumer, or by a stop heap on any stream).
    pub fn is_stopped(&self) -> bool {
        self.done || self.group.is_stopped()
    }

    /// Note a batch of `n` packets from the transport.
    pub fn note_batch(&self, n: usize) {
        StreamStats::add(&self.stats.batches, 1);
        self.stats.max_batch.fetch_max(n as u64, Ordering::Relaxed);
    }

    /// Note that the transport had no packet at its last call (a receive timeout): a stream
    /// gone quiet does not stand in the way of a resync ([`Latest`]).
    pub fn note_idle(&mut self) {
        self.set_latest(Latest::Quiet);
    }

    fn set_latest(&mut self, latest: Latest) {
        if self.latest != latest {
            self.latest = latest;
            self.shared_latest.store(latest as u8, Ordering::Relaxed);
        }
    }

    /// Drop live heap `i`, keeping its range list for reuse (no allocation per heap).
    fn retire(&mut self, i: usize) {
        if let Some(mut h) = self.live.remove(i) {
            h.ranges.clear();
            self.spare.push(h.ranges);
        }
    }

    /// Offer one packet.
    pub fn add_packet(&mut self, bytes: &[u8]) {
        self.add_packet_waiting(bytes, &mut || {});
    }

    /// Offer one packet; should its heap need a chunk while none is free, call `on_wait`
    /// every millisecond (`FREE_POLL`) of the wait. A receive thread refreshes there what it
    /// learns only by receiving (the kernel's drop count), so that a thread blocked by its
    /// consumer still shows the loss this causes.
    pub fn add_packet_waiting(&mut self, bytes: &[u8], on_wait: &mut dyn FnMut()) {
        StreamStats::add(&self.stats.packets, 1);
        if self.done {
            return;
        }
        let packet = match ParsedPacket::parse(bytes) {
            Ok(p) => p,
            Err(reason) => {
                self.stats.malformed(reason);
                return;
            }
        };
        let repr = packet.repr;
        if repr.stop {
            // Stopping one member stops the group (spead2 semantics).
            StreamStats::add(&self.stats.stops, 1);
            self.done = true;
            self.group.stop();
            return;
        }
        let idx = match self.live.iter().position(|h| h.cnt == repr.heap_cnt) {
            Some(i) => i,
            None if self.recent.contains(repr.heap_cnt) => {
                StreamStats::add(&self.stats.duplicate_packets, 1);
                return;
            }
            None => match self.start_heap(&packet, on_wait) {
                Some(i) => i,
                None => return,
            },
        };
        let heap = &mut self.live[idx];
        if repr.heap_length != Some(heap.heap_length) {
            StreamStats::add(&self.stats.inconsistent_packets, 1);
            return;
        }
        let start = repr.payload_offset;
        let end = start + repr.payload_length as u64;
        if !heap.ranges.add(start, end) {
            StreamStats::add(&self.stats.duplicate_packets, 1);
            return;
        }
        let payload = packet.payload();
        // SAFETY: `start_heap` checked base + heap_length <= chunk_bytes, and end <= heap_length
        // was checked by the parser; the chunk is alive while this stream holds it (it is in
        // `cache`, released only after its live heaps are retired). Streams write disjoint heaps.
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                heap.ptrs.data.add(heap.base + start as usize),
                payload.len(),
            );
        }
        heap.received += payload.len() as u64;
        StreamStats::add(&self.stats.bytes, payload.len() as u64);
        if heap.received == heap.heap_length {
            // SAFETY: heap_index < heaps_per_chunk was checked in `start_heap`; same lifetime
            // argument as above.
            unsafe {
                *heap.ptrs.present.add(heap.heap_index) = 1;
                *heap.ptrs.extra.add(heap.heap_index) = heap.extra;
            }
            StreamStats::add(&self.stats.heaps, 1);
            self.recent.insert(heap.cnt);
            self.retire(idx);
        }
    }

    /// Place a heap seen for the first time; returns its index in `live`.
    fn start_heap(
        &mut self,
        packet: &ParsedPacket<'_>,
        on_wait: &mut dyn FnMut(),
    ) -> Option<usize> {
        let repr = packet.repr;
        let Some(heap_length) = repr.heap_length else {
            StreamStats::add(&self.stats.inconsistent_packets, 1);
            return None;
        };
        self.values.fill(None);
        for p in packet.packet.pointers().filter(|p| p.immediate) {
            if let Some(i) = self.group.config.items.iter().position(|&id| id == p.id) {
                if self.values[i].is_none() {
                    self.values[i] = Some(p.value);
                }
            }
        }
        let verdict = (self.place)(&PlaceInput {
            items: &self.values,
            heap_cnt: repr.heap_cnt,
            heap_length,
        });
        let (chunk_id, heap_index, heap_offset, extra) = match verdict {
            Placement::Reject(reason) => {
                let reason = reason.min(MAX_REJECT_REASONS - 1);
                StreamStats::add(&self.stats.rejected_heaps[reason], 1);
                return None;
            }
            Placement::Heap {
                chunk_id,
                heap_index,
                heap_offset,
                extra,
            } => (chunk_id, heap_index, heap_offset, extra),
        };
        let cfg = &self.group.config;
        let max_heaps = cfg.max_heaps;
        // u64::MAX is refused so that the window arithmetic (id + 1) cannot overflow.
        let fits = chunk_id < u64::MAX
            && heap_index < cfg.heaps_per_chunk
            && heap_offset
                .checked_add(heap_length as usize)
                .is_some_and(|e| e <= cfg.chunk_bytes);
        if !fits {
            StreamStats::add(&self.stats.inconsistent_packets, 1);
            return None;
        }
        if self.group.epoch.load(Ordering::Acquire) != self.cache.epoch {
            self.group.release(&mut self.cache, |_| false);
            self.retire_released();
        }
        let ptrs = match self.cache.chunks.iter().find(|c| c.0 == chunk_id) {
            Some(&(_, p)) => {
                self.set_latest(Latest::InWindow);
                p
            }
            None => {
                let got = self.group.acquire(
                    &mut self.cache,
                    chunk_id,
                    repr.heap_cnt,
                    &self.stats,
                    on_wait,
                );
                // Whatever the verdict, the window may have moved past chunks that live
                // heaps point into while this stream waited: retire those heaps before
                // another packet can write through their pointers.
                self.retire_released();
                match got {
                    Acquired::Chunk(p) => {
                        self.set_latest(Latest::InWindow);
                        p
                    }
                    Acquired::TooOld => {
                        StreamStats::add(&self.stats.too_old_heaps, 1);
                        self.set_latest(Latest::TooOld);
                        return None;
                    }
                    Acquired::FarAhead => {
                        StreamStats::add(&self.stats.far_future_heaps, 1);
                        self.set_latest(Latest::FarAhead);
                        return None;
                    }
                    Acquired::Stopped => {
                        self.done = true;
                        return None;
                    }
                }
            }
        };
        if self.live.len() >= max_heaps {
            StreamStats::add(&self.stats.incomplete_heaps_evicted, 1);
            self.retire(0);
        }
        let ranges = self.spare.pop().unwrap_or_default();
        self.live.push_back(LiveHeap {
            cnt: repr.heap_cnt,
            ptrs,
            heap_index,
            base: heap_offset,
            heap_length,
            received: 0,
            extra,
            ranges,
        });
        Some(self.live.len() - 1)
    }

    /// Retire live heaps whose chunk this stream no longer holds.
    fn retire_released(&mut self) {
        let mut i = 0;
        while i < self.live.len() {
            let ptrs = self.live[i].ptrs;
            if self.cache.chunks.iter().any(|c| c.1.data == ptrs.data) {
                i += 1;
            } else {
                StreamStats::add(&self.stats.incomplete_heaps_evicted, 1);
                self.retire(i);
            }
        }
    }

    /// Call after each batch: let go of chunks the window has moved past.
    pub fn release_old(&mut self) {
        let head = self.group.head.load(Ordering::Acquire);
        let resynced = self.group.epoch.load(Ordering::Acquire) != self.cache.epoch;
        if resynced || self.cache.chunks.iter().any(|c| c.0 < head) {
            self.group.release(&mut self.cache, |id| id < head);
            self.retire_released();
        }
    }

    /// Finish: incomplete heaps are counted as flushed, chunks released; returns the counters.
    pub fn finish(mut self) -> StatsSnapshot {
        StreamStats::add(&self.stats.incomplete_heaps_flushed, self.live.len() as u64);
        self.live.clear();
        self.group.stream_done(&mut self.cache);
        self.finished = true;
        self.stats.snapshot()
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        if !self.finished {
            self.group.stream_done(&mut self.cache);
        }
    }
}
