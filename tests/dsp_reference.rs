//! The CPU oracle against numpy (tests/reference/*.py), computed independently in float64.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use cbf::dsp::pfb::{pfb_fir, pfb_weights, ChannelFft, Window};
use num_complex::Complex32;

fn numpy_pfb(
    step: usize,
    taps: usize,
    cut: f64,
    window: &str,
    starts: &[usize],
    x: &[i32],
) -> (Vec<f64>, Vec<(f64, f64)>) {
    let mut args = vec![
        step.to_string(),
        taps.to_string(),
        cut.to_string(),
        window.to_string(),
    ];
    args.extend(starts.iter().map(ToString::to_string));
    let mut child = Command::new(common::python())
        .arg(common::reference_script("pfb_reference.py"))
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let f = |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap());
    let (w, s) = out.stdout.split_at(step * taps * 8);
    let weights = w.chunks_exact(8).map(f).collect();
    let spectra = s
        .chunks_exact(16)
        .map(|c| (f(&c[..8]), f(&c[8..])))
        .collect();
    (weights, spectra)
}

#[test]
fn pfb_weights_and_channeliser_match_numpy() {
    for (channels, taps, cut, window) in [
        (512usize, 16usize, 1.0, Window::Hann),
        (64, 4, 0.95, Window::Rect),
        (8, 1, 0.0, Window::Rect),
        (32, 7, 1.0, Window::Hann),
    ] {
        let step = 2 * channels;
        let name = if window == Window::Hann {
            "hann"
        } else {
            "rect"
        };
        let x: Vec<i32> = (0..step * (taps + 3))
            .map(|i| (((i * 7919) % 1023) as i32) - 511)
            .collect();
        let starts = [0, 3, step + 11, 2 * step];
        let (w_ref, spectra_ref) = numpy_pfb(step, taps, cut, name, &starts, &x);
        let w = pfb_weights(step, taps, cut, window);
        for (a, b) in w.iter().zip(&w_ref) {
            // f32 rounding of an f64 computation: within half an f32 ulp.
            assert!(
                (f64::from(*a) - b).abs() <= b.abs() * 6e-8 + 1e-12,
                "{a} vs {b}"
            );
        }
        let mut frames = vec![0.0; starts.len() * step];
        pfb_fir(&x, &w, step, &starts, &mut frames);
        let mut out = vec![Complex32::default(); starts.len() * channels];
        ChannelFft::new(step).run(&frames, &mut out);
        let peak = spectra_ref
            .iter()
            .map(|(r, i)| r.hypot(*i))
            .fold(0.0, f64::max);
        for (got, want) in out.iter().zip(&spectra_ref) {
            // f32 arithmetic over taps·step terms: error relative to the spectrum's peak.
            let err = (f64::from(got.re) - want.0).hypot(f64::from(got.im) - want.1);
            assert!(
                err <= 1e-5 * peak,
                "{channels} ch {taps} taps: {got} vs {want:?} (peak {peak})"
            );
        }
    }
}
