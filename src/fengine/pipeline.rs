//! One output's processing, on any [`Backend`], in seed 000's structure: a front end
//! (decode + PFB FIR, one spectrum at a time at the input offset its coarse delay gives) and a
//! back end (FFT + post-processing) that runs once a whole output heap of spectra is ready, so
//! the two run at their own cadences. Heaps come back from the backend in order, up to its
//! depth later (a GPU overlaps their copies with the next heaps' compute); [`Pipeline::flush`]
//! collects the last ones.
//!
//! Spectra sit on the output grid T = k·step, step = 2N samples for wideband and 2N·decimation
//! for narrowband (seed 000 §Narrowband). Spectrum T of polarisation p reads input samples
//! [T − c_p(T), T − c_p(T) + window) (fengine_delay_convention.md §2; the window is taps·2N
//! wideband, and adds the DDC filter's footprint narrowband). A narrowband coarse delay is a
//! multiple of the subsampling factor (convention §3, `LinearDelayModel::at_aligned`), as its
//! PFB reads only every S-th digitiser sample. A spectrum is handled by
//! the chunk in which its earlier-starting polarisation's window starts; the chunk's samples
//! are extended by the head of the next chunk (the tail: PFB footprint plus the largest
//! differential coarse delay). A spectrum whose window would start before the current chunk
//! (a jump in delay, or a lost chunk) skips the output ahead to the next heap boundary. A heap
//! with any spectrum touched by missing input is emitted as invalid, so the engine does not
//! send it and counts it (facts §1.10).
#![deny(unsafe_code)]

use std::collections::VecDeque;

use num_complex::Complex32;

use super::backend::{BackEndInput, Backend, BackendError, ChunkInput, CpuBackend, HeapData};
use super::output::{OutputShape, OutputSpec, WidebandOutput};
use super::place::InputLayout;
use crate::dsp::delay::DelayModels;
use crate::dsp::postproc::{OutputBits, SpectrumDelay};
use crate::dsp::presence::MissingPrefix;
use crate::net::DeviceMemory;
use crate::spead::recv::Chunk;

/// One received chunk as the pipeline reads it (the engine's [`Chunk`], or any other memory:
/// the GPU benchmark's pinned buffers).
#[derive(Clone, Copy)]
pub struct ChunkView<'a> {
    pub chunk_id: u64,
    /// Packed samples, polarisation-major.
    pub data: &'a [u8],
    /// Per heap (polarisation-major), non-zero where it arrived.
    pub present: &'a [u8],
}

impl<'a> From<&'a Chunk> for ChunkView<'a> {
    fn from(c: &'a Chunk) -> ChunkView<'a> {
        ChunkView {
            chunk_id: c.chunk_id,
            data: &c.data,
            present: &c.present,
        }
    }
}

/// A finished output heap (both polarisations, all channels).
pub struct OutputHeap<'a> {
    pub timestamp: u64,
    /// The wire bytes: channels × spectra_per_heap × 2 pols × (re, im), as int8 values or
    /// packed 4-bit pairs (real in the high nibble), channel-major; on the host, or in device
    /// memory to be sent from there (`--use-peerdirect`).
    pub data: HeapData<'a>,
    pub clips: [u64; 2],
    /// Every spectrum had all its input.
    pub valid: bool,
}

pub struct Pipeline {
    pub output: OutputSpec,
    layout: InputLayout,
    /// Digitiser samples between spectra, read by each spectrum, and per PFB input sample.
    step: usize,
    window: usize,
    align: usize,
    spectra_per_heap: usize,
    tail: usize,
    backend: Box<dyn Backend>,
    gains: [Vec<Complex32>; 2],
    /// Bumped by every [`Pipeline::set_gains`].
    gains_version: u64,
    pub delays: [DelayModels; 2],
    dither_seed: Option<u64>,
    /// Next output spectrum timestamp.
    next_t: u64,
    started: bool,
    // Per-heap bookkeeping (front end → back end).
    heap_delays: [Vec<SpectrumDelay>; 2],
    heap_ts: Vec<i64>,
    heap_valid: bool,
    present: [Vec<bool>; 2],
    /// Missing-heap prefix sums over `present`, per pol (seed 000 §Missing data).
    missing: [MissingPrefix; 2],
    /// Σx² and sample count per pol since the caller last took them ([`Pipeline::take_dig_power`]).
    dig_power: [i64; 2],
    dig_samples: [u64; 2],
    /// Heaps submitted to the backend and not yet emitted: (timestamp, valid).
    in_flight: VecDeque<(u64, bool)>,
    /// Heaps dropped because the send path held every output buffer past the backend's bound
    /// ([`Backend::wait_ready`]).
    stalled: u64,
}

