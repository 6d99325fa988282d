//! A send call's lanes (`super::stream`): the heaps of one call that one interface was dealt,
//! sent as bursts of their own in the call's packet order and interleaved in time with the
//! other lanes' bursts, and the filling of a burst from a lane. Apart from the stream so that
//! each file keeps one job.

use super::heap::PacketGenerator;
use super::stream::HeapRef;
use crate::net::SendBatch;

/// Which interfaces a call's heaps go to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Assign {
    /// Each to the least-loaded live one.
    Balanced,
    /// All to this one.
    To(usize),
}

/// One heap of a call: its packets still to come, and its lane.
pub(super) struct Gen<'h, 'a, 'r> {
    pub(super) gen: PacketGenerator<'h, 'a>,
    pub(super) heap: &'r HeapRef<'h, 'a>,
    pub(super) lane: usize,
    /// Its place in the call.
    pub(super) order: usize,
}

/// The heaps of a call that one interface was given: they go out on it, in the call's mode,
/// as bursts of their own, interleaved in time with the other lanes' bursts.
#[derive(Debug, Clone, Default)]
pub(super) struct Lane {
    /// The interface carrying it: the one it was dealt to, until that one fails.
    pub(super) iface: usize,
    /// Its heaps (a range of the call's heaps, grouped by lane) and their packets' bytes,
    /// headers included.
    pub(super) heaps: std::ops::Range<usize>,
    pub(super) bytes: u64,
    /// Bytes of its bursts sent so far (headers included).
    pub(super) sent: u64,
    /// Index into `heaps` of the heap to take the next packet from.
    pub(super) next: usize,
    /// Whether its heaps are already counted in the in-flight record of `iface`.
    pub(super) charged: bool,
    /// No packet left.
    pub(super) done: bool,
}

impl Lane {
    pub(super) fn new(iface: usize) -> Lane {
        Lane {
            iface,
            ..Default::default()
        }
    }
}

/// Fill `batch` with lane's next packets, heap after heap, up to `burst` bytes, stopping
/// early where a paced heap follows an unpaced one or the other way round; returns whether
/// the burst is paced.
pub(super) fn fill_serial<'h>(
    batch: &mut SendBatch<'h>,
    lane: &mut Lane,
    gens: &mut [Gen<'h, '_, '_>],
    burst: usize,
) -> bool {
    let gens = &mut gens[lane.heaps.clone()];
    let mut paced = None;
    while let Some(g) = gens.get_mut(lane.next) {
        let p = !g.heap.unpaced;
        if paced.is_some_and(|q| q != p) {
            break;
        }
        if push_packet(batch, &mut g.gen, g.heap.substream) {
            paced = Some(p);
            if batch.bytes() >= burst {
                break;
            }
        } else {
            lane.next += 1;
        }
    }
    paced.unwrap_or(false)
}

/// Fill `batch` with lane's next packets, one from each heap in turn, up to `burst` bytes.
pub(super) fn fill_round_robin<'h>(
    batch: &mut SendBatch<'h>,
    lane: &mut Lane,
    gens: &mut [Gen<'h, '_, '_>],
    burst: usize,
) {
    let gens = &mut gens[lane.heaps.clone()];
    let n = gens.len();
    let mut idle = 0;
    while idle < n {
        let g = &mut gens[lane.next];
        lane.next = (lane.next + 1) % n;
        if push_packet(batch, &mut g.gen, g.heap.substream) {
            idle = 0;
            if batch.bytes() >= burst {
                break;
            }
        } else {
            idle += 1;
        }
    }
}

/// Generate the next packet of `g` into `batch`; false when the heap is done.
fn push_packet<'h>(
    batch: &mut SendBatch<'h>,
    g: &mut PacketGenerator<'h, '_>,
    dest: usize,
) -> bool {
    let (h, p) = (batch.header_buf().len(), batch.parts_buf().len());
    let (headers, parts) = batch.bufs();
    let mut device = None;
    match g.next_packet_parts(headers, parts, &mut device) {
        Some(_) => {
            batch.finish_gathered(h, p, device, dest);
            true
        }
        None => false,
    }
}
