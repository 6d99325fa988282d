//! Heaps to send, and the packetiser that cuts them into SPEAD packets byte-for-byte as
//! spead2's `packet_generator` does (spead2 4.x, `send_packet.cpp`).
//!
//! Every packet starts with HEAP_CNT, HEAP_LENGTH, PAYLOAD_OFFSET and PAYLOAD_LENGTH, then the
//! heap's item pointers: all of them in every packet when `repeat_pointers` is set (what
//! katgpucbf sends), otherwise spread over the first packets, as many per packet as fit.
//! Every packet carries at least one byte of payload so that packets of a heap are distinct;
//! when the heap has too little payload for that, it is padded with zeros and a NULL item
//! pointer marks where the padding starts. The maximum packet size is rounded down to a
//! multiple of 8 so that payload stays aligned.
//!
//! An item's bytes may stay in GPU memory ([`ItemData::Device`], `--use-peerdirect`): the
//! packetiser never reads payload, only slices it, so such an item is cut like any other and
//! each packet's share of it is handed on as a device slice for the transport to gather
//! (`net::device_memory`). It must be the heap's last item with payload and need no padding,
//! so that a packet is host bytes followed by at most one device slice: one gather entry.
#![deny(unsafe_code)]

use std::borrow::Cow;

use crate::net::DeviceBytes;
use crate::spead::items::Descriptor;
use crate::spead::wire::{
    emit_header, emit_pointer, Flavour, CTRL_STREAM_START, CTRL_STREAM_STOP, DESCRIPTOR_ID,
    HEAP_CNT_ID, HEAP_LENGTH_ID, NULL_ID, PAYLOAD_LENGTH_ID, PAYLOAD_OFFSET_ID, POINTER_LEN,
    STREAM_CTRL_ID,
};

/// Header plus the four special pointers every packet carries.
pub const PREFIX_LEN: usize = 8 + 4 * POINTER_LEN;

/// The value of one item in a heap being sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemData<'a> {
    /// Sent as an immediate pointer carrying `value` (spead2's `is_inline`).
    Immediate(u64),
    /// Sent as payload bytes. With `allow_immediate`, data no wider than the address field
    /// is right-aligned into an immediate pointer instead (spead2's `allow_immediate`).
    Bytes {
        data: Cow<'a, [u8]>,
        allow_immediate: bool,
    },
    /// Sent as payload bytes that stay in device memory (never an immediate).
    Device(DeviceBytes),
}

/// One heap: an ordered list of items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heap<'a> {
    pub items: Vec<(u64, ItemData<'a>)>,
    /// Repeat every item pointer in every packet.
    pub repeat_pointers: bool,
}

/// Why a heap cannot be packetised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketiseError {
    #[error("packet size {0} is too small for a SPEAD packet (minimum 56)")]
    PacketTooSmall(usize),
    #[error("packet size {0} is too small to repeat {1} item pointers in every packet")]
    TooManyPointers(usize, usize),
    #[error("a packet payload of 0 bytes cannot carry a heap")]
    ZeroPayload,
    #[error("payload in device memory must be the heap's last payload item and at least 1 byte")]
    DevicePayload,
}

/// Packets needed for `heap_payload` bytes at `packet_payload` bytes each, refusing a zero
/// packet payload (a configuration error that used to divide by zero).
pub fn packets_per_heap(
    heap_payload: usize,
    packet_payload: usize,
) -> Result<usize, PacketiseError> {
    if packet_payload == 0 {
        return Err(PacketiseError::ZeroPayload);
    }
    Ok(heap_payload.div_ceil(packet_payload))
}

impl<'a> Heap<'a> {
    pub fn new() -> Self {
        Heap::default()
    }

    pub fn add_immediate(&mut self, id: u64, value: u64) -> &mut Self {
        self.items.push((id, ItemData::Immediate(value)));
        self
    }

    /// Payload bytes, never turned into an immediate.
    pub fn add_bytes(&mut self, id: u64, data: impl Into<Cow<'a, [u8]>>) -> &mut Self {
        self.items.push((
            id,
            ItemData::Bytes {
                data: data.into(),
                allow_immediate: false,
            },
        ));
        self
    }

