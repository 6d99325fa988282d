//! The F-engine's CUDA backend (seed 000 §GPU Processing): the same [`Backend`] the CPU one
//! implements, so the engine code is shared; it composes the device ops of `crate::gpu`, which
//! know no engine. Three parts, one file each:
//!
//! - the input: chunks on the device in slots that every output of the engine shares, each
//!   sample uploaded once ([`SharedInput`], `cuda_input`; seed 000 §Multiple outputs); the
//!   engine's chunks are page-locked, so the copies are DMA straight from them, or with
//!   `--use-vkgdr` already in GPU memory (`gpu::vkgdr`), so the copies run on the device;
//! - the front end: the wideband PFB or the narrowband DDC + complex PFB (`cuda_front`), its
//!   consecutive spectra of one coarse delay batched into one launch (both polarisations in
//!   one grid where their runs line up), into this output's frames;
//! - the back end (`cuda_back`): batched C2C cuFFT and post-processing, compiled for the
//!   output's kind, and the copies of the heaps back to pinned host memory — or, with
//!   `--use-peerdirect` (`GpuConfig::peer`), the heaps left in device memory for the NIC.
//!
//! Every buffer is allocated at start-up.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice};

use crate::net::DeviceMemory;

use super::backend::{BackEndInput, Backend, BackendError, ChunkInput, Finished};
use super::cuda_back::BackEnd;
use super::cuda_front::{Front, FrontRun};
use super::cuda_input::{InputHold, InputShape, SharedInput};
use super::narrowband_output::NarrowbandOutput;
use super::output::WidebandOutput;
use crate::dsp::postproc::PhaseConvention;
use crate::gpu::ddc::DdcTuning;
use crate::gpu::fft::BatchedFft;
use crate::gpu::postproc::PostprocShape;
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};

pub use super::cuda_front::DdcChoice;
pub use super::cuda_shape::{
    default_batch, default_depth, default_unzip, peer_depth, wideband_batch, GpuConfig,
};

/// A run of consecutive spectra of one polarisation with one coarse delay.
#[derive(Debug, Clone, Copy)]
struct Run {
    offset: usize,
    k: usize,
    count: usize,
}

pub struct GpuBackend {
    gpu: Arc<Gpu>,
    front: Front,
    back: BackEnd,
    /// Digitiser samples from one spectrum to the next, and spectra per heap.
    step: usize,
    heap_spectra: usize,
    /// Whether a front-end run may go on across heaps (`Front::runs_cross_heaps`).
    cross_heaps: bool,
    /// The input slots this output shares, and the chunk it holds from `load` to `release`.
    input: SharedInput,
    hold: Option<InputHold>,
    frames: CudaSlice<f32>,
    power: CudaSlice<u64>,
    runs: [Option<Run>; 2],
    section: usize,
    /// Copies and launches, timed when a benchmark asks ([`GpuBackend::record_timeline`]).
    timeline: Timeline,
}

impl GpuBackend {
    /// A wideband output's backend with input slots of its own.
    pub fn new(
        gpu: Arc<Gpu>,
        output: &WidebandOutput,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        let input = SharedInput::new(&gpu, input_shape(&cfg))?;
        Self::wideband(&input, output, cfg)
    }

    /// A narrowband output's backend with input slots of its own and the default DDC mapping.
    pub fn narrowband(
        gpu: Arc<Gpu>,
        output: &NarrowbandOutput,
        cfg: GpuConfig,
        adc_sample_rate: f64,
    ) -> Result<GpuBackend, GpuError> {
        let input = SharedInput::new(&gpu, input_shape(&cfg))?;
        Self::narrowband_on(&input, output, cfg, adc_sample_rate, &mut |_, shape| {
            DdcTuning::default_for(shape)
        })
    }

