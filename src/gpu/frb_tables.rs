//! The first stage's constant inputs (`kernels/frb_stage1.cu` and `frb_stage1_wgmma.cu`, seed
//! 004 §4): the two DFT tables, rounded once from f64, as `mma.m16n8k16` fragments or as the
//! `wgmma` kernel's shared-memory operands, and the order in which the kernels grid the dishes.

use half::f16;

use super::frb_wgmma::{operand_offset, padded_sides};

/// Entry (row r of 16-row tile t, column k) of stage 1's real-ified zero-padded DFT along n
/// (kernel header): rows 0–7 real, 8–15 imaginary parts of output q = 8t + r mod 8; column k
/// input n = k/2's real (k even) or imaginary part; the value is the matching part of
/// e^{iπ·n·q/N}.
fn a1_entry(t: usize, r: usize, k: usize, len: usize) -> f64 {
    let (q, n) = (8 * t + (r & 7), k >> 1);
    if n >= len || q >= 2 * len {
        return 0.0;
    }
    let (s, c) = (std::f64::consts::PI * ((n * q) % (2 * len)) as f64 / len as f64).sin_cos();
    match (r >= 8, k & 1 == 1) {
        (false, false) | (true, true) => c,
        (false, true) => -s,
        (true, false) => s,
    }
}

/// Entry (k slot, column j) of stage 2's B for k step `mg` and column tile `nt` (kernel
/// header): slots 0–7 Re G, 8–15 Im G of m = 8mg + slot mod 8; column j is Re (j even) or Im
/// of output p = 4nt + j/2; the value is the matching part of e^{iπ·m·p/M}.
fn b2_entry(mg: usize, slot: usize, nt: usize, j: usize, len: usize) -> f64 {
    let (m, p) = (8 * mg + (slot & 7), 4 * nt + j / 2);
    if m >= len || p >= 2 * len {
        return 0.0;
    }
    let (s, c) = (std::f64::consts::PI * ((m * p) % (2 * len)) as f64 / len as f64).sin_cos();
    match (slot >= 8, j & 1 == 1) {
        (false, false) | (true, true) => c,
        (true, false) => -s,
        (false, true) => s,
    }
}

fn pack(lo: f64, hi: f64) -> u32 {
    u32::from(f16::from_f64(lo).to_bits()) | (u32::from(f16::from_f64(hi).to_bits()) << 16)
}

/// Stage 1's A fragments: (q tile of 8, k step, register, lane) for `mma.m16n8k16` (register
/// k holds row g + 8·(k & 1), columns 2i + 8·(k >> 1) and the next, g = lane/4, i = lane%4).
pub fn a1_table(cols: usize) -> Vec<u32> {
    let (tiles, steps) = ((2 * cols).div_ceil(16) * 2, cols.div_ceil(8));
    let mut v = Vec::with_capacity(tiles * steps * 4 * 32);
    for t in 0..tiles {
        for ks in 0..steps {
            for reg in 0..4 {
                for lane in 0..32 {
                    let row = (lane >> 2) + 8 * (reg & 1);
                    let k = 16 * ks + 2 * (lane & 3) + 8 * (reg >> 1);
                    v.push(pack(
                        a1_entry(t, row, k, cols),
                        a1_entry(t, row, k + 1, cols),
                    ));
                }
            }
        }
    }
    v
}

/// Stage 2's B fragments: (k step, column tile, register, lane) (register k holds column g,
/// slots 2i + 8k and the next).
pub fn b2_table(rows: usize) -> Vec<u32> {
    let (steps, tiles) = (rows.div_ceil(8), (2 * rows).div_ceil(4));
    let mut v = Vec::with_capacity(steps * tiles * 2 * 32);
    for mg in 0..steps {
        for nt in 0..tiles {
            for reg in 0..2 {
                for lane in 0..32 {
                    let (j, slot) = (lane >> 2, 2 * (lane & 3) + 8 * reg);
                    v.push(pack(
                        b2_entry(mg, slot, nt, j, rows),
                        b2_entry(mg, slot + 1, nt, j, rows),
                    ));
                }
            }
        }
    }
    v
}

/// An operand of `kernels/frb_stage1_wgmma.cu` in its swizzled K-major layout
/// (`frb_wgmma::operand_offset`), `rows` × `k_len` fp16 values from `entry(row, k)`, as u32 pairs
/// (k even in the low half).
fn wgmma_operand(rows: usize, k_len: usize, entry: impl Fn(usize, usize) -> f64) -> Vec<u32> {
    let mut v = vec![0u32; rows * k_len / 2];
    for row in 0..rows {
        for k in (0..k_len).step_by(2) {
            v[operand_offset(row, k, k_len) / 4] = pack(entry(row, k), entry(row, k + 1));
        }
    }
    v
}

/// Stage 1's DFT along n for the `wgmma` kernel: row (q, c) (c = re/im innermost) of the
/// product's columns, k (n, d) — [`a1_entry`]'s value for output part c of q from input part d
/// of n; q padded to a multiple of 8, n to 8.
pub fn a1_wgmma_table(cols: usize) -> Vec<u32> {
    let (_, np, qp, _) = padded_sides(1, cols);
    wgmma_operand(2 * qp, 2 * np, |row, k| {
        let (q, c) = (row / 2, row % 2);
        a1_entry(q / 8, q % 8 + 8 * c, k, cols)
    })
}

