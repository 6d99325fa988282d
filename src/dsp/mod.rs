//! The CPU implementation of every signal-processing operation: the backend when there is no
//! GPU, and the oracle every CUDA kernel is checked against. Pure functions over slices, no I/O.
//! Each function's doc cites the seed section it implements and states every buffer's shape,
//! type and layout.

pub mod beamform;
pub mod beamform_fast;
pub mod complex_pfb;
pub mod correlate;
pub mod correlate_fast;
pub mod ddc;
pub mod ddc_fast;
pub mod delay;
pub mod frb;
pub mod frb_fast;
pub mod frb_resample;
pub mod pfb;
pub mod postproc;
pub mod presence;
pub mod random;
pub mod samples;
