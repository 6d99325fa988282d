//! NUMA placement of receive memory (issue 15; seed 000 §Network receive): the memory a NIC
//! writes into (chunks, packet slots, io_uring's buffer ring) belongs on the NUMA node the NIC
//! hangs off, so that neither the NIC's writes nor the receive thread's copies cross the
//! inter-socket link.
//!
//! - Which node: Linux publishes a network device's node in
//!   `/sys/class/net/<if>/device/numa_node`; `-1` (no affinity, the usual answer on one-socket
//!   hosts and VMs) or no such file (virtual devices: `lo`, veth, bridges) means there is no
//!   node to bind to, which is logged once per interface. [`nic_node_in`] reads it under any
//!   sysfs root (a fake one in the tests), [`nic_node`] under `/sys`, for an interface given by
//!   name or by address as `--recv-interface` allows.
//! - Binding: [`bind_area`] binds an existing allocation to a node with `mbind(2)` and moves
//!   the pages already touched (chunks are faulted in when allocated); later ones are
//!   allocated there. Why `mbind` through `libc` and not hwlocality: see [`bind_area`].
//!   [`area_binding`] reads a binding back (`get_mempolicy(2)` with `MPOL_F_ADDR`), for the
//!   tests and for anyone checking a running engine's placement.
//!
//! Binding must happen before memory is page-locked for a GPU (pinned pages do not migrate):
//! the engines bind their chunks before they register them with CUDA.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

/// Largest NUMA node number accepted (Linux's `MAX_NUMNODES` is at most 1024).
pub const MAX_NODE: u32 = 1023;

/// Why memory cannot be bound where it was asked to go.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumaError {
    #[error("no NUMA node {node} on this host (its nodes: {nodes})")]
    NoNode { node: u32, nodes: String },
    #[error("binding {bytes} bytes to NUMA node {node} failed: {error}")]
    Bind {
        node: u32,
        bytes: usize,
        error: String,
    },
    #[error("reading back the NUMA binding failed: {0}")]
    Query(String),
}

/// Why an interface's node is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoNode {
    #[error("{path}: no such file (a virtual device, or no device behind the interface)")]
    Missing { path: String },
    #[error("{path} says -1 (the device has no NUMA affinity)")]
    NoAffinity { path: String },
    #[error("{path} holds {text:?}, not a node number")]
    Unreadable { path: String, text: String },
    #[error("{0:?}: no such interface or device")]
    NoInterface(String),
}

/// The NUMA node of network interface `iface` (a name) according to the sysfs tree at `sysfs`
/// (`/sys` on a live host): `<sysfs>/class/net/<iface>/device/numa_node`.
pub fn nic_node_in(sysfs: &Path, iface: &str) -> Result<u32, NoNode> {
    device_node_in(sysfs, "class/net", iface)
}

/// The NUMA node of RDMA device `device` (`mlx5_0`) according to the sysfs tree at `sysfs`:
/// `<sysfs>/class/infiniband/<device>/device/numa_node`, the node of the PCI function behind
/// it (the ibverbs transport's registered memory belongs there).
pub fn rdma_node_in(sysfs: &Path, device: &str) -> Result<u32, NoNode> {
    device_node_in(sysfs, "class/infiniband", device)
}

/// `<sysfs>/<class>/<name>/device/numa_node`, read and checked.
fn device_node_in(sysfs: &Path, class: &str, name: &str) -> Result<u32, NoNode> {
    // A name with a path separator would read some other file.
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(NoNode::NoInterface(name.to_string()));
    }
    let path = sysfs.join(class).join(name).join("device/numa_node");
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(_) => return Err(NoNode::Missing { path: shown }),
    };
    match text.trim().parse::<i64>() {
        Ok(-1) => Err(NoNode::NoAffinity { path: shown }),
        Ok(n) if (0..=i64::from(MAX_NODE)).contains(&n) => Ok(n as u32),
        _ => Err(NoNode::Unreadable {
            path: shown,
            text: text.trim().chars().take(32).collect(),
        }),
    }
}

