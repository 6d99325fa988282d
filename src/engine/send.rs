//! The transmit side every engine shares (seed 000 §Network transmit): each output's send
//! stream is owned by its own thread, so rate-limited sends (paced at `--send-rate-factor` × the
//! data rate, hence busy most of real time by design) never hold up the compute. Finished output
//! buffers are copied into one of a few preallocated buffers that circulate between the engine
//! and the thread; when all are in flight the engine waits (back-pressure instead of loss).
//! What a buffer becomes on the wire is the engine's [`HeapFormat`]; descriptors go out on a
//! timer, unpaced, as katgpucbf sends them.
//!
//! With `--use-peerdirect` (seed 000 §PeerDirect) nothing is copied: the engine hands the
//! thread a [`DevicePayload`] — where the heaps' bytes lie in GPU memory and a [`Lease`] on the
//! buffer holding them — the packets gather their payload from there (`net::ibv`), and the
//! lease is dropped, giving the buffer back, only once the stream's completions say the NIC
//! has read every packet (`SendStream::wait_sent`).

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::affinity::pin_current_thread;
use super::lease::Lease;
pub use super::send_dpdk::DpdkSend;
use super::send_dpdk::{open_dpdk_senders, plan_dpdk_senders};
use super::{ConfigError, EngineError, Shutdown};
use crate::net::udp::UdpSender;
use crate::net::{DeviceBytes, DeviceMemory, NetSender, PacketSender};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

/// How an engine's finished buffers become heaps: one heap per substream (destination) of each
/// buffer, plus the stream's descriptors.
pub trait HeapFormat: Send + 'static {
    /// What travels with a buffer besides its bytes (a timestamp, `beam_ants`, ...).
    type Meta: Send + 'static;
    /// Substreams (destinations) a buffer is split over.
    fn substreams(&self) -> usize;
    /// The heap for `substream` of one buffer, or `None` to send nothing there this time
    /// (a beam whose capture is stopped).
    fn heap<'a>(&self, data: &'a [u8], meta: &Self::Meta, substream: usize) -> Option<Heap<'a>>;
    /// [`HeapFormat::heap`] for a buffer whose bytes stay in device memory
    /// (`--use-peerdirect`); an error where this format has no such form (the engines refuse
    /// the flag before that can happen).
    fn device_heap(
        &self,
        data: DeviceBytes,
        meta: &Self::Meta,
        substream: usize,
    ) -> Result<Option<Heap<'static>>, String> {
        let _ = (data, meta, substream);
        Err("this stream cannot send from device memory".into())
    }
    /// The descriptor heap sent to `substream`.
    fn descriptors(&self, substream: usize) -> Heap<'static>;
}

/// How an output's packets leave the host (`--send-transport`, `--send-ibv`,
/// `--send-comp-vector`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SendTransport {
    /// Kernel UDP sockets (`net::udp`).
    #[default]
    Udp,
    /// ibverbs raw-packet queue pairs (`net::ibv`, cargo feature `ibv`), one per interface,
    /// completions on `comp_vector` (negative: polling).
    Ibv { comp_vector: i32 },
    /// DPDK ports polled from user space (`net::dpdk`, cargo feature `dpdk`), one per
    /// interface; see [`super::send_dpdk`].
    Dpdk(DpdkSend),
}

impl SendTransport {
    /// Say, before any transport starts, that the process will open `streams` send streams
    /// over this transport, each with a sender per interface: DPDK ports then start with a TX
    /// queue per sender (`send_dpdk`). `count_flag` names what set `streams` when that is
    /// the flag to blame for too many (dsim's `--send-threads`). Nothing for other transports.
    pub fn plan(
        &self,
        interfaces: &[String],
        streams: usize,
        flags: SendFlags,
        count_flag: Option<&'static str>,
    ) -> Result<(), ConfigError> {
        match self {
            SendTransport::Dpdk(cfg) => {
                plan_dpdk_senders(interfaces, streams, cfg, flags, count_flag)
            }
            SendTransport::Udp | SendTransport::Ibv { .. } => Ok(()),
        }
    }
}

