//! The F-engine simulator's payload and heaps (katgpucbf fsim, facts §1.5 "fsim", §1.9
//! "F heap"). The payload is rendered once, up front, for `PATTERN_BATCHES` batches and
//! replayed; at run time a heap only gets its timestamp.
//!
//! **The payload** of F-engine `f` (of `A`), polarisation `p`, channel `c` *within the heap*
//! (0 ≤ c < channels-per-substream: every destination gets the same values, as in katgpucbf)
//! and spectrum `s` *within the replayed pattern* (s = k·spectra_per_heap + t, where
//! k = (timestamp / timestamp_step) mod `PATTERN_BATCHES` and t is the spectrum in the heap):
//!
//! ```text
//! amplitude = (s + 10·c) mod M          M = 127 for 8-bit values, 7 for 4-bit
//! θ         = 2π·(2f + p) / (2A)
//! re, im    = trunc(amplitude·cos θ), trunc(amplitude·sin θ)     (toward zero)
//! ```
//!
//! The truncation is of the exact real value: a product within 1e-6 of an integer is that
//! integer (this only happens where cos θ or sin θ is 0, ±½ or ±1, Niven's theorem), so
//! libm's last-bit differences cannot flip a value. katgpucbf computes the same formula in
//! float64 and truncates by the int8 cast; it differs only where its float product lands just
//! under an exact integer (array sizes divisible by 3).
//!
//! **Random payload** (`--payload random --seed S`): re and im uniform in [−M, M] (−128 and −8
//! never occur, as the F-engine's quantiser never produces them), from
//! `bits = dsp::random::mix(S, 2f + p, (global channel)·2³² + s)`: re = (bits >> 32) mod
//! (2M+1) − M, im = (bits mod 2³²) mod (2M+1) − M.
//! Random values depend on the global channel, so destinations differ.
//!
//! 4-bit values are packed one byte per complex value, real in the high nibble (what
//! `dsp::correlate::unpack_4bit` reads).
#![deny(unsafe_code)]

use std::f64::consts::PI;

use crate::dsp::random::mix;
use crate::fengine::heaps::f_heap;
use crate::spead::items::TIMESTAMP_ID;
use crate::spead::send::{Heap, ItemData};

/// Batches in the replayed pattern (katgpucbf fsim's `QUEUE_DEPTH`).
pub const PATTERN_BATCHES: usize = 8;

/// What the heaps carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// katgpucbf fsim's pattern (module doc).
    Katgpucbf,
    /// Uniform random values from a seed (module doc).
    Random { seed: u64 },
}

/// The shape of one fsim stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsimLayout {
    pub array_size: usize,
    pub channels_per_substream: usize,
    pub spectra_per_heap: usize,
    /// Destinations (X-engines); destination d carries channels [d·cps, (d+1)·cps).
    pub destinations: usize,
    /// 8 or 4.
    pub sample_bits: u32,
}

impl FsimLayout {
    /// Bytes per (channel, spectrum): two polarisations, complex.
    pub fn jones_bytes(&self) -> usize {
        if self.sample_bits == 4 {
            2
        } else {
            4
        }
    }

    /// Payload bytes of one heap (one F-engine, one destination).
    pub fn heap_bytes(&self) -> usize {
        self.channels_per_substream * self.spectra_per_heap * self.jones_bytes()
    }

    /// Bytes of one F-engine's batch over every destination (an F-engine's whole output heap).
    fn feng_batch_bytes(&self) -> usize {
        self.destinations * self.heap_bytes()
    }

    /// Bytes of the whole rendered pattern.
    pub fn pattern_bytes(&self) -> usize {
        PATTERN_BATCHES * self.array_size * self.feng_batch_bytes()
    }
}

