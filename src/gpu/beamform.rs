//! The coherent beamformer on the GPU (issue 13; seed 003): the CUDA body of `dsp::beamform`.
//!
//! **Input** ([`Beamformer::form`]): `batches` consecutive batches, each in `dsp::beamform`'s
//! layout **(antenna, channel, spectrum, pol, re/im)**, int8 (`in_bits` 8) or one byte per
//! complex value with the real part in the high nibble (`in_bits` 4), starting 16-byte aligned.
//! **Output**: int8 **(batch, beam, channel, spectrum, re/im)**, overwritten, and per (batch,
//! beam) the count of complex values with a saturated part (u64, overwritten). Antennas whose
//! presence flag is 0 are excluded. Spectrum t of batch i has timestamp
//! `first + i·batch_step + t·spectrum_step`, which keys the dither: beam b with `Some(seed)` gets
//! `dsp::beamform::beam_dither(seed, b, …)` bit for bit, `None` none.
//!
//! The kernel (`kernels/beamform.cu`, whose header gives the mapping) is a per-channel integer
//! GEMM on int8 tensor cores: the input words, as they lie in memory, are the A fragments, and
//! each weight W = w·e^{jπcd}, scaled per beam by a power of two ([`beam_scale`]) and rounded
//! to 22 bits or more, is written as three int8 digits, one exact MMA each. The digits are made
//! on the GPU once per steering version (`beam_coeffs`, at [`Beamformer::set_beams`]) into a
//! table in the B-fragment order, which each block copies into shared memory; seed 003 makes
//! W per block, which cost the earlier fp16 kernel a fifth of its instructions. The oracle sums
//! in double, so a value may differ by ±1 LSB where its sum lies within the weights' rounding of
//! a quantisation boundary (the self-test bounds how many and their bias). The batches of a call
//! are laid end to end so that short heaps still fill its blocks. The per-call presence flags
//! and dither seeds are written into pinned host memory and copied on the compute stream into
//! device buffers, two sets used in turn, so nothing is allocated per call and the host never
//! waits for the device's idle stream (as a copy from pageable memory would). Mapped host
//! memory, which the F-engine uses for its per-heap terms, was measured here to cut the kernel
//! to a fifth of its bandwidth: every block reads the flags, and each read crosses PCIe.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::compile::{Defines, Kernel};
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

    /// Bytes of the digit table (`beam_coeffs`): per channel, tile of 4 beams and k-step of 8
    /// antennas, 3 digits × 32 lanes × 8 bytes.
    pub fn table_bytes(&self) -> usize {
        self.channels * self.beams.div_ceil(4) * self.n_ants.div_ceil(8) * 768
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
        if !(1..=1 << 24).contains(&self.spectra) || self.batches * self.spectra > i32::MAX as usize
        {
            return bad("spectra", "1 to 2^24, and batches × spectra below 2^31");
        }
        if !(1..=1024).contains(&self.beams) {
            return bad("beams", "1 to 1024");
        }
        if self.in_bits != 8 && self.in_bits != 4 {
            return bad("in_bits", "8 or 4");
        }
        if self.table_bytes() > MAX_TABLE_BYTES {
            return bad(
                "channels × antennas × beams",
                "a digit table of at most 1 GiB: 768 bytes per channel, 4 beams and 8 antennas",
            );
        }
        Ok(())
    }

    /// (batch, spectrum) slots per block, 32 per warp: a warp's multiple, at most 128. Blocks of
    /// 4 warps, 5 per SM, measured 2–4 points of copy faster than blocks of 8 warps, 3 per SM,
    /// at MeerKAT's shape, xbgpu's 32-spectrum heaps and 256 antennas alike (lent H100,
    /// bench/xbengine-notes.md v14: the finer blocks keep more warps loading while others run
    /// their epilogue).
    fn threads(&self) -> usize {
        (self.batches * self.spectra).next_multiple_of(32).min(128)
    }

    /// Tiles of 4 beams per beam batch: 24 int32 accumulators each per lane (3 digits × 2 m16
    /// tiles × 4); two fit the registers of five blocks of 4 warps per SM where a lane's slots
    /// are consecutive, and of three at every shape (three tiles spilled at two blocks of 8
    /// warps per SM).
    fn tiles(&self) -> usize {
        self.beams.div_ceil(4).min(2)
    }

    /// k-steps of 8 antennas per antenna batch: 40 / tiles, so at most 30 KiB of digits, and
    /// at most 32 (the kernel keeps a lane's presence bits of a batch in a u64).
    fn ksteps(&self) -> usize {
        self.n_ants.div_ceil(8).min(40 / self.tiles()).min(32)
    }

    /// Dynamic shared memory of one block under `occupancy`: where a lane's four slots are
    /// consecutive (spectra a multiple of 4), each warp's ring of `depth` k-steps of two
    /// antennas' words.
    fn ring_bytes(&self, occupancy: Occupancy) -> usize {
        if self.spectra % 4 == 0 {
            self.threads() / 32 * occupancy.depth * 2 * 32 * 4 * self.in_bits as usize / 2
        } else {
            0
        }
    }

    /// The kernel's compile-time constants under `occupancy`.
    pub fn defines(&self, occupancy: Occupancy) -> Defines {
        vec![
            ("N_ANTS", self.n_ants as i64),
            ("CHANNELS", self.channels as i64),
            ("SPECTRA", self.spectra as i64),
            ("BATCHES", self.batches as i64),
            ("N_BEAMS", self.beams as i64),
            ("IN_BITS", i64::from(self.in_bits)),
            ("THREADS", self.threads() as i64),
            ("BT", self.tiles() as i64),
            ("KS", self.ksteps() as i64),
            ("DEPTH", occupancy.depth as i64),
            ("MIN_BLOCKS", occupancy.blocks as i64),
        ]
    }
}

