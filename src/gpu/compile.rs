//! Run-time compilation of `kernels/*.cu` with NVRTC, straight to a cubin for the device's own
//! architecture (a real `sm_XY` target runs the PTX assembler, so inline-PTX and register
//! errors surface here, not at load time). Kernels take their sizes as `-D` constants, so each
//! output configuration gets its own specialised module; [`super::Gpu`] caches them by
//! (kernel, constants, architecture).
//!
//! cudarc's `compile_ptx` only returns PTX, so the cubin is fetched with `nvrtcGetCUBIN`
//! through cudarc's raw bindings.

use std::ffi::{CStr, CString};

use cudarc::nvrtc::{result, sys};

use super::GpuError;

/// A kernel source in `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Fused decode + PFB FIR (`kernels/pfb.cu`).
    Pfb,
    /// Unzip, real-to-complex fix-up, corrections, quantisation (`kernels/postproc.cu`).
    Postproc,
    /// The benchmark's bandwidth ceiling (`kernels/copy.cu`).
    Copy,
    /// The correlator's corner turn to planar rows (`kernels/correlate_turn.cu`).
    CorrTurn,
    /// The portable `mma.sync` correlator (`kernels/correlate_mma.cu`).
    CorrMma,
    /// The correlator's int64 → int32 reduce (`kernels/correlate_reduce.cu`).
    CorrReduce,
    /// The benchmark's int8 tensor-core ceiling (`kernels/correlate_peak.cu`).
    CorrPeak,
    /// The Hopper `wgmma` correlator (`kernels/correlate_wgmma.cu`), sm_90a only.
    CorrWgmma,
    /// The coherent beamformer (`kernels/beamform.cu`).
    Beamform,
    /// The FRB beamformer's first stage (`kernels/frb_stage1.cu`).
    FrbStage1,
    /// Its Hopper `wgmma` form (`kernels/frb_stage1_wgmma.cu`), sm_90a only.
    FrbStage1Wgmma,
    /// The FRB second stage's resampling matrix for a beam list (`kernels/frb_weights.cu`:
    /// `frb_w`, and `frb_u` before it).
    FrbWeights,
    F16Encode,
    /// The narrowband down-conversion: mixer, low-pass FIR, subsampling (`kernels/ddc.cu`).
    Ddc,
    /// The narrowband PFB FIR on the complex DDC output (`kernels/pfb_complex.cu`).
    PfbComplex,
    /// The benchmark's fp32 fused multiply-add ceiling (`kernels/fma_peak.cu`).
    FmaPeak,
}

