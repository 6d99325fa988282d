//! The FRB beamformer's second stage on the GPU (issue 17; seed 004 §5): the CUDA body of
//! `dsp::frb::resample` and `dsp::frb::resample_factorised`, as cuBLAS GEMMs on the compute
//! stream, in one of two precisions ([`Precision`]).
//!
//! **Input**: intensities on the half-integer grid, `rows` rows of (p < 2M, q < 2N) (first
//! stage's output: a row per (channel, slow sample)), float32 ([`FrbResampler::resample`]) or,
//! for the fp16 path, the bits of fp16(s_I·I) ([`FrbResampler::resample_half`]: as the first
//! stage writes them with [`super::frb::FrbIntensities::Float16`], s_I from
//! [`FrbResampler::half_scales`]). **Output**: `rows` rows of beams, float32, overwritten.
//! - Arbitrary beams (θ_β, θ′_β) (§5.2, eq. 138–140): J = I·W, W_{(p,q),β} = U_p^M(θ_β)·U_q^N(θ′_β),
//!   one GEMM (rows × 4MN) · (4MN × B).
//! - A Cartesian product θ_a × θ′_b (§5.3, eq. 141–144): J_row = Uᵀ I_row U′, two strided
//!   batched GEMMs (V = Uᵀ I, then J = V U′) with U (2M × A), U′ (2N × B) shared by every row;
//!   output (row, a, b).
//!
//! The tables: each entry evaluated in f64 by seed 004 eq. 7 and rounded once (to float32, the
//! CPU backend's arithmetic, or to scaled fp16). A product's U and U′ (2(M·P + N·Q) entries)
//! are `dsp::frb_resample::u_table`'s, made on the host and uploaded. A list's W (4MN·B
//! entries) is made on the device from the (θ, θ′) list by [`super::frb_weights`], at
//! construction and at every [`FrbResampler::repoint`] (tracking beams, §5.4): it equals the
//! host's table bit for bit or one rounding apart (float32 entries below 2⁻²⁰, the near-zeros of
//! U, within one spacing plus Δ): each is a correct rounding of a value within an absolute
//! Δ ≤ 2⁻⁴⁴ of the host's f64 one ([`super::frb_weights::deviation`]; see there), which the
//! bounds below add for lists.
//! A re-point is queued on the compute stream, so calls queued before it use the old beams and
//! calls after it the new ones, with one table.
//!
//! **Precisions.**
//! - [`Precision::Float32`]: SGEMMs (no tensor cores). Error bound (standard float32 GEMM
//!   bound, the self-test checks it value by value): a sum of k products in float32 is within
//!   (k + 2)·2⁻²⁴·Σ|terms| of the exact one (the +2 for the rounding of both factors), plus
//!   Δ·Σ|I| for a list's device-built W; the factorised form chains two such sums, so its
//!   bound is (2M + 2N + 4)·2⁻²⁴·Σ_{pq}|U_pa|·|I_pq|·|U′_qb|.
//! - [`Precision::Float16`] (the engine's default): the intensities in fp16 as the first stage
//!   wrote them (no conversion pass here), the tables and V stored in fp16, fp32 sums on the
//!   tensor cores (`cublasGemmEx` / `cublasGemmStridedBatchedEx`, `CUDA_R_16F` operands,
//!   `CUBLAS_COMPUTE_32F`); scales and the derived bound in [`super::frb_half`] (about 2⁻¹⁰ of
//!   Σ|U|·I·|U′| for a list, 2⁻⁹ for a product, plus k·2⁻²² of it for the fp32 sums, I the
//!   float32 intensities the fp16 operands were rounded from once; a list's W entries err by
//!   Δ besides their rounding, added to e_W), checked value by value by the self-test beside
//!   the float32 check. It is the default because
//!   that bound is acceptable for intensities: the output is float16 on the wire (the
//!   encoding itself rounds by 2⁻¹¹), the FRB search downstream quantises to 4 or 8 bits
//!   (seed 004 §5.2 footnote 10), and one slow sample's radiometer noise is 1/√(2·t_ds) of
//!   its mean (≥ 0.8 % for any t_ds ≤ 2¹³), far above the bound for beams that are not deep
//!   nulls of Σ|U|·I·|U′|. Float32 stays selectable (`--frb-beam …,stage2=f32`) where
//!   the beams must match the CPU backend's to float32's precision.
//!   Memory: the fp16 tables and V take half the float32 ones.

