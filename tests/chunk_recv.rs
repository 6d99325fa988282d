//! The chunk path (spead2's chunk stream group model) over the in-memory transport: exact
//! placement, presence and `extra` per heap, several streams filling shared chunks, the
//! window, too-old and rejected heaps, and loss, reordering and duplication with a known
//! ground truth.

use std::sync::Arc;
use std::thread;

use cbf::net::fault::{FaultInjector, Faults};
use cbf::net::{mem, PacketReceiver, Received, RecvBatch};
use cbf::spead::recv::chunk::PlaceFn;
use cbf::spead::recv::{Chunk, ChunkGroup, ChunkGroupConfig, ChunkStream, PlaceInput, Placement};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::Flavour;

const HEAP_BYTES: usize = 3000; // three packets of ≤ 1472 B each
const HEAPS_PER_POL: usize = 4; // per chunk
const TS_STEP: u64 = 1000; // timestamp units per heap

/// Placement in katgpucbf fgpu's shape: chunk = ts / (heaps per chunk × step), heap index =
/// (ts / step mod heaps) + pol × heaps, `extra` = a status item. Reason 0: no timestamp,
/// reason 1: timestamp not aligned.
fn place() -> Arc<PlaceFn> {
    Arc::new(|p: &PlaceInput<'_>| {
        let (Some(ts), Some(pol)) = (p.items[0], p.items[1]) else {
            return Placement::Reject(0);
        };
        if ts % TS_STEP != 0 {
            return Placement::Reject(1);
        }
        let n = ts / TS_STEP;
        let heap_index = (n % HEAPS_PER_POL as u64) as usize + (pol as usize & 1) * HEAPS_PER_POL;
        Placement::Heap {
            chunk_id: n / HEAPS_PER_POL as u64,
            heap_index,
            heap_offset: heap_index * HEAP_BYTES,
            extra: p.items[2].unwrap_or(0),
        }
    })
}

fn config(n_streams: usize) -> ChunkGroupConfig {
    ChunkGroupConfig {
        heaps_per_chunk: 2 * HEAPS_PER_POL,
        chunk_bytes: 2 * HEAPS_PER_POL * HEAP_BYTES,
        max_chunks: 2,
        n_chunks: 8,
        n_streams,
        max_heaps: 8,
        items: vec![0x1600, 0x3101, 0x3102],
        reject_reasons: vec!["no_timestamp", "bad_timestamp"],
    }
}

fn payload(n: u64, pol: u64) -> Vec<u8> {
    (0..HEAP_BYTES)
        .map(|i| (i as u64 * 7 + n * 13 + pol * 101) as u8)
        .collect()
}

/// Packets of heap n (timestamp n·step) for `pol`, in order.
fn heap_packets(n: u64, pol: u64) -> Vec<Vec<u8>> {
    let mut h = Heap::new();
    h.repeat_pointers = true;
    h.add_immediate(0x1600, n * TS_STEP)
        .add_immediate(0x3101, pol)
        .add_immediate(0x3102, n + 1000 * pol)
        .add_bytes(0x3300, payload(n, pol));
    let mut g = PacketGenerator::new(&h, n * 2 + pol, Flavour::SPEAD_64_48, 1472).unwrap();
    let mut v = Vec::new();
    loop {
        let mut b = Vec::new();
        if g.next_packet(&mut b).is_none() {
            return v;
        }
        v.push(b);
    }
}

/// Run one stream over a receiver to its end; returns the stream's counters.
fn run_stream(
    group: Arc<ChunkGroup>,
    mut rx: impl PacketReceiver,
) -> cbf::spead::recv::StatsSnapshot {
    let mut s = ChunkStream::new(group, place());
    let mut batch = RecvBatch::new(16, 9200);
    while !s.is_stopped() {
        match rx.recv_batch(&mut batch).unwrap() {
            Received::End => break,
            Received::Idle => {}
            Received::Packets(n) => {
                s.note_batch(n);
                for p in batch.iter() {
                    s.add_packet(p);
                }
            }
        }
        s.release_old();
    }
    s.finish()
}

#[allow(clippy::vec_box)] // the ready queue hands out boxed chunks
fn collect(group: &ChunkGroup) -> Vec<Box<Chunk>> {
    let mut v = Vec::new();
    while let Ok(c) = group.ready().recv() {
        v.push(c);
    }
    v
}

