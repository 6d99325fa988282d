//! A node's hardware from `cbf affinity --json` run on it (`[[nodes]] hardware = "FILE"`), in
//! place of `numa`, `nics` and `gpus` written by hand: NUMA node j's cores are its physical
//! cores (first hardware thread of each, SMT siblings left out as `cbf affinity` leaves them),
//! the GPUs with their CUDA numbers, NUMA nodes and PCIe bandwidth, the data NICs (a management
//! port is left out by `cbf affinity`'s rule) with the IPv4 address and speed the node reported.
#![deny(unsafe_code)]

use std::path::Path;

use serde::Deserialize;

use super::config::{ArrayConfig, Gpu, Nic, Node, Numa};
use super::ArrayError;
use crate::affinity::host::{Host, PciPlace};
use crate::affinity::plan::data_nics;
use crate::engine::affinity::ranges;

/// Largest hardware file read: `cbf affinity --json` of a large host is tens of KiB.
pub const MAX_HARDWARE_BYTES: u64 = 4 << 20;

/// The part of `cbf affinity --json` read here.
#[derive(Deserialize)]
struct Report {
    host: Host,
}

/// Fill every node that names a hardware file (a path relative to `base`, the description's
/// directory) from it. Errors name `nodes[i].hardware`.
pub fn resolve(cfg: &mut ArrayConfig, base: &Path) -> Result<(), ArrayError> {
    for (i, node) in cfg.nodes.iter_mut().enumerate() {
        let Some(file) = node.hardware.clone() else {
            continue;
        };
        let key = format!("nodes[{i}].hardware");
        if !(node.numa.is_empty() && node.nics.is_empty() && node.gpus.is_empty()) {
            return Err(ArrayError::config(
                key,
                "give numa, nics and gpus either by hand or from the file, not both",
            ));
        }
        let host = read(&base.join(&file)).map_err(|e| ArrayError::config(&key, e))?;
        fill(node, &host).map_err(|e| ArrayError::config(&key, format!("{file}: {e}")))?;
    }
    Ok(())
}

/// The host model in a `cbf affinity --json` file.
fn read(path: &Path) -> Result<Host, String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let len = std::fs::metadata(path).map_err(|e| err(&e))?.len();
    if len > MAX_HARDWARE_BYTES {
        return Err(err(&format!(
            "larger than {} MiB, which no `cbf affinity --json` is",
            MAX_HARDWARE_BYTES >> 20
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(&e))?;
    serde_json::from_str::<Report>(&text)
        .map(|r| r.host)
        .map_err(|e| err(&e))
}

/// The position in `numa` of a device's first NUMA node.
fn numa_of(what: &str, p: &PciPlace, nodes: &[usize]) -> Result<usize, String> {
    p.numa
        .first()
        .and_then(|n| nodes.iter().position(|m| m == n))
        .ok_or_else(|| format!("{what} ({}) has no known NUMA node", p.bus_id))
}

/// Set `node`'s `numa`, `nics` and `gpus` to `host`'s.
fn fill(node: &mut Node, host: &Host) -> Result<(), String> {
    let nodes: Vec<usize> = host.numa_nodes.iter().map(|n| n.os_index).collect();
    if let Some((j, n)) = nodes.iter().enumerate().find(|(j, n)| *j != **n) {
        return Err(format!(
            "NUMA node {n} is the {j}-th: the description numbers nodes as the kernel does"
        ));
    }
    node.numa = host
        .numa_nodes
        .iter()
        .map(|n| {
            let mut cores: Vec<usize> = n.cores.iter().filter_map(|c| c.first().copied()).collect();
            cores.sort_unstable();
            Numa {
                cores: ranges(&cores),
            }
        })
        .collect();
    node.nics = data_nics(host)
        .into_iter()
        .map(|k| {
            let n = &host.nics[k];
            let missing = |what: &str| {
                format!(
                    "NIC {} has no {what}: run `cbf affinity --json` on the node itself, with \
                     the link up",
                    n.interface
                )
            };
            Ok(Nic {
                name: n.interface.clone(),
                address: n.address.clone().ok_or_else(|| missing("IPv4 address"))?,
                speed_gbps: n.speed_gbps.ok_or_else(|| missing("link speed"))?,
                numa: numa_of(&format!("NIC {}", n.interface), &n.pci, &nodes)?,
                rdma_resource: None,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    node.gpus = host
        .gpus
        .iter()
        .map(|g| {
            Ok(Gpu {
                index: g.index,
                numa: numa_of(&format!("GPU {}", g.index), &g.pci, &nodes)?,
                pcie_gen: 4,
                pcie_width: 16,
                pcie_gbytes_per_s: g.pci.link_gbytes_per_s,
                engines: 1,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(())
}
