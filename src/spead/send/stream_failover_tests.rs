//! Multi-NIC sending under load and through failures, over the `mem` transport: what each
//! interface carried is counted at its receiver, and heaps are checked by reassembling them
//! with the receive side (`spead::recv::HeapStream`, which drops duplicate packets), not by
//! the stream's own counters.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::heap::Heap;
use super::stream::{HeapRef, SendMode, SendStream, SendStreamConfig};
use crate::net::mem::{self, MemReceiver, MemSender};
use crate::net::{PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};
use crate::spead::items::ItemValue;
use crate::spead::recv::{HeapStream, HeapStreamConfig};

const ITEM: u64 = 0x4300;

/// A NIC that works until its packet budget is spent, then fails with ENETDOWN, part-way
/// through a batch if the budget ends there (what a link going down mid-`sendmmsg` does:
/// the packets before the error are on the wire). `heal` gives it an unlimited budget again.
struct Flaky {
    inner: MemSender,
    budget: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(inner: MemSender) -> (Flaky, Arc<AtomicUsize>) {
        let budget = Arc::new(AtomicUsize::new(usize::MAX));
        (
            Flaky {
                inner,
                budget: Arc::clone(&budget),
            },
            budget,
        )
    }
}

impl PacketSender for Flaky {
    fn destinations(&self) -> usize {
        self.inner.destinations()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let left = self.budget.load(Ordering::Relaxed);
        if left >= batch.len() {
            self.budget
                .store(left.saturating_sub(batch.len()), Ordering::Relaxed);
            return self.inner.send_batch(batch);
        }
        // Send the first `left` packets, then fail.
        let mut part = SendBatch::default();
        let copies: Vec<Vec<u8>> = (0..left).map(|i| batch.to_vec(i)).collect();
        for (i, c) in copies.iter().enumerate() {
            part.push_packet(c, batch.packet(i).dest);
        }
        self.inner.send_batch(&part)?;
        self.budget.store(0, Ordering::Relaxed);
        Err(io::Error::from_raw_os_error(libc::ENETDOWN))
    }
}

fn drain(rx: &mut MemReceiver) -> Vec<Vec<u8>> {
    let mut b = RecvBatch::new(256, 9200);
    let mut v = Vec::new();
    while let Ok(Received::Packets(_)) = rx.recv_batch(&mut b) {
        v.extend(b.iter().map(|p| p.to_vec()));
    }
    v
}

/// Heap sizes from 1 to 48 KiB in a pattern that does not divide by the interface count.
fn heap_data(k: usize) -> Vec<u8> {
    let len = 1 + (k * 40_503) % 49_152;
    (0..len).map(|i| (i + 7 * k) as u8).collect()
}

/// Reassemble every packet of every receiver; returns heap cnt → payload of the item, and
/// fails the test on an incomplete heap.
fn reassemble(packets: &[Vec<Vec<u8>>]) -> BTreeMap<u64, Vec<u8>> {
    let mut hs = HeapStream::new(HeapStreamConfig {
        max_heaps: 1 << 16,
        ..Default::default()
    });
    let mut out = Vec::new();
    for p in packets.iter().flatten() {
        hs.add_packet(p, &mut out);
    }
    hs.flush(&mut out);
    let mut heaps = BTreeMap::new();
    for h in out {
        assert!(h.complete, "heap {} incomplete", h.cnt);
        let Some(ItemValue::Bytes(b)) = h.item(ITEM) else {
            panic!("heap {} has no item", h.cnt);
        };
        assert!(
            heaps.insert(h.cnt, b.to_vec()).is_none(),
            "heap {} twice",
            h.cnt
        );
    }
    heaps
}

fn config(rate: f64, retry: Duration) -> SendStreamConfig {
    SendStreamConfig {
        rate,
        max_packet_size: 8192 + 72,
        burst_size: 16384,
        interface_retry: retry,
        ..Default::default()
    }
}

