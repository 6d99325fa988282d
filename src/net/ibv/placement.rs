//! Where the ibverbs transport's registered memory lives (issue 15; seed 000 §Network receive
//! and §Network transmit): on the NUMA node of the RDMA device that reads or writes it, as the
//! udp, uring and DPDK paths place their receive memory (`net::numa`, `engine::recv_numa`), so
//! that the NIC's DMA and the threads' copies into and out of the slots stay off the
//! inter-socket link.
//!
//! The receive ring's node is `--recv-numa-node` when given, else the device's own
//! (`/sys/class/infiniband/<dev>/device/numa_node`, [`numa::rdma_node`]); the send ring's is
//! always the device's ([`send_ring_memory`]: there is no flag to force it, and a send ring
//! elsewhere than its NIC would only cost). The binding must come *before* `ibv_reg_mr`:
//! registration pins the pages, and pinned pages do not migrate (a later `mbind` with
//! `MPOL_MF_MOVE | MPOL_MF_STRICT` fails with EIO), so [`ring_memory`] allocates and binds, and
//! only then does `verbs::Mr::new` register. A binding that fails is an error when the node
//! was forced (the operator asked for it) and a warning otherwise, as `engine::recv_numa` has
//! it. The receiver allocates no chunk memory of its own: the chunks are the engine's, bound
//! by `engine::recv_numa::bind_chunks` to the node
//! [`IbvReceiver::numa_node`](crate::net::PacketReceiver::numa_node) reports.

#![deny(unsafe_code)]

use std::path::Path;

use super::IbvError;
use crate::net::numa;

/// The node for a receive ring: the forced one, else the device's (`None`: not bound).
pub fn ring_node(forced: Option<u32>, device: Option<u32>) -> Option<u32> {
    forced.or(device)
}

/// Which way a ring's frames go, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    Receive,
    Send,
}

impl Ring {
    fn name(self) -> &'static str {
        match self {
            Ring::Receive => "receive",
            Ring::Send => "send",
        }
    }
}

/// `len` zeroed bytes (at least one) for a `ring`, bound to `node` where one is given, ready to
/// register. The allocation is the one `verbs::Mr` owns and registers: a `Vec<u8>` (large, so
/// calloc maps fresh pages), bound whole-page with pages already touched moved.
pub fn ring_memory(
    ring: Ring,
    len: usize,
    node: Option<u32>,
    forced: bool,
) -> Result<Vec<u8>, IbvError> {
    let buf = vec![0u8; len.max(1)];
    if let Some(node) = node {
        let ring = ring.name();
        match numa::bind_area(&buf, node) {
            Ok(()) => tracing::debug!(node, bytes = buf.len(), ring, "ibverbs ring bound"),
            Err(e) if forced => return Err(IbvError::Numa(e)),
            Err(e) => {
                tracing::warn!(error = %e, ring, "ibverbs ring not bound to the RDMA device's NUMA node")
            }
        }
    }
    Ok(buf)
}

/// `len` zeroed bytes for the send ring of RDMA device `device`, bound to the device's node as
/// the sysfs tree at `sysfs` (`/sys` on a live host) gives it, and that node (`None`: the
/// device publishes none, e.g. a one-node host, and the ring is left to first touch, logged).
pub fn send_ring_memory(
    sysfs: &Path,
    device: &str,
    len: usize,
) -> Result<(Vec<u8>, Option<u32>), IbvError> {
    let node = numa::rdma_node_in(sysfs, device)
        .map_err(|why| {
            tracing::info!(device, "ibverbs send ring not bound to a NUMA node: {why}");
        })
        .ok();
    Ok((ring_memory(Ring::Send, len, node, false)?, node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_device() {
        assert_eq!(ring_node(Some(1), Some(0)), Some(1));
        assert_eq!(ring_node(None, Some(0)), Some(0));
        assert_eq!(ring_node(None, None), None);
    }

    /// Memory allocated as the receiver allocates it, bound to node 0 (every host has one):
    /// the kernel reports every page bound there; unbound when no node is known; a node this
    /// host lacks is an error when forced and only logged when it came from the device.
    #[test]
    fn ring_memory_is_bound_before_registration() {
        let slots = super::super::slots_for(8 << 20, 9280);
        let ring = ring_memory(Ring::Receive, slots * 9280, Some(0), true).unwrap();
        assert_eq!(ring.len(), slots * 9280);
        let got = numa::area_binding(&ring).unwrap();
        assert_eq!(
            got,
            numa::AreaBinding {
                bound: true,
                nodes: vec![0]
            }
        );
        assert!(ring.iter().all(|&b| b == 0));
        match ring_memory(Ring::Receive, 1 << 20, Some(1000), true) {
            Err(IbvError::Numa(numa::NumaError::NoNode { node: 1000, .. })) => {}
            other => panic!("bound to node 1000: {other:?}"),
        }
        assert_eq!(
            ring_memory(Ring::Receive, 1 << 20, Some(1000), false)
                .unwrap()
                .len(),
            1 << 20
        );
        assert_eq!(ring_memory(Ring::Receive, 0, None, false).unwrap().len(), 1);
    }

    /// The send ring, sized as the sender sizes it, follows its device's node in a fake sysfs
    /// tree (node 0: every host has one), read back from the kernel page by page; a device
    /// without a node (-1, or no such file) leaves the ring to the default policy, as does a
    /// node this host lacks (the sender still opens: only logged).
    #[test]
    fn the_send_ring_is_bound_to_its_devices_node() {
        let root = std::env::temp_dir().join(format!("cbf-sysfs-ibsend-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (dev, text) in [("mlx5_0", "0\n"), ("mlx5_1", "-1\n"), ("mlx5_2", "1000\n")] {
            let dir = root.join("class/infiniband").join(dev).join("device");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), text).unwrap();
        }
        let len = super::super::slots_for(8 << 20, 9280) * 9280;
        let (ring, node) = send_ring_memory(&root, "mlx5_0", len).unwrap();
        assert_eq!((ring.len(), node), (len, Some(0)));
        assert_eq!(
            numa::area_binding(&ring).unwrap(),
            numa::AreaBinding {
                bound: true,
                nodes: vec![0]
            }
        );
        // Past glibc's largest mmap threshold (32 MiB), so that the ring is fresh pages and not
        // heap another test may have bound.
        let fresh = 64 << 20;
        for (dev, want) in [("mlx5_1", None), ("mlx5_3", None), ("mlx5_2", Some(1000))] {
            let (ring, node) = send_ring_memory(&root, dev, fresh).unwrap();
            assert_eq!(node, want, "{dev}");
            assert!(!numa::area_binding(&ring).unwrap().bound, "{dev}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
