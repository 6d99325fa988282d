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
//! (2t_ds + 2)·2⁻²⁴·I_pq, the last term for the fp32 squares and running sum. The fp16 output
//! adds its own rounding, u·s·I + η in scaled units: the rounding of I that `gpu::frb_half`'s
//! bound on the second stage already charges (e_I there), of the same float32 I.
//!
//! **Range**: fp16 holds G only while |G| < 65504: [`FrbStage1::set_weights`] refuses weights
//! with 128·√2·N·max|W| ≥ 65000.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use num_complex::Complex32;

use super::compile::{Defines, Kernel};
use super::frb_tables::{a1_table, b2_table, gridding_order};
use super::{Gpu, GpuError};
use crate::dsp::frb::DishGrid;

/// Largest grid side the kernel is built for (its DFT tables live in registers and shared
/// memory; CHORD's full array is 24×24).
pub const MAX_GRID_SIDE: usize = 32;
/// Shared memory one block may use (the H100 and sm_80 allow 227 KiB; leave headroom).
const MAX_SMEM: usize = 200 * 1024;
/// Largest slow-sample factor accepted.
pub const MAX_T_DS: usize = 1 << 16;

/// The element type of the intensities the first stage writes (`-D OUT_HALF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrbIntensities {
    /// float32 I: the float32 second stage's input, and what the self-test checks against
    /// `dsp::frb`.
    Float32,
    /// The fp16 second stage's operand: the bits of fp16(s·I) for the float32 I the other form
    /// writes, s a power of two given to each run, saturated at ±65504 and rounded to nearest
    /// even — what `gpu::frb_half::f16_from_f32` makes of that float32 value on the host.
    Float16,
}

/// Where the first stage keeps stage 2's DFT table (`-D B2_SMEM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage2Table {
    /// In every warp's registers (36 at 24×24): no shared-memory reads in the transform loop.
    Registers,
    /// Once per block in shared memory, one 8-byte read per fragment: frees the registers, so
    /// that grids above 24 rows with 4 ∤ M build at all (they spilled at one block per SM).
    Shared,
}

/// How one first stage is laid out on the GPU; None everywhere is the engine's choice, the
/// rest are for the benchmark's comparisons and the self-test's coverage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrbTuning {
    /// Time samples per block step (None: the smallest of at least 4 that gives every warp
    /// group the same number of (time, pol) pairs).
    pub time_block: Option<usize>,
    /// Warp groups over (time, pol) pairs (None: 2 where 8 | N and N ≥ 16, so that no warp's
    /// q values are padding, else 1). Measured on the H100 with the fp16 gridding of
    /// 2026-11-27 (bench/RESULTS.md): 2 groups are 10–14 % faster than 1 at 16×16 and 24×24;
    /// at 8×8 8–11 % slower (one warp along q: the groups' reduction is not paid back); at 8×12
    /// level and at 16×20 22 % slower; 4 slower everywhere. The self-test checks 2 and 4.
    pub groups: Option<usize>,
    /// Stage 2's table (None: registers where ptxas holds it there without spilling at the
    /// blocks per SM asked for, else shared memory; `compile`).
    pub table: Option<Stage2Table>,
}

/// What one first stage is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrbConfig {
    /// Grid rows M and columns N.
    pub rows: usize,
    pub cols: usize,
    pub dishes: usize,
    pub t_ds: usize,
    pub channels: usize,
    pub spectra: usize,
    pub batches: usize,
    /// The kernel's layout (`FrbTuning::default()`: the op's choices).
    pub tuning: FrbTuning,
    /// The output's element type.
    pub output: FrbIntensities,
}

fn up(v: usize, k: usize) -> usize {
    v.div_ceil(k) * k
}

impl FrbConfig {
    /// Weights must stay below this in magnitude: 128·√2·N·|W| < 65000 keeps G in fp16.
    pub fn max_weight(&self) -> f64 {
        65000.0 / (128.0 * std::f64::consts::SQRT_2 * self.cols as f64)
    }

    /// A bound on every intensity [`FrbStage1::run`] writes while every weight's magnitude is
    /// at most `max_weight`. Exactly, |Ẽ| ≤ B = Σ_dishes |W|·|E| ≤ D·128√2·max|W| per (time,
    /// pol) (−128 in both parts is the largest sample); the kernel's |Ẽ| errs by at most
    /// δ = 8.2·2⁻¹¹·B + 2⁻¹⁴·MN and its fp32 sums by (2·t_ds + 2)·2⁻²⁴ of I (module doc, the
    /// bound [`error_bound`] checks), so
    /// I ≤ 2·t_ds·(B + δ)²·(1 + (2·t_ds + 2)·2⁻²⁴). The fp16 output ([`FrbStage1::run_half`])
    /// and the second stage's fp16 path take their scale s_I from this bound
    /// (`gpu::frb_half`), so no intensity saturates.
    pub fn max_intensity(&self, max_weight: f64) -> f64 {
        let eps = 2f64.powi(-24);
        let b = self.dishes as f64 * 128.0 * std::f64::consts::SQRT_2 * max_weight;
        let field = b * (1.0 + 8.2 / 2048.0) + 2f64.powi(-14) * (self.rows * self.cols) as f64;
        let t = self.t_ds as f64;
        2.0 * t * field * field * (1.0 + (2.0 * t + 2.0) * eps)
    }

