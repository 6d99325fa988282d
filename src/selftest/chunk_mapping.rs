//! The CUDA backends' receive chunks as the device sees them: host memory page-locked in place
//! and mapped into the device's address space (`gpu::memory::HostRegistrations`, the engines'
//! default for `--backend cuda`).
//!
//! A chunk-sized buffer of random bytes is registered as an engine registers its chunks; the
//! device copies a range of it out through its device address (an odd offset and length, so
//! that the address arithmetic is checked, not only the buffer's start), and writes random
//! bytes into another range through the mapping, which the host then reads in place. Both must
//! be exact, byte for byte, and the bytes around the written range untouched.

use std::sync::Arc;

use cudarc::driver::{sys, DevicePtr, DevicePtrMut};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{random_bytes, Check, MIB};
use crate::gpu::memory::HostRegistrations;
use crate::gpu::{Gpu, GpuError};

/// Every check on `gpu` with inputs drawn from `seed`.
pub fn run(gpu: &Arc<Gpu>, seed: u64) -> Result<Vec<Check>, GpuError> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x3a91);
    let mut chunk = random_bytes(&mut rng, 8 * MIB);
    let want = chunk.clone();
    let mut pins = HostRegistrations::new(Arc::clone(gpu));
    // SAFETY: `chunk` outlives `pins` (dropped first, below) and is not moved meanwhile.
    unsafe { pins.register(&mut chunk) }?;
    let st = &gpu.h2d;

    // The device reads [at, at + len) through the mapping.
    let (at, len) = (MIB + 13, 3 * MIB + 7);
    let from = pins
        .device_address(&chunk[at..at + len])
        .ok_or_else(|| GpuError::Backend("a registered chunk has no device address".into()))?;
    let mut copy = st.alloc_zeros::<u8>(len)?;
    {
        let (to, _record) = copy.device_ptr_mut(st);
        // SAFETY: `len` bytes at `from` are the registered chunk's, mapped for the device;
        // `copy` holds `len` bytes; the stream is `copy`'s.
        unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, len, st.cu_stream()) }.result()?;
    }
    let got = st.clone_dtoh(&copy)?;
    let read_differ = got
        .iter()
        .zip(&want[at..at + len])
        .filter(|(a, b)| a != b)
        .count();

    // The device writes [w, w + wlen) through the mapping; the host reads the whole chunk.
    let (w, wlen) = (5 * MIB + 101, MIB + 3);
    let new = random_bytes(&mut rng, wlen);
    let src = st.clone_htod(&new)?;
    let to = pins
        .device_address(&chunk[w..w + wlen])
        .ok_or_else(|| GpuError::Backend("a registered chunk has no device address".into()))?;
    {
        let (from, _record) = src.device_ptr(st);
        // SAFETY: `wlen` bytes of `src` into the registered chunk's mapping at `to`, which
        // nothing on the host touches until the stream is synchronised below.
        unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, wlen, st.cu_stream()) }.result()?;
    }
    st.synchronize()?;
    drop(pins);
    let mut expect = want;
    expect[w..w + wlen].copy_from_slice(&new);
    let write_differ = chunk.iter().zip(&expect).filter(|(a, b)| a != b).count();

    Ok(vec![
        Check {
            name: "receive chunk read by the device through its mapping".into(),
            measured: read_differ as f64,
            limit: 0.0,
            pass: read_differ == 0,
            note: format!("{read_differ} of {len} bytes differ (offset {at} of an 8 MiB chunk)"),
        },
        Check {
            name: "receive chunk written by the device through its mapping".into(),
            measured: write_differ as f64,
            limit: 0.0,
            pass: write_differ == 0,
            note: format!(
                "{write_differ} bytes of the 8 MiB chunk differ from the expected \
                 ({wlen} written at offset {w}, the rest as before)"
            ),
        },
    ])
}
