//! Receive cost per transport, one receive core: SPEAD packets of 8256 B (8 KiB of payload,
//! katgpucbf's default) and 1472 B (the largest UDP datagram at a 1500-byte MTU) into chunks (the chunk stream of `tests/net_conformance.rs`'s shape, with 1 MiB heaps), for
//! `mem` (chunking alone), `udp` and `uring` over loopback, and with `--features dpdk` DPDK on
//! `net_ring` (frames looped back in the process). A sender thread sends unpaced on the other
//! core; the receive thread is pinned to its core and its CPU time is read with
//! `getrusage(RUSAGE_THREAD)`, so that "per packet" is the receive core's cost whatever the
//! sender's speed: packets/s per core = 1 / (CPU time per packet). Results go in
//! `bench/RESULTS.md` with the on-paper 100 GbE budget.
//!
//! `cargo bench --bench net_transports [--features dpdk]` (root, for the DPDK EAL).

use std::net::{SocketAddrV4, UdpSocket};
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

const HEAP_BYTES: usize = 1 << 20;
const HEAPS_PER_CHUNK: u64 = 8;
const HEAPS: u64 = 200; // 200 MiB per run
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

/// The packets of every heap, each at most `packet` bytes (SPEAD header included).
fn packets(packet: usize) -> Vec<Vec<u8>> {
    let data = vec![0x5a; HEAP_BYTES];
    let mut out = Vec::new();
    for n in 0..HEAPS {
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

fn thread_cpu() -> Duration {
    // SAFETY: a zeroed rusage is valid; getrusage fills it for the calling thread.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// Pin the calling thread to `core` (best effort: a machine with one core keeps both threads).
fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
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
        let pk = Arc::new(packets(packet));
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
        let pk = packets(packet);
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