use std::sync::Arc;

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{result as blas, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut};

use super::frb_half::{f16_bits, f16_value, HalfScales, TABLE_SCALE};
use super::frb_weights::ListWeights;
use super::{Gpu, GpuError};
use crate::dsp::frb_resample::{u_table, FrbBeams};

/// Most beams one resampler forms per row (a beam list's W is 4MN × B floats).
pub const MAX_BEAMS: usize = 1 << 16;
/// The range a [`Precision::Float16`] bound on the intensities must lie in (the scales and
/// their inverses then stay normal float32 numbers).
pub const MAX_INTENSITY_RANGE: (f64, f64) = (1e-12, 1e30);

/// The arithmetic of the GEMMs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Precision {
    /// float32 operands and sums.
    Float32,
    /// fp16 operands, fp32 tensor-core sums; every input intensity must be at most
    /// `max_intensity` in magnitude (larger ones saturated at 65504/s_I when rounded).
    Float16 { max_intensity: f64 },
}

fn blas_err(e: cudarc::cublas::result::CublasError) -> GpuError {
    GpuError::Backend(format!("cuBLAS: {e:?}"))
}

/// The tables on the device (module doc).
enum Tables {
    /// W ((2M·2N) × B), row-major, and the kernel that builds it.
    General {
        w: CudaSlice<f32>,
        build: ListWeights<f32>,
    },
    /// U (2M × P), U′ (2N × Q), and V, one (P × 2N) per row of the largest call.
    Product {
        u: CudaSlice<f32>,
        u2: CudaSlice<f32>,
        v: CudaSlice<f32>,
        p: usize,
        q: usize,
    },
    /// As `General`, fp16 bits of 2¹⁵·W.
    HalfGeneral {
        w: CudaSlice<u16>,
        build: ListWeights<u16>,
        scales: HalfScales,
    },
    /// As `Product`, fp16 bits of 2¹⁵·U, 2¹⁵·U′ and of V scaled by α₁.
    HalfProduct {
        u: CudaSlice<u16>,
        u2: CudaSlice<u16>,
        v: CudaSlice<u16>,
        p: usize,
        q: usize,
        scales: HalfScales,
    },
}

pub struct FrbResampler {
    gpu: Arc<Gpu>,
    blas: CudaBlas,
    rows: usize,
    cols: usize,
    beams: usize,
    tables: Tables,
    max_rows: usize,
}

/// One GEMM of fp16 operands with fp32 sums into `c` of type `c_type`, column-major as cuBLAS
/// takes it (`cublasGemmStridedBatchedEx`; `cublasGemmEx` for one batch).
///
/// # Safety
/// The buffers must hold what `cfg` reads and writes, and `c` must be of `c_type`.
unsafe fn gemm_half<T>(
    blas: &CudaBlas,
    gpu: &Gpu,
    cfg: &StridedBatchedConfig<f32>,
    a: &impl DevicePtr<u16>,
    b: &impl DevicePtr<u16>,
    c: &mut impl DevicePtrMut<T>,
    c_type: cudaDataType_t,
) -> Result<(), GpuError> {
    let st = &gpu.compute;
    let g = &cfg.gemm;
    let (alpha, beta) = (g.alpha, 0.0f32);
    let (a, _ra) = a.device_ptr(st);
    let (b, _rb) = b.device_ptr(st);
    let (c, _rc) = c.device_ptr_mut(st);
    let half = cudaDataType_t::CUDA_R_16F;
    let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
    let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
    let alpha = (&alpha) as *const f32 as *const _;
    let beta = (&beta) as *const f32 as *const _;
    // SAFETY: the caller's contract; alpha and beta are float32, as CUBLAS_COMPUTE_32F takes
    // them, and outlive the (host pointer mode) calls that read them.
    unsafe {
        if cfg.batch_size == 1 {
            blas::gemm_ex(
                *blas.handle(),
                g.transa,
                g.transb,
                g.m,
                g.n,
                g.k,
                alpha,
                a as *const _,
                half,
                g.lda,
                b as *const _,
                half,
                g.ldb,
                beta,
                c as *mut _,
                c_type,
                g.ldc,
                compute,
                algo,
            )
        } else {
            blas::gemm_strided_batched_ex(
                *blas.handle(),
                g.transa,
                g.transb,
                g.m,
                g.n,
                g.k,
                alpha,
                a as *const _,
                half,
                g.lda,
                cfg.stride_a,
                b as *const _,
                half,
                g.ldb,
                cfg.stride_b,
                beta,
                c as *mut _,
                c_type,
                g.ldc,
                cfg.stride_c,
                cfg.batch_size,
                compute,
                algo,
            )
        }
    }
    .map_err(blas_err)
}

