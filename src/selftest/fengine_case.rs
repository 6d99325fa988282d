//! The small wideband F-engine case that the `peerdirect` and `vkgdr` families run the engine's
//! pipeline on twice (once as the default path, once as theirs) and compare byte for byte:
//! 10-bit samples, 1024 channels, 256 spectra per heap, two heaps per chunk.

use num_complex::Complex32;

use crate::dsp::postproc::OutputBits;
use crate::dsp::samples::packed_len;
use crate::fengine::cuda::{default_unzip, GpuConfig};
use crate::fengine::output::WidebandOutput;
use crate::fengine::pipeline::PipelineConfig;
use crate::fengine::place::InputLayout;
use crate::gpu::GpuError;

pub const BITS: u32 = 10;
pub const CHANNELS: usize = 1024;
pub const SPECTRA: usize = 256;
/// Samples per pol in a chunk: two heaps.
pub const CHUNK_SAMPLES: usize = 2 * SPECTRA * 2 * CHANNELS;
/// Samples per input heap.
pub const HEAP_SAMPLES: usize = 4096;

/// The output `name` and the pipeline's configuration (8-bit output, gain 0.05, dither from
/// `dither_seed`), and the tail the output reads past each chunk.
pub fn wideband(
    name: &str,
    dither_seed: u64,
) -> Result<(WidebandOutput, PipelineConfig, usize), GpuError> {
    let out = WidebandOutput::parse(&format!(
        "name={name},channels={CHANNELS},dst=239.1.1.1:7148,taps=16"
    ))
    .map_err(GpuError::Backend)?;
    let pcfg = PipelineConfig {
        layout: InputLayout {
            heap_samples: HEAP_SAMPLES as u64,
            heap_bytes: packed_len(HEAP_SAMPLES, BITS) as u64,
            chunk_samples: CHUNK_SAMPLES as u64,
            mask_timestamp: false,
        },
        sample_bits: BITS,
        spectra_per_heap: SPECTRA,
        max_delay_diff: HEAP_SAMPLES,
        gain: Complex32::new(0.05, 0.0),
        dither_seed,
        out_bits: OutputBits::Eight,
    };
    let tail = pcfg.tail(out.shape());
    Ok((out, pcfg, tail))
}

/// The CUDA backend's configuration for this case with the `tail` `wideband` gives: output
/// slots of `batch` heaps, `depth` of them, heaps left on the device where `peer`.
pub fn gpu_config(tail: usize, batch: usize, depth: usize, peer: bool) -> GpuConfig {
    GpuConfig {
        sample_bits: BITS,
        body: CHUNK_SAMPLES,
        tail,
        spectra_per_heap: SPECTRA,
        out_bits: OutputBits::Eight,
        unzip: default_unzip(CHANNELS),
        batch,
        depth,
        peer,
    }
}
