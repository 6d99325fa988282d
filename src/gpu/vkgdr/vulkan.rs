//! The Vulkan half of vkgdr memory: an instance and a device on the GPU whose UUID is the CUDA
//! device's, one buffer's worth of device-local host-visible memory allocated exportable as an
//! opaque file descriptor (bound to the buffer where the driver lets a buffer use that memory,
//! else on its own), and that memory mapped into the host. Everything it made is
//! destroyed, in reverse order, when it is dropped, also when it stops half way on an error.

use std::os::fd::{FromRawFd, OwnedFd};

use ash::vk;

use super::bar::{self, NoBar};
use super::icd::{vk_str, VulkanLib};
use super::VkgdrError;

/// Device-local host-visible memory and the Vulkan objects behind it.
pub struct VulkanMemory {
    instance: ash::Instance,
    device: Option<ash::Device>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// The host mapping of `memory` (null until mapped).
    pub host: *mut u8,
    /// The allocation's size (at least the bytes asked for): what CUDA imports.
    pub size: u64,
    /// Whether the allocation is dedicated to its buffer (CUDA must be told on import).
    pub dedicated: bool,
    /// The device's name, and the size of the heap the memory came from (the BAR window).
    pub device_name: String,
    pub heap: u64,
    /// Dropped last: the library the instance's functions live in.
    _lib: VulkanLib,
}

fn vk_err(call: &'static str) -> impl Fn(vk::Result) -> VkgdrError {
    move |result| VkgdrError::Vulkan { call, result }
}

/// What one Vulkan implementation offered when none had the CUDA device.
fn describe(instance: &ash::Instance, pd: vk::PhysicalDevice) -> (String, [u8; 16], u32) {
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
    // SAFETY: `pd` came from this instance, whose API version is at least 1.1 (checked by the
    // caller), so vkGetPhysicalDeviceProperties2 exists; `props` chains only core structures.
    unsafe { instance.get_physical_device_properties2(pd, &mut props) };
    let p = props.properties;
    (vk_str(&p.device_name), id.device_uuid, p.api_version)
}

impl VulkanMemory {
    /// `bytes` of device-local host-visible memory on the device with UUID `uuid`, from the
    /// first of `libs` that has that device, with its exported file descriptor.
    pub fn allocate(
        libs: Vec<VulkanLib>,
        uuid: [u8; 16],
        bytes: u64,
    ) -> Result<(VulkanMemory, OwnedFd), VkgdrError> {
        let mut seen = Vec::new();
        for lib in libs {
            match Self::on_device(lib, uuid, bytes, &mut seen)? {
                Some(found) => return Ok(found),
                None => continue,
            }
        }
        Err(VkgdrError::NoMatchingDevice {
            uuid: super::uuid_text(&uuid),
            seen: if seen.is_empty() {
                "no devices".into()
            } else {
                seen.join(", ")
            },
        })
    }

