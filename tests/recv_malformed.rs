//! Malformed and hostile packets, after spead2's `tests/test_recv.py`: each is counted under
//! its cause and dropped, and nothing a packet contains can panic a receiver. Packets are
//! built bit by bit here, independently of cbf's encoder.

use std::sync::Arc;

use cbf::spead::recv::{
    ChunkGroup, ChunkGroupConfig, ChunkStream, HeapStream, HeapStreamConfig, PlaceInput, Placement,
};
use cbf::spead::DropReason;
use proptest::prelude::*;

const IMM: u64 = 1 << 63;

fn imm(id: u64, v: u64) -> u64 {
    IMM | (id << 48) | v
}

fn addr(id: u64, a: u64) -> u64 {
    (id << 48) | a
}

/// Header + pointers + payload, SPEAD-64-48 unless the header bytes are overridden.
fn make_packet(pointers: &[u64], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x53, 0x04, 2, 6, 0, 0];
    v.extend_from_slice(&(pointers.len() as u16).to_be_bytes());
    for p in pointers {
        v.extend_from_slice(&p.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

fn good(cnt: u64, len: u64, off: u64, payload: &[u8]) -> Vec<u8> {
    make_packet(
        &[
            imm(1, cnt),
            imm(2, len),
            imm(3, off),
            imm(4, payload.len() as u64),
            addr(0x1000, 0),
        ],
        payload,
    )
}

fn feed(packets: &[Vec<u8>]) -> (HeapStream, Vec<cbf::spead::recv::ReceivedHeap>) {
    let mut s = HeapStream::new(HeapStreamConfig::default());
    let mut out = Vec::new();
    for p in packets {
        s.add_packet(p, &mut out);
    }
    s.flush(&mut out);
    (s, out)
}

#[test]
fn each_malformation_is_counted_under_its_cause() {
    let ok = good(1, 8, 0, &[1; 8]);
    let cases: Vec<(&str, Vec<u8>, DropReason)> = vec![
        ("empty", vec![], DropReason::ShortHeader),
        ("partial header", ok[..5].to_vec(), DropReason::ShortHeader),
        (
            "partial pointers",
            ok[..30].to_vec(),
            DropReason::ShortHeader,
        ),
        (
            "bad magic",
            {
                let mut b = ok.clone();
                b[0] = 0x4b;
                b
            },
            DropReason::BadMagic,
        ),
        (
            "bad version",
            {
                let mut b = ok.clone();
                b[1] = 3;
                b
            },
            DropReason::BadVersion,
        ),
        (
            "bad item pointer width",
            {
                let mut b = ok.clone();
                b[2] = 1;
                b
            },
            DropReason::BadFlavour,
        ),
        (
            "bad address width",
            {
                let mut b = ok.clone();
                b[3] = 5;
                b
            },
            DropReason::BadFlavour,
        ),
        (
            "no address bits",
            {
                let mut b = ok.clone();
                b[2] = 8;
                b[3] = 0;
                b
            },
            DropReason::BadFlavour,
        ),
        (
            "partial payload",
            ok[..ok.len() - 3].to_vec(),
            DropReason::PayloadPastPacket,
        ),
        (
            "trailing bytes",
            {
                let mut b = ok.clone();
                b.extend([0, 0]);
                b
            },
            DropReason::SizeMismatch,
        ),
        (
            "offset past heap",
            good(1, 8, 4, &[1; 8]),
            DropReason::PayloadPastHeap,
        ),
        (
            "no heap cnt",
            make_packet(&[imm(2, 8), imm(3, 0), imm(4, 0)], &[]),
            DropReason::MissingItems,
        ),
        (
            "no payload offset",
            make_packet(&[imm(1, 8), imm(2, 8), imm(4, 0)], &[]),
            DropReason::MissingItems,
        ),
        (
            "no payload length",
            make_packet(&[imm(1, 8), imm(2, 8), imm(3, 0)], &[]),
            DropReason::MissingItems,
        ),
        (
            "payload length huge",
            make_packet(&[imm(1, 1), imm(3, 0), imm(4, (1 << 48) - 1)], &[]),
            DropReason::PayloadPastPacket,
        ),
    ];
    for (name, bytes, reason) in cases {
        let (s, heaps) = feed(&[bytes]);
        let st = s.stats();
        assert_eq!(st.malformed(reason), 1, "{name}: {st:?}");
        assert_eq!(st.malformed_total(), 1, "{name}");
        assert!(heaps.is_empty(), "{name}");
    }
}

#[test]
fn inconsistent_and_duplicate_packets() {
    // Second packet disagrees about the heap length: dropped, the heap stays incomplete.
    let (s, heaps) = feed(&[good(5, 16, 0, &[1; 8]), good(5, 24, 8, &[2; 8])]);
    assert_eq!(s.stats().inconsistent_packets, 1);
    assert_eq!(heaps.len(), 1);
    assert!(!heaps[0].complete);
    // Overlapping range: a duplicate.
    let (s, heaps) = feed(&[
        good(6, 16, 0, &[1; 8]),
        good(6, 16, 4, &[9; 8]),
        good(6, 16, 8, &[2; 8]),
    ]);
    assert_eq!(s.stats().duplicate_packets, 1);
    assert!(heaps[0].complete);
    assert_eq!(
        &heaps[0].payload[..],
        &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2][..]
    );
    // A late duplicate of a finished heap does not open a new heap.
    let (s, heaps) = feed(&[good(7, 8, 0, &[1; 8]), good(7, 8, 0, &[1; 8])]);
    assert_eq!((s.stats().duplicate_packets, heaps.len()), (1, 1));
}

#[test]
fn unsized_heaps_are_delivered_incomplete() {
    let p = make_packet(
        &[imm(1, 3), imm(3, 0), imm(4, 4), addr(0x1000, 0)],
        &[1, 2, 3, 4],
    );
    let (s, heaps) = feed(&[p]);
    assert_eq!(heaps.len(), 1);
    assert!(!heaps[0].complete);
    assert_eq!(heaps[0].payload, [1, 2, 3, 4]);
    assert_eq!(s.stats().incomplete_heaps_flushed, 1);
}

fn chunk_stream() -> ChunkStream {
    let group = ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 4,
        chunk_bytes: 4 * 64,
        max_chunks: 2,
        n_chunks: 64,
        n_streams: 1,
        max_heaps: 4,
        items: vec![0x1600],
        reject_reasons: vec!["no_timestamp"],
    })
    .unwrap();
    // A deliberately careless placement: offsets straight from the packet. The chunk machinery
    // must still refuse anything outside the chunk.
    let place = Arc::new(|p: &PlaceInput<'_>| match p.items[0] {
        Some(ts) => Placement::Heap {
            chunk_id: ts >> 8,
            heap_index: (ts & 7) as usize,
            heap_offset: (ts & 0xff) as usize,
            extra: ts,
        },
        None => Placement::Reject(0),
    });
    ChunkStream::new(group, place)
}