impl Kernel {
    pub fn file(self) -> &'static str {
        match self {
            Kernel::Pfb => "pfb.cu",
            Kernel::Postproc => "postproc.cu",
            Kernel::Copy => "copy.cu",
            Kernel::CorrTurn => "correlate_turn.cu",
            Kernel::CorrMma => "correlate_mma.cu",
            Kernel::CorrReduce => "correlate_reduce.cu",
            Kernel::CorrPeak => "correlate_peak.cu",
            Kernel::CorrWgmma => "correlate_wgmma.cu",
            Kernel::Beamform => "beamform.cu",
            Kernel::FrbStage1 => "frb_stage1.cu",
            Kernel::FrbStage1Wgmma => "frb_stage1_wgmma.cu",
            Kernel::FrbWeights => "frb_weights.cu",
            Kernel::F16Encode => "f16_encode.cu",
            Kernel::Ddc => "ddc.cu",
            Kernel::PfbComplex => "pfb_complex.cu",
            Kernel::FmaPeak => "fma_peak.cu",
        }
    }

    /// The entry point's name.
    pub fn entry(self) -> &'static str {
        match self {
            Kernel::Pfb => "pfb_fir",
            Kernel::Postproc => "postproc",
            Kernel::Copy => "copy",
            Kernel::CorrTurn => "corr_turn",
            Kernel::CorrMma => "corr_mma",
            Kernel::CorrReduce => "corr_reduce",
            Kernel::CorrPeak => "corr_peak_mma",
            Kernel::CorrWgmma => "corr_wgmma",
            Kernel::Beamform => "beamform",
            Kernel::FrbStage1 => "frb_stage1",
            Kernel::FrbStage1Wgmma => "frb_stage1_wgmma",
            Kernel::FrbWeights => "frb_w",
            Kernel::F16Encode => "f16_encode",
            Kernel::Ddc => "ddc",
            Kernel::PfbComplex => "pfb_complex",
            Kernel::FmaPeak => "fma_peak",
        }
    }

    /// The target to compile for on a device of `device_arch`: the device's own, except for
    /// kernels that use architecture-specific instructions (`wgmma` needs `sm_90a`; NVRTC
    /// rejects it for plain `sm_90`).
    pub fn target(self, device_arch: &str) -> String {
        match self {
            Kernel::CorrWgmma | Kernel::FrbStage1Wgmma => "sm_90a".to_string(),
            _ => device_arch.to_string(),
        }
    }

    /// A checksum of the source (CRC-32): a cached result measured on one version of a kernel
    /// (`super::ddc_tune`) is not reused for another.
    pub fn fingerprint(self) -> u32 {
        crc32fast::hash(self.source().as_bytes())
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::Pfb => concat!(
                include_str!("../../kernels/decode.cuh"),
                include_str!("../../kernels/pfb.cu")
            ),
            Kernel::Postproc => concat!(
                include_str!("../../kernels/dither.cuh"),
                include_str!("../../kernels/postproc.cu")
            ),
            Kernel::Copy => include_str!("../../kernels/copy.cu"),
            Kernel::CorrTurn => include_str!("../../kernels/correlate_turn.cu"),
            Kernel::CorrMma => include_str!("../../kernels/correlate_mma.cu"),
            Kernel::CorrReduce => include_str!("../../kernels/correlate_reduce.cu"),
            Kernel::CorrPeak => include_str!("../../kernels/correlate_peak.cu"),
            Kernel::CorrWgmma => concat!(
                include_str!("../../kernels/hopper_cluster.cuh"),
                include_str!("../../kernels/correlate_wgmma_tiles.cuh"),
                include_str!("../../kernels/correlate_wgmma_fused.cuh"),
                include_str!("../../kernels/correlate_wgmma_ride.cuh"),
                include_str!("../../kernels/correlate_wgmma.cu")
            ),
            Kernel::Beamform => concat!(
                include_str!("../../kernels/dither.cuh"),
                include_str!("../../kernels/beamform_input.cuh"),
                include_str!("../../kernels/beamform.cu")
            ),
            Kernel::FrbStage1 => concat!(
                include_str!("../../kernels/frb_common.cuh"),
                include_str!("../../kernels/frb_stage1.cu")
            ),
            Kernel::FrbStage1Wgmma => concat!(
                include_str!("../../kernels/frb_common.cuh"),
                include_str!("../../kernels/frb_stage1_wgmma.cu")
            ),
            Kernel::FrbWeights => include_str!("../../kernels/frb_weights.cu"),
            Kernel::F16Encode => include_str!("../../kernels/f16_encode.cu"),
            Kernel::Ddc => concat!(
                include_str!("../../kernels/decode.cuh"),
                include_str!("../../kernels/ddc.cu")
            ),
            Kernel::PfbComplex => include_str!("../../kernels/pfb_complex.cu"),
            Kernel::FmaPeak => include_str!("../../kernels/fma_peak.cu"),
        }
    }
}

/// `-D` constants, in a fixed order so that equal sets are equal keys.
pub type Defines = Vec<(&'static str, i64)>;

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version, or `None` where it cannot be loaded.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (r == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Compile `kernel` with `defines` for `arch` (`sm_90`, `sm_90a`, ...) to a cubin.
pub fn compile(
    kernel: Kernel,
    defines: &[(&'static str, i64)],
    arch: &str,
) -> Result<Vec<u8>, GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let fail = |log: String| GpuError::Compile {
        kernel: kernel.file(),
        arch: arch.to_string(),
        log,
    };
    let src = CString::new(kernel.source()).map_err(|e| fail(e.to_string()))?;
    let name = CString::new(kernel.file()).map_err(|e| fail(e.to_string()))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--extra-device-vectorization".to_string(),
        // Spills and serialised wgmma (C7510-C7515) cost most of a kernel's speed silently:
        // ptxas reports both as warnings, and a warning fails the compile below.
        "--ptxas-options=--warn-on-spills".to_string(),
    ];
    options.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let prog = result::create_program(&src, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    // SAFETY: `prog` was just created and is destroyed once below; `src` and `name` outlive it.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options);
        let out = match compiled {
            Ok(()) => match check_log(&log(prog)) {
                Ok(()) => cubin(prog).map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}"))),
                Err(log) => Err(fail(format!("ptxas warning with {options:?}:\n{log}"))),
            },
            Err(e) => Err(fail(format!("{e:?} with {options:?}:\n{}", log(prog)))),
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// A successful compile's log is refused when it holds a warning or a "Potential Performance
/// Loss": ptxas reports spills (with `--warn-on-spills`) as warnings and serialised `wgmma`
/// (C7510–C7515) as warnings or, for want of registers (C7511), as a `ptxas info` line, and
/// either costs most of a kernel's speed silently. Other informational lines pass.
pub fn check_log(log: &str) -> Result<(), String> {
    if log.contains("warning") || log.contains("Potential Performance Loss") {
        Err(log.to_string())
    } else {
        Ok(())
    }
}

/// The compiler's log of `prog` (empty if it cannot be read).
///
/// # Safety
/// `prog` is a live program on which compilation was attempted.
unsafe fn log(prog: sys::nvrtcProgram) -> String {
    result::get_program_log(prog)
        .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// # Safety
/// `prog` is a successfully compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut bin = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast()).result()?;
    Ok(bin)
}
