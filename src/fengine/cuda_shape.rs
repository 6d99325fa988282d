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

/// Heaps per back-end launch. Narrowband: enough for 256 spectra, below which
/// post-processing was measured at a fraction of its bandwidth (bench/gpu-notes.md v7), 1024
/// where heaps have 256 spectra or more. Wideband: 4096 spectra where heaps have 256 or more
/// (4096 channels and fewer at katgpucbf's 2²⁰ samples per heap: a whole 2²⁵-sample chunk at
/// 4096 channels), 512 below (32768 channels: a chunk). The PFB's launches of 1024 and 256
/// spectra reached only 68 % and 75 % of the copy bandwidth, a launch of ~35 µs paying its
/// ramp and drain; at 4096 and 512 spectra they reach 81 and 80 % at the engine's section of 64
/// (v18). Not larger for the narrowband outputs: with their 32-spectrum heaps, 1024-spectrum
/// batches cut the three-output whole path from ≈ 105 % to ≈ 87 % of the PCIe bound (v16).
/// A wideband output takes at most a chunk's heaps ([`wideband_batch`]).
pub fn default_batch(spectra_per_heap: usize, wideband: bool) -> usize {
    let large = spectra_per_heap >= 256;
    let spectra: usize = match (wideband, large) {
        (true, true) => 4096,
        (true, false) => 512,
        (false, true) => 1024,
        (false, false) => 256,
    };
    spectra.div_ceil(spectra_per_heap).max(1)
}

/// [`default_batch`] of a wideband output of `channels` channels on chunks of `chunk_samples`
/// samples per pol, capped at a chunk's heaps (a heap is `spectra_per_heap` spectra of
/// 2·`channels` samples): with chunks smaller than 2²⁵ samples (`--recv-chunk-samples`) a
/// larger batch would only hold its output slot across chunks, each chunk's PFB launching
/// apart anyway.
pub fn wideband_batch(spectra_per_heap: usize, channels: usize, chunk_samples: usize) -> usize {
    let chunk_heaps = chunk_samples / (2 * channels * spectra_per_heap);
    default_batch(spectra_per_heap, true)
        .min(chunk_heaps)
        .max(1)
}

/// Output slots of [`default_batch`] heaps in flight: about 8 heaps kept the copies busy in
/// every run (bench/RESULTS.md), in at least two slots, and four where a batch is 512 spectra
/// or more (two slots of 1024 held back the three-output whole path, v16; at 32768 channels
/// two slots of 512 measured 84, 93, 94 and 109 % of the PCIe bound, four 95–115 %, v18).
pub fn default_depth(spectra_per_heap: usize, wideband: bool) -> usize {
    let batch = default_batch(spectra_per_heap, wideband);
    let min = if batch * spectra_per_heap >= 512 {
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
pub fn peer_depth(spectra_per_heap: usize, wideband: bool) -> usize {
    2 * default_depth(spectra_per_heap, wideband)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wideband batch never holds more heaps than one chunk (else its launch would wait for
    /// a second chunk), and is a whole chunk at katgpucbf's shapes.
    #[test]
    fn a_wideband_batch_fits_in_a_chunk() {
        for log2_chunk in 18..=27 {
            let chunk = 1usize << log2_chunk;
            for channels in [1024, 4096, 8192, 32768, 65536] {
                let sph = (1 << 20) / channels;
                let chunk_heaps = chunk / (2 * channels * sph);
                let batch = wideband_batch(sph, channels, chunk);
                assert!(batch >= 1);
                assert!(
                    batch <= chunk_heaps.max(1),
                    "{channels} ch, 2^{log2_chunk}: {batch} heaps of {chunk_heaps}"
                );
            }
        }
        // At katgpucbf's shapes and the default 2²⁵-sample chunk a launch is the whole chunk
        // (bench/gpu-notes.md v18: 16 heaps, 80 % of copy where 4 and 8 heaps gave 68–77 %).
        for channels in [4096, 32768] {
            let sph = (1 << 20) / channels;
            assert_eq!(wideband_batch(sph, channels, 1 << 25), 16, "{channels} ch");
        }
    }
}
