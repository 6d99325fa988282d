//! The CUDA backend's device layer, through `cudarc` (DESIGN "Backends"): the driver probe, one
//! context with three streams (host-to-device, compute, device-to-host; cudarc's event tracking
//! records an event after every use of a buffer and makes the next stream that touches it wait,
//! which is the event chain seed 001 describes), and the NVRTC module cache keyed by
//! (kernel, `-D` constants, architecture).
//!
//! cudarc panics when libcuda is absent, so [`Gpu::open`] probes for it first and answers with
//! [`GpuError::NoDriver`], whose message names `--backend cpu`.

pub mod beamform;
pub mod compile;
pub mod correlate;
pub mod correlate_plan;
pub mod ddc;
pub mod ddc_tune;
pub mod f16_encode;
pub mod fft;
pub mod frb;
pub mod frb_config;
pub mod frb_half;
pub mod frb_resample;
pub mod frb_tables;
pub mod frb_weights;
pub mod frb_wgmma;
pub mod memory;
pub mod pfb;
pub mod pfb_complex;
pub mod postproc;
pub mod tensor_map;
pub mod timeline;
pub mod vkgdr;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use compile::{Defines, Kernel};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver (libcuda.so.1) on this machine; run with --backend cpu")]
    NoDriver,
    #[error("NVRTC (libnvrtc.so.13) not found; install the CUDA 13 runtime compiler or run with --backend cpu")]
    NoNvrtc,
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("cuFFT: {0:?}")]
    Fft(cudarc::cufft::result::CufftError),
    #[error("cuFFT (libcufft.so.12) not found; run with --backend cpu")]
    NoCufft,
    #[error("{0}")]
    Backend(String),
    #[error("{0}")]
    Vkgdr(#[from] vkgdr::VkgdrError),
    #[error("NVRTC could not compile {kernel} for {arch}: {log}")]
    Compile {
        kernel: &'static str,
        arch: String,
        log: String,
    },
}

impl From<cudarc::cufft::result::CufftError> for GpuError {
    fn from(e: cudarc::cufft::result::CufftError) -> GpuError {
        GpuError::Fft(e)
    }
}

/// The power of two s that puts `max`·s in (limit/2, limit]: how the kernels with narrow number
/// formats (the beamformer's int8 weight digits, the FRB first stage's fp16) use their range
/// fully without overflowing it.
/// The exponent is kept within ±126, so s and 1/s are normal float32 numbers; a `max` of zero
/// or not finite gives 1.
pub fn pow2_scale(max: f64, limit: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    2f64.powi((limit / max).log2().floor().clamp(-126.0, 126.0) as i32)
}

/// Whether libcuda can be loaded: the probe to make before any cudarc driver call.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One GPU: context, streams, compiled modules.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub h2d: Arc<CudaStream>,
    pub compute: Arc<CudaStream>,
    pub d2h: Arc<CudaStream>,
    /// `sm_XY` of the device.
    pub arch: String,
    pub name: String,
    modules: Mutex<HashMap<(Kernel, Defines), Arc<CudaModule>>>,
}

impl Gpu {
    /// Open device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        // SAFETY: only tries to dlopen the libraries.
        if !unsafe { cudarc::cufft::sys::is_culib_present() } {
            return Err(GpuError::NoCufft);
        }
        if !compile::nvrtc_present() {
            return Err(GpuError::NoNvrtc);
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        Ok(Arc::new(Gpu {
            h2d: ctx.new_stream()?,
            compute: ctx.new_stream()?,
            d2h: ctx.new_stream()?,
            arch: format!("sm_{major}{minor}"),
            name: ctx.name()?,
            modules: Mutex::new(HashMap::new()),
            ctx,
        }))
    }

    /// The CUDA version the driver supports (`cuDriverGetVersion`: 1000·major + 10·minor).
    pub fn driver_version(&self) -> Result<i32, GpuError> {
        let mut v = 0;
        // SAFETY: the driver is loaded (a context exists); the call writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
        Ok(v)
    }

    /// Streaming multiprocessors on the device.
    pub fn sm_count(&self) -> Result<usize, GpuError> {
        Ok(self.ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as usize)
    }

    /// `kernel`'s entry point compiled with `defines` for this device (cached).
    pub fn function(&self, kernel: Kernel, defines: &Defines) -> Result<CudaFunction, GpuError> {
        self.function_entry(kernel, defines, kernel.entry())
    }

    /// Another entry point of `kernel`'s source, from the same cached module.
    pub fn function_entry(
        &self,
        kernel: Kernel,
        defines: &Defines,
        entry: &str,
    ) -> Result<CudaFunction, GpuError> {
        let key = (kernel, defines.clone());
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let module = match modules.get(&key) {
            Some(m) => Arc::clone(m),
            None => {
                let cubin = compile::compile(kernel, defines, &kernel.target(&self.arch))?;
                let m = self.ctx.load_module(Ptx::from_binary(cubin))?;
                modules.insert(key, Arc::clone(&m));
                m
            }
        };
        Ok(module.load_function(entry)?)
    }
}
