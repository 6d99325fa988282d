//! The CUDA backend's `--frb-beam` outputs (issue 17; seed 004): per output the GPU first stage
//! ([`FrbStage1`], the gridded fp16 tensor-core transform summed to intensities) over the
//! device copy of the chunk, then the second stage ([`FrbResampler`], cuBLAS) to the output's
//! beams, on the compute stream after the chunk's beams; the beams are copied back and encoded
//! to float16 on the host as the CPU backend encodes its own.
//!
//! - **Weights**: `?frb-weights` gives one complex weight per dish; the first stage takes them
//!   per (channel, dish, pol), so each is repeated. Intensities are linear in |W|², so the
//!   weights are scaled by a power of two s that puts the largest just below the first stage's
//!   fp16 range limit ([`FrbStage1::set_weights`]) and the output by 1/s² (exact), so no
//!   finite weight is refused and small weights keep their precision.
//! - **Missing antennas**: the engine zeroes missing heaps before the chunk is loaded, so they
//!   add nothing; the presence flags are not needed here.
//! - **Slow samples**: the configuration makes `t_ds` divide a chunk's spectra, so every call
//!   ends on a slow-sample boundary and returns all its rows (the op could carry partial sums
//!   across calls; the heap format has a fixed number of rows per chunk).
//! - The copy back is synchronous: an FRB output makes the engine thread wait for the chunk's
//!   compute at `frb` (the beams and X dumps keep their overlap without FRB outputs).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView};
use num_complex::Complex32;

use super::backend::{BackendError, FrbChunk};
use crate::dsp::frb::DishGrid;
use crate::dsp::frb_fast::{encode_f16, FrbBeams};
use crate::gpu::frb::{FrbConfig, FrbStage1};
use crate::gpu::frb_resample::FrbResampler;
use crate::gpu::{Gpu, GpuError};

/// What one output's GPU stages are built from.
pub struct CudaFrbSpec {
    pub config: FrbConfig,
    pub grid: DishGrid,
    pub beams: FrbBeams,
    /// The float16 encoding's scale (`--frb-beam`'s `scale`).
    pub scale: f32,
}

/// One `--frb-beam` output on the GPU.
pub(super) struct CudaFrb {
    gpu: Arc<Gpu>,
    stage1: FrbStage1,
    resampler: FrbResampler,
    /// First stage's output, (channel, slow sample, p, q).
    intensities: CudaSlice<f32>,
    /// Second stage's output, (channel, slow sample, beam).
    beams: CudaSlice<f32>,
    host: Vec<f32>,
    config: FrbConfig,
    scale: f32,
    /// 1/s² for the weights last uploaded, and their version.
    weight_scale: f32,
    version: Option<u64>,
    formed: Option<(Vec<u8>, u64)>,
}

/// The power of two s that puts max |w| in (limit/2, limit] (1 for all-zero weights).
fn weight_scale(weights: &[Complex32], limit: f64) -> f64 {
    let max = weights
        .iter()
        .map(|w| f64::from(w.norm()))
        .fold(0.0, f64::max);
    crate::gpu::pow2_scale(max, limit)
}

impl CudaFrb {
    pub(super) fn new(gpu: &Arc<Gpu>, spec: &CudaFrbSpec) -> Result<CudaFrb, GpuError> {
        let cfg = spec.config;
        let stage1 = FrbStage1::new(Arc::clone(gpu), cfg, &spec.grid)?;
        let rows = cfg.channels * cfg.out_rows();
        let resampler = FrbResampler::new(gpu, cfg.rows, cfg.cols, &spec.beams, rows)?;
        let st = &gpu.compute;
        Ok(CudaFrb {
            intensities: st.alloc_zeros(cfg.output_len())?,
            beams: st.alloc_zeros(rows * resampler.beams())?,
            host: vec![0.0; rows * resampler.beams()],
            gpu: Arc::clone(gpu),
            stage1,
            resampler,
            config: cfg,
            scale: spec.scale,
            weight_scale: 1.0,
            version: None,
            formed: None,
        })
    }

    /// Form the output's beams over `chunk` (the device copy of the loaded chunk) into `out`.
    pub(super) fn form(
        &mut self,
        chunk: &CudaView<u8>,
        input: &FrbChunk<'_>,
        mut out: Vec<u8>,
    ) -> Result<(), BackendError> {
        let cfg = self.config;
        let err = |e: GpuError| BackendError(e.to_string());
        if self.version != Some(input.version) {
            if input.weights.len() != cfg.dishes {
                return Err(BackendError(format!(
                    "FRB weights: {} given for {} dishes",
                    input.weights.len(),
                    cfg.dishes
                )));
            }
            // A little below the first stage's limit, which it refuses to reach.
            let s = weight_scale(input.weights, 0.98 * cfg.max_weight());
            let per_pol: Vec<Complex32> = input
                .weights
                .iter()
                .flat_map(|&w| {
                    let w = w * s as f32;
                    [w, w]
                })
                .collect();
            let all: Vec<Complex32> = (0..cfg.channels)
                .flat_map(|_| per_pol.iter().copied())
                .collect();
            self.stage1.set_weights(&all).map_err(err)?;
            // Beyond float32 (weights near its own limits) this is 0 or ∞, and the encoding
            // underflows or saturates, as those intensities would anyway.
            self.weight_scale = (1.0 / (s * s)) as f32;
            self.version = Some(input.version);
        }
        let rows = self.stage1.run(chunk, &mut self.intensities).map_err(err)?;
        if rows != cfg.out_rows() {
            return Err(BackendError(format!(
                "FRB stage 1 ended {rows} slow samples per channel, expected {} (t_ds must divide \
                 the chunk's spectra)",
                cfg.out_rows()
            )));
        }
        self.resampler
            .resample(
                &self.intensities.as_view(),
                cfg.channels * rows,
                &mut self.beams,
            )
            .map_err(err)?;
        self.gpu
            .compute
            .memcpy_dtoh(&self.beams, &mut self.host)
            .map_err(|e| err(e.into()))?;
        out.resize(2 * self.host.len(), 0);
        let clips = encode_f16(&self.host, self.scale * self.weight_scale, &mut out);
        self.formed = Some((out, clips));
        Ok(())
    }

    /// The outstanding result.
    pub(super) fn take(&mut self) -> Option<(Vec<u8>, u64)> {
        self.formed.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scaled largest weight lands in [limit/2, limit), and the factor is a power of two
    /// (no test weight sits exactly on a power of two of the limit).
    #[test]
    fn weight_scale_puts_the_largest_weight_just_below_the_limit() {
        for max in [1e-6f32, 0.01, 0.3, 1.0, 5.0, 1e4] {
            let w = [
                Complex32::new(max * 0.6, max * 0.8),
                Complex32::new(max / 7.0, 0.0),
            ];
            let s = weight_scale(&w, 15.0);
            assert_eq!(s.log2().fract(), 0.0, "{s} is not a power of two");
            let top = f64::from(max) * s;
            assert!((7.5..15.0).contains(&top), "max {max}: scaled to {top}");
        }
        assert_eq!(weight_scale(&[Complex32::new(0.0, 0.0)], 15.0), 1.0);
    }
}
