//! The window of a chunk stream group: which chunks are in flight, the free and ready queues,
//! and the rules that move the window (forward as heaps arrive, far ahead only when confirmed,
//! backwards on a confirmed resync). The contract is in [`super::chunk`]'s module docs;
//! `doc/dev-recv-chunk.md` explains the threading.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::chunk::{confirm_heaps, Chunk, ChunkConfigError, ChunkGroupConfig};
use super::stats::StreamStats;

/// Raw pointers into a chunk that streams write through while it is in the window.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkPtrs {
    pub(super) data: *mut u8,
    pub(super) present: *mut u8,
    pub(super) extra: *mut u64,
}

// SAFETY: the pointers refer to a boxed chunk that the group keeps alive and does not hand to
// the consumer while any stream holds it (`writers > 0`); see the module docs.
unsafe impl Send for ChunkPtrs {}

#[derive(Debug)]
struct Slot {
    id: u64,
    chunk: Box<Chunk>,
    ptrs: ChunkPtrs,
    writers: usize,
    evicting: bool,
}

/// Heaps in a row that fell outside the window on the same side, near each other.
#[derive(Debug, Default)]
struct Run {
    /// The chunk id the run started at; later heaps agree if within a window of it.
    anchor: u64,
    /// Lowest chunk id in the run: where a resync puts the head.
    lo: u64,
    /// Distinct heap counters seen (packets of one heap count once), at most `confirm`.
    cnts: Vec<u64>,
}

impl Run {
    /// Note one heap; returns the number of distinct heaps in the run.
    fn note(&mut self, chunk_id: u64, heap_cnt: u64, window: u64, confirm: usize) -> usize {
        if self.cnts.is_empty() || chunk_id.abs_diff(self.anchor) >= window {
            self.anchor = chunk_id;
            self.lo = chunk_id;
            self.cnts.clear();
        }
        self.lo = self.lo.min(chunk_id);
        if self.cnts.len() < confirm && !self.cnts.contains(&heap_cnt) {
            self.cnts.push(heap_cnt);
        }
        self.cnts.len()
    }
}

#[derive(Debug)]
struct GroupState {
    slots: VecDeque<Slot>,
    /// First chunk id of the window; `None` until the first heap is placed.
    head: Option<u64>,
    /// Next chunk id to bring into the window.
    next: u64,
    active_streams: usize,
    ready_tx: Option<Sender<Box<Chunk>>>,
    /// Far-ahead heaps in a row, and too-old ones.
    ahead: Run,
    behind: Run,
    /// Bumped at every resync; streams holding chunks of an older epoch let them go.
    epoch: u64,
}

/// The chunks, their window, and the free and ready queues, shared by a group's streams.
#[derive(Debug)]
pub struct ChunkGroup {
    pub(super) config: ChunkGroupConfig,
    state: Mutex<GroupState>,
    /// Mirror of `GroupState::head` (or 0), read without the lock by streams at each batch.
    pub(super) head: AtomicU64,
    /// Mirror of `GroupState::epoch`.
    pub(super) epoch: AtomicU64,
    /// Whether a far jump / a resync has been logged (each is logged once).
    logged_jump: AtomicBool,
    logged_resync: AtomicBool,
    stop: AtomicBool,
    free_tx: Sender<Box<Chunk>>,
    free_rx: Receiver<Box<Chunk>>,
    ready_rx: Receiver<Box<Chunk>>,
}

pub(super) enum Acquired {
    Chunk(ChunkPtrs),
    TooOld,
    FarAhead,
    Stopped,
}

/// What a stream holds: the chunks it writes into, and the epoch they belong to.
#[derive(Debug, Default)]
pub(super) struct Holds {
    pub(super) chunks: Vec<(u64, ChunkPtrs)>,
    pub(super) epoch: u64,
}

impl ChunkGroup {
    /// Allocate every chunk now; none is allocated later.
    pub fn new(config: ChunkGroupConfig) -> Result<Arc<ChunkGroup>, ChunkConfigError> {
        config.validate()?;
        let (free_tx, free_rx) = crossbeam_channel::bounded(config.n_chunks);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(config.n_chunks);
        for _ in 0..config.n_chunks {
            // Cannot fail: the channel holds exactly n_chunks.
            let _ = free_tx.try_send(Box::new(Chunk::new(&config)));
        }
        Ok(Arc::new(ChunkGroup {
            state: Mutex::new(GroupState {
                slots: VecDeque::with_capacity(config.n_chunks),
                head: None,
                next: 0,
                active_streams: config.n_streams,
                ready_tx: Some(ready_tx),
                ahead: Run {
                    cnts: Vec::with_capacity(confirm_heaps(&config)),
                    ..Run::default()
                },
                behind: Run {
                    cnts: Vec::with_capacity(confirm_heaps(&config)),
                    ..Run::default()
                },
                epoch: 0,
            }),
            config,
            head: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            logged_jump: AtomicBool::new(false),
            logged_resync: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            free_tx,
            free_rx,
            ready_rx,
        }))
    }

