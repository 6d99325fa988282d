//! The verbs objects of a striding (multi-packet) receive queue, each owned by a small RAII
//! type over `ffi/ibv_mprq_shim.c`, and the choice of its sizes from what the device reports
//! ([`plan`], pure and tested).
//!
//! A striding queue is not a queue pair's own receive queue: it is a work queue (`ibv_wq`,
//! created through mlx5 direct verbs with striding attributes) behind a one-entry indirection
//! table, which a raw-packet queue pair hashes its frames over (RSS with no hash fields: all to
//! the one queue); the steering rules attach to that queue pair as to the plain one. Its
//! completions come through an extended completion queue that reports each one's byte count
//! word ([`StrideWc`], decoded by `mprq_ledger`). This is how spead2's `udp_ibv` reader builds
//! its multi-packet receive queue on ConnectX-4 and later, and the device probe asks what
//! spead2's asks: striding support, multi-packet WQEs allowed, and raw-packet queue pairs among
//! those that may use it.

use std::ffi::c_int;
use std::io;

use ibverbs_sys as ffi;

use super::mprq_ledger::MAX_STRIDES_LOG;
use super::verbs::{check, failed, qp_failed, Channel, Context, Cq, Pd, Qp};

/// The shim's striding work queue (opaque).
#[repr(C)]
pub struct RawWq {
    _private: [u8; 0],
}

extern "C" {
    fn cbf_mprq_query(ctx: *mut ffi::ibv_context, caps: *mut StridingCaps) -> c_int;
    fn cbf_cqx_create(
        ctx: *mut ffi::ibv_context,
        cqe: u32,
        channel: *mut ffi::ibv_comp_channel,
        vector: u32,
    ) -> *mut ffi::ibv_cq_ex;
    fn cbf_cqx_cq(cq: *mut ffi::ibv_cq_ex) -> *mut ffi::ibv_cq;
    fn cbf_cqx_poll(cq: *mut ffi::ibv_cq_ex, max: c_int, out: *mut StrideWc) -> c_int;
    fn cbf_mprq_wq_create(
        ctx: *mut ffi::ibv_context,
        pd: *mut ffi::ibv_pd,
        cq: *mut ffi::ibv_cq,
        max_wr: u32,
        stride_log: u32,
        strides_log: u32,
    ) -> *mut RawWq;
    fn cbf_mprq_wq_post(wq: *mut RawWq, addrs: *const u64, n: usize, len: u32, lkey: u32);
    fn cbf_mprq_wq_destroy(wq: *mut RawWq) -> c_int;
    fn cbf_mprq_ind_table_create(
        ctx: *mut ffi::ibv_context,
        wq: *mut RawWq,
    ) -> *mut ffi::ibv_rwq_ind_table;
    fn cbf_mprq_ind_table_destroy(table: *mut ffi::ibv_rwq_ind_table) -> c_int;
    fn cbf_mprq_rss_qp(
        ctx: *mut ffi::ibv_context,
        pd: *mut ffi::ibv_pd,
        table: *mut ffi::ibv_rwq_ind_table,
    ) -> *mut ffi::ibv_qp;
}

// The C compiler's view of the shared layouts, for the test that holds Rust's against it.
#[cfg(test)]
extern "C" {
    fn cbf_mprq_layout(out: *mut usize);
}

/// What a device reports about striding receive queues (`struct cbf_mprq_caps` in the shim:
/// `mlx5dv_query_device`'s striding capabilities, and `ibv_query_device`'s queue limits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StridingCaps {
    /// Non-zero: the device answered the striding-RQ query.
    pub striding: u32,
    /// Non-zero: multi-packet WQEs are allowed.
    pub mpw_allowed: u32,
    /// log2 bytes per stride, least and most.
    pub min_stride_log: u32,
    pub max_stride_log: u32,
    /// log2 strides per buffer (work request), least and most.
    pub min_strides_log: u32,
    pub max_strides_log: u32,
    /// Bit n: queue pairs of type n may use a striding queue.
    pub qp_types: u32,
    /// Most completion queue entries, and most work requests per queue.
    pub max_cqe: u32,
    pub max_qp_wr: u32,
}

impl StridingCaps {
    /// Ask the device `ctx` is open on; why not, for a device that is not an mlx5 one or a
    /// query that failed.
    pub fn query(ctx: &Context) -> Result<StridingCaps, String> {
        let mut caps = StridingCaps::default();
        // SAFETY: the context is open; the shim writes one cbf_mprq_caps, whose layout this
        // type mirrors (tested).
        match unsafe { cbf_mprq_query(ctx.0, &mut caps) } {
            0 => Ok(caps),
            e if e == libc::EOPNOTSUPP => Err("not an mlx5 device".into()),
            e => Err(format!(
                "mlx5dv_query_device: {}",
                io::Error::from_raw_os_error(e)
            )),
        }
    }
}

