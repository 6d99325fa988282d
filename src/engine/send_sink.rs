//! An output's send thread and its buffers (seed 000 §Network transmit; see `engine::send`):
//! the engine hands it filled buffers from a pool that circulates between the two, or, with
//! `--use-peerdirect` (seed 000 §PeerDirect), heaps left in GPU memory with a lease on their
//! buffer, which the thread drops only once the NIC is done with them (`SendStream::wait_sent`).
//!
//! "Done" includes a link failing under them: the stream's wait then returns once the failed
//! interface's sender has taken back what its NIC held (so the NIC reads none of the buffer
//! again), with the loss counted against the interface ([`InterfaceCounters`]) and its heaps
//! moved to the others, and the thread carries on; with no interface up the heaps are counted
//! as lost without waiting for anything. Every wait of the thread is bounded (the transports'
//! own bounds), so a lease always comes back, with one exception: `--send-transport uring`
//! waits for the kernel to let go of each batch's memory for as long as the NIC takes to send
//! it, warning every second (`net::uring_send`), since returning earlier would free memory the
//! kernel still reads; on any path the lease is dropped exactly once,
//! and on an error that stops the thread only after the stream, and with it every queue that
//! could still read the buffer, is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    // All through the first live interface, as katgpucbf sends them through its first stream
    // (seed 000 §Network transmit): the interfaces share one network, and a set of
    // descriptors is too small to balance.
    stream
        .send_heaps_first(&refs, SendMode::RoundRobin)
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

/// What one send interface carried, how often it went down, and what its NIC had taken and
/// lost when it did (`spead::send::InterfaceCounters`).
#[derive(Debug, Default)]
pub struct InterfaceCounters {
    pub name: String,
    pub bytes: AtomicU64,
    pub downs: AtomicU64,
    pub lost_packets: AtomicU64,
    pub lost_heaps: AtomicU64,
    /// Whether every stream of the sink last saw this interface up.
    pub live: AtomicBool,
    /// Streams that last saw it down.
    down_streams: AtomicUsize,
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

    /// Add what `stream` has counted since `last` (its counts when this was last called), so
    /// that the streams of an output's several send threads add up. A link going down is seen
    /// by each stream that sends on it, so an interface's downs are the most any stream saw,
    /// and it is live while every stream last saw it up.
    fn update<S: PacketSender>(&self, stream: &SendStream<S>, last: &mut Reported) {
        let add = |to: &AtomicU64, now: u64, before: &mut u64| {
            to.fetch_add(now.saturating_sub(*before), Ordering::Relaxed);
            *before = now;
        };
        let c = stream.counters();
        add(&self.bytes, c.bytes, &mut last.bytes);
        add(&self.lost_heaps, c.lost_heaps, &mut last.lost_heaps);
        for ((mine, (_, theirs)), before) in self
            .interfaces
            .iter()
            .zip(stream.interfaces())
            .zip(&mut last.interfaces)
        {
            add(&mine.bytes, theirs.bytes, &mut before.bytes);
            add(
                &mine.lost_packets,
                theirs.lost_packets,
                &mut before.lost_packets,
            );
            add(&mine.lost_heaps, theirs.lost_heaps, &mut before.lost_heaps);
            mine.downs.fetch_max(theirs.downs, Ordering::Relaxed);
            if theirs.live == before.down {
                before.down = !theirs.live;
                if before.down {
                    mine.down_streams.fetch_add(1, Ordering::Relaxed);
                } else {
                    mine.down_streams.fetch_sub(1, Ordering::Relaxed);
                }
            }
            mine.live.store(
                mine.down_streams.load(Ordering::Relaxed) == 0,
                Ordering::Relaxed,
            );
        }
    }
}

/// A stream's counts as last added into its sink's counters ([`SinkCounters::update`]).
#[derive(Debug, Default)]
struct Reported {
    bytes: u64,
    lost_heaps: u64,
    interfaces: Vec<ReportedInterface>,
}

impl Reported {
    /// Nothing reported yet, of a stream over `interfaces` interfaces.
    fn new(interfaces: usize) -> Reported {
        Reported {
            interfaces: vec![ReportedInterface::default(); interfaces],
            ..Default::default()
        }
    }
}

