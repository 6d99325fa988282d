//! Where an engine's receive memory lives (issue 15; seed 000 §Network receive): on the NUMA
//! node of the NIC it receives from ([`crate::net::numa`]), or on the node `--recv-numa-node`
//! names (cbf's flag: katgpucbf has none; it relies on `numactl`/first touch). Three kinds of
//! memory are placed: the chunks (shared by every receive thread of the group), each thread's
//! packet slots ([`RecvBatch`]), and a transport's own receive ring (io_uring's provided
//! buffers; DPDK's mempool is already on its port's node).
//!
//! Without the flag a failure to bind is logged and the engine runs on (the memory stays where
//! first touch on the receive cores put it: slower, never wrong); with it, any failure is a
//! start-up error naming the flag, since the operator asked for that node.

use super::ConfigError;
use crate::net::numa::{self, NumaError};
use crate::net::{PacketReceiver, RecvBatch};
use crate::spead::recv::ChunkGroup;

/// The flag that forces the node.
const FLAG: &str = "--recv-numa-node";

/// Refuse a forced node this host does not have, before anything is opened.
pub fn check_forced(forced: Option<u32>) -> Result<(), ConfigError> {
    match forced {
        Some(node) => numa::check_node(node).map_err(|e| ConfigError::new(FLAG, e)),
        None => Ok(()),
    }
}

/// The node for the chunks: the forced one, else the node every receiving NIC shares; none
/// when a NIC's node is unknown or the NICs sit on different nodes (then first touch on the
/// receive cores decides, `engine::affinity::on_cores`).
pub fn chunk_node(forced: Option<u32>, nics: &[Option<u32>]) -> Option<u32> {
    if forced.is_some() {
        return forced;
    }
    let first = *nics.first()?;
    nics.iter().all(|&n| n == first).then_some(first).flatten()
}

/// Report a failed binding: an error when the node was forced, a warning otherwise.
fn failed(forced: bool, what: &str, e: NumaError) -> Result<(), ConfigError> {
    if forced {
        return Err(ConfigError::new(FLAG, format!("{what}: {e}")));
    }
    tracing::warn!(error = %e, "{what} not bound to the NIC's NUMA node");
    Ok(())
}

/// Bind each source's own receive memory to the forced node or its NIC's.
pub fn bind_sources(
    forced: Option<u32>,
    sources: &mut [Box<dyn PacketReceiver>],
) -> Result<(), ConfigError> {
    for source in sources.iter_mut() {
        if let Some(node) = forced.or(source.numa_node()) {
            if let Err(e) = source.bind_memory(node) {
                failed(forced.is_some(), "receive ring", e)?;
            }
        }
    }
    Ok(())
}

/// Bind every chunk of `group` to [`chunk_node`] (before the chunks are page-locked for a
/// GPU, and before any receiver writes into them).
pub fn bind_chunks(
    group: &ChunkGroup,
    forced: Option<u32>,
    sources: &[Box<dyn PacketReceiver>],
) -> Result<(), ConfigError> {
    let nics: Vec<Option<u32>> = sources.iter().map(|s| s.numa_node()).collect();
    let Some(node) = chunk_node(forced, &nics) else {
        if nics.iter().flatten().count() > 1 {
            tracing::info!(
                ?nics,
                "receive NICs on different NUMA nodes: chunks not bound"
            );
        }
        return Ok(());
    };
    match group.for_each_buffer(|b| numa::bind_area(b, node)) {
        Ok(()) => {
            tracing::info!(node, "receive chunks bound to NUMA node");
            Ok(())
        }
        Err(e) => failed(forced.is_some(), "receive chunks", e),
    }
}

/// Bind a receive thread's packet slots to the forced node or its source's NIC's; a failure
/// was reported when the chunks were bound, so it is only logged here.
pub fn bind_batch(batch: &RecvBatch, forced: Option<u32>, source: &dyn PacketReceiver) {
    if let Err(e) = bind_slots(batch, forced, source) {
        tracing::warn!(error = %e, "receive slots not bound to NUMA node");
    }
}

