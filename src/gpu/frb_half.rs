//! The FRB second stage's half-precision arithmetic (issue 17; seed 004 §5 proposes float16
//! for I, U and W, "using `cublasHgemm`"): fp16 operands, fp32 sums on the tensor cores. This
//! module holds what [`super::frb_resample`]'s fp16 path needs besides the GEMMs: the scales
//! that keep every operand in fp16's range, the rounding of the tables and of the intensities
//! (the first stage writes them rounded, [`super::frb::FrbIntensities::Float16`];
//! [`f16_from_f32`] is the same rounding on the host, for float32 intensities from elsewhere),
//! and the derived error bound the self-test checks value by value.
//!
//! **Scales** (powers of two, so scaling and unscaling are exact):
//! - intensities: s_I puts the caller's bound on every input intensity, `max_intensity`, in
//!   (32752, 65504] ([`crate::gpu::pow2_scale`]), so no intensity overflows fp16 and those down
//!   to 2⁻²⁹ of the bound are normal. Stage 1 can state that bound a priori
//!   ([`super::frb::FrbConfig::max_intensity`]): a fixed scale needs no reduction over the
//!   data and no read back, so stage 1 writes fp16(s_I·I) itself, from the float32 sum it
//!   would otherwise write, with no pass of its own over I.
//! - tables: |U_p^M(θ)| ≤ 1 (seed 004 eq. 7: a mean of cosines), so |W| = |U·U′| ≤ 1 too;
//!   both are stored as fp16(2¹⁵·value) ([`TABLE_SCALE`]), below 65504, normal down to 2⁻²⁹.
//! - the factorised path's V = Uᵀ I (§5.3 eq. 143) is written in fp16 as α₁·ΣŨĨ with α₁ the
//!   power of two that puts L·α₁ in (0.495, 0.99], L = max_a Σ_p |Ũ_pa| (the scaled table's
//!   largest column sum, measured on the rounded table): |α₁·ΣŨĨ| ≤ 0.99·65504 plus the fp32
//!   sum's error, so V cannot overflow. The second GEMM's α₂ = 1/(α₁·s_I·2³⁰) returns J in
//!   the input's units; the list path's α = 1/(s_I·2¹⁵).
//!
//! **Error bound** (derived here, computed by [`dot_bound`] and [`rounded`], checked by the
//! self-test for every output value). Let u = 2⁻¹¹ (fp16 unit roundoff) and η = 2⁻²⁵ (half the
//! spacing of fp16's subnormals): rounding x to fp16 errs by at most u·|x| + η, i.e.
//! u·|x| + η/s in the unscaled units of a value stored as fp16(s·x).
//! 1. A product of two fp16 numbers is exact in fp32 (11 + 11 significant bits ≤ 24).
//! 2. The fp32 sum of k products: cuBLAS (`CUBLAS_COMPUTE_32F`) sums on the tensor cores,
//!    which align each block of products (and the running sum) to the block's largest
//!    exponent and truncate rather than round (Fasi, Higham, Mikaitis & Pranesh 2021,
//!    "Numerical behavior of NVIDIA tensor cores", PeerJ CS 7:e330): each addend loses less
//!    than 2⁻²³ of the block's largest magnitude and the block's result as much again on
//!    normalisation, so for blocks of b ≥ 2 products the sum errs by less than
//!    k·(b + 2)/b·2⁻²³ ≤ k·2⁻²² of Σ|products| ([`ACCUMULATION`] per term; four times the
//!    2⁻²⁴ of an IEEE fp32 sum, which also covers split-K sums done in fp32 by CUDA cores).
//! 3. For a sum Σ_k x̂_k·ŷ_k whose operands err by |x̂ − x| ≤ e_x and |ŷ − y| ≤ e_y
//!    (|x| ≤ a_x, |y| ≤ a_y): |result − Σxy| ≤ Σ(e_x·a_y + a_x·e_y + e_x·e_y)
//!    + k·2⁻²²·Σ(a_x + e_x)(a_y + e_y) — [`dot_bound`].
//! 4. The list path (§5.2 eq. 140): one such sum over ρ = (p, q), k = 4MN, with
//!    e_I = u·I + η/s_I and e_W = u·|W| + η/2¹⁵. Here I is the float32 intensity the fp16
//!    operand was rounded from once (stage 1's float32 sum, rounded in its kernel; or the
//!    caller's float32 value, rounded by [`f16_from_f32`]): the bound is on the error against
//!    that I, and stage 1's own error against the exact intensity is bounded in `gpu::frb`.
//! 5. The factorised path: V_aq = Σ_p U_pa I_pq by (3) with k = 2M, then rounded to fp16:
//!    e_V = e₁ + u·(A + e₁) + η/(α₁·s_I·2¹⁵), A = Σ_p |U_pa|·I_pq ≥ |V_aq|; then
//!    J_ab = Σ_q V_aq U′_qb by (3) with k = 2N, (a_x, e_x) = (A_aq, e_V), e_U′ = u·|U′| + η/2¹⁵.
//!
//! To first order the list path errs by 2u·T and the factorised one by 4u·T, T = Σ|U|·I·|U′|
//! (2⁻¹⁰ and 2⁻⁹ of T), plus k·2⁻²² of T for the sums: for intensities that is far inside the
//! float16 output's own rounding over a few beams and far below the radiometer noise of one
//! slow sample, 1/√(2·t_ds) — see [`super::frb_resample`] for why fp16 is the default.

