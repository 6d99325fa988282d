//! The CPU oracle against numpy (tests/reference/*.py), computed independently in float64.

mod common;

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
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let stdout = common::run_reference_bytes("pfb_reference.py", &args, &bytes);
    let f = |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap());
    let (w, s) = stdout.split_at(step * taps * 8);
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

fn run_xb(cmd: &str, dims: [usize; 3], stdin: &[u8]) -> Vec<u8> {
    let mut args = vec![cmd.to_string()];
    args.extend(dims.iter().map(ToString::to_string));
    common::run_reference_bytes("xb_reference.py", &args, stdin)
}

fn random_i8(n: usize, seed: u64) -> Vec<i8> {
    // Never −128: katgpucbf treats it as invalid (conj maps it to itself).
    (0..n as u64)
        .map(|i| ((cbf::dsp::random::mix(seed, 9, i) % 255) as i16 - 127) as i8)
        .collect()
}

#[test]
fn correlator_matches_numpy_exactly() {
    use cbf::dsp::correlate::{correlate_accumulate, CorrShape};
    for (n_ants, channels, spectra) in [(1, 3, 16), (3, 2, 33), (4, 4, 8), (19, 1, 5)] {
        let shape = CorrShape {
            n_ants,
            channels,
            spectra,
        };
        let x = random_i8(shape.input_len(), n_ants as u64);
        let bytes: Vec<u8> = x.iter().map(|&v| v as u8).collect();
        let want: Vec<i64> = run_xb("correlate", [n_ants, channels, spectra], &bytes)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut acc = vec![0i64; shape.vis_len()];
        correlate_accumulate(shape, &x, &mut acc);
        assert_eq!(acc, want, "{n_ants} antennas");
    }
}

#[test]
fn beamformer_matches_numpy_within_quantisation() {
    use cbf::dsp::beamform::{beamform, Beam, BeamShape};
    use num_complex::Complex64;
    let (n_ants, channels, spectra) = (5, 8, 6);
    let shape = BeamShape {
        n_ants,
        channels,
        spectra,
    };
    let x = random_i8(n_ants * channels * spectra * 4, 77);
    let beams: Vec<Beam> = (0..4)
        .map(|b| Beam {
            pol: b % 2,
            weights: (0..n_ants)
                .map(|a| Complex64::from_polar(0.05 + 0.01 * a as f64, 0.3 * (a + b) as f64))
                .collect(),
            delays: (0..n_ants)
                .map(|a| 0.01 * (a as f64 - 2.0) * (b + 1) as f64)
                .collect(),
        })
        .collect();
    let mut stdin: Vec<u8> = x.iter().map(|&v| v as u8).collect();
    for b in &beams {
        stdin.extend_from_slice(&(b.pol as i64).to_le_bytes());
        for w in &b.weights {
            stdin.extend_from_slice(&w.re.to_le_bytes());
            stdin.extend_from_slice(&w.im.to_le_bytes());
        }
        for d in &b.delays {
            stdin.extend_from_slice(&d.to_le_bytes());
        }
    }
    let want: Vec<(f64, f64)> = run_xb("beamform", [n_ants, channels, spectra], &stdin)
        .chunks_exact(16)
        .map(|c| {
            (
                f64::from_le_bytes(c[..8].try_into().unwrap()),
                f64::from_le_bytes(c[8..].try_into().unwrap()),
            )
        })
        .collect();
    let timestamps: Vec<i64> = (0..spectra as i64).map(|t| t * 1024).collect();
    let mut out = vec![0i8; beams.len() * channels * spectra * 2];
    let cbf::dsp::beamform::Formed { clips, ants, .. } = beamform(
        shape,
        &x,
        &[true; 5],
        &beams,
        &timestamps,
        Some(5),
        &mut out,
    );
    assert_eq!(ants, n_ants);
    let mut expect_clips = vec![0u64; beams.len()];
    for (i, &(re, im)) in want.iter().enumerate() {
        let b = i / (channels * spectra);
        // katgpucbf's tolerance with dither: ±0.5 of the dither plus rounding, i.e. within 1
        // LSB, except where saturated.
        for (got, v) in [(out[2 * i], re), (out[2 * i + 1], im)] {
            let clamped = v.clamp(-127.0, 127.0);
            assert!(
                (f64::from(got) - clamped).abs() <= 1.0,
                "beam {b}: {got} vs {v}"
            );
        }
        expect_clips[b] += u64::from(re.abs() > 127.5 || im.abs() > 127.5);
    }
    // Values more than half an LSB beyond full scale clip whatever the dither.
    for (c, e) in clips.iter().zip(&expect_clips) {
        assert!(c >= e);
    }
}

fn run_ddc_ref(args: &[String], stdin: &[u8]) -> Vec<u8> {
    common::run_reference_bytes("ddc_reference.py", args, stdin)
}

