//! Placement: each engine, in the plan's order, goes to the first node (in the description's
//! order) that has the engine's role and a free slot — a GPU slot (`gpus[].engines`) for a
//! CUDA F- or XB-engine, a CPU slot (`cpu_engines`) for a dsim or a CPU-backend engine. It
//! gets a NIC on the NUMA node of its GPU (NICs taken in turn when there are several; a CPU
//! slot takes the node's NICs in turn and their NUMA nodes), cores from that NUMA node's list
//! (never a core another engine holds), and the node's next katcp and Prometheus ports.
//!
//! A deterministic first-fit, not a scheduler: the same description always gives the same
//! placement, which is what an operator reviewing a plan or a unit file diff wants.
#![deny(unsafe_code)]

use super::check::NodeShape;
use super::config::{ArrayConfig, Role};
use super::ArrayError;

/// Where one engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Index into `nodes`.
    pub node: usize,
    /// Index into the node's `numa`, `nics` and `gpus`.
    pub numa: usize,
    pub nic: usize,
    pub gpu: Option<usize>,
    pub cores: Vec<usize>,
    pub katcp_port: u16,
    pub prometheus_port: u16,
}

/// The state of a placement in progress: what each node has left.
pub struct Placer<'a> {
    cfg: &'a ArrayConfig,
    shapes: &'a [NodeShape],
    /// Engines left per GPU, per node.
    gpu_left: Vec<Vec<usize>>,
    cpu_used: Vec<usize>,
    /// Cores handed out per NUMA node, per node.
    cores_used: Vec<Vec<usize>>,
    /// Engines placed per node (the port offset).
    engines: Vec<usize>,
    /// GPU engines placed per NUMA node, per node (the turn of that NUMA node's NICs).
    nic_turn: Vec<Vec<usize>>,
}

impl<'a> Placer<'a> {
    pub fn new(cfg: &'a ArrayConfig, shapes: &'a [NodeShape]) -> Placer<'a> {
        Placer {
            cfg,
            shapes,
            gpu_left: cfg
                .nodes
                .iter()
                .map(|n| n.gpus.iter().map(|g| g.engines).collect())
                .collect(),
            cpu_used: vec![0; cfg.nodes.len()],
            cores_used: shapes.iter().map(|s| vec![0; s.cores.len()]).collect(),
            engines: vec![0; cfg.nodes.len()],
            nic_turn: cfg.nodes.iter().map(|n| vec![0; n.numa.len()]).collect(),
        }
    }

    /// Place engine `what` of `role`, on a GPU when `gpu`, with `cores` cores.
    pub fn place(
        &mut self,
        what: &str,
        role: Role,
        gpu: bool,
        cores: usize,
    ) -> Result<Placement, ArrayError> {
        let (node, numa, nic, gpu_at) = self.slot(what, role, gpu)?;
        let list = &self.shapes[node].cores[numa];
        let used = &mut self.cores_used[node][numa];
        if list.len() - *used < cores {
            return Err(ArrayError::config(
                format!("nodes[{node}].numa[{numa}].cores"),
                format!(
                    "{what} needs {cores} cores on NUMA node {numa} of {}, {} of its {} are left",
                    self.cfg.nodes[node].hostname,
                    list.len() - *used,
                    list.len()
                ),
            ));
        }
        let taken = list[*used..*used + cores].to_vec();
        *used += cores;
        let (katcp_port, prometheus_port) = self.ports(node)?;
        Ok(Placement {
            node,
            numa,
            nic,
            gpu: gpu_at,
            cores: taken,
            katcp_port,
            prometheus_port,
        })
    }

    /// The first free slot: (node, NUMA node, NIC, GPU).
    fn slot(
        &mut self,
        what: &str,
        role: Role,
        gpu: bool,
    ) -> Result<(usize, usize, usize, Option<usize>), ArrayError> {
        for (i, n) in self.cfg.nodes.iter().enumerate() {
            if !n.roles.contains(&role) {
                continue;
            }
            if gpu {
                if let Some(g) = self.gpu_left[i].iter().position(|&left| left > 0) {
                    self.gpu_left[i][g] -= 1;
                    let numa = n.gpus[g].numa;
                    let local: Vec<usize> = (0..n.nics.len())
                        .filter(|&k| n.nics[k].numa == numa)
                        .collect();
                    let turn = &mut self.nic_turn[i][numa];
                    let nic = local[*turn % local.len()];
                    *turn += 1;
                    return Ok((i, numa, nic, Some(g)));
                }
            } else if self.cpu_used[i] < n.cpu_engines {
                let nic = self.cpu_used[i] % n.nics.len();
                self.cpu_used[i] += 1;
                return Ok((i, n.nics[nic].numa, nic, None));
            }
        }
        let role_name = format!("{role:?}").to_lowercase();
        let (kind, key) = if gpu {
            ("GPU", "gpus[].engines")
        } else {
            ("CPU", "cpu_engines")
        };
        let slots: usize = self
            .cfg
            .nodes
            .iter()
            .filter(|n| n.roles.contains(&role))
            .map(|n| {
                if gpu {
                    n.gpus
                        .iter()
                        .fold(0usize, |a, g| a.saturating_add(g.engines))
                } else {
                    n.cpu_engines
                }
            })
            .fold(0usize, usize::saturating_add);
        Err(ArrayError::config(
            "nodes",
            format!(
                "no room for {what}: the nodes with role {role_name:?} have {slots} {kind} engine slots ({key}) and all are taken"
            ),
        ))
    }

    /// The next katcp and Prometheus ports of `node`: base + engines already there. The two
    /// ranges must not meet.
    fn ports(&mut self, node: usize) -> Result<(u16, u16), ArrayError> {
        let net = &self.cfg.network;
        let k = self.engines[node];
        self.engines[node] += 1;
        let add = |base: u16, key: &str| {
            u16::try_from(usize::from(base) + k).map_err(|_| {
                ArrayError::config(
                    key,
                    format!(
                        "{} engines on {} run past port 65535",
                        k + 1,
                        self.cfg.nodes[node].hostname
                    ),
                )
            })
        };
        let katcp = add(net.katcp_port_base, "network.katcp_port_base")?;
        let prom = add(net.prometheus_port_base, "network.prometheus_port_base")?;
        let low = net.katcp_port_base.min(net.prometheus_port_base);
        let high = net.katcp_port_base.max(net.prometheus_port_base);
        if usize::from(high) <= usize::from(low) + k
            || net.katcp_port_base == 0
            || net.prometheus_port_base == 0
        {
            return Err(ArrayError::config(
                "network.prometheus_port_base",
                format!(
                    "{} engines on {} need katcp ports {}–{katcp} and Prometheus ports {}–{prom}, which overlap (or start at 0)",
                    k + 1,
                    self.cfg.nodes[node].hostname,
                    net.katcp_port_base,
                    net.prometheus_port_base
                ),
            ));
        }
        Ok((katcp, prom))
    }
}
