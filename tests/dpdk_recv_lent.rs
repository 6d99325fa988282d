//! DPDK receive lends its mbufs to the batch instead of copying the payload (issue 15: one copy
//! per byte, into the chunk). With `--features dpdk`, on `net_ring` (frames sent by a DPDK
//! sender come back to the receiver in the same process):
//!
//! - the batch's packets are the bytes sent, and each lies in the port's mbuf pool (DPDK's own
//!   list of the pool's memory chunks, `rte_mempool_mem_iter`), not in the batch's slots; a
//!   copied packet does not (the check can tell the two apart);
//! - mbufs come back: the pool's free count (`rte_mempool_avail_count`, counted by DPDK, not by
//!   the code under test) is its starting value less exactly the frames the batch holds while it
//!   holds them (refused frames, foreign or malformed, are freed at once), and its starting
//!   value again once the batch is dropped, or cleared by the next receive call;
//! - the receiver lends a bounded number of mbufs at once: a batch larger than that gets fewer
//!   frames, a second batch gets none while the first holds them, and the rest once it is
//!   dropped, so the pool always keeps what refills the RX queue.
//!
//! One EAL per process: this file is its own test binary with one test. Without the feature
//! the test is reported ignored, with that reason.

#[cfg(not(feature = "dpdk"))]
#[test]
#[ignore = "built without --features dpdk: the DPDK transport is not in this build"]
fn dpdk_receive_lends_its_mbufs() {}

#[cfg(feature = "dpdk")]
#[test]
fn dpdk_receive_lends_its_mbufs() {
    use std::net::SocketAddrV4;

    use cbf::net::dpdk::{DpdkConfig, DpdkReceiver, DpdkSendConfig, DpdkSender};
    use cbf::net::frame::{FrameDrop, FrameHeaders, HEADERS_LEN};
    use cbf::net::{PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};

    let cfg = DpdkConfig {
        eal_args: format!(
            "-l 0 --no-huge --no-pci -m 128 --no-shconf --file-prefix=cbflent{} \
             --log-level=error --vdev=net_ring0",
            std::process::id()
        ),
        port: "net_ring0".into(),
    };
    let dst: SocketAddrV4 = "239.77.1.1:7148".parse().unwrap();
    let other: SocketAddrV4 = "239.77.1.1:7149".parse().unwrap();
    let send = DpdkSendConfig {
        src: "10.77.1.9:7148".parse().unwrap(),
        dst_mac: None,
        ttl: 4,
    };
    let mut rx = DpdkReceiver::open(&cfg, &[dst]).unwrap();
    let mut tx = DpdkSender::open(&cfg, &send, &[dst, other]).unwrap();
    let full = rx.pool_free();
    assert!(full > 0);

    // Ten datagrams to us, each its own bytes, five to another port, one frame with a bad IPv4
    // header checksum.
    let ours: Vec<Vec<u8>> = (0..10u8)
        .map(|i| {
            (0..100 + 50 * usize::from(i))
                .map(|k| k as u8 ^ i)
                .collect()
        })
        .collect();
    let mut b = SendBatch::default();
    for (i, p) in ours.iter().enumerate() {
        b.push_packet(p, 0);
        if i % 2 == 0 {
            b.push_packet(&p[..60], 1);
        }
    }
    tx.send_batch(&b).unwrap();
    let mut bad = vec![0u8; HEADERS_LEN + 100];
    FrameHeaders::new([2; 6], send.src, [1, 0, 0x5e, 77, 1, 1], dst, 4)
        .emit(&mut bad, 100, 0)
        .unwrap();
    bad[30] ^= 1; // the destination address, under the header checksum
    tx.send_frames(&[&bad]).unwrap();
    assert_eq!(
        rx.pool_free(),
        full - 16,
        "the frames sent wait in the ring"
    );

    let mut batch = RecvBatch::new(64, rx.slot_size(9200));
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), Received::Packets(10));
    let got: Vec<Vec<u8>> = batch.iter().map(<[u8]>::to_vec).collect();
    assert_eq!(got, ours, "the bytes sent, in order");
    assert!(
        batch.iter().all(|p| rx.in_pool(p)),
        "every packet is read in its mbuf"
    );
    let mut copied = RecvBatch::new(1, 9200);
    assert!(copied.push(&ours[3]));
    assert!(!rx.in_pool(copied.packet(0)), "a copy is not in the pool");
    assert_eq!(rx.frame_drops().get(FrameDrop::NotOurs), 5);
    assert_eq!(rx.frame_drops().get(FrameDrop::IpChecksum), 1);
    assert_eq!(
        rx.pool_free(),
        full - 10,
        "refused frames freed at once, the batch's held"
    );
    drop(batch);
    assert_eq!(
        rx.pool_free(),
        full,
        "every mbuf back once the batch is dropped"
    );

    // The next receive call gives the last batch's mbufs back.
    let mut batch = RecvBatch::new(64, rx.slot_size(9200));
    let mut b = SendBatch::default();
    for p in &ours[..3] {
        b.push_packet(p, 0);
    }
    tx.send_batch(&b).unwrap();
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), Received::Packets(3));
    assert_eq!(rx.pool_free(), full - 3);
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), Received::Idle);
    assert_eq!(rx.pool_free(), full, "cleared by the next call");

    // A bounded loan: 300 frames queued, a batch of 512 gets part of them, a second batch
    // nothing while the first holds its part, then the rest.
    let total = 300;
    for burst in (0..total).collect::<Vec<usize>>().chunks(32) {
        let mut b = SendBatch::default();
        for &i in burst {
            b.push_packet(&ours[i % ours.len()], 0);
        }
        tx.send_batch(&b).unwrap();
    }
    let mut big = RecvBatch::new(512, rx.slot_size(9200));
    let Received::Packets(first) = rx.recv_batch(&mut big).unwrap() else {
        panic!("nothing received");
    };
    assert!(
        (64..total).contains(&first),
        "lent {first} of {total} at once"
    );
    let mut second = RecvBatch::new(64, rx.slot_size(9200));
    assert_eq!(
        rx.recv_batch(&mut second).unwrap(),
        Received::Idle,
        "no more lent while the first batch holds its frames"
    );
    assert_eq!(rx.pool_free(), full - total as u32);
    drop(big);
    let mut rest = 0;
    while let Received::Packets(n) = rx.recv_batch(&mut second).unwrap() {
        rest += n;
    }
    assert_eq!(first + rest, total, "every frame, once");
    assert_eq!(rx.pool_free(), full);
    drop(second);
    assert_eq!(rx.pool_free(), full);
    drop(tx);
}
