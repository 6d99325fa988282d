//! The input chunks on the device, uploaded once and shared by every output of a CUDA F-engine
//! (seed 000 §Multiple outputs: "the input is only transferred to the GPU once"; the chunks
//! are reference-counted to tell when every output is done with them).
//!
//! Three device slots, each one chunk of both polarisations: its body followed by its tail,
//! the next chunk's head, as long as the longest tail any output reads (an output's kernels
//! read only their own). Each sample crosses PCIe once: the first output to load chunk c
//! uploads chunk c+1's head into a free slot, copies it device-to-device into the tail of
//! chunk c's slot, then uploads the rest of chunk c+1's body behind it, overlapping chunk c's
//! compute; chunk c+1's load then needs only chunk c+2's head. The other outputs that load
//! chunk c find it resident and copy nothing.
//!
//! Who may touch a slot when:
//! - **Reference counts** (host): an output holds its chunk ([`InputHold`], an `Arc` of the
//!   slot) from its `load` to its `release`; a slot is written only while no output holds it
//!   (`Arc::get_mut`), so no chunk an output has yet to read is overwritten.
//! - **CUDA events** (device): every copy into a slot is on the host-to-device stream and
//!   is followed by the slot's `uploaded` event, which the compute stream waits on when an
//!   output takes hold; an output letting go records the slot's `read` event on the compute
//!   stream after its last launch, and the next copy into the slot waits on it. Every output
//!   launches on the one compute stream, so the last `read` recorded follows all of them.
//!   (cudarc's own per-buffer events order the same pairs; these make the protocol explicit.)
//! - **Host memory**: `copied` is recorded after the last copy that reads the current chunk's
//!   host memory; an output's `release` waits for it, after which the engine may reuse the
//!   chunk. The prefetch reads the next chunk's memory, which stays until its own turn.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::backend::ChunkInput;
use crate::gpu::timeline::Timeline;
use crate::gpu::{Gpu, GpuError};

/// Device slots: the chunk the outputs are computing, the next one arriving, and the one
/// before, whose last launches may still run (with two, the next chunk's upload waited for
/// the previous chunk's compute).
const SLOTS: usize = 3;

/// One slot: a chunk's samples on the device and the events around them.
pub struct DeviceChunk {
    /// Polarisation p's body at p·`pol_stride`, its tail straight after, then padding.
    pub data: CudaSlice<u8>,
    /// Recorded on the host-to-device stream after the slot's last copy.
    uploaded: CudaEvent,
    /// Recorded on the compute stream by each output that lets go of the slot.
    read: CudaEvent,
}

/// An output's hold on the chunk it loaded: the slot stays unwritten while held. Dropped
/// (the output lets go) once every launch that reads the slot is on the compute stream, it
/// records the slot's `read` event there.
pub struct InputHold {
    chunk: Arc<DeviceChunk>,
    compute: Arc<CudaStream>,
}

impl InputHold {
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.chunk.data
    }
}

impl Drop for InputHold {
    fn drop(&mut self) {
        if let Err(e) = self.chunk.read.record(&self.compute) {
            // cudarc's own event on the buffer still orders the next copy after the reads.
            tracing::warn!(error = %e, "could not record an input slot's read event");
        }
    }
}

/// The shape every sharing output must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputShape {
    pub sample_bits: u32,
    /// Samples per polarisation in a chunk, and in the longest tail.
    pub body: usize,
    pub tail: usize,
}

/// The uploads every output of one engine shares (clones share them).
#[derive(Clone)]
pub struct SharedInput {
    gpu: Arc<Gpu>,
    inner: Arc<Mutex<Uploads>>,
    shape: InputShape,
    pol_stride: usize,
}

