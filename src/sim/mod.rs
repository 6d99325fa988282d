//! Signal generators: the digitiser simulator (`cbf dsim`): its signal language ([`signal`]),
//! the bit packing of samples ([`pack`]) and the digitiser heaps ([`dsim`]).

pub mod dsim;
pub mod pack;
pub mod signal;
