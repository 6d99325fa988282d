//! Multi-NIC balancing (seed 000 §Network transmit: "a stream is selected for each heap to
//! balance the load"): which of a send stream's interfaces takes the next heaps, at what share
//! of the stream's rate, and what happens when one of them fails.
//!
//! - **One common rate.** The stream's rate is split equally between the *live* interfaces
//!   (up, or on trial after a failure), each paced by its own [`RateLimiter`] so that bursts
//!   on different NICs overlap. When one goes down its share moves to the others, so the total
//!   stays the configured rate; a change of share keeps every limiter's schedule
//!   ([`RateLimiter::set_rate`]), so it neither grants credit nor stalls.
//! - **Least loaded, in bytes.** The next heaps go to a live interface that carried no more
//!   than one burst more than the least-carrying one since the live set last changed; of
//!   those, to the one whose limiter lets it start soonest (so that the sender does not wait
//!   on one interface while another could send), then to the one that carried the fewest
//!   bytes, then to the next after the one used last (a first-index tie-break would load the
//!   first interface most exactly when the host is busiest). An interface receives heaps only
//!   while it is within a burst of the least-carrying one, so whatever the timing no
//!   interface carries more than the largest call plus one burst more than another.
//!   The limiters' schedules alone are not a measure of load: a limiter restarts its schedule
//!   after idle time ([`RateLimiter::wake`]), so an interface that had just sent and ran a
//!   little (less than a burst) behind its schedule looked less loaded than idle ones that
//!   had carried less, and took call after call. When the sender was a little slower than an
//!   interface's share, one interface took most of the traffic (an optimised build sending
//!   1-48 KiB heaps over three interfaces at 4 GB/s: 4-6 heaps in a row on one, ±2.4 % of
//!   the mean over 300 heaps; calls of many bursts could all go to one).
//! - **Failure.** A send that fails with a link error ([`is_link_error`]: the interface went
//!   down, lost its address or its route) marks the interface down: counted, logged once, its
//!   share moved. After `retry` it is put on trial: it is live again, real heaps go out on it,
//!   and a success brings it back up (logged); a failure sends it down for another `retry`
//!   without a new log line or count. What the caller does with the failed burst is its
//!   business (`super::stream` re-sends it on another interface).
//!
//! Pure: time is an argument, and the caller sends and reports each outcome, so every
//! decision here can be tested without a clock or a network.
#![deny(unsafe_code)]

use std::io;
use std::time::{Duration, Instant};

use super::rate::RateLimiter;

/// A send error that means "this interface cannot send now" rather than "this send is wrong":
/// the link is down (ENETDOWN, ENODEV, ENXIO, ENOLINK, or a transport's own report of kind
/// `NetworkDown`, such as `net::LinkDown`), has no route (ENETUNREACH, EHOSTUNREACH,
/// EHOSTDOWN) or lost the address the socket is bound to (EADDRNOTAVAIL). Other errors (a bad
/// destination index, a receiver gone) stay errors of the stream.
pub fn is_link_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NetworkDown
        || matches!(
            e.raw_os_error(),
            Some(
                libc::ENETDOWN
                    | libc::ENODEV
                    | libc::ENXIO
                    | libc::ENOLINK
                    | libc::ENETUNREACH
                    | libc::EHOSTUNREACH
                    | libc::EHOSTDOWN
                    | libc::EADDRNOTAVAIL
            )
        )
}

/// Where an interface stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// Failed; tried again from `retry_at`.
    Down {
        retry_at: Instant,
    },
    /// Tried again after a failure: live, and up at its first success.
    Trial,
}

/// What one interface carried, and how often it failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Times the interface went down (a failed trial is not counted again).
    pub downs: u64,
    /// Failed sends, trials included.
    pub failures: u64,
    /// Packets the interface's NIC had taken and lost when its link failed (`net::LinkDown`),
    /// and the heaps of the send calls they belonged to (each call's heaps counted whole).
    pub lost_packets: u64,
    pub lost_heaps: u64,
    /// Not down (up or on trial) at the time of reading.
    pub live: bool,
}

