//! The F-engine's CUDA backend (seed 000 §GPU Processing): the same [`Backend`] the CPU one
//! implements, so the engine code is shared; it composes the device ops of `crate::gpu`
//! (a [`Front`] end, [`BatchedFft`], [`Postproc`]), which know no engine. The front end is the
//! wideband PFB or the narrowband DDC + complex PFB (`cuda_front`); everything after it is
//! shared, the post-processing compiled for the output's kind. Per chunk, both polarisations are copied to one of
//! three device input slots on the host-to-device stream (the tail, the next chunk's head, is
//! copied straight after the body), and the next chunk's body is prefetched into the next
//! slot while this chunk computes (the engine's chunks are page-locked, so these copies are
//! DMA straight from them). The per-heap delay terms are written into mapped host memory
//! rather than copied (seed 000 §Postprocessing: small copies queue behind the sample
//! transfers), and moved into device memory once per launch by the post-processing op. The front end batches consecutive spectra of one coarse
//! delay into one launch of `pfb_fir` (both polarisations in one grid where their runs line
//! up); the back end runs a batched C2C cuFFT in place and `postproc` on the compute stream,
//! then the heap and its clip and power counters go to pinned host memory on the
//! device-to-host stream. `depth` output slots circulate, so heap h's copy-out overlaps heap
//! h+1's compute and the next chunk's copy-in. Every buffer is allocated at start-up.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice};

use super::backend::{BackEndInput, Backend, BackendError, ChunkInput, Finished};
use super::cuda_front::{Front, FrontRun};
use super::cuda_slot::OutSlot;
use super::narrowband_output::NarrowbandOutput;
use super::output::WidebandOutput;
use crate::dsp::postproc::{OutputBits, PhaseConvention};
use crate::gpu::fft::BatchedFft;
use crate::gpu::postproc::{Postproc, PostprocShape};
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};

pub use super::cuda_shape::{default_batch, default_unzip, GpuConfig};

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
    post: Postproc,
    fft: BatchedFft,
    /// Output channels, and the phase convention of their delay terms.
    channels: usize,
    convention: PhaseConvention,
    /// Digitiser samples from one spectrum to the next.
    step: usize,
    /// Spectra per heap, and per launch (`batch` heaps).
    heap_spectra: usize,
    spectra: usize,
    batch: usize,
    pol_bytes: usize,
    tail_bytes: usize,
    /// Device bytes per polarisation in an input slot (body + tail + padding).
    pol_stride: usize,
    /// Three input slots: the chunk being computed, the next one arriving, and the one
    /// before, whose last front-end launches may still be running.
    inputs: [CudaSlice<u8>; 3],
    /// The chunk whose body each input slot holds.
    resident: [Option<u64>; 3],
    /// Recorded after the copies that read the current chunk's host memory.
    copied: CudaEvent,
    cur: usize,
    frames: CudaSlice<f32>,
    power: CudaSlice<u64>,
    /// Per heap of a batch: [pol][channel] complex gains.
    gains: CudaSlice<f32>,
    /// The latest gains on the device, their version (the pipeline's), and the version each
    /// batch position holds.
    gains_master: CudaSlice<f32>,
    gains_version: Option<u64>,
    gains_at: Vec<Option<u64>>,
    slots: Vec<OutSlot>,
    /// The slot being filled, and how many heaps it holds so far (not yet launched).
    fill: usize,
    pending: usize,
    /// (slot, heap in the slot) of every heap submitted and not yet taken.
    in_flight: VecDeque<(usize, usize)>,
    runs: [Option<Run>; 2],
    out_bytes: usize,
    section: usize,
    /// The dither seed of the heaps being batched.
    dither: Option<u64>,
    /// Copies and launches, timed when a benchmark asks ([`GpuBackend::timeline`]).
    timeline: Timeline,
}

impl GpuBackend {
    pub fn new(
        gpu: Arc<Gpu>,
        output: &WidebandOutput,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
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
        Self::assemble(gpu, front, fft, post, PhaseConvention::Wideband, cfg)
    }

    /// A narrowband output's backend (seed 000 §Narrowband): the DDC and complex PFB front
    /// end, an M-point C2C FFT, and the narrowband post-processing. `cfg.unzip` is unused.
    pub fn narrowband(
        gpu: Arc<Gpu>,
        output: &NarrowbandOutput,
        cfg: GpuConfig,
        adc_sample_rate: f64,
    ) -> Result<GpuBackend, GpuError> {
        let s = cfg.spectra_per_heap * cfg.batch.max(1);
        let m = output.internal_channels();
        let front = Front::narrowband(&gpu, output, &cfg, adc_sample_rate, s)?;
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
        Self::assemble(gpu, front, fft, post, convention, cfg)
    }

