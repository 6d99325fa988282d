//! The F-engine delay model, exactly as katgpucbf's fgpu applies it
//! (`../shared/reference/fengine_delay_convention.md` §1, §2, §5).
//!
//! A model (d, dr, p, pr) loaded with start t0 gives, for an **output** spectrum timestamp T:
//!
//! ```text
//! D(T) = D0 + dr·(T − t0)           samples (D0 = d·fs)
//! φ(T) = wrap(p + (pr/fs)·(T − t0))  rad, wrapped to [−π, π)
//! c(T) = rint(D(T))                 coarse delay, round half to even
//! δ(T) = D(T) − c(T)                fine delay, in [−½, ½]
//! ```
//!
//! The model is inverted: the spectrum at T reads input samples [T − c, T − c + taps·2N), so
//! a positive delay reads earlier input. A model applies to every spectrum with T ≥ t0; a new
//! model discards queued models starting at or after its own start. Pure: no clock.
//!
//! A request is outside input, so every value is bounded (issue 11) by a physical limit with a
//! wide margin, refused with an error that names it: [`MAX_DELAY_S`], [`MAX_DELAY_RATE`],
//! [`MAX_PHASE`], [`MAX_PHASE_RATE`], and a start at most [`MAX_START_SAMPLES`] after the sync
//! time. Within them, `at` cannot overflow for any timestamp: the model is evaluated with
//! saturating integer arithmetic, and |D(T)| stays far below 2^63 samples.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::f64::consts::PI;

/// Largest |delay| in seconds: Earth-sized baselines give under 0.05 s, cables microseconds.
pub const MAX_DELAY_S: f64 = 1.0;
/// Largest |delay rate| in s/s: Earth rotation gives under 3e-6 s/s for any baseline on Earth.
pub const MAX_DELAY_RATE: f64 = 1e-3;
/// Largest |phase| in rad (it is wrapped; beyond this its f64 value loses meaning).
pub const MAX_PHASE: f64 = 1e6;
/// Largest |phase rate| in rad/s: the fringe rate 2π·f·dr at 10 GHz and 1e-3 s/s is 6e7.
pub const MAX_PHASE_RATE: f64 = 1e8;
/// Latest start, in ADC samples after the sync time (2^62: decades at any ADC rate), so that
/// timestamps and their differences stay within i64.
pub const MAX_START_SAMPLES: f64 = 4_611_686_018_427_387_904.0;

/// Most models queued per input and not yet in force (`?delays` loads a few a minute).
pub const MAX_QUEUED_MODELS: usize = 64;

/// One linear model, in per-sample units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearDelayModel {
    /// Start, in ADC samples since the sync time.
    pub t0: i64,
    /// Delay at t0, in samples.
    pub delay: f64,
    /// Delay rate, samples per sample (unitless).
    pub delay_rate: f64,
    /// Phase at t0, in rad, wrapped.
    pub phase: f64,
    /// Phase rate, in rad per sample.
    pub phase_rate: f64,
    /// The request's own numbers (s, s/s, rad, rad/s), for the delay sensor.
    pub request: (f64, f64, f64, f64),
}

/// Why a `?delays` model is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DelayError {
    #[error("Start time cannot be prior to the sync time")]
    BeforeSync,
    #[error("start time {0} is too far after the sync time")]
    TooLate(f64),
    #[error("delay rate {0} must be less than {MAX_DELAY_RATE} in magnitude")]
    Rate(f64),
    #[error("delay {0} s must be at most {MAX_DELAY_S} s in magnitude")]
    Delay(f64),
    #[error("phase {0} rad must be at most {MAX_PHASE} rad in magnitude")]
    Phase(f64),
    #[error("phase rate {0} rad/s must be at most {MAX_PHASE_RATE} rad/s in magnitude")]
    PhaseRate(f64),
    #[error("delay model values must be finite")]
    NotFinite,
}

/// Wrap to [−π, π).
pub fn wrap_angle(a: f64) -> f64 {
    (a + PI).rem_euclid(2.0 * PI) - PI
}

