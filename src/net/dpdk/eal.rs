//! The process's one DPDK environment (EAL) and its started ports. DPDK allows `rte_eal_init`
//! once per process, so the first caller's arguments win: a later caller with the same
//! arguments shares the EAL (an engine's receive and send both come from `--dpdk-args`), one
//! with others is refused. A port is configured and started once, with one RX queue and one TX
//! queue per sender. A receiver takes the RX queue until it is dropped (one reader per queue).
//!
//! `rte_eal_init` pins its calling thread to the main lcore; that is undone unless the EAL
//! arguments name cores (`eal_affinity`).
//!
//! Each sender (an engine's output, one of dsim's send threads) takes a TX queue of its own
//! until it is dropped, so bursts from different threads never meet on a queue and no lock is
//! taken (`rte_eth_tx_burst` on one queue is not thread-safe). Queue counts are fixed when a
//! port starts, so a process that will have several senders on a port says so first
//! ([`plan_tx`], from the engines' output count), before any transport starts the port; a port
//! nobody planned starts with one TX queue. A plan beyond the driver's `max_tx_queues` is
//! refused, as is a sender beyond the queues the port started with. Virtual PMDs tie their
//! queue counts to their devargs: `net_af_packet` has `qpairs` (default 1) of each, and in
//! `net_ring` TX queue k feeds RX queue k, so only queue 0's frames reach this process's one
//! RX queue there.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{eal_affinity, ffi};
use super::{DpdkConfig, DpdkError};
use crate::net::cpu_set::CpuSet;
use crate::net::frame::Mac;

/// What the first `rte_eal_init` was given and what it answered.
static EAL: Mutex<Option<(String, Result<(), String>)>> = Mutex::new(None);
/// Ports started so far and TX queues planned, by port id.
static PORTS: Mutex<Option<Registry>> = Mutex::new(None);

#[derive(Default)]
struct Registry {
    started: HashMap<u16, Arc<Port>>,
    /// TX queues a port is to start with ([`plan_tx`]); 1 where none was planned.
    tx_plans: HashMap<u16, u16>,
}

/// Bytes of frame an mbuf holds: a 9200-byte UDP payload (spead2's default packet ceiling,
/// jumbo frames included) with its 42 bytes of headers, rounded up to a cache line.
pub(super) const DATA_ROOM: u16 = 9280;
const RX_DESC: u16 = 1024;
const TX_DESC: u16 = 1024;

/// mbufs in each EAL lcore's cache of a port's pool.
const POOL_CACHE: u16 = 256;

/// The most mbufs of a port's pool that can be out of the pool at once, from who holds them,
/// so that the RX queue can always be refilled while a receive batch holds its frames (an RX
/// descriptor that finds no mbuf drops its frame, counted as `rx_nombuf`):
///
/// ```text
///     rx_desc                      every RX descriptor holds an mbuf for the NIC to fill
///   + tx_queues × (tx_desc + S)    every TX descriptor one not yet sent, and every sender a
///                                  burst of S = send::BURST being filled
///   + L                            the frames lent to receive batches: the receiver lends at
///                                  most L = recv::MAX_LENT at once, then waits for them
///   + ⌊3 C / 2⌋                    the cache of C = POOL_CACHE mbufs of the EAL's main lcore
///                                  (the thread that started the EAL) may grow to its flush
///                                  threshold, 1.5 C (DPDK's mempool guide); cbf runs nothing
///                                  on the other lcores, and threads DPDK did not start (every
///                                  other cbf thread) have no cache
/// ```
///
/// The pool is made this size rounded up to 2ⁿ − 1 (the size DPDK's ring-backed pools use
/// best): 4095 mbufs (~38 MiB, inside `-m 64`) with one or two TX queues, 8191 with three or
/// four. Checked when the port starts against the pool it got ([`start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PoolNeed {
    pub rx_desc: u16,
    pub tx_desc: u16,
    pub tx_queues: u16,
}

impl PoolNeed {
    /// The formula above.
    pub fn mbufs(&self) -> u32 {
        let tx = u32::from(self.tx_queues) * (u32::from(self.tx_desc) + super::send::BURST as u32);
        let cache = 3 * u32::from(POOL_CACHE) / 2;
        u32::from(self.rx_desc) + tx + super::recv::MAX_LENT as u32 + cache
    }