    pub fn times(&self) -> usize {
        self.spectra * self.batches
    }

    /// Output rows per channel: the most complete slow samples one call can end.
    pub fn out_rows(&self) -> usize {
        self.times().div_ceil(self.t_ds)
    }

    /// Output length (values, of the output's type).
    pub fn output_len(&self) -> usize {
        self.channels * self.out_rows() * 4 * self.rows * self.cols
    }

    /// Input bytes of one call.
    pub fn input_bytes(&self) -> usize {
        self.batches * self.dishes * self.channels * self.spectra * 4
    }

    /// Warps along q (16 values of q each).
    fn q_warps(&self) -> usize {
        up(2 * self.cols, 16) / 16
    }

    fn groups(&self) -> usize {
        self.tuning
            .groups
            .unwrap_or(if self.cols % 8 == 0 && self.cols >= 16 {
                2
            } else {
                1
            })
    }

    fn warps(&self) -> usize {
        self.q_warps() * self.groups()
    }

    fn block_step(&self) -> usize {
        let r = self.groups();
        self.tuning
            .time_block
            .unwrap_or_else(|| (4..=64).find(|tb| (2 * tb) % r == 0).unwrap_or(4))
    }

    /// Dynamic shared memory of a block with stage 2's table in `table`.
    fn smem(&self, table: Stage2Table) -> usize {
        let (tb, r) = (self.block_step(), self.groups());
        let (mp, np, pp) = (up(self.rows, 8), up(self.cols, 8), up(2 * self.rows, 4));
        // Stage 2's B fragments: half the column tiles where 4 | M (kernel header).
        let b2_tiles = if self.rows % 4 == 0 {
            self.rows / 4
        } else {
            pp / 4
        };
        up(2 * tb * self.dishes * 4, 16)
            + tb * 2 * mp * (2 * np + 8) * 2
            + self.dishes * 16
            + up(self.dishes * 8, 16)
            + if table == Stage2Table::Shared {
                (mp / 8) * b2_tiles * 32 * 8
            } else {
                0
            }
            + (r - 1) * self.q_warps() * 32 * 2 * (pp / 4) * 4
    }

    /// The kernel's `-D` constants, once the shape is checked, with stage 2's table in `table`
    /// and registers for `min_blocks` blocks per SM.
    fn defines(&self, table: Stage2Table, min_blocks: usize) -> Result<Defines, GpuError> {
        let tb = self.validate()?;
        Ok(vec![
            ("M", self.rows as i64),
            ("N", self.cols as i64),
            ("D", self.dishes as i64),
            ("T_DS", self.t_ds as i64),
            ("CHANNELS", self.channels as i64),
            ("SPECTRA", self.spectra as i64),
            ("BATCHES", self.batches as i64),
            ("TB", tb as i64),
            ("R", self.groups() as i64),
            (
                "OUT_HALF",
                i64::from(self.output == FrbIntensities::Float16),
            ),
            ("B2_SMEM", i64::from(table == Stage2Table::Shared)),
            ("MIN_BLOCKS", min_blocks as i64),
        ])
    }

    /// The builds `FrbStage1::new` tries, in order, each with its stage-2 table: at the blocks
    /// per SM asked for, the table in registers, then in shared memory; then at one block per
    /// SM. A table named in the tuning is the only one tried.
    pub fn builds(&self) -> Result<Vec<(Stage2Table, Defines)>, GpuError> {
        self.validate()?;
        let tables = match self.tuning.table {
            Some(t) => vec![t],
            None => vec![Stage2Table::Registers, Stage2Table::Shared],
        };
        let mut out = Vec::new();
        for &t in &tables {
            out.push((t, self.defines(t, self.blocks_per_sm())?));
        }
        if self.blocks_per_sm() > 1 {
            let last = tables[tables.len() - 1];
            out.push((last, self.defines(last, 1)?));
        }
        Ok(out)
    }

    /// The blocks per SM asked of the registers first: 12 warps in all, three per scheduler,
    /// enough to hide the tensor cores' latency (168 registers at 24×24).
    fn blocks_per_sm(&self) -> usize {
        (12 / self.warps()).max(1)
    }

