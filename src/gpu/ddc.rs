//! The narrowband down-conversion op (`kernels/ddc.cu`; seed 000 §Down-conversion kernel, seed
//! 002): the GPU body of `dsp::ddc::ddc` on packed digitiser samples.
//!
//! Buffers: `input` u8, polarisation p's packed samples at byte p·`pol_stride` followed by at
//! least one padding byte; `z` f32 complex [q][W] mixed weights ([`mixed_weights`]); `out` f32
//! complex [pol][`out_stride`], outputs 0..`n_out` written.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use num_complex::Complex64;

use super::compile::{Defines, Kernel};
use super::{Gpu, GpuError};
use crate::dsp::ddc::{cis, mixer_phase};

/// Most taps per phase held in registers at once: a register block of PB samples and C outputs
/// takes C + PB − 1 + 2C registers, and longer filters loop over blocks.
const MAX_PB: usize = 16;
/// Shared memory a block may use: 99 KiB, what sm_86/sm_89 allow with opt-in (the H100 allows
/// 227 KiB), so that one plan fits every supported device.
const MAX_SHARED: usize = 99 * 1024;

/// Bytes of decoded span a block stages at once (a tile of its S rows): 32 KiB leaves room for
/// several blocks per SM.
const SPAN_BYTES: usize = 32 * 1024;

/// What the filter is: fixed by the narrowband output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdcShape {
    pub sample_bits: u32,
    pub subsampling: usize,
    pub taps: usize,
}

/// How the work is mapped (seed 002 §Performance tuning): outputs per thread, threads per
/// phase (a multiple of 32), phases in parallel per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DdcTuning {
    pub coarsen: usize,
    pub groups: usize,
    pub subgroup: usize,
}

impl DdcTuning {
    /// The grid of mappings seed 002 §Performance tuning calls for: coarsening 2, 4 or 8 outputs
    /// per thread, 32, 64 or 128 threads per phase, 1, 2 or 4 phases in parallel.
    /// `cbf-ddc-bench` times all of it; the start-up tuner a few (`ddc_tune::candidates`).
    pub fn grid() -> Vec<DdcTuning> {
        let mut v = Vec::new();
        for coarsen in [2, 4, 8] {
            for groups in [32, 64, 128] {
                for subgroup in [1, 2, 4] {
                    v.push(DdcTuning {
                        coarsen,
                        groups,
                        subgroup,
                    });
                }
            }
        }
        v
    }

    /// The first of a few mappings, largest first, whose whole decoded span fits 32 KiB (4
    /// outputs per thread, up to 4 phases in parallel, blocks of at most 256 threads, or
    /// fewer outputs per thread); where none of 2 outputs per thread or more does (large S),
    /// the largest, with its span decoded in tiles (`DdcPlan::q_tile`). The lent H100,
    /// 10-bit, 16·S taps (bench/ddc-bench-2026-11-27-qtile.txt): S = 128 ran at 94 GS/s with
    /// the single output per thread that fitted untiled, 176 GS/s tiled at 4; S = 64 (8-bit)
    /// ran 2.5 % faster untiled at 2 outputs than tiled at 4. Blocks of 512 made ptxas spill
    /// for some filters of two register blocks (16-bit, S = 6, 160 taps: 4 bytes at 32
    /// registers).
    pub fn default_for(shape: DdcShape) -> DdcTuning {
        let s = shape.subsampling;
        let subgroup = s.clamp(1, 4);
        let tuning = |(coarsen, groups): (usize, usize)| DdcTuning {
            coarsen,
            groups,
            subgroup,
        };
        let largest = (4, 256 / subgroup / 32 * 32);
        let untiled = |&c: &(usize, usize)| {
            DdcPlan::new(shape, tuning(c))
                .ok()
                .filter(|p| p.q_tile() == s && p.shared_bytes() <= SPAN_BYTES)
                .map(|_| tuning(c))
        };
        [largest, (4, 32), (2, 32)]
            .iter()
            .find_map(untiled)
            .unwrap_or(tuning(largest))
    }
}

/// The kernel's constants for a shape and tuning, and the block's shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdcPlan {
    pub shape: DdcShape,
    pub tuning: DdcTuning,
    /// Taps per phase in a register block, and blocks: W = pb·npb ≥ ⌈taps/S⌉.
    pub pb: usize,
    pub npb: usize,
}

impl DdcPlan {
    pub fn new(shape: DdcShape, tuning: DdcTuning) -> Result<DdcPlan, GpuError> {
        let bad = |what: String| Err(GpuError::Backend(format!("DDC kernel: {what}")));
        if !matches!(shape.sample_bits, 2..=10 | 12 | 16) {
            return bad(format!("{}-bit samples are not decoded", shape.sample_bits));
        }
        if shape.subsampling == 0 || shape.taps == 0 {
            return bad("subsampling and taps must be positive".into());
        }
        let t = tuning;
        if !matches!(t.coarsen, 1 | 2 | 4 | 8) {
            return bad(format!("coarsen {} is not 1, 2, 4 or 8", t.coarsen));
        }
        if t.groups == 0 || t.groups % 32 != 0 || t.subgroup == 0 || t.subgroup * t.groups > 1024 {
            return bad(format!(
                "{} groups × {} phases is not a block of whole warps up to 1024 threads",
                t.groups, t.subgroup
            ));
        }
        let w = shape.taps.div_ceil(shape.subsampling);
        let npb = w.div_ceil(MAX_PB);
        let plan = DdcPlan {
            shape,
            tuning,
            pb: w.div_ceil(npb),
            npb,
        };
        if plan.shared_bytes() > MAX_SHARED {
            return bad(format!(
                "{} B of shared memory per block (at most {MAX_SHARED}): fewer groups or coarsening",
                plan.shared_bytes()
            ));
        }
        Ok(plan)
    }