/// One completion of an extended completion queue: its byte count word and status.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StrideWc {
    pub byte_cnt: u32,
    pub status: u32,
}

impl StrideWc {
    pub fn ok(&self) -> bool {
        self.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }
}

/// The sizes of a striding queue: `buffers` buffers of 2^strides_log strides of 2^stride_log
/// bytes; `reduced` when the device's limits made the whole smaller than asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridingPlan {
    pub stride_log: u32,
    pub strides_log: u32,
    pub buffers: usize,
    pub reduced: bool,
}

impl StridingPlan {
    pub fn stride_len(&self) -> usize {
        1 << self.stride_log
    }

    pub fn strides(&self) -> u32 {
        1 << self.strides_log
    }

    pub fn buffer_len(&self) -> usize {
        1 << (self.stride_log + self.strides_log)
    }

    /// Completion queue entries: one per stride posted, the most completions that can be
    /// outstanding (every completion consumes at least one stride).
    pub fn cqe(&self) -> usize {
        self.buffers << self.strides_log
    }
}

/// log2 of the stride asked for: 64 bytes, a cache line, so that a frame wastes less than one
/// line and every frame starts on one (spead2's choice too).
const STRIDE_LOG: u32 = 6;
/// log2 of the buffer asked for: 1 MiB, room for about a hundred jumbo frames per work request
/// (spead2's choice).
const BUFFER_LOG: u32 = 20;

/// The sizes for a striding queue of about `bytes` bytes holding frames of up to `frame_len`
/// bytes on a device with `caps`, or why it cannot have one. Strides and buffers are the sizes
/// asked for ([`STRIDE_LOG`], [`BUFFER_LOG`]) within the device's ranges, at most
/// 2^[`MAX_STRIDES_LOG`] strides a buffer; at least two buffers, and no more than the device's
/// completion queue (one entry per stride) and work queue take (then `reduced`).
pub fn plan(caps: &StridingCaps, bytes: usize, frame_len: usize) -> Result<StridingPlan, String> {
    let raw_packet = 1u64 << ffi::ibv_qp_type::IBV_QPT_RAW_PACKET;
    if caps.striding == 0 {
        return Err("the device reports no striding receive queue".into());
    }
    if caps.mpw_allowed == 0 {
        return Err("the device does not allow multi-packet WQEs".into());
    }
    if u64::from(caps.qp_types) & raw_packet == 0 {
        return Err(
            "the device's striding receive queues do not serve raw-packet queue pairs".into(),
        );
    }
    if caps.min_stride_log > caps.max_stride_log || caps.min_strides_log > caps.max_strides_log {
        return Err(format!("the device reports empty stride ranges: {caps:?}"));
    }
    let stride_log = STRIDE_LOG.clamp(caps.min_stride_log, caps.max_stride_log);
    let most = caps.max_strides_log.min(MAX_STRIDES_LOG);
    if caps.min_strides_log > most {
        return Err(format!(
            "the device's buffers need at least 2^{} strides, more than a completion counts (2^{MAX_STRIDES_LOG})",
            caps.min_strides_log
        ));
    }
    let strides_log = BUFFER_LOG
        .saturating_sub(stride_log)
        .clamp(caps.min_strides_log, most);
    let buffer_len = 1usize << (stride_log + strides_log);
    if buffer_len < frame_len {
        return Err(format!(
            "its largest buffer ({buffer_len} bytes) is shorter than a frame ({frame_len} bytes)"
        ));
    }
    let asked = (bytes / buffer_len).max(2);
    let by_cqe = caps.max_cqe as usize >> strides_log;
    let buffers = asked.min(by_cqe).min(caps.max_qp_wr as usize);
    if buffers < 2 {
        return Err(format!(
            "the device's queues are too small for two buffers of {buffer_len} bytes ({} completions, {} requests)",
            caps.max_cqe, caps.max_qp_wr
        ));
    }
    Ok(StridingPlan {
        stride_log,
        strides_log,
        buffers,
        reduced: buffers < asked,
    })
}

/// An extended completion queue (byte counts readable), on a channel's vector or polled.
pub struct CqEx {
    /// The plain queue inside it: armed and waited on as any other, and destroyed through it.
    cq: Cq,
    ex: *mut ffi::ibv_cq_ex,
}
// SAFETY: as for the verbs objects (`verbs::Context`): used from one thread at a time.
unsafe impl Send for CqEx {}

