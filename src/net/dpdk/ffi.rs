//! The entry points of `ffi/dpdk_shim.c` and the structs it fills, field for field.

use std::ffi::{c_char, c_int, c_void};

/// `struct cbf_dpdk_port_conf`.
#[repr(C)]
pub(super) struct PortConf {
    pub rx_desc: u16,
    pub tx_desc: u16,
    pub mbufs: u32,
    pub data_room: u16,
    pub mtu: u16,
    pub tx_queues: u16,
    /// mbufs in each lcore's cache of the pool.
    pub cache: u16,
}

/// `struct cbf_dpdk_port_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct PortInfo {
    pub mac: [u8; 6],
    pub ip_cksum_offload: u8,
    pub udp_cksum_offload: u8,
    pub mtu: u16,
    /// Descriptors per RX and TX queue, as the device's limits adjusted them.
    pub rx_desc: u16,
    pub tx_desc: u16,
    pub _pad: u16,
    /// mbufs in the port's pool.
    pub pool_size: u32,
    /// The device's NUMA node, -1 when unknown.
    pub socket: i32,
    pub driver: [c_char; 32],
}

/// `struct cbf_dpdk_frame`: one received mbuf's first segment.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct RxFrame {
    pub data: *const u8,
    pub data_len: u32,
    pub pkt_len: u32,
    pub ip_bad: u32,
    pub l4_bad: u32,
    pub l4_good: u32,
    pub _pad: u32,
}

impl RxFrame {
    pub const EMPTY: RxFrame = RxFrame {
        data: std::ptr::null(),
        data_len: 0,
        pkt_len: 0,
        ip_bad: 0,
        l4_bad: 0,
        l4_good: 0,
        _pad: 0,
    };
}

/// `struct cbf_dpdk_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DpdkStats {
    pub ipackets: u64,
    pub opackets: u64,
    /// Frames the NIC dropped because the RX queue was full.
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// Frames dropped for want of an mbuf.
    pub rx_nombuf: u64,
}

/// `struct rte_mbuf` and `struct rte_mempool`, only ever behind pointers.
pub(super) type Mbuf = c_void;
pub(super) type Mempool = c_void;

extern "C" {
    pub(super) fn cbf_dpdk_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    pub(super) fn cbf_dpdk_strerror(err: c_int) -> *const c_char;
    pub(super) fn cbf_dpdk_port_count() -> u16;
    pub(super) fn cbf_dpdk_port_by_name(name: *const c_char, port: *mut u16) -> c_int;
    pub(super) fn cbf_dpdk_port_max_tx(port: u16, max: *mut u16) -> c_int;
    pub(super) fn cbf_dpdk_port_configure(
        port: u16,
        conf: *const PortConf,
        info: *mut PortInfo,
    ) -> c_int;
    pub(super) fn cbf_dpdk_port_pool(
        port: u16,
        conf: *const PortConf,
        info: *mut PortInfo,
        pool: *mut *mut Mempool,
    ) -> c_int;
    pub(super) fn cbf_dpdk_port_start(
        port: u16,
        conf: *const PortConf,
        info: *mut PortInfo,
        pool: *mut Mempool,
    ) -> c_int;
    pub(super) fn cbf_dpdk_join(port: u16, macs: *const [u8; 6], n: u32) -> c_int;
    pub(super) fn cbf_dpdk_rx(
        port: u16,
        queue: u16,
        mbufs: *mut *mut Mbuf,
        frames: *mut RxFrame,
        n: u16,
    ) -> u16;
    pub(super) fn cbf_dpdk_free(mbufs: *mut *mut Mbuf, n: u16);
    pub(super) fn cbf_dpdk_free_handles(handles: *const usize, n: usize);
    pub(super) fn cbf_dpdk_pool_avail(pool: *const Mempool) -> u32;
    pub(super) fn cbf_dpdk_pool_contains(pool: *mut Mempool, p: *const u8, n: usize) -> c_int;
    pub(super) fn cbf_dpdk_alloc(pool: *mut Mempool, mbufs: *mut *mut Mbuf, n: u16) -> c_int;
    pub(super) fn cbf_dpdk_fill(mbuf: *mut Mbuf, len: u16) -> *mut u8;
    pub(super) fn cbf_dpdk_tx(port: u16, queue: u16, mbufs: *mut *mut Mbuf, n: u16) -> u16;
    pub(super) fn cbf_dpdk_stats(port: u16, out: *mut DpdkStats) -> c_int;
}

/// DPDK's name for a negative errno.
pub(super) fn strerror(err: c_int) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(cbf_dpdk_strerror(err)) }
        .to_string_lossy()
        .into_owned()
}
