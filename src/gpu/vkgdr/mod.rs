//! GPU memory the host writes into directly (`--use-vkgdr`, after ska-sa/vkgdr; seed 000
//! §Network receive): Vulkan device-local host-visible memory — the part of device memory the
//! PCIe BAR window exposes — mapped into the host and imported into CUDA, so that one buffer
//! has a host address the receive path writes through and a device address the kernels and
//! copies read, and the host-to-device copy of what is written there disappears.
//!
//! Steps ([`VkgdrMemory::new`]): a Vulkan implementation (the loader, or the driver's ICD
//! loaded directly, `icd`); the physical device whose `deviceUUID` is the CUDA device's
//! (`cuDeviceGetUuid_v2`); a buffer and its memory from a device-local, host-visible,
//! host-coherent type (`bar`), allocated exportable as an opaque file descriptor; the memory
//! mapped with `vkMapMemory` (the host address), exported with `vkGetMemoryFdKHR` and imported
//! with `cuImportExternalMemory` + `cuExternalMemoryGetMappedBuffer` (the device address). It
//! is zeroed once, from the device. Dropped, it waits for the device, frees CUDA's mapping,
//! destroys the imported memory, then unmaps and frees the Vulkan memory and destroys the
//! device and instance.
//!
//! **How the host may use it.** The mapping is uncached and write-combined: stores are
//! gathered into 64-byte bursts across the bus, loads go across PCIe one by one (orders of
//! magnitude slower than host memory). The receive path only ever writes it, sequentially
//! (each payload `memcpy`'d once into place), and never reads it back on the host; the
//! presence flags and per-heap words stay in host memory. Write-combined stores leave the
//! writing core at the next serialising event, which includes any locked instruction (Intel
//! SDM vol. 3 §11.3.1): the chunk group hands a filled chunk on under a mutex, so every
//! payload byte is on its way to the device before the consumer can see the chunk, and PCIe
//! keeps those posted writes ahead of the consumer's later doorbell for the copy that reads
//! them.
//!
//! Every error says what is missing and names the flag to drop.

pub mod bar;
pub mod icd;
mod vulkan;

use std::os::fd::IntoRawFd;
use std::sync::Arc;

use ash::vk;
use cudarc::driver::{sys, CudaContext, CudaStream, CudaViewMut, DevicePtrMut, DriverError};

use vulkan::VulkanMemory;

/// Why vkgdr memory could not be had.
#[derive(Debug, thiserror::Error)]
pub enum VkgdrError {
    #[error("--use-vkgdr: {0}; install the Vulkan loader (libvulkan1) or the GPU driver's Vulkan ICD (an NVIDIA container needs NVIDIA_DRIVER_CAPABILITIES to include graphics), or drop --use-vkgdr")]
    NoVulkan(String),
    #[error(
        "--use-vkgdr: {what} offers Vulkan {version}; external memory needs 1.1: drop --use-vkgdr"
    )]
    OldVulkan { what: String, version: String },
    #[error("--use-vkgdr: no Vulkan device has the CUDA device's UUID {uuid} (Vulkan sees: {seen}); drop --use-vkgdr")]
    NoMatchingDevice { uuid: String, seen: String },
    #[error("--use-vkgdr: {device} cannot export memory as a file descriptor (VK_KHR_external_memory_fd); drop --use-vkgdr")]
    NoExternalMemoryFd { device: String },
    #[error("--use-vkgdr: {device} has no device-local host-visible host-coherent memory (no BAR window the host can write through; its memory types, \"not allowed\" for an exportable buffer: {types}); drop --use-vkgdr")]
    NoBarMemory { device: String, types: String },
    #[error("--use-vkgdr: {bytes} bytes ({}) asked for, but {device}'s device-local host-visible heap (the PCIe BAR window) is {heap} bytes ({}){}; drop --use-vkgdr or make the chunks smaller (--recv-chunk-samples)", bar::size(*.bytes), bar::size(*.heap), bar_hint(*.heap))]
    BarTooSmall {
        device: String,
        heap: u64,
        bytes: u64,
    },
    #[error("--use-vkgdr: allocating {bytes} bytes ({}) of device-local host-visible memory on {device} failed ({result:?}; the heap is {heap} bytes, {}){}; drop --use-vkgdr or make the chunks smaller (--recv-chunk-samples)", bar::size(*.bytes), bar::size(*.heap), bar_hint(*.heap))]
    Alloc {
        device: String,
        bytes: u64,
        heap: u64,
        result: vk::Result,
    },
    #[error("--use-vkgdr: Vulkan {call} failed: {result:?}; drop --use-vkgdr")]
    Vulkan {
        call: &'static str,
        result: vk::Result,
    },
    #[error("--use-vkgdr: CUDA could not import {bytes} bytes of Vulkan memory from {device}: {error}; drop --use-vkgdr")]
    Import {
        device: String,
        bytes: u64,
        error: DriverError,
    },
    #[error("--use-vkgdr: CUDA: {0}; drop --use-vkgdr")]
    Cuda(#[from] DriverError),
    #[error("--use-vkgdr: no memory asked for")]
    Empty,
}