    /// The size to create the pool with.
    pub fn pool_size(&self) -> u32 {
        (self.mbufs() + 1).next_power_of_two() - 1
    }
}

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
    // The EAL pins this thread to its main lcore; put the mask back after (`eal_affinity`).
    let before = CpuSet::of_current_thread()
        .map_err(|e| DpdkError::Eal(format!("reading the calling thread's CPU affinity: {e}")))?;
    // SAFETY: argv is a NULL-terminated array of NUL-terminated strings that outlive the call
    // (rte_eal_init may permute the pointers, not the strings); the lock makes it the only call.
    let r = unsafe { ffi::cbf_dpdk_eal_init(argv.len() as i32, ptrs.as_mut_ptr()) };
    eal_affinity::after_eal_init(args, &before);
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
    /// mbufs in the pool.
    pub pool_size: u32,
    rx_taken: AtomicBool,
    /// Per TX queue, whether a sender holds it (taken and given back at open and drop only).
    tx_taken: Mutex<Vec<bool>>,
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

/// A port's queue, held by one transport until dropped.
pub(super) struct QueueLease {
    pub port: Arc<Port>,
    kind: Queue,
    /// The queue's index (always 0 for RX).
    pub queue: u16,
}

impl Drop for QueueLease {
    fn drop(&mut self) {
        match self.kind {
            Queue::Rx => self.port.rx_taken.store(false, Ordering::Release),
            Queue::Tx => {
                let mut taken = self.port.tx_taken.lock().unwrap_or_else(|e| e.into_inner());
                taken[usize::from(self.queue)] = false;
            }
        }
    }
}

/// Plan TX queues before the ports start: each `(port, senders)` says that up to `senders`
/// senders of this process will use the port at once (summed over names of the same port), so
/// that it starts with that many TX queues. Refused where the driver allows fewer, or where the
/// port has started already with fewer.
pub(super) fn plan_tx(eal_args: &str, ports: &[(String, u16)]) -> Result<(), DpdkError> {
    init(eal_args)?;
    let mut want: HashMap<u16, (u16, &str)> = HashMap::new();
    for (name, senders) in ports {
        let id = port_id(name)?;
        let e = want.entry(id).or_insert((0, name));
        e.0 = e.0.saturating_add(*senders);
    }
    let mut registry = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let registry = registry.get_or_insert_with(Registry::default);
    for (id, (senders, name)) in want {
        let mut max = 0u16;
        // SAFETY: max is a valid out-pointer for the call.
        let r = unsafe { ffi::cbf_dpdk_port_max_tx(id, &mut max) };
        if r < 0 {
            return Err(DpdkError::Port {
                port: name.to_string(),
                error: format!("device info: {}", ffi::strerror(r)),
            });
        }
        if senders > max {
            return Err(DpdkError::TxQueues {
                port: name.to_string(),
                senders,
                max,
            });
        }
        if let Some(p) = registry.started.get(&id) {
            let queues = p.tx_taken.lock().unwrap_or_else(|e| e.into_inner()).len();
            if usize::from(senders) > queues {
                return Err(DpdkError::TxQueuesTaken {
                    port: name.to_string(),
                    queues: queues as u16,
                });
            }
        }
        let plan = registry.tx_plans.entry(id).or_insert(1);
        *plan = (*plan).max(senders);
    }
    Ok(())
}

