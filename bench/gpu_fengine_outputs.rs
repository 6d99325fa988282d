//! The F-engine's whole path with several outputs on one input (issue 16; seed 000 §Multiple
//! outputs): one wideband and two narrowband outputs (MeerKAT L-band: 1712 MS/s, 10-bit
//! samples, chunks of 2^25 samples per polarisation; narrowband 32768 channels at decimation 8
//! and 16, discard mode, 16 × S DDC taps; every output 16 PFB taps, 8-bit out, dithered) as the
//! engine runs them: pinned chunks, each uploaded once into the slots every output shares
//! (`fengine::cuda_input`), every output's `Pipeline` over chunk c before any over chunk c+1,
//! heaps to pinned memory. The narrowband outputs use the DDC mapping the start-up tuner picks
//! on this device.
//!
//! The figure is input samples per second (both polarisations) against two bounds measured in
//! the same run just before: the host-to-device copy alone (1.25 B per sample in: what one
//! upload per chunk must carry) and both directions at once at this case's ratio of heap
//! bytes out to sample bytes in. The goal is ≥ 90 % of the PCIe bound.

use std::sync::Arc;
use std::time::Instant;

use cbf::dsp::pfb::Window;
use cbf::dsp::postproc::OutputBits;
use cbf::fengine::cuda::{
    default_batch, default_depth, default_unzip, wideband_batch, GpuBackend, GpuConfig,
};
use cbf::fengine::cuda_input::{InputShape, SharedInput};
use cbf::fengine::narrowband_output::NarrowbandOutput;
use cbf::fengine::output::{OutputSpec, WidebandOutput};
use cbf::fengine::pipeline::{ChunkView, Pipeline, PipelineConfig};
use cbf::fengine::place::InputLayout;
use cbf::gpu::ddc_tune::TuningCache;
use cbf::gpu::memory::HostRegistrations;
use cbf::gpu::timeline::Timeline;
use cbf::gpu::{Gpu, GpuError};
use num_complex::Complex32;

use super::{both_ways, fill, pinned, GB};

const ADC_RATE: f64 = 1712e6;
const BITS: u32 = 10;
/// Bytes per input sample.
const IN_BYTES: f64 = BITS as f64 / 8.0;

/// Host-to-device alone, and (H2D, D2H) at once with `out_per_in` bytes out per byte in:
/// GB/s, medians of five.
fn bounds(gpu: &Arc<Gpu>, out_per_in: f64) -> Result<(f64, f64, f64), GpuError> {
    let bin = 5usize << 28;
    let bout = ((bin as f64 * out_per_in) as usize).max(1 << 20);
    let hin = pinned(gpu, bin, 1)?;
    let mut hout = pinned(gpu, bout, 2)?;
    let mut din = gpu.h2d.alloc_zeros::<u8>(bin)?;
    let dout = gpu.d2h.alloc_zeros::<u8>(bout)?;
    let mut alone = Vec::new();
    for _ in 0..5 {
        gpu.ctx.synchronize()?;
        let t = Instant::now();
        gpu.h2d.memcpy_htod(&hin, &mut din)?;
        gpu.ctx.synchronize()?;
        alone.push(t.elapsed().as_secs_f64());
    }
    let h2d = bin as f64 / super::median(alone) / GB;
    let (both_h2d, both_d2h) = both_ways(gpu, &hin, &mut hout, &mut din, &dout)?;
    Ok((h2d, both_h2d, both_d2h))
}

/// One output as the engine configures it (16 taps, Hann, dithered, 2^20 values per heap).
fn outputs(wide_channels: usize) -> Result<Vec<OutputSpec>, GpuError> {
    let mut v = vec![OutputSpec::Wideband(WidebandOutput {
        name: "wide".into(),
        channels: wide_channels,
        dst: vec![],
        taps: 16,
        w_cutoff: 1.0,
        window: Window::Hann,
        dither: true,
        jones_per_batch: None,
    })];
    for (decimation, centre) in [(8, 400e6), (16, 600e6)] {
        let text = format!(
            "name=nb{decimation},channels=32768,centre_frequency={centre},decimation={decimation},\
             dst=239.1.1.1:7148"
        );
        v.push(OutputSpec::Narrowband(
            NarrowbandOutput::parse(&text).map_err(GpuError::Backend)?,
        ));
    }
    Ok(v)
}

/// Heap bytes out per sample byte in: per output 2 pols × channels × (re, im) bytes per
/// spectrum, every `spectra_samples` samples of each pol.
fn out_per_in(specs: &[OutputSpec]) -> f64 {
    specs
        .iter()
        .map(|o| 2.0 * o.channels() as f64 / o.shape().spectra_samples as f64 / IN_BYTES)
        .sum()
}

/// What one run measured.
pub struct MultiFigures {
    pub rate: f64,
    pub heaps: u64,
    pub tunings: Vec<String>,
}

