//! CPU cost of the SPEAD paths, per core: packetising an F-engine-sized heap, parsing packets,
//! and assembling them through the generic heap assembler and the chunk path.
//! Run: `cargo bench --bench spead_codec`. Figures go to bench/RESULTS.md.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use cbf::spead::recv::{
    ChunkGroup, ChunkGroupConfig, ChunkStream, HeapStream, HeapStreamConfig, PlaceInput, Placement,
};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::wire::ParsedPacket;
use cbf::spead::Flavour;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const HEAP: usize = 128 * 1024; // katgpucbf's F heap at 8192 ch / 64 X-engines / 256 spectra

fn heap(data: &[u8], ts: u64) -> Heap<'_> {
    let mut h = Heap::new();
    h.repeat_pointers = true;
    h.add_immediate(0x1600, ts)
        .add_immediate(0x4101, 3)
        .add_immediate(0x4103, 0)
        .add_bytes(0x4300, data);
    h
}

fn packets(data: &[u8], n_heaps: u64) -> Vec<Vec<u8>> {
    packets_from(data, n_heaps, 0)
}

fn packets_from(data: &[u8], n_heaps: u64, first: u64) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for i in first..first + n_heaps {
        let h = heap(data, i * 1000);
        let mut g = PacketGenerator::new(&h, i, Flavour::SPEAD_64_48, 8192 + 72).unwrap();
        loop {
            let mut b = Vec::new();
            if g.next_packet(&mut b).is_none() {
                break;
            }
            v.push(b);
        }
    }
    v
}

fn bench(c: &mut Criterion) {
    let data = vec![0x5au8; HEAP];
    let mut g = c.benchmark_group("spead");
    g.throughput(Throughput::Bytes(HEAP as u64));
    g.bench_function("packetise_128KiB_heap_8KiB_packets", |b| {
        let mut out = Vec::with_capacity(HEAP + 4096);
        b.iter(|| {
            out.clear();
            let h = heap(&data, 0);
            let mut gen = PacketGenerator::new(&h, 1, Flavour::SPEAD_64_48, 8192 + 72).unwrap();
            while gen.next_packet(&mut out).is_some() {}
            out.len()
        })
    });
    let pk = packets(&data, 64);
    let per_heap = pk.len() / 64;
    g.bench_function("parse_packets_of_one_heap", |b| {
        b.iter(|| {
            pk[..per_heap]
                .iter()
                .map(|p| ParsedPacket::parse(p).unwrap().repr.payload_length)
                .sum::<usize>()
        })
    });
    g.throughput(Throughput::Bytes((HEAP * 64) as u64));
    g.bench_function("heap_stream_64_heaps", |b| {
        // One stream for all iterations, buffers recycled as `cbf capture` does; a fresh cnt
        // range per iteration so that heaps are new.
        let mut s = HeapStream::new(HeapStreamConfig::default());
        let mut out = Vec::new();
        let mut round = 0u64;
        let rounds: Vec<Vec<Vec<u8>>> = (0..4).map(|r| packets_from(&data, 64, r * 64)).collect();
        b.iter(|| {
            for p in &rounds[(round % 4) as usize] {
                s.add_packet(p, &mut out);
                for h in out.drain(..) {
                    s.recycle(h);
                }
            }
            round += 1;
        })
    });
    let cfg = ChunkGroupConfig {
        heaps_per_chunk: 16,
        chunk_bytes: 16 * HEAP,
        max_chunks: 2,
        n_chunks: 8,
        n_streams: 1,
        max_heaps: 4,
        items: vec![0x1600],
        reject_reasons: vec!["no_timestamp"],
    };
    g.bench_function("chunk_stream_64_heaps", |b| {
        // One group and stream for all iterations (chunks allocated once, as in an engine);
        // each iteration's heaps land in the next chunk ids.
        let group = ChunkGroup::new(cfg.clone()).unwrap();
        let round = Arc::new(AtomicU64::new(0));
        let r = Arc::clone(&round);
        let place = Arc::new(move |p: &PlaceInput<'_>| {
            let n = p.items[0].unwrap_or(0) / 1000 + 64 * r.load(Relaxed);
            Placement::Heap {
                chunk_id: n / 16,
                heap_index: (n % 16) as usize,
                heap_offset: (n % 16) as usize * HEAP,
                extra: 0,
            }
        });
        let mut s = ChunkStream::new(Arc::clone(&group), place);
        b.iter(|| {
            for p in &pk {
                s.add_packet(p);
            }
            s.release_old();
            while let Ok(c) = group.ready().try_recv() {
                group.free(c);
            }
            round.fetch_add(1, Relaxed);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
