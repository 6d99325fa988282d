//! A chunk stream group started late, under load: several receive streams, each with a socket
//! backlog of old heaps ahead of the live ones, drained at different speeds (bench/RESULTS.md,
//! "late start"; `doc/dev-recv-chunk.md`, "Late start"). The window must converge on the live
//! data within a bounded time, never go back to the backlog, never stall, and count every heap
//! by cause.
//!
//! The references are the model's own ground truth (which heaps were sent, which the "kernel"
//! dropped, when each stream read what), never the chunk machinery's answers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cbf::spead::recv::chunk::{confirm_heaps, PlaceFn};
use cbf::spead::recv::{ChunkGroup, ChunkGroupConfig, ChunkStream, PlaceInput, Placement};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::Flavour;

const TS_STEP: u64 = 1024; // timestamp units per batch
const HEAP_BYTES: usize = 64; // one packet per heap
const TIMESTAMP: u64 = 0x1600;
const FENG_ID: u64 = 0x4101;

/// The XB-engine's placement (src/xbengine/place.rs) for `ants` antennas and `batches`
/// batches per chunk: chunk = batch / batches, heap index = batch in chunk × ants + feng.
fn place(ants: u64, batches: u64) -> Arc<PlaceFn> {
    Arc::new(move |p: &PlaceInput<'_>| {
        let (Some(ts), Some(feng)) = (p.items[0], p.items[1]) else {
            return Placement::Reject(0);
        };
        let batch = ts / TS_STEP;
        let heap_index = ((batch % batches) * ants + feng) as usize;
        Placement::Heap {
            chunk_id: batch / batches,
            heap_index,
            heap_offset: heap_index * HEAP_BYTES,
            extra: 0,
        }
    })
}

fn config(
    ants: u64,
    batches: u64,
    max_chunks: usize,
    n_chunks: usize,
    n_streams: usize,
) -> ChunkGroupConfig {
    ChunkGroupConfig {
        heaps_per_chunk: (ants * batches) as usize,
        chunk_bytes: (ants * batches) as usize * HEAP_BYTES,
        max_chunks,
        n_chunks,
        n_streams,
        max_heaps: 2 * ants as usize,
        items: vec![TIMESTAMP, FENG_ID],
        reject_reasons: vec!["metadata"],
    }
}

