//! `cbf capture`: receive any SPEAD stream from UDP endpoints or a pcap file and print one
//! JSON line per heap (cnt, each item's id with its immediate value or its length and CRC-32,
//! descriptors decoded), or, with `--stats`, rates and counters by cause. `--pcap` writes
//! every datagram received to a pcap file. `--plot DIR` draws quick-look PNGs of F, X and beam
//! heaps ([`crate::quicklook`]) every `--plot-every` seconds and prints a summary line.

use std::io::{self, Write};
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::CliError;
use crate::engine::recv::{apply_busy_poll, check_busy_poll, open_dpdk, RecvTransport};
use crate::engine::recv_numa;
use crate::engine::{check_seconds, Shutdown};
use crate::net::dpdk::DpdkConfig;
use crate::net::frame::{FrameDrop, FrameDrops};
use crate::net::pcap::{PcapDump, PcapReceiver};
use crate::net::udp::UdpReceiver;
use crate::net::uring::UringReceiver;
use crate::net::{parse_endpoints, PacketReceiver, Received, RecvBatch};
use crate::quicklook::QuickLook;
use crate::spead::items::{Descriptor, ItemValue};
use crate::spead::recv::{HeapStream, HeapStreamConfig, ReceivedHeap, StatsSnapshot};

#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// UDP endpoints (A.B.C.D[+N]:port[,...]) or a pcap file to replay.
    pub src: String,
    /// Interface (name or address) on which to join multicast groups.
    #[arg(long)]
    pub interface: Option<String>,
    /// Socket receive buffer in bytes.
    #[arg(long, default_value_t = 128 << 20)]
    pub buffer: usize,
    /// How the endpoints are read: `udp` (recvmmsg), `uring` (io_uring multishot receive) or
    /// `dpdk` (a DPDK port: --dpdk-args, --dpdk-port).
    #[arg(long, value_enum, default_value_t = RecvTransport::Udp)]
    pub recv_transport: RecvTransport,
    /// Busy-poll the receive sockets for this many µs (1–10000) before sleeping:
    /// SO_BUSY_POLL with `udp`, io_uring NAPI busy polling with `uring` (Linux 6.9); refused
    /// with `dpdk` and `ibv`, whose receive loops poll already.
    #[arg(long, value_name = "µs")]
    pub recv_busy_poll: Option<u32>,
    /// NUMA node for the receive memory (packet slots, io_uring buffers) [default: the node
    /// of the --interface NIC, from /sys/class/net/<if>/device/numa_node; else not bound].
    #[arg(long, value_name = "NODE")]
    pub recv_numa_node: Option<u32>,
    #[command(flatten)]
    pub dpdk: super::dpdk::DpdkArgs,
    /// Stop after this many heaps.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print rates and counters (every second and at the end) instead of heaps.
    #[arg(long)]
    pub stats: bool,
    /// Write every datagram received to this pcap file.
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// Heaps in flight per substream before the oldest is evicted.
    #[arg(long, default_value_t = 4)]
    pub max_heaps: usize,
    /// Substreams (heap cnt modulo this) with their own heap slots.
    #[arg(long, default_value_t = 1)]
    pub substreams: usize,
    /// Largest datagram accepted, in bytes.
    #[arg(long, default_value_t = 9200)]
    pub packet_size: usize,
    /// Keep running after a stop heap.
    #[arg(long)]
    pub ignore_stop: bool,
    /// Draw quick-look PNGs (F spectra, X baselines and waterfall, beam power) into DIR and
    /// print a summary line, instead of heaps.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Seconds between redrawing the --plot pictures (they are also drawn at the end).
    #[arg(long, default_value_t = 5.0)]
    pub plot_every: f64,
}

impl CaptureArgs {
    /// How `SRC` is read, from the flags (`dpdk`: the EAL and port from `--dpdk-args`).
    fn source_options<'a>(&'a self, dpdk: Option<&'a DpdkConfig>) -> SourceOptions<'a> {
        SourceOptions {
            interface: self.interface.as_deref(),
            buffer: self.buffer,
            transport: self.recv_transport,
            max_packet: self.packet_size,
            busy_poll: self.recv_busy_poll,
            numa_node: self.recv_numa_node,
            dpdk,
        }
    }
}

