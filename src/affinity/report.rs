//! `cbf affinity`'s output: the host as the planner saw it, each engine's place with the exact
//! flags that put it there, and the warnings; as text for a person or JSON for tools (and for
//! `cbf array plan`, which can read it as a node's hardware).
#![deny(unsafe_code)]

use std::fmt::Write;

use serde::Serialize;

use super::host::{Host, PciPlace};
use super::plan::{Placement, Warning};
use crate::engine::affinity::{list, ranges};

/// The JSON document.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub host: &'a Host,
    pub engines: &'a [super::plan::EnginePlan],
    pub warnings: Vec<WarningEntry<'a>>,
}

/// A warning with its sentence.
#[derive(Debug, Serialize)]
pub struct WarningEntry<'a> {
    #[serde(flatten)]
    pub warning: &'a Warning,
    pub message: String,
}

/// `host` and `placement` as pretty-printed JSON.
pub fn json(host: &Host, placement: &Placement) -> String {
    let report = Report {
        host,
        engines: &placement.engines,
        warnings: placement
            .warnings
            .iter()
            .map(|w| WarningEntry {
                warning: w,
                message: w.to_string(),
            })
            .collect(),
    };
    // Cannot fail: plain structs of strings and numbers.
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

/// Where a device sits, in words.
fn place(p: &PciPlace) -> String {
    let numa = if p.numa.is_empty() {
        "NUMA unknown".to_string()
    } else {
        format!("NUMA {}", ranges(&p.numa))
    };
    let root = p.root.as_deref().unwrap_or("unknown");
    let mut s = format!("{}, {numa}, root complex {root}", p.bus_id);
    if let Some(gb) = p.link_gbytes_per_s {
        let _ = write!(s, ", link {gb:.1} GB/s");
    }
    s
}

/// `host` and `placement` as text.
pub fn text(host: &Host, placement: &Placement) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "host {}: {} NUMA nodes, {} cores, {} hardware threads",
        host.hostname.as_deref().unwrap_or("(unnamed)"),
        host.numa_nodes.len(),
        host.core_count(),
        host.thread_count()
    );
    for n in &host.numa_nodes {
        let mut firsts: Vec<usize> = n.cores.iter().filter_map(|c| c.first().copied()).collect();
        firsts.sort_unstable();
        let mut all: Vec<usize> = n.cores.iter().flatten().copied().collect();
        all.sort_unstable();
        let _ = writeln!(
            out,
            "  NUMA {}: cores {} (hardware threads {})",
            n.os_index,
            ranges(&firsts),
            ranges(&all)
        );
    }
    for g in &host.gpus {
        let _ = writeln!(
            out,
            "  GPU {} ({} numbering): {}, {}",
            g.index,
            g.index_from,
            g.model.as_deref().unwrap_or("NVIDIA GPU"),
            place(&g.pci)
        );
    }
    for n in &host.nics {
        let rdma = n
            .rdma
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let mut live = String::new();
        if let Some(a) = &n.address {
            let _ = write!(live, ", address {a}");
        }
        if let Some(s) = n.speed_gbps {
            let _ = write!(live, ", {s} Gb/s");
        }
        let _ = writeln!(
            out,
            "  NIC {}{rdma}: {}, {}{live}",
            n.interface,
            n.model.as_deref().unwrap_or("network port"),
            place(&n.pci)
        );
    }
    for e in &placement.engines {
        let gpu = e.gpu.map_or("no GPU".into(), |g| format!("GPU {g}"));
        let nic = e
            .nic
            .as_deref()
            .map_or("no NIC".into(), |n| format!("NIC {n}"));
        let numa = e.numa.map_or(String::new(), |n| format!(", NUMA {n}"));
        let core = |c: Option<usize>| c.map_or("none".into(), |c| c.to_string());
        let _ = writeln!(
            out,
            "{} {}: {gpu}, {nic}{numa}; receive cores {}, send core {}, main core {}",
            e.kind.as_str(),
            e.index,
            if e.recv_cores.is_empty() {
                "none".into()
            } else {
                list(&e.recv_cores)
            },
            core(e.send_core),
            core(e.main_core)
        );
        let _ = writeln!(out, "  cbf {} {}", e.kind.as_str(), e.flags.join(" "));
    }
    for w in &placement.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