/// Samples of tail needed: footprint plus differential delay (which aligning coarse delays
/// to the subsampling can widen by S − 1), rounded up to whole heaps.
pub fn tail_samples(shape: OutputShape, max_delay_diff: usize, heap_samples: usize) -> usize {
    // Saturating: an absurd --max-delay-diff must be refused by name, not overflow.
    shape
        .window
        .saturating_add(max_delay_diff)
        .saturating_add(shape.subsampling - 1)
        .div_ceil(heap_samples)
        .saturating_mul(heap_samples)
}

/// How a pipeline is set up (everything but the output itself).
#[derive(Debug, Clone, Copy)]
pub struct PipelineConfig {
    pub layout: InputLayout,
    /// Bits per digitiser sample.
    pub sample_bits: u32,
    pub spectra_per_heap: usize,
    pub max_delay_diff: usize,
    pub gain: Complex32,
    pub dither_seed: u64,
    pub out_bits: OutputBits,
}

impl PipelineConfig {
    /// Samples of tail each chunk is extended by for an output of `shape`.
    pub fn tail(&self, shape: OutputShape) -> usize {
        tail_samples(
            shape,
            self.max_delay_diff,
            self.layout.heap_samples as usize,
        )
    }
}

impl Pipeline {
    /// A wideband pipeline on the CPU backend.
    pub fn new(output: WidebandOutput, cfg: PipelineConfig) -> Pipeline {
        let backend = Box::new(CpuBackend::new(
            &output,
            cfg.sample_bits,
            cfg.layout.chunk_samples as usize,
            cfg.tail(output.shape()),
            cfg.spectra_per_heap,
            cfg.out_bits,
        ));
        Pipeline::with_backend(output.into(), cfg, backend)
    }

    /// A pipeline on `backend`, which was made for `output` and `cfg` (buffers of
    /// `cfg.layout.chunk_samples + cfg.tail(output.shape())` samples per pol).
    pub fn with_backend(
        output: OutputSpec,
        cfg: PipelineConfig,
        backend: Box<dyn Backend>,
    ) -> Pipeline {
        let shape = output.shape();
        let tail = cfg.tail(shape);
        let PipelineConfig {
            layout,
            spectra_per_heap,
            gain,
            dither_seed,
            ..
        } = cfg;
        let channels = shape.channels;
        Pipeline {
            backend,
            gains: [vec![gain; channels], vec![gain; channels]],
            gains_version: 0,
            delays: [DelayModels::default(), DelayModels::default()],
            dither_seed: output.dither().then_some(dither_seed),
            layout,
            step: shape.spectra_samples,
            window: shape.window,
            align: shape.subsampling,
            spectra_per_heap,
            tail,
            next_t: 0,
            started: false,
            heap_delays: [
                Vec::with_capacity(spectra_per_heap),
                Vec::with_capacity(spectra_per_heap),
            ],
            heap_ts: Vec::with_capacity(spectra_per_heap),
            heap_valid: true,
            present: [Vec::new(), Vec::new()],
            missing: [MissingPrefix::default(), MissingPrefix::default()],
            dig_power: [0; 2],
            dig_samples: [0; 2],
            in_flight: VecDeque::new(),
            stalled: 0,
            output,
        }
    }

