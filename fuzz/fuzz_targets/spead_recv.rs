//! Fuzz the receive path: the input is a sequence of packets, each prefixed by a little-endian
//! u16 length. Every packet goes through the packet parser, the generic heap assembler and a
//! chunk stream; every heap delivered has its items resolved and descriptors decoded. Nothing
//! may panic. Seeds: fuzz/seeds/spead_recv (spead2-encoded heaps, framed the same way).
#![no_main]

use std::sync::Arc;

use cbf::spead::items::Descriptor;
use cbf::spead::recv::{
    ChunkGroup, ChunkGroupConfig, ChunkStream, HeapStream, HeapStreamConfig, PlaceInput, Placement,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Heaps of up to 64 KiB: the default bound (256 MiB) is also enforced, but allocating and
    // zeroing what a claimed HEAP_LENGTH asks for made this target run at 1 k exec/s.
    let mut heaps = HeapStream::new(HeapStreamConfig {
        max_heaps: 2,
        substreams: 2,
        max_heap_bytes: 1 << 16,
        ..Default::default()
    });
    let group = ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 8,
        chunk_bytes: 8 * 4096,
        max_chunks: 2,
        n_chunks: 6,
        n_streams: 1,
        max_heaps: 4,
        items: vec![0x1600, 0x3101],
        reject_reasons: vec!["no_timestamp"],
    })
    .unwrap();
    let place = Arc::new(|p: &PlaceInput<'_>| match p.items[0] {
        Some(ts) => Placement::Heap {
            chunk_id: (ts >> 12) & 0x3ff,
            heap_index: (ts >> 3 & 15) as usize,
            heap_offset: (ts & 0xffff) as usize,
            extra: p.items[1].unwrap_or(0),
        },
        None => Placement::Reject(0),
    });
    let mut chunks = ChunkStream::new(Arc::clone(&group), place);
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let packet = &rest[2..2 + n];
        rest = &rest[2 + n..];
        heaps.add_packet(packet, &mut out);
        chunks.add_packet(packet);
        // Play the consumer: chunks that left the window go back to the free queue.
        while let Ok(c) = group.ready().try_recv() {
            group.free(c);
        }
        let _ = Descriptor::from_raw(packet);
    }
    heaps.flush(&mut out);
    for h in &out {
        let _ = h.items();
        let _ = h.descriptors();
    }
    chunks.finish();
    while let Ok(c) = group.ready().try_recv() {
        group.free(c);
    }
});
