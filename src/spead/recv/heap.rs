//! Generic heap assembly: packets in, whole heaps (with every item pointer) out.
//!
//! Modelled on spead2's `recv::stream`: a bounded number of heaps in flight per substream
//! (`cnt % substreams`, spead2 3.9+), the oldest evicted (and counted) when a new heap needs
//! its slot. Unlike spead2's default, packets of a heap may arrive in any order
//! (`allow_out_of_order`): payload ranges are tracked, and a packet overlapping bytes already
//! received is a duplicate and dropped. A heap is complete when HEAP_LENGTH bytes arrived;
//! unsized heaps are delivered, incomplete, when evicted or flushed. A packet carrying
//! STREAM_CTRL = stop ends the stream: everything in flight is flushed.
//!
//! This path allocates per heap; it serves `cbf capture` and control streams. Engines use
//! [`super::chunk`], which does not.
#![deny(unsafe_code)]

use std::collections::VecDeque;

use super::ranges::{PayloadRanges, RecentCnts};
use super::stats::{StatsSnapshot, StreamStats};
use crate::spead::items::{resolve_items, Descriptor, ItemValue};
use crate::spead::wire::{Flavour, ItemPointer, ParsedPacket, DESCRIPTOR_ID, STREAM_CTRL_ID};

#[derive(Debug, Clone, Copy)]
pub struct HeapStreamConfig {
    /// Heaps in flight per substream (spead2 `max_heaps`, default 4).
    pub max_heaps: usize,
    /// Number of substreams (spead2 `substreams`, default 1).
    pub substreams: usize,
    /// Largest heap accepted, to bound memory against hostile HEAP_LENGTH values.
    pub max_heap_bytes: usize,
    /// End the stream on a stop item (spead2 `stop_on_stop_item`).
    pub stop_on_stop_item: bool,
}

impl Default for HeapStreamConfig {
    fn default() -> Self {
        HeapStreamConfig {
            max_heaps: 4,
            substreams: 1,
            max_heap_bytes: 256 << 20,
            stop_on_stop_item: true,
        }
    }
}

/// A heap handed to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedHeap {
    pub cnt: u64,
    pub flavour: Flavour,
    /// All HEAP_LENGTH bytes arrived.
    pub complete: bool,
    pub heap_length: Option<u64>,
    /// Payload bytes received (less than `payload.len()` when incomplete).
    pub received: u64,
    pub payload: Vec<u8>,
    /// Non-special item pointers, first occurrence order, duplicates removed.
    pub pointers: Vec<ItemPointer>,
}

impl ReceivedHeap {
    /// Items resolved against the payload, in pointer order.
    pub fn items(&self) -> Vec<(u64, ItemValue<'_>)> {
        resolve_items(&self.pointers, &self.payload)
    }

    /// Descriptors carried by the heap; undecodable ones are returned as errors.
    pub fn descriptors(&self) -> Vec<Result<Descriptor, crate::spead::items::DescriptorError>> {
        self.items()
            .into_iter()
            .filter(|(id, _)| *id == DESCRIPTOR_ID)
            .filter_map(|(_, v)| match v {
                ItemValue::Bytes(b) => Some(Descriptor::from_raw(b)),
                ItemValue::Immediate(_) => None,
            })
            .collect()
    }

    /// The first item with `id`.
    pub fn item(&self, id: u64) -> Option<ItemValue<'_>> {
        self.items()
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, v)| v)
    }
}

#[derive(Debug)]
struct LiveHeap {
    heap: ReceivedHeap,
    ranges: PayloadRanges,
}

impl LiveHeap {
    fn new(cnt: u64, flavour: Flavour, payload: Vec<u8>) -> LiveHeap {
        LiveHeap {
            heap: ReceivedHeap {
                cnt,
                flavour,
                complete: false,
                heap_length: None,
                received: 0,
                payload,
                pointers: Vec::new(),
            },
            ranges: PayloadRanges::default(),
        }
    }
}

/// What [`HeapStream::add_packet`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Accepted,
    Dropped,
    /// The stream saw a stop item and has ended.
    Stopped,
}

