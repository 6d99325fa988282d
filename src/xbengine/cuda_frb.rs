//! The CUDA backend's `--frb-beam` outputs (issue 17; seed 004): per output the GPU first stage
//! ([`FrbStage1`], the gridded fp16 tensor-core transform summed to intensities) over the
//! device copy of the chunk, then the second stage ([`FrbResampler`], cuBLAS: fp16 operands
//! by default, float32 with `stage2=f32`) to the output's beams, on the compute stream after
//! the chunk's beams; the beams are encoded to float16 on the device ([`F16Encoder`], the bits
//! of the CPU backend's `encode_f16`) and copied back into the heap, one chunk later.
//!
//! - **Beams**: a list's W is built on the device from the (θ, θ′) list at start-up and at each
//!   re-point (`?frb-beams`, [`super::frb_pointing`]) by [`FrbResampler::repoint`], queued on
//!   the compute stream between two chunks' stages: chunks already formed keep the old beams.
//! - **Weights**: per (channel, dish, pol) (`?frb-weights`, [`super::frb_weights`]), the first
//!   stage's own layout, uploaded only when their version changes. A channel's intensities are
//!   linear in its |W|², so each channel's weights are scaled by a power of two s_c that puts
//!   the channel's largest just below the first stage's fp16 range limit
//!   ([`FrbStage1::set_weights`]) and that channel's output by 1/s_c² (exact), so no finite
//!   weight is refused and a channel of small weights keeps its precision beside one of large.
//! - **fp16 second stage**: its inputs are scaled by a bound fixed at start-up,
//!   [`FrbConfig::max_intensity`] at the scaled weights' limit (below), which no intensity
//!   of any chunk can exceed whatever the weights, so nothing is measured per chunk, and the
//!   first stage writes them so, as fp16 ([`FrbIntensities::Float16`] with the resampler's
//!   s_I): the bits a conversion of its float32 output would give, without that pass. With
//!   `stage2=f32` both stages keep float32.
//! - **Missing antennas**: the engine zeroes missing heaps before the chunk is loaded, so they
//!   add nothing; the presence flags are not needed here.
//! - **Slow samples**: the configuration makes `t_ds` divide a chunk's spectra, so every call
//!   ends on a slow-sample boundary and returns all its rows (the op could carry partial sums
//!   across calls; the heap format has a fixed number of rows per chunk).
//! - **Encoding and copy back**, as the beams': [`CudaFrb::form`] queues the stages, the
//!   float16 encoding with each channel's scale (the output's `scale` × 1/s_c² of the weights
//!   the chunk is formed with, uploaded on the compute stream when the weights change, so
//!   chunks already queued keep theirs) and a copy of the bytes and the saturation count into
//!   the heap buffer on the device-to-host stream, and returns; cudarc's events order the
//!   copy after the encoding and the next chunk's encoding after the copy. The engine's heap
//!   buffers are page-locked ([`super::backend::XbBackend::pin`]), so the device writes the
//!   heap itself; a buffer that is not goes through one of [`FRB_SLOTS`] pinned staging
//!   buffers and is copied into on the host. [`CudaFrb::take`], called by the engine after it
//!   has queued the next chunk, waits for that copy only. Encoding on the host took 75–200 ms
//!   per 35 ms chunk at seed 004 case 5 on the device's host, and the staged copy 24 ms of
//!   the engine thread's (bench/RESULTS.md).
//! - **Timing** (benchmarks, [`super::cuda::CudaBackend::record_timeline`]): the two stages and
//!   the encoding and the copy back are event-timed on the streams they run on ("frb stage 1",
//!   "frb stage 2", "frb encode", "d2h frb"), each span starting once the stream has made the waits its work would make.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaView, DevicePtr, PinnedHostSlice};
use num_complex::Complex32;

use super::backend::{BackendError, FrbChunk, FRB_SLOTS};
use super::cuda::host;
use crate::dsp::frb::DishGrid;
use crate::dsp::frb_resample::FrbBeams;
use crate::gpu::f16_encode::F16Encoder;
use crate::gpu::frb::{FrbConfig, FrbIntensities, FrbStage1};
use crate::gpu::frb_resample::{FrbResampler, Precision};
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};

