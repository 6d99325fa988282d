//! The shape of the F-engine's CUDA backend ([`super::cuda::GpuBackend`]) and its defaults,
//! and the conversions between the backend's and the device layer's errors.

use super::backend::BackendError;
use crate::dsp::postproc::OutputBits;
use crate::gpu::GpuError;

impl From<GpuError> for BackendError {
    fn from(e: GpuError) -> BackendError {
        BackendError(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for BackendError {
    fn from(e: cudarc::driver::DriverError) -> BackendError {
        BackendError(GpuError::from(e).to_string())
    }
}

/// The self-test and the benchmark drive the backend through the trait from code that
/// returns `GpuError`.
impl From<BackendError> for GpuError {
    fn from(e: BackendError) -> GpuError {
        GpuError::Backend(e.0)
    }
}

/// The unzip factor n of seed 000 §Unzipping the FFT: 4 from 8 channels up, else the largest
/// that leaves sub-transforms of at least 2 points.
pub fn default_unzip(channels: usize) -> usize {
    match channels {
        0..=2 => 1,
        3..=7 => 2,
        _ => 4,
    }
}

/// How a [`GpuBackend`] is shaped.
#[derive(Debug, Clone, Copy)]
pub struct GpuConfig {
    pub sample_bits: u32,
    /// Samples per polarisation in a chunk, and in its tail.
    pub body: usize,
    pub tail: usize,
    pub spectra_per_heap: usize,
    pub out_bits: OutputBits,
    pub unzip: usize,
    /// Heaps post-processed per launch (FFT and post-processing of a heap of few spectra
    /// leave the GPU idle; see [`default_batch`]).
    pub batch: usize,
    /// Output slots of `batch` heaps each in flight.
    pub depth: usize,
}

/// Heaps per back-end launch, and so per copy back: enough for 256 spectra, below which
/// post-processing was measured at a fraction of its bandwidth (bench/gpu-notes.md), and for
/// copies of at least [`MIN_COPY_BYTES`] (`heap_bytes` each heap), up to 16 heaps: one 4 MiB
/// heap per copy (4096 channels) cost about 30 µs per copy beyond what 32 MiB copies cost,
/// which held three outputs at 4096 channels to 84 % of the PCIe bound (bench/RESULTS.md).
pub fn default_batch(spectra_per_heap: usize, heap_bytes: usize) -> usize {
    let for_spectra = 256usize.div_ceil(spectra_per_heap.max(1));
    let for_copy = MIN_COPY_BYTES.div_ceil(heap_bytes.max(1)).min(16);
    for_spectra.max(for_copy).max(1)
}

/// Smallest copy back a launch should make (see [`default_batch`]).
pub const MIN_COPY_BYTES: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Heaps per launch for the engine's shapes (2²⁰ values per heap, 4 bytes each): 256
    /// spectra or 16 MiB, whichever needs more heaps, at most 16 for the copy's sake.
    #[test]
    fn default_batch_fills_spectra_and_copies() {
        // 4096 channels, 256 spectra: 4 MiB heaps, 4 of them make a 16 MiB copy.
        assert_eq!(default_batch(256, 4 << 20), 4);
        // 32768 channels, 32 spectra: 8 heaps for 256 spectra (32 MiB).
        assert_eq!(default_batch(32, 4 << 20), 8);
        // Small heaps: capped at 16 for the copy, unless the spectra need more.
        assert_eq!(default_batch(256, 64 << 10), 16);
        assert_eq!(default_batch(8, 64 << 10), 32);
        // A heap of 16 MiB or more is a whole copy.
        assert_eq!(default_batch(512, 32 << 20), 1);
    }
}
