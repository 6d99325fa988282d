//! The digitiser simulator's heaps: a pattern of `period` samples per polarisation, rendered
//! once from the signal language, quantised with dither, bit-packed, and replayed as
//! digitiser heaps exactly as katgpucbf's dsim sends them (facts §1.9, "Digitiser heap"):
//! one packet per heap carrying timestamp, digitiser_id, digitiser_status (bit 1 = saturation
//! flag, bits ≥ 32 = count of clipped samples in the heap) and adc_samples (big-endian
//! bit-packed). Heap counters: data 2, 4, 6, …, descriptors 1, 3, 5, ….
#![deny(unsafe_code)]

use super::signal::{check_render_cost, Signal, SignalError, Timebase};
use crate::dsp::random::{mix, unit};
use crate::dsp::samples::{pack, packed_len, valid_sample_bits};
use crate::spead::items::{
    Descriptor, ADC_SAMPLES_ID, DIGITISER_ID_ID, DIGITISER_STATUS_ID, TIMESTAMP_ID,
};
use crate::spead::send::Heap;
use crate::spead::Flavour;

/// What a digitiser stream looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct DigitiserConfig {
    pub adc_sample_rate: f64,
    pub sample_bits: u32,
    pub heap_samples: usize,
    /// Samples in the replayed pattern; a multiple of `heap_samples`.
    pub period: usize,
    /// digitiser_id of polarisation 0; polarisation p sends `first_id + p`.
    pub first_id: u64,
    pub dither_seed: u64,
}

/// Why a digitiser configuration or pattern is refused (issue 11: a zero packet payload, i.e.
/// `heap_samples` = 0, used to divide by zero while rendering).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DigitiserError {
    #[error("heap_samples must not be 0 (a packet needs a payload)")]
    ZeroHeap,
    #[error("period {period} must be a positive multiple of heap_samples {heap_samples}")]
    Period { period: usize, heap_samples: usize },
    #[error("sample_bits {0} is not one of 2–10, 12, 16")]
    SampleBits(u32),
    #[error("adc_sample_rate {0} must be a positive number of Hz")]
    Rate(f64),
    #[error(transparent)]
    Signal(#[from] SignalError),
}

impl DigitiserConfig {
    /// Check what rendering and sending rely on.
    pub fn validate(&self) -> Result<(), DigitiserError> {
        if self.heap_samples == 0 {
            return Err(DigitiserError::ZeroHeap);
        }
        if self.period == 0 || self.period % self.heap_samples != 0 {
            return Err(DigitiserError::Period {
                period: self.period,
                heap_samples: self.heap_samples,
            });
        }
        if !valid_sample_bits(self.sample_bits) {
            return Err(DigitiserError::SampleBits(self.sample_bits));
        }
        if !(self.adc_sample_rate.is_finite() && self.adc_sample_rate > 0.0) {
            return Err(DigitiserError::Rate(self.adc_sample_rate));
        }
        Ok(())
    }

    pub fn heap_bytes(&self) -> usize {
        packed_len(self.heap_samples, self.sample_bits)
    }

    /// Bytes of one digitiser packet on the wire (header, 8 pointers, samples).
    pub fn packet_bytes(&self) -> usize {
        8 + 8 * 8 + self.heap_bytes()
    }
}

/// One polarisation's rendered pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub packed: Vec<u8>,
    /// Clipped samples per heap of the pattern.
    pub clipped: Vec<u32>,
}

/// Quantise to `bits` with optional dither `d` ∈ [−½, ½): returns (code, clipped).
#[inline]
pub fn quantise(x: f64, bits: u32, d: f64) -> (i32, bool) {
    let scale = f64::from((1i32 << (bits - 1)) - 1);
    let v = (x * scale + d).round();
    if v > scale {
        (scale as i32, true)
    } else if v < -scale {
        (-scale as i32, true)
    } else {
        (v as i32, false)
    }
}