#[derive(Debug, Default, Clone)]
struct ReportedInterface {
    bytes: u64,
    lost_packets: u64,
    lost_heaps: u64,
    /// Whether the stream last saw the interface down (counted in `down_streams`).
    down: bool,
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

/// What the threads of one sink share.
#[derive(Default)]
struct Crew {
    /// Raised by a thread that stops on an error: the others stop too (its error is the
    /// sink's, `HeapSink::join`).
    failed: AtomicBool,
    /// Threads whose queue is still open; the last to close it drains it.
    running: AtomicUsize,
}

/// What the engine hands over, in order, shared by a sink's threads. Dropped last of a
/// [`Worker`], by the last thread to leave, it gives back the leases of what is still queued,
/// so that an engine waiting for its device buffers learns of the stop instead of waiting for
/// them (an earlier thread's drain would take the buffers of those still sending).
struct Queue<M> {
    rx: Receiver<(Payload, M)>,
    crew: Arc<Crew>,
}

impl<M> Queue<M> {
    /// One more thread's hold on the queue.
    fn open(rx: &Receiver<(Payload, M)>, crew: &Arc<Crew>) -> Queue<M> {
        crew.running.fetch_add(1, Ordering::AcqRel);
        Queue {
            rx: rx.clone(),
            crew: Arc::clone(crew),
        }
    }
}

impl<M> Drop for Queue<M> {
    fn drop(&mut self) {
        if self.crew.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            while self.rx.try_recv().is_ok() {}
        }
    }
}

/// A send thread's state. Its fields drop in order, on every path out of the thread (an error
/// and a panic included): the stream first, and with it every queue that could still read a
/// device buffer; then the device payload being sent, whose buffer may be rewritten only
/// now; then the queue.
struct Worker<F: HeapFormat> {
    stream: SendStream<NetSender>,
    /// The device payload being sent, held until the NIC is done with it.
    held: Option<DevicePayload>,
    format: Arc<F>,
    queue: Queue<F::Meta>,
    give: Sender<Vec<u8>>,
    counters: Arc<SinkCounters>,
    reported: Reported,
    /// The descriptors' schedule: the first thread's only (one copy per period, not one per
    /// thread).
    descriptors: Option<DescriptorSchedule>,
    /// The first thread's start-up descriptors go out before any data: it drops `sent` once
    /// they have; the others wait on `ready` for that.
    sent: Option<Sender<()>>,
    ready: Option<Receiver<()>>,
    core: Option<usize>,
}