/// The generic heap assembler.
#[derive(Debug)]
pub struct HeapStream {
    config: HeapStreamConfig,
    live: Vec<VecDeque<LiveHeap>>,
    stats: StreamStats,
    recent: RecentCnts,
    /// Payload buffers handed back through [`HeapStream::recycle`], reused for new heaps so
    /// that a steady stream does not allocate (or page-fault) per heap.
    pool: Vec<Vec<u8>>,
    stopped: bool,
}

impl HeapStream {
    pub fn new(config: HeapStreamConfig) -> HeapStream {
        let substreams = config.substreams.max(1);
        HeapStream {
            config: HeapStreamConfig {
                substreams,
                max_heaps: config.max_heaps.max(1),
                ..config
            },
            live: (0..substreams).map(|_| VecDeque::new()).collect(),
            stats: StreamStats::default(),
            recent: RecentCnts::new(2 * config.max_heaps.max(1) * substreams),
            pool: Vec::new(),
            stopped: false,
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Offer one packet; completed or evicted heaps are appended to `out`.
    pub fn add_packet(&mut self, bytes: &[u8], out: &mut Vec<ReceivedHeap>) -> Added {
        StreamStats::add(&self.stats.packets, 1);
        if self.stopped {
            return Added::Dropped;
        }
        let packet = match ParsedPacket::parse(bytes) {
            Ok(p) => p,
            Err(reason) => {
                self.stats.malformed(reason);
                return Added::Dropped;
            }
        };
        let repr = packet.repr;
        if repr
            .heap_length
            .is_some_and(|l| l > self.config.max_heap_bytes as u64)
            || repr.payload_offset + repr.payload_length as u64 > self.config.max_heap_bytes as u64
        {
            StreamStats::add(&self.stats.inconsistent_packets, 1);
            return Added::Dropped;
        }
        let sub = (repr.heap_cnt % self.config.substreams as u64) as usize;
        let queue = &mut self.live[sub];
        let pos = match queue.iter().position(|h| h.heap.cnt == repr.heap_cnt) {
            Some(p) => p,
            None if self.recent.contains(repr.heap_cnt) => {
                StreamStats::add(&self.stats.duplicate_packets, 1);
                return Added::Dropped;
            }
            None => {
                if queue.len() >= self.config.max_heaps {
                    if let Some(old) = queue.pop_front() {
                        StreamStats::add(&self.stats.incomplete_heaps_evicted, 1);
                        out.push(old.heap);
                    }
                }
                let buffer = self.pool.pop().unwrap_or_default();
                queue.push_back(LiveHeap::new(repr.heap_cnt, repr.flavour, buffer));
                queue.len() - 1
            }
        };
        let live = &mut queue[pos];
        if let (Some(a), Some(b)) = (live.heap.heap_length, repr.heap_length) {
            if a != b {
                StreamStats::add(&self.stats.inconsistent_packets, 1);
                return Added::Dropped;
            }
        }
        let start = repr.payload_offset;
        let end = start + repr.payload_length as u64;
        if !live.ranges.add(start, end) {
            StreamStats::add(&self.stats.duplicate_packets, 1);
            return Added::Dropped;
        }
        if let Some(len) = repr.heap_length {
            live.heap.heap_length = Some(len);
            if live.heap.payload.len() < len as usize {
                live.heap.payload.resize(len as usize, 0);
            }
        }
        if live.heap.payload.len() < end as usize {
            live.heap.payload.resize(end as usize, 0);
        }
        live.heap.payload[start as usize..end as usize].copy_from_slice(packet.payload());
        live.heap.received += repr.payload_length as u64;
        StreamStats::add(&self.stats.bytes, repr.payload_length as u64);
        let mut stop = false;
        for p in packet.packet.pointers() {
            if (p.immediate && p.id <= 4) || p.id == 0 {
                continue;
            }
            if self.config.stop_on_stop_item && p.immediate && p.id == STREAM_CTRL_ID && repr.stop {
                stop = true;
                continue;
            }
            if !live.heap.pointers.contains(&p) {
                live.heap.pointers.push(p);
            }
        }
        if live.heap.heap_length == Some(live.heap.received) {
            let mut done = queue.remove(pos).map(|l| l.heap);
            if let Some(h) = done.as_mut() {
                h.complete = true;
                self.recent.insert(h.cnt);
                // A heap that only says "stop" is not data.
                if !(stop && h.pointers.is_empty()) {
                    StreamStats::add(&self.stats.heaps, 1);
                    out.extend(done);
                }
            }
        }
        if stop {
            StreamStats::add(&self.stats.stops, 1);
            self.flush(out);
            self.stopped = true;
            return Added::Stopped;
        }
        Added::Accepted
    }

    /// Return a delivered heap's payload buffer for reuse (optional; bounded).
    pub fn recycle(&mut self, heap: ReceivedHeap) {
        if self.pool.len() < self.config.max_heaps * self.config.substreams + 4 {
            let mut payload = heap.payload;
            payload.clear();
            self.pool.push(payload);
        }
    }

    /// Hand over every heap in flight (incomplete ones counted as flushed).
    pub fn flush(&mut self, out: &mut Vec<ReceivedHeap>) {
        for queue in &mut self.live {
            for live in queue.drain(..) {
                StreamStats::add(&self.stats.incomplete_heaps_flushed, 1);
                out.push(live.heap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spead::send::heap::{Heap, PacketGenerator};

    fn packets(heap: &Heap<'_>, cnt: u64, size: usize) -> Vec<Vec<u8>> {
        let mut g = PacketGenerator::new(heap, cnt, Flavour::SPEAD_64_48, size).unwrap();
        let mut v = Vec::new();
        loop {
            let mut buf = Vec::new();
            if g.next_packet(&mut buf).is_none() {
                return v;
            }
            v.push(buf);
        }
    }

    fn data_heap(n: usize) -> (Heap<'static>, Vec<u8>) {
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut h = Heap::new();
        h.add_immediate(0x1600, 5).add_bytes(0x1000, data.clone());
        (h, data)
    }

    #[test]
    fn out_of_order_and_duplicates() {
        let (heap, data) = data_heap(5000);
        let mut pkts = packets(&heap, 3, 1024);
        pkts.reverse();
        pkts.insert(2, pkts[0].clone());
        let mut s = HeapStream::new(HeapStreamConfig::default());
        let mut out = Vec::new();
        for p in &pkts {
            s.add_packet(p, &mut out);
        }
        assert_eq!(out.len(), 1);
        assert!(out[0].complete);
        assert_eq!(out[0].item(0x1000), Some(ItemValue::Bytes(&data)));
        assert_eq!(out[0].item(0x1600), Some(ItemValue::Immediate(5)));
        assert_eq!(s.stats().duplicate_packets, 1);
    }

    #[test]
    fn eviction_per_substream() {
        let (heap, _) = data_heap(3000);
        let mut s = HeapStream::new(HeapStreamConfig {
            max_heaps: 2,
            substreams: 2,
            ..Default::default()
        });
        let mut out = Vec::new();
        // First packet of heaps 0..6: substream 0 holds 0,2,4 -> 0 evicted; substream 1: 1 evicted.
        for cnt in 0..6 {
            s.add_packet(&packets(&heap, cnt, 1024)[0], &mut out);
        }
        let evicted: Vec<u64> = out.iter().map(|h| h.cnt).collect();
        assert_eq!(evicted, [0, 1]);
        assert_eq!(s.stats().incomplete_heaps_evicted, 2);
    }

    #[test]
    fn stop_heap_flushes_and_ends() {
        let (heap, _) = data_heap(3000);
        let mut stop = Heap::new();
        stop.add_end();
        let mut s = HeapStream::new(HeapStreamConfig::default());
        let mut out = Vec::new();
        s.add_packet(&packets(&heap, 1, 1024)[0], &mut out);
        assert_eq!(
            s.add_packet(&packets(&stop, 2, 1024)[0], &mut out),
            Added::Stopped
        );
        assert_eq!(out.len(), 1);
        assert!(!out[0].complete);
        assert_eq!(s.stats().incomplete_heaps_flushed, 1);
        assert!(s.is_stopped());
    }
}
