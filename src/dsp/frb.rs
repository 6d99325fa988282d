//! The CHORD-style FFT ("FRB") beamformer oracle (seed 004 §2, §4.1, §5).
//!
//! Dishes sit on an M×N grid. The first stage grids the electric field (unoccupied grid points
//! are zero), applies complex weights W_{πmn}, takes the 2-D FFT zero-padded to (2M, 2N) and
//! sums intensities over both polarisations and T_ds time samples (eq. 50, 51):
//!
//! ```text
//! Ẽ_{τπpq} = Σ_{m<M} Σ_{n<N} W_{πmn} E_{τπmn} e^{2πi(mp/2M + nq/2N)}
//! I_{τ̄pq} = Σ_{τ in slow sample τ̄} Σ_π |Ẽ_{τπpq}|²
//! ```
//!
//! The second stage resamples to arbitrary beams (θ, θ′) with the main theorem (eq. 6):
//! J = Σ_{pq} U_p^M(θ) U_q^N(θ′) I_pq, as one matrix product J = I·W for arbitrary beams
//! (eq. 138–140) or as Uᵀ I U′ for a Cartesian product of beam coordinates (eq. 141–144; the
//! sums run over p < 2M and q < 2N, as in eq. 6 — eq. 9 and 10 of the seed write M and N, a
//! typo). Everything here is f64: this is the reference the float16 GPU path is judged by.
#![deny(unsafe_code)]

use std::f64::consts::PI;

use num_complex::Complex64;
use std::sync::Arc;

use rustfft::{Fft, FftPlanner};

/// Why a dish layout is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    #[error("dish {dish} at ({m}, {n}) lies outside the {rows}×{cols} grid")]
    Outside {
        dish: usize,
        m: usize,
        n: usize,
        rows: usize,
        cols: usize,
    },
    #[error("dishes {0} and {1} share a grid position")]
    Shared(usize, usize),
}

/// The dish → grid map (seed 004 §4.1 "gridding").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DishGrid {
    pub rows: usize,
    pub cols: usize,
    /// Grid index m·N + n of each dish.
    cells: Vec<usize>,
}

impl DishGrid {
    pub fn new(
        rows: usize,
        cols: usize,
        positions: &[(usize, usize)],
    ) -> Result<DishGrid, GridError> {
        let mut owner = vec![usize::MAX; rows * cols];
        let mut cells = Vec::with_capacity(positions.len());
        for (dish, &(m, n)) in positions.iter().enumerate() {
            if m >= rows || n >= cols {
                return Err(GridError::Outside {
                    dish,
                    m,
                    n,
                    rows,
                    cols,
                });
            }
            let cell = m * cols + n;
            if owner[cell] != usize::MAX {
                return Err(GridError::Shared(owner[cell], dish));
            }
            owner[cell] = dish;
            cells.push(cell);
        }
        Ok(DishGrid { rows, cols, cells })
    }

    pub fn dishes(&self) -> usize {
        self.cells.len()
    }

    /// Each dish's (m, n), in dish order.
    pub fn positions(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.cells.iter().map(|&c| (c / self.cols, c % self.cols))
    }

    /// Grid index m·N + n of each dish, in dish order.
    pub fn cells(&self) -> &[usize] {
        &self.cells
    }

    /// Per-(dish, pol) weights, `per_dish_pol[d·2 + π]`, as [`intensities`] takes them: on the
    /// grid (pol, m, n), zero at empty cells (seed 004 eq. 51's W_{πmn}).
    pub fn grid_weights(&self, per_dish_pol: &[Complex64]) -> Vec<Complex64> {
        assert_eq!(per_dish_pol.len(), 2 * self.dishes());
        let mn = self.rows * self.cols;
        let mut out = vec![Complex64::default(); 2 * mn];
        for (w, &cell) in per_dish_pol.chunks_exact(2).zip(&self.cells) {
            out[cell] = w[0];
            out[mn + cell] = w[1];
        }
        out
    }

    /// Scatter per-dish values onto the grid (`out`: rows·cols, zeroed first).
    pub fn grid(&self, per_dish: &[Complex64], out: &mut [Complex64]) {
        out.fill(Complex64::new(0.0, 0.0));
        for (&cell, &v) in self.cells.iter().zip(per_dish) {
            out[cell] = v;
        }
    }
}

/// U_q^N(θ) by the cosine sum (eq. 7): defined everywhere.
pub fn u_sum(q: usize, n: usize, theta: f64) -> f64 {
    let x = 2.0 * theta - q as f64;
    let nf = n as f64;
    let mut s = 0.5 * (1.0 + (PI * x).cos()); // s = 0 and s = N, each with weight ½
    for k in 1..n {
        s += (PI * x * k as f64 / nf).cos();
    }
    s / nf
}

