//! Zero-copy views over SPEAD packets (SPEAD-64-XX), after smoltcp's `wire` modules.
//!
//! Contract: [`Packet::new_checked`] is the only door for outside bytes. It validates the header,
//! the flavour, the item-pointer table, the special items and the payload bounds exactly as
//! spead2's `decode_packet` does, and returns a [`DropReason`] otherwise. After it succeeds no
//! accessor can panic: every length it uses was checked. [`PacketRepr`] is the small decoded
//! summary (`parse`), and [`emit_header`] writes the fixed part of a packet (`buffer_len` bytes).
//!
//! Layout (all big-endian):
//!
//! ```text
//! 0      1      2          3          4..6      6..8
//! 0x53 | 0x04 | id bytes | addr bytes | reserved | n_items
//! n_items × u64 item pointers: bit 63 immediate, then (id bytes·8 − 1) id bits, then addr bits
//! payload
//! ```
#![deny(unsafe_code)]

/// Special item IDs (spead2 `common_defines.h`).
pub const NULL_ID: u64 = 0x00;
pub const HEAP_CNT_ID: u64 = 0x01;
pub const HEAP_LENGTH_ID: u64 = 0x02;
pub const PAYLOAD_OFFSET_ID: u64 = 0x03;
pub const PAYLOAD_LENGTH_ID: u64 = 0x04;
pub const DESCRIPTOR_ID: u64 = 0x05;
pub const STREAM_CTRL_ID: u64 = 0x06;

/// Values of the stream-control item.
pub const CTRL_STREAM_START: u64 = 0;
pub const CTRL_DESCRIPTOR_REISSUE: u64 = 1;
pub const CTRL_STREAM_STOP: u64 = 2;
pub const CTRL_DESCRIPTOR_UPDATE: u64 = 3;

pub const MAGIC: u8 = 0x53;
pub const VERSION: u8 = 4;
/// Header bytes before the item pointers.
pub const HEADER_LEN: usize = 8;
/// Bytes per item pointer.
pub const POINTER_LEN: usize = 8;

mod field {
    use core::ops::Range;
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const ID_BYTES: usize = 2;
    pub const ADDR_BYTES: usize = 3;
    pub const N_ITEMS: Range<usize> = 6..8;
}

/// Why a packet was refused. Small and `Copy`, so callers count per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Fewer than 8 bytes, or fewer than the item-pointer table it announces.
    ShortHeader,
    BadMagic,
    BadVersion,
    /// Not a SPEAD-64-XX flavour, or not the flavour the receiver was configured for.
    BadFlavour,
    /// HEAP_CNT, PAYLOAD_OFFSET or PAYLOAD_LENGTH is missing.
    MissingItems,
    /// The payload length says more bytes than the packet holds.
    PayloadPastPacket,
    /// The packet holds more bytes than its header and payload length account for.
    SizeMismatch,
    /// PAYLOAD_OFFSET + PAYLOAD_LENGTH > HEAP_LENGTH.
    PayloadPastHeap,
}

impl DropReason {
    pub const ALL: [DropReason; 8] = [
        DropReason::ShortHeader,
        DropReason::BadMagic,
        DropReason::BadVersion,
        DropReason::BadFlavour,
        DropReason::MissingItems,
        DropReason::PayloadPastPacket,
        DropReason::SizeMismatch,
        DropReason::PayloadPastHeap,
    ];

    /// A stable snake-case name for counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::ShortHeader => "short_header",
            DropReason::BadMagic => "bad_magic",
            DropReason::BadVersion => "bad_version",
            DropReason::BadFlavour => "bad_flavour",
            DropReason::MissingItems => "missing_items",
            DropReason::PayloadPastPacket => "payload_past_packet",
            DropReason::SizeMismatch => "size_mismatch",
            DropReason::PayloadPastHeap => "payload_past_heap",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl core::fmt::Display for DropReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A SPEAD-64-XX flavour: how the 64-bit item pointer is split between ID and address.
///
/// spead2 accepts heap-address widths that are multiples of 8 strictly between 0 and 64; the
/// ID then has `63 − addr_bits` bits (bit 63 is the immediate flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flavour {
    addr_bits: u32,
}

impl Flavour {
    /// SPEAD-64-48, the flavour of every MeerKAT stream.
    pub const SPEAD_64_48: Flavour = Flavour { addr_bits: 48 };

    /// `None` unless `addr_bits` is a multiple of 8 in 8..=56.
    pub fn new(addr_bits: u32) -> Option<Flavour> {
        (addr_bits % 8 == 0 && (8..=56).contains(&addr_bits)).then_some(Flavour { addr_bits })
    }

