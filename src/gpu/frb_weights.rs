//! The FRB second stage's resampling matrix for a list of beams, built on the GPU (issue 17:
//! tracking beams; seed 004 §5.2 eq. 138, and §5.4: "if we decide to use tracking beams, then
//! we need to compute W on the GPU, since the W-matrix would get recomputed every t_k ~ 1 sec,
//! and copying from the CPU to GPU would use too much PCIe bandwidth"). From the (θ_β, θ′_β)
//! list alone (16 bytes a beam) `kernels/frb_weights.cu` writes
//! W_{(p,q),β} = U_p^M(θ_β)·U_q^N(θ′_β), (4MN × B) row-major, the layout
//! [`super::frb_resample`]'s GEMM reads, in either of its precisions ([`WeightType`]): float32,
//! or the fp16 bits of 2¹⁵·W ([`super::frb_half::TABLE_SCALE`]).
//!
//! **Buffers.** Positions: (β, θ/θ′) f64, uploaded by [`ListWeights::build`]. U: (2M + 2N, B)
//! f64 scratch, U_p^M(θ_β) in rows p < 2M and U_q^N(θ′_β) in rows 2M + q, overwritten by each
//! build (kept for the self-test, [`ListWeights::u_table`]). W: the caller's, overwritten.
//! Everything runs on the compute stream, so a build is ordered after the GEMMs already queued
//! with the old table and before those queued after it: a re-point takes effect at a call
//! boundary without a second table.
//!
//! **Agreement with the host's table** (`dsp::frb_resample::w_table` in f64, which the
//! self-test compares with; the CPU backend's `Resample::new` rounds the same values to f32).
//! The kernel evaluates each U by the cosine sum of `dsp::frb::u_sum` (seed 004 eq. 7) with the
//! same IEEE-rounded +, −, ×, / in the same order (no FMA contraction), W as the same f64 product, and rounds W once: to nearest even in
//! float32 (as Rust's `as f32`), or 2¹⁵·W to nearest even in fp16, saturated at ±65504 (as
//! `frb_half::f16_bits`). The doubles differ from the host's only through the cosines: CUDA's
//! double `cos` is within 2 ulp of the correctly rounded value (CUDA C++ Programming Guide,
//! mathematical functions appendix) and the host's within 1 ulp — the host premise: Rust's
//! `f64::cos` is the platform libm's, glibc's on the engine hosts (its manual's table of known
//! errors) — so two cosines of one argument differ by less than 4·2⁻⁵³ (|cos| ≤ 1). Through the
//! sum (each side's rounding of a partial sum of magnitude ≤ k + 1 adds at most (k + 1)·2⁻⁵³),
//! the division by n and the product (|U| ≤ 1: a mean of cosines), the two f64 values of an
//! entry differ by at most **Δ = (M + N + 8)·2⁻⁵²** ([`deviation`]): with n = M or N,
//! |ΔU| ≤ (n + 3)·2⁻⁵², and the product's own roundings add 2⁻⁵².
//!
//! So each GPU entry is *the correct rounding of a value within Δ of the host's f64 value*: it
//! equals the host's entry bit for bit unless a rounding boundary of the target format lies
//! within Δ of that value, and then it is the neighbouring representable value (one rounding
//! apart). That holds wherever the format's spacing exceeds Δ: every fp16 entry (2¹⁵·Δ < 2⁻²⁹,
//! below the smallest fp16 spacing, 2⁻²⁴) and every float32 entry of magnitude ≥ 2⁻²⁰ (spacing
//! ≥ 2⁻⁴⁴ > Δ for grids up to 64 × 64). Smaller float32 entries — the near-zeros of U, where the
//! cosine sum cancels (beams on or near the half-integer grid) and both sides hold rounding
//! noise of order n·2⁻⁵³ rather than the exact value — may differ by up to Δ plus one spacing:
//! an absolute error of Δ per entry, which [`super::frb_resample`]'s error bounds add. Bit for
//! bit everywhere would need correctly rounded cosines on both sides. Zero's sign may differ
//! (−0 and +0: equal values).
//!
//! Cost: 2(M + N)·B cosine sums of M or N terms and 4MN·B products, against the host's same work
//! plus an upload of 4MN·B·(2 or 4) bytes; the kernel's writes are the table's size, once.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::compile::Kernel;
use super::{Gpu, GpuError};

/// Threads per block of both launches (along the beams).
const BLOCK: u32 = 256;
/// Largest side of the grid, the sides [`deviation`] is stated for: the CPU backend's
/// `--frb-beam` limit (`xbengine::frb_output::MAX_GRID_SIDE`); the CUDA backend's FRB stages
/// take at most `gpu::frb::MAX_GRID_SIDE` = 32, so this op is also tried on larger grids by the
/// self-test alone.
pub const MAX_SIDE: usize = 64;

/// The bound Δ on the difference between the GPU's and the host's f64 value of a W entry for an
/// `rows` × `cols` grid (module doc).
pub fn deviation(rows: usize, cols: usize) -> f64 {
    (rows + cols + 8) as f64 * 2f64.powi(-52)
}