/// Redraw the quick-look pictures and print the summary line.
fn plot(q: &QuickLook, dir: &Path) -> Result<(), CliError> {
    let files =
        crate::quicklook::draw::write_all(q, dir).map_err(|e| CliError::flag("--plot", e))?;
    eprintln!(
        "capture: {} ({} pictures in {})",
        q.summary(),
        files.len(),
        dir.display()
    );
    Ok(())
}

/// One heap as a JSON object.
pub fn heap_json(heap: &ReceivedHeap) -> Value {
    let items: Vec<Value> = heap
        .items()
        .into_iter()
        .map(|(id, v)| match v {
            ItemValue::Immediate(x) => json!({"id": format!("0x{id:x}"), "immediate": x}),
            ItemValue::Bytes(b) => json!({
                "id": format!("0x{id:x}"),
                "length": b.len(),
                "crc32": format!("{:08x}", crc32fast::hash(b)),
            }),
        })
        .collect();
    let descriptors: Vec<Value> = heap
        .descriptors()
        .into_iter()
        .map(|d| match d {
            Ok(d) => descriptor_json(&d),
            Err(e) => json!({"error": e.to_string()}),
        })
        .collect();
    let mut v = json!({
        "cnt": heap.cnt,
        "complete": heap.complete,
        "heap_length": heap.heap_length,
        "received": heap.received,
        "items": items,
    });
    if !descriptors.is_empty() {
        v["descriptors"] = Value::Array(descriptors);
    }
    v
}

fn descriptor_json(d: &Descriptor) -> Value {
    let mut v = json!({
        "id": format!("0x{:x}", d.id),
        "name": d.name,
        "description": d.description,
        "shape": d.shape,
    });
    match &d.numpy_header {
        Some(h) => v["dtype"] = json!(h),
        None => {
            v["format"] = json!(d
                .format
                .iter()
                .map(|(c, b)| json!([(*c as char).to_string(), b]))
                .collect::<Vec<_>>())
        }
    }
    v
}

/// The stream's counters with the transport's kernel drops.
fn counted(stream: &HeapStream, source: &impl PacketReceiver) -> StatsSnapshot {
    StatsSnapshot {
        kernel_drops: source.kernel_drops(),
        ..stream.stats()
    }
}

/// The stream's counters as JSON, with the frames the transport refused (frame-level
/// transports only; `frame_<cause>`).
fn stats_json(s: &StatsSnapshot, frames: &FrameDrops, elapsed: f64) -> Value {
    let mut v = serde_json::Map::new();
    v.insert("elapsed_s".into(), json!(elapsed));
    v.insert(
        "gbps".into(),
        json!(s.bytes as f64 * 8.0 / elapsed.max(1e-9) / 1e9),
    );
    v.insert(
        "packets_per_s".into(),
        json!(s.packets as f64 / elapsed.max(1e-9)),
    );
    for (name, value) in s.fields(&[]) {
        v.insert(name, json!(value));
    }
    for cause in FrameDrop::ALL {
        v.insert(format!("frame_{cause}"), json!(frames.get(cause)));
    }
    Value::Object(v)
}

/// How `SRC` is read: the transport and its settings.
#[derive(Debug, Clone, Copy)]
pub struct SourceOptions<'a> {
    pub interface: Option<&'a str>,
    pub buffer: usize,
    pub transport: RecvTransport,
    pub max_packet: usize,
    /// `--recv-busy-poll`, as for the engines (`engine::recv`).
    pub busy_poll: Option<u32>,
    /// `--recv-numa-node`, as for the engines (`engine::recv_numa`).
    pub numa_node: Option<u32>,
    pub dpdk: Option<&'a DpdkConfig>,
}

