//! The correlator (`gpu::correlate`) against `dsp::correlate` on fresh random input: exact
//! equality of every int64 accumulator and every reduced int32 value and clip count, never a
//! tolerance. Cases cover 1 to 1024 antennas (odd counts, counts that leave a tile partly
//! filled), odd channel and spectrum counts, the whole int8 range (−128 included: the planar
//! scheme negates nothing, so −128 is correlated as −128), full-scale ±127/−128 extremes,
//! 4-bit input, accumulators pre-filled with garbage that the op must add to, two calls into the
//! same accumulators, missing antennas, and sums that saturate in the reduce. Every case but
//! the `wgmma`-only ones runs on the portable `mma.sync` path and, on an sm_90 device, on the
//! `wgmma` path too: with the corner turn fused into it where the spectra are a multiple of
//! 128, the input 8-bit and the array at most 128 antennas (`CorrConfig::can_fuse`), with the
//! turn riding in its launch for larger arrays in heaps of a multiple of 16 spectra and rows of
//! at least 3072 times (`can_ride`), after the separate turn elsewhere (17, 33, 255 … spectra,
//! 4-bit, short rows, 1024 antennas at 33 spectra). `wgmma` only: the ride forced over two
//! launches of one row and over several batch groups, and rows split into short launches.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::correlate::{
    accumulate_baseline, baseline_index, correlate_accumulate, reduce, unpack_4bit, CorrShape,
};
use crate::gpu::correlate::{CorrConfig, CorrPath, Correlator};
use crate::gpu::{Gpu, GpuError};

/// One case: shape, batches, input width, how the input is drawn, how garbage the
/// accumulators start.
#[derive(Clone, Copy)]
struct Case {
    n_ants: usize,
    channels: usize,
    spectra: usize,
    batches: usize,
    in_bits: u32,
    /// Input only from {−128, −127, 127} (the products' extremes).
    extremes: bool,
    /// Accumulators start anywhere within ±this (±2³¹ and beyond make the reduce saturate).
    garbage: i64,
    /// The `wgmma` path only, with the turn riding in its launch wherever the kernel allows it
    /// (`Correlator::riding`), also at sizes the plan turns apart: the ride over several
    /// windows of one row, which no plan's own choice reaches (its rows of more than 65,536
    /// times exceed `can_ride`'s row bounds).
    ride: bool,
    /// The `wgmma` path only, its rows split into launches of this many times
    /// (`Correlator::set_launch_times`, the benchmark's `--window`) instead of 65,536.
    launch_times: Option<usize>,
}

/// Input bytes of one call and their int8 expansion (the oracle's input): int8, or one byte per
/// complex value with `in_bits` 4; with `extremes`, 8-bit values only from {−128, −127, 127}.
pub(super) fn draw_samples(
    rng: &mut SmallRng,
    in_bits: u32,
    extremes: bool,
    len: usize,
) -> (Vec<u8>, Vec<i8>) {
    if in_bits == 4 {
        let bytes: Vec<u8> = (0..len / 2).map(|_| rng.random()).collect();
        let mut x = vec![0i8; len];
        unpack_4bit(&bytes, &mut x);
        (bytes, x)
    } else {
        let x: Vec<i8> = (0..len)
            .map(|_| {
                if extremes {
                    [-128, -127, 127][rng.random_range(0..3)]
                } else {
                    rng.random()
                }
            })
            .collect();
        (x.iter().map(|&v| v as u8).collect(), x)
    }
}