/// Blocks per SM the kernel is compiled for (its register budget) and k-steps of input in
/// flight per warp (`DEPTH`: 1 KiB each at 8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    pub blocks: usize,
    pub depth: usize,
}

/// The occupancies tried in turn, the first that compiles without a spill kept. Five blocks of
/// 4 warps leave each thread 96 registers (65536 / 640, in units of 8): the shapes whose
/// spectra are a multiple of 4 (every heap size katgpucbf uses) fit there at 87–96, while
/// those with other spectra counts (the kernel's register path) spill and take the fallback,
/// three blocks with 8 k-steps in flight (up to 170 registers). Five blocks are resident only
/// where shared memory allows (the digit table takes up to 30 KiB per block, from 160 antennas
/// at 8 beams), else the hardware runs four. Four k-steps in flight per warp rather than six
/// since the ring's copies became 16 bytes with an L2 prefetch hint: on the lent H200 that
/// pair took 3–14 % off every case measured (bench/xbengine-notes.md, 2026-11-28); six had
/// been best on the H100 with 8-byte copies. 4-bit input (8-byte copies) moves under 4 %
/// between depths 3 and 6 on the H200 (bench/RESULTS.md, twenty-fourth session): it is bound by
/// its multiplies there, not its loads. The H100 has not run this form.
pub const OCCUPANCIES: [Occupancy; 2] = [
    Occupancy {
        blocks: 5,
        depth: 4,
    },
    Occupancy {
        blocks: 3,
        depth: 8,
    },
];

/// The largest digit table a beamformer is built with (24 bytes per channel, antenna and beam:
/// 8 beams of 80 antennas over 512 channels take 7.9 MB).
const MAX_TABLE_BYTES: usize = 1 << 30;

/// Per-call parameters, on the host (pinned) and on the device; one set per call in flight.
struct CallParams {
    host_present: PinnedHostSlice<u8>,
    host_seeds: PinnedHostSlice<u64>,
    host_dithered: PinnedHostSlice<i32>,
    present: CudaSlice<u8>,
    seeds: CudaSlice<u64>,
    dithered: CudaSlice<i32>,
}

/// Pinned host memory (written by the host, copied to the device; cudarc waits for the last
/// copy from it before the host writes it again).
fn pinned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<PinnedHostSlice<T>, GpuError> {
    // SAFETY: the host writes every element it copies before each copy.
    Ok(unsafe { gpu.ctx.alloc_pinned_with_flags::<T>(len, 0) }?)
}

pub struct Beamformer {
    gpu: Arc<Gpu>,
    cfg: BeamformConfig,
    occupancy: Occupancy,
    kernel: CudaFunction,
    coeffs: CudaFunction,
    table: CudaSlice<u8>,
    weights: CudaSlice<f64>,
    delays: CudaSlice<f64>,
    pols: CudaSlice<i32>,
    scales: CudaSlice<f32>,
    version: Option<u64>,
    params: [CallParams; 2],
    next: usize,
}