/// The flags an error of [`open_senders`] names, which differ between the engines and dsim
/// (katgpucbf dsim's send flags carry no `send-` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendFlags {
    /// The interface list.
    pub interface: &'static str,
    /// The ibverbs switch.
    pub ibv: &'static str,
    /// The multicast TTL.
    pub ttl: &'static str,
}

impl SendFlags {
    /// fengine's, xbengine's and fsim's names.
    pub const ENGINE: SendFlags = SendFlags {
        interface: "--send-interface",
        ibv: "--send-ibv",
        ttl: "--send-ttl",
    };
    /// dsim's names.
    pub const DSIM: SendFlags = SendFlags {
        interface: "--interface",
        ibv: "--ibv",
        ttl: "--ttl",
    };
}

/// One sender per interface (one on the default route when none is named), each knowing
/// every destination of `dst`, over `transport`. ibverbs needs named interfaces; DPDK takes
/// its ports from them (or `--dpdk-port`).
pub fn open_senders(
    dst: &[SocketAddrV4],
    interfaces: &[String],
    ttl: u32,
    buffer: usize,
    max_packet: usize,
    transport: &SendTransport,
    flags: SendFlags,
) -> Result<Vec<NetSender>, ConfigError> {
    let wire = Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    };
    open_gathering(wire, transport, flags, &[])
}

/// Where and how [`open_senders`]' senders send.
#[derive(Clone, Copy)]
struct Wire<'a> {
    dst: &'a [SocketAddrV4],
    interfaces: &'a [String],
    ttl: u32,
    buffer: usize,
    max_packet: usize,
}

/// [`open_senders`] whose packets may gather payload from `device` memory, which only ibverbs
/// can (`--use-peerdirect`; the engines refuse the flag on other transports first).
fn open_gathering(
    wire: Wire<'_>,
    transport: &SendTransport,
    flags: SendFlags,
    device: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    let Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    } = wire;
    if !device.is_empty() && !matches!(transport, SendTransport::Ibv { .. }) {
        return Err(ConfigError::new(
            "--use-peerdirect",
            format!("needs {}", flags.ibv),
        ));
    }
    match transport {
        SendTransport::Udp => {
            let ifaces: Vec<Option<&str>> = if interfaces.is_empty() {
                vec![None]
            } else {
                interfaces.iter().map(|s| Some(s.as_str())).collect()
            };
            ifaces
                .into_iter()
                .map(|i| UdpSender::new(dst, i, ttl, buffer).map(|s| Box::new(s) as NetSender))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::new(flags.interface, e))
        }
        SendTransport::Ibv { comp_vector } => open_ibv(wire, *comp_vector, flags, device),
        SendTransport::Dpdk(cfg) => open_dpdk_senders(dst, interfaces, ttl, max_packet, cfg, flags),
    }
}

#[cfg(feature = "ibv")]
fn open_ibv(
    wire: Wire<'_>,
    comp_vector: i32,
    flags: SendFlags,
    device: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    let Wire {
        dst,
        interfaces,
        ttl,
        buffer,
        max_packet,
    } = wire;
    let (iface_flag, ibv_flag) = (flags.interface, flags.ibv);
    use crate::net::ibv::{rdma_devices, IbvSender};
    // First whether this host has RDMA at all, so that the refusal says so.
    rdma_devices().map_err(|e| ConfigError::new(ibv_flag, e))?;
    if interfaces.is_empty() {
        return Err(ConfigError::new(
            iface_flag,
            format!("{ibv_flag} needs the interface(s) to send from"),
        ));
    }
    interfaces
        .iter()
        .map(|i| {
            IbvSender::open(dst, i, ttl, buffer, max_packet, comp_vector, device)
                .map(|s| Box::new(s) as NetSender)
                .map_err(|e| ConfigError::new(ibv_flag, e))
        })
        .collect()
}

