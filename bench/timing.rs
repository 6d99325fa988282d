//! Event timing shared by the GPU benchmarks (included with `#[path]`: each benchmark is its
//! own binary).

use cbf::gpu::Gpu;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::DriverError;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `reps` event-timed runs of `f` on the compute stream, after 2 warm-ups.
pub fn timed<E: From<DriverError>>(
    gpu: &Gpu,
    reps: usize,
    f: &mut dyn FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    let mut v = Vec::new();
    for rep in 0..reps + 2 {
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (gpu.ctx.new_event(timing)?, gpu.ctx.new_event(timing)?);
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
