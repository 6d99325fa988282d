//! Multi-NIC balancing (seed 000 §Network transmit: "a stream is selected for each heap to
//! balance the load"): which of a send stream's interfaces takes the next heaps, and what
//! happens when one of them fails.
//!
//! - **One common rate, not one per interface.** The stream's one [`super::rate`] limiter
//!   paces every burst at the configured total rate, whichever interface carries it, so the
//!   total stays the configured rate however many interfaces are live and however the heaps
//!   fall; nothing here knows the rate. Each interface used to have a limiter of its own at
//!   its share of the rate (the rate over the live ones), which is right for senders that run
//!   in parallel (katgpucbf's one spead2 stream per interface) but not for one thread that
//!   sends a call's bursts one after another on the interface chosen: those went out at the
//!   share, so a stream over three interfaces sent calls of several bursts at little more
//!   than a third of its rate (a review's simulation: 1.9 of 4 GB/s with 16 KiB bursts;
//!   `tests/send_rate.rs`: 21 of 50 MB/s).
//! - **Least loaded, in bytes.** Each heap goes to the live interface with the fewest bytes:
//!   those it carried since the live set last changed, plus those already handed to it and
//!   not yet sent (`queued`: the stream deals a call's heaps out one by one before it sends
//!   any, so a call of many heaps spreads over the interfaces). Ties go to the next after the
//!   one chosen last (a first-index tie-break would load the first interface most). A heap
//!   goes whole to the interface chosen, so no interface carries more than the largest heap
//!   more than another, whatever the timing. (Choosing by the limiters' schedules, as before,
//!   did not balance: a limiter restarted its schedule after idle time, so one that had just
//!   sent looked less loaded than idle ones that had carried less, and took call after call:
//!   ±2.4 % of the mean over 300 heaps.)
//! - **Failure.** A send that fails with a link error ([`is_link_error`]: the interface went
//!   down, lost its address or its route) marks the interface down: counted, logged once, and
//!   the others take its heaps. After `retry` it is put on trial: it is live again, real heaps go out on it,
//!   and a success brings it back up (logged); a failure sends it down for another `retry`
//!   without a new log line or count. What the caller does with the failed burst is its
//!   business (`super::stream` re-sends it on another interface).
//!
//! Pure: time is an argument, and the caller sends and reports each outcome, so every
//! decision here can be tested without a clock or a network.
#![deny(unsafe_code)]

use std::io;
use std::time::{Duration, Instant};

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
    state: LinkState,
    counters: InterfaceCounters,
    /// Bytes carried since the live set last changed (the balance).
    since_change: u64,
}

/// The interfaces of one send stream: choice and failures.
#[derive(Debug, Clone)]
pub struct Balancer {
    links: Vec<Link>,
    retry: Duration,
    /// The interface [`Balancer::pick`] chose last.
    last: usize,
}

impl Balancer {
    /// `names` (one per interface, at least one) label the log lines; a failed interface is
    /// tried again after `retry`.
    pub fn new(names: Vec<String>, retry: Duration) -> Balancer {
        let links = names
            .into_iter()
            .map(|name| Link {
                name,
                state: LinkState::Up,
                counters: InterfaceCounters {
                    live: true,
                    ..Default::default()
                },
                since_change: 0,
            })
            .collect();
        Balancer {
            links,
            retry,
            last: 0,
        }
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

    /// Every interface's name and counters.
    pub fn counters(&self) -> impl Iterator<Item = (&str, InterfaceCounters)> {
        self.links.iter().map(|l| (l.name.as_str(), l.counters))
    }

    /// The live set changed: restart the byte counts the choice compares.
    fn restart_balance(&mut self) {
        for l in &mut self.links {
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
            self.restart_balance();
        }
    }

    /// The least-loaded live interface for a heap handed over at `now`, counting `queued[i]`
    /// bytes handed to interface `i` and not yet sent (module doc), or `None` when every
    /// interface is down and none is due for a retry.
    pub fn pick(&mut self, now: Instant, queued: &[u64]) -> Option<usize> {
        self.promote(now);
        let n = self.links.len();
        let chosen = (1..=n)
            .map(|k| (self.last + k) % n)
            .filter(|&i| is_live(self.links[i].state))
            .min_by_key(|&i| {
                let q = queued.get(i).copied().unwrap_or(0);
                self.links[i].since_change.saturating_add(q)
            })?;
        self.last = chosen;
        Some(chosen)
    }

    /// Whether interface `i` may be sent on now: up or on trial.
    pub fn is_live(&self, i: usize) -> bool {
        is_live(self.links[i].state)
    }

    /// The first live interface (descriptors and stop heaps go there, seed 000 §Network
    /// transmit), or `None` when none is.
    pub fn first_live(&mut self, now: Instant) -> Option<usize> {
        self.promote(now);
        self.links.iter().position(|l| is_live(l.state))
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
    /// `now + retry`.
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
                    "send interface down: the others carry its heaps");
            }
        }
        self.restart_balance();
    }
}

