//! Host memory the device reads directly: pinned pages mapped into the device's address space,
//! for small per-launch parameters that a copy would queue behind large transfers (seed 000
//! §Postprocessing).

use cudarc::driver::{DeviceRepr, PinnedHostSlice, ValidAsZeroBits};

use super::{Gpu, GpuError};

/// Pinned host memory of `len` values mapped into the device: (host slice, device address).
/// The device address lives as long as the slice, which its owner keeps beside it.
pub fn mapped<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<(PinnedHostSlice<T>, u64), GpuError> {
    // SAFETY: the host writes the memory before the device reads it; the device pointer is
    // the mapping of this allocation, valid until the slice is freed.
    unsafe {
        let mut host = gpu
            .ctx
            .alloc_pinned_with_flags::<T>(len, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)?;
        let mut dev = 0;
        cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, host.as_mut_ptr()?.cast(), 0)
            .result()?;
        Ok((host, dev))
    }
}