/// Send heaps `range`, one call each.
fn send<S: PacketSender>(s: &mut SendStream<S>, range: std::ops::Range<usize>) {
    for k in range {
        let data = heap_data(k);
        let mut h = Heap::new();
        h.add_bytes(ITEM, &data[..]);
        s.send_heaps(&[HeapRef::new(&h, 0)], SendMode::Serial)
            .unwrap();
    }
}

fn bytes_of(packets: &[Vec<u8>]) -> usize {
    packets.iter().map(Vec::len).sum()
}

/// Under load (the sender always has a heap ready), uneven heaps spread over three
/// interfaces with bytes per interface within 2 % of the mean, rate-limited (fast, so the
/// test is quick) and unlimited; every heap arrives whole.
#[test]
fn bytes_balance_over_three_interfaces_under_load() {
    for rate in [4e9, 0.0] {
        let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| mem::channel(100_000, 1)).unzip();
        let mut s = SendStream::new(config(rate, Duration::from_secs(1)), txs).unwrap();
        send(&mut s, 0..300);
        assert_eq!(s.counters().heaps, 300);
        drop(s);
        let packets: Vec<Vec<Vec<u8>>> = rxs.iter_mut().map(drain).collect();
        let per: Vec<usize> = packets.iter().map(|p| bytes_of(p)).collect();
        let mean = per.iter().sum::<usize>() as f64 / 3.0;
        for &b in &per {
            assert!((b as f64 / mean - 1.0).abs() < 0.02, "rate {rate}: {per:?}");
        }
        let heaps = reassemble(&packets);
        assert_eq!(heaps.len(), 300);
        for (i, (cnt, data)) in heaps.iter().enumerate() {
            assert_eq!((*cnt, data), (i as u64 + 1, &heap_data(i)));
        }
    }
}

/// One of three interfaces goes down mid-run, part-way through a burst: the burst is sent
/// again on another, the others carry every remaining heap (balanced between them), nothing
/// is lost, and the failure is counted once.
#[test]
fn one_interface_down_the_others_carry_every_heap() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (tx1, mut rx1) = mem::channel(100_000, 1);
    let (tx2, mut rx2) = mem::channel(100_000, 1);
    let (flaky, budget) = Flaky::new(tx1);
    let txs: Vec<Box<dyn PacketSender>> = vec![Box::new(tx0), Box::new(flaky), Box::new(tx2)];
    let mut s = SendStream::new(config(0.0, Duration::from_secs(3600)), txs).unwrap();
    s.set_interface_names(&["a".into(), "b".into(), "c".into()]);
    send(&mut s, 0..60);
    let before = [&mut rx0, &mut rx1, &mut rx2].map(drain);
    assert!(
        before.iter().all(|p| !p.is_empty()),
        "all three carried heaps"
    );
    // Down after 3 more packets: mid-burst for a 16 KiB burst of 8 KiB packets.
    budget.store(3, Ordering::Relaxed);
    send(&mut s, 60..300);
    let c = s.counters();
    assert_eq!((c.heaps, c.lost_heaps), (300, 0));
    let ifaces: Vec<_> = s.interfaces().map(|(n, c)| (n.to_string(), c)).collect();
    assert_eq!(ifaces[1].0, "b");
    assert_eq!((ifaces[1].1.downs, ifaces[1].1.live), (1, false));
    assert!(ifaces[0].1.live && ifaces[2].1.live && ifaces[0].1.downs == 0);
    drop(s);
    let after = [&mut rx0, &mut rx1, &mut rx2].map(drain);
    assert!(
        after[1].len() <= 3,
        "b sent {} packets after its budget",
        after[1].len()
    );
    let (a, c) = (bytes_of(&after[0]) as f64, bytes_of(&after[2]) as f64);
    assert!((a / c - 1.0).abs() < 0.05, "a {a} c {c}");
    let all: Vec<Vec<Vec<u8>>> = before.into_iter().chain(after).collect();
    let heaps = reassemble(&all);
    assert_eq!(heaps.len(), 300);
    for (i, (cnt, data)) in heaps.iter().enumerate() {
        assert_eq!((*cnt, data), (i as u64 + 1, &heap_data(i)));
    }
}

