//! The warnings of a placement: what an operator should know before starting engines where
//! `cbf affinity` says (seed 000 §Network receive, §PeerDirect: data from a NIC to a GPU should
//! not cross the CPUs' interconnect).
#![deny(unsafe_code)]

use std::fmt;

use serde::Serialize;

/// What an operator should know about the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Warning {
    /// No CUDA GPU: the engines are placed for the CPU backend.
    NoGpu,
    /// No NIC with an interface name: no interface flags.
    NoNic,
    /// A GPU and its NIC are local to different NUMA nodes.
    CrossNuma { gpu: usize, nic: String },
    /// A GPU and its NIC hang from different PCIe root complexes.
    CrossRoot {
        gpu: usize,
        nic: String,
        gpu_root: String,
        nic_root: String,
    },
    /// An engine's node had fewer free cores than it needs: it takes `borrowed` from other
    /// nodes (its threads then work on remote memory), or goes without when none is left.
    TooFewCores {
        engine: String,
        numa: usize,
        needed: usize,
        borrowed: usize,
        missing: usize,
    },
    /// More engines than GPUs: some share one.
    SharedGpu { gpu: usize, engines: usize },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::NoGpu => write!(
                f,
                "no CUDA GPU found: the engines are placed for --backend cpu"
            ),
            Warning::NoNic => write!(f, "no network interface found: no interface flags"),
            Warning::CrossNuma { gpu, nic } => write!(
                f,
                "GPU {gpu} and NIC {nic} are on different NUMA nodes: received data crosses \
                 the CPU interconnect on its way to the GPU"
            ),
            Warning::CrossRoot {
                gpu,
                nic,
                gpu_root,
                nic_root,
            } => write!(
                f,
                "GPU {gpu} and NIC {nic} are behind different PCIe root complexes ({gpu_root}, \
                 {nic_root}): no peer-to-peer path between them"
            ),
            Warning::TooFewCores {
                engine,
                numa,
                needed,
                borrowed,
                missing,
            } => {
                write!(f, "{engine} needs {needed} cores on NUMA node {numa}: ")?;
                if *borrowed > 0 {
                    write!(f, "{borrowed} taken from other nodes")?;
                }
                if *missing > 0 {
                    let sep = if *borrowed > 0 { ", " } else { "" };
                    write!(f, "{sep}{missing} not bound (no core left)")?;
                }
                Ok(())
            }
            Warning::SharedGpu { gpu, engines } => {
                write!(f, "GPU {gpu} is shared by {engines} engines")
            }
        }
    }
}
