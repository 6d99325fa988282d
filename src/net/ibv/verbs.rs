//! The verbs objects a raw-packet queue pair needs, each owned by a small RAII type, and the
//! work requests as plain data.
//!
//! What comes from where: `ibverbs-sys` (the `ibverbs` crate's FFI layer, bindgen over
//! rdma-core's `verbs.h`) gives the structure layouts and the exported functions (open a
//! device, protection domain, memory registration, completion channel and queue, queue pair
//! and its state changes); `ffi/ibv_shim.c` gives the inline ones it cannot bind (post, poll,
//! arm, flow steering). The `ibverbs` crate's own safe types are not used past device
//! enumeration: they hide the raw handles a raw-packet queue pair is built from (no `lkey`,
//! no context pointer), open port 1 only, create completion queues without a channel or
//! vector, and panic in `Drop` on an error.
//!
//! Work requests are filled by pure functions ([`chain_send`], [`fill_recv`]) so that their
//! layout (a send gathers its frame from the ring and, with `--use-peerdirect`, its payload
//! from a registered region of GPU memory; linked in order, only the last send signalled and
//! carrying the count) is tested without a device.

use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::ptr;
use std::sync::Arc;

use ibverbs_sys as ffi;

use crate::net::DeviceMemory;

extern "C" {
    fn cbf_ibv_post_send(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int;
    fn cbf_ibv_post_recv(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_recv_wr,
        bad: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int;
    fn cbf_ibv_poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int;
    fn cbf_ibv_req_notify_cq(cq: *mut ffi::ibv_cq, solicited_only: c_int) -> c_int;
    fn cbf_ibv_flow_rule_size() -> usize;
    fn cbf_ibv_flow_rule_fill(
        out: *mut c_void,
        port: u8,
        match_ip: c_int,
        dst_mac: *const u8,
        dst_ip_be: u32,
        dst_port: u16,
    );
    fn cbf_ibv_create_flow(qp: *mut ffi::ibv_qp, rule: *mut c_void) -> *mut ffi::ibv_flow;
    fn cbf_ibv_destroy_flow(flow: *mut ffi::ibv_flow) -> c_int;
}

// The C compiler's view of the layouts, for the tests that hold bindgen's against it.
#[cfg(test)]
extern "C" {
    pub(super) fn cbf_ibv_layout(out: *mut usize);
    pub(super) fn cbf_ibv_flow_rule_offsets(out: *mut usize);
}

/// A verbs call that failed, with the errno it left.
pub(super) fn failed(op: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{op}: {e}"))
}

/// `status` (an errno returned, not set) of verbs call `op`.
pub(super) fn check(op: &'static str, status: c_int) -> io::Result<()> {
    if status == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(status.abs());
        Err(io::Error::new(e.kind(), format!("{op}: {e}")))
    }
}

/// An open device.
pub struct Context(pub(super) *mut ffi::ibv_context);

// SAFETY: verbs objects may be used from any thread (libibverbs locks internally); each
// transport owns its objects and uses them from one thread at a time.
unsafe impl Send for Context {}

impl Context {
    /// Open the RDMA device called `name`.
    pub fn open(name: &str) -> io::Result<Context> {
        let mut n = 0;
        // SAFETY: the list is read while it is alive and freed once; the context outlives it.
        unsafe {
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() {
                return Err(failed("ibv_get_device_list"));
            }
            let mut ctx = ptr::null_mut();
            for i in 0..usize::try_from(n).unwrap_or(0) {
                let dev = *list.add(i);
                let dev_name = ffi::ibv_get_device_name(dev);
                if !dev_name.is_null() && CStr::from_ptr(dev_name).to_bytes() == name.as_bytes() {
                    ctx = ffi::ibv_open_device(dev);
                    break;
                }
            }
            let err = failed("ibv_open_device");
            ffi::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(err);
            }
            Ok(Context(ctx))
        }
    }

    pub fn comp_vectors(&self) -> u32 {
        // SAFETY: the context is open.
        unsafe { (*self.0).num_comp_vectors.max(1) as u32 }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; everything made from it is dropped before (the
        // owning structs declare it last).
        unsafe { ffi::ibv_close_device(self.0) };
    }
}

/// A protection domain.
pub struct Pd(pub(super) *mut ffi::ibv_pd);
// SAFETY: as for Context.
unsafe impl Send for Pd {}

impl Pd {
    pub fn new(ctx: &Context) -> io::Result<Pd> {
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.0) };
        if pd.is_null() {
            return Err(failed("ibv_alloc_pd"));
        }
        Ok(Pd(pd))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; its QPs and MRs are dropped before.
        unsafe { ffi::ibv_dealloc_pd(self.0) };
    }
}

