//! Value checks of an array description, before anything is placed: each error names the key
//! at fault as a path (`bands[0].channels`, `nodes[2].nics[0].speed_gbps`). The rules are the
//! engines' own (facts §1.3, §1.4) stated in the description's terms, so a description that
//! passes gives command lines the engines accept; `cbf array plan` still runs every generated
//! command line through the engines' parsers and validators.
#![deny(unsafe_code)]

use std::net::Ipv4Addr;

use super::config::{parse_cpu_list, ArrayConfig, Band, Node};
use super::rates::pcie_bytes_per_s;
use super::ArrayError;
use crate::dsp::samples::valid_sample_bits;
use crate::engine::SAMPLE_RATE_RANGE;

/// The largest `bands[].recv_chunk_samples`: 2^30 samples keeps a 16-bit chunk of both
/// polarisations within the F-engine's `MAX_CHUNK_BYTES` (8 GiB), with its tail.
pub const MAX_RECV_CHUNK_SAMPLES: usize = 1 << 30;
/// Samples per digitiser heap (`--recv-packet-samples`, which the plan keeps at fengine's
/// default): a chunk is made of whole heaps.
const HEAP_SAMPLES: usize = 4096;
/// fengine's largest output (`fengine::output::MAX_CHANNELS`) and PFB length.
const MAX_CHANNELS: usize = crate::fengine::output::MAX_CHANNELS;
const MAX_TAPS: usize = crate::fengine::output::MAX_TAPS;
/// Name lengths that keep `cbf-<array>-<band>-dsim-<antenna>` within the 52 characters of a
/// Kubernetes StatefulSet name (its pods' revision label adds 11).
const MAX_ARRAY_NAME: usize = 16;
const MAX_BAND_NAME: usize = 8;
const MAX_ANTENNA_NAME: usize = 16;

/// What a band's checked values give every engine of the band.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BandShape {
    /// Channels per XB-engine (`--channels-per-substream`).
    pub cps: usize,
    pub spectra_per_heap: usize,
    /// ADC samples between spectra: 2 × channels (a critically sampled wideband PFB).
    pub samples_between_spectra: u64,
    /// Batches per dump (`heap_accumulation_threshold`), nearest to `int_time`.
    pub heap_accumulation_threshold: u64,
    /// The dump time that threshold gives, seconds.
    pub dump_seconds: f64,
}

/// A node's checked hardware: cores per NUMA node, and each GPU's PCIe bandwidth (bytes/s).
#[derive(Debug, Clone)]
pub struct NodeShape {
    pub cores: Vec<Vec<usize>>,
    pub pcie_bytes_per_s: Vec<f64>,
}

fn err(key: impl Into<String>, m: impl std::fmt::Display) -> ArrayError {
    ArrayError::config(key, m)
}

/// Lower-case letters, digits and inner '-', at most `max` long: safe in unit file names,
/// Kubernetes object names and labels.
fn check_name(key: String, name: &str, max: usize) -> Result<(), ArrayError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(err(
            key,
            format!("{name:?}: 1 to {max} lower-case letters, digits and inner '-'"),
        ))
    }
}

/// Output names become katcp sensor names and metric labels (as `xbengine::output` requires).
fn check_output_name(key: String, name: &str) -> Result<(), ArrayError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(err(
            key,
            format!("{name:?}: letters, digits, '_', '-' and '.' only"),
        ))
    }
}

/// Check the `[array]`, `[network]`, `[dsim]` sections and the antennas.
pub fn check_array(cfg: &ArrayConfig) -> Result<(), ArrayError> {
    check_name("array.name".into(), &cfg.array.name, MAX_ARRAY_NAME)?;
    if !(cfg.array.sync_time.is_finite() && cfg.array.sync_time >= 0.0) {
        return Err(err("array.sync_time", "must be a UNIX time in seconds"));
    }
    if !cfg.array.binary.starts_with('/') {
        return Err(err("array.binary", "must be an absolute path"));
    }
    let net = &cfg.network;
    if net.port == 0 {
        return Err(err("network.port", "must be a port number, not 0"));
    }
    if net.digitiser_groups_per_pol == 0 {
        return Err(err("network.digitiser_groups_per_pol", "must be positive"));
    }
    if cfg.dsim.cores == 0 {
        return Err(err("dsim.cores", "a dsim needs a core per send thread"));
    }
    let max = crate::xbengine::config::MAX_ANTENNAS;
    if cfg.antennas.is_empty() || cfg.antennas.len() > max {
        return Err(err("antennas", format!("an array has 1 to {max} antennas")));
    }
    for (i, a) in cfg.antennas.iter().enumerate() {
        check_name(format!("antennas[{i}].name"), &a.name, MAX_ANTENNA_NAME)?;
        if cfg.antennas[..i].iter().any(|b| b.name == a.name) {
            return Err(err(
                format!("antennas[{i}].name"),
                format!("{:?} used twice", a.name),
            ));
        }
        for (band, streams) in &a.digitiser {
            let key = format!("antennas[{i}].digitiser.{band}");
            if !cfg.bands.iter().any(|b| &b.name == band) {
                return Err(err(key, "no band has this name"));
            }
            if streams.len() != 2 {
                return Err(err(key, "give one endpoint list per polarisation (two)"));
            }
            for s in streams {
                crate::net::parse_endpoints(s).map_err(|e| err(key.clone(), e))?;
            }
        }
    }
    Ok(())
}

