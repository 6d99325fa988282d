//! Quick-look views of cbf's (and katgpucbf's) output streams, for `cbf capture --plot`:
//! heaps are sorted by their data item and accumulated — F heaps (`feng_raw`) into a power
//! spectrum per polarisation, X heaps (`xeng_raw`) into the latest visibilities of every
//! baseline and a waterfall of one baseline, beam heaps (`bf_raw`) into power over time — and
//! [`draw`] renders them as PNG files; [`QuickLook::summary`] is one line for a terminal.
//!
//! Shapes come from the streams' own descriptors (facts §F heap, §X heap, §Beam heap: feng_raw
//! (channels, spectra, pol, re/im) int8 or packed 4-bit, xeng_raw (channels, baselines × 4,
//! re/im) int32 little-endian, bf_raw (channels, spectra, re/im) int8), so a heap that comes
//! before its descriptor is counted and skipped. Memory is bounded: at most [`MAX_CHANNELS`]
//! channels, [`MAX_WATERFALL`] dumps and [`MAX_BEAM_POINTS`] beam heaps are kept.
#![deny(unsafe_code)]

pub mod draw;

use std::collections::{BTreeMap, VecDeque};

use num_complex::Complex64;

use crate::spead::items::{
    Descriptor, ItemValue, BF_RAW_ID, FENG_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID, XENG_RAW_ID,
};
use crate::spead::recv::ReceivedHeap;

/// Most channels kept (the F-engine's largest output).
pub const MAX_CHANNELS: usize = 65536;
/// Dumps kept in the waterfall (its rows).
pub const MAX_WATERFALL: usize = 256;
/// Beam heaps kept for the power-over-time plot.
pub const MAX_BEAM_POINTS: usize = 4096;
/// Most baselines kept (of 64 antennas; plots show at most [`draw::MAX_BASELINE_ROWS`]).
const MAX_BASELINES: usize = 64 * 65 / 2;
/// katgpucbf's marker of a baseline touched by missing data (real part).
const MISSING: i32 = i32::MIN;

/// A data item's shape and sample width, from its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    dims: [usize; 3],
    bits: u32,
}

/// What the quick look has gathered.
#[derive(Debug, Default)]
pub struct QuickLook {
    shapes: BTreeMap<u64, Shape>,
    /// F: Σ |x|² per pol per channel, and the spectra summed per channel.
    pub f_power: [Vec<f64>; 2],
    pub f_spectra: Vec<u64>,
    pub f_heaps: u64,
    /// X: the latest visibilities, [baseline][product aa/bb][channel] (None = missing).
    pub x_vis: Vec<[Vec<Option<Complex64>>; 2]>,
    pub x_heaps: u64,
    /// Rows of |V| of the waterfall baseline (the first cross-correlation, product aa), by
    /// dump timestamp.
    pub waterfall: VecDeque<(u64, Vec<f64>)>,
    /// Beam heaps: (timestamp, mean power per sample).
    pub beam_power: VecDeque<(u64, f64)>,
    /// Heaps skipped: before their descriptor, or malformed for it.
    pub skipped: u64,
}

fn shape_of(d: &Descriptor) -> Option<Shape> {
    let dims: Vec<usize> = d
        .shape
        .iter()
        .map(|x| x.and_then(|v| usize::try_from(v).ok()))
        .collect::<Option<_>>()?;
    let bits = match (&d.numpy_header, d.format.as_slice()) {
        (Some(h), _) if h.contains("i1") => 8,
        (Some(h), _) if h.contains("i4") => 32,
        (None, [(b'i', 4)]) => 4,
        _ => return None,
    };
    let ok = |n: usize| (1..=MAX_CHANNELS * 1024).contains(&n);
    match (d.id, dims.as_slice()) {
        (FENG_RAW_ID, &[c, s, 2, 2]) if ok(c) && ok(s) && bits <= 8 => Some(Shape {
            dims: [c, s, 2],
            bits,
        }),
        (XENG_RAW_ID, &[c, b, 2])
            if ok(c) && b % 4 == 0 && b / 4 <= MAX_BASELINES && bits == 32 =>
        {
            Some(Shape {
                dims: [c, b / 4, 2],
                bits,
            })
        }
        (BF_RAW_ID, &[c, s, 2]) if ok(c) && ok(s) && bits == 8 => Some(Shape {
            dims: [c, s, 1],
            bits,
        }),
        _ => None,
    }
}

