//! The array description `cbf array` reads (TOML or YAML, one schema): the array's identity
//! and sync time, the network's multicast prefix and port bases, the bands (one channelised
//! product each: its digitiser rate, channels, X-engine count, outputs), the antennas, and the
//! nodes with their NUMA nodes, NICs and GPUs.
//!
//! Every table refuses unknown keys (`deny_unknown_fields`), so a misspelt key is an error
//! naming it rather than a default silently taken. Values are checked later, in
//! [`super::plan`], where each error names its key as a path (`bands[0].channels`).
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole description.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayConfig {
    pub array: ArraySection,
    pub network: NetworkSection,
    #[serde(default)]
    pub dsim: DsimSection,
    pub bands: Vec<Band>,
    pub antennas: Vec<Antenna>,
    pub nodes: Vec<Node>,
}

/// `[array]`: names, time and what runs.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArraySection {
    /// Lower-case letters, digits and '-': it prefixes every unit and workload name.
    pub name: String,
    /// UNIX time of timestamp 0 (the digitisers' sync time), given to every engine, which
    /// takes its `?delays` start times against it (katgpucbf requires it: facts §1.2).
    pub sync_time: f64,
    /// Compute backend of the F- and XB-engines.
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// Path of the `cbf` binary on the nodes (and in the container image).
    #[serde(default = "default_binary")]
    pub binary: String,
    /// Container image for `render --kubernetes`.
    #[serde(default = "default_image")]
    pub image: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Cuda,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// `[network]`: the multicast prefix every group is allocated from, the data port, and the
/// bases of the per-node control ports.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// An administratively scoped prefix such as `239.10.0.0/16`.
    pub multicast: String,
    /// UDP port of every stream (katgpucbf's 7148).
    #[serde(default = "default_data_port")]
    pub port: u16,
    /// Groups per polarisation of an allocated digitiser stream (MeerKAT uses 8: facts §1.9).
    #[serde(default = "default_digitiser_groups")]
    pub digitiser_groups_per_pol: u32,
    /// The k-th engine on a node listens for katcp on this + k.
    #[serde(default = "default_katcp_base")]
    pub katcp_port_base: u16,
    /// The k-th engine on a node serves Prometheus metrics on this + k.
    #[serde(default = "default_prometheus_base")]
    pub prometheus_port_base: u16,
    /// Multicast TTL of every sender.
    #[serde(default = "default_ttl")]
    pub ttl: u32,
}

/// `[dsim]`: digitiser simulators standing in for the antennas (a test array).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DsimSection {
    #[serde(default)]
    pub enabled: bool,
    /// Signal program of every dsim (`cbf dsim --signals`) [default: dsim's].
    pub signals: Option<String>,
    /// Cores per dsim: one send thread each (a thread sends about 25 Gb/s).
    #[serde(default = "default_dsim_cores")]
    pub cores: usize,
    /// Samples of the pattern each dsim renders and replays (`cbf dsim --max-period`, which
    /// is also the memory it sets aside); a tone is rounded to whole cycles per period
    /// [default: dsim's 2^27].
    pub period: Option<usize>,
}

impl Default for DsimSection {
    fn default() -> Self {
        DsimSection {
            enabled: false,
            signals: None,
            cores: default_dsim_cores(),
            period: None,
        }
    }
}

/// `[[bands]]`: one channelised product: every antenna's digitiser stream of this band goes
/// through one F-engine per antenna into `x_engines` XB-engines.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Band {
    /// Lower-case letters and digits (`l`, `u`, `s0`): part of each engine's name.
    pub name: String,
    pub adc_sample_rate: f64,
    /// Sky frequency at the band's centre, Hz. No engine takes it (katgpucbf's engines do
    /// not either); it is in the plan for the product's metadata.
    pub centre_frequency: f64,
    #[serde(default = "default_dig_bits")]
    pub dig_sample_bits: u32,
    pub channels: usize,
    pub x_engines: usize,
    /// The F-engines' output groups, one per XB-engine in channel order, as one range
    /// `A.B.C.D+N:port`, when the network's multicast plan fixes them [default: allocated from
    /// `network.multicast`].
    pub fx_dst: Option<String>,
    #[serde(default = "default_jones_per_batch")]
    pub jones_per_batch: usize,
    #[serde(default = "default_taps")]
    pub taps: usize,
    /// The F-engines' input chunk, samples per polarisation (`--recv-chunk-samples`): small
    /// for a slow test band, whose 2^25-sample chunks would take seconds to fill.
    #[serde(default = "default_recv_chunk_samples")]
    pub recv_chunk_samples: usize,
    /// Largest coarse-delay difference between polarisations the F-engines allow for
    /// (`--max-delay-diff`, samples); with the PFB footprint it must fit a chunk.
    #[serde(default = "default_max_delay_diff")]
    pub max_delay_diff: usize,
    #[serde(default = "default_dither")]
    pub dither: Dither,
    /// Target accumulation (dump) time in seconds; the nearest whole number of batches is used.
    #[serde(default = "default_int_time")]
    pub int_time: f64,
    /// Name of the F-engines' `--wideband` output.
    #[serde(default = "default_wideband")]
    pub wideband: String,
    /// Name of the XB-engines' `--corrprod` output.
    #[serde(default = "default_corrprod")]
    pub corrprod: String,
    #[serde(default)]
    pub beams: Vec<Beam>,
    /// Cores per F-engine and per XB-engine (NUMA-local to their NIC and GPU).
    #[serde(default = "default_engine_cores")]
    pub fengine_cores: usize,
    #[serde(default = "default_engine_cores")]
    pub xengine_cores: usize,
    /// Memory per engine in GiB (the Kubernetes request and limit).
    #[serde(default = "default_memory_gib")]
    pub fengine_memory_gib: u32,
    #[serde(default = "default_memory_gib")]
    pub xengine_memory_gib: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dither {
    Uniform,
    None,
}

