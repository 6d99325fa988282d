//! The send thread with heaps left in (fake) GPU memory (`--use-peerdirect`), driven the way an
//! engine drives it: output slots written only once their lease is back (`engine::lease`),
//! then lent to the thread. Fake NICs hold the packets they take until `wait_sent` and only
//! then read their device payload (as an RDMA NIC reads GPU memory when it gets to a request),
//! and their links can be made to fail with packets of a heap outstanding.
//!
//! What is checked comes from outside the code under test: every read of GPU memory asserts
//! that the slot is lent at that moment (a slot is never rewritten while the NIC may read it);
//! the engine's wait for a slot must end (no lease leaks and the ring never runs dry); heaps
//! are reassembled from the packets the NICs put on the wire by the receive side
//! (`spead::recv::HeapStream`) and their payload compared with what the engine wrote; and the
//! loss counters are compared with packet counts worked out from the heap format by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::engine::lease::Ledger;
use crate::net::{LinkDown, SendBatch};
use crate::spead::items::ItemValue;
use crate::spead::recv::{HeapStream, HeapStreamConfig};
use crate::spead::send::SendStreamConfig;

/// Item ids of the test heaps: the heap's index (what the engine wrote) and its payload.
const INDEX_ID: u64 = 0x1600;
const DATA_ID: u64 = 0x1601;
/// Output slots, destinations, and bytes per destination in a slot.
const SLOTS: usize = 3;
const DESTS: usize = 2;
const PART: usize = 20_000;
const SLOT_BYTES: usize = DESTS * PART;
/// Where the fake GPU memory lies.
const DEV_ADDR: u64 = 1 << 40;
/// Packets of one destination's heap: a header of 8 + 8 × (4 + 2) bytes in every packet
/// (pointers repeated), 8192-byte payloads, 20000 bytes: 8192 + 8192 + 3616.
const PACKETS_PER_HEAP: u64 = 3;

/// One heap per destination: the engine's heap index as an immediate, and the destination's
/// part of the buffer (as the F-engine's heaps, but owing nothing to its format).
struct SlotFormat;

impl HeapFormat for SlotFormat {
    type Meta = u64;

    fn substreams(&self) -> usize {
        DESTS
    }

    fn heap<'a>(&self, data: &'a [u8], meta: &u64, s: usize) -> Option<Heap<'a>> {
        let mut h = Heap::new();
        h.repeat_pointers = true;
        h.add_immediate(INDEX_ID, *meta)
            .add_bytes(DATA_ID, &data[s * PART..(s + 1) * PART]);
        Some(h)
    }

    fn device_heap(
        &self,
        data: DeviceBytes,
        meta: &u64,
        s: usize,
    ) -> Result<Option<Heap<'static>>, String> {
        let mut h = Heap::new();
        h.repeat_pointers = true;
        h.add_immediate(INDEX_ID, *meta)
            .add_device(DATA_ID, data.slice(s * PART, PART).ok_or("outside")?);
        Ok(Some(h))
    }

    fn descriptors(&self, s: usize) -> Heap<'static> {
        let mut h = Heap::new();
        h.add_immediate(INDEX_ID + 2, s as u64);
        h
    }
}

fn config(retry: Duration) -> SendStreamConfig {
    SendStreamConfig {
        max_packet_size: 8192 + 56,
        // Two packets a burst.
        burst_size: 16384,
        interface_retry: retry,
        ..Default::default()
    }
}

/// Descriptors at start-up only (the next set an hour away).
fn start_up_descriptors() -> DescriptorSchedule {
    DescriptorSchedule {
        first: Instant::now() + Duration::from_secs(3600),
        period: Duration::from_secs(3600),
    }
}

fn spawn(nics: Vec<NetSender>, retry: Duration, buffers: usize) -> HeapSink<u64> {
    let mut stream = SendStream::new(config(retry), nics).unwrap();
    stream.set_interface_names(&["a".into(), "b".into()]);
    let schedule = start_up_descriptors();
    let thread = SendThread {
        name: "test-tx".into(),
        core: None,
    };
    HeapSink::spawn(
        thread,
        stream,
        SlotFormat,
        schedule,
        buffers,
        0,
        &Shutdown::manual(),
    )
    .unwrap()
}

