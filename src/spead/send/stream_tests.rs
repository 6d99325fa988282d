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
    let cnts: Vec<u64> = pkts.iter().map(|p| heap_cnt(p)).collect();
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
    // the largest heap (`super::balance`; 8 KiB and a header). With the
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

/// Every burst the stream hands over, in order, over all interfaces: (interface, bytes).
type BurstLog = Arc<std::sync::Mutex<Vec<(usize, usize)>>>;

/// A `mem` sender that logs each burst in a log shared by all the stream's interfaces, so
/// the order of bursts across interfaces can be read back (each `mem` receiver sees only its
/// own).
struct Logged {
    inner: mem::MemSender,
    iface: usize,
    log: BurstLog,
}

impl PacketSender for Logged {
    fn destinations(&self) -> usize {
        self.inner.destinations()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        self.log.lock().unwrap().push((self.iface, batch.bytes()));
        self.inner.send_batch(batch)
    }
}

/// A stream over `n` logged `mem` interfaces (8 KiB packets, 16 KiB bursts, unpaced: the
/// order of bursts does not depend on time), their receivers and the log.
fn logged_stream(n: usize) -> (SendStream<Logged>, Vec<mem::MemReceiver>, BurstLog) {
    let log = BurstLog::default();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n)
        .map(|iface| {
            let (tx, rx) = mem::channel(100_000, 1);
            let log = Arc::clone(&log);
            (
                Logged {
                    inner: tx,
                    iface,
                    log,
                },
                rx,
            )
        })
        .unzip();
    let cfg = SendStreamConfig {
        max_packet_size: 8192 + 72,
        burst_size: 16384,
        ..Default::default()
    };
    (SendStream::new(cfg, txs).unwrap(), rxs, log)
}

/// The heap counter of a packet.
fn heap_cnt(packet: &[u8]) -> u64 {
    crate::spead::wire::ParsedPacket::parse(packet)
        .unwrap()
        .repr
        .heap_cnt
}

/// Per interface, the heap counters of the packets its receiver got.
fn cnts_per_interface(rxs: &mut [mem::MemReceiver]) -> Vec<std::collections::BTreeSet<u64>> {
    rxs.iter_mut()
        .map(|rx| drain(rx).iter().map(|p| heap_cnt(p)).collect())
        .collect()
}

/// One call of 90 equal heaps (20 000 B: three packets each) over three interfaces, in both
/// modes: each heap goes whole to one interface (its packets reach one receiver only), each
/// interface carries a third of the bytes, and the bursts are interleaved so that in every
/// sixth of the call (by bytes, in the order the stream handed the bursts over) each carries
/// between a quarter and 42 %: a third, give or take a burst of the 16 bursts or so each
/// carries per sixth. When a call went whole to one interface it carried everything: shares
/// of 1, 0 and 0 in every window.
#[test]
fn one_call_spreads_over_the_interfaces_in_time() {
    for mode in [SendMode::RoundRobin, SendMode::Serial] {
        let (mut s, mut rxs, log) = logged_stream(3);
        let data = vec![5u8; 20_000];
        let mut h = Heap::new();
        h.add_bytes(0x4300, &data[..]);
        let refs: Vec<HeapRef> = (0..90).map(|_| HeapRef::new(&h, 0)).collect();
        s.send_heaps(&refs, mode).unwrap();
        drop(s);
        let bursts = std::mem::take(&mut *log.lock().unwrap());
        let total: usize = bursts.iter().map(|b| b.1).sum();
        let mut per = [0usize; 3];
        for &(i, b) in &bursts {
            per[i] += b;
        }
        for p in per {
            let share = p as f64 / total as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.01, "{mode:?}: {per:?}");
        }
        let mut window = [0usize; 3];
        let (mut done, mut w) = (0, 1);
        for &(i, b) in &bursts {
            window[i] += b;
            done += b;
            if done * 6 >= w * total {
                let sum: usize = window.iter().sum();
                for c in window {
                    let share = c as f64 / sum as f64;
                    assert!(
                        (0.25..0.42).contains(&share),
                        "{mode:?}, sixth {w}: {window:?} bytes per interface"
                    );
                }
                window = [0; 3];
                w += 1;
            }
        }
        assert_eq!(w, 7, "six windows");
        let cnts = cnts_per_interface(&mut rxs);
        let n: usize = cnts.iter().map(|c| c.len()).sum();
        assert_eq!(n, 90, "{mode:?}: every heap on exactly one interface");
    }
}

/// Unequal lanes keep their shares to the end: four equal heaps (64 KiB, four bursts each)
/// over three interfaces are dealt, by hand, to interfaces 1, 2, 0 (in turn) and 1 again (all
/// tied, the next after 0), so interface 1 has twice the bytes of the others and must carry
/// half the bytes of each half of the call (the lane furthest behind its even spread sends
/// next). Taking the lane with the fewest bytes sent instead would give it a third of the
/// first three quarters and all of the last.
#[test]
fn unequal_lanes_keep_their_shares_to_the_end() {
    let (mut s, mut rxs, log) = logged_stream(3);
    let data = vec![6u8; 65_536];
    let mut h = Heap::new();
    h.add_bytes(0x4300, &data[..]);
    let refs: Vec<HeapRef> = (0..4).map(|_| HeapRef::new(&h, 0)).collect();
    s.send_heaps(&refs, SendMode::RoundRobin).unwrap();
    drop(s);
    let cnts = cnts_per_interface(&mut rxs);
    assert_eq!(cnts, [[3].into(), [1, 4].into(), [2].into()]);
    let bursts = std::mem::take(&mut *log.lock().unwrap());
    let total: usize = bursts.iter().map(|b| b.1).sum();
    let (mut done, mut on_1) = (0, 0);
    for &(i, b) in &bursts {
        if done * 2 >= total {
            break;
        }
        done += b;
        on_1 += if i == 1 { b } else { 0 };
    }
    let share = on_1 as f64 / done as f64;
    assert!(
        (share - 0.5).abs() < 0.1,
        "interface 1 carried {share:.3} of the first half"
    );
}