    /// Mean input power per polarisation since the last call (None where no samples).
    pub fn take_dig_power(&mut self) -> [Option<f64>; 2] {
        let out = [0, 1].map(|p| {
            (self.dig_samples[p] > 0).then(|| self.dig_power[p] as f64 / self.dig_samples[p] as f64)
        });
        self.dig_power = [0; 2];
        self.dig_samples = [0; 2];
        out
    }

    /// Timestamp of the next output spectrum to be produced.
    pub fn next_timestamp(&self) -> u64 {
        self.next_t
    }

    /// The device memory this output's heaps are sent from, for the NIC to register
    /// (`--use-peerdirect`); none where they come back to the host.
    pub fn peer_memory(&self) -> Vec<std::sync::Arc<dyn DeviceMemory>> {
        self.backend.peer_memory()
    }

    /// Most heaps lent to the send thread at once (`--use-peerdirect`; 0 otherwise).
    pub fn lendable_heaps(&self) -> usize {
        self.backend.lendable_heaps()
    }

    /// Heaps dropped so far because the send path held every output buffer past the
    /// backend's bound (counted apart from heaps skipped for missing input).
    pub fn stalled_heaps(&self) -> u64 {
        self.stalled
    }

    /// Samples a heap covers.
    pub fn heap_span(&self) -> u64 {
        (self.spectra_per_heap * self.step) as u64
    }

    /// Start assembling a new heap.
    fn clear_heap(&mut self) {
        for p in 0..2 {
            self.heap_delays[p].clear();
        }
        self.heap_ts.clear();
        self.heap_valid = true;
    }

    /// Per-channel complex gains of both polarisations, from the next heap on.
    pub fn set_gains(&mut self, gains: [Vec<Complex32>; 2]) {
        self.gains = gains;
        self.gains_version += 1;
    }

