//! Each output's [`Pipeline`] on the engine's backend. On the CPU each output has its own
//! backend; on CUDA they share one device context, one set of input slots, into which each
//! chunk is uploaded once for every output (seed 000 §Multiple outputs, `cuda_input`), and
//! one DDC tuning cache (`gpu::ddc_tune`), opened when the first narrowband output needs it.

use std::sync::Arc;

use super::backend::Backend;
use super::config::FengineConfig;
use super::cuda::{
    default_batch, default_depth, default_unzip, peer_depth, wideband_batch, GpuBackend, GpuConfig,
};
use super::cuda_input::{InputShape, SharedInput};
use super::narrowband::{NarrowbandBackend, NarrowbandSizes};
use super::output::{OutputSpec, WidebandOutput};
use super::pipeline::{Pipeline, PipelineConfig};
use super::place::InputLayout;
use crate::engine::{ConfigError, EngineError};
use crate::gpu::ddc_tune::TuningCache;
use crate::gpu::vkgdr::VkgdrMemory;
use crate::gpu::Gpu;

/// The engine's GPU, opened on first use.
pub(super) fn open_gpu(
    cfg: &FengineConfig,
    gpu: &mut Option<Arc<Gpu>>,
) -> Result<Arc<Gpu>, EngineError> {
    if let Some(g) = gpu {
        return Ok(Arc::clone(g));
    }
    let g = Gpu::open(cfg.gpu_device).map_err(|e| ConfigError::new("--backend", e))?;
    tracing::info!(device = %g.name, arch = %g.arch, "CUDA backend");
    Ok(gpu.insert(g).clone())
}

/// What the CUDA outputs of one engine share.
pub(super) struct CudaShared {
    input: SharedInput,
    tuning: Option<TuningCache>,
}

impl CudaShared {
    /// Input slots on `gpu` whose tail is the longest any of `outputs` reads, filled on the
    /// device from `device_chunks` where the chunks live there (`--use-vkgdr`).
    pub(super) fn new(
        cfg: &FengineConfig,
        layout: InputLayout,
        outputs: &[(OutputSpec, usize)],
        gpu: &Arc<Gpu>,
        device_chunks: Option<Arc<VkgdrMemory>>,
    ) -> Result<CudaShared, EngineError> {
        let pcfg = pipeline_config(cfg, layout, 1);
        let tail = outputs
            .iter()
            .map(|(o, _)| pcfg.tail(o.shape()))
            .max()
            .unwrap_or(0);
        let shape = InputShape {
            sample_bits: cfg.dig_sample_bits,
            body: layout.chunk_samples as usize,
            tail,
        };
        let input = SharedInput::new(gpu, shape)
            .map_err(|e| ConfigError::new("--recv-chunk-samples", e))?;
        if let Some(memory) = device_chunks {
            input.copy_on_device_from(memory);
        }
        tracing::info!(
            slots_bytes = 3 * 2 * input.pol_stride(),
            tail_samples = tail,
            "input slots shared by every output"
        );
        Ok(CudaShared {
            input,
            tuning: None,
        })
    }

    /// The DDC tuning cache of `--tuning-cache` or the default place, opened now if not yet.
    fn tuning(&mut self, cfg: &FengineConfig) -> &mut TuningCache {
        self.tuning.get_or_insert_with(|| {
            match cfg.tuning_cache.clone().or_else(TuningCache::default_path) {
                Some(path) => {
                    let c = TuningCache::open(&path);
                    tracing::info!(path = %path.display(), "DDC tuning cache");
                    c
                }
                None => {
                    tracing::warn!(
                        "no --tuning-cache, $XDG_CACHE_HOME or $HOME: DDC mappings are tuned at each start"
                    );
                    TuningCache::in_memory()
                }
            }
        })
    }
}