/// U_q^N(θ) by the closed form (eq. 8), with its 0/0 points (2θ − q ∈ 2N·ℤ) taken at their
/// limit, 1.
pub fn u_closed(q: usize, n: usize, theta: f64) -> f64 {
    let x = 2.0 * theta - q as f64;
    let period = 2.0 * n as f64;
    let r = x - period * (x / period).round();
    if r.abs() < 1e-12 {
        return 1.0;
    }
    (PI * x).sin() / (PI * x / period).tan() / period
}

/// Sizes of the first stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrbShape {
    pub times: usize,
    pub t_ds: usize,
}

/// The weighted, gridded, zero-padded 2-D transform of one (time, pol) (eq. 51), with its FFTs
/// planned once.
pub struct FieldTransform {
    row_fft: Arc<dyn Fft<f64>>,
    col_fft: Arc<dyn Fft<f64>>,
    cells: Vec<Complex64>,
    column: Vec<Complex64>,
}

impl FieldTransform {
    pub fn new(grid: &DishGrid) -> FieldTransform {
        let mut planner = FftPlanner::<f64>::new();
        // The sign convention of eq. 4 is e^{+2πi…}: an inverse transform (unnormalised).
        FieldTransform {
            row_fft: planner.plan_fft_inverse(2 * grid.cols),
            col_fft: planner.plan_fft_inverse(2 * grid.rows),
            cells: vec![Complex64::default(); grid.rows * grid.cols],
            column: vec![Complex64::default(); 2 * grid.rows],
        }
    }

    /// Ẽ (2M × 2N, row-major) into `out` from one (time, pol)'s per-dish field `e` and that
    /// pol's weights on the grid (m, n).
    pub fn field(
        &mut self,
        grid: &DishGrid,
        e: &[Complex64],
        weights: &[Complex64],
        out: &mut [Complex64],
    ) {
        let (m, n) = (grid.rows, grid.cols);
        let (pm, pn) = (2 * m, 2 * n);
        grid.grid(e, &mut self.cells);
        out.fill(Complex64::default());
        for r in 0..m {
            for c in 0..n {
                out[r * pn + c] = weights[r * n + c] * self.cells[r * n + c];
            }
        }
        for row in out.chunks_exact_mut(pn) {
            self.row_fft.process(row);
        }
        for c in 0..pn {
            for r in 0..pm {
                self.column[r] = out[r * pn + c];
            }
            self.col_fft.process(&mut self.column);
            for r in 0..pm {
                out[r * pn + c] = self.column[r];
            }
        }
    }
}

/// First stage. `e`: per dish electric field, layout (time, pol, dish); `weights`: (pol, m, n)
/// on the grid. Returns I with layout (slow time, p < 2M, q < 2N); trailing fast samples that
/// do not fill a slow sample are not used.
pub fn intensities(
    grid: &DishGrid,
    shape: FrbShape,
    e: &[Complex64],
    weights: &[Complex64],
) -> Vec<f64> {
    let (m, n, d) = (grid.rows, grid.cols, grid.dishes());
    assert_eq!(e.len(), shape.times * 2 * d);
    assert_eq!(weights.len(), 2 * m * n);
    let plane = 4 * m * n;
    let slow = shape.times / shape.t_ds;
    let mut transform = FieldTransform::new(grid);
    let mut out = vec![0.0f64; slow * plane];
    let mut field = vec![Complex64::default(); plane];
    for t in 0..slow * shape.t_ds {
        let slow_t = t / shape.t_ds;
        for pol in 0..2 {
            let tp = t * 2 + pol;
            transform.field(
                grid,
                &e[tp * d..(tp + 1) * d],
                &weights[pol * m * n..(pol + 1) * m * n],
                &mut field,
            );
            for (o, v) in out[slow_t * plane..(slow_t + 1) * plane]
                .iter_mut()
                .zip(&field)
            {
                *o += v.norm_sqr();
            }
        }
    }
    out
}

