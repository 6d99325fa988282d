//! The F-engine (seed 000): digitiser heaps in, channelised F heaps out, wideband and
//! narrowband. [`config`] validates fgpu's flags, [`place`] puts digitiser heaps into chunks,
//! [`output`] parses `--wideband` and [`narrowband_output`] `--narrowband`, [`pipeline`] turns
//! chunks into output heaps on a [`backend`] (CPU or CUDA, wideband or narrowband; [`narrowband`]
//! is the CPU narrowband one, [`cuda`] the CUDA one of either kind, whose outputs share one
//! upload of each chunk through [`cuda_input`]), [`heaps`] builds the F heaps on the wire,
//! [`control`] serves katcp, [`metrics`] names the Prometheus counters, and [`engine`] wires
//! them to the shared receive and send threads, every output reading the same received chunks.

pub mod backend;
pub mod config;
pub mod control;
pub mod cuda;
mod cuda_back;
mod cuda_front;
pub mod cuda_input;
pub mod cuda_shape;
mod cuda_slot;
pub mod engine;
pub mod heaps;
pub mod metrics;
pub mod narrowband;
pub mod narrowband_output;
mod out_ring;
pub mod output;
mod peerdirect;
pub mod pipeline;
mod pipelines;
pub mod place;
mod vkgdr;

pub use config::{BackendKind, FengineConfig};
pub use engine::{Engine, FengineReport};
