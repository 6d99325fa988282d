//! The DPDK half of the conformance suite (only with `--features dpdk`). DPDK allows one EAL
//! per process, so one test makes the namespace and veth pair, enters the namespace, starts
//! the EAL with both virtual ports, and runs every case over each.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use cbf::engine::recv::{open_sources, RecvTransport, SourceConfig};
use cbf::engine::send::{open_senders, DpdkSend, SendFlags, SendTransport};
use cbf::net::dpdk::{DpdkConfig, DpdkReceiver, DpdkSendConfig, DpdkSender};
use cbf::net::frame::{FrameDrop, FrameHeaders, HEADERS_LEN};
use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};
use cbf::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

use super::{conform, receive, Case, MAX_PACKET};

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip (install iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?} failed (the DPDK conformance test needs root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Move the calling thread into network namespace `name`.
fn enter(name: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
    // SAFETY: setns on a valid namespace file descriptor affects only this thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

/// Send a case through a DPDK sender from another thread: ours to `dst`, foreign to `other`.
fn send_dpdk(
    case: &Case,
    mut tx: DpdkSender,
    sent: Arc<AtomicBool>,
) -> thread::JoinHandle<DpdkSender> {
    let ours = case.ours.clone();
    let foreign = case.foreign.clone();
    thread::spawn(move || {
        let mut f = foreign.iter();
        for (i, p) in ours.iter().enumerate() {
            let mut b = SendBatch::default();
            b.push_packet(p, 0);
            if i % 4 == 0 {
                if let Some(x) = f.next() {
                    b.push_packet(x, 1);
                }
            }
            tx.send_batch(&b).unwrap();
        }
        let mut b = SendBatch::default();
        for x in f {
            b.push_packet(x, 1);
        }
        tx.send_batch(&b).unwrap();
        sent.store(true, Ordering::Release);
        tx
    })
}

/// Frames with one defect each, built from a good one, and the cause each must be counted as.
fn bad_frames(good: &[u8]) -> Vec<(Vec<u8>, FrameDrop)> {
    let reseal = |v: &mut Vec<u8>| {
        v[24] = 0;
        v[25] = 0;
        let c = cbf::net::frame::internet_checksum(&v[14..34], 0);
        v[24..26].copy_from_slice(&c.to_be_bytes());
    };
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.to_vec();
        f(&mut v);
        v
    };
    vec![
        (edit(&|v| v.truncate(30)), FrameDrop::Truncated),
        (edit(&|v| v[12] = 0x86), FrameDrop::NotIpv4),
        (edit(&|v| v[30] ^= 1), FrameDrop::IpChecksum),
        (
            edit(&|v| {
                v[20] |= 0x20;
                reseal(v)
            }),
            FrameDrop::Fragment,
        ),
        (
            edit(&|v| {
                v[23] = 6;
                reseal(v)
            }),
            FrameDrop::NotUdp,
        ),
        (edit(&|v| v.truncate(v.len() - 1)), FrameDrop::IpLength),
        (edit(&|v| v[39] = 3), FrameDrop::UdpLength),
    ]
}

#[test]
fn dpdk_conforms() {
    let id = std::process::id() % 100_000;
    let ns = format!("cbf-dpdk-{id}");
    let (va, vb) = (format!("cda{id}"), format!("cdb{id}"));
    ip(&["netns", "add", &ns]);
    let _guard = Netns(ns.clone());
    ip(&[
        "-n", &ns, "link", "add", &va, "mtu", "9000", "type", "veth", "peer", "name", &vb, "mtu",
        "9000",
    ]);
    for dev in ["lo", &va, &vb] {
        ip(&["-n", &ns, "link", "set", dev, "up"]);
    }
    ip(&["-n", &ns, "addr", "add", "10.77.0.1/24", "dev", &va]);
    ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", &va]);
    enter(&ns);
    let eal = format!(
        "-l 0 --no-huge --no-pci -m 256 --no-shconf --file-prefix=cbfconf{id} --log-level=error \
         --vdev=net_ring0 --vdev=net_af_packet0,iface={vb},blocksz=36864,framesz=9216,framecnt=512"
    );
    let ring = DpdkConfig {
        eal_args: eal.clone(),
        port: "net_ring0".into(),
    };
    let dst: SocketAddrV4 = "239.77.0.1:7148".parse().unwrap();
    let other: SocketAddrV4 = "239.77.0.1:7149".parse().unwrap();
    let src_cfg = DpdkSendConfig {
        src: "10.77.0.9:7148".parse().unwrap(),
        dst_mac: None,
        ttl: 4,
    };

    // net_ring: what the sender puts in the ring, the receiver takes out, in one process.
    let mut tx = Some(DpdkSender::open(&ring, &src_cfg, &[dst, other]).unwrap());
    conform("dpdk/net_ring", |case| {
        let mut rx = DpdkReceiver::open(&ring, &[dst]).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let t = send_dpdk(case, tx.take().unwrap(), Arc::clone(&sent));
        let o = receive(&mut rx, &sent);
        tx = Some(t.join().unwrap());
        assert_eq!(
            o.frames.get(FrameDrop::NotOurs),
            case.foreign.len() as u64,
            "{}",
            case.name
        );
        assert_eq!(o.frames.total(), case.foreign.len() as u64, "{}", case.name);
        o
    });
    // Frame-level defects, each counted by its cause and none reaching the stream.
    let mut tx = tx.unwrap();
    let mut good = vec![0u8; HEADERS_LEN + 100];
    FrameHeaders::new([2; 6], src_cfg.src, [1, 0, 0x5e, 77, 0, 1], dst, 4)
        .emit(&mut good, 100, 0)
        .unwrap();
    let bad = bad_frames(&good);
    let mut rx = DpdkReceiver::open(&ring, &[dst]).unwrap();
    let frames: Vec<&[u8]> = bad.iter().map(|(f, _)| &f[..]).chain([&good[..]]).collect();
    tx.send_frames(&frames).unwrap();
    let mut batch = RecvBatch::new(16, MAX_PACKET);
    let mut got = 0;
    while let Received::Packets(n) = rx.recv_batch(&mut batch).unwrap() {
        got += n;
    }
    assert_eq!(got, 1, "only the good frame arrives");
    for (_, cause) in &bad {
        assert_eq!(rx.frame_drops().get(*cause), 1, "{cause}");
    }
    assert_eq!(rx.frame_drops().total(), bad.len() as u64);
    drop(rx);
    // Its TX queue back to the port: net_ring0 started with one (nothing planned more), which
    // the engine's sender below takes.
    drop(tx);

    // net_af_packet on the veth: the kernel sends to the group, DPDK receives. IPv6 and other
    // link chatter may arrive too (counted as not_ipv4, not compared).
    let af = DpdkConfig {
        eal_args: eal.clone(),
        port: "net_af_packet0".into(),
    };
    let iface: Ipv4Addr = "10.77.0.1".parse().unwrap();
    conform("dpdk/net_af_packet", |case| {
        let mut rx = DpdkReceiver::open(&af, &[dst]).unwrap();
        let sent = Arc::new(AtomicBool::new(false));
        let (ours, foreign, flag) = (case.ours.clone(), case.foreign.clone(), Arc::clone(&sent));
        let ns = ns.clone();
        let t = thread::spawn(move || {
            enter(&ns);
            let s = UdpSocket::bind(SocketAddrV4::new(iface, 0)).unwrap();
            let mut f = foreign.iter();
            for (i, p) in ours.iter().enumerate() {
                s.send_to(p, dst).unwrap();
                if i % 4 == 0 {
                    if let Some(x) = f.next() {
                        s.send_to(x, other).unwrap();
                    }
                }
            }
            for x in f {
                s.send_to(x, other).unwrap();
            }
            flag.store(true, Ordering::Release);
        });
        let o = receive(&mut rx, &sent);
        t.join().unwrap();
        assert_eq!(
            o.frames.get(FrameDrop::NotOurs),
            case.foreign.len() as u64,
            "{}",
            case.name
        );
        o
    });

    // And back: DPDK sends on the veth, the kernel's UDP receiver on the other end takes the
    // frames, so their headers and checksums are what Linux accepts.
    let back: SocketAddrV4 = "239.77.0.2:7150".parse().unwrap();
    let mut krx = UdpReceiver::bind(&[back], Some(&va), 4 << 20).unwrap();
    let mut dtx = DpdkSender::open(&af, &src_cfg, &[back]).unwrap();
    let packets: Vec<Vec<u8>> = (0..50u8)
        .map(|i| vec![i; 100 + 40 * usize::from(i)])
        .collect();
    let mut b = SendBatch::default();
    for p in &packets {
        b.push_packet(p, 0);
    }
    dtx.send_batch(&b).unwrap();
    let mut batch = RecvBatch::new(64, krx.slot_size(MAX_PACKET));
    let mut got = Vec::new();
    while let Received::Packets(_) = krx.recv_batch(&mut batch).unwrap() {
        got.extend(batch.iter().map(<[u8]>::to_vec));
    }
    assert_eq!(got, packets, "the kernel received what DPDK sent");
    drop(dtx);

    // The engines' way in (`engine::recv`, `engine::send`, from one set of EAL arguments):
    // a DPDK receiver and DPDK senders in one process, on one port (net_ring0 receives what its
    // own TX queue sends) and on two (net_af_packet0 out to the kernel), a send stream
    // balancing heaps over both ports as over UDP sockets.
    engine_send_and_receive_share_the_eal(&ring, &va, src_cfg.src);
}

/// SPEAD-64-48 item `id` of a packet, read by hand (8-byte header with the item count in its
/// last two bytes, then 8-byte pointers: immediate flag, 15-bit id, 48-bit value).
fn spead_item(packet: &[u8], id: u64) -> Option<u64> {
    let n = usize::from(u16::from_be_bytes([packet[6], packet[7]]));
    (0..n)
        .map(|k| u64::from_be_bytes(packet[8 + 8 * k..16 + 8 * k].try_into().unwrap()))
        .find(|p| (p >> 48) & 0x7fff == id)
        .map(|p| p & ((1 << 48) - 1))
}

/// Every packet `rx` has until it goes idle.
fn drain(rx: &mut dyn PacketReceiver) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(64, rx.slot_size(MAX_PACKET));
    let mut got = Vec::new();
    while let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
        got.extend(batch.iter().map(<[u8]>::to_vec));
    }
    got
}

