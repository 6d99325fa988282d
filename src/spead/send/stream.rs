//! A send stream: heaps → packets → one or more interfaces, paced.
//!
//! Heaps carry a substream index (a destination: spead2's substreams, katgpucbf's one
//! destination per X-engine). Several heaps can be sent together, their packets interleaved
//! round-robin (spead2 `ROUND_ROBIN`, how katgpucbf sends a batch of F heaps) or one after
//! another (`SERIAL`). With several interfaces (NICs), a call's heaps are dealt out one by one,
//! each whole to the live interface least loaded at that moment (katgpucbf's multi-NIC scheme:
//! a heap's packets never straddle NICs, so receivers reassemble it as from one sender), and
//! each interface's share of the call, its *lane*, goes out as bursts of its own in the call's
//! mode. The lanes' bursts are interleaved in time: the next burst always comes from the lane
//! that has sent the smallest fraction of its bytes, so that every interface carries its share
//! of the rate throughout the call (a third each over three interfaces and equal heaps; with
//! unequal lanes each keeps its share to the end, rather than the smaller ones finishing
//! first and leaving the largest the whole rate, as taking the lane with the fewest bytes
//! sent would). A
//! call used to go whole to one interface, which then carried the stream's whole rate while
//! the others idled, more than its line rate where an operator gave the engine several NICs
//! because one cannot carry its output. Descriptors and stop heaps go to the first live
//! interface ([`super::balance`] says how, and what "live" means). One [`RateLimiter`] paces
//! every burst at the configured rate, whichever interface carries it: the bursts leave one
//! thread one after another, so the total is what is paced (limiters per interface at a
//! share of the rate paced calls of several bursts at the share, `super::balance`). Heap
//! counters follow a (first, step) sequence like spead2's `set_cnt_sequence`, wrapping to the
//! flavour's address width.
//!
//! An interface whose send fails with a link error is marked down, its lane moves to the
//! least-loaded live interface, and the burst that failed is sent again, whole, there: losing
//! it would lose every heap it carries a piece of, while re-sending costs at most a few
//! duplicate packets (those the kernel took before the error), which receivers drop by
//! payload range (spead2's and `spead::recv`'s duplicate detection). Only when no interface is live are the heaps of the call counted as
//! lost ([`SendCounters::lost_heaps`]), and the stream carries on, so that an engine survives
//! an outage of all its links and resumes when one comes back.
//!
//! A transport that learns of a failure only from its NIC's completions (`net::ibv`) may
//! find, at the next send or at [`SendStream::wait_sent`], that packets it had already taken
//! were never sent (`net::LinkDown`). The interface goes down as above, and those packets and
//! the heaps of the calls they belonged to are counted against it
//! ([`InterfaceCounters::lost_packets`], [`InterfaceCounters::lost_heaps`]: the heaps of those
//! calls that the interface carried; `super::in_flight` matches the one to the other); they
//! are not sent again (the calls are over).
//!
//! Sending is synchronous on the caller's thread: packets are written into one reusable
//! [`SendBatch`] as headers plus payload slices borrowed from the heaps (no payload copy in
//! user space) and handed to the transport in bursts.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::balance::{is_link_error, Balancer, InterfaceCounters};
use super::heap::{Heap, PacketGenerator, PacketiseError, PREFIX_LEN};
use super::in_flight::InFlight;
use super::lane::{fill_round_robin, fill_serial, Assign, Gen, Lane};
use super::rate::RateLimiter;
use crate::net::{lost_in_flight, PacketSender, SendBatch};
use crate::spead::wire::Flavour;
use crate::spead::wire::POINTER_LEN;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendStreamConfig {
    pub flavour: Flavour,
    /// Largest packet (spead2 default 1472; katgpucbf 8192 + 72).
    pub max_packet_size: usize,
    /// Bytes per second over all interfaces; 0 = unlimited.
    pub rate: f64,
    pub burst_size: usize,
    pub burst_rate_ratio: f64,
    /// First heap counter and step (spead2 defaults 1, 1).
    pub cnt_first: u64,
    pub cnt_step: u64,
    /// How long an interface that failed stays down before it is tried again.
    pub interface_retry: Duration,
}

