//! Multi-NIC sending under load and through failures, over the `mem` transport: what each
//! interface carried is counted at its receiver, and heaps are checked by reassembling them
//! with the receive side (`spead::recv::HeapStream`, which drops duplicate packets), not by
//! the stream's own counters.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::heap::Heap;
use super::stream::{HeapRef, SendMode, SendStream, SendStreamConfig};
use crate::net::mem::{self, MemReceiver, MemSender};
use crate::net::{LinkDown, PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};
use crate::spead::items::ItemValue;
use crate::spead::recv::{HeapStream, HeapStreamConfig};
use crate::spead::wire::ParsedPacket;

const ITEM: u64 = 0x4300;
/// The streams' burst size: two 8 KiB packets.
const BURST: usize = 16384;

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
        burst_size: BURST,
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
/// interfaces, rate-limited (fast, so the test is quick) and unlimited; every heap arrives
/// whole. The bound on the bytes per interface, whatever the timing: the least-carrying
/// interface takes the next heap (`super::balance`), so no two interfaces ever differ by more
/// than the largest heap (measured here from the packets received). That is 49.2 KB against
/// about 2.46 MB each, 2 %: an interface 10 % short (246 KB) fails. The choice by the
/// limiters' schedules that the stream once had failed the old bound of 2 % of the mean in 20
/// of 30 optimised runs: ±2.4 %, 113 KB apart.
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
        let mut heap_bytes = BTreeMap::<u64, usize>::new();
        for p in packets.iter().flatten() {
            let cnt = ParsedPacket::parse(p).unwrap().repr.heap_cnt;
            *heap_bytes.entry(cnt).or_default() += p.len();
        }
        let largest = heap_bytes.values().max().unwrap();
        let spread = per.iter().max().unwrap() - per.iter().min().unwrap();
        assert!(
            spread <= *largest,
            "rate {rate}: {per:?} bytes, largest heap {largest} B"
        );
        let heaps = reassemble(&packets);
        assert_eq!(heaps.len(), 300);
        for (i, (cnt, data)) in heaps.iter().enumerate() {
            assert_eq!((*cnt, data), (i as u64 + 1, &heap_data(i)));
        }
    }
}

/// One call's heaps are dealt to the interfaces by the bytes their packets take, headers
/// included: a heap of 4,000 payload bytes, then nine of one byte and 500 immediate items
/// (HEAP_LENGTH 1, about 4 KB of item pointers on the wire), over two interfaces. Dealt by
/// HEAP_LENGTH, as the stream once did, the nine all went to the second interface (36 KB
/// against 4 KB); by the wire the two end within one heap of each other.
#[test]
fn one_call_is_dealt_by_wire_bytes_not_heap_length() {
    let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| mem::channel(1000, 1)).unzip();
    let mut s = SendStream::new(config(0.0, Duration::from_secs(1)), txs).unwrap();
    let payload = vec![0x11u8; 4000];
    let mut big = Heap::new();
    big.add_bytes(ITEM, &payload[..]);
    let mut pointers = Heap::new();
    for i in 0..500 {
        pointers.add_immediate(0x5000 + i, i);
    }
    pointers.add_bytes(ITEM, &[0x22u8][..]);
    let mut heaps = vec![HeapRef::new(&big, 0)];
    heaps.extend((0..9).map(|_| HeapRef::new(&pointers, 0)));
    s.send_heaps(&heaps, SendMode::Serial).unwrap();
    drop(s);
    let per: Vec<usize> = rxs.iter_mut().map(|r| bytes_of(&drain(r))).collect();
    let largest = 8 + 505 * 8 + 1;
    assert!(
        per[0].abs_diff(per[1]) <= largest,
        "{per:?} bytes per interface, largest heap {largest} B"
    );
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

/// What the test tells a [`Holding`] NIC, and what it dropped.
#[derive(Default)]
struct Link {
    /// Batches it takes before its link fails at the next send.
    accept: Option<usize>,
    /// Its link fails at the next `wait_sent` that finds packets held.
    fail_at_wait: bool,
    down: bool,
    /// Packets it had taken and dropped when its link failed, in order.
    dropped: Vec<Vec<u8>>,
}