/// The list's GEMM (one batch): row-major J (rows × B) = I (rows × K) · W (K × B), i.e.
/// column-major Jᵀ (B × rows) = Wᵀ (B × K) · Iᵀ (K × rows).
fn list_gemm(beams: usize, rows: usize, plane: usize, alpha: f32) -> StridedBatchedConfig<f32> {
    let n = cublasOperation_t::CUBLAS_OP_N;
    let int = |v: usize| v as i32;
    StridedBatchedConfig {
        gemm: GemmConfig {
            transa: n,
            transb: n,
            m: int(beams),
            n: int(rows),
            k: int(plane),
            alpha,
            lda: int(beams),
            ldb: int(plane),
            beta: 0.0,
            ldc: int(beams),
        },
        batch_size: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
    }
}

/// The product's two batched GEMMs, a batch per row: V = Uᵀ I with `alphas.0`, then J = V U′
/// with `alphas.1`, for U (2M × A) and U′ (2N × B).
fn product_gemms(
    (pm, pn): (usize, usize),
    (na, nb): (usize, usize),
    rows: usize,
    alphas: (f32, f32),
) -> [StridedBatchedConfig<f32>; 2] {
    let n = cublasOperation_t::CUBLAS_OP_N;
    let t = cublasOperation_t::CUBLAS_OP_T;
    let int = |v: usize| v as i32;
    // Per row, column-major Vᵀ (2N × A) = I_rowᵀ (2N × 2M) · U (2M × A); U is row-major
    // (2M × A), i.e. column-major (A × 2M), used transposed.
    let first = StridedBatchedConfig {
        gemm: GemmConfig {
            transa: n,
            transb: t,
            m: int(pn),
            n: int(na),
            k: int(pm),
            alpha: alphas.0,
            lda: int(pn),
            ldb: int(na),
            beta: 0.0,
            ldc: int(pn),
        },
        batch_size: int(rows),
        stride_a: (pm * pn) as i64,
        stride_b: 0,
        stride_c: (pn * na) as i64,
    };
    // Then column-major J_rowᵀ (B × A) = U′ᵀ (B × 2N) · Vᵀ (2N × A): row-major J (A × B).
    let second = StridedBatchedConfig {
        gemm: GemmConfig {
            transa: n,
            transb: n,
            m: int(nb),
            n: int(na),
            k: int(pn),
            alpha: alphas.1,
            lda: int(nb),
            ldb: int(pn),
            beta: 0.0,
            ldc: int(nb),
        },
        batch_size: int(rows),
        stride_a: 0,
        stride_b: (pn * na) as i64,
        stride_c: (na * nb) as i64,
    };
    [first, second]
}

