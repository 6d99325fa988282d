//! The software rate limiter holds the configured rate within 1 % over a second on loopback
//! (the requirement): the receiver timestamps the first and last packet of a paced
//! stream and counts the bytes between them.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use cbf::net::udp::UdpSender;
use cbf::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

#[test]
fn paced_stream_holds_rate_within_one_percent() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let dest = match rx.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let rate = 50e6; // bytes/s: modest, so a debug build on 2 shared cores keeps up
    let heap_bytes = 64 * 1024;
    let n_heaps = (1.2 * rate / heap_bytes as f64) as usize;
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 9200];
        let mut first: Option<(Instant, usize)> = None;
        let mut last = Instant::now();
        let mut bytes = 0usize;
        while let Ok(n) = rx.recv(&mut buf) {
            let now = Instant::now();
            if first.is_none() {
                first = Some((now, n));
            }
            last = now;
            bytes += n;
        }
        let (t0, n0) = first.expect("nothing received");
        // Bytes after the first packet, over the time from the first to the last packet.
        ((bytes - n0) as f64, (last - t0).as_secs_f64())
    });
    let tx = UdpSender::new(&[dest], None, 1, 4 << 20).unwrap();
    let cfg = SendStreamConfig {
        max_packet_size: 8192 + 72,
        rate,
        burst_size: 65536,
        ..Default::default()
    };
    let mut s = SendStream::new(cfg, vec![tx]).unwrap();
    let data = vec![7u8; heap_bytes];
    let mut heap = Heap::new();
    heap.add_immediate(0x1600, 0).add_bytes(0x4300, &data[..]);
    for _ in 0..n_heaps {
        s.send_heaps(&[HeapRef::new(&heap, 0)], SendMode::Serial)
            .unwrap();
    }
    let (bytes, secs) = receiver.join().unwrap();
    let measured = bytes / secs;
    assert!(secs > 1.0, "ran only {secs} s");
    assert!(
        (measured / rate - 1.0).abs() < 0.01,
        "measured {measured:.0} B/s for {rate:.0} B/s over {secs:.3} s"
    );
}