impl VkgdrError {
    /// Whether the device itself lacks what vkgdr needs — Vulkan answered, and the memory it
    /// lists has no BAR window, or too small a one — as opposed
    /// to a failure on the way there (no driver found, a refused call), which may be cbf's.
    pub fn device_lacks_it(&self) -> bool {
        matches!(
            self,
            VkgdrError::NoBarMemory { .. } | VkgdrError::BarTooSmall { .. }
        )
    }
}

/// The advice a small BAR heap deserves: without resizable BAR the window is 256 MiB.
fn bar_hint(heap: u64) -> &'static str {
    if heap <= bar::CLASSIC_BAR {
        ": enable resizable BAR (Above 4G Decoding and Re-Size BAR Support in the host's firmware) to widen it to the GPU's memory"
    } else {
        ""
    }
}

/// A UUID as the usual hyphenated hex.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    [
        &hex[0..4],
        &hex[4..6],
        &hex[6..8],
        &hex[8..10],
        &hex[10..16],
    ]
    .map(|g| g.concat())
    .join("-")
}

/// CUDA's mapping of the imported memory: freed, then the import destroyed, on drop.
struct CudaImport {
    ctx: Arc<CudaContext>,
    external: sys::CUexternalMemory,
    ptr: sys::CUdeviceptr,
}

impl Drop for CudaImport {
    fn drop(&mut self) {
        // Nothing may still read or write the memory: wait for every stream first.
        let _ = self.ctx.synchronize();
        // SAFETY: the pointer and the import were made in `VkgdrMemory::new`, are released
        // once, the mapping before the import it maps.
        unsafe {
            let _ = self.ctx.bind_to_thread();
            let a = sys::cuMemFree_v2(self.ptr);
            let b = sys::cuDestroyExternalMemory(self.external);
            if a != sys::CUresult::CUDA_SUCCESS || b != sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(?a, ?b, "could not release CUDA's import of vkgdr memory");
            }
        }
    }
}

/// `len` bytes of device memory with a host mapping: written by the host through
/// [`VkgdrMemory::host_ptr`] (see the module docs for how), read by the device at
/// [`VkgdrMemory::device_ptr`].
pub struct VkgdrMemory {
    // Field order is drop order: CUDA lets go of the memory before Vulkan frees it.
    cuda: CudaImport,
    vulkan: VulkanMemory,
    len: usize,
}

// SAFETY: the handles are used only in `new` and on drop; the mapping's address is plain
// memory any thread may write (the owner of each range decides who writes it when).
unsafe impl Send for VkgdrMemory {}
// SAFETY: no method writes through the addresses.
unsafe impl Sync for VkgdrMemory {}

