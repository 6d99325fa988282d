//! The CPU backend of a narrowband output (seed 000 §Narrowband, §Down-conversion kernel): the
//! same [`Backend`] contract as the wideband one, so the pipeline's scheduling, delays,
//! presence and heap bookkeeping are shared.
//!
//! - [`Backend::load`] decodes the chunk with its tail and runs the DDC over it once per
//!   polarisation (`dsp::ddc_fast`: the oracle `dsp::ddc::ddc`'s contract in f32 — mixer
//!   referenced to the absolute timestamp of each sample, low-pass filter, subsampling by S —
//!   within about 10⁻⁷·2^bits of it), so DDC output b of the chunk starting at sample t_c is
//!   digitiser sample t_c + S·b. The outputs the previous load computed from its tail, which
//!   is this chunk's head, are moved rather than computed again when the head is the same
//!   (a quarter of the body at decimation 8, half at 16, with katgpucbf's 16 PFB taps).
//! - [`Backend::front_end`] records the spectrum whose window starts at chunk offset `offset`
//!   (a multiple of S: the pipeline aligns narrowband coarse delays to the subsampling), on
//!   DDC outputs from `offset/S`. The recorded spectra's complex PFB FIR runs as one batch
//!   (`dsp::complex_pfb`, each input read from memory once for the batch rather than once per
//!   spectrum and tap) before the next load replaces the DDC outputs, or before the back end.
//! - [`Backend::back_end`] runs the M-point complex FFT, keeps the channels around DC, and
//!   post-processes them with the narrowband phase convention (`dsp::postproc`,
//!   convention §3), into the same F-heap layout as wideband.
//!
//! One core keeps up with about 210–290 MS/s per polarisation at 32768 channels and decimation
//! 8–16 (the Zen 5 dev VM, `bench/RESULTS.md`), an eighth to a sixth of MeerKAT's 1712 MS/s.
//!
//! No digitiser power is measured here: the statistics come from the wideband outputs
//! (seed 000 §Input statistics).
#![deny(unsafe_code)]

use num_complex::Complex32;

use super::backend::{BackEndInput, Backend, BackendError, ChunkInput, Finished, HeapData};
use super::narrowband_output::NarrowbandOutput;
use crate::dsp::complex_pfb::{complex_pfb_firs, pair_weights};
use crate::dsp::ddc::DdcError;
use crate::dsp::ddc::{mixer_step, NarrowbandFft};
use crate::dsp::ddc_fast::{FastDdc, SPLIT};
use crate::dsp::pfb::pfb_weights;
use crate::dsp::postproc::{pack_4bit, postproc_heap_as, HeapInput, OutputBits, PhaseConvention};
use crate::dsp::samples::unpack;

/// The sizes a narrowband backend is built for (besides its output).
#[derive(Debug, Clone, Copy)]
pub struct NarrowbandSizes {
    pub adc_sample_rate: f64,
    /// Bits per digitiser sample.
    pub sample_bits: u32,
    /// Samples per polarisation of a chunk, and of the tail taken from the next.
    pub body: usize,
    pub tail: usize,
    pub spectra_per_heap: usize,
    pub out_bits: OutputBits,
}

pub struct NarrowbandBackend {
    channels: usize,
    fft_len: usize,
    subsampling: usize,
    convention: PhaseConvention,
    sample_bits: u32,
    body: usize,
    pol_bytes: usize,
    tail_bytes: usize,
    ddc: FastDdc,
    /// The PFB weights, each twice (`dsp::complex_pfb::pair_weights`).
    pfb_pairs: Vec<f32>,
    fft: NarrowbandFft,
    /// Decoded samples of one polarisation, body and tail.
    samples: Vec<i32>,
    /// DDC output per polarisation.
    subsampled: [Vec<Complex32>; 2],
    /// DDC outputs computed from a chunk's tail alone (from body/S on), which the next chunk's
    /// load can move to its start instead of computing again; 0 where the body is not a whole
    /// number of `SPLIT` blocks of outputs or the tail holds none.
    carry: usize,
    /// The id of the chunk whose head the last load took as its tail, and that head per
    /// polarisation (packed), kept to check that the chunk loaded next has the same head.
    tail_from: Option<u64>,
    tail_copy: [Vec<u8>; 2],
    /// PFB output per polarisation: spectra_per_heap × fft_len.
    frames: [Vec<Complex32>; 2],
    /// Spectra asked for but not yet filtered, per polarisation: (first DDC output, slot).
    pending: [Vec<(usize, usize)>; 2],
    /// Kept channels per polarisation: spectra_per_heap × channels.
    spectra: [Vec<Complex32>; 2],
    heap: Vec<i8>,
    out_bits: OutputBits,
    packed: Vec<u8>,
    done: Option<[u64; 2]>,
}