/// A NIC that holds the packets it takes until `wait_sent` (as an RDMA NIC reads them only
/// when it gets to them, and says so by its completions) and whose link the test can fail:
/// then it drops what it holds and reports how many in a `LinkDown`, as `net::ibv` does, and
/// fails every send (taking nothing) until healed.
struct Holding {
    inner: MemSender,
    held: Vec<Vec<u8>>,
    link: Arc<Mutex<Link>>,
}

impl Holding {
    fn new(inner: MemSender) -> (Holding, Arc<Mutex<Link>>) {
        let link = Arc::new(Mutex::new(Link::default()));
        let nic = Holding {
            inner,
            held: Vec::new(),
            link: Arc::clone(&link),
        };
        (nic, link)
    }

    fn fail(&mut self, link: &mut Link) -> io::Error {
        link.down = true;
        let packets = self.held.len() as u64;
        link.dropped.append(&mut self.held);
        LinkDown {
            packets,
            cause: "test link down".into(),
        }
        .into_io()
    }
}

impl PacketSender for Holding {
    fn destinations(&self) -> usize {
        self.inner.destinations()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let link = Arc::clone(&self.link);
        let mut link = link.lock().unwrap();
        if link.down {
            return Err(self.fail(&mut link));
        }
        match &mut link.accept {
            Some(0) => return Err(self.fail(&mut link)),
            Some(n) => *n -= 1,
            None => {}
        }
        self.held.extend((0..batch.len()).map(|i| batch.to_vec(i)));
        Ok(())
    }

    fn wait_sent(&mut self) -> io::Result<()> {
        let link = Arc::clone(&self.link);
        let mut link = link.lock().unwrap();
        if link.fail_at_wait && !self.held.is_empty() {
            return Err(self.fail(&mut link));
        }
        let mut b = SendBatch::default();
        for p in &self.held {
            b.push_packet(p, 0);
        }
        self.inner.send_batch(&b)?;
        self.held.clear();
        Ok(())
    }
}

/// The heap counters of `packets`, parsed by the receive side's parser.
fn cnts(packets: &[Vec<u8>]) -> BTreeSet<u64> {
    packets
        .iter()
        .map(|p| ParsedPacket::parse(p).unwrap().repr.heap_cnt)
        .collect()
}

/// Heaps reassembled from `packets`: (cnt → item payload of the complete ones, cnts of the
/// incomplete ones).
fn reassemble_some(packets: &[Vec<Vec<u8>>]) -> (BTreeMap<u64, Vec<u8>>, BTreeSet<u64>) {
    let mut hs = HeapStream::new(HeapStreamConfig {
        max_heaps: 1 << 16,
        ..Default::default()
    });
    let mut out = Vec::new();
    for p in packets.iter().flatten() {
        hs.add_packet(p, &mut out);
    }
    hs.flush(&mut out);
    let (mut whole, mut broken) = (BTreeMap::new(), BTreeSet::new());
    for h in out {
        if !h.complete {
            broken.insert(h.cnt);
            continue;
        }
        let Some(ItemValue::Bytes(b)) = h.item(ITEM) else {
            panic!("heap {} has no item", h.cnt);
        };
        whole.insert(h.cnt, b.to_vec());
    }
    (whole, broken)
}

