//! The start-up probe of `--use-peerdirect` (seed 000 §PeerDirect): before anything is sent,
//! check each thing GPUDirect RDMA send needs, in the order an operator would fix them, and
//! refuse with what is missing, naming the flag. [`FengineConfig::validate`] has already
//! refused the combinations that cannot work anywhere (the CPU backend, no `--send-ibv`, a
//! build without ibverbs); this checks the host:
//!
//! 1. an RDMA device (`net::ibv::rdma_devices`), else "no RDMA device";
//! 2. the kernel module through which the RDMA driver resolves GPU addresses, `nvidia_peermem`
//!    (shipped with the NVIDIA driver since 465) or the older Mellanox `nv_peer_mem`, seen as
//!    `/sys/module/<name>` ([`peer_module`]);
//! 3. a trial `ibv_reg_mr` of a small `cuMemAlloc`'d buffer with the send interface's device
//!    ([`probe_registration`]), which fails — with the errno saying why — where the module is
//!    loaded but the GPU, the NIC or the platform do not allow peer-to-peer.
//!
//! [`FengineConfig::validate`]: super::FengineConfig::validate

use std::path::Path;

use crate::engine::ConfigError;
use crate::gpu::Gpu;

const FLAG: &str = "--use-peerdirect";

/// The kernel modules that let an RDMA driver register GPU memory, newest first.
pub const PEER_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

/// Which peer-memory module is loaded, as `sys` (`/sys`, or a copy) shows it.
pub fn peer_module(sys: &Path) -> Result<&'static str, ConfigError> {
    PEER_MODULES
        .into_iter()
        .find(|m| sys.join("module").join(m).is_dir())
        .ok_or_else(|| {
            ConfigError::new(
                FLAG,
                format!(
                    "GPUDirect RDMA needs the nvidia_peermem kernel module (or the older \
                     nv_peer_mem), and {} shows neither: load it with `modprobe nvidia_peermem` \
                     (it ships with the NVIDIA driver), or drop {FLAG}",
                    sys.join("module").display()
                ),
            )
        })
}

/// Steps 1 and 2: an RDMA device and a peer-memory module under `sys`; the interface to
/// register GPU memory with (the first of `interfaces`).
pub fn probe_host(interfaces: &[String], sys: &Path) -> Result<String, ConfigError> {
    rdma_present()?;
    let module = peer_module(sys)?;
    let interface = interfaces.first().ok_or_else(|| {
        ConfigError::new(
            FLAG,
            "needs --send-interface: the NIC that reads the GPU memory",
        )
    })?;
    tracing::info!(module, interface = %interface, "GPUDirect RDMA: peer-memory module loaded");
    Ok(interface.clone())
}

#[cfg(feature = "ibv")]
fn rdma_present() -> Result<(), ConfigError> {
    crate::net::ibv::rdma_devices()
        .map(|_| ())
        .map_err(|e| ConfigError::new(FLAG, e))
}

#[cfg(not(feature = "ibv"))]
fn rdma_present() -> Result<(), ConfigError> {
    Err(ConfigError::new(FLAG, crate::net::IBV_NOT_BUILT))
}

/// Step 3: register a small buffer of `gpu`'s memory with `interface`'s RDMA device, and let
/// it go.
#[cfg(feature = "ibv")]
pub fn probe_registration(gpu: &Gpu, interface: &str) -> Result<(), ConfigError> {
    /// Bytes of the trial registration: one 64 KiB GPU page.
    const TRIAL_BYTES: usize = 64 << 10;
    let buffer = crate::gpu::memory::PeerBuffer::new(gpu, TRIAL_BYTES, true)
        .map_err(|e| ConfigError::new(FLAG, format!("allocating GPU memory to try: {e}")))?;
    crate::net::ibv::try_register(interface, buffer).map_err(|e| {
        ConfigError::new(
            FLAG,
            format!(
                "a trial registration of {TRIAL_BYTES} bytes of GPU memory with {interface}'s \
                 RDMA device failed: {e} (the peer-memory module is loaded, so the GPU, the NIC \
                 or the platform refuse peer-to-peer: check `nvidia-smi topo -m` and that the \
                 GPU supports GPUDirect RDMA)"
            ),
        )
    })?;
    tracing::info!(
        interface,
        "GPUDirect RDMA: GPU memory registers with the NIC"
    );
    Ok(())
}

#[cfg(not(feature = "ibv"))]
pub fn probe_registration(_: &Gpu, _: &str) -> Result<(), ConfigError> {
    Err(ConfigError::new(FLAG, crate::net::IBV_NOT_BUILT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sys(tag: &str, modules: &[&str]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("cbf-peer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("module/nvidia")).unwrap();
        for m in modules {
            std::fs::create_dir_all(root.join("module").join(m)).unwrap();
        }
        root
    }

    /// The module check reads /sys/module: either module will do, the newer preferred; with
    /// neither (nor a plain file of that name) the refusal names the flag and the module.
    #[test]
    fn the_peer_module_is_found_in_sys() {
        let both = fake_sys("both", &["nv_peer_mem", "nvidia_peermem"]);
        assert_eq!(peer_module(&both).unwrap(), "nvidia_peermem");
        let legacy = fake_sys("legacy", &["nv_peer_mem"]);
        assert_eq!(peer_module(&legacy).unwrap(), "nv_peer_mem");
        let none = fake_sys("none", &[]);
        std::fs::write(none.join("module/nvidia_peermem"), "").unwrap();
        let e = peer_module(&none).unwrap_err();
        assert_eq!(e.flag, "--use-peerdirect");
        assert!(e.message.contains("nvidia_peermem"), "{e}");
        for root in [both, legacy, none] {
            std::fs::remove_dir_all(root).unwrap();
        }
    }

    /// On a host without RDMA (this kind of machine) the first refusal says so, by the flag,
    /// before the module is looked for; a build without ibverbs says how to get one.
    #[test]
    fn no_rdma_device_is_refused_first() {
        let sys = fake_sys("nordma", &["nvidia_peermem"]);
        let got = probe_host(&["eth0".into()], &sys);
        std::fs::remove_dir_all(&sys).unwrap();
        if cfg!(feature = "ibv") && rdma_present().is_ok() {
            eprintln!("skipped: this host has RDMA devices");
            return;
        }
        let e = got.unwrap_err();
        assert_eq!(e.flag, "--use-peerdirect");
        let want = if cfg!(feature = "ibv") {
            "no RDMA device"
        } else {
            "built without ibverbs"
        };
        assert!(e.message.contains(want), "{e}");
    }
}