/// Antennas of `n_bl` baselines (autocorrelations included), if it is a triangular number.
fn antennas(n_bl: usize) -> Option<usize> {
    (1..=64).find(|a| a * (a + 1) / 2 == n_bl)
}

/// Baseline index of (a1 ≤ a2): facts §X heap.
fn baseline(a1: usize, a2: usize) -> usize {
    a2 * (a2 + 1) / 2 + a1
}

/// A signed 4-bit value from a nibble.
fn nibble(v: u8) -> i8 {
    ((v << 4) as i8) >> 4
}

impl QuickLook {
    pub fn new() -> QuickLook {
        QuickLook::default()
    }

    /// Take in one heap: its descriptors, and its data if it carries F, X or beam data.
    pub fn add(&mut self, heap: &ReceivedHeap) {
        for d in heap.descriptors().into_iter().flatten() {
            if let Some(s) = shape_of(&d) {
                self.shapes.insert(d.id, s);
            }
        }
        let items = heap.items();
        let bytes = |id| {
            items.iter().find_map(|(i, v)| match v {
                ItemValue::Bytes(b) if *i == id => Some(*b),
                _ => None,
            })
        };
        let imm = |id| {
            items
                .iter()
                .find(|(i, _)| *i == id)
                .and_then(|(_, v)| v.as_u64())
        };
        let first = imm(FREQUENCY_ID).unwrap_or(0) as usize;
        let timestamp = imm(TIMESTAMP_ID).unwrap_or(0);
        let taken = if let Some(raw) = bytes(FENG_RAW_ID) {
            self.add_f(raw, first)
        } else if let Some(raw) = bytes(XENG_RAW_ID) {
            self.add_x(raw, first, timestamp)
        } else if let Some(raw) = bytes(BF_RAW_ID) {
            self.add_beam(raw, timestamp)
        } else {
            return;
        };
        if !taken {
            self.skipped += 1;
        }
    }

    fn add_f(&mut self, raw: &[u8], first: usize) -> bool {
        let Some(&Shape {
            dims: [c, s, _],
            bits,
        }) = self.shapes.get(&FENG_RAW_ID)
        else {
            return false;
        };
        let per_value = if bits == 4 { 1 } else { 2 };
        if raw.len() != c * s * 2 * per_value || first.saturating_add(c) > MAX_CHANNELS {
            return false;
        }
        let end = first + c;
        for p in &mut self.f_power {
            if p.len() < end {
                p.resize(end, 0.0);
            }
        }
        if self.f_spectra.len() < end {
            self.f_spectra.resize(end, 0);
        }
        for ch in 0..c {
            for t in 0..s {
                for pol in 0..2 {
                    let i = (ch * s + t) * 2 + pol;
                    let (re, im) = if bits == 4 {
                        (nibble(raw[i] >> 4), nibble(raw[i] & 0xf))
                    } else {
                        (raw[2 * i] as i8, raw[2 * i + 1] as i8)
                    };
                    self.f_power[pol][first + ch] += f64::from(re).powi(2) + f64::from(im).powi(2);
                }
            }
            self.f_spectra[first + ch] += s as u64;
        }
        self.f_heaps += 1;
        true
    }

