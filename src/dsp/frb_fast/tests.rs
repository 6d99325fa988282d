//! The CPU FRB beamformer against the f64 oracle `dsp::frb` (direct beamforming and stage 1's
//! intensities), for lists, grids and a re-pointed list.

use super::*;
use crate::dsp::frb::{direct, intensities, FrbShape};
use crate::dsp::random::{mix, unit};
use num_complex::Complex64;

/// A random chunk, its presence and weights, for `grid` and `shape`.
fn inputs(shape: FrbChunkShape, seed: u64) -> (Vec<i8>, Vec<u8>, Vec<Complex32>) {
    let x = (0..shape.input_len() as u64)
        .map(|i| (mix(seed, 1, i) % 255) as i8)
        .map(|v| v.max(-127))
        .collect();
    // Antenna 1 misses batch 0.
    let present = (0..shape.batches * shape.n_ants)
        .map(|i| u8::from(i != 1))
        .collect();
    // Per (channel, dish, pol), all different.
    let w = (0..(shape.channels * shape.n_ants * 2) as u64)
        .map(|i| {
            Complex32::new(
                unit(mix(seed, 2, i)) as f32 - 0.5,
                unit(mix(seed, 3, i)) as f32 - 0.5,
            )
        })
        .collect();
    (x, present, w)
}

/// The oracle's direct beamforming (eq. 2, 3) of channel `c`: J (slow, beam) in f64.
fn oracle(
    grid: &DishGrid,
    shape: FrbChunkShape,
    data: &(Vec<i8>, Vec<u8>, Vec<Complex32>),
    c: usize,
    beams: &[(f64, f64)],
) -> Vec<f64> {
    let fs = FrbShape {
        times: shape.batches * shape.spectra,
        t_ds: shape.t_ds,
    };
    direct(
        grid,
        fs,
        &field(shape, data, c),
        &grid_weights(grid, &data.2, c),
        beams,
    )
}

/// Channel `c`'s weights on the grid, in f64.
fn grid_weights(grid: &DishGrid, w: &[Complex32], c: usize) -> Vec<Complex64> {
    let per_dish_pol: Vec<Complex64> = w[c * 2 * grid.dishes()..(c + 1) * 2 * grid.dishes()]
        .iter()
        .map(|v| Complex64::new(v.re.into(), v.im.into()))
        .collect();
    grid.grid_weights(&per_dish_pol)
}

/// The chunk's field of channel `c` as `dsp::frb::intensities` takes it: (time, pol, dish).
fn field(
    shape: FrbChunkShape,
    (x, present, _): &(Vec<i8>, Vec<u8>, Vec<Complex32>),
    c: usize,
) -> Vec<Complex64> {
    let (d, times) = (shape.n_ants, shape.batches * shape.spectra);
    let mut e = vec![Complex64::default(); times * 2 * d];
    for t in 0..times {
        let (b, s) = (t / shape.spectra, t % shape.spectra);
        for pol in 0..2 {
            for a in (0..d).filter(|&a| present[b * d + a] != 0) {
                let i = ((((b * d + a) * shape.channels + c) * shape.spectra + s) * 2 + pol) * 2;
                e[(t * 2 + pol) * d + a] = Complex64::new(x[i].into(), x[i + 1].into());
            }
        }
    }
    e
}

/// Stage 1 alone against `dsp::frb::intensities` in f64, per (channel, dish, pol) weights.
#[test]
fn intensities_equal_the_oracle() {
    let grid = partial_grid(3, 2, &[4]);
    let shape = FrbChunkShape {
        n_ants: grid.dishes(),
        channels: 3,
        spectra: 4,
        batches: 2,
        t_ds: 4,
    };
    let data = inputs(shape, 7);
    let mut bf = FrbBeamformer::new(shape, &grid, &FrbBeams::even(3, 2, 2, 2), 2);
    let mut out = vec![f32::NAN; bf.intensities_len()];
    bf.intensities(&data.0, &data.1, &data.2, &mut out);
    let cells = 4 * 3 * 2;
    for c in 0..shape.channels {
        let fs = FrbShape {
            times: shape.batches * shape.spectra,
            t_ds: shape.t_ds,
        };
        let want = intensities(
            &grid,
            fs,
            &field(shape, &data, c),
            &grid_weights(&grid, &data.2, c),
        );
        let got = &out[c * shape.slow() * cells..(c + 1) * shape.slow() * cells];
        let top = want.iter().fold(0.0f64, |a, &v| a.max(v));
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-5 * top,
                "channel {c} value {k}: {g} vs {w}"
            );
        }
    }
}

fn check(grid: &DishGrid, shape: FrbChunkShape, beams: &FrbBeams, threads: usize) {
    let mut bf = FrbBeamformer::new(shape, grid, beams, threads);
    check_formed(grid, shape, &mut bf, &beams.positions());
}

/// `bf`'s beams against the oracle's at `positions`.
fn check_formed(
    grid: &DishGrid,
    shape: FrbChunkShape,
    bf: &mut FrbBeamformer,
    positions: &[(f64, f64)],
) {
    let data = inputs(shape, 99 + shape.t_ds as u64);
    let mut out = vec![f32::NAN; bf.output_len()];
    bf.form(&data.0, &data.1, &data.2, &mut out);
    let b = positions.len();
    for c in 0..shape.channels {
        let want = oracle(grid, shape, &data, c, positions);
        let got = &out[c * shape.slow() * b..(c + 1) * shape.slow() * b];
        let top = want.iter().fold(0.0f64, |a, &v| a.max(v));
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-5 * top,
                "channel {c} value {k}: {g} vs {w} (max {top})"
            );
        }
    }
}

