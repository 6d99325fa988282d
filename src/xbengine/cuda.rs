//! The XB-engine's CUDA backend (seed 001 §Signal Flow, §Synchronization and Coordination;
//! seed 003): the [`XbBackend`] the CPU backend implements, composed from the device ops of
//! `crate::gpu` ([`Correlator`], [`Beamformer`]), which know no engine.
//!
//! Seed 001's three command queues are the [`Gpu`]'s three streams:
//! - **host-to-device**: `load` copies the chunk (page-locked receive memory, see
//!   [`XbBackend::pin`]) into one of two device input slots and records `copied`; `release`
//!   waits for it, so the chunk goes back to the receivers as soon as its bytes are on the
//!   device, while the previous chunk may still be computing;
//! - **compute**: the corner turn and correlation of a batch range into the output's per-batch
//!   int64 accumulators, the reduce at a dump, the beamformer over every batch of the chunk;
//! - **device-to-host**: the reduced visibilities, the beams and the FRB beams into pinned
//!   host memory.
//!
//! cudarc records an event after each use of a device buffer and makes the next stream that
//! touches it wait for it; that is the event chain of seed 001 (copy → correlate → copy out),
//! and it also keeps a device input slot from being overwritten while the compute stream still
//! reads it. Every buffer is allocated at start-up.
//!
//! For benchmarks, [`CudaBackend::record_timeline`] event-times every copy and launch on the
//! stream it runs on ("h2d chunk", "correlate", "reduce", "d2h vis", "beamform", "d2h beams",
//! and the FRB outputs' spans), each span starting once its stream has made the waits on the
//! other streams that its work would make anyway, so that it times the work alone.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, PinnedHostSlice};

use super::backend::{
    BackendError, BeamChunk, BeamResult, FrbChunk, FrbRepoint, XbBackend, XbShape, BEAM_SLOTS,
};
use super::cuda_frb::{CudaFrb, CudaFrbSpec};
use crate::dsp::correlate::CorrShape;
use crate::gpu::beamform::{BeamformConfig, Beamformer};
use crate::gpu::correlate::{CorrConfig, CorrPath, Correlator};
use crate::gpu::memory::HostRegistrations;
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};

fn gpu_error(e: impl Into<GpuError>) -> BackendError {
    BackendError(e.into().to_string())
}

#[cfg(not(target_endian = "little"))]
compile_error!("xbengine::cuda hands out visibilities in host order, which must be little-endian");

/// The self-test and the benchmark drive the backend through the trait from code that
/// returns `GpuError`.
impl From<BackendError> for GpuError {
    fn from(e: BackendError) -> GpuError {
        GpuError::Backend(e.0)
    }
}

/// One output's dump in flight.
struct OutDump {
    buffer: Option<Vec<u8>>,
    clips: PinnedHostSlice<u64>,
    done: CudaEvent,
    /// The device copies straight into the buffer (it lies in memory given to `pin`), not
    /// through [`CudaBackend`]'s bounce buffer.
    in_place: bool,
}

/// Device input slots: a chunk is copied into one while the other is correlated.
const INPUT_SLOTS: usize = 2;

/// One beam result slot: on the device and in pinned host memory.
struct BeamSlot {
    data: CudaSlice<i8>,
    clips: CudaSlice<u64>,
    host_data: PinnedHostSlice<i8>,
    host_clips: PinnedHostSlice<u64>,
}

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    /// Bytes of one chunk.
    input_bytes: usize,
    inputs: Vec<CudaSlice<u8>>,
    /// The slot the loaded chunk is in.
    current: usize,
    /// Recorded on the host-to-device stream after the loaded chunk's copy.
    copied: CudaEvent,
    correlator: Correlator,
    /// Per output: `batches` int64 accumulators.
    acc: Vec<CudaSlice<i64>>,
    present: CudaSlice<u8>,
    host_present: PinnedHostSlice<u8>,
    vis: CudaSlice<i32>,
    clips: CudaSlice<u64>,
    /// Per output: the outstanding dump (the heap buffer being filled, its clip count in
    /// pinned memory, and the event after its copy-out).
    dumps: Vec<OutDump>,
    /// Pinned staging for heap buffers not given to `pin` (allocated at the first such dump).
    bounce: Option<PinnedHostSlice<i32>>,
    beamformer: Option<Beamformer>,
    beam_slots: Vec<BeamSlot>,
    next_beam_slot: usize,
    /// Host buffers page-locked by [`XbBackend::pin`] (receive chunks, X heap buffers),
    /// unlocked on drop.
    pinned: HostRegistrations,
    /// The `--frb-beam` outputs ([`super::cuda_frb`]).
    frb: Vec<CudaFrb>,
    /// Copies and launches, timed when a benchmark asks ([`CudaBackend::record_timeline`]).
    timeline: Timeline,
}

