//! The process's one DPDK environment (EAL) and its started ports. DPDK allows `rte_eal_init`
//! once per process, so the first caller's arguments win: a later caller with the same
//! arguments shares the EAL (an engine's receive and send both come from `--dpdk-args`), one
//! with others is refused. A port is configured and started once, with one RX and one TX queue.
//! A receiver takes the RX queue until it is dropped (one reader per queue). The TX queue is
//! shared: every sender on the port (an engine's outputs, dsim's send threads) sends its bursts
//! under the port's TX lock, since `rte_eth_tx_burst` on one queue is not thread-safe. The lock
//! is taken once per burst of up to 32 frames, uncontended when one sender uses the port; one
//! TX queue per sender is not done because virtual PMDs tie queue counts to their devargs
//! (`net_af_packet`'s `qpairs`, `net_ring`'s paired rings, where TX queue k feeds RX queue k).

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::ffi;
use super::{DpdkConfig, DpdkError};
use crate::net::frame::Mac;

/// What the first `rte_eal_init` was given and what it answered.
static EAL: Mutex<Option<(String, Result<(), String>)>> = Mutex::new(None);
/// Ports started so far, by port id.
static PORTS: Mutex<Option<HashMap<u16, Arc<Port>>>> = Mutex::new(None);

/// Bytes of frame an mbuf holds: a 9200-byte UDP payload (spead2's default packet ceiling,
/// jumbo frames included) with its 42 bytes of headers, rounded up to a cache line.
pub(super) const DATA_ROOM: u16 = 9280;
/// mbufs per port: RX and TX descriptors plus bursts in flight, with room to spare
/// (~38 MiB, inside `-m 256`).
const MBUFS: u32 = 4095;
const RX_DESC: u16 = 1024;
const TX_DESC: u16 = 1024;

/// Initialise the EAL with `args` (whitespace-separated, no quoting), or share the one the
/// process already has if it was given the same arguments.
pub(super) fn init(args: &str) -> Result<(), DpdkError> {
    let mut eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((first, result)) = eal.as_ref() {
        if first != args {
            return Err(DpdkError::EalTwice {
                first: first.clone(),
                second: args.to_string(),
            });
        }
        return result.clone().map_err(DpdkError::Eal);
    }
    let argv: Vec<CString> = std::iter::once("cbf")
        .chain(args.split_whitespace())
        .map(CString::new)
        .collect::<Result<_, _>>()
        .map_err(|_| DpdkError::Eal("an argument holds a NUL byte".into()))?;
    let mut ptrs: Vec<*mut c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());
    // SAFETY: argv is a NULL-terminated array of NUL-terminated strings that outlive the call
    // (rte_eal_init may permute the pointers, not the strings); the lock makes it the only call.
    let r = unsafe { ffi::cbf_dpdk_eal_init(argv.len() as i32, ptrs.as_mut_ptr()) };
    let result = if r < 0 {
        Err(format!("rte_eal_init: {}", ffi::strerror(r)))
    } else {
        Ok(())
    };
    *eal = Some((args.to_string(), result.clone()));
    result.map_err(DpdkError::Eal)
}

/// A started port and who holds its queues.
pub(super) struct Port {
    pub id: u16,
    pub name: String,
    pub mac: Mac,
    /// The device's NUMA node, where DPDK knows it (its mempool is allocated there).
    pub numa_node: Option<u32>,
    pub pool: Pool,
    rx_taken: AtomicBool,
    /// Held while a burst goes into the shared TX queue.
    tx_lock: Mutex<()>,
}

impl Port {
    /// The TX queue, for one burst.
    pub fn tx_queue(&self) -> MutexGuard<'_, ()> {
        self.tx_lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The port's mempool: DPDK's pools are safe to use from any thread.
#[derive(Clone, Copy)]
pub(super) struct Pool(pub *mut ffi::Mempool);
// SAFETY: rte_mempool get/put are multi-producer, multi-consumer; the pool is never freed.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// Which queue of a port a transport holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queue {
    Rx,
    Tx,
}

