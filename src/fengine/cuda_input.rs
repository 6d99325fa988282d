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
//!
//! With `--use-vkgdr` the chunks themselves are in device memory, written by the receive
//! threads through its host mapping ([`SharedInput::copy_on_device_from`]): every copy above
//! becomes a device-to-device copy from the chunk's device address on the same stream, and
//! nothing else changes: slots, events, holds, and `copied`, which now marks the last copy
//! that reads the chunk's device memory, before the receivers may write into it again. (The
//! kernels could read the chunk where it lies instead of from a slot, but the tail, the next
//! chunk's head, would then be elsewhere, and every kernel would need two inputs; a copy on
//! the device costs a few tens of µs per chunk of the device's memory bandwidth.)

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaViewMut};

use super::backend::ChunkInput;
use crate::gpu::timeline::Timeline;
use crate::gpu::vkgdr::VkgdrMemory;
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
    /// Where the engine's chunks live in device memory (`--use-vkgdr`): chunks there are
    /// copied on the device, not across PCIe.
    device_chunks: Option<Arc<VkgdrMemory>>,
    slots: Vec<Arc<DeviceChunk>>,
    book: SlotBook,
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
            device_chunks: None,
            slots: (0..SLOTS).map(|_| slot()).collect::<Result<_, _>>()?,
            book: SlotBook::default(),
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

    /// Chunks lying in `memory` are copied from its device side from now on: device-to-device
    /// copies in place of the uploads (the slots, events and holds stay as they are).
    pub fn copy_on_device_from(&self, memory: Arc<VkgdrMemory>) {
        self.lock().device_chunks = Some(memory);
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
        let held = std::array::from_fn(|i| Arc::strong_count(&u.slots[i]) > 1);
        let slot = match u.book.plan(chunk.id, chunk.next.is_some(), held) {
            Some(Plan::Share(slot)) => slot,
            Some(Plan::Upload {
                slot,
                prefetched,
                next,
            }) => {
                let copied = u.upload(chunk, slot, prefetched, next);
                if copied.is_err() {
                    u.book = SlotBook::default();
                }
                copied?;
                slot
            }
            None => {
                return Err(GpuError::Backend(format!(
                    "every one of the {SLOTS} input slots is held"
                )))
            }
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

/// Which slot holds what, apart from the copies: a pure state machine, so that its choices
/// are tested without a device.
#[derive(Debug, Default)]
struct SlotBook {
    /// The slot whose chunk (body and tail) was uploaded last, and that chunk.
    current: Option<(usize, u64)>,
    /// The slot holding the next chunk's body (no tail yet), and that chunk.
    prefetched: Option<(usize, u64)>,
    /// When each slot was last chosen, to pick the least recently used free one.
    used: [u64; SLOTS],
    clock: u64,
}

/// What loading a chunk takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// The chunk is resident in this slot: nothing to copy.
    Share(usize),
    /// Upload the chunk into `slot` (its body too unless `prefetched`) with its tail, and the
    /// next chunk's head and then the rest of its body into `next`; without `next` (no next
    /// chunk, or no free slot) the tail comes from the host or is zeros.
    Upload {
        slot: usize,
        prefetched: bool,
        next: Option<usize>,
    },
}

impl SlotBook {
    /// The plan for chunk `id` (followed by a chunk if `has_next`) while outputs hold the
    /// slots marked in `held`; `None` if every slot it needs is held.
    fn plan(&mut self, id: u64, has_next: bool, held: [bool; SLOTS]) -> Option<Plan> {
        if let Some((slot, _)) = self.current.filter(|&(_, cur)| cur == id) {
            return Some(Plan::Share(slot));
        }
        let pre = self
            .prefetched
            .take()
            .filter(|&(s, p)| p == id && !held[s])
            .map(|(s, _)| s);
        let slot = match pre {
            Some(s) => s,
            None => self.free(held, None)?,
        };
        self.touch(slot);
        let next = if has_next {
            self.free(held, Some(slot))
        } else {
            None
        };
        if let Some(n) = next {
            self.touch(n);
        }
        self.current = Some((slot, id));
        self.prefetched = next.map(|n| (n, id.wrapping_add(1)));
        Some(Plan::Upload {
            slot,
            prefetched: pre.is_some(),
            next,
        })
    }

    /// The least recently used slot not held, other than `except`.
    fn free(&self, held: [bool; SLOTS], except: Option<usize>) -> Option<usize> {
        (0..SLOTS)
            .filter(|&i| Some(i) != except && !held[i])
            .min_by_key(|&i| self.used[i])
    }

    fn touch(&mut self, slot: usize) {
        self.clock += 1;
        self.used[slot] = self.clock;
    }
}

impl Uploads {
    /// The slot `i` for writing on the host-to-device stream, after every read of it.
    fn writable(&mut self, i: usize) -> Result<&mut DeviceChunk, GpuError> {
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
        let device_chunks = self.device_chunks.clone();
        let s = self.writable(i)?;
        for p in 0..2 {
            copy_in(
                &gpu,
                device_chunks.as_deref(),
                &host[p * pb + from..p * pb + to],
                &mut s.data.slice_mut(p * stride + from..p * stride + to),
            )?;
        }
        Ok(())
    }

    /// The copies of a [`Plan::Upload`]: `chunk` into slot `cur` (its body unless
    /// `prefetched`, its tail) and the next chunk into slot `next`.
    fn upload(
        &mut self,
        chunk: ChunkInput<'_>,
        cur: usize,
        prefetched: bool,
        next: Option<usize>,
    ) -> Result<(), GpuError> {
        let gpu = Arc::clone(&self.gpu);
        let h2d = &gpu.h2d;
        let (pb, tb, stride) = (self.pol_bytes, self.tail_bytes, self.pol_stride);
        if !prefetched {
            let t = self.timeline.start(&gpu, h2d)?;
            self.copy_body(cur, chunk.data, 0, pb)?;
            self.timeline.end(&gpu, h2d, "h2d body", t)?;
        }
        // Every copy that reads this chunk's host memory (a prefetch came earlier on the
        // same stream) is before this mark.
        self.copied.record(h2d)?;
        let next = next.zip(chunk.next);
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
                let device_chunks = self.device_chunks.clone();
                let dst = self.writable(cur)?;
                for p in 0..2 {
                    let at = p * stride + pb;
                    match chunk.next {
                        Some(next) => copy_in(
                            &gpu,
                            device_chunks.as_deref(),
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
        if let Some((to, next)) = next {
            // The rest of the next chunk's body, overlapping this chunk's compute.
            let t = self.timeline.start(&gpu, h2d)?;
            self.copy_body(to, next, tb, pb)?;
            self.timeline.end(&gpu, h2d, "h2d prefetch", t)?;
        }
        Ok(())
    }
}

/// `src` (a chunk's bytes) into `dst` on the host-to-device stream: a device-to-device copy
/// where the chunk lies in `device_chunks`, else an upload from host memory.
fn copy_in(
    gpu: &Gpu,
    device_chunks: Option<&VkgdrMemory>,
    src: &[u8],
    dst: &mut CudaViewMut<'_, u8>,
) -> Result<(), GpuError> {
    if let Some(memory) = device_chunks {
        if memory.copy_to_device(&gpu.h2d, src, dst)? {
            return Ok(());
        }
    }
    Ok(gpu.h2d.memcpy_htod(src, dst)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots as the copies of each plan would leave them, checked against what every load
    /// expects, with the holds of outputs that have loaded and not yet released.
    #[derive(Default)]
    struct Device {
        book: SlotBook,
        /// Per slot: the chunk whose body it holds, and whether its tail is there too.
        body: [Option<u64>; SLOTS],
        tail: [bool; SLOTS],
        held: [usize; SLOTS],
        /// Bodies copied from the host: whole at once, or as a prefetch (head, then the rest).
        bodies: usize,
        prefetches: usize,
        uploads: usize,
        shares: usize,
    }

    impl Device {
        /// An output loads chunk `id`: the slot it holds (the chunk's body and tail there).
        fn load(&mut self, id: u64, has_next: bool) -> Option<usize> {
            let held = self.held.map(|n| n > 0);
            let slot = match self.book.plan(id, has_next, held)? {
                Plan::Share(slot) => {
                    self.shares += 1;
                    slot
                }
                Plan::Upload {
                    slot,
                    prefetched,
                    next,
                } => {
                    self.uploads += 1;
                    assert!(!held[slot], "chunk {id} into held slot {slot}");
                    if prefetched {
                        assert_eq!(self.body[slot], Some(id), "prefetch of {id} lost");
                    } else {
                        self.bodies += 1;
                        self.body[slot] = Some(id);
                    }
                    self.tail[slot] = true;
                    if let Some(n) = next {
                        assert!(has_next && n != slot && !held[n], "next of {id} into {n}");
                        self.prefetches += 1;
                        self.body[n] = Some(id + 1);
                        self.tail[n] = false;
                    }
                    slot
                }
            };
            assert_eq!((self.body[slot], self.tail[slot]), (Some(id), true));
            self.held[slot] += 1;
            Some(slot)
        }

        fn release(&mut self, slot: usize) {
            self.held[slot] -= 1;
        }
    }

    /// Three outputs over 50 chunks, as the engine runs them: each chunk's samples cross to
    /// the device once (the first chunk's body, then every next chunk as a prefetch), the first
    /// output to load a chunk uploads it and the other two share it.
    #[test]
    fn outputs_in_step_upload_each_chunk_once() {
        let mut d = Device::default();
        let chunks = 50;
        for id in 0..chunks {
            for _ in 0..3 {
                let slot = d.load(id, id + 1 < chunks).expect("a free slot");
                d.release(slot);
            }
        }
        assert_eq!((d.uploads, d.shares), (50, 100));
        assert_eq!((d.bodies, d.prefetches), (1, 49));
    }

    /// A gap (no next chunk: no prefetch; the chunk after the gap uploaded whole), a chunk
    /// whose prefetch went unused, and an output that lags a chunk behind the others all find
    /// their chunk in its slot, and no held slot is written.
    #[test]
    fn gaps_and_a_lagging_output_still_find_their_chunk() {
        let mut d = Device::default();
        for (id, has_next) in [(0, true), (1, true), (2, false), (9, true), (10, true)] {
            for _ in 0..2 {
                let slot = d.load(id, has_next).unwrap();
                d.release(slot);
            }
        }
        assert_eq!((d.bodies, d.prefetches), (2, 4));
        // The prefetch of chunk 11 is not used: chunk 20 comes instead.
        let slot = d.load(20, true).unwrap();
        d.release(slot);
        assert_eq!(d.bodies, 3);
        // A lags one chunk behind B: while A holds chunk 21, B loads 22, 23 and 24.
        let a = d.load(21, true).unwrap();
        for id in 22..25 {
            let b = d.load(id, true).unwrap();
            assert_ne!(a, b);
            d.release(b);
        }
        d.release(a);
        // Every slot held (three outputs three chunks apart): the fourth load is refused.
        let held: Vec<usize> = (30..33).map(|id| d.load(id, false).unwrap()).collect();
        assert_eq!(d.load(40, false), None);
        for s in held {
            d.release(s);
        }
        assert!(d.load(40, false).is_some());
    }
}