/// Interfaces whose missing node has been logged already.
static LOGGED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The NUMA node of the NIC behind `interface` (a name or an IPv4 address, as
/// `--recv-interface` takes it), or `None` (no interface named, or no node known: logged once
/// per interface, since receive memory then stays where first touch puts it).
pub fn nic_node(interface: Option<&str>) -> Option<u32> {
    let Some(given) = interface else {
        log_once(
            "",
            "no --recv-interface: no NIC to place receive memory next to",
        );
        return None;
    };
    let found = interface_name(given).and_then(|name| nic_node_in(Path::new("/sys"), &name));
    match found {
        Ok(node) => Some(node),
        Err(why) => {
            log_once(given, &why.to_string());
            None
        }
    }
}

/// The NUMA node of RDMA device `device` under `/sys`, or `None` (logged once per device).
pub fn rdma_node(device: &str) -> Option<u32> {
    match rdma_node_in(Path::new("/sys"), device) {
        Ok(node) => Some(node),
        Err(why) => {
            log_once(device, &why.to_string());
            None
        }
    }
}

fn log_once(iface: &str, why: &str) {
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if logged.insert(iface.to_string()) {
        tracing::info!(
            interface = iface,
            "receive memory not bound to a NUMA node: {why}"
        );
    }
}

/// The interface's name, for an interface given by name or by IPv4 address.
fn interface_name(given: &str) -> Result<String, NoNode> {
    let (index, _) =
        super::udp::resolve_interface(given).map_err(|_| NoNode::NoInterface(given.to_string()))?;
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires; on success it holds a
    // NUL-terminated name.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return Err(NoNode::NoInterface(given.to_string()));
    }
    // SAFETY: as above, NUL-terminated within buf.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// How an area's pages are bound, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaBinding {
    /// Bound (`MPOL_BIND`), as opposed to the default first-touch or another policy.
    pub bound: bool,
    /// The nodes the pages may come from.
    pub nodes: Vec<u32>,
}

/// `mbind(2)` flags and the `get_mempolicy(2)` flag from `<linux/mempolicy.h>` (not in `libc`).
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
/// Words of the node masks passed to the kernel: bits for nodes 0..=MAX_NODE.
const MASK_WORDS: usize = (MAX_NODE as usize + 1) / 64;
/// The mask length the calls are told: one more bit than the mask holds, since the kernel
/// counts `maxnode` one short (`mbind(2)`, BUGS).
const MAX_NODE_ARG: libc::c_ulong = (MASK_WORDS * 64 + 1) as libc::c_ulong;

/// The host's NUMA nodes as Linux lists them (`0`, `0-3`), for messages.
fn online_nodes() -> String {
    std::fs::read_to_string("/sys/devices/system/node/online")
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|_| "unknown: no /sys/devices/system/node".into())
}

/// Refuse a node this host does not have.
pub fn check_node(node: u32) -> Result<(), NumaError> {
    let dir = format!("/sys/devices/system/node/node{node}");
    if node > MAX_NODE || !Path::new(&dir).is_dir() {
        return Err(NumaError::NoNode {
            node,
            nodes: online_nodes(),
        });
    }
    Ok(())
}

/// The whole pages covering `area`: (start, length, page size).
fn pages(area: &[u8]) -> (usize, usize, usize) {
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = area.as_ptr() as usize & !(page - 1);
    let end = (area.as_ptr() as usize + area.len()).next_multiple_of(page);
    (start, end - start, page)
}

