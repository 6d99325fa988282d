//! The post-processing op (`kernels/postproc.cu`; seed 000 §Postprocessing): the last
//! Cooley–Tukey round and the real-to-complex fix-up of the unzipped FFT, complex gains, fine
//! delay and phase, dither, saturating quantisation, clip counts, and the transpose to
//! (channel, spectrum, pol, re/im), for a batch of heaps. The GPU body of `dsp::postproc`.
//!
//! Buffers: `out` u8 [heap] channels × heap spectra × 2 pols × (re, im) (8-bit, or 4-bit
//! packed), written; `frames` f32 the FFT output, read; `gains` [heap][pol][channel] complex
//! f32; `phase` (mapped) [pol][spectrum] pairs (x, y) with θ_k/π = x·k + y; `ts0` (mapped)
//! [heap] first timestamps (the dither key); `power` u64 [heap][pol] moved into `stats`;
//! `stats` u64 [heap][clips pol 0, clips pol 1, power 0, power 1], clip counts accumulated.
//!
//! A narrowband shape ([`PostprocShape::narrowband`]) compiles `postproc_nb` instead: no unzip
//! or real-to-complex fix-up, the kept channels taken around DC of a C2C transform.
//!
//! The mapped `phase` and `ts0` are read once per launch, by `postproc_params` into device
//! copies the op owns: the host writes them without a copy queued behind the chunk transfers
//! (seed 000 §Postprocessing), and the blocks then read device memory, not the host's.

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{Defines, Kernel};
use super::{Gpu, GpuError};
use crate::dsp::postproc::OutputBits;

/// The compile-time shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostprocShape {
    pub channels: usize,
    pub unzip: usize,
    /// Spectra of the whole batch, and of one heap.
    pub spectra: usize,
    pub heap_spectra: usize,
    pub out_bits: OutputBits,
    pub dither: bool,
    /// Digitiser samples from one spectrum to the next (the dither key's timestamps).
    pub spectrum_samples: usize,
    /// Narrowband: the C2C transform's length M, of which `channels` are kept.
    pub narrowband: Option<usize>,
}

/// The compiled kernels, their grids and the device copies of the per-launch parameters
/// (one set: launches on one stream run in order).
pub struct Postproc {
    func: CudaFunction,
    params: CudaFunction,
    grid: (u32, u32, u32),
    params_blocks: u32,
    phase: CudaSlice<f32>,
    ts0: CudaSlice<i64>,
}

impl Postproc {
    pub fn new(gpu: &Gpu, s: PostprocShape) -> Result<Postproc, GpuError> {
        let n = s.unzip;
        // s in [0, m/2) in tiles; s = m/2 in a column of its own (the grid's last).
        let values_of_s = s.channels / n / 2;
        // Blocks of 32 values of s × 32 spectra, unless that leaves the GPU short of blocks
        // (a heap of few spectra, as at 32768 channels): then 8 values of s.
        let stile = if values_of_s.div_ceil(32) * s.spectra.div_ceil(32) >= 1024 {
            32
        } else {
            8
        };
        let mut defs: Defines = vec![
            ("CHANNELS", s.channels as i64),
            ("UNZIP", n as i64),
            ("SPECTRA", s.spectra as i64),
            ("HEAP_SPECTRA", s.heap_spectra as i64),
            ("STILE", stile as i64),
            (
                "OUT_BITS",
                if s.out_bits == OutputBits::Four { 4 } else { 8 },
            ),
            ("DITHER", i64::from(s.dither)),
            ("SPECTRUM_SAMPLES", s.spectrum_samples as i64),
        ];
        let (entry, grid) = match s.narrowband {
            None => (
                "postproc",
                (
                    values_of_s.div_ceil(stile) as u32 + 1,
                    s.spectra.div_ceil(32) as u32,
                    1,
                ),
            ),
            Some(m) => {
                defs.push(("FFT_LEN", m as i64));
                (
                    "postproc_nb",
                    (
                        s.channels.div_ceil(32) as u32,
                        s.spectra.div_ceil(32) as u32,
                        1,
                    ),
                )
            }
        };
        Ok(Postproc {
            func: gpu.function_entry(Kernel::Postproc, &defs, entry)?,
            params: gpu.function_entry(Kernel::Postproc, &defs, "postproc_params")?,
            params_blocks: (2 * s.spectra).div_ceil(256) as u32,
            phase: gpu.compute.alloc_zeros(4 * s.spectra)?,
            ts0: gpu.compute.alloc_zeros(s.spectra / s.heap_spectra)?,
            grid,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        st: &CudaStream,
        out: &mut CudaSlice<u8>,
        frames: &CudaSlice<f32>,
        gains: &CudaSlice<f32>,
        phase_dev: u64,
        ts0_dev: u64,
        seed: u64,
        power: &mut CudaSlice<u64>,
        stats: &mut CudaSlice<u64>,
    ) -> Result<(), GpuError> {
        let cfg = LaunchConfig {
            grid_dim: self.grid,
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut p = st.launch_builder(&self.params);
        p.arg(&mut self.phase)
            .arg(&mut self.ts0)
            .arg(&phase_dev)
            .arg(&ts0_dev);
        // SAFETY: the arguments match postproc_params' signature; the device copies hold
        // 2·SPECTRA pairs and SPECTRA / HEAP_SPECTRA timestamps, as do the caller's mapped
        // allocations, which are live.
        unsafe {
            p.launch(LaunchConfig {
                grid_dim: (self.params_blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        let mut b = st.launch_builder(&self.func);
        b.arg(out)
            .arg(frames)
            .arg(gains)
            .arg(&self.phase)
            .arg(&self.ts0)
            .arg(&seed)
            .arg(power)
            .arg(stats);
        // SAFETY: the arguments match postproc's (and postproc_nb's) signature and the sizes it
        // was compiled for (CHANNELS, FFT_LEN, SPECTRA, HEAP_SPECTRA).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