/// A port's queue, held until dropped: the RX queue alone, the TX queue shared.
pub(super) struct QueueLease {
    pub port: Arc<Port>,
    queue: Queue,
}

impl Drop for QueueLease {
    fn drop(&mut self) {
        if self.queue == Queue::Rx {
            self.port.rx_taken.store(false, Ordering::Release);
        }
    }
}

/// The port `cfg.port` names (an index or a device name such as `net_ring0`), started on first
/// use, with `queue` leased to the caller (the RX queue to one caller at a time).
pub(super) fn lease(cfg: &DpdkConfig, queue: Queue) -> Result<QueueLease, DpdkError> {
    init(&cfg.eal_args)?;
    let id = port_id(&cfg.port)?;
    let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let ports = ports.get_or_insert_with(HashMap::new);
    let port = match ports.get(&id) {
        Some(p) => Arc::clone(p),
        None => {
            let p = Arc::new(start(id, &cfg.port)?);
            ports.insert(id, Arc::clone(&p));
            p
        }
    };
    if queue == Queue::Rx && port.rx_taken.swap(true, Ordering::AcqRel) {
        return Err(DpdkError::QueueTaken {
            port: cfg.port.clone(),
        });
    }
    Ok(QueueLease { port, queue })
}

fn port_id(name: &str) -> Result<u16, DpdkError> {
    // SAFETY: a plain query of the initialised EAL.
    let count = unsafe { ffi::cbf_dpdk_port_count() };
    if let Ok(i) = name.parse::<u16>() {
        return if i < count {
            Ok(i)
        } else {
            Err(DpdkError::NoPort {
                port: name.to_string(),
                count,
            })
        };
    }
    let c = CString::new(name).map_err(|_| DpdkError::NoPort {
        port: name.to_string(),
        count,
    })?;
    let mut id = 0u16;
    // SAFETY: c is NUL-terminated and id a valid out-pointer for the call.
    let r = unsafe { ffi::cbf_dpdk_port_by_name(c.as_ptr(), &mut id) };
    if r < 0 {
        return Err(DpdkError::NoPort {
            port: name.to_string(),
            count,
        });
    }
    Ok(id)
}

fn start(id: u16, name: &str) -> Result<Port, DpdkError> {
    let conf = ffi::PortConf {
        rx_desc: RX_DESC,
        tx_desc: TX_DESC,
        mbufs: MBUFS,
        data_room: DATA_ROOM,
        mtu: DATA_ROOM - 14,
    };
    // SAFETY: PortInfo is plain old data; all-zero is a valid value for the shim to overwrite.
    let mut info: ffi::PortInfo = unsafe { std::mem::zeroed() };
    let mut pool = std::ptr::null_mut();
    // SAFETY: conf, info and pool are valid for the call; the shim writes only info and pool.
    let r = unsafe { ffi::cbf_dpdk_port_start(id, &conf, &mut info, &mut pool) };
    if r < 0 {
        return Err(DpdkError::Port {
            port: name.to_string(),
            error: format!("set-up failed: {}", ffi::strerror(r)),
        });
    }
    let driver: Vec<u8> = info
        .driver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    tracing::info!(
        port = id,
        driver = %String::from_utf8_lossy(&driver),
        mtu = info.mtu,
        numa_node = info.socket,
        ip_cksum_offload = info.ip_cksum_offload != 0,
        udp_cksum_offload = info.udp_cksum_offload != 0,
        "DPDK port started"
    );
    Ok(Port {
        id,
        name: name.to_string(),
        mac: info.mac,
        numa_node: u32::try_from(info.socket).ok(),
        pool: Pool(pool),
        rx_taken: AtomicBool::new(false),
        tx_lock: Mutex::new(()),
    })
}

/// The port's counters (`rte_eth_stats`), zero where the PMD cannot tell.
pub(super) fn stats(port: &Port) -> ffi::DpdkStats {
    let mut s = ffi::DpdkStats::default();
    // SAFETY: s is a valid out-pointer for the call.
    let r = unsafe { ffi::cbf_dpdk_stats(port.id, &mut s) };
    if r < 0 {
        return ffi::DpdkStats::default();
    }
    s
}