#[test]
fn ddc_filter_design_matches_scipy_remez() {
    use cbf::dsp::ddc::{ddc_weights_discard, ddc_weights_no_discard};
    let cases: Vec<(Vec<String>, Vec<f32>)> = vec![
        (
            vec!["discard".into(), "64".into(), "4".into(), "0.005".into()],
            ddc_weights_discard(64, 4, 0.005).unwrap(),
        ),
        (
            vec!["discard".into(), "128".into(), "8".into(), "0.005".into()],
            ddc_weights_discard(128, 8, 0.005).unwrap(),
        ),
        (
            vec!["discard".into(), "61".into(), "6".into(), "0.01".into()],
            ddc_weights_discard(61, 6, 0.01).unwrap(),
        ),
        (
            vec![
                "nodiscard".into(),
                "64".into(),
                "8".into(),
                "0.8".into(),
                "0.005".into(),
            ],
            ddc_weights_no_discard(64, 8, 0.8, 0.005).unwrap(),
        ),
    ];
    for (args, got) in cases {
        let mut a = vec!["weights".to_string()];
        a.extend(args.clone());
        let want: Vec<f64> = run_ddc_ref(&a, &[])
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got.len(), want.len());
        // Compared by the quantity Remez minimises, the maximum weighted error over the
        // specified bands (between them the response is free): cbf's design must be at least
        // as good as scipy's (pm-remez converges more tightly than scipy's 16× grid), allowing
        // for cbf rounding its taps to f32. Tap values themselves are ill-conditioned where the
        // optimum error reaches f64 noise and are not compared.
        let s: f64 = args[2].parse().unwrap();
        let response = |h: &[f64], f: f64| -> f64 {
            let (re, im) = h.iter().enumerate().fold((0.0, 0.0), |(re, im), (k, &v)| {
                let a = -std::f64::consts::TAU * f * k as f64;
                (re + v * a.cos(), im + v * a.sin())
            });
            re.hypot(im) / s.sqrt()
        };
        let got64: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
        // (low, high, desired, weight) in cycles per subsampled sample (scipy's fs = S units).
        let bands: Vec<(f64, f64, f64, f64)> = if args[0] == "discard" {
            let wp: f64 = args[3].parse().unwrap();
            let mut b = vec![(0.0, 0.25, 1.0, wp)];
            let mut x = 0.75;
            while x < s / 2.0 {
                b.push((x, (x + 0.5).min(s / 2.0), 0.0, 1.0));
                x += 1.0;
            }
            b
        } else {
            let (pf, wp): (f64, f64) = (args[3].parse().unwrap(), args[4].parse().unwrap());
            vec![
                (0.0, pf / 2.0, 1.0, wp),
                (1.0 - pf / 2.0, s / 2.0, 0.0, 1.0),
            ]
        };
        let max_err = |h: &[f64]| -> f64 {
            let mut m = 0.0f64;
            for &(lo, hi, want, weight) in &bands {
                for i in 0..=400 {
                    let f = (lo + (hi - lo) * i as f64 / 400.0) / s;
                    m = m.max((response(h, f) - want).abs() * weight);
                }
            }
            m
        };
        let (ours, theirs) = (max_err(&got64), max_err(&want));
        assert!(
            ours <= theirs * 1.001 + 1e-7,
            "{args:?}: weighted error {ours} vs scipy's {theirs}"
        );
        // Passband (¼ of the subsampled rate) flat to ±1e-3 (weight_pass lets it ripple), and
        // the aliasing bands suppressed.
        if args[0] == "discard" {
            for i in 0..=100 {
                let f = 0.25 / s * i as f64 / 100.0;
                assert!(
                    (response(&got64, f) - 1.0).abs() < 1e-2,
                    "{args:?} passband at {f}"
                );
            }
        }
    }
}

#[test]
fn ddc_matches_an_exact_mixer_reference() {
    use cbf::dsp::ddc::{ddc, ddc_weights_discard, mixer_step};
    for (bits, s, t_first) in [
        (10u32, 4usize, 123_456_789_012u64),
        (8, 8, 5),
        (12, 6, (1 << 33) + 17),
    ] {
        let h = ddc_weights_discard(16 * s, s, 0.005).unwrap();
        let n_out = 50;
        let nx = s * (n_out - 1) + h.len();
        let lim = 1i64 << (bits - 1);
        let x: Vec<i32> = (0..nx as u64)
            .map(|i| {
                (cbf::dsp::random::mix(bits as u64, 3, i) % (2 * lim as u64 - 1)) as i32
                    - (lim as i32 - 1)
            })
            .collect();
        let step = mixer_step(0.2718281828);
        let mut got = vec![Complex32::default(); n_out];
        ddc(&x, &h, s, step, t_first, &mut got);
        let mut stdin: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        stdin.extend(h.iter().flat_map(|v| v.to_le_bytes()));
        let args: Vec<String> = [
            "ddc".to_string(),
            s.to_string(),
            step.to_string(),
            t_first.to_string(),
            n_out.to_string(),
            nx.to_string(),
        ]
        .to_vec();
        let want: Vec<(f64, f64)> = run_ddc_ref(&args, &stdin)
            .chunks_exact(16)
            .map(|c| {
                (
                    f64::from_le_bytes(c[..8].try_into().unwrap()),
                    f64::from_le_bytes(c[8..].try_into().unwrap()),
                )
            })
            .collect();
        let scale = f64::from(1u32 << bits);
        let mut sq = 0.0;
        for (g, w) in got.iter().zip(&want) {
            let e = (f64::from(g.re) - w.0).hypot(f64::from(g.im) - w.1);
            // katgpucbf's DDC tolerance: atol 2e-5·2^bits, RMS < 2e-6·2^bits.
            assert!(e <= 2e-5 * scale, "{bits} bits: {g} vs {w:?}");
            sq += e * e;
        }
        assert!((sq / n_out as f64).sqrt() < 2e-6 * scale);
    }
}