/// The one packet of F-engine `feng`'s heap for `batch`.
fn packet(batch: u64, feng: u64, ants: u64) -> Vec<u8> {
    let mut h = Heap::new();
    h.add_immediate(TIMESTAMP, batch * TS_STEP)
        .add_immediate(FENG_ID, feng)
        .add_bytes(0x4300, vec![(batch + feng) as u8; HEAP_BYTES]);
    let cnt = batch * ants + feng + 1;
    let mut g = PacketGenerator::new(&h, cnt, Flavour::SPEAD_64_48, 1472).unwrap();
    let mut b = Vec::new();
    g.next_packet(&mut b).unwrap();
    assert!(
        g.next_packet(&mut Vec::new()).is_none(),
        "one packet per heap"
    );
    b
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
fn a_stream_waiting_for_a_free_chunk_does_not_hold_evicted_ones() {
    // What stalled the XB-engine on the device (bench/RESULTS.md, "late start"): stream A's
    // heap slides the window past chunks 0 and 1 while stream B still holds them, and takes
    // the one free chunk; B's next heap needs a chunk not yet brought in, so B waits for a
    // free one too. Were B to keep its holds while it waits, chunks 0 and 1 could never go
    // to the consumer, the consumer could never free a chunk, and both streams would wait
    // for ever (every receive thread parked on the free queue, the main thread on the ready
    // queue, no counter moving).
    let (ants, batches) = (2, 1);
    let group = ChunkGroup::new(config(ants, batches, 2, 3, 2)).unwrap();
    let place = place(ants, batches);
    let mut a = ChunkStream::new(Arc::clone(&group), Arc::clone(&place));
    let mut b = ChunkStream::new(Arc::clone(&group), place);
    for batch in 0..2 {
        a.add_packet(&packet(batch, 0, ants));
        b.add_packet(&packet(batch, 1, ants));
    }
    // A: chunk 3 slides the window to [2, 3]; chunk 2 takes the free chunk, 3 waits.
    let ta = thread::spawn(move || {
        a.add_packet(&packet(3, 0, ants));
        a
    });
    wait_until("A to slide the window", || group.head() == Some(2));
    // B, in the same batch as its last heap (no release_old in between): chunk 3 as well.
    let tb = thread::spawn(move || {
        b.add_packet(&packet(3, 1, ants));
        b
    });
    // The consumer: chunks 0 and 1 (complete), then 2 and 3 once the streams finish.
    let mut got = Vec::new();
    for _ in 0..2 {
        let c = group
            .ready()
            .recv_timeout(Duration::from_secs(10))
            .expect("no chunk reached the consumer: the streams wait for ever");
        got.push((c.chunk_id, c.present.to_vec()));
        group.free(c);
    }
    let (a, b) = (ta.join().unwrap(), tb.join().unwrap());
    let (sa, sb) = (a.finish(), b.finish());
    while let Ok(c) = group.ready().recv() {
        got.push((c.chunk_id, c.present.to_vec()));
    }
    assert_eq!(
        got,
        [
            (0, vec![1, 1]),
            (1, vec![1, 1]),
            (2, vec![0, 0]),
            (3, vec![1, 1])
        ]
    );
    assert_eq!((sa.heaps, sb.heaps), (3, 3));
    assert_eq!(sa.too_old_heaps + sb.too_old_heaps, 0);
}

/// One receive stream of the model: its socket (a bounded FIFO: what does not fit is dropped,
/// as the kernel does), the F-engines whose heaps it receives, and how much work it can do
/// per batch time.
struct SimStream {
    stream: ChunkStream,
    socket: VecDeque<(u64, Vec<u8>)>,
    capacity: usize,
    fengs: std::ops::Range<u64>,
    /// Work per batch time: a heap copied into a chunk costs `COPY`, one dropped costs 1.
    budget: u64,
    kernel_drops: u64,
    offered: u64,
}

/// A copied heap costs this much more than one the stream drops (the copy dominates).
const COPY: u64 = 3;

/// What the consumer saw: (chunk id, heaps present, batch time it arrived).
type Delivered = Vec<(u64, usize, u64)>;

/// Run the model: every F-engine sends one heap per batch time from batch 0; the engine
/// starts reading at batch `start` (its sockets full of the oldest heaps, the rest dropped);
/// then, each batch time, the senders send, each stream reads in turn as its budget allows,
/// calls `release_old` (the end of its receive batch), and the consumer takes every ready
/// chunk at once. Returns what the consumer saw and the streams.
fn run_model(
    cfg: &ChunkGroupConfig,
    batches: u64,
    ants: u64,
    budgets: &[u64],
    capacity: usize,
    start: u64,
    end: u64,
) -> (Delivered, Vec<SimStream>, Arc<ChunkGroup>) {
    let group = ChunkGroup::new(cfg.clone()).unwrap();
    let place = place(ants, batches);
    let per = ants / budgets.len() as u64;
    let mut streams: Vec<SimStream> = budgets
        .iter()
        .enumerate()
        .map(|(i, &budget)| SimStream {
            stream: ChunkStream::new(Arc::clone(&group), Arc::clone(&place)),
            socket: VecDeque::new(),
            capacity,
            fengs: i as u64 * per..(i as u64 + 1) * per,
            budget,
            kernel_drops: 0,
            offered: 0,
        })
        .collect();
    let mut seen = Delivered::new();
    for now in 0..end {
        for s in &mut streams {
            for feng in s.fengs.clone() {
                if s.socket.len() < s.capacity {
                    s.socket.push_back((now, packet(now, feng, ants)));
                } else {
                    s.kernel_drops += 1;
                }
            }
        }
        if now < start {
            continue;
        }
        for s in &mut streams {
            let mut work = 0;
            while work < s.budget {
                let Some((_, p)) = s.socket.pop_front() else {
                    break;
                };
                let bytes = s.stream.stats().snapshot().bytes;
                s.stream.add_packet(&p);
                s.offered += 1;
                work += if s.stream.stats().snapshot().bytes > bytes {
                    COPY
                } else {
                    1
                };
            }
            s.stream.release_old();
            while let Ok(c) = group.ready().try_recv() {
                let present = c.present.iter().filter(|&&p| p != 0).count();
                seen.push((c.chunk_id, present, now));
                group.free(c);
            }
        }
    }
    (seen, streams, group)
}

#[test]
fn a_late_start_converges_on_the_live_heaps() {
    // Two F-engines per stream, chunks of four batches, a window of four chunks. The engine
    // starts reading 200 batch times after the senders, each socket full with its first 32
    // batches (64 heaps), the rest dropped. The streams' budgets differ: at 7, a stream
    // copies 7/3 heaps per batch time against the 2 it receives, so copying its whole
    // backlog and what queues behind it would take it ~200 batch times, dropping it ~13.
    for budgets in [&[16, 7][..], &[16, 7, 12, 8][..], &[7, 16, 7][..]] {
        converges(budgets);
    }
}

/// One late start of [`run_model`] with one stream per budget, checked against the bound.
fn converges(budgets: &[u64]) {
    let n = budgets.len() as u64;
    let (ants, batches, max_chunks) = (2 * n, 4, 4);
    let cfg = config(ants, batches, max_chunks, 3 * max_chunks + 4, budgets.len());
    let confirm = confirm_heaps(&cfg) as u64;
    let (capacity, start) = (64usize, 200);
    let end = start + 300;
    let (seen, streams, group) = run_model(&cfg, batches, ants, budgets, capacity, start, end);
    let case = format!("budgets {budgets:?}");

    // The bound, from the model's parameters. A stream reaches its first live heap once it
    // has copied the `capacity` heaps of its backlog (COPY each). The window jumps once at
    // least half of the streams are there and `confirm` distinct live heaps have come (at 2
    // per batch time from one stream at least). Then every stream drops what is left in its
    // socket at (budget − input) heaps per batch time net; then the window (the reorder
    // tolerance) and the chunk being filled pass.
    let input = 2;
    let mut live: Vec<u64> = budgets
        .iter()
        .map(|b| (capacity as u64 * COPY).div_ceil(*b))
        .collect();
    live.sort_unstable();
    let drain = budgets
        .iter()
        .map(|b| (capacity as u64).div_ceil(b - input))
        .max()
        .unwrap();
    let quorum = live[(budgets.len() - 1) / 2];
    let bound = quorum + confirm.div_ceil(input) + drain + (max_chunks as u64 + 1) * batches;
    let settled = start + bound;

    // Never back to the backlog: chunk ids only increase.
    let ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{case}: the window went back: {ids:?}"
    );
    // From `settled` on, every chunk comes, complete, in order, as it is sent.
    let first = settled.div_ceil(batches);
    let last = (end - 1) / batches - max_chunks as u64; // still in the window at the end
    let late: Vec<(u64, usize)> = seen
        .iter()
        .filter(|s| s.0 >= first && s.0 <= last)
        .map(|s| (s.0, s.1))
        .collect();
    let want: Vec<(u64, usize)> = (first..=last).map(|id| (id, cfg.heaps_per_chunk)).collect();
    assert_eq!(
        late, want,
        "{case}: not converged {bound} batch times after the start (delivered: {seen:?})"
    );
    // Every heap counted: sent = dropped by the kernel + still queued + offered, and offered
    // = complete + too old + far future (one packet per heap, none lost in between).
    let mut stats = cbf::spead::recv::StatsSnapshot::default();
    for s in streams {
        let queued = s.socket.len() as u64;
        assert_eq!(end * input, s.kernel_drops + queued + s.offered, "{case}");
        stats.merge(&s.stream.finish());
    }
    while group.ready().try_recv().is_ok() {}
    assert_eq!(
        stats.packets,
        stats.heaps + stats.too_old_heaps + stats.far_future_heaps,
        "{case}: {stats:?}"
    );
    assert_eq!(stats.resyncs, 0, "{case}: {stats:?}");
}

