//! The zero-copy io_uring sender against loopback sockets, beside `sendmmsg`'s sender on the
//! same batches: every packet arrives whole, in order, at its destination, across GSO runs,
//! gathered headers and rounds of many messages; a message the kernel refuses stops the batch
//! there, with what came before it sent and nothing after.

use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use super::*;
use crate::net::udp::UdpSender;

/// Two loopback receivers with room for every test packet.
fn receivers() -> (Vec<UdpSocket>, Vec<SocketAddrV4>) {
    let socks: Vec<UdpSocket> = (0..2)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            socket2::SockRef::from(&s)
                .set_recv_buffer_size(16 << 20)
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            s
        })
        .collect();
    let addrs = socks
        .iter()
        .map(|s| match s.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            a => panic!("{a}"),
        })
        .collect();
    (socks, addrs)
}

/// Every datagram waiting on `s`, in arrival order.
fn drain(s: &UdpSocket) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 17];
    while let Ok(n) = s.recv(&mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// Packet `i`'s bytes: `len` bytes, its index in the first four, a pattern after.
fn packet(i: usize, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len).map(|k| (i * 31 + k * 7) as u8).collect();
    p[..4].copy_from_slice(&(i as u32).to_le_bytes());
    p
}

/// The senders under test, by name, on `dests`.
fn sender(name: &str, dests: &[SocketAddrV4]) -> Box<dyn PacketSender> {
    match name {
        "uring" => Box::new(UringSender::new(dests, None, 1, 4 << 20).unwrap()),
        _ => Box::new(UdpSender::new(dests, None, 1, 4 << 20).unwrap()),
    }
}

const NAMES: [&str; 2] = ["uring", "udp"];

/// (packet length, destination) of a batch with a GSO run longer than one message, a run cut by
/// a short last packet, packets alternating between destinations (no run: one message each,
/// more than one round's worth), and large single packets.
fn layout() -> Vec<(usize, usize)> {
    let mut l = Vec::new();
    l.extend(std::iter::repeat_n((1472, 0), 100));
    l.extend(std::iter::repeat_n((1000, 1), 10));
    l.push((300, 1));
    for i in 0..300 {
        l.push((64 + i % 7, i % 2));
    }
    l.extend(std::iter::repeat_n((8256, 0), 12));
    l
}

#[test]
fn every_packet_arrives_whole_and_in_order_at_its_destination() {
    for name in NAMES {
        let (socks, addrs) = receivers();
        let mut sender = sender(name, &addrs);
        let lay = layout();
        let packets: Vec<Vec<u8>> = lay
            .iter()
            .enumerate()
            .map(|(i, &(n, _))| packet(i, n))
            .collect();
        let mut batch = SendBatch::default();
        for (i, (p, &(_, dest))) in packets.iter().zip(&lay).enumerate() {
            if i % 5 == 0 && p.len() > 16 {
                // A gathered packet: an 8-byte header, then two borrowed payload slices.
                let (h, parts) = batch.bufs();
                let (h0, p0) = (h.len(), parts.len());
                h.extend_from_slice(&p[..8]);
                parts.push(&p[8..p.len() / 2]);
                parts.push(&p[p.len() / 2..]);
                batch.finish_packet(h0, p0, dest);
            } else {
                batch.push_packet(p, dest);
            }
        }
        sender
            .send_batch(&batch)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (d, s) in socks.iter().enumerate() {
            let want: Vec<&Vec<u8>> = packets
                .iter()
                .zip(&lay)
                .filter(|(_, l)| l.1 == d)
                .map(|(p, _)| p)
                .collect();
            let got = drain(s);
            assert_eq!(
                got.len(),
                want.len(),
                "{name}: datagrams at destination {d}"
            );
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == *w, "{name}: destination {d}, datagram {k} differs");
            }
        }
    }
}

/// Zero copy is what was asked of the kernel: every message was notified (a plain send posts
/// no notification), and on loopback the kernel says it copied each one after all (the usage
/// report was asked for and honoured).
#[test]
fn every_message_is_notified_and_loopback_reports_the_copy() {
    let (_socks, addrs) = receivers();
    let mut sender = UringSender::new(&addrs, None, 1, 4 << 20).unwrap();
    let packets: Vec<Vec<u8>> = (0..20).map(|i| packet(i, 1000)).collect();
    let mut batch = SendBatch::default();
    for (i, p) in packets.iter().enumerate() {
        batch.push_packet(p, i % 2); // alternating: one message each
    }
    sender.send_batch(&batch).unwrap();
    assert_eq!(sender.copied(), (20, 20), "(copied, notified)");
}

/// A lone packet touching more pages than a zero-copy message may hold (a 64-byte header and
/// 65000 bytes starting one byte before a page boundary: 18 pages) still arrives, sent as an
/// ordinary `sendmsg`, between zero-copy messages; and a GSO run over the limit is cut.
#[test]
fn a_packet_over_the_page_limit_is_sent_all_the_same() {
    let (socks, addrs) = receivers();
    let mut sender = UringSender::new(&addrs, None, 1, 4 << 20).unwrap();
    let store: Vec<u8> = (0..65000 + 2 * 4096)
        .map(|k: usize| (k * 13) as u8)
        .collect();
    let at = (4096 - store.as_ptr() as usize % 4096) % 4096 + 4095;
    let big = &store[at..at + 65000];
    let header = [0xa5u8; 64];
    let small: Vec<Vec<u8>> = (0..30).map(|i| packet(i, 8256)).collect();
    let mut batch = SendBatch::default();
    batch.push_packet(&small[0], 0);
    let (h, parts) = batch.bufs();
    let (h0, p0) = (h.len(), parts.len());
    h.extend_from_slice(&header);
    parts.push(big);
    batch.finish_packet(h0, p0, 0);
    for p in &small[1..] {
        batch.push_packet(p, 0);
    }
    sender.send_batch(&batch).unwrap();
    let got = drain(&socks[0]);
    let mut want = vec![small[0].clone(), [&header[..], big].concat()];
    want.extend(small[1..].iter().cloned());
    assert_eq!(got.len(), want.len());
    assert!(got == want, "datagrams differ");
    // Every message but the big one's was zero-copy and notified: the first packet alone, then
    // 29 of 8256 bytes (3 pages or more each) in runs of at most five within 17 pages.
    let (_, notified) = sender.copied();
    assert!(notified > 29_u64.div_ceil(5), "{notified} notifications");
}

/// A datagram larger than UDP allows (EMSGSIZE) in the middle of a batch: the call fails with
/// that error, the packets before it arrived and none after it, as `sendmmsg`'s sender does.
#[test]
fn a_refused_message_stops_the_batch_there_as_sendmmsg_does() {
    for name in NAMES {
        let (socks, addrs) = receivers();
        let mut sender = sender(name, &addrs);
        let small: Vec<Vec<u8>> = (0..4).map(|i| packet(i, 100)).collect();
        let big = packet(9, 70_000);
        let mut batch = SendBatch::default();
        batch.push_packet(&small[0], 0);
        batch.push_packet(&small[1], 1);
        batch.push_packet(&big, 0);
        batch.push_packet(&small[2], 1);
        batch.push_packet(&small[3], 0);
        let e = sender
            .send_batch(&batch)
            .expect_err("70000 bytes is no UDP datagram");
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{name}: {e}");
        assert_eq!(
            drain(&socks[0]),
            vec![small[0].clone()],
            "{name}: destination 0"
        );
        assert_eq!(
            drain(&socks[1]),
            vec![small[1].clone()],
            "{name}: destination 1"
        );
    }
}