/// Memory a registration covers.
///
/// # Safety
/// [`Region::region`] must give the same address and length for as long as the value lives,
/// and that memory must stay allocated (and not move) meanwhile.
pub unsafe trait Region: Send {
    fn region(&self) -> (*mut u8, usize);
}

// SAFETY: a Vec that is not resized keeps its allocation; `Mr` hands out only slices of it.
unsafe impl Region for Vec<u8> {
    fn region(&self) -> (*mut u8, usize) {
        (self.as_ptr().cast_mut(), self.len())
    }
}

// SAFETY: `DeviceMemory`'s contract is `Region`'s: the range stays allocated, unmoved, while
// the value lives. The pointer is a device address: the NIC reads it (through nvidia_peermem);
// nothing on the host dereferences it (`Mr::bytes_mut` exists only for vectors).
unsafe impl Region for Arc<dyn DeviceMemory> {
    fn region(&self) -> (*mut u8, usize) {
        let b = self.bytes();
        (b.addr as *mut u8, b.len)
    }
}

/// Registered memory: bytes the NIC reads (send) or writes (receive) directly, owned by `M`: a
/// vector (the send ring), memory shared with the batches its slots are lent to (the
/// receive ring, `recv_slots`), or GPU memory the NIC reads payload from (`--use-peerdirect`:
/// `ibv_reg_mr` on a CUDA device address, which the `nvidia_peermem` kernel module resolves).
pub struct Mr<M: Region = Vec<u8>> {
    mr: *mut ffi::ibv_mr,
    mem: M,
}
// SAFETY: as for Context.
unsafe impl<M: Region> Send for Mr<M> {}

impl<M: Region> Mr<M> {
    /// Register `mem` (allocated and placed by the caller: pages bound to a NUMA node must be
    /// bound before this, since registration pins them).
    pub fn new(pd: &Pd, mem: M) -> io::Result<Mr<M>> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        let (addr, len) = mem.region();
        // SAFETY: the memory lives as long as the registration (`mem` is dropped after it, see
        // Drop) and stays where it is (`Region`).
        let mr = unsafe { ffi::ibv_reg_mr(pd.0, addr.cast(), len, access) };
        if mr.is_null() {
            return Err(failed("ibv_reg_mr"));
        }
        Ok(Mr { mr, mem })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: registered.
        unsafe { (*self.mr).lkey }
    }

    pub fn addr(&self) -> u64 {
        self.mem.region().0 as u64
    }

    pub fn len(&self) -> usize {
        self.mem.region().1
    }
}

impl Mr<Vec<u8>> {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }
}

