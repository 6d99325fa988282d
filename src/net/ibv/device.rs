//! Which RDMA device and port sit behind a network interface, found the way the kernel
//! publishes it: `/sys/class/net/<if>/device/infiniband/<rdma device>` names the device of the
//! interface's PCI function, `dev_port` its port (0-based; verbs count from 1), `address` its
//! MAC. spead2 asks librdmacm instead (`rdma_bind_addr` on the interface address); sysfs gives
//! the same answer without another library.
//!
//! The first check is whether this host has RDMA at all (`ibverbs::devices()`): without
//! devices or kernel support the answer is [`IbvError::NoDevice`], whatever the interface, so
//! that the refusal at start-up says what is missing.

use std::ffi::CStr;
use std::net::Ipv4Addr;
use std::path::Path;

use super::IbvError;
use crate::net::udp::resolve_interface;

/// An interface's RDMA device, port and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbvDevice {
    /// The network interface (`eth2`).
    pub netdev: String,
    /// The RDMA device (`mlx5_0`).
    pub device: String,
    /// Verbs port number (from 1).
    pub port: u8,
    pub mac: [u8; 6],
    pub addr: Ipv4Addr,
}

/// The RDMA devices of this host, or why there are none.
pub fn rdma_devices() -> Result<Vec<String>, IbvError> {
    let list = ibverbs::devices().map_err(|e| IbvError::NoDevice(e.to_string()))?;
    let names: Vec<String> = list
        .iter()
        .filter_map(|d| d.name().map(|n: &CStr| n.to_string_lossy().into_owned()))
        .collect();
    if names.is_empty() {
        return Err(IbvError::NoDevice("the device list is empty".into()));
    }
    Ok(names)
}

/// The RDMA device behind `interface` (a name or an IPv4 address).
pub fn find(interface: &str) -> Result<IbvDevice, IbvError> {
    let devices = rdma_devices()?;
    let (index, addr) = resolve_interface(interface)
        .map_err(|e| IbvError::Interface(interface.into(), e.to_string()))?;
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer has IF_NAMESIZE bytes, as if_indextoname requires.
    let netdev = unsafe {
        if libc::if_indextoname(index, name.as_mut_ptr()).is_null() {
            return Err(IbvError::Interface(
                interface.into(),
                std::io::Error::last_os_error().to_string(),
            ));
        }
        CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned()
    };
    let found = from_sysfs(Path::new("/sys/class/net"), &netdev, addr)?;
    if !devices.contains(&found.device) {
        return Err(IbvError::Interface(
            interface.into(),
            format!("its RDMA device {} is not among {devices:?}", found.device),
        ));
    }
    Ok(found)
}

/// Read `netdev`'s RDMA device, port and MAC under `root` (`/sys/class/net`, or a copy).
pub fn from_sysfs(root: &Path, netdev: &str, addr: Ipv4Addr) -> Result<IbvDevice, IbvError> {
    let dir = root.join(netdev);
    let not = |why: String| IbvError::Interface(netdev.into(), why);
    let ib = dir.join("device/infiniband");
    let device = std::fs::read_dir(&ib)
        .map_err(|_| not("has no RDMA device (it is not on an RDMA-capable NIC)".into()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .min()
        .ok_or_else(|| not("has no RDMA device".into()))?;
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .map(|s| s.trim().to_string())
            .map_err(|e| not(format!("{f}: {e}")))
    };
    let dev_port = read("dev_port").unwrap_or_else(|_| "0".into());
    let port = parse_dev_port(&dev_port).ok_or_else(|| not(format!("dev_port {dev_port:?}")))?;
    let mac_text = read("address")?;
    let mac = parse_mac(&mac_text).ok_or_else(|| not(format!("MAC address {mac_text:?}")))?;
    Ok(IbvDevice {
        netdev: netdev.into(),
        device,
        port,
        mac,
        addr,
    })
}

/// sysfs `dev_port` (0-based, decimal or 0x-hex) → verbs port (1-based).
fn parse_dev_port(text: &str) -> Option<u8> {
    let n = match text.strip_prefix("0x") {
        Some(h) => u8::from_str_radix(h, 16).ok()?,
        None => text.parse::<u8>().ok()?,
    };
    n.checked_add(1)
}

/// `aa:bb:cc:dd:ee:ff`.
fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree of one ConnectX port, read back.
    #[test]
    fn sysfs_gives_device_port_and_mac() {
        let root = std::env::temp_dir().join(format!("cbf-ibv-sysfs-{}", std::process::id()));
        let dir = root.join("ens1f1");
        std::fs::create_dir_all(dir.join("device/infiniband/mlx5_1")).unwrap();
        std::fs::write(dir.join("dev_port"), "1\n").unwrap();
        std::fs::write(dir.join("address"), "0c:42:a1:0b:7e:f3\n").unwrap();
        std::fs::create_dir_all(root.join("eth0")).unwrap();
        let addr = Ipv4Addr::new(10, 0, 0, 2);
        let d = from_sysfs(&root, "ens1f1", addr).unwrap();
        assert_eq!(
            d,
            IbvDevice {
                netdev: "ens1f1".into(),
                device: "mlx5_1".into(),
                port: 2,
                mac: [0x0c, 0x42, 0xa1, 0x0b, 0x7e, 0xf3],
                addr,
            }
        );
        let e = from_sysfs(&root, "eth0", addr).unwrap_err().to_string();
        assert!(e.contains("eth0") && e.contains("no RDMA device"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn text_fields_parse_or_are_refused() {
        assert_eq!(parse_dev_port("0"), Some(1));
        assert_eq!(parse_dev_port("0x1"), Some(2));
        assert_eq!(parse_dev_port("255"), None);
        assert_eq!(parse_dev_port("x"), None);
        assert_eq!(
            parse_mac("01:00:5e:0a:0a:0a"),
            Some([1, 0, 0x5e, 10, 10, 10])
        );
        assert_eq!(parse_mac("01:00:5e:0a:0a"), None);
        assert_eq!(parse_mac("01:00:5e:0a:0a:0a:0b"), None);
    }

    /// What this kind of machine does (no RDMA devices, no kernel support): a clear refusal,
    /// whatever the interface. Reported as skipped where RDMA exists.
    #[test]
    fn no_rdma_device_is_a_clear_error() {
        match find("lo") {
            Err(IbvError::NoDevice(why)) => {
                let e = IbvError::NoDevice(why).to_string();
                assert!(e.starts_with("no RDMA device"), "{e}");
            }
            other => eprintln!("skipped: this host has RDMA devices ({other:?})"),
        }
    }
}