impl NarrowbandBackend {
    /// Design the DDC filter and size the buffers (the output was checked against the sample
    /// rate by the engine's configuration).
    pub fn new(output: &NarrowbandOutput, sizes: NarrowbandSizes) -> Result<Self, DdcError> {
        let s = output.subsampling();
        let (channels, fft_len) = (output.channels, output.internal_channels());
        let ddc_weights = output.ddc_weights(sizes.adc_sample_rate)?;
        let n_sub = (sizes.body + sizes.tail).saturating_sub(ddc_weights.len()) / s + 1;
        let heap_values = channels * sizes.spectra_per_heap * 4;
        let bits = sizes.sample_bits as usize;
        // Whole multiples of `SPLIT` after a body of them, so that the carried outputs and
        // those computed after them are bit for bit those of a whole run.
        let carry = if sizes.body % (s * SPLIT) == 0 && sizes.tail <= sizes.body {
            n_sub.saturating_sub(sizes.body / s) / SPLIT * SPLIT
        } else {
            0
        };
        let tail_copy = if carry > 0 { sizes.tail * bits / 8 } else { 0 };
        Ok(NarrowbandBackend {
            channels,
            fft_len,
            subsampling: s,
            convention: PhaseConvention::Narrowband {
                decimation: output.decimation,
            },
            sample_bits: sizes.sample_bits,
            body: sizes.body,
            pol_bytes: sizes.body * bits / 8,
            tail_bytes: sizes.tail * bits / 8,
            ddc: FastDdc::new(
                &ddc_weights,
                s,
                mixer_step(output.mixer_frequency(sizes.adc_sample_rate)),
            ),
            pfb_pairs: pair_weights(&pfb_weights(
                fft_len,
                output.taps,
                output.w_cutoff,
                output.window,
            )),
            fft: NarrowbandFft::new(fft_len, channels),
            samples: vec![0; sizes.body + sizes.tail],
            subsampled: [
                vec![Complex32::default(); n_sub],
                vec![Complex32::default(); n_sub],
            ],
            carry,
            tail_from: None,
            tail_copy: [vec![0; tail_copy], vec![0; tail_copy]],
            frames: [
                vec![Complex32::default(); sizes.spectra_per_heap * fft_len],
                vec![Complex32::default(); sizes.spectra_per_heap * fft_len],
            ],
            pending: [
                Vec::with_capacity(sizes.spectra_per_heap),
                Vec::with_capacity(sizes.spectra_per_heap),
            ],
            spectra: [
                vec![Complex32::default(); sizes.spectra_per_heap * channels],
                vec![Complex32::default(); sizes.spectra_per_heap * channels],
            ],
            heap: vec![0; heap_values],
            out_bits: sizes.out_bits,
            packed: vec![
                0;
                if sizes.out_bits == OutputBits::Four {
                    heap_values / 2
                } else {
                    0
                }
            ],
            done: None,
        })
    }
}

impl NarrowbandBackend {
    /// Filter every pending spectrum from the DDC output now held (before it is replaced, or
    /// before the heap's FFTs).
    fn filter_pending(&mut self) {
        for p in 0..2 {
            complex_pfb_firs(
                &self.subsampled[p],
                &self.pfb_pairs,
                self.fft_len,
                &self.pending[p],
                &mut self.frames[p],
            );
            self.pending[p].clear();
        }
    }
}

impl Backend for NarrowbandBackend {
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError> {
        self.filter_pending();
        let (pb, tb) = (self.pol_bytes, self.tail_bytes);
        let (s, bits) = (self.subsampling, self.sample_bits);
        let first_sample = chunk.id.wrapping_mul(self.body as u64);
        let follows = self.tail_from == Some(chunk.id);
        for p in 0..2 {
            let data = &chunk.data[p * pb..(p + 1) * pb];
            // The outputs the last load computed from this chunk's head, if it had this head:
            // the same inputs and absolute phases, so the same values.
            let keep = if follows && data[..tb] == self.tail_copy[p][..] {
                self.carry
            } else {
                0
            };
            let from = self.body / s;
            self.subsampled[p].copy_within(from..from + keep, 0);
            // Decode from the first sample the other outputs read, down to a whole byte.
            let start = s * keep / 8 * 8;
            let (head, rest) = self.samples.split_at_mut(self.body);
            unpack(&data[start * bits as usize / 8..], bits, &mut head[start..]);
            match chunk.next {
                Some(next) => {
                    let tail = &next[p * pb..p * pb + tb];
                    unpack(tail, bits, rest);
                    if self.carry > 0 {
                        self.tail_copy[p].copy_from_slice(tail);
                    }
                }
                None => rest.fill(0),
            }
            self.ddc.run(
                &self.samples[s * keep..],
                first_sample.wrapping_add((s * keep) as u64),
                &mut self.subsampled[p][keep..],
            );
        }
        self.tail_from = chunk
            .next
            .filter(|_| self.carry > 0)
            .map(|_| chunk.id.wrapping_add(1));
        Ok(())
    }

