//! Where each engine on a host should run: a pure function of the host's [`Host`] model and
//! the engines asked for. Each GPU is paired with the NIC nearest it (behind the same PCIe
//! root complex, else on the same NUMA node, else any: with a warning, since every byte then
//! crosses the CPUs' interconnect twice); engines are dealt to the GPUs in turn (several may
//! share one, as katgpucbf runs two to four F-engines per GPU); each engine gets whole physical
//! cores on its GPU's NUMA node, one per receive thread plus one send and one processing core
//! (katgpucbf's `--recv-affinity`, `--send-affinity` and main thread), SMT siblings left idle
//! so that a busy-polling receive thread has its core to itself (seed 000 §Network receive).
#![deny(unsafe_code)]

use serde::Serialize;

use super::host::{Host, Nic};
pub use super::warning::Warning;

/// The engines `cbf affinity` places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Fengine,
    Xbengine,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Fengine => "fengine",
            EngineKind::Xbengine => "xbengine",
        }
    }
}

/// What to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Engines of each kind, placed in this order.
    pub engines: Vec<(EngineKind, usize)>,
    /// Receive threads (so receive cores) per engine.
    pub recv_threads: usize,
}

/// One engine's place and the flags that put it there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnginePlan {
    pub kind: EngineKind,
    /// Its number among the engines of its kind on this host.
    pub index: usize,
    /// CUDA ordinal of its GPU; `None` on a host without one (CPU backend).
    pub gpu: Option<usize>,
    /// Interface name of its NIC.
    pub nic: Option<String>,
    /// The NUMA node its cores are on (and its chunks, first touched there).
    pub numa: Option<usize>,
    pub recv_cores: Vec<usize>,
    pub send_core: Option<usize>,
    pub main_core: Option<usize>,
    /// `cbf fengine`/`cbf xbengine` flags, one `--flag=value` each.
    pub flags: Vec<String>,
}

/// The whole host's plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    pub engines: Vec<EnginePlan>,
    pub warnings: Vec<Warning>,
}

/// The NICs fit to carry data (indices into `host.nics`): those whose PCIe link is within a
/// factor 4 of the fastest, so that a management port on a x1 link is never paired with a
/// GPU. A NIC whose link speed is unknown (a VM's virtual NIC) counts as fit.
pub fn data_nics(host: &Host) -> Vec<usize> {
    let fastest = host
        .nics
        .iter()
        .filter_map(|n| n.pci.link_gbytes_per_s)
        .fold(0.0, f64::max);
    (0..host.nics.len())
        .filter(|&n| {
            host.nics[n]
                .pci
                .link_gbytes_per_s
                .is_none_or(|s| 4.0 * s >= fastest)
        })
        .collect()
}

/// The NIC for each GPU (index into `host.nics`), among `data`: same root complex first, then
/// same NUMA node, then any; among equals the one serving fewest GPUs so far, then bus order.
fn pair_nics(host: &Host, data: &[usize]) -> Vec<Option<usize>> {
    let mut uses = vec![0usize; host.nics.len()];
    host.gpus
        .iter()
        .map(|g| {
            let best = data.iter().copied().min_by_key(|&n| {
                let p = &host.nics[n].pci;
                let closeness =
                    2 * usize::from(g.pci.shares_root(p)) + usize::from(g.pci.shares_numa(p));
                (std::cmp::Reverse(closeness), uses[n], n)
            });
            if let Some(n) = best {
                uses[n] += 1;
            }
            best
        })
        .collect()
}

/// Free physical cores per NUMA node (first hardware thread of each), taken front first.
struct CorePool {
    free: Vec<(usize, std::collections::VecDeque<usize>)>,
}

impl CorePool {
    fn new(host: &Host) -> CorePool {
        CorePool {
            free: host
                .numa_nodes
                .iter()
                .map(|n| {
                    (
                        n.os_index,
                        n.cores.iter().filter_map(|c| c.first().copied()).collect(),
                    )
                })
                .collect(),
        }
    }

