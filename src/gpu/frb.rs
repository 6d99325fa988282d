//! The FRB beamformer's first stage on the GPU (issue 17; seed 004 §4): the CUDA body of
//! `dsp::frb::intensities`, for every channel of an XB-engine chunk.
//!
//! **Input** ([`FrbStage1::run`]): `batches` consecutive batches of the XB-engine's chunk,
//! **(batch, dish, channel, spectrum, pol, re/im)** int8 (any byte is a valid sample, −128
//! included: it is converted exactly). Call sample t is spectrum `t % spectra` of batch
//! `t / spectra`. **Weights** ([`FrbStage1::set_weights`]): per (channel, dish, pol), complex.
//! **Output**: intensities **(channel, row, p < 2M, q < 2N)** with [`FrbConfig::out_rows`] rows
//! per channel, of which the call's return value are complete slow samples (rows beyond are
//! left as they were), in the type [`FrbConfig::output`] builds the kernel for
//! ([`FrbIntensities`]): float32 I ([`FrbStage1::run`]), or the fp16 second stage's operand
//! fp16(s·I) ([`FrbStage1::run_half`], s a power of two), the float32 value rounded once, so
//! that stage needs no conversion pass of its own. Slow samples run on across calls: the op
//! keeps the partial sums of a slot that a call ends inside (float32, whatever the output type)
//! and adds them into the next call's first row, so any `t_ds` works with any call length.
//!
//! **Method** (`kernels/frb_stage1.cu`): the weighted field is gridded into shared memory and
//! the two zero-padded 1-D transforms are dense DFT matrices applied with fp16 tensor-core MMAs
//! (fp32 accumulation), the first's output packed in registers as the second's operand;
//! |Ẽ|² is summed over pols and `t_ds` samples in fp32 registers. Stage 2's table sits in
//! registers where ptxas holds it without spilling, else in shared memory ([`Stage2Table`]):
//! either way the same roundings and sums.
//!
//! **Error bound** (derived; [`error_bound`] computes it and the self-test checks the kernel
//! against it). Let u = 2⁻¹¹ (fp16 unit roundoff), η = 2⁻²⁵ (half fp16's subnormal spacing)
//! and, for one (time, pol), B = Σ_{mn} |X_mn| with X = W·E the weighted gridded field.
//! (1) X is formed in fp16 (`grid_sample`): W's parts are rounded to fp16 (u|W_part| + η),
//! re·Ŵ is rounded (u + η per part) and im·Ŵ added by a fused multiply-add rounded once
//! (u + η). Per part that is ≤ 3.01u·(|re||Wr| + |im||Wi|) (or the other pairing) + 260η, as
//! |re| + |im| ≤ 256; over both parts, with (|re| + |im|)(|Wr| + |Wi|) ≤ 2|E||W|,
//! |δX| ≤ 6.02u|X| + 520η ≤ 6.02u|X| + 2⁻¹⁵. (2) Each DFT entry cos θ + i sin θ is rounded per
//! part: |δw| ≤ u/2 (|parts| ≤ 1). (3) Stage 1 then gives |δG_mq| ≤ (6.02u + u/2)·Σ_n|X_mn| plus
//! the cells' absolute terms, and rounding G to fp16 adds u·|G_mq| ≤ u·Σ_n|X_mn|. (4) Stage 2's
//! entries add (u/2)·Σ_m|G_mq|. So |δẼ_pq| ≤ 8.02u·B plus fp32 accumulation (at most 2⁻²⁴ per
//! term of ≤ 2·max(M,N)·8 terms, below 0.1u·B for grids up to 64), the cells' 2⁻¹⁵ each through
//! DFT entries of modulus ≤ 1 + u, and fp16 subnormal flushes of G and Ẽ (≤ 2⁻²⁵ absolute per
//! value): δ = 8.2u·B + 2⁻¹⁴·MN. Then |Î − I|_pq ≤ Σ_{τπ} (2|Ẽ_τπpq|·δ_τπ + δ_τπ²) +
//! (4t_ds + 2)·2⁻²⁴·I_pq, the last term for the fp32 squares and running sum (the `wgmma` kernel
//! adds the 4t_ds exact squares by fused multiply-adds, 2⁻²⁴ each; `mma.sync` the 2t_ds
//! terms, each within 2·2⁻²⁴, by rounded adds: (2t_ds + 2)·2⁻²⁴, within the same bound). The fp16 output
//! adds its own rounding, u·s·I + η in scaled units: the rounding of I that `gpu::frb_half`'s
//! bound on the second stage already charges (e_I there), of the same float32 I.
//!
//! **Range**: fp16 holds G only while |G| < 65504: [`FrbStage1::set_weights`] refuses weights
//! with 128·√2·N·max|W| ≥ 65000.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use num_complex::Complex32;