    /// Hand every chunk's data to `f` once, e.g. to page-lock it for a GPU's copies. Call it
    /// before any stream runs: every chunk must still be free (a programming error panics).
    pub fn for_each_buffer<E>(
        &self,
        mut f: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut chunks: Vec<Box<Chunk>> = self.free_rx.try_iter().collect();
        assert_eq!(
            chunks.len(),
            self.config.n_chunks,
            "ChunkGroup::for_each_buffer called while chunks are in use"
        );
        let result = chunks.iter_mut().try_for_each(|c| f(&mut c.data));
        for c in chunks {
            self.free(c);
        }
        result
    }

    pub fn config(&self) -> &ChunkGroupConfig {
        &self.config
    }

    /// Chunks leave the window here, in id order. Disconnects when every stream has finished.
    pub fn ready(&self) -> &Receiver<Box<Chunk>> {
        &self.ready_rx
    }

    /// Give a consumed chunk back.
    pub fn free(&self, chunk: Box<Chunk>) {
        // The free queue holds every chunk there is, so this cannot be full.
        let _ = self.free_tx.try_send(chunk);
    }

    /// Ask every stream to finish at its next batch.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// First chunk id of the window, `None` before the first heap.
    pub fn head(&self) -> Option<u64> {
        self.lock().head
    }

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        // A panicking stream thread cannot leave the window inconsistent (no await points
        // inside), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hand evicting chunks at the front of the window to the ready queue.
    fn flush_ready(state: &mut GroupState) {
        while state
            .slots
            .front()
            .is_some_and(|s| s.evicting && s.writers == 0)
        {
            if let Some(slot) = state.slots.pop_front() {
                if let Some(tx) = &state.ready_tx {
                    // Bounded by n_chunks, which is every chunk: never full.
                    let _ = tx.try_send(slot.chunk);
                }
            }
        }
    }

    /// Drop a hold on the chunk behind `ptrs` (found by address: after a resync two slots can
    /// carry the same id).
    fn unhold(st: &mut GroupState, ptrs: ChunkPtrs) {
        if let Some(s) = st.slots.iter_mut().find(|s| s.ptrs.data == ptrs.data) {
            s.writers -= 1;
        }
    }

    /// Let go of everything `holds` has if it belongs to an older epoch.
    fn catch_up(st: &mut GroupState, holds: &mut Holds) {
        if holds.epoch != st.epoch {
            for (_, p) in holds.chunks.drain(..) {
                Self::unhold(st, p);
            }
            holds.epoch = st.epoch;
        }
    }

