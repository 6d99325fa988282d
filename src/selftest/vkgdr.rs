//! `--use-vkgdr` on this device (`gpu::vkgdr`): GPU memory the host writes through a mapping.
//!
//! - the host writes 64 MiB of random bytes through the mapping and the device copies them
//!   out: every byte as written (the receive path's direction);
//! - the device writes random bytes into the memory and the host reads them through the
//!   mapping (1 MiB at the start, middle and end: host reads of the BAR are slow);
//! - the F-engine's pipeline (`fengine::pipeline`, the engine's own code, on the CUDA backend
//!   with its shared input slots) over four consecutive chunks, once from host memory and once
//!   from chunks in vkgdr memory, whose slots are filled by device-to-device copies: every
//!   output heap identical, byte for byte, with the same clip counts (the first chunk's
//!   upload, each next chunk's prefetch and the last chunk's zero tail all run).
//!
//! A device without vkgdr is never a pass: the family stops with the allocation's error, which
//! says what is missing. Where that is the device's own memory layout (no BAR window in its
//! Vulkan memory, or too small a one), `selftest::run` lists the family as not
//! available instead of failed; any other error (no Vulkan driver, a refused call) fails it.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, DevicePtr};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::fengine_case::{self, BITS, CHANNELS, CHUNK_SAMPLES, HEAP_SAMPLES, SPECTRA};
use super::{random_bytes, Check, MIB};
use crate::dsp::samples::packed_len;
use crate::fengine::cuda::{default_depth, wideband_batch, GpuBackend};
use crate::fengine::cuda_input::{InputShape, SharedInput};
use crate::fengine::output::OutputSpec;
use crate::fengine::pipeline::{ChunkView, OutputHeap, Pipeline};
use crate::gpu::vkgdr::VkgdrMemory;
use crate::gpu::{Gpu, GpuError};

/// Chunks in the F-engine comparison (its shape is `fengine_case`'s).
const CHUNKS: usize = 4;

/// Write `bytes` at byte `at` of `memory` through its host mapping, as the receive path does
/// (one sequential copy), then fence so that the write-combined stores leave this core before
/// the device is asked to read them.
fn host_write(memory: &VkgdrMemory, at: usize, bytes: &[u8]) -> Result<(), GpuError> {
    if at + bytes.len() > memory.len() {
        return Err(GpuError::Backend("write past the vkgdr memory".into()));
    }
    // SAFETY: inside the mapping (checked); nothing else touches these bytes now.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), memory.host_ptr().add(at), bytes.len())
    };
    fence(Ordering::SeqCst);
    Ok(())
}

/// `len` bytes at byte `at` of `memory` as a slice of its host mapping (for the copies, which
/// look up its device address; never read on the host here).
fn host_slice(memory: &VkgdrMemory, at: usize, len: usize) -> &[u8] {
    assert!(at + len <= memory.len());
    // SAFETY: inside the mapping, which lives as long as `memory`; the device does not write
    // these bytes while the slice is used.
    unsafe { std::slice::from_raw_parts(memory.host_ptr().add(at), len) }
}

/// The host writes, the device reads.
fn host_to_device(gpu: &Arc<Gpu>, rng: &mut SmallRng) -> Result<Check, GpuError> {
    let n = 64 * MIB;
    let memory = VkgdrMemory::new(&gpu.ctx, n)?;
    let want = random_bytes(rng, n);
    host_write(&memory, 0, &want)?;
    let st = &gpu.h2d;
    let mut copy = st.alloc_zeros::<u8>(n)?;
    if !memory.copy_to_device(st, host_slice(&memory, 0, n), &mut copy.slice_mut(..))? {
        return Err(GpuError::Backend(
            "the mapping's address was not recognised".into(),
        ));
    }
    let got = st.clone_dtoh(&copy)?;
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    Ok(Check {
        name: "vkgdr host writes, device reads 64 MiB".into(),
        measured: differ as f64,
        limit: 0.0,
        pass: differ == 0,
        note: format!(
            "{differ} bytes differ; {} through {} of a {} heap",
            crate::gpu::vkgdr::bar::size(n as u64),
            memory.device_name(),
            crate::gpu::vkgdr::bar::size(memory.heap_bytes())
        ),
    })
}

/// The device writes, the host reads.
fn device_to_host(gpu: &Arc<Gpu>, rng: &mut SmallRng) -> Result<Check, GpuError> {
    let n = 16 * MIB;
    let memory = VkgdrMemory::new(&gpu.ctx, n)?;
    let want = random_bytes(rng, n);
    let st = &gpu.h2d;
    let src = st.clone_htod(&want)?;
    {
        let (from, _record) = src.device_ptr(st);
        // SAFETY: `n` bytes of `src` into the `n` bytes of the vkgdr memory's device mapping,
        // on the stream `src`'s pointer was taken for.
        unsafe { sys::cuMemcpyDtoDAsync_v2(memory.device_ptr(), from, n, st.cu_stream()) }
            .result()?;
    }
    st.synchronize()?;
    let mut differ = 0;
    for at in [0, n / 2 - MIB / 2, n - MIB] {
        let mut got = vec![0u8; MIB];
        // SAFETY: inside the mapping; the device's write is complete (synchronised).
        unsafe { std::ptr::copy_nonoverlapping(memory.host_ptr().add(at), got.as_mut_ptr(), MIB) };
        differ += got
            .iter()
            .zip(&want[at..at + MIB])
            .filter(|(a, b)| a != b)
            .count();
    }
    Ok(Check {
        name: "vkgdr device writes, host reads 3 × 1 MiB".into(),
        measured: differ as f64,
        limit: 0.0,
        pass: differ == 0,
        note: format!("{differ} bytes differ at the start, middle and end of 16 MiB"),
    })
}