impl CudaBackend {
    /// A backend for chunks of `batches` batches of `shape` and `beams` beams (0: no
    /// beamformer), on `gpu`. The correlator is the fastest path the device runs.
    pub fn new(
        gpu: Arc<Gpu>,
        shape: XbShape,
        batches: usize,
        beams: usize,
    ) -> Result<CudaBackend, GpuError> {
        let corr_shape = CorrShape {
            n_ants: shape.n_ants,
            channels: shape.channels,
            spectra: shape.spectra,
        };
        let cfg = CorrConfig {
            shape: corr_shape,
            batches,
            in_bits: shape.sample_bits,
            path: CorrPath::best_for(&gpu),
        };
        let correlator = Correlator::new(Arc::clone(&gpu), cfg)?;
        tracing::info!(
            path = ?cfg.path,
            corner_turn = correlator.staging(),
            clusters = correlator.resident_clusters(),
            "correlator"
        );
        let st = &gpu.compute;
        let inputs = (0..INPUT_SLOTS)
            .map(|_| st.alloc_zeros::<u8>(cfg.input_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let acc = (0..shape.outputs)
            .map(|_| st.alloc_zeros::<i64>(cfg.acc_len()))
            .collect::<Result<Vec<_>, _>>()?;
        let vis_len = corr_shape.vis_len();
        let beamformer = if beams == 0 {
            None
        } else {
            Some(Beamformer::new(
                Arc::clone(&gpu),
                BeamformConfig {
                    n_ants: shape.n_ants,
                    channels: shape.channels,
                    spectra: shape.spectra,
                    batches,
                    beams,
                    in_bits: shape.sample_bits,
                },
            )?)
        };
        let beam_len = batches * beams * shape.channels * shape.spectra * 2;
        let beam_slots = if beams == 0 {
            Vec::new()
        } else {
            (0..BEAM_SLOTS)
                .map(|_| -> Result<BeamSlot, GpuError> {
                    Ok(BeamSlot {
                        data: st.alloc_zeros(beam_len)?,
                        clips: st.alloc_zeros(batches * beams)?,
                        host_data: host(&gpu, beam_len)?,
                        host_clips: host(&gpu, batches * beams)?,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(CudaBackend {
            inputs,
            current: 0,
            copied: gpu.ctx.new_event(None)?,
            correlator,
            acc,
            present: st.alloc_zeros(shape.n_ants)?,
            host_present: host(&gpu, shape.n_ants)?,
            vis: st.alloc_zeros(vis_len)?,
            clips: st.alloc_zeros(1)?,
            bounce: None,
            dumps: (0..shape.outputs)
                .map(|_| {
                    Ok(OutDump {
                        buffer: None,
                        clips: host(&gpu, 1)?,
                        done: gpu.ctx.new_event(None)?,
                        in_place: false,
                    })
                })
                .collect::<Result<Vec<_>, GpuError>>()?,
            beamformer,
            beam_slots,
            next_beam_slot: 0,
            pinned: HostRegistrations::new(Arc::clone(&gpu)),
            input_bytes: cfg.input_bytes(),
            frb: Vec::new(),
            timeline: Timeline::default(),
            gpu,
        })
    }

    /// With `--frb-beam` outputs, one per spec, over this backend's chunks (8-bit samples).
    pub fn with_frb(mut self, specs: &[CudaFrbSpec]) -> Result<CudaBackend, GpuError> {
        self.frb = specs
            .iter()
            .map(|spec| {
                let mut f = CudaFrb::new(&self.gpu, spec)?;
                f.timeline = self.timeline.clone();
                Ok(f)
            })
            .collect::<Result<_, GpuError>>()?;
        Ok(self)
    }

    /// Time every copy and launch from now on (for benchmarks); the handle summarises them
    /// per label (module doc).
    pub fn record_timeline(&mut self) -> Timeline {
        self.timeline.enable();
        for f in &mut self.frb {
            f.timeline = self.timeline.clone();
        }
        self.timeline.clone()
    }
}

/// Size `out` (a heap buffer) to `need` bytes and say whether it lies in memory given to
/// `pin`, so that the device may copy into it directly. A page-locked buffer too small is
/// refused: growing it would free memory the backend still has registered.
fn heap_buffer(
    pinned: &HostRegistrations,
    out: &mut Vec<u8>,
    need: usize,
    what: &str,
) -> Result<bool, BackendError> {
    if out.capacity() < need && pinned.covers(&out[..0]) {
        return Err(BackendError(format!(
            "{what} buffer given to pin holds {} bytes, the device writes {need}",
            out.capacity()
        )));
    }
    out.resize(need, 0);
    Ok(pinned.covers(out))
}

/// Pinned host memory the device writes and the host reads (not write-combined, which is
/// cudarc's default and slow to read).
pub(super) fn host<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<PinnedHostSlice<T>, GpuError> {
    // SAFETY: the memory is only read through `as_slice`, after the device wrote it (cudarc
    // waits for the write event), or after it was zeroed below.
    let mut h = unsafe { gpu.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }?;
    h.as_mut_slice()?.fill_with(|| {
        // SAFETY: T is ValidAsZeroBits.
        unsafe { std::mem::zeroed() }
    });
    Ok(h)
}

impl XbBackend for CudaBackend {
    fn load(&mut self, chunk: &[u8]) -> Result<(), BackendError> {
        if chunk.len() != self.input_bytes {
            return Err(BackendError(format!(
                "chunk of {} bytes, the backend was built for {}",
                chunk.len(),
                self.input_bytes
            )));
        }
        self.current = (self.current + 1) % INPUT_SLOTS;
        let (gpu, tl) = (&self.gpu, &self.timeline);
        let h2d = &gpu.h2d;
        let slot = &mut self.inputs[self.current];
        let t = tl.start_writing(gpu, h2d, slot).map_err(gpu_error)?;
        h2d.memcpy_htod(chunk, slot).map_err(gpu_error)?;
        self.copied.record(h2d).map_err(gpu_error)?;
        tl.end(gpu, h2d, "h2d chunk", t).map_err(gpu_error)
    }

    fn release(&mut self) -> Result<(), BackendError> {
        self.copied.synchronize().map_err(gpu_error)
    }

    fn correlate(&mut self, output: usize, batches: Range<usize>) -> Result<(), BackendError> {
        if batches.is_empty() {
            return Ok(());
        }
        let (gpu, tl) = (&self.gpu, &self.timeline);
        // The chunk's copy is the last work on the host-to-device stream.
        let t = tl
            .start_after(gpu, &gpu.compute, &gpu.h2d)
            .map_err(gpu_error)?;
        self.correlator
            .correlate_range(
                &self.inputs[self.current].as_view(),
                &mut self.acc[output],
                batches,
            )
            .map_err(gpu_error)?;
        tl.end(gpu, &gpu.compute, "correlate", t).map_err(gpu_error)
    }

    fn dump(
        &mut self,
        output: usize,
        present: &[bool],
        mut out: Vec<u8>,
    ) -> Result<(), BackendError> {
        if self.dumps[output].buffer.is_some() {
            return Err(BackendError(format!(
                "a dump of output {output} is already outstanding"
            )));
        }
        // Through pinned memory: a copy from pageable memory would wait for the compute
        // stream's queue to drain.
        let flags = self.host_present.as_mut_slice().map_err(gpu_error)?;
        for (f, &p) in flags.iter_mut().zip(present) {
            *f = u8::from(p);
        }
        let (gpu, tl) = (&self.gpu, &self.timeline);
        let st = &gpu.compute;
        // On the host-to-device stream, ahead of the next chunk's copy (the compute stream's
        // copy would wait behind it in the copy engine; see `gpu::beamform`).
        gpu.h2d
            .memcpy_htod(&self.host_present, &mut self.present)
            .map_err(gpu_error)?;
        let t = tl
            .start_writing(gpu, st, &mut self.vis)
            .map_err(gpu_error)?;
        self.correlator
            .reduce(
                &mut self.acc[output],
                &self.present,
                &mut self.vis,
                &mut self.clips,
                true,
            )
            .map_err(gpu_error)?;
        tl.end(gpu, st, "reduce", t).map_err(gpu_error)?;
        let in_place = heap_buffer(&self.pinned, &mut out, self.vis.len() * 4, "an X heap")?;
        let d2h = &gpu.d2h;
        let t = tl.start_after(gpu, d2h, st).map_err(gpu_error)?;
        let dump = &mut self.dumps[output];
        d2h.memcpy_dtoh(&self.clips, &mut dump.clips)
            .map_err(gpu_error)?;
        dump.in_place = in_place;
        if dump.in_place {
            let (src, _read) = self.vis.device_ptr(d2h);
            // SAFETY: `out` holds exactly the visibilities' bytes and lies in memory page-locked
            // by `pin`, whose caller keeps it alive and unmoved while this backend lives; it is
            // not touched until `dumped` has waited for `done`. `device_ptr` made d2h wait for
            // the reduce and records the read, so the next reduce waits for this copy.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut out[..], src, d2h.cu_stream())
                    .map_err(gpu_error)?;
            }
        } else {
            let bounce = match &mut self.bounce {
                Some(b) => b,
                None => self
                    .bounce
                    .insert(host(gpu, self.vis.len()).map_err(gpu_error)?),
            };
            d2h.memcpy_dtoh(&self.vis, bounce).map_err(gpu_error)?;
        }
        dump.done.record(d2h).map_err(gpu_error)?;
        dump.buffer = Some(out);
        tl.end(gpu, d2h, "d2h vis", t).map_err(gpu_error)
    }

    fn dumped(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError> {
        let dump = &mut self.dumps[output];
        let mut out = dump
            .buffer
            .take()
            .ok_or_else(|| BackendError(format!("no dump of output {output} is outstanding")))?;
        dump.done.synchronize().map_err(gpu_error)?;
        if !dump.in_place {
            let bounce = self
                .bounce
                .as_ref()
                .ok_or_else(|| BackendError("a staged dump without its bounce buffer".into()))?;
            // int32 little-endian on the wire is the host's own order (checked at compile
            // time above).
            out.copy_from_slice(bytemuck::cast_slice(bounce.as_slice().map_err(gpu_error)?));
        }
        let count = dump.clips.as_slice().map_err(gpu_error)?[0];
        Ok((out, count))
    }

    fn beamform(&mut self, input: &BeamChunk<'_>) -> Result<usize, BackendError> {
        let Some(bf) = &mut self.beamformer else {
            return Err(BackendError(
                "beamform called on a backend built without beams".into(),
            ));
        };
        let s = self.next_beam_slot;
        self.next_beam_slot = (s + 1) % BEAM_SLOTS;
        let slot = &mut self.beam_slots[s];
        let (gpu, tl) = (&self.gpu, &self.timeline);
        bf.set_beams(input.version, input.beams)
            .map_err(gpu_error)?;
        let t = tl
            .start_writing(gpu, &gpu.compute, &mut slot.data)
            .map_err(gpu_error)?;
        bf.form(
            &self.inputs[self.current].as_view(),
            input.present,
            input.first,
            input.batch_step,
            input.spectrum_step,
            input.dither,
            &mut slot.data,
            &mut slot.clips,
        )
        .map_err(gpu_error)?;
        tl.end(gpu, &gpu.compute, "beamform", t)
            .map_err(gpu_error)?;
        let d2h = &gpu.d2h;
        let t = tl.start_after(gpu, d2h, &gpu.compute).map_err(gpu_error)?;
        d2h.memcpy_dtoh(&slot.data, &mut slot.host_data)
            .map_err(gpu_error)?;
        d2h.memcpy_dtoh(&slot.clips, &mut slot.host_clips)
            .map_err(gpu_error)?;
        tl.end(gpu, d2h, "d2h beams", t).map_err(gpu_error)?;
        Ok(s)
    }

    fn beams(&mut self, slot: usize) -> Result<BeamResult<'_>, BackendError> {
        let slot = &self.beam_slots[slot];
        Ok(BeamResult {
            data: bytemuck::cast_slice(slot.host_data.as_slice().map_err(gpu_error)?),
            clips: slot.host_clips.as_slice().map_err(gpu_error)?,
        })
    }

    fn frb(
        &mut self,
        output: usize,
        input: &FrbChunk<'_>,
        mut out: Vec<u8>,
    ) -> Result<(), BackendError> {
        let chunk = self.inputs[self.current].as_view();
        let frb = self
            .frb
            .get_mut(output)
            .ok_or_else(|| BackendError(format!("no FRB output {output}")))?;
        let in_place = heap_buffer(&self.pinned, &mut out, frb.heap_bytes(), "an FRB heap")?;
        // SAFETY: a buffer `pinned` covers lies in memory page-locked by `pin`, whose caller
        // keeps it alive and unmoved while this backend lives, and the heap is not touched
        // until `frb_formed` returns it.
        unsafe { frb.form(&chunk, input, out, in_place) }
    }

    fn frb_repoint(&mut self, output: usize, repoint: FrbRepoint<'_>) -> Result<(), BackendError> {
        // W is built on the device from the positions (0.1 ms): no host table is needed.
        self.frb
            .get_mut(output)
            .ok_or_else(|| BackendError(format!("no FRB output {output}")))?
            .repoint(repoint.positions)
    }

    fn frb_formed(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError> {
        self.frb
            .get_mut(output)
            .ok_or_else(|| BackendError(format!("no FRB output {output}")))?
            .take()
            .ok_or_else(|| {
                BackendError(format!(
                    "no FRB intensities of output {output} are outstanding"
                ))
            })?
    }

    fn pin(&mut self, buffer: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: the caller keeps `buffer` alive and unmoved until this backend is dropped
        // (the contract of `XbBackend::pin`), and with it the registrations.
        unsafe { self.pinned.register(buffer) }.map_err(gpu_error)
    }
}
