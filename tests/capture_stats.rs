//! `cbf capture --stats` counts large heaps as they complete (issue 14): its once-a-second lines
//! show the heaps received so far, not only the final line. Six 4 MiB heaps (512 packets of
//! 8 KiB each) are sent about 0.7 s apart; the per-second lines must climb through the run.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddrV4;
use std::process::{Command, Stdio};
use std::time::Duration;

use cbf::net::udp::UdpSender;
use cbf::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};
use common::{free_udp_port, Kill};

#[test]
fn stats_lines_count_large_heaps_as_they_complete() {
    let port = free_udp_port();
    let dest: SocketAddrV4 = format!("127.0.0.1:{port}").parse().unwrap();
    let mut capture = Kill(
        Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args(["capture", "--stats", "--duration", "7", &dest.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The capture's lines, as they come; its first (a second after it bound) says it is ready.
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = capture.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
            tx.send(v["heaps"].as_u64().unwrap()).unwrap();
        }
    });
    let mut counts = vec![lines.recv_timeout(Duration::from_secs(20)).unwrap()];
    let sender = UdpSender::new(&[dest], None, 1, 8 << 20).unwrap();
    let config = SendStreamConfig {
        max_packet_size: 8192 + 72,
        // 4 MiB in about 20 ms: paced, so the capture's socket buffer is never the question.
        rate: 200e6,
        ..Default::default()
    };
    let mut stream = SendStream::new(config, vec![sender]).unwrap();
    let payload = vec![0x5au8; 4 << 20];
    for k in 0..6u64 {
        let mut heap = Heap::new();
        heap.add_immediate(0x1600, k).add_bytes(0x4300, &payload);
        stream
            .send_heaps(&[HeapRef::new(&heap, 0)], SendMode::Serial)
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
    }
    reader.join().unwrap();
    counts.extend(lines.try_iter());
    assert!(capture.0.wait().unwrap().success());
    assert_eq!(counts.last(), Some(&6), "{counts:?}");
    // Lines before the end saw part of the run: at least two distinct counts between 1 and 5.
    let mut partial: Vec<u64> = counts
        .iter()
        .copied()
        .filter(|&c| (1..6).contains(&c))
        .collect();
    partial.dedup();
    assert!(partial.len() >= 2, "{counts:?}");
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
}
