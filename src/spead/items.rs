//! Item IDs of the streams cbf speaks, and SPEAD descriptors.
//!
//! IDs follow katgpucbf (`spead.py`; facts §1.9): receivers use these hard-coded IDs and
//! ignore descriptors, which are sent only so that generic tools (spead2's `ItemGroup`,
//! `cbf capture`) can name the items.
//!
//! A descriptor is itself a SPEAD packet nested in the payload of item 0x5, encoded exactly as
//! spead2 4.x does with bug-compat flags 0: a single packet with cnt 1, DESCRIPTOR_ID as an
//! immediate, then NAME, DESCRIPTION, FORMAT, SHAPE (and DTYPE when there is a numpy header)
//! as addressed items in that order. Shape entries are one flag byte (1 = variable) and
//! `addr_bytes` of size; format entries are one type character and `8 − addr_bytes` bytes of
//! bit width.
#![deny(unsafe_code)]

use super::wire::{
    emit_header, emit_pointer, Flavour, ParsedPacket, HEADER_LEN, HEAP_CNT_ID, HEAP_LENGTH_ID,
    PAYLOAD_LENGTH_ID, PAYLOAD_OFFSET_ID, POINTER_LEN,
};

pub const TIMESTAMP_ID: u64 = 0x1600;
pub const DIGITISER_ID_ID: u64 = 0x3101;
pub const DIGITISER_STATUS_ID: u64 = 0x3102;
pub const ADC_SAMPLES_ID: u64 = 0x3300;
pub const FENG_ID_ID: u64 = 0x4101;
pub const FREQUENCY_ID: u64 = 0x4103;
pub const FENG_RAW_ID: u64 = 0x4300;
pub const XENG_RAW_ID: u64 = 0x1800;
pub const BF_RAW_ID: u64 = 0x5000;
pub const BEAM_ANTS_ID: u64 = 0x5004;
/// cbf's own (katgpucbf has no FRB beamformer): `xbengine::heaps::FrbHeapFormat`.
pub const FRB_RAW_ID: u64 = 0x5100;

pub const DESCRIPTOR_NAME_ID: u64 = 0x10;
pub const DESCRIPTOR_DESCRIPTION_ID: u64 = 0x11;
pub const DESCRIPTOR_SHAPE_ID: u64 = 0x12;
pub const DESCRIPTOR_FORMAT_ID: u64 = 0x13;
pub const DESCRIPTOR_ID_ID: u64 = 0x14;
pub const DESCRIPTOR_DTYPE_ID: u64 = 0x15;

/// One item of a received heap, borrowed from the heap's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemValue<'a> {
    Immediate(u64),
    Bytes(&'a [u8]),
}

impl ItemValue<'_> {
    /// The value as an unsigned big-endian integer (immediates directly; up to 8 bytes).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            ItemValue::Immediate(v) => Some(v),
            ItemValue::Bytes(b) if b.len() <= 8 => {
                Some(b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
            }
            ItemValue::Bytes(_) => None,
        }
    }
}

/// Resolve item pointers against a heap payload, as spead2's `heap` constructor does: addressed
/// items are sorted by (address, pointer order), and each runs to the address of the next in
/// that order (or the end of the heap), so of two items at one address the first is empty.
/// Special items (NULL, CNT, LENGTH, OFFSET, PLEN) are skipped. Addresses beyond the payload
/// give an empty slice rather than a panic.
pub fn resolve_items<'a>(
    pointers: &[super::wire::ItemPointer],
    payload: &'a [u8],
) -> Vec<(u64, ItemValue<'a>)> {
    let end = payload.len() as u64;
    let mut order: Vec<usize> = (0..pointers.len())
        .filter(|&i| !pointers[i].immediate)
        .collect();
    order.sort_by_key(|&i| (pointers[i].value, i));
    let mut extent = vec![0u64; pointers.len()];
    for (k, &i) in order.iter().enumerate() {
        extent[i] = order.get(k + 1).map_or(end, |&j| pointers[j].value);
    }
    pointers
        .iter()
        .enumerate()
        .filter(|(_, p)| !(p.immediate && p.id <= PAYLOAD_LENGTH_ID) && p.id != 0)
        .map(|(i, p)| {
            if p.immediate {
                return (p.id, ItemValue::Immediate(p.value));
            }
            let stop = extent[i].min(end);
            let start = p.value.min(stop);
            (
                p.id,
                ItemValue::Bytes(&payload[start as usize..stop as usize]),
            )
        })
        .collect()
}

