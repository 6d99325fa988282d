//! Fuzz pcap replay: any bytes as a pcap file, read to the end (or to the first error) through
//! `PcapReceiver` with and without an endpoint filter; and any bytes as one frame of every
//! link type through `udp_payload`. Nothing may panic or allocate without bound.
//! Seeds: fuzz/seeds/pcap.
#![no_main]

use std::cell::RefCell;
use std::io::Cursor;

use cbf::net::pcap::{udp_payload, PcapReceiver};
use cbf::net::{PacketReceiver, Received, RecvBatch};
use libfuzzer_sys::fuzz_target;
use pcap_file::DataLink;

thread_local! {
    // One batch for every run: allocating and zeroing 74 KB per run was most of its time.
    static BATCH: RefCell<RecvBatch> = RefCell::new(RecvBatch::new(8, 9200));
}

fuzz_target!(|data: &[u8]| {
    for link in [
        DataLink::ETHERNET,
        DataLink::LINUX_SLL,
        DataLink::RAW,
        DataLink::IPV4,
    ] {
        if let Some((_, payload)) = udp_payload(link, data) {
            assert!(payload.len() <= data.len());
        }
    }
    let filter = ["239.10.10.10:7148".parse().unwrap()];
    for f in [&[][..], &filter[..]] {
        let Ok(mut rx) = PcapReceiver::from_reader(Cursor::new(data), f) else {
            continue;
        };
        BATCH.with_borrow_mut(|batch| {
            // Each frame costs at least its 16-byte record header, so this bounds the loop.
            for _ in 0..data.len() / 16 + 2 {
                match rx.recv_batch(batch) {
                    Ok(Received::Packets(_)) => {}
                    _ => break,
                }
            }
        });
    }
});