/// The byte heap `index` has at `offset` of its slot.
fn pattern(index: u64, offset: usize) -> u8 {
    (index as usize * 97 + offset * 31 % 251) as u8
}

/// GPU memory as the engine writes it and the NICs read it: `SLOTS` slots, each lent while
/// its heaps are sent.
struct Gpu {
    bytes: Mutex<Vec<u8>>,
    ledger: Ledger,
}

impl Gpu {
    fn new() -> Arc<Gpu> {
        Arc::new(Gpu {
            bytes: Mutex::new(vec![0; SLOTS * SLOT_BYTES]),
            ledger: Ledger::new(SLOTS),
        })
    }

    /// Write heap `index` into `slot` (the engine's compute), which must not be lent.
    fn write(&self, slot: usize, index: u64) {
        assert!(!self.ledger.lent(slot), "slot {slot} rewritten while lent");
        let mut b = self.bytes.lock().unwrap();
        for (k, v) in b[slot * SLOT_BYTES..(slot + 1) * SLOT_BYTES]
            .iter_mut()
            .enumerate()
        {
            *v = pattern(index, k);
        }
    }

    /// What a NIC reads at `d`, which must lie in a lent slot.
    fn read(&self, d: DeviceBytes) -> Vec<u8> {
        let at = (d.addr - DEV_ADDR) as usize;
        let slot = at / SLOT_BYTES;
        assert_eq!((at + d.len - 1) / SLOT_BYTES, slot, "a read across slots");
        assert!(
            self.ledger.lent(slot),
            "slot {slot} read after it was given back"
        );
        self.bytes.lock().unwrap()[at..at + d.len].to_vec()
    }

    /// The heap index in `slot` (its first bytes are the pattern of that index).
    fn index_in(&self, slot: usize) -> u64 {
        let b = self.bytes.lock().unwrap();
        let first = b[slot * SLOT_BYTES];
        (0..u64::MAX).find(|&i| pattern(i, 0) == first).unwrap()
    }
}

/// What the test tells a fake NIC, and what it did.
#[derive(Default)]
struct Script {
    /// Its link fails at the wait for the completions of a heap with at least this index.
    fail_at_wait_from: Option<u64>,
    /// Its link fails at a send of a heap with at least this index, after taking this many
    /// bursts of it.
    fail_at_send_from: Option<(u64, usize)>,
    /// Its link is down for heaps from `.0` up to (not including) `.1`.
    down_for: Option<(u64, u64)>,
    /// Whether the link is down now (failed by the script, until a heap outside `down_for`).
    down: bool,
    /// Its wait fails with an error that is not a link's (which stops the send thread).
    broken: bool,
    /// Whether every slot it held packets of was still lent when it was dropped.
    lent_at_drop: Option<bool>,
    /// The heap indices of the packets it had taken and dropped when its link failed.
    dropped: Vec<u64>,
}

/// A NIC of one interface: takes packets (their host bytes, and where their device payload
/// lies) and holds them; at `wait_sent` reads their payload from the GPU and puts them on the
/// wire. When its link fails it drops what it holds (reading none of it) and reports how many
/// (`LinkDown`), as `net::ibv` does, and takes nothing while down.
struct FakeNic {
    gpu: Arc<Gpu>,
    wire: Arc<Mutex<Vec<Vec<u8>>>>,
    held: Vec<(Vec<u8>, Option<DeviceBytes>)>,
    script: Arc<Mutex<Script>>,
}

impl FakeNic {
    fn new(gpu: &Arc<Gpu>, wire: &Arc<Mutex<Vec<Vec<u8>>>>) -> (FakeNic, Arc<Mutex<Script>>) {
        let script = Arc::new(Mutex::new(Script::default()));
        let nic = FakeNic {
            gpu: Arc::clone(gpu),
            wire: Arc::clone(wire),
            held: Vec::new(),
            script: Arc::clone(&script),
        };
        (nic, script)
    }

