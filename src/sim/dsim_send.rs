//! dsim's send threads. One thread over kernel UDP sockets tops out near 25 Gb/s on the lent
//! host, short of a MeerKAT L-band antenna (2 × 1712 MS/s × 10 bits = 34 Gb/s, issue 14), so
//! the heaps are shared out between `--send-threads` threads, each with its own sockets and
//! optionally its own core (`--affinity`).
//!
//! The time axis is cut into groups of [`GROUP_STEPS`] heap timestamps (every polarisation of
//! a timestamp goes together); thread t of T sends groups t, t + T, t + 2T, … Each group leaves
//! as one burst (`DsimPlan::send_config` sizes the burst to a group) when the sample clock
//! reaches it ([`Pacer`]), so the groups leave in timestamp order to within about one group,
//! far inside a receiver's chunk window.
//!
//! A `?signals` switch must take effect at the same timestamp in every thread. The threads
//! claim each group under one lock ([`Schedule`]), which also records the pattern in force
//! from each switch step on; a switch is placed just past the furthest claimed group, so no
//! step sent before it carries the new pattern, no group is sent half old and half new, and
//! the reply names the exact first timestamp (a slower thread's groups below it keep the old
//! pattern, as their timestamps say they must).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::dsim::DigitiserHeaps;
use super::dsim_config::DsimPlan;
use super::dsim_control::SignalChange;
use super::dsim_engine::{DsimReport, DESCRIPTOR_INTERVAL};
use crate::engine::affinity::pin_current_thread;
use crate::engine::{EngineError, Shutdown};
use crate::net::PacketSender;
use crate::spead::send::stream::{sleep_until_or, SendError};
use crate::spead::send::{Heap, HeapRef, SendMode, SendStream};

/// Heap timestamps a send thread claims at a time. Within a group the heaps of one
/// destination are adjacent, so the UDP sender hands them to the kernel as one GSO message;
/// the polarisations get at most this many heaps (32768 samples at 4096 per heap) out of
/// step, well inside a receiver's chunk window.
pub const GROUP_STEPS: u64 = 8;

/// How often the coordinating thread looks for a `?signals` switch and the end of the run.
const POLL: Duration = Duration::from_millis(20);

/// How long the stop heaps wait after the last data: with several threads the data left on
/// other sockets, which a NIC may serve from other queues, and a stop heap that overtook them
/// would end a receiver's stream early.
const STOP_GRACE: Duration = Duration::from_millis(20);

/// Raises `failed` if its thread unwinds, so that a panicking send thread stops the others
/// instead of leaving a hole every T groups in an unbounded run.
struct PanicFlag<'a>(&'a AtomicBool);

impl Drop for PanicFlag<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// The pattern in force at each step, and how far each thread has claimed.
struct Schedule {
    /// (first step, pattern), ascending by step; the first entry starts at step 0.
    switches: Vec<(u64, Arc<DigitiserHeaps>)>,
    /// Per thread: the end of the last group it claimed (0 before its first).
    claimed: Vec<u64>,
}

impl Schedule {
    fn new(heaps: Arc<DigitiserHeaps>, threads: usize) -> Schedule {
        Schedule {
            switches: vec![(0, heaps)],
            claimed: vec![0; threads],
        }
    }

    /// Thread `t` takes steps `first..end`: the pattern in force at `first`.
    fn claim(&mut self, t: usize, first: u64, end: u64) -> Arc<DigitiserHeaps> {
        self.claimed[t] = end;
        let i = self.switches.partition_point(|(s, _)| *s <= first);
        Arc::clone(&self.switches[i.max(1) - 1].1)
    }

    /// Switch to `heaps` just past the furthest claimed group; returns that step. Groups
    /// start at multiples of [`GROUP_STEPS`] and every claim ends on one (or at
    /// `--max-heaps`, after which nothing is claimed), so no group straddles the switch.
    /// Patterns no thread can need again are dropped: each may hold 2^27 samples per pol.
    fn switch(&mut self, heaps: Arc<DigitiserHeaps>) -> u64 {
        let at = self.claimed.iter().copied().max().unwrap_or(0);
        self.switches.push((at, heaps));
        // Every later claim starts at or after the thread's own last claim end.
        let low = self.claimed.iter().copied().min().unwrap_or(0);
        let keep = self.switches.partition_point(|(s, _)| *s <= low).max(1) - 1;
        self.switches.drain(..keep);
        at
    }
}

/// How much faster than the rate a send thread that fell behind the clock may send.
const CATCH_UP: f64 = 2.0;