/// The chunks left in the group after its streams finished: (id, heaps present).
fn drain_ready(group: &ChunkGroup) -> Vec<(u64, usize)> {
    let mut v = Vec::new();
    while let Ok(c) = group.ready().recv() {
        v.push((c.chunk_id, c.present.iter().filter(|&&p| p != 0).count()));
        group.free(c);
    }
    v
}

#[test]
fn a_live_stream_jumps_past_one_draining_a_backlog() {
    // Stream A copies its backlog (a new chunk for every other heap it places); stream B has
    // reached the live heaps, far ahead. A's chunks say nothing about B's heaps, so B's
    // confirm the jump on their own; A's backlog is then too old. (Before, every chunk A
    // brought in restarted B's run, and B's live heaps were dropped until A had copied all
    // of its backlog.)
    let (ants, batches) = (2, 1);
    let cfg = config(ants, batches, 2, 16, 2);
    let confirm = confirm_heaps(&cfg) as u64;
    let group = ChunkGroup::new(cfg).unwrap();
    let place = place(ants, batches);
    let mut a = ChunkStream::new(Arc::clone(&group), Arc::clone(&place));
    let mut b = ChunkStream::new(Arc::clone(&group), place);
    let live = 1000;
    for i in 0..2 * confirm {
        a.add_packet(&packet(i, 0, ants));
        b.add_packet(&packet(live + i, 1, ants));
        a.release_old();
        b.release_old();
        while let Ok(c) = group.ready().try_recv() {
            group.free(c);
        }
    }
    let (sa, sb) = (a.finish(), b.finish());
    assert_eq!(sb.window_jumps, 1, "{sb:?}");
    assert_eq!(sb.far_future_heaps, confirm - 1, "{sb:?}");
    assert_eq!(sb.heaps, confirm + 1, "{sb:?}");
    // A copied its backlog until the jump, then its heaps were too old.
    assert_eq!(sa.heaps + sa.too_old_heaps, 2 * confirm, "{sa:?}");
    assert_eq!(sa.too_old_heaps, confirm, "{sa:?}");
    assert_eq!(sa.resyncs + sb.resyncs, 0);
    // The window ends on B's last heaps: live chunks with B's heap present.
    let last = drain_ready(&group);
    assert_eq!(last.last(), Some(&(live + 2 * confirm - 1, 1)));
}

