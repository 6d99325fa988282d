//! Receive state machines: generic heap assembly ([`heap`]) for `cbf capture` and control
//! streams, and chunk assembly ([`chunk`]) for the engines, with statistics by cause
//! ([`stats`]). Transports feed them packets; they never read a clock or a socket.

pub mod chunk;
mod chunk_data;
mod chunk_group;
pub mod heap;
mod ranges;
pub mod stats;

pub use chunk::{Chunk, ChunkGroup, ChunkGroupConfig, ChunkStream, PlaceInput, Placement};
pub use chunk_data::{ChunkData, ExternalBuffer};
pub use heap::{HeapStream, HeapStreamConfig, ReceivedHeap};
pub use stats::{StatsSnapshot, StreamStats};