impl CqEx {
    pub fn new(
        ctx: &Context,
        entries: usize,
        channel: Option<(&Channel, u32)>,
    ) -> io::Result<CqEx> {
        let (ch, vector) = channel.map_or((std::ptr::null_mut(), 0), |(c, v)| (c.0, v));
        let n = u32::try_from(entries).unwrap_or(u32::MAX);
        // SAFETY: the context and channel are open.
        let ex = unsafe { cbf_cqx_create(ctx.0, n, ch, vector) };
        if ex.is_null() {
            return Err(failed("ibv_create_cq_ex"));
        }
        // SAFETY: `ex` is live, made on `channel`; the Cq destroys it (ibv_destroy_cq on the
        // plain queue inside an extended one is how rdma-core destroys both).
        let cq = unsafe { Cq::from_raw(cbf_cqx_cq(ex), channel.map(|(c, _)| c)) };
        Ok(CqEx { cq, ex })
    }

    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// Up to `out.len()` completions; how many.
    pub fn poll(&self, out: &mut [StrideWc]) -> io::Result<usize> {
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: `out` has room for n entries; the queue is polled from this thread only.
        let got = unsafe { cbf_cqx_poll(self.ex, n, out.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| {
            let e = io::Error::from_raw_os_error(-got);
            io::Error::new(e.kind(), format!("ibv_start_poll: {e}"))
        })
    }
}

/// A striding receive work queue, ready to receive (`mlx5dv_create_wq`, then `IBV_WQS_RDY`).
pub struct StridingWq(*mut RawWq);
// SAFETY: as for CqEx.
unsafe impl Send for StridingWq {}

impl StridingWq {
    /// A queue for `plan.buffers` buffers of `plan`'s strides, completing on `cq`.
    pub fn new(ctx: &Context, pd: &Pd, cq: &CqEx, plan: &StridingPlan) -> io::Result<StridingWq> {
        let max_wr = u32::try_from(plan.buffers).unwrap_or(u32::MAX);
        // SAFETY: the context, domain and queue are alive.
        let wq = unsafe {
            cbf_mprq_wq_create(
                ctx.0,
                pd.0,
                cbf_cqx_cq(cq.ex),
                max_wr,
                plan.stride_log,
                plan.strides_log,
            )
        };
        if wq.is_null() {
            return Err(failed("mlx5dv_create_wq (striding)"));
        }
        Ok(StridingWq(wq))
    }

    /// Hand the buffers of `len` bytes at `addrs` to the NIC, in order.
    ///
    /// # Safety
    /// Each buffer lies in memory registered under `lkey` that stays allocated, is not read
    /// or written by anyone else until the NIC has finished it (`mprq_ledger`), and is not
    /// already posted; no more than the queue's `plan.buffers` are posted at once.
    pub unsafe fn post(&mut self, addrs: &[u64], len: u32, lkey: u32) {
        cbf_mprq_wq_post(self.0, addrs.as_ptr(), addrs.len(), len, lkey);
    }
}

impl Drop for StridingWq {
    fn drop(&mut self) {
        // SAFETY: made by the shim; its indirection table is dropped before.
        unsafe { cbf_mprq_wq_destroy(self.0) };
    }
}

/// An indirection table over one striding work queue.
pub struct IndTable(*mut ffi::ibv_rwq_ind_table);
// SAFETY: as for CqEx.
unsafe impl Send for IndTable {}

impl IndTable {
    pub fn new(ctx: &Context, wq: &StridingWq) -> io::Result<IndTable> {
        // SAFETY: the context and work queue are alive.
        let t = unsafe { cbf_mprq_ind_table_create(ctx.0, wq.0) };
        if t.is_null() {
            return Err(failed("ibv_create_rwq_ind_table"));
        }
        Ok(IndTable(t))
    }

