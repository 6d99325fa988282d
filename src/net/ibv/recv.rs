//! Receiving through a raw-packet queue pair (see the module doc of `net::ibv`): frames are
//! lent to the caller's batch in their ring slots, which go back to the receive queue when the
//! batch gives them back (`recv_slots`).

use std::io;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use socket2::{Domain, Protocol, Socket, Type};

use super::placement::{ring_memory, ring_node, Ring};
use super::recv_slots::{lend_completed, Completion, RecvSlots};
use super::verbs::{fill_recv, Channel, Context, Cq, Flow, FlowRule, Mr, Pd, Qp};
use super::{slots_for, CompMode, IbvError};
use crate::net::frame::{self, FrameDrops, HEADERS_LEN};
use crate::net::numa::{self, NumaError};
use crate::net::recv_batch::Lender;
use crate::net::{PacketReceiver, Received, RecvBatch};

/// How long a receive call waits for frames before it returns [`Received::Idle`] (as the UDP
/// transport's poll interval).
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Frames per completion poll.
const POLL_BATCH: usize = 64;

/// A receiver for `endpoints` on one interface. Fields drop in order: the steering rules,
/// then the queue pair, its completion queue and channel, the registration, the domain, the
/// device; the ring's memory goes with the last of the receiver and the batches holding slots.
pub struct IbvReceiver {
    _flows: Vec<Flow>,
    qp: Qp,
    cq: Cq,
    _channel: Option<Channel>,
    mr: Mr<Arc<RecvSlots>>,
    _pd: Pd,
    _ctx: Context,
    /// Joins the multicast groups (IGMP), so that the switch forwards them to this port.
    _join: Socket,
    /// The ring's slots, and the same object as batches hold it.
    slots: Arc<RecvSlots>,
    lender: Arc<dyn Lender>,
    wrs: Vec<ffi::ibv_recv_wr>,
    sges: Vec<ffi::ibv_sge>,
    wcs: Vec<ffi::ibv_wc>,
    /// One poll's completions, and the slots to post again (kept, so that receiving does not
    /// allocate).
    completed: Vec<Completion>,
    to_post: Vec<usize>,
    mode: CompMode,
    drops: FrameDrops,
    failed_completions: u64,
    /// The RDMA device's NUMA node, where known (the engine's chunks go there).
    device_node: Option<u32>,
    /// The node the slots were bound to before registration, if any.
    ring_node: Option<u32>,
}

// SAFETY: the raw pointers inside the work requests point only into this receiver's own
// heap allocations (its request and SGE vectors and registered memory), which move with it;
// the verbs objects may be used from any thread, one at a time (`verbs`).
unsafe impl Send for IbvReceiver {}