/// Render one polarisation: evaluate, dither, quantise and pack the whole period.
pub fn render(signal: &Signal, pol: usize, cfg: &DigitiserConfig) -> Pattern {
    render_threads(signal, pol, cfg, 1)
}

/// [`render`] on `threads` threads, each taking a run of heaps. Every heap depends only on
/// its own timestamp (the signal is evaluated at absolute sample times and the dither is
/// counter-based), so the pattern is the same bit for bit whatever the thread count; a
/// 2^27-sample period took tens of seconds on one thread per polarisation (issue 14).
pub fn render_threads(
    signal: &Signal,
    pol: usize,
    cfg: &DigitiserConfig,
    threads: usize,
) -> Pattern {
    let n_heaps = cfg.period / cfg.heap_samples;
    let heap_bytes = cfg.heap_bytes();
    let mut packed = vec![0u8; n_heaps * heap_bytes];
    let mut clipped = vec![0u32; n_heaps];
    let per = n_heaps.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let runs = packed
            .chunks_mut(per * heap_bytes)
            .zip(clipped.chunks_mut(per))
            .enumerate();
        for (k, (packed, clipped)) in runs {
            s.spawn(move || render_heaps(signal, pol, cfg, k * per, packed, clipped));
        }
    });
    Pattern { packed, clipped }
}

/// Render heaps `first..` of the pattern into `packed` (whole heaps) and their clip counts
/// into `clipped`.
fn render_heaps(
    signal: &Signal,
    pol: usize,
    cfg: &DigitiserConfig,
    first: usize,
    packed: &mut [u8],
    clipped: &mut [u32],
) {
    let tb = Timebase {
        period: cfg.period as u64,
        adc_sample_rate: cfg.adc_sample_rate,
    };
    let heap_bytes = cfg.heap_bytes();
    let mut values = vec![0.0f64; cfg.heap_samples];
    let mut codes = vec![0i32; cfg.heap_samples];
    for (j, (out, clip_count)) in packed
        .chunks_exact_mut(heap_bytes)
        .zip(clipped.iter_mut())
        .enumerate()
    {
        let t0 = ((first + j) * cfg.heap_samples) as u64;
        signal.expr.eval(tb, t0, &mut values);
        for (i, (c, &x)) in codes.iter_mut().zip(&values).enumerate() {
            let d = if signal.dither {
                unit(mix(cfg.dither_seed, pol as u64 + 16, t0 + i as u64)) - 0.5
            } else {
                0.0
            };
            let (q, clip) = quantise(x, cfg.sample_bits, d);
            *c = q;
            *clip_count += u32::from(clip);
        }
        pack(&codes, cfg.sample_bits, out);
    }
}

/// Heaps of all polarisations, built on demand from the rendered patterns.
#[derive(Debug, Clone)]
pub struct DigitiserHeaps {
    pub config: DigitiserConfig,
    pub patterns: Vec<Pattern>,
}

