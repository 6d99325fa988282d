//! One conformance suite over every transport this build and machine have (issue 15): the same
//! SPEAD heaps go in through each, and the same chunks (presence, bytes, `extra`) and the same
//! stream counters must come out, with every drop counted by its cause.
//!
//! Cases: heaps in order; reordered; with lost packets; with duplicated packets; with corrupt
//! and truncated packets (SPEAD-level, so every transport delivers them and the SPEAD parser
//! counts them); with foreign traffic (datagrams to another port, which the kernel filters for
//! the socket transports and the frame-level ones count as `not_ours`; junk datagrams to our
//! port, which everyone counts as `bad_magic`). The `mem` transport's outcome is checked against
//! what the case predicts (computed from how it was built, not by the code under test), and
//! every other transport must reproduce it exactly.
//!
//! Transports: `mem`, `pcap`, `udp` and `uring` (over loopback) always; with `--features dpdk`,
//! DPDK on `net_ring` (frames looped back inside the process, with frame-level defects injected
//! as well) and on `net_af_packet` over a veth pair in a network namespace this test creates
//! (the kernel sends, DPDK receives; DPDK sends, the kernel receives). Needs root for the
//! namespace; without the feature the DPDK test is reported ignored, with that reason.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use cbf::net::frame::FrameDrops;
use cbf::net::pcap::{PcapDump, PcapReceiver};
use cbf::net::udp::UdpReceiver;
use cbf::net::uring::UringReceiver;
use cbf::net::{mem, PacketReceiver, Received, RecvBatch};
use cbf::spead::recv::chunk::PlaceFn;
use cbf::spead::recv::StatsSnapshot;
use cbf::spead::recv::{ChunkGroup, ChunkGroupConfig, ChunkStream, PlaceInput, Placement};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::{DropReason, Flavour};

const HEAP_BYTES: usize = 3000; // three packets of ≤ 1472 B each
const HEAPS_PER_POL: u64 = 4; // per chunk
const N_HEAPS: u64 = 16; // per polarisation: 4 chunks
const TS_STEP: u64 = 1024;
const MAX_PACKET: usize = 9200;

/// katgpucbf fgpu's placement shape: chunk = ts / (heaps per chunk × step), heap index =
/// (ts / step mod heaps) + pol × heaps, `extra` = a status item.
fn place() -> Arc<PlaceFn> {
    Arc::new(|p: &PlaceInput<'_>| {
        let (Some(ts), Some(pol)) = (p.items[0], p.items[1]) else {
            return Placement::Reject(0);
        };
        let n = ts / TS_STEP;
        let heap_index = (n % HEAPS_PER_POL) as usize + (pol as usize & 1) * HEAPS_PER_POL as usize;
        Placement::Heap {
            chunk_id: n / HEAPS_PER_POL,
            heap_index,
            heap_offset: heap_index * HEAP_BYTES,
            extra: p.items[2].unwrap_or(0),
        }
    })
}

fn group() -> Arc<ChunkGroup> {
    ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: 2 * HEAPS_PER_POL as usize,
        chunk_bytes: 2 * HEAPS_PER_POL as usize * HEAP_BYTES,
        max_chunks: 2,
        n_chunks: 16,
        n_streams: 1,
        max_heaps: 8,
        items: vec![0x1600, 0x3101, 0x3102],
        reject_reasons: vec!["no_timestamp"],
    })
    .unwrap()
}

fn payload(n: u64, pol: u64) -> Vec<u8> {
    (0..HEAP_BYTES)
        .map(|i| (i as u64 * 7 + n * 13 + pol * 101) as u8)
        .collect()
}

/// The packets of heap n of `pol`, in order.
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

/// A case builder's step: (heap n, pol, the heap's packets in order, the wire so far).
type HeapStep<'a> = &'a mut dyn FnMut(u64, u64, Vec<Vec<u8>>, &mut Vec<Vec<u8>>);

/// One chunk as received: id, presence, the bytes and `extra` of its present heaps.
type ChunkSeen = (u64, Vec<u8>, Vec<u8>, Vec<u64>);

