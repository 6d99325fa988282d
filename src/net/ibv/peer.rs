//! The last step of `--use-peerdirect`'s start-up probe: register a small buffer of GPU memory
//! with the NIC behind the send interface and let it go again. `ibv_reg_mr` on a CUDA device
//! address succeeds only where the `nvidia_peermem` (or legacy `nv_peer_mem`) kernel module
//! resolves it for the RDMA driver, the GPU and NIC allow peer-to-peer, and the device memory
//! is of a kind the driver exports; the errno says which refusal it was (EFAULT or EINVAL where
//! nothing claims the address).

use std::sync::Arc;

use super::verbs::{Context, Mr, Pd};
use super::IbvError;
use crate::net::DeviceMemory;

/// Register `memory` with the RDMA device behind `interface` in a protection domain of its
/// own, then deregister it.
pub fn try_register(interface: &str, memory: Arc<dyn DeviceMemory>) -> Result<(), IbvError> {
    let dev = super::find(interface)?;
    let ctx = Context::open(&dev.device)?;
    let pd = Pd::new(&ctx)?;
    let mr = Mr::new(&pd, memory)?;
    tracing::debug!(device = %dev.device, lkey = mr.lkey(), "trial registration of GPU memory");
    Ok(())
}
