//! The stream's own tests: packet order, counters, pacing under shutdown, spreading over
//! interfaces (its failover tests are in `stream_failover_tests`).

use super::*;
use crate::net::mem;
use crate::net::{PacketReceiver, Received, RecvBatch};
use crate::spead::recv::{HeapStream, HeapStreamConfig};

fn drain(rx: &mut mem::MemReceiver) -> Vec<Vec<u8>> {
    let mut b = RecvBatch::new(64, 9200);
    let mut v = Vec::new();
    while let Ok(Received::Packets(_)) = rx.recv_batch(&mut b) {
        v.extend(b.iter().map(|p| p.to_vec()));
    }
    v
}

#[test]
fn round_robin_interleaves_and_cnt_sequence_steps() {
    let (tx, mut rx) = mem::channel(1000, 2);
    let mut s = SendStream::new(
        SendStreamConfig {
            cnt_first: 5,
            cnt_step: 3,
            ..Default::default()
        },
        vec![tx],
    )
    .unwrap();
    let data = vec![1u8; 3000];
    let mut a = Heap::new();
    a.add_bytes(0x1000, &data[..]);
    let heaps = [HeapRef::new(&a, 0), HeapRef::new(&a, 1)];
    s.send_heaps(&heaps, SendMode::RoundRobin).unwrap();
    drop(s);
    let pkts = drain(&mut rx);
    let cnts: Vec<u64> = pkts
        .iter()
        .map(|p| {
            crate::spead::wire::ParsedPacket::parse(p)
                .unwrap()
                .repr
                .heap_cnt
        })
        .collect();
    assert_eq!(cnts, [5, 8, 5, 8, 5, 8]);
}

/// A raised hurry flag ends pacing at once: a heap paced to take 1000 s goes out whole
/// within seconds of the flag (a stopping engine used to wait for the pace).
#[test]
fn hurry_stops_pacing_and_sends_everything() {
    let (tx, mut rx) = mem::channel(1000, 1);
    let mut s = SendStream::new(
        SendStreamConfig {
            rate: 100.0,
            burst_size: 1500,
            ..Default::default()
        },
        vec![tx],
    )
    .unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    s.set_hurry(Arc::clone(&flag));
    let raise = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        flag.store(true, Ordering::Relaxed);
    });
    let data = vec![7u8; 100_000];
    let mut a = Heap::new();
    a.add_bytes(0x1000, &data[..]);
    let started = Instant::now();
    s.send_heaps(&[HeapRef::new(&a, 0)], SendMode::Serial)
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    raise.join().unwrap();
    let bytes: usize = drain(&mut rx).iter().map(Vec::len).sum();
    assert!(
        bytes > data.len(),
        "{bytes} bytes sent of a {}-byte heap",
        data.len()
    );
}

#[test]
fn serial_heaps_reassemble() {
    let (tx, mut rx) = mem::channel(1000, 1);
    let mut s = SendStream::new(SendStreamConfig::default(), vec![tx]).unwrap();
    let data: Vec<u8> = (0..5000).map(|i| i as u8).collect();
    let mut a = Heap::new();
    a.add_immediate(0x1600, 99).add_bytes(0x1000, &data[..]);
    a.repeat_pointers = true;
    s.send_heaps(
        &[HeapRef::new(&a, 0), HeapRef::new(&a, 0)],
        SendMode::Serial,
    )
    .unwrap();
    assert!(matches!(
        s.send_heaps(&[HeapRef::new(&a, 1)], SendMode::Serial),
        Err(SendError::Substream(1, 1))
    ));
    drop(s);
    let mut hs = HeapStream::new(HeapStreamConfig::default());
    let mut out = Vec::new();
    for p in drain(&mut rx) {
        hs.add_packet(&p, &mut out);
    }
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(
        |h| h.complete && h.item(0x1000) == Some(crate::spead::items::ItemValue::Bytes(&data))
    ));
    assert_eq!(out[1].cnt, 2);
}