    #[inline]
    pub fn addr_bits(self) -> u32 {
        self.addr_bits
    }

    /// Bytes of an immediate value (6 for 64-48).
    #[inline]
    pub fn addr_bytes(self) -> usize {
        (self.addr_bits / 8) as usize
    }

    #[inline]
    fn addr_mask(self) -> u64 {
        (1u64 << self.addr_bits) - 1
    }

    #[inline]
    fn id_mask(self) -> u64 {
        (1u64 << (63 - self.addr_bits)) - 1
    }

    /// Largest value an immediate or address can hold; heap counters wrap to this.
    #[inline]
    pub fn max_value(self) -> u64 {
        self.addr_mask()
    }

    #[inline]
    pub fn encode_immediate(self, id: u64, value: u64) -> u64 {
        (1 << 63) | ((id & self.id_mask()) << self.addr_bits) | (value & self.addr_mask())
    }

    #[inline]
    pub fn encode_address(self, id: u64, addr: u64) -> u64 {
        ((id & self.id_mask()) << self.addr_bits) | (addr & self.addr_mask())
    }

    #[inline]
    pub fn decode(self, raw: u64) -> ItemPointer {
        ItemPointer {
            immediate: raw >> 63 != 0,
            id: (raw >> self.addr_bits) & self.id_mask(),
            value: raw & self.addr_mask(),
        }
    }
}

impl Default for Flavour {
    fn default() -> Self {
        Flavour::SPEAD_64_48
    }
}

/// One decoded item pointer. `value` is the immediate value or the payload byte address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ItemPointer {
    pub immediate: bool,
    pub id: u64,
    pub value: u64,
}

/// A read-only view of a SPEAD packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking. Accessors may panic on short buffers: only for bytes this process
    /// wrote itself.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap outside bytes: checks the header and the pointer table fit.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, DropReason> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    fn check_len(&self) -> Result<(), DropReason> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(DropReason::ShortHeader);
        }
        if data[field::MAGIC] != MAGIC {
            return Err(DropReason::BadMagic);
        }
        if data[field::VERSION] != VERSION {
            return Err(DropReason::BadVersion);
        }
        let id_bits = u32::from(data[field::ID_BYTES]) * 8;
        let addr_bits = u32::from(data[field::ADDR_BYTES]) * 8;
        if id_bits + addr_bits != 64 || Flavour::new(addr_bits).is_none() {
            return Err(DropReason::BadFlavour);
        }
        if data.len() < self.payload_start() {
            return Err(DropReason::ShortHeader);
        }
        Ok(())
    }

    /// The flavour the header announces.
    #[inline]
    pub fn flavour(&self) -> Flavour {
        Flavour {
            addr_bits: u32::from(self.buffer.as_ref()[field::ADDR_BYTES]) * 8,
        }
    }

    #[inline]
    pub fn n_items(&self) -> usize {
        let d = &self.buffer.as_ref()[field::N_ITEMS];
        usize::from(u16::from_be_bytes([d[0], d[1]]))
    }

    #[inline]
    fn payload_start(&self) -> usize {
        HEADER_LEN + POINTER_LEN * self.n_items()
    }

    /// The raw (big-endian decoded) item pointer `i`.
    #[inline]
    pub fn raw_pointer(&self, i: usize) -> u64 {
        let start = HEADER_LEN + POINTER_LEN * i;
        let d = &self.buffer.as_ref()[start..start + POINTER_LEN];
        u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }

    /// All item pointers, decoded, in packet order (specials included).
    pub fn pointers(&self) -> impl Iterator<Item = ItemPointer> + '_ {
        let flavour = self.flavour();
        (0..self.n_items()).map(move |i| flavour.decode(self.raw_pointer(i)))
    }

    /// Bytes after the pointer table (not yet limited by PAYLOAD_LENGTH).
    #[inline]
    pub fn trailing(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_start()..]
    }

    /// The whole buffer.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The special items and payload bounds of a packet that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr {
    pub flavour: Flavour,
    pub heap_cnt: u64,
    /// `None` for an unsized heap.
    pub heap_length: Option<u64>,
    pub payload_offset: u64,
    pub payload_length: usize,
    pub n_items: usize,
    /// The packet contains an immediate STREAM_CTRL = stop.
    pub stop: bool,
}