    fn validate(&self) -> Result<usize, GpuError> {
        let bad = |what: &str, range: &str| {
            Err(GpuError::Backend(format!(
                "FRB beamformer shape: {what} out of range ({range})"
            )))
        };
        if !(1..=MAX_GRID_SIDE).contains(&self.rows) || !(1..=MAX_GRID_SIDE).contains(&self.cols) {
            return bad("grid side", "1 to 32");
        }
        if !(1..=self.rows * self.cols).contains(&self.dishes) {
            return bad("dishes", "1 to the grid's cells");
        }
        if !(1..=MAX_T_DS).contains(&self.t_ds) {
            return bad("t_ds", "1 to 65536");
        }
        if !(1..=65535).contains(&self.channels) || !(1..=65535).contains(&self.batches) {
            return bad("channels or batches", "1 to 65535");
        }
        if !(1..=1 << 24).contains(&self.spectra) || self.times() > i32::MAX as usize / 2 {
            return bad("spectra", "1 to 2^24, and batches × spectra below 2^30");
        }
        let (tb, r) = (self.block_step(), self.groups());
        if !(1..=64).contains(&tb) || !(1..=32).contains(&r) || self.warps() > 32 {
            return bad(
                "time_block or groups",
                "1 to 64 and 1 to 32, at most 32 warps",
            );
        }
        if self.smem(Stage2Table::Shared) > MAX_SMEM {
            return bad("shared memory", "the block's buffers must fit 200 KiB");
        }
        Ok(tb)
    }
}

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
    table: Stage2Table,
    smem: usize,
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
    slots_per_block: usize,
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
        let (kernel, table) = compile(&gpu, &cfg)?;
        let smem = cfg.smem(table);
        kernel.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        let xrow = 2 * up(cfg.cols, 8) + 8;
        let cells: Vec<i32> = grid
            .positions()
            .map(|(m, n)| (m * xrow + 2 * n) as i32)
            .collect();
        let order = gridding_order(&cells);
        let slot_cells: Vec<i32> = order.iter().map(|&d| cells[d]).collect();
        let slot_dishes: Vec<i32> = order.iter().map(|&d| d as i32).collect();
        let st = &gpu.compute;
        let plane = cfg.channels * 4 * cfg.rows * cfg.cols;
        let resident = kernel.occupancy_max_active_blocks_per_multiprocessor(
            cfg.warps() as u32 * 32,
            smem,
            None,
        )? as usize
            * gpu.sm_count()?;
        let slots_per_block = slots_per_block(&cfg, resident.max(1));
        Ok(FrbStage1 {
            kernel,
            table,
            smem,
            weights: st.alloc_zeros(cfg.channels * cfg.dishes * 4)?,
            cells: st.clone_htod(&slot_cells)?,
            dishes: st.clone_htod(&slot_dishes)?,
            a1: st.clone_htod(&a1_table(cfg.cols))?,
            b2: st.clone_htod(&b2_table(cfg.rows))?,
            carry: [st.alloc_zeros(plane)?, st.alloc_zeros(plane)?],
            phase: 0,
            next_carry: 0,
            weights_set: false,
            slots_per_block,
            gpu,
            cfg,
        })
    }

    /// Where the build in use keeps stage 2's table (`compile`'s choice).
    pub fn table(&self) -> Stage2Table {
        self.table
    }

    /// (registers per thread, dynamic shared memory bytes, resident blocks per SM), for the
    /// benchmark's report.
    pub fn occupancy(&self) -> Result<(i32, usize, u32), GpuError> {
        let threads = self.cfg.warps() as u32 * 32;
        Ok((
            self.kernel.num_regs()?,
            self.smem,
            self.kernel
                .occupancy_max_active_blocks_per_multiprocessor(threads, self.smem, None)?,
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
        let launch = LaunchConfig {
            grid_dim: (
                slots.div_ceil(self.slots_per_block) as u32,
                cfg.channels as u32,
                1,
            ),
            block_dim: (cfg.warps() as u32 * 32, 1, 1),
            shared_mem_bytes: self.smem as u32,
        };
        let (phase, spb) = (self.phase as i32, self.slots_per_block as i32);
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
        // SAFETY: the argument list matches `frb_stage1`'s, `out`'s element type the kernel's
        // `out_t` for this stage's OUT_HALF (checked by the callers); the lengths were checked
        // above and the kernel indexes within the sizes of its -D constants.
        unsafe { b.launch(launch) }?;
        let total = self.phase + cfg.times();
        self.next_carry = read;
        self.phase = total % cfg.t_ds;
        Ok(total / cfg.t_ds)
    }
}

/// The first stage's kernel: the first of `cfg.builds()` that ptxas builds without spilling
/// (the compile check refuses a spill), and where its stage-2 table lives. A grid that spills in
/// every build is refused, saying so.
fn compile(gpu: &Gpu, cfg: &FrbConfig) -> Result<(CudaFunction, Stage2Table), GpuError> {
    let mut last = None;
    for (table, defs) in cfg.builds()? {
        match gpu.function(Kernel::FrbStage1, &defs) {
            Ok(f) => return Ok((f, table)),
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
            bound[s * plane + k] += (2 * t_ds + 2) as f64 * 2f64.powi(-24) * i[s * plane + k];
        }
    }
    bound
}