/// When a send thread's groups leave: the group at step `first` is due when the sample clock
/// reaches it, `start + first × step`, and no sooner than a group's share of time over
/// [`CATCH_UP`] after the thread's previous burst. So a thread that fell behind (its core
/// taken, a slow system call) makes the time up, at most twice as fast as the rate, and the
/// threads stay together. Paced instead by the stream's rate limiter, whose schedule restarts
/// once it is a burst behind (it cannot tell a late sender from an idle one), every hiccup
/// was lost for good: on the lent H100's host four threads fell behind the clock by ~45 ms
/// per second and apart from each other, until the engine's window dropped the slowest
/// thread's heaps as too old (2026-11-27, bench/RESULTS.md "full-rate antenna").
struct Pacer {
    start: Instant,
    /// Seconds per step, unrounded: a step rounded to whole nanoseconds (2392.52 → 2393 ns at
    /// 1712 MS/s) and multiplied up would drift 0.7 s an hour from the sample clock.
    step: f64,
    min_gap: Duration,
}

impl Pacer {
    /// `threads` threads share the groups in turn, so one thread's groups are `threads` groups
    /// of time apart.
    fn new(start: Instant, step: f64, threads: u64) -> Pacer {
        Pacer {
            start,
            step,
            min_gap: Duration::from_secs_f64(step * (GROUP_STEPS * threads) as f64 / CATCH_UP),
        }
    }

    /// When the group starting at step `first` may leave, the thread's previous burst having
    /// left at `last`.
    fn due(&self, first: u64, last: Option<Instant>) -> Instant {
        let clock = self.start + Duration::from_secs_f64(first as f64 * self.step);
        last.map_or(clock, |l| clock.max(l + self.min_gap))
    }
}

/// What one send thread has sent, read by the progress reports.
#[derive(Default)]
struct Sent {
    steps: AtomicU64,
    packets: AtomicU64,
    bytes: AtomicU64,
}

/// What the send threads share.
struct Shared<'a> {
    plan: &'a DsimPlan,
    schedule: Mutex<Schedule>,
    sent: Vec<Sent>,
    start_timestamp: u64,
    start: Instant,
    shutdown: &'a Shutdown,
    /// Raised by a thread whose send failed, so that the others stop too.
    failed: AtomicBool,
}

impl Shared<'_> {
    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopped(&self) -> bool {
        self.shutdown.requested() || self.failed.load(Ordering::Relaxed)
    }

    fn report(&self) -> DsimReport {
        let sum = |f: fn(&Sent) -> &AtomicU64| -> u64 {
            self.sent.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
        };
        DsimReport {
            heaps: sum(|s| &s.steps) * self.plan.dests.len() as u64,
            packets: sum(|s| &s.packets),
            bytes: sum(|s| &s.bytes),
            first_timestamp: self.start_timestamp,
            elapsed: self.start.elapsed(),
        }
    }
}

