//! The XB-engine (seed 001, seed 003): F heaps in, baseline correlation products and coherent
//! beams out, with katgpucbf xbgpu's flags, wire formats, requests, sensors and metrics.
//! [`config`] validates the flags, [`output`] parses `--corrprod` and `--beam`, [`place`] puts
//! F heaps into chunks, [`accum`] schedules correlation and dumps, [`beams`] turns katcp
//! steering into beamformer coefficients, [`backend`] is the compute (CPU now), [`heaps`] the
//! X and beam heaps on the wire, `outputs` their send streams, [`control`] serves katcp, [`metrics`] names the Prometheus
//! counters, and [`engine`] wires them to the shared receive and send threads.

pub mod accum;
pub mod backend;
pub mod beams;
pub mod config;
pub mod control;
pub mod cuda;
pub mod engine;
pub mod heaps;
pub mod metrics;
pub mod output;
mod outputs;
pub mod place;

pub use config::XbengineConfig;
pub use engine::{Engine, XbengineReport};
