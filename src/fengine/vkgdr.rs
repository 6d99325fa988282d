//! The F-engine's receive chunks in GPU memory (`--use-vkgdr`; seed 000 §Network receive):
//! every chunk is a slice of one [`VkgdrMemory`], which the receive threads write through its
//! host mapping and the CUDA backend's input slots copy from on the device
//! ([`super::cuda_input`]), so no sample crosses PCIe a second time. Such chunks are neither
//! page-locked nor bound to a NUMA node: they are not host memory.

use std::sync::Arc;

use crate::engine::{ConfigError, EngineError};
use crate::gpu::vkgdr::VkgdrMemory;
use crate::gpu::Gpu;
use crate::spead::recv::{ChunkGroup, ChunkGroupConfig, ExternalBuffer};

/// Where each chunk starts in the memory: page-aligned, so that chunks share no cache line and
/// the device copies start aligned.
const ALIGN: usize = 4096;

/// A chunk group for `config` whose chunks live in vkgdr memory on `gpu`, and that memory
/// (which the input slots are told of, to copy from it on the device).
pub(super) fn chunk_group(
    gpu: &Gpu,
    config: ChunkGroupConfig,
) -> Result<(Arc<ChunkGroup>, Arc<VkgdrMemory>), EngineError> {
    let stride = config.chunk_bytes.next_multiple_of(ALIGN);
    let bytes = stride
        .checked_mul(config.n_chunks)
        .ok_or_else(|| ConfigError::new("--recv-chunk-samples", "chunks too large"))?;
    let memory = Arc::new(
        VkgdrMemory::new(&gpu.ctx, bytes).map_err(|e| ConfigError::new("--use-vkgdr", e))?,
    );
    let base = memory.host_ptr();
    let buffers = (0..config.n_chunks)
        .map(|i| {
            // SAFETY: chunk i's `chunk_bytes` at i·stride lie inside the `bytes` mapped (each
            // below the next chunk's start), are reached only through this buffer, and stay
            // mapped while `memory`, which every buffer holds, lives.
            unsafe { ExternalBuffer::new(base.add(i * stride), config.chunk_bytes, memory.clone()) }
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ConfigError::new("--use-vkgdr", "the memory has no host mapping"))?;
    let group = ChunkGroup::with_buffers(config, buffers)
        .map_err(|e| ConfigError::new("--recv-chunk-samples", e))?;
    tracing::info!(
        bytes,
        heap_bytes = memory.heap_bytes(),
        device = memory.device_name(),
        "receive chunks in GPU memory (--use-vkgdr)"
    );
    Ok((group, memory))
}
