//! The F-engine's CUDA backend (seed 000 §GPU Processing): the same [`Backend`] the CPU one
//! implements, so the engine code is shared. Per chunk, both polarisations are copied to one of
//! three device input slots on the host-to-device stream (the tail, the next chunk's head, is
//! copied straight after the body), and the next chunk's body is prefetched into the next
//! slot while this chunk computes. The per-heap delay terms are read by the kernel from mapped
//! host memory rather than copied (seed 000 §Postprocessing: small copies queue behind the
//! sample transfers). The front end batches consecutive spectra of one coarse
//! delay into one launch of `pfb_fir` (both polarisations in one grid where their runs line
//! up); the back end runs a batched C2C cuFFT in place and `postproc` on the compute stream,
//! then the heap and its clip and power counters go to pinned host memory on the
//! device-to-host stream. `depth` output slots circulate, so heap h's copy-out overlaps heap
//! h+1's compute and the next chunk's copy-in. Every buffer is allocated at start-up.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::cufft::{self, CudaFft};
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, DevicePtrMut, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use num_complex::Complex32;

use super::compile::{Defines, Kernel};
use super::{Gpu, GpuError};
use crate::dsp::pfb::pfb_weights;
use crate::dsp::postproc::OutputBits;
use crate::fengine::backend::{BackEndInput, Backend, BackendError, ChunkInput, Finished};
use crate::fengine::output::WidebandOutput;

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
    /// Output heaps in flight.
    pub depth: usize,
}

/// A run of consecutive spectra of one polarisation with one coarse delay.
#[derive(Debug, Clone, Copy)]
struct Run {
    offset: usize,
    k: usize,
    count: usize,
}

struct OutSlot {
    /// The heap's delay terms in mapped pinned memory, which the kernel reads directly: a
    /// copy would queue behind the chunk transfers (seed 000 §Postprocessing).
    phase_host: PinnedHostSlice<f32>,
    phase_dev: u64,
    out: CudaSlice<u8>,
    out_host: PinnedHostSlice<u8>,
    /// Clip counts per pol (cumulative over the slot's heaps), then the heap's power per pol.
    stats: CudaSlice<u64>,
    stats_host: PinnedHostSlice<u64>,
    /// The cumulative clip counts at the slot's previous heap.
    clips_seen: [u64; 2],
    done: CudaEvent,
}

pub struct GpuBackend {
    gpu: Arc<Gpu>,
    pfb: CudaFunction,
    post: CudaFunction,
    fft: CudaFft,
    channels: usize,
    step: usize,
    spectra: usize,
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
    weights: CudaSlice<f32>,
    frames: CudaSlice<f32>,
    power: CudaSlice<u64>,
    gains: CudaSlice<f32>,
    gains_host: Vec<Complex32>,
    slots: Vec<OutSlot>,
    next_slot: usize,
    in_flight: VecDeque<usize>,
    runs: [Option<Run>; 2],
    out_bytes: usize,
    section: usize,
    unzip: usize,
    /// Values of s per post-processing block.
    stile: usize,
}