/// Second stage for arbitrary beams (eq. 138–140): J (slow time, beam) = I · W with
/// W_{(p,q),β} = U_p^M(θ_β) U_q^N(θ′_β).
pub fn resample(i: &[f64], m: usize, n: usize, beams: &[(f64, f64)]) -> Vec<f64> {
    let rho = 4 * m * n;
    let slow = i.len() / rho;
    let w: Vec<f64> = (0..rho)
        .flat_map(|r| {
            let (p, q) = (r / (2 * n), r % (2 * n));
            beams
                .iter()
                .map(move |&(th, th2)| u_sum(p, m, th) * u_sum(q, n, th2))
        })
        .collect();
    let mut j = vec![0.0; slow * beams.len()];
    for t in 0..slow {
        for r in 0..rho {
            let v = i[t * rho + r];
            for b in 0..beams.len() {
                j[t * beams.len() + b] += v * w[r * beams.len() + b];
            }
        }
    }
    j
}

/// Second stage for a Cartesian product of beam coordinates (eq. 141–144):
/// J (slow time, γ, γ′) = Uᵀ I U′.
pub fn resample_factorised(
    i: &[f64],
    m: usize,
    n: usize,
    thetas: &[f64],
    thetas2: &[f64],
) -> Vec<f64> {
    let (pm, pn) = (2 * m, 2 * n);
    let slow = i.len() / (pm * pn);
    let u: Vec<f64> = (0..pm)
        .flat_map(|p| thetas.iter().map(move |&t| u_sum(p, m, t)))
        .collect();
    let u2: Vec<f64> = (0..pn)
        .flat_map(|q| thetas2.iter().map(move |&t| u_sum(q, n, t)))
        .collect();
    let (g, g2) = (thetas.len(), thetas2.len());
    let mut j = vec![0.0; slow * g * g2];
    let mut v = vec![0.0; g * pn];
    for t in 0..slow {
        v.fill(0.0);
        for p in 0..pm {
            for q in 0..pn {
                let x = i[(t * pm + p) * pn + q];
                for a in 0..g {
                    v[a * pn + q] += u[p * g + a] * x;
                }
            }
        }
        for a in 0..g {
            for q in 0..pn {
                for b in 0..g2 {
                    j[(t * g + a) * g2 + b] += v[a * pn + q] * u2[q * g2 + b];
                }
            }
        }
    }
    j
}