impl Dither {
    pub fn as_str(self) -> &'static str {
        match self {
            Dither::Uniform => "uniform",
            Dither::None => "none",
        }
    }
}

/// `[[bands.beams]]`: a single-polarisation tied-array beam (katgpucbf's `--beam`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Beam {
    pub name: String,
    pub pol: usize,
    #[serde(default = "default_dither")]
    pub dither: Dither,
}

/// `[[antennas]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Antenna {
    /// Lower-case letters and digits (`m000`).
    pub name: String,
    /// Digitiser streams by band name: one endpoint list per polarisation
    /// (`l = ["239.102.0.0+7:7148", "239.102.0.8+7:7148"]`). A band not listed gets groups
    /// allocated from `network.multicast`.
    #[serde(default)]
    pub digitiser: BTreeMap<String, Vec<String>>,
}

/// `[[nodes]]`: a host, the roles it takes, and its hardware.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub hostname: String,
    pub roles: Vec<Role>,
    /// Engines this node runs without a GPU (dsims always; F- and XB-engines with
    /// `array.backend = "cpu"`), dealt in turn to its NICs.
    #[serde(default)]
    pub cpu_engines: usize,
    /// `cbf affinity --json` run on the node (a path relative to the description): its
    /// `numa`, `nics` and `gpus` come from there instead ([`super::hardware`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<String>,
    #[serde(default)]
    pub numa: Vec<Numa>,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Dsim,
    Fengine,
    Xbengine,
}

/// `[[nodes.numa]]`: a NUMA node and the cores on it that cbf may use (leave the operating
/// system's housekeeping cores out). The j-th entry is the kernel's NUMA node j: the units
/// bind memory to it by that number (`NUMAMask=j`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Numa {
    /// A Linux CPU list: `0-15,32-47`.
    pub cores: String,
}

/// `[[nodes.nics]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    pub name: String,
    /// IPv4 address: the engines' `--recv-interface`/`--send-interface`.
    pub address: String,
    pub speed_gbps: f64,
    /// Index into this node's `numa`.
    pub numa: usize,
    /// Kubernetes device-plugin resource of the NIC's RDMA device (e.g.
    /// `rdma/hca_shared_devices_a`), requested by each engine on it when given.
    pub rdma_resource: Option<String>,
}

/// `[[nodes.gpus]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// CUDA device index in PCI bus order (`nvidia-smi`'s).
    pub index: usize,
    /// Index into this node's `numa`.
    pub numa: usize,
    /// PCIe generation and lanes, or `pcie_gbytes_per_s` (per direction) when known better.
    #[serde(default = "default_pcie_gen")]
    pub pcie_gen: u32,
    #[serde(default = "default_pcie_width")]
    pub pcie_width: u32,
    pub pcie_gbytes_per_s: Option<f64>,
    /// Engines sharing this GPU.
    #[serde(default = "default_gpu_engines")]
    pub engines: usize,
}

fn default_backend() -> Backend {
    Backend::Cuda
}
fn default_binary() -> String {
    "/usr/local/bin/cbf".into()
}
fn default_image() -> String {
    "cbf:latest".into()
}
fn default_data_port() -> u16 {
    7148
}
fn default_digitiser_groups() -> u32 {
    8
}
fn default_katcp_base() -> u16 {
    7200
}
fn default_prometheus_base() -> u16 {
    9200
}
fn default_ttl() -> u32 {
    4
}
fn default_dsim_cores() -> usize {
    2
}
fn default_dig_bits() -> u32 {
    10
}
fn default_jones_per_batch() -> usize {
    1 << 20
}
fn default_taps() -> usize {
    16
}
fn default_recv_chunk_samples() -> usize {
    1 << 25
}
fn default_max_delay_diff() -> usize {
    1 << 20
}
fn default_dither() -> Dither {
    Dither::Uniform
}
fn default_int_time() -> f64 {
    0.5
}
fn default_wideband() -> String {
    "antenna-channelised-voltage".into()
}
fn default_corrprod() -> String {
    "baseline-correlation-products".into()
}
fn default_engine_cores() -> usize {
    2
}
fn default_memory_gib() -> u32 {
    8
}
fn default_pcie_gen() -> u32 {
    4
}
fn default_pcie_width() -> u32 {
    16
}
fn default_gpu_engines() -> usize {
    1
}

/// Parse a Linux CPU list (`0-3,8,10-11`); `Err` says what is wrong.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .ok()
                .filter(|&c| c <= crate::engine::affinity::MAX_CORE)
                .ok_or_else(|| format!("{s:?} is not a core number"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if hi < lo {
            return Err(format!("{part:?} runs backwards"));
        }
        for c in lo..=hi {
            if out.contains(&c) {
                return Err(format!("core {c} listed twice"));
            }
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11"),
            Ok(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Ok(vec![5]));
        for bad in ["", "3-1", "a", "1,1", "0-2,2", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }
}
