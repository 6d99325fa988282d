//! cbf: a GPU correlator-beamformer for radio telescopes.
//!
//! Layers, bottom up: [`spead`] (pure wire codec and receive/send state machines), [`net`]
//! (packet transports that move batches), [`dsp`] (the CPU implementation of every signal
//! processing operation: the backend without a GPU and the GPU's oracle), [`sim`] (signal generators for `dsim`),
//! [`control`] (katcp and metrics), and [`cli`] (one file per subcommand). See
//! `../shared/DESIGN.md` for the whole map.

pub mod affinity;
pub mod array;
pub mod chain;
pub mod cli;
pub mod control;
pub mod dsp;
pub mod engine;
pub mod fengine;
pub mod gpu;
pub mod net;
pub mod quicklook;
pub mod selftest;
pub mod sim;
pub mod spead;
pub mod xbengine;