impl LinearDelayModel {
    /// The all-zero model in force before any `?delays`.
    pub const ZERO: LinearDelayModel = LinearDelayModel {
        t0: 0,
        delay: 0.0,
        delay_rate: 0.0,
        phase: 0.0,
        phase_rate: 0.0,
        request: (0.0, 0.0, 0.0, 0.0),
    };

    /// From a `?delays` request: `start` UNIX seconds, d s, dr s/s, p rad, pr rad/s.
    pub fn from_request(
        start: f64,
        sync_time: f64,
        fs: f64,
        d: f64,
        dr: f64,
        p: f64,
        pr: f64,
    ) -> Result<Self, DelayError> {
        if ![start, d, dr, p, pr].iter().all(|v| v.is_finite()) {
            return Err(DelayError::NotFinite);
        }
        let t0 = ((start - sync_time) * fs).round();
        if t0 < 0.0 {
            return Err(DelayError::BeforeSync);
        }
        if t0 > MAX_START_SAMPLES {
            return Err(DelayError::TooLate(start));
        }
        if dr.abs() >= MAX_DELAY_RATE {
            return Err(DelayError::Rate(dr));
        }
        if d.abs() > MAX_DELAY_S {
            return Err(DelayError::Delay(d));
        }
        if p.abs() > MAX_PHASE {
            return Err(DelayError::Phase(p));
        }
        if pr.abs() > MAX_PHASE_RATE {
            return Err(DelayError::PhaseRate(pr));
        }
        Ok(LinearDelayModel {
            t0: t0 as i64,
            delay: d * fs,
            delay_rate: dr,
            phase: wrap_angle(p),
            phase_rate: pr / fs,
            request: (d, dr, p, pr),
        })
    }

    /// (coarse delay c, fine delay δ, phase φ) for the output spectrum at timestamp `t`.
    pub fn at(&self, t: i64) -> (i64, f64, f64) {
        let dt = t.saturating_sub(self.t0) as f64;
        let d = self.delay + self.delay_rate * dt;
        let c = d.round_ties_even();
        (
            c as i64,
            d - c,
            wrap_angle(self.phase + self.phase_rate * dt),
        )
    }

    /// [`LinearDelayModel::at`] with the coarse delay a multiple of `align` (a narrowband
    /// output's subsampling factor: its PFB reads every `align`-th sample; seed 000 §Delays,
    /// convention §3, katgpucbf's `AlignedDelayModel`). The input start t − c is rounded to a
    /// multiple of `align`, a tie going the way that leaves the smaller residual (up when it
    /// is zero); the fine delay takes up what the rounding moved, so |δ| ≤ (align + 1)/2.
    /// With `align` 1 this is `at`.
    pub fn at_aligned(&self, t: i64, align: usize) -> (i64, f64, f64) {
        let (c, fine, phase) = self.at(t);
        if align <= 1 {
            return (c, fine, phase);
        }
        // i128: the doubled start of a timestamp near i64::MAX stays exact.
        let a = align as i128;
        let orig = i128::from(t) - i128::from(c);
        let aligned = if a % 2 == 0 {
            let sign = if fine > 0.0 {
                1
            } else if fine < 0.0 {
                -1
            } else {
                0
            };
            (2 * orig + a - sign).div_euclid(2 * a) * a
        } else {
            (orig + a / 2).div_euclid(a) * a
        };
        let moved = aligned - orig;
        (
            (i128::from(c) - moved).clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            fine + moved as f64,
            phase,
        )
    }
}

/// The models of one input: the current one and those queued for the future.
#[derive(Debug, Clone)]
pub struct DelayModels {
    current: LinearDelayModel,
    queued: VecDeque<LinearDelayModel>,
}

impl Default for DelayModels {
    fn default() -> Self {
        DelayModels {
            current: LinearDelayModel::ZERO,
            queued: VecDeque::new(),
        }
    }
}

impl DelayModels {
    /// Queue a model; queued models starting at or after its start are discarded. At most
    /// [`MAX_QUEUED_MODELS`] stay queued: past that the earliest is dropped (the katcp side
    /// refuses requests before this can happen).
    pub fn add(&mut self, model: LinearDelayModel) {
        self.queued.retain(|m| m.t0 < model.t0);
        if self.queued.len() >= MAX_QUEUED_MODELS {
            self.queued.pop_front();
        }
        self.queued.push_back(model);
    }