fn check(
    gpu: &Arc<Gpu>,
    rng: &mut SmallRng,
    case: Case,
    path: CorrPath,
) -> Result<Vec<Check>, GpuError> {
    let shape = CorrShape {
        n_ants: case.n_ants,
        channels: case.channels,
        spectra: case.spectra,
    };
    let cfg = CorrConfig {
        shape,
        batches: case.batches,
        in_bits: case.in_bits,
        path,
    };
    let mut corr = if case.ride {
        Correlator::riding(Arc::clone(gpu), cfg)?
    } else {
        Correlator::new(Arc::clone(gpu), cfg)?
    };
    let name = format!(
        "correlate {path:?}{} {:>4} ants {:>2} ch {:>3} t {} batch (groups of {}) {}-bit{}{}",
        if corr.fused() {
            " fused"
        } else if corr.rides() {
            " ride"
        } else {
            ""
        },
        case.n_ants,
        case.channels,
        case.spectra,
        case.batches,
        cfg.group(),
        case.in_bits,
        if case.extremes { " extremes" } else { "" },
        case.launch_times
            .map_or(String::new(), |t| format!(", launches of {t} times"))
    );
    let refused = if case.ride && !corr.rides() {
        Some("the plan refused the ride")
    } else if case.launch_times.is_some_and(|t| !corr.set_launch_times(t)) {
        Some("the plan refused the launch length")
    } else {
        None
    };
    if let Some(why) = refused {
        return Ok(vec![Check {
            name,
            measured: 1.0,
            limit: 0.0,
            pass: false,
            note: why.to_string(),
        }]);
    }
    let st = &gpu.compute;
    let lim = case.garbage;
    let mut want: Vec<i64> = (0..cfg.acc_len())
        .map(|_| rng.random_range(-lim..=lim))
        .collect();
    let mut acc: CudaSlice<i64> = st.clone_htod(&want)?;
    // Two calls into the same accumulators.
    for _ in 0..2 {
        let (bytes, x) = draw_samples(
            rng,
            case.in_bits,
            case.extremes,
            shape.input_len() * case.batches,
        );
        // Group j of `group` consecutive batches adds into accumulator j.
        let group = cfg.group();
        for (i, xb) in x.chunks_exact(shape.input_len()).enumerate() {
            let j = i / group;
            correlate_accumulate(
                shape,
                xb,
                &mut want[j * shape.vis_len()..][..shape.vis_len()],
            );
        }
        let input = st.clone_htod(&bytes)?;
        corr.correlate(&input.as_view(), &mut acc)?;
    }
    let got = st.clone_dtoh(&acc)?;
    let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    let mut checks = vec![Check {
        name,
        measured: wrong as f64,
        limit: 0.0,
        pass: wrong == 0,
        note: format!("int64 accumulators exact ({} values)", want.len()),
    }];

    // Reduce: the batches' sum through dsp::reduce, with a random antenna missing (if > 1).
    let mut present = vec![true; case.n_ants];
    if case.n_ants > 1 {
        present[rng.random_range(0..case.n_ants)] = false;
    }
    let mut sum = vec![0i64; shape.vis_len()];
    for wb in want.chunks_exact(shape.vis_len()) {
        for (s, w) in sum.iter_mut().zip(wb) {
            *s += w;
        }
    }
    let mut want_out = vec![0i32; shape.vis_len()];
    let want_clips = reduce(shape, &sum, &present, &mut want_out);
    let flags: Vec<u8> = present.iter().map(|&p| u8::from(p)).collect();
    let present_dev = st.clone_htod(&flags)?;
    let mut out = st.clone_htod(&vec![0x5a5a_5a5ai32; shape.vis_len()])?;
    let mut clips = st.clone_htod(&[12345u64])?;
    corr.reduce(&mut acc, &present_dev, &mut out, &mut clips, true)?;
    let got_out = st.clone_dtoh(&out)?;
    let got_clips = st.clone_dtoh(&clips)?[0];
    let cleared = st.clone_dtoh(&acc)?.iter().all(|&v| v == 0);
    let wrong = got_out
        .iter()
        .zip(&want_out)
        .filter(|(g, w)| g != w)
        .count();
    let pass = wrong == 0 && got_clips == want_clips && cleared;
    checks.push(Check {
        name: format!("  reduce {} accumulators, 1 antenna missing", case.batches),
        measured: wrong as f64,
        limit: 0.0,
        pass,
        note: format!(
            "clips {got_clips} (oracle {want_clips}); accumulators {}",
            if cleared { "cleared" } else { "NOT cleared" }
        ),
    });
    Ok(checks)
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xc0_44e1);
    let base = Case {
        n_ants: 4,
        channels: 3,
        spectra: 64,
        batches: 2,
        in_bits: 8,
        extremes: false,
        garbage: 1 << 20,
        ride: false,
        launch_times: None,
    };
    let mut checks = Vec::new();
    for case in [
        Case {
            n_ants: 1,
            channels: 1,
            spectra: 1,
            batches: 1,
            ..base
        },
        Case {
            n_ants: 3,
            channels: 5,
            spectra: 17,
            ..base
        },
        base,
        Case {
            n_ants: 17,
            channels: 3,
            spectra: 33,
            ..base
        },
        Case {
            n_ants: 19,
            channels: 2,
            spectra: 255,
            batches: 3,
            ..base
        },
        Case {
            n_ants: 33,
            channels: 7,
            spectra: 65,
            ..base
        },
        // katgpucbf's 32-spectrum heaps: the call's batches merged into one group.
        Case {
            n_ants: 80,
            channels: 2,
            spectra: 32,
            batches: 5,
            ..base
        },
        Case {
            n_ants: 64,
            channels: 2,
            spectra: 128,
            ..base
        },
        Case {
            n_ants: 65,
            channels: 3,
            spectra: 31,
            batches: 1,
            ..base
        },
        Case {
            n_ants: 80,
            channels: 5,
            spectra: 256,
            ..base
        },
        Case {
            n_ants: 130,
            channels: 1,
            spectra: 100,
            ..base
        },
        // Whole steps of 128 spectra, where the wgmma path fuses its corner turn (`can_fuse`):
        // two column tiles, a row tile partly beyond the array. Then three column tiles, fused
        // only in a build whose FUSE_MAX_NP allows it (bench/correlator-notes.md v14), the
        // turned path otherwise.
        Case {
            n_ants: 100,
            channels: 3,
            spectra: 256,
            ..base
        },
        Case {
            n_ants: 130,
            channels: 2,
            spectra: 384,
            ..base
        },
        // Beyond 128 antennas, heaps of a multiple of 16 spectra, rows of 3072 times or more:
        // the turn rides in the wgmma kernel's launch (`can_ride`), here with 100 merged heaps
        // of 32 spectra (rows of 3200 times, a step's 128 times spanning four heaps), and with
        // two heaps of 3072, and with rows padded past the call's times (3088 → 3200).
        Case {
            n_ants: 200,
            channels: 1,
            spectra: 3088,
            batches: 1,
            extremes: true,
            ..base
        },
        Case {
            n_ants: 200,
            channels: 2,
            spectra: 32,
            batches: 100,
            ..base
        },
        Case {
            n_ants: 130,
            channels: 2,
            spectra: 3072,
            batches: 2,
            ..base
        },
        Case {
            n_ants: 1024,
            channels: 1,
            spectra: 33,
            batches: 1,
            ..base
        },
        // The ride over two launches of one row (65,792 times: steps 0 and 512, the progress
        // words zeroed again for the second), extremes. (A window's sums stay below 2³¹ here:
        // the extremes case at 140,032 times below is the one that needs the windows.)
        Case {
            n_ants: 130,
            channels: 1,
            spectra: 256,
            batches: 257,
            extremes: true,
            ride: true,
            ..base
        },
        // Full-scale extremes with accumulators near ±2³¹: the reduce saturates.
        Case {
            n_ants: 19,
            channels: 3,
            spectra: 384,
            extremes: true,
            garbage: 1 << 31,
            ..base
        },
        Case {
            n_ants: 80,
            channels: 2,
            spectra: 256,
            extremes: true,
            garbage: 1 << 40,
            ..base
        },
        // Autocorrelations of 140,032 extreme samples pass 2³¹: the int32 sums must be windowed
        // (the wgmma path launches once per 65,536 times, the mma kernel loops).
        Case {
            n_ants: 2,
            channels: 1,
            spectra: 140_032,
            batches: 1,
            extremes: true,
            ..base
        },
        // Rows too long to merge (3 × 400,000 times > 2²⁰): one group per batch, each summed
        // into its own accumulator over several windows (fused on the wgmma path: whole steps
        // of 128 spectra); then 400,016 spectra, turned apart (7 launches per row).
        Case {
            n_ants: 3,
            channels: 2,
            spectra: 400_000,
            batches: 3,
            extremes: true,
            ..base
        },
        Case {
            n_ants: 3,
            channels: 2,
            spectra: 400_016,
            batches: 3,
            extremes: true,
            ..base
        },
        // Rows split into short launches (`set_launch_times`): turned apart (2048 times, six
        // launches of 384), fused (2048, eight of 256), riding (6144, six of 1024).
        Case {
            n_ants: 19,
            channels: 3,
            spectra: 1000,
            batches: 2,
            launch_times: Some(384),
            ..base
        },
        Case {
            n_ants: 100,
            channels: 2,
            spectra: 1024,
            batches: 2,
            launch_times: Some(256),
            ..base
        },
        Case {
            n_ants: 130,
            channels: 1,
            spectra: 3072,
            batches: 2,
            launch_times: Some(1024),
            ..base
        },
        Case {
            n_ants: 19,
            channels: 3,
            spectra: 77,
            in_bits: 4,
            ..base
        },
        Case {
            n_ants: 80,
            channels: 2,
            spectra: 256,
            in_bits: 4,
            ..base
        },
    ] {
        if !case.ride && case.launch_times.is_none() {
            checks.extend(check(gpu, &mut rng, case, CorrPath::Mma)?);
        }
        if CorrPath::best_for(gpu) == CorrPath::Wgmma {
            checks.extend(check(gpu, &mut rng, case, CorrPath::Wgmma)?);
        }
    }
    if CorrPath::best_for(gpu) == CorrPath::Wgmma {
        checks.push(ride_against_apart(gpu, &mut rng)?);
    }
    Ok(checks)
}

