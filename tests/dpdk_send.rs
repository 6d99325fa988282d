//! `--send-transport dpdk` from the command line (issue 15). With `--features dpdk`: `cbf dsim`
//! sends through DPDK's `net_af_packet` on one end of a veth pair, a kernel UDP socket in
//! another network namespace receives on the other end, and the same run over UDP sockets (out
//! of the same veth end) must deliver the same packets byte for byte, every heap complete,
//! except the values of the two items that come from the clock (heap counter and timestamp,
//! checked separately: the counters are dsim's 2, 4, 6, … in both runs, the timestamps
//! consecutive). The oracle is the UDP path, not the DPDK code; the packets are read by a
//! hand-written SPEAD pointer reader. Two send threads on one port (`--send-threads 2`, a TX
//! queue each, `qpairs=2`) must deliver everything too, as two threads over UDP do. Needs root
//! (namespaces). Without the feature, and with it, the refusals of impossible combinations are
//! checked by the flag they name, among them more senders on a port than its driver has TX
//! queues.

use std::process::Command;

/// The error `cbf args` stops with (it must stop).
fn refusal(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const DSIM: &[&str] = &[
    "dsim",
    "--adc-sample-rate",
    "1e7",
    "--period",
    "4096",
    "--katcp-port",
    "0",
];
const FENGINE: &[&str] = &[
    "fengine",
    "239.1.1.1:7148",
    "--adc-sample-rate",
    "1e6",
    "--sync-time",
    "0",
    "--katcp-port",
    "0",
    "--wideband",
    "name=w,channels=64,dst=239.2.2.2:7148",
];

#[cfg(not(feature = "dpdk"))]
#[test]
fn dpdk_send_is_refused_without_the_feature_naming_the_flag() {
    let dpdk = ["--send-transport", "dpdk"];
    for args in [
        [DSIM, &dpdk, &["239.3.3.3:7148"]].concat(),
        [FENGINE, &dpdk].concat(),
    ] {
        let err = refusal(&args);
        assert!(
            err.contains("error: --send-transport:") && err.contains("--features dpdk"),
            "{err}"
        );
    }
}

#[cfg(feature = "dpdk")]
#[test]
fn impossible_dpdk_send_combinations_are_refused_naming_the_flag() {
    let eal =
        "-l 0 --no-huge --no-pci -m 64 --no-shconf --file-prefix=cbfsendrefuse --vdev=net_null0";
    let dpdk = [
        "--send-transport",
        "dpdk",
        "--dpdk-args",
        eal,
        "--dpdk-src",
        "10.0.0.1",
    ];
    let group = "239.3.3.3:7148";
    let cases: [(&[&str], Vec<&str>, &str); 5] = [
        (DSIM, vec!["--ibv", group], "--ibv"),
        (FENGINE, vec!["--send-ibv"], "--send-ibv"),
        (
            DSIM,
            vec!["--dpdk-dst-mac", "02:00", group],
            "--dpdk-dst-mac",
        ),
        // A unicast destination and no next-hop MAC: refused before the EAL starts.
        (DSIM, vec!["10.0.0.2:7148"], "--dpdk-dst-mac"),
        // Three sources for one port.
        (
            DSIM,
            vec!["--dpdk-src", "10.0.0.1,10.0.0.2", group],
            "--dpdk-src",
        ),
    ];
    for (cmd, extra, flag) in cases {
        let args = [cmd, &dpdk[..], &extra].concat();
        let err = refusal(&args);
        assert!(err.contains(&format!("error: {flag}:")), "{args:?}: {err}");
    }
    let err = refusal(&[DSIM, &["--dpdk-src", "10.0.0.1", group]].concat());
    assert!(
        err.contains("--dpdk-src: needs --send-transport dpdk"),
        "{err}"
    );
}

/// A sender per TX queue: two send threads (dsim) or two outputs (fengine) on a port whose
/// driver has one TX queue (`net_af_packet` without `qpairs`, on `lo`: nothing is sent) are
/// refused at start-up, naming the flag that made them.
#[cfg(feature = "dpdk")]
#[test]
fn more_senders_than_tx_queues_are_refused_naming_the_flag() {
    let eal = format!(
        "-l 0 --no-huge --no-pci -m 128 --no-shconf --file-prefix=cbftxq{} --log-level=error \
         --vdev=net_af_packet0,iface=lo",
        std::process::id()
    );
    let dpdk = [
        "--send-transport",
        "dpdk",
        "--dpdk-args",
        &eal,
        "--dpdk-src",
        "10.0.0.1",
    ];
    let two_outputs = ["--wideband", "name=w2,channels=64,dst=239.2.2.3:7148"];
    for (args, flag) in [
        (
            [DSIM, &dpdk, &["--send-threads", "2", "239.3.3.3:7148"]].concat(),
            "--send-threads",
        ),
        ([FENGINE, &dpdk, &two_outputs].concat(), "--dpdk-port"),
    ] {
        let err = refusal(&args);
        assert!(
            err.contains(&format!("error: {flag}:"))
                && err.contains("2 senders need a TX queue each")
                && err.contains("at most 1"),
            "{args:?}: {err}"
        );
    }
}

#[cfg(feature = "dpdk")]
mod wire {
    use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    const TX_NS_IP: &str = "10.78.0.2";
    const RX_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
    const GROUPS: [Ipv4Addr; 2] = [Ipv4Addr::new(239, 78, 0, 1), Ipv4Addr::new(239, 78, 0, 2)];
    const PORT: u16 = 7152;
    const HEAPS_PER_POL: usize = 64;
    const TIMESTAMP_ID: u64 = 0x1600;
    const HEAP_CNT_ID: u64 = 0x0001;
    const HEAP_SAMPLES: u64 = 4096;

    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args:?} failed (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Two namespaces joined by a veth pair: `rx` (veth end at 10.78.0.1) and `tx` (10.78.0.2),
    /// so that neither sees the other's address as its own.
    struct Namespaces {
        rx: String,
        tx: String,
        tx_dev: String,
    }

    impl Namespaces {
        /// `tag` tells apart the namespaces of tests running at once in this process.
        fn new(tag: char) -> Namespaces {
            let id = std::process::id() % 100_000;
            let ns = Namespaces {
                rx: format!("cbf-srx{tag}-{id}"),
                tx: format!("cbf-stx{tag}-{id}"),
                tx_dev: format!("cst{tag}{id}"),
            };
            let rx_dev = format!("csr{tag}{id}");
            ip(&["netns", "add", &ns.rx]);
            ip(&["netns", "add", &ns.tx]);
            ip(&[
                "link", "add", &rx_dev, "mtu", "9000", "netns", &ns.rx, "type", "veth", "peer",
                "name", &ns.tx_dev, "mtu", "9000", "netns", &ns.tx,
            ]);
            for (n, dev, addr) in [
                (&ns.rx, &rx_dev, "10.78.0.1/24"),
                (&ns.tx, &ns.tx_dev, "10.78.0.2/24"),
            ] {
                ip(&["-n", n, "link", "set", "lo", "up"]);
                ip(&["-n", n, "link", "set", dev, "up"]);
                ip(&["-n", n, "addr", "add", addr, "dev", dev]);
                ip(&["-n", n, "route", "add", "224.0.0.0/4", "dev", dev]);
            }
            ns
        }
    }

    impl Drop for Namespaces {
        fn drop(&mut self) {
            for n in [&self.rx, &self.tx] {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }

    /// Receive both groups in namespace `ns` until `stop` is raised and nothing arrives for a
    /// while; `ready` is sent once the groups are joined.
    fn receive(ns: String, ready: mpsc::Sender<()>, stop: Arc<AtomicBool>) -> Vec<Vec<u8>> {
        let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
        // SAFETY: setns on a valid namespace descriptor moves only this thread.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).unwrap();
        for g in GROUPS {
            s.join_multicast_v4(&g, &RX_IP).unwrap();
        }
        let size: libc::c_int = 16 << 20;
        // SAFETY: setsockopt reads one int from a valid pointer.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        ready.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            match s.recv(&mut buf) {
                Ok(n) => got.push(buf[..n].to_vec()),
                Err(_) if stop.load(Ordering::Acquire) => return got,
                Err(_) => {}
            }
        }
    }

    /// What one dsim run (with `transport` flags, in namespace `tx`) delivered.
    fn dsim_run(ns: &Namespaces, transport: &[&str]) -> Vec<Vec<u8>> {
        let (ready_tx, ready) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (rx_ns, flag) = (ns.rx.clone(), Arc::clone(&stop));
        let t = std::thread::spawn(move || receive(rx_ns, ready_tx, flag));
        ready.recv().unwrap();
        let dests = GROUPS.map(|g| format!("{g}:{PORT}"));
        let max_heaps = HEAPS_PER_POL.to_string();
        let mut args = vec![
            "netns",
            "exec",
            &ns.tx,
            env!("CARGO_BIN_EXE_cbf"),
            "dsim",
            "--adc-sample-rate",
            "1e7",
            "--heap-samples",
            "4096",
            "--period",
            "32768",
            "--max-heaps",
            &max_heaps,
            "--dither-seed",
            "7",
            "--signals",
            "cw(0.3, 1234567.0);",
            "--katcp-port",
            "0",
            "--ttl",
            "4",
        ];
        args.extend_from_slice(transport);
        args.extend(dests.iter().map(String::as_str));
        let out = Command::new("ip").args(&args).output().unwrap();
        stop.store(true, Ordering::Release);
        let got = t.join().unwrap();
        assert!(
            out.status.success(),
            "dsim {transport:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        got
    }

    /// The values of the packet's item pointers (SPEAD-64-48: 8-byte header whose last two
    /// bytes count the pointers; each pointer an immediate flag, a 15-bit id, a 48-bit value).
    fn pointers(p: &[u8]) -> Vec<(u64, u64, usize)> {
        let n = usize::from(u16::from_be_bytes([p[6], p[7]]));
        (0..n)
            .map(|k| {
                let v = u64::from_be_bytes(p[8 + 8 * k..16 + 8 * k].try_into().unwrap());
                ((v >> 48) & 0x7fff, v & ((1 << 48) - 1), 8 + 8 * k)
            })
            .collect()
    }

    fn item(p: &[u8], id: u64) -> Option<u64> {
        pointers(p).into_iter().find(|x| x.0 == id).map(|x| x.1)
    }

    /// The packet with the heap counter's and the timestamp's values zeroed, sorted with its
    /// fellows so that runs starting at different times (and pattern phases) compare.
    fn without_clock(packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = packets
            .iter()
            .map(|p| {
                let mut p = p.clone();
                for (id, _, at) in pointers(&p) {
                    if id == HEAP_CNT_ID || id == TIMESTAMP_ID {
                        p[at + 2..at + 8].fill(0);
                    }
                }
                p
            })
            .collect();
        v.sort();
        v
    }

    /// Every data heap once, counters 2, 4, 6, …, each polarisation's timestamps consecutive.
    fn assert_complete(packets: &[Vec<u8>], transport: &str) {
        let data: Vec<&Vec<u8>> = packets
            .iter()
            .filter(|p| item(p, TIMESTAMP_ID).is_some())
            .collect();
        assert_eq!(data.len(), 2 * HEAPS_PER_POL, "{transport}: data heaps");
        let mut cnts: Vec<u64> = data.iter().map(|p| item(p, HEAP_CNT_ID).unwrap()).collect();
        cnts.sort_unstable();
        let want: Vec<u64> = (1..=2 * HEAPS_PER_POL as u64).map(|k| 2 * k).collect();
        assert_eq!(cnts, want, "{transport}: heap counters");
        for pol in 0..2u64 {
            let mut ts: Vec<u64> = data
                .iter()
                .filter(|p| item(p, 0x3101) == Some(pol))
                .map(|p| item(p, TIMESTAMP_ID).unwrap())
                .collect();
            ts.sort_unstable();
            assert_eq!(ts.len(), HEAPS_PER_POL, "{transport}: pol {pol}");
            assert!(
                ts.windows(2).all(|w| w[1] - w[0] == HEAP_SAMPLES),
                "{transport}: pol {pol} timestamps {ts:?}"
            );
        }
    }

    /// The EAL for `net_af_packet0` on the namespace's veth end, with `extra` devargs.
    fn eal(ns: &Namespaces, extra: &str) -> String {
        format!(
            "-l 0 --no-huge --no-pci -m 256 --no-shconf --file-prefix=cbfsend{} \
             --log-level=error --vdev=net_af_packet0,iface={},blocksz=36864,framesz=9216,framecnt=512{extra}",
            ns.tx_dev,
            ns.tx_dev
        )
    }

    fn dpdk_flags(eal: &str) -> Vec<&str> {
        vec![
            "--send-transport",
            "dpdk",
            "--dpdk-args",
            eal,
            "--dpdk-port",
            "net_af_packet0",
            "--dpdk-src",
            TX_NS_IP,
        ]
    }

    #[test]
    fn dsim_over_dpdk_delivers_what_it_delivers_over_udp() {
        let ns = Namespaces::new('a');
        let eal = eal(&ns, "");
        let udp = dsim_run(&ns, &["--interface", TX_NS_IP]);
        let dpdk = dsim_run(&ns, &dpdk_flags(&eal));
        assert_complete(&udp, "udp");
        assert_complete(&dpdk, "dpdk");
        assert_eq!(
            without_clock(&dpdk),
            without_clock(&udp),
            "DPDK and UDP delivered different packets"
        );
    }

    /// Two send threads on one port, each with a TX queue of its own (the port started with
    /// two: `qpairs=2` lets `net_af_packet` have them), deliver every heap between them
    /// (thread 0 counts 2, 6, 10, …, thread 1 4, 8, 12, …), the same packets as two threads
    /// over UDP sockets.
    #[test]
    fn two_send_threads_on_one_port_both_deliver_everything() {
        let ns = Namespaces::new('b');
        let eal = eal(&ns, ",qpairs=2");
        let threads = ["--send-threads", "2"];
        let udp = dsim_run(&ns, &[&["--interface", TX_NS_IP][..], &threads].concat());
        let dpdk = dsim_run(&ns, &[dpdk_flags(&eal), threads.to_vec()].concat());
        assert_complete(&udp, "udp, two threads");
        assert_complete(&dpdk, "dpdk, two threads");
        assert_eq!(
            without_clock(&dpdk),
            without_clock(&udp),
            "DPDK and UDP delivered different packets"
        );
    }
}