/// Send digitiser heaps from `start_timestamp` on `streams` (one per send thread, each built
/// with [`DsimPlan::send_config`] for its index) until a limit or shutdown, switching
/// patterns as `changes` ask. `progress` is called about once a second. The first stream also
/// carries the descriptors and, with `--send-stop`, the stop heaps.
pub fn send_loop<S: PacketSender + Send>(
    plan: &DsimPlan,
    heaps: Arc<DigitiserHeaps>,
    changes: Option<&Receiver<SignalChange>>,
    streams: &mut [SendStream<S>],
    start_timestamp: u64,
    shutdown: &Shutdown,
    mut progress: impl FnMut(&DsimReport),
) -> Result<DsimReport, EngineError> {
    let send_err = |e: SendError| EngineError::Send(e.to_string());
    let threads = streams.len();
    let shared = Shared {
        plan,
        schedule: Mutex::new(Schedule::new(heaps, threads)),
        sent: (0..threads).map(|_| Sent::default()).collect(),
        start_timestamp,
        start: Instant::now(),
        shutdown,
        failed: AtomicBool::new(false),
    };
    let hs = plan.config.heap_samples as u64;
    let descriptor_heap = shared.schedule().switches[0].1.descriptor_heap();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter_mut()
            .enumerate()
            .map(|(t, stream)| {
                let (shared, descriptors) = (&shared, &descriptor_heap);
                s.spawn(move || {
                    let _flag = PanicFlag(&shared.failed);
                    let r = send_thread(shared, t, stream, (t == 0).then_some(descriptors));
                    if r.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        // This thread: pattern switches and progress, until every send thread is done.
        let mut last_progress = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            match changes.map(|c| c.recv_timeout(POLL)) {
                Some(Ok(change)) => {
                    // Send threads claim groups under this lock: the sensors change before any
                    // heap of the new pattern can be claimed.
                    let mut schedule = shared.schedule();
                    let at = schedule.switch(change.heaps);
                    (change.announce)();
                    drop(schedule);
                    let _ = change.started.send(start_timestamp + at * hs);
                }
                Some(Err(RecvTimeoutError::Timeout)) => {}
                Some(Err(RecvTimeoutError::Disconnected)) | None => std::thread::sleep(POLL),
            }
            if last_progress.elapsed() >= Duration::from_secs(1) {
                progress(&shared.report());
                last_progress = Instant::now();
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Vec<_>>()
    });
    let mut descriptor_cnt = 1;
    for (t, r) in results.into_iter().enumerate() {
        let cnt = r.map_err(send_err)?;
        if t == 0 {
            descriptor_cnt = cnt;
        }
    }
    if plan.send_stop {
        if threads > 1 {
            std::thread::sleep(STOP_GRACE);
        }
        let mut stop = Heap::new();
        stop.add_end();
        to_every_destination(&mut streams[0], &stop, descriptor_cnt).map_err(send_err)?;
    }
    let mut report = shared.report();
    // The stop heaps count as sent bytes, as they did on one thread.
    let c = streams.iter().map(SendStream::counters);
    (report.packets, report.bytes) = c.fold((0, 0), |(p, b), c| (p + c.packets, b + c.bytes));
    Ok(report)
}

/// Send thread `t`: groups t, t + T, …, and `descriptors` (thread 0's) every
/// [`DESCRIPTOR_INTERVAL`]. Returns the next free descriptor heap counter.
fn send_thread<S: PacketSender>(
    shared: &Shared<'_>,
    t: usize,
    stream: &mut SendStream<S>,
    descriptors: Option<&Heap<'_>>,
) -> Result<u64, SendError> {
    let plan = shared.plan;
    if let Some(core) = plan.send_cores.get(t).copied().flatten() {
        if let Err(e) = pin_current_thread(core) {
            tracing::warn!(thread = t, "--affinity: {e}; the send thread runs unpinned");
        }
    }
    let threads = shared.sent.len() as u64;
    let n_pols = plan.dests.len();
    let offsets: Vec<usize> = plan
        .dests
        .iter()
        .scan(0, |acc, d| {
            let o = *acc;
            *acc += d.len();
            Some(o)
        })
        .collect();
    let hs = plan.config.heap_samples as u64;
    // Thread t's first group is group t, due t groups' time after thread 0's: groups leave in
    // order.
    let pacer = plan
        .step_seconds()
        .map(|step| Pacer::new(shared.start, step, threads));
    let mut last_burst = None;
    let mut descriptor_cnt = 1u64;
    let mut last_descriptors: Option<Instant> = None;
    let mut group = t as u64;
    loop {
        let now = Instant::now();
        let first = group * GROUP_STEPS;
        let end = plan
            .max_heaps
            .map_or(first + GROUP_STEPS, |m| m.min(first + GROUP_STEPS));
        if shared.stopped()
            || plan.duration.is_some_and(|d| now - shared.start >= d)
            || first >= end
        {
            break;
        }
        if let Some(heap) = descriptors {
            if last_descriptors.is_none_or(|at| now - at >= DESCRIPTOR_INTERVAL) {
                descriptor_cnt = to_every_destination(stream, heap, descriptor_cnt)?;
                last_descriptors = Some(now);
            }
        }
        if let Some(pacer) = &pacer {
            let due = pacer.due(first, last_burst);
            // A group due after the run's end is not sent (nor slept for).
            if plan.duration.is_some_and(|d| due >= shared.start + d)
                || !sleep_until_or(due, || shared.stopped())
            {
                break;
            }
            last_burst = Some(Instant::now());
        }
        let heaps = shared.schedule().claim(t, first, end);
        // Grouped by destination (polarisation, then its destinations in turn) so that the
        // packets of one destination are adjacent (one GSO message).
        let mut batch: Vec<(Heap<'_>, usize)> = Vec::with_capacity((end - first) as usize * n_pols);
        for (p, dests) in plan.dests.iter().enumerate() {
            let n_dest = dests.len() as u64;
            for d in 0..n_dest {
                for s in (first..end).filter(|s| s % n_dest == d) {
                    let ts = shared.start_timestamp + s * hs;
                    batch.push((heaps.heap(p, ts), offsets[p] + d as usize));
                }
            }
        }
        let refs: Vec<HeapRef> = batch.iter().map(|(h, d)| HeapRef::new(h, *d)).collect();
        stream.send_heaps(&refs, SendMode::Serial)?;
        let sent = &shared.sent[t];
        let c = stream.counters();
        sent.steps.fetch_add(end - first, Ordering::Relaxed);
        sent.packets.store(c.packets, Ordering::Relaxed);
        sent.bytes.store(c.bytes, Ordering::Relaxed);
        group += threads;
    }
    Ok(descriptor_cnt)
}

/// Send `heap` once to every destination, unpaced, on the first interface, each copy with its
/// own odd cnt from `first_cnt` (a receiver joined to several destinations must see distinct
/// heaps); returns the next free cnt.
fn to_every_destination<S: PacketSender>(
    stream: &mut SendStream<S>,
    heap: &Heap<'_>,
    first_cnt: u64,
) -> Result<u64, SendError> {
    let refs: Vec<HeapRef> = (0..stream.destinations())
        .map(|d| HeapRef {
            heap,
            cnt: Some(first_cnt + 2 * d as u64),
            substream: d,
            unpaced: true,
        })
        .collect();
    stream.send_heaps_first(&refs, SendMode::RoundRobin)?;
    Ok(first_cnt + 2 * refs.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::dsim::DigitiserConfig;

    fn pattern(id: u64) -> Arc<DigitiserHeaps> {
        Arc::new(DigitiserHeaps {
            config: DigitiserConfig {
                adc_sample_rate: 1e6,
                sample_bits: 8,
                heap_samples: 8,
                period: 8,
                first_id: id,
                dither_seed: 0,
            },
            patterns: vec![],
        })
    }

    fn id(h: &DigitiserHeaps) -> u64 {
        h.config.first_id
    }

    #[test]
    fn a_switch_lands_after_every_claimed_group_and_old_patterns_are_dropped() {
        let mut s = Schedule::new(pattern(0), 3);
        assert_eq!(id(&s.claim(0, 0, 8)), 0);
        assert_eq!(id(&s.claim(1, 8, 16)), 0);
        // Thread 2 has not claimed yet; thread 1 is furthest.
        assert_eq!(s.switch(pattern(1)), 16);
        assert_eq!(id(&s.claim(2, 16, 24)), 1);
        // Thread 0's next group (24) is past the switch.
        assert_eq!(id(&s.claim(0, 24, 32)), 1);
        assert_eq!(
            s.switches.len(),
            2,
            "patterns are dropped at the next switch"
        );
        assert_eq!(id(&s.claim(1, 32, 40)), 1);
        // Every thread is past 16 now: the next switch drops pattern 0.
        assert_eq!(s.switch(pattern(2)), 40);
        assert_eq!(
            s.switches
                .iter()
                .map(|(at, h)| (*at, id(h)))
                .collect::<Vec<_>>(),
            vec![(16, 1), (40, 2)]
        );
        // A claim below a switch still gets the pattern in force there.
        let mut s = Schedule::new(pattern(0), 2);
        s.claim(0, 0, 8);
        assert_eq!(s.switch(pattern(1)), 8);
        assert_eq!(
            id(&s.claim(1, 0, 8)),
            0,
            "a slow thread's first group predates it"
        );
    }

    #[test]
    fn a_late_thread_makes_the_time_up_at_twice_the_rate_then_follows_the_clock() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // 1 ms per step, 2 threads: a thread's groups are 16 steps (16 ms) apart.
        let p = Pacer::new(t0, 1e-3, 2);
        assert_eq!(p.due(0, None), t0);
        assert_eq!(p.due(8, None), t0 + ms(8), "thread 1 starts a group later");
        // On time: the clock decides.
        assert_eq!(p.due(16, Some(t0)), t0 + ms(16));
        // Thread 0 sent group 0 at t0, then stalled: group 2 (step 16) went out 40 ms late.
        let mut last = t0 + ms(56);
        assert_eq!(
            p.due(32, Some(last)),
            last + ms(8),
            "catch up at twice the rate"
        );
        // Each later group leaves 8 ms after the previous (16 ms of data) until the clock is
        // reached again: lateness 40, 32, 24, 16, 8, 0 ms.
        let mut first = 32;
        let mut lateness = vec![];
        for _ in 0..7 {
            let due = p.due(first, Some(last));
            lateness.push((due - (t0 + ms(first))).as_millis());
            last = due;
            first += 16;
        }
        assert_eq!(lateness, vec![32, 24, 16, 8, 0, 0, 0]);
    }

    #[test]
    fn the_clock_does_not_drift_over_an_hour() {
        // 1712 MS/s in heaps of 4096 samples: 2392.52 ns a step, not a whole number of ns.
        let step = 4096.0 / 1712e6;
        let t0 = Instant::now();
        let p = Pacer::new(t0, step, 4);
        let hour = (3600.0 / step) as u64;
        let late = (p.due(hour, None) - t0).as_secs_f64() - hour as f64 * step;
        assert!(
            late.abs() < 1e-6,
            "{late} s off the sample clock after an hour"
        );
    }

    #[test]
    fn a_switch_before_any_claim_replaces_the_first_pattern() {
        let mut s = Schedule::new(pattern(0), 2);
        assert_eq!(s.switch(pattern(5)), 0);
        assert_eq!(id(&s.claim(1, 8, 16)), 5);
        assert_eq!(s.switches.len(), 1);
    }
}
