//! Where a digitiser heap goes in an input chunk (katgpucbf fgpu's place callback, facts §1.9):
//! chunk = timestamp / chunk_samples; heap index = (timestamp / heap_samples mod heaps per
//! chunk) + pol × heaps per chunk, so polarisation is the chunk's major axis; the saturation
//! count from digitiser_status (bits ≥ 32) goes into the heap's `extra`. Heaps whose payload is
//! not one heap of samples or that lack a timestamp are metadata; timestamps off the heap grid
//! are bad. Pure.
#![deny(unsafe_code)]

use crate::spead::items::{DIGITISER_ID_ID, DIGITISER_STATUS_ID, TIMESTAMP_ID};
use crate::spead::recv::{PlaceInput, Placement};

/// The immediates the placement reads, in this order.
pub const ITEMS: [u64; 3] = [TIMESTAMP_ID, DIGITISER_ID_ID, DIGITISER_STATUS_ID];
/// Reject reasons, by index (katgpucbf's metric names).
pub const REJECT_REASONS: [&str; 2] = ["metadata_heaps", "bad_timestamp_heaps"];
pub const METADATA: usize = 0;
pub const BAD_TIMESTAMP: usize = 1;

/// Geometry of input chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLayout {
    pub heap_samples: u64,
    pub heap_bytes: u64,
    pub chunk_samples: u64,
    /// Clear the timestamp's bits below `heap_samples` first (katgpucbf's `--mask-timestamp`,
    /// `timestamp & ~(heap_samples − 1)`, for digitisers that set them).
    pub mask_timestamp: bool,
}

impl InputLayout {
    pub fn heaps_per_pol(&self) -> usize {
        (self.chunk_samples / self.heap_samples) as usize
    }

    /// Bytes of one polarisation's samples in a chunk.
    pub fn pol_bytes(&self) -> usize {
        self.heaps_per_pol() * self.heap_bytes as usize
    }

    pub fn place(&self, p: &PlaceInput<'_>) -> Placement {
        let (Some(mut ts), Some(id)) = (p.items[0], p.items[1]) else {
            return Placement::Reject(METADATA);
        };
        if self.mask_timestamp {
            ts &= !(self.heap_samples - 1);
        }
        if p.heap_length != self.heap_bytes {
            return Placement::Reject(METADATA);
        }
        if ts % self.heap_samples != 0 {
            return Placement::Reject(BAD_TIMESTAMP);
        }
        let pol = (id & 1) as usize;
        let per_pol = self.heaps_per_pol();
        let heap_index = ((ts / self.heap_samples) % per_pol as u64) as usize + pol * per_pol;
        Placement::Heap {
            chunk_id: ts / self.chunk_samples,
            heap_index,
            heap_offset: heap_index * self.heap_bytes as usize,
            extra: p.items[2].map_or(0, |s| s >> 32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_like_fgpu() {
        let mut l = InputLayout {
            heap_samples: 4096,
            heap_bytes: 5120,
            chunk_samples: 4096 * 8,
            mask_timestamp: false,
        };
        let at = |ts: u64, id: u64, status: u64, len: u64| {
            l.place(&PlaceInput {
                items: &[Some(ts), Some(id), Some(status)],
                heap_cnt: 2,
                heap_length: len,
            })
        };
        assert_eq!(
            at(4096 * 9, 3, 7 << 32 | 2, 5120),
            Placement::Heap {
                chunk_id: 1,
                heap_index: 1 + 8,
                heap_offset: 9 * 5120,
                extra: 7
            }
        );
        assert_eq!(
            at(4096 * 9, 2, 0, 5120),
            Placement::Heap {
                chunk_id: 1,
                heap_index: 1,
                heap_offset: 5120,
                extra: 0
            }
        );
        assert_eq!(at(4097, 0, 0, 5120), Placement::Reject(BAD_TIMESTAMP));
        assert_eq!(at(4096, 0, 0, 100), Placement::Reject(METADATA));
        assert_eq!(
            l.place(&PlaceInput {
                items: &[None, Some(0), None],
                heap_cnt: 1,
                heap_length: 5120
            }),
            Placement::Reject(METADATA)
        );
        // --mask-timestamp: the bits below the heap size are cleared, not refused.
        l.mask_timestamp = true;
        assert_eq!(
            l.place(&PlaceInput {
                items: &[Some(4096 * 9 + 17), Some(0), None],
                heap_cnt: 1,
                heap_length: 5120
            }),
            Placement::Heap {
                chunk_id: 1,
                heap_index: 1,
                heap_offset: 5120,
                extra: 0
            }
        );
    }
}
