//! The device's float16 encoding of FRB beams (`gpu::f16_encode`) against the host's
//! (`dsp::frb_fast::encode_f16`, block-wise through F16C or software rounding): every value's
//! bytes and each call's saturation count, bit for bit, over values spread across fp16's normal,
//! subnormal and saturating ranges, rows of their own scales (one row's a power of two, one
//! not), a row length that leaves the last warp partial, and NaN-free input (a NaN's payload may
//! differ between the two; stage 2 writes none).

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Check;
use crate::dsp::frb_fast::encode_f16;
use crate::gpu::f16_encode::F16Encoder;
use crate::gpu::{Gpu, GpuError};

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xf16e);
    let mut checks = Vec::new();
    for (rows, row_len) in [(3usize, 1000usize), (7, 33), (1, 70_001)] {
        // Magnitudes 2⁻³⁰ … 2³⁰ of either sign, so that the scaled values fall in every range.
        let input: Vec<f32> = (0..rows * row_len)
            .map(|_| {
                let m: f32 = rng.random_range(1.0..2.0);
                let e: i32 = rng.random_range(-30..30);
                if rng.random_bool(0.5) {
                    m * 2f32.powi(e)
                } else {
                    -m * 2f32.powi(e)
                }
            })
            .collect();
        let scales: Vec<f32> = (0..rows)
            .map(|r| match r % 3 {
                0 => 0.25,
                1 => 3.7e-3,
                _ => rng.random_range(0.5..8.0),
            })
            .collect();
        let mut want = vec![0u8; 2 * input.len()];
        let mut want_clips = 0;
        for ((x, o), &s) in input
            .chunks_exact(row_len)
            .zip(want.chunks_exact_mut(2 * row_len))
            .zip(&scales)
        {
            want_clips += encode_f16(x, s, o);
        }
        let st = &gpu.compute;
        let d_in = st.clone_htod(&input)?;
        let d_scales = st.clone_htod(&scales)?;
        let mut d_out = st.alloc_zeros::<u8>(want.len())?;
        let mut d_clips = st.alloc_zeros::<u64>(1)?;
        let encoder = F16Encoder::new(gpu, rows, row_len)?;
        encoder.encode(
            &d_in.as_view(),
            &d_scales,
            &mut d_out,
            &mut d_clips,
            row_len,
        )?;
        let got = st.clone_dtoh(&d_out)?;
        let clips = st.clone_dtoh(&d_clips)?[0];
        let differ = got
            .chunks_exact(2)
            .zip(want.chunks_exact(2))
            .filter(|(a, b)| a != b)
            .count();
        let saturated = want_clips > 0 && (want_clips as usize) < input.len();
        checks.push(Check {
            name: format!("frb float16 encoding {rows} rows × {row_len}"),
            measured: differ as f64,
            limit: 0.0,
            pass: differ == 0 && clips == want_clips && saturated,
            note: format!(
                "values whose bytes differ from the host's encode_f16: {differ} of {}; saturated {clips} (host {want_clips})",
                input.len()
            ),
        });
    }
    Ok(checks)
}
