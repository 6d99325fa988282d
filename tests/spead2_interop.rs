//! SPEAD interoperability with spead2 4.5.1 (tests/reference/spead2_peer.py), both ways:
//! byte-exact encoding, spead2 → cbf over UDP (with packets reordered), cbf → spead2 over UDP.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddrV4;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cbf::net::udp::{UdpReceiver, UdpSender};
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::items::{Descriptor, ItemValue};
use cbf::spead::recv::{HeapStream, HeapStreamConfig, ReceivedHeap};
use cbf::spead::send::{Heap, HeapRef, PacketGenerator, SendMode, SendStream, SendStreamConfig};
use cbf::spead::Flavour;

struct Case {
    flavour: Flavour,
    packet_size: usize,
    cnt: (u64, u64),
    heaps: Vec<Heap<'static>>,
}

fn be_u32s(v: impl Iterator<Item = u32>) -> Vec<u8> {
    v.flat_map(u32::to_be_bytes).collect()
}

fn addressed_a() -> Vec<u8> {
    (0..1000).map(|i| ((i % 256) - 128) as i8 as u8).collect()
}
fn addressed_b() -> Vec<u8> {
    be_u32s((0..35).map(|i| i * 3 + 1))
}
fn multipacket_data() -> Vec<u8> {
    (0..20000).map(|i| (i % 251) as u8).collect()
}

/// The same heaps as `case()` in spead2_peer.py, built with cbf's API.
fn rust_case(name: &str) -> Case {
    let f48 = Flavour::SPEAD_64_48;
    let mut c = Case {
        flavour: f48,
        packet_size: 1472,
        cnt: (1, 1),
        heaps: vec![],
    };
    let mut h = Heap::new();
    match name {
        "immediates" => {
            h.add_immediate(0x1600, 0x12_3456_789a)
                .add_immediate(0x3101, 3)
                .add_immediate(0x3102, 0x1_0000_0002);
        }
        "addressed" => {
            h.add_descriptor(
                &Descriptor::with_dtype(0x1000, "raw", "int8 samples", &[1000], "|i1"),
                f48,
            );
            h.add_small(0x1000, addressed_a());
            h.add_descriptor(
                &Descriptor::with_dtype(0x1001, "table", "u32 table", &[5, 7], ">u4"),
                f48,
            );
            h.add_small(0x1001, addressed_b());
        }
        "multipacket_repeat" => {
            h.repeat_pointers = true;
            h.add_immediate(0x1600, 0xabcdef)
                .add_small(0x4300, multipacket_data());
            c.packet_size = 8192 + 72;
        }
        "descriptors" => {
            h.add_descriptor(
                &Descriptor::with_format(
                    0x1600,
                    "timestamp",
                    "ADC sample count",
                    &[],
                    &[(b'u', 48)],
                ),
                f48,
            );
            h.add_descriptor(
                &Descriptor::with_dtype(
                    0x4300,
                    "feng_raw",
                    "channelised",
                    &[512, 256, 2, 2],
                    "|i1",
                ),
                f48,
            );
            h.add_descriptor(
                &Descriptor::with_format(
                    0x1234,
                    "varlen",
                    "variable",
                    &[None, Some(3)],
                    &[(b'i', 8), (b'f', 32)],
                ),
                f48,
            );
        }
        "start" => {
            h.add_start();
        }
        "stop" => {
            h.add_end();
        }
        "empty" => {}
        "cnt_sequence" => {
            c.cnt = (10, 7);
            for i in 0..3 {
                let mut h = Heap::new();
                h.add_immediate(0x1600, 1000 + i);
                c.heaps.push(h);
            }
            return c;
        }
        "many_pointers" => {
            for i in 0..200 {
                h.add_immediate(0x2000 + i, i * 1001);
            }
            h.add_small(0x1000, (0..100u8).collect::<Vec<_>>());
            c.packet_size = 256;
        }
        "flavour40" => {
            c.flavour = Flavour::new(40).unwrap();
            c.packet_size = 1000;
            h.add_immediate(0x7fff, 0xffff_ffff);
            h.add_small(
                0x1000,
                (0..300u16).flat_map(u16::to_be_bytes).collect::<Vec<_>>(),
            );
        }
        other => panic!("no case {other}"),
    }
    c.heaps.push(h);
    c
}

const CASES: [&str; 10] = [
    "immediates",
    "addressed",
    "multipacket_repeat",
    "descriptors",
    "start",
    "stop",
    "empty",
    "cnt_sequence",
    "many_pointers",
    "flavour40",
];

fn cbf_packets(c: &Case) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cnt = c.cnt.0;
    for h in &c.heaps {
        let mut g = PacketGenerator::new(h, cnt, c.flavour, c.packet_size).unwrap();
        loop {
            let mut buf = vec![0xa5; 3]; // dirty prefix: the generator must only append
            match g.next_packet(&mut buf) {
                Some(_) => out.push(buf[3..].to_vec()),
                None => break,
            }
        }
        cnt += c.cnt.1;
    }
    out
}

#[test]
fn encoding_is_byte_exact_with_spead2() {
    for name in CASES {
        let want = common::run_reference("spead2_peer.py", &["encode", name]);
        let got: Vec<String> = cbf_packets(&rust_case(name))
            .iter()
            .map(|p| common::hex(p))
            .collect();
        assert_eq!(got, want, "case {name}");
    }
}

