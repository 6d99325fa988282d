//! The DPDK half of the conformance suite (only with `--features dpdk`). DPDK allows one EAL
//! per process, so one test makes the namespace and veth pair, enters the namespace, starts
//! the EAL with both virtual ports, and runs every case over each.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use cbf::net::dpdk::{DpdkConfig, DpdkReceiver, DpdkSendConfig, DpdkSender};
use cbf::net::frame::{FrameDrop, FrameHeaders, HEADERS_LEN};
use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};

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
}
