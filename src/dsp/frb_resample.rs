//! The FRB beamformer's second stage on the CPU (seed 004 §5): the beam sets an output forms,
//! the resampling matrices of the main theorem (eq. 6) in float32, and their application to a
//! block of intensities. The GPU's second stage (`gpu::frb_resample`) uploads a product's U
//! and U′ from here ([`u_table`]) and builds a list's W on the device (`gpu::frb_weights`), to
//! within one rounding of [`w_table`]'s; `dsp::frb::resample{,_factorised}` (f64) is the
//! oracle. A list is re-pointed (tracking beams, issue 17) by building its [`Resample`] anew off
//! the data path and swapping it in (`FrbBeamformer::repoint`).
#![deny(unsafe_code)]

use super::frb::u_sum;

/// The beam centres of an FRB output, in the normalised sky coordinates of seed 004 eq. 1
/// (θ = M n̂·σ/λ, θ′ = N n̂·σ′/λ; J is periodic in θ with period M and in θ′ with period N).
#[derive(Debug, Clone, PartialEq)]
pub enum FrbBeams {
    /// The Cartesian product {θ_i} × {θ′_j} (factorisable, §5.3); beam β = i·Q + j.
    Product { thetas: Vec<f64>, thetas2: Vec<f64> },
    /// Arbitrary (θ, θ′) pairs (non-factorisable, §5.2), in beam order.
    List(Vec<(f64, f64)>),
}

/// Why a beam set cannot be re-pointed (tracking beams, issue 17).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepointError {
    #[error("a grid of beams (θ × θ′) cannot be re-pointed, only a list")]
    Grid,
    #[error("{given} beam positions for an output of {beams} beams")]
    Count { given: usize, beams: usize },
    #[error("a table of {given} grid cells for a beamformer of {cells}")]
    Cells { given: usize, cells: usize },
}

/// "P×Q beam grid" or "B listed beams", for reports.
impl std::fmt::Display for FrbBeams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrbBeams::List(b) => write!(f, "{} listed beams", b.len()),
            FrbBeams::Product { thetas, thetas2 } => {
                write!(f, "{}×{} beam grid", thetas.len(), thetas2.len())
            }
        }
    }
}