/// Bind the pages of `area` to NUMA node `node`, moving those already placed elsewhere.
/// Whole pages are bound, so the bytes sharing a page with either end of `area` go too (the
/// areas bound here are large and their own allocations).
///
/// Through `mbind(2)` (`MPOL_BIND`, `MPOL_MF_MOVE | MPOL_MF_STRICT`) rather than hwlocality:
/// hwlocality 1.0.0-alpha.13 refuses hwloc's migrate flag for area binding
/// (`MemoryBindingFlags::validate`), so it cannot move the pages of an allocation already
/// touched, and the chunks are faulted in when allocated (a first-touch fault on the receive
/// path costs more than the copy). Without migration a binding would steer only pages not yet
/// touched. With `MPOL_MF_STRICT` a page that cannot move is an error (EIO), not ignored.
pub fn bind_area(area: &[u8], node: u32) -> Result<(), NumaError> {
    check_node(node)?;
    if area.is_empty() {
        return Ok(());
    }
    let mut mask = [0u64; MASK_WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    let (start, len, _) = pages(area);
    // SAFETY: mbind changes only the placement policy of this process's own pages in
    // [start, start + len), which covers `area` (mapped, since we hold a reference to it) and
    // at most the partial pages around it, which belong to this process too; the mask holds
    // MASK_WORDS words, as MAX_NODE_ARG says (one bit over, as the kernel expects).
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            start as *mut libc::c_void,
            len as libc::c_ulong,
            libc::MPOL_BIND,
            mask.as_ptr(),
            MAX_NODE_ARG,
            MPOL_MF_MOVE | MPOL_MF_STRICT,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            // Online yet not allowed (a cpuset's mems), or gone since the check.
            return Err(NumaError::NoNode {
                node,
                nodes: online_nodes(),
            });
        }
        return Err(NumaError::Bind {
            node,
            bytes: area.len(),
            error: format!("mbind: {e}"),
        });
    }
    Ok(())
}

/// The policy and nodes of the page at `addr` (`get_mempolicy(2)` with `MPOL_F_ADDR`).
fn page_policy(addr: usize) -> Result<(libc::c_int, [u64; MASK_WORDS]), NumaError> {
    let mut mode: libc::c_int = 0;
    let mut mask = [0u64; MASK_WORDS];
    // SAFETY: mode and mask are valid out-pointers, the mask of MASK_WORDS words as
    // MAX_NODE_ARG says; MPOL_F_ADDR only reads the policy of the mapping at addr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            MAX_NODE_ARG,
            addr as *mut libc::c_void,
            MPOL_F_ADDR,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(NumaError::Query(format!("get_mempolicy: {e}")));
    }
    Ok((mode, mask))
}

