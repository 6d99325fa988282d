//! The receive side every engine shares (seed 000 §Network receive, seed 001 §Signal Flow):
//! transports opened from `--src`, one named thread per transport, each a member of one chunk
//! stream group placing heaps through the engine's pure placement function. A transport error
//! stops the group and is reported by [`Receivers::join`], so the engine exits non-zero instead
//! of running on silently without input.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::affinity::pin_current_thread;
use super::recv_numa;
use super::{ConfigError, EngineError, Shutdown};
use crate::net::dpdk::{self, DpdkConfig, DpdkError};
use crate::net::pcap::PcapReceiver;
use crate::net::udp::UdpReceiver;
use crate::net::uring::UringReceiver;
use crate::net::{parse_endpoints, PacketReceiver, Received, RecvBatch};
use crate::spead::recv::chunk::PlaceFn;
use crate::spead::recv::{ChunkGroup, ChunkStream, StatsSnapshot, StreamStats};

/// Largest datagram a receive slot holds (spead2's UDP default, jumbo frames included).
const MAX_PACKET: usize = 9200;

/// Packets per `recv_batch` call.
const BATCH: usize = 64;

/// How the sockets of `--src` endpoints are read (`--recv-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RecvTransport {
    /// `recvmmsg` batches with UDP GRO (`net::udp`).
    #[default]
    Udp,
    /// io_uring multishot receive into a provided-buffer ring (`net::uring`; Linux 6.0).
    Uring,
    /// A DPDK port polled from user space (`net::dpdk`; `--dpdk-args`, `--dpdk-port`; a build
    /// with `--features dpdk`).
    Dpdk,
    /// ibverbs raw-packet queue pairs with flow steering (`net::ibv`; cargo feature `ibv`, an
    /// RDMA NIC; katgpucbf's `--recv-ibv`).
    Ibv,
}

/// Which receive queue the ibverbs transport uses (`--recv-ibv-mprq`; `net::ibv`'s module doc
/// describes both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum IbvMprq {
    /// The striding (multi-packet) queue where the device has one, else one slot per frame.
    #[default]
    Auto,
    /// The striding queue; a device without one is refused at start-up.
    On,
    /// One slot per frame.
    Off,
}

/// Where an engine's input comes from (`--src`, `--recv-interface`, `--recv-buffer`,
/// `--recv-threads`, `--recv-transport`).
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Endpoints `A.B.C.D[+N]:port[,...]`, or the path of a pcap file.
    pub src: String,
    pub interface: Option<String>,
    pub buffer: usize,
    pub threads: usize,
    pub transport: RecvTransport,
    /// Completion vectors of the ibverbs transport (`--recv-comp-vector`), dealt to the
    /// receive threads in turn; negative = polling; empty = vector 0.
    pub comp_vectors: Vec<i32>,
    /// The ibverbs transport's receive queue (`--recv-ibv-mprq`).
    pub ibv_mprq: IbvMprq,
    /// The EAL and port for [`RecvTransport::Dpdk`] (`--dpdk-args`, `--dpdk-port`).
    pub dpdk: Option<DpdkConfig>,
    /// Busy-poll the receive sockets for this many µs (`--recv-busy-poll`): SO_BUSY_POLL on
    /// the UDP path, io_uring's NAPI busy polling on the uring path (what each does and does
    /// not do: `UdpReceiver::set_busy_poll`, `UringReceiver::set_busy_poll`). The DPDK and
    /// ibverbs transports have no socket: their receive loops poll the queue already (DPDK
    /// spins on empty bursts, napping 20 µs once idle; ibverbs polls its completion queue
    /// with `--recv-comp-vector -1`), so the flag is refused there rather than ignored.
    pub busy_poll: Option<u32>,
    /// The NUMA node for the receive memory (`--recv-numa-node`); `None`: the receiving NIC's
    /// where known ([`super::recv_numa`]).
    pub numa_node: Option<u32>,
}

/// Longest `--recv-busy-poll` accepted, in µs: the receive loops wake every 20 ms
/// (`net::udp::POLL_INTERVAL`), and a busy poll of that order would spin the whole interval.
pub const MAX_BUSY_POLL_US: u32 = 10_000;

/// Apply `--recv-busy-poll` to a receiver just bound, naming the flag when the kernel refuses
/// (the engines' receive threads and `cbf capture`).
pub fn apply_busy_poll(
    micros: Option<u32>,
    set: impl FnOnce(u32) -> std::io::Result<u32>,
) -> Result<(), ConfigError> {
    if let Some(us) = micros {
        let held = set(us).map_err(|e| ConfigError::new("--recv-busy-poll", e))?;
        tracing::info!(busy_poll_us = held, "receive sockets busy-poll");
    }
    Ok(())
}