#[test]
fn chunk_stream_refuses_placements_outside_the_chunk() {
    let mut s = chunk_stream();
    // heap_index 7 ≥ 4 heaps per chunk; offset 200 + length 64 > 256 bytes.
    s.add_packet(&make_packet(
        &[imm(1, 1), imm(2, 8), imm(3, 0), imm(4, 8), imm(0x1600, 0x7)],
        &[0; 8],
    ));
    s.add_packet(&make_packet(
        &[
            imm(1, 2),
            imm(2, 64),
            imm(3, 0),
            imm(4, 8),
            imm(0x1600, 0xc8),
        ],
        &[0; 8],
    ));
    // No HEAP_LENGTH: the chunk path needs it.
    s.add_packet(&make_packet(
        &[imm(1, 3), imm(3, 0), imm(4, 8), imm(0x1600, 0x1)],
        &[0; 8],
    ));
    let st = s.finish();
    assert_eq!(st.inconsistent_packets, 3);
    assert_eq!(st.heaps, 0);
}

/// A valid packet to mutate.
fn seed_packet() -> Vec<u8> {
    make_packet(
        &[
            imm(1, 9),
            imm(2, 16),
            imm(3, 8),
            imm(4, 8),
            imm(0x1600, 0x101),
            addr(0x1000, 0),
        ],
        &[5; 8],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let (s, _) = feed(std::slice::from_ref(&bytes));
        prop_assert_eq!(s.stats().packets, 1);
        let mut c = chunk_stream();
        c.add_packet(&bytes);
        c.finish();
    }

    #[test]
    fn mutated_packets_never_panic(flips in prop::collection::vec((0usize..64, any::<u8>()), 1..6), cut in 0usize..80) {
        let mut p = seed_packet();
        for (i, v) in flips {
            let n = p.len();
            p[i % n] = v;
        }
        p.truncate(cut.max(1));
        let (s, _) = feed(&[seed_packet(), p.clone()]);
        prop_assert_eq!(s.stats().packets, 2);
        let mut c = chunk_stream();
        c.add_packet(&seed_packet());
        c.add_packet(&p);
        c.finish();
    }
}