#[cfg(not(feature = "ibv"))]
fn open_ibv(
    _: Wire<'_>,
    _: i32,
    flags: SendFlags,
    _: &[Arc<dyn DeviceMemory>],
) -> Result<Vec<NetSender>, ConfigError> {
    Err(ConfigError::new(flags.ibv, crate::net::IBV_NOT_BUILT))
}

/// The wire side of one output: destinations, interface, TTL and the send stream's settings.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub dst: Vec<SocketAddrV4>,
    /// Interfaces (names or addresses) to send from; several share the rate (multi-NIC).
    pub interfaces: Vec<String>,
    pub ttl: u32,
    /// Socket send buffer (`--send-buffer`), or the ibverbs ring of frames.
    pub buffer: usize,
    pub transport: SendTransport,
    pub config: SendStreamConfig,
}

impl StreamSpec {
    /// Open the senders (one per interface, or one on the default route).
    pub fn open(&self) -> Result<SendStream<NetSender>, ConfigError> {
        self.open_with(&[])
    }

    /// [`StreamSpec::open`] with `device` memory registered with every sender, for heaps
    /// sent from it (`--use-peerdirect`; ibverbs only).
    pub fn open_with(
        &self,
        device: &[Arc<dyn DeviceMemory>],
    ) -> Result<SendStream<NetSender>, ConfigError> {
        let wire = Wire {
            dst: &self.dst,
            interfaces: &self.interfaces,
            ttl: self.ttl,
            buffer: self.buffer,
            max_packet: self.config.max_packet_size,
        };
        let senders = open_gathering(wire, &self.transport, SendFlags::ENGINE, device)?;
        let mut stream = SendStream::new(self.config, senders)
            .map_err(|e| ConfigError::new(SendFlags::ENGINE.interface, e))?;
        stream.set_interface_names(&self.interfaces);
        Ok(stream)
    }
}

/// When descriptors are sent: once at start-up (so that a receiver that joins with the
/// engine can decode its first heaps), then at `first`, then every `period`.
#[derive(Debug, Clone, Copy)]
pub struct DescriptorSchedule {
    pub first: Instant,
    pub period: Duration,
}