impl Beamformer {
    pub fn new(gpu: Arc<Gpu>, cfg: BeamformConfig) -> Result<Beamformer, GpuError> {
        cfg.validate()?;
        let (occupancy, kernel) = compile(&gpu, &cfg)?;
        let coeffs =
            gpu.function_entry(Kernel::Beamform, &cfg.defines(occupancy), "beam_coeffs")?;
        // The ring is dynamic shared memory; with the static digits (up to 30 KiB) it may pass
        // the default limit of 48 KiB (4 warps × 8 k-steps × 1 KiB at the fallback occupancy).
        kernel.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            cfg.ring_bytes(occupancy) as i32,
        )?;
        let st = &gpu.compute;
        let params = |gpu: &Gpu| -> Result<CallParams, GpuError> {
            let st = &gpu.compute;
            Ok(CallParams {
                host_present: pinned(gpu, cfg.batches * cfg.n_ants)?,
                host_seeds: pinned(gpu, cfg.beams)?,
                host_dithered: pinned(gpu, cfg.beams)?,
                present: st.alloc_zeros(cfg.batches * cfg.n_ants)?,
                seeds: st.alloc_zeros(cfg.beams)?,
                dithered: st.alloc_zeros(cfg.beams)?,
            })
        };
        Ok(Beamformer {
            occupancy,
            kernel,
            coeffs,
            table: st.alloc_zeros(cfg.table_bytes())?,
            weights: st.alloc_zeros(cfg.beams * cfg.n_ants * 2)?,
            delays: st.alloc_zeros(cfg.beams * cfg.n_ants)?,
            pols: st.alloc_zeros(cfg.beams)?,
            scales: st.alloc_zeros(cfg.beams)?,
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

    /// Upload the beams' weights and delays and make their digit table (on the compute stream,
    /// ordered before later forms) when `version` differs from the last upload's.
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
        let scales: Vec<f32> = beams.iter().map(beam_scale).collect();
        let st = &self.gpu.compute;
        st.memcpy_htod(&weights, &mut self.weights)?;
        st.memcpy_htod(&delays, &mut self.delays)?;
        st.memcpy_htod(&pols, &mut self.pols)?;
        st.memcpy_htod(&scales, &mut self.scales)?;
        let threads = self.cfg.table_bytes() / 24;
        let launch = LaunchConfig {
            grid_dim: (threads.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = st.launch_builder(&self.coeffs);
        b.arg(&self.weights)
            .arg(&self.delays)
            .arg(&self.pols)
            .arg(&self.scales)
            .arg(&mut self.table);
        // SAFETY: the buffers were sized from the config whose constants the kernel was built
        // with; thread i writes only its own 24 bytes of the table, and no thread exists past
        // the table's end (the kernel also checks).
        unsafe { b.launch(launch) }?;
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
        let (ptr, _sync) = input.device_ptr(&self.gpu.compute);
        if ptr % 16 != 0 {
            return Err(GpuError::Backend(
                "beamformer input: not 16-byte aligned (the kernel loads 16-byte vectors)".into(),
            ));
        }
        if self.version.is_none() {
            return Err(GpuError::Backend(
                "beamformer: form before set_beams".into(),
            ));
        }
        let k = self.next;
        self.next = (k + 1) % self.params.len();
        let p = &mut self.params[k];
        // `as_mut_slice` waits for the copy of two calls back to have read these.
        p.host_present.as_mut_slice()?.copy_from_slice(present);
        let seeds = p.host_seeds.as_mut_slice()?;
        for (b, d) in dither.iter().enumerate() {
            // Beam b's bits are keyed on seed + b (`dsp::beamform::beam_dither`).
            seeds[b] = d.map_or(0, |s| s.wrapping_add(b as u64));
        }
        let dithered = p.host_dithered.as_mut_slice()?;
        for (f, d) in dithered.iter_mut().zip(dither) {
            *f = i32::from(d.is_some());
        }
        // On the host-to-device stream, where they queue behind the loaded chunk's copy (which
        // the kernel waits for anyway) and ahead of the next chunk's: on the compute stream
        // the copy engine ran them after the whole next chunk's copy, and the kernel waited
        // ~6 ms for 100 bytes (bench/RESULTS.md, issue 17's FRB share). cudarc's events make
        // the launch wait for them.
        let h2d = &self.gpu.h2d;
        h2d.memcpy_htod(&p.host_present, &mut p.present)?;
        h2d.memcpy_htod(&p.host_seeds, &mut p.seeds)?;
        h2d.memcpy_htod(&p.host_dithered, &mut p.dithered)?;
        let st = &self.gpu.compute;
        st.memset_zeros(clips)?;
        let threads = cfg.threads();
        let launch = LaunchConfig {
            grid_dim: (
                (cfg.batches * cfg.spectra).div_ceil(threads) as u32,
                cfg.channels as u32,
                1,
            ),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: cfg.ring_bytes(self.occupancy) as u32,
        };
        let mut b = st.launch_builder(&self.kernel);
        b.arg(input)
            .arg(&self.table)
            .arg(&self.scales)
            .arg(&p.present)
            .arg(&p.seeds)
            .arg(&p.dithered)
            .arg(out)
            .arg(clips)
            .arg(&first)
            .arg(&batch_step)
            .arg(&spectrum_step);
        // SAFETY: every buffer's length was checked against the kernel's constants above (the
        // parameter buffers were sized from the same config); each thread writes only its own
        // (batch, beam, channel, spectrum) outputs and adds to the clip counts atomically.
        unsafe { b.launch(launch) }?;
        Ok(())
    }
}

/// The beamformer kernel for `cfg` at the first of [`OCCUPANCIES`] that compiles without a
/// ptxas warning (a spill), or the last one's error. A compile error at an earlier occupancy is
/// logged, so that one that is not a spill is seen.
fn compile(gpu: &Gpu, cfg: &BeamformConfig) -> Result<(Occupancy, CudaFunction), GpuError> {
    let mut last = None;
    for occupancy in OCCUPANCIES {
        match gpu.function(Kernel::Beamform, &cfg.defines(occupancy)) {
            Ok(f) => return Ok((occupancy, f)),
            Err(e @ GpuError::Compile { .. }) => {
                tracing::debug!("beamformer at {occupancy:?}: {e}; trying the next occupancy");
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| GpuError::Backend("beamformer: no occupancy to try".into())))
}

/// The power of two by which the kernel scales a beam's weights before rounding them to
/// integers and writing them as three int8 digits in base 256: the largest |w|·2^s is at most
/// 126·2¹⁶, so that its leading digit stays within ±127 and it keeps 22 bits or more
/// ([`super::pow2_scale`]; the scale is held to 2^±100 so that the kernel's 2¹⁶·2^−s stays
/// finite: weights below 2^−77 lose bits, and weights above about 2¹²³ are clamped by the
/// kernel's digits, which saturates the beam anyway; a beam of zero or non-finite weights is
/// not scaled).
pub fn beam_scale(beam: &Beam) -> f32 {
    let max = beam.weights.iter().map(|w| w.norm()).fold(0.0, f64::max);
    super::pow2_scale(max, DIGIT_LIMIT).clamp(2f64.powi(-100), 2f64.powi(100)) as f32
}

/// The largest scaled weight, 126·2¹⁶: with the lower digits' ±(128·2⁸ + 128) the leading
/// digit stays within ±127.
const DIGIT_LIMIT: f64 = 8_257_536.0;

#[cfg(test)]
mod tests {
    use num_complex::Complex64;

    use super::*;

    fn beam(weights: &[f64]) -> Beam {
        Beam {
            pol: 0,
            weights: weights
                .iter()
                .map(|&r| Complex64::from_polar(r, 0.7))
                .collect(),
            delays: vec![0.0; weights.len()],
        }
    }

    /// The scaled largest weight lies in (126·2¹⁵, 126·2¹⁶] whatever the weights' magnitude
    /// (so its leading base-256 digit is at most 127 and it keeps 22 bits or more), and the
    /// scale is a power of two (so that undoing it is exact).
    #[test]
    fn beam_scale_puts_the_largest_weight_just_below_the_leading_digits_limit() {
        for max in [1e-9, 3e-4, 0.05, 0.25, 1.0, 7.5, 16384.0, 1e6] {
            let s = beam_scale(&beam(&[max / 3.0, max, max / 1e4]));
            assert_eq!(s.to_bits() & 0x007f_ffff, 0, "{s} is not a power of two");
            let top = max * f64::from(s);
            assert!(
                top > 126.0 * 32768.0 && top <= 126.0 * 65536.0,
                "max {max}: scaled to {top}"
            );
        }
        assert_eq!(beam_scale(&beam(&[0.0, 0.0])), 1.0);
        assert_eq!(beam_scale(&beam(&[f64::NAN])), 1.0);
    }
}
