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

    /// The distance from representable `g` to the next one away from zero (at zero: the
    /// smallest subnormal).
    fn spacing(self, g: f64) -> f64 {
        match self {
            Format::F32 => {
                // The next float32 up from |g| (finite, non-negative: its bits plus one).
                let a = (g as f32).abs();
                f64::from(f32::from_bits(a.to_bits() + 1)) - f64::from(a)
            }
            Format::F16 => {
                if g.abs() < 2f64.powi(-14) {
                    2f64.powi(-24)
                } else {
                    2f64.powi(g.abs().log2().floor() as i32 - 10)
                }
            }
        }
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
    /// max over entries of (|g − v| − ½·spacing(g)) / Δ, floored at 0: ≤ 1 when every entry
    /// is the correct rounding of a value within Δ of the host's v.
    pub worst: f64,
    /// Entries whose value differs from the host's rounding.
    pub differ: usize,
    /// Of those, the ones below the format's neighbour floor (float32's near-zeros: noise of
    /// the cosine sums on either side, bounded by Δ alone).
    pub near_zero: usize,
    /// Of those at or above the floor, the ones more than one step away.
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
        let excess = ((g - v).abs() - 0.5 * format.spacing(g)).max(0.0) / d;
        a.worst = a.worst.max(excess);
        let r = format.round(v);
        if g != r {
            a.differ += 1;
            let step = format.spacing(g.abs().max(r.abs()));
            if r.abs() < format.neighbour_floor() {
                a.near_zero += 1;
            } else if (g - r).abs() > step {
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
            let step = format.spacing(g);
            let mid = (g + 0.5 * step) / s;
            // Just below the midpoint (the host rounds down to g), within Δ of it: the device
            // may round up.
            let near = mid - 0.5 * delta;
            let a = agreement(&[near], &[g + step], format, delta);
            assert!(
                a.pass() && a.differ == 1 && a.far == 0,
                "{format:?} near: {a:?}"
            );
            // Far below the midpoint: rounding up is wrong.
            let a = agreement(&[mid - 50.0 * delta], &[g + step], format, delta);
            assert!(!a.pass() && a.worst > 1.0, "{format:?} far: {a:?}");
            // Two steps.
            let a = agreement(&[g / s], &[g + 2.0 * step], format, delta);
            assert!(!a.pass() && a.far == 1, "{format:?} two steps: {a:?}");
        }
    }
}