/// One value (re, im) of the payload (module doc): F-engine `feng`, polarisation `pol`,
/// `channel` (global: destination · channels_per_substream + channel in the heap) and
/// `spectrum` within the pattern (k · spectra_per_heap + t), for `layout`'s array size,
/// channels per substream and sample bits.
pub fn payload(
    kind: Payload,
    layout: &FsimLayout,
    feng: usize,
    pol: usize,
    channel: usize,
    spectrum: usize,
) -> (i8, i8) {
    let m: i8 = if layout.sample_bits == 4 { 7 } else { 127 };
    match kind {
        Payload::Katgpucbf => {
            let c = channel % layout.channels_per_substream;
            let amplitude = ((spectrum + 10 * c) % m as usize) as f64;
            let theta = 2.0 * PI * (2 * feng + pol) as f64 / (2 * layout.array_size) as f64;
            (
                exact_trunc(amplitude * theta.cos()),
                exact_trunc(amplitude * theta.sin()),
            )
        }
        Payload::Random { seed } => {
            let index = ((channel as u64) << 32) | spectrum as u64;
            let bits = mix(seed, (2 * feng + pol) as u64, index);
            let span = 2 * m as u64 + 1;
            // (0..span) − m lies in [−m, m], so the casts are exact.
            let value = |b: u64| ((b % span) as i64 - i64::from(m)) as i8;
            (value(bits >> 32), value(bits & 0xffff_ffff))
        }
    }
}

/// Truncation toward zero of the exact value `x` approximates (module doc).
fn exact_trunc(x: f64) -> i8 {
    let r = x.round();
    if (x - r).abs() < 1e-6 {
        r as i8
    } else {
        x.trunc() as i8
    }
}

/// The rendered pattern: for each of `PATTERN_BATCHES` batches and each F-engine, that
/// F-engine's whole output heap (destinations × channels-per-substream × spectra × pols ×
/// complex, channel-major as the F-engine lays it out), so `fengine::heaps::f_heap` cuts each
/// destination's heap out of it as the F-engine does.
#[derive(Debug, Clone)]
pub struct FsimPattern {
    pub layout: FsimLayout,
    pub payload: Payload,
    data: Vec<u8>,
}

impl FsimPattern {
    /// Render every value once.
    pub fn new(layout: FsimLayout, kind: Payload) -> FsimPattern {
        let l = layout;
        let (sph, jb) = (l.spectra_per_heap, l.jones_bytes());
        let mut data = vec![0u8; l.pattern_bytes()];
        for (i, block) in data.chunks_exact_mut(l.feng_batch_bytes()).enumerate() {
            let (k, feng) = (i / l.array_size, i % l.array_size);
            // Channel-major: block offset ((channel · sph) + t) · jones_bytes.
            for (j, jones) in block.chunks_exact_mut(jb).enumerate() {
                let (channel, t) = (j / sph, j % sph);
                let s = k * sph + t;
                let v = |pol| payload(kind, &l, feng, pol, channel, s);
                let ((r0, i0), (r1, i1)) = (v(0), v(1));
                if l.sample_bits == 4 {
                    jones[0] = nibbles(r0, i0);
                    jones[1] = nibbles(r1, i1);
                } else {
                    jones.copy_from_slice(&[r0 as u8, i0 as u8, r1 as u8, i1 as u8]);
                }
            }
        }
        FsimPattern {
            layout,
            payload: kind,
            data,
        }
    }

    /// The heaps of pattern batch `k` for destination `dest`, one per F-engine, timestamp 0
    /// (set per batch with [`set_timestamp`]).
    pub fn heaps(&self, k: usize, dest: usize) -> Vec<Heap<'_>> {
        let l = &self.layout;
        (0..l.array_size)
            .map(|feng| {
                let start = (k * l.array_size + feng) * l.feng_batch_bytes();
                f_heap(
                    &self.data[start..start + l.feng_batch_bytes()],
                    l.jones_bytes(),
                    0,
                    feng as u64,
                    dest,
                    l.channels_per_substream,
                    l.spectra_per_heap,
                )
            })
            .collect()
    }
}

/// Real in the high nibble, imaginary in the low one (`dsp::postproc::pack_4bit`).
fn nibbles(re: i8, im: i8) -> u8 {
    ((re as u8) << 4) | (im as u8 & 0x0f)
}