    /// The heap index of a packet's payload, if it has device payload.
    fn index(&self, d: Option<DeviceBytes>) -> Option<u64> {
        d.map(|d| self.gpu.index_in((d.addr - DEV_ADDR) as usize / SLOT_BYTES))
    }

    fn fail(&mut self, script: &mut Script) -> io::Error {
        script.down = true;
        let packets = self.held.len() as u64;
        for (_, d) in std::mem::take(&mut self.held) {
            let index = self.index(d).expect("only device packets are held here");
            script.dropped.push(index);
        }
        LinkDown {
            packets,
            cause: "test link down".into(),
        }
        .into_io()
    }
}

impl PacketSender for FakeNic {
    fn destinations(&self) -> usize {
        DESTS
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let script = Arc::clone(&self.script);
        let mut script = script.lock().unwrap();
        let index = self.index(batch.packet(0).device);
        if let (Some(i), Some((from, to))) = (index, script.down_for) {
            script.down = (from..to).contains(&i);
        }
        if script.down {
            return Err(self.fail(&mut script));
        }
        if let (Some(i), Some((from, bursts))) = (index, script.fail_at_send_from.as_mut()) {
            if i >= *from {
                if *bursts == 0 {
                    script.fail_at_send_from = None;
                    return Err(self.fail(&mut script));
                }
                *bursts -= 1;
            }
        }
        for i in 0..batch.len() {
            self.held.push((batch.to_vec(i), batch.packet(i).device));
        }
        Ok(())
    }

    fn wait_sent(&mut self) -> io::Result<()> {
        let script = Arc::clone(&self.script);
        let mut script = script.lock().unwrap();
        if script.broken {
            return Err(io::Error::other("test: the NIC broke"));
        }
        let latest = self.held.iter().filter_map(|(_, d)| self.index(*d)).max();
        if let (Some(i), Some(from)) = (latest, script.fail_at_wait_from) {
            if i >= from {
                script.fail_at_wait_from = None;
                return Err(self.fail(&mut script));
            }
        }
        for (mut bytes, d) in std::mem::take(&mut self.held) {
            if let Some(d) = d {
                bytes.extend(self.gpu.read(d));
            }
            self.wire.lock().unwrap().push(bytes);
        }
        Ok(())
    }
}

impl Drop for FakeNic {
    fn drop(&mut self) {
        let slot = |d: DeviceBytes| (d.addr - DEV_ADDR) as usize / SLOT_BYTES;
        if !self.held.is_empty() {
            let lent = self
                .held
                .iter()
                .all(|(_, d)| d.is_none_or(|d| self.gpu.ledger.lent(slot(d))));
            if let Ok(mut s) = self.script.lock() {
                s.lent_at_drop = Some(lent);
            }
        }
    }
}

/// Play the engine: heaps `0..heaps` into the slots in ring order, each written only once the
/// slot's lease is back (within a bound far beyond any wait here: a leaked lease fails the
/// test instead of hanging it), then lent to the thread; at the end every slot is back.
fn run_engine(sink: &mut HeapSink<u64>, gpu: &Gpu, heaps: u64) {
    for index in 0..heaps {
        let slot = index as usize % SLOTS;
        gpu.ledger
            .wait_returned(slot, Duration::from_secs(60))
            .expect("a slot never came back: the ring ran dry");
        gpu.write(slot, index);
        let bytes = DeviceBytes {
            addr: DEV_ADDR + (slot * SLOT_BYTES) as u64,
            len: SLOT_BYTES,
        };
        let lease = gpu.ledger.lend(slot);
        sink.send_device(DevicePayload { bytes, lease }, index);
    }
    sink.join().expect("the send thread survives");
    for slot in 0..SLOTS {
        assert!(!gpu.ledger.lent(slot), "slot {slot} never given back");
    }
}

/// The wire's heaps, by (heap index, destination part): whole ones with their payload, and
/// the keys of incomplete ones.
type Arrived = (BTreeMap<(u64, usize), Vec<u8>>, BTreeSet<u64>);

