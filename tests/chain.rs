//! The whole chain over loopback (dsim ×3 → fengine ×3 → xbengine → capture, in-process, CPU
//! backend): a common noise signal with antenna i lagging by 2·i samples must give the phase
//! slope the delay predicts on baseline (0, 1) (the same physics as the F-engine's delay test:
//! phase +πkn/N on channel k), and the beam steered by `?beam-delays` to undo the lags must be
//! the antenna count (3) times as strong as the unsteered one.

use cbf::chain::{run, ChainConfig};

#[test]
fn delay_and_beam_gain_through_the_whole_chain() {
    let cfg = ChainConfig {
        antennas: 3,
        adc_sample_rate: 2e6,
        channels: 128,
        duration: 3.0,
        delay_samples: 2,
    };
    let r = run(&cfg, |_, _| {}).unwrap();
    assert!(r.complete_dumps >= 3, "{r:?}");
    assert!((r.delay_measured - 2.0).abs() < 0.1, "{r:?}");
    let ratio = r.beam_power[1] / r.beam_power[0];
    assert!((ratio / 3.0 - 1.0).abs() < 0.25, "ratio {ratio}: {r:?}");
    // The F-engines' gain puts about 10 counts rms on each component pair (power ~100).
    assert!((60.0..160.0).contains(&r.antenna_power), "{r:?}");
}