/// Refuse `--recv-busy-poll` where it cannot apply (a pcap file, `transport` without a socket),
/// or out of bounds (the engines' `--src` and `cbf capture`'s `SRC`).
pub fn check_busy_poll(
    busy_poll: Option<u32>,
    transport: RecvTransport,
    pcap: bool,
) -> Result<(), ConfigError> {
    let Some(us) = busy_poll else {
        return Ok(());
    };
    let why = match transport {
        _ if pcap => "a pcap file is read, not polled",
        RecvTransport::Dpdk => "the DPDK receiver polls its queue already (no socket to busy-poll)",
        RecvTransport::Ibv => {
            "ibverbs has no socket to busy-poll; --recv-comp-vector -1 polls its completion queue"
        }
        RecvTransport::Udp | RecvTransport::Uring if (1..=MAX_BUSY_POLL_US).contains(&us) => {
            return Ok(())
        }
        _ => "must be between 1 and 10000 µs",
    };
    Err(ConfigError::new("--recv-busy-poll", why))
}

/// The flag a DPDK failure is the fault of.
pub fn dpdk_flag(e: &DpdkError) -> &'static str {
    match e {
        DpdkError::NotBuilt => "--recv-transport",
        DpdkError::Eal(_) | DpdkError::EalTwice { .. } => "--dpdk-args",
        DpdkError::NoPort { .. }
        | DpdkError::Port { .. }
        | DpdkError::QueueTaken { .. }
        | DpdkError::TxQueues { .. }
        | DpdkError::TxQueuesTaken { .. } => "--dpdk-port",
        DpdkError::Frame(_) => "--dpdk-dst-mac",
    }
}

/// A DPDK receiver for `endpoints`: refused, naming the flag, without the feature, without
/// `--dpdk-args`, or when the EAL or the port cannot start.
pub fn open_dpdk(
    cfg: Option<&DpdkConfig>,
    endpoints: &[std::net::SocketAddrV4],
) -> Result<Box<dyn PacketReceiver>, ConfigError> {
    if !dpdk::AVAILABLE {
        return Err(ConfigError::new("--recv-transport", DpdkError::NotBuilt));
    }
    let cfg = cfg.ok_or_else(|| {
        ConfigError::new(
            "--dpdk-args",
            "--recv-transport dpdk needs the EAL's arguments (e.g. \"-l 0 -a 0000:17:00.0\")",
        )
    })?;
    dpdk::open_receiver(cfg, endpoints).map_err(|e| ConfigError::new(dpdk_flag(&e), e))
}

/// Open the transports: one reader for a pcap file; for endpoints, `threads` UDP receivers
/// with the endpoints dealt round-robin between them (each thread its own sockets and groups,
/// as katgpucbf gives each stream-group member a share of the multicast groups). A
/// transport's own receive ring is bound to the NUMA node of its NIC or `--recv-numa-node`.
pub fn open_sources(cfg: &SourceConfig) -> Result<Vec<Box<dyn PacketReceiver>>, ConfigError> {
    check_busy_poll(cfg.busy_poll, cfg.transport, Path::new(&cfg.src).is_file())?;
    recv_numa::check_forced(cfg.numa_node)?;
    let mut sources = open_unplaced(cfg)?;
    recv_numa::bind_sources(cfg.numa_node, &mut sources)?;
    Ok(sources)
}