use super::compile::Kernel;
pub use super::frb_config::{
    FrbConfig, FrbIntensities, FrbTuning, Stage2Table, MAX_GRID_SIDE, MAX_T_DS,
};
use super::frb_tables::{a1_table, a1_wgmma_table, b2_table, b2_wgmma_table, gridding_order};
pub use super::frb_wgmma::{FrbKernel, WgmmaShape};
use super::{Gpu, GpuError};
use crate::dsp::frb::DishGrid;

/// Slots per block: the fewest waves of `resident` blocks, each wave as long as a block's
/// slots plus its set-up (taken as 8 samples' work), over the most slots a call can touch.
fn slots_per_block(cfg: &FrbConfig, resident: usize) -> usize {
    let slots = (cfg.t_ds - 1 + cfg.times()).div_ceil(cfg.t_ds);
    (1..=slots)
        .min_by_key(|&spb| {
            let blocks = cfg.channels * slots.div_ceil(spb);
            blocks.div_ceil(resident) * (spb * cfg.t_ds + 8)
        })
        .unwrap_or(1)
}

pub struct FrbStage1 {
    gpu: Arc<Gpu>,
    cfg: FrbConfig,
    kernel: CudaFunction,
    build: Build,
    weights: CudaSlice<f32>,
    /// Per gridding slot (`frb_tables::gridding_order`): its dish's cell and the dish.
    cells: CudaSlice<i32>,
    dishes: CudaSlice<i32>,
    a1: CudaSlice<u32>,
    b2: CudaSlice<u32>,
    carry: [CudaSlice<f32>; 2],
    /// Samples of the current slot summed into `carry[1 - next_carry]` by earlier calls.
    phase: usize,
    next_carry: usize,
    weights_set: bool,
    /// Slots per block, `mma.sync`'s grid.
    slots_per_block: usize,
    /// Blocks resident on the whole device at once (blocks per SM × SMs).
    resident: usize,
}