fn engine_send_and_receive_share_the_eal(ring: &DpdkConfig, va: &str, src: SocketAddrV4) {
    const HEAPS: u64 = 200;
    let group: SocketAddrV4 = "239.77.0.3:7151".parse().unwrap();
    let mut ring_rx = open_sources(&SourceConfig {
        src: group.to_string(),
        interface: None,
        buffer: 1 << 20,
        threads: 1,
        transport: RecvTransport::Dpdk,
        comp_vectors: vec![],
        ibv_mprq: Default::default(),
        busy_poll: None,
        numa_node: None,
        dpdk: Some(ring.clone()),
    })
    .unwrap()
    .pop()
    .unwrap();
    let mut kernel_rx = UdpReceiver::bind(&[group], Some(va), 8 << 20).unwrap();
    let transport = SendTransport::Dpdk(DpdkSend {
        eal: ring.clone(),
        src: vec![src],
        dst_mac: None,
    });
    let ports = ["net_ring0".to_string(), "net_af_packet0".to_string()];
    let senders = open_senders(
        &[group],
        &ports,
        4,
        1 << 20,
        8264,
        &transport,
        SendFlags::ENGINE,
    )
    .unwrap();
    let config = SendStreamConfig {
        max_packet_size: 8264,
        rate: 100e6,
        ..Default::default()
    };
    let mut stream = SendStream::new(config, senders).unwrap();
    for i in 0..HEAPS {
        let payload = vec![i as u8; 6000];
        let mut heap = Heap::new();
        heap.add_immediate(0x1600, i).add_bytes(0x4000, payload);
        stream
            .send_heaps(&[HeapRef::new(&heap, 0)], SendMode::RoundRobin)
            .unwrap();
    }
    let by_port = [drain(&mut *ring_rx), drain(&mut kernel_rx)];
    let mut seen: Vec<u64> = Vec::new();
    for (name, packets) in ports.iter().zip(&by_port) {
        let share = packets.len() as f64 / HEAPS as f64;
        assert!(
            (0.45..=0.55).contains(&share),
            "{name} carried {share:.2} of the heaps"
        );
        for p in packets {
            let ts = spead_item(p, 0x1600).expect("a timestamp");
            assert!(p.ends_with(&[ts as u8; 6000]), "heap {ts} arrived intact");
            seen.push(ts);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..HEAPS).collect::<Vec<_>>(), "every heap, once");
    let bytes: Vec<u64> = stream.interfaces().map(|(_, c)| c.bytes).collect();
    let (lo, hi) = (bytes[0].min(bytes[1]) as f64, bytes[0].max(bytes[1]) as f64);
    assert!(hi / lo < 1.05, "bytes per port {bytes:?}");
}
