//! The back end of the F-engine's CUDA backend ([`super::cuda::GpuBackend`]): heaps of
//! spectra through the batched C2C cuFFT (in place) and the post-processing, `batch` heaps per
//! launch on the compute stream, then each launch's heaps and their clip and power counters to
//! pinned host memory on the device-to-host stream. `depth` output slots circulate, so heap
//! h's copy-out overlaps heap h+1's compute. The per-heap delay terms are written into mapped
//! host memory rather than copied (seed 000 §Postprocessing: small copies queue behind the
//! sample transfers), and moved into device memory once per launch by the post-processing op.
//!
//! With `--use-peerdirect` (seed 000 §PeerDirect) the heaps are not copied: each finished heap
//! is handed on as its place in the slot's device memory with a lease on the slot, and a slot
//! is written again only once every lease on it is back, that is, once the NIC has read its
//! heaps (`out_ring`); only the clip and power counters still come to the host.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaSlice;

use super::backend::{BackEndInput, Finished, HeapData};
use super::cuda_shape::GpuConfig;
use super::cuda_slot::OutSlot;
use super::out_ring::{OutRing, Taken};
use crate::dsp::postproc::{OutputBits, PhaseConvention};
use crate::engine::send::DevicePayload;
use crate::gpu::fft::BatchedFft;
use crate::gpu::postproc::{Postproc, PostprocShape};
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};
use crate::net::DeviceMemory;

/// Longest wait for the send thread to give a slot back before the heap about to be computed
/// is dropped (counted as `output_stalled_heaps`, logged; `out_ring`). It must exceed the
/// longest a send path that still makes progress can hold a slot: the heaps queued ahead of
/// it (at most every slot's, `OutRing::lendable`) leave at the paced rate, which keeps up
/// with the data rate, so in about the time they took to compute (well under a second for
/// the default depths); a heap whose link fails under it adds at most the ibverbs sender's
/// `STALL` (5 s) per interface it is tried on, since a failed link is then down (its trials
/// fail at once while the kernel says so) and with none up heaps are dropped without waiting.
/// With NICs stalling on up to four interfaces in turn that is 20 s; 30 s is reached only
/// when the send thread has stopped making progress altogether (a hung call, a bug).
const RETURN_LIMIT: Duration = Duration::from_secs(30);

pub struct BackEnd {
    gpu: Arc<Gpu>,
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
    /// Per heap of a batch: [pol][channel] complex gains.
    gains: CudaSlice<f32>,
    /// The latest gains on the device, their version (the pipeline's), and the version each
    /// batch position holds.
    gains_master: CudaSlice<f32>,
    gains_version: Option<u64>,
    gains_at: Vec<Option<u64>>,
    slots: Vec<OutSlot>,
    /// Which slot is filled, and when a slot is free again.
    ring: OutRing,
    out_bytes: usize,
    /// The dither seed of the heaps being batched.
    dither: Option<u64>,
    pub(super) timeline: Timeline,
}

impl BackEnd {
    pub fn new(
        gpu: Arc<Gpu>,
        fft: BatchedFft,
        post: PostprocShape,
        convention: PhaseConvention,
        step: usize,
        cfg: &GpuConfig,
    ) -> Result<BackEnd, GpuError> {
        let channels = post.channels;
        let hs = cfg.spectra_per_heap;
        let batch = cfg.batch.max(1);
        let s = hs * batch;
        let post = Postproc::new(&gpu, post)?;
        let out_bytes = channels
            * hs
            * if cfg.out_bits == OutputBits::Four {
                2
            } else {
                4
            };
        let depth = cfg.depth.max(1);
        let slots = (0..depth)
            .map(|_| OutSlot::new(&gpu, s, batch, out_bytes, cfg.peer))
            .collect::<Result<Vec<_>, _>>()?;
        let st = &gpu.compute;
        Ok(BackEnd {
            post,
            fft,
            channels,
            convention,
            step,
            heap_spectra: hs,
            spectra: s,
            gains: st.alloc_zeros(4 * channels * batch)?,
            gains_master: st.alloc_zeros(4 * channels)?,
            gains_version: None,
            gains_at: vec![None; batch],
            slots,
            ring: OutRing::new(depth, batch, cfg.peer),
            out_bytes,
            dither: None,
            timeline: Timeline::default(),
            gpu,
        })
    }

    /// The heap of the batch being filled (its position in the frames and power counters).
    pub fn pending(&self) -> usize {
        self.ring.pending()
    }

    /// Whether submitting the heap being filled launches the batch.
    pub fn fills_batch(&self) -> bool {
        self.ring.fills_batch()
    }

    /// The device memory the heaps are sent from, for the NIC to register
    /// (`--use-peerdirect`); none where they are copied to the host.
    pub fn peer_memory(&self) -> Vec<Arc<dyn DeviceMemory>> {
        self.slots
            .iter()
            .filter(|s| s.out_host.is_none())
            .map(|s| Arc::clone(&s.out) as Arc<dyn DeviceMemory>)
            .collect()
    }

