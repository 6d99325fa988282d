//! F heaps on the wire (facts §1.9 "F heap"): one heap per destination per output batch, each
//! carrying `channels / destinations` consecutive channels: items timestamp, feng_id,
//! frequency (first channel index) as immediates and feng_raw, int8 of shape
//! (channels per substream, spectra per heap, 2 pols, 2), with every pointer in every packet.
//! feng_raw is the heap's only payload item, so with `--use-peerdirect` it is sent straight
//! from GPU memory (a device item, `spead::send::heap`).
#![deny(unsafe_code)]

use crate::net::DeviceBytes;
use crate::spead::items::{Descriptor, FENG_ID_ID, FENG_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID};
use crate::spead::send::Heap;
use crate::spead::Flavour;

/// Where destination `dest`'s feng_raw lies in a whole output heap: wire bytes are
/// channel-major, so each destination's channels are one contiguous run of `value_bytes` (4
/// for int8, 2 for packed 4-bit) per channel and spectrum. (offset, length) in bytes.
fn dest_range(
    value_bytes: usize,
    dest: usize,
    channels_per_dest: usize,
    spectra: usize,
) -> (usize, usize) {
    let bytes = channels_per_dest * spectra * value_bytes;
    (dest * bytes, bytes)
}

/// An F heap's immediates.
fn f_heap_items(h: &mut Heap<'_>, timestamp: u64, feng_id: u64, first_channel: usize) {
    h.repeat_pointers = true;
    h.add_immediate(TIMESTAMP_ID, timestamp)
        .add_immediate(FENG_ID_ID, feng_id)
        .add_immediate(FREQUENCY_ID, first_channel as u64);
}

/// The heap for destination `dest` from a whole output heap (`data`: channels × spectra × 2 × 2).
pub fn f_heap<'a>(
    data: &'a [u8],
    value_bytes: usize,
    timestamp: u64,
    feng_id: u64,
    dest: usize,
    channels_per_dest: usize,
    spectra: usize,
) -> Heap<'a> {
    let (at, len) = dest_range(value_bytes, dest, channels_per_dest, spectra);
    let mut h = Heap::new();
    f_heap_items(&mut h, timestamp, feng_id, dest * channels_per_dest);
    h.add_bytes(FENG_RAW_ID, &data[at..at + len]);
    h
}

/// [`f_heap`] from a whole output heap left in device memory; `None` if `data` is too short
/// for destination `dest`.
pub fn f_heap_device(
    data: DeviceBytes,
    value_bytes: usize,
    timestamp: u64,
    feng_id: u64,
    dest: usize,
    channels_per_dest: usize,
    spectra: usize,
) -> Option<Heap<'static>> {
    let (at, len) = dest_range(value_bytes, dest, channels_per_dest, spectra);
    let mut h = Heap::new();
    f_heap_items(&mut h, timestamp, feng_id, dest * channels_per_dest);
    h.add_device(FENG_RAW_ID, data.slice(at, len)?);
    Some(h)
}

/// The descriptor heap of an F stream: int8 values as a numpy dtype, 4-bit values as a SPEAD
/// format ('i', 4), which spead2 unpacks.
pub fn descriptor_heap(
    channels_per_dest: usize,
    spectra: usize,
    sample_bits: u32,
) -> Heap<'static> {
    let f = Flavour::SPEAD_64_48;
    let u48 = [(b'u', 48)];
    let shape = [channels_per_dest as u64, spectra as u64, 2, 2];
    let what = "Channelised complex data (channel, spectrum, pol, re/im)";
    let raw = if sample_bits == 4 {
        Descriptor::with_format(
            FENG_RAW_ID,
            "feng_raw",
            what,
            &shape.map(Some),
            &[(b'i', 4)],
        )
    } else {
        Descriptor::with_dtype(FENG_RAW_ID, "feng_raw", what, &shape, "|i1")
    };
    let mut h = Heap::new();
    h.add_descriptor(
        &Descriptor::with_format(
            TIMESTAMP_ID,
            "timestamp",
            "Timestamp of the first spectrum, in ADC samples since the sync time",
            &[],
            &u48,
        ),
        f,
    )
    .add_descriptor(
        &Descriptor::with_format(FENG_ID_ID, "feng_id", "Antenna (F-engine) index", &[], &u48),
        f,
    )
    .add_descriptor(
        &Descriptor::with_format(
            FREQUENCY_ID,
            "frequency",
            "First channel in the heap",
            &[],
            &u48,
        ),
        f,
    )
    .add_descriptor(&raw, f);
    h
}

/// One output's F heaps as the send thread builds them: each buffer is a whole output heap
/// batch, split over the destinations (facts §1.9 "F heap").
pub struct FHeapFormat {
    pub feng_id: u64,
    pub channels: usize,
    pub destinations: usize,
    pub spectra_per_heap: usize,
    pub sample_bits: u32,
}

impl FHeapFormat {
    /// Bytes per (channel, spectrum): both pols' complex values, int8 or packed 4-bit.
    fn value_bytes(&self) -> usize {
        if self.sample_bits == 4 {
            2
        } else {
            4
        }
    }
}

impl crate::engine::send::HeapFormat for FHeapFormat {
    /// The batch's timestamp.
    type Meta = u64;

    fn substreams(&self) -> usize {
        self.destinations
    }

    fn heap<'a>(&self, data: &'a [u8], timestamp: &u64, dest: usize) -> Option<Heap<'a>> {
        Some(f_heap(
            data,
            self.value_bytes(),
            *timestamp,
            self.feng_id,
            dest,
            self.channels / self.destinations,
            self.spectra_per_heap,
        ))
    }

    fn device_heap(
        &self,
        data: DeviceBytes,
        timestamp: &u64,
        dest: usize,
    ) -> Result<Option<Heap<'static>>, String> {
        f_heap_device(
            data,
            self.value_bytes(),
            *timestamp,
            self.feng_id,
            dest,
            self.channels / self.destinations,
            self.spectra_per_heap,
        )
        .map(Some)
        .ok_or_else(|| format!("{} device bytes do not hold destination {dest}", data.len))
    }

    fn descriptors(&self, _dest: usize) -> Heap<'static> {
        descriptor_heap(
            self.channels / self.destinations,
            self.spectra_per_heap,
            self.sample_bits,
        )
    }
}