#[test]
fn a_resync_waits_for_every_stream_with_newer_heaps() {
    // Stream B sends many too-old heaps in a row, near each other (a backlog, or a sender
    // that went back). While stream A's latest heap was in the window (A is merely held up:
    // starved of a core, or waiting for a free chunk), that is B's backlog and the window
    // stays. Once A's transport has gone quiet, B's run resynchronises the window.
    let (ants, batches, max_chunks) = (2, 4, 8);
    let cfg = config(ants, batches, max_chunks, 24, 2);
    let confirm = confirm_heaps(&cfg) as u64;
    let group = ChunkGroup::new(cfg).unwrap();
    let place = place(ants, batches);
    let mut a = ChunkStream::new(Arc::clone(&group), Arc::clone(&place));
    let mut b = ChunkStream::new(Arc::clone(&group), place);
    let now = 400; // batch 400: chunk 100
    a.add_packet(&packet(now, 0, ants));
    b.add_packet(&packet(now, 1, ants));
    // 2 × confirm heaps of B within 2 × confirm / batches < max_chunks chunks of each other.
    for i in 0..2 * confirm {
        b.add_packet(&packet(i, 1, ants));
    }
    assert_eq!(
        group.head(),
        Some(now / batches),
        "a backlog moved the window back"
    );
    assert_eq!(b.stats().snapshot().too_old_heaps, 2 * confirm);
    a.note_idle();
    let back = 200; // batch 200: chunk 50
    for i in 0..confirm {
        b.add_packet(&packet(back + i, 1, ants));
    }
    let sb = b.finish();
    a.finish();
    assert_eq!(sb.resyncs, 1, "{sb:?}");
    assert_eq!(sb.too_old_heaps, 2 * confirm + confirm - 1, "{sb:?}");
    assert_eq!(sb.heaps, 2, "{sb:?}");
    // The old window, then a window from the run's first chunk to its last.
    let chunks = drain_ready(&group);
    let last = (back + confirm - 1) / batches;
    let want: Vec<(u64, usize)> = [(now / batches, 2)]
        .into_iter()
        .chain((back / batches..=last).map(|id| (id, usize::from(id == last))))
        .collect();
    assert_eq!(chunks, want);
}

#[test]
fn the_window_follows_most_streams_ahead() {
    // Three streams, one F-engine each. Stream C alone sends heaps far ahead, consistently
    // (a sender with a wrong clock, or one stream already past its backlog): while A and B
    // still fill the window, C's heaps stay far ahead and are dropped, however many agree.
    // As soon as B's heaps are out there too, the far streams are no longer outnumbered and
    // the window jumps (C's heaps confirmed it long ago); A's heaps are then too old.
    let (ants, batches) = (3, 1);
    let cfg = config(ants, batches, 2, 16, 3);
    let confirm = confirm_heaps(&cfg) as u64;
    let group = ChunkGroup::new(cfg).unwrap();
    let place = place(ants, batches);
    let mut s: Vec<ChunkStream> = (0..3)
        .map(|_| ChunkStream::new(Arc::clone(&group), Arc::clone(&place)))
        .collect();
    let far = 1000;
    let step = |s: &mut [ChunkStream], batches: [u64; 3]| {
        for (feng, b) in batches.into_iter().enumerate() {
            s[feng].add_packet(&packet(b, feng as u64, ants));
            s[feng].release_old();
        }
        while let Ok(c) = group.ready().try_recv() {
            group.free(c);
        }
    };
    for i in 0..3 * confirm {
        step(&mut s, [i, i, far + i]);
    }
    let stats: Vec<_> = s.iter().map(|s| s.stats().snapshot()).collect();
    assert_eq!(stats[2].far_future_heaps, 3 * confirm, "{:?}", stats[2]);
    assert_eq!(stats[2].window_jumps, 0);
    assert_eq!((stats[0].heaps, stats[1].heaps), (3 * confirm, 3 * confirm));
    for i in 3 * confirm..4 * confirm {
        step(&mut s, [i, far + i, far + i]);
    }
    let stats: Vec<_> = s.into_iter().map(|s| s.finish()).collect();
    let jumps: u64 = stats.iter().map(|s| s.window_jumps).sum();
    assert_eq!(jumps, 1, "{stats:?}");
    assert_eq!(stats[1].far_future_heaps, 0, "{:?}", stats[1]);
    assert_eq!(stats[0].too_old_heaps, confirm - 1, "{:?}", stats[0]);
    assert_eq!(stats.iter().map(|s| s.resyncs).sum::<u64>(), 0);
}