    /// The batched C2C FFT of every frame, in place.
    pub fn fft(&mut self, frames: &mut CudaSlice<f32>) -> Result<(), GpuError> {
        self.fft.forward(frames)
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
        let b = self.ring.pending();
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
        let slot = &mut self.slots[self.ring.fill()];
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
    pub fn postproc(
        &mut self,
        frames: &CudaSlice<f32>,
        power: &mut CudaSlice<u64>,
        seed: Option<u64>,
    ) -> Result<(), GpuError> {
        let slot = &mut self.slots[self.ring.fill()];
        let mut out = slot.out.lock();
        self.post.launch(
            &self.gpu.compute,
            &mut out,
            frames,
            &self.gains,
            slot.phase_dev,
            slot.ts0_dev,
            seed.unwrap_or(0),
            power,
            &mut slot.stats,
        )
    }

    /// FFT and post-process the filling slot's heaps (all of the batch, however many were
    /// submitted: the rest are ignored), copy them out, and move on to the next slot.
    fn launch_batch(
        &mut self,
        frames: &mut CudaSlice<f32>,
        power: &mut CudaSlice<u64>,
    ) -> Result<(), GpuError> {
        let t = self.timeline.start(&self.gpu, &self.gpu.compute)?;
        self.fft(frames)?;
        self.postproc(frames, power, self.dither)?;
        self.timeline
            .end(&self.gpu, &self.gpu.compute, "compute fft+postproc", t)?;
        let d2h = &self.gpu.d2h;
        // The copy waits for this post-processing: the span starts after it, so it times the
        // copy alone.
        let t = self
            .timeline
            .start_after(&self.gpu, d2h, &self.gpu.compute)?;
        let slot = &mut self.slots[self.ring.fill()];
        if let Some(host) = &mut slot.out_host {
            d2h.memcpy_dtoh(&*slot.out.lock(), host)?;
        }
        // The counters come back either way; with the heaps left on the device, `done` (after
        // this copy, which waits for the post-processing that also wrote the heaps) says when
        // the NIC may read them.
        d2h.memcpy_dtoh(&slot.stats, &mut slot.stats_host)?;
        slot.done.record(d2h)?;
        self.timeline.end(&self.gpu, d2h, "d2h batch", t)?;
        self.ring.launched();
        Ok(())
    }

    /// Queue the heap whose spectra are in the frames at position `pending`, launching the
    /// batch once it is full.
    pub fn submit(
        &mut self,
        frames: &mut CudaSlice<f32>,
        power: &mut CudaSlice<u64>,
        input: &BackEndInput<'_>,
    ) -> Result<(), GpuError> {
        self.dither = input.dither;
        self.stage(input)?;
        if self.ring.submit() {
            self.launch_batch(frames, power)?;
        }
        Ok(())
    }

    /// The filling slot has room; a slot starts a new batch only once every heap of its
    /// previous one has been taken (its host buffers are about to be rewritten) and, sent from
    /// the device, returned by the send thread (`out_ring`).
    pub fn ready(&self) -> bool {
        self.ring.ready()
    }

    /// Wait for the send thread to return the filling slot (when nothing is left to take);
    /// false when it did not within [`RETURN_LIMIT`] (the heap must be dropped).
    pub fn wait_returned(&mut self) -> bool {
        self.ring.wait_returned(RETURN_LIMIT)
    }

    /// Most heaps lent to the send thread at once (0 where heaps are copied to the host).
    pub fn lendable(&self) -> usize {
        self.ring.lendable()
    }

    /// The oldest heap in flight, once done (waiting for it if `wait`, which also launches a
    /// partly filled batch holding it).
    pub fn finished(
        &mut self,
        wait: bool,
        frames: &mut CudaSlice<f32>,
        power: &mut CudaSlice<u64>,
    ) -> Result<Option<Finished<'_>>, GpuError> {
        let Some((idx, _)) = self.ring.oldest() else {
            return Ok(None);
        };
        if idx == self.ring.fill() && self.ring.pending() > 0 {
            // The oldest heap is in the batch still filling.
            if !wait {
                return Ok(None);
            }
            self.launch_batch(frames, power)?;
        }
        let slot = &self.slots[idx];
        if wait {
            self.timeline
                .wait("host waits for a heap", || slot.done.synchronize())?;
        } else if !slot.done.is_complete() {
            return Ok(None);
        }
        let Taken {
            slot: idx,
            heap: b,
            last,
            lease,
        } = self
            .ring
            .take()
            .ok_or_else(|| GpuError::Backend("no heap to take".into()))?;
        let ob = self.out_bytes;
        let slot = &mut self.slots[idx];
        let stats = slot.stats_host.as_slice()?;
        let clips = [
            stats[4 * b] - slot.clips_base[b][0],
            stats[4 * b + 1] - slot.clips_base[b][1],
        ];
        let power = [stats[4 * b + 2] as i64, stats[4 * b + 3] as i64];
        if last {
            // Every position's counters, the unused ones of a partial batch included, are the
            // base for the slot's next launch.
            for (base, st) in slot.clips_base.iter_mut().zip(stats.chunks_exact(4)) {
                *base = [st[0], st[1]];
            }
        }
        let data = match (&slot.out_host, lease) {
            (Some(host), _) => HeapData::Host(&host.as_slice()?[b * ob..(b + 1) * ob]),
            (None, Some(lease)) => HeapData::Device(DevicePayload {
                bytes: slot
                    .out
                    .bytes()
                    .slice(b * ob, ob)
                    .ok_or_else(|| GpuError::Backend("heap outside its slot".into()))?,
                lease,
            }),
            (None, None) => {
                return Err(GpuError::Backend(
                    "a slot sent from the device without a lease".into(),
                ))
            }
        };
        Ok(Some(Finished { data, clips, power }))
    }
}