fn open_unplaced(cfg: &SourceConfig) -> Result<Vec<Box<dyn PacketReceiver>>, ConfigError> {
    if Path::new(&cfg.src).is_file() {
        if cfg.threads != 1 {
            return Err(ConfigError::new(
                "--recv-threads",
                "a pcap file is read by one thread",
            ));
        }
        let r = PcapReceiver::open(Path::new(&cfg.src), &[])
            .map_err(|e| ConfigError::new("--src", e))?;
        return Ok(vec![Box::new(r)]);
    }
    let eps = parse_endpoints(&cfg.src)
        .map_err(|e| ConfigError::new("--src", format!("{e} (and no such file)")))?;
    if cfg.transport == RecvTransport::Dpdk {
        // One RX queue per port (net::dpdk): one thread reads it.
        if cfg.threads != 1 {
            return Err(ConfigError::new(
                "--recv-threads",
                "the DPDK transport reads its port with one thread",
            ));
        }
        return Ok(vec![open_dpdk(cfg.dpdk.as_ref(), &eps)?]);
    }
    if cfg.threads == 0 || cfg.threads > eps.len() {
        return Err(ConfigError::new(
            "--recv-threads",
            format!(
                "must be between 1 and the number of --src endpoints ({})",
                eps.len()
            ),
        ));
    }
    (0..cfg.threads)
        .map(|t| {
            let mine: Vec<_> = eps.iter().skip(t).step_by(cfg.threads).copied().collect();
            // A list of interfaces (katgpucbf fgpu's multi --recv-interface) is dealt to the
            // receive threads in turn.
            let iface = cfg.interface.as_deref().map(|list| {
                let all: Vec<&str> = list.split(',').collect();
                all[t % all.len()]
            });
            match cfg.transport {
                RecvTransport::Udp => {
                    let mut r = UdpReceiver::bind(&mine, iface, cfg.buffer)
                        .map_err(|e| ConfigError::new("--src", e))?;
                    apply_busy_poll(cfg.busy_poll, |us| r.set_busy_poll(us))?;
                    Ok(Box::new(r) as Box<dyn PacketReceiver>)
                }
                RecvTransport::Uring => {
                    let mut r = UringReceiver::bind(&mine, iface, cfg.buffer, MAX_PACKET)
                        .map_err(|e| ConfigError::new("--recv-transport", e))?;
                    apply_busy_poll(cfg.busy_poll, |us| r.set_busy_poll(us))?;
                    Ok(Box::new(r) as Box<dyn PacketReceiver>)
                }
                RecvTransport::Dpdk => open_dpdk(cfg.dpdk.as_ref(), &mine),
                RecvTransport::Ibv => {
                    let cv = &cfg.comp_vectors;
                    let vector = if cv.is_empty() { 0 } else { cv[t % cv.len()] };
                    open_ibv(
                        &mine,
                        iface,
                        cfg.buffer,
                        vector,
                        cfg.numa_node,
                        cfg.ibv_mprq,
                    )
                }
            }
        })
        .collect()
}

/// One ibverbs receiver for `eps` on `iface` (katgpucbf's `--recv-ibv`), its registered
/// memory on `numa_node` (`--recv-numa-node`) or its device's node, its receive queue as
/// `mprq` says (`--recv-ibv-mprq`).
#[cfg(feature = "ibv")]
fn open_ibv(
    eps: &[std::net::SocketAddrV4],
    iface: Option<&str>,
    buffer: usize,
    comp_vector: i32,
    numa_node: Option<u32>,
    mprq: IbvMprq,
) -> Result<Box<dyn PacketReceiver>, ConfigError> {
    use crate::net::ibv::{rdma_devices, IbvError, IbvReceiver, StridingRq};
    // First whether this host has RDMA at all, so that the refusal says so.
    rdma_devices().map_err(|e| ConfigError::new("--recv-ibv", e))?;
    let iface = iface.ok_or_else(|| {
        ConfigError::new(
            "--recv-interface",
            "--recv-ibv needs the interface to receive on",
        )
    })?;
    let striding = match mprq {
        IbvMprq::Auto => StridingRq::Auto,
        IbvMprq::On => StridingRq::On,
        IbvMprq::Off => StridingRq::Off,
    };
    IbvReceiver::open(
        eps,
        iface,
        buffer,
        MAX_PACKET,
        comp_vector,
        numa_node,
        striding,
    )
    .map(|r| Box::new(r) as Box<dyn PacketReceiver>)
    .map_err(|e| match e {
        IbvError::Numa(_) => ConfigError::new("--recv-numa-node", e),
        IbvError::NoStridingRq(_) => ConfigError::new("--recv-ibv-mprq", e),
        _ => ConfigError::new("--recv-ibv", e),
    })
}

#[cfg(not(feature = "ibv"))]
fn open_ibv(
    _: &[std::net::SocketAddrV4],
    _: Option<&str>,
    _: usize,
    _: i32,
    _: Option<u32>,
    _: IbvMprq,
) -> Result<Box<dyn PacketReceiver>, ConfigError> {
    Err(ConfigError::new("--recv-ibv", crate::net::IBV_NOT_BUILT))
}

/// The running receive threads of one chunk stream group.
pub struct Receivers {
    threads: Vec<JoinHandle<Result<StatsSnapshot, String>>>,
    stats: Vec<Arc<StreamStats>>,
}

