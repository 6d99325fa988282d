//! The `wgmma` kernel's work items within one (batch group, channel): which pairs of row tiles
//! each cluster multiplies (kernels/correlate_wgmma.cu, `publish_item`).
//!
//! A *pair* is two row tiles of 64 antenna-pols against one column tile of 128 (the pairs of
//! column tile `ct` are `pp = 0 ..= ct`, the last on the diagonal; index
//! `ct·(ct + 1)/2 + pp` in the channel). A cluster of two blocks takes one pair per item, each
//! block one row tile, and the column tile is multicast to both: each block loads half of it.
//!
//! A cluster of four takes two pairs per item, blocks 0–1 the first and 2–3 the second. Where
//! both are of one column tile (a *quad*) each block loads only a quarter of the column tile
//! and multicasts it to all four: 24 KB of L2 reads per block and step instead of 32, the
//! saving bench/correlator-notes.md v16 costs. Every column tile has `ct + 1` pairs, one of them
//! the diagonal, which costs 5/8 of a full pair (its lower triangle is skipped), so pairing the
//! diagonal with a full pair would leave two blocks idle 3/8 of the item; instead the leftovers
//! (each odd column tile's last full pair, and every diagonal) are paired with leftovers of
//! their own kind from other column tiles, as two independent halves of the cluster, each
//! multicasting its own column tile to its two blocks. Only a channel's last leftovers may be
//! paired unevenly, or with no second pair at all (those two blocks then idle).

/// No pair: the half of the cluster has nothing to multiply in this item.
pub const NONE: i32 = -1;

/// The items of one (batch group, channel) for clusters of `blocks` (2 or 4) over
/// `col_tiles` column tiles: per item the pair of blocks 0–1 and, for clusters of four, of
/// blocks 2–3 ([`NONE`] where absent, and always for clusters of two). Consecutive items stay
/// on neighbouring column tiles, whose rows the clusters at work share in L2.
pub fn items(col_tiles: usize, blocks: u32) -> Vec<[i32; 2]> {
    let pair = |ct: usize, pp: usize| (ct * (ct + 1) / 2 + pp) as i32;
    if blocks == 2 {
        return (0..col_tiles * (col_tiles + 1) / 2)
            .map(|k| [k as i32, NONE])
            .collect();
    }
    let mut out = Vec::new();
    // A leftover full pair and a diagonal waiting for a partner of their own kind.
    let (mut full, mut diag) = (None, None);
    let pend = |slot: &mut Option<i32>, k: i32, out: &mut Vec<[i32; 2]>| match slot.take() {
        Some(first) => out.push([first, k]),
        None => *slot = Some(k),
    };
    for ct in 0..col_tiles {
        for q in 0..ct / 2 {
            out.push([pair(ct, 2 * q), pair(ct, 2 * q + 1)]);
        }
        if ct % 2 == 1 {
            pend(&mut full, pair(ct, ct - 1), &mut out);
        }
        pend(&mut diag, pair(ct, ct), &mut out);
    }
    match (full, diag) {
        (Some(f), Some(d)) => out.push([f, d]),
        (Some(k), None) | (None, Some(k)) => out.push([k, NONE]),
        (None, None) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (column tile, pair) of a pair index, by counting (not the closed form the schedule
    /// uses).
    fn parts(k: i32, col_tiles: usize) -> (usize, usize) {
        let mut n = 0;
        for ct in 0..col_tiles {
            for pp in 0..=ct {
                if n == k {
                    return (ct, pp);
                }
                n += 1;
            }
        }
        panic!("pair {k} beyond {col_tiles} column tiles");
    }

    #[test]
    fn every_pair_is_multiplied_exactly_once() {
        for col_tiles in 1..=40 {
            let pairs = col_tiles * (col_tiles + 1) / 2;
            for blocks in [2, 4] {
                let mut seen = vec![0; pairs];
                for [a, b] in items(col_tiles, blocks) {
                    assert_ne!(a, NONE, "an item with no first pair");
                    for k in [a, b].into_iter().filter(|&k| k != NONE) {
                        seen[k as usize] += 1;
                    }
                }
                assert!(
                    seen.iter().all(|&n| n == 1),
                    "{col_tiles} column tiles, clusters of {blocks}: {seen:?}"
                );
            }
        }
    }

    /// Both halves of an item cost the same (two full pairs, or two diagonals), except for at
    /// most one item per channel; and where the halves share a column tile they are two of its
    /// pairs side by side.
    #[test]
    fn halves_are_balanced_and_quads_adjacent() {
        for col_tiles in 1..=40 {
            let mut uneven = 0;
            for [a, b] in items(col_tiles, 4) {
                let (ca, pa) = parts(a, col_tiles);
                if b == NONE {
                    uneven += 1;
                    continue;
                }
                let (cb, pb) = parts(b, col_tiles);
                if (pa == ca) != (pb == cb) {
                    uneven += 1;
                }
                if ca == cb && pa != ca && pb != cb {
                    assert_eq!(
                        pb,
                        pa + 1,
                        "{col_tiles}: quad ({ca}, {pa}) with ({cb}, {pb})"
                    );
                    assert_eq!(pa % 2, 0);
                }
            }
            assert!(
                uneven <= 1,
                "{col_tiles} column tiles: {uneven} uneven items"
            );
        }
    }

    /// Of the full pairs of 9 column tiles (576 antennas), those in quads: the column tiles
    /// with pairs 0..ct hold ⌊ct/2⌋ quads each, 16 in all, so 32 of the 36 full pairs load a
    /// quarter of their column tile per block.
    #[test]
    fn nine_column_tiles_share_in_sixteen_quads() {
        let quads = items(9, 4)
            .into_iter()
            .filter(|&[a, b]| b != NONE && parts(a, 9).0 == parts(b, 9).0)
            .count();
        assert_eq!(quads, 16);
    }
}