    /// The raw-packet queue pair that hashes every frame to this table's queue; steering
    /// rules attach to it (`Qp::flow`).
    pub fn rss_qp(&self, ctx: &Context, pd: &Pd) -> io::Result<Qp> {
        // SAFETY: the context, domain and table are alive.
        let qp = unsafe { cbf_mprq_rss_qp(ctx.0, pd.0, self.0) };
        if qp.is_null() {
            return Err(qp_failed("ibv_create_qp_ex (RSS)"));
        }
        // SAFETY: just made, owned by nothing else.
        Ok(unsafe { Qp::from_raw(qp) })
    }
}

impl Drop for IndTable {
    fn drop(&mut self) {
        // SAFETY: made by the shim; its queue pair is dropped before.
        let status = unsafe { cbf_mprq_ind_table_destroy(self.0) };
        if let Err(e) = check("ibv_destroy_rwq_ind_table", status) {
            tracing::warn!(error = %e, "ibverbs: indirection table not destroyed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The shared structures' layouts and the enum values Rust reads them with, as the C
    /// compiler has them.
    #[test]
    fn rust_and_c_agree_on_the_striding_layouts() {
        let mut c = [0usize; 15];
        // SAFETY: the shim writes fifteen values.
        unsafe { cbf_mprq_layout(c.as_mut_ptr()) };
        let rust = [
            size_of::<StridingCaps>(),
            offset_of!(StridingCaps, striding),
            offset_of!(StridingCaps, mpw_allowed),
            offset_of!(StridingCaps, min_stride_log),
            offset_of!(StridingCaps, max_stride_log),
            offset_of!(StridingCaps, min_strides_log),
            offset_of!(StridingCaps, max_strides_log),
            offset_of!(StridingCaps, qp_types),
            offset_of!(StridingCaps, max_cqe),
            offset_of!(StridingCaps, max_qp_wr),
            size_of::<StrideWc>(),
            offset_of!(StrideWc, byte_cnt),
            offset_of!(StrideWc, status),
            ffi::ibv_qp_type::IBV_QPT_RAW_PACKET as usize,
            ffi::ibv_wc_status::IBV_WC_SUCCESS as usize,
        ];
        assert_eq!(rust, c);
    }

    /// Striding capabilities as Linux's mlx5_ib driver reports them for a device with striding
    /// queues (`drivers/infiniband/hw/mlx5`: strides of 2^6–2^13 bytes, 2^9–2^16 strides per
    /// buffer, raw-packet queue pairs only), with a ConnectX-5's queue limits (`ibv_devinfo
    /// -v`: max_cqe 4194303, max_qp_wr 32768).
    fn cx5() -> StridingCaps {
        StridingCaps {
            striding: 1,
            mpw_allowed: 1,
            min_stride_log: 6,
            max_stride_log: 13,
            min_strides_log: 9,
            max_strides_log: 16,
            qp_types: 1 << 8,
            max_cqe: 4_194_303,
            max_qp_wr: 1 << 15,
        }
    }

    /// 64-byte strides, 1 MiB buffers, as many as the bytes asked for (at least two); limits
    /// of the device shrink the count and say so.
    #[test]
    fn the_plan_asks_for_cache_line_strides_and_megabyte_buffers() {
        let p = plan(&cx5(), 64 << 20, 9242).unwrap();
        assert_eq!(
            (p.stride_len(), p.strides(), p.buffer_len()),
            (64, 16384, 1 << 20)
        );
        assert_eq!((p.buffers, p.reduced, p.cqe()), (64, false, 64 << 14));
        assert_eq!(plan(&cx5(), 1, 9242).unwrap().buffers, 2);
        let small = StridingCaps {
            max_cqe: 40 << 14,
            ..cx5()
        };
        let p = plan(&small, 64 << 20, 9242).unwrap();
        assert_eq!((p.buffers, p.reduced), (40, true));
        let few = StridingCaps {
            max_qp_wr: 8,
            ..cx5()
        };
        assert_eq!(plan(&few, 64 << 20, 9242).unwrap().buffers, 8);
        // A device whose strides start at 256 bytes: 4096 of them make the megabyte.
        let coarse = StridingCaps {
            min_stride_log: 8,
            ..cx5()
        };
        let p = plan(&coarse, 64 << 20, 9242).unwrap();
        assert_eq!((p.stride_len(), p.strides()), (256, 4096));
    }

    /// Each reason a device cannot have a striding queue is refused with its own words.
    #[test]
    fn devices_without_what_it_needs_are_refused() {
        let refuse = |caps: StridingCaps, frame: usize| plan(&caps, 64 << 20, frame).unwrap_err();
        assert!(refuse(StridingCaps::default(), 9242).contains("no striding"));
        assert!(refuse(
            StridingCaps {
                mpw_allowed: 0,
                ..cx5()
            },
            9242
        )
        .contains("multi-packet"));
        assert!(refuse(
            StridingCaps {
                qp_types: 1 << 2,
                ..cx5()
            },
            9242
        )
        .contains("raw-packet"));
        let tiny = StridingCaps {
            max_stride_log: 6,
            min_strides_log: 7,
            max_strides_log: 7,
            ..cx5()
        };
        assert!(refuse(tiny, 9242).contains("shorter than a frame"));
        assert!(refuse(
            StridingCaps {
                min_strides_log: 15,
                ..cx5()
            },
            9242
        )
        .contains("2^15"));
        assert!(refuse(
            StridingCaps {
                max_qp_wr: 1,
                ..cx5()
            },
            9242
        )
        .contains("too small"));
        assert!(refuse(
            StridingCaps {
                min_stride_log: 9,
                max_stride_log: 8,
                ..cx5()
            },
            1
        )
        .contains("empty"));
    }
}
