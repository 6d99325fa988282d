//! Receive cost per transport, one receive core: SPEAD packets of 8256 B (8 KiB of payload,
//! katgpucbf's default) and 1472 B (the largest UDP datagram at a 1500-byte MTU) into chunks (the chunk stream of `tests/net_conformance.rs`'s shape, with 1 MiB heaps), for
//! `mem` (chunking alone), `udp` and `uring` over loopback, and with `--features dpdk` DPDK on
//! `net_ring` (frames looped back in the process). A sender thread sends unpaced on the other
//! core; the receive thread is pinned to its core and its CPU time is read with
//! `CLOCK_THREAD_CPUTIME_ID`, so that "per packet" is the receive core's cost whatever the
//! sender's speed: packets/s per core = 1 / (CPU time per packet). Results go in
//! `bench/RESULTS.md` with the on-paper 100 GbE budget.
//!
//! spead2 beside cbf, on the same traffic: a socket is filled with [`PREFILL_HEAPS`] heaps
//! first (a large SO_RCVBUFFORCE buffer holds them all), then drained by one receiver on core
//! 1, timing its CPU until every packet is in: cbf's `udp` and `uring` into chunks, and spead2's
//! C++ chunk receiver (`ChunkRingStream`, one worker thread on core 1) through its Python
//! bindings (`bench/spead2_recv_chunks.py`, run with `$CBF_PYTHON`; skipped, saying so, without
//! it). On loopback the kernel's delivery work runs in the sender's calls, before the receiver
//! starts, so each figure is the receiver's own: system calls, copies, heap assembly, chunking.
//!
//! `CBF_PYTHON=… cargo bench --bench net_transports [--features dpdk]` (root, for the DPDK EAL
//! and SO_RCVBUFFORCE).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cbf::net::udp::UdpReceiver;
use cbf::net::uring::UringReceiver;
use cbf::net::{mem, PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};
use cbf::spead::recv::chunk::PlaceFn;
use cbf::spead::recv::{ChunkGroup, ChunkGroupConfig, ChunkStream, PlaceInput, Placement};
use cbf::spead::send::{Heap, PacketGenerator};
use cbf::spead::Flavour;

#[path = "cpu_time.rs"]
mod cpu_time;
use cpu_time::{pin, thread_cpu};

const HEAP_BYTES: usize = 1 << 20;
const HEAPS_PER_CHUNK: u64 = 8;
const HEAPS: u64 = 200; // 200 MiB per run
/// Heaps a socket is filled with before it is drained (64 MiB: within the socket buffer with
/// the kernel's per-packet overhead).
const PREFILL_HEAPS: u64 = 64;
/// Socket buffer of the prefilled runs.
const PREFILL_BUFFER: usize = 1 << 30;
const MAX_PACKET: usize = 9200;

fn place() -> Arc<PlaceFn> {
    Arc::new(|p: &PlaceInput<'_>| {
        let Some(n) = p.items[0] else {
            return Placement::Reject(0);
        };
        let i = (n % HEAPS_PER_CHUNK) as usize;
        Placement::Heap {
            chunk_id: n / HEAPS_PER_CHUNK,
            heap_index: i,
            heap_offset: i * HEAP_BYTES,
            extra: 0,
        }
    })
}

fn group() -> Arc<ChunkGroup> {
    ChunkGroup::new(ChunkGroupConfig {
        heaps_per_chunk: HEAPS_PER_CHUNK as usize,
        chunk_bytes: HEAPS_PER_CHUNK as usize * HEAP_BYTES,
        max_chunks: 2,
        n_chunks: 4,
        n_streams: 1,
        max_heaps: 8,
        items: vec![0x1600],
        reject_reasons: vec!["no_timestamp"],
    })
    .unwrap()
}

/// The packets of `heaps` heaps, each at most `packet` bytes (SPEAD header included).
fn packets(packet: usize, heaps: u64) -> Vec<Vec<u8>> {
    let data = vec![0x5a; HEAP_BYTES];
    let mut out = Vec::new();
    for n in 0..heaps {
        let mut h = Heap::new();
        h.add_immediate(0x1600, n).add_bytes(0x3300, data.clone());
        let mut g = PacketGenerator::new(&h, n + 1, Flavour::SPEAD_64_48, packet).unwrap();
        loop {
            let mut b = Vec::new();
            if g.next_packet(&mut b).is_none() {
                break;
            }
            out.push(b);
        }
    }
    out
}

struct Figures {
    packets: u64,
    bytes: u64,
    wall: Duration,
    cpu: Duration,
}

