//! A batched in-place C2C cuFFT (seed 000 §Unzipping the FFT: N/n-point transforms of every
//! z^r of every frame).

use std::sync::Arc;

use cudarc::cufft::{self, CudaFft};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use super::GpuError;

pub struct BatchedFft {
    plan: CudaFft,
    stream: Arc<CudaStream>,
    len: usize,
}

impl BatchedFft {
    /// `batch` forward transforms of `points` complex values, on `stream`.
    pub fn new(
        stream: &Arc<CudaStream>,
        points: usize,
        batch: usize,
    ) -> Result<BatchedFft, GpuError> {
        Ok(BatchedFft {
            plan: CudaFft::plan_1d(
                points as i32,
                cufft::sys::cufftType::CUFFT_C2C,
                batch as i32,
                Arc::clone(stream),
            )?,
            stream: Arc::clone(stream),
            len: 2 * points * batch,
        })
    }

    /// Transform `data` (interleaved re/im f32, exactly the plan's size) in place.
    pub fn forward(&self, data: &mut CudaSlice<f32>) -> Result<(), GpuError> {
        if data.len() != self.len {
            return Err(GpuError::Backend(format!(
                "FFT plan covers {} values, buffer holds {}",
                self.len,
                data.len()
            )));
        }
        let (ptr, _record) = data.device_ptr_mut(&self.stream);
        // SAFETY: the plan covers exactly the buffer (checked above), in place on its stream.
        unsafe {
            cufft::result::exec_c2c(
                self.plan.handle(),
                ptr as *mut cufft::sys::cufftComplex,
                ptr as *mut cufft::sys::cufftComplex,
                -1,
            )
        }?;
        Ok(())
    }
}
