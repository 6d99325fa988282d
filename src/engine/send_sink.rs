//! An output's send thread and its buffers (seed 000 §Network transmit; see `engine::send`):
//! the engine hands it filled buffers from a pool that circulates between the two, or, with
//! `--use-peerdirect` (seed 000 §PeerDirect), heaps left in GPU memory with a lease on their
//! buffer, which the thread drops only once the NIC has read them (`SendStream::wait_sent`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::affinity::pin_current_thread;
use super::lease::Lease;
use super::send::HeapFormat;
use super::{EngineError, Shutdown};
use crate::net::{DeviceBytes, NetSender, PacketSender};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream};

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
}