/// Receive on this thread (pinned to core 1) until the sender is done and the link is idle.
fn receive(rx: &mut dyn PacketReceiver, sent: &AtomicBool) -> Figures {
    pin(1);
    let g = group();
    let mut s = ChunkStream::new(Arc::clone(&g), place());
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    let (mut first, mut last) = (None, Instant::now());
    let cpu0 = thread_cpu();
    let mut cpu_last = cpu0;
    loop {
        match rx.recv_batch(&mut batch).unwrap() {
            Received::Packets(n) => {
                first.get_or_insert_with(Instant::now);
                s.note_batch(n);
                for p in batch.iter() {
                    s.add_packet(p);
                }
                last = Instant::now();
                cpu_last = thread_cpu();
            }
            Received::End => break,
            Received::Idle if sent.load(Ordering::Acquire) => break,
            Received::Idle => {}
        }
        s.release_old();
        while let Ok(c) = g.ready().try_recv() {
            g.free(c);
        }
    }
    let st = s.finish();
    Figures {
        packets: st.packets,
        bytes: st.bytes,
        wall: last - first.unwrap_or(last),
        cpu: cpu_last - cpu0,
    }
}

/// One line: packets and payload Gb/s by the wall clock (bounded by the sender on the other
/// core too), then the receive core's CPU time per packet and the rate it implies per core.
fn report(name: &str, packet: usize, sent: usize, f: &Figures) {
    let ns = f.cpu.as_nanos() as f64 / f.packets.max(1) as f64;
    let payload = f.bytes as f64 / f.packets.max(1) as f64;
    println!(
        "{name:<16} {packet:>5} B  received {:>7}/{sent:<7} wall {:>6.2} Gb/s {:>7.0} kpkt/s | receive core {:>6.0} ns/pkt = {:>6.0} kpkt/s = {:>6.1} Gb/s of payload per core",
        f.packets,
        f.bytes as f64 * 8.0 / f.wall.as_secs_f64() / 1e9,
        f.packets as f64 / f.wall.as_secs_f64() / 1e3,
        ns,
        1e6 / ns,
        payload * 8.0 / ns,
    );
}

/// Rounds of `ROUND` packets (net_ring holds fewer than 1024): send them into the transport's queue (socket buffer, ring), then
/// drain it on this same pinned thread, timing only the receive calls that returned packets.
/// What a polling receiver spends waiting for a slower sender is left out, so this is the
/// receive core's cost per packet when it never waits. On loopback the kernel's delivery work
/// runs in the sending call, so for `udp`/`uring` it covers the copy out of the socket and the
/// chunking, not the stack a NIC's interrupt would cost.
const ROUND: usize = 512;

fn drain_rounds(
    name: &str,
    packet: usize,
    pk: &[Vec<u8>],
    rx: &mut dyn PacketReceiver,
    tx: &mut dyn PacketSender,
) {
    pin(1);
    let g = group();
    let mut s = ChunkStream::new(Arc::clone(&g), place());
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    let mut busy = Duration::ZERO;
    let mut got = 0u64;
    for round in pk.chunks(ROUND) {
        for burst in round.chunks(32) {
            let mut b = SendBatch::default();
            for p in burst {
                b.push_packet(p, 0);
            }
            tx.send_batch(&b).unwrap();
        }
        let mut in_round = 0;
        while in_round < round.len() {
            let t0 = Instant::now();
            match rx.recv_batch(&mut batch).unwrap() {
                Received::Packets(n) => {
                    s.note_batch(n);
                    for p in batch.iter() {
                        s.add_packet(p);
                    }
                    s.release_old();
                    while let Ok(c) = g.ready().try_recv() {
                        g.free(c);
                    }
                    busy += t0.elapsed();
                    in_round += n;
                }
                _ => panic!("{name}: lost packets ({in_round} of {})", round.len()),
            }
        }
        got += in_round as u64;
    }
    let st = s.finish();
    let ns = busy.as_nanos() as f64 / got as f64;
    let payload = st.bytes as f64 / st.packets.max(1) as f64;
    println!(
        "{name:<16} {packet:>5} B  drained {got:>7} | receive core {ns:>6.0} ns/pkt = {:>6.0} kpkt/s = {:>6.1} Gb/s of payload per core",
        1e6 / ns,
        payload * 8.0 / ns,
    );
}

/// Send every packet to `dst` from a thread on core 0, and wait for it.
fn fill(pk: &[Vec<u8>], dst: SocketAddrV4) {
    let pk = Arc::new(pk.to_vec());
    udp_sender(pk, dst, Arc::new(AtomicBool::new(false)))
        .join()
        .unwrap();
}