/// What a case sends, and what it predicts.
struct Case {
    name: &'static str,
    /// SPEAD (or junk) datagrams to the receiver's endpoint, in wire order.
    ours: Vec<Vec<u8>>,
    /// Datagrams to another port of the same address.
    foreign: Vec<Vec<u8>>,
    /// (heap n, pol) that must be absent from the chunks.
    absent: Vec<(u64, u64)>,
    /// Malformed packets by reason, as built.
    malformed: Vec<(DropReason, u64)>,
    duplicates: u64,
}

fn cases() -> Vec<Case> {
    let all = |f: HeapStep<'_>| {
        let mut out = Vec::new();
        for n in 0..N_HEAPS {
            for pol in 0..2 {
                f(n, pol, heap_packets(n, pol), &mut out);
            }
        }
        out
    };
    let plain = || Case {
        name: "",
        ours: all(&mut |_, _, hp, out| out.extend(hp)),
        foreign: Vec::new(),
        absent: Vec::new(),
        malformed: Vec::new(),
        duplicates: 0,
    };
    let mut v = vec![Case {
        name: "in_order",
        ..plain()
    }];
    // Reordered: the packets of each heap backwards, and pairs of heaps interleaved.
    let mut ours = all(&mut |_, _, mut hp, out| {
        hp.reverse();
        out.extend(hp)
    });
    for pair in ours.chunks_mut(6) {
        pair.swap(1, 4);
    }
    v.push(Case {
        name: "reordered",
        ours,
        ..plain()
    });
    // Lost: the middle packet of every third heap.
    let mut absent = Vec::new();
    let ours = all(&mut |n, pol, mut hp, out| {
        if (2 * n + pol) % 3 == 0 {
            hp.remove(1);
            absent.push((n, pol));
        }
        out.extend(hp)
    });
    v.push(Case {
        name: "lost",
        ours,
        absent,
        ..plain()
    });
    // Duplicated: the last packet of every fourth heap twice.
    let mut dups = 0;
    let ours = all(&mut |n, pol, mut hp, out| {
        if (2 * n + pol) % 4 == 0 {
            hp.push(hp[2].clone());
            dups += 1;
        }
        out.extend(hp)
    });
    v.push(Case {
        name: "duplicated",
        ours,
        duplicates: dups,
        ..plain()
    });
    // Corrupt and truncated: heap 5 pol 0 loses its first packet to a bad magic byte, heap 9
    // pol 1 its second to a cut that leaves the header announcing more pointers than arrive.
    let mut absent = Vec::new();
    let ours = all(&mut |n, pol, mut hp, out| {
        if (n, pol) == (5, 0) {
            hp[0][0] = 0x54;
            absent.push((n, pol));
        }
        if (n, pol) == (9, 1) {
            hp[1].truncate(20);
            absent.push((n, pol));
        }
        out.extend(hp)
    });
    v.push(Case {
        name: "corrupt",
        ours,
        absent,
        malformed: vec![(DropReason::BadMagic, 1), (DropReason::ShortHeader, 1)],
        ..plain()
    });
    // Foreign: a copy of every fifth packet to another port, and junk to ours.
    let mut ours = plain().ours;
    let foreign: Vec<Vec<u8>> = ours.iter().step_by(5).cloned().collect();
    for k in 0..3 {
        ours.insert(
            10 * k + 7,
            vec![0xde, 0xad, 0xbe, 0xef, k as u8, 0, 0, 0, 1, 2],
        );
    }
    v.push(Case {
        name: "foreign",
        ours,
        foreign,
        malformed: vec![(DropReason::BadMagic, 3)],
        ..plain()
    });
    v
}

/// What came out of one transport for one case.
#[derive(Debug, PartialEq)]
struct Outcome {
    chunks: Vec<ChunkSeen>,
    /// The stream's counters, less those that depend on batching and timing.
    stats: StatsSnapshot,
    frames: FrameDrops,
}

