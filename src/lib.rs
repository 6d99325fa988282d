//! cbf: a GPU correlator-beamformer for radio telescopes.
//!
//! Layers, bottom up: [`spead`] (pure wire codec and receive/send state machines), [`net`]
//! (packet transports that move batches), [`sim`] (signal generators for `dsim`),
//! [`control`] (katcp and metrics), and [`cli`] (one file per subcommand). See
//! `../shared/DESIGN.md` for the whole map.

pub mod cli;
pub mod control;
pub mod net;
pub mod sim;
pub mod spead;