impl Receivers {
    /// One thread per source, named `{name}-rx{i}` and bound to `cores[i]` where that is
    /// given (`--recv-affinity`), each feeding `group` through `place` until its source ends,
    /// the group stops, or `shutdown` is raised. Each thread's packet slots are bound to
    /// `numa_node` (`--recv-numa-node`) or else its NIC's node.
    pub fn spawn(
        name: &str,
        group: &Arc<ChunkGroup>,
        place: Arc<PlaceFn>,
        sources: Vec<Box<dyn PacketReceiver>>,
        cores: &[Option<usize>],
        numa_node: Option<u32>,
        shutdown: &Shutdown,
    ) -> std::io::Result<Receivers> {
        let mut threads = Vec::new();
        let mut stats = Vec::new();
        for (i, mut source) in sources.into_iter().enumerate() {
            let mut stream = ChunkStream::new(Arc::clone(group), Arc::clone(&place));
            let my_stats = stream.stats();
            stats.push(Arc::clone(&my_stats));
            let shutdown = shutdown.clone();
            let core = cores.get(i).copied().flatten();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-rx{i}"))
                    .spawn(move || {
                        // The core was checked at start-up; failing now (a core taken offline)
                        // stops the engine rather than receiving off its NUMA node.
                        let mut failure = core
                            .and_then(|c| pin_current_thread(c).err())
                            .map(|e| format!("--recv-affinity: {e}"));
                        // After pinning: the slots are touched first on the receive core.
                        let mut batch = RecvBatch::new(BATCH, source.slot_size(MAX_PACKET));
                        recv_numa::bind_batch(&batch, numa_node, &*source);
                        while failure.is_none() && !stream.is_stopped() && !shutdown.requested() {
                            match source.recv_batch(&mut batch) {
                                Ok(Received::Packets(n)) => {
                                    stream.note_batch(n);
                                    // Blocked by the consumer, a thread does not receive:
                                    // the kernel's drops are read while it waits.
                                    let mut refresh = || {
                                        source.refresh_kernel_drops();
                                        my_stats
                                            .kernel_drops
                                            .store(source.kernel_drops(), Ordering::Relaxed);
                                    };
                                    for p in batch.iter() {
                                        stream.add_packet_waiting(p, &mut refresh);
                                    }
                                }
                                Ok(Received::Idle) => stream.note_idle(),
                                Ok(Received::End) => break,
                                Err(e) => {
                                    tracing::error!(error = %e, "receive failed");
                                    failure = Some(e.to_string());
                                    break;
                                }
                            }
                            stream.release_old();
                            my_stats
                                .kernel_drops
                                .store(source.kernel_drops(), Ordering::Relaxed);
                        }
                        let group = Arc::clone(stream.group());
                        let snapshot = stream.finish();
                        match failure {
                            Some(e) => {
                                // Without this source the engine would wait for ever.
                                group.stop();
                                Err(e)
                            }
                            None => Ok(snapshot),
                        }
                    })?,
            );
        }
        Ok(Receivers { threads, stats })
    }

    /// The statistics of every member so far, summed.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut total = StatsSnapshot::default();
        for s in &self.stats {
            total.merge(&s.snapshot());
        }
        total
    }

    /// Wait for every thread (after the group has stopped); the summed final statistics, or
    /// the first transport error.
    pub fn join(self) -> Result<StatsSnapshot, EngineError> {
        let mut total = StatsSnapshot::default();
        let mut failure = None;
        for t in self.threads {
            match t.join() {
                Ok(Ok(s)) => total.merge(&s),
                Ok(Err(e)) => failure = failure.or(Some(EngineError::Receive(e))),
                Err(_) => failure = failure.or(Some(EngineError::Panicked("receive"))),
            }
        }
        failure.map_or(Ok(total), Err)
    }
}

/// The chunk ids a consumer never received: those skipped between consecutive chunks
/// delivered, when the window jumped further than its own length (`chunk.rs`). Their heaps
/// are as missing as the absent heaps of a delivered chunk, and are counted with them, so
/// that an input gap of any length shows in `input_missing_heaps`. Ids going back (a
/// resync) start the sequence again.
#[derive(Debug, Default)]
pub struct ChunkGaps {
    last: Option<u64>,
}

impl ChunkGaps {
    /// Chunks skipped between the previous chunk and `id`.
    pub fn skipped_before(&mut self, id: u64) -> u64 {
        let skipped = match self.last {
            Some(last) if id > last => id - last - 1,
            _ => 0,
        };
        self.last = Some(id);
        skipped
    }
}

/// Whether this build and host can use ibverbs at all (for tests that expect a refusal).
#[cfg(test)]
pub(crate) fn rdma_available() -> bool {
    #[cfg(feature = "ibv")]
    return crate::net::ibv::rdma_devices().is_ok();
    #[cfg(not(feature = "ibv"))]
    false
}