/// The receive core's figure of one prefilled run.
fn report_prefilled(name: &str, packet: usize, sent: usize, heaps: u64, f: &Figures) {
    let ns = f.cpu.as_nanos() as f64 / f.packets.max(1) as f64;
    let payload = f.bytes as f64 / f.packets.max(1) as f64;
    println!(
        "{name:<16} {packet:>5} B  drained {:>7}/{sent:<7} heaps {heaps:>3}/{PREFILL_HEAPS} | receive core {ns:>6.0} ns/pkt = {:>6.0} kpkt/s = {:>6.1} Gb/s of payload per core",
        f.packets,
        1e6 / ns,
        payload * 8.0 / ns,
    );
}

/// cbf: fill `rx`'s socket (bound to `dst`), then drain it into chunks on core 1.
fn cbf_prefilled(
    name: &str,
    packet: usize,
    pk: &[Vec<u8>],
    dst: SocketAddrV4,
    rx: &mut dyn PacketReceiver,
) {
    fill(pk, dst);
    pin(1);
    let g = group();
    let mut s = ChunkStream::new(Arc::clone(&g), place());
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    let mut got = 0;
    let t0 = Instant::now();
    let cpu0 = thread_cpu();
    while got < pk.len() {
        match rx.recv_batch(&mut batch).unwrap() {
            Received::Packets(n) => {
                s.note_batch(n);
                for p in batch.iter() {
                    s.add_packet(p);
                }
                got += n;
            }
            _ => break, // the socket held fewer than were sent
        }
        s.release_old();
        while let Ok(c) = g.ready().try_recv() {
            g.free(c);
        }
    }
    let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
    let st = s.finish();
    let f = Figures {
        packets: st.packets,
        bytes: st.bytes,
        wall,
        cpu,
    };
    let complete = st.heaps - st.incomplete_heaps_evicted - st.incomplete_heaps_flushed;
    report_prefilled(name, packet, pk.len(), complete, &f);
}

/// spead2: the same, through `bench/spead2_recv_chunks.py` (see the module doc).
fn spead2_prefilled(packet: usize, pk: &[Vec<u8>]) -> Result<(), String> {
    let python = std::env::var("CBF_PYTHON").map_err(|_| "CBF_PYTHON is not set".to_string())?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/spead2_recv_chunks.py");
    let mut child = Command::new(python)
        .args([script, "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| format!("no port: {line:?}"))?;
    fill(pk, SocketAddrV4::new([127, 0, 0, 1].into(), port));
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", pk.len()).map_err(|e| e.to_string())?;
    line.clear();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    child.wait().map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line:?}"))?;
    let packets = v["packets"].as_u64().unwrap_or(0);
    // The payload of the packets counted (all of them, when every packet arrived).
    let payload: u64 = pk
        .iter()
        .take(packets as usize)
        .map(|p| spead_payload(p) as u64)
        .sum();
    let f = Figures {
        packets,
        bytes: payload,
        wall: Duration::from_secs_f64(v["wall_s"].as_f64().unwrap_or(0.0)),
        cpu: Duration::from_secs_f64(v["cpu_s"].as_f64().unwrap_or(0.0)),
    };
    let name = format!("spead2 {}", v["spead2"].as_str().unwrap_or("?"));
    report_prefilled(
        &name,
        packet,
        pk.len(),
        v["heaps_complete"].as_u64().unwrap_or(0),
        &f,
    );
    Ok(())
}

/// Payload bytes of a SPEAD packet (its `payload_length` item, 0x0004).
fn spead_payload(p: &[u8]) -> usize {
    let n = usize::from(u16::from_be_bytes([p[6], p[7]]));
    (0..n)
        .map(|k| u64::from_be_bytes(p[8 + 8 * k..16 + 8 * k].try_into().unwrap()))
        .find(|v| (v >> 48) & 0x7fff == 0x0004)
        .map_or(0, |v| (v & ((1 << 48) - 1)) as usize)
}

fn udp_sender(
    pk: Arc<Vec<Vec<u8>>>,
    dst: SocketAddrV4,
    sent: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        pin(0);
        let mut tx = cbf::net::udp::UdpSender::new(&[dst], None, 1, 8 << 20).unwrap();
        for chunk in pk.chunks(64) {
            let mut b = SendBatch::default();
            for p in chunk {
                b.push_packet(p, 0);
            }
            tx.send_batch(&b).unwrap();
        }
        sent.store(true, Ordering::Release);
    })
}

fn local() -> SocketAddrV4 {
    match UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
    {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    }
}

