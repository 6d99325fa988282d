//! Which Vulkan memory type is the GPU memory the host can write through: device-local,
//! host-visible and host-coherent, i.e. the part of device memory the PCIe BAR window exposes.
//! Without resizable BAR that window is 256 MiB (seed 000 §Network receive: "not always
//! possible to use more than 256 MiB of the GPU memory for this"); with it the heap spans the
//! device's memory. A pure function of the device's memory properties, so that its choices and
//! its refusals are tested without a device.
#![deny(unsafe_code)]

use ash::vk;

/// The BAR window without resizable BAR: a heap no larger than this suggests enabling it.
pub const CLASSIC_BAR: u64 = 256 << 20;

/// Host-coherent is required, not preferred: the receive path writes chunks with plain stores
/// and never flushes mapped ranges, which non-coherent memory would need.
pub const WANTED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::from_raw(
    vk::MemoryPropertyFlags::DEVICE_LOCAL.as_raw()
        | vk::MemoryPropertyFlags::HOST_VISIBLE.as_raw()
        | vk::MemoryPropertyFlags::HOST_COHERENT.as_raw(),
);

/// Why no memory type serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoBar {
    /// No allowed type is device-local, host-visible and host-coherent.
    None,
    /// The largest such heap (`heap` bytes) is smaller than the `bytes` asked for.
    TooSmall { heap: u64, bytes: u64 },
}

/// The memory type for `bytes` among `types` (of the heaps `heaps`, as
/// `vkGetPhysicalDeviceMemoryProperties` lists them) allowed by `type_bits` (the buffer's
/// `memoryTypeBits`): the one of [`WANTED`]'s flags whose heap is largest (the first such on a
/// tie), and its heap's size.
pub fn choose(
    types: &[vk::MemoryType],
    heaps: &[vk::MemoryHeap],
    type_bits: u32,
    bytes: u64,
) -> Result<(u32, u64), NoBar> {
    let heap_of = |t: &vk::MemoryType| heaps.get(t.heap_index as usize).map_or(0, |h| h.size);
    let best = types
        .iter()
        .enumerate()
        .filter(|&(i, t)| i < 32 && type_bits & (1 << i) != 0 && t.property_flags.contains(WANTED))
        .map(|(i, t)| (i as u32, heap_of(t)))
        .fold(None, |best: Option<(u32, u64)>, (i, h)| match best {
            Some((_, bh)) if bh >= h => best,
            _ => Some((i, h)),
        });
    match best {
        None => Err(NoBar::None),
        Some((_, heap)) if heap < bytes => Err(NoBar::TooSmall { heap, bytes }),
        Some(b) => Ok(b),
    }
}

/// The memory types as a message lists them: index, flags (L device-local, V host-visible,
/// C host-coherent, H host-cached), heap and its size, and whether the buffer may use it
/// (`type_bits`), e.g. "0 L heap 0 (80.0 GiB); 1 VC heap 1 (1.0 TiB, not allowed)".
pub fn describe(types: &[vk::MemoryType], heaps: &[vk::MemoryHeap], type_bits: u32) -> String {
    let flag = |t: &vk::MemoryType, f: vk::MemoryPropertyFlags, c: char| {
        t.property_flags.contains(f).then_some(c)
    };
    let parts: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let flags: String = [
                flag(t, vk::MemoryPropertyFlags::DEVICE_LOCAL, 'L'),
                flag(t, vk::MemoryPropertyFlags::HOST_VISIBLE, 'V'),
                flag(t, vk::MemoryPropertyFlags::HOST_COHERENT, 'C'),
                flag(t, vk::MemoryPropertyFlags::HOST_CACHED, 'H'),
            ]
            .into_iter()
            .flatten()
            .collect();
            let heap = heaps.get(t.heap_index as usize).map_or(0, |h| h.size);
            let allowed = i < 32 && type_bits & (1 << i) != 0;
            format!(
                "{i} {} heap {} ({}{})",
                if flags.is_empty() { "-" } else { &flags },
                t.heap_index,
                size(heap),
                if allowed { "" } else { ", not allowed" }
            )
        })
        .collect();
    if parts.is_empty() {
        "no memory types".into()
    } else {
        parts.join("; ")
    }
}

