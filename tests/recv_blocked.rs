//! A receive thread blocked by its consumer (every chunk taken, none given back) still shows
//! what the blocking costs: the kernel's drops, which it otherwise learns only by receiving,
//! and the waits themselves (spead2's `worker_blocked`), with their time.
//!
//! The references are the test's own: the drop count it sets in the fake transport, the
//! chunks it keeps from the thread and for how long (its own clock), never anything the
//! receive path computed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cbf::engine::recv::Receivers;
use cbf::engine::Shutdown;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::recv::chunk::PlaceFn;
use cbf::spead::recv::{Chunk, ChunkGroup, ChunkGroupConfig, PlaceInput, Placement};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::Flavour;

const TIMESTAMP: u64 = 0x1600;
const HEAP_BYTES: usize = 64;

/// One chunk per heap: chunk id = timestamp.
fn place() -> Arc<PlaceFn> {
    Arc::new(|p: &PlaceInput<'_>| match p.items[0] {
        Some(ts) => Placement::Heap {
            chunk_id: ts,
            heap_index: 0,
            heap_offset: 0,
            extra: 0,
        },
        None => Placement::Reject(0),
    })
}

/// A window of two chunks and one spare: with no chunk given back, the heap of chunk 3 waits.
fn group() -> Arc<ChunkGroup> {
    group_of(3)
}

/// A window of two chunks, `n_chunks` in all.
fn group_of(n_chunks: usize) -> Arc<ChunkGroup> {
    ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 1,
        chunk_bytes: HEAP_BYTES,
        max_chunks: 2,
        n_chunks,
        n_streams: 1,
        max_heaps: 2,
        items: vec![TIMESTAMP],
        reject_reasons: vec!["metadata"],
    })
    .unwrap()
}

/// The one packet of the heap for chunk `ts`.
fn packet(ts: u64) -> Vec<u8> {
    let mut h = Heap::new();
    h.add_immediate(TIMESTAMP, ts)
        .add_bytes(0x4300, vec![ts as u8; HEAP_BYTES]);
    let mut g = PacketGenerator::new(&h, ts + 1, Flavour::SPEAD_64_48, 1472).unwrap();
    let mut b = Vec::new();
    g.next_packet(&mut b).unwrap();
    b
}

/// A transport with one batch of packets, then nothing, whose kernel drop count the test
/// sets; it learns the count only when asked to refresh it (as the socket transports learn it
/// only with a datagram or a `SO_MEMINFO` read).
struct FakeSource {
    packets: Vec<Vec<u8>>,
    kernel: Arc<AtomicU64>,
    seen: u64,
}

impl PacketReceiver for FakeSource {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        self.seen = self.kernel.load(Ordering::Relaxed);
        if self.packets.is_empty() {
            thread::sleep(Duration::from_millis(1));
            return Ok(Received::Idle);
        }
        for p in self.packets.drain(..) {
            batch.push(&p);
        }
        Ok(Received::Packets(batch.len()))
    }

    fn kernel_drops(&self) -> u64 {
        self.seen
    }

    fn refresh_kernel_drops(&mut self) {
        self.seen = self.kernel.load(Ordering::Relaxed);
    }
}

/// Poll `cond` until it holds (10 s at most: a liveness bound, not a timing assertion).
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed().as_secs() < 10, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// One receive thread over a [`FakeSource`] with the heaps of chunks `0..chunks`; the handle
/// on its kernel drop count.
fn spawn(group: &Arc<ChunkGroup>, chunks: u64) -> (Receivers, Arc<AtomicU64>) {
    let kernel = Arc::new(AtomicU64::new(0));
    let source = FakeSource {
        packets: (0..chunks).map(packet).collect(),
        kernel: Arc::clone(&kernel),
        seen: 0,
    };
    let rx = Receivers::spawn(
        "blocked",
        group,
        place(),
        vec![Box::new(source)],
        &[],
        None,
        &Shutdown::manual(),
    )
    .unwrap();
    (rx, kernel)
}

/// The next chunk the window delivers.
fn next_ready(group: &ChunkGroup) -> Box<Chunk> {
    group
        .ready()
        .recv_timeout(Duration::from_secs(10))
        .expect("a chunk reached the consumer")
}

#[test]
fn kernel_drops_show_while_the_thread_waits_for_a_free_chunk() {
    let group = group();
    let (rx, kernel) = spawn(&group, 4);
    // Chunk 0 leaves the window when chunk 2 comes in; the consumer keeps it, so chunk 3
    // waits for a free chunk for as long as the test likes, inside the one batch.
    let held = next_ready(&group);
    for drops in [5, 17] {
        kernel.store(drops, Ordering::Relaxed);
        wait_until(&format!("{drops} kernel drops to show"), || {
            rx.snapshot().kernel_drops == drops
        });
    }
    assert_eq!(rx.snapshot().heaps, 3, "chunk 3's heap is still waiting");
    group.free(held);
    group.stop();
    let total = rx.join().unwrap();
    assert_eq!((total.heaps, total.kernel_drops), (4, 17));
}

/// spead2's `worker_blocked`: each wait for a free chunk counts once, and its time, which moves
/// while the wait lasts, is at least as long as the consumer kept the chunk the thread waited
/// for after the wait began (the test's own sleep) and at most the test's whole run.
#[test]
fn each_wait_for_a_free_chunk_is_counted_with_its_time() {
    const HOLD: Duration = Duration::from_millis(20);
    let group = group();
    let start = Instant::now();
    let (rx, _) = spawn(&group, 5);
    // Chunk 3 waits until the consumer gives chunk 0 back, then chunk 4 until it gives
    // chunk 1 back (chunks 1 and 2 leave the window as chunks 3 and 4 come in).
    for (wait, id) in [(1, 0), (2, 1)] {
        let c = next_ready(&group);
        assert_eq!(c.chunk_id, id);
        wait_until(&format!("wait {wait}"), || {
            rx.snapshot().worker_blocked == wait
        });
        let before = rx.snapshot().worker_blocked_ns;
        wait_until("the blocked time to move during the wait", || {
            rx.snapshot().worker_blocked_ns > before
        });
        thread::sleep(HOLD);
        assert_eq!(rx.snapshot().worker_blocked, wait, "still the same wait");
        group.free(c);
    }
    wait_until("every heap", || rx.snapshot().heaps == 5);
    group.stop();
    let total = rx.join().unwrap();
    let run = start.elapsed();
    assert_eq!(total.worker_blocked, 2);
    let blocked = Duration::from_nanos(total.worker_blocked_ns);
    assert!(
        blocked >= 2 * HOLD && blocked <= run,
        "blocked {blocked:?}, held 2 × {HOLD:?}, ran {run:?}"
    );
}

/// A thread with a chunk for every heap never waits, though every heap needs a new one.
#[test]
fn a_thread_never_short_of_chunks_is_never_blocked() {
    let group = group_of(6);
    let (rx, _) = spawn(&group, 6);
    wait_until("every heap", || rx.snapshot().heaps == 6);
    group.stop();
    let total = rx.join().unwrap();
    let ids: Vec<u64> = group.ready().iter().map(|c| c.chunk_id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
    assert_eq!((total.worker_blocked, total.worker_blocked_ns), (0, 0));
}
