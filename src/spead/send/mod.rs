//! Send: heaps to packets ([`heap`]), the software rate limiter ([`rate`]), and the stream
//! that spreads heaps over substreams and NICs ([`stream`]).

pub mod heap;
pub mod rate;
pub mod stream;

pub use heap::{packets_per_heap, Heap, ItemData, PacketGenerator, PacketiseError};
pub use rate::RateLimiter;
pub use stream::{HeapRef, SendMode, SendStream, SendStreamConfig};