impl FrbStage1 {
    pub fn new(gpu: Arc<Gpu>, cfg: FrbConfig, grid: &DishGrid) -> Result<FrbStage1, GpuError> {
        if grid.rows != cfg.rows || grid.cols != cfg.cols || grid.dishes() != cfg.dishes {
            return Err(GpuError::Backend(format!(
                "FRB beamformer: grid {}×{} with {} dishes, built for {}×{} with {}",
                grid.rows,
                grid.cols,
                grid.dishes(),
                cfg.rows,
                cfg.cols,
                cfg.dishes
            )));
        }
        let (kernel, build) = compile(&gpu, &cfg)?;
        let smem = build.smem;
        kernel.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        let xrow = 2 * cfg.cols.next_multiple_of(8) + 8;
        let cells: Vec<i32> = match build.kernel {
            FrbKernel::Mma => grid
                .positions()
                .map(|(m, n)| (m * xrow + 2 * n) as i32)
                .collect(),
            FrbKernel::Wgmma => WgmmaShape::cells(grid),
        };
        let (a1, b2) = match build.kernel {
            FrbKernel::Mma => (a1_table(cfg.cols), b2_table(cfg.rows)),
            FrbKernel::Wgmma => (a1_wgmma_table(cfg.cols), b2_wgmma_table(cfg.rows)),
        };
        let order = gridding_order(&cells);
        let slot_cells: Vec<i32> = order.iter().map(|&d| cells[d]).collect();
        let slot_dishes: Vec<i32> = order.iter().map(|&d| d as i32).collect();
        let st = &gpu.compute;
        let plane = cfg.channels * 4 * cfg.rows * cfg.cols;
        let resident =
            kernel.occupancy_max_active_blocks_per_multiprocessor(build.threads, smem, None)?
                as usize
                * gpu.sm_count()?;
        let resident = resident.max(1);
        let slots_per_block = slots_per_block(&cfg, resident);
        Ok(FrbStage1 {
            kernel,
            build,
            weights: st.alloc_zeros(cfg.channels * cfg.dishes * 4)?,
            cells: st.clone_htod(&slot_cells)?,
            dishes: st.clone_htod(&slot_dishes)?,
            a1: st.clone_htod(&a1)?,
            b2: st.clone_htod(&b2)?,
            carry: [st.alloc_zeros(plane)?, st.alloc_zeros(plane)?],
            phase: 0,
            next_carry: 0,
            weights_set: false,
            slots_per_block,
            resident,
            gpu,
            cfg,
        })
    }

    /// The kernel in use and, for `mma.sync`, where it keeps stage 2's table (`compile`'s
    /// choices).
    pub fn kernel(&self) -> (FrbKernel, Option<Stage2Table>) {
        (self.build.kernel, self.build.table)
    }

    /// (registers per thread, dynamic shared memory bytes, resident blocks per SM), for the
    /// benchmark's report.
    pub fn occupancy(&self) -> Result<(i32, usize, u32), GpuError> {
        let b = &self.build;
        Ok((
            self.kernel.num_regs()?,
            b.smem,
            self.kernel
                .occupancy_max_active_blocks_per_multiprocessor(b.threads, b.smem, None)?,
        ))
    }

    /// Upload weights, (channel, dish, pol), on the compute stream (ordered before later runs).
    pub fn set_weights(&mut self, weights: &[Complex32]) -> Result<(), GpuError> {
        let cfg = self.cfg;
        if weights.len() != cfg.channels * cfg.dishes * 2 {
            return Err(GpuError::Backend(format!(
                "FRB weights: {} values, expected channels × dishes × 2 = {}",
                weights.len(),
                cfg.channels * cfg.dishes * 2
            )));
        }
        let limit = cfg.max_weight();
        if let Some(w) = weights
            .iter()
            .find(|w| !(f64::from(w.norm()) < limit && w.re.is_finite() && w.im.is_finite()))
        {
            return Err(GpuError::Backend(format!(
                "FRB weights: |{w}| not below {limit:.3}, the largest that keeps the fp16 \
                 transform of a {}-column grid in range",
                cfg.cols
            )));
        }
        let flat: Vec<f32> = weights.iter().flat_map(|w| [w.re, w.im]).collect();
        self.gpu.compute.memcpy_htod(&flat, &mut self.weights)?;
        self.weights_set = true;
        Ok(())
    }

    /// Sum one call's samples (see the module doc) on the compute stream into float32 `out`
    /// (a stage built for [`FrbIntensities::Float32`]); returns the number of complete slow
    /// samples written to rows 0.. of each channel.
    pub fn run(
        &mut self,
        input: &CudaView<u8>,
        out: &mut CudaSlice<f32>,
    ) -> Result<usize, GpuError> {
        self.expect(FrbIntensities::Float32)?;
        self.launch(input, out, 1.0)
    }