impl DigitiserHeaps {
    /// Render every polarisation, each on its share of the machine's cores (the period can
    /// be 2^27 samples).
    pub fn new(config: DigitiserConfig, signals: &[Signal]) -> DigitiserHeaps {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (cores / signals.len().max(1)).max(1);
        let patterns = std::thread::scope(|s| {
            let handles: Vec<_> = signals
                .iter()
                .enumerate()
                .map(|(p, sig)| {
                    let cfg = &config;
                    s.spawn(move || render_threads(sig, p, cfg, threads))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        DigitiserHeaps { config, patterns }
    }

    /// [`DigitiserHeaps::new`] for outside input: refuses an invalid configuration and a
    /// pattern whose render cost exceeds the signal language's bound, instead of panicking or
    /// computing for hours.
    pub fn try_new(config: DigitiserConfig, signals: &[Signal]) -> Result<Self, DigitiserError> {
        config.validate()?;
        check_render_cost(signals, config.period as u64)?;
        Ok(DigitiserHeaps::new(config, signals))
    }

    pub fn n_pols(&self) -> usize {
        self.patterns.len()
    }

    /// The heap for polarisation `pol` starting at ADC sample `timestamp` (a multiple of
    /// `heap_samples`). Borrows the samples from the pattern.
    pub fn heap(&self, pol: usize, timestamp: u64) -> Heap<'_> {
        let cfg = &self.config;
        let n_heaps = (cfg.period / cfg.heap_samples) as u64;
        let h = ((timestamp / cfg.heap_samples as u64) % n_heaps) as usize;
        let bytes = cfg.heap_bytes();
        let pattern = &self.patterns[pol];
        let clipped = u64::from(pattern.clipped[h]);
        let status = (clipped << 32) | if clipped > 0 { 2 } else { 0 };
        let mut heap = Heap::new();
        heap.repeat_pointers = true;
        heap.add_immediate(TIMESTAMP_ID, timestamp)
            .add_immediate(DIGITISER_ID_ID, cfg.first_id + pol as u64)
            .add_immediate(DIGITISER_STATUS_ID, status)
            .add_bytes(ADC_SAMPLES_ID, &pattern.packed[h * bytes..(h + 1) * bytes]);
        heap
    }

    /// The descriptor heap of a digitiser stream.
    pub fn descriptor_heap(&self) -> Heap<'static> {
        let f = Flavour::SPEAD_64_48;
        let u48 = [(b'u', 48)];
        let mut heap = Heap::new();
        heap.add_descriptor(
            &Descriptor::with_format(
                TIMESTAMP_ID,
                "timestamp",
                "Timestamp of the first sample, in ADC samples since the sync time",
                &[],
                &u48,
            ),
            f,
        )
        .add_descriptor(
            &Descriptor::with_format(
                DIGITISER_ID_ID,
                "digitiser_id",
                "Digitiser serial number and polarisation (LSB)",
                &[],
                &u48,
            ),
            f,
        )
        .add_descriptor(
            &Descriptor::with_format(
                DIGITISER_STATUS_ID,
                "digitiser_status",
                "Bit 1: saturation; bits 32-47: saturated sample count",
                &[],
                &u48,
            ),
            f,
        )
        .add_descriptor(
            &Descriptor::with_format(
                ADC_SAMPLES_ID,
                "adc_samples",
                "Digitised samples, big-endian bit-packed",
                &[Some(self.config.heap_samples as u64)],
                &[(b'i', u64::from(self.config.sample_bits))],
            ),
            f,
        );
        heap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsp::samples::unpack;
    use crate::sim::signal::Expr;
    use std::sync::Arc;

    fn cfg(bits: u32) -> DigitiserConfig {
        DigitiserConfig {
            adc_sample_rate: 1712e6,
            sample_bits: bits,
            heap_samples: 4096,
            period: 8192,
            first_id: 4,
            dither_seed: 1,
        }
    }

    #[test]
    fn quantiser_saturates_symmetrically() {
        assert_eq!(quantise(1.5, 10, 0.0), (511, true));
        assert_eq!(quantise(-1.5, 10, 0.0), (-511, true));
        assert_eq!(quantise(0.5, 8, 0.0), (64, false)); // 63.5 rounds away from zero
        assert_eq!(quantise(1.0, 8, 0.49), (127, false));
    }

    #[test]
    fn pattern_holds_the_quantised_signal_without_dither() {
        let sig = Signal {
            expr: Expr::Cw {
                amplitude: 0.5,
                frequency: 1712e6 / 8192.0 * 3.0,
            },
            dither: false,
        };
        let c = cfg(10);
        let d = DigitiserHeaps::new(c.clone(), &[sig.clone(), sig]);
        let mut codes = vec![0i32; 8192];
        unpack(&d.patterns[1].packed, 10, &mut codes);
        for (t, &q) in codes.iter().enumerate() {
            let want = (511.0 * 0.5 * (std::f64::consts::TAU * 3.0 * t as f64 / 8192.0).cos())
                .round() as i32;
            assert_eq!(q, want, "t={t}");
        }
        assert_eq!(d.patterns[1].clipped, [0, 0]);
    }

    /// Rendering on several threads gives the pattern bit for bit, dither and clip counts
    /// included, however the heaps divide (7 heaps over 1, 2, 3 and 7 threads); without
    /// dither every sample is the quantised tone computed here directly.
    #[test]
    fn threads_do_not_change_the_pattern() {
        let c = DigitiserConfig {
            heap_samples: 256,
            period: 7 * 256,
            ..cfg(8)
        };
        let tone = Expr::Cw {
            amplitude: 1.2,
            frequency: 1712e6 / 1792.0 * 5.0,
        };
        let noisy = Signal {
            expr: Expr::Add(
                Arc::new(tone.clone()),
                Arc::new(Expr::Wgn { std: 0.1, seed: 9 }),
            ),
            dither: true,
        };
        let one = render_threads(&noisy, 1, &c, 1);
        for t in [2, 3, 7, 16] {
            let many = render_threads(&noisy, 1, &c, t);
            assert_eq!(many.packed, one.packed, "{t} threads");
            assert_eq!(many.clipped, one.clipped, "{t} threads");
        }
        assert!(one.clipped.iter().sum::<u32>() > 0, "the 1.2 tone clips");
        let plain = render_threads(
            &Signal {
                expr: tone,
                dither: false,
            },
            0,
            &c,
            3,
        );
        let mut codes = vec![0i32; 1792];
        unpack(&plain.packed, 8, &mut codes);
        for (t, &q) in codes.iter().enumerate() {
            let x = 127.0 * 1.2 * (std::f64::consts::TAU * 5.0 * t as f64 / 1792.0).cos();
            assert_eq!(q, (x.round() as i32).clamp(-127, 127), "t={t}");
        }
    }

    #[test]
    fn clipped_samples_are_counted_in_the_status() {
        let sig = Signal {
            expr: Expr::Const(2.0),
            dither: true,
        };
        let d = DigitiserHeaps::new(cfg(8), &[sig]);
        let heap = d.heap(0, 4096 * 5);
        let status = heap
            .items
            .iter()
            .find(|i| i.0 == DIGITISER_STATUS_ID)
            .unwrap();
        assert_eq!(
            status.1,
            crate::spead::send::ItemData::Immediate((4096 << 32) | 2)
        );
    }

    #[test]
    fn a_zero_payload_is_refused_not_divided_by() {
        let sig = Signal {
            expr: Expr::Const(0.0),
            dither: true,
        };
        let zero = DigitiserConfig {
            heap_samples: 0,
            ..cfg(8)
        };
        // `new` divided by zero here.
        assert_eq!(
            DigitiserHeaps::try_new(zero, std::slice::from_ref(&sig)).err(),
            Some(DigitiserError::ZeroHeap)
        );
        let odd = DigitiserConfig {
            period: 4095,
            ..cfg(8)
        };
        assert!(matches!(
            DigitiserHeaps::try_new(odd, std::slice::from_ref(&sig)),
            Err(DigitiserError::Period { .. })
        ));
        assert!(matches!(
            DigitiserHeaps::try_new(cfg(11), std::slice::from_ref(&sig)),
            Err(DigitiserError::SampleBits(11))
        ));
        assert_eq!(DigitiserHeaps::try_new(cfg(8), &[sig]).unwrap().n_pols(), 1);
        assert_eq!(
            crate::spead::send::packets_per_heap(4096, 0),
            Err(crate::spead::send::PacketiseError::ZeroPayload)
        );
        assert_eq!(crate::spead::send::packets_per_heap(8193, 4096), Ok(3));
    }
}
