//! Send cost per transport on one core (issue 15): `udp` (`sendmmsg` with GSO, the kernel
//! copying every payload byte into socket buffers) beside `uring` (io_uring's zero-copy
//! `sendmsg`, `net::uring_send`), over loopback. SPEAD packets of 8256 B (8 KiB of payload,
//! katgpucbf's default) and 1472 B, each a 64-byte header followed by a payload slice borrowed
//! from a heap (as `spead::send` builds them), in batches of 256 KiB (the send stream's burst)
//! to one destination. The send thread is pinned to core 0 and its CPU time read with
//! `CLOCK_THREAD_CPUTIME_ID`; a thread on core 1 drains the receiving socket. Each transport
//! runs [`ROUNDS`] times, alternated, and the median is printed.
//!
//! On loopback the kernel delivers each packet inside the sender's system call, and a
//! zero-copy send is copied there after all (the notifications say so: printed), so this
//! measures io_uring's cost against `sendmmsg`'s for the same copies; what zero copy saves, a
//! NIC reading the heap's pages itself, loopback cannot show.
//!
//! `cargo bench --bench net_send`

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cbf::net::udp::UdpSender;
use cbf::net::uring_send::UringSender;
use cbf::net::{PacketSender, SendBatch};

#[path = "cpu_time.rs"]
mod cpu_time;
use cpu_time::{pin, thread_cpu};

/// Bytes sent per run and per batch.
const RUN_BYTES: usize = 256 << 20;
const BATCH_BYTES: usize = 256 << 10;
const HEADER: usize = 64;
const ROUNDS: usize = 7;

/// A socket on loopback drained by a thread on core 1 until `stop`.
fn drained_socket(stop: Arc<AtomicBool>) -> (SocketAddrV4, thread::JoinHandle<()>) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&s)
        .set_recv_buffer_size(64 << 20)
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let addr = match s.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        a => panic!("{a}"),
    };
    let t = thread::spawn(move || {
        pin(1);
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let _ = s.recv(&mut buf);
        }
    });
    (addr, t)
}

/// CPU time per packet of sending `RUN_BYTES` in packets of `packet` bytes through `tx`, and
/// the wall time.
fn run(tx: &mut dyn PacketSender, packet: usize, headers: &[u8], payload: &[u8]) -> (f64, f64) {
    let per_batch = BATCH_BYTES / packet;
    let batches = RUN_BYTES / (per_batch * packet);
    let step = packet - HEADER;
    let (cpu0, t0) = (thread_cpu(), Instant::now());
    let mut batch = SendBatch::default();
    for b in 0..batches {
        for k in 0..per_batch {
            let (h, parts) = batch.bufs();
            let (h0, p0) = (h.len(), parts.len());
            h.extend_from_slice(&headers[..HEADER]);
            let off = ((b * per_batch + k) * step) % (payload.len() - step);
            parts.push(&payload[off..off + step]);
            batch.finish_packet(h0, p0, 0);
        }
        tx.send_batch(&batch).unwrap();
        batch.clear();
    }
    let packets = (batches * per_batch) as f64;
    let cpu = (thread_cpu() - cpu0).as_secs_f64();
    (cpu / packets * 1e9, t0.elapsed().as_secs_f64())
}

/// (median, min, max).
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    pin(0);
    let headers = vec![0x53u8; HEADER];
    let payload: Vec<u8> = (0..64 << 20).map(|i: usize| (i * 7) as u8).collect();
    println!(
        "send cost per packet on one core, loopback, median of {ROUNDS} alternated runs of {} MiB",
        RUN_BYTES >> 20
    );
    for packet in [8256usize, 1472] {
        let stop = Arc::new(AtomicBool::new(false));
        let (dst, drain) = drained_socket(Arc::clone(&stop));
        let mut udp = UdpSender::new(&[dst], None, 1, 4 << 20).unwrap();
        let mut uring = UringSender::new(&[dst], None, 1, 4 << 20).unwrap();
        let (mut u, mut z) = (Vec::new(), Vec::new());
        let (mut uw, mut zw) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (c, w) = run(&mut udp, packet, &headers, &payload);
            u.push(c);
            uw.push(w);
            let (c, w) = run(&mut uring, packet, &headers, &payload);
            z.push(c);
            zw.push(w);
        }
        stop.store(true, Ordering::Relaxed);
        drain.join().unwrap();
        let gbps = |ns: f64| packet as f64 * 8.0 / ns;
        let ((un, umin, umax), (zn, zmin, zmax)) = (spread(&u), spread(&z));
        println!(
            "{packet:>5} B  udp (sendmmsg + GSO): {un:7.0} ns/packet (min {umin:.0}, max {umax:.0}), {:.1} Gb/s per core, wall {:.3} s",
            gbps(un),
            spread(&uw).0
        );
        let (copied, notified) = uring.copied();
        println!(
            "{packet:>5} B  uring (sendmsg zero-copy): {zn:7.0} ns/packet (min {zmin:.0}, max {zmax:.0}), {:.1} Gb/s per core, wall {:.3} s; {copied} of {notified} sends copied by the kernel; uring/udp {:.2}",
            gbps(zn),
            spread(&zw).0,
            zn / un
        );
    }
}