impl IbvReceiver {
    /// Steer `endpoints` arriving on `interface` (a name or an address) into a ring of
    /// `buffer` bytes of frames of up to `max_packet` UDP payload bytes; completions per
    /// `comp_vector` (katgpucbf's `--recv-comp-vector`: ≥ 0 interrupts, < 0 polling). The
    /// slots are bound to `numa_node` (`--recv-numa-node`: a failure is an error) or else the
    /// device's node (a failure is logged) before they are registered.
    pub fn open(
        endpoints: &[SocketAddrV4],
        interface: &str,
        buffer: usize,
        max_packet: usize,
        comp_vector: i32,
        numa_node: Option<u32>,
    ) -> Result<IbvReceiver, IbvError> {
        if endpoints.is_empty() {
            return Err(IbvError::Config("no endpoints to receive".into()));
        }
        let dev = super::find(interface)?;
        let slot_len = (HEADERS_LEN + max_packet).next_multiple_of(64);
        let slots = slots_for(buffer, slot_len);
        let mode = CompMode::from_vector(comp_vector);
        let ctx = Context::open(&dev.device)?;
        let pd = Pd::new(&ctx)?;
        let channel = match mode {
            CompMode::Interrupt(_) => Some(Channel::new(&ctx)?),
            CompMode::Polling => None,
        };
        let vector = match mode {
            CompMode::Interrupt(v) => v % ctx.comp_vectors(),
            CompMode::Polling => 0,
        };
        let cq = Cq::new(&ctx, slots, channel.as_ref().map(|c| (c, vector)))?;
        let qp = Qp::raw_packet(&pd, &cq, dev.port, 0, slots, 0)?;
        let device_node = numa::rdma_node(&dev.device);
        let node = ring_node(numa_node, device_node);
        let ring = RecvSlots::new(
            ring_memory(Ring::Receive, slots * slot_len, node, numa_node.is_some())?,
            slot_len,
        );
        let mr = Mr::new(&pd, Arc::clone(&ring))?;
        let flows = endpoints
            .iter()
            .map(|ep| {
                let mac = frame::multicast_mac(*ep.ip()).unwrap_or(dev.mac);
                qp.flow(&mut FlowRule::udp(dev.port, mac, *ep))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let join =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(IbvError::Verbs)?;
        for ep in endpoints.iter().filter(|e| e.ip().is_multicast()) {
            join.join_multicast_v4(ep.ip(), &dev.addr)
                .map_err(IbvError::Verbs)?;
        }
        let mut r = IbvReceiver {
            _flows: flows,
            qp,
            cq,
            _channel: channel,
            mr,
            _pd: pd,
            _ctx: ctx,
            _join: join,
            lender: Arc::clone(&ring) as Arc<dyn Lender>,
            slots: ring,
            wrs: vec![ffi::ibv_recv_wr::default(); slots],
            sges: vec![ffi::ibv_sge::default(); slots],
            // SAFETY: ibv_wc is plain data; zero is a valid (unused) completion.
            wcs: vec![unsafe { std::mem::zeroed() }; POLL_BATCH],
            completed: Vec::with_capacity(POLL_BATCH),
            to_post: Vec::with_capacity(slots),
            mode,
            drops: FrameDrops::default(),
            failed_completions: 0,
            device_node,
            ring_node: node,
        };
        r.post(0..slots)?;
        tracing::info!(interface, device = %dev.device, port = dev.port, slots, mode = %mode, numa_node = ?node, "ibverbs receiver");
        Ok(r)
    }

    /// Hand slots back to the NIC, as one chain.
    fn post(&mut self, slots: impl Iterator<Item = usize>) -> io::Result<()> {
        let (base, lkey) = (self.mr.addr(), self.mr.lkey());
        let slot_len = self.slots.slot_len();
        let mut first: Option<usize> = None;
        let mut prev: Option<usize> = None;
        for s in slots {
            fill_recv(&mut self.wrs[s], &mut self.sges[s], base, s, slot_len, lkey);
            let this: *mut ffi::ibv_recv_wr = &mut self.wrs[s];
            match prev {
                Some(p) => self.wrs[p].next = this,
                None => first = Some(s),
            }
            prev = Some(s);
        }
        match first {
            // SAFETY: the chain was just built over this receiver's slots, none of them posted
            // or lent (`recv_slots`); the NIC owns them until their completions come back.
            Some(f) => unsafe { self.qp.post_recv(&mut self.wrs[f]) },
            None => Ok(()),
        }
    }

    /// Frames refused, by cause.
    pub fn drops(&self) -> FrameDrops {
        self.drops
    }

    /// Wait for completions as the mode says, up to [`POLL_INTERVAL`]; how many arrived.
    fn poll(&mut self, cap: usize) -> io::Result<usize> {
        let start = Instant::now();
        loop {
            let n = self.cq.poll(&mut self.wcs[..cap])?;
            if n > 0 || start.elapsed() >= POLL_INTERVAL {
                return Ok(n);
            }
            match self.mode {
                CompMode::Polling => std::hint::spin_loop(),
                CompMode::Interrupt(_) => {
                    self.cq.wait(POLL_INTERVAL.as_millis() as i32)?;
                    return self.cq.poll(&mut self.wcs[..cap]);
                }
            }
        }
    }
}

impl PacketReceiver for IbvReceiver {
    fn numa_node(&self) -> Option<u32> {
        self.device_node
    }

    /// The slots were bound when the receiver opened, before registration pinned them (a
    /// failure then was reported); registered pages cannot move to another node now.
    fn bind_memory(&mut self, node: u32) -> Result<(), NumaError> {
        if self.ring_node == Some(node) {
            return Ok(());
        }
        Err(NumaError::Bind {
            node,
            bytes: self.slots.bytes(),
            error: format!(
                "the ibverbs receive ring is registered (pinned) and was placed on {:?} when it opened",
                self.ring_node
            ),
        })
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        // Clearing gives back the slots this batch held; they are posted below with the
        // others given back since the last call (and any a call that failed to poll left).
        batch.clear();
        self.slots.take_returned(&mut self.to_post);
        let cap = batch.capacity().min(self.wcs.len());
        let n = self.poll(cap)?;
        self.completed.clear();
        for wc in &self.wcs[..n] {
            let valid = wc.is_valid();
            if !valid && self.failed_completions == 0 {
                tracing::warn!(status = ?wc.error(), "ibverbs receive completion failed");
            }
            self.completed.push(Completion {
                slot: wc.wr_id(),
                len: valid.then(|| wc.len()),
            });
        }
        self.failed_completions += lend_completed(
            &self.slots,
            &self.lender,
            &self.completed,
            batch,
            &mut self.drops,
            &mut self.to_post,
        ) as u64;
        let to_post = std::mem::take(&mut self.to_post);
        let posted = self.post(to_post.iter().copied());
        self.to_post = to_post;
        self.to_post.clear();
        posted?;
        Ok(if batch.is_empty() {
            Received::Idle
        } else {
            Received::Packets(batch.len())
        })
    }
}