fn partial_grid(m: usize, n: usize, skip: &[usize]) -> DishGrid {
    let cells: Vec<(usize, usize)> = (0..m * n)
        .rev()
        .filter(|c| !skip.contains(c))
        .map(|c| (c / n, c % n))
        .collect();
    DishGrid::new(m, n, &cells).unwrap()
}

#[test]
fn arbitrary_beams_equal_direct_beamforming() {
    let grid = partial_grid(3, 4, &[0, 5, 11]);
    let beams = FrbBeams::List(
        (0..7u64)
            .map(|i| {
                (
                    unit(mix(5, 1, i)) * 8.0 - 4.0,
                    unit(mix(5, 2, i)) * 10.0 - 5.0,
                )
            })
            .collect(),
    );
    for t_ds in [1, 3, 6] {
        let shape = FrbChunkShape {
            n_ants: grid.dishes(),
            channels: 3,
            spectra: 3,
            batches: 2,
            t_ds,
        };
        check(&grid, shape, &beams, 2);
    }
}

/// A re-pointed list forms the oracle's beams at the new positions; a grid, and a table of
/// another count or grid size than the list's, are refused.
#[test]
fn a_repointed_list_forms_the_new_beams() {
    let grid = partial_grid(2, 3, &[1]);
    let shape = FrbChunkShape {
        n_ants: grid.dishes(),
        channels: 2,
        spectra: 4,
        batches: 1,
        t_ds: 2,
    };
    let mut bf = FrbBeamformer::new(shape, &grid, &FrbBeams::List(vec![(0.0, 0.0); 3]), 2);
    let moved = [(1.5, -0.5), (-0.3, 2.7), (6.1, 1.0)];
    let table = |m, n, p: &[(f64, f64)]| Arc::new(Resample::new(m, n, &FrbBeams::List(p.to_vec())));
    bf.repoint(table(2, 3, &moved)).unwrap();
    check_formed(&grid, shape, &mut bf, &moved);
    assert_eq!(
        bf.repoint(table(2, 3, &moved[..2])).unwrap_err(),
        RepointError::Count { given: 2, beams: 3 }
    );
    assert_eq!(
        bf.repoint(table(3, 3, &moved)).unwrap_err(),
        RepointError::Cells {
            given: 36,
            cells: 24
        }
    );
    let grid_table = Arc::new(Resample::new(2, 3, &FrbBeams::even(2, 3, 1, 3)));
    assert_eq!(bf.repoint(grid_table).unwrap_err(), RepointError::Grid);
    let mut product = FrbBeamformer::new(shape, &grid, &FrbBeams::even(2, 3, 1, 3), 1);
    assert_eq!(
        product.repoint(table(2, 3, &moved)).unwrap_err(),
        RepointError::Grid
    );
}

#[test]
fn beam_grids_equal_direct_beamforming() {
    let grid = partial_grid(2, 5, &[3]);
    // A slow time longer than a batch, and more slow times than SLOW_BLOCK elsewhere.
    for (t_ds, spectra, p, q) in [(4, 2, 3, 4), (1, 20, 4, 10), (5, 5, 1, 2)] {
        let shape = FrbChunkShape {
            n_ants: grid.dishes(),
            channels: 2,
            spectra,
            batches: 2,
            t_ds,
        };
        check(&grid, shape, &FrbBeams::even(2, 5, p, q), 3);
    }
}

#[test]
fn float16_encoding_saturates_and_counts() {
    let mut out = [0u8; 8];
    let clips = encode_f16(&[1.5, -0.25, 1e6, -7e4], 2.0, &mut out);
    assert_eq!(clips, 2);
    // 3.0, −0.5, 65504, −65504 in IEEE binary16.
    assert_eq!(out, [0x00, 0x42, 0x00, 0xb8, 0xff, 0x7b, 0xff, 0xfb]);
}

/// The block-wise conversion gives the bits of an independent rounding (`gpu::frb_half::f16_bits`:
/// the f64 value rounded to a multiple of its fp16 spacing, ties to even; an f32 is exact in
/// f64, so this is one rounding) over normals, subnormals, halfway cases, saturation and a
/// partial last block, with the clip count of a direct count.
#[test]
fn float16_encoding_matches_the_value_by_value_rounding() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut j: Vec<f32> = (0..2500)
        .map(|_| {
            let r = next();
            // Random bits as a float across many magnitudes, finite only.
            f32::from_bits((r as u32 & 0x807f_ffff) | (((r >> 32) as u32 % 60 + 100) << 23))
        })
        .collect();
    // Exact halfway points between fp16 neighbours at scale 1, and the saturation edge.
    j.extend([
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65504.0,
        65520.0,
        -65519.0,
        2f32.powi(-25),
    ]);
    for scale in [1.0f32, 0.5, 2f32.powi(-20), 2f32.powi(10)] {
        let mut out = vec![0u8; 2 * j.len()];
        let clips = encode_f16(&j, scale, &mut out);
        let mut want_clips = 0;
        for (i, &v) in j.iter().enumerate() {
            let x = v * scale;
            if x.abs() > F16_MAX {
                want_clips += 1;
            }
            let want = crate::gpu::frb_half::f16_bits(f64::from(x));
            assert_eq!(
                [out[2 * i], out[2 * i + 1]],
                want.to_le_bytes(),
                "value {v} at scale {scale}"
            );
        }
        assert_eq!(clips, want_clips);
    }
}