    /// The model for the spectrum at `t`, advancing past models that have started. Spectrum
    /// timestamps must not decrease between calls.
    pub fn model_at(&mut self, t: i64) -> &LinearDelayModel {
        while self.queued.front().is_some_and(|m| m.t0 <= t) {
            if let Some(m) = self.queued.pop_front() {
                self.current = m;
            }
        }
        &self.current
    }

    /// The model that [`DelayModels::model_at`] would give for `t`, without advancing.
    pub fn peek_at(&self, t: i64) -> &LinearDelayModel {
        self.queued
            .iter()
            .rev()
            .find(|m| m.t0 <= t)
            .unwrap_or(&self.current)
    }

    /// The start of the first queued model after `t`, if any: until then the model at `t`
    /// stays in force.
    pub fn next_start_after(&self, t: i64) -> Option<i64> {
        self.queued.iter().map(|m| m.t0).find(|&t0| t0 > t)
    }

    /// The model now in force (for the delay sensor).
    pub fn current(&self) -> &LinearDelayModel {
        &self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_fine_split_rounds_half_to_even() {
        let m = |d: f64| LinearDelayModel {
            delay: d,
            ..LinearDelayModel::ZERO
        };
        assert_eq!(m(2.5).at(0), (2, 0.5, 0.0));
        assert_eq!(m(3.5).at(0), (4, -0.5, 0.0));
        assert_eq!(m(-2.5).at(0).0, -2);
        let (c, f, _) = m(7.3).at(0);
        assert_eq!(c, 7);
        assert!((f - 0.3).abs() < 1e-12);
    }

    /// The aligned coarse delay is a multiple of the alignment, the total delay is kept, and
    /// the residual is the smallest possible (ties: katgpucbf's rule).
    #[test]
    fn aligned_coarse_delay_keeps_the_total_delay() {
        let m = |d: f64| LinearDelayModel {
            delay: d,
            ..LinearDelayModel::ZERO
        };
        // A spectrum timestamp is a multiple of the alignment (of 120 here: every align below).
        let t = 120 << 20;
        for align in [1usize, 2, 3, 4, 8, 10] {
            for i in -400..400 {
                let d = i as f64 * 0.37;
                let (c, f, _) = m(d).at_aligned(t, align);
                assert_eq!(c.rem_euclid(align as i64), 0, "align {align}, delay {d}");
                assert!((c as f64 + f - d).abs() < 1e-9, "align {align}, delay {d}");
                assert!(
                    f.abs() <= (align as f64 + 1.0) / 2.0 + 1e-9,
                    "{align} {d}: {f}"
                );
            }
        }
        // Ties, with alignment 4: rint(D) = ±2 puts the start halfway between two multiples
        // of 4. D = 2.5 (δ = +0.5) takes c = 4 (δ' = −1.5, not 2.5); D = 1.6 (δ = −0.4) takes
        // c = 0; D = 2 (δ = 0) rounds the start up, c = 0; so does D = −2, c = −4.
        assert_eq!(m(2.5).at_aligned(t, 4).0, 4);
        assert_eq!(m(1.6).at_aligned(t, 4).0, 0);
        assert_eq!(m(2.0).at_aligned(t, 4).0, 0);
        assert_eq!(m(-2.0).at_aligned(t, 4).0, -4);
        assert_eq!(m(-2.5).at_aligned(t, 4).0, -4);
    }

    #[test]
    fn request_units_and_refusals() {
        let fs = 1712e6;
        let m = LinearDelayModel::from_request(1000.5, 1000.0, fs, 1e-6, 1e-9, 4.0, 2.0).unwrap();
        assert_eq!(m.t0, (0.5 * fs) as i64);
        assert!((m.delay - 1712.0).abs() < 1e-9);
        assert!(
            (m.phase - (4.0 - 2.0 * PI)).abs() < 1e-12,
            "wrapped on entry"
        );
        assert!((m.phase_rate - 2.0 / fs).abs() < 1e-20);
        // Rates are referenced to t0.
        let (c, f, p) = m.at(m.t0 + 1_000_000);
        assert!(((c as f64 + f) - (1712.0 + 1e-3)).abs() < 1e-9);
        assert!((p - wrap_angle(4.0 + 2.0 / fs * 1e6)).abs() < 1e-12);
        assert_eq!(
            LinearDelayModel::from_request(999.0, 1000.0, fs, 0.0, 0.0, 0.0, 0.0),
            Err(DelayError::BeforeSync)
        );
        assert_eq!(
            LinearDelayModel::from_request(1001.0, 1000.0, fs, 0.0, 1.0, 0.0, 0.0),
            Err(DelayError::Rate(1.0))
        );
        assert_eq!(
            LinearDelayModel::from_request(1001.0, 1000.0, fs, f64::NAN, 0.0, 0.0, 0.0),
            Err(DelayError::NotFinite)
        );
    }

    #[test]
    fn models_switch_per_spectrum_and_later_loads_replace_queued_ones() {
        let m = |t0: i64, d: f64| LinearDelayModel {
            t0,
            delay: d,
            ..LinearDelayModel::ZERO
        };
        let mut q = DelayModels::default();
        q.add(m(1000, 1.0));
        q.add(m(3000, 3.0));
        q.add(m(2000, 2.0)); // discards the model at 3000
        let step = 512;
        let seen: Vec<f64> = (0..8).map(|s| q.model_at(s * step).delay).collect();
        // Spectra at 0, 512 keep zero; 1024 ≥ 1000 takes model 1; 2048 ≥ 2000 takes model 2.
        assert_eq!(seen, [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
        assert_eq!(q.current().delay, 2.0);
    }

    #[test]
    fn wrap_is_half_open() {
        assert!((wrap_angle(PI) + PI).abs() < 1e-15);
        assert!((wrap_angle(-PI) + PI).abs() < 1e-15);
        assert!((wrap_angle(3.0 * PI / 2.0) + PI / 2.0).abs() < 1e-12);
    }

    #[test]
    fn values_beyond_physical_bounds_are_refused_by_name() {
        let fs = 1712e6;
        let r = |start: f64, d: f64, dr: f64, p: f64, pr: f64| {
            LinearDelayModel::from_request(start, 1000.0, fs, d, dr, p, pr)
        };
        // MeerKAT's qualification extremes (80 µs, 2.56e-9 s/s, 49.22 rad/s) are accepted.
        assert!(r(1001.0, 79.53e-6, 2.56e-9, 3.0, 49.22).is_ok());
        assert_eq!(r(1001.0, 1e30, 0.0, 0.0, 0.0), Err(DelayError::Delay(1e30)));
        assert_eq!(r(1001.0, 0.0, 0.5, 0.0, 0.0), Err(DelayError::Rate(0.5)));
        assert_eq!(
            r(1001.0, 0.0, 0.0, -1e300, 0.0),
            Err(DelayError::Phase(-1e300))
        );
        assert_eq!(
            r(1001.0, 0.0, 0.0, 0.0, 1e12),
            Err(DelayError::PhaseRate(1e12))
        );
        assert_eq!(
            r(1e300, 0.0, 0.0, 0.0, 0.0),
            Err(DelayError::TooLate(1e300))
        );
        assert!(DelayError::Delay(1e30)
            .to_string()
            .contains("1000000000000000000000000000000"));
    }

    #[test]
    fn evaluation_never_overflows() {
        let fs = 1712e6;
        let m = LinearDelayModel::from_request(
            1000.0 + MAX_START_SAMPLES / fs,
            1000.0,
            fs,
            -1.0,
            -9.99e-4,
            1e6,
            -1e8,
        )
        .unwrap();
        for t in [i64::MIN, -1, 0, 1, m.t0, i64::MAX] {
            let (c, f, p) = m.at(t);
            assert!(f.abs() <= 0.5 && (-PI..PI).contains(&p), "{t}: {c} {f} {p}");
        }
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut q = DelayModels::default();
        for t0 in 0..10 * MAX_QUEUED_MODELS as i64 {
            q.add(LinearDelayModel {
                t0: t0 + 1,
                ..LinearDelayModel::ZERO
            });
        }
        assert_eq!(q.queued.len(), MAX_QUEUED_MODELS);
    }
}