/// One buffer's heaps, interleaved (katgpucbf's `ROUND_ROBIN`), paced.
fn send_buffer(
    stream: &mut SendStream<NetSender>,
    heaps: &[(usize, Heap<'_>)],
) -> Result<(), String> {
    let refs: Vec<HeapRef> = heaps
        .iter()
        .map(|(s, heap)| HeapRef::new(heap, *s))
        .collect();
    if refs.is_empty() {
        return Ok(());
    }
    stream
        .send_heaps(&refs, SendMode::RoundRobin)
        .map_err(|e| e.to_string())
}

/// One descriptor heap per substream of `format`, unpaced.
fn send_descriptors<F: HeapFormat>(
    stream: &mut SendStream<NetSender>,
    format: &F,
) -> Result<(), String> {
    let d: Vec<Heap<'static>> = (0..format.substreams())
        .map(|s| format.descriptors(s))
        .collect();
    let refs: Vec<HeapRef> = d
        .iter()
        .enumerate()
        .map(|(s, heap)| HeapRef {
            heap,
            cnt: None,
            substream: s,
            unpaced: true,
        })
        .collect();
    stream
        .send_heaps(&refs, SendMode::RoundRobin)
        .map_err(|e| e.to_string())
}

/// Heaps and bytes sent so far (read by metrics and sensors from other threads).
#[derive(Debug, Default)]
pub struct SinkCounters {
    /// Buffers handed to the stream (each as up to one heap per substream).
    pub buffers: AtomicU64,
    pub bytes: AtomicU64,
    /// Heaps lost because no send interface was up (`SendCounters::lost_heaps`).
    pub lost_heaps: AtomicU64,
    /// One per send interface, in `--send-interface` order.
    pub interfaces: Vec<InterfaceCounters>,
}

/// What one send interface carried, and how often it went down.
#[derive(Debug, Default)]
pub struct InterfaceCounters {
    pub name: String,
    pub bytes: AtomicU64,
    pub downs: AtomicU64,
    pub live: AtomicBool,
}

impl SinkCounters {
    fn for_stream<S: PacketSender>(stream: &SendStream<S>) -> SinkCounters {
        SinkCounters {
            interfaces: stream
                .interfaces()
                .map(|(name, _)| InterfaceCounters {
                    name: name.to_string(),
                    live: AtomicBool::new(true),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Bring the counters up to `stream`'s.
    fn update<S: PacketSender>(&self, stream: &SendStream<S>) {
        let c = stream.counters();
        self.bytes.store(c.bytes, Ordering::Relaxed);
        self.lost_heaps.store(c.lost_heaps, Ordering::Relaxed);
        for (mine, (_, theirs)) in self.interfaces.iter().zip(stream.interfaces()) {
            mine.bytes.store(theirs.bytes, Ordering::Relaxed);
            mine.downs.store(theirs.downs, Ordering::Relaxed);
            mine.live.store(theirs.live, Ordering::Relaxed);
        }
    }
}

/// A send thread's name (at most 15 bytes, Linux's limit, so that `top -H` tells them apart)
/// and the core it is bound to (`--send-affinity`).
#[derive(Debug, Clone)]
pub struct SendThread {
    pub name: String,
    pub core: Option<usize>,
}

/// A sink's buffers: how many, bytes each, and what to do to each before use (an error stops
/// the start with its message).
pub type BufferPool<'a> = (
    usize,
    usize,
    &'a mut dyn FnMut(&mut [u8]) -> Result<(), String>,
);

/// Heaps whose bytes stay in device memory (`--use-peerdirect`): where they lie, and the hold
/// on the buffer there, dropped once the NIC has read them.
#[derive(Debug, Clone)]
pub struct DevicePayload {
    pub bytes: DeviceBytes,
    pub lease: Lease,
}

/// What the engine hands its send thread: a buffer of the pool, filled, or heaps in device
/// memory.
enum Payload {
    Host(Vec<u8>),
    Device(DevicePayload),
}

/// A send thread and its buffer pool.
pub struct HeapSink<M> {
    heaps: Sender<(Payload, M)>,
    free: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<Result<(), String>>>,
    counters: Arc<SinkCounters>,
}

impl<M: Send + 'static> HeapSink<M> {
    /// Start `thread` with `buffers` buffers of `buffer_bytes` capacity. Once `shutdown` is
    /// raised the stream stops pacing, so that what is queued goes out and the engine stops
    /// promptly however low `--send-rate-factor` is.
    pub fn spawn<F: HeapFormat<Meta = M>>(
        thread: SendThread,
        stream: SendStream<NetSender>,
        format: F,
        descriptors: DescriptorSchedule,
        buffers: usize,
        buffer_bytes: usize,
        shutdown: &Shutdown,
    ) -> std::io::Result<HeapSink<M>> {
        let mut nothing = |_: &mut [u8]| Ok(());
        let pool: BufferPool<'_> = (buffers, buffer_bytes, &mut nothing);
        Self::spawn_with(thread, stream, format, descriptors, pool, shutdown)
    }

    /// [`HeapSink::spawn`] with `pool` = (buffers, bytes each, `prepare`): every buffer is
    /// allocated (zeroed) and handed to `prepare` before the thread starts (the
    /// XB-engine page-locks its X heap buffers there, so that the GPU writes into them). The
    /// buffers keep their memory for the sink's life.
    pub fn spawn_with<F: HeapFormat<Meta = M>>(
        thread: SendThread,
        mut stream: SendStream<NetSender>,
        format: F,
        descriptors: DescriptorSchedule,
        pool: BufferPool<'_>,
        shutdown: &Shutdown,
    ) -> std::io::Result<HeapSink<M>> {
        let (buffers, buffer_bytes, prepare) = pool;
        stream.set_hurry(shutdown.flag());
        let (heaps, rx) = crossbeam_channel::bounded::<(Payload, M)>(buffers);
        let (give, free) = crossbeam_channel::bounded(buffers);
        for _ in 0..buffers {
            let mut b = vec![0u8; buffer_bytes];
            prepare(&mut b).map_err(std::io::Error::other)?;
            b.clear();
            // Cannot fail: the channel has room for every buffer.
            let _ = give.send(b);
        }
        let counters = Arc::new(SinkCounters::for_stream(&stream));
        let c = Arc::clone(&counters);
        let core = thread.core;
        let thread = std::thread::Builder::new().name(thread.name).spawn(
            move || -> Result<(), String> {
                let sent = (|| -> Result<(), String> {
                    if let Some(c) = core {
                        // Checked at start-up; a failure now stops this output with the reason.
                        pin_current_thread(c).map_err(|e| format!("--send-affinity: {e}"))?;
                    }
                    send_descriptors(&mut stream, &format)?;
                    let mut next_desc = descriptors.first;
                    loop {
                        if Instant::now() >= next_desc {
                            send_descriptors(&mut stream, &format)?;
                            next_desc += descriptors.period;
                        }
                        let (data, meta) = match rx.recv_timeout(Duration::from_millis(100)) {
                            Ok(h) => h,
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => return Ok(()),
                        };
                        match data {
                            Payload::Host(data) => {
                                let n = format.substreams();
                                let heaps: Vec<(usize, Heap<'_>)> = (0..n)
                                    .filter_map(|s| format.heap(&data, &meta, s).map(|h| (s, h)))
                                    .collect();
                                send_buffer(&mut stream, &heaps)?;
                                drop(heaps);
                                // The engine may have gone: then the buffer is simply dropped.
                                let _ = give.send(data);
                            }
                            Payload::Device(d) => {
                                let heaps = (0..format.substreams())
                                    .filter_map(|s| {
                                        format
                                            .device_heap(d.bytes, &meta, s)
                                            .transpose()
                                            .map(|h| h.map(|h| (s, h)))
                                    })
                                    .collect::<Result<Vec<_>, String>>()?;
                                send_buffer(&mut stream, &heaps)?;
                                // The buffer goes back only once the NIC has read it.
                                stream.wait_sent().map_err(|e| e.to_string())?;
                                drop(d.lease);
                            }
                        }
                        c.buffers.fetch_add(1, Ordering::Relaxed);
                        c.update(&stream);
                    }
                })();
                // Give back the leases of what is still queued, so that an engine waiting for
                // its device buffers learns of the stop instead of waiting for them.
                while rx.try_recv().is_ok() {}
                sent
            },
        )?;
        Ok(HeapSink {
            heaps,
            free,
            thread: Some(thread),
            counters,
        })
    }

    /// A free buffer (cleared), waiting while every buffer is in flight; `None` if the send
    /// thread has stopped (on an error that [`HeapSink::check`] reports).
    pub fn buffer(&self) -> Option<Vec<u8>> {
        let mut b = self.free.recv().ok()?;
        b.clear();
        Some(b)
    }

    /// Queue a filled buffer for sending.
    pub fn send(&self, data: Vec<u8>, meta: M) {
        // A closed channel means the thread stopped on an error, which check() reports.
        let _ = self.heaps.send((Payload::Host(data), meta));
    }

    /// Queue heaps in device memory for sending from there; their lease is dropped once the
    /// NIC has read them (at once if the thread has stopped).
    pub fn send_device(&self, data: DevicePayload, meta: M) {
        let _ = self.heaps.send((Payload::Device(data), meta));
    }

    /// Buffers sent so far.
    pub fn sent(&self) -> u64 {
        self.counters.buffers.load(Ordering::Relaxed)
    }

    /// Bytes sent so far (packets, headers included).
    pub fn bytes(&self) -> u64 {
        self.counters.bytes.load(Ordering::Relaxed)
    }

    /// The counters, to read from another thread.
    pub fn counters(&self) -> Arc<SinkCounters> {
        Arc::clone(&self.counters)
    }

    /// A send failure, if the thread stopped on one.
    pub fn check(&mut self) -> Result<(), EngineError> {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            return self.join();
        }
        Ok(())
    }

    /// Let the thread send what is queued, and stop it.
    pub fn join(&mut self) -> Result<(), EngineError> {
        let (dead, _) = crossbeam_channel::bounded(1);
        drop(std::mem::replace(&mut self.heaps, dead));
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Err(EngineError::Send(e)),
            Some(Err(_)) => Err(EngineError::Panicked("send")),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lease::Ledger;
    use crate::engine::recv::{assert_ibv_refusal, rdma_available};
    use crate::fengine::heaps::FHeapFormat;
    use crate::net::SendBatch;
    use crate::spead::send::SendStreamConfig;

    /// A NIC that takes packets with device payload and completes them only when the test
    /// says so (one `done` per `wait_sent`).
    struct GatedNic {
        gathered: Sender<usize>,
        done: Receiver<()>,
    }

    impl PacketSender for GatedNic {
        fn destinations(&self) -> usize {
            2
        }
        fn send_batch(&mut self, batch: &SendBatch<'_>) -> std::io::Result<()> {
            let n = (0..batch.len())
                .filter(|&i| batch.packet(i).device.is_some())
                .count();
            let _ = self.gathered.send(n);
            Ok(())
        }
        fn wait_sent(&mut self) -> std::io::Result<()> {
            self.done
                .recv()
                .map_err(|_| std::io::Error::other("test over"))
        }
    }

    /// The send thread gives a device buffer back only after the NIC's completions for every
    /// packet gathered from it: while they are outstanding the buffer stays lent.
    #[test]
    fn a_device_buffer_returns_only_after_its_sends_complete() {
        let (gathered, packets) = crossbeam_channel::unbounded();
        let (complete, done) = crossbeam_channel::unbounded();
        let nic: NetSender = Box::new(GatedNic { gathered, done });
        let config = SendStreamConfig {
            max_packet_size: 8192 + 72,
            ..Default::default()
        };
        let stream = SendStream::new(config, vec![nic]).unwrap();
        let format = FHeapFormat {
            feng_id: 0,
            channels: 64,
            destinations: 2,
            spectra_per_heap: 256,
            sample_bits: 8,
        };
        let schedule = DescriptorSchedule {
            first: Instant::now() + Duration::from_secs(3600),
            period: Duration::from_secs(3600),
        };
        let thread = SendThread {
            name: "test-tx".into(),
            core: None,
        };
        let shutdown = Shutdown::manual();
        let mut sink =
            HeapSink::<u64>::spawn(thread, stream, format, schedule, 2, 0, &shutdown).unwrap();
        // The descriptors at start-up are host heaps: no device packets.
        assert_eq!(packets.recv().unwrap(), 0);
        let ledger = Ledger::new(1);
        // 64 channels × 256 spectra × 4 bytes = 64 KiB: 32 KiB per destination, 4 packets each.
        let bytes = DeviceBytes {
            addr: 1 << 40,
            len: 64 * 256 * 4,
        };
        sink.send_device(
            DevicePayload {
                bytes,
                lease: ledger.lend(0),
            },
            1 << 20,
        );
        let mut sent = 0;
        while sent < 8 {
            sent += packets.recv().unwrap();
        }
        assert_eq!(sent, 8);
        assert!(ledger.lent(0), "returned before the NIC completed");
        complete.send(()).unwrap();
        ledger.wait_returned(0, Duration::from_secs(60)).unwrap();
        drop(complete);
        sink.join().unwrap();
    }

    /// `--send-ibv` (dsim `--ibv`) is refused at start-up, by the flag the caller names.
    #[test]
    fn ibv_without_rdma_is_refused_by_name() {
        if rdma_available() {
            eprintln!("skipped: this host has RDMA devices");
            return;
        }
        let dst = ["239.10.10.10:7148".parse().unwrap()];
        for flags in [SendFlags::ENGINE, SendFlags::DSIM] {
            let ibv = SendTransport::Ibv { comp_vector: 0 };
            let Err(e) = open_senders(&dst, &["lo".into()], 4, 1 << 20, 8264, &ibv, flags) else {
                panic!("opened an ibverbs sender without RDMA")
            };
            assert_ibv_refusal(&e, flags.ibv);
        }
    }
}