    fn add_x(&mut self, raw: &[u8], first: usize, timestamp: u64) -> bool {
        let Some(&Shape {
            dims: [c, n_bl, _], ..
        }) = self.shapes.get(&XENG_RAW_ID)
        else {
            return false;
        };
        if raw.len() != c * n_bl * 8 * 4 || first.saturating_add(c) > MAX_CHANNELS {
            return false;
        }
        let end = first + c;
        if self.x_vis.len() != n_bl {
            self.x_vis = vec![[vec![], vec![]]; n_bl];
            self.waterfall.clear();
        }
        let word = |k: usize| {
            i32::from_le_bytes([raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]])
        };
        for (b, prods) in self.x_vis.iter_mut().enumerate() {
            for (j, prod) in [0, 3].into_iter().enumerate() {
                let v = &mut prods[j];
                if v.len() < end {
                    v.resize(end, None);
                }
                for ch in 0..c {
                    let k = ((ch * n_bl + b) * 4 + prod) * 2;
                    let (re, im) = (word(k), word(k + 1));
                    v[first + ch] =
                        (re != MISSING).then(|| Complex64::new(f64::from(re), f64::from(im)));
                }
            }
        }
        // The waterfall's baseline: (0, 1), or the autocorrelation of a single antenna.
        let wb = if antennas(n_bl).is_some_and(|a| a > 1) {
            baseline(0, 1)
        } else {
            0
        };
        let amp: Vec<f64> = self.x_vis[wb][0]
            .iter()
            .map(|v| v.map_or(0.0, |v| v.norm()))
            .collect();
        match self.waterfall.back_mut() {
            Some((t, row)) if *t == timestamp => *row = amp,
            _ => {
                if self.waterfall.len() == MAX_WATERFALL {
                    self.waterfall.pop_front();
                }
                self.waterfall.push_back((timestamp, amp));
            }
        }
        self.x_heaps += 1;
        true
    }

    fn add_beam(&mut self, raw: &[u8], timestamp: u64) -> bool {
        let Some(&Shape {
            dims: [c, s, _], ..
        }) = self.shapes.get(&BF_RAW_ID)
        else {
            return false;
        };
        if raw.len() != c * s * 2 {
            return false;
        }
        let power: f64 = raw
            .chunks_exact(2)
            .map(|v| f64::from(v[0] as i8).powi(2) + f64::from(v[1] as i8).powi(2))
            .sum::<f64>()
            / (c * s) as f64;
        if self.beam_power.len() == MAX_BEAM_POINTS {
            self.beam_power.pop_front();
        }
        self.beam_power.push_back((timestamp, power));
        true
    }

    /// Mean power per spectrum in each channel, per polarisation.
    pub fn spectrum(&self, pol: usize) -> Vec<f64> {
        self.f_power[pol]
            .iter()
            .zip(&self.f_spectra)
            .map(|(p, &n)| if n == 0 { 0.0 } else { p / n as f64 })
            .collect()
    }

    /// One line for a terminal: heaps of each kind, the strongest channel of each
    /// polarisation and of the waterfall baseline, the latest beam power.
    pub fn summary(&self) -> String {
        let peak = |v: &[f64]| {
            (0..v.len())
                .max_by(|&a, &b| v[a].total_cmp(&v[b]))
                .filter(|&i| v[i] > 0.0)
        };
        let mut parts = vec![];
        if self.f_heaps > 0 {
            let s = [0, 1].map(|p| {
                let sp = self.spectrum(p);
                peak(&sp).map_or("-".into(), |c| {
                    format!("{c} ({:.1} dB)", 10.0 * sp[c].log10())
                })
            });
            parts.push(format!(
                "F {} heaps, peak channel pol0 {} pol1 {}",
                self.f_heaps, s[0], s[1]
            ));
        }
        if self.x_heaps > 0 {
            let row = self
                .waterfall
                .back()
                .map(|(_, r)| r.as_slice())
                .unwrap_or(&[]);
            parts.push(format!(
                "X {} heaps, {} baselines, strongest channel {}",
                self.x_heaps,
                self.x_vis.len(),
                peak(row).map_or("-".into(), |c| c.to_string())
            ));
        }
        if let Some((_, p)) = self.beam_power.back() {
            parts.push(format!(
                "beam {} heaps, power {:.1} dB",
                self.beam_power.len(),
                10.0 * p.max(1e-12).log10()
            ));
        }
        if self.skipped > 0 {
            parts.push(format!(
                "{} heaps skipped (no descriptor yet)",
                self.skipped
            ));
        }
        if parts.is_empty() {
            "no F, X or beam heaps yet".into()
        } else {
            parts.join("; ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_are_signed() {
        assert_eq!(nibble(0x7), 7);
        assert_eq!(nibble(0x8), -8);
        assert_eq!(nibble(0xf), -1);
    }

    #[test]
    fn shapes_come_from_descriptors() {
        let f = Descriptor::with_dtype(FENG_RAW_ID, "feng_raw", "", &[32, 256, 2, 2], "|i1");
        assert_eq!(
            shape_of(&f),
            Some(Shape {
                dims: [32, 256, 2],
                bits: 8
            })
        );
        let x = Descriptor::with_dtype(XENG_RAW_ID, "xeng_raw", "", &[32, 24, 2], "<i4");
        assert_eq!(shape_of(&x).unwrap().dims, [32, 6, 2]);
        let bad = Descriptor::with_dtype(XENG_RAW_ID, "xeng_raw", "", &[32, 23, 2], "<i4");
        assert_eq!(shape_of(&bad), None);
        assert_eq!(antennas(6), Some(3));
        assert_eq!(antennas(5), None);
    }
}