#![deny(unsafe_code)]

/// Largest finite fp16.
pub const F16_MAX: f64 = 65504.0;
/// fp16 unit roundoff: rounding to nearest errs by at most u·|x| in the normal range.
pub const UNIT: f64 = 1.0 / 2048.0;
/// Half the spacing 2⁻²⁴ of fp16's subnormals: the absolute part of a rounding's error.
pub const SUBNORMAL: f64 = 1.0 / 33_554_432.0;
/// The tables' scale: |U|, |W| ≤ 1 become at most 2¹⁵ < 65504.
pub const TABLE_SCALE: f64 = 32768.0;
/// The fp32 tensor-core sum's error per product term, relative to Σ|terms| (module doc, 2).
pub const ACCUMULATION: f64 = 1.0 / 4_194_304.0;

/// `x` rounded to the nearest fp16 (ties to even), as its bits; beyond ±65504 it saturates.
/// Rounded from f64 directly: `half`'s `from_f64` goes through f32 on x86 (two roundings).
pub fn f16_bits(x: f64) -> u16 {
    let exponent = (((x.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-14);
    let ulp = 2f64.powi(exponent - 10);
    let v = ((x / ulp).round_ties_even() * ulp).clamp(-F16_MAX, F16_MAX);
    // v is an fp16 value, so every conversion path gives it exactly.
    half::f16::from_f64(v).to_bits()
}

/// The bits of fp16(`scale`·`x`) as the first stage writes them (`kernels/frb_stage1.cu` with
/// OUT_HALF): the product taken in float32 as the kernel takes it (exact for a power of two in
/// range), saturated at ±65504, then rounded once to the nearest fp16, ties to even, from the
/// f32 (`half`'s conversion from f32 is round-to-nearest-even, by F16C or in software; from an
/// f64 it would round to f32 first, a second rounding in general).
pub fn f16_from_f32(x: f32, scale: f32) -> u16 {
    let max = F16_MAX as f32;
    half::f16::from_f32((x * scale).clamp(-max, max)).to_bits()
}

/// The value of fp16 bits.
pub fn f16_value(bits: u16) -> f64 {
    f64::from(half::f16::from_bits(bits).to_f32())
}

/// The fp16 path's scales (module doc), all powers of two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HalfScales {
    /// s_I: intensities are stored as fp16(s_I·I).
    pub intensity: f64,
    /// α₁: the factorised path's V is stored as fp16(α₁·Σ Ũ Ĩ).
    pub v: f64,
}

impl HalfScales {
    /// For inputs bounded by `max_intensity` and a factorised path whose scaled U table has
    /// largest column sum `u_column_sum` (any positive value for the list path).
    pub fn new(max_intensity: f64, u_column_sum: f64) -> HalfScales {
        HalfScales {
            intensity: super::pow2_scale(max_intensity, F16_MAX),
            v: super::pow2_scale(u_column_sum, 0.99),
        }
    }

    /// The list path's α: J = α·Σ Ĩ W̃.
    pub fn list_alpha(&self) -> f64 {
        1.0 / (self.intensity * TABLE_SCALE)
    }

    /// The factorised path's α₂: J = α₂·Σ V̂ Ũ′.
    pub fn product_alpha(&self) -> f64 {
        1.0 / (self.v * self.intensity * TABLE_SCALE * TABLE_SCALE)
    }

    /// η/s_I: the absolute part of an intensity's rounding, in intensity units.
    pub fn intensity_floor(&self) -> f64 {
        SUBNORMAL / self.intensity
    }

    /// η/2¹⁵: the absolute part of a table entry's rounding.
    pub fn table_floor(&self) -> f64 {
        SUBNORMAL / TABLE_SCALE
    }

    /// η/(α₁·s_I·2¹⁵): the absolute part of V's rounding, in the units of U·I.
    pub fn v_floor(&self) -> f64 {
        SUBNORMAL / (self.v * self.intensity * TABLE_SCALE)
    }
}

/// The error bound of a rounding to fp16 of a value of magnitude `a` whose absolute floor is
/// `floor` (module doc): u·a + floor.
pub fn rounded(a: f64, floor: f64) -> f64 {
    UNIT * a + floor
}

/// The bound of module doc (3) on an fp32 tensor-core sum of products x̂·ŷ, from each term's
/// (a_x, e_x, a_y, e_y): magnitudes bounding |x| and |y| and bounds on the operands' errors.
pub fn dot_bound(terms: impl Iterator<Item = (f64, f64, f64, f64)>) -> f64 {
    let (mut operands, mut magnitude, mut k) = (0.0, 0.0, 0usize);
    for (ax, ex, ay, ey) in terms {
        operands += ex * ay + ax * ey + ex * ey;
        magnitude += (ax + ex) * (ay + ey);
        k += 1;
    }
    operands + k as f64 * ACCUMULATION * magnitude
}

/// The factorised path's bound on V_aq (module doc, 5) from the terms of Σ_p U_pa·I_pq as
/// (I_pq, |U_pa|), and the sum A = Σ_p |U_pa|·I_pq they give.
pub fn v_bound(scales: &HalfScales, terms: impl Iterator<Item = (f64, f64)> + Clone) -> (f64, f64) {
    let a: f64 = terms.clone().map(|(i, u)| i.abs() * u).sum();
    let e1 = dot_bound(terms.map(|(i, u)| {
        (
            i.abs(),
            rounded(i.abs(), scales.intensity_floor()),
            u,
            rounded(u, scales.table_floor()),
        )
    }));
    (a, e1 + UNIT * (a + e1) + scales.v_floor())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Every fp16 value, in order: the reference for rounding by search.
    fn all_finite() -> Vec<f64> {
        let mut v: Vec<f64> = (0..=u16::MAX)
            .map(f16_value)
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    }

    /// Against the nearest fp16 found by search (ties to the even significand), across the
    /// normal and subnormal ranges, at exact midpoints and just off them.
    #[test]
    fn rounding_to_f16_is_to_nearest_even() {
        let table = all_finite();
        let nearest = |x: f64| -> f64 {
            let k = table.partition_point(|&t| t < x);
            let (lo, hi) = (table[k.saturating_sub(1)], table[k.min(table.len() - 1)]);
            let (dl, dh) = ((x - lo).abs(), (hi - x).abs());
            if dl < dh {
                lo
            } else if dh < dl {
                hi
            } else {
                // Ties: the even significand (the last bit of its bits is 0).
                if f16_bits(lo) & 1 == 0 {
                    lo
                } else {
                    hi
                }
            }
        };
        let mut rng = SmallRng::seed_from_u64(5);
        let mut xs: Vec<f64> = (0..20_000)
            .map(|_| {
                let m: f64 = rng.random_range(1.0..2.0);
                let e = rng.random_range(-30..16);
                let s = if rng.random() { 1.0 } else { -1.0 };
                s * m * 2f64.powi(e)
            })
            .filter(|x| x.abs() <= F16_MAX)
            .collect();
        for w in table.windows(2).step_by(97) {
            let mid = 0.5 * (w[0] + w[1]);
            xs.extend([mid, mid * (1.0 + 1e-12), mid * (1.0 - 1e-12)]);
        }
        for x in xs {
            let want = nearest(x);
            assert_eq!(f16_value(f16_bits(x)), want, "{x:e}");
            assert!((want - x).abs() <= rounded(x.abs(), SUBNORMAL), "{x:e}");
        }
        assert_eq!(f16_value(f16_bits(1e6)), F16_MAX);
        assert_eq!(f16_value(f16_bits(-65520.0)), -F16_MAX);
    }

    /// The first stage's rounding of scaled float32 values against [`f16_bits`] (searched
    /// against every fp16 above) of the exact f64 product: random values across the normal and
    /// subnormal ranges, fp16 midpoints (exact in float32) and just off them, saturation.
    #[test]
    fn rounding_from_f32_is_the_single_rounding_of_the_scaled_value() {
        let mut rng = SmallRng::seed_from_u64(17);
        let table = all_finite();
        let mut xs: Vec<f32> = (0..50_000)
            .map(|_| rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-40..30)))
            .collect();
        for w in table.windows(2).step_by(31) {
            let mid = (0.5 * (w[0] + w[1])) as f32;
            xs.extend([
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits() - 1),
            ]);
        }
        xs.extend([65504.0, 65519.99, 65520.0, 1e30, 0.0, -3.5e-8]);
        for scale in [1.0f32, 2f32.powi(-20), 2f32.powi(12)] {
            for &x in &xs {
                let exact = f64::from(x) * f64::from(scale);
                assert_eq!(f16_from_f32(x, scale), f16_bits(exact), "{x:e} × {scale:e}");
            }
        }
    }

    #[test]
    fn scales_keep_operands_in_range_and_unscale_exactly() {
        let s = HalfScales::new(1e9, 40_000.0);
        assert!(1e9 * s.intensity <= F16_MAX && 2e9 * s.intensity > F16_MAX);
        assert!(40_000.0 * s.v <= 0.99 && 80_000.0 * s.v > 0.99);
        for a in [s.list_alpha(), s.product_alpha()] {
            assert_eq!(a.log2().fract(), 0.0);
            assert_eq!(f64::from(a as f32), a, "α is a normal float32");
        }
    }

    /// The bound against a CPU model of the fp16 path (operands rounded to fp16 from f64,
    /// exact products, f32 sums, V rounded to fp16) on random intensities spanning six decades
    /// under a loose bound on them, against the f64 sums: never exceeded, and not vacuous.
    #[test]
    fn the_derived_bound_holds_for_a_model_of_the_fp16_path() {
        let mut rng = SmallRng::seed_from_u64(11);
        let (pm, pn, na, nb) = (8, 6, 5, 7);
        let i: Vec<f64> = (0..pm * pn)
            .map(|_| 10f64.powf(rng.random_range(-1.0..5.0)))
            .collect();
        let u: Vec<f64> = (0..pm * na).map(|_| rng.random_range(-1.0..1.0)).collect();
        let u2: Vec<f64> = (0..pn * nb).map(|_| rng.random_range(-1.0..1.0)).collect();
        let q16 = |x: f64, s: f64| f16_value(f16_bits(x * s));
        let ut: Vec<f64> = u.iter().map(|&x| q16(x, TABLE_SCALE)).collect();
        let u2t: Vec<f64> = u2.iter().map(|&x| q16(x, TABLE_SCALE)).collect();
        let column = (0..na)
            .map(|a| (0..pm).map(|p| ut[p * na + a].abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let s = HalfScales::new(1e7, column);
        let it: Vec<f64> = i.iter().map(|&x| q16(x, s.intensity)).collect();
        let mut worst = 0.0f64;
        for a in 0..na {
            let mut vhat = vec![0.0; pn];
            let mut av = vec![(0.0, 0.0); pn];
            for q in 0..pn {
                let acc: f32 = (0..pm)
                    .map(|p| (ut[p * na + a] * it[p * pn + q]) as f32)
                    .sum();
                vhat[q] = q16(f64::from(acc), s.v);
                av[q] = v_bound(&s, (0..pm).map(|p| (i[p * pn + q], u[p * na + a].abs())));
            }
            for b in 0..nb {
                let acc: f32 = (0..pn).map(|q| (vhat[q] * u2t[q * nb + b]) as f32).sum();
                let got = f64::from(acc) * s.product_alpha();
                let exact: f64 = (0..pn)
                    .map(|q| {
                        (0..pm).map(|p| u[p * na + a] * i[p * pn + q]).sum::<f64>() * u2[q * nb + b]
                    })
                    .sum();
                let bound = dot_bound((0..pn).map(|q| {
                    let y = u2[q * nb + b].abs();
                    (av[q].0, av[q].1, y, rounded(y, s.table_floor()))
                }));
                let ratio = (got - exact).abs() / bound;
                assert!(
                    ratio <= 1.0,
                    "a {a} b {b}: error {} bound {bound}",
                    (got - exact).abs()
                );
                worst = worst.max(ratio);
            }
        }
        assert!(worst > 0.01, "the bound is vacuous here: worst {worst}");
    }
}
