//! Fuzz `net::frame::parse` (the door for frames on DPDK and ibverbs): no panic; an accepted
//! frame's payload lies inside it, behind the 42 header bytes, and emitting headers for the
//! same endpoints and payload length parses back to the same datagram.
//! Seeds: fuzz/seeds/frame (one good multicast frame, one good unicast frame).
#![no_main]

use cbf::net::frame::{parse, FrameHeaders, UdpChecksum, HEADERS_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for check in [UdpChecksum::Verify, UdpChecksum::Skip] {
        let Ok(d) = parse(data, check) else {
            continue;
        };
        assert!(HEADERS_LEN + d.payload.len() <= data.len());
        let h = FrameHeaders::new(d.src_mac, d.src, d.dst_mac, d.dst, 1);
        let mut f = vec![0u8; HEADERS_LEN + d.payload.len()];
        h.emit(&mut f, d.payload.len(), 0).unwrap();
        f[HEADERS_LEN..].copy_from_slice(d.payload);
        let again = parse(&f, UdpChecksum::Verify).unwrap();
        assert_eq!(
            (again.src, again.dst, again.payload),
            (d.src, d.dst, d.payload)
        );
    }
});