    /// The allocation through `lib`, or `None` (each device it sees noted in `seen`) if it
    /// has no device with `uuid`.
    fn on_device(
        lib: VulkanLib,
        uuid: [u8; 16],
        bytes: u64,
        seen: &mut Vec<String>,
    ) -> Result<Option<(VulkanMemory, OwnedFd)>, VkgdrError> {
        // SAFETY: a global command of a loaded entry.
        let version = unsafe { lib.entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_1 {
            return Err(VkgdrError::OldVulkan {
                what: lib.source.clone(),
                version: version_text(version),
            });
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"cbf")
            .api_version(vk::API_VERSION_1_1);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: a valid create-info with no layers or extensions.
        let instance = unsafe { lib.entry.create_instance(&info, None) }
            .map_err(vk_err("vkCreateInstance"))?;
        let mut mem = VulkanMemory {
            instance,
            device: None,
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            host: std::ptr::null_mut(),
            size: 0,
            dedicated: false,
            device_name: String::new(),
            heap: 0,
            _lib: lib,
        };
        // SAFETY: the instance is live.
        let pds = unsafe { mem.instance.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        let mut found = None;
        for pd in pds {
            let (name, id, api) = describe(&mem.instance, pd);
            seen.push(format!("{name} (UUID {})", super::uuid_text(&id)));
            if id == uuid {
                found = Some((pd, name, api));
                break;
            }
        }
        let Some((pd, name, api)) = found else {
            return Ok(None);
        };
        if api < vk::API_VERSION_1_1 {
            return Err(VkgdrError::OldVulkan {
                what: format!("{name} through {}", mem._lib.source),
                version: version_text(api),
            });
        }
        mem.device_name = name;
        let fd = mem.allocate_on(pd, bytes)?;
        Ok(Some((mem, fd)))
    }

    /// Device, buffer, memory, mapping and exported descriptor on `pd`.
    fn allocate_on(&mut self, pd: vk::PhysicalDevice, bytes: u64) -> Result<OwnedFd, VkgdrError> {
        let inst = &self.instance;
        // SAFETY (every call below): the handles passed are live children of this instance
        // (or of the device made here), and the create-infos chain only core 1.1 structures
        // and those of VK_KHR_external_memory_fd, which the device enables.
        let extensions = unsafe { inst.enumerate_device_extension_properties(pd) }
            .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
        let fd_ext = ash::khr::external_memory_fd::NAME;
        if !extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(fd_ext))
        {
            return Err(VkgdrError::NoExternalMemoryFd {
                device: self.device_name.clone(),
            });
        }
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let names = [fd_ext.as_ptr()];
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&names);
        let device =
            unsafe { inst.create_device(pd, &info, None) }.map_err(vk_err("vkCreateDevice"))?;
        let device = self.device.insert(device);
        let handle = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = vk::BufferCreateInfo::default()
            .size(bytes)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        self.buffer =
            unsafe { device.create_buffer(&info, None) }.map_err(vk_err("vkCreateBuffer"))?;
        let mut dedicated = vk::MemoryDedicatedRequirements::default();
        let mut reqs = vk::MemoryRequirements2::default().push_next(&mut dedicated);
        let info = vk::BufferMemoryRequirementsInfo2::default().buffer(self.buffer);
        unsafe { device.get_buffer_memory_requirements2(&info, &mut reqs) };
        let reqs = reqs.memory_requirements;
        let mut props = vk::ExternalBufferProperties::default();
        let info = vk::PhysicalDeviceExternalBufferInfo::default()
            .usage(usage)
            .handle_type(handle);
        unsafe { inst.get_physical_device_external_buffer_properties(pd, &info, &mut props) };
        let features = props.external_memory_properties.external_memory_features;
        if !features.contains(vk::ExternalMemoryFeatureFlags::EXPORTABLE) {
            return Err(VkgdrError::NoExternalMemoryFd {
                device: self.device_name.clone(),
            });
        }
        self.dedicated = dedicated.requires_dedicated_allocation == vk::TRUE
            || features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY);
        let memory_props = unsafe { inst.get_physical_device_memory_properties(pd) };
        let (types, heaps) = (
            memory_props.memory_types_as_slice(),
            memory_props.memory_heaps_as_slice(),
        );
        let no_bar = |e| match e {
            NoBar::None => VkgdrError::NoBarMemory {
                device: self.device_name.clone(),
                types: bar::describe(types, heaps, reqs.memory_type_bits),
            },
            NoBar::TooSmall { heap, bytes } => VkgdrError::BarTooSmall {
                device: self.device_name.clone(),
                heap,
                bytes,
            },
        };
        // The buffer's own types first (the memory is then bound to it, dedicated where the
        // driver asks). A driver may leave the BAR type out of an exportable buffer's types
        // while it still exports memory of that type: the lent H100's lists its device-local
        // host-visible type 4 but not for the buffer (bench/RESULTS.md). Then the memory is
        // allocated on its own, bound to no buffer, as katgpucbf's vkgdr library allocates
        // it: CUDA imports the descriptor, which is all a buffer was for.
        let (type_index, heap) = match bar::choose(types, heaps, reqs.memory_type_bits, reqs.size) {
            Ok(chosen) => chosen,
            Err(NoBar::None) => {
                let chosen = bar::choose(types, heaps, !0, reqs.size).map_err(no_bar)?;
                unsafe { device.destroy_buffer(self.buffer, None) };
                self.buffer = vk::Buffer::null();
                self.dedicated = false;
                chosen
            }
            Err(e) => return Err(no_bar(e)),
        };
        self.heap = heap;
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(handle);
        let mut to_buffer = vk::MemoryDedicatedAllocateInfo::default().buffer(self.buffer);
        let mut info = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(type_index)
            .push_next(&mut export);
        if self.dedicated {
            info = info.push_next(&mut to_buffer);
        }
        self.memory =
            unsafe { device.allocate_memory(&info, None) }.map_err(|result| VkgdrError::Alloc {
                device: self.device_name.clone(),
                bytes: reqs.size,
                heap,
                result,
            })?;
        self.size = reqs.size;
        if self.buffer != vk::Buffer::null() {
            unsafe { device.bind_buffer_memory(self.buffer, self.memory, 0) }
                .map_err(vk_err("vkBindBufferMemory"))?;
        }
        let host = unsafe {
            device.map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .map_err(vk_err("vkMapMemory"))?;
        self.host = host.cast();
        let fd_fns = ash::khr::external_memory_fd::Device::new(inst, device);
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.memory)
            .handle_type(handle);
        let fd = unsafe { fd_fns.get_memory_fd(&info) }.map_err(vk_err("vkGetMemoryFdKHR"))?;
        // SAFETY: vkGetMemoryFdKHR hands the caller a new descriptor it owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for VulkanMemory {
    fn drop(&mut self) {
        // SAFETY: each handle was made here and is destroyed once, children first; the owner
        // frees CUDA's mapping of the memory before this runs (field order of VkgdrMemory),
        // and no host reference into the mapping outlives its owner.
        unsafe {
            if let Some(device) = &self.device {
                if !self.host.is_null() {
                    device.unmap_memory(self.memory);
                }
                if self.buffer != vk::Buffer::null() {
                    device.destroy_buffer(self.buffer, None);
                }
                if self.memory != vk::DeviceMemory::null() {
                    device.free_memory(self.memory, None);
                }
                device.destroy_device(None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// A Vulkan version number as "major.minor.patch".
pub fn version_text(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}
