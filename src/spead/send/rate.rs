//! The software rate limiter, after spead2's (`doc/dev-send-rate-limit.rst`,
//! `src/send_writer.cpp`). One limiter paces a whole send stream at its configured rate,
//! whichever interface carries each burst (`super::stream`).
//!
//! Packets go out in bursts of about `burst_size` bytes with no sleep inside a burst. Two
//! schedules bound when the next burst may start:
//! - the *nominal* schedule advances by `bytes / rate` per burst, so the long-term average is
//!   exactly `rate` however late individual bursts were: time a sender lost (overslept,
//!   descheduled, a slow syscall) is made up;
//! - the *catch-up* bound is the previous burst's actual start plus `bytes / (rate ×
//!   burst_rate_ratio)`, so a sender that fell behind catches up at most `burst_rate_ratio`
//!   times faster, never in one line-rate flood.
//!
//! **How much is made up is bounded:** the nominal schedule never lags the present by more
//! than [`MAX_LAG`], so after any stall at most `MAX_LAG × rate` bytes go out ahead of the
//! rate, at the catch-up rate. spead2 bounds it otherwise: its writer thread forgives the
//! whole debt whenever a heap arrives while its queue is empty (`update_send_time_empty`
//! moves the nominal time up to now), so a writer its producer keeps supplied makes up every
//! stall and one that ran dry makes up nothing. Here the sender is the caller's thread and a
//! send is synchronous, so the queue is empty between every two calls, and a caller late for
//! its next call (descheduled) cannot be told from one that had nothing to send. Forgiving
//! at every call, as spead2 would, loses each such stall for good; cbf used to forgive when
//! more than a burst behind, which is how dsim fell 45 ms a second behind its sample clock
//! (`bench/RESULTS.md`, 2026-11-27). Unbounded, a stall of seconds would become tens of
//! seconds at the catch-up rate. So an idle sender that comes back is treated as a late one,
//! and gets the same bounded credit.
//!
//! The nominal schedule keeps the fraction of a nanosecond each burst's duration leaves over
//! (spead2's `precise_time`): rounded away every burst, it would run 15 ppm fast at 3 GB/s in
//! 64 KiB bursts. Kernel pacing (`SO_MAX_PACING_RATE`, `SO_TXTIME`) is accepted but not
//! enforced without an fq/etf qdisc on these machines, so this is the only pacing cbf relies on.
//!
//! Pure: time is an argument (`quinn`'s `pacing.rs` habit), so tests are deterministic.
#![deny(unsafe_code)]

use std::time::{Duration, Instant};

/// How far the nominal schedule may lag the present: lateness up to this is made up, more is
/// forgotten. A few of the scheduler's time slices (CFS gives a thread on a busy core 3 ms or
/// so), so a descheduled sender makes up the whole of it; worked off within
/// `MAX_LAG / (burst_rate_ratio - 1)`, 100 ms at spead2's default ratio of 1.05.
pub const MAX_LAG: Duration = Duration::from_millis(5);

#[derive(Debug, Clone)]
pub struct RateLimiter {
    /// Nanoseconds per byte at the nominal rate; 0 = unlimited.
    ns_per_byte: f64,
    ns_per_byte_burst: f64,
    /// When the next burst is due on the nominal schedule, and the fraction of a nanosecond
    /// past it (in [0, 1)).
    nominal: Option<(Instant, f64)>,
    /// Earliest start of the next burst under the catch-up bound.
    catch_up: Option<Instant>,
}

impl RateLimiter {
    /// `rate` in bytes per second (0 = unlimited), `burst_rate_ratio` ≥ 1.
    pub fn new(rate: f64, burst_rate_ratio: f64) -> RateLimiter {
        let (ns_per_byte, ns_per_byte_burst) = if rate > 0.0 {
            (1e9 / rate, 1e9 / (rate * burst_rate_ratio.max(1.0)))
        } else {
            (0.0, 0.0)
        };
        RateLimiter {
            ns_per_byte,
            ns_per_byte_burst,
            nominal: None,
            catch_up: None,
        }
    }

    pub fn is_limited(&self) -> bool {
        self.ns_per_byte > 0.0
    }