impl<M: Region> Drop for Mr<M> {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr; the memory is released (by `mem`) after this.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A completion channel: the file descriptor a thread sleeps on in interrupt mode.
pub struct Channel(pub(super) *mut ffi::ibv_comp_channel);
// SAFETY: as for Context.
unsafe impl Send for Channel {}

impl Channel {
    pub fn new(ctx: &Context) -> io::Result<Channel> {
        // SAFETY: the context is open.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.0) };
        if ch.is_null() {
            return Err(failed("ibv_create_comp_channel"));
        }
        // Non-blocking, so that draining events after a poll() never blocks.
        // SAFETY: fd belongs to the channel.
        unsafe {
            let fd = (*ch).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Ok(Channel(ch))
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel; its CQ is dropped before.
        unsafe { ffi::ibv_destroy_comp_channel(self.0) };
    }
}

/// A completion queue, on a channel's `vector` in interrupt mode or polled.
pub struct Cq {
    cq: *mut ffi::ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
}
// SAFETY: as for Context.
unsafe impl Send for Cq {}

impl Cq {
    pub fn new(ctx: &Context, entries: usize, channel: Option<(&Channel, u32)>) -> io::Result<Cq> {
        let (ch, vector) = channel.map_or((ptr::null_mut(), 0), |(c, v)| (c.0, v));
        let n = c_int::try_from(entries).unwrap_or(c_int::MAX);
        // SAFETY: the context and channel are open; no user context pointer.
        let cq = unsafe { ffi::ibv_create_cq(ctx.0, n, ptr::null_mut(), ch, vector as c_int) };
        if cq.is_null() {
            return Err(failed("ibv_create_cq"));
        }
        Ok(Cq { cq, channel: ch })
    }

    /// Own `cq`, made some other way (the extended queue of `mprq_verbs`), on `channel` if any.
    ///
    /// # Safety
    /// `cq` is a live completion queue that nothing else destroys, created on `channel`.
    pub(super) unsafe fn from_raw(cq: *mut ffi::ibv_cq, channel: Option<&Channel>) -> Cq {
        Cq {
            cq,
            channel: channel.map_or(ptr::null_mut(), |c| c.0),
        }
    }

    /// Up to `wcs.len()` completions; how many.
    pub fn poll(&self, wcs: &mut [ffi::ibv_wc]) -> io::Result<usize> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: wcs has room for n entries.
        let got = unsafe { cbf_ibv_poll_cq(self.cq, n, wcs.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| io::Error::other("ibv_poll_cq failed"))
    }

    /// Interrupt mode: sleep until a completion arrives or `timeout_ms` passes. Arms the
    /// queue, and returns at once if completions are already there (the caller polls again).
    pub fn wait(&self, timeout_ms: i32) -> io::Result<()> {
        if self.channel.is_null() {
            return Ok(());
        }
        // SAFETY: cq and channel are alive; events are acknowledged one for one.
        unsafe {
            check("ibv_req_notify_cq", cbf_ibv_req_notify_cq(self.cq, 0))?;
            let mut pfd = libc::pollfd {
                fd: (*self.channel).fd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, timeout_ms) < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            while ffi::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) == 0 {
                ffi::ibv_ack_cq_events(cq, 1);
            }
        }
        Ok(())
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; its QP is dropped before.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

/// A raw-packet queue pair (whole Ethernet frames in and out, CAP_NET_RAW needed).
pub struct Qp(*mut ffi::ibv_qp);
// SAFETY: as for Context.
unsafe impl Send for Qp {}

/// The errno a queue pair's creation (`op`) left, with the likely cause when it is a
/// permission one.
pub(super) fn qp_failed(op: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    let hint = if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EPERM) {
        " (raw-packet queue pairs need CAP_NET_RAW)"
    } else {
        ""
    };
    io::Error::new(e.kind(), format!("{op}: {e}{hint}"))
}

impl Qp {
    /// Own `qp`, made some other way (the RSS queue pair of `mprq_verbs`).
    ///
    /// # Safety
    /// `qp` is a live queue pair that nothing else destroys.
    pub(super) unsafe fn from_raw(qp: *mut ffi::ibv_qp) -> Qp {
        Qp(qp)
    }