/// The heaps reassembled from a wire's packets.
fn wire_heaps(wire: &Mutex<Vec<Vec<u8>>>) -> Vec<crate::spead::recv::ReceivedHeap> {
    let mut hs = HeapStream::new(HeapStreamConfig {
        max_heaps: 1 << 12,
        ..Default::default()
    });
    let mut out = Vec::new();
    for p in wire.lock().unwrap().iter() {
        hs.add_packet(p, &mut out);
    }
    hs.flush(&mut out);
    out
}

/// Which destination's part of heap `index` a whole heap carries (the one whose pattern it
/// holds), and its bytes, checked against what the engine wrote.
fn data_part(h: &crate::spead::recv::ReceivedHeap, index: u64) -> (usize, &[u8]) {
    let Some(ItemValue::Bytes(b)) = h.item(DATA_ID) else {
        panic!("heap {index} without data");
    };
    let part = (0..DESTS)
        .find(|&s| b[0] == pattern(index, s * PART))
        .unwrap();
    let want: Vec<u8> = (part * PART..(part + 1) * PART)
        .map(|k| pattern(index, k))
        .collect();
    assert_eq!(
        b,
        &want[..],
        "heap {index} part {part}: bytes not the engine's"
    );
    (part, b)
}

fn arrived(wire: &Mutex<Vec<Vec<u8>>>) -> Arrived {
    let out = wire_heaps(wire);
    let (mut whole, mut broken) = (BTreeMap::new(), BTreeSet::new());
    for h in out {
        let Some(ItemValue::Immediate(index)) = h.item(INDEX_ID) else {
            continue; // a descriptor heap
        };
        if !h.complete {
            broken.insert(index);
            continue;
        }
        let (part, b) = data_part(&h, index);
        assert!(whole.insert((index, part), b.to_vec()).is_none());
    }
    (whole, broken)
}

/// Every (index, part) of `indices`.
fn parts(indices: impl Iterator<Item = u64>) -> BTreeSet<(u64, usize)> {
    indices
        .flat_map(|i| (0..DESTS).map(move |s| (i, s)))
        .collect()
}

/// The (heap index, destination part) keys of heaps `0..heaps` that did not arrive whole.
fn missing_parts(whole: &BTreeMap<(u64, usize), Vec<u8>>, heaps: u64) -> BTreeSet<(u64, usize)> {
    parts(0..heaps)
        .into_iter()
        .filter(|k| !whole.contains_key(k))
        .collect()
}

/// A NIC that takes packets with device payload and completes them only when the test
/// says so (one `done` per `wait_sent`).
struct GatedNic {
    gathered: Sender<usize>,
    done: Receiver<()>,
}

impl PacketSender for GatedNic {
    fn destinations(&self) -> usize {
        DESTS
    }
    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let n = (0..batch.len())
            .filter(|&i| batch.packet(i).device.is_some())
            .count();
        let _ = self.gathered.send(n);
        Ok(())
    }
    fn wait_sent(&mut self) -> io::Result<()> {
        self.done.recv().map_err(|_| io::Error::other("test over"))
    }
}

/// The send thread gives a device buffer back only after the NIC's completions for every
/// packet gathered from it: while they are outstanding the buffer stays lent.
#[test]
fn a_device_buffer_returns_only_after_its_sends_complete() {
    let (gathered, packets) = crossbeam_channel::unbounded();
    let (complete, done) = crossbeam_channel::unbounded();
    let nic: NetSender = Box::new(GatedNic { gathered, done });
    let mut sink = spawn(vec![nic], Duration::from_secs(1), 2);
    // The descriptors at start-up are host heaps: no device packets.
    assert_eq!(packets.recv().unwrap(), 0);
    let ledger = Ledger::new(1);
    let bytes = DeviceBytes {
        addr: DEV_ADDR,
        len: SLOT_BYTES,
    };
    sink.send_device(
        DevicePayload {
            bytes,
            lease: ledger.lend(0),
        },
        1,
    );
    let mut sent = 0;
    while sent < DESTS as u64 * PACKETS_PER_HEAP {
        sent += packets.recv().unwrap() as u64;
    }
    assert_eq!(sent, 6);
    assert!(ledger.lent(0), "returned before the NIC completed");
    complete.send(()).unwrap();
    ledger.wait_returned(0, Duration::from_secs(60)).unwrap();
    drop(complete);
    sink.join().unwrap();
}

