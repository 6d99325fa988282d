//! The front ends of the F-engine's CUDA backend ([`super::cuda::GpuBackend`]): what turns a
//! chunk on the device into the frames the batched C2C FFT transforms.
//!
//! - **Wideband** (seed 000 §Polyphase Filter Bank): the fused decode + PFB FIR reads the packed
//!   samples and writes frames in the unzip order; it also sums the digitiser power.
//! - **Narrowband** (seed 000 §Narrowband): once per chunk the DDC kernel mixes, filters and
//!   subsamples both polarisations of the chunk with its tail (DDC output b of the chunk
//!   starting at sample t_c is digitiser sample t_c + S·b, as the CPU backend has it); each run
//!   of spectra then goes through the complex PFB FIR, whose windows start at DDC output
//!   offset/S (the pipeline aligns narrowband coarse delays to the subsampling). No digitiser
//!   power is measured (seed 000 §Input statistics).

use cudarc::driver::CudaSlice;

use super::cuda::GpuConfig;
use super::narrowband_output::NarrowbandOutput;
use super::output::WidebandOutput;
use crate::dsp::ddc::mixer_step;
use crate::dsp::pfb::pfb_weights;
use crate::gpu::ddc::{Ddc, DdcPlan, DdcRun, DdcShape, DdcTuning};
use crate::gpu::pfb::{Pfb, PfbRun, PfbShape};
use crate::gpu::pfb_complex::{ComplexPfb, ComplexPfbRun};
use crate::gpu::{Gpu, GpuError};

/// How a narrowband front end picks its DDC kernel's mapping for a shape on a device: the
/// default ([`DdcTuning::default_for`]) or a tuned one (`gpu::ddc_tune::TuningCache::tuning`).
pub type DdcChoice<'a> = dyn FnMut(&Gpu, DdcShape) -> DdcTuning + 'a;

/// Spectra per thread of the complex PFB: its grid has M/256 columns, so a few spectra per
/// thread still leave enough blocks for a heap of 256 spectra.
const NARROWBAND_SECTION: usize = 8;

/// One launch of a front end: `count` consecutive spectra of one or both polarisations
/// into frame slots k.. (across the batch's heaps: the wideband kernel adds each heap's
/// power to its own counter), windows starting at digitiser sample `starts[p]` of the chunk.
#[derive(Debug, Clone, Copy)]
pub struct FrontRun {
    pub first_pol: usize,
    pub pols: usize,
    pub starts: [usize; 2],
    pub k: usize,
    pub count: usize,
    /// Spectra per thread (wideband; the narrowband PFB picks its own).
    pub section: usize,
}

pub enum Front {
    Wideband {
        pfb: Pfb,
        weights: CudaSlice<f32>,
        channels: usize,
        unzip: usize,
    },
    Narrowband(Box<NarrowbandFront>),
}

pub struct NarrowbandFront {
    ddc: Ddc,
    /// Mixed DDC weights ([q][W], `DdcPlan::mixed_weights`).
    z: CudaSlice<f32>,
    mixer: u32,
    /// Digitiser samples per polarisation the DDC reads (body and tail), and per chunk.
    n_in: usize,
    body: usize,
    /// DDC output per polarisation ([pol][n_sub] complex).
    subsampled: CudaSlice<f32>,
    n_sub: usize,
    subsampling: usize,
    fft_len: usize,
    pfb: ComplexPfb,
    weights: CudaSlice<f32>,
}

impl Front {
    /// Whether one launch may cover spectra of several heaps of `heap_spectra` spectra: the
    /// wideband kernel separates the power of at most one heap boundary per group of TAPS
    /// spectra; the narrowband front end keeps no power.
    pub fn runs_cross_heaps(&self, heap_spectra: usize) -> bool {
        match self {
            Front::Wideband { pfb, .. } => heap_spectra >= pfb.taps(),
            Front::Narrowband(_) => true,
        }
    }

    pub fn wideband(
        gpu: &Gpu,
        output: &WidebandOutput,
        cfg: &GpuConfig,
        spectra: usize,
    ) -> Result<Front, GpuError> {
        let channels = output.channels;
        let pfb = Pfb::new(
            gpu,
            PfbShape {
                channels,
                taps: output.taps,
                sample_bits: cfg.sample_bits,
                unzip: cfg.unzip,
                spectra,
                heap_spectra: cfg.spectra_per_heap,
            },
        )?;
        let weights = gpu.compute.clone_htod(&pfb_weights(
            2 * channels,
            output.taps,
            output.w_cutoff,
            output.window,
        ))?;
        Ok(Front::Wideband {
            pfb,
            weights,
            channels,
            unzip: cfg.unzip,
        })
    }