/// The bound on the difference between the GPU's and the host's f64 value of U_q^n(θ) (module
/// doc): (n + 3)·2⁻⁵².
pub fn u_deviation(n: usize) -> f64 {
    (n + 3) as f64 * 2f64.powi(-52)
}

/// A table element the kernel writes: float32, or fp16 bits of 2¹⁵·W.
pub trait WeightType: DeviceRepr + Copy {
    /// The kernel's `HALF` constant.
    const HALF: i64;
}

impl WeightType for f32 {
    const HALF: i64 = 0;
}

impl WeightType for u16 {
    const HALF: i64 = 1;
}

/// Builds W for a fixed grid, beam count and element type, on the compute stream.
pub struct ListWeights<T: WeightType> {
    gpu: Arc<Gpu>,
    u_kernel: CudaFunction,
    w_kernel: CudaFunction,
    rows: usize,
    cols: usize,
    beams: usize,
    /// (β, θ/θ′).
    positions: CudaSlice<f64>,
    /// (2M + 2N, B): U_p^M(θ_β) for p < 2M, then U_q^N(θ′_β).
    u: CudaSlice<f64>,
    element: PhantomData<T>,
}

impl<T: WeightType> ListWeights<T> {
    /// For `beams` beams of a `rows` × `cols` grid (sides 1 to [`MAX_SIDE`]).
    pub fn new(
        gpu: &Arc<Gpu>,
        rows: usize,
        cols: usize,
        beams: usize,
    ) -> Result<ListWeights<T>, GpuError> {
        // The launches' grid: B along x, the 4MN ≤ 16384 rows of W along y (at most 65535).
        if !(1..=MAX_SIDE).contains(&rows)
            || !(1..=MAX_SIDE).contains(&cols)
            || !(1..=i32::MAX as usize).contains(&beams)
        {
            return Err(GpuError::Backend(format!(
                "FRB weights: grid {rows}×{cols} (sides 1 to {MAX_SIDE}), {beams} beams"
            )));
        }
        let defines = vec![
            ("ROWS", rows as i64),
            ("COLS", cols as i64),
            ("HALF", T::HALF),
        ];
        let st = &gpu.compute;
        Ok(ListWeights {
            u_kernel: gpu.function_entry(Kernel::FrbWeights, &defines, "frb_u")?,
            w_kernel: gpu.function(Kernel::FrbWeights, &defines)?,
            positions: st.alloc_zeros(2 * beams)?,
            u: st.alloc_zeros(2 * (rows + cols) * beams)?,
            gpu: Arc::clone(gpu),
            rows,
            cols,
            beams,
            element: PhantomData,
        })
    }

    /// Elements of the table: 4MN × B.
    pub fn len(&self) -> usize {
        4 * self.rows * self.cols * self.beams
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write W for `positions` ((θ, θ′) per beam, finite, as many as built for) into `w`
    /// (at least [`Self::len`] elements; the first `len` overwritten), on the compute stream.
    pub fn build(
        &mut self,
        positions: &[(f64, f64)],
        w: &mut CudaSlice<T>,
    ) -> Result<(), GpuError> {
        if positions.len() != self.beams || w.len() < self.len() {
            return Err(GpuError::Backend(format!(
                "FRB weights: {} positions into {} elements, built for {} beams ({} elements)",
                positions.len(),
                w.len(),
                self.beams,
                self.len()
            )));
        }
        if let Some(b) = positions
            .iter()
            .position(|(a, b)| !(a.is_finite() && b.is_finite()))
        {
            return Err(GpuError::Backend(format!(
                "FRB weights: beam {b} at {:?} is not finite",
                positions[b]
            )));
        }
        let flat: Vec<f64> = positions.iter().flat_map(|&(a, b)| [a, b]).collect();
        let st = &self.gpu.compute;
        st.memcpy_htod(&flat, &mut self.positions)?;
        let n_beams = self.beams as i32;
        let x = (self.beams as u32).div_ceil(BLOCK);
        let launch = |rows: usize| LaunchConfig {
            grid_dim: (x, rows as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = st.launch_builder(&self.u_kernel);
        b.arg(&self.positions).arg(&mut self.u).arg(&n_beams);
        // SAFETY: the arguments match frb_u's (const double2 *, double *, int); positions holds
        // 2B doubles and u (2M + 2N)·B, the grid's y extent is 2M + 2N rows and threads past B
        // return.
        unsafe { b.launch(launch(2 * (self.rows + self.cols))) }?;
        let mut b = st.launch_builder(&self.w_kernel);
        b.arg(&self.u).arg(w).arg(&n_beams);
        // SAFETY: the arguments match frb_w's (const double *, weight_t *, int), with weight_t
        // the type of HALF = T::HALF; thread (β, ρ) writes element ρ·B + β < 4MN·B ≤ w.len()
        // (checked) and reads u rows below 2M + 2N.
        unsafe { b.launch(launch(4 * self.rows * self.cols)) }?;
        Ok(())
    }

    /// The last build's U table ((2M + 2N) × B f64), for the self-test's check of the
    /// agreement's premise.
    pub fn u_table(&self) -> &CudaSlice<f64> {
        &self.u
    }
}
