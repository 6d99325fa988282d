//! What `cbf affinity` knows of a host: its NUMA nodes with their physical cores, and the GPUs
//! and NICs on its PCIe tree, each with the NUMA nodes it is local to and the root complex
//! (host bridge) it hangs from. Built from hwloc ([`super::hwloc`]) or by hand in tests; the
//! planner ([`super::plan`]) reads nothing else.
#![deny(unsafe_code)]

use serde::{Deserialize, Serialize};

/// A host's topology, as far as placing engines needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub hostname: Option<String>,
    /// In the kernel's order (`os_index` ascending).
    pub numa_nodes: Vec<NumaNode>,
    /// In CUDA ordinal order.
    pub gpus: Vec<Gpu>,
    /// In PCI bus order.
    pub nics: Vec<Nic>,
}

/// A NUMA node and the cores local to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The kernel's node number (`numactl --membind`, `/sys/devices/system/node/nodeN`).
    pub os_index: usize,
    /// Physical cores, each as the kernel's numbers of its hardware threads (SMT siblings),
    /// the first of which is the one the planner binds.
    pub cores: Vec<Vec<usize>>,
}

/// Where a PCIe device sits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciPlace {
    /// `domain:bus:device.function`, as `lspci -D` prints it.
    pub bus_id: String,
    /// The NUMA nodes the device is local to (those of the nearest CPU-side object above it
    /// in hwloc's tree); empty when unknown.
    pub numa: Vec<usize>,
    /// The host bridge (PCIe root complex) above it, named by its bus range
    /// (`0000:[16-1a]`): devices behind different ones talk through the CPUs' interconnect.
    pub root: Option<String>,
    /// The link's bandwidth in GB/s per direction, when the host reports it.
    pub link_gbytes_per_s: Option<f64>,
}

/// A CUDA-capable GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The CUDA device ordinal: `cbf fengine --gpu-device`.
    pub index: usize,
    /// How `index` was learnt: `cuda` (the CUDA OS device `cudaN`: CUDA's own numbering),
    /// `nvml` (`nvmlN`) or `pci` (NVIDIA devices in bus order): the last two equal CUDA's
    /// only with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub index_from: String,
    pub model: Option<String>,
    pub pci: PciPlace,
}

/// A network port (one PCI function of a NIC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nic {
    /// The kernel's interface name (`ens1f0`): `--recv-interface`, `--send-interface`.
    pub interface: String,
    /// Its RDMA device (`mlx5_0`), the one kernel-bypass transports open.
    pub rdma: Option<String>,
    pub model: Option<String>,
    pub pci: PciPlace,
    /// Its IPv4 address, when read on the host itself (an XML export carries none).
    #[serde(default)]
    pub address: Option<String>,
    /// Its link speed in Gb/s as the kernel reports it (`/sys/class/net/IF/speed`), when read
    /// on the host itself with the link up.
    #[serde(default)]
    pub speed_gbps: Option<f64>,
}

impl Host {
    /// Physical cores on every node.
    pub fn core_count(&self) -> usize {
        self.numa_nodes.iter().map(|n| n.cores.len()).sum()
    }

    /// Hardware threads on every node.
    pub fn thread_count(&self) -> usize {
        self.numa_nodes
            .iter()
            .flat_map(|n| &n.cores)
            .map(Vec::len)
            .sum()
    }
}

impl PciPlace {
    /// Both devices are local to a common NUMA node (unknown counts as not).
    pub fn shares_numa(&self, other: &PciPlace) -> bool {
        self.numa.iter().any(|n| other.numa.contains(n))
    }

    /// Both devices hang from the same known root complex.
    pub fn shares_root(&self, other: &PciPlace) -> bool {
        self.root.is_some() && self.root == other.root
    }
}
