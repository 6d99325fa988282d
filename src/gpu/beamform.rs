//! The coherent beamformer on the GPU (issue 13; seed 003): the CUDA body of `dsp::beamform`.
//!
//! **Input** ([`Beamformer::form`]): `batches` consecutive batches, each in `dsp::beamform`'s
//! layout **(antenna, channel, spectrum, pol, re/im)**, int8 (`in_bits` 8) or one byte per
//! complex value with the real part in the high nibble (`in_bits` 4). **Output**: int8
//! **(batch, beam, channel, spectrum, re/im)**, overwritten, and per (batch, beam) the count of
//! complex values with a saturated part (u64, overwritten). Antennas whose presence flag is 0
//! are excluded. Spectrum t of batch i has timestamp `first + i·batch_step + t·spectrum_step`,
//! which keys the dither: beam b with `Some(seed)` gets `dsp::beamform::beam_dither(seed, b, …)`
//! bit for bit, `None` none.
//!
//! The kernel (`kernels/beamform.cu`) generates W = w·e^{jπcd} per (antenna batch, beam batch)
//! in shared memory and sums in float, as seed 003 designs it; the oracle sums in double, so a
//! value may differ by ±1 LSB where its sum lies within float rounding of a quantisation
//! boundary (the self-test bounds how many and their bias). Coefficients are uploaded only when
//! the steering version changes; the per-call presence flags and dither seeds go through
//! double-buffered pinned host memory mapped into the device (no copy queued behind the sample
//! transfers, nothing allocated per call).

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::compile::{Defines, Kernel};
use super::memory::mapped;
use super::{Gpu, GpuError};
use crate::dsp::beamform::Beam;

/// What one beamformer is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeamformConfig {
    pub n_ants: usize,
    pub channels: usize,
    pub spectra: usize,
    /// Batches per call (consecutive in time).
    pub batches: usize,
    pub beams: usize,
    /// 8 (int8 re, im) or 4 (one byte per complex value).
    pub in_bits: u32,
}

impl BeamformConfig {
    /// Input bytes of one call.
    pub fn input_bytes(&self) -> usize {
        self.batches * self.n_ants * self.channels * self.spectra * 4 * self.in_bits as usize / 8
    }

    /// int8 values of one call's output.
    pub fn output_len(&self) -> usize {
        self.batches * self.beams * self.channels * self.spectra * 2
    }

    fn validate(&self) -> Result<(), GpuError> {
        let bad = |what: &str, range: &str| {
            Err(GpuError::Backend(format!(
                "beamformer shape: {what} out of range ({range})"
            )))
        };
        if !(1..=4096).contains(&self.n_ants) {
            return bad("n_ants", "1 to 4096");
        }
        if !(1..=65535).contains(&self.channels) || !(1..=65535).contains(&self.batches) {
            return bad("channels or batches", "1 to 65535");
        }
        if !(1..=1 << 24).contains(&self.spectra) {
            return bad("spectra", "1 to 2^24");
        }
        if !(1..=1024).contains(&self.beams) {
            return bad("beams", "1 to 1024");
        }
        if self.in_bits != 8 && self.in_bits != 4 {
            return bad("in_bits", "8 or 4");
        }
        Ok(())
    }

    /// Spectra per block: a warp's multiple, at most 256.
    fn threads(&self) -> usize {
        self.spectra.next_multiple_of(32).min(256)
    }
}

/// Per-call parameters in mapped host memory, one set per call in flight.
struct CallParams {
    present: (PinnedHostSlice<u8>, u64),
    seeds: (PinnedHostSlice<u64>, u64),
    dithered: (PinnedHostSlice<i32>, u64),
    /// Recorded on the compute stream after the call that read these.
    done: cudarc::driver::CudaEvent,
}

pub struct Beamformer {
    gpu: Arc<Gpu>,
    cfg: BeamformConfig,
    kernel: CudaFunction,
    weights: CudaSlice<f64>,
    delays: CudaSlice<f64>,
    pols: CudaSlice<i32>,
    version: Option<u64>,
    params: [CallParams; 2],
    next: usize,
}

impl Beamformer {
    pub fn new(gpu: Arc<Gpu>, cfg: BeamformConfig) -> Result<Beamformer, GpuError> {
        cfg.validate()?;
        let defs: Defines = vec![
            ("N_ANTS", cfg.n_ants as i64),
            ("CHANNELS", cfg.channels as i64),
            ("SPECTRA", cfg.spectra as i64),
            ("N_BEAMS", cfg.beams as i64),
            ("IN_BITS", i64::from(cfg.in_bits)),
            ("THREADS", cfg.threads() as i64),
        ];
        let kernel = gpu.function(Kernel::Beamform, &defs)?;
        let st = &gpu.compute;
        let params = |gpu: &Gpu| -> Result<CallParams, GpuError> {
            Ok(CallParams {
                present: mapped(gpu, cfg.batches * cfg.n_ants)?,
                seeds: mapped(gpu, cfg.beams)?,
                dithered: mapped(gpu, cfg.beams)?,
                done: gpu.ctx.new_event(None)?,
            })
        };
        Ok(Beamformer {
            kernel,
            weights: st.alloc_zeros(cfg.beams * cfg.n_ants * 2)?,
            delays: st.alloc_zeros(cfg.beams * cfg.n_ants)?,
            pols: st.alloc_zeros(cfg.beams)?,
            version: None,
            params: [params(&gpu)?, params(&gpu)?],
            next: 0,
            gpu,
            cfg,
        })
    }

