//! Where an F heap goes in an X-engine input chunk (katgpucbf xbgpu's receive, facts §1.4,
//! §1.9 "F heap", seed 001 §Accumulations): a *batch* is the heaps of every F-engine with one
//! timestamp, a chunk holds `heaps_per_fengine_per_chunk` consecutive batches, so
//! chunk = timestamp / (heap step × batches per chunk) and heap index = batch × n_ants +
//! feng_id; the chunk's bytes are therefore (batch, antenna, channel, spectrum, pol, re/im),
//! each batch laid out as `dsp::correlate` reads it. Heaps without a timestamp or feng_id, or
//! whose size is not one heap, are metadata; timestamps off the heap grid are bad; feng_ids
//! outside the array are counted apart. Pure.
#![deny(unsafe_code)]

use crate::spead::items::{FENG_ID_ID, FREQUENCY_ID, TIMESTAMP_ID};
use crate::spead::recv::{PlaceInput, Placement};

/// The immediates the placement reads, in this order.
pub const ITEMS: [u64; 3] = [TIMESTAMP_ID, FENG_ID_ID, FREQUENCY_ID];
/// Reject reasons, by index (katgpucbf's metric names, `input_…`).
pub const REJECT_REASONS: [&str; 3] =
    ["metadata_heaps", "bad_timestamp_heaps", "bad_feng_id_heaps"];
pub const METADATA: usize = 0;
pub const BAD_TIMESTAMP: usize = 1;
pub const BAD_FENG_ID: usize = 2;

/// Geometry of X-engine input chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XLayout {
    pub n_ants: usize,
    /// Bytes of one F heap (channels per substream × spectra per heap × 2 pols × value bytes).
    pub heap_bytes: usize,
    /// Timestamp step between batches (spectra per heap × samples between spectra).
    pub heap_step: u64,
    /// Batches per chunk (`--heaps-per-fengine-per-chunk`).
    pub batches: usize,
}

impl XLayout {
    pub fn heaps_per_chunk(&self) -> usize {
        self.n_ants * self.batches
    }

    pub fn chunk_bytes(&self) -> usize {
        self.heaps_per_chunk() * self.heap_bytes
    }

    /// Timestamp span of one chunk.
    pub fn chunk_step(&self) -> u64 {
        self.heap_step * self.batches as u64
    }

    /// Bytes of one batch (every antenna's heap of one timestamp).
    pub fn batch_bytes(&self) -> usize {
        self.n_ants * self.heap_bytes
    }

    pub fn place(&self, p: &PlaceInput<'_>) -> Placement {
        let (Some(ts), Some(feng)) = (p.items[0], p.items[1]) else {
            return Placement::Reject(METADATA);
        };
        if p.heap_length != self.heap_bytes as u64 {
            return Placement::Reject(METADATA);
        }
        if ts % self.heap_step != 0 {
            return Placement::Reject(BAD_TIMESTAMP);
        }
        if feng >= self.n_ants as u64 {
            return Placement::Reject(BAD_FENG_ID);
        }
        let batch = ((ts / self.heap_step) % self.batches as u64) as usize;
        let heap_index = batch * self.n_ants + feng as usize;
        Placement::Heap {
            chunk_id: ts / self.chunk_step(),
            heap_index,
            heap_offset: heap_index * self.heap_bytes,
            extra: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_like_xbgpu() {
        let l = XLayout {
            n_ants: 4,
            heap_bytes: 1024,
            heap_step: 2048 * 256,
            batches: 32,
        };
        let at = |ts: Option<u64>, feng: u64, len: u64| {
            l.place(&PlaceInput {
                items: &[ts, Some(feng), Some(0)],
                heap_cnt: 7,
                heap_length: len,
            })
        };
        // Batch 33 is batch 1 of chunk 1; antenna 3.
        assert_eq!(
            at(Some(33 * l.heap_step), 3, 1024),
            Placement::Heap {
                chunk_id: 1,
                heap_index: 4 + 3,
                heap_offset: 7 * 1024,
                extra: 0
            }
        );
        assert_eq!(
            at(Some(33 * l.heap_step), 4, 1024),
            Placement::Reject(BAD_FENG_ID)
        );
        assert_eq!(
            at(Some(l.heap_step + 1), 0, 1024),
            Placement::Reject(BAD_TIMESTAMP)
        );
        assert_eq!(at(Some(0), 0, 1023), Placement::Reject(METADATA));
        assert_eq!(at(None, 0, 1024), Placement::Reject(METADATA));
        assert_eq!(l.chunk_bytes(), 4 * 32 * 1024);
    }
}