    /// The narrowband front end; `Err` names what the output's filter or shape lacks.
    pub fn narrowband(
        gpu: &Gpu,
        output: &NarrowbandOutput,
        cfg: &GpuConfig,
        adc_sample_rate: f64,
        spectra: usize,
        tuning: &mut DdcChoice<'_>,
    ) -> Result<Front, GpuError> {
        let s = output.subsampling();
        let m = output.internal_channels();
        let h = output
            .ddc_weights(adc_sample_rate)
            .map_err(|e| GpuError::Backend(format!("DDC filter: {e}")))?;
        let shape = DdcShape {
            sample_bits: cfg.sample_bits,
            subsampling: s,
            taps: h.len(),
        };
        let plan = DdcPlan::new(shape, tuning(gpu, shape))?;
        let mixer = mixer_step(output.mixer_frequency(adc_sample_rate));
        let n_in = cfg.body + cfg.tail;
        let n_sub = n_in.saturating_sub(h.len()) / s + 1;
        let st = &gpu.compute;
        Ok(Front::Narrowband(Box::new(NarrowbandFront {
            ddc: Ddc::new(gpu, plan)?,
            z: st.clone_htod(&plan.mixed_weights(&h, mixer))?,
            mixer,
            n_in,
            body: cfg.body,
            subsampled: st.alloc_zeros(4 * n_sub)?,
            n_sub,
            subsampling: s,
            fft_len: m,
            pfb: ComplexPfb::new(gpu, m, output.taps, spectra)?,
            weights: st.clone_htod(&pfb_weights(m, output.taps, output.w_cutoff, output.window))?,
        })))
    }

    /// Digitiser samples from one spectrum to the next.
    pub fn spectrum_samples(&self) -> usize {
        match self {
            Front::Wideband { channels, .. } => 2 * channels,
            Front::Narrowband(n) => n.fft_len * n.subsampling,
        }
    }

    /// f32 values per frame (the FFT's input).
    pub fn frame_values(&self) -> usize {
        match self {
            Front::Wideband { channels, .. } => 2 * channels,
            Front::Narrowband(n) => 2 * n.fft_len,
        }
    }

    /// Work done once per chunk, after its samples are on the device: the narrowband DDC.
    pub fn chunk_ready(
        &mut self,
        gpu: &Gpu,
        input: &CudaSlice<u8>,
        pol_stride: usize,
        chunk_id: u64,
    ) -> Result<(), GpuError> {
        let Front::Narrowband(n) = self else {
            return Ok(());
        };
        let first = chunk_id.wrapping_mul(n.body as u64);
        n.ddc.launch(
            &gpu.compute,
            &mut n.subsampled,
            input,
            &n.z,
            DdcRun {
                pols: 2,
                n_in: n.n_in,
                pol_stride,
                n_out: n.n_sub,
                out_stride: n.n_sub,
                t_first: [first, first],
                step: n.mixer,
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        frames: &mut CudaSlice<f32>,
        input: &CudaSlice<u8>,
        pol_stride: usize,
        power: &mut CudaSlice<u64>,
        run: FrontRun,
    ) -> Result<(), GpuError> {
        match self {
            Front::Wideband { pfb, weights, .. } => pfb.launch(
                &gpu.compute,
                frames,
                input,
                weights,
                power,
                PfbRun {
                    first_pol: run.first_pol,
                    pols: run.pols,
                    starts: run.starts,
                    pol_stride,
                    k: run.k,
                    count: run.count,
                    section: run.section,
                },
            ),
            Front::Narrowband(n) => {
                let s = n.subsampling;
                let pols = run.first_pol..run.first_pol + run.pols;
                if let Some(p) = pols.clone().find(|&p| run.starts[p] % s != 0) {
                    return Err(GpuError::Backend(format!(
                        "narrowband spectrum at offset {}, not a multiple of the subsampling {s}",
                        run.starts[p]
                    )));
                }
                n.pfb.launch(
                    &gpu.compute,
                    frames,
                    &n.subsampled,
                    &n.weights,
                    ComplexPfbRun {
                        first_pol: run.first_pol,
                        pols: run.pols,
                        starts: run.starts.map(|o| o / s),
                        x_stride: n.n_sub,
                        k: run.k,
                        count: run.count,
                        section: NARROWBAND_SECTION,
                    },
                )
            }
        }
    }

    /// Frames read back from the device in natural order (pol-major, then spectrum): the
    /// wideband ones leave the unzip order, the narrowband ones are already natural.
    pub fn natural_frames(&self, raw: Vec<f32>) -> Vec<f32> {
        match self {
            Front::Wideband {
                channels, unzip, ..
            } => crate::gpu::pfb::natural_order(&raw, *channels, *unzip),
            Front::Narrowband(_) => raw,
        }
    }
}
