//! Sending through a raw-packet queue pair (see the module doc of `net::ibv`).
//!
//! With device memory to send from (`--use-peerdirect`, seed 000 §PeerDirect), each region is
//! registered with the NIC when the sender opens, and a packet whose payload lies there goes
//! out as a gather of two entries: its Ethernet/IPv4/UDP and SPEAD headers written into the
//! ring slot, then its payload read by the NIC straight from GPU memory (`send_frames`). Such
//! payload must not change until the NIC is done with it: [`PacketSender::wait_sent`] waits
//! for every completion or, when the link fails, until the queue pair has been reset so that
//! the NIC reads none of it again (`send_queue`, which also says how a failure is found and
//! reported).

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ibverbs_sys as ffi;

use super::placement::send_ring_memory;
use super::send_frames::{fill_chain, Ring};
use super::send_queue::{operstate_up, Completion, Nic, SendQueue};
use super::verbs::{chain_send, Channel, Context, Cq, Gather, Mr, Pd, Qp, SEND_SGES};
use super::{slots_for, CompMode, IbvError};
use crate::net::frame::{self, FrameHeaders, HEADERS_LEN};
use crate::net::{DeviceBytes, DeviceMemory, PacketSender, SendBatch};

/// Most requests posted as one chain (one doorbell, one signalled completion).
const MAX_CHAIN: usize = 64;

/// How long an interrupt-mode wait sleeps on the completion channel before looking again.
const SLEEP_MS: i32 = 20;

/// The verbs side of the send ring: the queue pair, its completion queue and channel (fields
/// drop in that order).
struct VerbsNic {
    qp: Qp,
    cq: Cq,
    _channel: Option<Channel>,
    mode: CompMode,
    port: u8,
    /// `/sys/class/net/<interface>/operstate`.
    operstate: PathBuf,
    wcs: Vec<ffi::ibv_wc>,
}

impl Nic for VerbsNic {
    unsafe fn post(&mut self, first: *mut ffi::ibv_send_wr) -> io::Result<()> {
        // SAFETY: the caller's promise (`Nic::post`).
        unsafe { self.qp.post_send(first) }
    }

    fn poll(&mut self, out: &mut [Completion]) -> io::Result<usize> {
        let n = out.len().min(self.wcs.len());
        let got = self.cq.poll(&mut self.wcs[..n])?;
        for (o, wc) in out.iter_mut().zip(&self.wcs[..got]) {
            *o = match wc.error() {
                None => Completion::Sent(wc.wr_id() as usize),
                Some((status, vendor)) => Completion::Failed {
                    status: status_str(status),
                    vendor,
                },
            };
        }
        Ok(got)
    }

    fn idle(&mut self) -> io::Result<()> {
        match self.mode {
            CompMode::Polling => {
                std::hint::spin_loop();
                Ok(())
            }
            CompMode::Interrupt(_) => self.cq.wait(SLEEP_MS),
        }
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn link_up(&self) -> bool {
        // Unreadable (no sysfs in a container): no word from the kernel, so the completions
        // decide.
        std::fs::read_to_string(&self.operstate).map_or(true, |s| operstate_up(&s))
    }

    fn reset(&mut self) -> io::Result<()> {
        self.qp.reset()?;
        // Completions of requests from before the reset, where the driver left any: they are
        // not the ring's any more.
        while self.cq.poll(&mut self.wcs)? > 0 {}
        self.qp.ready_to_send(self.port)
    }
}

/// `ibv_wc_status_str`'s name for `status`.
fn status_str(status: ffi::ibv_wc_status::Type) -> &'static str {
    // SAFETY: libibverbs returns a pointer to a static string for any status (an "unknown"
    // one for values it does not know).
    unsafe { std::ffi::CStr::from_ptr(ffi::ibv_wc_status_str(status)) }
        .to_str()
        .unwrap_or("unknown status")
}

/// A sender to a list of multicast destinations from one interface. Fields drop in order:
/// the queue pair, its completion queue and channel, the memory, the domain, the device.
pub struct IbvSender {
    queue: SendQueue<VerbsNic>,
    mr: Mr,
    /// Device memory packets may gather payload from, registered (kept for the registrations'
    /// life; dropped before the domain).
    _device: Vec<Mr<Arc<dyn DeviceMemory>>>,
    /// Each registration's range and lkey, for `send_frames::device_entry`.
    device_keys: Vec<(DeviceBytes, u32)>,
    _pd: Pd,
    _ctx: Context,
    /// Holds the UDP source port the frames carry, so that no kernel socket takes it.
    _port: UdpSocket,
    headers: Vec<FrameHeaders>,
    slot_len: usize,
    wrs: Vec<ffi::ibv_send_wr>,
    sges: Vec<ffi::ibv_sge>,
    frames: Vec<Gather>,
    ident: u16,
}

// SAFETY: as for `IbvReceiver`: the work requests point only into this sender's own heap
// allocations, and the verbs objects may be used from any thread, one at a time.
unsafe impl Send for IbvSender {}

