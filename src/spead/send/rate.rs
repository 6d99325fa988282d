//! The software rate limiter, after spead2's (`doc/dev-send-rate-limit.rst`).
//!
//! Packets go out in bursts of about `burst_size` bytes with no sleep inside a burst. Two
//! schedules bound when the next burst may start:
//! - the *nominal* schedule advances by `bytes / rate` per burst, so the long-term average is
//!   exactly `rate` however late individual bursts were (sleep overshoot does not accumulate);
//! - the *catch-up* bound is the previous burst's actual start plus `bytes / (rate ×
//!   burst_rate_ratio)`, so a sender that fell behind catches up at most `burst_rate_ratio`
//!   times faster, never in one line-rate flood.
//!
//! After an idle period (the producer handed over nothing for longer than one burst takes at
//! the nominal rate) the nominal schedule restarts from now: idle time is not credit.
//! Kernel pacing (`SO_MAX_PACING_RATE`, `SO_TXTIME`) is accepted but not enforced without an
//! fq/etf qdisc on these machines, so this is the only pacing cbf relies on.
//!
//! Pure: time is an argument (`quinn`'s `pacing.rs` habit), so tests are deterministic.
#![deny(unsafe_code)]

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct RateLimiter {
    /// Seconds per byte at the nominal rate; 0 = unlimited.
    sec_per_byte: f64,
    sec_per_byte_burst: f64,
    burst_rate_ratio: f64,
    burst_size: usize,
    /// When the next burst is due on the nominal schedule.
    nominal: Option<Instant>,
    /// Earliest start of the next burst under the catch-up bound.
    catch_up: Option<Instant>,
}

impl RateLimiter {
    /// `rate` in bytes per second (0 = unlimited), `burst_rate_ratio` ≥ 1.
    pub fn new(rate: f64, burst_size: usize, burst_rate_ratio: f64) -> RateLimiter {
        let mut r = RateLimiter {
            sec_per_byte: 0.0,
            sec_per_byte_burst: 0.0,
            burst_rate_ratio: burst_rate_ratio.max(1.0),
            burst_size: burst_size.max(1),
            nominal: None,
            catch_up: None,
        };
        r.set_rate(rate);
        r
    }

    /// Change the rate (bytes per second, 0 = unlimited) from the next reservation on,
    /// keeping the schedule: what was reserved stays where it is, so a change neither grants
    /// credit nor makes a sender wait again for bytes already paced (how an interface's share
    /// moves when another goes down or comes back, `super::balance`).
    pub fn set_rate(&mut self, rate: f64) {
        (self.sec_per_byte, self.sec_per_byte_burst) = if rate > 0.0 {
            (1.0 / rate, 1.0 / (rate * self.burst_rate_ratio))
        } else {
            (0.0, 0.0)
        };
    }

    pub fn is_limited(&self) -> bool {
        self.sec_per_byte > 0.0
    }

    pub fn burst_size(&self) -> usize {
        self.burst_size
    }

    /// Nominal time to send `bytes`.
    pub fn duration_of(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 * self.sec_per_byte)
    }

    /// The producer hands over new data at `now`: forget the schedule if it was idle.
    pub fn wake(&mut self, now: Instant) {
        if let Some(n) = self.nominal {
            if now > n + self.duration_of(self.burst_size) {
                self.nominal = None;
                self.catch_up = None;
            }
        }
    }

    /// Reserve a burst of `bytes` to start no earlier than `now`; returns when it may start.
    /// The caller sleeps until then and sends.
    pub fn reserve(&mut self, now: Instant, bytes: usize) -> Instant {
        if !self.is_limited() {
            return now;
        }
        let nominal = self.nominal.unwrap_or(now);
        let start = self.catch_up.map_or(nominal, |c| c.max(nominal));
        // The burst cannot really start before the call; the catch-up bound runs from there.
        let actual = start.max(now);
        self.nominal = Some(nominal + Duration::from_secs_f64(bytes as f64 * self.sec_per_byte));
        self.catch_up =
            Some(actual + Duration::from_secs_f64(bytes as f64 * self.sec_per_byte_burst));
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_sender_holds_rate_exactly() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e9, 65536, 1.05);
        let mut now = t0;
        for _ in 0..1000 {
            let at = r.reserve(now, 65536);
            // A sender that wakes 30 µs late every time.
            now = at.max(now) + Duration::from_micros(30);
        }
        let elapsed = (now - t0).as_secs_f64();
        let expected = 1000.0 * 65536.0 / 1e9;
        assert!(
            (elapsed - expected).abs() / expected < 0.01,
            "{elapsed} vs {expected}"
        );
    }

    #[test]
    fn catch_up_is_bounded_by_burst_ratio() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e6, 1000, 1.05);
        r.reserve(t0, 1000);
        // The sender stalls for 10 ms (10 bursts behind) but keeps producing.
        let late = t0 + Duration::from_millis(10);
        let a = r.reserve(late, 1000);
        assert_eq!(a, t0 + Duration::from_millis(1));
        let b = r.reserve(late, 1000);
        let gap = (b - late).as_secs_f64();
        assert!((gap - 1e-3 / 1.05).abs() < 1e-9, "{gap}");
    }

    #[test]
    fn idle_is_not_credit() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1e6, 1000, 1.05);
        r.reserve(t0, 1000);
        let later = t0 + Duration::from_secs(1);
        r.wake(later);
        assert_eq!(r.reserve(later, 1000), later);
        assert_eq!(r.reserve(later, 1000), later + Duration::from_millis(1));
    }

    #[test]
    fn unlimited_never_waits() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(0.0, 1000, 1.05);
        assert_eq!(r.reserve(t0, 1 << 30), t0);
        assert_eq!(r.reserve(t0, 1 << 30), t0);
    }
}
