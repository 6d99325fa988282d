//! The kernel's own drops (socket receive buffer full) are counted by the UDP receiver
//! (issue 11: no silent loss). The expected count is the sender's tally minus the packets
//! received, not anything the receiver computes.

use std::net::{SocketAddrV4, UdpSocket};

use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};

/// Receive until the socket has been idle for one poll interval; packets taken.
fn drain(rx: &mut UdpReceiver, batch: &mut RecvBatch) -> u64 {
    let mut n = 0;
    loop {
        match rx.recv_batch(batch).unwrap() {
            Received::Packets(k) => n += k as u64,
            _ => return n,
        }
    }
}

const SENT: u64 = 2000;
const PAYLOAD: [u8; 1024] = [0x5a; 1024];

/// A receiver with the smallest receive buffer the kernel allows, a burst of SENT datagrams
/// already sent to it (which must overflow it), its batch, the sender and its address.
fn flooded() -> (UdpReceiver, RecvBatch, UdpSocket, SocketAddrV4) {
    let any: SocketAddrV4 = "127.0.0.1:0".parse().unwrap();
    let rx = UdpReceiver::bind(&[any], None, 4096).unwrap();
    let dst = rx.local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let batch = RecvBatch::new(64, rx.slot_size(2048));
    for _ in 0..SENT {
        tx.send_to(&PAYLOAD, dst).unwrap();
    }
    (rx, batch, tx, dst)
}

#[test]
fn socket_overflow_is_counted_exactly() {
    let (mut rx, mut batch, tx, dst) = flooded();
    let got = drain(&mut rx, &mut batch);
    assert!(got < SENT, "nothing was dropped ({got} of {SENT} received)");
    // The kernel reports the count with the next datagram it queues.
    tx.send_to(&PAYLOAD, dst).unwrap();
    assert_eq!(drain(&mut rx, &mut batch), 1);
    assert_eq!(rx.kernel_drops(), SENT - got);
    // No new drops: the count stays.
    tx.send_to(&PAYLOAD, dst).unwrap();
    assert_eq!(drain(&mut rx, &mut batch), 1);
    assert_eq!(rx.kernel_drops(), SENT - got);
}

/// A receiver that is not receiving (its thread waits for a free chunk) reads the count on
/// request (`refresh_kernel_drops`, `SO_MEMINFO`), before any datagram could bring it; the
/// datagrams received afterwards, queued before the drops, do not count them again.
#[test]
fn overflow_is_counted_without_receiving() {
    let (mut rx, mut batch, tx, dst) = flooded();
    assert_eq!(rx.kernel_drops(), 0, "nothing received, nothing refreshed");
    rx.refresh_kernel_drops();
    let early = rx.kernel_drops();
    let got = drain(&mut rx, &mut batch);
    assert!(got < SENT, "nothing was dropped ({got} of {SENT} received)");
    assert_eq!(early, SENT - got);
    assert_eq!(rx.kernel_drops(), SENT - got);
    tx.send_to(&PAYLOAD, dst).unwrap();
    assert_eq!(drain(&mut rx, &mut batch), 1);
    rx.refresh_kernel_drops();
    assert_eq!(rx.kernel_drops(), SENT - got);
}
