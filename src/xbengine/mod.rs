//! The XB-engine (seed 001, seed 003, seed 004): F heaps in, baseline correlation products,
//! coherent beams and FFT ("FRB") beam intensities out, with katgpucbf xbgpu's flags, wire
//! formats, requests, sensors and metrics. [`config`] validates the flags, [`output`] parses
//! `--corrprod` and `--beam`, [`frb_output`] `--frb-beam` ([`frb_weights`] its `?frb-weights`,
//! [`frb_pointing`] its `?frb-beams`), [`place`] puts F heaps into chunks,
//! [`accum`] schedules correlation and dumps, [`beams`] turns katcp steering into beamformer
//! coefficients, [`backend`] is the compute ([`cuda`] and [`cuda_frb`] its GPU side), [`heaps`] the X, beam and FRB heaps on the wire,
//! `outputs` and `frb` their send streams, [`control`] serves katcp (`control_frb` the FRB
//! outputs' part), [`metrics`] names the
//! Prometheus counters, and [`engine`] wires them to the shared receive and send threads.

pub mod accum;
pub mod backend;
pub mod beams;
pub mod config;
pub mod control;
mod control_frb;
pub mod cuda;
pub mod cuda_frb;
pub mod engine;
mod frb;
pub mod frb_output;
pub mod frb_pointing;
pub mod frb_weights;
pub mod heaps;
pub mod metrics;
pub mod output;
mod outputs;
pub mod place;

pub use config::XbengineConfig;
pub use engine::{Engine, XbengineReport};