fn check_present_heap(c: &Chunk, idx: usize) {
    let pol = (idx / HEAPS_PER_POL) as u64;
    let n = c.chunk_id * HEAPS_PER_POL as u64 + (idx % HEAPS_PER_POL) as u64;
    assert_eq!(
        &c.data[idx * HEAP_BYTES..(idx + 1) * HEAP_BYTES],
        &payload(n, pol)[..],
        "chunk {} heap {idx}",
        c.chunk_id
    );
    assert_eq!(c.extra[idx], n + 1000 * pol);
}

#[test]
fn two_streams_fill_shared_chunks_exactly() {
    let group = ChunkGroup::new(ChunkGroupConfig {
        max_chunks: 3,
        ..config(2)
    })
    .unwrap();
    let n_heaps = 40u64;
    // The consumer only records; assertions run on the main thread, so a failure cannot stop
    // chunks from being freed and hang the streams.
    let consumer = thread::spawn({
        let g = Arc::clone(&group);
        move || {
            let mut seen = Vec::new();
            while let Ok(c) = g.ready().recv() {
                let present = c.present.to_vec();
                let ok: Vec<bool> = (0..c.present.len())
                    .map(|idx| {
                        let pol = (idx / HEAPS_PER_POL) as u64;
                        let n = c.chunk_id * HEAPS_PER_POL as u64 + (idx % HEAPS_PER_POL) as u64;
                        c.data[idx * HEAP_BYTES..(idx + 1) * HEAP_BYTES] == payload(n, pol)[..]
                            && c.extra[idx] == n + 1000 * pol
                    })
                    .collect();
                seen.push((c.chunk_id, present, ok));
                g.free(c); // chunks circulate: 8 chunks serve all 10
            }
            seen
        }
    });
    // One producer feeds both streams heap by heap through small bounded queues, as two NICs
    // would in real time, so neither stream runs a window ahead of the other.
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| mem::channel(4, 1)).unzip();
    let streams: Vec<_> = rxs
        .into_iter()
        .map(|rx| {
            let g = Arc::clone(&group);
            thread::spawn(move || run_stream(g, rx))
        })
        .collect();
    let mut txs = txs;
    for n in 0..n_heaps {
        for (pol, tx) in txs.iter_mut().enumerate() {
            for p in heap_packets(n, pol as u64) {
                let mut b = cbf::net::SendBatch::default();
                b.push_packet(&p, 0);
                cbf::net::PacketSender::send_batch(tx, &b).unwrap();
            }
        }
    }
    drop(txs);
    let stats: Vec<_> = streams.into_iter().map(|t| t.join().unwrap()).collect();
    let seen = consumer.join().unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        (0..n_heaps / HEAPS_PER_POL as u64).collect::<Vec<_>>()
    );
    for (id, present, ok) in &seen {
        assert!(present.iter().all(|&p| p == 1), "chunk {id}: {present:?}");
        assert!(ok.iter().all(|&o| o), "chunk {id}: wrong data {ok:?}");
    }
    for s in stats {
        assert_eq!(s.heaps, n_heaps);
        assert_eq!(
            s.incomplete_heaps_evicted + s.too_old_heaps + s.malformed_total(),
            0,
            "{s:?}"
        );
    }
}

#[test]
fn loss_reorder_and_duplicates_have_exact_consequences() {
    let group = ChunkGroup::new(ChunkGroupConfig {
        n_chunks: 32,
        ..config(1)
    })
    .unwrap();
    let n_heaps = 48u64;
    let mut packets = Vec::new();
    let mut lost_heaps = std::collections::HashSet::new();
    let mut k = 0;
    for n in 0..n_heaps {
        for pol in 0..2 {
            let mut hp = heap_packets(n, pol);
            // Deterministic faults: swap the first two packets of every 3rd heap, repeat the last
            // packet of every 5th, drop the middle packet of every 7th.
            if k % 3 == 0 {
                hp.swap(0, 1);
            }
            if k % 5 == 0 {
                let last = hp.last().unwrap().clone();
                hp.push(last);
            }
            if k % 7 == 0 {
                hp.remove(1);
                lost_heaps.insert((n, pol));
            }
            packets.extend(hp);
            k += 1;
        }
    }
    let stats = run_stream(Arc::clone(&group), mem::from_packets(packets));
    let chunks = collect(&group);
    assert_eq!(chunks.len() as u64, n_heaps / HEAPS_PER_POL as u64);
    let mut present = 0;
    for c in &chunks {
        for idx in 0..c.present.len() {
            let n = c.chunk_id * HEAPS_PER_POL as u64 + (idx % HEAPS_PER_POL) as u64;
            let pol = (idx / HEAPS_PER_POL) as u64;
            let want = !lost_heaps.contains(&(n, pol));
            assert_eq!(c.present[idx] == 1, want, "heap {n} pol {pol}");
            if want {
                check_present_heap(c, idx);
                present += 1;
            }
        }
    }
    assert_eq!(stats.heaps, present);
    assert_eq!(
        stats.duplicate_packets,
        (0..2 * n_heaps).filter(|k| k % 5 == 0).count() as u64
    );
    // Incomplete heaps leave through eviction (a later heap needs the slot) or the final flush.
    assert_eq!(
        stats.incomplete_heaps_evicted + stats.incomplete_heaps_flushed,
        lost_heaps.len() as u64
    );
}

