//! float32 rows to float16 bytes on the device (`kernels/f16_encode.cu`): each row scaled by
//! its own factor, saturated at ±65504, rounded to nearest even, with a count of the values
//! saturated — the bits of `dsp::frb_fast::encode_f16`, which the self-test compares value by
//! value. The FRB output encodes its beams so before the copy back: half the bytes cross PCIe,
//! and the engine thread, which took 75–200 ms per 35 ms chunk to encode them on the host at
//! seed 004 case 5, only copies (bench/RESULTS.md, FRB share of the chunk time).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::compile::Kernel;
use super::{Gpu, GpuError};

/// The compiled encoder.
pub struct F16Encoder {
    gpu: Arc<Gpu>,
    kernel: CudaFunction,
    /// Blocks per row: the grid-stride loop's width, enough for a few waves over all rows.
    blocks_per_row: u32,
}

impl F16Encoder {
    /// For calls of `rows` rows of `row_len` values.
    pub fn new(gpu: &Arc<Gpu>, rows: usize, row_len: usize) -> Result<F16Encoder, GpuError> {
        let kernel = gpu.function(Kernel::F16Encode, &vec![])?;
        let wanted = (8 * gpu.sm_count()?).div_ceil(rows.max(1));
        Ok(F16Encoder {
            gpu: Arc::clone(gpu),
            kernel,
            blocks_per_row: row_len.div_ceil(256).min(wanted).max(1) as u32,
        })
    }

    /// On the compute stream: `out` (2 bytes per value, little-endian) = fp16(`input`·s_r) for
    /// every row r of `row_len` values, s_r = `scales[r]`; the saturated values are added to
    /// `clips[0]` (the caller zeroes it).
    pub fn encode(
        &self,
        input: &CudaView<f32>,
        scales: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
        clips: &mut CudaSlice<u64>,
        row_len: usize,
    ) -> Result<(), GpuError> {
        let rows = scales.len();
        if input.len() < rows * row_len || out.len() < 2 * rows * row_len || clips.is_empty() {
            return Err(GpuError::Backend(format!(
                "float16 encoding of {rows} rows of {row_len}: input {}, output {} bytes",
                input.len(),
                out.len()
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (self.blocks_per_row, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let len = row_len as i64;
        let mut b = self.gpu.compute.launch_builder(&self.kernel);
        b.arg(input).arg(scales).arg(out).arg(clips).arg(&len);
        // SAFETY: the arguments match f16_encode's signature; every row lies inside `input`
        // and, at 2 bytes a value, inside `out` (checked above), and `clips` has an element.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
