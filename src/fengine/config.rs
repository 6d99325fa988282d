//! The F-engine's configuration (katgpucbf fgpu's flags, facts §1.2, §1.3), validated at
//! start-up with errors that name the flag at fault, and the plan derived from it.
#![deny(unsafe_code)]

use num_complex::Complex32;

use super::narrowband_output::NarrowbandOutput;
use super::output::{OutputSpec, WidebandOutput};
use super::pipeline::tail_samples;
use super::place::InputLayout;
use crate::dsp::postproc::OutputBits;
use crate::dsp::samples::{packed_len, valid_sample_bits};
use crate::engine::affinity::EngineAffinity;
use crate::engine::control::ControlConfig;
use crate::engine::recv::SourceConfig;
use crate::engine::{
    check_rate_factor, check_sample_rate, check_seconds, ConfigError, MAX_CHUNK_BYTES,
};

/// Where an engine's DSP runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// `src/dsp` on the host.
    Cpu,
    /// The kernels in `kernels/` (needs a CUDA driver, NVRTC and cuFFT).
    Cuda,
}

/// Most send threads an output may have (`--send-threads`).
pub const MAX_SEND_THREADS: usize = 16;

/// Everything an F-engine is built from.
#[derive(Debug, Clone)]
pub struct FengineConfig {
    pub source: SourceConfig,
    pub adc_sample_rate: f64,
    pub feng_id: u64,
    pub array_size: u64,
    pub dig_sample_bits: u32,
    pub recv_packet_samples: usize,
    pub recv_chunk_samples: usize,
    pub backend: BackendKind,
    pub gpu_device: usize,
    /// Receive the chunks straight into GPU memory through a host mapping of it
    /// (`--use-vkgdr`, `gpu::vkgdr`): the CUDA backend then copies each chunk on the device
    /// instead of across PCIe. CUDA backend only.
    pub use_vkgdr: bool,
    /// Send the output heaps from GPU memory, which the NIC reads through GPUDirect RDMA
    /// (`--use-peerdirect`, seed 000 §PeerDirect): no device-to-host copy of the heaps. CUDA
    /// backend and ibverbs only; checked further at start-up (`fengine::peerdirect`).
    pub use_peerdirect: bool,
    /// Where the DDC kernel's tuned mappings are kept (`--tuning-cache`; `None`: the default
    /// place, `gpu::ddc_tune::TuningCache::default_path`).
    pub tuning_cache: Option<std::path::PathBuf>,
    pub jones_per_batch: usize,
    pub max_delay_diff: usize,
    pub send_rate_factor: f64,
    /// Send threads per output (`--send-threads`), each with its own sockets: for outputs
    /// faster than one thread sends through kernel UDP sockets. Kernel UDP only.
    pub send_threads: usize,
    pub send_sample_bits: u32,
    pub send_packet_payload: usize,
    pub send_interfaces: Vec<String>,
    pub send_ttl: u32,
    /// Socket send buffer, bytes.
    pub send_buffer: usize,
    /// Kernel UDP or ibverbs (`--send-ibv`, `--send-comp-vector`).
    pub send_transport: crate::engine::send::SendTransport,
    /// Clear the timestamp bits below the heap size (`--mask-timestamp`).
    pub mask_timestamp: bool,
    pub gain: Complex32,
    pub dither_seed: u64,
    /// `--wideband` outputs.
    pub outputs: Vec<WidebandOutput>,
    /// `--narrowband` outputs.
    pub narrowband: Vec<NarrowbandOutput>,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// UNIX time of timestamp 0.
    pub sync_time: f64,
    pub control: ControlConfig,
    /// Cores of the receive, send and processing threads.
    pub affinity: EngineAffinity,
}

/// The validated shape of the engine: input layout and each output (wideband first, then
/// narrowband, as katgpucbf orders them) with its spectra per heap.
#[derive(Debug, Clone)]
pub struct Plan {
    pub layout: InputLayout,
    pub outputs: Vec<(OutputSpec, usize)>,
}

