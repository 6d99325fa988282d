//! The fast correlator (`dsp::correlate_fast`) against the oracle (`dsp::correlate`), exactly,
//! and for one larger shape against numpy's complex128 einsum (tests/reference/xb_reference.py),
//! which the oracle itself is checked against in tests/dsp_reference.rs.

mod common;

use cbf::dsp::correlate::{correlate_accumulate, reduce, unpack_4bit, CorrShape};
use cbf::dsp::correlate_fast::{self, Correlator, MAX_BLOCK};
use cbf::dsp::random::mix;
use proptest::prelude::*;

/// Test input of one kind: 0 uniform over all of i8 (−128 included), 1 full scale ±127 with
/// random signs (katgpucbf's valid range at its extremes), 2 mostly −128 (the largest
/// products, 2·128² per term).
fn input(n: usize, seed: u64, kind: u8) -> Vec<i8> {
    (0..n as u64)
        .map(|i| {
            let r = mix(seed, 3, i);
            match kind {
                0 => r as i8,
                1 => {
                    if r & 1 == 0 {
                        127
                    } else {
                        -127
                    }
                }
                _ => {
                    if r % 8 == 0 {
                        (r >> 8) as i8
                    } else {
                        -128
                    }
                }
            }
        })
        .collect()
}

/// A non-zero starting accumulator, to show that both add into it rather than overwrite it.
fn start(shape: CorrShape, seed: u64) -> Vec<i64> {
    (0..shape.vis_len() as u64)
        .map(|i| (mix(seed, 4, i) >> 20) as i64 - (1 << 43))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Two batches accumulated by the fast correlator equal the oracle's, bit for bit.
    #[test]
    fn eight_bit_matches_the_oracle(
        n_ants in 1usize..=20,
        channels in 1usize..=4,
        spectra in 1usize..=70,
        threads in 1usize..=3,
        kind in 0u8..3,
        seed in any::<u64>(),
    ) {
        let shape = CorrShape { n_ants, channels, spectra };
        let mut want = start(shape, seed);
        let mut got = want.clone();
        let mut corr = Correlator::new(shape, threads);
        for batch in 0..2 {
            let x = input(shape.input_len(), seed ^ batch, kind);
            correlate_accumulate(shape, &x, &mut want);
            corr.accumulate(&x, &mut got);
        }
        prop_assert!(got == want);
    }

    /// 4-bit input: the same as unpacking it and correlating with the oracle.
    #[test]
    fn four_bit_matches_the_oracle(
        n_ants in 1usize..=20,
        channels in 1usize..=4,
        spectra in 1usize..=70,
        threads in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let shape = CorrShape { n_ants, channels, spectra };
        let packed: Vec<u8> = input(shape.input_len() / 2, seed, 0).iter().map(|&v| v as u8).collect();
        let mut unpacked = vec![0i8; shape.input_len()];
        unpack_4bit(&packed, &mut unpacked);
        let mut want = start(shape, seed);
        let mut got = want.clone();
        correlate_accumulate(shape, &unpacked, &mut want);
        Correlator::new(shape, threads).accumulate_4bit(&packed, &mut got);
        prop_assert!(got == want);
    }

    /// The fast reduce gives the oracle's values, clip count and missing markers, with values
    /// on both sides of ±(2³¹ − 1) and random antennas absent.
    #[test]
    fn reduce_matches_the_oracle(
        n_ants in 1usize..=12,
        channels in 1usize..=4,
        absent in any::<u16>(),
        seed in any::<u64>(),
    ) {
        let shape = CorrShape { n_ants, channels, spectra: 1 };
        let acc: Vec<i64> = (0..shape.vis_len() as u64)
            .map(|i| {
                let r = mix(seed, 5, i);
                // ±2³¹ plus or minus a little, or anything up to ±2⁴⁰.
                let near = (i64::from(i32::MAX) + (r >> 62) as i64 - 1) * if r & 2 == 0 { 1 } else { -1 };
                if r & 1 == 0 { near } else { (r >> 24) as i64 - (1 << 39) }
            })
            .collect();
        let present: Vec<bool> = (0..n_ants).map(|a| absent >> a & 1 == 0).collect();
        let mut want = vec![0i32; acc.len()];
        let mut got = vec![7i32; acc.len()];
        let clips_want = reduce(shape, &acc, &present, &mut want);
        let clips_got = correlate_fast::reduce(shape, &acc, &present, &mut got);
        prop_assert_eq!(clips_got, clips_want);
        prop_assert!(got == want);
    }
}