/// One heap as the pipeline emitted it.
type Emitted = (u64, Vec<u8>, [u64; 2], bool);

/// The engine's pipeline over `chunks` (each chunk's bytes, pol-major), with the input slots
/// filled from `device_chunks` where given.
fn run_pipeline(
    gpu: &Arc<Gpu>,
    chunks: &[&[u8]],
    device_chunks: Option<Arc<VkgdrMemory>>,
    dither_seed: u64,
) -> Result<Vec<Emitted>, GpuError> {
    let (out, pcfg, tail) = fengine_case::wideband("vkgdr", dither_seed)?;
    let input = SharedInput::new(
        gpu,
        InputShape {
            sample_bits: BITS,
            body: CHUNK_SAMPLES,
            tail,
        },
    )?;
    if let Some(memory) = device_chunks {
        input.copy_on_device_from(memory);
    }
    let backend = GpuBackend::wideband(
        &input,
        &out,
        fengine_case::gpu_config(
            tail,
            // The engine's batch for these chunks (two heaps each): full batches over the 8 heaps.
            wideband_batch(SPECTRA, CHANNELS, CHUNK_SAMPLES),
            default_depth(SPECTRA, true),
            false,
        ),
    )?;
    let mut pipeline = Pipeline::with_backend(OutputSpec::Wideband(out), pcfg, Box::new(backend));
    let present = vec![1u8; 2 * CHUNK_SAMPLES / HEAP_SAMPLES];
    let view = |i: usize| ChunkView {
        chunk_id: i as u64,
        data: chunks[i],
        present: &present,
    };
    let mut heaps = Vec::new();
    // Heaps left in device memory have no host bytes to compare: counted and refused below
    // (this backend is built to copy every heap to the host), never compared as empty.
    let mut on_device = 0;
    let mut emit = |h: &OutputHeap<'_>| match h.data.host() {
        Some(bytes) => heaps.push((h.timestamp, bytes.to_vec(), h.clips, h.valid)),
        None => on_device += 1,
    };
    let failed = |e: crate::fengine::backend::BackendError| GpuError::Backend(e.to_string());
    for i in 0..chunks.len() {
        let next = (i + 1 < chunks.len()).then(|| view(i + 1));
        pipeline.process(view(i), next, &mut emit).map_err(failed)?;
    }
    pipeline.flush(&mut emit).map_err(failed)?;
    if on_device > 0 {
        return Err(GpuError::Backend(format!(
            "{on_device} heaps were left in device memory, with no host copy to compare"
        )));
    }
    Ok(heaps)
}

/// The F-engine's output from chunks in host memory and from chunks in vkgdr memory.
fn fengine_identical(gpu: &Arc<Gpu>, rng: &mut SmallRng) -> Result<Check, GpuError> {
    let chunk_bytes = 2 * packed_len(CHUNK_SAMPLES, BITS);
    let stride = chunk_bytes.next_multiple_of(4096);
    let host: Vec<Vec<u8>> = (0..CHUNKS)
        .map(|_| random_bytes(rng, chunk_bytes))
        .collect();
    let memory = Arc::new(VkgdrMemory::new(&gpu.ctx, CHUNKS * stride)?);
    for (i, c) in host.iter().enumerate() {
        host_write(&memory, i * stride, c)?;
    }
    let seed = rng.random();
    let from_host: Vec<&[u8]> = host.iter().map(Vec::as_slice).collect();
    let want = run_pipeline(gpu, &from_host, None, seed)?;
    let on_device: Vec<&[u8]> = (0..CHUNKS)
        .map(|i| host_slice(&memory, i * stride, chunk_bytes))
        .collect();
    let got = run_pipeline(gpu, &on_device, Some(Arc::clone(&memory)), seed)?;
    let valid = want.iter().filter(|h| h.3).count();
    // Which heaps differ (index, and whether it is one the engine sends), for the note.
    let which: Vec<String> = got
        .iter()
        .zip(&want)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| {
            let bytes = g.1.iter().zip(&w.1).filter(|(a, b)| a != b).count();
            format!(
                "heap {i} ({}, {bytes} bytes{})",
                if w.3 { "sent" } else { "not sent" },
                if (g.0, g.2, g.3) == (w.0, w.2, w.3) {
                    ""
                } else {
                    ", metadata too"
                }
            )
        })
        .collect();
    let differ = which.len() + got.len().abs_diff(want.len());
    // Two heaps per chunk, less those whose input reaches past the last chunk: at least one
    // per chunk, so that the comparison covers every chunk's copies.
    let enough = valid >= CHUNKS;
    Ok(Check {
        name: "vkgdr fengine output identical".into(),
        measured: differ as f64,
        limit: 0.0,
        pass: differ == 0 && enough,
        note: format!(
            "{differ} of {} heaps differ from those from host memory ({valid} valid{}; {} heaps \
             from vkgdr memory){}",
            want.len(),
            if enough { "" } else { ", TOO FEW" },
            got.len(),
            if which.is_empty() {
                String::new()
            } else {
                format!(": {}", which.join(", "))
            }
        ),
    })
}

/// Every vkgdr check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7c6d);
    Ok(vec![
        host_to_device(gpu, &mut rng)?,
        device_to_host(gpu, &mut rng)?,
        fengine_identical(gpu, &mut rng)?,
    ])
}