#[derive(Debug, Clone)]
struct Link {
    name: String,
    limiter: RateLimiter,
    state: LinkState,
    counters: InterfaceCounters,
    /// Bytes carried since the live set last changed (the balance).
    since_change: u64,
}

/// The interfaces of one send stream: shares, choice and failures.
#[derive(Debug, Clone)]
pub struct Balancer {
    links: Vec<Link>,
    /// Bytes per second over all live interfaces; 0 = unlimited.
    rate: f64,
    retry: Duration,
    /// How many bytes more than the least-carrying live interface one may have carried and
    /// still be chosen: one burst.
    slack: u64,
    /// The interface [`Balancer::pick`] chose last.
    last: usize,
}

impl Balancer {
    /// `names` (one per interface, at least one) label the log lines; `rate` in bytes per
    /// second is shared by the live interfaces; a failed interface is tried again after
    /// `retry`.
    pub fn new(
        names: Vec<String>,
        rate: f64,
        burst_size: usize,
        burst_rate_ratio: f64,
        retry: Duration,
    ) -> Balancer {
        let links = names
            .into_iter()
            .map(|name| Link {
                name,
                limiter: RateLimiter::new(0.0, burst_size, burst_rate_ratio),
                state: LinkState::Up,
                counters: InterfaceCounters {
                    live: true,
                    ..Default::default()
                },
                since_change: 0,
            })
            .collect();
        let mut b = Balancer {
            links,
            rate,
            retry,
            slack: burst_size as u64,
            last: 0,
        };
        b.reshare();
        b
    }

    /// Interfaces, live or not.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Rename the interfaces (for log lines); extra names are ignored.
    pub fn set_names(&mut self, names: &[String]) {
        for (l, n) in self.links.iter_mut().zip(names) {
            l.name.clone_from(n);
        }
    }

    pub fn name(&self, i: usize) -> &str {
        &self.links[i].name
    }

    pub fn state(&self, i: usize) -> LinkState {
        self.links[i].state
    }

    /// Interfaces that may be chosen: up or on trial.
    pub fn live(&self) -> usize {
        self.links.iter().filter(|l| is_live(l.state)).count()
    }

    /// The rate interface `i` is paced at now: the stream's rate over the live interfaces
    /// (0 = unlimited, also for a down interface).
    pub fn share(&self, i: usize) -> f64 {
        if is_live(self.links[i].state) && self.rate > 0.0 {
            self.rate / self.live() as f64
        } else {
            0.0
        }
    }

    /// Every interface's name and counters.
    pub fn counters(&self) -> impl Iterator<Item = (&str, InterfaceCounters)> {
        self.links.iter().map(|l| (l.name.as_str(), l.counters))
    }

    /// Give every live interface its share of the rate and restart the tie-break count.
    fn reshare(&mut self) {
        let live = self.live().max(1) as f64;
        for l in &mut self.links {
            if is_live(l.state) {
                l.limiter.set_rate(self.rate / live);
            }
            l.since_change = 0;
        }
    }

    /// Put interfaces whose retry time has come on trial.
    fn promote(&mut self, now: Instant) {
        let mut changed = false;
        for l in &mut self.links {
            if let LinkState::Down { retry_at } = l.state {
                if now >= retry_at {
                    l.state = LinkState::Trial;
                    l.counters.live = true;
                    changed = true;
                }
            }
        }
        if changed {
            self.reshare();
        }
    }