    /// `n` cores from `node`, then from the other nodes in order; also how many came from
    /// elsewhere. Fewer than `n` when the host has run out.
    fn take(&mut self, node: usize, n: usize) -> (Vec<usize>, usize) {
        let mut got = Vec::with_capacity(n);
        let order = self
            .free
            .iter()
            .position(|(os, _)| *os == node)
            .into_iter()
            .chain((0..self.free.len()).filter(|&i| self.free[i].0 != node));
        let mut borrowed = 0;
        for i in order.collect::<Vec<_>>() {
            while got.len() < n {
                let Some(c) = self.free[i].1.pop_front() else {
                    break;
                };
                borrowed += usize::from(self.free[i].0 != node);
                got.push(c);
            }
        }
        (got, borrowed)
    }
}

/// Place `request`'s engines on `host`.
pub fn place(host: &Host, request: &Request) -> Placement {
    let mut warnings = Vec::new();
    if host.gpus.is_empty() {
        warnings.push(Warning::NoGpu);
    }
    let data = data_nics(host);
    if data.is_empty() {
        warnings.push(Warning::NoNic);
    }
    let pairs = pair_nics(host, &data);
    for (g, nic) in host.gpus.iter().zip(&pairs) {
        let Some(nic) = nic.map(|n| &host.nics[n]) else {
            continue;
        };
        if !g.pci.shares_numa(&nic.pci) {
            warnings.push(Warning::CrossNuma {
                gpu: g.index,
                nic: nic.interface.clone(),
            });
        }
        if !g.pci.shares_root(&nic.pci) {
            let root = |r: &Option<String>| r.clone().unwrap_or_else(|| "unknown".into());
            warnings.push(Warning::CrossRoot {
                gpu: g.index,
                nic: nic.interface.clone(),
                gpu_root: root(&g.pci.root),
                nic_root: root(&nic.pci.root),
            });
        }
    }
    let mut pool = CorePool::new(host);
    let mut engines = Vec::new();
    let mut per_gpu = vec![0usize; host.gpus.len()];
    let mut slot = 0;
    for &(kind, count) in &request.engines {
        for index in 0..count {
            // Engines are dealt to GPUs (or, without GPUs, to NICs) in turn.
            let (gpu, nic): (Option<usize>, Option<&Nic>) = if host.gpus.is_empty() {
                let nic = (!data.is_empty()).then(|| &host.nics[data[slot % data.len()]]);
                (None, nic)
            } else {
                let g = slot % host.gpus.len();
                per_gpu[g] += 1;
                (Some(g), pairs[g].map(|n| &host.nics[n]))
            };
            slot += 1;
            let local = gpu
                .and_then(|g| host.gpus[g].pci.numa.first())
                .or_else(|| nic.and_then(|n| n.pci.numa.first()))
                .copied();
            let numa = local.or_else(|| host.numa_nodes.first().map(|n| n.os_index));
            let needed = request.recv_threads + 2;
            let (cores, borrowed) = numa.map_or((Vec::new(), 0), |n| pool.take(n, needed));
            let name = format!("{} {index}", kind.as_str());
            if cores.len() < needed || borrowed > 0 {
                warnings.push(Warning::TooFewCores {
                    engine: name,
                    numa: numa.unwrap_or(0),
                    needed,
                    borrowed,
                    missing: needed - cores.len(),
                });
            }
            // Main and send cores first: a receive thread left without a core is the one
            // that copes best unbound (it sleeps in the kernel between batches).
            let mut it = cores.into_iter();
            let main_core = it.next();
            let send_core = it.next();
            let recv_cores: Vec<usize> = it.collect();
            let mut plan = EnginePlan {
                kind,
                index,
                gpu: gpu.map(|g| host.gpus[g].index),
                nic: nic.map(|n| n.interface.clone()),
                numa: local,
                recv_cores,
                send_core,
                main_core,
                flags: Vec::new(),
            };
            plan.flags = flags(&plan, request.recv_threads);
            engines.push(plan);
        }
    }
    for (g, &n) in per_gpu.iter().enumerate() {
        if n > 1 {
            warnings.push(Warning::SharedGpu {
                gpu: host.gpus[g].index,
                engines: n,
            });
        }
    }
    Placement { engines, warnings }
}