#[test]
fn window_too_old_and_rejected() {
    let group = ChunkGroup::new(config(1)).unwrap();
    let mut packets = Vec::new();
    packets.extend(heap_packets(0, 0)); // chunk 0
    packets.extend(heap_packets(12, 0)); // chunk 3: window (max 2) slides to [2, 3]
    packets.extend(heap_packets(1, 0)); // chunk 0 again: too old
    let mut bad = Heap::new();
    bad.add_immediate(0x1600, 1234)
        .add_immediate(0x3101, 0)
        .add_bytes(0x3300, vec![0u8; 10]);
    let mut g = PacketGenerator::new(&bad, 99, Flavour::SPEAD_64_48, 1472).unwrap();
    let mut b = Vec::new();
    g.next_packet(&mut b).unwrap();
    packets.push(b);
    let mut meta = Heap::new();
    meta.add_bytes(0x3300, vec![1u8; 10]);
    let mut g = PacketGenerator::new(&meta, 100, Flavour::SPEAD_64_48, 1472).unwrap();
    let mut b = Vec::new();
    g.next_packet(&mut b).unwrap();
    packets.push(b);
    packets.push(vec![0x53, 0x04, 2, 6, 0, 0, 0, 9]); // short
    let stats = run_stream(Arc::clone(&group), mem::from_packets(packets));
    let ids: Vec<u64> = collect(&group).iter().map(|c| c.chunk_id).collect();
    // Chunk 1 was skipped over by the jump (it would have left the window at once); 2 is delivered empty.
    assert_eq!(ids, [0, 2, 3]);
    assert_eq!(
        stats.too_old_heaps, 3,
        "one per packet of the 3-packet heap"
    );
    assert_eq!(stats.rejected_heaps[1], 1);
    assert_eq!(stats.rejected_heaps[0], 1);
    assert_eq!(stats.malformed_total(), 1);
    assert_eq!(stats.heaps, 2);
}

#[test]
fn random_faults_never_corrupt_a_present_heap() {
    for seed in 0..8 {
        let group = ChunkGroup::new(ChunkGroupConfig {
            n_chunks: 32,
            ..config(1)
        })
        .unwrap();
        let packets: Vec<Vec<u8>> = (0..64u64)
            .flat_map(|n| (0..2).flat_map(move |p| heap_packets(n, p)))
            .collect();
        let faults = Faults {
            drop: 0.05,
            reorder: 0.2,
            duplicate: 0.05,
            corrupt: 0.0,
        };
        let rx = FaultInjector::new(mem::from_packets(packets), faults, seed, 9200);
        let stats = run_stream(Arc::clone(&group), rx);
        let chunks = collect(&group);
        let mut present = 0;
        for c in &chunks {
            for idx in (0..c.present.len()).filter(|&i| c.present[i] == 1) {
                check_present_heap(c, idx);
                present += 1;
            }
        }
        assert_eq!(stats.heaps, present);
        assert!(
            present > 64,
            "seed {seed}: only {present} heaps survived 5 % loss"
        );
    }
}

#[test]
fn corruption_is_counted_never_fatal() {
    let group = ChunkGroup::new(ChunkGroupConfig {
        n_chunks: 32,
        ..config(1)
    })
    .unwrap();
    let packets: Vec<Vec<u8>> = (0..64u64)
        .flat_map(|n| (0..2).flat_map(move |p| heap_packets(n, p)))
        .collect();
    let total = packets.len() as u64;
    let faults = Faults {
        drop: 0.0,
        reorder: 0.0,
        duplicate: 0.0,
        corrupt: 0.5,
    };
    let rx = FaultInjector::new(mem::from_packets(packets), faults, 42, 9200);
    let stats = run_stream(Arc::clone(&group), rx);
    let _ = collect(&group);
    assert_eq!(stats.packets, total);
    assert!(stats.heaps < 128);
}
