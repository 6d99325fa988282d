//! The narrowband CUDA backend (DDC, complex PFB, C2C cuFFT, narrowband post-processing,
//! copies) against the CPU narrowband backend, whose DDC is `dsp::ddc_fast` (f32, tested
//! against the f64 oracle `dsp::ddc` with katgpucbf's DDC tolerances), over
//! one chunk: discard and no-discard modes, several sample widths, both output widths, with
//! and without dither, gains changed for one heap, fine delays and phases per spectrum,
//! coarse delays (multiples of the subsampling) changing inside a heap.
//!
//! Tolerance: every value within ±1 LSB, the differences unbiased (as for wideband), and at
//! most 1 value in 10³ off (wideband allows 1 in 10⁴): both DDCs accumulate in f32, in
//! different orders, each within ~10⁻⁷·2^bits of the f64 oracle (below the DDC self-test's
//! RMS bound of 2·10⁻⁶·2^bits), which moves a value across a rounding boundary more often
//! than the wideband path's float-exact PFB does.
//! Clip counts may differ by the values off by one plus 1 in 10³ of the clips (a value within
//! rounding of the clip level clips on one side only).

use std::sync::Arc;

use num_complex::Complex32;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::backends::{drive_both, heap_inputs, values};
use super::fengine::chunks;
use super::Check;
use crate::dsp::postproc::{OutputBits, SpectrumDelay};
use crate::fengine::backend::ChunkInput;
use crate::fengine::cuda::{GpuBackend, GpuConfig};
use crate::fengine::narrowband::{NarrowbandBackend, NarrowbandSizes};
use crate::fengine::narrowband_output::NarrowbandOutput;
use crate::gpu::{Gpu, GpuError};

const ADC_RATE: f64 = 1712e6;

#[derive(Clone, Copy)]
struct Case {
    channels: usize,
    decimation: usize,
    /// Extra sub-options (`pass_bandwidth=…` selects no-discard mode).
    extra: &'static str,
    bits: u32,
    out_bits: OutputBits,
    dither: bool,
    /// Output level: the gains put the RMS of the output values (each part) near this.
    level: f32,
}

fn output(c: &Case) -> NarrowbandOutput {
    let text = format!(
        "name=nb,channels={},centre_frequency=3.1e8,decimation={},dst=239.1.1.1:7148,taps=4,\
         dither={}{}",
        c.channels,
        c.decimation,
        if c.dither { "uniform" } else { "none" },
        c.extra
    );
    NarrowbandOutput::parse(&text).expect("the self-test's narrowband output parses")
}