/// Change a heap's timestamp in place (the only thing that varies from one replay to the next).
pub fn set_timestamp(heap: &mut Heap<'_>, timestamp: u64) {
    for (id, value) in &mut heap.items {
        if *id == TIMESTAMP_ID {
            *value = ItemData::Immediate(timestamp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::correlate::unpack_4bit;
    use crate::spead::items::{FENG_ID_ID, FENG_RAW_ID, FREQUENCY_ID};

    fn layout(n: usize, cps: usize, bits: u32) -> FsimLayout {
        FsimLayout {
            array_size: n,
            channels_per_substream: cps,
            spectra_per_heap: 5,
            destinations: 2,
            sample_bits: bits,
        }
    }

    fn kg(feng: usize, n: usize, pol: usize, c: usize, s: usize, bits: u32) -> (i8, i8) {
        payload(Payload::Katgpucbf, &layout(n, 512, bits), feng, pol, c, s)
    }

    #[test]
    fn katgpucbf_values_worked_by_hand() {
        // θ = 0 for F-engine 0, pol 0: (amplitude, 0); amplitude = (s + 10c) mod 127.
        assert_eq!(kg(0, 4, 0, 3, 5, 8), (35, 0));
        assert_eq!(kg(0, 4, 0, 12, 10, 8), (3, 0)); // 130 mod 127
                                                    // The channel counts within the heap: channel 512 + 3 is channel 3 of destination 1.
        assert_eq!(kg(0, 4, 0, 515, 5, 8), (35, 0));
        // 4 antennas: θ = 2π·(2f+p)/8; f = 1, p = 0 → θ = π/2: (0, amplitude).
        assert_eq!(kg(1, 4, 0, 0, 100, 8), (0, 100));
        // f = 0, p = 1 → θ = π/4: 100·cos = 70.71 → 70.
        assert_eq!(kg(0, 4, 1, 0, 100, 8), (70, 70));
        // f = 1, p = 1 → θ = 3π/4: (−70.71, 70.71) → (−70, 70), toward zero.
        assert_eq!(kg(1, 4, 1, 0, 100, 8), (-70, 70));
        // 3 antennas, f = 1, p = 0 → θ = 2π/3: cos = −½ exactly, so −2·½ is −1 (float: −0.99…).
        assert_eq!(kg(1, 3, 0, 0, 2, 8), (-1, 1));
        // 4-bit: amplitude mod 7.
        assert_eq!(kg(0, 4, 0, 1, 5, 4), (1, 0)); // 15 mod 7
    }

    #[test]
    fn random_values_stay_in_range_and_cover_it() {
        let mut seen = [false; 255];
        for s in 0..20_000 {
            let (re, im) = payload(Payload::Random { seed: 9 }, &layout(4, 16, 8), 2, 1, 7, s);
            assert!((-127..=127).contains(&re) && (-127..=127).contains(&im));
            seen[(re as i32 + 127) as usize] = true;
        }
        assert!(seen.iter().all(|&x| x));
        for s in 0..1000 {
            let (re, im) = payload(Payload::Random { seed: 9 }, &layout(4, 16, 4), 2, 1, 7, s);
            assert!((-7..=7).contains(&re) && (-7..=7).contains(&im));
        }
    }

    #[test]
    fn heaps_carry_the_pattern_at_the_f_engine_layout() {
        for bits in [8, 4] {
            let layout = FsimLayout {
                array_size: 3,
                channels_per_substream: 4,
                ..layout(3, 4, bits)
            };
            let p = FsimPattern::new(layout, Payload::Katgpucbf);
            let mut heaps = p.heaps(6, 1);
            assert_eq!(heaps.len(), 3);
            set_timestamp(&mut heaps[2], 777);
            let item = |id| heaps[2].items.iter().find(|i| i.0 == id).unwrap().1.clone();
            assert_eq!(item(TIMESTAMP_ID), ItemData::Immediate(777));
            assert_eq!(item(FENG_ID_ID), ItemData::Immediate(2));
            assert_eq!(item(FREQUENCY_ID), ItemData::Immediate(4));
            let ItemData::Bytes { data, .. } = item(FENG_RAW_ID) else {
                panic!("feng_raw is not bytes")
            };
            let values: Vec<i8> = if bits == 4 {
                let mut v = vec![0i8; data.len() * 2];
                unpack_4bit(&data, &mut v);
                v
            } else {
                data.iter().map(|&b| b as i8).collect()
            };
            assert_eq!(values.len(), 4 * 5 * 4);
            for c in 0..4 {
                for t in 0..5 {
                    for pol in 0..2 {
                        let o = ((c * 5 + t) * 2 + pol) * 2;
                        let want = payload(Payload::Katgpucbf, &layout, 2, pol, 4 + c, 6 * 5 + t);
                        assert_eq!((values[o], values[o + 1]), want, "{bits} {c} {t} {pol}");
                    }
                }
            }
        }
    }
}
