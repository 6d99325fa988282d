//! The wideband F-engine (seed 000): digitiser heaps in, channelised F heaps out.
//! [`place`] puts digitiser heaps into chunks, [`output`] parses `--wideband`, [`pipeline`]
//! turns chunks into output heaps on a [`backend`] (CPU now, CUDA later), [`heaps`] builds the
//! F heaps on the wire, [`control`] serves katcp.

pub mod backend;
pub mod control;
pub mod heaps;
pub mod output;
pub mod pipeline;
pub mod place;