/// What one output's GPU stages are built from.
pub struct CudaFrbSpec {
    /// The first stage's shape; its output type is also the second stage's arithmetic:
    /// [`FrbIntensities::Float16`] for the fp16 GEMMs (default), `Float32` with `stage2=f32`.
    pub config: FrbConfig,
    pub grid: DishGrid,
    pub beams: FrbBeams,
    /// The float16 encoding's scale (`--frb-beam`'s `scale`).
    pub scale: f32,
}

/// One `--frb-beam` output on the GPU.
pub(super) struct CudaFrb {
    gpu: Arc<Gpu>,
    stage1: FrbStage1,
    resampler: FrbResampler,
    /// First stage's output, (channel, slow sample, p, q).
    intensities: Intensities,
    /// Second stage's output, (channel, slow sample, beam).
    beams: CudaSlice<f32>,
    encoder: F16Encoder,
    /// Per channel: the float16 encoding's scale for the weights last uploaded.
    encode_scales: CudaSlice<f32>,
    /// The beams as float16 little-endian, and how many saturated.
    encoded: CudaSlice<u8>,
    clips: CudaSlice<u64>,
    slots: Vec<FrbSlot>,
    /// Chunks formed and not yet taken, oldest first: their slot and heap buffer.
    pending: VecDeque<(usize, Vec<u8>)>,
    /// Bytes of one chunk's beams: float16 (channel, slow sample, beam).
    heap_bytes: usize,
    config: FrbConfig,
    scale: f32,
    /// The version of the weights last uploaded.
    version: Option<u64>,
    pub(super) timeline: Timeline,
}

/// The intensities between the stages, in the second stage's operand type.
enum Intensities {
    Float32(CudaSlice<f32>),
    /// fp16 bits of `scale`·I, `scale` the resampler's s_I.
    Float16 {
        half: CudaSlice<u16>,
        scale: f32,
    },
}

/// One chunk's beams on their way back.
struct FrbSlot {
    /// Staging for a heap buffer that is not page-locked: (channel, slow sample, beam) float16
    /// little-endian, written by the device-to-host stream (allocated at the first such chunk;
    /// the engine's buffers are page-locked and never need it).
    staging: Option<PinnedHostSlice<u8>>,
    /// The device wrote the heap buffer itself, not `staging`.
    in_place: bool,
    /// Values saturated by the encoding.
    clips: PinnedHostSlice<u64>,
    /// Recorded on the device-to-host stream after the chunk's copies.
    done: CudaEvent,
}

/// The power of two s that puts max |w| in (limit/2, limit] (1 for all-zero weights).
fn weight_scale(weights: &[Complex32], limit: f64) -> f64 {
    let max = weights
        .iter()
        .map(|w| f64::from(w.norm()))
        .fold(0.0, f64::max);
    crate::gpu::pow2_scale(max, limit)
}

/// Each channel's weights are scaled to at most this: a little below the first stage's limit,
/// which it refuses to reach. The fp16 second stage's bound on the intensities follows from it.
fn weight_limit(cfg: &FrbConfig) -> f64 {
    0.98 * cfg.max_weight()
}

impl CudaFrb {
    pub(super) fn new(gpu: &Arc<Gpu>, spec: &CudaFrbSpec) -> Result<CudaFrb, GpuError> {
        let cfg = spec.config;
        let stage1 = FrbStage1::new(Arc::clone(gpu), cfg, &spec.grid)?;
        let rows = cfg.channels * cfg.out_rows();
        let precision = match cfg.output {
            FrbIntensities::Float32 => Precision::Float32,
            FrbIntensities::Float16 => Precision::Float16 {
                max_intensity: cfg.max_intensity(weight_limit(&cfg)),
            },
        };
        let resampler = FrbResampler::new(gpu, cfg.rows, cfg.cols, &spec.beams, rows, precision)?;
        let st = &gpu.compute;
        let intensities = match resampler.half_scales() {
            None => Intensities::Float32(st.alloc_zeros(cfg.output_len())?),
            Some(s) => Intensities::Float16 {
                half: st.alloc_zeros(cfg.output_len())?,
                scale: s.intensity as f32,
            },
        };
        let len = rows * resampler.beams();
        let slots = (0..FRB_SLOTS)
            .map(|_| {
                Ok(FrbSlot {
                    staging: None,
                    in_place: false,
                    clips: host(gpu, 1)?,
                    done: gpu.ctx.new_event(None)?,
                })
            })
            .collect::<Result<_, GpuError>>()?;
        Ok(CudaFrb {
            intensities,
            beams: st.alloc_zeros(len)?,
            encoder: F16Encoder::new(gpu, cfg.channels, len / cfg.channels)?,
            encode_scales: st.alloc_zeros(cfg.channels)?,
            encoded: st.alloc_zeros(2 * len)?,
            clips: st.alloc_zeros(1)?,
            slots,
            pending: VecDeque::with_capacity(FRB_SLOTS),
            heap_bytes: 2 * len,
            gpu: Arc::clone(gpu),
            stage1,
            resampler,
            config: cfg,
            scale: spec.scale,
            version: None,
            timeline: Timeline::default(),
        })
    }