fn main() {
    for packet in [8256usize, 1472] {
        let pk = Arc::new(packets(packet, HEAPS));
        let n = pk.len();
        let f = receive(&mut mem::from_packets(pk.to_vec()), &AtomicBool::new(true));
        report("mem (chunking)", packet, n, &f);

        let dst = local();
        let mut rx = UdpReceiver::bind(&[dst], None, 256 << 20).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let t = udp_sender(Arc::clone(&pk), dst, Arc::clone(&sent));
        let f = receive(&mut rx, &sent);
        t.join().unwrap();
        report("udp", packet, n, &f);

        let dst = local();
        let mut rx = UringReceiver::bind(&[dst], None, 256 << 20, MAX_PACKET).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let t = udp_sender(Arc::clone(&pk), dst, Arc::clone(&sent));
        let f = receive(&mut rx, &sent);
        t.join().unwrap();
        report("uring", packet, n, &f);

        #[cfg(feature = "dpdk")]
        dpdk_ring(&pk, packet);
    }
    println!("-- drained in rounds of {ROUND} on one pinned thread (no waiting counted)");
    for packet in [8256usize, 1472] {
        let pk = packets(packet, HEAPS);
        let mut rx = mem::channel(ROUND, 1);
        drain_rounds("mem (chunking)", packet, &pk, &mut rx.1, &mut rx.0);
        let dst = local();
        let mut rx = UdpReceiver::bind(&[dst], None, 256 << 20).unwrap();
        let mut tx = cbf::net::udp::UdpSender::new(&[dst], None, 1, 8 << 20).unwrap();
        drain_rounds("udp", packet, &pk, &mut rx, &mut tx);
        let dst = local();
        let mut rx = UringReceiver::bind(&[dst], None, 256 << 20, MAX_PACKET).unwrap();
        let mut tx = cbf::net::udp::UdpSender::new(&[dst], None, 1, 8 << 20).unwrap();
        drain_rounds("uring", packet, &pk, &mut rx, &mut tx);
        #[cfg(feature = "dpdk")]
        {
            let (cfg, dst, send) = dpdk_config();
            let mut rx = cbf::net::dpdk::DpdkReceiver::open(&cfg, &[dst]).unwrap();
            let mut tx = cbf::net::dpdk::DpdkSender::open(&cfg, &send, &[dst]).unwrap();
            drain_rounds("dpdk net_ring", packet, &pk, &mut rx, &mut tx);
        }
    }
    println!(
        "-- a socket filled with {PREFILL_HEAPS} heaps, then drained on core 1: cbf beside spead2"
    );
    for packet in [8256usize, 1472] {
        let pk = packets(packet, PREFILL_HEAPS);
        let dst = local();
        let mut rx = UdpReceiver::bind(&[dst], None, PREFILL_BUFFER).unwrap();
        cbf_prefilled("cbf udp", packet, &pk, dst, &mut rx);
        let dst = local();
        let mut rx = UringReceiver::bind(&[dst], None, PREFILL_BUFFER, MAX_PACKET).unwrap();
        cbf_prefilled("cbf uring", packet, &pk, dst, &mut rx);
        if let Err(e) = spead2_prefilled(packet, &pk) {
            println!("spead2           {packet:>5} B  skipped: {e}");
        }
    }
}

#[cfg(feature = "dpdk")]
fn dpdk_config() -> (
    cbf::net::dpdk::DpdkConfig,
    SocketAddrV4,
    cbf::net::dpdk::DpdkSendConfig,
) {
    let cfg = cbf::net::dpdk::DpdkConfig {
        eal_args: format!(
            "-l 0 --no-huge --no-pci -m 256 --no-shconf --file-prefix=cbfbench{} --log-level=error --vdev=net_ring0",
            std::process::id()
        ),
        port: "net_ring0".into(),
    };
    let send = cbf::net::dpdk::DpdkSendConfig {
        src: "10.0.0.1:7148".parse().unwrap(),
        dst_mac: None,
        ttl: 1,
    };
    (cfg, "239.10.10.10:7148".parse().unwrap(), send)
}

#[cfg(feature = "dpdk")]
fn dpdk_ring(pk: &Arc<Vec<Vec<u8>>>, packet: usize) {
    use cbf::net::dpdk::{DpdkReceiver, DpdkSender};
    let (cfg, dst, send) = dpdk_config();
    let mut rx = DpdkReceiver::open(&cfg, &[dst]).unwrap();
    let mut tx = DpdkSender::open(&cfg, &send, &[dst]).unwrap();
    let sent = Arc::new(AtomicBool::new(false));
    let (pk2, flag) = (Arc::clone(pk), Arc::clone(&sent));
    let t = thread::spawn(move || {
        pin(0);
        for chunk in pk2.chunks(32) {
            let mut b = SendBatch::default();
            for p in chunk {
                b.push_packet(p, 0);
            }
            tx.send_batch(&b).unwrap();
        }
        flag.store(true, Ordering::Release);
    });
    let f = receive(&mut rx, &sent);
    t.join().unwrap();
    report("dpdk net_ring", packet, pk.len(), &f);
}
