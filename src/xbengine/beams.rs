//! The beams' steering as the operator sets it (katcp `?beam-weights`, `?beam-delays`,
//! `?beam-quant-gains`) and as the beamformer applies it (seed 003 §GPU kernel, katgpucbf
//! xbgpu `BPipeline`): per beam b and antenna a a real weight w, a delay τ (s) and a phase φ
//! (rad, at the centre frequency of the whole band), per beam a quantisation gain g. The host
//! folds weight, gain and the fringe phase at this engine's first channel into one complex
//! coefficient and scales the delay into the kernel's unit:
//!
//! ```text
//! W_ab = w_ab · g_b · e^{j(φ_ab − 2π·Δf·(c0 − N/2)·τ_ab)},   d_ab = −2·Δf·τ_ab
//! ```
//!
//! with Δf = bandwidth / N the channel spacing and c0 = `--channel-offset-value`, so that the
//! kernel's W_ab·e^{jπ·c·d_ab} at local channel c is the phase φ − 2πΔf(c0 + c − N/2)τ: a delay
//! of τ lags the wave, lowering the phase at a fixed time. A version number changes with every
//! request, so the coefficients are rebuilt only then (seed 003 §Data flow). Pure.
#![deny(unsafe_code)]

use num_complex::Complex64;

use crate::dsp::beamform::Beam;

/// Every beam's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Steering {
    /// Per beam, per antenna.
    pub weights: Vec<Vec<f64>>,
    /// Per beam, per antenna: (delay s, phase rad).
    pub delays: Vec<Vec<(f64, f64)>>,
    /// Per beam.
    pub quant_gains: Vec<f64>,
    /// Bumped by every change.
    pub version: u64,
}

/// The band geometry the fold needs.
#[derive(Debug, Clone, Copy)]
pub struct Band {
    /// Channel spacing Δf (Hz).
    pub channel_spacing: f64,
    /// This engine's first channel and the band's channel count.
    pub channel_offset: u64,
    pub channels: u64,
}

impl Steering {
    /// katgpucbf's defaults: weights 1, delays 0, gains 1.
    pub fn new(beams: usize, n_ants: usize) -> Steering {
        Steering {
            weights: vec![vec![1.0; n_ants]; beams],
            delays: vec![vec![(0.0, 0.0); n_ants]; beams],
            quant_gains: vec![1.0; beams],
            version: 1,
        }
    }

    /// The beamformer's coefficients for beam `b` looking at polarisation `pol`.
    pub fn beam(&self, b: usize, pol: usize, band: Band) -> Beam {
        let centre = band.channels as f64 / 2.0;
        let fringe_scale = -2.0
            * std::f64::consts::PI
            * band.channel_spacing
            * (band.channel_offset as f64 - centre);
        let (weights, delays) = self.weights[b]
            .iter()
            .zip(&self.delays[b])
            .map(|(&w, &(tau, phi))| {
                (
                    Complex64::from_polar(w * self.quant_gains[b], phi + fringe_scale * tau),
                    -2.0 * band.channel_spacing * tau,
                )
            })
            .unzip();
        Beam {
            pol,
            weights,
            delays,
        }
    }
}

/// Parse `?beam-weights` values (one real weight per antenna).
pub fn parse_weights(args: &[String], n_ants: usize) -> Result<Vec<f64>, String> {
    if args.len() != n_ants {
        return Err(format!(
            "Incorrect number of weights (expected {n_ants}, received {})",
            args.len()
        ));
    }
    args.iter()
        .map(|a| match a.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("weight {a:?} is not a finite number")),
        })
        .collect()
}

/// Largest |delay| accepted by `?beam-delays` (s): far beyond any array (a 10 000 km baseline
/// is 33 ms), small enough that the phase arithmetic keeps its precision.
pub const MAX_BEAM_DELAY: f64 = 1.0;

/// Parse `?beam-delays` values (`delay:phase` per antenna).
pub fn parse_delays(args: &[String], n_ants: usize) -> Result<Vec<(f64, f64)>, String> {
    if args.len() != n_ants {
        return Err(format!(
            "Incorrect number of delays (expected {n_ants}, received {})",
            args.len()
        ));
    }
    args.iter()
        .map(|a| {
            let (d, p) = a
                .split_once(':')
                .ok_or_else(|| format!("{a:?} is not delay:phase"))?;
            let num = |t: &str| t.trim().parse::<f64>().ok().filter(|v| v.is_finite());
            match (num(d), num(p)) {
                (Some(d), Some(_)) if d.abs() > MAX_BEAM_DELAY => {
                    Err(format!("delay {d} s is beyond ±{MAX_BEAM_DELAY} s"))
                }
                (Some(d), Some(p)) => Ok((d, p)),
                _ => Err(format!("{a:?} is not two finite numbers delay:phase")),
            }
        })
        .collect()
}

/// Parse a `?beam-quant-gains` value.
pub fn parse_gain(arg: &str) -> Result<f64, String> {
    match arg.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("gain {arg:?} is not a finite number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    #[test]
    fn coefficient_phase_at_each_channel_is_the_delay_across_the_band() {
        // 4096 channels over 856 MHz, this engine from channel 1024; antenna 1 delayed by
        // τ = 1.3 ns with a phase offset of 0.4 rad at the band centre.
        let band = Band {
            channel_spacing: 856e6 / 4096.0,
            channel_offset: 1024,
            channels: 4096,
        };
        let mut s = Steering::new(1, 2);
        s.delays[0][1] = (1.3e-9, 0.4);
        s.weights[0][1] = 0.5;
        s.quant_gains[0] = 3.0;
        let beam = s.beam(0, 1, band);
        for c in [0usize, 17, 511] {
            let w = beam.weights[1] * Complex64::from_polar(1.0, PI * c as f64 * beam.delays[1]);
            // Independent: the phase of a delayed wave at channel frequency offset
            // (c0 + c − N/2)·Δf from the centre.
            let f = (1024.0 + c as f64 - 2048.0) * band.channel_spacing;
            let want = 0.4 - 2.0 * PI * f * 1.3e-9;
            let err = (w.arg() - want).rem_euclid(2.0 * PI);
            assert!(
                err.min(2.0 * PI - err) < 1e-9,
                "channel {c}: {} vs {want}",
                w.arg()
            );
            assert!((w.norm() - 1.5).abs() < 1e-12);
        }
        assert_eq!(beam.pol, 1);
        assert_eq!(beam.weights[0], Complex64::new(3.0, 0.0));
    }

    #[test]
    fn requests_are_checked() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_weights(&s(&["1", "0.5"]), 2).unwrap(), [1.0, 0.5]);
        assert!(parse_weights(&s(&["1"]), 2)
            .unwrap_err()
            .contains("expected 2"));
        assert!(parse_weights(&s(&["1", "nan"]), 2).is_err());
        assert_eq!(parse_delays(&s(&["1e-9:0.5"]), 1).unwrap(), [(1e-9, 0.5)]);
        assert!(parse_delays(&s(&["1e-9"]), 1).is_err());
        assert!(parse_delays(&s(&["5:0"]), 1)
            .unwrap_err()
            .contains("beyond"));
        assert!(parse_delays(&s(&["0:inf"]), 1).is_err());
        assert!(parse_gain("x").is_err());
        assert_eq!(parse_gain("0.25").unwrap(), 0.25);
    }
}
