//! The FRB first stage's Hopper kernel (`kernels/frb_stage1_wgmma.cu`, sm_90a): which shapes
//! it takes and how ([`WgmmaShape`]), beside the portable `mma.sync` kernel that `gpu::frb`
//! runs by default ([`FrbKernel`]).
//!
//! The kernel puts a block step's 2·TB (time, pol) pairs through each transform as one product
//! with the DFT matrix shared (kernel header), so its tiles of 64 rows must hold whole pairs'
//! rows: 2·TB·MP and 2·TB·QP multiples of 64 (m padded to 8, q to 8), the tiles dealt evenly to
//! the block's warpgroups, and 64·NWG a multiple of QP so that a thread's rows keep one q. The
//! two products' N (2·QP for stage 1, 2·PP for stage 2) must be equal, a multiple of 16 up to
//! 96: stage 1 reuses a stage-2 tile's accumulators, and where the two widths differed (8×12,
//! 12×16) ptxas serialised every MMA for want of registers (C7511) at half the registers. Every
//! pair of a step is transformed, so a step that a slot cuts short wastes the rest.
//!
//! **The default at 24×24** ([`WgmmaShape::preferred`]; bench/RESULTS.md, 2026-11-28
//! twenty-second session): at seed 004 case 5 on the H200 it takes 1.68–1.70 ms against
//! `mma.sync`'s 2.01–2.03, once the step's address arithmetic left the loop (level before) and
//! its blocks took equal runs of (channel, slot) units in one wave (`gpu::frb`'s launch). The products alone run near the fp16 peak when fed (50 cycles per
//! m64n96k16 with three warpgroups on random operands); here each warpgroup's work is a chain
//! (a stage-2 tile summed before its next one) and the block's barrier per step drains the
//! tensor cores.

use super::compile::Defines;
use super::frb_config::{up, FrbConfig, MAX_SMEM};
use crate::dsp::frb::DishGrid;

/// Which kernel a first stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrbKernel {
    /// Warp-level `mma.sync` per (time, pol) pair (`kernels/frb_stage1.cu`): any sm_80 and
    /// later device, every shape.
    Mma,
    /// Warpgroup `wgmma` over a block step's pairs at once (`kernels/frb_stage1_wgmma.cu`):
    /// sm_90 devices, the shapes [`WgmmaShape::choose`] finds.
    Wgmma,
}

/// Accumulators one thread holds in flight (a stage-1 and a stage-2 tile): 96 built at 167
/// registers with no spill at 24×24 with three warpgroups, the most a 384-thread block has.
const MAX_ACCUMULATORS: usize = 96;

/// The kernel's block step and warpgroups for one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaShape {
    /// Time samples per block step (TB).
    pub time_block: usize,
    /// Warpgroups per block (NWG).
    pub warpgroups: usize,
}

/// The kernel's padded extents for an M×N grid (its MP, NP, QP, PP): m, n and q to multiples
/// of 8, p to 4.
pub fn padded_sides(rows: usize, cols: usize) -> (usize, usize, usize, usize) {
    (up(rows, 8), up(cols, 8), up(2 * cols, 8), up(2 * rows, 4))
}

fn padded(cfg: &FrbConfig) -> (usize, usize, usize, usize) {
    padded_sides(cfg.rows, cfg.cols)
}

impl WgmmaShape {
    /// The first (block step, warpgroups) the kernel takes for `cfg`'s grid — steps from 1 to
    /// 16 samples, three warpgroups preferred (the most a block's registers allow at 24×24),
    /// then two, then four — or None where none fits.
    pub fn choose(cfg: &FrbConfig) -> Option<WgmmaShape> {
        (1..=16)
            .flat_map(|time_block| {
                [3, 2, 4].map(|warpgroups| WgmmaShape {
                    time_block,
                    warpgroups,
                })
            })
            .find(|s| s.fits(cfg))
    }

    /// The shape the op runs where its tuning leaves the kernel open on an sm_90 device: the
    /// one [`choose`](Self::choose) finds, where its products are the full 96 columns wide
    /// (grids of 23–24 rows by 21–24 columns, CHORD's 24×24 among them). Measured on the H200
    /// (bench/RESULTS.md, 2026-11-28 twenty-second session): 10 % faster than `mma.sync` at
    /// 24×24, but 42 % slower at 8×8 (32 columns) and 63 % at 16×16 (64), where each product
    /// is too narrow to pay for the warpgroups' waits.
    pub fn preferred(cfg: &FrbConfig) -> Option<WgmmaShape> {
        let (_, _, qp, _) = padded(cfg);
        Self::choose(cfg).filter(|_| 2 * qp == MAX_ACCUMULATORS)
    }

    /// Whether the kernel builds this shape for `cfg` (its `#error` conditions, the registers:
    /// N accumulators of each stage in flight, and the shared memory).
    pub fn fits(&self, cfg: &FrbConfig) -> bool {
        let (mp, _, qp, pp) = padded(cfg);
        let (pairs, nwg) = (2 * self.time_block, self.warpgroups);
        let (n1, n2) = (2 * qp, 2 * pp);
        let (t1, t2) = (pairs * mp / 64, pairs * qp / 64);
        pairs * mp % 64 == 0
            && pairs * qp % 64 == 0
            && t1 % nwg == 0
            && t2 % nwg == 0
            && (64 * nwg) % qp == 0
            && n1 % 16 == 0
            && n1 == n2
            && n1 <= MAX_ACCUMULATORS
            && self.smem(cfg) <= MAX_SMEM
    }