/// A link fails while its NIC holds a whole heap's packets, found at the wait for their
/// completions (how `--use-peerdirect` sends: one call, then `wait_sent`): the stream does not
/// fail; the interface goes down once; the packets the NIC dropped (as it recorded them) and
/// their heap are counted against it; the other interface carries every later heap; and the
/// receiver gets every heap whole except the dropped one, which never arrives.
#[test]
fn a_link_lost_at_the_completion_wait_counts_its_heap_and_carries_on() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (tx1, mut rx1) = mem::channel(100_000, 1);
    let (n0, _) = Holding::new(tx0);
    let (n1, link1) = Holding::new(tx1);
    let mut s = SendStream::new(config(0.0, Duration::from_secs(3600)), vec![n0, n1]).unwrap();
    for k in 0..40 {
        if k == 20 {
            link1.lock().unwrap().fail_at_wait = true;
        }
        send(&mut s, k..k + 1);
        s.wait_sent().unwrap();
    }
    let dropped = std::mem::take(&mut link1.lock().unwrap().dropped);
    let lost = cnts(&dropped);
    assert_eq!(lost.len(), 1, "one call, one heap, was held: {lost:?}");
    assert!(*lost.first().unwrap() > 20, "failed only once armed");
    let c = s.counters();
    assert_eq!((c.heaps, c.lost_heaps), (40, 0));
    let ifaces: Vec<_> = s.interfaces().map(|(_, c)| c).collect();
    assert_eq!((ifaces[0].downs, ifaces[0].lost_packets), (0, 0));
    assert_eq!(ifaces[1].downs, 1);
    assert!(!ifaces[1].live);
    assert_eq!(ifaces[1].lost_packets, dropped.len() as u64);
    assert_eq!(ifaces[1].lost_heaps, 1);
    drop(s);
    let (whole, broken) = reassemble_some(&[drain(&mut rx0), drain(&mut rx1)]);
    assert!(broken.is_empty(), "{broken:?}");
    let want: BTreeSet<u64> = (1..=40).filter(|c| !lost.contains(c)).collect();
    assert_eq!(whole.keys().copied().collect::<BTreeSet<_>>(), want);
    for (cnt, data) in &whole {
        assert_eq!(data, &heap_data(*cnt as usize - 1));
    }
}

/// A link fails part-way through a call of three heaps sent round-robin, after its NIC took
/// two bursts of it (4 packets: bursts of 16 KiB are two 8 KiB packets): the failing burst and
/// the rest go out on the other interface, the 4 packets are counted lost with the heaps they
/// carry pieces of, and exactly those heaps arrive incomplete; every other heap is whole. The
/// call's heaps are dealt over both interfaces (`super::stream`), by hand: heap 1 (cnt 1) to
/// interface 1 (the first in turn), heap 2 to interface 0, heap 3 to 1 (a tie, in turn), so
/// the failing interface carried cnts 1 and 3, a packet of each in both bursts. (When a call
/// went whole to one interface, all three heaps were on it and all three were lost.)
#[test]
fn a_link_lost_mid_call_counts_the_call_and_carries_on() {
    let (tx0, mut rx0) = mem::channel(100_000, 1);
    let (tx1, mut rx1) = mem::channel(100_000, 1);
    let (n0, _) = Holding::new(tx0);
    let (n1, link1) = Holding::new(tx1);
    link1.lock().unwrap().accept = Some(2);
    let mut s = SendStream::new(config(0.0, Duration::from_secs(3600)), vec![n0, n1]).unwrap();
    let data: Vec<Vec<u8>> = (0..30).map(|k| vec![k as u8; 40_000]).collect();
    for call in data.chunks(3) {
        let heaps: Vec<Heap> = call
            .iter()
            .map(|d| {
                let mut h = Heap::new();
                h.add_bytes(ITEM, &d[..]);
                h
            })
            .collect();
        let refs: Vec<HeapRef> = heaps.iter().map(|h| HeapRef::new(h, 0)).collect();
        s.send_heaps(&refs, SendMode::RoundRobin).unwrap();
        s.wait_sent().unwrap();
    }
    let dropped = std::mem::take(&mut link1.lock().unwrap().dropped);
    assert_eq!(dropped.len(), 4);
    let lost = cnts(&dropped);
    assert_eq!(lost, BTreeSet::from([1, 3]));
    let ifaces: Vec<_> = s.interfaces().map(|(_, c)| c).collect();
    assert_eq!((ifaces[1].downs, ifaces[1].lost_packets), (1, 4));
    assert_eq!(ifaces[1].lost_heaps, 2);
    assert_eq!((ifaces[0].downs, ifaces[0].lost_heaps), (0, 0));
    assert_eq!(s.counters().lost_heaps, 0);
    drop(s);
    let (whole, broken) = reassemble_some(&[drain(&mut rx0), drain(&mut rx1)]);
    assert_eq!(broken, lost);
    assert_eq!(whole.len(), 28);
    for (cnt, d) in &whole {
        assert_eq!(d, &data[*cnt as usize - 1]);
    }
}
