//! The [`Host`] model from hwloc: this machine's topology, or an `lstopo --of xml` export of
//! another (how `cbf affinity` plans a node it does not run on, and how the tests load
//! correlator-class hosts on a small VM). PCI devices and OS devices appear only with an I/O
//! filter; "important" keeps GPUs, NICs and the bridges above them.

use std::collections::BTreeMap;
use std::path::Path;

use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes};
use hwlocality::object::types::{BridgeType, OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology;

use super::host::{Gpu, Host, Nic, NumaNode, PciPlace};

/// PCI vendor id of NVIDIA (the only GPUs cbf drives).
const NVIDIA: u16 = 0x10de;

/// Largest XML export read: an `lstopo` export of a 4-socket, 512-thread host with its PCIe
/// tree is about 2 MiB; hwloc parses a file whole, in memory.
pub const MAX_XML_BYTES: u64 = 64 << 20;

/// Load this host's topology, or the XML export at `xml`. `Err` says what failed.
pub fn load(xml: Option<&Path>) -> Result<Host, String> {
    let mut builder = Topology::builder();
    if let Some(path) = xml {
        let len = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len > MAX_XML_BYTES {
            return Err(format!(
                "{}: {len} bytes, more than an hwloc export of any host ({} MiB)",
                path.display(),
                MAX_XML_BYTES >> 20
            ));
        }
        builder = builder
            .from_xml_file(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let topology = builder
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| format!("hwloc could not build the topology: {e}"))?;
    let mut host = host(&topology);
    if xml.is_none() {
        for nic in &mut host.nics {
            live_details(nic);
        }
    }
    Ok(host)
}

/// What only the running host knows of a NIC: its IPv4 address and link speed.
fn live_details(nic: &mut Nic) {
    nic.address = crate::net::udp::resolve_interface(&nic.interface)
        .ok()
        .map(|(_, a)| a.to_string());
    // Mb/s; -1 (or an error) while the link is down.
    nic.speed_gbps = std::fs::read_to_string(format!("/sys/class/net/{}/speed", nic.interface))
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&mbps| mbps > 0.0)
        .map(|mbps| mbps / 1000.0);
}

/// The model of a loaded topology.
pub fn host(topology: &Topology) -> Host {
    let hostname = topology
        .root_object()
        .info("HostName")
        .map(|v| v.to_string_lossy().into_owned());
    Host {
        hostname,
        numa_nodes: numa_nodes(topology),
        gpus: gpus(topology),
        nics: nics(topology),
    }
}

/// Each NUMA node with its physical cores (hardware threads grouped by their Core object;
/// a thread without one is a core of its own).
fn numa_nodes(topology: &Topology) -> Vec<NumaNode> {
    let mut nodes: BTreeMap<usize, BTreeMap<u64, Vec<usize>>> = topology
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|n| n.os_index())
        .map(|n| (n, BTreeMap::new()))
        .collect();
    for pu in topology.objects_with_type(ObjectType::PU) {
        let (Some(os), Some(node)) = (pu.os_index(), first_node(pu)) else {
            continue;
        };
        let core = pu
            .first_ancestor_with_type(ObjectType::Core)
            .map_or(u64::MAX - os as u64, |c| c.global_persistent_index());
        nodes
            .entry(node)
            .or_default()
            .entry(core)
            .or_default()
            .push(os);
    }
    nodes
        .into_iter()
        .map(|(os_index, cores)| {
            let mut cores: Vec<Vec<usize>> = cores
                .into_values()
                .map(|mut t| {
                    t.sort_unstable();
                    t
                })
                .collect();
            cores.sort_unstable();
            NumaNode { os_index, cores }
        })
        .collect()
}

/// The first NUMA node of an object's node set.
fn first_node(obj: &TopologyObject) -> Option<usize> {
    obj.nodeset()?.first_set().map(usize::from)
}

