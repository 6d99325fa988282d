//! Signal generators as library types: the digitiser simulator [`Dsim`] (`cbf dsim`): its
//! signal language ([`signal`]), the digitiser heaps ([`dsim`]), its flags
//! ([`dsim_config`]), katcp ([`dsim_control`]) and send loop ([`dsim_engine`]); sample packing
//! is in `crate::dsp::samples`.

pub mod dsim;
pub mod dsim_config;
pub mod dsim_control;
pub mod dsim_engine;
pub mod signal;

pub use dsim_config::{DsimConfig, DsimPlan};
pub use dsim_engine::{Dsim, DsimReport};