/// Bind packet slots that are the only receive memory (`cbf capture`, which has no chunks):
/// a failure is an error naming the flag when the node was forced, else logged.
pub fn bind_slots(
    batch: &RecvBatch,
    forced: Option<u32>,
    source: &dyn PacketReceiver,
) -> Result<(), ConfigError> {
    match forced.or(source.numa_node()) {
        Some(node) => match batch.bind_to_node(node) {
            Ok(()) => Ok(()),
            Err(e) => failed(forced.is_some(), "receive slots", e),
        },
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spead::recv::ChunkGroupConfig;

    /// `open_sources` checks the node before opening anything.
    #[test]
    fn sources_with_a_missing_node_are_refused_by_name() {
        let cfg = crate::engine::recv::SourceConfig {
            src: "127.0.0.1:1".into(),
            interface: None,
            buffer: 1 << 16,
            threads: 1,
            transport: crate::engine::recv::RecvTransport::Udp,
            comp_vectors: vec![],
            ibv_mprq: Default::default(),
            dpdk: None,
            busy_poll: None,
            numa_node: Some(1000),
        };
        let e = crate::engine::recv::open_sources(&cfg).err().unwrap();
        assert_eq!(e.flag, FLAG, "{e}");
    }

    #[test]
    fn chunks_go_where_the_flag_or_every_nic_says() {
        assert_eq!(chunk_node(Some(3), &[Some(1), None]), Some(3));
        assert_eq!(chunk_node(None, &[Some(1), Some(1)]), Some(1));
        assert_eq!(chunk_node(None, &[Some(1), Some(0)]), None);
        assert_eq!(chunk_node(None, &[Some(1), None]), None);
        assert_eq!(chunk_node(None, &[None]), None);
        assert_eq!(chunk_node(None, &[]), None);
    }

    fn group() -> std::sync::Arc<ChunkGroup> {
        ChunkGroup::new(ChunkGroupConfig {
            heaps_per_chunk: 4,
            chunk_bytes: 1 << 20,
            max_chunks: 2,
            n_chunks: 3,
            n_streams: 1,
            max_heaps: 4,
            items: vec![],
            reject_reasons: vec![],
        })
        .unwrap()
    }

    /// `--recv-numa-node 0` binds every chunk and the slots there (read back from the kernel);
    /// a node this host lacks is refused naming the flag, and so is binding it when asked.
    #[test]
    fn a_forced_node_binds_the_chunks_or_is_refused_by_name() {
        let g = group();
        let sources: Vec<Box<dyn PacketReceiver>> =
            vec![Box::new(crate::net::mem::from_packets(vec![]))];
        check_forced(Some(0)).unwrap();
        let e = check_forced(Some(1000)).unwrap_err();
        assert_eq!(e.flag, FLAG);
        assert!(e.message.contains("no NUMA node 1000"), "{e}");
        bind_chunks(&g, Some(0), &sources).unwrap();
        g.for_each_buffer(|b| {
            let got = numa::area_binding(b).unwrap();
            assert!(got.bound && got.nodes == [0], "{got:?}");
            Ok::<_, ()>(())
        })
        .unwrap();
        let mut batch = RecvBatch::new(4, 9000);
        bind_batch(&batch, Some(0), &*sources[0]);
        let got = numa::area_binding(batch.raw_parts().0).unwrap();
        assert!(got.bound && got.nodes == [0], "{got:?}");
        // A node that passed no check: binding refuses it, naming the flag.
        let e = bind_chunks(&group(), Some(1000), &sources).unwrap_err();
        assert_eq!(e.flag, FLAG);
        // Not forced and no NIC node (the in-memory source has none): nothing to do. (Whether
        // the chunks were left alone cannot be read back here: malloc may hand out heap pages
        // that an earlier test bound, and a page's policy outlives its allocation.)
        bind_chunks(&group(), None, &sources).unwrap();
    }
}
