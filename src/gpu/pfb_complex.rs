//! The narrowband PFB FIR op (`kernels/pfb_complex.cu`; seed 000 §Narrowband step 4): the GPU
//! body of `dsp::ddc::complex_pfb_fir`, on the DDC's complex output.
//!
//! Buffers: `x` f32 complex [pol][`x_stride`] DDC output; `weights` f32 TAPS × M tap-major
//! (`dsp::pfb::pfb_weights` with step M); `frames` f32 complex [pol][spectra][M], written.

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{Defines, Kernel};
use super::{Gpu, GpuError};

/// Threads (columns) per block, as the kernel's BLOCK.
const BLOCK: usize = 256;

/// One launch: `count` consecutive spectra into frame slots k.., of one polarisation
/// (`first_pol`, `pols` = 1) or both, windows starting at DDC output `starts[p]`.
#[derive(Debug, Clone, Copy)]
pub struct ComplexPfbRun {
    pub first_pol: usize,
    pub pols: usize,
    pub starts: [usize; 2],
    pub x_stride: usize,
    pub k: usize,
    pub count: usize,
    /// Spectra per thread.
    pub section: usize,
}

pub struct ComplexPfb {
    func: CudaFunction,
    fft_len: usize,
    taps: usize,
    spectra: usize,
}

impl ComplexPfb {
    /// `spectra`: frames per polarisation in the frames buffer.
    pub fn new(
        gpu: &Gpu,
        fft_len: usize,
        taps: usize,
        spectra: usize,
    ) -> Result<ComplexPfb, GpuError> {
        let defs: Defines = vec![
            ("FFT_LEN", fft_len as i64),
            ("TAPS", taps as i64),
            ("SPECTRA", spectra as i64),
        ];
        Ok(ComplexPfb {
            func: gpu.function(Kernel::PfbComplex, &defs)?,
            fft_len,
            taps,
            spectra,
        })
    }

    pub fn launch(
        &self,
        st: &CudaStream,
        frames: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        weights: &CudaSlice<f32>,
        run: ComplexPfbRun,
    ) -> Result<(), GpuError> {
        let m = self.fft_len;
        let last_pol = run.first_pol + run.pols;
        let window_end = |p: usize| run.starts[p] + (run.count + self.taps - 1) * m;
        let fits = run.pols >= 1
            && last_pol <= 2
            && run.k + run.count <= self.spectra
            && 2 * 2 * self.spectra * m <= frames.len()
            && weights.len() == self.taps * m
            && (run.first_pol..last_pol).all(|p| {
                window_end(p) <= run.x_stride && 2 * (p * run.x_stride + window_end(p)) <= x.len()
            });
        if !fits {
            return Err(GpuError::Backend(format!(
                "complex PFB launch {run:?} does not fit its buffers (frames {}, input {})",
                frames.len(),
                x.len()
            )));
        }
        let section = run.section.clamp(1, run.count.max(1));
        let cfg = LaunchConfig {
            grid_dim: (
                m.div_ceil(BLOCK) as u32,
                run.count.div_ceil(section) as u32,
                run.pols as u32,
            ),
            block_dim: (BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (stride, s0, s1) = (
            run.x_stride as i64,
            run.starts[0] as i64,
            run.starts[1] as i64,
        );
        let (first, k, count, section) = (
            run.first_pol as i32,
            run.k as i32,
            run.count as i32,
            section as i32,
        );
        let mut b = st.launch_builder(&self.func);
        b.arg(frames)
            .arg(x)
            .arg(weights)
            .arg(&stride)
            .arg(&s0)
            .arg(&s1)
            .arg(&first)
            .arg(&k)
            .arg(&count)
            .arg(&section);
        // SAFETY: the arguments match pfb_complex's signature; every window lies inside its
        // polarisation's input and every slot inside the frames buffer (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
