//! TMA tensor maps (`cuTensorMapEncodeTiled`): how a kernel's `cp.async.bulk.tensor` copies
//! see a buffer in global memory — dimensions, byte strides and the box one copy moves — passed
//! to the kernel by value (`const __grid_constant__`). cudarc has the driver call but no safe
//! wrapper or kernel-argument type for the map, hence this module.

use cudarc::driver::{sys, DeviceRepr, DriverError};

/// An encoded tensor map, as a kernel argument (128 bytes; the driver copies its bytes into
/// the kernel's 64-byte aligned parameter).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte C struct that the driver wrote and the kernel reads as its
// `TensorMap` parameter (the same size).
unsafe impl DeviceRepr for TensorMap {}

impl TensorMap {
    /// A map of 4-byte words at device `address`: `dims[0]` contiguous words, each later
    /// dimension `strides[i − 1]` bytes apart; boxes of `boxes` words, landing in shared
    /// memory densely in that order (dimension 0 fastest), with `swizzle_128b` in the 128-byte
    /// swizzle (16-byte chunk k of each 128-byte row r at (k ^ r % 8)·16; the box's first
    /// dimension then 128 bytes at most, its destination 1024-byte aligned); reads outside
    /// `dims` give zeros. The driver checks the rules (address and strides multiples of 16,
    /// box ≤ 256 per dimension, rank ≤ 5) and answers an error otherwise.
    pub fn words<const R: usize>(
        address: u64,
        dims: [u64; R],
        strides: &[u64],
        boxes: [u32; R],
        swizzle_128b: bool,
    ) -> Result<TensorMap, DriverError> {
        assert_eq!(
            strides.len() + 1,
            R,
            "one byte stride per dimension after the first"
        );
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        let element_strides = [1u32; R];
        // SAFETY: every array holds R (strides R − 1) entries as the rank says; the map is
        // written by the driver before it is read.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
                R as u32,
                address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                if swizzle_128b {
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
                } else {
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
                },
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()?;
            Ok(TensorMap(map.assume_init()))
        }
    }
}