fn check(gpu: &Arc<Gpu>, rng: &mut SmallRng, c: &Case) -> Result<Check, GpuError> {
    let o = output(c);
    let shape = o.shape();
    let (s, m) = (o.subsampling(), o.internal_channels());
    let step = shape.spectra_samples;
    let (hs, heaps, batch) = (16, 4, 2);
    let total = hs * heaps;
    let tail = shape.window.next_multiple_of(step) + step;
    let body = (total + 4) * step;
    let ch = chunks(rng, body, tail, c.bits, false);
    let sizes = NarrowbandSizes {
        adc_sample_rate: ADC_RATE,
        sample_bits: c.bits,
        body,
        tail,
        spectra_per_heap: hs,
        out_bits: c.out_bits,
    };
    let mut cb = NarrowbandBackend::new(&o, sizes).map_err(|e| GpuError::Backend(e.to_string()))?;
    let mut gb = GpuBackend::narrowband(
        Arc::clone(gpu),
        &o,
        GpuConfig {
            sample_bits: c.bits,
            body,
            tail,
            spectra_per_heap: hs,
            out_bits: c.out_bits,
            unzip: 1,
            batch,
            depth: 2,
            peer: false,
        },
        ADC_RATE,
    )?;
    // Window starts: multiples of S, a coarse-delay jump half way (different per pol).
    let st: [Vec<usize>; 2] = [(3usize, 1usize), (0, 5)].map(|(base, jump)| {
        (0..total)
            .map(|k| (base + k * m + if k >= total / 2 { jump } else { 0 }) * s)
            .collect()
    });
    // Output RMS ≈ level: uniform samples have RMS 2^(bits−1)/√3. The DDC filter, normalised
    // to gain √S after subsampling, keeps about 1/S of white input's power (half of it in
    // discard mode, where the outer half of the PFB's channels is dropped), and the PFB's
    // weights (Σw² = 1 per column) and the unnormalised M-point FFT leave the power per channel
    // unchanged: about 0.75·RMS_in in each part (measured on the H100 with unit gains: 0.68 to
    // 0.78 over this self-test's cases).
    let rms_in = f64::from(1u32 << (c.bits - 1)) / 3f64.sqrt();
    let rms_out = 0.75 * rms_in;
    let g = c.level / rms_out as f32;
    let mut random_gains = || -> [Vec<Complex32>; 2] {
        [0, 1].map(|_| {
            (0..c.channels)
                .map(|_| {
                    Complex32::from_polar(
                        g * rng.random_range(0.5..1.5f32),
                        rng.random_range(-3.2..3.2f32),
                    )
                })
                .collect()
        })
    };
    let (gains_a, gains_b) = (random_gains(), random_gains());
    let delays: [Vec<SpectrumDelay>; 2] = [0, 1].map(|p| {
        (0..total)
            .map(|k| SpectrumDelay {
                coarse: (st[p][k] / s) as i64 % 5,
                fine: rng.random_range(-0.5..0.5) * s as f64,
                phase: rng.random_range(-3.2..3.2),
            })
            .collect()
    });
    let ts: Vec<Vec<i64>> = (0..heaps)
        .map(|h| {
            (0..hs)
                .map(|k| (1 << 40) + ((h * (hs + 3) + k) * step) as i64)
                .collect()
        })
        .collect();
    let seed = c.dither.then(|| rng.random::<u64>());
    let inputs = heap_inputs([&gains_a, &gains_b], &delays, &ts, hs, seed);
    let chunk = ChunkInput {
        id: 0,
        data: &ch.data,
        next: Some(&ch.next),
    };
    let [got, want] = drive_both(&mut gb, &mut cb, chunk, &inputs, &st, hs)?;
    let (mut worst, mut off, mut count, mut signed) = (0, 0usize, 0usize, 0i64);
    let (mut clips_g, mut clips_c, mut sq) = ([0u64; 2], [0u64; 2], 0f64);
    for (g, w) in got.iter().zip(&want) {
        let (gv, wv) = (values(c.out_bits, &g.0), values(c.out_bits, &w.0));
        if gv.len() != wv.len() || g.2 != w.2 {
            worst = 99;
        }
        for (a, b) in gv.iter().zip(&wv) {
            worst = worst.max((a - b).abs());
            off += usize::from(a != b);
            signed += i64::from(a - b);
            sq += f64::from(*b) * f64::from(*b);
        }
        count += gv.len();
        for p in 0..2 {
            clips_g[p] += g.1[p];
            clips_c[p] += w.1[p];
        }
    }
    let few = off <= (count / 1000).max(16);
    let unbiased = (signed.unsigned_abs() as f64) <= 3.0 * (off as f64).sqrt() + 3.0;
    let clip_diff: u64 = (0..2).map(|p| clips_g[p].abs_diff(clips_c[p])).sum();
    let clips_ok = clip_diff <= off as u64 + (clips_c[0] + clips_c[1]) / 1000;
    let rms = (sq / count.max(1) as f64).sqrt();
    Ok(Check {
        name: format!(
            "narrowband {} ch dec {} {} {}-bit in {}-bit out{}",
            c.channels,
            c.decimation,
            if o.discard() { "discard" } else { "no-discard" },
            c.bits,
            if c.out_bits == OutputBits::Four { 4 } else { 8 },
            if c.dither { " dither" } else { "" },
        ),
        measured: f64::from(worst),
        limit: 1.0,
        pass: worst <= 1 && few && unbiased && clips_ok,
        note: format!(
            "{off}/{count} values off by 1{}, sum of differences {signed}{}; clips {clips_g:?} vs {clips_c:?}{}; output rms {rms:.1}",
            if few { "" } else { " TOO MANY" },
            if unbiased { "" } else { " BIASED" },
            if clips_ok { "" } else { " WRONG" },
        ),
    })
}

pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x0a77_0ba4);
    let base = Case {
        channels: 128,
        decimation: 8,
        extra: "",
        bits: 10,
        out_bits: OutputBits::Eight,
        dither: true,
        level: 20.0,
    };
    [
        base,
        Case {
            dither: false,
            bits: 8,
            ..base
        },
        Case {
            out_bits: OutputBits::Four,
            level: 2.0,
            bits: 12,
            ..base
        },
        Case {
            level: 90.0,
            ..base
        },
        // No-discard as tests/narrowband_dsp.rs designs it (¾ of the band flat; remez does not
        // converge for every band split).
        Case {
            channels: 64,
            decimation: 4,
            extra: ",pass_bandwidth=160.5e6",
            ..base
        },
        Case {
            channels: 256,
            decimation: 3,
            extra: ",pass_bandwidth=214e6,ddc_taps=160,weight_pass=0.05",
            bits: 16,
            ..base
        },
    ]
    .iter()
    .map(|c| check(gpu, &mut rng, c))
    .collect()
}