/// One dimension of a descriptor's shape.
pub type Dim = Option<u64>;

/// A SPEAD item descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub id: u64,
    pub name: String,
    pub description: String,
    /// `None` marks a variable-size dimension.
    pub shape: Vec<Dim>,
    /// SPEAD format: (type character, bits). Empty when `numpy_header` is set.
    pub format: Vec<(u8, u64)>,
    /// numpy `.npy` header dictionary, e.g. `{'descr': '>i2', 'fortran_order': False, 'shape': (3, 2)}`.
    pub numpy_header: Option<String>,
}

/// Why a descriptor could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error("descriptor is not a valid SPEAD packet: {0}")]
    Packet(super::wire::DropReason),
    #[error("descriptor has no DESCRIPTOR_ID item")]
    MissingId,
    #[error("descriptor field 0x{0:x} is malformed")]
    Field(u64),
}

impl Descriptor {
    /// A descriptor with a SPEAD format (`fmt`), e.g. `[(b'u', 48)]` for an immediate.
    pub fn with_format(
        id: u64,
        name: &str,
        description: &str,
        shape: &[Dim],
        fmt: &[(u8, u64)],
    ) -> Self {
        // spead2's receivers decode names and descriptions as ASCII and fail on anything else.
        debug_assert!(
            name.is_ascii() && description.is_ascii(),
            "{name}: {description}"
        );
        Descriptor {
            id,
            name: name.into(),
            description: description.into(),
            shape: shape.to_vec(),
            format: fmt.to_vec(),
            numpy_header: None,
        }
    }

    /// A descriptor with a numpy dtype (`descr` such as `|i1` or `>i4`); shape is fixed.
    pub fn with_dtype(id: u64, name: &str, description: &str, shape: &[u64], descr: &str) -> Self {
        debug_assert!(
            name.is_ascii() && description.is_ascii(),
            "{name}: {description}"
        );
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        let shape_text = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        Descriptor {
            id,
            name: name.into(),
            description: description.into(),
            shape: shape.iter().map(|&d| Some(d)).collect(),
            format: Vec::new(),
            numpy_header: Some(format!(
                "{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}}}"
            )),
        }
    }

    /// The raw descriptor bytes (a nested SPEAD packet), as spead2 encodes them.
    pub fn to_raw(&self, flavour: Flavour) -> Vec<u8> {
        let ab = flavour.addr_bytes();
        let fb = 8 - ab;
        let mut format = Vec::with_capacity(self.format.len() * (1 + fb));
        for &(code, bits) in &self.format {
            format.push(code);
            format.extend_from_slice(&bits.to_be_bytes()[8 - fb..]);
        }
        let mut shape = Vec::with_capacity(self.shape.len() * (1 + ab));
        for dim in &self.shape {
            shape.push(u8::from(dim.is_none()));
            shape.extend_from_slice(&dim.unwrap_or(0).to_be_bytes()[8 - ab..]);
        }
        let mut fields: Vec<(u64, &[u8])> = vec![
            (DESCRIPTOR_NAME_ID, self.name.as_bytes()),
            (DESCRIPTOR_DESCRIPTION_ID, self.description.as_bytes()),
            (DESCRIPTOR_FORMAT_ID, &format),
            (DESCRIPTOR_SHAPE_ID, &shape),
        ];
        if let Some(h) = &self.numpy_header {
            fields.push((DESCRIPTOR_DTYPE_ID, h.as_bytes()));
        }
        let payload_len: usize = fields.iter().map(|f| f.1.len()).sum();
        let n_items = 5 + fields.len();
        let header_len = HEADER_LEN + POINTER_LEN * n_items;
        let mut out = vec![0u8; header_len + payload_len];
        emit_header(flavour, n_items as u16, &mut out);
        let specials = [
            flavour.encode_immediate(HEAP_CNT_ID, 1),
            flavour.encode_immediate(HEAP_LENGTH_ID, payload_len as u64),
            flavour.encode_immediate(PAYLOAD_OFFSET_ID, 0),
            flavour.encode_immediate(PAYLOAD_LENGTH_ID, payload_len as u64),
            flavour.encode_immediate(DESCRIPTOR_ID_ID, self.id),
        ];
        for (i, &p) in specials.iter().enumerate() {
            emit_pointer(p, i, &mut out);
        }
        let mut addr = 0usize;
        for (i, (id, bytes)) in fields.iter().enumerate() {
            emit_pointer(flavour.encode_address(*id, addr as u64), 5 + i, &mut out);
            out[header_len + addr..header_len + addr + bytes.len()].copy_from_slice(bytes);
            addr += bytes.len();
        }
        out
    }