/// Stage 2's DFT along m for the `wgmma` kernel: row (p, c), k (m, d) — [`b2_entry`]'s value
/// for output part c of p from G's part d at m; p padded to a multiple of 4, m to 8.
pub fn b2_wgmma_table(rows: usize) -> Vec<u32> {
    let (mp, _, _, pp) = padded_sides(rows, 1);
    wgmma_operand(2 * pp, 2 * mp, |row, k| {
        let (p, c, m, d) = (row / 2, row % 2, k / 2, k % 2);
        b2_entry(m / 8, m % 8 + 8 * d, p / 4, 2 * (p % 4) + c, rows)
    })
}

/// The gridding order: for each gridding slot k, the dish it takes, so that the 32 slots of
/// each group (a warp's stores at one time sample, when 32 divides the dish count) fall in
/// distinct shared-memory banks wherever the dish map allows. `cells` holds each dish's
/// offset in a gridded row, in fp16 halves (`m·XROW + 2n`); its bank is (offset / 2) mod 32.
///
/// The dishes are sorted by bank and dealt out in turn to G = ⌈D/32⌉ groups, the groups then
/// laid end to end: a bank's dishes are consecutive in the sorted list, so a bank with at most
/// G dishes puts at most one into any group (and one with more, at most ⌈count/G⌉). Within
/// the kernel the result is the same in any order: each dish writes only its own cell.
pub fn gridding_order(cells: &[i32]) -> Vec<usize> {
    let d = cells.len();
    let groups = d.div_ceil(32).max(1);
    let mut sorted: Vec<usize> = (0..d).collect();
    sorted.sort_by_key(|&k| ((cells[k] / 2).rem_euclid(32), k));
    let mut dealt: Vec<Vec<usize>> = vec![Vec::with_capacity(32); groups];
    for (i, &dish) in sorted.iter().enumerate() {
        dealt[i % groups].push(dish);
    }
    dealt.concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    /// The `wgmma` tables, read back through the operand layout as the kernel's products take
    /// them (row (out, c) · (in, d) with c and d the real and imaginary parts), give the zero-
    /// padded DFTs of a random complex vector, e^{iπ·n·q/N} summed directly in f64, within
    /// fp16's rounding of the entries: at a side that pads q and n (5) and at case 5's (24).
    #[test]
    fn wgmma_tables_apply_the_dfts_with_their_signs() {
        use num_complex::Complex64;
        let mut rng = SmallRng::seed_from_u64(3);
        let entry = |table: &[u32], row: usize, k: usize, k_len: usize| {
            let word = table[operand_offset(row, k, k_len) / 4];
            f16::from_bits((word >> (16 * (k % 2))) as u16).to_f64()
        };
        for len in [5usize, 24] {
            let x: Vec<Complex64> = (0..len)
                .map(|_| Complex64::new(rng.random_range(-1.0..1.0), rng.random_range(-1.0..1.0)))
                .collect();
            let pad = len.div_ceil(8) * 8;
            for (table, k_len) in [
                (a1_wgmma_table(len), 2 * pad),
                (b2_wgmma_table(len), 2 * pad),
            ] {
                for out in 0..2 * len {
                    let want: Complex64 = (0..len)
                        .map(|n| {
                            let a = std::f64::consts::PI * (n * out) as f64 / len as f64;
                            Complex64::from_polar(1.0, a) * x[n]
                        })
                        .sum();
                    let part = |c: usize| -> f64 {
                        (0..len)
                            .map(|n| {
                                entry(&table, 2 * out + c, 2 * n, k_len) * x[n].re
                                    + entry(&table, 2 * out + c, 2 * n + 1, k_len) * x[n].im
                            })
                            .sum()
                    };
                    let tol = 2f64.powi(-11) * 2.0 * len as f64;
                    assert!((part(0) - want.re).abs() < tol, "{len} {out}");
                    assert!((part(1) - want.im).abs() < tol, "{len} {out}");
                }
            }
        }
    }

    /// Most dishes of one bank in any aligned group of 32 slots.
    fn worst_group(cells: &[i32], order: &[usize]) -> usize {
        order
            .chunks(32)
            .map(|g| {
                let mut count = [0usize; 32];
                for &k in g {
                    count[(cells[k] / 2) as usize % 32] += 1;
                }
                count.into_iter().max().unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    /// Random dish maps on seed 004's grids: the order is a permutation, and every group of
    /// 32 is as conflict-free as the banks' counts allow (one dish per bank where no bank has
    /// more dishes than there are groups), where dish order itself conflicts.
    #[test]
    fn each_warp_stores_to_distinct_banks() {
        let mut rng = SmallRng::seed_from_u64(7);
        for (rows, cols, dishes) in [
            (24usize, 24usize, 512),
            (16, 16, 256),
            (8, 8, 64),
            (32, 32, 1024),
        ] {
            let xrow = 2 * cols.next_multiple_of(8) + 8;
            let mut all: Vec<i32> = (0..rows * cols)
                .map(|c| ((c / cols) * xrow + 2 * (c % cols)) as i32)
                .collect();
            all.shuffle(&mut rng);
            let cells = &all[..dishes];
            let order = gridding_order(cells);
            let mut seen = order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..dishes).collect::<Vec<_>>());
            let groups = dishes / 32;
            let mut per_bank = [0usize; 32];
            for c in cells {
                per_bank[(c / 2) as usize % 32] += 1;
            }
            let floor = per_bank.iter().map(|&n| n.div_ceil(groups)).max().unwrap();
            assert_eq!(worst_group(cells, &order), floor, "{rows}×{cols}");
            let identity: Vec<usize> = (0..dishes).collect();
            assert!(worst_group(cells, &identity) > floor, "{rows}×{cols}");
        }
    }
}