impl VkgdrMemory {
    /// `bytes` of vkgdr memory on `ctx`'s device, zeroed.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<VkgdrMemory, VkgdrError> {
        if bytes == 0 {
            return Err(VkgdrError::Empty);
        }
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        ctx.bind_to_thread()?;
        // SAFETY: writes one CUuuid for a device the context was made on.
        unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, ctx.cu_device()) }.result()?;
        let uuid = uuid.bytes.map(|b| b as u8);
        let libs = icd::vulkan_libs().map_err(VkgdrError::NoVulkan)?;
        let (vulkan, fd) = VulkanMemory::allocate(libs, uuid, bytes as u64)?;
        let desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
            type_: sys::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st__bindgen_ty_1 {
                fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            },
            size: vulkan.size,
            flags: if vulkan.dedicated {
                sys::CUDA_EXTERNAL_MEMORY_DEDICATED
            } else {
                0
            },
            reserved: [0; 16],
        };
        let import_err = |error: DriverError| VkgdrError::Import {
            device: vulkan.device_name.clone(),
            bytes: vulkan.size,
            error,
        };
        let mut external = std::ptr::null_mut();
        ctx.bind_to_thread()?;
        // SAFETY: `desc` describes the descriptor Vulkan exported for an allocation of
        // `vulkan.size` bytes. On success the driver owns the descriptor (so it is not closed
        // here); on failure `fd` closes it.
        unsafe { sys::cuImportExternalMemory(&mut external, &desc) }
            .result()
            .map_err(import_err)?;
        let _ = fd.into_raw_fd();
        let mut cuda = CudaImport {
            ctx: Arc::clone(ctx),
            external,
            ptr: 0,
        };
        let buffer = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset: 0,
            size: vulkan.size,
            flags: 0,
            reserved: [0; 16],
        };
        // SAFETY: maps the whole of the imported memory; released by `CudaImport`.
        unsafe { sys::cuExternalMemoryGetMappedBuffer(&mut cuda.ptr, external, &buffer) }
            .result()
            .map_err(import_err)?;
        // SAFETY: the mapping is `vulkan.size` bytes of device memory.
        unsafe { sys::cuMemsetD8_v2(cuda.ptr, 0, vulkan.size as usize) }.result()?;
        // A memset of device memory returns before it is done (CUDA's API synchronisation
        // rules: "asynchronous with respect to the host" unless the target is pinned host
        // memory), and the host writes this memory through the BAR with no stream between: without
        // this wait the zeros landed over the first bytes the host wrote (the self-test's
        // F-engine comparison saw 0.4 MiB of its first chunk zeroed, on the lent H100).
        ctx.synchronize()?;
        tracing::info!(
            device = %vulkan.device_name,
            bytes,
            heap_bytes = vulkan.heap,
            dedicated = vulkan.dedicated,
            "vkgdr memory: device memory the host writes through its BAR window"
        );
        Ok(VkgdrMemory {
            cuda,
            vulkan,
            len: bytes,
        })
    }

    /// Bytes usable (as asked for; the allocation may be larger).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host address of the first byte: write-only in practice (module docs).
    pub fn host_ptr(&self) -> *mut u8 {
        self.vulkan.host
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.cuda.ptr
    }

    /// The device address of `host`'s first byte if `host` lies wholly inside this memory.
    pub fn device_address(&self, host: &[u8]) -> Option<sys::CUdeviceptr> {
        let start = self.vulkan.host as usize;
        let p = host.as_ptr() as usize;
        (p >= start && p + host.len() <= start + self.len)
            .then(|| self.cuda.ptr + (p - start) as u64)
    }

    /// Queue on `stream` a device-to-device copy of `src` — bytes of this memory, named by
    /// their host address — into `dst` (as long). `Ok(false)`, nothing queued, if `src` is not
    /// wholly in this memory. The caller orders the copy after the host's writes of `src`
    /// (module docs) and keeps `src` unwritten until the copy is done; `dst`'s own reads and
    /// writes are ordered by cudarc as for any copy.
    pub fn copy_to_device(
        &self,
        stream: &Arc<CudaStream>,
        src: &[u8],
        dst: &mut CudaViewMut<'_, u8>,
    ) -> Result<bool, DriverError> {
        let Some(from) = self.device_address(src) else {
            return Ok(false);
        };
        if src.len() != dst.len() {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        stream.context().bind_to_thread()?;
        let (to, _record) = dst.device_ptr_mut(stream);
        // SAFETY: `from` is `src.len()` bytes of this memory's device mapping, `to` as many of
        // `dst`'s, on the stream `dst`'s pointer was taken for.
        unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, src.len(), stream.cu_stream()) }.result()?;
        Ok(true)
    }

    /// The Vulkan device's name and the size of the heap (BAR window) the memory came from.
    pub fn device_name(&self) -> &str {
        &self.vulkan.device_name
    }

    pub fn heap_bytes(&self) -> u64 {
        self.vulkan.heap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small BAR window's refusal gives both sizes, the remedy and the flag to drop; a large
    /// one's does not suggest resizable BAR.
    #[test]
    fn a_small_bar_window_is_explained() {
        let e = VkgdrError::BarTooSmall {
            device: "NVIDIA H100 PCIe".into(),
            heap: 256 << 20,
            bytes: 1 << 30,
        }
        .to_string();
        for want in [
            "--use-vkgdr",
            "1073741824 bytes (1.0 GiB)",
            "268435456 bytes (256.0 MiB)",
            "enable resizable BAR",
            "NVIDIA H100 PCIe",
            "--recv-chunk-samples",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        let e = VkgdrError::BarTooSmall {
            device: "x".into(),
            heap: 64 << 30,
            bytes: 80 << 30,
        }
        .to_string();
        assert!(!e.contains("resizable"), "{e}");
        let e = VkgdrError::Alloc {
            device: "x".into(),
            bytes: 1 << 30,
            heap: 256 << 20,
            result: vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
        }
        .to_string();
        assert!(e.contains("ERROR_OUT_OF_DEVICE_MEMORY") && e.contains("resizable BAR"));
    }

    /// Every refusal names the flag to drop.
    #[test]
    fn every_error_names_the_flag() {
        let errors = [
            VkgdrError::NoVulkan("no Vulkan loader".into()),
            VkgdrError::OldVulkan {
                what: "x".into(),
                version: "1.0.0".into(),
            },
            VkgdrError::NoMatchingDevice {
                uuid: uuid_text(&[0; 16]),
                seen: "llvmpipe".into(),
            },
            VkgdrError::NoExternalMemoryFd { device: "x".into() },
            VkgdrError::NoBarMemory {
                device: "x".into(),
                types: "0 L heap 0 (80.0 GiB)".into(),
            },
            VkgdrError::Vulkan {
                call: "vkCreateInstance",
                result: vk::Result::ERROR_INITIALIZATION_FAILED,
            },
        ];
        for e in errors {
            assert!(e.to_string().contains("--use-vkgdr"), "{e}");
        }
    }

    /// Only the device's own memory layout counts as the device lacking vkgdr; every failure
    /// on the way to asking it does not.
    #[test]
    fn only_the_memory_layout_means_the_device_lacks_it() {
        let lacks = [
            VkgdrError::NoBarMemory {
                device: "x".into(),
                types: "0 L heap 0 (80.0 GiB)".into(),
            },
            VkgdrError::BarTooSmall {
                device: "x".into(),
                heap: 256 << 20,
                bytes: 1 << 30,
            },
        ];
        assert!(lacks.iter().all(VkgdrError::device_lacks_it));
        let ours = [
            VkgdrError::NoVulkan("refused loader interface version 5".into()),
            VkgdrError::NoMatchingDevice {
                uuid: "u".into(),
                seen: "v".into(),
            },
            VkgdrError::NoExternalMemoryFd { device: "x".into() },
            VkgdrError::Vulkan {
                call: "vkCreateInstance",
                result: vk::Result::ERROR_INITIALIZATION_FAILED,
            },
            VkgdrError::Empty,
        ];
        assert!(!ours.iter().any(VkgdrError::device_lacks_it));
    }

    #[test]
    fn uuids_print_as_usual() {
        let u: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_text(&u), "00112233-4455-6677-8899-aabbccddeeff");
    }

    /// With no Vulkan at all (this machine) the search fails with every place it looked,
    /// never a crash.
    #[test]
    fn no_vulkan_is_an_error_naming_the_places_tried() {
        if let Err(e) = icd::vulkan_libs() {
            assert!(e.contains("libvulkan.so.1") && e.contains("/usr/share/vulkan/icd.d"));
        }
    }
}
