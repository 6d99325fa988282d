//! `--use-peerdirect`'s GPU side on this device (seed 000 §PeerDirect), without a NIC: the
//! F-engine's pipeline (`fengine::pipeline` on the CUDA backend, the engine's own code) over
//! six chunks, once with the heaps copied to the host and once with them left in the output
//! slots' device memory (`GpuConfig::peer`), two slots of two heaps so that the slots cycle and
//! the pipeline has to wait for them.
//!
//! A stand-in for the send thread takes each device heap with its lease, holds it a few
//! milliseconds (as a paced send would), reads the heap's device bytes again and only then drops
//! the lease: if the backend rewrote a slot before its leases were back, the bytes read then
//! differ from those read when the heap was handed over. The heaps' bytes, read from the device
//! when handed over, must equal those of the host-copy run byte for byte (that run is itself
//! checked against the CPU oracle by the `fengine` family), with the same timestamps, clip
//! counts and validity.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::fengine_case::{self, BITS, CHUNK_SAMPLES, HEAP_SAMPLES};
use super::Check;
use crate::dsp::samples::packed_len;
use crate::engine::send::DevicePayload;
use crate::fengine::backend::{BackendError, HeapData};
use crate::fengine::cuda::GpuBackend;
use crate::fengine::output::OutputSpec;
use crate::fengine::pipeline::{ChunkView, OutputHeap, Pipeline};
use crate::gpu::{Gpu, GpuError};

/// Chunks in the comparison (their shape is `fengine_case`'s).
const CHUNKS: usize = 6;

/// A heap as emitted: timestamp, bytes, clip counts, validity.
type Emitted = (u64, Vec<u8>, [u64; 2], bool);

/// `len` bytes of device memory at `addr`, read synchronously.
fn read_device(gpu: &Gpu, addr: u64, len: usize) -> Result<Vec<u8>, GpuError> {
    gpu.ctx.bind_to_thread()?;
    let mut out = vec![0u8; len];
    // SAFETY: `addr` .. + len lies in an output slot, held alive by the backend and, while
    // this runs, by a lease the caller holds.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, addr) }?;
    Ok(out)
}

/// The pipeline over `chunks`, heaps copied to the host or (`peer`) left on the device and
/// handed, with their leases, to a stand-in send thread; the heaps, and how many of them the
/// stand-in found rewritten while it still held them.
fn run_pipeline(
    gpu: &Arc<Gpu>,
    chunks: &[Vec<u8>],
    peer: bool,
    dither_seed: u64,
) -> Result<(Vec<Emitted>, usize), GpuError> {
    let (out, pcfg, tail) = fengine_case::wideband("peer", dither_seed)?;
    let backend = GpuBackend::new(
        Arc::clone(gpu),
        &out,
        fengine_case::gpu_config(tail, 2, 2, peer),
    )?;
    let mut pipeline = Pipeline::with_backend(OutputSpec::Wideband(out), pcfg, Box::new(backend));
    if peer == pipeline.peer_memory().is_empty() {
        return Err(GpuError::Backend(
            "the backend's device memory does not match its mode".into(),
        ));
    }
    let rewritten = Arc::new(AtomicUsize::new(0));
    let (to_sender, sender_rx) = crossbeam_channel::unbounded::<(DevicePayload, Vec<u8>)>();
    let sender = {
        let (gpu, rewritten) = (Arc::clone(gpu), Arc::clone(&rewritten));
        std::thread::spawn(move || -> Result<(), GpuError> {
            for (d, was) in sender_rx {
                std::thread::sleep(Duration::from_millis(5));
                if read_device(&gpu, d.bytes.addr, d.bytes.len)? != was {
                    rewritten.fetch_add(1, Ordering::Relaxed);
                }
                drop(d.lease);
            }
            Ok(())
        })
    };
    let present = vec![1u8; 2 * CHUNK_SAMPLES / HEAP_SAMPLES];
    let view = |i: usize| ChunkView {
        chunk_id: i as u64,
        data: &chunks[i],
        present: &present,
    };
    let mut heaps = Vec::new();
    let mut error = None;
    let mut emit = |h: &OutputHeap<'_>| {
        let bytes = match &h.data {
            HeapData::Host(b) => b.to_vec(),
            HeapData::Device(d) => match read_device(gpu, d.bytes.addr, d.bytes.len) {
                Ok(b) => {
                    let _ = to_sender.send((d.clone(), b.clone()));
                    b
                }
                Err(e) => {
                    error.get_or_insert(e);
                    Vec::new()
                }
            },
        };
        heaps.push((h.timestamp, bytes, h.clips, h.valid));
    };
    let failed = |e: BackendError| GpuError::Backend(e.to_string());
    for i in 0..chunks.len() {
        let next = (i + 1 < chunks.len()).then(|| view(i + 1));
        pipeline.process(view(i), next, &mut emit).map_err(failed)?;
    }
    pipeline.flush(&mut emit).map_err(failed)?;
    drop(to_sender);
    sender
        .join()
        .map_err(|_| GpuError::Backend("the stand-in sender panicked".into()))??;
    if let Some(e) = error {
        return Err(e);
    }
    Ok((heaps, rewritten.load(Ordering::Relaxed)))
}

/// Heaps sent from device memory against heaps copied to the host.
fn peer_identical(gpu: &Arc<Gpu>, rng: &mut SmallRng) -> Result<Vec<Check>, GpuError> {
    let chunk_bytes = 2 * packed_len(CHUNK_SAMPLES, BITS);
    let chunks: Vec<Vec<u8>> = (0..CHUNKS)
        .map(|_| (0..chunk_bytes).map(|_| rng.random()).collect())
        .collect();
    let seed = rng.random();
    let (want, _) = run_pipeline(gpu, &chunks, false, seed)?;
    let (got, rewritten) = run_pipeline(gpu, &chunks, true, seed)?;
    let differ =
        got.iter().zip(&want).filter(|(g, w)| g != w).count() + got.len().abs_diff(want.len());
    let valid = want.iter().filter(|h| h.3).count();
    // More heaps than the two slots hold, so that the slots cycled through the leases.
    let enough = valid > 4;
    Ok(vec![
        Check {
            name: "peerdirect heaps from device memory identical".into(),
            measured: differ as f64,
            limit: 0.0,
            pass: differ == 0 && enough,
            note: format!(
                "{differ} of {} heaps differ from those copied to the host ({valid} valid{})",
                want.len(),
                if enough { "" } else { ", TOO FEW" }
            ),
        },
        Check {
            name: "peerdirect slots not rewritten while lent".into(),
            measured: rewritten as f64,
            limit: 0.0,
            pass: rewritten == 0,
            note: format!("{rewritten} heaps changed on the device while their lease was held"),
        },
    ])
}

/// Every peerdirect check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x9d1e);
    peer_identical(gpu, &mut rng)
}
