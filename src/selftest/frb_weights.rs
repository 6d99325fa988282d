//! The FRB second stage's device-built resampling matrix (`gpu::frb_weights`, tracking beams)
//! against the host's table (`dsp::frb_resample::w_table`, f64), in both precisions the
//! resampler uses: every entry must be the correct rounding of a value within Δ
//! (`frb_weights::deviation`) of the host's f64 value ([`agreement`]), every fp16 entry and
//! every float32 entry of magnitude ≥ 2⁻²⁰ equal to the host's rounding or its neighbour, and
//! the device's U (f64) within `frb_weights::u_deviation` of `dsp::frb::u_sum` — the premise of
//! Δ's derivation, checked directly. Lists mix positions on the half-integer grid (where U's
//! cosine sums cancel to rounding noise), a hair off it, and anywhere, negative and beyond one
//! period; grids have M ≠ N and odd sides, up to 64 × 64. A second build into the same op
//! (a re-point) is checked as the first.

use std::sync::Arc;

use cudarc::driver::ValidAsZeroBits;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::frb::u_sum;
use crate::dsp::frb_resample::w_table;
use crate::gpu::frb_half::{f16_bits, f16_value, TABLE_SCALE};
use crate::gpu::frb_weights::{deviation, u_deviation, ListWeights, WeightType};
use crate::gpu::{Gpu, GpuError};

/// A table's number format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// float32 of W.
    F32,
    /// fp16 of 2¹⁵·W.
    F16,
}

impl Format {
    /// The factor from W to the stored value.
    fn scale(self) -> f64 {
        match self {
            Format::F32 => 1.0,
            Format::F16 => TABLE_SCALE,
        }
    }

    /// The host's rounding of a stored value `v` (already scaled).
    fn round(self, v: f64) -> f64 {
        match self {
            Format::F32 => f64::from(v as f32),
            Format::F16 => f16_value(f16_bits(v)),
        }
    }

