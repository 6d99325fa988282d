//! Host memory the device reads directly: pinned pages mapped into the device's address space,
//! for small per-launch parameters that a copy would queue behind large transfers (seed 000
//! §Postprocessing); host buffers page-locked in place ([`HostRegistrations`]); and device
//! memory a NIC may read directly ([`PeerBuffer`], `--use-peerdirect`).

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

/// Host buffers page-locked in place (`cuMemHostRegister`), so that copies from them run as
/// DMA straight from the buffer, asynchronously, at the link's rate: a copy from pageable
/// memory is staged through a driver buffer and returns only when done. They are also mapped
/// into the device's address space ([`HostRegistrations::device_address`]), so that device
/// code may read a chunk where it lies, across PCIe, without a copy queued first (issue 15's
/// "pinned, device-mapped" chunks; the F-engine still copies its chunks with the copy engines,
/// which overlap the kernels, where a kernel reading across the link would hold its SMs for
/// the transfer's duration). Engines register their
/// receive chunks (and the XB-engine its X heap buffers) once, before any receiver writes into
/// them; everything is unlocked on drop, after the device has finished with it. Nothing else is
/// ever registered: a registration outliving its memory would leave the driver DMA-ing to pages
/// the process no longer maps at that address (and a later copy from a new buffer there fails
/// with CUDA_ERROR_INVALID_VALUE), so registration is only for memory whose owner promises to
/// keep it.
pub struct HostRegistrations {
    gpu: std::sync::Arc<Gpu>,
    /// (start address, length, device address) of each buffer; the starts are handed back to
    /// the driver on drop.
    regions: Vec<(usize, usize, u64)>,
}

// SAFETY: the raw addresses are only handed back to the driver on drop.
unsafe impl Send for HostRegistrations {}
// SAFETY: no method reads or writes through the addresses.
unsafe impl Sync for HostRegistrations {}

impl HostRegistrations {
    pub fn new(gpu: std::sync::Arc<Gpu>) -> HostRegistrations {
        HostRegistrations {
            gpu,
            regions: Vec::new(),
        }
    }

    /// Page-lock `buffer` and map it for the device (nothing for an empty one).
    ///
    /// # Safety
    /// `buffer` stays alive and unmoved until `self` is dropped.
    pub unsafe fn register(&mut self, buffer: &mut [u8]) -> Result<(), GpuError> {
        if buffer.is_empty() {
            return Ok(());
        }
        self.gpu.ctx.bind_to_thread()?;
        use cudarc::driver::sys;
        let host = buffer.as_mut_ptr();
        sys::cuMemHostRegister_v2(
            host.cast(),
            buffer.len(),
            sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
        )
        .result()?;
        let mut dev = 0;
        if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0).result() {
            let _ = sys::cuMemHostUnregister(host.cast());
            return Err(e.into());
        }
        self.regions.push((host as usize, buffer.len(), dev));
        Ok(())
    }

    /// The device's address of `buffer`'s first byte, if `buffer` lies wholly inside one
    /// locked buffer: device code reads and writes it there, across PCIe.
    pub fn device_address(&self, buffer: &[u8]) -> Option<u64> {
        let (p, n) = (buffer.as_ptr() as usize, buffer.len().max(1));
        self.regions
            .iter()
            .find(|&&(s, len, _)| s <= p && p + n <= s + len)
            .map(|&(s, _, dev)| dev + (p - s) as u64)
    }

    /// Whether `buffer` lies wholly inside one locked buffer, so that the device may copy
    /// into it asynchronously (an empty one: whether its address lies inside one).
    pub fn covers(&self, buffer: &[u8]) -> bool {
        self.device_address(buffer).is_some()
    }

    /// How many buffers are locked.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

impl Drop for HostRegistrations {
    fn drop(&mut self) {
        if self.regions.is_empty() {
            return;
        }
        // Nothing may still read the buffers: wait for every stream before unlocking them.
        let _ = self.gpu.ctx.synchronize();
        for &(p, _, _) in &self.regions {
            // SAFETY: `p` was registered by `register`, whose contract keeps its buffer alive
            // until now.
            let r = unsafe { cudarc::driver::sys::cuMemHostUnregister(p as *mut _) };
            if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(?r, "could not unlock a page-locked buffer");
            }
        }
    }
}

/// Device memory that the kernels write and a NIC reads directly (GPUDirect RDMA,
/// `--use-peerdirect`; seed 000 §PeerDirect): shared (`Arc`) between the op that fills it and
/// the transport that registers it with the NIC, so that it is freed only once both are done
/// with it. The op takes the slice through [`PeerBuffer::lock`], uncontended (the transport
/// only ever uses the address). For a NIC, `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` is set on it, as
/// NVIDIA's GPUDirect RDMA guide asks of memory a third-party device reads, so that synchronous
/// memory operations on it are complete when they return.
pub struct PeerBuffer {
    slice: std::sync::Mutex<cudarc::driver::CudaSlice<u8>>,
    bytes: crate::net::DeviceBytes,
}

impl PeerBuffer {
    /// `len` zeroed bytes of device memory on `gpu`'s compute stream, prepared for a NIC to
    /// read where `for_nic`.
    pub fn new(
        gpu: &Gpu,
        len: usize,
        for_nic: bool,
    ) -> Result<std::sync::Arc<PeerBuffer>, GpuError> {
        use cudarc::driver::{sys, DevicePtr};
        let slice = gpu.compute.alloc_zeros::<u8>(len.max(1))?;
        let addr = {
            let (ptr, _sync) = slice.device_ptr(&gpu.compute);
            ptr
        };
        if for_nic {
            let on: u32 = 1;
            // SAFETY: `addr` is the base of a live allocation of this context; the attribute
            // takes a pointer to an unsigned int.
            unsafe {
                sys::cuPointerSetAttribute(
                    (&on as *const u32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                    addr,
                )
                .result()?;
            }
        }
        Ok(std::sync::Arc::new(PeerBuffer {
            slice: std::sync::Mutex::new(slice),
            bytes: crate::net::DeviceBytes { addr, len },
        }))
    }

    /// The memory, for an op to write or a copy to read.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, cudarc::driver::CudaSlice<u8>> {
        self.slice
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where it lies.
    pub fn bytes(&self) -> crate::net::DeviceBytes {
        self.bytes
    }
}

// SAFETY: the range is that of the slice this value owns, allocated at construction and freed
// only when the value is dropped; the slice is never reallocated.
unsafe impl crate::net::DeviceMemory for PeerBuffer {
    fn bytes(&self) -> crate::net::DeviceBytes {
        self.bytes
    }
}