    /// Decode raw descriptor bytes (the value of a DESCRIPTOR item).
    pub fn from_raw(raw: &[u8]) -> Result<Descriptor, DescriptorError> {
        let packet = ParsedPacket::parse(raw).map_err(DescriptorError::Packet)?;
        let flavour = packet.repr.flavour;
        let pointers: Vec<_> = packet.packet.pointers().collect();
        let items = resolve_items(&pointers, packet.payload());
        let mut d = Descriptor {
            id: u64::MAX,
            name: String::new(),
            description: String::new(),
            shape: Vec::new(),
            format: Vec::new(),
            numpy_header: None,
        };
        let text = |id, v: ItemValue<'_>| match v {
            ItemValue::Bytes(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            ItemValue::Immediate(_) => Err(DescriptorError::Field(id)),
        };
        let ab = flavour.addr_bytes();
        for (id, value) in items {
            match id {
                DESCRIPTOR_ID_ID => d.id = value.as_u64().ok_or(DescriptorError::Field(id))?,
                DESCRIPTOR_NAME_ID => d.name = text(id, value)?,
                DESCRIPTOR_DESCRIPTION_ID => d.description = text(id, value)?,
                DESCRIPTOR_DTYPE_ID => d.numpy_header = Some(text(id, value)?),
                DESCRIPTOR_SHAPE_ID => {
                    let ItemValue::Bytes(b) = value else {
                        return Err(DescriptorError::Field(id));
                    };
                    if b.len() % (1 + ab) != 0 {
                        return Err(DescriptorError::Field(id));
                    }
                    d.shape = b
                        .chunks_exact(1 + ab)
                        .map(|e| {
                            // Bit 0 (or bit 1 under PySPEAD bug-compat) marks variable size.
                            (e[0] & 3 == 0).then(|| be_uint(&e[1..]))
                        })
                        .collect();
                }
                DESCRIPTOR_FORMAT_ID => {
                    let ItemValue::Bytes(b) = value else {
                        return Err(DescriptorError::Field(id));
                    };
                    let fb = 8 - ab;
                    if b.len() % (1 + fb) != 0 {
                        return Err(DescriptorError::Field(id));
                    }
                    d.format = b
                        .chunks_exact(1 + fb)
                        .map(|e| (e[0], be_uint(&e[1..])))
                        .collect();
                }
                _ => {}
            }
        }
        if d.id == u64::MAX {
            return Err(DescriptorError::MissingId);
        }
        Ok(d)
    }
}

fn be_uint(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spead2 4.5.1's bytes for the descriptor of a `('u', 48)` scalar named "timestamp",
    /// captured with `spead2.send.BytesStream` (the heap-level check is in tests/spead2_interop.rs).
    const TIMESTAMP_DESCRIPTOR: &str = "53040206000000098001000000000001800200000000000e8003000000000000800400000000000e801400000000160000100000000000000011000000000009001300000000000b001200000000000e74696d657374616d707473750030";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn matches_spead2_bytes() {
        let d = Descriptor::with_format(TIMESTAMP_ID, "timestamp", "ts", &[], &[(b'u', 48)]);
        assert_eq!(d.to_raw(Flavour::SPEAD_64_48), unhex(TIMESTAMP_DESCRIPTOR));
    }

    #[test]
    fn round_trip() {
        for d in [
            Descriptor::with_dtype(0x4300, "feng_raw", "raw", &[512, 256, 2, 2], "|i1"),
            Descriptor::with_format(0x10, "v", "", &[None, Some(3)], &[(b'i', 8), (b'f', 32)]),
        ] {
            for bits in [40, 48, 56] {
                let f = Flavour::new(bits).unwrap();
                assert_eq!(Descriptor::from_raw(&d.to_raw(f)).unwrap(), d);
            }
        }
    }

    #[test]
    fn resolve_handles_bad_addresses() {
        let f = Flavour::SPEAD_64_48;
        let ptrs = [
            f.decode(f.encode_address(0x1000, 100)),
            f.decode(f.encode_address(0x1001, 2)),
        ];
        let payload = [1u8, 2, 3, 4];
        let items = resolve_items(&ptrs, &payload);
        assert_eq!(items[0], (0x1000, ItemValue::Bytes(&[])));
        assert_eq!(items[1], (0x1001, ItemValue::Bytes(&[3, 4])));
    }
}