    /// A queue pair on `port` with `send` send slots or `recv` receive slots (the other 0),
    /// brought to the state where it works: receive-only to RTR, send to RTS. Sends gather
    /// from up to `send_sge` entries.
    pub fn raw_packet(
        pd: &Pd,
        cq: &Cq,
        port: u8,
        send: usize,
        recv: usize,
        send_sge: u32,
    ) -> io::Result<Qp> {
        let mut attr = ffi::ibv_qp_init_attr {
            send_cq: cq.cq,
            recv_cq: cq.cq,
            qp_type: ffi::ibv_qp_type::IBV_QPT_RAW_PACKET,
            ..Default::default()
        };
        attr.cap.max_send_wr = send as u32;
        attr.cap.max_recv_wr = recv as u32;
        attr.cap.max_send_sge = if send > 0 { send_sge.max(1) } else { 0 };
        attr.cap.max_recv_sge = u32::from(recv > 0);
        // SAFETY: pd and cq are alive.
        let qp = unsafe { ffi::ibv_create_qp(pd.0, &mut attr) };
        if qp.is_null() {
            return Err(qp_failed("ibv_create_qp"));
        }
        let qp = Qp(qp);
        qp.modify(ffi::ibv_qp_state::IBV_QPS_INIT, Some(port))?;
        qp.modify(ffi::ibv_qp_state::IBV_QPS_RTR, None)?;
        if send > 0 {
            qp.modify(ffi::ibv_qp_state::IBV_QPS_RTS, None)?;
        }
        Ok(qp)
    }

    /// Move to RESET: the NIC drops every request posted and reads none of them again (what
    /// a send queue does when its link fails under them, `send_queue`).
    pub fn reset(&self) -> io::Result<()> {
        self.modify(ffi::ibv_qp_state::IBV_QPS_RESET, None)
    }

    /// From RESET back to where a send queue on `port` sends (INIT, RTR, RTS), as
    /// [`Qp::raw_packet`] brings a new one.
    pub fn ready_to_send(&self, port: u8) -> io::Result<()> {
        self.modify(ffi::ibv_qp_state::IBV_QPS_INIT, Some(port))?;
        self.modify(ffi::ibv_qp_state::IBV_QPS_RTR, None)?;
        self.modify(ffi::ibv_qp_state::IBV_QPS_RTS, None)
    }

    fn modify(&self, state: ffi::ibv_qp_state::Type, port: Option<u8>) -> io::Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let mut mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE;
        if let Some(p) = port {
            attr.port_num = p;
            mask |= ffi::ibv_qp_attr_mask::IBV_QP_PORT;
        }
        // SAFETY: the QP is alive; attr is filled for the mask given.
        check("ibv_modify_qp", unsafe {
            ffi::ibv_modify_qp(self.0, &mut attr, mask.0 as c_int)
        })
    }

    /// Post a chain of send requests starting at `first`.
    ///
    /// # Safety
    /// `first` heads a chain built by [`chain_send`] whose SGEs point into registered memory
    /// that stays untouched until the signalled request completes.
    pub unsafe fn post_send(&self, first: *mut ffi::ibv_send_wr) -> io::Result<()> {
        let mut bad = ptr::null_mut();
        check("ibv_post_send", cbf_ibv_post_send(self.0, first, &mut bad))
    }

    /// Post a chain of receive requests starting at `first`.
    ///
    /// # Safety
    /// As [`Qp::post_send`], for [`fill_recv`]'s requests: the slots they point to belong to
    /// the NIC until their completion.
    pub unsafe fn post_recv(&self, first: *mut ffi::ibv_recv_wr) -> io::Result<()> {
        let mut bad = ptr::null_mut();
        check("ibv_post_recv", cbf_ibv_post_recv(self.0, first, &mut bad))
    }