/// Interface b's link fails at the wait for the completions of a buffer whose packets it
/// holds (buffer 10, or the first after it, once b holds some): the thread carries on, the
/// buffer's slot comes back (only after b has dropped its packets: no read of it follows) and
/// is reused, every later heap goes out on a, and b's loss is counted: one down, the 3
/// packets of the one heap of the buffer b carried (a buffer's two heaps are dealt one to
/// each interface, `spead::send::stream`; 3 packets worked out from the format), that heap;
/// nothing counted against a. (When a buffer went whole to one interface, b held and lost
/// both heaps, 2 × 3 packets.)
#[test]
fn a_link_lost_at_the_completion_wait_is_absorbed() {
    let gpu = Gpu::new();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (a, _) = FakeNic::new(&gpu, &wire);
    let (b, script) = FakeNic::new(&gpu, &wire);
    script.lock().unwrap().fail_at_wait_from = Some(10);
    let mut sink = spawn(vec![Box::new(a), Box::new(b)], Duration::from_secs(3600), 8);
    let counters = sink.counters();
    run_engine(&mut sink, &gpu, 30);

    let dropped = std::mem::take(&mut script.lock().unwrap().dropped);
    let lost: BTreeSet<u64> = dropped.iter().copied().collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let lost_index = *lost.first().unwrap();
    assert!(lost_index >= 10);
    assert_eq!(dropped.len() as u64, PACKETS_PER_HEAP);
    let (whole, broken) = arrived(&wire);
    assert!(broken.is_empty(), "{broken:?}");
    let missing = missing_parts(&whole, 30);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing.first().unwrap().0, lost_index);

    let c = &counters;
    assert_eq!(c.buffers.load(Ordering::Relaxed), 30);
    assert_eq!(c.lost_heaps.load(Ordering::Relaxed), 0);
    let [ia, ib] = [&c.interfaces[0], &c.interfaces[1]];
    assert_eq!(
        (ib.name.as_str(), ib.downs.load(Ordering::Relaxed)),
        ("b", 1)
    );
    assert!(!ib.live.load(Ordering::Relaxed));
    assert_eq!(ib.lost_packets.load(Ordering::Relaxed), PACKETS_PER_HEAP);
    assert_eq!(ib.lost_heaps.load(Ordering::Relaxed), 1);
    assert_eq!(ia.downs.load(Ordering::Relaxed), 0);
    assert_eq!(ia.lost_packets.load(Ordering::Relaxed), 0);
    assert!(ia.live.load(Ordering::Relaxed));
}

/// Interface b's link fails in the middle of a heap, after it took one burst of it (2 of its
/// 3 packets: a buffer's two heaps are dealt one to each interface) and while they are
/// outstanding: the rest of the buffer goes out on a, the slot is held until a has read its
/// share, and b's 2 packets and their one heap are counted lost; that heap arrives incomplete
/// and every other heap whole. (When a buffer went whole to one interface, b's burst carried
/// a packet of each of the buffer's heaps, and both were lost.)
#[test]
fn a_link_lost_mid_heap_is_absorbed() {
    let gpu = Gpu::new();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (a, _) = FakeNic::new(&gpu, &wire);
    let (b, script) = FakeNic::new(&gpu, &wire);
    script.lock().unwrap().fail_at_send_from = Some((10, 1));
    let mut sink = spawn(vec![Box::new(a), Box::new(b)], Duration::from_secs(3600), 8);
    let counters = sink.counters();
    run_engine(&mut sink, &gpu, 30);

    let dropped = std::mem::take(&mut script.lock().unwrap().dropped);
    assert_eq!(dropped.len(), 2, "one burst of two packets");
    let lost_index = dropped[0];
    assert_eq!(dropped, [lost_index, lost_index]);
    let (whole, broken) = arrived(&wire);
    assert_eq!(broken, BTreeSet::from([lost_index]));
    let missing = missing_parts(&whole, 30);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing.first().unwrap().0, lost_index);

    let ib = &counters.interfaces[1];
    assert_eq!(ib.downs.load(Ordering::Relaxed), 1);
    assert_eq!(ib.lost_packets.load(Ordering::Relaxed), 2);
    assert_eq!(ib.lost_heaps.load(Ordering::Relaxed), 1);
    assert_eq!(
        counters.interfaces[0].lost_packets.load(Ordering::Relaxed),
        0
    );
    assert_eq!(counters.buffers.load(Ordering::Relaxed), 30);
}