/// The refusal of an ibverbs flag on a host or build without ibverbs: how to build it, or
/// "no RDMA device" (what this project's machines say: no RDMA hardware or kernel support).
#[cfg(test)]
pub(crate) fn assert_ibv_refusal(e: &ConfigError, flag: &str) {
    assert_eq!(e.flag, flag, "{}", e.message);
    if cfg!(feature = "ibv") {
        assert!(e.message.starts_with("no RDMA device"), "{}", e.message);
    } else {
        assert!(e.message.contains("--features ibv"), "{}", e.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpdk_refusals_name_their_flag() {
        let cfg = |threads| SourceConfig {
            src: "239.10.10.10+1:7148".into(),
            interface: None,
            buffer: 1 << 20,
            threads,
            transport: RecvTransport::Dpdk,
            dpdk: None,
            comp_vectors: vec![],
            ibv_mprq: Default::default(),
            busy_poll: None,
            numa_node: None,
        };
        let flag = |c: &SourceConfig| open_sources(c).err().map(|e| e.flag);
        assert_eq!(flag(&cfg(2)), Some("--recv-threads"));
        let want = if crate::net::dpdk::AVAILABLE {
            "--dpdk-args"
        } else {
            "--recv-transport"
        };
        assert_eq!(flag(&cfg(1)), Some(want));
    }

    /// `--recv-ibv` (and `--recv-transport ibv`) is refused at start-up, by name.
    #[test]
    fn ibv_without_rdma_is_refused_by_name() {
        if rdma_available() {
            eprintln!("skipped: this host has RDMA devices");
            return;
        }
        let cfg = SourceConfig {
            src: "239.10.10.10+1:7148".into(),
            interface: Some("lo".into()),
            buffer: 1 << 20,
            threads: 2,
            transport: RecvTransport::Ibv,
            dpdk: None,
            comp_vectors: vec![-1, 3],
            ibv_mprq: Default::default(),
            busy_poll: None,
            numa_node: None,
        };
        let Err(e) = open_sources(&cfg) else {
            panic!("opened an ibverbs receiver without RDMA")
        };
        assert_ibv_refusal(&e, "--recv-ibv");
    }

    /// `--recv-busy-poll` is applied on the socket transports, refused by name where there is
    /// no socket or out of bounds, and a kernel's refusal is reported naming the flag and the
    /// errno (made here by a seccomp filter: Linux 6.18 no longer checks CAP_NET_ADMIN).
    #[test]
    fn busy_poll_is_applied_or_refused_naming_the_flag() {
        let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let src = free.local_addr().unwrap().to_string();
        drop(free);
        let cfg = move |transport, busy_poll| SourceConfig {
            src: src.clone(),
            interface: None,
            buffer: 1 << 16,
            threads: 1,
            transport,
            dpdk: None,
            comp_vectors: vec![],
            ibv_mprq: Default::default(),
            busy_poll,
            numa_node: None,
        };
        for t in [RecvTransport::Udp, RecvTransport::Uring] {
            assert_eq!(open_sources(&cfg(t, Some(50))).map(|v| v.len()), Ok(1));
            for us in [0, MAX_BUSY_POLL_US + 1] {
                let e = open_sources(&cfg(t, Some(us))).err().unwrap();
                assert_eq!(e.flag, "--recv-busy-poll", "{e}");
            }
        }
        for t in [RecvTransport::Dpdk, RecvTransport::Ibv] {
            let e = open_sources(&cfg(t, Some(50))).err().unwrap();
            assert_eq!(e.flag, "--recv-busy-poll", "{e}");
            assert!(e.message.contains("poll"), "{e}");
        }
        let so_busy_poll = vec![(1, libc::SOL_SOCKET as u32), (2, libc::SO_BUSY_POLL as u32)];
        let refused = crate::net::recv_socket::with_syscall_refused(
            libc::SYS_setsockopt,
            so_busy_poll,
            libc::EPERM as u16,
            move || open_sources(&cfg(RecvTransport::Udp, Some(50))).err(),
        )
        .expect("a refused SO_BUSY_POLL refuses the flag");
        assert_eq!(refused.flag, "--recv-busy-poll");
        assert!(refused.message.contains("EPERM"), "{}", refused.message);
    }

    #[test]
    fn gaps_count_skipped_ids_and_a_resync_restarts() {
        let mut g = ChunkGaps::default();
        let counts: Vec<u64> = [5, 6, 7, 10, 1_000_000, 3, 4, 6]
            .iter()
            .map(|&id| g.skipped_before(id))
            .collect();
        assert_eq!(counts, [0, 0, 0, 2, 999_989, 0, 0, 1]);
    }
}