fn is_live(s: LinkState) -> bool {
    !matches!(s, LinkState::Down { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balancer(n: usize, retry: Duration) -> Balancer {
        let names = (0..n).map(|i| format!("nic{i}")).collect();
        Balancer::new(names, retry)
    }

    fn down() -> io::Error {
        io::Error::from_raw_os_error(libc::ENETDOWN)
    }

    fn bytes(b: &Balancer) -> Vec<u64> {
        b.counters().map(|(_, c)| c.bytes).collect()
    }

    /// Heaps of 1 byte to eight bursts of 8 KiB, each sent whole on the interface picked (as
    /// `super::stream` sends a heap), in a pattern that does not divide by the interface
    /// count. No interface carries more than the largest heap more than another: the
    /// least-carrying one always takes the next heap.
    #[test]
    fn calls_balance_by_bytes() {
        const LARGEST: usize = 8 * 8192;
        for n in 1..=4 {
            let mut b = balancer(n, Duration::from_secs(1));
            let now = Instant::now();
            for k in 0..3001 {
                let i = b.pick(now, &[]).expect("an interface is live");
                let mut left = 1 + (k * 40_503) % LARGEST;
                while left > 0 {
                    let burst = left.min(8192);
                    b.sent(i, 1, burst);
                    left -= burst;
                }
                let v = bytes(&b);
                let spread = v.iter().max().unwrap() - v.iter().min().unwrap();
                assert!(spread <= LARGEST as u64, "{n} interfaces, call {k}: {v:?}");
            }
        }
    }

    /// Interfaces that tie take turns (the byte counts restart when the live set changes, so
    /// ties are common): equal calls go round in order, not to the first.
    #[test]
    fn ties_take_turns() {
        let mut b = balancer(3, Duration::from_secs(1));
        let now = Instant::now();
        let picks: Vec<usize> = (0..6)
            .map(|_| {
                let i = b.pick(now, &[]).unwrap();
                b.sent(i, 1, 1000);
                i
            })
            .collect();
        assert_eq!(picks, [1, 2, 0, 1, 2, 0]);
    }

    /// Bytes queued on an interface count as carried: a call's equal heaps, dealt one by one
    /// with what each took added to its queue, go to the interfaces that carried less before
    /// until they catch up, then in turn. Worked by hand: 0 carried 3000 B, so the first six
    /// heaps of 1000 B alternate between 1 and 2 (ties in turn after the last chosen), and
    /// the seventh, with all three at 3000, goes to 0, the next after 2.
    #[test]
    fn queued_bytes_count_as_carried() {
        let mut b = balancer(3, Duration::from_secs(1));
        let now = Instant::now();
        b.sent(0, 1, 3000);
        let mut queued = [0u64; 3];
        let picks: Vec<usize> = (0..7)
            .map(|_| {
                let i = b.pick(now, &queued).unwrap();
                queued[i] += 1000;
                i
            })
            .collect();
        assert_eq!(picks, [1, 2, 1, 2, 1, 2, 0]);
    }

    #[test]
    fn a_failed_interface_is_skipped_then_tried_again_after_retry() {
        let retry = Duration::from_secs(2);
        let mut b = balancer(3, retry);
        let t0 = Instant::now();
        b.failed(1, t0, &down());
        assert_eq!(b.live(), 2);
        let picks: Vec<usize> = (0..10)
            .map(|_| {
                let i = b.pick(t0, &[]).unwrap();
                b.sent(i, 1, 1000);
                i
            })
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
        // Its retry time comes: on trial, live, and chosen in its turn (the byte counts
        // restart as the live set changes, so all three tie).
        let t1 = t0 + retry;
        let picks: Vec<usize> = (0..3).map(|_| b.pick(t1, &[]).unwrap()).collect();
        assert!(picks.contains(&1), "{picks:?}");
        assert_eq!(b.state(1), LinkState::Trial);
        // The trial fails: down again, counted as a failure but not as a new down.
        b.failed(1, t1, &down());
        let c = b.counters().nth(1).unwrap().1;
        assert_eq!((c.downs, c.failures, c.live), (1, 2, false));
        // The next trial succeeds: up.
        b.pick(t1 + retry, &[]).unwrap();
        assert_eq!(b.state(1), LinkState::Trial);
        b.sent(1, 1, 1000);
        assert_eq!(b.state(1), LinkState::Up);
        assert_eq!(b.live(), 3);
    }

    #[test]
    fn all_down_picks_nothing_until_a_retry_is_due() {
        let retry = Duration::from_millis(500);
        let mut b = balancer(2, retry);
        let t0 = Instant::now();
        b.failed(0, t0, &down());
        b.failed(1, t0 + Duration::from_millis(100), &down());
        assert_eq!(b.pick(t0 + Duration::from_millis(499), &[]), None);
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