/// The engine's command-line flags (`cbf fengine --help`, katgpucbf's names).
fn flags(p: &EnginePlan, recv_threads: usize) -> Vec<String> {
    let mut f = Vec::new();
    match p.gpu {
        Some(g) => {
            f.push("--backend=cuda".to_string());
            f.push(format!("--gpu-device={g}"));
        }
        None => f.push("--backend=cpu".to_string()),
    }
    if let Some(nic) = &p.nic {
        f.push(format!("--recv-interface={nic}"));
        f.push(format!("--send-interface={nic}"));
    }
    // One entry per receive thread (katgpucbf's meaning): -1 for a thread left unbound.
    let mut recv: Vec<String> = p.recv_cores.iter().map(usize::to_string).collect();
    if !recv.is_empty() || recv_threads > 1 {
        recv.resize(recv_threads, "-1".into());
        f.push(format!("--recv-affinity={}", recv.join(",")));
    }
    if let Some(c) = p.send_core {
        f.push(format!("--send-affinity={c}"));
    }
    if let Some(c) = p.main_core {
        f.push(format!("--main-affinity={c}"));
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::host::{Gpu, NumaNode, PciPlace};

    fn pci(bus: &str, numa: usize, root: &str, gbps: f64) -> PciPlace {
        PciPlace {
            bus_id: bus.into(),
            numa: vec![numa],
            root: Some(root.into()),
            link_gbytes_per_s: Some(gbps),
        }
    }

    fn gpu(index: usize, numa: usize, root: &str) -> Gpu {
        Gpu {
            index,
            index_from: "cuda".into(),
            model: None,
            pci: pci(&format!("0000:{index:02x}:00.0"), numa, root, 31.5),
        }
    }

    fn nic(name: &str, numa: usize, root: &str, gbps: f64) -> Nic {
        Nic {
            interface: name.into(),
            rdma: None,
            model: None,
            pci: pci("0000:aa:00.0", numa, root, gbps),
            address: None,
            speed_gbps: None,
        }
    }

    /// `nodes` NUMA nodes of `cores` cores each, SMT siblings numbered after every first thread.
    fn host(nodes: usize, cores: usize, gpus: Vec<Gpu>, nics: Vec<Nic>) -> Host {
        Host {
            hostname: None,
            numa_nodes: (0..nodes)
                .map(|n| NumaNode {
                    os_index: n,
                    cores: (0..cores)
                        .map(|c| vec![n * cores + c, nodes * cores + n * cores + c])
                        .collect(),
                })
                .collect(),
            gpus,
            nics,
        }
    }

    fn request(engines: &[(EngineKind, usize)], recv_threads: usize) -> Request {
        Request {
            engines: engines.to_vec(),
            recv_threads,
        }
    }

    /// Every bound core, each engine's; no core may be given twice.
    fn all_cores(p: &Placement) -> Vec<usize> {
        p.engines
            .iter()
            .flat_map(|e| {
                e.recv_cores
                    .iter()
                    .copied()
                    .chain(e.send_core)
                    .chain(e.main_core)
            })
            .collect()
    }

    #[test]
    fn a_gpu_and_nic_per_socket_give_one_local_engine_each() {
        let h = host(
            2,
            8,
            vec![gpu(0, 0, "r0"), gpu(1, 1, "r1")],
            vec![nic("ens1f0", 0, "r0", 31.5), nic("ens2f0", 1, "r1", 31.5)],
        );
        let p = place(&h, &request(&[(EngineKind::Fengine, 2)], 2));
        assert_eq!(p.warnings, []);
        let f1 = &p.engines[1];
        assert_eq!(
            (f1.gpu, f1.nic.as_deref(), f1.numa),
            (Some(1), Some("ens2f0"), Some(1))
        );
        assert_eq!(
            f1.flags,
            [
                "--backend=cuda",
                "--gpu-device=1",
                "--recv-interface=ens2f0",
                "--send-interface=ens2f0",
                "--recv-affinity=10,11",
                "--send-affinity=9",
                "--main-affinity=8"
            ]
        );
        // First hardware threads of node 0's cores only, none shared.
        let f0 = all_cores(&Placement {
            engines: vec![p.engines[0].clone()],
            warnings: vec![],
        });
        assert!(f0.iter().all(|c| (0..8).contains(c)), "{f0:?}");
        let mut cores = all_cores(&p);
        let n = cores.len();
        cores.sort_unstable();
        cores.dedup();
        assert_eq!((n, cores.len()), (8, 8));
    }

    #[test]
    fn a_gpu_and_nic_apart_are_warned_about() {
        let h = host(
            2,
            8,
            vec![gpu(0, 0, "r0")],
            vec![nic("ens2f0", 1, "r1", 31.5)],
        );
        let p = place(&h, &request(&[(EngineKind::Xbengine, 1)], 1));
        assert_eq!(p.engines[0].nic.as_deref(), Some("ens2f0"));
        // Cores follow the GPU.
        assert_eq!(p.engines[0].numa, Some(0));
        assert_eq!(
            p.warnings,
            [
                Warning::CrossNuma {
                    gpu: 0,
                    nic: "ens2f0".into()
                },
                Warning::CrossRoot {
                    gpu: 0,
                    nic: "ens2f0".into(),
                    gpu_root: "r0".into(),
                    nic_root: "r1".into()
                }
            ]
        );
        // Same node, different root complexes: only the root complex is warned about.
        let h = host(
            1,
            8,
            vec![gpu(0, 0, "r0")],
            vec![nic("ens1f0", 0, "r1", 31.5)],
        );
        let p = place(&h, &request(&[(EngineKind::Fengine, 1)], 1));
        assert!(
            matches!(p.warnings[..], [Warning::CrossRoot { .. }]),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn a_management_port_is_never_a_gpu_s_nic() {
        // The 1 GbE port shares the GPU's node and root; the 100 GbE port is remote.
        let h = host(
            2,
            4,
            vec![gpu(0, 0, "r0")],
            vec![nic("eno1", 0, "r0", 0.6), nic("ens2f0", 1, "r1", 31.5)],
        );
        let p = place(&h, &request(&[(EngineKind::Fengine, 1)], 1));
        assert_eq!(p.engines[0].nic.as_deref(), Some("ens2f0"));
    }

    #[test]
    fn shared_gpus_and_short_nodes_are_warned_about() {
        // Two engines on one GPU whose node has 4 cores: the second borrows 2 from node 1.
        let h = host(
            2,
            4,
            vec![gpu(0, 0, "r0")],
            vec![nic("ens1f0", 0, "r0", 31.5)],
        );
        let p = place(&h, &request(&[(EngineKind::Fengine, 2)], 1));
        assert_eq!(
            p.warnings,
            [
                Warning::TooFewCores {
                    engine: "fengine 1".into(),
                    numa: 0,
                    needed: 3,
                    borrowed: 2,
                    missing: 0
                },
                Warning::SharedGpu { gpu: 0, engines: 2 }
            ]
        );
        assert_eq!(
            (
                p.engines[1].main_core,
                p.engines[1].send_core,
                &p.engines[1].recv_cores
            ),
            (Some(3), Some(4), &vec![5])
        );
        // Out of cores altogether: receive threads go unbound first, as -1 entries.
        let h = host(1, 3, vec![], vec![nic("eth0", 0, "r0", 31.5)]);
        let p = place(&h, &request(&[(EngineKind::Fengine, 1)], 2));
        assert_eq!(p.warnings[0], Warning::NoGpu);
        assert!(matches!(
            p.warnings[1],
            Warning::TooFewCores { missing: 1, .. }
        ));
        assert_eq!(
            p.engines[0].flags,
            [
                "--backend=cpu",
                "--recv-interface=eth0",
                "--send-interface=eth0",
                "--recv-affinity=2,-1",
                "--send-affinity=1",
                "--main-affinity=0"
            ]
        );
    }

    #[test]
    fn a_host_without_devices_still_gets_cores() {
        let p = place(
            &host(1, 4, vec![], vec![]),
            &request(&[(EngineKind::Fengine, 1)], 1),
        );
        assert_eq!(p.warnings, [Warning::NoGpu, Warning::NoNic]);
        assert_eq!(
            p.engines[0].flags,
            [
                "--backend=cpu",
                "--recv-affinity=2",
                "--send-affinity=1",
                "--main-affinity=0"
            ]
        );
    }
}
