//! `cbf selftest --gpu`: every GPU operation against its `src/dsp` oracle on fresh random
//! inputs, one module per engine or op family. It sits above both `gpu` and the engines (it
//! drives an engine's CUDA backend beside its CPU backend), so `gpu` itself knows no engine.

pub mod backends;
pub mod beamform;
pub mod correlate;
pub mod ddc;
pub mod fengine;
pub mod frb;
pub mod narrowband;
pub mod outputs;
pub mod xbengine;
pub mod xbengine_frb;

use std::sync::Arc;

use crate::gpu::{Gpu, GpuError};

/// One line of the report.
pub struct Check {
    pub name: String,
    pub measured: f64,
    pub limit: f64,
    pub pass: bool,
    pub note: String,
}

/// Run every check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut checks = fengine::run(gpu, seed)?;
    checks.extend(ddc::run(gpu, seed)?);
    checks.extend(narrowband::run(gpu, seed)?);
    checks.extend(outputs::run(gpu, seed)?);
    checks.extend(correlate::run(gpu, seed)?);
    checks.extend(beamform::run(gpu, seed)?);
    checks.extend(frb::run(gpu, seed)?);
    checks.extend(xbengine::run(gpu, seed)?);
    checks.extend(xbengine_frb::run(gpu, seed)?);
    Ok(checks)
}