impl PacketRepr {
    /// Decode and validate as spead2's `decode_packet` does: CNT, OFF and PLEN required (as
    /// immediates), the payload within the packet, and offset + length within the heap length.
    /// spead2 also refuses a packet longer than its contents ("size mismatch").
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<PacketRepr, DropReason> {
        let mut heap_cnt = None;
        let mut heap_length = None;
        let mut payload_offset = None;
        let mut payload_length = None;
        let mut stop = false;
        for p in packet.pointers().filter(|p| p.immediate) {
            match p.id {
                HEAP_CNT_ID => heap_cnt = Some(p.value),
                HEAP_LENGTH_ID => heap_length = Some(p.value),
                PAYLOAD_OFFSET_ID => payload_offset = Some(p.value),
                PAYLOAD_LENGTH_ID => payload_length = Some(p.value),
                STREAM_CTRL_ID if p.value == CTRL_STREAM_STOP => stop = true,
                _ => {}
            }
        }
        let (Some(heap_cnt), Some(payload_offset), Some(payload_length)) =
            (heap_cnt, payload_offset, payload_length)
        else {
            return Err(DropReason::MissingItems);
        };
        let trailing = packet.trailing().len() as u64;
        if payload_length > trailing {
            return Err(DropReason::PayloadPastPacket);
        }
        if payload_length < trailing {
            return Err(DropReason::SizeMismatch);
        }
        if let Some(len) = heap_length {
            // Addresses are < 2^56, so the sum cannot overflow.
            if payload_offset + payload_length > len {
                return Err(DropReason::PayloadPastHeap);
            }
        }
        Ok(PacketRepr {
            flavour: packet.flavour(),
            heap_cnt,
            heap_length,
            payload_offset,
            payload_length: payload_length as usize,
            n_items: packet.n_items(),
            stop,
        })
    }

    /// Bytes of the fixed part: header plus pointer table.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + POINTER_LEN * self.n_items
    }

    /// The whole packet's length.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_length
    }
}

/// A checked packet with its decoded special items: what the receive state machines consume.
#[derive(Debug, Clone, Copy)]
pub struct ParsedPacket<'a> {
    pub packet: Packet<&'a [u8]>,
    pub repr: PacketRepr,
}

impl<'a> ParsedPacket<'a> {
    /// Validate outside bytes completely; the only entry point receivers use.
    ///
    /// ```
    /// use cbf::spead::wire::{DropReason, ParsedPacket};
    /// // Header (SPEAD-64-48, 3 items), HEAP_CNT = 1, PAYLOAD_OFFSET = 0, PAYLOAD_LENGTH = 2.
    /// let mut p = vec![0x53, 4, 2, 6, 0, 0, 0, 3];
    /// for (id, v) in [(1u64, 1u64), (3, 0), (4, 2)] {
    ///     p.extend_from_slice(&((1 << 63) | (id << 48) | v).to_be_bytes());
    /// }
    /// p.extend_from_slice(&[7, 8]);
    /// assert_eq!(ParsedPacket::parse(&p).unwrap().payload(), &[7, 8]);
    /// assert_eq!(ParsedPacket::parse(&p[..p.len() - 1]).unwrap_err(), DropReason::PayloadPastPacket);
    /// ```
    pub fn parse(bytes: &'a [u8]) -> Result<ParsedPacket<'a>, DropReason> {
        let packet = Packet::new_checked(bytes)?;
        let repr = PacketRepr::parse(&packet)?;
        Ok(ParsedPacket { packet, repr })
    }

    /// The payload, exactly PAYLOAD_LENGTH bytes.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let bytes: &'a [u8] = self.packet.buffer;
        &bytes[self.repr.header_len()..]
    }

    /// The value of the first immediate item `id`, if present.
    pub fn immediate(&self, id: u64) -> Option<u64> {
        self.packet
            .pointers()
            .find(|p| p.immediate && p.id == id)
            .map(|p| p.value)
    }
}

/// Write the 8-byte header for a packet of `n_items` pointers.
pub fn emit_header(flavour: Flavour, n_items: u16, out: &mut [u8]) {
    out[field::MAGIC] = MAGIC;
    out[field::VERSION] = VERSION;
    out[field::ID_BYTES] = (8 - flavour.addr_bytes()) as u8;
    out[field::ADDR_BYTES] = flavour.addr_bytes() as u8;
    out[4] = 0;
    out[5] = 0;
    out[field::N_ITEMS].copy_from_slice(&n_items.to_be_bytes());
}