    /// Reserve a burst of `bytes` to start no earlier than `now`; returns when it may start
    /// (in the past when the sender is behind). The caller sleeps until then and sends.
    pub fn reserve(&mut self, now: Instant, bytes: usize) -> Instant {
        if !self.is_limited() {
            return now;
        }
        let floor = now.checked_sub(MAX_LAG).unwrap_or(now);
        let (nominal, fraction) = match self.nominal {
            Some((n, f)) if n >= floor => (n, f),
            Some(_) => (floor, 0.0),
            None => (now, 0.0),
        };
        let start = self.catch_up.map_or(nominal, |c| c.max(nominal));
        let exact = fraction + bytes as f64 * self.ns_per_byte;
        let whole = exact.floor();
        self.nominal = Some((nominal + Duration::from_nanos(whole as u64), exact - whole));
        // The burst cannot really start before the call; the catch-up bound runs from there.
        let actual = start.max(now);
        // Rounded up: never faster than the ratio.
        let burst = (bytes as f64 * self.ns_per_byte_burst).ceil();
        self.catch_up = Some(actual + Duration::from_nanos(burst as u64));
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: Duration = Duration::from_nanos(1);

    /// Burst `j` of a catch-up starts at `want`: no earlier (to the nanosecond the schedule
    /// is rounded to), and no later than the catch-up bound's rounding up, under a
    /// nanosecond a burst.
    fn within(at: Instant, want: Instant, j: usize) {
        assert!(
            at + NS >= want && at <= want + (j as u32 + 1) * NS,
            "burst {j}: {:?} from where it was due",
            at.max(want) - at.min(want)
        );
    }

    /// A sender that asks for each burst `late` after it may start, from `now` on, `n`
    /// times; returns the start of each burst (when the sender really sent it).
    fn send(
        r: &mut RateLimiter,
        now: &mut Instant,
        n: usize,
        bytes: usize,
        late: Duration,
    ) -> Vec<Instant> {
        (0..n)
            .map(|_| {
                let at = r.reserve(*now, bytes).max(*now);
                *now = at + late;
                at
            })
            .collect()
    }

    #[test]
    fn steady_sender_holds_rate_exactly() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e9, 1.05);
        let mut now = t0;
        // A sender that wakes 30 µs late every time.
        send(&mut r, &mut now, 1000, 65536, Duration::from_micros(30));
        let elapsed = (now - t0).as_secs_f64();
        let expected = 1000.0 * 65536.0 / 1e9;
        assert!(
            (elapsed - expected).abs() / expected < 0.01,
            "{elapsed} vs {expected}"
        );
    }

    /// The schedule keeps the fractions of a nanosecond: 65536-byte bursts at 3 GB/s last
    /// 21845.33 ns, and burst k starts at k × 65536 / 3e9 s (computed here in integers) to
    /// the nanosecond after a million of them. Rounded per burst it was 333 µs early.
    #[test]
    fn the_schedule_does_not_round_per_burst() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(3e9, 1.05);
        let mut now = t0;
        let starts = send(&mut r, &mut now, 1_000_001, 65536, Duration::ZERO);
        for k in [1usize, 3, 1000, 999_999, 1_000_000] {
            let ns = k as u128 * 65536 * 1_000_000_000 / 3_000_000_000;
            let due = t0 + Duration::from_nanos(ns as u64);
            assert!(
                starts[k].max(due) - starts[k].min(due) <= NS,
                "burst {k}: {:?} vs {due:?}",
                starts[k]
            );
        }
    }

    /// A sender that stalls for 3 ms (under [`MAX_LAG`]) and then always has data makes up
    /// all of it, never faster than the burst ratio: 1000-byte bursts at 1 MB/s (1 ms each),
    /// ratio 1.05. After the stall burst j goes at `resume + j / 1.05` ms until that meets
    /// the original schedule (`t0 + (10 + j)` ms, 3 ms behind: j = 63), and on it after;
    /// both worked out here, not by the limiter.
    #[test]
    fn a_late_sender_makes_up_its_lateness_at_the_burst_ratio() {
        let (bytes, d) = (1000, Duration::from_millis(1));
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e6, 1.05);
        let mut now = t0;
        send(&mut r, &mut now, 10, bytes, Duration::ZERO);
        let resume = t0 + 10 * d + Duration::from_millis(3);
        now = resume;
        let starts = send(&mut r, &mut now, 200, bytes, Duration::ZERO);
        for (j, &at) in starts.iter().enumerate() {
            let catching_up = resume + (j as u32 * d).div_f64(1.05);
            let on_schedule = t0 + (10 + j as u32) * d;
            within(at, catching_up.max(on_schedule), j);
        }
        assert_eq!(starts[199], t0 + 209 * d, "all 3 ms made up");
    }

    /// A sender that stalls for a second (or was idle that long: the limiter cannot tell)
    /// makes up [`MAX_LAG`] of it and no more, at the burst ratio: burst j after the stall
    /// goes at `resume + j / 1.05` ms until that meets `resume - MAX_LAG + j` ms (j = 105),
    /// and on that after. So the burst it may send is bounded: `MAX_LAG × rate` bytes ahead
    /// of the rate, never faster than `rate × burst_rate_ratio`.
    #[test]
    fn a_long_stall_is_made_up_only_to_max_lag() {
        let (bytes, d) = (1000, Duration::from_millis(1));
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e6, 1.05);
        let mut now = t0;
        send(&mut r, &mut now, 10, bytes, Duration::ZERO);
        let resume = t0 + Duration::from_secs(1);
        now = resume;
        let starts = send(&mut r, &mut now, 300, bytes, Duration::ZERO);
        for (j, &at) in starts.iter().enumerate() {
            let catching_up = resume + (j as u32 * d).div_f64(1.05);
            let on_schedule = resume - MAX_LAG + j as u32 * d;
            within(at, catching_up.max(on_schedule), j);
        }
        let ahead = 300.0 * bytes as f64 - (starts[299] - resume).as_secs_f64() * 1e6;
        assert!(
            (ahead - (MAX_LAG.as_secs_f64() * 1e6 + bytes as f64)).abs() < 1.0,
            "{ahead} bytes ahead"
        );
    }

    #[test]
    fn unlimited_never_waits() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(0.0, 1.05);
        assert_eq!(r.reserve(t0, 1 << 30), t0);
        assert_eq!(r.reserve(t0, 1 << 30), t0);
    }
}