/// Check one band; its shape.
pub fn check_band(i: usize, b: &Band, bands: &[Band]) -> Result<BandShape, ArrayError> {
    let key = |k: &str| format!("bands[{i}].{k}");
    check_name(key("name"), &b.name, MAX_BAND_NAME)?;
    if bands[..i].iter().any(|o| o.name == b.name) {
        return Err(err(key("name"), format!("{:?} used twice", b.name)));
    }
    if !SAMPLE_RATE_RANGE.contains(&b.adc_sample_rate) {
        return Err(err(key("adc_sample_rate"), "must be 1 Hz to 1 THz"));
    }
    if !(b.centre_frequency.is_finite() && b.centre_frequency > 0.0) {
        return Err(err(
            key("centre_frequency"),
            "must be a positive number of Hz",
        ));
    }
    if !valid_sample_bits(b.dig_sample_bits) {
        return Err(err(key("dig_sample_bits"), "must be 2–10, 12 or 16"));
    }
    let ch = b.channels;
    if ch < 2 || !ch.is_power_of_two() || ch > MAX_CHANNELS {
        return Err(err(
            key("channels"),
            format!("{ch}: the F-engine's PFB needs a power of two from 2 to {MAX_CHANNELS}"),
        ));
    }
    if b.x_engines == 0 || ch % b.x_engines != 0 {
        return Err(err(
            key("x_engines"),
            format!(
                "{} does not divide channels = {ch}: each XB-engine takes an equal channel range",
                b.x_engines
            ),
        ));
    }
    let chunk = b.recv_chunk_samples;
    if chunk == 0 || chunk > MAX_RECV_CHUNK_SAMPLES || chunk % HEAP_SAMPLES != 0 {
        return Err(err(
            key("recv_chunk_samples"),
            format!(
                "{chunk} must be a multiple of the {HEAP_SAMPLES}-sample digitiser heap, at most {MAX_RECV_CHUNK_SAMPLES}"
            ),
        ));
    }
    let jpb = b.jones_per_batch;
    // jpb is bounded before it is doubled.
    if jpb < ch || jpb % ch != 0 || jpb > chunk / 2 || chunk % (2 * jpb) != 0 {
        return Err(err(
            key("jones_per_batch"),
            format!(
                "{jpb} must be a multiple of channels = {ch} whose heap span (2 × {jpb} samples) divides the F-engine's {chunk}-sample input chunks (recv_chunk_samples)"
            ),
        ));
    }
    if b.taps == 0 || b.taps > MAX_TAPS {
        return Err(err(key("taps"), format!("must be 1 to {MAX_TAPS}")));
    }
    // The chunk carries the PFB's footprint and the delay allowance as its tail
    // (`fengine::pipeline::tail_samples`, rounded up to whole heaps).
    let footprint = (b.taps * 2 * ch)
        .checked_add(b.max_delay_diff)
        .map(|t| t.div_ceil(HEAP_SAMPLES) * HEAP_SAMPLES);
    if footprint.is_none_or(|t| t > chunk) {
        return Err(err(
            key("max_delay_diff"),
            format!(
                "{} with the PFB footprint (taps × 2 × channels = {}) exceeds recv_chunk_samples = {chunk}",
                b.max_delay_diff,
                b.taps * 2 * ch
            ),
        ));
    }
    if b.fengine_cores == 0 || b.xengine_cores == 0 {
        let k = if b.fengine_cores == 0 {
            "fengine_cores"
        } else {
            "xengine_cores"
        };
        return Err(err(key(k), "an engine needs at least one core"));
    }
    if b.fengine_memory_gib == 0 || b.xengine_memory_gib == 0 {
        let k = if b.fengine_memory_gib == 0 {
            "fengine_memory_gib"
        } else {
            "xengine_memory_gib"
        };
        return Err(err(key(k), "must be positive"));
    }
    check_output_name(key("wideband"), &b.wideband)?;
    check_output_name(key("corrprod"), &b.corrprod)?;
    for (j, beam) in b.beams.iter().enumerate() {
        let bk = |k: &str| format!("bands[{i}].beams[{j}].{k}");
        check_output_name(bk("name"), &beam.name)?;
        if beam.name == b.corrprod || b.beams[..j].iter().any(|o| o.name == beam.name) {
            return Err(err(
                bk("name"),
                format!("{:?} names another output of the XB-engines", beam.name),
            ));
        }
        if beam.pol > 1 {
            return Err(err(bk("pol"), "must be 0 or 1"));
        }
    }
    let spectra_per_heap = jpb / ch;
    let samples_between_spectra = 2 * ch as u64;
    let batch_seconds =
        (spectra_per_heap as u64 * samples_between_spectra) as f64 / b.adc_sample_rate;
    let threshold = (b.int_time / batch_seconds).round();
    if !(b.int_time.is_finite() && (1.0..=1e9).contains(&threshold)) {
        return Err(err(
            key("int_time"),
            format!("must be 1 to 10^9 batches of {batch_seconds:.6} s"),
        ));
    }
    Ok(BandShape {
        cps: ch / b.x_engines,
        spectra_per_heap,
        samples_between_spectra,
        heap_accumulation_threshold: threshold as u64,
        dump_seconds: threshold * batch_seconds,
    })
}

