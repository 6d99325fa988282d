//! `--narrowband name=…,channels=…,centre_frequency=…,decimation=…,dst=…[,ddc_taps=…]
//! [,weight_pass=0.005][,pass_bandwidth=…][,taps=16][,w_cutoff=1.0][,window_function=hann]
//! [,dither=uniform][,jones_per_batch=…]` (katgpucbf fgpu, facts §1.3; seed 000 §Narrowband),
//! parsed and validated with errors that name the flag's key, and the sizes that follow from it.
//!
//! Two modes (seed 000 §Narrowband; katgpucbf `NarrowbandOutputDiscard`/`NoDiscard`):
//!
//! | mode | when | subsampling S | PFB size M | kept |
//! |---|---|---|---|---|
//! | discard | no `pass_bandwidth` | decimation (must be even) | 2·channels | inner half |
//! | no-discard | `pass_bandwidth` given | 2·decimation | channels | all |
//!
//! Either way a spectrum is M·S = 2·channels·decimation digitiser samples apart, the output
//! band is adc_sample_rate/(2·decimation) wide, centred on `centre_frequency`, and the DDC
//! filter has `ddc_taps` taps (default 16·S, as katgpucbf's `16 × subsampling`).
#![deny(unsafe_code)]

use std::net::SocketAddrV4;

use super::output::{OutputShape, WidebandOutput};
use crate::dsp::ddc::{ddc_weights_discard, ddc_weights_no_discard, DdcError};
use crate::dsp::pfb::Window;

/// Largest decimation (MeerKAT's narrowband modes decimate by 8 to 64; the DDC filter and
/// the PFB window grow with it).
pub const MAX_DECIMATION: usize = 256;
/// Most DDC filter taps: the Remez design at start-up grows with their square (1 s for 2048
/// taps, 4 s for 4096 in a debug build), and katgpucbf's default, 16 × subsampling, reaches
/// 8192 at the largest decimation without discard.
pub const MAX_DDC_TAPS: usize = 8192;
/// Most DDC taps per subsampled sample (per phase of the filter): pm-remez did not finish in
/// minutes for longer filters of a small subsampling factor (1000 taps at S = 2, 4096 at
/// S = 64, measured 2026-11-26), which would stall start-up; designs up to 32·S finished within
/// seconds or failed at once. katgpucbf's default is 16·S.
pub const MAX_DDC_TAPS_PER_PHASE: usize = 32;

#[derive(Debug, Clone, PartialEq)]
pub struct NarrowbandOutput {
    pub name: String,
    pub channels: usize,
    pub dst: Vec<SocketAddrV4>,
    pub taps: usize,
    pub w_cutoff: f64,
    pub window: Window,
    pub dither: bool,
    pub jones_per_batch: Option<usize>,
    /// Digitiser (baseband) frequency of the band's centre, Hz: output channel channels/2.
    pub centre_frequency: f64,
    /// Factor by which the bandwidth is reduced.
    pub decimation: usize,
    pub ddc_taps: usize,
    /// Passband weight of the DDC filter design against a stopband weight of 1.
    pub weight_pass: f64,
    /// Hz of flat response: set, it selects no-discard mode.
    pub pass_bandwidth: Option<f64>,
}