    /// Steer UDP datagrams matching `rule` to this queue pair.
    pub fn flow(&self, rule: &mut FlowRule) -> io::Result<Flow> {
        // SAFETY: the rule buffer holds a rule filled by the shim.
        let f = unsafe { cbf_ibv_create_flow(self.0, rule.0.as_mut_ptr().cast()) };
        if f.is_null() {
            return Err(failed("ibv_create_flow"));
        }
        Ok(Flow(f))
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp; its flows are dropped before.
        unsafe { ffi::ibv_destroy_qp(self.0) };
    }
}

/// A steering rule in place.
pub struct Flow(*mut ffi::ibv_flow);
// SAFETY: as for Context.
unsafe impl Send for Flow {}

impl Drop for Flow {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_flow.
        unsafe { cbf_ibv_destroy_flow(self.0) };
    }
}

/// A flow rule as verbs.h lays it out (filled by the shim, so that layout is the C
/// compiler's): UDP to one destination port, and to one IPv4 address in frames to one MAC
/// unless the address is unspecified.
pub struct FlowRule(Vec<u8>);

impl FlowRule {
    pub fn udp(port: u8, dst_mac: [u8; 6], dst: std::net::SocketAddrV4) -> FlowRule {
        // SAFETY: size comes from the shim; fill writes exactly that many bytes.
        unsafe {
            let mut buf = vec![0u8; cbf_ibv_flow_rule_size()];
            let any = dst.ip().is_unspecified();
            cbf_ibv_flow_rule_fill(
                buf.as_mut_ptr().cast(),
                port,
                c_int::from(!any),
                dst_mac.as_ptr(),
                u32::from_ne_bytes(dst.ip().octets()),
                dst.port(),
            );
            FlowRule(buf)
        }
    }

    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Most gather entries one send uses: the frame in the ring, then payload in device memory.
pub const SEND_SGES: usize = 2;

/// One packet as the NIC gathers it: its frame's host bytes (address and length in the ring),
/// then, with `--use-peerdirect`, its payload in a registered region of device memory
/// (address, length, that region's lkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    pub frame: (u64, u32),
    pub device: Option<(u64, u32, u32)>,
}

/// Link `wrs[..n]` into one chain of sends, in order, request i gathering `frames[i]` through
/// `sges[SEND_SGES·i..]` (the frame registered under `lkey`, then its device part under its
/// own); only the last is signalled, and it carries `n` as its id so that one completion
/// returns `n` slots.
pub fn chain_send(
    wrs: &mut [ffi::ibv_send_wr],
    sges: &mut [ffi::ibv_sge],
    frames: &[Gather],
    lkey: u32,
) {
    let n = frames.len();
    for (i, g) in frames.iter().enumerate() {
        let (addr, length) = g.frame;
        sges[SEND_SGES * i] = ffi::ibv_sge { addr, length, lkey };
        if let Some((addr, length, lkey)) = g.device {
            sges[SEND_SGES * i + 1] = ffi::ibv_sge { addr, length, lkey };
        }
    }
    let base = wrs.as_mut_ptr();
    for i in 0..n {
        let w = &mut wrs[i];
        *w = ffi::ibv_send_wr::default();
        w.sg_list = &mut sges[SEND_SGES * i];
        w.num_sge = 1 + i32::from(frames[i].device.is_some());
        w.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        // SAFETY: i + 1 ≤ n ≤ wrs.len(): a pointer into (or one past) the slice.
        w.next = if i + 1 < n {
            unsafe { base.add(i + 1) }
        } else {
            ptr::null_mut()
        };
        if i + 1 == n {
            w.wr_id = n as u64;
            w.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
    }
}

/// Fill receive request `wr` for slot `slot` of `slot_len` bytes at `base` (registered under
/// `lkey`): one SGE, the slot index as its id, unlinked.
pub fn fill_recv(
    wr: &mut ffi::ibv_recv_wr,
    sge: &mut ffi::ibv_sge,
    base: u64,
    slot: usize,
    slot_len: usize,
    lkey: u32,
) {
    *sge = ffi::ibv_sge {
        addr: base + (slot * slot_len) as u64,
        length: slot_len as u32,
        lkey,
    };
    *wr = ffi::ibv_recv_wr {
        wr_id: slot as u64,
        next: ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
    };
}