impl<F: HeapFormat> Worker<F> {
    /// Send what the engine hands over until it stops.
    fn run(&mut self) -> Result<(), String> {
        let (stream, held) = (&mut self.stream, &mut self.held);
        if let Some(c) = self.core {
            // Checked at start-up; a failure now stops this output with the reason.
            pin_current_thread(c).map_err(|e| format!("--send-affinity: {e}"))?;
        }
        let format = &*self.format;
        let mut next_desc = None;
        if let Some(d) = self.descriptors {
            send_descriptors(stream, format)?;
            next_desc = Some(d.first);
        }
        drop(self.sent.take());
        if let Some(ready) = self.ready.take() {
            // Ends when the first thread has sent them, or has stopped.
            let _ = ready.recv();
        }
        loop {
            if self.queue.crew.failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            if let (Some(at), Some(d)) = (next_desc.as_mut(), self.descriptors) {
                if Instant::now() >= *at {
                    send_descriptors(stream, format)?;
                    *at += d.period;
                }
            }
            let (data, meta) = match self.queue.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(h) => h,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            match data {
                Payload::Host(data) => {
                    let heaps: Vec<(usize, Heap<'_>)> = (0..format.substreams())
                        .filter_map(|s| format.heap(&data, &meta, s).map(|h| (s, h)))
                        .collect();
                    send_buffer(stream, &heaps)?;
                    drop(heaps);
                    // The engine may have gone: then the buffer is simply dropped.
                    let _ = self.give.send(data);
                }
                Payload::Device(d) => {
                    let d = held.insert(d);
                    let heaps = (0..format.substreams())
                        .filter_map(|s| {
                            format
                                .device_heap(d.bytes, &meta, s)
                                .transpose()
                                .map(|h| h.map(|h| (s, h)))
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                    let sent = send_buffer(stream, &heaps);
                    // Waited for even after a failed send: the NIC may hold some of its packets.
                    let done = stream.wait_sent().map_err(|e| e.to_string());
                    sent?;
                    done?;
                    // Every packet is sent, or taken back from a failed link and counted: the
                    // buffer goes back.
                    *held = None;
                }
            }
            self.counters.buffers.fetch_add(1, Ordering::Relaxed);
            self.counters.update(stream, &mut self.reported);
        }
    }
}

/// An output's send threads (one, or several that take the queued buffers in turn as each
/// gets free, each with its own stream) and their buffer pool.
pub struct HeapSink<M> {
    heaps: Sender<(Payload, M)>,
    free: Receiver<Vec<u8>>,
    threads: Vec<JoinHandle<Result<(), String>>>,
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
        Self::spawn_threads(
            vec![(thread, stream)],
            format,
            descriptors,
            buffers,
            buffer_bytes,
            shutdown,
        )
    }

    /// [`HeapSink::spawn`] with several threads, each with its stream (`senders`, at least
    /// one): each takes the next queued buffer when it is free, so a buffer's heaps leave
    /// whole from one stream and the streams share the output. The first sends the
    /// descriptors. For outputs faster than one thread sends through kernel sockets (its
    /// copy of every byte: ~27 Gb/s on the lent H100's host, bench/RESULTS.md "full-rate
    /// antenna"); the streams' heap counters and rates are the caller's to split.
    pub fn spawn_threads<F: HeapFormat<Meta = M>>(
        senders: Vec<(SendThread, SendStream<NetSender>)>,
        format: F,
        descriptors: DescriptorSchedule,
        buffers: usize,
        buffer_bytes: usize,
        shutdown: &Shutdown,
    ) -> std::io::Result<HeapSink<M>> {
        let mut nothing = |_: &mut [u8]| Ok(());
        let pool: BufferPool<'_> = (buffers, buffer_bytes, &mut nothing);
        Self::start(senders, format, descriptors, pool, shutdown)
    }

    /// [`HeapSink::spawn`] with `pool` = (buffers, bytes each, `prepare`): every buffer is
    /// allocated (zeroed) and handed to `prepare` before the thread starts (the
    /// XB-engine page-locks its X heap buffers there, so that the GPU writes into them). The
    /// buffers keep their memory for the sink's life.
    pub fn spawn_with<F: HeapFormat<Meta = M>>(
        thread: SendThread,
        stream: SendStream<NetSender>,
        format: F,
        descriptors: DescriptorSchedule,
        pool: BufferPool<'_>,
        shutdown: &Shutdown,
    ) -> std::io::Result<HeapSink<M>> {
        Self::start(vec![(thread, stream)], format, descriptors, pool, shutdown)
    }

    fn start<F: HeapFormat<Meta = M>>(
        senders: Vec<(SendThread, SendStream<NetSender>)>,
        format: F,
        descriptors: DescriptorSchedule,
        pool: BufferPool<'_>,
        shutdown: &Shutdown,
    ) -> std::io::Result<HeapSink<M>> {
        let (buffers, buffer_bytes, prepare) = pool;
        let Some((_, first)) = senders.first() else {
            return Err(std::io::Error::other("an output needs a send thread"));
        };
        let counters = Arc::new(SinkCounters::for_stream(first));
        let (heaps, rx) = crossbeam_channel::bounded::<(Payload, M)>(buffers);
        let (give, free) = crossbeam_channel::bounded(buffers);
        for _ in 0..buffers {
            let mut b = vec![0u8; buffer_bytes];
            prepare(&mut b).map_err(std::io::Error::other)?;
            b.clear();
            // Cannot fail: the channel has room for every buffer.
            let _ = give.send(b);
        }
        let format = Arc::new(format);
        let crew = Arc::new(Crew::default());
        let (sent, ready) = crossbeam_channel::bounded::<()>(0);
        let mut sent = Some(sent);
        let mut sink = HeapSink {
            heaps,
            free,
            threads: Vec::with_capacity(senders.len()),
            counters,
        };
        for (i, (thread, mut stream)) in senders.into_iter().enumerate() {
            stream.set_hurry(shutdown.flag());
            let mut work = Worker {
                stream,
                held: None,
                format: Arc::clone(&format),
                queue: Queue::open(&rx, &crew),
                give: give.clone(),
                counters: Arc::clone(&sink.counters),
                reported: Reported::new(sink.counters.interfaces.len()),
                descriptors: (i == 0).then_some(descriptors),
                sent: sent.take(),
                ready: (i > 0).then(|| ready.clone()),
                core: thread.core,
            };
            let crew = Arc::clone(&crew);
            let run = move || {
                let r = work.run();
                if r.is_err() {
                    crew.failed.store(true, Ordering::Relaxed);
                }
                r
            };
            match std::thread::Builder::new().name(thread.name).spawn(run) {
                Ok(t) => sink.threads.push(t),
                Err(e) => {
                    // Those started stop once the queue closes.
                    let _ = sink.join();
                    return Err(e);
                }
            }
        }
        Ok(sink)
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
    /// NIC is done with them (at once if the thread has stopped). Waits only while the queue
    /// holds as many payloads as the sink has buffers: a caller whose leases are fewer (the
    /// F-engine sizes the sink so) never waits here, and its only wait is for a lease.
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

    /// A send failure, if a thread stopped on one (the others are then stopped too).
    pub fn check(&mut self) -> Result<(), EngineError> {
        if self.threads.iter().any(JoinHandle::is_finished) {
            return self.join();
        }
        Ok(())
    }

    /// Let the threads send what is queued, and stop them; the first failure, if any.
    pub fn join(&mut self) -> Result<(), EngineError> {
        let (dead, _) = crossbeam_channel::bounded(1);
        drop(std::mem::replace(&mut self.heaps, dead));
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            let r = match t.join() {
                Ok(Err(e)) => Err(EngineError::Send(e)),
                Err(_) => Err(EngineError::Panicked("send")),
                Ok(Ok(())) => Ok(()),
            };
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

#[cfg(test)]
#[path = "send_sink_tests.rs"]
mod tests;
