//! The io_uring receiver (issue 15) against what was sent: every datagram arrives once, intact
//! and in order per socket, across several sockets; when the provided-buffer ring runs dry the
//! receive is re-armed and nothing is lost; kernel drops are counted exactly (the sender's
//! tally minus the packets received, as tests/kernel_drops.rs does for the recvmmsg path).

use std::net::{SocketAddrV4, UdpSocket};

use cbf::net::uring::UringReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};

const MAX_PACKET: usize = 9200;

/// Datagram `i`: its index, then bytes derived from it, of a length that varies with it.
fn datagram(i: u32) -> Vec<u8> {
    let len = 8 + (i as usize * 37) % 8000;
    let mut v: Vec<u8> = (0..len)
        .map(|k| (k as u32 ^ i.wrapping_mul(2654435761)) as u8)
        .collect();
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

/// Receive until the sockets have been idle for one poll interval; the packets taken.
fn drain(rx: &mut UringReceiver, batch: &mut RecvBatch) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    loop {
        match rx.recv_batch(batch).unwrap() {
            Received::Packets(n) => {
                assert_eq!(n, batch.len());
                got.extend(batch.iter().map(<[u8]>::to_vec));
            }
            _ => return got,
        }
    }
}

fn any() -> SocketAddrV4 {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn every_datagram_arrives_once_and_intact() {
    // Two sockets: bind two free ports by asking the kernel for them first.
    let ports: Vec<u16> = (0..2)
        .map(|_| UdpSocket::bind(any()).unwrap().local_addr().unwrap().port())
        .collect();
    let eps: Vec<SocketAddrV4> = ports
        .iter()
        .map(|&p| SocketAddrV4::new([127, 0, 0, 1].into(), p))
        .collect();
    let mut rx = UringReceiver::bind(&eps, None, 64 << 20, MAX_PACKET).unwrap();
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    assert!(drain(&mut rx, &mut batch).is_empty());
    let tx = UdpSocket::bind(any()).unwrap();
    const SENT: u32 = 3000;
    for i in 0..SENT {
        tx.send_to(&datagram(i), eps[i as usize % 2]).unwrap();
    }
    let got = drain(&mut rx, &mut batch);
    assert_eq!(got.len(), SENT as usize, "datagrams lost or duplicated");
    // In order within each socket; every one exactly as sent.
    let mut last = [None::<u32>; 2];
    for g in &got {
        let i = u32::from_le_bytes(g[..4].try_into().unwrap());
        assert_eq!(g, &datagram(i), "datagram {i} altered");
        let s = i as usize % 2;
        assert!(
            last[s].is_none_or(|l| l < i),
            "socket {s}: {i} after {last:?}"
        );
        last[s] = Some(i);
    }
    assert_eq!(rx.kernel_drops(), 0);
}

#[test]
fn a_dry_buffer_ring_is_rearmed_without_loss() {
    let mut rx = UringReceiver::bind(&[any()], None, 64 << 20, MAX_PACKET).unwrap();
    let dst = rx.local_addr().unwrap();
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    // Arm the multishot receive, then send 96 times the ring's 32 buffers without reading: the
    // ring runs dry, the kernel ends the request, the socket buffer holds the rest.
    assert!(drain(&mut rx, &mut batch).is_empty());
    let tx = UdpSocket::bind(any()).unwrap();
    const SENT: u32 = 3072;
    for i in 0..SENT {
        tx.send_to(&datagram(i), dst).unwrap();
    }
    let got = drain(&mut rx, &mut batch);
    let idx: Vec<u32> = got
        .iter()
        .map(|g| u32::from_le_bytes(g[..4].try_into().unwrap()))
        .collect();
    assert_eq!(idx, (0..SENT).collect::<Vec<_>>());
    assert_eq!(rx.kernel_drops(), 0);
}

const FLOOD: u64 = 2000;
const PAYLOAD: [u8; 1024] = [0x5a; 1024];

/// A receiver with the smallest receive buffer the kernel allows, a burst of FLOOD datagrams
/// sent before its first receive (nothing armed yet: it must overflow), its batch, the sender
/// and its address.
fn flooded() -> (UringReceiver, RecvBatch, UdpSocket, SocketAddrV4) {
    let rx = UringReceiver::bind(&[any()], None, 4096, 2048).unwrap();
    let dst = rx.local_addr().unwrap();
    let batch = RecvBatch::new(64, rx.slot_size(2048));
    let tx = UdpSocket::bind(any()).unwrap();
    for _ in 0..FLOOD {
        tx.send_to(&PAYLOAD, dst).unwrap();
    }
    (rx, batch, tx, dst)
}

#[test]
fn socket_overflow_is_counted_exactly() {
    let (mut rx, mut batch, tx, dst) = flooded();
    let got = drain(&mut rx, &mut batch).len() as u64;
    assert!(
        got < FLOOD,
        "nothing was dropped ({got} of {FLOOD} received)"
    );
    // The kernel reports the count with the next datagram it queues.
    tx.send_to(&PAYLOAD, dst).unwrap();
    assert_eq!(drain(&mut rx, &mut batch).len(), 1);
    assert_eq!(rx.kernel_drops(), FLOOD - got);
    tx.send_to(&PAYLOAD, dst).unwrap();
    assert_eq!(drain(&mut rx, &mut batch).len(), 1);
    assert_eq!(rx.kernel_drops(), FLOOD - got);
}

/// Without receiving, the count is read on request (`refresh_kernel_drops`, `SO_MEMINFO`), as
/// a receive thread waiting for a free chunk does; the datagrams taken afterwards, queued
/// before the drops, do not count them again.
#[test]
fn overflow_is_counted_without_receiving() {
    let (mut rx, mut batch, _, _) = flooded();
    assert_eq!(rx.kernel_drops(), 0, "nothing received, nothing refreshed");
    rx.refresh_kernel_drops();
    let early = rx.kernel_drops();
    let got = drain(&mut rx, &mut batch).len() as u64;
    assert!(
        got < FLOOD,
        "nothing was dropped ({got} of {FLOOD} received)"
    );
    assert_eq!(early, FLOOD - got);
    assert_eq!(rx.kernel_drops(), FLOOD - got);
}

/// The buffers a batch holds are the batch's until it is cleared: datagrams received into
/// other batches meanwhile (32 times the ring's 32 buffers, through the 24 the first batch
/// leaves) leave its packets as they were, and they stay readable after the receiver is gone
/// (the batch keeps the memory alive).
#[test]
fn a_batch_keeps_its_lent_buffers_until_cleared() {
    let mut rx = UringReceiver::bind(&[any()], None, 64 << 20, MAX_PACKET).unwrap();
    let dst = rx.local_addr().unwrap();
    let mut kept = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    let mut other = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    assert!(drain(&mut rx, &mut other).is_empty());
    let tx = UdpSocket::bind(any()).unwrap();
    const FIRST: u32 = 8;
    for i in 0..FIRST {
        tx.send_to(&datagram(i), dst).unwrap();
    }
    let mut first = Vec::new();
    while first.len() < FIRST as usize {
        match rx.recv_batch(&mut kept).unwrap() {
            Received::Packets(_) => first.extend(kept.iter().map(<[u8]>::to_vec)),
            _ => panic!("datagrams lost: {} of {FIRST}", first.len()),
        }
    }
    let held: Vec<Vec<u8>> = kept.iter().map(<[u8]>::to_vec).collect();
    assert!(!held.is_empty());
    const MORE: u32 = 1024;
    for i in FIRST..FIRST + MORE {
        tx.send_to(&datagram(i), dst).unwrap();
    }
    assert_eq!(drain(&mut rx, &mut other).len(), MORE as usize);
    drop(rx);
    let now: Vec<Vec<u8>> = kept.iter().map(<[u8]>::to_vec).collect();
    assert_eq!(
        now, held,
        "a lent buffer was written while the batch held it"
    );
    for g in &now {
        let i = u32::from_le_bytes(g[..4].try_into().unwrap());
        assert_eq!(g, &datagram(i));
    }
}