    /// The least-loaded live interface for heaps handed over at `now` (module doc), or `None`
    /// when every interface is down and none is due for a retry.
    pub fn pick(&mut self, now: Instant) -> Option<usize> {
        self.wake(now);
        let n = self.links.len();
        let live = (1..=n)
            .map(|k| (self.last + k) % n)
            .filter(|&i| is_live(self.links[i].state));
        let fewest = live.clone().map(|i| self.links[i].since_change).min()?;
        let chosen = live
            .filter(|&i| self.links[i].since_change <= fewest + self.slack)
            .min_by_key(|&i| {
                let l = &self.links[i];
                // Probe the limiter's next start without committing (clones are cheap). One
                // that is behind its schedule can start now, and no sooner than an idle one:
                // how far behind it is measures the sender's lateness, not the load.
                (l.limiter.clone().reserve(now, 0).max(now), l.since_change)
            })?;
        self.last = chosen;
        Some(chosen)
    }

    /// The first live interface (descriptors and stop heaps go there, seed 000 §Network
    /// transmit), or `None` when none is.
    pub fn first_live(&mut self, now: Instant) -> Option<usize> {
        self.wake(now);
        self.links.iter().position(|l| is_live(l.state))
    }

    /// New data is handed over at `now`: interfaces due for a retry go on trial, and every
    /// live limiter more than a burst behind forgets its schedule (it was idle; idle time is
    /// not credit).
    fn wake(&mut self, now: Instant) {
        self.promote(now);
        for l in &mut self.links {
            if is_live(l.state) {
                l.limiter.wake(now);
            }
        }
    }

    /// Reserve a burst of `bytes` on interface `i`; returns when it may start.
    pub fn reserve(&mut self, i: usize, now: Instant, bytes: usize) -> Instant {
        self.links[i].limiter.reserve(now, bytes)
    }

    /// Interface `i` sent `packets` packets of `bytes` bytes in all.
    pub fn sent(&mut self, i: usize, packets: usize, bytes: usize) {
        let l = &mut self.links[i];
        l.counters.packets += packets as u64;
        l.counters.bytes += bytes as u64;
        l.since_change += bytes as u64;
        if l.state == LinkState::Trial {
            l.state = LinkState::Up;
            let live = self.live();
            tracing::info!(interface = %self.links[i].name, live, "send interface is back up");
        }
    }

    /// Interface `i`'s NIC lost `packets` packets it had taken, of `heaps` heaps, when its
    /// link failed.
    pub fn lost(&mut self, i: usize, packets: u64, heaps: u64) {
        let c = &mut self.links[i].counters;
        c.lost_packets += packets;
        c.lost_heaps += heaps;
    }

    /// A send on interface `i` failed at `now` with `error` (a link error): down until
    /// `now + retry`, its share moved to the others.
    pub fn failed(&mut self, i: usize, now: Instant, error: &io::Error) {
        let l = &mut self.links[i];
        let was = l.state;
        l.state = LinkState::Down {
            retry_at: now + self.retry,
        };
        l.counters.failures += 1;
        l.counters.live = false;
        if was == LinkState::Up {
            l.counters.downs += 1;
            let name = l.name.clone();
            let live = self.live();
            if live == 0 {
                tracing::error!(interface = %name, %error, retry_s = self.retry.as_secs_f64(),
                    "send interface down and none is left: heaps are counted as lost until one comes back");
            } else {
                tracing::warn!(interface = %name, %error, live, retry_s = self.retry.as_secs_f64(),
                    "send interface down: the others carry its share of the rate");
            }
        }
        self.reshare();
    }
}