/// Direct beamforming (eq. 2, 3 with weights and both pols), the definition the FFT path must
/// reproduce: J (slow time, beam).
pub fn direct(
    grid: &DishGrid,
    shape: FrbShape,
    e: &[Complex64],
    weights: &[Complex64],
    beams: &[(f64, f64)],
) -> Vec<f64> {
    let (m, n, d) = (grid.rows, grid.cols, grid.dishes());
    let slow = shape.times / shape.t_ds;
    let mut cells = vec![Complex64::default(); m * n];
    let mut j = vec![0.0; slow * beams.len()];
    for t in 0..slow * shape.t_ds {
        for pol in 0..2 {
            grid.grid(&e[(t * 2 + pol) * d..(t * 2 + pol + 1) * d], &mut cells);
            for (b, &(th, th2)) in beams.iter().enumerate() {
                let mut acc = Complex64::default();
                for r in 0..m {
                    for c in 0..n {
                        let phase =
                            2.0 * PI * (r as f64 * th / m as f64 + c as f64 * th2 / n as f64);
                        acc += weights[(pol * m + r) * n + c]
                            * cells[r * n + c]
                            * Complex64::from_polar(1.0, phase);
                    }
                }
                j[(t / shape.t_ds) * beams.len() + b] += acc.norm_sqr();
            }
        }
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::random::{mix, unit};
    use proptest::prelude::*;

    fn random_c(n: usize, seed: u64) -> Vec<Complex64> {
        (0..n as u64)
            .map(|i| Complex64::new(unit(mix(seed, 1, i)) - 0.5, unit(mix(seed, 2, i)) - 0.5))
            .collect()
    }

    #[test]
    fn u_is_a_delta_at_half_integers_and_both_forms_agree() {
        for n in [3usize, 8, 12] {
            for q in 0..2 * n {
                for q2 in 0..2 * n {
                    let want = if q == q2 { 1.0 } else { 0.0 };
                    assert!((u_sum(q, n, q2 as f64 / 2.0) - want).abs() < 1e-12);
                    assert!((u_closed(q, n, q2 as f64 / 2.0) - want).abs() < 1e-12);
                }
                for theta in [0.123, 1.7, -3.3, 7.77, 100.01] {
                    assert!(
                        (u_sum(q, n, theta) - u_closed(q, n, theta)).abs() < 1e-10,
                        "n{n} q{q} θ{theta}"
                    );
                }
                // The 0/0 points of eq. 8, away from the half-integer grid's own period.
                let theta = (q as f64 + 2.0 * n as f64) / 2.0;
                assert!((u_closed(q, n, theta) - u_sum(q, n, theta)).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn gridding_refuses_bad_layouts() {
        assert_eq!(
            DishGrid::new(2, 2, &[(0, 0), (2, 0)]),
            Err(GridError::Outside {
                dish: 1,
                m: 2,
                n: 0,
                rows: 2,
                cols: 2
            })
        );
        assert_eq!(
            DishGrid::new(2, 2, &[(1, 1), (0, 0), (1, 1)]),
            Err(GridError::Shared(0, 2))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// The main theorem (eq. 6): FFT beamforming at half-integer locations plus exact
        /// resampling equals direct beamforming at arbitrary (θ, θ′), for random fields,
        /// weights, partly filled grids and T_ds not a power of two.
        #[test]
        fn main_theorem(m in 2usize..6, n in 2usize..7, t_ds in 1usize..4, seed in any::<u64>(), beams in prop::collection::vec((-20.0f64..20.0, -20.0f64..20.0), 1..6)) {
            let positions: Vec<(usize, usize)> = (0..m * n).filter(|c| mix(seed, 7, *c as u64) % 4 != 0).map(|c| (c / n, c % n)).collect();
            let grid = DishGrid::new(m, n, &positions).unwrap();
            let shape = FrbShape { times: 2 * t_ds + 1, t_ds };
            let e = random_c(shape.times * 2 * grid.dishes(), seed);
            let w = random_c(2 * m * n, seed ^ 5);
            let i = intensities(&grid, shape, &e, &w);
            let fast = resample(&i, m, n, &beams);
            let slow = direct(&grid, shape, &e, &w, &beams);
            prop_assert_eq!(fast.len(), shape.times / t_ds * beams.len());
            for (a, b) in fast.iter().zip(&slow) {
                prop_assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} vs {}", a, b);
            }
        }
    }

    /// Per-polarisation dish weights: the FFT path (weights gridded by
    /// [`DishGrid::grid_weights`]) against eq. 2–3 summed straight from each dish's (m, n) and
    /// its own (dish, pol) weight, with the two polarisations' weights unrelated.
    #[test]
    fn per_polarisation_weights_follow_eq_2_and_3() {
        let (m, n) = (3, 5);
        let positions = [(2, 4), (0, 0), (1, 3), (0, 2), (2, 1), (1, 0)];
        let grid = DishGrid::new(m, n, &positions).unwrap();
        let d = positions.len();
        let shape = FrbShape { times: 6, t_ds: 2 };
        let e = random_c(shape.times * 2 * d, 21);
        let w = random_c(2 * d, 22);
        let beams = [(0.37, -1.2), (2.5, 4.75), (-3.1, 0.0)];
        let fast = resample(
            &intensities(&grid, shape, &e, &grid.grid_weights(&w)),
            m,
            n,
            &beams,
        );
        for (k, &(th, th2)) in beams.iter().enumerate() {
            for slow in 0..shape.times / shape.t_ds {
                let mut want = 0.0;
                for t in slow * shape.t_ds..(slow + 1) * shape.t_ds {
                    for pol in 0..2 {
                        let sum: Complex64 = positions
                            .iter()
                            .enumerate()
                            .map(|(dish, &(r, c))| {
                                let phase = 2.0 * PI * (r as f64 * th / 3.0 + c as f64 * th2 / 5.0);
                                w[dish * 2 + pol]
                                    * e[(t * 2 + pol) * d + dish]
                                    * Complex64::from_polar(1.0, phase)
                            })
                            .sum();
                        want += sum.norm_sqr();
                    }
                }
                let got = fast[slow * beams.len() + k];
                assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
            }
        }
    }

    #[test]
    fn factorised_resampling_equals_the_general_one() {
        let (m, n) = (3, 4);
        let positions: Vec<(usize, usize)> = (0..m * n).map(|c| (c / n, c % n)).collect();
        let grid = DishGrid::new(m, n, &positions).unwrap();
        let shape = FrbShape { times: 6, t_ds: 3 };
        let e = random_c(shape.times * 2 * grid.dishes(), 11);
        let w = random_c(2 * m * n, 12);
        let i = intensities(&grid, shape, &e, &w);
        let (thetas, thetas2) = ([0.1, 1.3, 2.9], [-0.4, 0.0, 3.75, 5.5]);
        let beams: Vec<(f64, f64)> = thetas
            .iter()
            .flat_map(|&a| thetas2.iter().map(move |&b| (a, b)))
            .collect();
        let general = resample(&i, m, n, &beams);
        let factorised = resample_factorised(&i, m, n, &thetas, &thetas2);
        for (a, b) in general.iter().zip(&factorised) {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0));
        }
    }
}