/// Both links are down for heaps 8 to 15: those buffers' heaps are dropped and counted as
/// lost for want of an interface (2 each), their slots come back at once so the engine goes
/// on, nothing is counted as lost in flight (nothing was held), and once the links are back
/// (tried again at every call) heaps 16 on arrive whole.
#[test]
fn with_every_link_down_heaps_are_dropped_counted_and_never_waited_for() {
    let gpu = Gpu::new();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (a, sa) = FakeNic::new(&gpu, &wire);
    let (b, sb) = FakeNic::new(&gpu, &wire);
    for s in [&sa, &sb] {
        s.lock().unwrap().down_for = Some((8, 16));
    }
    let mut sink = spawn(vec![Box::new(a), Box::new(b)], Duration::ZERO, 8);
    let counters = sink.counters();
    run_engine(&mut sink, &gpu, 24);

    let (whole, broken) = arrived(&wire);
    assert!(broken.is_empty(), "{broken:?}");
    let want = parts((0..8).chain(16..24));
    assert_eq!(whole.keys().copied().collect::<BTreeSet<_>>(), want);
    assert_eq!(
        counters.lost_heaps.load(Ordering::Relaxed),
        8 * DESTS as u64
    );
    assert_eq!(counters.buffers.load(Ordering::Relaxed), 24);
    for i in &counters.interfaces {
        assert_eq!(i.downs.load(Ordering::Relaxed), 1, "{}", i.name);
        assert_eq!(i.lost_packets.load(Ordering::Relaxed), 0);
        assert!(i.live.load(Ordering::Relaxed), "{} back", i.name);
    }
    assert!(sa.lock().unwrap().dropped.is_empty());
}

/// A NIC error that is not a link's stops the thread with that error; every buffer comes
/// back, the one whose packets the NIC still held only after the NIC itself is gone (it
/// could still read it until then), and the engine's waits all end.
#[test]
fn a_thread_stopped_by_an_error_gives_every_buffer_back_after_its_nics() {
    let gpu = Gpu::new();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (a, script) = FakeNic::new(&gpu, &wire);
    script.lock().unwrap().broken = true;
    let mut sink = spawn(vec![Box::new(a)], Duration::from_secs(3600), 8);
    for index in 0..2 * SLOTS as u64 {
        let slot = index as usize % SLOTS;
        gpu.ledger
            .wait_returned(slot, Duration::from_secs(60))
            .expect("a slot never came back");
        gpu.write(slot, index);
        let bytes = DeviceBytes {
            addr: DEV_ADDR + (slot * SLOT_BYTES) as u64,
            len: SLOT_BYTES,
        };
        let lease = gpu.ledger.lend(slot);
        sink.send_device(DevicePayload { bytes, lease }, index);
    }
    let e = sink.join().unwrap_err();
    assert!(e.to_string().contains("the NIC broke"), "{e}");
    for slot in 0..SLOTS {
        assert!(!gpu.ledger.lent(slot), "slot {slot} never given back");
    }
    assert_eq!(script.lock().unwrap().lent_at_drop, Some(true));
}

#[path = "send_sink_threads_tests.rs"]
mod threads;