/// Run a chunk stream over `rx` until it ends, or is idle once `sent` is raised.
fn receive(rx: &mut dyn PacketReceiver, sent: &AtomicBool) -> Outcome {
    let group = group();
    let mut s = ChunkStream::new(Arc::clone(&group), place());
    let mut batch = RecvBatch::new(16, rx.slot_size(MAX_PACKET));
    let mut idle_after_send = 0;
    loop {
        let done = sent.load(Ordering::Acquire);
        match rx.recv_batch(&mut batch).unwrap() {
            Received::End => break,
            Received::Idle if done => {
                idle_after_send += 1;
                if idle_after_send == 2 {
                    break;
                }
            }
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
    let stats = StatsSnapshot {
        batches: 0,
        max_batch: 0,
        kernel_drops: rx.kernel_drops(),
        ..s.finish()
    };
    let mut chunks = Vec::new();
    while let Ok(c) = group.ready().try_recv() {
        let mut data = Vec::new();
        let mut extra = Vec::new();
        for (i, &p) in c.present.iter().enumerate() {
            if p == 1 {
                data.extend_from_slice(&c.data[i * HEAP_BYTES..(i + 1) * HEAP_BYTES]);
                extra.push(c.extra[i]);
            }
        }
        chunks.push((c.chunk_id, c.present.to_vec(), data, extra));
        group.free(c);
    }
    Outcome {
        chunks,
        stats,
        frames: rx.frame_drops(),
    }
}

/// The case's prediction checked on the reference transport's outcome.
fn check_prediction(case: &Case, o: &Outcome) {
    let c = case.name;
    assert_eq!(
        o.chunks.len() as u64,
        N_HEAPS / HEAPS_PER_POL,
        "{c}: chunks"
    );
    for (id, present, data, extra) in &o.chunks {
        let mut at = 0;
        for (i, &p) in present.iter().enumerate() {
            let pol = i as u64 / HEAPS_PER_POL;
            let n = id * HEAPS_PER_POL + i as u64 % HEAPS_PER_POL;
            let want_absent = case.absent.contains(&(n, pol));
            assert_eq!(p == 0, want_absent, "{c}: chunk {id} heap {i}");
            if p == 1 {
                assert_eq!(data[at..at + HEAP_BYTES], payload(n, pol)[..], "{c}: bytes");
                assert_eq!(extra[at / HEAP_BYTES], n + 1000 * pol, "{c}: extra");
                at += HEAP_BYTES;
            }
        }
    }
    let s = &o.stats;
    assert_eq!(
        s.heaps,
        2 * N_HEAPS - case.absent.len() as u64,
        "{c}: {s:?}"
    );
    for r in DropReason::ALL {
        let want = case.malformed.iter().find(|m| m.0 == r).map_or(0, |m| m.1);
        assert_eq!(s.malformed(r), want, "{c}: malformed {r}");
    }
    assert_eq!(s.duplicate_packets, case.duplicates, "{c}: duplicates");
    assert_eq!(s.kernel_drops, 0, "{c}: drops");
}

/// Each case through `run`, compared with the `mem` transport's outcome.
fn conform(transport: &str, mut run: impl FnMut(&Case) -> Outcome) {
    for case in cases() {
        let reference = receive(
            &mut mem::from_packets(case.ours.clone()),
            &AtomicBool::new(true),
        );
        check_prediction(&case, &reference);
        let got = run(&case);
        assert_eq!(
            got.chunks, reference.chunks,
            "{transport}/{}: chunks differ from mem's",
            case.name
        );
        assert_eq!(
            got.stats, reference.stats,
            "{transport}/{}: counters differ from mem's",
            case.name
        );
    }
}

#[test]
fn mem_matches_each_case_prediction() {
    conform("mem", |case| {
        receive(
            &mut mem::from_packets(case.ours.clone()),
            &AtomicBool::new(true),
        )
    });
}

#[test]
fn pcap_replay_conforms() {
    let path = std::env::temp_dir().join(format!("cbf-conformance-{}.pcap", std::process::id()));
    let dst: SocketAddrV4 = "239.10.10.10:7148".parse().unwrap();
    let other: SocketAddrV4 = "239.10.10.10:7149".parse().unwrap();
    let src: SocketAddrV4 = "10.0.0.1:5000".parse().unwrap();
    conform("pcap", |case| {
        let mut d = PcapDump::create(&path).unwrap();
        // Foreign datagrams go between ours, as they would arrive on a wire.
        let mut f = case.foreign.iter();
        for (i, p) in case.ours.iter().enumerate() {
            d.write(src, dst, p).unwrap();
            if i % 4 == 0 {
                if let Some(x) = f.next() {
                    d.write(src, other, x).unwrap();
                }
            }
        }
        for x in f {
            d.write(src, other, x).unwrap();
        }
        d.finish().unwrap();
        let mut rx = PcapReceiver::open(&path, &[dst]).unwrap();
        let o = receive(&mut rx, &AtomicBool::new(true));
        assert_eq!(
            rx.skipped,
            case.foreign.len() as u64,
            "{}: skipped",
            case.name
        );
        o
    });
    let _ = std::fs::remove_file(&path);
}

/// Send a case over loopback UDP from another thread (foreign datagrams to `other`), raising
/// the flag when done.
fn send_udp(
    case: &Case,
    dst: SocketAddrV4,
    other: SocketAddrV4,
    sent: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let ours = case.ours.clone();
    let foreign = case.foreign.clone();
    thread::spawn(move || {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut f = foreign.iter();
        for (i, p) in ours.iter().enumerate() {
            tx.send_to(p, dst).unwrap();
            if i % 4 == 0 {
                if let Some(x) = f.next() {
                    tx.send_to(x, other).unwrap();
                }
            }
        }
        for x in f {
            tx.send_to(x, other).unwrap();
        }
        sent.store(true, Ordering::Release);
    })
}

/// A port that was free a moment ago, and a second one for foreign traffic (nobody listens).
fn two_ports() -> (SocketAddrV4, SocketAddrV4) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ep = |s: &UdpSocket| match s.local_addr().unwrap() {
        std::net::SocketAddr::V4(v) => v,
        _ => unreachable!(),
    };
    (ep(&a), ep(&b))
}

#[test]
fn udp_conforms() {
    conform("udp", |case| {
        let (dst, other) = two_ports();
        let mut rx = UdpReceiver::bind(&[dst], None, 16 << 20).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let t = send_udp(case, dst, other, Arc::clone(&sent));
        let o = receive(&mut rx, &sent);
        t.join().unwrap();
        o
    });
}

#[test]
fn uring_conforms() {
    conform("uring", |case| {
        let (dst, other) = two_ports();
        let mut rx = UringReceiver::bind(&[dst], None, 16 << 20, MAX_PACKET).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let t = send_udp(case, dst, other, Arc::clone(&sent));
        let o = receive(&mut rx, &sent);
        t.join().unwrap();
        o
    });
}

#[cfg(feature = "dpdk")]
#[path = "net_conformance/dpdk.rs"]
mod dpdk;

#[cfg(not(feature = "dpdk"))]
#[test]
#[ignore = "built without --features dpdk: the DPDK transport is not in this build"]
fn dpdk_conforms() {}

/// `cbf capture` with `--recv-transport dpdk`: the run's stderr and stdout, and whether it
/// succeeded.
fn capture_dpdk(extra: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["capture", "239.10.10.10:7148", "--recv-transport", "dpdk"])
        .args(["--stats", "--duration", "0.5"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[cfg(not(feature = "dpdk"))]
#[test]
fn dpdk_is_refused_naming_the_flag_and_the_feature() {
    let (ok, err, _) = capture_dpdk(&[]);
    assert!(!ok);
    assert!(
        err.contains("--recv-transport") && err.contains("--features dpdk"),
        "{err}"
    );
}

#[cfg(feature = "dpdk")]
#[test]
fn dpdk_start_up_errors_name_the_flag_and_an_idle_port_runs() {
    let (ok, err, _) = capture_dpdk(&[]);
    assert!(!ok && err.contains("--dpdk-args"), "{err}");
    let eal = |tag: &str| {
        format!(
            "-l 0 --no-huge --no-pci -m 64 --no-shconf --file-prefix=cbfcap{tag}{} \
             --log-level=error --vdev=net_ring0",
            std::process::id()
        )
    };
    let (ok, err, _) = capture_dpdk(&["--dpdk-args", "--no-such-eal-flag"]);
    assert!(!ok && err.contains("--dpdk-args"), "{err}");
    let (ok, err, _) = capture_dpdk(&["--dpdk-args", &eal("a"), "--dpdk-port", "7"]);
    assert!(!ok && err.contains("--dpdk-port"), "{err}");
    // A port that nothing feeds: the engine starts, polls and stops cleanly on time.
    let (ok, err, out) = capture_dpdk(&["--dpdk-args", &eal("b")]);
    assert!(ok, "{err}");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["frame_not_ours"], 0, "{last}");
    assert_eq!(last["packets"], 0, "{last}");
}
