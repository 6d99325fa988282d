//! The compute an F-engine pipeline needs, behind one trait so that the engine is written once
//! and drives the CPU and CUDA backends alike (DESIGN "Data flow"). The split follows seed 000:
//! a *front end* (decode + PFB FIR, one spectrum at a time at its coarse-delay offset) and a
//! *back end* (FFT + post-processing, once per output heap). Scheduling, delays, presence and
//! heap bookkeeping stay in `pipeline`.
//!
//! The back end is asynchronous so that a GPU can overlap the copies of one heap with the
//! compute of the next (and post-process several heaps per launch): [`Backend::back_end`]
//! submits a heap once [`Backend::ready`] says there is room, [`Backend::finished`] hands
//! results back in submission order.

use std::sync::Arc;

use num_complex::Complex32;

use super::output::WidebandOutput;
use crate::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft};
use crate::dsp::postproc::{pack_4bit, postproc_heap, HeapInput, OutputBits, SpectrumDelay};
use crate::dsp::samples::unpack;
use crate::engine::send::DevicePayload;
use crate::net::DeviceMemory;

/// A backend's failure: the engine stops on it (a GPU fault is not something to run on past).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// One input chunk as the backend sees it.
#[derive(Clone, Copy)]
pub struct ChunkInput<'a> {
    pub id: u64,
    /// Packed samples, polarisation-major (`2 × pol_bytes`).
    pub data: &'a [u8],
    /// The following chunk's data, whose head becomes this chunk's tail (`None`: zeros).
    pub next: Option<&'a [u8]>,
}

/// What the back end needs besides the spectra it holds.
pub struct BackEndInput<'a> {
    pub gains: [&'a [Complex32]; 2],
    /// Changes whenever `gains` do (and only then need they be uploaded again).
    pub gains_version: u64,
    pub delays: [&'a [SpectrumDelay]; 2],
    pub timestamps: &'a [i64],
    pub dither: Option<u64>,
}

/// A finished heap's wire bytes: (channel, spectrum, pol, re/im).
#[derive(Debug)]
pub enum HeapData<'a> {
    /// In host memory.
    Host(&'a [u8]),
    /// Left in device memory to be sent from there (`--use-peerdirect`): where, and the hold
    /// on the buffer, which is written again only once every hold on it is dropped.
    Device(DevicePayload),
}

impl<'a> HeapData<'a> {
    /// The bytes, where the host can read them.
    pub fn host(&self) -> Option<&'a [u8]> {
        match self {
            HeapData::Host(b) => Some(b),
            HeapData::Device(_) => None,
        }
    }
}

/// A heap the back end finished.
pub struct Finished<'a> {
    pub data: HeapData<'a>,
    /// Clipped complex values per pol.
    pub clips: [u64; 2],
    /// Σx² of the digitiser samples the heap's spectra counted, per pol (int64).
    pub power: [i64; 2],
}

/// One output's compute. Buffers live in the backend (host or device memory).
pub trait Backend: Send {
    /// Make `chunk` the current input (both polarisations, tail included).
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError>;
    /// Nothing reads the host memory of the chunk last loaded once this returns.
    fn release(&mut self) -> Result<(), BackendError>;
    /// Front end: the PFB of the spectrum of `pol` starting at sample `offset` of the loaded
    /// chunk, into slot `k` of the heap being assembled; its digitiser power (the window's
    /// last step) goes to the heap's total.
    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError>;
    /// Forget the spectra and power of the heap being assembled (it will not be sent).
    fn discard(&mut self) -> Result<(), BackendError>;
    /// Back end: FFT and post-process the heap's spectra (both pols), now or batched with
    /// later heaps. Only called when [`Backend::ready`].
    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError>;
    /// Whether another heap may be submitted, or heaps in flight must be taken first.
    fn ready(&self) -> bool;
    /// Not [`Backend::ready`] with no heap in flight: wait for room, which only a backend whose
    /// heaps are sent from its own buffers can have to do (until the send thread gives them
    /// back), and for at most a bound: false when it ran out, and the heap being assembled is
    /// to be dropped. For any other backend that is a bug, reported as an error.
    fn wait_ready(&mut self) -> Result<bool, BackendError> {
        Err(BackendError(
            "backend not ready with no heap in flight".into(),
        ))
    }
    /// Most heaps it lends to the send thread at once, sent from its own buffers
    /// (`--use-peerdirect`); 0 where heaps come back to the host.
    fn lendable_heaps(&self) -> usize {
        0
    }
    /// The device memory its heaps are sent from, for the NIC to register
    /// (`--use-peerdirect`); none where heaps come back to the host.
    fn peer_memory(&self) -> Vec<Arc<dyn DeviceMemory>> {
        Vec::new()
    }
    /// The oldest heap in flight, once done (waiting for it if `wait`, which also launches a
    /// partly filled batch); `None` if none is.
    fn finished(&mut self, wait: bool) -> Result<Option<Finished<'_>>, BackendError>;
}