    /// Everything after the front end, which both kinds share.
    fn assemble(
        gpu: Arc<Gpu>,
        front: Front,
        fft: BatchedFft,
        post: PostprocShape,
        convention: PhaseConvention,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        let channels = post.channels;
        let hs = cfg.spectra_per_heap;
        let batch = cfg.batch.max(1);
        let s = hs * batch;
        let post = Postproc::new(&gpu, post)?;
        let bits = cfg.sample_bits as usize;
        let pol_bytes = cfg.body * bits / 8;
        let tail_bytes = cfg.tail * bits / 8;
        let pol_stride = (pol_bytes + tail_bytes + 1).next_multiple_of(256);
        let st = &gpu.compute;
        let out_bytes = channels
            * hs
            * if cfg.out_bits == OutputBits::Four {
                2
            } else {
                4
            };
        let slots = (0..cfg.depth.max(1))
            .map(|_| OutSlot::new(&gpu, s, batch, out_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuBackend {
            post,
            fft,
            channels,
            convention,
            step: front.spectrum_samples(),
            heap_spectra: hs,
            spectra: s,
            batch,
            pol_bytes,
            tail_bytes,
            pol_stride,
            inputs: [
                gpu.h2d.alloc_zeros(2 * pol_stride)?,
                gpu.h2d.alloc_zeros(2 * pol_stride)?,
                gpu.h2d.alloc_zeros(2 * pol_stride)?,
            ],
            resident: [None, None, None],
            copied: gpu.ctx.new_event(None)?,
            cur: 0,
            frames: st.alloc_zeros(2 * s * front.frame_values())?,
            power: st.alloc_zeros(2 * batch)?,
            gains: st.alloc_zeros(4 * channels * batch)?,
            gains_master: st.alloc_zeros(4 * channels)?,
            gains_version: None,
            gains_at: vec![None; batch],
            slots,
            fill: 0,
            pending: 0,
            in_flight: VecDeque::with_capacity(cfg.depth * batch),
            runs: [None, None],
            out_bytes,
            // Measured best on the H100 with staged rows (bench/gpu-notes.md, v4); the kernel
            // takes fewer where a section's rows would not fit in shared memory.
            section: 128,
            dither: None,
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
            heap: k / self.heap_spectra,
        };
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.front.launch(
            &self.gpu,
            &mut self.frames,
            &self.inputs[self.cur],
            self.pol_stride,
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
        let at = 2 * self.pending;
        Ok([p[at] as i64, p[at + 1] as i64])
    }

    /// Copy `chunk` in: its body unless the previous call prefetched it, its tail straight
    /// from the next chunk's head, then the next chunk's body into the other slot, so that
    /// its copy overlaps this chunk's compute (the tail is copied on its own, a few per cent
    /// more PCIe traffic, so that this chunk's compute waits for the tail only, not for the
    /// whole next chunk).
    fn copy_in(&mut self, chunk: ChunkInput<'_>) -> Result<(), GpuError> {
        self.flush_runs()?;
        let slots = self.inputs.len();
        let prefetched = self.resident.iter().position(|&r| r == Some(chunk.id));
        let cur = prefetched.unwrap_or((self.cur + 1) % slots);
        self.cur = cur;
        let (pb, tb, stride) = (self.pol_bytes, self.tail_bytes, self.pol_stride);
        let h2d = &self.gpu.h2d;
        let t = self.timeline.start(&self.gpu, h2d)?;
        for p in 0..2 {
            let base = p * stride;
            let slot = &mut self.inputs[cur];
            if prefetched.is_none() {
                h2d.memcpy_htod(
                    &chunk.data[p * pb..(p + 1) * pb],
                    &mut slot.slice_mut(base..base + pb),
                )?;
            }
            let mut tail = slot.slice_mut(base + pb..base + pb + tb);
            match chunk.next {
                Some(next) => h2d.memcpy_htod(&next[p * pb..p * pb + tb], &mut tail)?,
                None => h2d.memset_zeros(&mut tail)?,
            }
        }
        // Every copy that reads this chunk's host memory (its prefetch came earlier on the
        // same stream) is before this mark; the prefetch below reads the next chunk's, which
        // the caller keeps until that chunk's own release.
        self.copied.record(h2d)?;
        let label = if prefetched.is_some() {
            "h2d tail"
        } else {
            "h2d body+tail"
        };
        self.timeline.end(&self.gpu, h2d, label, t)?;
        self.resident[cur] = Some(chunk.id);
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.front
            .chunk_ready(&self.gpu, &self.inputs[cur], stride, chunk.id)?;
        self.timeline
            .end(&self.gpu, &self.gpu.compute, "compute chunk (ddc)", t)?;
        if let Some(next) = chunk.next {
            // The slot after this one held the chunk before last: its compute is long done,
            // so the prefetch starts at once (with two slots it waited for the previous
            // chunk's compute to let go of its slot).
            let to = (cur + 1) % slots;
            let t = self.timeline.start(&self.gpu, h2d)?;
            let slot = &mut self.inputs[to];
            for p in 0..2 {
                let base = p * stride;
                h2d.memcpy_htod(
                    &next[p * pb..(p + 1) * pb],
                    &mut slot.slice_mut(base..base + pb),
                )?;
            }
            self.timeline.end(&self.gpu, h2d, "h2d prefetch", t)?;
            self.resident[to] = Some(chunk.id + 1);
        }
        Ok(())
    }

    /// Time every copy and launch from now on (for benchmarks); the handle summarises them.
    pub fn record_timeline(&mut self) -> Timeline {
        self.timeline.enable();
        self.timeline.clone()
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

    /// The batched C2C FFT of every z^r of the heap's frames, in place.
    pub fn fft(&mut self) -> Result<(), GpuError> {
        self.flush_runs()?;
        self.fft.forward(&mut self.frames)
    }

    /// Write heap `pending`'s delay terms and first timestamp into the filling slot, uploading
    /// the gains first if they changed (after launching the heaps that used the old ones).
    pub fn stage(&mut self, input: &BackEndInput<'_>) -> Result<(), GpuError> {
        let (hs, s, n) = (self.heap_spectra, self.spectra, self.channels);
        assert_eq!(
            input.timestamps.len(),
            hs,
            "a heap has spectra_per_heap spectra"
        );
        // The kernel keys the dither on timestamps[0] + spectrum·step: a heap's spectra are
        // consecutive (the pipeline starts a new heap at any skip).
        debug_assert!(input
            .timestamps
            .windows(2)
            .all(|w| w[1] - w[0] == self.step as i64));
        // Gains: each heap of a batch has its own copy, so a change (rarely: a katcp request)
        // takes effect at its heap. Uploaded once per change, then copied on the device into
        // each position as it is next used.
        let b = self.pending;
        let version = Some(input.gains_version);
        if self.gains_version != version {
            for p in 0..2 {
                let flat: &[f32] = bytemuck::cast_slice(input.gains[p]);
                self.gpu.compute.memcpy_htod(
                    flat,
                    &mut self.gains_master.slice_mut(p * 2 * n..(p + 1) * 2 * n),
                )?;
            }
            self.gains_version = version;
        }
        if self.gains_at[b] != self.gains_version {
            let len = 4 * n;
            self.gpu.compute.memcpy_dtod(
                &self.gains_master,
                &mut self.gains.slice_mut(b * len..(b + 1) * len),
            )?;
            self.gains_at[b] = self.gains_version;
        }
        let slot = &mut self.slots[self.fill];
        // θ_k/π = x·k + y per pol and spectrum (fengine_delay_convention.md §3; the kernel
        // evaluates it with sincospi): with the convention's slope delay δ′ and fixed phase
        // φ′ (wideband δ and φ + (π/2)(c mod 4); narrowband δ/decimation and φ),
        // x = −δ′/N, y = δ′/2 + φ′/π, reduced mod 2 in f64 before rounding to f32.
        let ph = slot.phase_host.as_mut_slice()?;
        for p in 0..2 {
            for (j, d) in input.delays[p].iter().enumerate() {
                let (fine, fixed) = self.convention.terms(d);
                let y = fine / 2.0 + fixed / std::f64::consts::PI;
                let at = 2 * (p * s + b * hs + j);
                ph[at] = (-fine / n as f64) as f32;
                ph[at + 1] = y.rem_euclid(2.0) as f32;
            }
        }
        slot.ts0_host.as_mut_slice()?[b] = input.timestamps[0];
        Ok(())
    }

    /// The post-processing kernel over the filling slot's batch (device memory only).
    pub fn postproc(&mut self, seed: Option<u64>) -> Result<(), GpuError> {
        let slot = &mut self.slots[self.fill];
        self.post.launch(
            &self.gpu.compute,
            &mut slot.out,
            &self.frames,
            &self.gains,
            slot.phase_dev,
            slot.ts0_dev,
            seed.unwrap_or(0),
            &mut self.power,
            &mut slot.stats,
        )
    }

    /// FFT and post-process the filling slot's heaps (all of the batch, however many were
    /// submitted: the rest are ignored), copy them out, and move on to the next slot.
    fn launch_batch(&mut self) -> Result<(), GpuError> {
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.fft()?;
        self.postproc(self.dither)?;
        self.timeline
            .end(&self.gpu, &self.gpu.compute, "compute fft+postproc", t)?;
        let d2h = &self.gpu.d2h;
        let t = self.timeline.start(&self.gpu, d2h)?;
        let slot = &mut self.slots[self.fill];
        d2h.memcpy_dtoh(&slot.out, &mut slot.out_host)?;
        d2h.memcpy_dtoh(&slot.stats, &mut slot.stats_host)?;
        slot.done.record(d2h)?;
        self.timeline.end(&self.gpu, d2h, "d2h batch", t)?;
        self.fill = (self.fill + 1) % self.slots.len();
        self.pending = 0;
        Ok(())
    }

    fn submit(&mut self, input: &BackEndInput<'_>) -> Result<(), GpuError> {
        self.flush_runs()?;
        self.dither = input.dither;
        self.stage(input)?;
        self.slots[self.fill].unemitted += 1;
        self.in_flight.push_back((self.fill, self.pending));
        self.pending += 1;
        if self.pending == self.batch {
            self.launch_batch()?;
        }
        Ok(())
    }
}

impl Backend for GpuBackend {
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError> {
        Ok(self.copy_in(chunk)?)
    }

    fn release(&mut self) -> Result<(), BackendError> {
        // The copies read host memory until they complete; the prefetch of the next chunk
        // goes on (its memory is released after its own turn).
        let copied = &self.copied;
        Ok(self
            .timeline
            .wait("host waits for chunk copies", || copied.synchronize())?)
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        let step = self.step;
        // Slot k of the heap being assembled is spectrum k of heap `pending` of the batch; a
        // run never crosses heaps (each has its own power counter).
        let first = k == 0;
        let k = self.pending * self.heap_spectra + k;
        match &mut self.runs[pol] {
            Some(r) if !first && offset == r.offset + r.count * step && k == r.k + r.count => {
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
        self.runs = [None, None];
        let at = 2 * self.pending;
        Ok(self
            .gpu
            .compute
            .memset_zeros(&mut self.power.slice_mut(at..at + 2))?)
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        Ok(self.submit(input)?)
    }

    fn ready(&self) -> bool {
        // The filling slot has room; a slot starts a new batch only once every heap of its
        // previous one has been taken (its host buffers are about to be rewritten).
        self.pending > 0 || self.slots[self.fill].unemitted == 0
    }

    fn finished(&mut self, wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        let Some(&(idx, b)) = self.in_flight.front() else {
            return Ok(None);
        };
        if idx == self.fill && self.pending > 0 {
            // The oldest heap is in the batch still filling.
            if !wait {
                return Ok(None);
            }
            self.launch_batch()?;
        }
        let slot = &self.slots[idx];
        if wait {
            self.timeline
                .wait("host waits for a heap", || slot.done.synchronize())?;
        } else if !slot.done.is_complete() {
            return Ok(None);
        }
        self.in_flight.pop_front();
        let ob = self.out_bytes;
        let slot = &mut self.slots[idx];
        let stats = slot.stats_host.as_slice()?;
        let clips = [
            stats[4 * b] - slot.clips_base[b][0],
            stats[4 * b + 1] - slot.clips_base[b][1],
        ];
        let power = [stats[4 * b + 2] as i64, stats[4 * b + 3] as i64];
        slot.unemitted -= 1;
        if slot.unemitted == 0 {
            // Every position's counters, the unused ones of a partial batch included, are the
            // base for the slot's next launch.
            for (base, st) in slot.clips_base.iter_mut().zip(stats.chunks_exact(4)) {
                *base = [st[0], st[1]];
            }
        }
        Ok(Some(Finished {
            data: &slot.out_host.as_slice()?[b * ob..(b + 1) * ob],
            clips,
            power,
        }))
    }
}