    /// Log a window event once per group.
    fn log_once(flag: &AtomicBool, what: &str, from: u64, to: u64) {
        if !flag.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                from,
                to,
                "chunk window {what} (logged once; see the counters)"
            );
        }
    }

    /// Bring `chunk_id` into the window (sliding it if needed) and register a writer.
    ///
    /// Never waits for a free chunk while holding the lock: the consumer's progress can depend
    /// on other streams releasing chunks, which needs the lock. Whatever the outcome, `holds`
    /// may have lost chunks (the window moved, here or in another stream, while this one
    /// waited): the caller must retire live heaps in chunks it no longer holds.
    pub(super) fn acquire(
        &self,
        holds: &mut Holds,
        chunk_id: u64,
        heap_cnt: u64,
        stats: &StreamStats,
    ) -> Acquired {
        let mut spare: Option<Box<Chunk>> = None;
        let max = self.config.max_chunks as u64;
        let confirm = confirm_heaps(&self.config);
        loop {
            let mut st = self.lock();
            Self::catch_up(&mut st, holds);
            let head = *st.head.get_or_insert(chunk_id);
            if st.next < head {
                st.next = head;
            }
            if chunk_id < head {
                if st.behind.note(chunk_id, heap_cnt, max, confirm) < confirm {
                    if let Some(c) = spare.take() {
                        self.free(c);
                    }
                    return Acquired::TooOld;
                }
                // Persistent too-old input: the sender went back (a resync). Deliver the
                // window and restart it where the run is.
                let lo = st.behind.lo;
                for slot in st.slots.iter_mut() {
                    slot.evicting = true;
                }
                st.epoch += 1;
                Self::catch_up(&mut st, holds);
                st.head = Some(lo);
                st.next = lo;
                st.behind.cnts.clear();
                st.ahead.cnts.clear();
                self.head.store(lo, Ordering::Release);
                self.epoch.store(st.epoch, Ordering::Release);
                StreamStats::add(&stats.resyncs, 1);
                Self::log_once(&self.logged_resync, "resynchronised backwards", head, lo);
                Self::flush_ready(&mut st);
                continue;
            }
            let ahead = chunk_id - head;
            if ahead >= 2 * max {
                if st.ahead.note(chunk_id, heap_cnt, max, confirm) < confirm {
                    if let Some(c) = spare.take() {
                        self.free(c);
                    }
                    return Acquired::FarAhead;
                }
                StreamStats::add(&stats.window_jumps, 1);
                Self::log_once(&self.logged_jump, "jumped far ahead", head, chunk_id);
            }
            st.ahead.cnts.clear();
            st.behind.cnts.clear();
            if ahead >= max {
                let new_head = chunk_id + 1 - max;
                for slot in st.slots.iter_mut().filter(|s| s.id < new_head) {
                    slot.evicting = true;
                }
                // Release this stream's own hold on what leaves the window.
                let mut i = 0;
                while i < holds.chunks.len() {
                    let (id, p) = holds.chunks[i];
                    if id < new_head {
                        Self::unhold(&mut st, p);
                        holds.chunks.swap_remove(i);
                    } else {
                        i += 1;
                    }
                }
                st.head = Some(new_head);
                st.next = st.next.max(new_head);
                self.head.store(new_head, Ordering::Release);
            }
            Self::flush_ready(&mut st);
            while st.next <= chunk_id {
                let Some(mut chunk) = spare.take().or_else(|| self.free_rx.try_recv().ok()) else {
                    break;
                };
                chunk.chunk_id = st.next;
                chunk.present.fill(0);
                chunk.extra.fill(0);
                let ptrs = ChunkPtrs {
                    data: chunk.data.as_mut_ptr(),
                    present: chunk.present.as_mut_ptr(),
                    extra: chunk.extra.as_mut_ptr(),
                };
                let id = st.next;
                st.slots.push_back(Slot {
                    id,
                    chunk,
                    ptrs,
                    writers: 0,
                    evicting: false,
                });
                st.next += 1;
            }
            if st.next > chunk_id {
                if let Some(c) = spare.take() {
                    self.free(c);
                }
                return match st
                    .slots
                    .iter_mut()
                    .find(|s| s.id == chunk_id && !s.evicting)
                {
                    Some(slot) => {
                        slot.writers += 1;
                        holds.chunks.push((chunk_id, slot.ptrs));
                        Acquired::Chunk(slot.ptrs)
                    }
                    None => Acquired::TooOld,
                };
            }
            drop(st);
            // Out of free chunks: wait for the consumer without the lock, then retry.
            loop {
                match self.free_rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(c) => {
                        spare = Some(c);
                        break;
                    }
                    Err(RecvTimeoutError::Timeout) if !self.is_stopped() => continue,
                    Err(_) => return Acquired::Stopped,
                }
            }
        }
    }

    /// Drop this stream's hold on held chunks for which `release(id)` is true, and on all of
    /// them if the window was resynchronised since they were taken.
    pub(super) fn release(&self, holds: &mut Holds, release: impl Fn(u64) -> bool) {
        let mut st = self.lock();
        Self::catch_up(&mut st, holds);
        let mut i = 0;
        while i < holds.chunks.len() {
            let (id, p) = holds.chunks[i];
            if release(id) {
                Self::unhold(&mut st, p);
                holds.chunks.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Self::flush_ready(&mut st);
    }

    /// A stream has finished; the last one flushes the window and closes the ready queue.
    pub(super) fn stream_done(&self, holds: &mut Holds) {
        self.release(holds, |_| true);
        let mut st = self.lock();
        st.active_streams -= 1;
        if st.active_streams == 0 {
            for s in st.slots.iter_mut() {
                s.evicting = true;
            }
            Self::flush_ready(&mut st);
            st.ready_tx = None;
        }
    }
}