/// How the pages of `area` are bound: the policy of every page read back from the kernel,
/// which must be the same on all (else an error says where it changes).
pub fn area_binding(area: &[u8]) -> Result<AreaBinding, NumaError> {
    let (start, len, page) = pages(area);
    let first = page_policy(start)?;
    for addr in (start..start + len).step_by(page).skip(1) {
        if page_policy(addr)? != first {
            return Err(NumaError::Query(format!(
                "the policy changes at byte {} of the area",
                addr.saturating_sub(area.as_ptr() as usize)
            )));
        }
    }
    let (mode, mask) = first;
    Ok(AreaBinding {
        bound: mode == libc::MPOL_BIND,
        nodes: (0..=MAX_NODE)
            .filter(|&n| mask[n as usize / 64] & (1 << (n % 64)) != 0)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree: `class/net/<if>/device/numa_node` holding `text` for each entry
    /// (`None`: the interface without a device, as `lo`).
    fn fake_sysfs(entries: &[(&str, Option<&str>)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "cbf-sysfs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (iface, text) in entries {
            let dir = root.join("class/net").join(iface);
            match text {
                Some(t) => {
                    std::fs::create_dir_all(dir.join("device")).unwrap();
                    std::fs::write(dir.join("device/numa_node"), t).unwrap();
                }
                None => std::fs::create_dir_all(&dir).unwrap(),
            }
        }
        root
    }

    #[test]
    fn the_nics_node_comes_from_sysfs() {
        let root = fake_sysfs(&[
            ("ens1f0", Some("1\n")),
            ("ens2", Some("0\n")),
            ("eth0", Some("-1\n")),
            ("lo", None),
            ("odd", Some("socket 2\n")),
            ("huge", Some("4096\n")),
        ]);
        assert_eq!(nic_node_in(&root, "ens1f0"), Ok(1));
        assert_eq!(nic_node_in(&root, "ens2"), Ok(0));
        assert!(matches!(
            nic_node_in(&root, "eth0"),
            Err(NoNode::NoAffinity { .. })
        ));
        assert!(matches!(
            nic_node_in(&root, "lo"),
            Err(NoNode::Missing { .. })
        ));
        assert!(matches!(
            nic_node_in(&root, "absent"),
            Err(NoNode::Missing { .. })
        ));
        assert!(matches!(
            nic_node_in(&root, "odd"),
            Err(NoNode::Unreadable { .. })
        ));
        assert!(matches!(
            nic_node_in(&root, "huge"),
            Err(NoNode::Unreadable { .. })
        ));
        for bad in ["", "..", "../ens1f0", "a/b"] {
            assert_eq!(
                nic_node_in(&root, bad),
                Err(NoNode::NoInterface(bad.to_string()))
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// An RDMA device's node comes from its own PCI function under `class/infiniband` (what a
    /// ConnectX port on socket 1 publishes), not from any network interface's.
    #[test]
    fn the_rdma_devices_node_comes_from_sysfs() {
        let root = std::env::temp_dir().join(format!("cbf-sysfs-ib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (dev, text) in [("mlx5_0", "1\n"), ("mlx5_1", "-1\n"), ("rxe0", "x")] {
            let dir = root.join("class/infiniband").join(dev).join("device");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), text).unwrap();
        }
        std::fs::create_dir_all(root.join("class/net/mlx5_0")).unwrap();
        assert_eq!(rdma_node_in(&root, "mlx5_0"), Ok(1));
        assert!(matches!(
            rdma_node_in(&root, "mlx5_1"),
            Err(NoNode::NoAffinity { .. })
        ));
        assert!(matches!(
            rdma_node_in(&root, "rxe0"),
            Err(NoNode::Unreadable { .. })
        ));
        assert!(matches!(
            rdma_node_in(&root, "mlx5_2"),
            Err(NoNode::Missing { .. })
        ));
        assert!(matches!(
            nic_node_in(&root, "mlx5_0"),
            Err(NoNode::Missing { .. })
        ));
        assert_eq!(
            rdma_node_in(&root, "../net"),
            Err(NoNode::NoInterface("../net".into()))
        );
        assert_eq!(rdma_node("cbf-no-such-device"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// On this host's `lo` (no device behind it) and a name that is no interface: no node.
    #[test]
    fn virtual_and_unknown_interfaces_have_no_node() {
        assert_eq!(nic_node(Some("lo")), None);
        assert_eq!(nic_node(Some("127.0.0.1")), None);
        assert_eq!(nic_node(Some("cbf-no-such-if")), None);
        assert_eq!(nic_node(None), None);
        assert_eq!(interface_name("127.0.0.1").as_deref(), Ok("lo"));
    }

    /// The binding read back from the kernel: a fresh area is not bound; after binding it to
    /// node 0 (every host has one) it is bound there, pages touched before the binding
    /// included; a node the host lacks is refused by name.
    /// A fresh anonymous mapping of `len` bytes, written once: pages no binding has touched
    /// (malloc may return heap pages an earlier binding left its policy on).
    struct Fresh(&'static mut [u8]);

    impl Fresh {
        fn new(len: usize) -> Fresh {
            // SAFETY: a new private anonymous mapping, owned by the returned value alone.
            let area = unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                std::slice::from_raw_parts_mut(p.cast::<u8>(), len)
            };
            area.fill(1);
            Fresh(area)
        }
    }

    impl Drop for Fresh {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.0.as_mut_ptr().cast(), self.0.len()) };
        }
    }

    #[test]
    fn an_area_bound_to_a_node_reads_back_bound_there() {
        let fresh = Fresh::new(4 << 20);
        let area = &*fresh.0;
        let before = area_binding(area).unwrap();
        assert!(
            !before.bound,
            "a fresh area is left to first touch: {before:?}"
        );
        bind_area(area, 0).unwrap();
        let after = area_binding(area).unwrap();
        assert_eq!(
            after,
            AreaBinding {
                bound: true,
                nodes: vec![0]
            }
        );
        // Binding part of an area splits its policy: the read-back sees it.
        let other = Fresh::new(1 << 20);
        bind_area(&other.0[64 << 10..], 0).unwrap();
        assert!(matches!(area_binding(other.0), Err(NumaError::Query(_))));
        let absent = 1000;
        match bind_area(area, absent) {
            Err(NumaError::NoNode { node, nodes }) => {
                assert_eq!(node, absent);
                assert!(nodes.contains('0'), "{nodes}");
            }
            other => panic!("bound to node {absent}: {other:?}"),
        }
        assert!(matches!(
            check_node(MAX_NODE + 1),
            Err(NumaError::NoNode { .. })
        ));
    }
}