    /// A wideband output's backend reading the chunks of `input` (shared with other outputs).
    pub fn wideband(
        input: &SharedInput,
        output: &WidebandOutput,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        let gpu = input.gpu();
        let channels = output.channels;
        let s = cfg.spectra_per_heap * cfg.batch.max(1);
        let n = cfg.unzip;
        if !(channels.is_power_of_two() && channels % n == 0 && channels / n >= 2) {
            return Err(GpuError::Backend(format!(
                "unzip factor {n} does not suit {channels} channels"
            )));
        }
        let front = Front::wideband(&gpu, output, &cfg, s)?;
        let fft = BatchedFft::new(&gpu.compute, channels / n, 2 * s * n)?;
        let post = PostprocShape {
            channels,
            unzip: n,
            spectra: s,
            heap_spectra: cfg.spectra_per_heap,
            out_bits: cfg.out_bits,
            dither: output.dither,
            spectrum_samples: 2 * channels,
            narrowband: None,
        };
        Self::assemble(input, front, fft, post, PhaseConvention::Wideband, cfg)
    }

    /// A narrowband output's backend (seed 000 §Narrowband) reading the chunks of `input`: the
    /// DDC, with the mapping `tuning` picks for its shape (`gpu::ddc_tune`), and the complex
    /// PFB front end, an M-point C2C FFT, and the narrowband post-processing. `cfg.unzip` is
    /// unused.
    pub fn narrowband_on(
        input: &SharedInput,
        output: &NarrowbandOutput,
        cfg: GpuConfig,
        adc_sample_rate: f64,
        tuning: &mut DdcChoice<'_>,
    ) -> Result<GpuBackend, GpuError> {
        let gpu = input.gpu();
        let s = cfg.spectra_per_heap * cfg.batch.max(1);
        let m = output.internal_channels();
        let front = Front::narrowband(&gpu, output, &cfg, adc_sample_rate, s, tuning)?;
        let fft = BatchedFft::new(&gpu.compute, m, 2 * s)?;
        let post = PostprocShape {
            channels: output.channels,
            unzip: 1,
            spectra: s,
            heap_spectra: cfg.spectra_per_heap,
            out_bits: cfg.out_bits,
            dither: output.dither,
            spectrum_samples: front.spectrum_samples(),
            narrowband: Some(m),
        };
        let convention = PhaseConvention::Narrowband {
            decimation: output.decimation,
        };
        Self::assemble(input, front, fft, post, convention, cfg)
    }

    /// Everything after the front end, which both kinds share.
    fn assemble(
        input: &SharedInput,
        front: Front,
        fft: BatchedFft,
        post: PostprocShape,
        convention: PhaseConvention,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        let shape = input.shape();
        if shape.sample_bits != cfg.sample_bits || shape.body != cfg.body || shape.tail < cfg.tail {
            return Err(GpuError::Backend(format!(
                "the shared input {shape:?} does not carry this output's chunks \
                 ({} bits, {} samples, tail {})",
                cfg.sample_bits, cfg.body, cfg.tail
            )));
        }
        let gpu = input.gpu();
        let hs = cfg.spectra_per_heap;
        let batch = cfg.batch.max(1);
        let step = front.spectrum_samples();
        let st = &gpu.compute;
        Ok(GpuBackend {
            back: BackEnd::new(Arc::clone(&gpu), fft, post, convention, step, &cfg)?,
            step,
            heap_spectra: hs,
            cross_heaps: front.runs_cross_heaps(hs),
            input: input.clone(),
            hold: None,
            frames: st.alloc_zeros(2 * hs * batch * front.frame_values())?,
            power: st.alloc_zeros(2 * batch)?,
            runs: [None, None],
            // At the engine's launch size on the H100 64 beats 128 at 32768 channels (80 against
            // 78 % of copy for a launch of 512 spectra, v18; 75 against 71 % for 256, whose
            // rows ran 64 instead of 124, 124 and 8, v17) and is within a point of it at 4096
            // (bench/gpu-notes.md); the kernel takes fewer where a section's rows would not fit
            // in shared memory.
            section: 64,
            timeline: Timeline::default(),
            front,
            gpu,
        })
    }

