//! An output slot of the F-engine's CUDA backend ([`super::cuda::GpuBackend`]): one launch's
//! worth of heaps (a batch), its per-launch parameters and its way back to the host — or, with
//! `--use-peerdirect`, its heaps left in device memory for the NIC to read (seed 000
//! §PeerDirect; only the small counters come back). Every buffer is allocated at start-up.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};

use crate::gpu::memory::{mapped, PeerBuffer};
use crate::gpu::{Gpu, GpuError};

pub struct OutSlot {
    /// The heaps' delay terms ([pol][spectrum] pairs) and first timestamps ([heap]) in mapped
    /// pinned memory, which the kernel reads directly: a copy would queue behind the chunk
    /// transfers (seed 000 §Postprocessing).
    pub phase_host: PinnedHostSlice<f32>,
    pub phase_dev: u64,
    pub ts0_host: PinnedHostSlice<i64>,
    pub ts0_dev: u64,
    /// The heaps, in device memory that the NIC may also be registered to read.
    pub out: Arc<PeerBuffer>,
    /// Their copy on the host; none where they are sent from the device.
    pub out_host: Option<PinnedHostSlice<u8>>,
    /// Per heap: clip counts per pol (cumulative over the slot's launches), then power per pol.
    pub stats: CudaSlice<u64>,
    pub stats_host: PinnedHostSlice<u64>,
    /// The cumulative clip counts before the current launch, per heap.
    pub clips_base: Vec<[u64; 2]>,
    pub done: CudaEvent,
}

impl OutSlot {
    /// A slot for `batch` heaps of `out_bytes` each, `spectra` spectra in all; with `peer`,
    /// sent from the device (no host copy).
    pub fn new(
        gpu: &Gpu,
        spectra: usize,
        batch: usize,
        out_bytes: usize,
        peer: bool,
    ) -> Result<OutSlot, GpuError> {
        let (phase_host, phase_dev) = mapped::<f32>(gpu, 4 * spectra)?;
        let (ts0_host, ts0_dev) = mapped::<i64>(gpu, batch)?;
        let st = &gpu.compute;
        Ok(OutSlot {
            phase_host,
            phase_dev,
            ts0_host,
            ts0_dev,
            out: PeerBuffer::new(gpu, out_bytes * batch, peer)?,
            out_host: if peer {
                None
            } else {
                // SAFETY: written by the device-to-host copy before the host reads it.
                Some(unsafe { gpu.ctx.alloc_pinned_with_flags(out_bytes * batch, 0) }?)
            },
            stats: st.alloc_zeros(4 * batch)?,
            // SAFETY: as above.
            stats_host: unsafe { gpu.ctx.alloc_pinned_with_flags(4 * batch, 0) }?,
            clips_base: vec![[0; 2]; batch],
            done: gpu.ctx.new_event(None)?,
        })
    }
}