struct Uploads {
    gpu: Arc<Gpu>,
    slots: Vec<Arc<DeviceChunk>>,
    /// The slot whose chunk (body and tail) was uploaded last, and that chunk.
    current: Option<(usize, u64)>,
    /// The slot holding the next chunk's body (no tail yet), and that chunk.
    prefetched: Option<(usize, u64)>,
    /// Slot uses in order, to pick the least recently used free one.
    used: [u64; SLOTS],
    clock: u64,
    pol_bytes: usize,
    tail_bytes: usize,
    pol_stride: usize,
    copied: CudaEvent,
    timeline: Timeline,
}

impl SharedInput {
    /// Slots for chunks of `shape` on `gpu` (the tail at most a chunk).
    pub fn new(gpu: &Arc<Gpu>, shape: InputShape) -> Result<SharedInput, GpuError> {
        if shape.tail > shape.body {
            return Err(GpuError::Backend(format!(
                "a tail of {} samples is longer than the chunk ({})",
                shape.tail, shape.body
            )));
        }
        let bits = shape.sample_bits as usize;
        let pol_bytes = shape.body * bits / 8;
        let tail_bytes = (shape.tail * bits).div_ceil(8).min(pol_bytes);
        let pol_stride = (pol_bytes + tail_bytes + 1).next_multiple_of(256);
        let slot = || -> Result<Arc<DeviceChunk>, GpuError> {
            Ok(Arc::new(DeviceChunk {
                data: gpu.h2d.alloc_zeros(2 * pol_stride)?,
                uploaded: gpu.ctx.new_event(None)?,
                read: gpu.ctx.new_event(None)?,
            }))
        };
        let uploads = Uploads {
            gpu: Arc::clone(gpu),
            slots: (0..SLOTS).map(|_| slot()).collect::<Result<_, _>>()?,
            current: None,
            prefetched: None,
            used: [0; SLOTS],
            clock: 0,
            pol_bytes,
            tail_bytes,
            pol_stride,
            copied: gpu.ctx.new_event(None)?,
            timeline: Timeline::default(),
        };
        Ok(SharedInput {
            gpu: Arc::clone(gpu),
            inner: Arc::new(Mutex::new(uploads)),
            shape,
            pol_stride,
        })
    }

    pub fn gpu(&self) -> Arc<Gpu> {
        Arc::clone(&self.gpu)
    }

    pub fn shape(&self) -> InputShape {
        self.shape
    }

    /// Bytes from one polarisation's samples to the next's in a slot.
    pub fn pol_stride(&self) -> usize {
        self.pol_stride
    }

    /// Time the copies from now on, into `timeline` (a benchmark's).
    pub fn record_timeline(&self, timeline: Timeline) {
        self.lock().timeline = timeline;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Uploads> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold `chunk` on the device, uploading it unless another output already did; the
    /// compute stream waits for its copies.
    pub fn acquire(&self, chunk: ChunkInput<'_>) -> Result<InputHold, GpuError> {
        let mut u = self.lock();
        let slot = match u.current {
            Some((slot, id)) if id == chunk.id => slot,
            _ => u.upload(chunk)?,
        };
        let chunk = Arc::clone(&u.slots[slot]);
        u.gpu.compute.wait(&chunk.uploaded)?;
        Ok(InputHold {
            chunk,
            compute: Arc::clone(&u.gpu.compute),
        })
    }

    /// Wait until no copy reads the host memory of the chunk uploaded last.
    pub fn wait_copied(&self) -> Result<(), GpuError> {
        let u = self.lock();
        let copied = &u.copied;
        Ok(u.timeline
            .wait("host waits for chunk copies", || copied.synchronize())?)
    }
}

impl Uploads {
    /// A slot no output holds, other than `except`: the least recently used.
    fn free_slot(&self, except: Option<usize>) -> Option<usize> {
        (0..SLOTS)
            .filter(|&i| Some(i) != except && Arc::strong_count(&self.slots[i]) == 1)
            .min_by_key(|&i| self.used[i])
    }