    /// Spectra per PFB thread (the section length of seed 000 §Polyphase Filter Bank).
    pub fn set_section(&mut self, section: usize) {
        self.section = section.max(1);
    }

    /// Launch the pending front-end runs: both polarisations in one grid when their runs
    /// cover the same heap slots (the usual case), else one each.
    pub fn flush_runs(&mut self) -> Result<(), GpuError> {
        match self.runs {
            [Some(a), Some(b)] if a.k == b.k && a.count == b.count => {
                self.launch_pfb(0, 2, [a.offset, b.offset], a.k, a.count)?
            }
            runs => {
                for (pol, run) in runs.iter().enumerate() {
                    if let Some(r) = run {
                        let mut starts = [0; 2];
                        starts[pol] = r.offset;
                        self.launch_pfb(pol, 1, starts, r.k, r.count)?;
                    }
                }
            }
        }
        self.runs = [None, None];
        Ok(())
    }

    fn launch_pfb(
        &mut self,
        first_pol: usize,
        pols: usize,
        starts: [usize; 2],
        k: usize,
        count: usize,
    ) -> Result<(), GpuError> {
        let run = FrontRun {
            first_pol,
            pols,
            starts,
            k,
            count,
            section: self.section,
        };
        let hold = self
            .hold
            .as_ref()
            .ok_or_else(|| GpuError::Backend("front end with no chunk loaded".into()))?;
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.front.launch(
            &self.gpu,
            &mut self.frames,
            hold.data(),
            self.input.pol_stride(),
            &mut self.power,
            run,
        )?;
        self.timeline
            .end(&self.gpu, &self.gpu.compute, "compute pfb", t)
    }

    /// The frames of the heap being assembled, in natural order (pol-major, then spectrum,
    /// one frame each): for the self-test's comparison with `dsp::pfb::pfb_fir`.
    pub fn read_frames(&mut self) -> Result<Vec<f32>, GpuError> {
        self.flush_runs()?;
        let raw = self.gpu.compute.clone_dtoh(&self.frames)?;
        Ok(self.front.natural_frames(raw))
    }

    /// The digitiser power accumulated for the heap being assembled.
    pub fn read_power(&mut self) -> Result<[i64; 2], GpuError> {
        self.flush_runs()?;
        let p = self.gpu.compute.clone_dtoh(&self.power)?;
        let at = 2 * self.back.pending();
        Ok([p[at] as i64, p[at + 1] as i64])
    }

    /// Take hold of `chunk` on the device (uploaded by whichever output loads it first) and
    /// run the front end's once-per-chunk work on it.
    fn copy_in(&mut self, chunk: ChunkInput<'_>) -> Result<(), GpuError> {
        self.flush_runs()?;
        self.hold = None;
        let hold = self.input.acquire(chunk)?;
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.front
            .chunk_ready(&self.gpu, hold.data(), self.input.pol_stride(), chunk.id)?;
        self.timeline
            .end(&self.gpu, &self.gpu.compute, "compute chunk (ddc)", t)?;
        self.hold = Some(hold);
        Ok(())
    }

    /// Time every copy and launch from now on (for benchmarks); the handle summarises them.
    /// The shared input's copies land in it too.
    pub fn record_timeline(&mut self) -> Timeline {
        let mut timeline = Timeline::default();
        timeline.enable();
        self.record_into(&timeline);
        timeline
    }

    /// Time every copy and launch from now on into `timeline` (enabled), which other
    /// outputs sharing the input may record into as well.
    pub fn record_into(&mut self, timeline: &Timeline) {
        self.timeline = timeline.clone();
        self.back.timeline = timeline.clone();
        self.input.record_timeline(timeline.clone());
    }

    /// An event recorded now on the compute stream, with timing (for benchmarks).
    pub fn mark(&self) -> Result<CudaEvent, GpuError> {
        let e = self
            .gpu
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(&self.gpu.compute)?;
        Ok(e)
    }