/// Expected items of the cases sent over UDP, from the case formulas (not from the receiver).
fn check_heap(name: &str, heap: &ReceivedHeap) {
    assert!(heap.complete, "{name}: heap {} incomplete", heap.cnt);
    let item = |id| {
        heap.item(id)
            .unwrap_or_else(|| panic!("{name}: item {id:#x} missing"))
    };
    match name {
        "immediates" => {
            assert_eq!(item(0x1600), ItemValue::Immediate(0x12_3456_789a));
            assert_eq!(item(0x3102), ItemValue::Immediate(0x1_0000_0002));
        }
        "addressed" => {
            assert_eq!(item(0x1000), ItemValue::Bytes(&addressed_a()));
            assert_eq!(item(0x1001), ItemValue::Bytes(&addressed_b()));
            let d: Vec<Descriptor> = heap.descriptors().into_iter().map(Result::unwrap).collect();
            assert_eq!(
                d[1],
                Descriptor::with_dtype(0x1001, "table", "u32 table", &[5, 7], ">u4")
            );
        }
        "multipacket_repeat" => {
            assert_eq!(item(0x1600), ItemValue::Immediate(0xabcdef));
            assert_eq!(item(0x4300), ItemValue::Bytes(&multipacket_data()));
        }
        "many_pointers" => {
            for i in [0u64, 57, 199] {
                assert_eq!(item(0x2000 + i), ItemValue::Immediate(i * 1001));
            }
            assert_eq!(
                item(0x1000),
                ItemValue::Bytes(&(0..100u8).collect::<Vec<_>>())
            );
        }
        _ => unreachable!(),
    }
}

#[test]
fn spead2_sends_cbf_receives() {
    for (name, shuffle) in [
        ("immediates", None),
        ("addressed", Some("1")),
        ("multipacket_repeat", Some("2")),
        ("many_pointers", Some("3")),
    ] {
        let mut rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 8 << 20).unwrap();
        let port = rx.local_addr().unwrap().port().to_string();
        let mut args = vec!["send-udp", name, "127.0.0.1", port.as_str()];
        if let Some(seed) = shuffle {
            args.extend(["--shuffle", seed]);
        }
        let sender = std::thread::spawn({
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            move || {
                common::run_reference(
                    "spead2_peer.py",
                    &args.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            }
        });
        // Out-of-order packets of one heap need every packet kept: enough heap slots.
        let mut stream = HeapStream::new(HeapStreamConfig::default());
        let mut batch = RecvBatch::new(32, rx.slot_size(9200));
        let mut heaps = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !stream.is_stopped() && Instant::now() < deadline {
            if let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
                for p in batch.iter() {
                    stream.add_packet(p, &mut heaps);
                }
            }
        }
        sender.join().unwrap();
        assert!(stream.is_stopped(), "{name}: no stop heap within 20 s");
        let expected_heaps = rust_case(name).heaps.len();
        assert_eq!(heaps.len(), expected_heaps, "{name}: {:?}", stream.stats());
        for h in &heaps {
            check_heap(name, h);
        }
        assert_eq!(stream.stats().malformed_total(), 0);
    }
}

#[test]
fn cbf_sends_spead2_receives() {
    let port = common::free_udp_port();
    let names = [
        "immediates",
        "addressed",
        "multipacket_repeat",
        "many_pointers",
    ];
    let mut child = Command::new(common::python())
        .arg(common::reference_script("spead2_peer.py"))
        .args(["recv-udp", &port.to_string(), &names.len().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let dest: SocketAddrV4 = format!("127.0.0.1:{port}").parse().unwrap();
    for name in names {
        let c = rust_case(name);
        let tx = UdpSender::new(&[dest], None, 1, 1 << 20).unwrap();
        let cfg = SendStreamConfig {
            max_packet_size: c.packet_size,
            rate: 50e6,
            ..Default::default()
        };
        let mut s = SendStream::new(cfg, vec![tx]).unwrap();
        let refs: Vec<HeapRef> = c.heaps.iter().map(|h| HeapRef::new(h, 0)).collect();
        s.send_heaps(&refs, SendMode::Serial).unwrap();
    }
    let mut got = Vec::new();
    for _ in names {
        let line = lines.next().expect("spead2 receiver ended early").unwrap();
        got.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    child.wait().unwrap();
    let items = |i: usize| got[i]["items"].clone();
    let raw = |i: usize| got[i]["raw"].clone();
    assert_eq!(raw(0)["5632"], 0x12_3456_789a_u64);
    assert_eq!(raw(0)["12546"], 0x1_0000_0002_u64);
    let a: Vec<i64> = serde_json::from_value(items(1)["4096"].clone()).unwrap();
    assert_eq!(a, (0..1000).map(|i| (i % 256) - 128).collect::<Vec<i64>>());
    let b: Vec<Vec<u64>> = serde_json::from_value(items(1)["4097"].clone()).unwrap();
    assert_eq!(b[4][6], 34 * 3 + 1);
    assert_eq!(got[1]["descriptors"][1]["name"], "table");
    assert_eq!(got[1]["descriptors"][1]["description"], "u32 table");
    assert_eq!(raw(2)["17152"], common::hex(&multipacket_data()));
    assert_eq!(raw(2)["5632"], 0xabcdef);
    assert_eq!(raw(3)["8249"], 57 * 1001);
    assert_eq!(raw(3)["4096"], common::hex(&(0..100u8).collect::<Vec<_>>()));
}