impl FengineConfig {
    /// Check every flag and how they combine.
    pub fn validate(&self) -> Result<Plan, ConfigError> {
        check_sample_rate("--adc-sample-rate", self.adc_sample_rate)?;
        if self.use_vkgdr && self.backend != BackendKind::Cuda {
            return Err(ConfigError::new(
                "--use-vkgdr",
                "needs --backend cuda: it puts the receive chunks in GPU memory, which the CPU \
                 backend would have to read back across PCIe",
            ));
        }
        self.check_peerdirect()?;
        self.affinity.validate(self.source.threads)?;
        if !valid_sample_bits(self.dig_sample_bits) {
            return Err(ConfigError::new(
                "--dig-sample-bits",
                format!("{} is not one of 2–10, 12, 16", self.dig_sample_bits),
            ));
        }
        let hs = self.recv_packet_samples;
        if hs == 0 || hs % 8 != 0 {
            return Err(ConfigError::new(
                "--recv-packet-samples",
                "must be a positive multiple of 8",
            ));
        }
        if self.recv_chunk_samples == 0 || self.recv_chunk_samples % hs != 0 {
            return Err(ConfigError::new(
                "--recv-chunk-samples",
                format!("must be a positive multiple of --recv-packet-samples ({hs})"),
            ));
        }
        let chunk_bytes = (self.recv_chunk_samples as u64)
            .checked_mul(2 * u64::from(self.dig_sample_bits))
            .map(|bits| bits / 8);
        if chunk_bytes.is_none_or(|b| b > MAX_CHUNK_BYTES) {
            return Err(ConfigError::new(
                "--recv-chunk-samples",
                format!("chunks over {} GiB", MAX_CHUNK_BYTES >> 30),
            ));
        }
        if self.feng_id >= self.array_size {
            return Err(ConfigError::new(
                "--feng-id",
                format!("must be less than --array-size ({})", self.array_size),
            ));
        }
        if !matches!(self.send_sample_bits, 4 | 8) {
            return Err(ConfigError::new(
                "--send-sample-bits",
                format!("{} is not 4 or 8", self.send_sample_bits),
            ));
        }
        check_rate_factor("--send-rate-factor", self.send_rate_factor)?;
        if !(1..=MAX_SEND_THREADS).contains(&self.send_threads) {
            return Err(ConfigError::new(
                "--send-threads",
                format!("{} is not 1 … {MAX_SEND_THREADS}", self.send_threads),
            ));
        }
        if self.send_threads > 1
            && !matches!(
                self.send_transport,
                crate::engine::send::SendTransport::Udp | crate::engine::send::SendTransport::Uring
            )
        {
            return Err(ConfigError::new(
                "--send-threads",
                "more than one send thread is for kernel UDP sockets (whose work per byte \
                 limits one thread); ibverbs and DPDK send without the kernel",
            ));
        }
        if self.send_packet_payload == 0 {
            return Err(ConfigError::new(
                "--send-packet-payload",
                "must be positive",
            ));
        }
        if !(self.gain.re.is_finite() && self.gain.im.is_finite()) {
            return Err(ConfigError::new(
                "--gain",
                "must be a finite complex number",
            ));
        }
        if !self.sync_time.is_finite() || self.sync_time < 0.0 {
            return Err(ConfigError::new(
                "--sync-time",
                "must be a UNIX time in seconds",
            ));
        }
        if let Some(d) = self.duration {
            check_seconds("--duration", d, false)?;
        }
        if self.outputs.is_empty() && self.narrowband.is_empty() {
            return Err(ConfigError::new(
                "--wideband",
                "at least one --wideband or --narrowband output is needed",
            ));
        }
        for o in &self.narrowband {
            o.check(self.adc_sample_rate)
                .map_err(|e| ConfigError::new("--narrowband", format!("output {}: {e}", o.name)))?;
        }
        let specs = self.outputs.iter().cloned().map(OutputSpec::Wideband);
        let specs = specs.chain(self.narrowband.iter().cloned().map(OutputSpec::Narrowband));
        let mut outputs: Vec<(OutputSpec, usize)> = Vec::new();
        for o in specs {
            let name = o.name();
            if outputs.iter().any(|(p, _)| p.name() == name) {
                return Err(ConfigError::new(
                    o.flag(),
                    format!("output name {name} used twice"),
                ));
            }
            let sph = o.spectra_per_heap(self.jones_per_batch).map_err(|e| {
                ConfigError::new("--jones-per-batch", format!("output {name}: {e}"))
            })?;
            let shape = o.shape();
            let span = sph.saturating_mul(shape.spectra_samples);
            if self.recv_chunk_samples % span != 0 {
                return Err(ConfigError::new(
                    "--recv-chunk-samples",
                    format!("must be a multiple of output {name}'s heap span ({span} samples)"),
                ));
            }
            if tail_samples(shape, self.max_delay_diff, hs) > self.recv_chunk_samples {
                return Err(ConfigError::new(
                    "--max-delay-diff",
                    format!("with output {name}'s PFB footprint it exceeds --recv-chunk-samples"),
                ));
            }
            outputs.push((o, sph));
        }
        Ok(Plan {
            layout: InputLayout {
                heap_samples: hs as u64,
                heap_bytes: packed_len(hs, self.dig_sample_bits) as u64,
                chunk_samples: self.recv_chunk_samples as u64,
                mask_timestamp: self.mask_timestamp,
            },
            outputs,
        })
    }

    /// `--use-peerdirect` needs the CUDA backend (the heaps must be in GPU memory), ibverbs
    /// (the only transport that gathers from registered device memory) and a build with it.
    fn check_peerdirect(&self) -> Result<(), ConfigError> {
        const FLAG: &str = "--use-peerdirect";
        if !self.use_peerdirect {
            return Ok(());
        }
        if self.backend != BackendKind::Cuda {
            return Err(ConfigError::new(
                FLAG,
                "needs --backend cuda: it sends the output heaps from GPU memory",
            ));
        }
        if !matches!(
            self.send_transport,
            crate::engine::send::SendTransport::Ibv { .. }
        ) {
            return Err(ConfigError::new(
                FLAG,
                "needs --send-ibv: only the ibverbs transport lets the NIC read GPU memory",
            ));
        }
        if !cfg!(feature = "ibv") {
            return Err(ConfigError::new(FLAG, crate::net::IBV_NOT_BUILT));
        }
        Ok(())
    }

    /// Output sample width.
    pub fn out_bits(&self) -> OutputBits {
        if self.send_sample_bits == 4 {
            OutputBits::Four
        } else {
            OutputBits::Eight
        }
    }
}