/// A failed interface is tried again after the retry interval: while it still fails the
/// others carry on (a failed trial is a failure, not a new down), and once it works it
/// carries its share again.
#[test]
fn a_failed_interface_comes_back_after_retry() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (tx1, mut rx1) = mem::channel(100_000, 1);
    let (flaky, budget) = Flaky::new(tx1);
    budget.store(0, Ordering::Relaxed);
    let txs: Vec<Box<dyn PacketSender>> = vec![Box::new(tx0), Box::new(flaky)];
    // No retry delay: every call may try the failed interface again.
    let mut s = SendStream::new(config(0.0, Duration::ZERO), txs).unwrap();
    send(&mut s, 0..40);
    let c1 = s.interfaces().nth(1).unwrap().1;
    assert_eq!(c1.downs, 1);
    assert!(c1.failures > 1, "{c1:?}");
    assert!(drain(&mut rx1).is_empty());
    budget.store(usize::MAX, Ordering::Relaxed);
    send(&mut s, 40..80);
    let c1 = s.interfaces().nth(1).unwrap().1;
    assert!(c1.live && c1.downs == 1 && c1.bytes > 0, "{c1:?}");
    assert_eq!(s.counters().lost_heaps, 0);
    drop(s);
    let heaps = reassemble(&[drain(&mut rx0), drain(&mut rx1)]);
    assert_eq!(heaps.len(), 80);
}

/// With every interface down the stream does not fail: the heaps are counted as lost, and
/// sending resumes when an interface comes back. Descriptors (`send_heaps_first`) go to the
/// first live interface.
#[test]
fn all_down_counts_heaps_lost_and_carries_on() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (tx1, mut rx1) = mem::channel(100_000, 1);
    let (f0, b0) = Flaky::new(tx0);
    let (f1, b1) = Flaky::new(tx1);
    b0.store(0, Ordering::Relaxed);
    let retry = Duration::from_secs(3600);
    let mut s = SendStream::new(config(1e9, retry), vec![f0, f1]).unwrap();
    let mut d = Heap::new();
    d.add_bytes(ITEM, &[9u8; 10][..]);
    s.send_heaps_first(&[HeapRef::new(&d, 0)], SendMode::Serial)
        .unwrap();
    assert_eq!(
        s.counters().heaps,
        1,
        "the descriptor went out on the second"
    );
    b1.store(0, Ordering::Relaxed);
    send(&mut s, 0..10);
    let c = s.counters();
    assert_eq!((c.heaps, c.lost_heaps), (1, 10));
    assert!(s.interfaces().all(|(_, c)| !c.live));
    // Nothing is tried before the retry time: the budgets are not touched.
    b0.store(usize::MAX, Ordering::Relaxed);
    send(&mut s, 10..12);
    assert_eq!(s.counters().lost_heaps, 12);
    drop(s);
    assert!(drain(&mut rx0).is_empty());
    assert_eq!(reassemble(&[drain(&mut rx1)]).len(), 1);
}

/// Same, but the links come back: a retry finds them and nothing more is lost.
#[test]
fn all_down_then_back() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (f0, b0) = Flaky::new(tx0);
    b0.store(0, Ordering::Relaxed);
    let mut s = SendStream::new(config(0.0, Duration::ZERO), vec![f0]).unwrap();
    send(&mut s, 0..5);
    assert_eq!(s.counters().lost_heaps, 5);
    b0.store(usize::MAX, Ordering::Relaxed);
    send(&mut s, 5..10);
    let c = s.counters();
    assert_eq!((c.heaps, c.lost_heaps), (5, 5));
    assert!(s.interfaces().all(|(_, c)| c.live));
    drop(s);
    let heaps = reassemble(&[drain(&mut rx0)]);
    assert_eq!(
        heaps.keys().copied().collect::<Vec<_>>(),
        (6..=10).collect::<Vec<_>>()
    );
}