    pub fn threads(&self) -> u32 {
        self.warpgroups as u32 * 128
    }

    /// Dynamic shared memory of a block (kernel header's list).
    pub fn smem(&self, cfg: &FrbConfig) -> usize {
        let (mp, np, qp, pp) = padded(cfg);
        let pairs = 2 * self.time_block;
        2 * pairs * mp * 2 * np * 2
            + 2 * pairs * qp * 2 * mp * 2
            + 2 * qp * 2 * np * 2
            + 2 * pp * 2 * mp * 2
            + up(2 * self.time_block * cfg.dishes * 4, 16)
            + cfg.dishes * 16
            + up(cfg.dishes * 8, 16)
            + pp * 64 * self.warpgroups * 4
    }

    /// The kernel's `-D` constants.
    pub fn defines(&self, cfg: &FrbConfig) -> Defines {
        let mut defines = cfg.call_defines();
        defines.extend([
            ("TB", self.time_block as i64),
            ("NWG", self.warpgroups as i64),
        ]);
        defines
    }

    /// Each dish's cell in the gridded field X, in fp16 halves: (m, n) at row m, k = 2n of a
    /// pair's rows ([`operand_offset`]; a pair's rows start a row group, MP being a multiple of
    /// 8, so the swizzle is the same in every pair).
    pub fn cells(grid: &DishGrid) -> Vec<i32> {
        let k_len = 2 * padded_sides(grid.rows, grid.cols).1;
        grid.positions()
            .map(|(m, n)| (operand_offset(m, 2 * n, k_len) / 2) as i32)
            .collect()
    }
}

/// Byte offset of (row, k) in a K-major operand of the kernel, with
/// `k_len` fp16 values per row, in the 32-byte swizzle: atoms of 8 rows × 16 values (32 bytes a
/// row), a row group's atoms consecutive along k, a row's two 16-byte halves swapped in rows
/// 4–7 of its atom.
pub fn operand_offset(row: usize, k: usize, k_len: usize) -> usize {
    ((row / 8) * (k_len / 16) + k / 16) * 256
        + (row % 8) * 32
        + (((k / 8) ^ (row / 4)) & 1) * 16
        + (k % 8) * 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::frb::{FrbIntensities, FrbTuning};

    fn cfg(rows: usize, cols: usize, dishes: usize) -> FrbConfig {
        FrbConfig {
            rows,
            cols,
            dishes,
            t_ds: 40,
            channels: 256,
            spectra: 2064,
            batches: 1,
            tuning: FrbTuning::default(),
            output: FrbIntensities::Float16,
        }
    }

    /// Seed 004 case 5 takes the shape the kernel was written and measured for; the kernel's
    /// limits refuse the rest (checked against its `#error` by `tests/kernels_compile.rs`).
    #[test]
    fn case_five_takes_four_samples_and_three_warpgroups() {
        assert_eq!(
            WgmmaShape::choose(&cfg(24, 24, 512)),
            Some(WgmmaShape {
                time_block: 4,
                warpgroups: 3
            })
        );
        // 16×20: q padded to 40, which no warpgroup count's 64·NWG divides.
        assert_eq!(WgmmaShape::choose(&cfg(16, 20, 256)), None);
        // 8×12: the two products' widths differ (48 and 32).
        assert_eq!(WgmmaShape::choose(&cfg(8, 12, 64)), None);
        // 12×12: m padded to 16, three stage-2 tiles per warpgroup.
        assert_eq!(
            WgmmaShape::choose(&cfg(12, 12, 100)),
            Some(WgmmaShape {
                time_block: 12,
                warpgroups: 3
            })
        );
        // 32×32: the products would be 128 columns wide, 128 accumulators in flight.
        assert_eq!(WgmmaShape::choose(&cfg(32, 32, 1024)), None);
    }

    /// The default takes the wgmma kernel only where its products are 96 columns wide, the
    /// shapes where it measured faster than `mma.sync`.
    #[test]
    fn the_default_takes_wgmma_at_full_width_only() {
        assert!(WgmmaShape::preferred(&cfg(24, 24, 512)).is_some());
        assert!(WgmmaShape::preferred(&cfg(23, 21, 400)).is_some());
        // Built by wgmma when named, but slower there: 64 and 32 columns.
        assert!(WgmmaShape::choose(&cfg(16, 16, 256)).is_some());
        assert_eq!(WgmmaShape::preferred(&cfg(16, 16, 256)), None);
        assert!(WgmmaShape::choose(&cfg(8, 8, 64)).is_some());
        assert_eq!(WgmmaShape::preferred(&cfg(8, 8, 64)), None);
        // 24 rows by 20 columns: q padded to 40, 80 columns.
        assert_eq!(WgmmaShape::preferred(&cfg(24, 20, 400)), None);
    }

    /// Every cell of a pair's rows lands at a distinct, in-bounds, 4-byte aligned offset.
    #[test]
    fn cells_are_distinct_words_within_a_pair() {
        let (rows, cols) = (24, 24);
        let k_len = 2 * up(cols, 8);
        let mut seen: Vec<usize> = (0..rows)
            .flat_map(|m| (0..cols).map(move |n| operand_offset(m, 2 * n, k_len)))
            .collect();
        assert!(seen
            .iter()
            .all(|o| o % 4 == 0 && *o < up(rows, 8) * k_len * 2));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), rows * cols);
    }
}