impl FrbBeams {
    /// P × Q beams evenly spaced over one period of the field of an M×N grid:
    /// θ_i = M·(i − ⌊P/2⌋)/P for i < P, θ′_j = N·(j − ⌊Q/2⌋)/Q for j < Q. The set covers
    /// [−M/2, M/2) × [−N/2, N/2) with zenith (0, 0) among the beams; P = 2M, Q = 2N gives the
    /// half-integer grid of stage 1 itself.
    pub fn even(rows: usize, cols: usize, p: usize, q: usize) -> FrbBeams {
        let axis = |side: usize, k: usize| -> Vec<f64> {
            (0..k)
                .map(|i| side as f64 * (i as f64 - (k / 2) as f64) / k as f64)
                .collect()
        };
        FrbBeams::Product {
            thetas: axis(rows, p),
            thetas2: axis(cols, q),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FrbBeams::Product { thetas, thetas2 } => thetas.len() * thetas2.len(),
            FrbBeams::List(l) => l.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (θ, θ′) of every beam, in beam order.
    pub fn positions(&self) -> Vec<(f64, f64)> {
        match self {
            FrbBeams::Product { thetas, thetas2 } => thetas
                .iter()
                .flat_map(|&a| thetas2.iter().map(move |&b| (a, b)))
                .collect(),
            FrbBeams::List(l) => l.clone(),
        }
    }
}

/// Stage 2's matrices (seed 004 §5) in f32, for the CPU backend: U evaluated in f64 by
/// `dsp::frb::u_sum` and rounded once. (The GPU uploads [`u_table`] and builds W itself.)
#[derive(Debug)]
pub enum Resample {
    /// U (2M × P) and U′ (2N × Q), row-major.
    Product {
        u: Vec<f32>,
        u2: Vec<f32>,
        p: usize,
        q: usize,
    },
    /// W ((2M·2N) × B), row-major.
    General { w: Vec<f32>, beams: usize },
}

impl Resample {
    /// The tables for `beams` of an `m` × `n` dish grid, each entry computed in f64 (W as the
    /// f64 product U·U′) and rounded to f32 once.
    pub fn new(m: usize, n: usize, beams: &FrbBeams) -> Resample {
        let round = |x: f64| x as f32;
        match beams {
            FrbBeams::Product { thetas, thetas2 } => Resample::Product {
                u: u_table(m, thetas, round),
                u2: u_table(n, thetas2, round),
                p: thetas.len(),
                q: thetas2.len(),
            },
            FrbBeams::List(list) => Resample::General {
                w: w_table(m, n, list, round),
                beams: list.len(),
            },
        }
    }
}

/// U (2·`side` × P, row-major) of one axis of a product: U_p^side(θ_a) in f64 by eq. 7, each
/// passed through `round` once.
pub fn u_table<T>(side: usize, thetas: &[f64], round: impl Fn(f64) -> T) -> Vec<T> {
    (0..2 * side)
        .flat_map(|p| thetas.iter().map(move |&t| (p, t)))
        .map(|(p, t)| round(u_sum(p, side, t)))
        .collect()
}

/// W ((2M·2N) × B, row-major) of a beam list (eq. 138): U_p^M(θ_β) and U_q^N(θ′_β) in f64 once
/// per (p, β) and (q, β), W their f64 products — 2(M + N)·B cosine sums instead of 8MN·B —
/// each passed through `round` once. `gpu::frb_weights` builds the same table on the device.
pub fn w_table<T>(m: usize, n: usize, list: &[(f64, f64)], round: impl Fn(f64) -> T) -> Vec<T> {
    let (pm, pn, nb) = (2 * m, 2 * n, list.len());
    let ua: Vec<f64> = (0..pm)
        .flat_map(|p| list.iter().map(move |&(a, _)| u_sum(p, m, a)))
        .collect();
    let ub: Vec<f64> = (0..pn)
        .flat_map(|q| list.iter().map(move |&(_, b)| u_sum(q, n, b)))
        .collect();
    (0..pm * pn)
        .flat_map(|r| (0..nb).map(move |k| (r, k)))
        .map(|(r, k)| {
            let (p, q) = (r / pn, r % pn);
            round(ua[p * nb + k] * ub[q * nb + k])
        })
        .collect()
}

/// Stage 2 of a block of slow times: `intensity` (slow, p < 2M, q < 2N) of a grid with `cols`
/// columns → `out` (slow, beam), overwritten. `v` is scratch of P × 2N floats for a
/// [`Resample::Product`] (unused for [`Resample::General`]).
pub fn resample(r: &Resample, cols: usize, intensity: &[f32], v: &mut [f32], out: &mut [f32]) {
    let pn = 2 * cols;
    match r {
        Resample::Product { u, u2, p, q } => {
            let (gp, gq) = (*p, *q);
            let cells = u.len() / gp.max(1) * pn;
            for (i, j) in intensity
                .chunks_exact(cells)
                .zip(out.chunks_exact_mut(gp * gq))
            {
                // V (γ, q) = Σ_p U (p, γ) I (p, q)  (eq. 143)
                v.fill(0.0);
                for (irow, urow) in i.chunks_exact(pn).zip(u.chunks_exact(gp)) {
                    for (vrow, &uw) in v.chunks_exact_mut(pn).zip(urow) {
                        for (a, &b) in vrow.iter_mut().zip(irow) {
                            *a += uw * b;
                        }
                    }
                }
                // J (γ, γ′) = Σ_q V (γ, q) U′ (q, γ′)  (eq. 144)
                j.fill(0.0);
                for (jrow, vrow) in j.chunks_exact_mut(gq).zip(v.chunks_exact(pn)) {
                    for (&vq, u2row) in vrow.iter().zip(u2.chunks_exact(gq)) {
                        for (a, &b) in jrow.iter_mut().zip(u2row) {
                            *a += vq * b;
                        }
                    }
                }
            }
        }
        Resample::General { w, beams } => {
            // J (slow, β) = Σ_ρ I (slow, ρ) W (ρ, β)  (eq. 140), each row of W once per block.
            let cells = w.len() / (*beams).max(1);
            out.fill(0.0);
            for (rho, wrow) in w.chunks_exact(*beams).enumerate() {
                for (i, j) in intensity
                    .chunks_exact(cells)
                    .zip(out.chunks_exact_mut(*beams))
                {
                    let x = i[rho];
                    for (a, &b) in j.iter_mut().zip(wrow) {
                        *a += x * b;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_beams_cover_one_period_around_zenith() {
        let FrbBeams::Product { thetas, thetas2 } = FrbBeams::even(4, 3, 8, 3) else {
            panic!()
        };
        assert_eq!(thetas, [-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
        assert_eq!(thetas2, [-1.0, 0.0, 1.0]);
        assert_eq!(FrbBeams::even(4, 3, 8, 3).positions()[4], (-1.5, 0.0));
    }

    /// The list's table against U·U′ formed entry by entry from `u_sum` (the row-major (ρ, β)
    /// layout the GEMMs read), and a product's U against `u_sum` per (p, a).
    #[test]
    fn tables_hold_u_products_in_row_major_order() {
        let (m, n) = (3, 2);
        let list = [(0.3, -1.1), (2.5, 0.0), (-4.2, 7.9)];
        let w = w_table(m, n, &list, |x| x);
        assert_eq!(w.len(), 4 * m * n * list.len());
        for p in 0..2 * m {
            for q in 0..2 * n {
                for (b, &(t, t2)) in list.iter().enumerate() {
                    let want = u_sum(p, m, t) * u_sum(q, n, t2);
                    assert_eq!(w[(p * 2 * n + q) * list.len() + b], want);
                }
            }
        }
        let thetas = [0.5, -1.25];
        let u = u_table(m, &thetas, |x| x as f32);
        for p in 0..2 * m {
            for (a, &t) in thetas.iter().enumerate() {
                assert_eq!(u[p * thetas.len() + a], u_sum(p, m, t) as f32);
            }
        }
    }
}
