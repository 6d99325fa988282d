//! `cbf demo`: the whole chain on loopback with the CPU backend (`crate::chain`): one dsim per
//! antenna sharing a noise source (each antenna lagging the one before by `--delay` samples) →
//! one F-engine per antenna → one XB-engine (correlation products and two beams) → capture.
//! Prints live rates, then the delay measured from the cross-correlation phase slope against
//! the delay injected and the beams' powers; exits non-zero if they disagree.

use clap::Args;

use super::CliError;
use crate::chain::{self, ChainConfig};

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Antennas (one dsim and one F-engine each).
    #[arg(long, default_value_t = 2)]
    pub antennas: usize,
    /// ADC sample rate in Hz of the simulated digitisers.
    #[arg(long, default_value_t = 4e6)]
    pub adc_sample_rate: f64,
    /// Seconds of signal.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// F-engine channels.
    #[arg(long, default_value_t = 256)]
    pub channels: usize,
    /// Samples by which each antenna lags the one before.
    #[arg(long, default_value_t = 3)]
    pub delay: u32,
}

/// Largest error of the measured delay, in samples, still called agreement.
const DELAY_TOLERANCE: f64 = 0.1;
/// Largest relative error of the steered-to-zenith beam power ratio against the antenna count.
const BEAM_TOLERANCE: f64 = 0.25;

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    if !(args.duration.is_finite() && (1.0..=3600.0).contains(&args.duration)) {
        return Err(CliError::flag("--duration", "must be 1–3600 seconds"));
    }
    if !(args.adc_sample_rate.is_finite() && (1e5..=1e9).contains(&args.adc_sample_rate)) {
        return Err(CliError::flag("--adc-sample-rate", "must be 1e5–1e9 Hz"));
    }
    let cfg = ChainConfig {
        antennas: args.antennas,
        adc_sample_rate: args.adc_sample_rate,
        channels: args.channels,
        duration: args.duration,
        delay_samples: args.delay,
    };
    println!(
        "demo: {} × dsim ({:.1} MS/s, one noise source, antenna i lagging by {}·i samples) → {} × fengine ({} channels, CPU) → xbengine (correlation + 2 beams) → capture, {:.1} s",
        cfg.antennas,
        cfg.adc_sample_rate / 1e6,
        cfg.delay_samples,
        cfg.antennas,
        cfg.channels,
        cfg.duration
    );
    let r = chain::run(&cfg, |secs, p| {
        println!(
            "  {secs:5.1} s  X dumps {:4}   beam heaps {:6}",
            p.x_dumps.load(std::sync::atomic::Ordering::Relaxed),
            p.beam_heaps.load(std::sync::atomic::Ordering::Relaxed)
        );
    })?;
    let delay_ok = (r.delay_measured - r.delay_injected).abs() <= DELAY_TOLERANCE;
    let ratio = r.beam_power[1] / r.beam_power[0].max(1e-12);
    let n = cfg.antennas as f64;
    let beam_ok = (ratio / n - 1.0).abs() <= BEAM_TOLERANCE;
    println!(
        "demo: dsim sent {} heaps; X dumps {} ({} complete), beam heaps {}; antenna power {:.1} per sample",
        r.dsim_heaps, r.x_dumps, r.complete_dumps, r.beam_heaps, r.antenna_power
    );
    println!(
        "demo: delay of antenna 1 from the phase slope {:.3} samples, injected {} samples: {}",
        r.delay_measured,
        r.delay_injected,
        if delay_ok { "OK" } else { "WRONG" }
    );
    println!(
        "demo: beam power zenith {:.1}, steered {:.1}: ratio {ratio:.2} (coherent/incoherent = {} antennas): {}",
        r.beam_power[0],
        r.beam_power[1],
        cfg.antennas,
        if beam_ok { "OK" } else { "WRONG" }
    );
    if r.complete_dumps == 0 {
        return Err(CliError::Run(
            "no complete dump came out of the XB-engine".into(),
        ));
    }
    if !delay_ok || !beam_ok {
        return Err(CliError::Run(
            "the measured delay or beam gain disagrees with what was injected".into(),
        ));
    }
    Ok(())
}