impl Default for SendStreamConfig {
    fn default() -> Self {
        SendStreamConfig {
            flavour: Flavour::SPEAD_64_48,
            max_packet_size: 1472,
            rate: 0.0,
            burst_size: 65536,
            burst_rate_ratio: 1.05,
            cnt_first: 1,
            cnt_step: 1,
            interface_retry: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Packetise(#[from] PacketiseError),
    #[error("substream {0} out of range ({1} destinations)")]
    Substream(usize, usize),
    #[error("send failed: {0}")]
    Io(#[from] io::Error),
    #[error("send stream {0}: {1}")]
    Config(&'static str, String),
    /// Every interface is down: what was being sent is lost (counted by the stream).
    #[error("no send interface is up")]
    NoInterface,
}

impl SendStreamConfig {
    /// Refuse a configuration that cannot send: a packet with no room for payload, a rate
    /// that is not a finite non-negative number, an empty burst, a zero counter step.
    pub fn validate(&self) -> Result<(), SendError> {
        if self.max_packet_size & !7 < PREFIX_LEN + 2 * POINTER_LEN {
            return Err(PacketiseError::PacketTooSmall(self.max_packet_size).into());
        }
        if !(self.rate.is_finite() && self.rate >= 0.0) {
            return Err(SendError::Config(
                "rate",
                format!("{} is not ≥ 0", self.rate),
            ));
        }
        if !(self.burst_rate_ratio.is_finite() && self.burst_rate_ratio >= 1.0) {
            let r = self.burst_rate_ratio;
            return Err(SendError::Config(
                "burst_rate_ratio",
                format!("{r} is not ≥ 1"),
            ));
        }
        if self.burst_size == 0 {
            return Err(SendError::Config("burst_size", "must not be 0".into()));
        }
        if self.cnt_step == 0 {
            return Err(SendError::Config("cnt_step", "must not be 0".into()));
        }
        Ok(())
    }
}

/// Order of packets when several heaps are sent together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMode {
    RoundRobin,
    Serial,
}

/// One heap to send.
#[derive(Debug, Clone, Copy)]
pub struct HeapRef<'h, 'a> {
    pub heap: &'h Heap<'a>,
    /// Explicit heap counter; `None` takes the next of the stream's sequence.
    pub cnt: Option<u64>,
    pub substream: usize,
    /// Send without pacing (descriptors, as katgpucbf sends them at rate 0).
    pub unpaced: bool,
}

impl<'h, 'a> HeapRef<'h, 'a> {
    pub fn new(heap: &'h Heap<'a>, substream: usize) -> Self {
        HeapRef {
            heap,
            cnt: None,
            substream,
            unpaced: false,
        }
    }
}

/// Counters of what was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendCounters {
    pub heaps: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Heaps of calls that could not be completed because no interface was up (a call's heaps
    /// are counted whole: in round-robin mode each carries a piece of the lost bursts).
    pub lost_heaps: u64,
}

pub struct SendStream<S: PacketSender> {
    config: SendStreamConfig,
    txs: Vec<S>,
    balancer: Balancer,
    /// Paces every burst, on whichever interface, at the configured rate.
    limiter: RateLimiter,
    /// What each interface's NIC may still hold, to count what a failure loses.
    in_flight: InFlight,
    /// One lane per interface: the heaps of the current call dealt to it (module doc).
    lanes: Vec<Lane>,
    /// Per interface, bytes of the current call handed to it and not yet sent (the balance
    /// counts them as carried), kept so that steady sending does not allocate.
    queued: Vec<u64>,
    next_cnt: u64,
    /// Storage of the per-call [`SendBatch`], kept so that steady sending does not allocate.
    spare: SendBatch<'static>,
    counters: SendCounters,
    /// Once raised, pacing stops (see [`SendStream::set_hurry`]).
    hurry: Option<Arc<AtomicBool>>,
}

impl<S: PacketSender> SendStream<S> {
    /// One stream over `interfaces` (at least one), all with the same destination list.
    pub fn new(config: SendStreamConfig, interfaces: Vec<S>) -> Result<Self, SendError> {
        config.validate()?;
        if interfaces.is_empty() {
            return Err(SendError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no send interface",
            )));
        }
        let balancer = Balancer::new(
            (0..interfaces.len()).map(|i| i.to_string()).collect(),
            config.interface_retry,
        );
        Ok(SendStream {
            limiter: RateLimiter::new(config.rate, config.burst_rate_ratio),
            next_cnt: config.cnt_first,
            config,
            in_flight: InFlight::new(interfaces.len()),
            lanes: vec![Lane::default(); interfaces.len()],
            queued: vec![0; interfaces.len()],
            txs: interfaces,
            balancer,
            spare: SendBatch::default(),
            counters: SendCounters::default(),
            hurry: None,
        })
    }

    /// Stop pacing once `flag` is raised (a shutdown): what is still to send then goes out at
    /// line rate, and a wait already begun ends within [`SLEEP_SLICE`]. Stopping a process
    /// then takes bounded time however low the rate, and loses nothing already queued.
    pub fn set_hurry(&mut self, flag: Arc<AtomicBool>) {
        self.hurry = Some(flag);
    }

    pub fn config(&self) -> &SendStreamConfig {
        &self.config
    }

    pub fn counters(&self) -> SendCounters {
        self.counters
    }

    /// Name the interfaces (in the order given to [`SendStream::new`]) for log lines and
    /// [`SendStream::interfaces`]; they are numbered from 0 until then.
    pub fn set_interface_names(&mut self, names: &[String]) {
        self.balancer.set_names(names);
    }

    /// Each interface's name and counters (bytes carried, times down, live now).
    pub fn interfaces(&self) -> impl Iterator<Item = (&str, InterfaceCounters)> {
        self.balancer.counters()
    }

    pub fn destinations(&self) -> usize {
        self.txs[0].destinations()
    }

    /// Restart the heap counter sequence (spead2 `set_cnt_sequence`).
    pub fn set_cnt_sequence(&mut self, first: u64, step: u64) {
        self.next_cnt = first;
        self.config.cnt_first = first;
        self.config.cnt_step = step;
    }

    fn take_cnt(&mut self) -> u64 {
        let cnt = self.next_cnt;
        let mask = self.config.flavour.max_value();
        self.next_cnt = cnt.wrapping_add(self.config.cnt_step) & mask;
        cnt & mask
    }

    /// Send heaps together, each whole on one of the live interfaces, the least loaded when
    /// it is dealt out, their bursts interleaved over the interfaces (module doc); a lane
    /// whose interface fails moves to another, and the call's heaps are counted as lost if
    /// none is up.
    pub fn send_heaps(
        &mut self,
        heaps: &[HeapRef<'_, '_>],
        mode: SendMode,
    ) -> Result<(), SendError> {
        let live = self.balancer.first_live(Instant::now());
        self.send_on(live.map(|_| Assign::Balanced), heaps, mode)
    }

    /// Block until every interface's NIC is done with every packet sent so far
    /// ([`PacketSender::wait_sent`], bounded): after this, device memory the heaps were sent
    /// from may be rewritten. An interface whose link fails meanwhile has been made to drop
    /// what it held (the transport's contract): it goes down, the others take its heaps,
    /// and what it lost is counted against it; the stream carries on.
    pub fn wait_sent(&mut self) -> Result<(), SendError> {
        for i in 0..self.txs.len() {
            match self.txs[i].wait_sent() {
                Ok(()) => self.in_flight.confirmed(i),
                Err(e) if is_link_error(&e) => self.link_failed(i, &e),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether pacing has stopped ([`SendStream::set_hurry`]).
    fn hurried(&self) -> bool {
        self.hurry
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Interface `i` failed with link error `e`: down, and the packets it says its NIC lost
    /// counted, with their heaps.
    fn link_failed(&mut self, i: usize, e: &io::Error) {
        let packets = lost_in_flight(e);
        let heaps = self.in_flight.lost(i, packets);
        self.balancer.lost(i, packets, heaps);
        self.balancer.failed(i, Instant::now(), e);
    }

    /// Send heaps on the first live interface (descriptors, stop heaps).
    pub fn send_heaps_first(
        &mut self,
        heaps: &[HeapRef<'_, '_>],
        mode: SendMode,
    ) -> Result<(), SendError> {
        let iface = self.balancer.first_live(Instant::now());
        self.send_on(iface.map(Assign::To), heaps, mode)
    }

    /// Send as `assign` says, or count the heaps as lost when it is `None` (no interface is
    /// live) or when every interface fails on the way.
    fn send_on(
        &mut self,
        assign: Option<Assign>,
        heaps: &[HeapRef<'_, '_>],
        mode: SendMode,
    ) -> Result<(), SendError> {
        let result = match assign {
            Some(a) => self.send_all(a, heaps, mode),
            None => Err(SendError::NoInterface),
        };
        match result {
            Ok(()) => {
                self.counters.heaps += heaps.len() as u64;
                Ok(())
            }
            Err(SendError::NoInterface) => {
                self.counters.lost_heaps += heaps.len() as u64;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn send_all(
        &mut self,
        assign: Assign,
        heaps: &[HeapRef<'_, '_>],
        mode: SendMode,
    ) -> Result<(), SendError> {
        let n_dest = self.destinations();
        let now = Instant::now();
        for (k, l) in self.lanes.iter_mut().enumerate() {
            *l = Lane::new(k);
        }
        self.queued.fill(0);
        let mut gens = Vec::with_capacity(heaps.len());
        for (order, h) in heaps.iter().enumerate() {
            if h.substream >= n_dest {
                return Err(SendError::Substream(h.substream, n_dest));
            }
            let cnt = match h.cnt {
                Some(c) => c,
                None => self.take_cnt(),
            };
            let gen = PacketGenerator::new(
                h.heap,
                cnt,
                self.config.flavour,
                self.config.max_packet_size,
            )?;
            let lane = match assign {
                Assign::To(i) => i,
                Assign::Balanced => self
                    .balancer
                    .pick(now, &self.queued)
                    .ok_or(SendError::NoInterface)?,
            };
            // Counted as the packets' bytes, headers included, as the balancer counts what
            // each interface sent and a lane what it has sent.
            let wire = gen.wire_length();
            self.queued[lane] += wire;
            self.lanes[lane].bytes += wire;
            gens.push(Gen {
                gen,
                heap: h,
                lane,
                order,
            });
        }
        // Each lane's heaps together, in the order given, so a lane is a range of `gens`.
        gens.sort_unstable_by_key(|g| (g.lane, g.order));
        let mut start = 0;
        for (k, l) in self.lanes.iter_mut().enumerate() {
            let end = start + gens[start..].iter().take_while(|g| g.lane == k).count();
            l.heaps = start..end;
            start = end;
        }
        self.in_flight.begin();
        let mut batch = std::mem::take(&mut self.spare).reuse();
        let result = self.send_lanes(&mut batch, &mut gens, mode);
        batch.clear();
        self.spare = batch.reuse();
        result
    }

    /// Send every lane's bursts, each next burst from the lane furthest behind an even spread
    /// over the call (the smallest fraction of its bytes sent), so that every interface
    /// carries its share of the rate throughout the call rather than one after another.
    fn send_lanes<'h>(
        &mut self,
        batch: &mut SendBatch<'h>,
        gens: &mut [Gen<'h, '_, '_>],
        mode: SendMode,
    ) -> Result<(), SendError> {
        let call_paced = !gens.iter().all(|g| g.heap.unpaced);
        while let Some(k) = self.furthest_behind() {
            let lane = &mut self.lanes[k];
            let paced = match mode {
                SendMode::Serial => fill_serial(batch, lane, gens, self.config.burst_size),
                SendMode::RoundRobin => {
                    fill_round_robin(batch, lane, gens, self.config.burst_size);
                    call_paced
                }
            };
            if batch.is_empty() {
                self.lanes[k].done = true;
            } else {
                self.flush(batch, paced, k)?;
            }
        }
        Ok(())
    }

    /// The lane with packets left whose sent bytes are the smallest fraction of its heaps'
    /// bytes (ties to the first), or `None` when every lane is done.
    fn furthest_behind(&self) -> Option<usize> {
        let behind = |a: &Lane, b: &Lane| {
            u128::from(a.sent) * u128::from(b.bytes) < u128::from(b.sent) * u128::from(a.bytes)
        };
        let mut best: Option<usize> = None;
        for (k, l) in self.lanes.iter().enumerate() {
            if l.done || l.heaps.is_empty() {
                continue;
            }
            if best.is_none_or(|b| behind(l, &self.lanes[b])) {
                best = Some(k);
            }
        }
        best
    }

    /// Move lane `k` to the least-loaded live interface, counting what the other lanes still
    /// have to send as queued (its own interface failed or went down under another lane).
    /// `failed`, the interface the lane's burst just failed on, is taken only when no other
    /// is live: with a short retry interval it may already be due for a trial, and trying it
    /// again at once would use up the burst's tries before the others are tried.
    fn move_lane(
        &mut self,
        k: usize,
        now: Instant,
        failed: Option<usize>,
    ) -> Result<(), SendError> {
        self.queued.fill(0);
        for (j, l) in self.lanes.iter().enumerate() {
            if j != k && !l.done {
                self.queued[l.iface] += l.bytes.saturating_sub(l.sent);
            }
        }
        if let Some(f) = failed {
            self.queued[f] = u64::MAX;
        }
        let lane = &mut self.lanes[k];
        lane.iface = self
            .balancer
            .pick(now, &self.queued)
            .ok_or(SendError::NoInterface)?;
        lane.charged = false;
        Ok(())
    }

    /// Send lane `k`'s burst on its interface, paced; on a link error, mark that interface
    /// down, move the lane to the least-loaded of the others and send the burst again there
    /// at once (its time on the schedule was reserved once), until one takes it or none is
    /// left ([`SendError::NoInterface`]). Each burst tries at most as many sends as there are
    /// interfaces, so a short retry interval cannot make it spin while every link is down.
    fn flush(&mut self, batch: &mut SendBatch<'_>, paced: bool, k: usize) -> Result<(), SendError> {
        let bytes = batch.bytes();
        if paced && !self.hurried() {
            let at = self.limiter.reserve(Instant::now(), bytes);
            sleep_until_or(at, || self.hurried());
        }
        if !self.balancer.is_live(self.lanes[k].iface) {
            self.move_lane(k, Instant::now(), None)?;
        }
        for tries in 1.. {
            let iface = self.lanes[k].iface;
            match self.txs[iface].send_batch(batch) {
                Ok(()) => {
                    let lane = &mut self.lanes[k];
                    let new_heaps = if lane.charged { 0 } else { lane.heaps.len() };
                    lane.charged = true;
                    lane.sent += bytes as u64;
                    self.balancer.sent(iface, batch.len(), bytes);
                    self.in_flight.sent(iface, batch.len(), new_heaps);
                    break;
                }
                Err(e) if is_link_error(&e) => {
                    self.link_failed(iface, &e);
                    if tries >= self.txs.len() {
                        return Err(SendError::NoInterface);
                    }
                    self.move_lane(k, Instant::now(), Some(iface))?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.counters.packets += batch.len() as u64;
        self.counters.bytes += bytes as u64;
        batch.clear();
        Ok(())
    }
}

/// Longest single kernel sleep of [`sleep_until_or`]: how soon a stop is noticed.
pub const SLEEP_SLICE: Duration = Duration::from_millis(20);

/// Sleep until `at`, or until `stop()` holds (checked at least every [`SLEEP_SLICE`]): the
/// kernel sleep for all but the last 100 µs, then spin, so that bursts start on time without
/// burning a core between them. False if stopped early.
pub fn sleep_until_or(at: Instant, stop: impl Fn() -> bool) -> bool {
    const SPIN: Duration = Duration::from_micros(100);
    loop {
        let now = Instant::now();
        if now >= at {
            return true;
        }
        if stop() {
            return false;
        }
        let left = at - now;
        if left > SPIN {
            std::thread::sleep((left - SPIN).min(SLEEP_SLICE));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