impl FrbResampler {
    /// For a grid of `rows` × `cols` dishes and calls of at most `max_rows` intensity rows.
    pub fn new(
        gpu: &Arc<Gpu>,
        rows: usize,
        cols: usize,
        beams: &FrbBeams,
        max_rows: usize,
        precision: Precision,
    ) -> Result<FrbResampler, GpuError> {
        // SAFETY: only tries to dlopen the library (cudarc panics on first use otherwise).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(GpuError::Backend(
                "libcublas not found: the FRB beamformer's second stage needs it".into(),
            ));
        }
        let n_beams = beams.len();
        if !(1..=MAX_BEAMS).contains(&n_beams) || rows == 0 || cols == 0 || max_rows == 0 {
            return Err(GpuError::Backend(format!(
                "FRB resampler: {n_beams} beams (1 to {MAX_BEAMS}), grid {rows}×{cols}, {max_rows} rows"
            )));
        }
        let st = &gpu.compute;
        let blas = CudaBlas::new(Arc::clone(st)).map_err(blas_err)?;
        let half = match precision {
            Precision::Float32 => None,
            Precision::Float16 { max_intensity } => {
                let (lo, hi) = MAX_INTENSITY_RANGE;
                if !(lo..=hi).contains(&max_intensity) {
                    return Err(GpuError::Backend(format!(
                        "FRB resampler: a bound on the intensities of {max_intensity:e} \
                         (fp16 needs one from {lo:e} to {hi:e})"
                    )));
                }
                Some(max_intensity)
            }
        };
        let tables = match (beams, half) {
            (FrbBeams::List(list), None) => {
                let mut build = ListWeights::new(gpu, rows, cols, n_beams)?;
                let mut w = st.alloc_zeros(build.len())?;
                build.build(list, &mut w)?;
                Tables::General { w, build }
            }
            (FrbBeams::List(list), Some(max_intensity)) => {
                let mut build = ListWeights::new(gpu, rows, cols, n_beams)?;
                let mut w = st.alloc_zeros(build.len())?;
                build.build(list, &mut w)?;
                Tables::HalfGeneral {
                    w,
                    build,
                    scales: HalfScales::new(max_intensity, 1.0),
                }
            }
            (FrbBeams::Product { thetas, thetas2 }, None) => Tables::Product {
                u: st.clone_htod(&u_table(rows, thetas, |x| x as f32))?,
                u2: st.clone_htod(&u_table(cols, thetas2, |x| x as f32))?,
                v: st.alloc_zeros::<f32>(max_rows * thetas.len() * 2 * cols)?,
                p: thetas.len(),
                q: thetas2.len(),
            },
            (FrbBeams::Product { thetas, thetas2 }, Some(max_intensity)) => {
                let round = |x: f64| f16_bits(x * TABLE_SCALE);
                let (u, p) = (u_table(rows, thetas, round), thetas.len());
                // The scaled table's largest column sum Σ_p |Ũ_pa| (V's range).
                let column = (0..p)
                    .map(|a| {
                        u.iter()
                            .skip(a)
                            .step_by(p)
                            .map(|&b| f16_value(b).abs())
                            .sum()
                    })
                    .fold(0.0, f64::max);
                Tables::HalfProduct {
                    u: st.clone_htod(&u)?,
                    u2: st.clone_htod(&u_table(cols, thetas2, round))?,
                    v: st.alloc_zeros::<u16>(max_rows * p * 2 * cols)?,
                    p,
                    q: thetas2.len(),
                    scales: HalfScales::new(max_intensity, column),
                }
            }
        };
        Ok(FrbResampler {
            gpu: Arc::clone(gpu),
            blas,
            rows,
            cols,
            beams: n_beams,
            tables,
            max_rows,
        })
    }

    /// Beams per row of the output.
    pub fn beams(&self) -> usize {
        self.beams
    }

    /// Re-point a list's beams to `positions` (as many, finite): the list's W is rebuilt on
    /// the compute stream, so resamplings queued before this call use the old beams and those
    /// queued after it the new ones. A product's beams (a grid of θ × θ′) are refused.
    pub fn repoint(&mut self, positions: &[(f64, f64)]) -> Result<(), GpuError> {
        match &mut self.tables {
            Tables::General { w, build } => build.build(positions, w),
            Tables::HalfGeneral { w, build, .. } => build.build(positions, w),
            Tables::Product { .. } | Tables::HalfProduct { .. } => Err(GpuError::Backend(
                "FRB resampler: a grid of beams (θ × θ′) cannot be re-pointed, only a list".into(),
            )),
        }
    }

    /// The fp16 path's scales (`None` for float32): s_I, the one the intensities given to
    /// [`FrbResampler::resample_half`] must be scaled by, and those of the self-test's bound.
    pub fn half_scales(&self) -> Option<HalfScales> {
        match self.tables {
            Tables::HalfGeneral { scales, .. } | Tables::HalfProduct { scales, .. } => Some(scales),
            _ => None,
        }
    }

    /// Resample `rows` rows of float32 `i` (row-major (p, q)) into `out` (`rows` × beams), on
    /// the compute stream ([`Precision::Float32`]).
    pub fn resample(
        &mut self,
        i: &CudaView<f32>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.check_call(i.len(), rows, out.len())?;
        let (pm, pn) = (2 * self.rows, 2 * self.cols);
        let beams = self.beams;
        let blas = &self.blas;
        // SAFETY (every GEMM below): the buffers hold at least what the configurations read
        // and write — the input and output checked above, the tables and V sized at
        // construction for `max_rows` rows; the strides stay within `rows` rows.
        match &mut self.tables {
            Tables::General { w, .. } => {
                let cfg = list_gemm(beams, rows, pm * pn, 1.0);
                unsafe { blas.gemm(cfg.gemm, &*w, i, out) }.map_err(blas_err)?;
            }
            Tables::Product { u, u2, v, p, q } => {
                let [first, second] = product_gemms((pm, pn), (*p, *q), rows, (1.0, 1.0));
                unsafe {
                    blas.gemm_strided_batched(first, i, &*u, v)
                        .map_err(blas_err)?;
                    blas.gemm_strided_batched(second, &*u2, &*v, out)
                        .map_err(blas_err)?;
                }
            }
            Tables::HalfGeneral { .. } | Tables::HalfProduct { .. } => {
                return Err(GpuError::Backend(
                    "FRB resampler: built for fp16, given float32 intensities".into(),
                ))
            }
        }
        Ok(())
    }

    /// Resample `rows` rows of `i`, the fp16 bits of s_I·I (row-major (p, q), s_I from
    /// [`FrbResampler::half_scales`]), into `out` (`rows` × beams, float32, in I's units), on
    /// the compute stream ([`Precision::Float16`]).
    pub fn resample_half(
        &mut self,
        i: &CudaView<u16>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.check_call(i.len(), rows, out.len())?;
        let (pm, pn) = (2 * self.rows, 2 * self.cols);
        let beams = self.beams;
        let (blas, gpu) = (&self.blas, &*self.gpu);
        let (r16, r32) = (cudaDataType_t::CUDA_R_16F, cudaDataType_t::CUDA_R_32F);
        // SAFETY (every GEMM below): as in `resample`; `out` is float32 (CUDA_R_32F) and V
        // fp16 bits (CUDA_R_16F).
        match &mut self.tables {
            Tables::HalfGeneral { w, scales, .. } => {
                let cfg = list_gemm(beams, rows, pm * pn, scales.list_alpha() as f32);
                unsafe { gemm_half(blas, gpu, &cfg, &*w, i, out, r32) }?;
            }
            Tables::HalfProduct {
                u,
                u2,
                v,
                p,
                q,
                scales,
            } => {
                let alphas = (scales.v as f32, scales.product_alpha() as f32);
                let [first, second] = product_gemms((pm, pn), (*p, *q), rows, alphas);
                unsafe {
                    gemm_half(blas, gpu, &first, i, &*u, v, r16)?;
                    gemm_half(blas, gpu, &second, &*u2, &*v, out, r32)?;
                }
            }
            Tables::General { .. } | Tables::Product { .. } => {
                return Err(GpuError::Backend(
                    "FRB resampler: built for float32, given fp16 intensities".into(),
                ))
            }
        }
        Ok(())
    }

    /// A call's rows and buffer lengths (values) checked against the resampler's.
    fn check_call(&self, input: usize, rows: usize, output: usize) -> Result<(), GpuError> {
        let plane = 4 * self.rows * self.cols;
        if rows == 0 || rows > self.max_rows || input < rows * plane || output < rows * self.beams {
            return Err(GpuError::Backend(format!(
                "FRB resampler: {rows} rows (1 to {}), input {input} and output {output} values, need {} and {}",
                self.max_rows,
                rows * plane,
                rows * self.beams
            )));
        }
        Ok(())
    }
}