/// Where the packets come from.
pub fn open_source(
    src: &str,
    opts: SourceOptions<'_>,
) -> Result<(Box<dyn PacketReceiver>, SocketAddrV4), CliError> {
    let SourceOptions {
        interface,
        buffer,
        transport,
        max_packet,
        busy_poll,
        numa_node,
        dpdk,
    } = opts;
    let path = Path::new(src);
    check_busy_poll(busy_poll, transport, path.is_file())?;
    recv_numa::check_forced(numa_node)?;
    if path.is_file() {
        let r = PcapReceiver::open(path, &[])
            .map_err(|e| CliError::flag("src", format!("{src}: {e}")))?;
        return Ok((Box::new(r), SocketAddrV4::new([0, 0, 0, 0].into(), 0)));
    }
    let eps = parse_endpoints(src)
        .map_err(|e| CliError::flag("src", format!("{e} (and no such file)")))?;
    let mut r: Box<dyn PacketReceiver> = match transport {
        RecvTransport::Udp => {
            let mut r = UdpReceiver::bind(&eps, interface, buffer)
                .map_err(|e| CliError::flag("src", format!("cannot receive on {src}: {e}")))?;
            apply_busy_poll(busy_poll, |us| r.set_busy_poll(us))?;
            Box::new(r)
        }
        RecvTransport::Uring => {
            let mut r = UringReceiver::bind(&eps, interface, buffer, max_packet).map_err(|e| {
                CliError::flag("--recv-transport", format!("cannot receive on {src}: {e}"))
            })?;
            apply_busy_poll(busy_poll, |us| r.set_busy_poll(us))?;
            Box::new(r)
        }
        RecvTransport::Dpdk => {
            open_dpdk(dpdk, &eps).map_err(|e| CliError::flag(e.flag, e.message))?
        }
        RecvTransport::Ibv => {
            return Err(CliError::flag(
                "--recv-transport",
                "capture reads udp, uring or dpdk (ibv is the engines' transport)",
            ))
        }
    };
    recv_numa::bind_sources(numa_node, std::slice::from_mut(&mut r))?;
    Ok((r, eps[0]))
}