/// Check one node's hardware: names, NUMA indices, cores (no core on two NUMA nodes, so no
/// two engines can be given the same one), NIC addresses and speeds, GPUs and their links.
pub fn check_node(i: usize, n: &Node, nodes: &[Node]) -> Result<NodeShape, ArrayError> {
    let key = |k: &str| format!("nodes[{i}].{k}");
    if n.hostname.is_empty() || n.hostname.contains(char::is_whitespace) {
        return Err(err(key("hostname"), "must be a host name"));
    }
    if nodes[..i].iter().any(|o| o.hostname == n.hostname) {
        return Err(err(key("hostname"), format!("{:?} used twice", n.hostname)));
    }
    if n.numa.is_empty() {
        return Err(err(
            key("numa"),
            "list the node's NUMA nodes and their cores (or give `hardware`)",
        ));
    }
    let mut cores: Vec<Vec<usize>> = Vec::new();
    for (j, numa) in n.numa.iter().enumerate() {
        let k = format!("nodes[{i}].numa[{j}].cores");
        let list = parse_cpu_list(&numa.cores).map_err(|e| err(k.clone(), e))?;
        for (m, other) in cores.iter().enumerate() {
            if let Some(c) = list.iter().find(|c| other.contains(c)) {
                return Err(err(k, format!("core {c} is also on numa[{m}]")));
            }
        }
        cores.push(list);
    }
    if n.nics.is_empty() {
        return Err(err(key("nics"), "a node needs a NIC"));
    }
    for (j, nic) in n.nics.iter().enumerate() {
        let k = |f: &str| format!("nodes[{i}].nics[{j}].{f}");
        if nic.name.is_empty() {
            return Err(err(k("name"), "must be the interface name"));
        }
        if nic.address.parse::<Ipv4Addr>().is_err() {
            return Err(err(
                k("address"),
                format!("{:?} is not an IPv4 address", nic.address),
            ));
        }
        if !(nic.speed_gbps.is_finite() && nic.speed_gbps > 0.0) {
            return Err(err(k("speed_gbps"), "must be a positive number of Gb/s"));
        }
        if nic.numa >= n.numa.len() {
            return Err(err(
                k("numa"),
                format!("the node has {} NUMA nodes", n.numa.len()),
            ));
        }
    }
    let mut pcie = Vec::new();
    for (j, gpu) in n.gpus.iter().enumerate() {
        let k = |f: &str| format!("nodes[{i}].gpus[{j}].{f}");
        if n.gpus[..j].iter().any(|o| o.index == gpu.index) {
            return Err(err(k("index"), format!("GPU {} listed twice", gpu.index)));
        }
        if gpu.numa >= n.numa.len() {
            return Err(err(
                k("numa"),
                format!("the node has {} NUMA nodes", n.numa.len()),
            ));
        }
        if !n.nics.iter().any(|nic| nic.numa == gpu.numa) {
            return Err(err(
                k("numa"),
                format!(
                    "no NIC on NUMA node {}: the GPU's engines would cross the inter-socket link",
                    gpu.numa
                ),
            ));
        }
        if gpu.engines == 0 {
            return Err(err(k("engines"), "must be at least 1"));
        }
        let bytes = match gpu.pcie_gbytes_per_s {
            Some(g) if g.is_finite() && g > 0.0 => g * 1e9,
            Some(_) => return Err(err(k("pcie_gbytes_per_s"), "must be positive")),
            None if ![1, 2, 4, 8, 16, 32].contains(&gpu.pcie_width) => {
                return Err(err(k("pcie_width"), "must be 1, 2, 4, 8, 16 or 32 lanes"))
            }
            None => pcie_bytes_per_s(gpu.pcie_gen, gpu.pcie_width)
                .ok_or_else(|| err(k("pcie_gen"), "must be 1 to 6"))?,
        };
        pcie.push(bytes);
    }
    Ok(NodeShape {
        cores,
        pcie_bytes_per_s: pcie,
    })
}