#[test]
fn heaps_spread_over_interfaces_descriptors_on_the_first() {
    let (tx0, mut rx0) = mem::channel(10_000, 1);
    let (tx1, mut rx1) = mem::channel(10_000, 1);
    // 40 MB/s over two interfaces (one limiter for both); 64 heaps of 8 KiB.
    let cfg = SendStreamConfig {
        rate: 40e6,
        max_packet_size: 9000,
        burst_size: 8192,
        ..Default::default()
    };
    let mut s = SendStream::new(cfg, vec![tx0, tx1]).unwrap();
    let data = vec![3u8; 8192];
    let mut h = Heap::new();
    h.add_bytes(0x4300, &data[..]);
    let mut d = Heap::new();
    d.add_descriptor(
        &crate::spead::items::Descriptor::with_format(0x1600, "timestamp", "", &[], &[(b'u', 48)]),
        Flavour::SPEAD_64_48,
    );
    for _ in 0..4 {
        s.send_heaps_first(
            &[HeapRef {
                heap: &d,
                cnt: None,
                substream: 0,
                unpaced: true,
            }],
            SendMode::Serial,
        )
        .unwrap();
    }
    for _ in 0..64 {
        s.send_heaps(&[HeapRef::new(&h, 0)], SendMode::Serial)
            .unwrap();
    }
    drop(s);
    let (p0, p1) = (drain(&mut rx0), drain(&mut rx1));
    let descriptors = |v: &[Vec<u8>]| v.iter().filter(|p| p.len() < 1000).count();
    assert_eq!((descriptors(&p0), descriptors(&p1)), (4, 0));
    // Least-loaded assignment: whatever the timing, the interfaces' bytes differ by at most
    // the largest call (`super::balance`; one heap of 8 KiB and a header). With the
    // descriptors (< 4 KB, counted) also on the first, that is under two heaps, so the heap
    // counts differ by at most 1, and by an even number as they sum to 64: each is half. The
    // assertion allows one either side (the bound before the choice went by bytes alone).
    let (n0, n1) = (p0.len() - 4, p1.len());
    assert_eq!(n0 + n1, 64);
    assert!(n0.abs_diff(32) <= 1, "{n0} and {n1} heaps");
}

#[test]
fn interfaces_that_tie_take_turns() {
    // Equal heaps: the interfaces tie on bytes every third heap, and the heaps must still
    // spread evenly, not go to the first.
    let (tx0, rx0) = mem::channel(10_000, 1);
    let (tx1, rx1) = mem::channel(10_000, 1);
    let (tx2, rx2) = mem::channel(10_000, 1);
    let mut s = SendStream::new(SendStreamConfig::default(), vec![tx0, tx1, tx2]).unwrap();
    let mut h = Heap::new();
    h.add_bytes(0x4300, &[1u8; 100][..]);
    for _ in 0..30 {
        s.send_heaps(&[HeapRef::new(&h, 0)], SendMode::Serial)
            .unwrap();
    }
    drop(s);
    let counts = [rx0, rx1, rx2].map(|mut rx| drain(&mut rx).len());
    assert_eq!(counts, [10, 10, 10]);
}

#[test]
fn unusable_configurations_are_refused() {
    let bad = |c: SendStreamConfig| c.validate().is_err();
    let d = SendStreamConfig::default();
    assert!(d.validate().is_ok());
    assert!(bad(SendStreamConfig {
        max_packet_size: 40,
        ..d
    }));
    assert!(bad(SendStreamConfig {
        rate: f64::NAN,
        ..d
    }));
    assert!(bad(SendStreamConfig { rate: -1.0, ..d }));
    assert!(bad(SendStreamConfig { burst_size: 0, ..d }));
    assert!(bad(SendStreamConfig {
        burst_rate_ratio: 0.5,
        ..d
    }));
    assert!(bad(SendStreamConfig { cnt_step: 0, ..d }));
}