    /// Bytes of one chunk's heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    /// Queue the output's beams over `chunk` (the device copy of the loaded chunk) and their
    /// copy back; [`CudaFrb::take`] returns them in `out`, which holds [`CudaFrb::heap_bytes`]
    /// bytes. With `in_place` the device copies into `out` itself.
    ///
    /// # Safety
    /// With `in_place`, `out` lies in page-locked memory that stays alive and unmoved until
    /// [`CudaFrb::take`] has returned it.
    pub(super) unsafe fn form(
        &mut self,
        chunk: &CudaView<u8>,
        input: &FrbChunk<'_>,
        mut out: Vec<u8>,
        in_place: bool,
    ) -> Result<(), BackendError> {
        let cfg = self.config;
        let err = |e: GpuError| BackendError(e.to_string());
        if self.pending.len() >= FRB_SLOTS {
            return Err(BackendError(format!(
                "{FRB_SLOTS} FRB results of this output are already outstanding"
            )));
        }
        if out.len() != self.heap_bytes {
            return Err(BackendError(format!(
                "an FRB heap buffer of {} bytes, a chunk's beams take {}",
                out.len(),
                self.heap_bytes
            )));
        }
        if self.version != Some(input.version) {
            let per_channel = cfg.dishes * 2;
            if input.weights.len() != cfg.channels * per_channel {
                return Err(BackendError(format!(
                    "FRB weights: {} given, expected channels × dishes × 2 = {}",
                    input.weights.len(),
                    cfg.channels * per_channel
                )));
            }
            let limit = weight_limit(&cfg);
            let mut scaled = Vec::with_capacity(input.weights.len());
            // Per channel: the encoding's scale, the output's `scale` × 1/s_c².
            let mut scales = Vec::with_capacity(cfg.channels);
            for row in input.weights.chunks_exact(per_channel) {
                let s = weight_scale(row, limit);
                scaled.extend(row.iter().map(|&w| w * s as f32));
                // Beyond float32 (weights near its own limits) 1/s_c² is 0 or ∞, and the
                // encoding underflows or saturates, as those intensities would anyway.
                scales.push(self.scale * (1.0 / (s * s)) as f32);
            }
            self.stage1.set_weights(&scaled).map_err(err)?;
            self.gpu
                .compute
                .memcpy_htod(&scales, &mut self.encode_scales)
                .map_err(|e| err(e.into()))?;
            self.version = Some(input.version);
        }
        let gpu = Arc::clone(&self.gpu);
        let (compute, d2h) = (&gpu.compute, &gpu.d2h);
        let tl = &self.timeline;
        let t = tl.start_after(&gpu, compute, &gpu.h2d).map_err(err)?;
        let rows = match &mut self.intensities {
            Intensities::Float32(i) => self.stage1.run(chunk, i),
            Intensities::Float16 { half, scale } => self.stage1.run_half(chunk, half, *scale),
        }
        .map_err(err)?;
        tl.end(&gpu, compute, "frb stage 1", t).map_err(err)?;
        if rows != cfg.out_rows() {
            return Err(BackendError(format!(
                "FRB stage 1 ended {rows} slow samples per channel, expected {} (t_ds must divide \
                 the chunk's spectra)",
                cfg.out_rows()
            )));
        }
        let t = tl
            .start_writing(&gpu, compute, &mut self.beams)
            .map_err(err)?;
        let n = cfg.channels * rows;
        match &self.intensities {
            Intensities::Float32(i) => self.resampler.resample(&i.as_view(), n, &mut self.beams),
            Intensities::Float16 { half, .. } => {
                self.resampler
                    .resample_half(&half.as_view(), n, &mut self.beams)
            }
        }
        .map_err(err)?;
        tl.end(&gpu, compute, "frb stage 2", t).map_err(err)?;
        let t = tl
            .start_writing(&gpu, compute, &mut self.encoded)
            .map_err(err)?;
        compute
            .memset_zeros(&mut self.clips)
            .map_err(|e| err(e.into()))?;
        self.encoder
            .encode(
                &self.beams.as_view(),
                &self.encode_scales,
                &mut self.encoded,
                &mut self.clips,
                n * self.resampler.beams() / cfg.channels,
            )
            .map_err(err)?;
        tl.end(&gpu, compute, "frb encode", t).map_err(err)?;
        // A slot no outstanding chunk holds (fewer than FRB_SLOTS are, checked above).
        let s = (0..FRB_SLOTS)
            .find(|s| self.pending.iter().all(|p| p.0 != *s))
            .ok_or_else(|| BackendError("no free FRB result slot".into()))?;
        let slot = &mut self.slots[s];
        let t = tl.start_after(&gpu, d2h, compute).map_err(err)?;
        slot.in_place = in_place;
        if in_place {
            let (src, _read) = self.encoded.device_ptr(d2h);
            // SAFETY: `out` holds exactly the encoded bytes and lies in page-locked memory kept
            // alive and unmoved until `take` returns it (this function's contract), which waits
            // for `done` before handing it back. `device_ptr` made d2h wait for the encoding and
            // records the read, so the next chunk's encoding waits for this copy.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut out[..], src, d2h.cu_stream())
                    .map_err(|e| err(e.into()))?;
            }
        } else {
            let staging = match &mut slot.staging {
                Some(h) => h,
                None => slot
                    .staging
                    .insert(host(&gpu, self.heap_bytes).map_err(err)?),
            };
            d2h.memcpy_dtoh(&self.encoded, staging)
                .map_err(|e| err(e.into()))?;
        }
        d2h.memcpy_dtoh(&self.clips, &mut slot.clips)
            .map_err(|e| err(e.into()))?;
        slot.done.record(d2h).map_err(|e| err(e.into()))?;
        tl.end(&gpu, d2h, "d2h frb", t).map_err(err)?;
        self.pending.push_back((s, out));
        Ok(())
    }

    /// Re-point the output's beam list (tracking beams): the second stage's W is rebuilt on the
    /// compute stream from `positions`, after the stages of every chunk already formed and
    /// before those of the next, so no outstanding chunk changes.
    pub(super) fn repoint(&mut self, positions: &[(f64, f64)]) -> Result<(), BackendError> {
        self.resampler
            .repoint(positions)
            .map_err(|e| BackendError(e.to_string()))
    }

    /// The oldest outstanding result (`None`: none), waiting for its copy: the heap buffer,
    /// float16 (channel, slow sample, beam), and the count of values saturated.
    pub(super) fn take(&mut self) -> Option<Result<(Vec<u8>, u64), BackendError>> {
        let (s, mut out) = self.pending.pop_front()?;
        let slot = &self.slots[s];
        let read = || -> Result<(Vec<u8>, u64), GpuError> {
            slot.done.synchronize()?;
            let clips = slot.clips.as_slice()?[0];
            if !slot.in_place {
                let staging = slot
                    .staging
                    .as_ref()
                    .ok_or_else(|| GpuError::Backend("a staged FRB heap without staging".into()))?;
                out.copy_from_slice(staging.as_slice()?);
            }
            Ok((out, clips))
        };
        Some(read().map_err(|e| BackendError(e.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scaled largest weight lands in [limit/2, limit), and the factor is a power of two
    /// (no test weight sits exactly on a power of two of the limit).
    #[test]
    fn weight_scale_puts_the_largest_weight_just_below_the_limit() {
        for max in [1e-6f32, 0.01, 0.3, 1.0, 5.0, 1e4] {
            let w = [
                Complex32::new(max * 0.6, max * 0.8),
                Complex32::new(max / 7.0, 0.0),
            ];
            let s = weight_scale(&w, 15.0);
            assert_eq!(s.log2().fract(), 0.0, "{s} is not a power of two");
            let top = f64::from(max) * s;
            assert!((7.5..15.0).contains(&top), "max {max}: scaled to {top}");
        }
        assert_eq!(weight_scale(&[Complex32::new(0.0, 0.0)], 15.0), 1.0);
    }
}