/// The port `cfg.port` names (an index or a device name such as `net_ring0`), started on first
/// use, with a queue of kind `kind` leased to the caller: the RX queue, or a TX queue nobody
/// holds.
pub(super) fn lease(cfg: &DpdkConfig, kind: Queue) -> Result<QueueLease, DpdkError> {
    init(&cfg.eal_args)?;
    let id = port_id(&cfg.port)?;
    let mut registry = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let registry = registry.get_or_insert_with(Registry::default);
    let port = match registry.started.get(&id) {
        Some(p) => Arc::clone(p),
        None => {
            let tx_queues = registry.tx_plans.get(&id).copied().unwrap_or(1);
            let p = Arc::new(start(id, &cfg.port, tx_queues)?);
            registry.started.insert(id, Arc::clone(&p));
            p
        }
    };
    let queue = match kind {
        Queue::Rx if port.rx_taken.swap(true, Ordering::AcqRel) => {
            return Err(DpdkError::QueueTaken {
                port: cfg.port.clone(),
            })
        }
        Queue::Rx => 0,
        Queue::Tx => {
            let mut taken = port.tx_taken.lock().unwrap_or_else(|e| e.into_inner());
            let Some(free) = taken.iter().position(|t| !t) else {
                return Err(DpdkError::TxQueuesTaken {
                    port: cfg.port.clone(),
                    queues: taken.len() as u16,
                });
            };
            taken[free] = true;
            free as u16
        }
    };
    Ok(QueueLease { port, kind, queue })
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

/// Configure port `id`, make its pool as [`PoolNeed`] says from the descriptor counts the
/// device allows, refuse a pool smaller than that (one found by name, made before), and start it.
fn start(id: u16, name: &str, tx_queues: u16) -> Result<Port, DpdkError> {
    let failed = |step: &str, r: i32| DpdkError::Port {
        port: name.to_string(),
        error: format!("{step} failed: {}", ffi::strerror(r)),
    };
    let mut conf = ffi::PortConf {
        rx_desc: RX_DESC,
        tx_desc: TX_DESC,
        mbufs: 0,
        data_room: DATA_ROOM,
        mtu: DATA_ROOM - 14,
        tx_queues,
        cache: POOL_CACHE,
    };
    // SAFETY: PortInfo is plain old data; all-zero is a valid value for the shim to overwrite.
    let mut info: ffi::PortInfo = unsafe { std::mem::zeroed() };
    // SAFETY: conf and info are valid for the call; the shim writes only info.
    let r = unsafe { ffi::cbf_dpdk_port_configure(id, &conf, &mut info) };
    if r < 0 {
        return Err(failed("set-up", r));
    }
    let need = PoolNeed {
        rx_desc: info.rx_desc,
        tx_desc: info.tx_desc,
        tx_queues,
    };
    conf.mbufs = need.pool_size();
    let mut pool = std::ptr::null_mut();
    // SAFETY: conf, info and pool are valid for the call; the shim writes only info and pool.
    let r = unsafe { ffi::cbf_dpdk_port_pool(id, &conf, &mut info, &mut pool) };
    if r < 0 {
        return Err(failed("mbuf pool", r));
    }
    if info.pool_size < need.mbufs() {
        return Err(DpdkError::Port {
            port: name.to_string(),
            error: format!(
                "its mbuf pool holds {} mbufs, fewer than the {} that its queues, lent frames \
                 and the main lcore's cache may hold at once ({need:?}): the RX queue could run dry",
                info.pool_size,
                need.mbufs()
            ),
        });
    }
    // SAFETY: conf and info are valid for the call, pool is the port's pool from above.
    let r = unsafe { ffi::cbf_dpdk_port_start(id, &conf, &mut info, pool) };
    if r < 0 {
        return Err(failed("start", r));
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
        tx_queues,
        rx_desc = info.rx_desc,
        tx_desc = info.tx_desc,
        mbufs = info.pool_size,
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
        pool_size: info.pool_size,
        rx_taken: AtomicBool::new(false),
        tx_taken: Mutex::new(vec![false; usize::from(tx_queues)]),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool sizes the formula gives for the shapes cbf runs, worked by hand: 1024 RX
    /// descriptors, 1024 per TX queue plus a 32-frame send burst, 256 lent frames, 384 in the
    /// main lcore's cache (1.5 × 256).
    #[test]
    fn pool_holds_every_holder_at_once() {
        let need = |tx_queues| PoolNeed {
            rx_desc: 1024,
            tx_desc: 1024,
            tx_queues,
        };
        assert_eq!(need(1).mbufs(), 1024 + 1056 + 256 + 384);
        assert_eq!(need(1).pool_size(), 4095);
        assert_eq!(need(2).mbufs(), 3776);
        assert_eq!(need(2).pool_size(), 4095);
        assert_eq!(need(3).pool_size(), 8191);
        assert_eq!(need(4).mbufs(), 5888);
        assert_eq!(need(4).pool_size(), 8191);
        // A need of exactly 2ⁿ − 1 is met by that size, not the next.
        let exact = PoolNeed {
            rx_desc: 4095 - 1056 - 256 - 384,
            tx_desc: 1024,
            tx_queues: 1,
        };
        assert_eq!(exact.mbufs(), 4095);
        assert_eq!(exact.pool_size(), 4095);
    }
}
