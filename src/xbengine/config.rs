//! The XB-engine's configuration (katgpucbf xbgpu's flags, facts §1.2, §1.4), validated at
//! start-up with errors that name the flag at fault, and the plan derived from it.
#![deny(unsafe_code)]

use super::frb_output::FrbBeamOutput;
use super::output::{BeamOutput, CorrprodOutput};
use super::place::XLayout;
use crate::engine::affinity::EngineAffinity;
use crate::engine::control::ControlConfig;
use crate::engine::recv::SourceConfig;
use crate::engine::{
    check_rate_factor, check_sample_rate, check_seconds, ConfigError, MAX_CHUNK_BYTES,
};
use crate::fengine::BackendKind;

/// Everything an XB-engine is built from.
#[derive(Debug, Clone)]
pub struct XbengineConfig {
    pub source: SourceConfig,
    pub array_size: usize,
    /// Channels of the whole band, and of this engine's substream.
    pub channels: usize,
    pub channels_per_substream: usize,
    pub samples_between_spectra: u64,
    pub channel_offset_value: u64,
    /// Hz of the whole band (`None`: critically sampled, adc_sample_rate / 2).
    pub bandwidth: Option<f64>,
    pub jones_per_batch: usize,
    pub sample_bits: u32,
    pub heaps_per_fengine_per_chunk: usize,
    /// Largest lateness of a heap still accepted, in ADC ticks.
    pub recv_reorder_tol: u64,
    pub send_enabled: bool,
    pub adc_sample_rate: f64,
    pub sync_time: f64,
    pub corrprods: Vec<CorrprodOutput>,
    pub beams: Vec<BeamOutput>,
    pub frb_beams: Vec<FrbBeamOutput>,
    pub backend: BackendKind,
    /// CUDA device ordinal (with the CUDA backend).
    pub gpu_device: usize,
    /// Threads of the CPU backend's correlator.
    pub cpu_threads: usize,
    pub send_rate_factor: f64,
    pub send_packet_payload: usize,
    pub send_interfaces: Vec<String>,
    pub send_ttl: u32,
    pub send_buffer: usize,
    /// Kernel UDP or ibverbs (`--send-ibv`, `--send-comp-vector`).
    pub send_transport: crate::engine::send::SendTransport,
    pub dither_seed: u64,
    pub duration: Option<f64>,
    pub control: ControlConfig,
    /// Cores of the receive, send and processing threads.
    pub affinity: EngineAffinity,
}

/// The validated shape of the engine.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub layout: XLayout,
    pub spectra_per_heap: usize,
    /// Chunks in the receive window (from `--recv-reorder-tol`).
    pub max_chunks: usize,
    /// Channel spacing (Hz).
    pub channel_spacing: f64,
}

/// Largest array accepted: katgpucbf's correlator is used up to 80 antennas, its heaps
/// carry feng_id in 48 bits; the bound keeps the baseline count (and X heap size) sane.
pub const MAX_ANTENNAS: usize = 4096;
/// Most `--corrprod`, `--beam` and `--frb-beam` outputs in all (each has a send thread and
/// heap buffers).
pub const MAX_OUTPUTS: usize = 64;
/// Most `--frb-beam` outputs (each may hold a 256 MiB resampling matrix and its heaps).
pub const MAX_FRB_OUTPUTS: usize = 8;