    pub fn config(&self) -> BeamformConfig {
        self.cfg
    }

    /// Upload the beams' coefficients (on the compute stream, ordered before later forms) when
    /// `version` differs from the last upload's.
    pub fn set_beams(&mut self, version: u64, beams: &[Beam]) -> Result<(), GpuError> {
        if self.version == Some(version) {
            return Ok(());
        }
        let (n, a) = (self.cfg.beams, self.cfg.n_ants);
        if beams.len() != n
            || beams
                .iter()
                .any(|b| b.weights.len() != a || b.delays.len() != a || b.pol > 1)
        {
            return Err(GpuError::Backend(format!(
                "beamformer: {} beams given, built for {n} beams of {a} antennas, pol 0 or 1",
                beams.len()
            )));
        }
        let weights: Vec<f64> = beams
            .iter()
            .flat_map(|b| b.weights.iter().flat_map(|w| [w.re, w.im]))
            .collect();
        let delays: Vec<f64> = beams
            .iter()
            .flat_map(|b| b.delays.iter().copied())
            .collect();
        let pols: Vec<i32> = beams.iter().map(|b| b.pol as i32).collect();
        let st = &self.gpu.compute;
        st.memcpy_htod(&weights, &mut self.weights)?;
        st.memcpy_htod(&delays, &mut self.delays)?;
        st.memcpy_htod(&pols, &mut self.pols)?;
        self.version = Some(version);
        Ok(())
    }

    /// Form every beam of every batch of `input` (see the module doc) on the compute stream.
    #[allow(clippy::too_many_arguments)]
    pub fn form(
        &mut self,
        input: &CudaView<u8>,
        present: &[u8],
        first: i64,
        batch_step: i64,
        spectrum_step: i64,
        dither: &[Option<u64>],
        out: &mut CudaSlice<i8>,
        clips: &mut CudaSlice<u64>,
    ) -> Result<(), GpuError> {
        let cfg = self.cfg;
        let check = |what: &str, len: usize, want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(GpuError::Backend(format!(
                    "beamformer {what}: {len} elements, expected {want}"
                )))
            }
        };
        check("input", input.len(), cfg.input_bytes())?;
        check("present", present.len(), cfg.batches * cfg.n_ants)?;
        check("dither", dither.len(), cfg.beams)?;
        check("out", out.len(), cfg.output_len())?;
        check("clips", clips.len(), cfg.batches * cfg.beams)?;
        if self.version.is_none() {
            return Err(GpuError::Backend(
                "beamformer: form before set_beams".into(),
            ));
        }
        let k = self.next;
        self.next = (k + 1) % self.params.len();
        let p = &mut self.params[k];
        // The call two back read these host buffers: wait for it before rewriting them.
        p.done.synchronize()?;
        p.present.0.as_mut_slice()?.copy_from_slice(present);
        for (b, d) in dither.iter().enumerate() {
            // Beam b's bits are keyed on seed + b (`dsp::beamform::beam_dither`).
            p.seeds.0.as_mut_slice()?[b] = d.map_or(0, |s| s.wrapping_add(b as u64));
            p.dithered.0.as_mut_slice()?[b] = i32::from(d.is_some());
        }
        let st = &self.gpu.compute;
        st.memset_zeros(clips)?;
        let threads = cfg.threads();
        let launch = LaunchConfig {
            grid_dim: (
                cfg.spectra.div_ceil(threads) as u32,
                cfg.channels as u32,
                cfg.batches as u32,
            ),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = st.launch_builder(&self.kernel);
        b.arg(input)
            .arg(&self.weights)
            .arg(&self.delays)
            .arg(&self.pols)
            .arg(&p.present.1)
            .arg(&p.seeds.1)
            .arg(&p.dithered.1)
            .arg(out)
            .arg(clips)
            .arg(&first)
            .arg(&batch_step)
            .arg(&spectrum_step);
        // SAFETY: every buffer's length was checked against the kernel's constants above; the
        // mapped parameter buffers stay untouched until `done` says this call has finished;
        // each thread writes only its own (batch, beam, channel, spectrum) outputs and adds to
        // the clip counts atomically.
        unsafe { b.launch(launch) }?;
        p.done.record(st)?;
        Ok(())
    }
}
