//! The window of a chunk stream group: which chunks are in flight, the free and ready queues,
//! and the rules that move the window (forward as heaps arrive, far ahead only when confirmed,
//! backwards on a confirmed resync). The contract is in [`super::chunk`]'s module docs;
//! `doc/dev-recv-chunk.md` explains the threading.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::chunk::{confirm_heaps, Chunk, ChunkConfigError, ChunkGroupConfig};
use super::chunk_data::{ChunkData, ExternalBuffer};
use super::stats::StreamStats;

/// How long a stream waiting for a free chunk sleeps before it looks at the window again
/// (to let go of chunks the window has moved past meanwhile).
const FREE_POLL: Duration = Duration::from_millis(1);

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
    /// The chunk id of the run's latest heap; the next agrees if within a window of it, so
    /// that a run can follow a stream that moves on while it is being confirmed.
    last: u64,
    /// Lowest chunk id in the run: where a resync puts the head.
    lo: u64,
    /// Distinct heap counters seen (packets of one heap count once), at most `confirm`.
    cnts: Vec<u64>,
    /// The streams whose heaps are in the run (a far-ahead run is broken only by their own
    /// heaps placed in the window).
    streams: Vec<usize>,
}

impl Run {
    /// Note one heap of `stream`; returns the number of distinct heaps in the run.
    fn note(
        &mut self,
        chunk_id: u64,
        heap_cnt: u64,
        stream: usize,
        window: u64,
        confirm: usize,
    ) -> usize {
        if self.cnts.is_empty() || chunk_id.abs_diff(self.last) >= window {
            self.clear();
            self.lo = chunk_id;
        }
        self.last = chunk_id;
        self.lo = self.lo.min(chunk_id);
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
        }
        if self.cnts.len() < confirm && !self.cnts.contains(&heap_cnt) {
            self.cnts.push(heap_cnt);
        }
        self.cnts.len()
    }

    fn clear(&mut self) {
        self.cnts.clear();
        self.streams.clear();
    }

    fn with_capacity(config: &ChunkGroupConfig) -> Run {
        Run {
            cnts: Vec::with_capacity(confirm_heaps(config)),
            streams: Vec::with_capacity(config.n_streams),
            ..Run::default()
        }
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
    /// Where each stream's latest heap fell ([`Latest`]), by the index
    /// [`ChunkGroup::register`] gave it.
    latest: Vec<Arc<AtomicU8>>,
}

/// Where a stream's latest heap fell, or that its transport has gone quiet: a resync needs
/// every other stream to be [`Latest::TooOld`] or [`Latest::Quiet`], so that one stream
/// draining a backlog cannot drag the window back while another still receives live heaps
/// (or is held up: starved of a core, or waiting for a free chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Latest {
    /// No heap yet, or the transport had nothing at its last call, or the stream finished.
    Quiet = 0,
    InWindow = 1,
    TooOld = 2,
    FarAhead = 3,
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
#[derive(Debug)]
pub(super) struct Holds {
    pub(super) chunks: Vec<(u64, ChunkPtrs)>,
    pub(super) epoch: u64,
    /// The stream's index in its group ([`ChunkGroup::register`]).
    pub(super) stream: usize,
}

impl ChunkGroup {
    /// Allocate every chunk now; none is allocated later.
    pub fn new(config: ChunkGroupConfig) -> Result<Arc<ChunkGroup>, ChunkConfigError> {
        config.validate()?;
        let chunks = (0..config.n_chunks).map(|_| Chunk::new(&config)).collect();
        Ok(Self::with_chunks(config, chunks))
    }