    /// As [`FrbStage1::run`], into `out` as fp16 bits of `scale`·I (a stage built for
    /// [`FrbIntensities::Float16`]); `scale` must be a power of two, so that scaling is exact.
    pub fn run_half(
        &mut self,
        input: &CudaView<u8>,
        out: &mut CudaSlice<u16>,
        scale: f32,
    ) -> Result<usize, GpuError> {
        self.expect(FrbIntensities::Float16)?;
        if !(scale.is_normal() && scale > 0.0 && scale.to_bits() & 0x7f_ffff == 0) {
            return Err(GpuError::Backend(format!(
                "FRB stage 1: fp16 output scale {scale:e} is not a normal power of two"
            )));
        }
        self.launch(input, out, scale)
    }

    fn expect(&self, output: FrbIntensities) -> Result<(), GpuError> {
        if self.cfg.output != output {
            return Err(GpuError::Backend(format!(
                "FRB stage 1: built for {:?} output, run for {output:?}",
                self.cfg.output
            )));
        }
        Ok(())
    }

    fn launch<T: DeviceRepr>(
        &mut self,
        input: &CudaView<u8>,
        out: &mut CudaSlice<T>,
        scale: f32,
    ) -> Result<usize, GpuError> {
        let cfg = self.cfg;
        if input.len() != cfg.input_bytes() || out.len() != cfg.output_len() {
            return Err(GpuError::Backend(format!(
                "FRB stage 1: input {} bytes and output {} values, expected {} and {}",
                input.len(),
                out.len(),
                cfg.input_bytes(),
                cfg.output_len()
            )));
        }
        if !self.weights_set {
            return Err(GpuError::Backend(
                "FRB stage 1: run before set_weights".into(),
            ));
        }
        let slots = (self.phase + cfg.times()).div_ceil(cfg.t_ds);
        // This call writes carry[next_carry] and reads the other, which the last call wrote.
        let read = 1 - self.next_carry;
        // `mma.sync`: a block per run of `slots_per_block` slots of one channel; `wgmma`: one
        // wave of blocks over runs of equal length of the call's (channel, slot) units, a run
        // free to cross a channel's end (kernel header), the waves' last partial one gone.
        let (grid_dim, spb) = match self.build.kernel {
            FrbKernel::Mma => (
                (
                    slots.div_ceil(self.slots_per_block) as u32,
                    cfg.channels as u32,
                    1,
                ),
                self.slots_per_block,
            ),
            FrbKernel::Wgmma => {
                let units = cfg.channels * slots;
                let per_block = units.div_ceil(self.resident);
                ((units.div_ceil(per_block) as u32, 1, 1), per_block)
            }
        };
        let launch = LaunchConfig {
            grid_dim,
            block_dim: (self.build.threads, 1, 1),
            shared_mem_bytes: self.build.smem as u32,
        };
        let (phase, spb) = (self.phase as i32, spb as i32);
        let [c0, c1] = &mut self.carry;
        let (carry_in, carry_out) = if read == 0 { (&*c0, c1) } else { (&*c1, c0) };
        let mut b = self.gpu.compute.launch_builder(&self.kernel);
        b.arg(input)
            .arg(&self.weights)
            .arg(&self.cells)
            .arg(&self.dishes)
            .arg(&self.a1)
            .arg(&self.b2)
            .arg(carry_in)
            .arg(carry_out)
            .arg(out)
            .arg(&phase)
            .arg(&spb)
            .arg(&scale);
        // SAFETY: the argument list matches `frb_stage1`'s and `frb_stage1_wgmma`'s (the tables
        // those of the kernel built, 16-byte aligned as allocations are), `out`'s element type
        // the kernel's `out_t` for this stage's OUT_HALF (checked by the callers); the lengths
        // were checked above and the kernel indexes within the sizes of its -D constants.
        unsafe { b.launch(launch) }?;
        let total = self.phase + cfg.times();
        self.next_carry = read;
        self.phase = total % cfg.t_ds;
        Ok(total / cfg.t_ds)
    }
}

/// The kernel a first stage runs, as built.
struct Build {
    kernel: FrbKernel,
    /// Stage 2's table, `mma.sync` only.
    table: Option<Stage2Table>,
    threads: u32,
    smem: usize,
}

