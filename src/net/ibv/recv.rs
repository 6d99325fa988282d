//! Receiving through a raw-packet queue pair (see the module doc of `net::ibv`): frames are
//! lent to the caller's batch where the NIC wrote them, and their memory goes back to the
//! receive queue when the batch gives them back. The receive queue is chosen when the receiver
//! opens (`--recv-ibv-mprq`, [`StridingRq`]): a striding (multi-packet) queue where the device
//! has one (`recv_mprq`), else one ring slot per frame ([`SlotQueue`], `recv_slots`).

use std::io;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use socket2::{Domain, Protocol, Socket, Type};

use super::mprq_verbs::{plan, StridingCaps, StridingPlan};
use super::placement::{ring_memory, ring_node, Ring};
use super::recv_mprq::StridingQueue;
use super::recv_slots::{lend_completed, Completion, RecvSlots};
use super::verbs::{fill_recv, Channel, Context, Cq, Flow, FlowRule, Mr, Pd, Qp};
use super::{slots_for, CompMode, IbvError, StridingRq};
use crate::net::frame::{self, FrameDrops, HEADERS_LEN};
use crate::net::numa::{self, NumaError};
use crate::net::recv_batch::Lender;
use crate::net::{PacketReceiver, Received, RecvBatch};

/// How long a receive call waits for frames before it returns [`Received::Idle`] (as the UDP
/// transport's poll interval).
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Frames per completion poll.
pub(super) const POLL_BATCH: usize = 64;

/// A receiver for `endpoints` on one interface. Fields drop in order: the steering rules,
/// then the receive queue (queue pair, work queue, completion queue, registration), the
/// channel, the domain, the device; the ring's memory goes with the last of the receiver and
/// the batches holding frames in it.
pub struct IbvReceiver {
    _flows: Vec<Flow>,
    queue: Queue,
    _channel: Option<Channel>,
    _pd: Pd,
    _ctx: Context,
    /// Joins the multicast groups (IGMP), so that the switch forwards them to this port.
    _join: Socket,
    /// The receive memory, and the same object as batches hold it.
    ring: Arc<RecvSlots>,
    lender: Arc<dyn Lender>,
    mode: CompMode,
    drops: FrameDrops,
    /// The RDMA device's NUMA node, where known (the engine's chunks go there).
    device_node: Option<u32>,
    /// The node the ring was bound to before registration, if any.
    ring_node: Option<u32>,
}

/// The receive queue behind the queue pair.
enum Queue {
    Slots(SlotQueue),
    Striding(StridingQueue),
}