    /// Chunks whose payloads live in `buffers` (one of `chunk_bytes` per chunk), lent by
    /// their owner for the group's life: device memory the host writes through a mapping, for
    /// a consumer that reads the chunks on the device (`--use-vkgdr`).
    pub fn with_buffers(
        config: ChunkGroupConfig,
        buffers: Vec<ExternalBuffer>,
    ) -> Result<Arc<ChunkGroup>, ChunkConfigError> {
        config.validate()?;
        if buffers.len() != config.n_chunks || buffers.iter().any(|b| b.len() != config.chunk_bytes)
        {
            return Err(ChunkConfigError::Buffers {
                given: buffers.len(),
                bytes: buffers.first().map_or(0, ExternalBuffer::len),
                n_chunks: config.n_chunks,
                chunk_bytes: config.chunk_bytes,
            });
        }
        let chunks = buffers
            .into_iter()
            .map(|b| Chunk::with_data(&config, ChunkData::External(b)))
            .collect();
        Ok(Self::with_chunks(config, chunks))
    }

    fn with_chunks(config: ChunkGroupConfig, chunks: Vec<Chunk>) -> Arc<ChunkGroup> {
        let (free_tx, free_rx) = crossbeam_channel::bounded(config.n_chunks);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(config.n_chunks);
        for chunk in chunks {
            // Cannot fail: the channel holds exactly n_chunks.
            let _ = free_tx.try_send(Box::new(chunk));
        }
        Arc::new(ChunkGroup {
            state: Mutex::new(GroupState {
                slots: VecDeque::with_capacity(config.n_chunks),
                head: None,
                next: 0,
                active_streams: config.n_streams,
                ready_tx: Some(ready_tx),
                ahead: Run::with_capacity(&config),
                behind: Run::with_capacity(&config),
                epoch: 0,
                latest: Vec::with_capacity(config.n_streams),
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
        })
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

    /// Enrol a new stream: what it will hold, under its index, and where it tells the group
    /// where its latest heap fell (a [`Latest`]).
    pub(super) fn register(&self) -> (Holds, Arc<AtomicU8>) {
        let mut st = self.lock();
        let latest = Arc::new(AtomicU8::new(Latest::Quiet as u8));
        st.latest.push(Arc::clone(&latest));
        let holds = Holds {
            chunks: Vec::new(),
            epoch: st.epoch,
            stream: st.latest.len() - 1,
        };
        (holds, latest)
    }

    /// Whether the streams whose latest heap was far ahead, `me` included, are at least as
    /// many as those whose latest heap fell in the window: the window follows the newer
    /// heaps unless most streams still fill it.
    fn most_ahead(st: &GroupState, me: usize) -> bool {
        let (mut ahead, mut inside) = (1, 0);
        for (_, l) in st.latest.iter().enumerate().filter(|&(i, _)| i != me) {
            match l.load(Ordering::Relaxed) {
                l if l == Latest::FarAhead as u8 => ahead += 1,
                l if l == Latest::InWindow as u8 => inside += 1,
                _ => {}
            }
        }
        ahead >= inside
    }

    /// Whether every stream but `me` last saw a too-old heap or nothing at all.
    fn others_behind_or_quiet(st: &GroupState, me: usize) -> bool {
        st.latest.iter().enumerate().all(|(i, l)| {
            let l = l.load(Ordering::Relaxed);
            i == me || l == Latest::TooOld as u8 || l == Latest::Quiet as u8
        })
    }

    /// Drop `holds`' hold on every chunk below `head` (chunks that have left the window).
    fn release_below(st: &mut GroupState, holds: &mut Holds, head: u64) {
        let mut i = 0;
        while i < holds.chunks.len() {
            let (id, p) = holds.chunks[i];
            if id < head {
                Self::unhold(st, p);
                holds.chunks.swap_remove(i);
            } else {
                i += 1;
            }
        }
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
    /// waited): the caller must retire live heaps in chunks it no longer holds. `on_wait` runs
    /// before each `FREE_POLL` of a wait (the receive thread refreshes what it cannot see
    /// while it does not receive: the kernel's drops).
    pub(super) fn acquire(
        &self,
        holds: &mut Holds,
        chunk_id: u64,
        heap_cnt: u64,
        stats: &StreamStats,
        on_wait: &mut dyn FnMut(),
    ) -> Acquired {
        let mut spare: Option<Box<Chunk>> = None;
        // When this call started waiting for a free chunk, then the end of its latest poll.
        let mut blocked: Option<Instant> = None;
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
                let run = st
                    .behind
                    .note(chunk_id, heap_cnt, holds.stream, max, confirm);
                if run < confirm || !Self::others_behind_or_quiet(&st, holds.stream) {
                    if let Some(c) = spare.take() {
                        self.free(c);
                    }
                    return Acquired::TooOld;
                }
                // Persistent too-old input, and no stream with newer heaps: the senders
                // went back (a resync). Deliver the window and restart it where the run is,
                // as far back as the run goes with this heap still in it.
                let lo = st.behind.lo.max((chunk_id + 1).saturating_sub(max));
                for slot in st.slots.iter_mut() {
                    slot.evicting = true;
                }
                st.epoch += 1;
                Self::catch_up(&mut st, holds);
                st.head = Some(lo);
                st.next = lo;
                st.behind.clear();
                st.ahead.clear();
                self.head.store(lo, Ordering::Release);
                self.epoch.store(st.epoch, Ordering::Release);
                StreamStats::add(&stats.resyncs, 1);
                Self::log_once(&self.logged_resync, "resynchronised backwards", head, lo);
                Self::flush_ready(&mut st);
                continue;
            }
            let ahead = chunk_id - head;
            if ahead >= 2 * max {
                let run = st
                    .ahead
                    .note(chunk_id, heap_cnt, holds.stream, max, confirm);
                if run < confirm || !Self::most_ahead(&st, holds.stream) {
                    if let Some(c) = spare.take() {
                        self.free(c);
                    }
                    return Acquired::FarAhead;
                }
                StreamStats::add(&stats.window_jumps, 1);
                Self::log_once(&self.logged_jump, "jumped far ahead", head, chunk_id);
                st.ahead.clear();
            }
            if ahead >= max {
                let new_head = chunk_id + 1 - max;
                for slot in st.slots.iter_mut().filter(|s| s.id < new_head) {
                    slot.evicting = true;
                }
                // Release this stream's own hold on what leaves the window.
                Self::release_below(&mut st, holds, new_head);
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
                let st = &mut *st;
                let Some(slot) = st
                    .slots
                    .iter_mut()
                    .find(|s| s.id == chunk_id && !s.evicting)
                else {
                    return Acquired::TooOld;
                };
                slot.writers += 1;
                holds.chunks.push((chunk_id, slot.ptrs));
                // A chunk brought in normally breaks a too-old run, and a far-ahead run if
                // this stream's heaps are in it: its far heaps were strays. Another stream's
                // chunk says nothing about those (that stream may be draining a backlog).
                st.behind.clear();
                if st.ahead.streams.contains(&holds.stream) {
                    st.ahead.clear();
                }
                return Acquired::Chunk(slot.ptrs);
            }
            // Out of free chunks: wait for the consumer without the lock, then retry. Chunks
            // that have left the window reach the consumer only once no stream holds them,
            // and the chunk this wait needs is one the consumer frees: so let go of them
            // first, and again each `FREE_POLL`, since the window may move past more of what
            // this stream holds while it waits. A stream that waited holding them could wait
            // for ever, and every stream of a late start did (`doc/dev-recv-chunk.md`).
            let head = st.head.unwrap_or(0);
            Self::release_below(&mut st, holds, head);
            Self::flush_ready(&mut st);
            drop(st);
            // Counted once per wait, as spead2 counts `worker_blocked`; its time at every
            // poll (all of it since the wait began), so that a long wait shows while it lasts.
            let since = *blocked.get_or_insert_with(|| {
                let start = Instant::now();
                StreamStats::add(&stats.worker_blocked, 1);
                start
            });
            on_wait();
            let got = self.free_rx.recv_timeout(FREE_POLL);
            let now = Instant::now();
            let waited = u64::try_from((now - since).as_nanos()).unwrap_or(u64::MAX);
            StreamStats::add(&stats.worker_blocked_ns, waited);
            blocked = Some(now);
            match got {
                Ok(c) => spare = Some(c),
                Err(RecvTimeoutError::Timeout) if !self.is_stopped() => {}
                Err(_) => return Acquired::Stopped,
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
        st.latest[holds.stream].store(Latest::Quiet as u8, Ordering::Relaxed);
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