/// Several spectrum blocks with a partial last one: at 200 antennas a block is 80 spectra, so
/// 170 spectra are blocks of 80, 80 and 10.
#[test]
fn many_antennas_span_several_blocks() {
    let shape = CorrShape {
        n_ants: 200,
        channels: 1,
        spectra: 170,
    };
    for (kind, threads) in [(0, 1), (2, 3)] {
        let x = input(shape.input_len(), 7, kind);
        let mut want = vec![0i64; shape.vis_len()];
        correlate_accumulate(shape, &x, &mut want);
        let mut got = vec![0i64; shape.vis_len()];
        Correlator::new(shape, threads).accumulate(&x, &mut got);
        assert!(got == want, "kind {kind}, {threads} threads");
    }
}

/// The largest block (`MAX_BLOCK` spectra, one antenna) of all −128 is the largest i32 partial
/// sum the correlator forms: 2·128²·4096 = 2²⁸, exact, and the tail block adds the rest.
#[test]
fn largest_block_of_largest_values_is_exact() {
    let shape = CorrShape {
        n_ants: 1,
        channels: 2,
        spectra: MAX_BLOCK + 904,
    };
    let x = vec![-128i8; shape.input_len()];
    let mut got = vec![0i64; shape.vis_len()];
    Correlator::new(shape, 2).accumulate(&x, &mut got);
    let power = 2 * 128 * 128 * shape.spectra as i64;
    // Every product of (−128 − 128j) with its own conjugate: real 2·128² per spectrum.
    assert_eq!(got[..8], [power, 0, power, 0, power, 0, power, 0]);
    let mut want = vec![0i64; shape.vis_len()];
    correlate_accumulate(shape, &x, &mut want);
    assert_eq!(got, want);
}

/// One shape larger than the proptests (80 antennas, 3240 baselines, two blocks of spectra)
/// against numpy's complex128 einsum.
#[test]
fn larger_shape_matches_numpy() {
    let shape = CorrShape {
        n_ants: 80,
        channels: 2,
        spectra: 300,
    };
    // katgpucbf's valid range: never −128 (the oracle's numpy test uses the same).
    let x: Vec<i8> = (0..shape.input_len() as u64)
        .map(|i| ((mix(11, 9, i) % 255) as i16 - 127) as i8)
        .collect();
    let bytes: Vec<u8> = x.iter().map(|&v| v as u8).collect();
    let args: Vec<String> = ["correlate".to_string()]
        .into_iter()
        .chain([shape.n_ants, shape.channels, shape.spectra].map(|d| d.to_string()))
        .collect();
    let want: Vec<i64> = common::run_reference_bytes("xb_reference.py", &args, &bytes)
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut got = vec![0i64; shape.vis_len()];
    Correlator::new(shape, 2).accumulate(&x, &mut got);
    assert!(got == want);
}

/// Empty shapes (no antennas, channels or spectra) are no work, not a panic.
#[test]
fn empty_shapes_do_nothing() {
    for (n_ants, channels, spectra) in [(0, 3, 5), (3, 0, 5), (3, 2, 0)] {
        let shape = CorrShape {
            n_ants,
            channels,
            spectra,
        };
        let mut acc = vec![1i64; shape.vis_len()];
        Correlator::new(shape, 2).accumulate(&vec![1i8; shape.input_len()], &mut acc);
        assert!(acc.iter().all(|&v| v == 1));
    }
}