    fn release(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        if offset % self.subsampling != 0 {
            return Err(BackendError(format!(
                "narrowband spectrum at offset {offset}, not a multiple of the subsampling {}",
                self.subsampling
            )));
        }
        self.pending[pol].push((offset / self.subsampling, k));
        Ok(())
    }

    fn discard(&mut self) -> Result<(), BackendError> {
        self.pending.iter_mut().for_each(Vec::clear);
        Ok(())
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        self.filter_pending();
        let (m, n) = (self.fft_len, self.channels);
        for p in 0..2 {
            for (frame, out) in self.frames[p]
                .chunks_exact_mut(m)
                .zip(self.spectra[p].chunks_exact_mut(n))
            {
                self.fft.run(frame, out);
            }
        }
        let heap = HeapInput {
            spectra: [&self.spectra[0], &self.spectra[1]],
            gains: input.gains,
            delays: input.delays,
            timestamps: input.timestamps,
            dither: input.dither,
        };
        let clips = postproc_heap_as(self.convention, &heap, n, self.out_bits, &mut self.heap);
        if self.out_bits == OutputBits::Four {
            pack_4bit(&self.heap, &mut self.packed);
        }
        self.done = Some(clips);
        Ok(())
    }

    fn ready(&self) -> bool {
        self.done.is_none()
    }

    fn finished(&mut self, _wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        let Some(clips) = self.done.take() else {
            return Ok(None);
        };
        let data: &[u8] = match self.out_bits {
            OutputBits::Eight => bytemuck::cast_slice(&self.heap),
            OutputBits::Four => &self.packed,
        };
        Ok(Some(Finished {
            data: HeapData::Host(data),
            clips,
            power: [0; 2],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::samples::packed_len;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    const BODY: usize = 8192;
    const TAIL: usize = 2560;

    fn backend() -> NarrowbandBackend {
        let o = NarrowbandOutput::parse(
            "name=nb,channels=64,centre_frequency=3.1e8,decimation=4,dst=127.0.0.1:9,taps=4",
        )
        .unwrap();
        let sizes = NarrowbandSizes {
            adc_sample_rate: 1712e6,
            sample_bits: 10,
            body: BODY,
            tail: TAIL,
            spectra_per_heap: 4,
            out_bits: OutputBits::Eight,
        };
        NarrowbandBackend::new(&o, sizes).unwrap()
    }

    fn load(b: &mut NarrowbandBackend, id: u64, data: &[u8], next: Option<&[u8]>) {
        b.load(ChunkInput { id, data, next }).unwrap();
    }

    /// A chunk whose head was the last load's tail takes the DDC outputs of that tail over:
    /// they equal (bit for bit) a fresh backend's loading the same chunk, and so does every
    /// load where the head differs from the tail used or no tail was there.
    #[test]
    fn outputs_carried_from_the_tail_equal_computed_ones() {
        let mut rng = SmallRng::seed_from_u64(16);
        let chunk = |rng: &mut SmallRng| -> Vec<u8> {
            (0..2 * packed_len(BODY, 10))
                .map(|_| rng.random())
                .collect()
        };
        let c: Vec<Vec<u8>> = (0..4).map(|_| chunk(&mut rng)).collect();
        let fresh = |id: u64, data: &[u8], next: &[u8]| {
            let mut b = backend();
            load(&mut b, id, data, Some(next));
            b.subsampled
        };
        let mut b = backend();
        assert!(b.carry > 0);
        // Chunk 5, then 6 with the head chunk 5's load saw: carried.
        load(&mut b, 5, &c[0], Some(&c[1]));
        assert_eq!(b.tail_from, Some(6));
        load(&mut b, 6, &c[1], Some(&c[2]));
        assert!(b.subsampled == fresh(6, &c[1], &c[2]));
        // Chunk 7 with another head than chunk 6's load saw: computed.
        load(&mut b, 7, &c[3], Some(&c[0]));
        assert!(b.subsampled == fresh(7, &c[3], &c[0]));
        // Chunk 8 after a load without a tail: computed.
        load(&mut b, 8, &c[0], None);
        assert_eq!(b.tail_from, None);
        load(&mut b, 9, &c[1], Some(&c[2]));
        assert!(b.subsampled == fresh(9, &c[1], &c[2]));
    }
}