impl IbvSender {
    /// Send to `dests` (IPv4 multicast: unicast would need ARP, which a raw queue pair does
    /// not do, as in spead2) from `interface` with `ttl`, through a ring of `buffer` bytes of
    /// frames of up to `max_packet` UDP payload bytes; completions per `comp_vector`
    /// (katgpucbf's `--send-comp-vector`: ≥ 0 interrupts, < 0 polling). Packets may gather
    /// payload from `device` memory, which is registered now.
    pub fn open(
        dests: &[SocketAddrV4],
        interface: &str,
        ttl: u32,
        buffer: usize,
        max_packet: usize,
        comp_vector: i32,
        device: &[Arc<dyn DeviceMemory>],
    ) -> Result<IbvSender, IbvError> {
        if dests.is_empty() {
            return Err(IbvError::Config("no destinations to send to".into()));
        }
        let dev = super::find(interface)?;
        let port = UdpSocket::bind(SocketAddrV4::new(dev.addr, 0)).map_err(IbvError::Verbs)?;
        let std::net::SocketAddr::V4(src) = port.local_addr().map_err(IbvError::Verbs)? else {
            return Err(IbvError::Config("the source port is not IPv4".into()));
        };
        let ttl = u8::try_from(ttl).map_err(|_| IbvError::Config(format!("TTL {ttl} > 255")))?;
        let headers = dests
            .iter()
            .map(|d| {
                let mac = frame::dest_mac(*d.ip(), None).map_err(|e| {
                    IbvError::Config(format!("{e} (ibverbs sends to multicast only)"))
                })?;
                Ok(FrameHeaders::new(dev.mac, src, mac, *d, ttl))
            })
            .collect::<Result<Vec<_>, IbvError>>()?;
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
        let sges = if device.is_empty() {
            1
        } else {
            SEND_SGES as u32
        };
        let qp = Qp::raw_packet(&pd, &cq, dev.port, slots, 0, sges)?;
        // Bound to the device's node before registration pins it (`placement`).
        let (ring, node) = send_ring_memory(Path::new("/sys"), &dev.device, slots * slot_len)?;
        let mr = Mr::new(&pd, ring)?;
        let device = device
            .iter()
            .map(|m| Mr::new(&pd, Arc::clone(m)).map_err(|e| peer_error(&dev.device, e)))
            .collect::<Result<Vec<_>, _>>()?;
        let device_keys = device
            .iter()
            .map(|m| {
                let range = DeviceBytes {
                    addr: m.addr(),
                    len: m.len(),
                };
                (range, m.lkey())
            })
            .collect();
        tracing::info!(interface, device = %dev.device, port = dev.port, slots, mode = %mode, numa_node = ?node, gpu_regions = device.len(), "ibverbs sender");
        let nic = VerbsNic {
            qp,
            cq,
            _channel: channel,
            mode,
            port: dev.port,
            operstate: Path::new("/sys/class/net")
                .join(&dev.netdev)
                .join("operstate"),
            // SAFETY: ibv_wc is plain data; zero is a valid (unused) completion.
            wcs: vec![unsafe { std::mem::zeroed() }; MAX_CHAIN],
        };
        Ok(IbvSender {
            queue: SendQueue::new(nic, slots, MAX_CHAIN),
            mr,
            _device: device,
            device_keys,
            _pd: pd,
            _ctx: ctx,
            _port: port,
            headers,
            slot_len,
            wrs: vec![ffi::ibv_send_wr::default(); MAX_CHAIN],
            sges: vec![ffi::ibv_sge::default(); MAX_CHAIN * SEND_SGES],
            frames: Vec::with_capacity(MAX_CHAIN),
            ident: 0,
        })
    }
}

impl PacketSender for IbvSender {
    fn destinations(&self) -> usize {
        self.headers.len()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let mut i = 0;
        while i < batch.len() {
            // A chain never wraps the ring, so that its slots are contiguous in completion order.
            let (first, room) = self.queue.room(i)?;
            let chunk = room.min(batch.len() - i).min(MAX_CHAIN);
            self.frames.clear();
            let ring = Ring {
                addr: self.mr.addr(),
                slot_len: self.slot_len,
                first,
            };
            let wire = (self.headers.as_slice(), self.device_keys.as_slice());
            let packets = (batch, i..i + chunk);
            let bytes = self.mr.bytes_mut();
            fill_chain(
                bytes,
                ring,
                packets,
                wire,
                &mut self.ident,
                &mut self.frames,
            )?;
            chain_send(&mut self.wrs, &mut self.sges, &self.frames, self.mr.lkey());
            // SAFETY: the chain covers slots this sender owns and does not touch again until
            // their completion is reaped or the queue pair reset (the queue counts them), and
            // device payload in registered regions, which the caller keeps until `wait_sent`
            // (the trait's contract).
            unsafe { self.queue.post(&mut self.wrs[0], chunk, i)? };
            i += chunk;
        }
        Ok(())
    }

    fn wait_sent(&mut self) -> io::Result<()> {
        self.queue.wait_sent()
    }
}

/// A registration of device memory failed: most often because GPUDirect RDMA is not set up.
fn peer_error(device: &str, e: io::Error) -> IbvError {
    IbvError::Config(format!(
        "registering GPU memory with {device} failed ({e}): --use-peerdirect needs GPUDirect \
         RDMA (the nvidia_peermem kernel module loaded)"
    ))
}