fn is_live(s: LinkState) -> bool {
    !matches!(s, LinkState::Down { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balancer(n: usize, rate: f64, retry: Duration) -> Balancer {
        let names = (0..n).map(|i| format!("nic{i}")).collect();
        Balancer::new(names, rate, 8192, 1.05, retry)
    }

    fn down() -> io::Error {
        io::Error::from_raw_os_error(libc::ENETDOWN)
    }

    /// A sender that always has data ("under load") drives the balancer in simulated time:
    /// each burst goes to the interface picked, starts when its limiter allows (never before
    /// the previous burst: one thread sends), and takes no time itself. Returns the simulated
    /// time at the end.
    fn run(
        b: &mut Balancer,
        mut now: Instant,
        bursts: usize,
        size: impl Fn(usize) -> usize,
    ) -> Instant {
        for k in 0..bursts {
            let i = b.pick(now).expect("an interface is live");
            let bytes = size(k);
            now = now.max(b.reserve(i, now, bytes));
            b.sent(i, 1, bytes);
        }
        now
    }

    fn bytes(b: &Balancer) -> Vec<u64> {
        b.counters().map(|(_, c)| c.bytes).collect()
    }

    /// The theorem behind "one common rate limit": with k live interfaces each paced at R/k,
    /// a sender that always has data sends R bytes per second in all, whatever k is and
    /// however k changes (shares move, schedules stay). Checked on the limiter arithmetic in
    /// simulated time, for 1 to 4 interfaces and after each of them but one goes down.
    #[test]
    fn total_rate_is_the_configured_rate_whatever_the_live_count() {
        const RATE: f64 = 1e9;
        let size = |k: usize| 4096 + (k * 7919) % 8192; // uneven bursts
        for n in 1..=4 {
            let t0 = Instant::now();
            let mut b = balancer(n, RATE, Duration::from_secs(3600));
            let mut now = t0;
            for live in (1..=n).rev() {
                assert_eq!(b.live(), live);
                let before: u64 = bytes(&b).iter().sum();
                let start = now;
                now = run(&mut b, now, 4000, size);
                let sent = (bytes(&b).iter().sum::<u64>() - before) as f64;
                let rate = sent / (now - start).as_secs_f64();
                assert!(
                    (rate / RATE - 1.0).abs() < 0.02,
                    "{n} interfaces, {live} live: {rate:.4e} B/s"
                );
                // Take the most recently used one down.
                if live > 1 {
                    let i = b.last;
                    b.failed(i, now, &down());
                    assert_eq!(b.share(i), 0.0);
                    for j in (0..n).filter(|&j| is_live(b.state(j))) {
                        assert!((b.share(j) * (live - 1) as f64 / RATE - 1.0).abs() < 1e-12);
                    }
                }
            }
        }
    }

    /// Least-loaded choice balances bytes, not heaps: uneven bursts paced at a rate, and
    /// uneven bursts at an unlimited rate (every limiter answers "now"), both end with each
    /// interface within 1 % of the mean.
    #[test]
    fn uneven_bursts_balance_by_bytes() {
        for rate in [1e9, 0.0] {
            let mut b = balancer(3, rate, Duration::from_secs(1));
            // Sizes from 1 to 64 KiB in a pattern that does not divide by 3.
            run(&mut b, Instant::now(), 3001, |k| 1 + (k * 40_503) % 65_536);
            let v = bytes(&b);
            let mean = v.iter().sum::<u64>() as f64 / 3.0;
            for &x in &v {
                assert!((x as f64 / mean - 1.0).abs() < 0.01, "rate {rate}: {v:?}");
            }
        }
    }

    /// Calls of up to eight bursts (as `super::stream` sends a call: all of it on the
    /// interface picked, burst after burst), from a sender that takes `sec_per_byte` to send
    /// each byte besides waiting for its limiter, in simulated time.
    fn run_calls(b: &mut Balancer, calls: usize, burst: usize, sec_per_byte: f64) {
        let mut now = Instant::now();
        for k in 0..calls {
            let i = b.pick(now).expect("an interface is live");
            let mut left = 1 + (k * 40_503) % (8 * burst);
            while left > 0 {
                let bytes = left.min(burst);
                now = now.max(b.reserve(i, now, bytes))
                    + Duration::from_secs_f64(bytes as f64 * sec_per_byte);
                b.sent(i, 1, bytes);
                left -= bytes;
            }
        }
    }

    /// Whatever the sender's speed, no interface carries more than the largest call plus one
    /// burst more than another: an interface is chosen only while it is within a burst of the
    /// least-carrying one. A sender a little slower than an interface's share (0.3 to 0.34 times
    /// the rate over three) used to end each call a little behind that interface's schedule
    /// and so pick it again over the idle others (module doc): 85 KB apart at 0.32, 713 KB at
    /// 0.33. Paced and unpaced, sender from 0.2 to 3 times the rate.
    #[test]
    fn calls_balance_by_bytes_whatever_the_sender_speed() {
        const RATE: f64 = 3e9;
        const BURST: usize = 8192;
        for rate in [RATE, 0.0] {
            for speed in [0.2, 0.3, 0.32, 0.33, 0.34, 0.4, 0.5, 1.0, 3.0] {
                let mut b = balancer(3, rate, Duration::from_secs(1));
                run_calls(&mut b, 3000, BURST, 1.0 / (speed * RATE));
                let v = bytes(&b);
                let spread = v.iter().max().unwrap() - v.iter().min().unwrap();
                assert!(
                    spread <= 8 * BURST as u64 + BURST as u64,
                    "rate {rate}, sender at {speed} times {RATE}: {v:?}"
                );
            }
        }
    }

    #[test]
    fn a_failed_interface_is_skipped_then_tried_again_after_retry() {
        let retry = Duration::from_secs(2);
        let mut b = balancer(3, 3e6, retry);
        let t0 = Instant::now();
        b.failed(1, t0, &down());
        assert_eq!(b.live(), 2);
        assert_eq!(b.share(0), 1.5e6);
        let picks: Vec<usize> = (0..10)
            .map(|_| {
                let i = b.pick(t0).unwrap();
                b.reserve(i, t0, 1000);
                i
            })
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
        // Its retry time comes: on trial, live, and chosen in its turn (all three limiters are
        // idle by then, so they tie).
        let t1 = t0 + retry;
        let picks: Vec<usize> = (0..3).map(|_| b.pick(t1).unwrap()).collect();
        assert!(picks.contains(&1), "{picks:?}");
        assert_eq!(b.state(1), LinkState::Trial);
        assert_eq!(b.share(1), 1e6);
        // The trial fails: down again, counted as a failure but not as a new down.
        b.failed(1, t1, &down());
        let c = b.counters().nth(1).unwrap().1;
        assert_eq!((c.downs, c.failures, c.live), (1, 2, false));
        // The next trial succeeds: up.
        b.pick(t1 + retry).unwrap();
        assert_eq!(b.state(1), LinkState::Trial);
        b.sent(1, 1, 1000);
        assert_eq!(b.state(1), LinkState::Up);
        assert_eq!(b.live(), 3);
    }

    #[test]
    fn all_down_picks_nothing_until_a_retry_is_due() {
        let retry = Duration::from_millis(500);
        let mut b = balancer(2, 0.0, retry);
        let t0 = Instant::now();
        b.failed(0, t0, &down());
        b.failed(1, t0 + Duration::from_millis(100), &down());
        assert_eq!(b.pick(t0 + Duration::from_millis(499)), None);
        assert_eq!(b.first_live(t0 + Duration::from_millis(499)), None);
        assert_eq!(b.first_live(t0 + retry), Some(0));
        assert_eq!(b.live(), 1, "only the one whose retry is due");
    }

    #[test]
    fn link_errors_are_told_from_other_errors() {
        for e in [
            libc::ENETDOWN,
            libc::ENODEV,
            libc::EHOSTUNREACH,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(is_link_error(&io::Error::from_raw_os_error(e)), "{e}");
        }
        for e in [libc::EINVAL, libc::EPIPE, libc::EMSGSIZE] {
            assert!(!is_link_error(&io::Error::from_raw_os_error(e)), "{e}");
        }
        assert!(!is_link_error(&io::Error::other("no errno")));
        let lost = crate::net::LinkDown {
            packets: 3,
            cause: "completion failed".into(),
        };
        assert!(is_link_error(&lost.into_io()));
    }
}