/// The ride over several batch groups, each over two windows, against the separate turn on
/// the same input and accumulators (exact), and a sample of baselines against direct sums on
/// the host: rows of more than 2²⁰ times are not merged, so each of 16 batches of 65,664
/// spectra is its own group. The oracle's sums over all 1,050,624 times of 130 antennas would
/// take minutes on the host, so it checks `SAMPLE` baselines of every group in full; the
/// comparison with the separate turn (oracle-checked over several groups and windows at
/// 3 antennas × 400,016 spectra) covers the rest.
fn ride_against_apart(gpu: &Arc<Gpu>, rng: &mut SmallRng) -> Result<Check, GpuError> {
    /// Baselines checked against the host: an autocorrelation, the column tiles' corners.
    const SAMPLE: [(usize, usize); 4] = [(0, 0), (0, 129), (63, 64), (127, 128)];
    let shape = CorrShape {
        n_ants: 130,
        channels: 1,
        spectra: 65_664,
    };
    let cfg = CorrConfig {
        shape,
        batches: 16,
        in_bits: 8,
        path: CorrPath::Wgmma,
    };
    let mut ride = Correlator::riding(Arc::clone(gpu), cfg)?;
    let mut apart = Correlator::with_turn(Arc::clone(gpu), cfg)?;
    let st = &gpu.compute;
    let mut want: Vec<i64> = (0..cfg.acc_len())
        .map(|_| rng.random_range(-(1i64 << 40)..=1 << 40))
        .collect();
    let mut acc_ride: CudaSlice<i64> = st.clone_htod(&want)?;
    let mut acc_apart: CudaSlice<i64> = st.clone_htod(&want)?;
    for _ in 0..2 {
        let (bytes, x) = draw_samples(rng, 8, true, shape.input_len() * cfg.batches);
        // Each batch is its own group: batch j adds into accumulator j.
        for (j, x) in x.chunks_exact(shape.input_len()).enumerate() {
            let acc = &mut want[j * shape.vis_len()..][..shape.vis_len()];
            for (a1, a2) in SAMPLE {
                accumulate_baseline(shape, x, 0, a1, a2, acc);
            }
        }
        let input = st.clone_htod(&bytes)?;
        ride.correlate(&input.as_view(), &mut acc_ride)?;
        apart.correlate(&input.as_view(), &mut acc_apart)?;
    }
    let (got, other) = (st.clone_dtoh(&acc_ride)?, st.clone_dtoh(&acc_apart)?);
    let differ = got.iter().zip(&other).filter(|(g, o)| g != o).count();
    let sampled: Vec<usize> = (0..cfg.batches)
        .flat_map(|j| {
            SAMPLE.iter().flat_map(move |&(a1, a2)| {
                let o = j * shape.vis_len() + baseline_index(a1, a2) * 8;
                o..o + 8
            })
        })
        .collect();
    let off = sampled.iter().filter(|&&o| got[o] != want[o]).count();
    let rides = ride.rides() && !apart.rides() && !apart.fused();
    Ok(Check {
        name: format!(
            "correlate Wgmma ride vs apart {} ants {} ch {} t {} batch (groups of {})",
            shape.n_ants,
            shape.channels,
            shape.spectra,
            cfg.batches,
            cfg.group()
        ),
        measured: (differ + off) as f64,
        limit: 0.0,
        pass: differ == 0 && off == 0 && rides && cfg.group() == 1,
        note: format!(
            "int64 accumulators: {differ} of {} differ from the separate turn's, {off} of {} \
             sampled from the host's direct sums (extremes, two calls); {}",
            got.len(),
            sampled.len(),
            if rides {
                "riding against the separate turn"
            } else {
                "NOT riding against the separate turn"
            }
        ),
    })
}