    /// Bytes that become an immediate when they fit (what spead2's Python `Item` does for
    /// fixed-size items).
    pub fn add_small(&mut self, id: u64, data: impl Into<Cow<'a, [u8]>>) -> &mut Self {
        self.items.push((
            id,
            ItemData::Bytes {
                data: data.into(),
                allow_immediate: true,
            },
        ));
        self
    }

    /// Payload bytes that stay in device memory (see the module doc for where they may go).
    pub fn add_device(&mut self, id: u64, data: DeviceBytes) -> &mut Self {
        self.items.push((id, ItemData::Device(data)));
        self
    }

    pub fn add_descriptor(&mut self, d: &Descriptor, flavour: Flavour) -> &mut Self {
        self.add_bytes(DESCRIPTOR_ID, d.to_raw(flavour))
    }

    pub fn add_start(&mut self) -> &mut Self {
        self.add_immediate(STREAM_CTRL_ID, CTRL_STREAM_START)
    }

    pub fn add_end(&mut self) -> &mut Self {
        self.add_immediate(STREAM_CTRL_ID, CTRL_STREAM_STOP)
    }
}

fn as_immediate(item: &ItemData<'_>, max_immediate: usize) -> Option<u64> {
    match item {
        ItemData::Immediate(v) => Some(*v),
        ItemData::Bytes {
            data,
            allow_immediate: true,
        } if data.len() <= max_immediate => {
            Some(data.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        ItemData::Bytes { .. } | ItemData::Device(_) => None,
    }
}

fn payload_of<'h>(item: &'h ItemData<'_>, max_immediate: usize) -> Option<&'h [u8]> {
    match item {
        ItemData::Bytes { data, .. } if as_immediate(item, max_immediate).is_none() => Some(data),
        _ => None,
    }
}

/// Payload bytes `item` contributes, wherever they are.
fn item_payload_len(item: &ItemData<'_>, max_immediate: usize) -> usize {
    match item {
        ItemData::Device(d) => d.len,
        _ => payload_of(item, max_immediate).map_or(0, <[u8]>::len),
    }
}

/// Whether the heap's device item, if any, is its last item with payload and not empty.
fn device_item_ok(items: &[(u64, ItemData<'_>)], max_immediate: usize) -> bool {
    let Some(at) = items
        .iter()
        .position(|(_, d)| matches!(d, ItemData::Device(_)))
    else {
        return true;
    };
    item_payload_len(&items[at].1, max_immediate) > 0
        && items[at + 1..]
            .iter()
            .all(|(_, d)| item_payload_len(d, max_immediate) == 0)
}

/// Cuts one heap into packets. Pure: writes packet bytes into caller buffers.
#[derive(Debug)]
pub struct PacketGenerator<'h, 'a> {
    heap: &'h Heap<'a>,
    flavour: Flavour,
    cnt: u64,
    max_packet_size: usize,
    max_pointers_per_packet: usize,
    payload_size: u64,
    need_null_item: bool,
    payload_offset: u64,
    next_pointer: usize,
    next_address: u64,
    next_item: usize,
    next_item_offset: usize,
}

impl<'h, 'a> PacketGenerator<'h, 'a> {
    pub fn new(
        heap: &'h Heap<'a>,
        cnt: u64,
        flavour: Flavour,
        max_packet_size: usize,
    ) -> Result<Self, PacketiseError> {
        let max_packet_size = max_packet_size & !7;
        if max_packet_size < PREFIX_LEN + 2 * POINTER_LEN {
            return Err(PacketiseError::PacketTooSmall(max_packet_size));
        }
        let max_immediate = flavour.addr_bytes();
        if !device_item_ok(&heap.items, max_immediate) {
            return Err(PacketiseError::DevicePayload);
        }
        let mut payload_size: u64 = heap
            .items
            .iter()
            .map(|(_, d)| item_payload_len(d, max_immediate) as u64)
            .sum();
        let max_pointers_per_packet = (max_packet_size - (PREFIX_LEN + POINTER_LEN)) / POINTER_LEN;
        let item_packets = heap.items.len() / max_pointers_per_packet + 1;
        if heap.repeat_pointers && item_packets > 1 {
            return Err(PacketiseError::TooManyPointers(
                max_packet_size,
                heap.items.len(),
            ));
        }
        let min_payload = (item_packets as u64 - 1) * POINTER_LEN as u64 + 1;
        let need_null_item = payload_size < min_payload;
        if need_null_item
            && heap
                .items
                .iter()
                .any(|(_, d)| matches!(d, ItemData::Device(_)))
        {
            return Err(PacketiseError::DevicePayload);
        }
        if need_null_item {
            payload_size = min_payload;
        }
        Ok(PacketGenerator {
            heap,
            flavour,
            cnt,
            max_packet_size,
            max_pointers_per_packet,
            payload_size,
            need_null_item,
            payload_offset: 0,
            next_pointer: 0,
            next_address: 0,
            next_item: 0,
            next_item_offset: 0,
        })
    }

    /// Bytes of every packet of the heap, headers included: what the heap puts on the wire
    /// (less the UDP/IP/Ethernet framing, the same per packet), which the multi-interface
    /// send stream balances. Walks the packets' shapes without writing them.
    pub fn wire_length(&self) -> u64 {
        let (mut offset, mut pointer, mut bytes) = (0, 0, 0);
        while offset < self.payload_size {
            if self.heap.repeat_pointers {
                pointer = 0;
            }
            let (n_pointers, payload_len) = self.packet_shape(offset, pointer);
            bytes += (PREFIX_LEN + n_pointers * POINTER_LEN + payload_len) as u64;
            offset += payload_len as u64;
            pointer += n_pointers;
        }
        bytes
    }

    /// The item pointers and payload bytes of the packet that starts at `payload_offset` with
    /// item pointer `next_pointer` next: as many pointers as fit, then as much payload as is
    /// left and fits.
    fn packet_shape(&self, payload_offset: u64, next_pointer: usize) -> (usize, usize) {
        let total_pointers = self.heap.items.len() + usize::from(self.need_null_item);
        let n_pointers = self
            .max_pointers_per_packet
            .min(total_pointers - next_pointer.min(total_pointers));
        let payload_len = ((self.payload_size - payload_offset) as usize)
            .min(self.max_packet_size - n_pointers * POINTER_LEN - PREFIX_LEN);
        (n_pointers, payload_len)
    }

    /// Append the next packet to `out`; returns its length, or `None` when the heap is done —
    /// or when the packet's payload is in device memory, which cannot be copied here (such
    /// heaps go through [`PacketGenerator::next_packet_parts`]).
    pub fn next_packet(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let start = out.len();
        let mut parts = Vec::new();
        let mut device = None;
        self.next_packet_parts(out, &mut parts, &mut device)?;
        if device.is_some() {
            out.truncate(start);
            return None;
        }
        for p in parts {
            out.extend_from_slice(p);
        }
        Some(out.len() - start)
    }

    /// The next packet without copying payload: its header (special items and item pointers)
    /// is appended to `header`, and the payload follows as slices borrowed from the heap's
    /// items, appended to `parts`, then, where it ends in a device item, that item's share in
    /// `device` (else `None`). Returns the packet's length, or `None` when the heap is done.
    pub fn next_packet_parts(
        &mut self,
        header: &mut Vec<u8>,
        parts: &mut Vec<&'h [u8]>,
        device: &mut Option<DeviceBytes>,
    ) -> Option<usize> {
        *device = None;
        /// Source of the zero padding after the last item (spead2 pads with zeros).
        static ZEROS: [u8; 64] = [0; 64];
        if self.payload_offset >= self.payload_size {
            return None;
        }
        let heap = self.heap;
        let f = self.flavour;
        let max_immediate = f.addr_bytes();
        if heap.repeat_pointers {
            self.next_pointer = 0;
            self.next_address = 0;
        }
        let (n_pointers, mut payload_len) =
            self.packet_shape(self.payload_offset, self.next_pointer);
        let header_len = PREFIX_LEN + n_pointers * POINTER_LEN;
        let packet_len = header_len + payload_len;
        let start = header.len();
        header.resize(start + header_len, 0);
        let pkt = &mut header[start..];
        emit_header(f, (n_pointers + 4) as u16, pkt);
        emit_pointer(f.encode_immediate(HEAP_CNT_ID, self.cnt), 0, pkt);
        emit_pointer(
            f.encode_immediate(HEAP_LENGTH_ID, self.payload_size),
            1,
            pkt,
        );
        emit_pointer(
            f.encode_immediate(PAYLOAD_OFFSET_ID, self.payload_offset),
            2,
            pkt,
        );
        emit_pointer(
            f.encode_immediate(PAYLOAD_LENGTH_ID, payload_len as u64),
            3,
            pkt,
        );
        for i in 0..n_pointers {
            let raw = match heap.items.get(self.next_pointer) {
                None => f.encode_address(NULL_ID, self.next_address),
                Some((id, data)) => match as_immediate(data, max_immediate) {
                    Some(v) => f.encode_immediate(*id, v),
                    None => {
                        let raw = f.encode_address(*id, self.next_address);
                        self.next_address += item_payload_len(data, max_immediate) as u64;
                        raw
                    }
                },
            };
            emit_pointer(raw, 4 + i, pkt);
            self.next_pointer += 1;
        }
        self.payload_offset += payload_len as u64;
        while payload_len > 0 {
            match heap.items.get(self.next_item) {
                None => {
                    // Zero padding after the last item, marked by the NULL pointer.
                    let n = payload_len.min(ZEROS.len());
                    parts.push(&ZEROS[..n]);
                    payload_len -= n;
                }
                Some((_, ItemData::Device(d))) => {
                    // The last payload item (checked in `new`): the rest of the packet.
                    let n = (d.len - self.next_item_offset).min(payload_len);
                    *device = d.slice(self.next_item_offset, n);
                    self.next_item_offset += n;
                    if self.next_item_offset == d.len {
                        self.next_item += 1;
                        self.next_item_offset = 0;
                    }
                    payload_len -= n;
                }
                Some((_, data)) => match payload_of(data, max_immediate) {
                    None => {
                        self.next_item += 1;
                        self.next_item_offset = 0;
                    }
                    Some(bytes) => {
                        let n = (bytes.len() - self.next_item_offset).min(payload_len);
                        parts.push(&bytes[self.next_item_offset..self.next_item_offset + n]);
                        self.next_item_offset += n;
                        if self.next_item_offset == bytes.len() {
                            self.next_item += 1;
                            self.next_item_offset = 0;
                        }
                        payload_len -= n;
                    }
                },
            }
        }
        Some(packet_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spead::wire::ParsedPacket;

    #[test]
    fn empty_heap_is_null_item_and_one_pad_byte() {
        let heap = Heap::new();
        let mut g = PacketGenerator::new(&heap, 1, Flavour::SPEAD_64_48, 1500).unwrap();
        let mut out = vec![0xa5; 3];
        let n = g.next_packet(&mut out).unwrap();
        assert_eq!(n, PREFIX_LEN + 8 + 1);
        let p = ParsedPacket::parse(&out[3..]).unwrap();
        assert_eq!(p.repr.heap_length, Some(1));
        assert_eq!(p.payload(), &[0]);
        assert!(g.next_packet(&mut out).is_none());
    }

    #[test]
    fn multi_packet_heap_covers_payload_once() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut heap = Heap::new();
        heap.add_immediate(0x1600, 42).add_bytes(0x4300, &data[..]);
        heap.repeat_pointers = true;
        let mut g = PacketGenerator::new(&heap, 9, Flavour::SPEAD_64_48, 1472).unwrap();
        let mut out = Vec::new();
        let mut got = vec![0u8; data.len()];
        let mut start = 0;
        while let Some(n) = g.next_packet(&mut out) {
            assert!(n <= 1472);
            let p = ParsedPacket::parse(&out[start..start + n]).unwrap();
            assert_eq!(p.immediate(0x1600), Some(42));
            let off = p.repr.payload_offset as usize;
            got[off..off + p.payload().len()].copy_from_slice(p.payload());
            start += n;
        }
        assert_eq!(got, data);
    }

    /// A device item is sliced like host bytes (each packet's share, at the offsets its
    /// header carries) but never read: `next_packet`, which copies, gives up on it; it must be
    /// the last payload item, and not empty.
    #[test]
    fn device_items_are_sliced_not_read() {
        let d = DeviceBytes {
            addr: 0x7f00_0000_0000,
            len: 3000,
        };
        let mut heap = Heap::new();
        heap.add_immediate(0x1600, 7).add_device(0x4300, d);
        heap.repeat_pointers = true;
        let mut g = PacketGenerator::new(&heap, 1, Flavour::SPEAD_64_48, 1024).unwrap();
        let (mut header, mut parts, mut device) = (Vec::new(), Vec::new(), None);
        let mut offset = 0;
        while let Some(n) = g.next_packet_parts(&mut header, &mut parts, &mut device) {
            let payload = 1024 - (8 + 6 * 8);
            let want = payload.min(3000 - offset);
            assert!(parts.is_empty());
            assert_eq!(device, d.slice(offset, want));
            assert_eq!(n, header.len() + want);
            offset += want;
            header.clear();
        }
        assert_eq!(offset, 3000);
        let mut g = PacketGenerator::new(&heap, 1, Flavour::SPEAD_64_48, 1024).unwrap();
        let mut out = vec![0xa5; 5];
        assert_eq!(g.next_packet(&mut out), None);
        assert_eq!(out, [0xa5; 5]);

        let mut after = Heap::new();
        after.add_device(0x4300, d).add_bytes(0x4301, &[1u8, 2][..]);
        let mut empty = Heap::new();
        empty.add_device(
            0x4300,
            DeviceBytes {
                addr: d.addr,
                len: 0,
            },
        );
        for bad in [after, empty] {
            assert_eq!(
                PacketGenerator::new(&bad, 1, Flavour::SPEAD_64_48, 1024).unwrap_err(),
                PacketiseError::DevicePayload
            );
        }
    }

    proptest::proptest! {
        /// `wire_length` (the packets' shapes walked without writing) is the number of bytes
        /// the generator writes, whatever the items, their sizes, the packet size and whether
        /// pointers are repeated.
        #[test]
        fn wire_length_is_what_the_packets_take(
            immediates in 0usize..12,
            sizes in proptest::collection::vec(0usize..5000, 0..6),
            packet in 64usize..9200,
            repeat in proptest::bool::ANY,
        ) {
            let blobs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0x3c; n]).collect();
            let mut heap = Heap::new();
            for i in 0..immediates {
                heap.add_immediate(0x1000 + i as u64, i as u64);
            }
            for (i, b) in blobs.iter().enumerate() {
                heap.add_bytes(0x2000 + i as u64, &b[..]);
            }
            heap.repeat_pointers = repeat;
            let Ok(mut g) = PacketGenerator::new(&heap, 3, Flavour::SPEAD_64_48, packet) else {
                return Ok(());
            };
            let want = g.wire_length();
            let mut out = Vec::new();
            while g.next_packet(&mut out).is_some() {}
            proptest::prop_assert_eq!(want, out.len() as u64);
        }
    }

    #[test]
    fn refuses_tiny_packets() {
        let heap = Heap::new();
        assert_eq!(
            PacketGenerator::new(&heap, 1, Flavour::SPEAD_64_48, 55).unwrap_err(),
            PacketiseError::PacketTooSmall(48)
        );
        let mut heap = Heap::new();
        for i in 0..10 {
            heap.add_immediate(0x100 + i, i);
        }
        heap.repeat_pointers = true;
        assert!(matches!(
            PacketGenerator::new(&heap, 1, Flavour::SPEAD_64_48, 64),
            Err(PacketiseError::TooManyPointers(..))
        ));
    }
}
