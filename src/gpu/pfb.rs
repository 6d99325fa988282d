//! The fused decode + PFB FIR op (`kernels/pfb.cu`; seed 000 §Decode, §Polyphase Filter Bank,
//! §Digitiser sample statistics), the GPU body of `dsp::samples::unpack` + `dsp::pfb::pfb_fir`.
//!
//! Buffers: `input` u8, polarisation p's packed samples at byte p·`pol_stride` (body, tail,
//! one padding byte); `weights` f32 TAPS × 2N tap-major (`dsp::pfb::pfb_weights`); `frames`
//! f32 [pol][spectra][2N] in the unzip order (each z^r contiguous, see the kernel), written;
//! `power` u64 [heap][pol] Σx², accumulated.

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{Defines, Kernel};
use super::{Gpu, GpuError};

/// The compile-time shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfbShape {
    pub channels: usize,
    pub taps: usize,
    pub sample_bits: u32,
    pub unzip: usize,
    /// Spectra the frames buffer holds per polarisation, and spectra per heap (a launch may
    /// cover several heaps; each has its own power counter).
    pub spectra: usize,
    pub heap_spectra: usize,
}

/// One launch: `count` consecutive spectra into frame slots k.. (across heaps), of one polarisation
/// (`first_pol`, `pols` = 1) or both (`pols` = 2), windows starting at sample `starts[p]`.
#[derive(Debug, Clone, Copy)]
pub struct PfbRun {
    pub first_pol: usize,
    pub pols: usize,
    pub starts: [usize; 2],
    pub pol_stride: usize,
    pub k: usize,
    pub count: usize,
    /// Spectra per thread.
    pub section: usize,
}

/// The compiled kernel.
pub struct Pfb {
    func: CudaFunction,
    step: usize,
    taps: usize,
    /// Bytes of shared memory per staged window row, or `None` where the kernel reads global
    /// memory directly (rows of fractional bytes, or fewer than 256 columns).
    staged_row: Option<usize>,
}

/// Threads (columns) per block.
const BLOCK: usize = 256;

/// The kernel's `SROW`: a block's 256 samples of a row, 15 bytes of alignment slop and the
/// byte after them, in 16-byte units.
fn staged_row_bytes(sample_bits: u32) -> usize {
    (BLOCK * sample_bits as usize / 8 + 17).next_multiple_of(16)
}

/// Blocks a launch should have before its section is shortened no further: two waves of
/// four 256-thread blocks per SM on a 132-SM H100.
const FULL_GRID: usize = 1024;

/// The shortest section the split goes to: shorter ones re-read a larger share of history
/// (TAPS − 1 rows per section) than the extra blocks gain.
const MIN_SPLIT_SECTION: usize = 32;

/// Shared memory a block may take without opting in to more (CUDA's default limit).
const SHARED_LIMIT: usize = 48 * 1024;

impl Pfb {
    pub fn new(gpu: &Gpu, s: PfbShape) -> Result<Pfb, GpuError> {
        let defs: Defines = vec![
            ("CHANNELS", s.channels as i64),
            ("TAPS", s.taps as i64),
            ("SAMPLE_BITS", i64::from(s.sample_bits)),
            ("UNZIP", s.unzip as i64),
            ("SPECTRA", s.spectra as i64),
            ("HEAP_SPECTRA", s.heap_spectra as i64),
        ];
        let step = 2 * s.channels;
        let whole_rows = (step * s.sample_bits as usize) % 8 == 0;
        Ok(Pfb {
            func: gpu.function(Kernel::Pfb, &defs)?,
            step,
            taps: s.taps,
            staged_row: (whole_rows && step % BLOCK == 0).then(|| staged_row_bytes(s.sample_bits)),
        })
    }

    /// Filter taps.
    pub fn taps(&self) -> usize {
        self.taps
    }

    pub fn launch(
        &self,
        st: &CudaStream,
        frames: &mut CudaSlice<f32>,
        input: &CudaSlice<u8>,
        weights: &CudaSlice<f32>,
        power: &mut CudaSlice<u64>,
        run: PfbRun,
    ) -> Result<(), GpuError> {
        let mut section = run.section.clamp(1, run.count.max(1));
        // A launch of few spectra (a small or partly filled batch) gets shorter sections, down
        // to 32, until it has a few waves of blocks: at 4096 channels a batch of 512 spectra in
        // sections of 128 gave an H100 256 blocks for its 528 slots (bench/gpu-notes.md v15).
        let columns = self.step.div_ceil(BLOCK) * run.pols;
        while section > MIN_SPLIT_SECTION && columns * run.count.div_ceil(section) < FULL_GRID {
            section /= 2;
        }
        let mut shared = 0;
        if let Some(row) = self.staged_row {
            // A staged block holds its section's window rows: fewer spectra per block where
            // they would not fit.
            section = section.min((SHARED_LIMIT / row).saturating_sub(self.taps - 1).max(1));
            shared = (section + self.taps - 1) * row;
        }
        let cfg = LaunchConfig {
            grid_dim: (
                self.step.div_ceil(BLOCK) as u32,
                run.count.div_ceil(section) as u32,
                run.pols as u32,
            ),
            block_dim: (BLOCK as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let in_len = input.len() as i64;
        let (s0, s1, stride) = (
            run.starts[0] as i64,
            run.starts[1] as i64,
            run.pol_stride as i64,
        );
        let (first, k, count, section) = (
            run.first_pol as i32,
            run.k as i32,
            run.count as i32,
            section as i32,
        );
        let mut b = st.launch_builder(&self.func);
        b.arg(frames)
            .arg(input)
            .arg(&in_len)
            .arg(weights)
            .arg(power)
            .arg(&s0)
            .arg(&s1)
            .arg(&stride)
            .arg(&first)
            .arg(&k)
            .arg(&count)
            .arg(&section);
        // SAFETY: the arguments match pfb_fir's signature; the caller keeps every window
        // inside the input slot and every slot inside the frames and power buffers.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// Frames read back from the device, put in natural order (pol-major, then spectrum, 2N
/// values each), undoing the unzip order: for comparison with `dsp::pfb::pfb_fir`.
pub fn natural_order(raw: &[f32], channels: usize, unzip: usize) -> Vec<f32> {
    let (step, m) = (2 * channels, channels / unzip);
    let mut out = vec![0f32; raw.len()];
    for (f, frame) in raw.chunks_exact(step).enumerate() {
        for (i, o) in out[f * step..(f + 1) * step].iter_mut().enumerate() {
            let zi = i / 2;
            *o = frame[2 * ((zi % unzip) * m + zi / unzip) + (i & 1)];
        }
    }
    out
}
