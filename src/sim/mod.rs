//! The simulators as library types. The digitiser simulator [`Dsim`] (`cbf dsim`): its
//! signal language ([`signal`]), the digitiser heaps ([`dsim`]), its flags
//! ([`dsim_config`]), katcp ([`dsim_control`]), engine ([`dsim_engine`]) and send threads
//! ([`dsim_send`]); sample packing is in `crate::dsp::samples`. The F-engine simulator [`Fsim`] (`cbf fsim`): its payload and
//! heaps ([`fsim`]), flags ([`fsim_config`]) and send threads ([`fsim_engine`]).

pub mod dsim;
pub mod dsim_config;
pub mod dsim_control;
pub mod dsim_engine;
pub mod dsim_send;
pub mod fsim;
pub mod fsim_config;
pub mod fsim_engine;
pub mod signal;
mod signal_parse;

pub use dsim_config::{DsimConfig, DsimPlan};
pub use dsim_engine::{Dsim, DsimReport};
pub use fsim_config::{FsimConfig, FsimPlan};
pub use fsim_engine::{Fsim, FsimReport};
