//! X and beam heaps on the wire (facts §1.9 "X heap", "Beam heap"; SPEAD-64-48, every pointer
//! in every packet). An X heap is one dump: timestamp, frequency (this engine's first
//! channel), xeng_raw int32 little-endian of shape (channels per substream, baselines × 4, 2).
//! A beam heap is one batch of one beam: timestamp, frequency, beam_ants (antennas present in
//! the sum) and bf_raw int8 of shape (channels per substream, spectra per heap, 2). An FRB heap
//! is one chunk of one `--frb-beam` output ([`FrbHeapFormat`]).
#![deny(unsafe_code)]

use crate::engine::send::HeapFormat;
use crate::spead::items::{
    Descriptor, BEAM_ANTS_ID, BF_RAW_ID, FRB_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID, XENG_RAW_ID,
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

/// One `--frb-beam` output's heaps (cbf's own format; seed 004 leaves the packet format open):
/// one substream, one heap per receive chunk of `--heaps-per-fengine-per-chunk` batches, SPEAD-64-48
/// with every pointer in every packet, items
///
/// | id | name | value |
/// |---|---|---|
/// | 0x1600 | `timestamp` | ADC timestamp of the chunk's first spectrum (immediate, u48) |
/// | 0x4103 | `frequency` | this engine's first channel (immediate, u48) |
/// | 0x5004 | `beam_ants` | antennas present in every batch of the heap (immediate, u48) |
/// | 0x5100 | `frb_raw` | `<f2` (IEEE float16, little-endian), shape (channels per substream, slow times, beams) |
///
/// where slow time s sums the chunk's spectra s·T_ds … (s+1)·T_ds − 1 and `frb_raw` holds
/// scale · J (J of seed 004 eq. 3 with weights, both polarisations), saturated at ±65504.
/// Missing antennas contribute nothing; a chunk with none present sends no heap.
pub struct FrbHeapFormat {
    pub channels_per_substream: usize,
    pub slow: usize,
    pub beams: usize,
    pub channel_offset: u64,
}

/// What travels with an FRB heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrbMeta {
    pub timestamp: u64,
    pub beam_ants: u64,
}

impl FrbHeapFormat {
    /// float16 values of one heap.
    pub fn values(&self) -> usize {
        self.channels_per_substream * self.slow * self.beams
    }

    pub fn heap_bytes(&self) -> usize {
        2 * self.values()
    }
}

impl HeapFormat for FrbHeapFormat {
    type Meta = FrbMeta;

    fn substreams(&self) -> usize {
        1
    }

    fn heap<'a>(&self, data: &'a [u8], meta: &FrbMeta, _substream: usize) -> Option<Heap<'a>> {
        let mut h = Heap::new();
        h.repeat_pointers = true;
        h.add_immediate(TIMESTAMP_ID, meta.timestamp)
            .add_immediate(FREQUENCY_ID, self.channel_offset)
            .add_immediate(BEAM_ANTS_ID, meta.beam_ants)
            .add_bytes(FRB_RAW_ID, data);
        Some(h)
    }

    fn descriptors(&self, _substream: usize) -> Heap<'static> {
        let f = Flavour::SPEAD_64_48;
        let mut h = Heap::new();
        common_descriptors(&mut h);
        h.add_descriptor(
            &Descriptor::with_format(
                BEAM_ANTS_ID,
                "beam_ants",
                "Number of antennas present in every batch of the heap",
                &[],
                &U48,
            ),
            f,
        )
        .add_descriptor(
            &Descriptor::with_dtype(
                FRB_RAW_ID,
                "frb_raw",
                "FRB beam intensities times scale (channel, slow time, beam)",
                &[
                    self.channels_per_substream as u64,
                    self.slow as u64,
                    self.beams as u64,
                ],
                "<f2",
            ),
            f,
        );
        h
    }
}