    /// Taps per phase, the filter zero-padded to W·S.
    pub fn taps_per_phase(&self) -> usize {
        self.pb * self.npb
    }

    /// Outputs per block.
    pub fn outputs_per_block(&self) -> usize {
        self.tuning.groups * self.tuning.coarsen
    }

    fn threads(&self) -> usize {
        self.tuning.groups * self.tuning.subgroup
    }

    /// Floats of one padded row of the decoded span (the kernel's `ROW_STRIDE`).
    fn row_stride(&self) -> usize {
        let row = self.outputs_per_block() + self.taps_per_phase() - 1;
        (row + row / 32 + 1) | 1
    }

    /// Rows (phases) of the span decoded at once (the kernel's `QTILE`): all S where they fit
    /// [`SPAN_BYTES`], else the most that do, in whole multiples of SG so that every thread
    /// keeps its phases in the same order (the sums are then bit for bit those of the whole
    /// span). Without tiles, the span of S = 128 at 4 outputs per thread took 270 KiB, so
    /// only one output per thread fitted and the kernel ran at 95 GS/s
    /// (bench/ddc-bench-2026-11-26-v1.txt).
    pub fn q_tile(&self) -> usize {
        let (s, sg) = (self.shape.subsampling, self.tuning.subgroup);
        let fit = SPAN_BYTES / (self.row_stride() * 4);
        if fit >= s {
            s
        } else {
            (fit / sg * sg).max(sg)
        }
    }

    /// The larger of the decoded span's tile (`q_tile` padded rows) and the partial sums
    /// (SG·O complex values).
    pub fn shared_bytes(&self) -> usize {
        let span = self.q_tile() * self.row_stride() * 4;
        let parts = self.tuning.subgroup * self.outputs_per_block() * 8;
        span.max(parts)
    }

    pub fn defines(&self) -> Defines {
        vec![
            ("SAMPLE_BITS", i64::from(self.shape.sample_bits)),
            ("SUBSAMPLING", self.shape.subsampling as i64),
            ("PB", self.pb as i64),
            ("NPB", self.npb as i64),
            ("COARSEN", self.tuning.coarsen as i64),
            ("GROUPS", self.tuning.groups as i64),
            ("SUBGROUP", self.tuning.subgroup as i64),
            ("QTILE", self.q_tile() as i64),
        ]
    }

    /// The mixed weights z_k = h_k·e^{2πj·f·k} (seed 000 §Down-conversion kernel) in the
    /// kernel's [q][W] order, tap k = p·S + q at q·W + p, zero past the filter; interleaved
    /// re/im f32, computed in f64 with the oracle's fixed-point phase.
    pub fn mixed_weights(&self, weights: &[f32], step: u32) -> Vec<f32> {
        let (s, w) = (self.shape.subsampling, self.taps_per_phase());
        let mut z = vec![0f32; 2 * s * w];
        for (k, &h) in weights.iter().enumerate() {
            let v: Complex64 = cis(mixer_phase(step, k as u64)) * f64::from(h);
            let at = 2 * ((k % s) * w + k / s);
            z[at] = v.re as f32;
            z[at + 1] = v.im as f32;
        }
        z
    }
}

/// One launch over one or both polarisations.
#[derive(Debug, Clone, Copy)]
pub struct DdcRun {
    pub pols: usize,
    /// Samples per polarisation in the input (later ones read as zero).
    pub n_in: usize,
    pub pol_stride: usize,
    /// Outputs per polarisation, and the complex values from one polarisation's to the next's.
    pub n_out: usize,
    pub out_stride: usize,
    /// The absolute index of each polarisation's first input sample.
    pub t_first: [u64; 2],
    /// The mixer's fixed-point step (`dsp::ddc::mixer_step`).
    pub step: u32,
}

/// The compiled kernel.
pub struct Ddc {
    func: CudaFunction,
    plan: DdcPlan,
}

