//! An output's several send threads (`HeapSink::spawn_threads`), on the host-buffer path the
//! engines use with kernel sockets: every thread made to send, every heap once with its own
//! counter, one set of descriptors, counts that add up; and one thread's failure stopping the
//! output without leaving the engine waiting; and one thread over two interfaces putting its
//! descriptors on the first. Helpers (the heap format, the patterns, the
//! reassembly of a wire) are the parent module's.

use super::*;

/// A NIC of one send thread that puts host packets on its own wire at once. Its first send
/// waits (up to 10 s) until every NIC of the test has one to send, so that each thread has
/// taken a buffer before any finishes (otherwise one fast thread could take them all and the
/// test would say nothing about the others); with `broken` its first send fails with an error
/// that is not a link's, which stops its thread.
struct WireNic {
    wire: Arc<Mutex<Vec<Vec<u8>>>>,
    start: Arc<(Mutex<usize>, std::sync::Condvar)>,
    nics: usize,
    first: bool,
    broken: bool,
}

impl PacketSender for WireNic {
    fn destinations(&self) -> usize {
        DESTS
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let data = (0..batch.len()).any(|i| {
            let mut hs = HeapStream::new(HeapStreamConfig::default());
            let mut out = Vec::new();
            hs.add_packet(&batch.to_vec(i), &mut out);
            hs.flush(&mut out);
            out.iter().any(|h| h.item(INDEX_ID).is_some())
        });
        if self.first && data {
            self.first = false;
            let (count, all) = &*self.start;
            let mut n = count.lock().unwrap();
            *n += 1;
            all.notify_all();
            if self.broken {
                return Err(io::Error::other("test: the NIC broke"));
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while *n < self.nics && Instant::now() < deadline {
                n = all.wait_timeout(n, Duration::from_millis(50)).unwrap().0;
            }
        }
        let mut wire = self.wire.lock().unwrap();
        for i in 0..batch.len() {
            wire.push(batch.to_vec(i));
        }
        Ok(())
    }
}

/// A sink of `wires.len()` threads, thread t's stream (heap counters t, t + T, …) over a
/// [`WireNic`] onto `wires[t]`; thread `broken`'s NIC fails at its first data (and then no
/// NIC waits for the others: a stopped thread may never take a buffer).
fn spawn_threads(wires: &[Arc<Mutex<Vec<Vec<u8>>>>], broken: Option<usize>) -> HeapSink<u64> {
    let start = Arc::new((Mutex::new(0), std::sync::Condvar::new()));
    let threads = wires.len() as u64;
    let senders = wires
        .iter()
        .enumerate()
        .map(|(t, wire)| {
            let nic = WireNic {
                wire: Arc::clone(wire),
                start: Arc::clone(&start),
                nics: if broken.is_some() { 1 } else { wires.len() },
                first: true,
                broken: broken == Some(t),
            };
            let cfg = SendStreamConfig {
                cnt_first: t as u64,
                cnt_step: threads,
                ..config(Duration::from_secs(3600))
            };
            let nics: Vec<NetSender> = vec![Box::new(nic)];
            let mut stream = SendStream::new(cfg, nics).unwrap();
            stream.set_interface_names(&["a".into()]);
            let thread = SendThread {
                name: format!("test-tx{t}"),
                core: None,
            };
            (thread, stream)
        })
        .collect();
    let schedule = start_up_descriptors();
    HeapSink::spawn_threads(
        senders,
        SlotFormat,
        schedule,
        8,
        SLOT_BYTES,
        &Shutdown::manual(),
    )
    .unwrap()
}

/// Play the engine with host buffers: heap `index` written into a free buffer and handed
/// over, until `heaps` or until the sink has no buffer to give (it stopped), within 60 s.
/// Returns how many were handed over.
fn run_engine_host(sink: &HeapSink<u64>, heaps: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    for index in 0..heaps {
        assert!(
            Instant::now() < deadline,
            "the engine never got a buffer back"
        );
        let Some(mut b) = sink.buffer() else {
            return index;
        };
        b.extend((0..SLOT_BYTES).map(|k| pattern(index, k)));
        sink.send(b, index);
    }
    heaps
}

/// Heaps (index, part) and counters of the data heaps on a wire, and its descriptor heaps.
fn on_wire(wire: &Mutex<Vec<Vec<u8>>>) -> (BTreeSet<(u64, usize)>, Vec<u64>, usize) {
    let heaps = wire_heaps(wire);
    let (mut parts, mut cnts, mut descriptors) = (BTreeSet::new(), Vec::new(), 0);
    for h in &heaps {
        let Some(ItemValue::Immediate(index)) = h.item(INDEX_ID) else {
            descriptors += usize::from(h.item(INDEX_ID + 2).is_some());
            continue;
        };
        assert!(h.complete, "heap {index} incomplete");
        let (part, _) = data_part(h, index);
        assert!(
            parts.insert((index, part)),
            "heap {index} part {part} twice"
        );
        cnts.push(h.cnt);
    }
    (parts, cnts, descriptors)
}

/// Three send threads, each with its own stream and NIC, take the engine's host buffers as
/// each gets free: every thread sends some, every heap arrives whole exactly once, no two
/// heaps share a counter, one set of descriptors goes out at start-up, and the sink's
/// counters are the three streams' sums (its bytes are the wires').
#[test]
fn three_threads_send_every_heap_once_and_their_counts_add_up() {
    let wires: Vec<_> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let mut sink = spawn_threads(&wires, None);
    let counters = sink.counters();
    assert_eq!(run_engine_host(&sink, 60), 60);
    sink.join().expect("the send threads survive");

    let (mut all, mut cnts, mut descriptors) = (BTreeSet::new(), Vec::new(), 0);
    for (t, wire) in wires.iter().enumerate() {
        let (parts, c, d) = on_wire(wire);
        assert!(!parts.is_empty(), "thread {t} sent nothing");
        for p in parts {
            assert!(all.insert(p), "{p:?} from two threads");
        }
        cnts.extend(c);
        descriptors += d;
    }
    assert_eq!(all, parts(0..60));
    assert_eq!(
        cnts.iter().collect::<BTreeSet<_>>().len(),
        cnts.len(),
        "two heaps share a counter"
    );
    assert_eq!(
        descriptors, DESTS,
        "one set of descriptors, not one per thread"
    );
    let wire_bytes: u64 = wires
        .iter()
        .flat_map(|w| {
            w.lock()
                .unwrap()
                .iter()
                .map(|p| p.len() as u64)
                .collect::<Vec<_>>()
        })
        .sum();
    assert_eq!(counters.buffers.load(Ordering::Relaxed), 60);
    assert_eq!(counters.bytes.load(Ordering::Relaxed), wire_bytes);
    assert_eq!(
        counters.interfaces[0].bytes.load(Ordering::Relaxed),
        wire_bytes
    );
    assert!(counters.interfaces[0].live.load(Ordering::Relaxed));
}

/// One of three threads stops on an error (its NIC breaks): the other two stop as well, the
/// engine's next requests for a buffer end (none hangs), and the sink reports the error.
#[test]
fn one_thread_failing_stops_the_output_without_a_hang() {
    let wires: Vec<_> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let mut sink = spawn_threads(&wires, Some(1));
    let handed = run_engine_host(&sink, 100_000);
    assert!(handed < 100_000, "the engine was never told of the stop");
    let err = sink.join().expect_err("the failure is reported");
    assert!(err.to_string().contains("the NIC broke"), "{err}");
}

/// One send thread whose stream spans two interfaces: the start-up descriptors all go to the
/// first live one (seed 000 §Network transmit; README "multi-NIC send"), while the data heaps
/// are spread over both.
#[test]
fn descriptors_go_to_the_first_interface_and_data_to_both() {
    let wires: Vec<_> = (0..2).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let start = Arc::new((Mutex::new(0), std::sync::Condvar::new()));
    let nics: Vec<NetSender> = wires
        .iter()
        .map(|wire| -> NetSender {
            Box::new(WireNic {
                wire: Arc::clone(wire),
                start: Arc::clone(&start),
                nics: 1,
                first: true,
                broken: false,
            })
        })
        .collect();
    let mut stream = SendStream::new(config(Duration::from_secs(3600)), nics).unwrap();
    stream.set_interface_names(&["a".into(), "b".into()]);
    let thread = SendThread {
        name: "test-tx".into(),
        core: None,
    };
    let mut sink = HeapSink::spawn(
        thread,
        stream,
        SlotFormat,
        start_up_descriptors(),
        8,
        0,
        &Shutdown::manual(),
    )
    .unwrap();
    assert_eq!(run_engine_host(&sink, 40), 40);
    sink.join().expect("the send thread survives");
    let (first, _, first_descriptors) = on_wire(&wires[0]);
    let (second, _, second_descriptors) = on_wire(&wires[1]);
    assert_eq!(
        (first_descriptors, second_descriptors),
        (DESTS, 0),
        "descriptors per interface"
    );
    assert!(
        !first.is_empty() && !second.is_empty(),
        "data heaps on one interface only: {} and {}",
        first.len(),
        second.len()
    );
}
