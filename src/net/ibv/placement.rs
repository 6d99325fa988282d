//! Where the ibverbs receiver's registered memory lives (issue 15; seed 000 §Network receive):
//! on the NUMA node of the RDMA device it receives from, as the udp, uring and DPDK paths
//! place theirs (`net::numa`, `engine::recv_numa`), so that the NIC's DMA writes and the
//! receive thread's copies out of the slots stay off the inter-socket link.
//!
//! The node is `--recv-numa-node` when given, else the device's own
//! (`/sys/class/infiniband/<dev>/device/numa_node`, [`numa::rdma_node`]). The binding must come
//! *before* `ibv_reg_mr`: registration pins the pages, and pinned pages do not migrate (a later
//! `mbind` with `MPOL_MF_MOVE | MPOL_MF_STRICT` fails with EIO), so [`ring_memory`] allocates
//! and binds, and only then does `verbs::Mr::new` register. A binding that fails is an error
//! when the node was forced (the operator asked for it) and a warning otherwise, as
//! `engine::recv_numa` has it. The receiver allocates no chunk memory of its own: the chunks
//! are the engine's, bound by `engine::recv_numa::bind_chunks` to the node
//! [`IbvReceiver::numa_node`](crate::net::PacketReceiver::numa_node) reports.

#![deny(unsafe_code)]

use super::IbvError;
use crate::net::numa;

/// The node for a receive ring: the forced one, else the device's (`None`: not bound).
pub fn ring_node(forced: Option<u32>, device: Option<u32>) -> Option<u32> {
    forced.or(device)
}

/// `len` zeroed bytes (at least one) for a receive ring, bound to `node` where one is given,
/// ready to register. The allocation is the one `verbs::Mr` owns and registers: a `Vec<u8>`
/// (large, so calloc maps fresh pages), bound whole-page with pages already touched moved.
pub fn ring_memory(len: usize, node: Option<u32>, forced: bool) -> Result<Vec<u8>, IbvError> {
    let buf = vec![0u8; len.max(1)];
    if let Some(node) = node {
        match numa::bind_area(&buf, node) {
            Ok(()) => tracing::debug!(node, bytes = buf.len(), "ibverbs receive ring bound"),
            Err(e) if forced => return Err(IbvError::Numa(e)),
            Err(e) => {
                tracing::warn!(error = %e, "ibverbs receive ring not bound to the RDMA device's NUMA node")
            }
        }
    }
    Ok(buf)
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
        let ring = ring_memory(slots * 9280, Some(0), true).unwrap();
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
        match ring_memory(1 << 20, Some(1000), true) {
            Err(IbvError::Numa(numa::NumaError::NoNode { node: 1000, .. })) => {}
            other => panic!("bound to node 1000: {other:?}"),
        }
        assert_eq!(
            ring_memory(1 << 20, Some(1000), false).unwrap().len(),
            1 << 20
        );
        assert_eq!(ring_memory(0, None, false).unwrap().len(), 1);
    }
}