/// `bytes` as a short size for messages ("256 MiB", "80 GiB", "1234 bytes").
pub fn size(bytes: u64) -> String {
    const TIB: u64 = 1 << 40;
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= TIB {
        format!("{:.1} TiB", bytes as f64 / TIB as f64)
    } else if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(flags: vk::MemoryPropertyFlags, heap: u32) -> vk::MemoryType {
        vk::MemoryType {
            property_flags: flags,
            heap_index: heap,
        }
    }

    fn heap(size: u64, local: bool) -> vk::MemoryHeap {
        vk::MemoryHeap {
            size,
            flags: if local {
                vk::MemoryHeapFlags::DEVICE_LOCAL
            } else {
                vk::MemoryHeapFlags::empty()
            },
        }
    }

    const LOCAL: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    const HOST: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::from_raw(
        vk::MemoryPropertyFlags::HOST_VISIBLE.as_raw()
            | vk::MemoryPropertyFlags::HOST_COHERENT.as_raw(),
    );

    /// An NVIDIA discrete GPU's layout: device memory, system memory, and the BAR window as a
    /// heap of its own (256 MiB without resizable BAR) or on the device heap (with it).
    fn nvidia(bar_heap: Option<u64>) -> (Vec<vk::MemoryType>, Vec<vk::MemoryHeap>) {
        let mut heaps = vec![heap(80 << 30, true), heap(1 << 40, false)];
        let mut types = vec![
            ty(LOCAL, 0),
            ty(HOST, 1),
            ty(HOST | vk::MemoryPropertyFlags::HOST_CACHED, 1),
        ];
        match bar_heap {
            Some(size) => {
                heaps.push(heap(size, true));
                types.push(ty(LOCAL | HOST, 2));
            }
            None => types.push(ty(LOCAL | HOST, 0)),
        }
        (types, heaps)
    }

    #[test]
    fn resizable_bar_offers_the_device_heap() {
        let (types, heaps) = nvidia(None);
        assert_eq!(choose(&types, &heaps, !0, 8 << 30), Ok((3, 80 << 30)));
    }

    /// The classic 256 MiB window serves what fits and refuses the rest with both sizes.
    #[test]
    fn a_classic_bar_window_is_too_small_for_large_chunks() {
        let (types, heaps) = nvidia(Some(CLASSIC_BAR));
        assert_eq!(choose(&types, &heaps, !0, 64 << 20), Ok((3, CLASSIC_BAR)));
        assert_eq!(
            choose(&types, &heaps, !0, 1 << 30),
            Err(NoBar::TooSmall {
                heap: CLASSIC_BAR,
                bytes: 1 << 30
            })
        );
    }

    /// A type the buffer may not use, or one missing any of the three flags, is never chosen.
    #[test]
    fn only_allowed_device_local_host_coherent_types_serve() {
        let (types, heaps) = nvidia(None);
        assert_eq!(choose(&types, &heaps, 0b0111, 1), Err(NoBar::None));
        let visible_only = vk::MemoryPropertyFlags::HOST_VISIBLE;
        let types = [ty(LOCAL, 0), ty(LOCAL | visible_only, 0), ty(HOST, 1)];
        assert_eq!(choose(&types, &heaps, !0, 1), Err(NoBar::None));
        assert_eq!(choose(&[], &[], !0, 1), Err(NoBar::None));
    }

    /// Two candidate types: the one on the larger heap.
    #[test]
    fn the_largest_heap_wins() {
        let heaps = [heap(CLASSIC_BAR, true), heap(48 << 30, true)];
        let types = [ty(LOCAL | HOST, 0), ty(LOCAL | HOST, 1)];
        assert_eq!(choose(&types, &heaps, !0, 1), Ok((1, 48 << 30)));
        assert_eq!(choose(&types, &heaps, 0b01, 1), Ok((0, CLASSIC_BAR)));
    }

    /// The listing names every type's flags, heap and size, and the types the buffer may not
    /// use.
    #[test]
    fn memory_types_are_listed_for_the_error() {
        let (types, heaps) = nvidia(Some(CLASSIC_BAR));
        assert_eq!(
            describe(&types, &heaps, 0b0111),
            "0 L heap 0 (80.0 GiB); 1 VC heap 1 (1.0 TiB); 2 VCH heap 1 (1.0 TiB); \
             3 LVC heap 2 (256.0 MiB, not allowed)"
        );
        assert_eq!(describe(&[], &[], !0), "no memory types");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(CLASSIC_BAR), "256.0 MiB");
        assert_eq!(size(128 << 30), "128.0 GiB");
        assert_eq!(size(3 << 29), "1.5 GiB");
        assert_eq!(size(100), "100 bytes");
    }
}
