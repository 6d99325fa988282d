//! Signal generators: the digitiser simulator (`cbf dsim`): its signal language ([`signal`])
//! and the digitiser heaps ([`dsim`]); sample packing is in `crate::dsp::samples`.

pub mod dsim;
pub mod signal;
mod signal_parse;