/// How output pipelines of `cfg` are set up, with `sph` spectra per heap.
pub(super) fn pipeline_config(
    cfg: &FengineConfig,
    layout: InputLayout,
    sph: usize,
) -> PipelineConfig {
    PipelineConfig {
        layout,
        sample_bits: cfg.dig_sample_bits,
        spectra_per_heap: sph,
        max_delay_diff: cfg.max_delay_diff,
        gain: cfg.gain,
        dither_seed: cfg.dither_seed,
        out_bits: cfg.out_bits(),
    }
}

/// The output's pipeline on the CPU backend, or on CUDA with what the engine's CUDA outputs
/// share (`cuda`).
pub(super) fn make_pipeline(
    cfg: &FengineConfig,
    cuda: Option<&mut CudaShared>,
    output: OutputSpec,
    pcfg: PipelineConfig,
) -> Result<Pipeline, EngineError> {
    let tail = pcfg.tail(output.shape());
    let backend: Box<dyn Backend> = match (&output, cuda) {
        (OutputSpec::Wideband(o), None) => return Ok(Pipeline::new(o.clone(), pcfg)),
        (OutputSpec::Narrowband(o), None) => {
            let sizes = NarrowbandSizes {
                adc_sample_rate: cfg.adc_sample_rate,
                sample_bits: pcfg.sample_bits,
                body: pcfg.layout.chunk_samples as usize,
                tail,
                spectra_per_heap: pcfg.spectra_per_heap,
                out_bits: pcfg.out_bits,
            };
            let b = NarrowbandBackend::new(o, sizes).map_err(|e| {
                ConfigError::new(
                    "--narrowband",
                    format!(
                        "output {}: DDC filter (ddc_taps={}): {e}",
                        o.name, o.ddc_taps
                    ),
                )
            })?;
            Box::new(b)
        }
        (OutputSpec::Wideband(o), Some(shared)) => {
            let gcfg = gpu_config(&pcfg, tail, Some(o), cfg.use_peerdirect);
            let b = GpuBackend::wideband(&shared.input, o, gcfg)
                .map_err(|e| ConfigError::new("--backend", e))?;
            Box::new(b)
        }
        (OutputSpec::Narrowband(o), Some(shared)) => {
            let gcfg = gpu_config(&pcfg, tail, None, cfg.use_peerdirect);
            let input = shared.input.clone();
            let cache = shared.tuning(cfg);
            let b = GpuBackend::narrowband_on(
                &input,
                o,
                gcfg,
                cfg.adc_sample_rate,
                &mut |gpu, shape| cache.tuning(gpu, shape),
            )
            .map_err(|e| ConfigError::new("--narrowband", format!("output {}: {e}", o.name)))?;
            Box::new(b)
        }
    };
    Ok(Pipeline::with_backend(output, pcfg, backend))
}

/// The CUDA backend's shape for an output of `pcfg`: `wideband`, or narrowband where that is
/// `None`; its heaps sent from device memory where `peer` (`--use-peerdirect`, with more
/// slots: seed 000 §PeerDirect).
fn gpu_config(
    pcfg: &PipelineConfig,
    tail: usize,
    wideband: Option<&WidebandOutput>,
    peer: bool,
) -> GpuConfig {
    let sph = pcfg.spectra_per_heap;
    let chunk = pcfg.layout.chunk_samples as usize;
    let (batch, unzip) = match wideband {
        Some(o) => (
            wideband_batch(sph, o.channels, chunk),
            default_unzip(o.channels),
        ),
        None => (default_batch(sph, false), 1),
    };
    let wideband = wideband.is_some();
    GpuConfig {
        sample_bits: pcfg.sample_bits,
        body: pcfg.layout.chunk_samples as usize,
        tail,
        spectra_per_heap: pcfg.spectra_per_heap,
        out_bits: pcfg.out_bits,
        unzip,
        batch,
        depth: if peer {
            peer_depth(sph, wideband)
        } else {
            default_depth(sph, wideband)
        },
        peer,
    }
}