impl XbengineConfig {
    /// Check every flag and how they combine.
    pub fn validate(&self) -> Result<Plan, ConfigError> {
        fn e(flag: &'static str, m: impl std::fmt::Display) -> ConfigError {
            ConfigError::new(flag, m)
        }
        self.affinity.validate(self.source.threads)?;
        if self.array_size == 0 || self.array_size > MAX_ANTENNAS {
            return Err(e("--array-size", format!("must be 1–{MAX_ANTENNAS}")));
        }
        if self.channels == 0 {
            return Err(e("--channels", "must be positive"));
        }
        let cps = self.channels_per_substream;
        if cps == 0 || self.channels % cps != 0 {
            return Err(e(
                "--channels-per-substream",
                format!("must divide --channels ({})", self.channels),
            ));
        }
        if self.channel_offset_value % cps as u64 != 0
            || self.channel_offset_value >= self.channels as u64
        {
            return Err(e(
                "--channel-offset-value",
                "must be a multiple of --channels-per-substream below --channels",
            ));
        }
        if self.samples_between_spectra == 0 {
            return Err(e("--samples-between-spectra", "must be positive"));
        }
        if self.jones_per_batch == 0 || self.jones_per_batch % self.channels != 0 {
            return Err(e(
                "--jones-per-batch",
                format!("must be a multiple of --channels ({})", self.channels),
            ));
        }
        if !matches!(self.sample_bits, 4 | 8) {
            return Err(e(
                "--sample-bits",
                format!("{} is not 8 or 4", self.sample_bits),
            ));
        }
        if self.heaps_per_fengine_per_chunk == 0 || self.heaps_per_fengine_per_chunk > 4096 {
            return Err(e("--heaps-per-fengine-per-chunk", "must be 1–4096"));
        }
        check_sample_rate("--adc-sample-rate", self.adc_sample_rate)?;
        let bandwidth = self.bandwidth.unwrap_or(self.adc_sample_rate / 2.0);
        if !(bandwidth.is_finite() && bandwidth > 0.0) {
            return Err(e("--bandwidth", "must be a positive number of Hz"));
        }
        if !(self.sync_time.is_finite() && self.sync_time >= 0.0) {
            return Err(e("--sync-time", "must be a UNIX time in seconds"));
        }
        check_rate_factor("--send-rate-factor", self.send_rate_factor)?;
        if self.send_packet_payload == 0 || self.send_packet_payload > 65000 {
            return Err(e("--send-packet-payload", "must be 1–65000 bytes"));
        }
        if let Some(d) = self.duration {
            check_seconds("--duration", d, false)?;
        }
        if self.cpu_threads == 0 || self.cpu_threads > 1024 {
            return Err(e("--cpu-threads", "must be 1–1024"));
        }
        if self.corrprods.is_empty() && self.beams.is_empty() && self.frb_beams.is_empty() {
            return Err(e(
                "--corrprod",
                "give at least one --corrprod, --beam or --frb-beam output",
            ));
        }
        if self.frb_beams.len() > MAX_FRB_OUTPUTS {
            return Err(e(
                "--frb-beam",
                format!("at most {MAX_FRB_OUTPUTS} FRB beamformer outputs"),
            ));
        }
        if self.corrprods.len() + self.beams.len() + self.frb_beams.len() > MAX_OUTPUTS {
            return Err(e(
                "--corrprod",
                format!("at most {MAX_OUTPUTS} outputs (--corrprod, --beam and --frb-beam)"),
            ));
        }
        let mut names: Vec<&str> = self.corrprods.iter().map(|c| c.name.as_str()).collect();
        names.extend(self.beams.iter().map(|b| b.name.as_str()));
        names.extend(self.frb_beams.iter().map(|b| b.name.as_str()));
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(e("--corrprod", format!("output name {n:?} used twice")));
            }
        }
        let spectra_per_heap = self.jones_per_batch / self.channels;
        let value_bytes = self.sample_bits as usize * 2 / 8;
        let heap_bytes = cps
            .checked_mul(spectra_per_heap)
            .and_then(|v| v.checked_mul(2 * value_bytes))
            .filter(|&v| v <= 1 << 30)
            .ok_or_else(|| e("--jones-per-batch", "F heaps over 1 GiB"))?;
        let heap_step = (spectra_per_heap as u64)
            .checked_mul(self.samples_between_spectra)
            .filter(|step| {
                step.checked_mul(self.heaps_per_fengine_per_chunk as u64)
                    .is_some()
            })
            .ok_or_else(|| {
                e(
                    "--samples-between-spectra",
                    "a chunk's span of timestamps overflows 64 bits",
                )
            })?;
        let layout = XLayout {
            n_ants: self.array_size,
            heap_bytes,
            heap_step,
            batches: self.heaps_per_fengine_per_chunk,
        };
        if layout
            .heaps_per_chunk()
            .checked_mul(heap_bytes)
            .is_none_or(|b| b as u64 > MAX_CHUNK_BYTES)
        {
            return Err(e(
                "--heaps-per-fengine-per-chunk",
                format!(
                    "chunks over {} GiB: fewer batches per chunk",
                    MAX_CHUNK_BYTES >> 30
                ),
            ));
        }
        for f in &self.frb_beams {
            if self.backend == BackendKind::Cuda {
                let side = crate::gpu::frb::MAX_GRID_SIDE;
                if f.grid.rows > side || f.grid.cols > side {
                    return Err(e(
                        "--frb-beam",
                        format!(
                            "{}: the CUDA backend's FRB beamformer takes grids up to {side}×{side}",
                            f.name
                        ),
                    ));
                }
                if self.sample_bits != 8 {
                    return Err(e(
                        "--frb-beam",
                        format!(
                            "{}: the CUDA backend's FRB beamformer takes 8-bit samples",
                            f.name
                        ),
                    ));
                }
            }
            f.check(self.array_size, spectra_per_heap * layout.batches, cps)
                .map_err(|m| e("--frb-beam", m))?;
        }
        // katgpucbf: enough chunks in flight to cover the reorder tolerance, plus the one
        // being filled.
        let max_chunks =
            (self.recv_reorder_tol.div_ceil(layout.chunk_step()) as usize + 1).clamp(2, 64);
        Ok(Plan {
            layout,
            spectra_per_heap,
            max_chunks,
            channel_spacing: bandwidth / self.channels as f64,
        })
    }
}
