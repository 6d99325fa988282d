//! The compute an XB-engine needs, behind one trait so that the engine is written once for the
//! CPU and CUDA backends (DESIGN "Data flow"): correlation of batch ranges into a per-output
//! accumulator, the reduce at each dump (seed 001 §Accumulations), the beamformer per
//! batch (seed 003) and the FFT beamformer per chunk (seed 004). The engine keeps the
//! scheduling (dumps, presence, steering versions).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use num_complex::Complex32;

use crate::dsp::beamform::{Beam, BeamShape};
use crate::dsp::beamform_fast::Beamformer;
use crate::dsp::correlate::{unpack_4bit, CorrShape};
use crate::dsp::correlate_fast::{reduce, Correlator};
use crate::dsp::frb_fast::{encode_f16, FrbBeamformer};
use crate::dsp::frb_resample::Resample;

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

/// The beams of one chunk: every batch of the loaded chunk is formed.
pub struct BeamChunk<'a> {
    /// The steering version `beams` were made from: a backend that keeps the coefficients
    /// (the GPU) uploads them only when it changes.
    pub version: u64,
    pub beams: &'a [Beam],
    /// Per beam: the dither seed, or `None` for `dither=none`.
    pub dither: &'a [Option<u64>],
    /// Timestamp of spectrum s of batch i: `first + i·batch_step + s·spectrum_step` (keys the
    /// dither).
    pub first: i64,
    pub batch_step: i64,
    pub spectrum_step: i64,
    /// Batches × antennas, non-zero where the antenna's heap is present.
    pub present: &'a [u8],
}

/// The formed beams of one chunk.
pub struct BeamResult<'a> {
    /// int8, (batch, beam, channel, spectrum, re/im).
    pub data: &'a [u8],
    /// (batch, beam): complex values with a saturated part.
    pub clips: &'a [u64],
}

/// A re-point of an `--frb-beam` output's beam list (tracking beams, issue 17), prepared off
/// the processing thread (by the `?frb-beams` request handler, `xbengine::control_frb`).
pub struct FrbRepoint<'a> {
    /// (θ, θ′) per beam, in beam order: the CUDA backend builds its W from them on the device.
    pub positions: &'a [(f64, f64)],
    /// Their f32 W (`Resample::new`), which the CPU backend swaps in: its f64 evaluation takes
    /// ~0.5 s for thousands of beams, too long for the processing thread. `None` where the
    /// backend builds its own (CUDA).
    pub table: Option<Arc<Resample>>,
}

/// One `--frb-beam` output's work on the loaded chunk.
pub struct FrbChunk<'a> {
    /// The version of `weights` (bumped by every `?frb-weights`): a backend that keeps them
    /// uploads them only when it changes.
    pub version: u64,
    /// (channel, dish, pol): dish (= antenna) d's complex weight in channel c for
    /// polarisation π is `weights[(c·D + d)·2 + π]` ([`super::frb_weights`]).
    pub weights: &'a [Complex32],
    /// Batches × antennas, non-zero where the antenna's heap is present (absent: zero).
    pub present: &'a [u8],
}

/// FRB results a backend holds per `--frb-beam` output: the engine starts a chunk's FRB
/// stages, then collects the previous chunk's (one chunk late, as the beams), so a GPU's FRB
/// stages and their copy back overlap the next chunk instead of stopping the engine thread.
pub const FRB_SLOTS: usize = 2;

/// How many result slots a backend keeps: the engine reads a chunk's beams after it has
/// started the next two chunks', so that copies and compute overlap (seed 001
/// §Synchronization); with two slots (one chunk later) it waited behind the previous chunk's
/// correlation and left the copy engine idle at 576–1024 antennas and with short heaps.
pub const BEAM_SLOTS: usize = 3;

