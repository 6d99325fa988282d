//! SPEAD: the Streaming Protocol for Exchanging Astronomical Data, as spead2 implements it.
//!
//! Layers point one way: [`wire`] and [`items`] are pure codecs over byte slices; [`recv`] and
//! [`send`] are state machines above them (time is passed in, never read); transports live in
//! `crate::net`. Everything here is SPEAD-64-XX (item pointers are 64 bits; the heap address
//! width is a multiple of 8), the flavours spead2 accepts.

pub mod items;
pub mod recv;
pub mod send;
pub mod wire;

pub use wire::{DropReason, Flavour, Packet};