impl Ddc {
    pub fn new(gpu: &Gpu, plan: DdcPlan) -> Result<Ddc, GpuError> {
        let func = gpu.function(Kernel::Ddc, &plan.defines())?;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            plan.shared_bytes() as i32,
        )?;
        Ok(Ddc { func, plan })
    }

    pub fn plan(&self) -> DdcPlan {
        self.plan
    }

    pub fn launch(
        &self,
        st: &CudaStream,
        out: &mut CudaSlice<f32>,
        input: &CudaSlice<u8>,
        z: &CudaSlice<f32>,
        run: DdcRun,
    ) -> Result<(), GpuError> {
        let (bits, s) = (
            self.plan.shape.sample_bits as usize,
            self.plan.shape.subsampling,
        );
        let pol_bytes = (run.n_in * bits).div_ceil(8) + 1;
        let fits = run.pols >= 1
            && run.pols <= 2
            && (run.pols - 1) * run.pol_stride + pol_bytes <= input.len()
            && (run.pols == 1 || run.pol_stride >= pol_bytes)
            && 2 * ((run.pols - 1) * run.out_stride + run.n_out) <= out.len()
            && (run.pols == 1 || run.out_stride >= run.n_out)
            && z.len() == 2 * s * self.plan.taps_per_phase();
        if !fits {
            return Err(GpuError::Backend(format!(
                "DDC launch {run:?} does not fit its buffers (input {} B, output {} values, \
                 weights {})",
                input.len(),
                out.len(),
                z.len()
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (
                run.n_out.div_ceil(self.plan.outputs_per_block()) as u32,
                run.pols as u32,
                1,
            ),
            block_dim: (self.plan.threads() as u32, 1, 1),
            shared_mem_bytes: self.plan.shared_bytes() as u32,
        };
        let (n_in, stride, n_out, out_stride) = (
            run.n_in as i64,
            run.pol_stride as i64,
            run.n_out as i64,
            run.out_stride as i64,
        );
        let (t0, t1) = (run.t_first[0] as u32, run.t_first[1] as u32);
        let mut b = st.launch_builder(&self.func);
        b.arg(out)
            .arg(input)
            .arg(z)
            .arg(&n_in)
            .arg(&stride)
            .arg(&n_out)
            .arg(&out_stride)
            .arg(&t0)
            .arg(&t1)
            .arg(&run.step);
        // SAFETY: the arguments match ddc's signature; every polarisation's samples (with their
        // padding byte), outputs and the weight table lie inside their buffers (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(subsampling: usize, taps: usize) -> DdcShape {
        DdcShape {
            sample_bits: 10,
            subsampling,
            taps,
        }
    }

    /// The default mapping fits every shape `--narrowband` accepts (subsampling up to 512,
    /// up to 8192 taps).
    #[test]
    fn default_tuning_fits_every_accepted_shape() {
        for s in [2, 3, 6, 8, 10, 16, 24, 64, 100, 128, 256, 512] {
            for taps in [1, s, 16 * s, 8192] {
                let sh = shape(s, taps);
                let plan = DdcPlan::new(sh, DdcTuning::default_for(sh))
                    .unwrap_or_else(|e| panic!("S {s} taps {taps}: {e}"));
                assert!(plan.taps_per_phase() * s >= taps);
                assert!(plan.pb <= MAX_PB);
            }
        }
    }

    /// Tap k = p·S + q lands at q·W + p: checked against the weights read back by position.
    #[test]
    fn mixed_weights_are_phase_major() {
        let plan = DdcPlan::new(shape(3, 7), DdcTuning::default_for(shape(3, 7))).unwrap();
        let w = plan.taps_per_phase();
        assert_eq!(w, 3);
        let h: Vec<f32> = (1..=7).map(|k| k as f32).collect();
        let z = plan.mixed_weights(&h, 0); // no mixing: z = h
        for q in 0..3 {
            for p in 0..w {
                let k = p * 3 + q;
                let want = if k < 7 { (k + 1) as f32 } else { 0.0 };
                assert_eq!((z[2 * (q * w + p)], z[2 * (q * w + p) + 1]), (want, 0.0));
            }
        }
    }

    #[test]
    fn unusable_mappings_are_refused() {
        let sh = shape(8, 128);
        for t in [
            DdcTuning {
                coarsen: 3,
                groups: 32,
                subgroup: 1,
            },
            DdcTuning {
                coarsen: 4,
                groups: 48,
                subgroup: 1,
            },
            DdcTuning {
                coarsen: 4,
                groups: 512,
                subgroup: 4,
            },
        ] {
            assert!(DdcPlan::new(sh, t).is_err(), "{t:?}");
        }
    }

    /// A span too large for shared memory is decoded in tiles of whole multiples of SG rows
    /// (S = 512 at 8 outputs per thread: 4 KiB per row, 1 MiB in all), within the budget.
    #[test]
    fn large_spans_are_staged_in_tiles() {
        for (s, subgroup) in [(512, 1), (512, 4), (128, 4), (100, 3)] {
            let t = DdcTuning {
                coarsen: 8,
                groups: 128,
                subgroup,
            };
            let plan = DdcPlan::new(shape(s, 16 * s), t).unwrap();
            let q = plan.q_tile();
            assert!(
                q < s && q % subgroup == 0 && q >= subgroup,
                "S {s}: tile {q}"
            );
            assert!(q * plan.row_stride() * 4 <= SPAN_BYTES, "S {s}: tile {q}");
        }
        // Where the whole span fits, it is one tile.
        let small = DdcPlan::new(shape(8, 128), DdcTuning::default_for(shape(8, 128))).unwrap();
        assert_eq!(small.q_tile(), 8);
    }
}