    /// The batched C2C FFT of every frame, in place.
    pub fn fft(&mut self) -> Result<(), GpuError> {
        self.flush_runs()?;
        self.back.fft(&mut self.frames)
    }

    /// Write the next heap's delay terms, timestamp and gains (see `BackEnd::stage`).
    pub fn stage(&mut self, input: &BackEndInput<'_>) -> Result<(), GpuError> {
        self.back.stage(input)
    }

    /// The post-processing kernel over the filling batch (device memory only).
    pub fn postproc(&mut self, seed: Option<u64>) -> Result<(), GpuError> {
        self.back.postproc(&self.frames, &mut self.power, seed)
    }
}

/// Input slots for one output of `cfg`.
fn input_shape(cfg: &GpuConfig) -> InputShape {
    InputShape {
        sample_bits: cfg.sample_bits,
        body: cfg.body,
        tail: cfg.tail,
    }
}

impl Backend for GpuBackend {
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError> {
        Ok(self.copy_in(chunk)?)
    }

    fn release(&mut self) -> Result<(), BackendError> {
        // Every launch that reads the chunk is queued: let go of its slot (recording its read
        // event), then wait until no copy reads the chunk's host memory (the prefetch of the
        // next chunk goes on: its memory is released after its own turn).
        self.flush_runs()?;
        self.hold = None;
        Ok(self.input.wait_copied()?)
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        let step = self.step;
        // Slot k of the heap being assembled is spectrum k of heap `pending` of the batch. A
        // run goes on across the batch's heaps while the input is contiguous (the kernel adds
        // each heap's power to its own counter), so the PFB launches once per batch, not per
        // heap (a heap of 32 spectra at 32768 channels gave the GPU 512 blocks of 32 spectra).
        let joins = k > 0 || self.cross_heaps;
        let k = self.back.pending() * self.heap_spectra + k;
        match &mut self.runs[pol] {
            Some(r) if joins && offset == r.offset + r.count * step && k == r.k + r.count => {
                r.count += 1
            }
            _ => {
                if self.runs[pol].is_some() {
                    self.flush_runs()?;
                }
                self.runs[pol] = Some(Run {
                    offset,
                    k,
                    count: 1,
                });
            }
        }
        Ok(())
    }

    fn discard(&mut self) -> Result<(), BackendError> {
        // Drop the heap being assembled from the pending runs; earlier heaps of the batch in
        // them stay.
        let base = self.back.pending() * self.heap_spectra;
        for run in &mut self.runs {
            *run = run.filter(|r| r.k < base).map(|r| Run {
                count: r.count.min(base - r.k),
                ..r
            });
        }
        let at = 2 * self.back.pending();
        Ok(self
            .gpu
            .compute
            .memset_zeros(&mut self.power.slice_mut(at..at + 2))?)
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        // The batch's FFT reads every frame: its spectra must all be in before it launches.
        if self.back.fills_batch() {
            self.flush_runs()?;
        }
        Ok(self.back.submit(&mut self.frames, &mut self.power, input)?)
    }

    fn ready(&self) -> bool {
        self.back.ready()
    }

    fn wait_ready(&mut self) -> Result<bool, BackendError> {
        Ok(self.back.wait_returned())
    }

    fn lendable_heaps(&self) -> usize {
        self.back.lendable()
    }

    fn peer_memory(&self) -> Vec<Arc<dyn DeviceMemory>> {
        self.back.peer_memory()
    }

    fn finished(&mut self, wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        if wait && self.back.pending() > 0 {
            // Waiting may launch a partly filled batch: its spectra must all be in. With no
            // heap pending the runs hold only the heap being assembled, which no launch reads
            // yet: flushing them here split each batch's PFB launch in two (bench/gpu-notes.md
            // v15).
            self.flush_runs()?;
        }
        Ok(self
            .back
            .finished(wait, &mut self.frames, &mut self.power)?)
    }
}
