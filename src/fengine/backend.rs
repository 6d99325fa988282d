//! The compute an F-engine pipeline needs, behind one trait so that the engine is written once
//! and the CUDA backend (issue 6) plugs in beside the CPU one (DESIGN "Data flow": the same
//! engine code drives both backends). The split follows seed 000: a *front end* (decode + PFB
//! FIR, one spectrum at a time at its coarse-delay offset) and a *back end* (FFT +
//! post-processing, once per output heap). Scheduling, delays, presence and heap bookkeeping
//! stay in `pipeline`.

use num_complex::Complex32;

use super::output::WidebandOutput;
use crate::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft};
use crate::dsp::postproc::{pack_4bit, postproc_heap, HeapInput, OutputBits, SpectrumDelay};
use crate::dsp::samples::unpack;

/// What the back end needs besides the spectra it holds.
pub struct BackEndInput<'a> {
    pub gains: [&'a [Complex32]; 2],
    pub delays: [&'a [SpectrumDelay]; 2],
    pub timestamps: &'a [i64],
    pub dither: Option<u64>,
}

/// One output's compute. Buffers live in the backend (host or device memory).
pub trait Backend: Send {
    /// Decode polarisation `pol` of the current chunk: `body` is this chunk's packed samples,
    /// `tail` the next chunk's head (`None` if it is missing: zeros).
    fn load(&mut self, pol: usize, body: &[u8], tail: Option<&[u8]>);
    /// Front end: the PFB of the spectrum of `pol` starting at sample `offset` of the loaded
    /// chunk, into slot `k` of the heap being assembled. Returns the digitiser power of the
    /// window's last step (int64).
    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> i64;
    /// Back end: FFT and post-process the heap's spectra (both pols); returns the wire bytes
    /// (channel, spectrum, pol, re/im) and the clip count per pol.
    fn back_end(&mut self, input: &BackEndInput<'_>) -> (&[u8], [u64; 2]);
}

/// The CPU backend: `src/dsp` run on the host.
pub struct CpuBackend {
    channels: usize,
    step: usize,
    sample_bits: u32,
    weights: Vec<f32>,
    fft: ChannelFft,
    samples: [Vec<i32>; 2],
    frames: [Vec<f32>; 2],
    spectra: [Vec<Complex32>; 2],
    heap: Vec<i8>,
    out_bits: OutputBits,
    packed: Vec<u8>,
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
        }
    }
}

impl Backend for CpuBackend {
    fn load(&mut self, pol: usize, body: &[u8], tail: Option<&[u8]>) {
        let n = body.len() * 8 / self.sample_bits as usize;
        let (head, rest) = self.samples[pol].split_at_mut(n);
        unpack(body, self.sample_bits, head);
        match tail {
            Some(t) => unpack(t, self.sample_bits, rest),
            None => rest.fill(0),
        }
    }

    fn front_end(&mut self, pol: usize, offset: usize, k: usize) -> i64 {
        let frame = &mut self.frames[pol][k * self.step..(k + 1) * self.step];
        pfb_fir(
            &self.samples[pol],
            &self.weights,
            self.step,
            &[offset],
            frame,
        )[0]
    }

    fn back_end(&mut self, input: &BackEndInput<'_>) -> (&[u8], [u64; 2]) {
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
        let data: &[u8] = match self.out_bits {
            OutputBits::Eight => bytemuck::cast_slice(&self.heap),
            OutputBits::Four => {
                pack_4bit(&self.heap, &mut self.packed);
                &self.packed
            }
        };
        (data, clips)
    }
}