impl GpuBackend {
    pub fn new(
        gpu: Arc<Gpu>,
        output: &WidebandOutput,
        cfg: GpuConfig,
    ) -> Result<GpuBackend, GpuError> {
        let channels = output.channels;
        let step = 2 * channels;
        let s = cfg.spectra_per_heap;
        let n = cfg.unzip;
        assert!(
            channels.is_power_of_two() && channels % n == 0 && channels / n >= 2,
            "unzip factor {n} does not suit {channels} channels"
        );
        let pfb_defs: Defines = vec![
            ("CHANNELS", channels as i64),
            ("TAPS", output.taps as i64),
            ("SAMPLE_BITS", i64::from(cfg.sample_bits)),
            ("UNZIP", n as i64),
            ("SPECTRA", s as i64),
        ];
        // Blocks of 32 values of s × 32 spectra, unless that leaves the GPU short of blocks
        // (a heap of few spectra, as at 32768 channels): then 8 values of s.
        let stile = if (channels / n / 2 + 1).div_ceil(32) * s.div_ceil(32) >= 1024 {
            32
        } else {
            8
        };
        let post_defs: Defines = vec![
            ("CHANNELS", channels as i64),
            ("UNZIP", n as i64),
            ("SPECTRA", s as i64),
            ("STILE", stile as i64),
            (
                "OUT_BITS",
                if cfg.out_bits == OutputBits::Four {
                    4
                } else {
                    8
                },
            ),
            ("DITHER", i64::from(output.dither)),
        ];
        let pfb = gpu.function(Kernel::Pfb, &pfb_defs)?;
        let post = gpu.function(Kernel::Postproc, &post_defs)?;
        let bits = cfg.sample_bits as usize;
        let pol_bytes = cfg.body * bits / 8;
        let tail_bytes = cfg.tail * bits / 8;
        let pol_stride = (pol_bytes + tail_bytes + 1).next_multiple_of(256);
        let st = &gpu.compute;
        let weights = st.clone_htod(&pfb_weights(
            step,
            output.taps,
            output.w_cutoff,
            output.window,
        ))?;
        let out_bytes = channels
            * s
            * if cfg.out_bits == OutputBits::Four {
                2
            } else {
                4
            };
        let mut slots = Vec::with_capacity(cfg.depth);
        for _ in 0..cfg.depth.max(1) {
            // SAFETY: pinned allocations are written before they are read (plain, not
            // write-combined: the host reads the heaps back); the mapped pointer is the
            // device's address of `phase_host`, which lives as long as the slot.
            unsafe {
                let mut phase_host = gpu.ctx.alloc_pinned_with_flags::<f32>(
                    4 * s,
                    cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )?;
                let mut phase_dev = 0;
                cudarc::driver::sys::cuMemHostGetDevicePointer_v2(
                    &mut phase_dev,
                    phase_host.as_mut_ptr()?.cast(),
                    0,
                )
                .result()?;
                slots.push(OutSlot {
                    phase_host,
                    phase_dev,
                    out: st.alloc_zeros(out_bytes)?,
                    out_host: gpu.ctx.alloc_pinned_with_flags(out_bytes, 0)?,
                    stats: st.alloc_zeros(4)?,
                    stats_host: gpu.ctx.alloc_pinned_with_flags(4, 0)?,
                    clips_seen: [0; 2],
                    done: gpu.ctx.new_event(None)?,
                });
            }
        }
        let fft = CudaFft::plan_1d(
            (channels / n) as i32,
            cufft::sys::cufftType::CUFFT_C2C,
            (2 * s * n) as i32,
            Arc::clone(st),
        )?;
        Ok(GpuBackend {
            pfb,
            post,
            fft,
            channels,
            step,
            spectra: s,
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
            weights,
            frames: st.alloc_zeros(2 * s * step)?,
            power: st.alloc_zeros(2)?,
            gains: st.alloc_zeros(4 * channels)?,
            gains_host: vec![Complex32::new(f32::NAN, 0.0); 2 * channels],
            slots,
            next_slot: 0,
            in_flight: VecDeque::with_capacity(cfg.depth),
            runs: [None, None],
            out_bytes,
            // Measured best on the H100 (bench/gpu-notes.md): longer sections for longer rows.
            section: if channels >= 16384 { 64 } else { 32 },
            unzip: n,
            stile,
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
        let section = self.section.min(count);
        let cfg = LaunchConfig {
            grid_dim: (
                self.step.div_ceil(256) as u32,
                count.div_ceil(section) as u32,
                pols as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (s0, s1) = (starts[0] as i64, starts[1] as i64);
        let (stride, first, k, count, section) = (
            self.pol_stride as i64,
            first_pol as i32,
            k as i32,
            count as i32,
            section as i32,
        );
        let st = &self.gpu.compute;
        let mut b = st.launch_builder(&self.pfb);
        b.arg(&mut self.frames)
            .arg(&self.inputs[self.cur])
            .arg(&self.weights)
            .arg(&mut self.power)
            .arg(&s0)
            .arg(&s1)
            .arg(&stride)
            .arg(&first)
            .arg(&k)
            .arg(&count)
            .arg(&section);
        // SAFETY: the arguments match pfb_fir's signature; every index stays inside the
        // buffers (the pipeline checks windows against body + tail).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The frames of the heap being assembled, in natural order (pol-major, then spectrum,
    /// `step` f32 each): for the self-test's comparison with `dsp::pfb::pfb_fir`.
    pub fn read_frames(&mut self) -> Result<Vec<f32>, GpuError> {
        self.flush_runs()?;
        let raw = self.gpu.compute.clone_dtoh(&self.frames)?;
        let (n, m) = (self.unzip, self.channels / self.unzip);
        let mut out = vec![0f32; raw.len()];
        for (f, frame) in raw.chunks_exact(self.step).enumerate() {
            for (i, o) in out[f * self.step..(f + 1) * self.step]
                .iter_mut()
                .enumerate()
            {
                let zi = i / 2;
                *o = frame[2 * ((zi % n) * m + zi / n) + (i & 1)];
            }
        }
        Ok(out)
    }

    /// The digitiser power accumulated for the heap being assembled.
    pub fn read_power(&mut self) -> Result<[i64; 2], GpuError> {
        self.flush_runs()?;
        let p = self.gpu.compute.clone_dtoh(&self.power)?;
        Ok([p[0] as i64, p[1] as i64])
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
        self.resident[cur] = Some(chunk.id);
        if let Some(next) = chunk.next {
            // The slot after this one held the chunk before last: its compute is long done,
            // so the prefetch starts at once (with two slots it waited for the previous
            // chunk's compute to let go of its slot).
            let to = (cur + 1) % slots;
            let slot = &mut self.inputs[to];
            for p in 0..2 {
                let base = p * stride;
                h2d.memcpy_htod(
                    &next[p * pb..(p + 1) * pb],
                    &mut slot.slice_mut(base..base + pb),
                )?;
            }
            self.resident[to] = Some(chunk.id + 1);
        }
        Ok(())
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
        let st = Arc::clone(&self.gpu.compute);
        let (ptr, _record) = self.frames.device_ptr_mut(&st);
        // SAFETY: the plan covers exactly 2·S·n transforms of N/n points: the frames buffer.
        unsafe {
            cufft::result::exec_c2c(
                self.fft.handle(),
                ptr as *mut cufft::sys::cufftComplex,
                ptr as *mut cufft::sys::cufftComplex,
                -1,
            )
        }?;
        Ok(())
    }

    /// Post-process the transformed frames into output slot `idx` (device memory only; the
    /// heap's power is moved into the slot's counters).
    pub fn postproc(&mut self, idx: usize, input: &BackEndInput<'_>) -> Result<(), GpuError> {
        let (s, n) = (self.spectra, self.channels);
        assert_eq!(
            input.timestamps.len(),
            s,
            "a heap has spectra_per_heap spectra"
        );
        let st = Arc::clone(&self.gpu.compute);
        // Gains: uploaded when they change (rarely: a katcp request).
        let changed = (0..2).any(|p| input.gains[p] != &self.gains_host[p * n..(p + 1) * n]);
        if changed {
            for p in 0..2 {
                self.gains_host[p * n..(p + 1) * n].copy_from_slice(input.gains[p]);
            }
            let flat: &[f32] = bytemuck::cast_slice(&self.gains_host);
            st.memcpy_htod(flat, &mut self.gains)?;
        }
        let slot = &mut self.slots[idx];
        // θ_k/π = x·k + y per pol and spectrum (fengine_delay_convention.md §3; the kernel
        // evaluates it with sincospi): x = −δ/N, y = δ/2 + φ/π + (c mod 4)/2, reduced mod 2
        // in f64 before rounding to f32.
        {
            let ph = slot.phase_host.as_mut_slice()?;
            for p in 0..2 {
                for (j, d) in input.delays[p].iter().enumerate() {
                    let y = d.fine / 2.0
                        + d.phase / std::f64::consts::PI
                        + d.coarse.rem_euclid(4) as f64 / 2.0;
                    ph[2 * (p * s + j)] = (-d.fine / n as f64) as f32;
                    ph[2 * (p * s + j) + 1] = y.rem_euclid(2.0) as f32;
                }
            }
        }
        // The kernel keys the dither on timestamps[0] + spectrum·2N: a heap's spectra are
        // consecutive (the pipeline starts a new heap at any skip).
        debug_assert!(input
            .timestamps
            .windows(2)
            .all(|w| w[1] - w[0] == 2 * n as i64));
        let ts0 = input.timestamps[0];
        let seed = input.dither.unwrap_or(0);
        let cfg = LaunchConfig {
            grid_dim: (
                (n / self.unzip / 2 + 1).div_ceil(self.stile) as u32,
                s.div_ceil(32) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = st.launch_builder(&self.post);
        b.arg(&mut slot.out)
            .arg(&self.frames)
            .arg(&self.gains)
            .arg(&slot.phase_dev)
            .arg(&ts0)
            .arg(&seed)
            .arg(&mut self.power)
            .arg(&mut slot.stats);
        // SAFETY: the arguments match postproc's signature and sizes (CHANNELS, SPECTRA).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    fn submit(&mut self, input: &BackEndInput<'_>) -> Result<(), GpuError> {
        let idx = self.next_slot;
        self.next_slot = (idx + 1) % self.slots.len();
        self.fft()?;
        self.postproc(idx, input)?;
        let d2h = &self.gpu.d2h;
        let slot = &mut self.slots[idx];
        d2h.memcpy_dtoh(&slot.out, &mut slot.out_host)?;
        d2h.memcpy_dtoh(&slot.stats, &mut slot.stats_host)?;
        slot.done.record(d2h)?;
        self.in_flight.push_back(idx);
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
        Ok(self.copied.synchronize()?)
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        let step = self.step;
        match &mut self.runs[pol] {
            Some(r) if offset == r.offset + r.count * step && k == r.k + r.count => r.count += 1,
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
        Ok(self.gpu.compute.memset_zeros(&mut self.power)?)
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        Ok(self.submit(input)?)
    }

    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn finished(&mut self, wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        let Some(&idx) = self.in_flight.front() else {
            return Ok(None);
        };
        let slot = &self.slots[idx];
        if wait {
            slot.done.synchronize()?;
        } else if !slot.done.is_complete() {
            return Ok(None);
        }
        self.in_flight.pop_front();
        let slot = &mut self.slots[idx];
        let stats = slot.stats_host.as_slice()?;
        let clips = [stats[0] - slot.clips_seen[0], stats[1] - slot.clips_seen[1]];
        let power = [stats[2] as i64, stats[3] as i64];
        slot.clips_seen = [stats[0], stats[1]];
        Ok(Some(Finished {
            data: &slot.out_host.as_slice()?[..self.out_bytes],
            clips,
            power,
        }))
    }
}