/// Write one item pointer at index `i` of the table.
#[inline]
pub fn emit_pointer(raw: u64, i: usize, out: &mut [u8]) {
    let start = HEADER_LEN + POINTER_LEN * i;
    out[start..start + POINTER_LEN].copy_from_slice(&raw.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test encoder written independently of `emit_*`: bytes assembled by hand.
    fn make_packet(id_bytes: u8, addr_bytes: u8, pointers: &[u64], payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0x53, 0x04, id_bytes, addr_bytes, 0, 0];
        v.extend_from_slice(&(pointers.len() as u16).to_be_bytes());
        for p in pointers {
            v.extend_from_slice(&p.to_be_bytes());
        }
        v.extend_from_slice(payload);
        v
    }

    const IMM: u64 = 1 << 63;

    fn basic(payload: &[u8], len: u64, off: u64) -> Vec<u8> {
        make_packet(
            2,
            6,
            &[
                IMM | (1 << 48) | 7,
                IMM | (2 << 48) | len,
                IMM | (3 << 48) | off,
                IMM | (4 << 48) | payload.len() as u64,
                0x1000 << 48,
            ],
            payload,
        )
    }

    #[test]
    fn parses_good_packet() {
        let bytes = basic(&[1, 2, 3, 4], 10, 6);
        let p = ParsedPacket::parse(&bytes).unwrap();
        assert_eq!(p.repr.heap_cnt, 7);
        assert_eq!(p.repr.heap_length, Some(10));
        assert_eq!(p.repr.payload_offset, 6);
        assert_eq!(p.payload(), &[1, 2, 3, 4]);
        let ptrs: Vec<_> = p.packet.pointers().collect();
        assert_eq!(
            ptrs[4],
            ItemPointer {
                immediate: false,
                id: 0x1000,
                value: 0
            }
        );
    }

    #[test]
    fn rejections_by_cause() {
        let good = basic(&[1, 2, 3, 4], 10, 0);
        let cases: Vec<(Vec<u8>, DropReason)> = vec![
            (good[..7].to_vec(), DropReason::ShortHeader),
            (good[..20].to_vec(), DropReason::ShortHeader),
            (
                {
                    let mut b = good.clone();
                    b[0] = 0x54;
                    b
                },
                DropReason::BadMagic,
            ),
            (
                {
                    let mut b = good.clone();
                    b[1] = 3;
                    b
                },
                DropReason::BadVersion,
            ),
            (
                {
                    let mut b = good.clone();
                    b[2] = 3;
                    b
                },
                DropReason::BadFlavour,
            ),
            (
                {
                    let mut b = good.clone();
                    b[2] = 0;
                    b[3] = 8;
                    b
                },
                DropReason::BadFlavour,
            ),
            (
                good[..good.len() - 1].to_vec(),
                DropReason::PayloadPastPacket,
            ),
            (
                {
                    let mut b = good.clone();
                    b.push(0);
                    b
                },
                DropReason::SizeMismatch,
            ),
            (basic(&[1, 2, 3, 4], 10, 7), DropReason::PayloadPastHeap),
            (
                make_packet(2, 6, &[IMM | (1 << 48), IMM | (3 << 48)], &[]),
                DropReason::MissingItems,
            ),
            // Addressed (non-immediate) specials do not count.
            (
                make_packet(2, 6, &[IMM | (1 << 48), 3 << 48, IMM | (4 << 48)], &[]),
                DropReason::MissingItems,
            ),
        ];
        for (bytes, reason) in cases {
            assert_eq!(
                ParsedPacket::parse(&bytes).unwrap_err(),
                reason,
                "{bytes:02x?}"
            );
        }
    }

    #[test]
    fn other_flavours() {
        // SPEAD-64-40: 3 ID bytes, 5 address bytes.
        let f = Flavour::new(40).unwrap();
        let bytes = make_packet(
            3,
            5,
            &[
                f.encode_immediate(1, 0xff_ffff_ffff),
                f.encode_immediate(3, 0),
                f.encode_immediate(4, 0),
                f.encode_immediate(0x7f_ffff, 5),
            ],
            &[],
        );
        let p = ParsedPacket::parse(&bytes).unwrap();
        assert_eq!(p.repr.heap_cnt, 0xff_ffff_ffff);
        assert_eq!(p.repr.heap_length, None);
        assert_eq!(p.immediate(0x7f_ffff), Some(5));
        assert_eq!(p.repr.flavour, f);
    }

    #[test]
    fn emit_into_dirty_buffer() {
        let mut buf = vec![0xa5; 16];
        emit_header(Flavour::SPEAD_64_48, 1, &mut buf);
        emit_pointer(
            Flavour::SPEAD_64_48.encode_immediate(1, 0x0203),
            0,
            &mut buf,
        );
        assert_eq!(buf, [0x53, 4, 2, 6, 0, 0, 0, 1, 0x80, 1, 0, 0, 0, 0, 2, 3]);
    }
}