    /// Representable `g`'s place in the format's order: its magnitude's bit pattern, negated
    /// for negative values (±0 both 0), so that adjacent values differ by one.
    fn ordinal(self, g: f64) -> i64 {
        let magnitude = match self {
            Format::F32 => i64::from((g as f32).abs().to_bits()),
            Format::F16 => i64::from(f16_bits(g.abs())),
        };
        if g < 0.0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The value at `ordinal` ([`Format::ordinal`]'s inverse).
    fn value(self, ordinal: i64) -> f64 {
        let magnitude = match self {
            Format::F32 => f64::from(f32::from_bits(ordinal.unsigned_abs() as u32)),
            Format::F16 => f16_value(ordinal.unsigned_abs() as u16),
        };
        magnitude.copysign(ordinal as f64)
    }

    /// Half the gap from representable `g` to its neighbour on `v`'s side (0 where v = g): a
    /// correct rounding of x lies within it of x. At a power of two the gaps on either side
    /// differ by a factor of two, so the side matters.
    fn half_gap(self, g: f64, v: f64) -> f64 {
        let k = self.ordinal(g);
        let toward = match v.partial_cmp(&g) {
            Some(std::cmp::Ordering::Greater) => k + 1,
            Some(std::cmp::Ordering::Less) => k - 1,
            _ => return 0.0,
        };
        0.5 * (self.value(toward) - g).abs()
    }

    /// Stored magnitudes from which the format's spacing exceeds Δ, so that a device entry is
    /// the host's rounding or its neighbour (`gpu::frb_weights` module doc).
    fn neighbour_floor(self) -> f64 {
        match self {
            Format::F32 => 2f64.powi(-20),
            Format::F16 => 0.0,
        }
    }
}

/// How a device table agrees with the host's f64 values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    /// max over entries of (|g − v| − ½·gap) / Δ, floored at 0, the gap from g to its
    /// neighbour on v's side: ≤ 1 when every entry is the correct rounding of a value within
    /// Δ of the host's v.
    pub worst: f64,
    /// Entries whose value differs from the host's rounding.
    pub differ: usize,
    /// Of those, the ones below the format's neighbour floor (float32's near-zeros: noise of
    /// the cosine sums on either side, bounded by Δ alone).
    pub near_zero: usize,
    /// Of those at or above the floor, the ones more than one representable step away.
    pub far: usize,
    pub count: usize,
}

impl Agreement {
    pub fn pass(&self) -> bool {
        self.worst <= 1.0 && self.far == 0
    }
}

/// Device entries `got` (stored values: W, or 2¹⁵·W) against the host's unscaled f64 values
/// `host`, with `delta` the bound on their f64 difference (unscaled).
pub fn agreement(host: &[f64], got: &[f64], format: Format, delta: f64) -> Agreement {
    let d = delta * format.scale();
    let mut a = Agreement {
        worst: 0.0,
        differ: 0,
        near_zero: 0,
        far: 0,
        count: host.len().min(got.len()),
    };
    for (&h, &g) in host.iter().zip(got) {
        let v = h * format.scale();
        let excess = ((g - v).abs() - format.half_gap(g, v)).max(0.0) / d;
        a.worst = a.worst.max(excess);
        let r = format.round(v);
        if g != r {
            a.differ += 1;
            if r.abs() < format.neighbour_floor() {
                a.near_zero += 1;
            } else if (format.ordinal(g) - format.ordinal(r)).abs() > 1 {
                a.far += 1;
            }
        }
    }
    a
}

/// One list on one grid: both precisions, each built twice in one op (the second build a
/// re-point from another list), with the device's U.
fn check(
    gpu: &Arc<Gpu>,
    (m, n): (usize, usize),
    first: &[(f64, f64)],
    list: &[(f64, f64)],
    what: &str,
) -> Result<Vec<Check>, GpuError> {
    let host = w_table(m, n, list, |x| x);
    let delta = deviation(m, n);
    let b = list.len();
    let mut checks = Vec::new();
    for format in [Format::F32, Format::F16] {
        let (got, u): (Vec<f64>, Vec<f64>) = match format {
            Format::F32 => {
                let (w, u) = build::<f32>(gpu, (m, n), first, list)?;
                (w.iter().map(|&x| f64::from(x)).collect(), u)
            }
            Format::F16 => {
                let (w, u) = build::<u16>(gpu, (m, n), first, list)?;
                (w.iter().map(|&bits| f16_value(bits)).collect(), u)
            }
        };
        let a = agreement(&host, &got, format, delta);
        // The premise: U on the device against u_sum, rows p < 2M then q < 2N.
        let mut u_worst = 0.0f64;
        for (r, row) in u.chunks_exact(b).enumerate() {
            for (&g, &(t, t2)) in row.iter().zip(list) {
                let (want, side) = if r < 2 * m {
                    (u_sum(r, m, t), m)
                } else {
                    (u_sum(r - 2 * m, n, t2), n)
                };
                u_worst = u_worst.max((g - want).abs() / u_deviation(side));
            }
        }
        let pass =
            a.pass() && got.len() == host.len() && u.len() == 2 * (m + n) * b && u_worst <= 1.0;
        checks.push(Check {
            name: format!("frb weights {format:?} {m:>2}×{n:<2} {b} beams {what}"),
            measured: a.worst,
            limit: 1.0,
            pass,
            note: format!(
                "re-pointed table vs host's f64: worst excess over the rounding / Δ {:.3} \
                 (Δ = {delta:.2e}); {} of {} entries differ from the host's rounding ({} of \
                 them near-zeros below 2^-20, {} beyond the neighbour); device U vs u_sum / \
                 its bound {u_worst:.3}",
                a.worst, a.differ, a.count, a.near_zero, a.far
            ),
        });
    }
    Ok(checks)
}

/// Build W for `first`, then again for `list` in the same op (a re-point); read back W and U.
fn build<T: WeightType + ValidAsZeroBits>(
    gpu: &Arc<Gpu>,
    (m, n): (usize, usize),
    first: &[(f64, f64)],
    list: &[(f64, f64)],
) -> Result<(Vec<T>, Vec<f64>), GpuError> {
    let mut op = ListWeights::<T>::new(gpu, m, n, list.len())?;
    let st = &gpu.compute;
    let mut w = st.alloc_zeros::<T>(op.len())?;
    op.build(first, &mut w)?;
    op.build(list, &mut w)?;
    Ok((st.clone_dtoh(&w)?, st.clone_dtoh(op.u_table())?))
}

/// A list of `b` beams: a third on the half-integer grid (θ = p/2, θ′ = q/2 for any integers,
/// some beyond one period), a third a hair off it, the rest anywhere in ±2 periods.
fn draw(rng: &mut SmallRng, (m, n): (usize, usize), b: usize) -> Vec<(f64, f64)> {
    (0..b)
        .map(|k| {
            let on = |rng: &mut SmallRng, side: usize| {
                f64::from(rng.random_range(-4 * side as i32..4 * side as i32)) / 2.0
            };
            match k % 3 {
                0 => (on(rng, m), on(rng, n)),
                1 => (
                    on(rng, m) + rng.random_range(-1e-9..1e-9),
                    on(rng, n) + rng.random_range(-1e-9..1e-9),
                ),
                _ => (
                    rng.random_range(-2.0 * m as f64..2.0 * m as f64),
                    rng.random_range(-2.0 * n as f64..2.0 * n as f64),
                ),
            }
        })
        .collect()
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7e1_6b75);
    let mut checks = Vec::new();
    for (grid, b) in [
        ((3, 5), 37),
        ((7, 2), 300),
        ((24, 24), 130),
        ((13, 11), 257),
        ((64, 64), 9),
    ] {
        let first = draw(&mut rng, grid, b);
        let list = draw(&mut rng, grid, b);
        checks.extend(check(
            gpu,
            grid,
            &first,
            &list,
            "at, near and off the grid",
        )?);
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    /// The kernel's arithmetic (`kernels/frb_weights.cu`, the same operations as `u_sum`) with
    /// a cosine `cos` of its own, for a model of the device on the host.
    fn u_model(q: usize, n: usize, theta: f64, cos: &dyn Fn(f64) -> f64) -> f64 {
        let x = 2.0 * theta - q as f64;
        let nf = n as f64;
        let mut s = 0.5 * (1.0 + cos(PI * x));
        for k in 1..n {
            s += cos(PI * x * k as f64 / nf);
        }
        s / nf
    }

    fn model_table(
        (m, n): (usize, usize),
        list: &[(f64, f64)],
        cos: &dyn Fn(f64) -> f64,
    ) -> (Vec<f64>, f64) {
        let (pm, pn, b) = (2 * m, 2 * n, list.len());
        let ua: Vec<f64> = (0..pm)
            .flat_map(|p| list.iter().map(move |&(t, _)| (p, t)))
            .map(|(p, t)| u_model(p, m, t, cos))
            .collect();
        let ub: Vec<f64> = (0..pn)
            .flat_map(|q| list.iter().map(move |&(_, t)| (q, t)))
            .map(|(q, t)| u_model(q, n, t, cos))
            .collect();
        let mut worst_u = 0.0f64;
        for (k, &(t, t2)) in list.iter().enumerate() {
            for p in 0..pm {
                worst_u = worst_u.max((ua[p * b + k] - u_sum(p, m, t)).abs() / u_deviation(m));
            }
            for q in 0..pn {
                worst_u = worst_u.max((ub[q * b + k] - u_sum(q, n, t2)).abs() / u_deviation(n));
            }
        }
        let w = (0..pm * pn)
            .flat_map(|r| (0..b).map(move |k| (r, k)))
            .map(|(r, k)| ua[r / pn * b + k] * ub[r % pn * b + k])
            .collect();
        (w, worst_u)
    }

    /// Δ's derivation on a host model of the device: cosines off the host's by up to 3.5 ulp
    /// (more than CUDA's 2 plus glibc's 1), rounded as the kernel rounds. Both formats agree,
    /// on lists at, near and off the half-integer grid, and some entries do differ (the check
    /// is not vacuous).
    #[test]
    fn a_model_of_the_device_agrees_within_the_derived_bound() {
        let mut rng = SmallRng::seed_from_u64(3);
        let grid = (13, 11);
        let list = draw(&mut rng, grid, 60);
        let host = w_table(grid.0, grid.1, &list, |x| x);
        let noise = std::cell::RefCell::new(SmallRng::seed_from_u64(4));
        let off_cos =
            |x: f64| x.cos() + noise.borrow_mut().random_range(-3.5..3.5) * 2f64.powi(-53);
        let (model, worst_u) = model_table(grid, &list, &off_cos);
        assert!(worst_u <= 1.0 && worst_u > 0.0, "U: {worst_u}");
        let delta = deviation(grid.0, grid.1);
        let mut differ = 0;
        for format in [Format::F32, Format::F16] {
            let got: Vec<f64> = model
                .iter()
                .map(|&v| format.round(v * format.scale()))
                .collect();
            let a = agreement(&host, &got, format, delta);
            assert!(a.pass(), "{format:?}: {a:?}");
            differ += a.differ;
        }
        assert!(differ > 0, "no entry differed: the model tests nothing");
    }

    #[test]
    fn the_host_rounding_itself_agrees_exactly() {
        let host = [0.75, -1.0 / 3.0, 1e-17, -2e-19, 0.0, 1.0];
        for format in [Format::F32, Format::F16] {
            let got: Vec<f64> = host
                .iter()
                .map(|&v| format.round(v * format.scale()))
                .collect();
            let a = agreement(&host, &got, format, deviation(3, 3));
            assert_eq!(
                (a.worst, a.differ, a.near_zero, a.far, a.count),
                (0.0, 0, 0, 0, 6),
                "{format:?}"
            );
        }
    }

    /// The neighbour is accepted only where the host's value lies within Δ of the midpoint
    /// between the two; two steps away never.
    #[test]
    fn a_neighbour_passes_only_near_a_midpoint() {
        let delta = deviation(8, 8);
        for format in [Format::F32, Format::F16] {
            let s = format.scale();
            let g = 0.625 * s;
            let up = |k: i64| format.value(format.ordinal(g) + k);
            let mid = (g + up(1)) / 2.0 / s;
            // Just below the midpoint (the host rounds down to g), within Δ of it: the device
            // may round up.
            let near = mid - 0.5 * delta;
            let a = agreement(&[near], &[up(1)], format, delta);
            assert!(
                a.pass() && a.differ == 1 && a.far == 0,
                "{format:?} near: {a:?}"
            );
            // Far below the midpoint: rounding up is wrong.
            let a = agreement(&[mid - 50.0 * delta], &[up(1)], format, delta);
            assert!(!a.pass() && a.worst > 1.0, "{format:?} far: {a:?}");
            // Two steps.
            let a = agreement(&[g / s], &[up(2)], format, delta);
            assert!(!a.pass() && a.far == 1, "{format:?} two steps: {a:?}");
        }
    }

    /// At a power of two p the gap below is half the gap above: p given where the host's value
    /// rounds to p's lower neighbour, clear of their midpoint, is caught (the review's fp16
    /// case: 32768 where the correct rounding is 32752), and two steps below p are "far"
    /// though within p's upper gap. (The checks by the gap above |g| passed both.)
    #[test]
    fn a_one_step_error_at_a_power_of_two_is_caught() {
        let delta = deviation(8, 8);
        for format in [Format::F32, Format::F16] {
            let s = format.scale();
            let p = 0.5 * s;
            let below = format.value(format.ordinal(p) - 1);
            let below2 = format.value(format.ordinal(p) - 2);
            // The host's v rounds to `below` (between below's lower midpoint and its upper one,
            // well clear of both by more than Δ); the device gives p: one step up, wrong.
            let v = (below + 0.1 * (p - below)) / s;
            assert_eq!(format.round(v * s), below, "{format:?}");
            let a = agreement(&[v], &[p], format, delta);
            assert!(
                !a.pass() && a.worst > 1.0 && a.far == 0,
                "{format:?} p for below: {a:?}"
            );
            // The correct rounding, and the neighbour near the midpoint, still pass.
            assert!(agreement(&[v], &[below], format, delta).pass());
            let mid = (below + p) / 2.0 / s;
            assert!(
                agreement(&[mid - 0.5 * delta], &[p], format, delta).pass(),
                "{format:?} near the midpoint"
            );
            // Two steps below p counted far, though within the gap above p.
            let a = agreement(&[p / s], &[below2], format, delta);
            assert!(!a.pass() && a.far == 1, "{format:?} two steps below: {a:?}");
        }
        // The review's case in fp16 numbers: 2¹⁵·W = 32752.5 rounds to 32752; 32768 is wrong.
        let v = 32752.5 / TABLE_SCALE;
        assert_eq!(Format::F16.round(32752.5), 32752.0);
        let a = agreement(&[v], &[32768.0], Format::F16, deviation(8, 8));
        assert!(!a.pass(), "{a:?}");
    }
}
