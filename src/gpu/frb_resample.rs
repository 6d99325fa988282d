//! The FRB beamformer's second stage on the GPU (issue 17; seed 004 §5): the CUDA body of
//! `dsp::frb::resample` and `dsp::frb::resample_factorised`, as cuBLAS float32 GEMMs on the
//! compute stream.
//!
//! **Input**: intensities on the half-integer grid, `rows` rows of (p < 2M, q < 2N) float32
//! (first stage's output: a row per (channel, slow sample)). **Output**: `rows` rows of beams.
//! - Arbitrary beams (θ_β, θ′_β) (§5.2, eq. 138–140): J = I·W, W_{(p,q),β} = U_p^M(θ_β)·U_q^N(θ′_β),
//!   one GEMM (rows × 4MN) · (4MN × B).
//! - A Cartesian product θ_a × θ′_b (§5.3, eq. 141–144): J_row = Uᵀ I_row U′, two strided
//!   batched GEMMs (V = Uᵀ I, then J = V U′) with U (2M × A), U′ (2N × B) shared by every row;
//!   output (row, a, b).
//!
//! The tables are `dsp::frb_resample::Resample`'s (U evaluated in f64, rounded to float32 once),
//! the CPU backend's own.
//! **Error bound** (standard float32 GEMM bound, the self-test checks it value by value): a sum
//! of k products in float32 is within (k + 2)·2⁻²⁴·Σ|terms| of the exact one (the +2 for the
//! rounding of both factors); the factorised form chains two such sums, so its bound is
//! (2M + 2N + 4)·2⁻²⁴·Σ_{pq}|U_pa|·|I_pq|·|U′_qb|.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, CudaView};

use super::{Gpu, GpuError};
use crate::dsp::frb_resample::{FrbBeams, Resample};

/// Most beams one resampler forms per row (a beam list's W is 4MN × B floats).
pub const MAX_BEAMS: usize = 1 << 16;

fn blas_err(e: cudarc::cublas::result::CublasError) -> GpuError {
    GpuError::Backend(format!("cuBLAS: {e:?}"))
}

/// The tables on the device (`dsp::frb_resample::Resample`'s).
enum Tables {
    /// W ((2M·2N) × B), row-major.
    General { w: CudaSlice<f32>, beams: usize },
    /// U (2M × P), U′ (2N × Q), and V, one (P × 2N) per row of the largest call.
    Product {
        u: CudaSlice<f32>,
        u2: CudaSlice<f32>,
        v: CudaSlice<f32>,
        p: usize,
        q: usize,
    },
}

pub struct FrbResampler {
    blas: CudaBlas,
    rows: usize,
    cols: usize,
    tables: Tables,
    max_rows: usize,
}

impl FrbResampler {
    /// For a grid of `rows` × `cols` dishes and calls of at most `max_rows` intensity rows.
    pub fn new(
        gpu: &Gpu,
        rows: usize,
        cols: usize,
        beams: &FrbBeams,
        max_rows: usize,
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
        let tables = match Resample::new(rows, cols, beams) {
            Resample::General { w, beams } => Tables::General {
                w: st.clone_htod(&w)?,
                beams,
            },
            Resample::Product { u, u2, p, q } => Tables::Product {
                u: st.clone_htod(&u)?,
                u2: st.clone_htod(&u2)?,
                v: st.alloc_zeros::<f32>(max_rows * p * 2 * cols)?,
                p,
                q,
            },
        };
        Ok(FrbResampler {
            blas,
            rows,
            cols,
            tables,
            max_rows,
        })
    }

    /// Beams per row of the output.
    pub fn beams(&self) -> usize {
        match self.tables {
            Tables::General { beams, .. } => beams,
            Tables::Product { p, q, .. } => p * q,
        }
    }

    /// Resample `rows` rows of `i` (row-major (p, q)) into `out` (`rows` × beams), on the
    /// compute stream.
    pub fn resample(
        &mut self,
        i: &CudaView<f32>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let (pm, pn) = (2 * self.rows, 2 * self.cols);
        let plane = pm * pn;
        let beams = self.beams();
        if rows == 0 || rows > self.max_rows || i.len() < rows * plane || out.len() < rows * beams {
            return Err(GpuError::Backend(format!(
                "FRB resampler: {rows} rows (1 to {}), input {} and output {} floats, need {} and {}",
                self.max_rows,
                i.len(),
                out.len(),
                rows * plane,
                rows * beams
            )));
        }
        let n = cublasOperation_t::CUBLAS_OP_N;
        let t = cublasOperation_t::CUBLAS_OP_T;
        let int = |v: usize| v as i32;
        match &mut self.tables {
            Tables::General { w, .. } => {
                // Row-major J (rows × B) = I (rows × K) · W (K × B), i.e. column-major
                // Jᵀ (B × rows) = Wᵀ (B × K) · Iᵀ (K × rows).
                let cfg = GemmConfig {
                    transa: n,
                    transb: n,
                    m: int(beams),
                    n: int(rows),
                    k: int(plane),
                    alpha: 1.0f32,
                    lda: int(beams),
                    ldb: int(plane),
                    beta: 0.0,
                    ldc: int(beams),
                };
                // SAFETY: the buffers hold at least the sizes the config reads and writes
                // (checked above and at construction).
                unsafe { self.blas.gemm(cfg, &*w, i, out) }.map_err(blas_err)?;
            }
            Tables::Product { u, u2, v, p, q } => {
                let (na, nb) = (*p, *q);
                // Per row, column-major Vᵀ (2N × A) = I_rowᵀ (2N × 2M) · U (2M × A); U is
                // row-major (2M × A), i.e. column-major (A × 2M), used transposed.
                let first = StridedBatchedConfig {
                    gemm: GemmConfig {
                        transa: n,
                        transb: t,
                        m: int(pn),
                        n: int(na),
                        k: int(pm),
                        alpha: 1.0f32,
                        lda: int(pn),
                        ldb: int(na),
                        beta: 0.0,
                        ldc: int(pn),
                    },
                    batch_size: int(rows),
                    stride_a: plane as i64,
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
                        alpha: 1.0f32,
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
                // SAFETY: as above; the strides stay within `rows` rows of each buffer.
                unsafe {
                    self.blas
                        .gemm_strided_batched(first, i, &*u, v)
                        .map_err(blas_err)?;
                    self.blas
                        .gemm_strided_batched(second, &*u2, &*v, out)
                        .map_err(blas_err)?;
                }
            }
        }
        Ok(())
    }
}