    /// The slot `i` for writing on the host-to-device stream, after every read of it.
    fn writable(&mut self, i: usize) -> Result<&mut DeviceChunk, GpuError> {
        self.clock += 1;
        self.used[i] = self.clock;
        let s = Arc::get_mut(&mut self.slots[i]).ok_or_else(|| {
            GpuError::Backend("an input slot still held was to be written".into())
        })?;
        self.gpu.h2d.wait(&s.read)?;
        Ok(s)
    }

    /// Bytes [from, to) of each polarisation of `host` (a chunk, pol-major) into slot `i` at
    /// the same offsets.
    fn copy_body(&mut self, i: usize, host: &[u8], from: usize, to: usize) -> Result<(), GpuError> {
        if from == to {
            return Ok(());
        }
        let (pb, stride) = (self.pol_bytes, self.pol_stride);
        let gpu = Arc::clone(&self.gpu);
        let s = self.writable(i)?;
        for p in 0..2 {
            gpu.h2d.memcpy_htod(
                &host[p * pb + from..p * pb + to],
                &mut s.data.slice_mut(p * stride + from..p * stride + to),
            )?;
        }
        Ok(())
    }

    /// Upload `chunk` (its body unless prefetched, its tail) and prefetch the next one; the
    /// slot it went to.
    fn upload(&mut self, chunk: ChunkInput<'_>) -> Result<usize, GpuError> {
        let gpu = Arc::clone(&self.gpu);
        let h2d = &gpu.h2d;
        let (pb, tb, stride) = (self.pol_bytes, self.tail_bytes, self.pol_stride);
        let prefetched = self
            .prefetched
            .take()
            .filter(|&(_, id)| id == chunk.id)
            .map(|(slot, _)| slot);
        let cur = match prefetched {
            Some(slot) => slot,
            None => {
                let slot = self.free_slot(None).ok_or_else(|| {
                    GpuError::Backend(format!("every one of the {SLOTS} input slots is held"))
                })?;
                let t = self.timeline.start(&gpu, h2d)?;
                self.copy_body(slot, chunk.data, 0, pb)?;
                self.timeline.end(&gpu, h2d, "h2d body", t)?;
                slot
            }
        };
        // Every copy that reads this chunk's host memory (a prefetch came earlier on the
        // same stream) is before this mark.
        self.copied.record(h2d)?;
        self.current = None;
        let next = match chunk.next {
            Some(next) => self.free_slot(Some(cur)).map(|slot| (slot, next)),
            None => None,
        };
        let t = self.timeline.start(&gpu, h2d)?;
        match next {
            Some((to, next)) => {
                // The next chunk's head into its own slot, and on into this chunk's tail.
                self.copy_body(to, next, 0, tb)?;
                let src = Arc::clone(&self.slots[to]);
                let dst = self.writable(cur)?;
                for p in 0..2 {
                    h2d.memcpy_dtod(
                        &src.data.slice(p * stride..p * stride + tb),
                        &mut dst.data.slice_mut(p * stride + pb..p * stride + pb + tb),
                    )?;
                }
            }
            None => {
                let dst = self.writable(cur)?;
                for p in 0..2 {
                    let at = p * stride + pb;
                    match chunk.next {
                        Some(next) => h2d.memcpy_htod(
                            &next[p * pb..p * pb + tb],
                            &mut dst.data.slice_mut(at..at + tb),
                        )?,
                        None => h2d.memset_zeros(&mut dst.data.slice_mut(at..at + tb))?,
                    }
                }
            }
        }
        self.slots[cur].uploaded.record(h2d)?;
        self.timeline.end(&gpu, h2d, "h2d tail", t)?;
        self.current = Some((cur, chunk.id));
        if let Some((to, next)) = next {
            // The rest of the next chunk's body, overlapping this chunk's compute.
            let t = self.timeline.start(&gpu, h2d)?;
            self.copy_body(to, next, tb, pb)?;
            self.timeline.end(&gpu, h2d, "h2d prefetch", t)?;
            self.prefetched = Some((to, chunk.id.wrapping_add(1)));
        }
        Ok(cur)
    }
}
