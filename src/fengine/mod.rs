//! The wideband F-engine (seed 000): digitiser heaps in, channelised F heaps out.
//! [`place`] puts digitiser heaps into chunks, [`output`] parses `--wideband`, [`pipeline`]
//! turns chunks into output heaps, [`heaps`] builds the F heaps on the wire.

pub mod control;
pub mod heaps;
pub mod output;
pub mod pipeline;
pub mod place;
