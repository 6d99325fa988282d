//! `net::frame` against frames built and checked by a second computation: Python's `struct` and
//! `socket` with its own RFC 1071 sum (`tests/reference/frames.py`). Python's frames, good and
//! with one defect each, must parse to the endpoints and payload Python put in, or be refused
//! with the cause Python names; frames cbf emits must pass Python's checks.

mod common;

use std::net::SocketAddrV4;

use cbf::net::frame::{dest_mac, parse, FrameHeaders, UdpChecksum, HEADERS_LEN};

#[test]
fn python_frames_parse_to_what_python_built() {
    let lines = common::run_reference("frames.py", &["frames", "7", "3000"]);
    assert_eq!(lines.len(), 3000);
    let mut causes = std::collections::BTreeMap::new();
    for line in &lines {
        let f: Vec<&str> = line.split(' ').collect();
        let bytes = if f[0] == "-" {
            Vec::new()
        } else {
            (0..f[0].len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&f[0][i..i + 2], 16).unwrap())
                .collect()
        };
        let got = parse(&bytes, UdpChecksum::Verify);
        *causes.entry(f[1]).or_insert(0) += 1;
        match got {
            Ok(d) => {
                assert_eq!(f[1], "ok", "{line}");
                assert_eq!(d.src, f[2].parse::<SocketAddrV4>().unwrap(), "{line}");
                assert_eq!(d.dst, f[3].parse::<SocketAddrV4>().unwrap(), "{line}");
                let n: usize = f[4].parse().unwrap();
                assert_eq!(d.payload, &bytes[HEADERS_LEN..HEADERS_LEN + n], "{line}");
            }
            Err(cause) => assert_eq!(cause.name(), f[1], "{line}"),
        }
    }
    // Every cause Python makes was exercised.
    assert_eq!(causes.len(), 10, "{causes:?}");
}

#[test]
fn emitted_frames_pass_python_checks() {
    let mut frames = Vec::new();
    let mut want = Vec::new();
    for i in 0..200u32 {
        let dst = if i % 2 == 0 {
            SocketAddrV4::new([239, (i * 7) as u8, (i * 13) as u8, i as u8].into(), 7148)
        } else {
            SocketAddrV4::new([10, 1, (i >> 8) as u8, i as u8].into(), 9000 + i as u16)
        };
        let src = SocketAddrV4::new([10, 0, 0, (i % 250) as u8].into(), 40000 + i as u16);
        let mac = dest_mac(*dst.ip(), Some([2, 0, 0, 0, 0, i as u8])).unwrap();
        let h = FrameHeaders::new([2, 1, 1, 1, 1, 1], src, mac, dst, (i % 255) as u8 + 1);
        let len = (i as usize * 41) % 1500;
        let mut f = vec![0xa5; HEADERS_LEN + len];
        h.emit(&mut f, len, i as u16).unwrap();
        frames.push(common::hex(&f));
        want.push(format!("ok {len}"));
    }
    let out = common::run_reference_bytes(
        "frames.py",
        &["check".to_string()],
        frames.join("\n").as_bytes(),
    );
    let got: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, want);
}
