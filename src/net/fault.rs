//! A seeded fault injector in front of any receiver: drops, reorders, duplicates and corrupts
//! packets with given probabilities (smoltcp's `phy::FaultInjector`), and inserts stray
//! packets from a far-off time (a misconfigured or resynchronised sender). Deterministic for a
//! seed, so a failing test can be replayed.
#![deny(unsafe_code)]

use std::io;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{PacketReceiver, Received, RecvBatch};

/// Probabilities per packet, each in [0, 1].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    pub drop: f64,
    /// Swap the packet with the one after it.
    pub reorder: f64,
    pub duplicate: f64,
    /// Flip one random bit somewhere in the packet.
    pub corrupt: f64,
    /// Insert after the packet a copy with bit 40 of its timestamp and of its heap counter
    /// flipped ([`warp_timestamp`]): a stray heap 2^40 samples (minutes to hours) away.
    pub time_warp: f64,
}

/// Immediate item id of the timestamp in katgpucbf's streams (facts §1.9).
pub const TIMESTAMP_ID: u64 = 0x1600;

/// Flip bit 40 of the immediate [`TIMESTAMP_ID`] item and of the heap counter (item 1) of a
/// SPEAD-64-48 packet in place, so that it is another heap far away in time; false (and
/// untouched) if the packet has no timestamp. Decoded by hand: `net` sits below `spead`.
pub fn warp_timestamp(p: &mut [u8]) -> bool {
    if p.len() < 8 || p[0] != 0x53 || p[2] != 2 || p[3] != 6 {
        return false;
    }
    let n = usize::from(u16::from_be_bytes([p[6], p[7]]));
    let raw = |p: &[u8], i: usize| -> Option<u64> {
        let b = p.get(8 + 8 * i..16 + 8 * i)?;
        let mut r = [0u8; 8];
        r.copy_from_slice(b);
        Some(u64::from_be_bytes(r))
    };
    // First immediate pointer with `id`, as receivers read it.
    let find = |p: &[u8], id: u64| {
        (0..n).find(|&i| raw(p, i).is_some_and(|r| r >> 63 == 1 && (r >> 48) & 0x7fff == id))
    };
    let Some(ts) = find(p, TIMESTAMP_ID) else {
        return false;
    };
    for i in std::iter::once(ts).chain(find(p, 1)) {
        if let Some(r) = raw(p, i) {
            p[8 + 8 * i..16 + 8 * i].copy_from_slice(&(r ^ (1 << 40)).to_be_bytes());
        }
    }
    true
}

/// Counts of what was done, for tests to reconcile with receiver statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub dropped: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Stray copies inserted by `time_warp`.
    pub warped: u64,
}

pub struct FaultInjector<R> {
    inner: R,
    faults: Faults,
    rng: SmallRng,
    scratch: RecvBatch,
    pending: Vec<Vec<u8>>,
    pub counts: FaultCounts,
}

impl<R: PacketReceiver> FaultInjector<R> {
    pub fn new(inner: R, faults: Faults, seed: u64, slot_size: usize) -> Self {
        let scratch = RecvBatch::new(64, inner.slot_size(slot_size));
        FaultInjector {
            inner,
            faults,
            rng: SmallRng::seed_from_u64(seed),
            scratch,
            pending: Vec::new(),
            counts: FaultCounts::default(),
        }
    }

    fn mangle(&mut self) {
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(self.scratch.len() * 2);
        for p in self.scratch.iter() {
            if self.rng.random_bool(self.faults.drop) {
                self.counts.dropped += 1;
                continue;
            }
            let mut p = p.to_vec();
            if !p.is_empty() && self.rng.random_bool(self.faults.corrupt) {
                let bit = self.rng.random_range(0..p.len() * 8);
                p[bit / 8] ^= 1 << (bit % 8);
                self.counts.corrupted += 1;
            }
            if self.rng.random_bool(self.faults.duplicate) {
                out.push(p.clone());
                self.counts.duplicated += 1;
            }
            let mut stray = p.clone();
            let warp = self.rng.random_bool(self.faults.time_warp);
            out.push(p);
            if warp && warp_timestamp(&mut stray) {
                out.push(stray);
                self.counts.warped += 1;
            }
        }
        let mut i = 0;
        while i + 1 < out.len() {
            if self.rng.random_bool(self.faults.reorder) {
                out.swap(i, i + 1);
                self.counts.reordered += 1;
                i += 1;
            }
            i += 1;
        }
        out.reverse();
        self.pending = out;
    }
}

impl<R: PacketReceiver> PacketReceiver for FaultInjector<R> {
    fn slot_size(&self, max_packet: usize) -> usize {
        self.inner.slot_size(max_packet)
    }

    fn kernel_drops(&self) -> u64 {
        self.inner.kernel_drops()
    }

    fn refresh_kernel_drops(&mut self) {
        self.inner.refresh_kernel_drops()
    }

    fn frame_drops(&self) -> super::frame::FrameDrops {
        self.inner.frame_drops()
    }

    fn numa_node(&self) -> Option<u32> {
        self.inner.numa_node()
    }

    fn bind_memory(&mut self, node: u32) -> Result<(), super::numa::NumaError> {
        self.inner.bind_memory(node)
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        if self.pending.is_empty() {
            match self.inner.recv_batch(&mut self.scratch)? {
                Received::Packets(_) => self.mangle(),
                other => return Ok(other),
            }
        }
        while batch.len() < batch.capacity() {
            match self.pending.pop() {
                Some(p) => {
                    batch.push(&p);
                }
                None => break,
            }
        }
        Ok(if batch.is_empty() {
            Received::Idle
        } else {
            Received::Packets(batch.len())
        })
    }
}