pub fn run(args: CaptureArgs) -> Result<(), CliError> {
    if args.max_heaps == 0 {
        return Err(CliError::flag("--max-heaps", "must be at least 1"));
    }
    if args.substreams == 0 {
        return Err(CliError::flag("--substreams", "must be at least 1"));
    }
    if !(64..=65536).contains(&args.packet_size) {
        return Err(CliError::flag("--packet-size", "must be in 64..=65536"));
    }
    let limit = args
        .duration
        .map(|d| check_seconds("--duration", d, true))
        .transpose()
        .map_err(|e| CliError::flag(e.flag, e.message))?;
    let plot_every = check_seconds("--plot-every", args.plot_every, false)
        .map_err(|e| CliError::flag(e.flag, e.message))?;
    let mut quicklook = args.plot.as_ref().map(|_| QuickLook::new());
    let quiet = args.stats || quicklook.is_some();
    let dpdk = args.dpdk.config();
    let (mut source, dst) = open_source(&args.src, args.source_options(dpdk.as_ref()))?;
    let mut dump = args
        .pcap
        .as_deref()
        .map(PcapDump::create)
        .transpose()
        .map_err(|e| CliError::flag("--pcap", e))?;
    let shutdown = Shutdown::install();
    let mut stream = HeapStream::new(HeapStreamConfig {
        max_heaps: args.max_heaps,
        substreams: args.substreams,
        stop_on_stop_item: !args.ignore_stop,
        ..Default::default()
    });
    let mut batch = RecvBatch::new(64, source.slot_size(args.packet_size));
    recv_numa::bind_slots(&batch, args.recv_numa_node, &*source)?;
    let mut heaps = Vec::new();
    let mut n_heaps = 0u64;
    let start = Instant::now();
    let mut last_stats = start;
    let mut last_plot = start;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let src_addr = SocketAddrV4::new([0, 0, 0, 0].into(), 0);
    while !shutdown.requested()
        && !stream.is_stopped()
        && args.count.is_none_or(|c| n_heaps < c)
        && limit.is_none_or(|l| start.elapsed() < l)
    {
        match source.recv_batch(&mut batch)? {
            Received::End => break,
            Received::Idle => {}
            Received::Packets(_) => {
                for p in batch.iter() {
                    if let Some(d) = dump.as_mut() {
                        d.write(src_addr, dst, p)?;
                    }
                    stream.add_packet(p, &mut heaps);
                }
            }
        }
        for h in std::mem::take(&mut heaps) {
            if args.count.is_none_or(|c| n_heaps < c) {
                n_heaps += 1;
                if let Some(q) = quicklook.as_mut() {
                    q.add(&h);
                }
                if !quiet {
                    writeln!(out, "{}", heap_json(&h))?;
                }
            }
            stream.recycle(h);
        }
        if let (Some(q), Some(dir)) = (&quicklook, &args.plot) {
            if last_plot.elapsed() >= plot_every {
                plot(q, dir)?;
                last_plot = Instant::now();
            }
        }
        if args.stats && last_stats.elapsed() >= Duration::from_secs(1) {
            let stats = stats_json(
                &counted(&stream, &source),
                &source.frame_drops(),
                start.elapsed().as_secs_f64(),
            );
            writeln!(out, "{stats}")?;
            out.flush()?;
            last_stats = Instant::now();
        }
    }
    if !stream.is_stopped() {
        stream.flush(&mut heaps);
        for h in heaps.drain(..) {
            if args.count.is_some_and(|c| n_heaps >= c) {
                break;
            }
            n_heaps += 1;
            if let Some(q) = quicklook.as_mut() {
                q.add(&h);
            }
            if !quiet {
                writeln!(out, "{}", heap_json(&h))?;
            }
        }
    }
    if let (Some(q), Some(dir)) = (&quicklook, &args.plot) {
        plot(q, dir)?;
    }
    let stats = stats_json(
        &counted(&stream, &source),
        &source.frame_drops(),
        start.elapsed().as_secs_f64(),
    );
    if args.stats {
        writeln!(out, "{stats}")?;
    } else {
        eprintln!("capture: {stats}");
    }
    out.flush()?;
    if let Some(d) = dump {
        d.finish().map_err(|e| CliError::flag("--pcap", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: CaptureArgs,
    }

    /// A duration that is NaN, negative or beyond `MAX_SECONDS` is refused naming the flag,
    /// before any socket is opened (`--duration 1e300` panicked converting to `Duration`).
    #[test]
    fn extreme_durations_are_refused_naming_the_flag() {
        for value in ["1e300", "NaN", "-1", "inf"] {
            let d = format!("--duration={value}");
            let args = Wrap::try_parse_from(["capture", d.as_str(), "127.0.0.1:1"])
                .unwrap()
                .a;
            match run(args) {
                Err(CliError::Flag { flag, .. }) => assert_eq!(flag, "--duration", "{value}"),
                other => panic!("{value}: expected a --duration error, got {other:?}"),
            }
        }
    }

    /// `capture --recv-busy-poll …` opened: the flag as the command line gives it.
    fn open_with(flags: &[&str], src: &str) -> Result<Box<dyn PacketReceiver>, CliError> {
        let argv = [&["capture"][..], flags, &[src]].concat();
        let args = Wrap::try_parse_from(argv).unwrap().a;
        open_source(&args.src, args.source_options(None)).map(|(r, _)| r)
    }

    fn refused_flag(r: Result<Box<dyn PacketReceiver>, CliError>) -> (&'static str, String) {
        match r {
            Err(CliError::Flag { flag, message }) => (flag, message),
            Err(e) => panic!("expected a flag error, got {e}"),
            Ok(_) => panic!("opened a source the flags refuse"),
        }
    }

    /// `--recv-busy-poll` as the engines have it (`engine::recv`'s test): applied on the socket
    /// transports (read back with SO_BUSY_POLL on the UDP path), refused by name where there is
    /// no socket (dpdk, ibv, a pcap file) or out of bounds, and a kernel's refusal (made here by
    /// a seccomp filter) reported naming the flag and the errno.
    #[test]
    fn recv_busy_poll_is_applied_or_refused_naming_the_flag() {
        let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let src = free.local_addr().unwrap().to_string();
        drop(free);
        for t in ["udp", "uring"] {
            let flags = [
                "--buffer",
                "65536",
                "--recv-transport",
                t,
                "--recv-busy-poll",
            ];
            assert!(
                open_with(&[&flags[..], &["50"]].concat(), &src).is_ok(),
                "{t}"
            );
            for us in ["0", "10001"] {
                let (flag, _) = refused_flag(open_with(&[&flags[..], &[us]].concat(), &src));
                assert_eq!(flag, "--recv-busy-poll", "{t} {us}");
            }
        }
        for t in ["dpdk", "ibv"] {
            let flags = ["--recv-transport", t, "--recv-busy-poll", "50"];
            let (flag, message) = refused_flag(open_with(&flags, &src));
            assert_eq!(flag, "--recv-busy-poll", "{t}: {message}");
            assert!(message.contains("poll"), "{message}");
        }
        let pcap = std::env::temp_dir().join(format!("cbf-busy-poll-{}.pcap", std::process::id()));
        std::fs::write(&pcap, b"").unwrap();
        let r = open_with(&["--recv-busy-poll", "50"], pcap.to_str().unwrap());
        std::fs::remove_file(&pcap).unwrap();
        let (flag, message) = refused_flag(r);
        assert_eq!(flag, "--recv-busy-poll", "{message}");
        assert!(message.contains("pcap"), "{message}");
        let so_busy_poll = vec![(1, libc::SOL_SOCKET as u32), (2, libc::SO_BUSY_POLL as u32)];
        let (flag, message) = crate::net::recv_socket::with_syscall_refused(
            libc::SYS_setsockopt,
            so_busy_poll,
            libc::EPERM as u16,
            move || refused_flag(open_with(&["--recv-busy-poll", "50"], &src)),
        );
        assert_eq!(flag, "--recv-busy-poll");
        assert!(message.contains("EPERM"), "{message}");
    }

    /// `--recv-numa-node` as the engines have it (`engine::recv_numa`'s tests): a node this
    /// host lacks is refused naming the flag before anything is opened (a pcap file too); node
    /// 0 (every host has one) opens, and the packet slots read back bound there from the
    /// kernel; binding to a node that passed no check is refused naming the flag.
    #[test]
    fn recv_numa_node_binds_the_slots_or_is_refused_naming_the_flag() {
        let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let src = free.local_addr().unwrap().to_string();
        drop(free);
        let pcap = std::env::temp_dir().join(format!("cbf-numa-{}.pcap", std::process::id()));
        std::fs::write(&pcap, b"").unwrap();
        for (t, at) in [
            ("udp", &src),
            ("uring", &src),
            ("udp", &pcap.display().to_string()),
        ] {
            let flags = ["--recv-transport", t, "--recv-numa-node", "1000"];
            let (flag, message) = refused_flag(open_with(&flags, at));
            assert_eq!(flag, "--recv-numa-node", "{t} {at}: {message}");
            assert!(message.contains("no NUMA node 1000"), "{message}");
        }
        std::fs::remove_file(&pcap).unwrap();
        for t in ["udp", "uring"] {
            let flags = [
                "--buffer",
                "65536",
                "--recv-transport",
                t,
                "--recv-numa-node",
                "0",
            ];
            let source = open_with(&flags, &src).unwrap();
            let mut batch = RecvBatch::new(4, source.slot_size(1500));
            recv_numa::bind_slots(&batch, Some(0), &*source).unwrap();
            let got = crate::net::numa::area_binding(batch.raw_parts().0).unwrap();
            assert!(got.bound && got.nodes == [0], "{t}: {got:?}");
            match recv_numa::bind_slots(&batch, Some(1000), &*source) {
                Err(e) => assert_eq!(e.flag, "--recv-numa-node", "{e}"),
                Ok(()) => panic!("{t}: bound to node 1000"),
            }
        }
    }
}
