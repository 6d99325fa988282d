//! What one FRB first stage (`gpu::frb`) is built for ([`FrbConfig`]): the grid, the call's
//! shape, the output type and the `mma.sync` kernel's tuning ([`FrbTuning`]), its checks, its
//! `-D` constants and the builds `FrbStage1::new` tries.

use super::compile::Defines;
use super::frb_wgmma::FrbKernel;
use super::GpuError;

/// Largest grid side the kernel is built for (its DFT tables live in registers and shared
/// memory; CHORD's full array is 24×24).
pub const MAX_GRID_SIDE: usize = 32;
/// Shared memory one block may use (the H100 and sm_80 allow 227 KiB; leave headroom).
pub(super) const MAX_SMEM: usize = 200 * 1024;
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
    /// The kernel (None: `wgmma` on an sm_90 device where
    /// `gpu::frb_wgmma::WgmmaShape::preferred` takes the grid and no field above is set, else
    /// `mma.sync`; `wgmma` where named, for the shapes `WgmmaShape::choose` finds). The fields
    /// above tune `mma.sync` only.
    pub kernel: Option<FrbKernel>,
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

pub(super) fn up(v: usize, k: usize) -> usize {
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
    /// δ = 8.2·2⁻¹¹·B + 2⁻¹⁴·MN and its fp32 sums by (4·t_ds + 2)·2⁻²⁴ of I (module doc, the
    /// bound [`error_bound`] checks), so
    /// I ≤ 2·t_ds·(B + δ)²·(1 + (4·t_ds + 2)·2⁻²⁴). The fp16 output ([`FrbStage1::run_half`])
    /// and the second stage's fp16 path take their scale s_I from this bound
    /// (`gpu::frb_half`), so no intensity saturates.
    pub fn max_intensity(&self, max_weight: f64) -> f64 {
        let eps = 2f64.powi(-24);
        let b = self.dishes as f64 * 128.0 * std::f64::consts::SQRT_2 * max_weight;
        let field = b * (1.0 + 8.2 / 2048.0) + 2f64.powi(-14) * (self.rows * self.cols) as f64;
        let t = self.t_ds as f64;
        2.0 * t * field * field * (1.0 + (4.0 * t + 2.0) * eps)
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

    pub(super) fn warps(&self) -> usize {
        self.q_warps() * self.groups()
    }

    fn block_step(&self) -> usize {
        let r = self.groups();
        self.tuning
            .time_block
            .unwrap_or_else(|| (4..=64).find(|tb| (2 * tb) % r == 0).unwrap_or(4))
    }

    /// Dynamic shared memory of a block with stage 2's table in `table`.
    pub(super) fn smem(&self, table: Stage2Table) -> usize {
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

    /// The `-D` constants of the grid and the call that both kernels take (M, N, D, T_DS,
    /// CHANNELS, SPECTRA, BATCHES), and the output type (OUT_HALF).
    pub(super) fn call_defines(&self) -> Defines {
        vec![
            ("M", self.rows as i64),
            ("N", self.cols as i64),
            ("D", self.dishes as i64),
            ("T_DS", self.t_ds as i64),
            ("CHANNELS", self.channels as i64),
            ("SPECTRA", self.spectra as i64),
            ("BATCHES", self.batches as i64),
            (
                "OUT_HALF",
                i64::from(self.output == FrbIntensities::Float16),
            ),
        ]
    }

    /// The kernel's `-D` constants, once the shape is checked, with stage 2's table in `table`
    /// and registers for `min_blocks` blocks per SM.
    fn defines(&self, table: Stage2Table, min_blocks: usize) -> Result<Defines, GpuError> {
        let tb = self.validate()?;
        let mut defines = self.call_defines();
        defines.extend([
            ("TB", tb as i64),
            ("R", self.groups() as i64),
            ("B2_SMEM", i64::from(table == Stage2Table::Shared)),
            ("MIN_BLOCKS", min_blocks as i64),
        ]);
        Ok(defines)
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