/// The CPU backend: `src/dsp` run on the host, one heap at a time.
pub struct CpuBackend {
    channels: usize,
    step: usize,
    sample_bits: u32,
    pol_bytes: usize,
    tail_bytes: usize,
    weights: Vec<f32>,
    fft: ChannelFft,
    samples: [Vec<i32>; 2],
    frames: [Vec<f32>; 2],
    spectra: [Vec<Complex32>; 2],
    heap: Vec<i8>,
    out_bits: OutputBits,
    packed: Vec<u8>,
    power: [i64; 2],
    done: Option<([u64; 2], [i64; 2])>,
}

impl CpuBackend {
    /// Buffers for `body + tail` samples per pol and `spectra_per_heap` spectra.
    pub fn new(
        output: &WidebandOutput,
        sample_bits: u32,
        body: usize,
        tail: usize,
        spectra_per_heap: usize,
        out_bits: OutputBits,
    ) -> CpuBackend {
        let (channels, step) = (output.channels, 2 * output.channels);
        let heap_values = channels * spectra_per_heap * 4;
        CpuBackend {
            channels,
            step,
            sample_bits,
            pol_bytes: body * sample_bits as usize / 8,
            tail_bytes: tail * sample_bits as usize / 8,
            weights: pfb_weights(step, output.taps, output.w_cutoff, output.window),
            fft: ChannelFft::new(step),
            samples: [vec![0; body + tail], vec![0; body + tail]],
            frames: [
                vec![0.0; spectra_per_heap * step],
                vec![0.0; spectra_per_heap * step],
            ],
            spectra: [
                vec![Complex32::default(); spectra_per_heap * channels],
                vec![Complex32::default(); spectra_per_heap * channels],
            ],
            heap: vec![0; heap_values],
            out_bits,
            packed: vec![
                0;
                if out_bits == OutputBits::Four {
                    heap_values / 2
                } else {
                    0
                }
            ],
            power: [0; 2],
            done: None,
        }
    }
}

impl Backend for CpuBackend {
    fn load(&mut self, chunk: ChunkInput<'_>) -> Result<(), BackendError> {
        let (pb, tb) = (self.pol_bytes, self.tail_bytes);
        let n = pb * 8 / self.sample_bits as usize;
        for p in 0..2 {
            let (head, rest) = self.samples[p].split_at_mut(n);
            unpack(&chunk.data[p * pb..(p + 1) * pb], self.sample_bits, head);
            match chunk.next {
                Some(next) => unpack(&next[p * pb..p * pb + tb], self.sample_bits, rest),
                None => rest.fill(0),
            }
        }
        Ok(())
    }

    fn release(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> Result<(), BackendError> {
        let frame = &mut self.frames[pol][k * self.step..(k + 1) * self.step];
        self.power[pol] += pfb_fir(
            &self.samples[pol],
            &self.weights,
            self.step,
            &[offset],
            frame,
        )[0];
        Ok(())
    }

    fn discard(&mut self) -> Result<(), BackendError> {
        self.power = [0; 2];
        Ok(())
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> Result<(), BackendError> {
        for p in 0..2 {
            self.fft.run(&self.frames[p], &mut self.spectra[p]);
        }
        let heap = HeapInput {
            spectra: [&self.spectra[0], &self.spectra[1]],
            gains: input.gains,
            delays: input.delays,
            timestamps: input.timestamps,
            dither: input.dither,
        };
        let clips = postproc_heap(&heap, self.channels, self.out_bits, &mut self.heap);
        if self.out_bits == OutputBits::Four {
            pack_4bit(&self.heap, &mut self.packed);
        }
        self.done = Some((clips, std::mem::take(&mut self.power)));
        Ok(())
    }

    fn ready(&self) -> bool {
        self.done.is_none()
    }

    fn finished(&mut self, _wait: bool) -> Result<Option<Finished<'_>>, BackendError> {
        let Some((clips, power)) = self.done.take() else {
            return Ok(None);
        };
        let data: &[u8] = match self.out_bits {
            OutputBits::Eight => bytemuck::cast_slice(&self.heap),
            OutputBits::Four => &self.packed,
        };
        Ok(Some(Finished {
            data: HeapData::Host(data),
            clips,
            power,
        }))
    }
}