impl NarrowbandOutput {
    /// Parse the sub-option string; `Err` is a message for the `--narrowband` flag, naming
    /// the key at fault. Checks that need the ADC sample rate are [`NarrowbandOutput::check`].
    pub fn parse(text: &str) -> Result<NarrowbandOutput, String> {
        let mut centre = None;
        let mut decimation = None;
        let mut ddc_taps = None;
        let mut weight_pass = 0.005;
        let mut pass_bandwidth = None;
        let common = WidebandOutput::parse_with(text, |k, v| {
            let bad = |what: &str| format!("{k}={v:?}: {what}");
            let number = || v.parse::<f64>().map_err(|_| bad("not a number"));
            let integer = || v.parse::<usize>().map_err(|_| bad("not an integer"));
            match k {
                "centre_frequency" => centre = Some(number()?),
                "decimation" => decimation = Some(integer()?),
                "ddc_taps" => ddc_taps = Some(integer()?),
                "weight_pass" => weight_pass = number()?,
                "pass_bandwidth" => pass_bandwidth = Some(number()?),
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        let centre_frequency = centre.ok_or("missing centre_frequency=")?;
        let decimation = decimation.ok_or("missing decimation=")?;
        if !centre_frequency.is_finite() || centre_frequency <= 0.0 {
            return Err(format!(
                "centre_frequency={centre_frequency} must be a positive frequency in Hz"
            ));
        }
        if decimation == 0 || decimation > MAX_DECIMATION {
            return Err(format!(
                "decimation={decimation} must be from 1 to {MAX_DECIMATION}"
            ));
        }
        if pass_bandwidth.is_none() && decimation % 2 != 0 {
            return Err(format!(
                "decimation={decimation} must be even (discard mode; pass_bandwidth= selects no-discard)"
            ));
        }
        if let Some(b) = pass_bandwidth.filter(|b| !b.is_finite() || *b <= 0.0) {
            return Err(format!(
                "pass_bandwidth={b} must be a positive bandwidth in Hz"
            ));
        }
        if !weight_pass.is_finite() || weight_pass <= 0.0 {
            return Err(format!("weight_pass={weight_pass} must be positive"));
        }
        let subsampling = if pass_bandwidth.is_some() {
            2 * decimation
        } else {
            decimation
        };
        let ddc_taps = ddc_taps.unwrap_or(16 * subsampling);
        if ddc_taps == 0 || ddc_taps > MAX_DDC_TAPS {
            return Err(format!(
                "ddc_taps={ddc_taps} must be from 1 to {MAX_DDC_TAPS}"
            ));
        }
        if ddc_taps > MAX_DDC_TAPS_PER_PHASE * subsampling {
            return Err(format!(
                "ddc_taps={ddc_taps} must be at most {MAX_DDC_TAPS_PER_PHASE} × the subsampling \
                 factor ({subsampling}): longer filters make the Remez design run for minutes"
            ));
        }
        Ok(NarrowbandOutput {
            name: common.name,
            channels: common.channels,
            dst: common.dst,
            taps: common.taps,
            w_cutoff: common.w_cutoff,
            window: common.window,
            dither: common.dither,
            jones_per_batch: common.jones_per_batch,
            centre_frequency,
            decimation,
            ddc_taps,
            weight_pass,
            pass_bandwidth,
        })
    }

    /// Discard mode: the PFB has twice the channels and the outer half is dropped.
    pub fn discard(&self) -> bool {
        self.pass_bandwidth.is_none()
    }

    /// Digitiser samples per DDC output sample.
    pub fn subsampling(&self) -> usize {
        if self.discard() {
            self.decimation
        } else {
            2 * self.decimation
        }
    }

    /// Points of the PFB and its complex FFT.
    pub fn internal_channels(&self) -> usize {
        if self.discard() {
            2 * self.channels
        } else {
            self.channels
        }
    }

    /// Width of the output band in Hz.
    pub fn bandwidth(&self, adc_sample_rate: f64) -> f64 {
        adc_sample_rate * 0.5 / self.decimation as f64
    }

    /// The checks that need the ADC sample rate: the band lies within the digitised band
    /// [0, fs/2], and `pass_bandwidth` is less than the output band.
    pub fn check(&self, adc_sample_rate: f64) -> Result<(), String> {
        let half = self.bandwidth(adc_sample_rate) / 2.0;
        let f = self.centre_frequency;
        if f - half < 0.0 || f + half > adc_sample_rate / 2.0 {
            return Err(format!(
                "centre_frequency={f}: the band {}–{} Hz must lie within 0–{} Hz",
                f - half,
                f + half,
                adc_sample_rate / 2.0
            ));
        }
        if let Some(b) = self.pass_bandwidth.filter(|&b| b >= 2.0 * half) {
            return Err(format!(
                "pass_bandwidth={b} must be less than the output bandwidth {} Hz",
                2.0 * half
            ));
        }
        Ok(())
    }

    /// The DDC low-pass filter (katgpucbf's `generate_ddc_weights`, seed 000 §Filter design).
    pub fn ddc_weights(&self, adc_sample_rate: f64) -> Result<Vec<f32>, DdcError> {
        match self.pass_bandwidth {
            None => ddc_weights_discard(self.ddc_taps, self.subsampling(), self.weight_pass),
            Some(b) => ddc_weights_no_discard(
                self.ddc_taps,
                self.subsampling(),
                b / self.bandwidth(adc_sample_rate),
                self.weight_pass,
            ),
        }
    }

    /// The mixer frequency, in cycles per digitiser sample: it moves the centre to DC.
    pub fn mixer_frequency(&self, adc_sample_rate: f64) -> f64 {
        -self.centre_frequency / adc_sample_rate
    }

    /// The shape its pipeline runs on: a spectrum every M·S digitiser samples, reading the
    /// taps·M·S samples of its PFB window plus the DDC filter's footprint beyond the last
    /// subsampled sample (katgpucbf `NarrowbandOutput.window`).
    pub fn shape(&self) -> OutputShape {
        let s = self.subsampling();
        let spectra_samples = self.internal_channels() * s;
        OutputShape {
            channels: self.channels,
            spectra_samples,
            window: self.taps * spectra_samples + self.ddc_taps - s,
            subsampling: s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_and_their_sizes() {
        let d = NarrowbandOutput::parse(
            "name=nb,channels=1024,centre_frequency=2e8,decimation=8,dst=239.1.1.1+3:7148",
        )
        .unwrap();
        assert!(d.discard());
        assert_eq!(
            (d.subsampling(), d.internal_channels(), d.ddc_taps),
            (8, 2048, 128)
        );
        assert_eq!(
            d.shape(),
            OutputShape {
                channels: 1024,
                spectra_samples: 16384,
                window: 16 * 16384 + 128 - 8,
                subsampling: 8,
            }
        );
        assert_eq!((d.weight_pass, d.taps, d.dither), (0.005, 16, true));
        assert_eq!(d.check(1712e6), Ok(()));
        let n = NarrowbandOutput::parse(
            "name=vlbi,channels=64,centre_frequency=4e8,decimation=5,dst=239.1.1.2:7148,\
             pass_bandwidth=64e6,taps=1,w_cutoff=0,window_function=rect,ddc_taps=200,weight_pass=0.01,dither=none",
        )
        .unwrap();
        assert!(!n.discard());
        assert_eq!((n.subsampling(), n.internal_channels()), (10, 64));
        assert_eq!(n.shape().spectra_samples, 640);
        assert_eq!(n.shape().window, 640 + 200 - 10);
        assert_eq!(
            (n.ddc_taps, n.weight_pass, n.window, n.dither),
            (200, 0.01, Window::Rect, false)
        );
        // Default DDC taps: 16 × subsampling, which is twice the decimation without discard.
        let n2 = NarrowbandOutput::parse(
            "name=v,channels=64,centre_frequency=4e8,decimation=4,dst=1.2.3.4:5,pass_bandwidth=1e6",
        )
        .unwrap();
        assert_eq!(n2.ddc_taps, 128);
        assert_eq!(n.check(1712e6), Ok(()));
    }

    /// Every refusal names the key at fault.
    #[test]
    fn every_refusal_names_its_key() {
        let base = "name=nb,channels=64,centre_frequency=2e8,dst=1.2.3.4:5";
        for (extra, key) in [
            ("decimation=8,bogus=1", "bogus"),
            ("", "decimation="),
            ("decimation=x", "decimation="),
            ("decimation=0", "decimation="),
            ("decimation=1024", "decimation="),
            ("decimation=7", "decimation="),
            ("decimation=8,ddc_taps=0", "ddc_taps="),
            ("decimation=8,ddc_taps=100000", "ddc_taps="),
            ("decimation=2,ddc_taps=1000", "ddc_taps="),
            ("decimation=64,ddc_taps=4096", "ddc_taps="),
            ("decimation=8,ddc_taps=-3", "ddc_taps="),
            ("decimation=8,weight_pass=0", "weight_pass="),
            ("decimation=8,weight_pass=nan", "weight_pass="),
            ("decimation=8,weight_pass=x", "weight_pass="),
            ("decimation=8,pass_bandwidth=-1", "pass_bandwidth="),
            ("decimation=8,pass_bandwidth=inf", "pass_bandwidth="),
            ("decimation=8,pass_bandwidth=x", "pass_bandwidth="),
            ("decimation=8,centre_frequency=nan", "centre_frequency="),
            ("decimation=8,centre_frequency=-5", "centre_frequency="),
            ("decimation=8,centre_frequency=x", "centre_frequency="),
            ("decimation=8,channels=48", "channels="),
            ("decimation=8,taps=0", "taps="),
            ("decimation=8,window_function=kaiser", "window_function="),
            ("decimation=8,dither=gauss", "dither="),
            ("decimation=8,w_cutoff=-1", "w_cutoff="),
            (
                "decimation=8,jones_per_batch=1099511627776",
                "jones_per_batch=",
            ),
            (
                "decimation=8,dst=1.2.3.4+1:5,channels=2,dst=1.2.3.4+2:5",
                "channels=",
            ),
        ] {
            let text = format!("{base},{extra}");
            let e = NarrowbandOutput::parse(&text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
        for (text, key) in [
            (
                "channels=64,centre_frequency=2e8,decimation=8,dst=1.2.3.4:5",
                "name=",
            ),
            (
                "name=a,centre_frequency=2e8,decimation=8,dst=1.2.3.4:5",
                "channels=",
            ),
            (
                "name=a,channels=64,decimation=8,dst=1.2.3.4:5",
                "centre_frequency=",
            ),
            (
                "name=a,channels=64,centre_frequency=2e8,decimation=8",
                "dst=",
            ),
        ] {
            let e = NarrowbandOutput::parse(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
        // Those that need the sample rate.
        let at = |extra: &str| {
            NarrowbandOutput::parse(&format!("name=a,channels=64,dst=1.2.3.4:5,{extra}"))
                .unwrap()
                .check(1712e6)
        };
        for (extra, key) in [
            ("centre_frequency=1e7,decimation=8", "centre_frequency="),
            ("centre_frequency=850e6,decimation=8", "centre_frequency="),
            (
                "centre_frequency=4e8,decimation=8,pass_bandwidth=107e6",
                "pass_bandwidth=",
            ),
        ] {
            let e = at(extra).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
        assert_eq!(
            at("centre_frequency=4e8,decimation=8,pass_bandwidth=100e6"),
            Ok(())
        );
    }
}
