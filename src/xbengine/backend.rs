//! The compute an XB-engine needs, behind one trait so that the engine is written once for the
//! CPU and CUDA backends (DESIGN "Data flow"): correlation of batch ranges into a per-output
//! accumulator, the reduce at each dump (seed 001 §Accumulations), and the beamformer per
//! batch (seed 003). The engine keeps the scheduling (dumps, presence, steering versions).

use std::ops::Range;

use crate::dsp::beamform::{Beam, BeamShape};
use crate::dsp::beamform_fast::Beamformer;
use crate::dsp::correlate::{unpack_4bit, CorrShape};
use crate::dsp::correlate_fast::{reduce, Correlator};

/// A backend's failure: the engine stops on it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// The shape every call shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XbShape {
    pub n_ants: usize,
    pub channels: usize,
    pub spectra: usize,
    /// 8, or 4 (one byte per complex value, real in the high nibble).
    pub sample_bits: u32,
    /// Accumulators (one per `--corrprod` output).
    pub outputs: usize,
    /// Threads the CPU correlator runs on.
    pub threads: usize,
}

impl XbShape {
    pub fn corr(&self) -> CorrShape {
        CorrShape {
            n_ants: self.n_ants,
            channels: self.channels,
            spectra: self.spectra,
        }
    }

    /// Wire bytes of one batch (every antenna's heap).
    pub fn batch_bytes(&self) -> usize {
        self.corr().input_len() * self.sample_bits as usize / 8
    }
}

/// One batch's beams.
pub struct BeamInput<'a> {
    pub beams: &'a [Beam],
    /// Per beam: the dither seed, or `None` for `dither=none`.
    pub dither: &'a [Option<u64>],
    /// Timestamp of each spectrum of the batch (keys the dither).
    pub timestamps: &'a [i64],
    pub present: &'a [bool],
}

pub trait XbBackend: Send {
    /// Make `chunk` (batch-major, each batch (antenna, channel, spectrum, pol, re/im)) current.
    fn load(&mut self, chunk: &[u8]) -> Result<(), BackendError>;
    /// Add batches `batches` of the loaded chunk into output `output`'s accumulator.
    fn correlate(&mut self, output: usize, batches: Range<usize>) -> Result<(), BackendError>;
    /// Reduce output `output`'s accumulator into `out` (int32 little-endian, (channel,
    /// baseline, product, re/im)), flagging baselines of antennas not `present`, and zero the
    /// accumulator. Returns the saturated value count.
    fn dump(
        &mut self,
        output: usize,
        present: &[bool],
        out: &mut [u8],
    ) -> Result<u64, BackendError>;
    /// Form every beam of batch `batch` of the loaded chunk into `out` ((beam, channel,
    /// spectrum, re/im) int8). Returns per-beam saturated complex values.
    fn beamform(
        &mut self,
        batch: usize,
        input: &BeamInput<'_>,
        out: &mut [u8],
    ) -> Result<Vec<u64>, BackendError>;
}

/// The CPU backend: `src/dsp` on the host (the blocked, vectorised, multi-threaded correlator
/// of `dsp::correlate_fast` and the threaded beamformer of `dsp::beamform_fast`, both exact
/// against their oracles).
pub struct CpuBackend {
    shape: XbShape,
    correlator: Correlator,
    beamformer: Beamformer,
    /// The loaded chunk, as int8 (4-bit input expanded).
    chunk: Vec<i8>,
    acc: Vec<Vec<i64>>,
    vis: Vec<i32>,
}

impl CpuBackend {
    pub fn new(shape: XbShape, batches: usize) -> CpuBackend {
        let corr = shape.corr();
        CpuBackend {
            shape,
            correlator: Correlator::new(corr, shape.threads),
            beamformer: Beamformer::new(
                BeamShape {
                    n_ants: shape.n_ants,
                    channels: shape.channels,
                    spectra: shape.spectra,
                },
                shape.threads,
            ),
            chunk: vec![0; corr.input_len() * batches],
            acc: vec![vec![0; corr.vis_len()]; shape.outputs],
            vis: vec![0; corr.vis_len()],
        }
    }
}

impl XbBackend for CpuBackend {
    fn load(&mut self, chunk: &[u8]) -> Result<(), BackendError> {
        if self.shape.sample_bits == 4 {
            unpack_4bit(chunk, &mut self.chunk);
        } else {
            self.chunk.copy_from_slice(bytemuck::cast_slice(chunk));
        }
        Ok(())
    }

    fn correlate(&mut self, output: usize, batches: Range<usize>) -> Result<(), BackendError> {
        let n = self.shape.corr().input_len();
        let acc = &mut self.acc[output];
        for b in batches {
            self.correlator
                .accumulate(&self.chunk[b * n..(b + 1) * n], acc);
        }
        Ok(())
    }

    fn dump(
        &mut self,
        output: usize,
        present: &[bool],
        out: &mut [u8],
    ) -> Result<u64, BackendError> {
        let clips = reduce(self.shape.corr(), &self.acc[output], present, &mut self.vis);
        for (o, v) in out.chunks_exact_mut(4).zip(&self.vis) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        self.acc[output].fill(0);
        Ok(clips)
    }

    fn beamform(
        &mut self,
        batch: usize,
        input: &BeamInput<'_>,
        out: &mut [u8],
    ) -> Result<Vec<u64>, BackendError> {
        let shape = BeamShape {
            n_ants: self.shape.n_ants,
            channels: self.shape.channels,
            spectra: self.shape.spectra,
        };
        let per_beam = shape.channels * shape.spectra * 2;
        let n = self.shape.corr().input_len();
        let x = &self.chunk[batch * n..(batch + 1) * n];
        let mut clips = Vec::with_capacity(input.beams.len());
        for (b, beam) in input.beams.iter().enumerate() {
            // One beam at a time so each keeps its own dither choice; seeding with seed + b
            // gives the bits `dsp::beamform::beam_dither` keys on beam b.
            let seed = input.dither[b].map(|s| s.wrapping_add(b as u64));
            let o: &mut [i8] = bytemuck::cast_slice_mut(&mut out[b * per_beam..(b + 1) * per_beam]);
            let (c, _) = self.beamformer.form(
                x,
                input.present,
                std::slice::from_ref(beam),
                input.timestamps,
                seed,
                o,
            );
            clips.push(c[0]);
        }
        Ok(clips)
    }
}