impl IbvReceiver {
    /// Steer `endpoints` arriving on `interface` (a name or an address) into `buffer` bytes
    /// of receive memory for frames of up to `max_packet` UDP payload bytes, through a
    /// striding queue as `striding` says; completions per `comp_vector` (katgpucbf's
    /// `--recv-comp-vector`: ≥ 0 interrupts, < 0 polling). The memory is bound to `numa_node`
    /// (`--recv-numa-node`: a failure is an error) or else the device's node (a failure is
    /// logged) before it is registered.
    pub fn open(
        endpoints: &[SocketAddrV4],
        interface: &str,
        buffer: usize,
        max_packet: usize,
        comp_vector: i32,
        numa_node: Option<u32>,
        striding: StridingRq,
    ) -> Result<IbvReceiver, IbvError> {
        if endpoints.is_empty() {
            return Err(IbvError::Config("no endpoints to receive".into()));
        }
        let dev = super::find(interface)?;
        let frame_len = HEADERS_LEN + max_packet;
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
        let on = channel.as_ref().map(|c| (c, vector));
        let device_node = numa::rdma_node(&dev.device);
        let node = ring_node(numa_node, device_node);
        let memory = |count: usize, len: usize| -> Result<Arc<RecvSlots>, IbvError> {
            let bytes = RecvSlots::bytes_for(count, len);
            let mem = ring_memory(Ring::Receive, bytes, node, numa_node.is_some())?;
            Ok(RecvSlots::new(mem, len, count))
        };
        let striding_queue = match striding_plan(&ctx, striding, buffer, frame_len)? {
            Some(p) => match StridingQueue::open(&ctx, &pd, on, &p, &memory) {
                Ok(q) => Some(q),
                // A device that reported striding queues but refuses this one (spead2 falls
                // back on the same errors).
                Err(IbvError::Verbs(e))
                    if striding == StridingRq::Auto && e.kind() == io::ErrorKind::Unsupported =>
                {
                    tracing::warn!(error = %e, "ibverbs: striding receive queue refused; one slot per frame");
                    None
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        let (queue, ring, what) = match striding_queue {
            Some((q, ring)) => {
                let what = q.describe();
                (Queue::Striding(q), ring, what)
            }
            None => {
                let slot_len = frame_len.next_multiple_of(64);
                let ring = memory(slots_for(buffer, slot_len), slot_len)?;
                let q = SlotQueue::open(&ctx, &pd, on, dev.port, &ring)?;
                let what = format!("{} slots of {slot_len} bytes", ring.count());
                (Queue::Slots(q), ring, what)
            }
        };
        let qp = match &queue {
            Queue::Slots(q) => &q.qp,
            Queue::Striding(q) => q.qp(),
        };
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
        tracing::info!(interface, device = %dev.device, port = dev.port, queue = %what, mode = %mode, numa_node = ?node, "ibverbs receiver");
        Ok(IbvReceiver {
            _flows: flows,
            queue,
            _channel: channel,
            _pd: pd,
            _ctx: ctx,
            _join: join,
            lender: Arc::clone(&ring) as Arc<dyn Lender>,
            ring,
            mode,
            drops: FrameDrops::default(),
            device_node,
            ring_node: node,
        })
    }
}

/// The sizes of a striding queue for `buffer` bytes and frames of `frame_len`, if `striding`
/// asks for one and the device has it; its absence is logged when automatic, and refused
/// ([`IbvError::NoStridingRq`]) when forced.
fn striding_plan(
    ctx: &Context,
    striding: StridingRq,
    buffer: usize,
    frame_len: usize,
) -> Result<Option<StridingPlan>, IbvError> {
    if striding == StridingRq::Off {
        return Ok(None);
    }
    match StridingCaps::query(ctx).and_then(|caps| plan(&caps, buffer, frame_len)) {
        Ok(p) => {
            if p.reduced {
                tracing::warn!(
                    bytes = p.buffers * p.buffer_len(),
                    "ibverbs: receive buffer reduced to the device's queue limits"
                );
            }
            Ok(Some(p))
        }
        Err(why) if striding == StridingRq::On => Err(IbvError::NoStridingRq(why)),
        Err(why) => {
            tracing::info!(%why, "ibverbs: no striding receive queue; one slot per frame");
            Ok(None)
        }
    }
}

/// Poll with `poll` until completions come or [`POLL_INTERVAL`] passes, spinning or sleeping
/// on `cq`'s channel as `mode` says; how many came.
pub(super) fn poll_within(
    mode: CompMode,
    cq: &Cq,
    mut poll: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    let start = Instant::now();
    loop {
        let n = poll()?;
        if n > 0 || start.elapsed() >= POLL_INTERVAL {
            return Ok(n);
        }
        match mode {
            CompMode::Polling => std::hint::spin_loop(),
            CompMode::Interrupt(_) => {
                cq.wait(POLL_INTERVAL.as_millis() as i32)?;
                return poll();
            }
        }
    }
}

/// A queue pair's own receive queue with one ring slot per frame (every verbs NIC has it).
struct SlotQueue {
    qp: Qp,
    cq: Cq,
    mr: Mr<Arc<RecvSlots>>,
    wrs: Vec<ffi::ibv_recv_wr>,
    sges: Vec<ffi::ibv_sge>,
    wcs: Vec<ffi::ibv_wc>,
    /// One poll's completions, and the slots to post again (kept, so that receiving does not
    /// allocate).
    completed: Vec<Completion>,
    to_post: Vec<usize>,
    failed_completions: u64,
}

impl SlotQueue {
    /// A queue pair on `port` receiving into every slot of `ring`, completing on a queue on
    /// `on` (a channel and vector) or polled; all slots posted.
    fn open(
        ctx: &Context,
        pd: &Pd,
        on: Option<(&Channel, u32)>,
        port: u8,
        ring: &Arc<RecvSlots>,
    ) -> Result<SlotQueue, IbvError> {
        let slots = ring.count();
        let cq = Cq::new(ctx, slots, on)?;
        let qp = Qp::raw_packet(pd, &cq, port, 0, slots, 0)?;
        let mut q = SlotQueue {
            mr: Mr::new(pd, Arc::clone(ring))?,
            qp,
            cq,
            wrs: vec![ffi::ibv_recv_wr::default(); slots],
            sges: vec![ffi::ibv_sge::default(); slots],
            // SAFETY: ibv_wc is plain data; zero is a valid (unused) completion.
            wcs: vec![unsafe { std::mem::zeroed() }; POLL_BATCH],
            completed: Vec::with_capacity(POLL_BATCH),
            to_post: Vec::with_capacity(slots),
            failed_completions: 0,
        };
        q.post(ring, 0..slots)?;
        Ok(q)
    }

    /// Hand slots back to the NIC, as one chain.
    fn post(&mut self, ring: &RecvSlots, slots: impl Iterator<Item = usize>) -> io::Result<()> {
        let (base, lkey) = (ring.slot_addr(0), self.mr.lkey());
        let slot_len = ring.slot_len();
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

    /// Fill `batch` (cleared) with the frames of one poll, posting the slots given back.
    fn receive(
        &mut self,
        ring: &RecvSlots,
        lender: &Arc<dyn Lender>,
        mode: CompMode,
        batch: &mut RecvBatch,
        drops: &mut FrameDrops,
    ) -> io::Result<()> {
        // The slots given back are posted below with those this poll refuses (and any that a
        // call that failed to poll left).
        ring.take_returned(&mut self.to_post);
        let cap = batch.capacity().min(self.wcs.len());
        let n = poll_within(mode, &self.cq, || self.cq.poll(&mut self.wcs[..cap]))?;
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
            ring,
            lender,
            &self.completed,
            batch,
            drops,
            &mut self.to_post,
        ) as u64;
        let to_post = std::mem::take(&mut self.to_post);
        let posted = self.post(ring, to_post.iter().copied());
        self.to_post = to_post;
        self.to_post.clear();
        posted
    }
}

// SAFETY: the raw pointers inside the work requests point only into this receiver's own
// heap allocations (its request and SGE vectors and registered memory), which move with it;
// the verbs objects may be used from any thread, one at a time (`verbs`).
unsafe impl Send for IbvReceiver {}

impl PacketReceiver for IbvReceiver {
    fn numa_node(&self) -> Option<u32> {
        self.device_node
    }

    /// The ring was bound when the receiver opened, before registration pinned it (a failure
    /// then was reported); registered pages cannot move to another node now.
    fn bind_memory(&mut self, node: u32) -> Result<(), NumaError> {
        if self.ring_node == Some(node) {
            return Ok(());
        }
        Err(NumaError::Bind {
            node,
            bytes: self.ring.bytes(),
            error: format!(
                "the ibverbs receive ring is registered (pinned) and was placed on {:?} when it opened",
                self.ring_node
            ),
        })
    }

    fn frame_drops(&self) -> FrameDrops {
        self.drops
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        // Clearing gives back the frames this batch held.
        batch.clear();
        let (ring, lender, drops) = (&self.ring, &self.lender, &mut self.drops);
        match &mut self.queue {
            Queue::Slots(q) => q.receive(ring, lender, self.mode, batch, drops)?,
            Queue::Striding(q) => q.receive(ring, lender, self.mode, batch, drops)?,
        }
        Ok(if batch.is_empty() {
            Received::Idle
        } else {
            Received::Packets(batch.len())
        })
    }
}
