//! Event timing and the copy ceiling, shared by the GPU benchmarks (included with `#[path]`:
//! each benchmark is its own binary and uses a part, hence `dead_code` is allowed).
#![allow(dead_code)]

use cbf::gpu::compile::Kernel;
use cbf::gpu::{Gpu, GpuError};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DriverError, LaunchConfig, PushKernelArg};

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Bytes of the device copy queued ahead of each timed launch of a kernel that the engine runs
/// behind other work (≈ 90 µs on an H100: longer than the host takes to issue the launches
/// behind it).
pub const PAD_BYTES: usize = 128 << 20;

/// A device copy to queue on the compute stream ahead of a timed launch ([`timed_behind`]), so
/// that the stream is busy when the host issues the launch and the events time the kernel
/// alone, not the host's launch call too.
pub struct Pad {
    src: CudaSlice<u8>,
    dst: CudaSlice<u8>,
}

impl Pad {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Pad, DriverError> {
        Ok(Pad {
            src: gpu.compute.alloc_zeros::<u8>(bytes)?,
            dst: gpu.compute.alloc_zeros::<u8>(bytes)?,
        })
    }

    /// Queue the copy on the compute stream.
    pub fn queue(&mut self, gpu: &Gpu) -> Result<(), DriverError> {
        gpu.compute.memcpy_dtod(&self.src, &mut self.dst)
    }
}

/// Median seconds of `reps` event-timed runs of `f` on the compute stream, after 2 warm-ups.
pub fn timed<E: From<DriverError>>(
    gpu: &Gpu,
    reps: usize,
    f: &mut dyn FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    timed_behind(gpu, reps, &mut || Ok(()), f)
}

/// [`timed`], with `before` queued ahead of each run's first event (work that keeps the
/// stream busy, so that the events time `f` alone and not the host's launch call).
pub fn timed_behind<E: From<DriverError>>(
    gpu: &Gpu,
    reps: usize,
    before: &mut dyn FnMut() -> Result<(), E>,
    f: &mut dyn FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    let mut v = Vec::new();
    for rep in 0..reps + 2 {
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (gpu.ctx.new_event(timing)?, gpu.ctx.new_event(timing)?);
        before()?;
        a.record(&gpu.compute)?;
        f()?;
        b.record(&gpu.compute)?;
        b.synchronize()?;
        if rep >= 2 {
            v.push(f64::from(a.elapsed_ms(&b)?) * 1e-3);
        }
    }
    Ok(median(v))
}

/// Device-to-device copy of `n` float4s (`kernels/copy.cu`), bytes read + written per second:
/// the faster of a persistent grid (8 blocks per SM) and one thread per float4.
pub fn copy_ceiling(gpu: &Gpu, n: usize) -> Result<f64, GpuError> {
    copy_rate(gpu, n, 0)
}

/// [`copy_ceiling`] at a kernel's own size: `n` float4s, each timed launch queued behind a
/// `pad`-byte device copy so that its events time the copy alone (as the launch-size kernels
/// are timed). A short launch pays its ramp and drain as a kernel of the same bytes does, so
/// this is the ceiling such a kernel can be held to.
pub fn copy_at_size(gpu: &Gpu, n: usize, pad: usize) -> Result<f64, GpuError> {
    copy_rate(gpu, n, pad)
}

/// The copy of `n` float4s, median of 10 event-timed launches, each behind a `pad`-byte device
/// copy (none for 0).
fn copy_rate(gpu: &Gpu, n: usize, pad: usize) -> Result<f64, GpuError> {
    let st = &gpu.compute;
    let src = st.alloc_zeros::<[f32; 4]>(n)?;
    let mut dst = st.alloc_zeros::<[f32; 4]>(n)?;
    let mut pad = (pad > 0).then(|| Pad::new(gpu, pad)).transpose()?;
    let f = gpu.function(Kernel::Copy, &vec![])?;
    let sms = gpu.sm_count()? as u32;
    let n64 = n as i64;
    let mut best = f64::MAX;
    for blocks in [sms * 8, n.div_ceil(256) as u32] {
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut before = || -> Result<(), GpuError> {
            if let Some(pad) = &mut pad {
                pad.queue(gpu)?;
            }
            Ok(())
        };
        best = best.min(timed_behind::<GpuError>(gpu, 10, &mut before, &mut || {
            let mut l = st.launch_builder(&f);
            l.arg(&mut dst).arg(&src).arg(&n64);
            // SAFETY: copy(float4*, const float4*, long long n) over two n-element buffers.
            unsafe { l.launch(cfg) }?;
            Ok(())
        })?);
    }
    Ok(2.0 * (n * 16) as f64 / best)
}
