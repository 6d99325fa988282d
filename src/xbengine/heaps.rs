//! X and beam heaps on the wire (facts §1.9 "X heap", "Beam heap"; SPEAD-64-48, every pointer
//! in every packet). An X heap is one dump: timestamp, frequency (this engine's first
//! channel), xeng_raw int32 little-endian of shape (channels per substream, baselines × 4, 2).
//! A beam heap is one batch of one beam: timestamp, frequency, beam_ants (antennas present in
//! the sum) and bf_raw int8 of shape (channels per substream, spectra per heap, 2).
#![deny(unsafe_code)]

use crate::engine::send::HeapFormat;
use crate::spead::items::{
    Descriptor, BEAM_ANTS_ID, BF_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID, XENG_RAW_ID,
};
use crate::spead::send::Heap;
use crate::spead::Flavour;

const U48: [(u8, u64); 1] = [(b'u', 48)];

fn common_descriptors(h: &mut Heap<'static>) {
    let f = Flavour::SPEAD_64_48;
    h.add_descriptor(
        &Descriptor::with_format(
            TIMESTAMP_ID,
            "timestamp",
            "Timestamp of the first spectrum, in ADC samples since the sync time",
            &[],
            &U48,
        ),
        f,
    )
    .add_descriptor(
        &Descriptor::with_format(
            FREQUENCY_ID,
            "frequency",
            "First channel in the heap",
            &[],
            &U48,
        ),
        f,
    );
}

/// One `--corrprod` output's X heaps (one substream, one heap per dump).
pub struct XHeapFormat {
    pub channels_per_substream: usize,
    pub n_baselines: usize,
    /// This engine's first channel (`--channel-offset-value`).
    pub channel_offset: u64,
}

impl XHeapFormat {
    /// Bytes of one dump.
    pub fn heap_bytes(&self) -> usize {
        self.channels_per_substream * self.n_baselines * 4 * 2 * 4
    }
}

impl HeapFormat for XHeapFormat {
    /// The dump's timestamp.
    type Meta = u64;

    fn substreams(&self) -> usize {
        1
    }

    fn heap<'a>(&self, data: &'a [u8], timestamp: &u64, _substream: usize) -> Option<Heap<'a>> {
        let mut h = Heap::new();
        h.repeat_pointers = true;
        h.add_immediate(TIMESTAMP_ID, *timestamp)
            .add_immediate(FREQUENCY_ID, self.channel_offset)
            .add_bytes(XENG_RAW_ID, data);
        Some(h)
    }

    fn descriptors(&self, _substream: usize) -> Heap<'static> {
        let mut h = Heap::new();
        common_descriptors(&mut h);
        h.add_descriptor(
            &Descriptor::with_dtype(
                XENG_RAW_ID,
                "xeng_raw",
                // ASCII only: spead2 decodes descriptor text as ASCII (a '×' here broke it).
                "Integrated baseline correlation products (channel, baseline * 4 products aa/ba/ab/bb, re/im)",
                &[
                    self.channels_per_substream as u64,
                    (self.n_baselines * 4) as u64,
                    2,
                ],
                "<i4",
            ),
            Flavour::SPEAD_64_48,
        );
        h
    }
}

/// Every beam's heaps of one batch (one substream per beam, as katgpucbf's BSend).
pub struct BeamHeapFormat {
    pub beams: usize,
    pub channels_per_substream: usize,
    pub spectra_per_heap: usize,
    pub channel_offset: u64,
}

/// What travels with a batch of beam heaps.
#[derive(Debug, Clone)]
pub struct BeamMeta {
    pub timestamp: u64,
    /// Antennas present in the batch.
    pub beam_ants: u64,
    /// Per beam: whether its capture is on for this batch.
    pub send: Vec<bool>,
}

impl BeamHeapFormat {
    /// Bytes of one beam's heap.
    pub fn heap_bytes(&self) -> usize {
        self.channels_per_substream * self.spectra_per_heap * 2
    }
}

impl HeapFormat for BeamHeapFormat {
    type Meta = BeamMeta;

    fn substreams(&self) -> usize {
        self.beams
    }

    fn heap<'a>(&self, data: &'a [u8], meta: &BeamMeta, beam: usize) -> Option<Heap<'a>> {
        if !meta.send[beam] {
            return None;
        }
        let n = self.heap_bytes();
        let mut h = Heap::new();
        h.repeat_pointers = true;
        h.add_immediate(TIMESTAMP_ID, meta.timestamp)
            .add_immediate(FREQUENCY_ID, self.channel_offset)
            .add_immediate(BEAM_ANTS_ID, meta.beam_ants)
            .add_bytes(BF_RAW_ID, &data[beam * n..(beam + 1) * n]);
        Some(h)
    }

    fn descriptors(&self, _beam: usize) -> Heap<'static> {
        let f = Flavour::SPEAD_64_48;
        let mut h = Heap::new();
        common_descriptors(&mut h);
        h.add_descriptor(
            &Descriptor::with_format(
                BEAM_ANTS_ID,
                "beam_ants",
                "Number of antennas present in the beam sum",
                &[],
                &U48,
            ),
            f,
        )
        .add_descriptor(
            &Descriptor::with_dtype(
                BF_RAW_ID,
                "bf_raw",
                "Beamformer output (channel, spectrum, re/im)",
                &[
                    self.channels_per_substream as u64,
                    self.spectra_per_heap as u64,
                    2,
                ],
                "|i1",
            ),
            f,
        );
        h
    }
}