/// The compute of an XB-engine, in the order the engine calls it per chunk: `load`, then
/// `correlate` and `dump` as the accumulations fall, `beamform`, the previous chunk's
/// `beams` and `dumped`, and `release` before the chunk goes back to the receivers. A backend
/// may run the work asynchronously: `load`, `correlate`, `dump` and `beamform` may return
/// before it is done; `dumped`, `beams` and `release` wait for what they return.
pub trait XbBackend: Send {
    /// Start making `chunk` (batch-major, each batch (antenna, channel, spectrum, pol, re/im))
    /// current; its memory may be read until [`XbBackend::release`] returns.
    fn load(&mut self, chunk: &[u8]) -> Result<(), BackendError>;
    /// Wait until the loaded chunk's memory is no longer read.
    fn release(&mut self) -> Result<(), BackendError>;
    /// Add batches `batches` of the loaded chunk into output `output`'s accumulator.
    fn correlate(&mut self, output: usize, batches: Range<usize>) -> Result<(), BackendError>;
    /// Start reducing output `output`'s accumulator (flagging baselines of antennas not
    /// `present`) into `out` (the X heap's buffer, resized to `vis_len` × 4 bytes and kept by
    /// the backend until [`XbBackend::dumped`] gives it back) and zero the accumulator. One
    /// dump per output is outstanding at a time. A buffer inside memory given to
    /// [`XbBackend::pin`] is written by the device directly; any other through staging.
    fn dump(&mut self, output: usize, present: &[bool], out: Vec<u8>) -> Result<(), BackendError>;
    /// Output `output`'s outstanding dump, waiting for it: the buffer, filled with int32
    /// little-endian (channel, baseline, product, re/im), and the saturated value count.
    fn dumped(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError>;
    /// Start forming every beam of every batch of the loaded chunk; returns the slot (below
    /// [`BEAM_SLOTS`]) to read the result from, valid until `BEAM_SLOTS` more calls.
    fn beamform(&mut self, input: &BeamChunk<'_>) -> Result<usize, BackendError>;
    /// The beams of slot `slot`, waiting for them.
    fn beams(&mut self, slot: usize) -> Result<BeamResult<'_>, BackendError>;
    /// Start forming FRB output `output`'s intensities over the loaded chunk into `out` (the
    /// heap's buffer, resized to float16 little-endian (channel, slow time, beam) scaled by the
    /// output's scale, kept until [`XbBackend::frb_formed`] gives it back). At most
    /// [`FRB_SLOTS`] per output are outstanding; a further call is refused. Backends without an
    /// FRB beamformer refuse; the engine's configuration keeps `--frb-beam` off them.
    fn frb(
        &mut self,
        _output: usize,
        _input: &FrbChunk<'_>,
        _out: Vec<u8>,
    ) -> Result<(), BackendError> {
        Err(BackendError("this backend has no FRB beamformer".into()))
    }
    /// FRB output `output`'s oldest outstanding intensities, waiting for them: the buffer and
    /// the count of values saturated to float16.
    fn frb_formed(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError> {
        Err(BackendError(format!(
            "no FRB intensities of output {output} are outstanding"
        )))
    }
    /// Re-point FRB output `output`'s beam list as `repoint` says (as many beams; tracking
    /// beams, issue 17): every [`XbBackend::frb`] call after this one forms the new beams,
    /// every earlier one (outstanding or not) the old. A grid of beams or another count is
    /// refused, and so is a missing table where the backend needs one.
    fn frb_repoint(&mut self, output: usize, _repoint: FrbRepoint<'_>) -> Result<(), BackendError> {
        Err(BackendError(format!(
            "this backend has no FRB beamformer to re-point (output {output})"
        )))
    }
    /// Page-lock `buffer` (a receive chunk, or an X heap buffer that will be given to `dump`)
    /// so that copies from and to it run at full speed; the CPU backend has nothing to do. The
    /// backend unlocks it when dropped, so it must be dropped before the buffer is freed (or
    /// moved: the buffer's memory must stay where it is).
    fn pin(&mut self, _buffer: &mut [u8]) -> Result<(), BackendError> {
        Ok(())
    }
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
    batches: usize,
    acc: Vec<Vec<i64>>,
    vis: Vec<i32>,
    /// Per output: the outstanding dump (int32 little-endian bytes) and its saturated count.
    dumps: Vec<Option<(Vec<u8>, u64)>>,
    /// Beam result slots: data and clips.
    beam_data: [Vec<u8>; BEAM_SLOTS],
    beam_clips: [Vec<u64>; BEAM_SLOTS],
    next_slot: usize,
    frb: Vec<CpuFrb>,
}

/// One `--frb-beam` output on the CPU.
struct CpuFrb {
    former: FrbBeamformer,
    scale: f32,
    /// The f32 intensities of the last chunk.
    intensities: Vec<f32>,
    /// The outstanding results, oldest first.
    formed: VecDeque<(Vec<u8>, u64)>,
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
            batches,
            acc: vec![vec![0; corr.vis_len()]; shape.outputs],
            vis: vec![0; corr.vis_len()],
            dumps: vec![None; shape.outputs],
            beam_data: Default::default(),
            beam_clips: Default::default(),
            next_slot: 0,
            frb: Vec::new(),
        }
    }

    /// With `--frb-beam` outputs: per output its beamformer (over this backend's chunks) and
    /// float16 scale.
    pub fn with_frb(mut self, outputs: Vec<(FrbBeamformer, f32)>) -> CpuBackend {
        self.frb = outputs
            .into_iter()
            .map(|(former, scale)| CpuFrb {
                intensities: vec![0.0; former.output_len()],
                former,
                scale,
                formed: VecDeque::with_capacity(FRB_SLOTS),
            })
            .collect();
        self
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

    fn release(&mut self) -> Result<(), BackendError> {
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
        mut out: Vec<u8>,
    ) -> Result<(), BackendError> {
        let clips = reduce(self.shape.corr(), &self.acc[output], present, &mut self.vis);
        out.resize(self.vis.len() * 4, 0);
        for (o, v) in out.chunks_exact_mut(4).zip(&self.vis) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        self.dumps[output] = Some((out, clips));
        self.acc[output].fill(0);
        Ok(())
    }

    fn dumped(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError> {
        self.dumps[output]
            .take()
            .ok_or_else(|| BackendError(format!("no dump of output {output} is outstanding")))
    }

    fn beamform(&mut self, input: &BeamChunk<'_>) -> Result<usize, BackendError> {
        let shape = BeamShape {
            n_ants: self.shape.n_ants,
            channels: self.shape.channels,
            spectra: self.shape.spectra,
        };
        let n_beams = input.beams.len();
        let per_beam = shape.channels * shape.spectra * 2;
        let n = self.shape.corr().input_len();
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % BEAM_SLOTS;
        let data = &mut self.beam_data[slot];
        data.resize(self.batches * n_beams * per_beam, 0);
        let clips = &mut self.beam_clips[slot];
        clips.clear();
        clips.resize(self.batches * n_beams, 0);
        let mut timestamps = vec![0i64; shape.spectra];
        for batch in 0..self.batches {
            let present: Vec<bool> = input.present[batch * shape.n_ants..][..shape.n_ants]
                .iter()
                .map(|&p| p != 0)
                .collect();
            if !present.contains(&true) {
                // Nothing to form: the engine sends no beam heap for such a batch.
                continue;
            }
            let t0 = input.first + batch as i64 * input.batch_step;
            for (s, t) in timestamps.iter_mut().enumerate() {
                *t = t0 + s as i64 * input.spectrum_step;
            }
            let x = &self.chunk[batch * n..(batch + 1) * n];
            for (b, beam) in input.beams.iter().enumerate() {
                // One beam at a time so each keeps its own dither choice; seeding with seed + b
                // gives the bits `dsp::beamform::beam_dither` keys on beam b.
                let seed = input.dither[b].map(|s| s.wrapping_add(b as u64));
                let i = batch * n_beams + b;
                let (c, _) = self.beamformer.form(
                    x,
                    &present,
                    std::slice::from_ref(beam),
                    &timestamps,
                    seed,
                    bytemuck::cast_slice_mut(&mut data[i * per_beam..(i + 1) * per_beam]),
                );
                clips[i] = c[0];
            }
        }
        Ok(slot)
    }

    fn beams(&mut self, slot: usize) -> Result<BeamResult<'_>, BackendError> {
        Ok(BeamResult {
            data: &self.beam_data[slot],
            clips: &self.beam_clips[slot],
        })
    }

    fn frb(
        &mut self,
        output: usize,
        input: &FrbChunk<'_>,
        mut out: Vec<u8>,
    ) -> Result<(), BackendError> {
        let f = self
            .frb
            .get_mut(output)
            .ok_or_else(|| BackendError(format!("no FRB output {output}")))?;
        if f.formed.len() >= FRB_SLOTS {
            return Err(BackendError(format!(
                "{FRB_SLOTS} FRB results of output {output} are already outstanding"
            )));
        }
        let shape = f.former.shape();
        if input.weights.len() != shape.channels * shape.n_ants * 2 {
            return Err(BackendError(format!(
                "FRB weights: {} given, expected channels × dishes × 2 = {}",
                input.weights.len(),
                shape.channels * shape.n_ants * 2
            )));
        }
        f.former.form(
            &self.chunk,
            input.present,
            input.weights,
            &mut f.intensities,
        );
        out.resize(2 * f.intensities.len(), 0);
        let clips = encode_f16(&f.intensities, f.scale, &mut out);
        f.formed.push_back((out, clips));
        Ok(())
    }

    fn frb_repoint(&mut self, output: usize, repoint: FrbRepoint<'_>) -> Result<(), BackendError> {
        let f = self
            .frb
            .get_mut(output)
            .ok_or_else(|| BackendError(format!("no FRB output {output}")))?;
        let table = repoint.table.ok_or_else(|| {
            BackendError(format!(
                "FRB output {output}: the CPU backend re-points with a table built beforehand"
            ))
        })?;
        // Formed synchronously: the outstanding results already hold the old beams.
        let old = f
            .former
            .repoint(table)
            .map_err(|e| BackendError(format!("FRB output {output}: {e}")))?;
        // Freeing up to ~100 MB of old table is not the data path's work either (if no thread
        // can be started, the closure and the table are dropped here instead).
        let _ = std::thread::Builder::new()
            .name("frb-table-drop".into())
            .spawn(move || drop(old));
        Ok(())
    }

    fn frb_formed(&mut self, output: usize) -> Result<(Vec<u8>, u64), BackendError> {
        self.frb
            .get_mut(output)
            .and_then(|f| f.formed.pop_front())
            .ok_or_else(|| {
                BackendError(format!(
                    "no FRB intensities of output {output} are outstanding"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::frb::DishGrid;
    use crate::dsp::frb_fast::FrbChunkShape;
    use crate::dsp::frb_resample::FrbBeams;

    /// A CPU backend of two antennas (a 1×2 dish grid, one channel, two spectra) with one FRB
    /// output of one listed beam at zenith.
    fn one_frb_beam() -> CpuBackend {
        let grid = DishGrid::new(1, 2, &[(0, 0), (0, 1)]).unwrap();
        let shape = XbShape {
            n_ants: 2,
            channels: 1,
            spectra: 2,
            sample_bits: 8,
            outputs: 0,
            threads: 1,
        };
        let frb = FrbChunkShape {
            n_ants: 2,
            channels: 1,
            spectra: 2,
            batches: 1,
            t_ds: 2,
        };
        let zenith = FrbBeams::List(vec![(0.0, 0.0)]);
        CpuBackend::new(shape, 1).with_frb(vec![(FrbBeamformer::new(frb, &grid, &zenith, 1), 1.0)])
    }

    /// The CPU back end holds [`FRB_SLOTS`] FRB results per output, hands them back oldest
    /// first, and refuses one more: the engine's one-chunk-late collection relies on it.
    #[test]
    fn frb_results_are_held_and_returned_oldest_first() {
        let mut cpu = one_frb_beam();
        let (present, w) = ([1u8; 2], [Complex32::new(1.0, 0.0); 4]);
        // Chunk a: antenna 0's first sample (pol 0) is a, the rest 0, so J = a² at zenith.
        for a in 1..=FRB_SLOTS as u8 + 1 {
            let mut chunk = vec![0u8; 16];
            chunk[0] = a;
            cpu.load(&chunk).unwrap();
            let input = FrbChunk {
                version: 1,
                weights: &w,
                present: &present,
            };
            let r = cpu.frb(0, &input, Vec::new());
            assert_eq!(r.is_ok(), usize::from(a) <= FRB_SLOTS, "{r:?}");
        }
        for a in 1..=FRB_SLOTS {
            let (heap, _) = cpu.frb_formed(0).unwrap();
            let j = half::f16::from_le_bytes([heap[0], heap[1]]).to_f32();
            assert!((j - (a * a) as f32).abs() < 1e-3, "chunk {a}: {j}");
        }
        assert!(cpu.frb_formed(0).is_err());
    }

    /// The CPU backend re-points only with a table built beforehand, of the list's count, and
    /// forms the new beam from the next chunk: two antennas of a 1×2 grid with equal samples
    /// add to 4a² at zenith and cancel at θ′ = 1 (half of N = 2: phases 1 and e^{iπ}).
    #[test]
    fn the_cpu_backend_swaps_in_a_table_built_beforehand() {
        let mut cpu = one_frb_beam();
        let (present, w) = ([1u8; 2], [Complex32::new(1.0, 0.0); 4]);
        // (antenna, channel, spectrum, pol, re/im): spectrum 0, pol 0 of both antennas is 3.
        let mut chunk = vec![0u8; 16];
        chunk[0] = 3;
        chunk[8] = 3;
        let input = FrbChunk {
            version: 1,
            weights: &w,
            present: &present,
        };
        let form = |cpu: &mut CpuBackend| {
            cpu.load(&chunk).unwrap();
            cpu.frb(0, &input, Vec::new()).unwrap();
            let (heap, _) = cpu.frb_formed(0).unwrap();
            half::f16::from_le_bytes([heap[0], heap[1]]).to_f32()
        };
        assert!((form(&mut cpu) - 36.0).abs() < 1e-3);
        let moved = [(0.0, 1.0)];
        let table =
            |p: &[(f64, f64)]| Some(Arc::new(Resample::new(1, 2, &FrbBeams::List(p.to_vec()))));
        let repoint = |table| FrbRepoint {
            positions: &moved,
            table,
        };
        assert!(cpu.frb_repoint(0, repoint(None)).is_err());
        assert!(cpu
            .frb_repoint(0, repoint(table(&[(0.0, 1.0), (1.0, 0.0)])))
            .is_err());
        assert!(
            (form(&mut cpu) - 36.0).abs() < 1e-3,
            "refusals change nothing"
        );
        cpu.frb_repoint(0, repoint(table(&moved))).unwrap();
        assert!(form(&mut cpu).abs() < 1e-3, "the new beam cancels");
    }
}
