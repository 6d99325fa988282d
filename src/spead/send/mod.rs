//! Send: heaps to packets ([`heap`]), the software rate limiter ([`rate`], one per stream), the choice of
//! NIC and what happens when one fails ([`balance`]; `in_flight` counts what a failure loses
//! in flight), and the stream that spreads heaps over substreams and NICs ([`stream`]).

pub mod balance;
pub mod heap;
mod in_flight;
mod lane;
pub mod rate;
pub mod stream;
#[cfg(test)]
mod stream_failover_tests;

pub use balance::InterfaceCounters;
pub use heap::{packets_per_heap, Heap, ItemData, PacketGenerator, PacketiseError};
pub use rate::RateLimiter;
pub use stream::{HeapRef, SendCounters, SendMode, SendStream, SendStreamConfig};
