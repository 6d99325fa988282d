//! `cbf selftest --gpu`: every GPU operation against its `src/dsp` oracle on fresh random
//! inputs, one module per engine or op family. It sits above both `gpu` and the engines (it
//! drives an engine's CUDA backend beside its CPU backend), so `gpu` itself knows no engine.

pub mod backends;
pub mod beamform;
pub mod chunk_mapping;
pub mod correlate;
pub mod ddc;
pub mod f16_encode;
pub mod fengine;
pub mod fengine_case;
pub mod frb;
pub mod frb_weights;
pub mod narrowband;
pub mod outputs;
pub mod peerdirect;
pub mod vkgdr;
pub mod xbengine;
pub mod xbengine_frb;

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::gpu::{Gpu, GpuError};

/// One line of the report.
pub struct Check {
    pub name: String,
    pub measured: f64,
    pub limit: f64,
    pub pass: bool,
    pub note: String,
}

/// A family of checks: its name and its runner.
type Family = (
    &'static str,
    fn(&Arc<Gpu>, u64) -> Result<Vec<Check>, GpuError>,
);

const FAMILIES: [Family; 14] = [
    ("fengine", fengine::run),
    ("chunk_mapping", chunk_mapping::run),
    ("ddc", ddc::run),
    ("narrowband", narrowband::run),
    ("outputs", outputs::run),
    ("correlate", correlate::run),
    ("beamform", beamform::run),
    ("frb", frb::run),
    ("frb_weights", frb_weights::run),
    ("f16_encode", f16_encode::run),
    ("xbengine", xbengine::run),
    ("xbengine_frb", xbengine_frb::run),
    ("peerdirect", peerdirect::run),
    // Last: a device without vkgdr stops this family with the reason, after every other
    // family has run: a failed check, or unavailable where the device has no BAR window to
    // offer (`run`).
    ("vkgdr", vkgdr::run),
];

/// What the self-test found: every check, and the families this device cannot run at all,
/// each with the reason (neither passed nor failed, and not counted).
pub struct Report {
    pub checks: Vec<Check>,
    pub unavailable: Vec<(&'static str, String)>,
}

const MIB: usize = 1 << 20;

/// `n` random bytes: the memory families' payloads (host and device memory compared byte for
/// byte).
fn random_bytes(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

/// The families' names, in the order they run.
pub fn family_names() -> Vec<&'static str> {
    FAMILIES.iter().map(|(name, _)| *name).collect()
}

/// Run every check on `gpu` with inputs drawn from `seed`. A family whose run fails with an
/// error (a CUDA call refused, a kernel that does not build) is reported as one failed check
/// naming the family and the error, and the families after it still run (an error that leaves
/// the context unusable fails them too, each saying so). The one exception is a device that
/// lacks a feature outright, as Vulkan itself reports it (vkgdr: no BAR window in its Vulkan
/// memory, or too small a one, [`crate::gpu::vkgdr::VkgdrError::device_lacks_it`]): that
/// family is listed as unavailable. A failure on the way to asking the device is still a
/// failure. With `only` non-empty, only the families it names run.
pub fn run(gpu: &Arc<Gpu>, seed: u64, only: &[String]) -> Report {
    let mut checks = Vec::new();
    let mut unavailable = Vec::new();
    for (name, family) in FAMILIES {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        match family(gpu, seed) {
            Ok(c) => checks.extend(c),
            Err(GpuError::Vkgdr(e)) if e.device_lacks_it() => {
                unavailable.push((name, e.to_string()))
            }
            Err(e) => checks.push(Check {
                name: format!("{name}: did not run"),
                measured: f64::NAN,
                limit: f64::NAN,
                pass: false,
                note: e.to_string(),
            }),
        }
    }
    Report {
        checks,
        unavailable,
    }
}
