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
    /// Send the heaps from the output slots in device memory, which the NIC reads
    /// (`--use-peerdirect`), instead of copying them to the host.
    pub peer: bool,
}

/// Heaps per back-end launch: enough for 256 spectra, below which post-processing was
/// measured at a fraction of its bandwidth (bench/gpu-notes.md v7), and 1024 where heaps have
/// 256 spectra or more (4096 channels and fewer at katgpucbf's 2²⁰ samples per heap), whose
/// PFB launches of one 256-spectrum heap reached only ≈ 30 % of the copy bandwidth (v15). Not
/// 1024 for smaller heaps: with 32-spectrum heaps (32768 channels) such batches cut the
/// three-output whole path from ≈ 105 % to ≈ 87 % of the PCIe bound (v16).
pub fn default_batch(spectra_per_heap: usize) -> usize {
    let spectra: usize = if spectra_per_heap >= 256 { 1024 } else { 256 };
    spectra.div_ceil(spectra_per_heap).max(1)
}

/// Output slots of [`default_batch`] heaps in flight: about 8 heaps kept the copies busy in
/// every run (bench/RESULTS.md), in at least two slots, and four where a batch is 1024
/// spectra (two slots of them held back the three-output whole path, v16).
pub fn default_depth(spectra_per_heap: usize) -> usize {
    let batch = default_batch(spectra_per_heap);
    let min = if batch * spectra_per_heap >= 1024 {
        4
    } else {
        2
    };
    (8 / batch).max(min)
}

/// Output slots with `--use-peerdirect` (seed 000 §PeerDirect: more OutItems, since one is
/// held until the NIC has sent it rather than until it is copied): twice [`default_depth`],
/// so that the slots the send thread holds (a batch's heaps go out over the batch's span)
/// leave as many for the compute as without it. Not yet tuned on hardware.
pub fn peer_depth(spectra_per_heap: usize) -> usize {
    2 * default_depth(spectra_per_heap)
}