/// Where a PCI device sits: its bus id, the NUMA nodes of the first CPU-side object above it,
/// the host bridge above it, and its link speed.
fn pci_place(dev: &TopologyObject) -> Option<PciPlace> {
    let Some(ObjectAttributes::PCIDevice(pci)) = dev.attributes() else {
        return None;
    };
    let numa = dev
        .first_non_io_ancestor()
        .and_then(|a| a.nodeset())
        .map(|set| set.iter_set().map(usize::from).collect())
        .unwrap_or_default();
    let root = dev.ancestors().find_map(|a| match a.attributes() {
        Some(ObjectAttributes::Bridge(b)) if b.upstream_type() == BridgeType::Host => {
            match b.downstream_attributes() {
                Some(DownstreamAttributes::PCI(d)) => Some(format!(
                    "{:04x}:[{:02x}-{:02x}]",
                    d.domain(),
                    d.secondary_bus(),
                    d.subordinate_bus()
                )),
                _ => None,
            }
        }
        _ => None,
    });
    // hwloc keeps GB/s as a float: widened through its shortest decimal form, so that 63.015385
    // stays 63.015385 rather than 63.01538467407...
    let speed: f64 = pci.link_speed().to_string().parse().unwrap_or(0.0);
    Some(PciPlace {
        bus_id: format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            pci.domain(),
            pci.bus_id(),
            pci.bus_device(),
            pci.function()
        ),
        numa,
        root,
        link_gbytes_per_s: (speed > 0.0).then_some(speed),
    })
}

/// An object's name, as text.
fn name(obj: &TopologyObject) -> Option<String> {
    obj.name().map(|n| n.to_string_lossy().into_owned())
}

/// A PCI device's model name (hwloc's `PCIDevice` info), if known.
fn model(dev: &TopologyObject) -> Option<String> {
    dev.info("PCIDevice")
        .map(|v| v.to_string_lossy().into_owned())
}

/// The OS devices under a PCI device of `ty`, by name.
fn os_devices(dev: &TopologyObject, ty: OSDeviceType) -> Vec<String> {
    dev.io_children()
        .filter(|c| matches!(c.attributes(), Some(ObjectAttributes::OSDevice(o)) if o.device_type() == ty))
        .filter_map(name)
        .collect()
}

/// The number after `prefix` in one of `names` (`cuda3` → 3).
fn numbered(names: &[String], prefix: &str) -> Option<usize> {
    names
        .iter()
        .find_map(|n| n.strip_prefix(prefix)?.parse().ok())
}

/// NVIDIA GPUs (PCI class 03xx), numbered as CUDA numbers them where hwloc's CUDA OS device
/// says (`cudaN`), else NVML's (`nvmlN`), else in bus order.
fn gpus(topology: &Topology) -> Vec<Gpu> {
    let mut found: Vec<Gpu> = Vec::new();
    for dev in topology.pci_devices() {
        let Some(ObjectAttributes::PCIDevice(pci)) = dev.attributes() else {
            continue;
        };
        if pci.vendor_id() != NVIDIA || pci.class_id() >> 8 != 0x03 {
            continue;
        }
        let Some(place) = pci_place(dev) else {
            continue;
        };
        let mut names = os_devices(dev, OSDeviceType::CoProcessor);
        names.extend(os_devices(dev, OSDeviceType::GPU));
        let (index, from) = match (numbered(&names, "cuda"), numbered(&names, "nvml")) {
            (Some(i), _) => (i, "cuda"),
            (None, Some(i)) => (i, "nvml"),
            (None, None) => (found.len(), "pci"),
        };
        found.push(Gpu {
            index,
            index_from: from.into(),
            model: model(dev),
            pci: place,
        });
    }
    found.sort_by_key(|g| g.index);
    found
}

/// Network ports (PCI class 02xx) with an interface name; their RDMA device if any.
fn nics(topology: &Topology) -> Vec<Nic> {
    let mut found = Vec::new();
    for dev in topology.pci_devices() {
        let Some(ObjectAttributes::PCIDevice(pci)) = dev.attributes() else {
            continue;
        };
        if pci.class_id() >> 8 != 0x02 {
            continue;
        }
        let (Some(place), Some(interface)) = (
            pci_place(dev),
            os_devices(dev, OSDeviceType::Network).into_iter().next(),
        ) else {
            continue;
        };
        found.push(Nic {
            interface,
            rdma: os_devices(dev, OSDeviceType::OpenFabrics)
                .into_iter()
                .next(),
            model: model(dev),
            pci: place,
            address: None,
            speed_gbps: None,
        });
    }
    found
}