/// `chunks` chunks (after 4 of warm-up) through the three outputs' pipelines.
pub fn whole_path_outputs(
    gpu: &Arc<Gpu>,
    wide_channels: usize,
    chunks: usize,
    timeline: bool,
) -> Result<MultiFigures, GpuError> {
    let layout = InputLayout {
        heap_samples: 4096,
        heap_bytes: 4096 * 10 / 8,
        chunk_samples: 1 << 25,
        mask_timestamp: false,
    };
    let specs = outputs(wide_channels)?;
    let pcfg = |o: &OutputSpec| -> Result<PipelineConfig, GpuError> {
        Ok(PipelineConfig {
            layout,
            sample_bits: BITS,
            spectra_per_heap: o.spectra_per_heap(1 << 20).map_err(GpuError::Backend)?,
            max_delay_diff: 0,
            gain: Complex32::new(0.05, 0.0),
            dither_seed: 9,
            out_bits: OutputBits::Eight,
        })
    };
    let mut tail = 0;
    for o in &specs {
        tail = tail.max(pcfg(o)?.tail(o.shape()));
    }
    let input = SharedInput::new(
        gpu,
        InputShape {
            sample_bits: BITS,
            body: layout.chunk_samples as usize,
            tail,
        },
    )?;
    let mut cache = TuningCache::in_memory();
    let mut tunings = Vec::new();
    let tl = timeline.then(|| {
        let mut t = Timeline::default();
        t.enable();
        t
    });
    let mut pipelines = Vec::new();
    for o in specs {
        let cfg = pcfg(&o)?;
        let sph = cfg.spectra_per_heap;
        let wideband = matches!(o, OutputSpec::Wideband(_));
        // As `fengine::pipelines` picks them.
        let batch = if wideband {
            wideband_batch(sph, o.channels(), layout.chunk_samples as usize)
        } else {
            default_batch(sph, false)
        };
        let gcfg = GpuConfig {
            sample_bits: BITS,
            body: layout.chunk_samples as usize,
            tail: cfg.tail(o.shape()),
            spectra_per_heap: sph,
            out_bits: OutputBits::Eight,
            unzip: default_unzip(o.channels()),
            batch,
            depth: default_depth(sph, wideband),
            peer: false,
        };
        let mut backend = match &o {
            OutputSpec::Wideband(w) => GpuBackend::wideband(&input, w, gcfg)?,
            OutputSpec::Narrowband(n) => {
                GpuBackend::narrowband_on(&input, n, gcfg, ADC_RATE, &mut |g, shape| {
                    let t = cache.tuning(g, shape);
                    tunings.push(format!(
                        "S {} taps {}: C{} G{} SG{}",
                        shape.subsampling, shape.taps, t.coarsen, t.groups, t.subgroup
                    ));
                    t
                })?
            }
        };
        if let Some(t) = &tl {
            backend.record_into(t);
        }
        pipelines.push(Pipeline::with_backend(o, cfg, Box::new(backend)));
    }
    let bytes = 2 * layout.pol_bytes();
    let mut bufs: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let mut b = vec![0u8; bytes];
            fill(&mut b, 20 + i);
            b
        })
        .collect();
    let mut pins = HostRegistrations::new(Arc::clone(gpu));
    for b in &mut bufs {
        // SAFETY: `bufs` outlives `pins` (dropped first, below) and is never resized.
        unsafe { pins.register(b) }?;
    }
    let present = vec![1u8; 2 * layout.heaps_per_pol()];
    let (mut heaps, mut check) = (0u64, 0u64);
    let warm = 4;
    let mut t0 = Instant::now();
    for id in 0..chunks + warm {
        if id == warm {
            t0 = Instant::now();
        }
        let view = |i: usize| ChunkView {
            chunk_id: i as u64,
            data: &bufs[i % 3],
            present: &present,
        };
        for p in &mut pipelines {
            p.process(view(id), Some(view(id + 1)), |h| {
                heaps += 1;
                if let Some(d) = h.data.host() {
                    check = check.wrapping_add(u64::from(d[d.len() / 2]));
                }
            })?;
        }
    }
    for p in &mut pipelines {
        p.flush(|_| heaps += 1)?;
    }
    let t = t0.elapsed().as_secs_f64();
    std::hint::black_box(check);
    drop(pipelines);
    drop(pins);
    if let Some(tl) = tl {
        super::print_timeline(&tl)?;
    }
    Ok(MultiFigures {
        rate: (chunks as u64 * 2 * layout.chunk_samples) as f64 / t,
        heaps,
        tunings,
    })
}

/// Run the case for each wideband size and print it against the bounds measured just before.
pub fn report(gpu: &Arc<Gpu>, quick: bool, timeline: bool) -> Result<(), GpuError> {
    for wide in [4096, 32768] {
        let ratio = out_per_in(&outputs(wide)?);
        let (h2d, both_h2d, both_d2h) = bounds(gpu, ratio)?;
        let h2d_bound = h2d / IN_BYTES * GB;
        let pcie_bound = (both_h2d / IN_BYTES).min(both_d2h / (ratio * IN_BYTES)) * GB;
        let f = whole_path_outputs(gpu, wide, if quick { 100 } else { 300 }, timeline)?;
        println!(
            "whole path, 3 outputs (wide {wide} ch + nb 32768 ch dec 8 + dec 16, 16 taps, 10-bit in, 8-bit out, {:.3} B out per B in; DDC {}): {:.2} GS/s = {:.0}% of the H2D bound ({:.2} GS/s at {:.1} GB/s alone), {:.0}% of the PCIe bound both ways ({:.2} GS/s: H2D {:.1} GB/s, D2H {:.1} GB/s at once); {} heaps",
            ratio,
            f.tunings.join(", "),
            f.rate / GB,
            100.0 * f.rate / h2d_bound,
            h2d_bound / GB,
            h2d,
            100.0 * f.rate / pcie_bound,
            pcie_bound / GB,
            both_h2d,
            both_d2h,
            f.heaps,
        );
    }
    Ok(())
}
