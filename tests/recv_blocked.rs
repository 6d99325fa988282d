//! A receive thread blocked by its consumer (every chunk taken, none given back) still shows
//! what the blocking costs: the kernel's drops, which it otherwise learns only by receiving.
//!
//! The references are the fake transport's own numbers (the drop count the test sets), never
//! anything the receive path computed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cbf::engine::recv::Receivers;
use cbf::engine::Shutdown;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::recv::chunk::PlaceFn;
use cbf::spead::recv::{ChunkGroup, ChunkGroupConfig, PlaceInput, Placement};
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
    ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 1,
        chunk_bytes: HEAP_BYTES,
        max_chunks: 2,
        n_chunks: 3,
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

#[test]
fn kernel_drops_show_while_the_thread_waits_for_a_free_chunk() {
    let group = group();
    let kernel = Arc::new(AtomicU64::new(0));
    let source = FakeSource {
        packets: (0..4).map(packet).collect(),
        kernel: Arc::clone(&kernel),
        seen: 0,
    };
    let shutdown = Shutdown::manual();
    let rx = Receivers::spawn(
        "blocked",
        &group,
        place(),
        vec![Box::new(source)],
        &[],
        None,
        &shutdown,
    )
    .unwrap();
    // Chunk 0 leaves the window when chunk 2 comes in; the consumer keeps it, so chunk 3
    // waits for a free chunk for as long as the test likes, inside the one batch.
    let held = group
        .ready()
        .recv_timeout(Duration::from_secs(10))
        .expect("chunk 0 reached the consumer");
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