/// The first stage's kernel: the `wgmma` one where [`FrbTuning::kernel`] asks for it (an
/// error where the shape is outside it or ptxas refuses it) or leaves it open on an sm_90
/// device for a shape [`WgmmaShape::preferred`] takes, else the first of `cfg.builds()`
/// that ptxas builds without spilling (the compile check refuses a spill). A grid that spills
/// in every build is refused, saying so.
fn compile(gpu: &Gpu, cfg: &FrbConfig) -> Result<(CudaFunction, Build), GpuError> {
    let t = &cfg.tuning;
    let open =
        t.kernel.is_none() && t.time_block.is_none() && t.groups.is_none() && t.table.is_none();
    let wgmma = if t.kernel == Some(FrbKernel::Wgmma) {
        Some(WgmmaShape::choose(cfg).ok_or_else(|| {
            GpuError::Backend(format!(
                "FRB beamformer: no wgmma first stage for a {}×{} grid (kernels/\
                 frb_stage1_wgmma.cu's tiles)",
                cfg.rows, cfg.cols
            ))
        })?)
    } else if open && gpu.arch == "sm_90" {
        WgmmaShape::preferred(cfg)
    } else {
        None
    };
    if let Some(shape) = wgmma {
        let build = Build {
            kernel: FrbKernel::Wgmma,
            table: None,
            threads: shape.threads(),
            smem: shape.smem(cfg),
        };
        let f = gpu.function(Kernel::FrbStage1Wgmma, &shape.defines(cfg))?;
        return Ok((f, build));
    }
    let mut last = None;
    for (table, defs) in cfg.builds()? {
        match gpu.function(Kernel::FrbStage1, &defs) {
            Ok(f) => {
                let build = Build {
                    kernel: FrbKernel::Mma,
                    table: Some(table),
                    threads: cfg.warps() as u32 * 32,
                    smem: cfg.smem(table),
                };
                return Ok((f, build));
            }
            Err(GpuError::Compile { log, .. }) => {
                tracing::debug!(
                    ?table,
                    "FRB stage 1 build spills or fails; trying the next: {log}"
                );
                last = Some(log);
            }
            Err(e) => return Err(e),
        }
    }
    Err(GpuError::Backend(format!(
        "FRB beamformer: a {}×{} grid does not fit the first stage's registers (ptxas spills \
         even at one block per SM with stage 2's table in shared memory): {}",
        cfg.rows,
        cfg.cols,
        last.unwrap_or_default()
    )))
}

/// The derived bound on |Î − I| (module doc) for one channel: `e` per (time, pol, dish),
/// `weights` on the grid (pol, m, n), `i` the exact intensities (slow, p, q), `e_tilde_abs`
/// |Ẽ| per (time, pol, p, q) from the same f64 computation.
pub fn error_bound(
    grid: &DishGrid,
    t_ds: usize,
    x_abs_sum: &[f64],
    e_tilde_abs: &[f64],
    i: &[f64],
) -> Vec<f64> {
    let u = 2f64.powi(-11);
    let plane = 4 * grid.rows * grid.cols;
    let slow = i.len() / plane;
    let mut bound = vec![0.0; i.len()];
    for s in 0..slow {
        for tau in s * t_ds..(s + 1) * t_ds {
            for pol in 0..2 {
                let tp = tau * 2 + pol;
                let delta =
                    8.2 * u * x_abs_sum[tp] + 2f64.powi(-14) * (grid.rows * grid.cols) as f64;
                for k in 0..plane {
                    bound[s * plane + k] +=
                        2.0 * e_tilde_abs[tp * plane + k] * delta + delta * delta;
                }
            }
        }
        for k in 0..plane {
            bound[s * plane + k] += (4 * t_ds + 2) as f64 * 2f64.powi(-24) * i[s * plane + k];
        }
    }
    bound
}