    /// Emit the oldest heap in flight (waiting for it if `wait`); false if there was none ready.
    fn emit_one(
        &mut self,
        wait: bool,
        emit: &mut impl FnMut(&OutputHeap<'_>),
    ) -> Result<bool, BackendError> {
        if self.in_flight.is_empty() {
            return Ok(false);
        }
        let span = self.heap_span();
        let Some(done) = self.backend.finished(wait)? else {
            return Ok(false);
        };
        let Some((timestamp, valid)) = self.in_flight.pop_front() else {
            return Ok(false);
        };
        for p in 0..2 {
            self.dig_power[p] += done.power[p];
            self.dig_samples[p] += span;
        }
        emit(&OutputHeap {
            timestamp,
            data: done.data,
            clips: done.clips,
            valid,
        });
        Ok(true)
    }

    /// Wait for every heap still in the backend and emit it.
    pub fn flush(&mut self, mut emit: impl FnMut(&OutputHeap<'_>)) -> Result<(), BackendError> {
        while self.emit_one(true, &mut emit)? {}
        Ok(())
    }

    /// The first heap boundary after the heap of `next_t` whose first spectrum's input starts
    /// at or after sample `start` in both polarisations; every heap before it has input
    /// before `start`, so is lost. Under one delay model t − c(t) never decreases
    /// (|delay rate| < 1, `dsp::delay`), so a bisection over the heap boundaries of each
    /// model's interval finds it exactly, in a number of steps logarithmic in the gap (a
    /// chunk after a window jump, or a large delay change, used to cost one iteration per
    /// heap).
    fn first_heap_from(&self, start: i64) -> u64 {
        let span = self.heap_span() as i64;
        let mut lo = (self.next_t as i64 / span)
            .saturating_add(1)
            .saturating_mul(span);
        loop {
            let m = [self.delays[0].peek_at(lo), self.delays[1].peek_at(lo)];
            let start_of = |p: usize, t: i64| t.saturating_sub(m[p].at_aligned(t, self.align).0);
            let input = |t: i64| start_of(0, t).min(start_of(1, t));
            let have = input(lo);
            if have >= start {
                return lo as u64;
            }
            // With slope ≥ 1 − 10⁻³ and ±1 of rounding (±S aligned), the input reaches `start`
            // within 2·(start − have) + 2S + 2 samples; the end of the models' interval may come
            // first.
            let reach = start
                .saturating_sub(have)
                .saturating_mul(2)
                .saturating_add(2 * self.align as i64 + 2);
            let mut hi = lo.saturating_add((reach / span).saturating_add(1).saturating_mul(span));
            let change = [0, 1]
                .iter()
                .filter_map(|&p| self.delays[p].next_start_after(lo))
                .min()
                .map(|c| c.saturating_add(span - 1) / span * span);
            if let Some(c) = change.filter(|&c| c <= hi) {
                if input(c - span) < start {
                    lo = c; // none in this interval: on with the next model
                    continue;
                }
                hi = c - span;
            } else if input(hi) < start {
                // Only if a model broke the rate bound: fall back to one heap.
                return (lo + span) as u64;
            }
            // input(lo) < start <= input(hi): bisect on the heap boundaries.
            while hi - lo > span {
                let mid = lo + (hi - lo) / span / 2 * span;
                if input(mid) >= start {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            return hi as u64;
        }
    }

    /// Process chunk `chunk` (with `next`, the following chunk, for the tail, if it arrived);
    /// `emit` receives every output heap completed. Returns the number of heaps skipped because
    /// their input was not there (a gap in the chunks, or a delay jump), whole or partial.
    pub fn process(
        &mut self,
        chunk: ChunkView<'_>,
        next: Option<ChunkView<'_>>,
        mut emit: impl FnMut(&OutputHeap<'_>),
    ) -> Result<u64, BackendError> {
        let l = self.layout;
        let start = chunk.chunk_id * l.chunk_samples;
        let end = start + l.chunk_samples;
        let per_pol = l.heaps_per_pol();
        let tail_heaps = self.tail / l.heap_samples as usize;
        let next = next.filter(|n| n.chunk_id == chunk.chunk_id + 1);
        self.backend.load(ChunkInput {
            id: chunk.chunk_id,
            data: chunk.data,
            next: next.map(|n| n.data),
        })?;
        for p in 0..2 {
            self.present[p].clear();
            self.present[p].extend(
                chunk.present[p * per_pol..(p + 1) * per_pol]
                    .iter()
                    .map(|&v| v != 0),
            );
            match next {
                Some(n) => self.present[p].extend(
                    n.present[p * per_pol..p * per_pol + tail_heaps]
                        .iter()
                        .map(|&v| v != 0),
                ),
                None => self.present[p].extend(std::iter::repeat_n(false, tail_heaps)),
            }
        }
        for p in 0..2 {
            self.missing[p].reset(self.present[p].iter().copied(), l.heap_samples as usize);
        }
        if !self.started {
            // Start at the first heap boundary of the output grid in this chunk.
            self.next_t = start.div_ceil(self.heap_span()) * self.heap_span();
            self.started = true;
        }
        let window = self.window;
        let mut skipped = 0;
        loop {
            let t = self.next_t as i64;
            let d = [
                self.delays[0].model_at(t).at_aligned(t, self.align),
                self.delays[1].model_at(t).at_aligned(t, self.align),
            ];
            let s = [t - d[0].0, t - d[1].0];
            let first = s[0].min(s[1]);
            if first >= end as i64 {
                break; // belongs to the next chunk
            }
            let latest_end = s[0].max(s[1]) + window as i64;
            if first < start as i64 || latest_end > (end as usize + self.tail) as i64 {
                // Input no longer (or never) available: the heap containing next_t is lost
                // (counted, partial or not), and the output skips to the next heap boundary;
                // when the input is before this chunk, straight past every heap that is
                // (one step for a gap of any length).
                if !self.heap_ts.is_empty() {
                    self.backend.discard()?;
                }
                self.clear_heap();
                let span = self.heap_span();
                let next = (self.next_t / span + 1) * span;
                let to = if first < start as i64 {
                    self.first_heap_from(start as i64).max(next)
                } else {
                    next
                };
                skipped += 1 + (to - next) / span;
                self.next_t = to;
                continue;
            }
            let k = self.heap_ts.len();
            for p in 0..2 {
                let off = (s[p] - start as i64) as usize;
                // Digitiser power over the last step of each window: with consecutive spectra,
                // every sample once (seed 000 §Digitiser sample statistics).
                self.backend.front_end(p, off, k)?;
                self.heap_valid &= self.missing[p].window_ok(off, window);
                self.heap_delays[p].push(SpectrumDelay {
                    coarse: d[p].0,
                    fine: d[p].1,
                    phase: d[p].2,
                });
            }
            self.heap_ts.push(t);
            self.next_t += self.step as u64;
            if self.heap_ts.len() == self.spectra_per_heap {
                let mut room = true;
                while room && !self.backend.ready() {
                    if !self.emit_one(true, &mut emit)? {
                        // Every heap taken: its buffers are still with the send thread.
                        room = self.backend.wait_ready()?;
                    }
                }
                if !room {
                    // Still with it past the bound: this heap is dropped, not waited for.
                    self.backend.discard()?;
                    self.clear_heap();
                    self.stalled += 1;
                    continue;
                }
                let input = BackEndInput {
                    gains: [&self.gains[0], &self.gains[1]],
                    gains_version: self.gains_version,
                    delays: [&self.heap_delays[0], &self.heap_delays[1]],
                    timestamps: &self.heap_ts,
                    dither: self.dither_seed,
                };
                self.backend.back_end(&input)?;
                self.in_flight
                    .push_back((self.heap_ts[0] as u64, self.heap_valid));
                self.clear_heap();
                while self.emit_one(false, &mut emit)? {}
            }
        }
        self.backend.release()?;
        Ok(skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::delay::LinearDelayModel;

    /// A small wideband pipeline on the CPU backend (the stall tests' shape).
    fn pipeline() -> Pipeline {
        Pipeline::new(super::stall_tests::output(), super::stall_tests::config())
    }

    fn model(t0: i64, delay: f64, delay_rate: f64) -> LinearDelayModel {
        LinearDelayModel {
            t0,
            delay,
            delay_rate,
            ..LinearDelayModel::ZERO
        }
    }

    /// The one-step skip lands on the same heap as walking the boundaries one at a time and
    /// evaluating each polarisation's model there (the old loop), across model changes and
    /// both signs of delay rate.
    #[test]
    fn the_skip_matches_walking_heap_by_heap() {
        let mut p = pipeline();
        let span = p.heap_span() as i64; // 512 samples
        p.delays[0].add(model(0, 3000.0, 9e-4));
        p.delays[0].add(model(90_000, 80_000.0, -9e-4));
        p.delays[1].add(model(0, 100.0, 0.0));
        p.delays[1].add(model(200_003, 150_000.5, 5e-4));
        for next_t in [0_i64, 511, 512, 40_000, 89_600, 150_000, 199_999] {
            for start in [0_i64, 1, 5_000, 60_000, 100_000, 120_000, 260_000, 1 << 22] {
                p.next_t = next_t as u64;
                let got = p.first_heap_from(start) as i64;
                let mut walk = (next_t / span + 1) * span;
                let input = |t: i64| {
                    let m = [p.delays[0].peek_at(t), p.delays[1].peek_at(t)];
                    (t - m[0].at(t).0).min(t - m[1].at(t).0)
                };
                while input(walk) < start {
                    walk += span;
                }
                assert_eq!(got, walk, "next_t {next_t}, start {start}");
            }
        }
    }

    /// A gap of 2^40 samples, crossed by bisection (the old loop took 2^31 iterations).
    #[test]
    fn a_huge_gap_lands_on_the_right_heap() {
        let mut p = pipeline();
        let start = 1_i64 << 40;
        p.delays[0].add(model(0, 1.5e9, 0.0));
        let got = p.first_heap_from(start) as i64;
        assert_eq!(got, ((start + 1_500_000_000) / 512 + 1) * 512);
    }
}

#[cfg(test)]
#[path = "pipeline_stall_tests.rs"]
mod stall_tests;
