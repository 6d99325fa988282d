//! A narrowband output end to end over loopback UDP, beside a wideband one from the same
//! engine: `cbf dsim` sends five tones into `cbf fengine` (CPU backend) with
//! `--wideband name=wide,channels=128` and `--narrowband name=nb,channels=64,decimation=2`
//! centred on 72·fs/256, so both outputs have channels fs/256 wide and narrowband channel j is
//! wideband channel 72 + j − 32. Two tests: discard mode (subsampling 2, a 128-point PFB, the
//! outer half dropped) and no-discard mode (`pass_bandwidth` ¾ of the band: subsampling 4, a
//! 64-point PFB, every channel kept; the tones all lie in the flat part).
//!
//! Checked against computations independent of the code under test:
//! - each tone lands in its predicted narrowband channel at A/2·|H(Δf)|·Σw·g (within 3 %),
//!   with the DDC response H from scipy's `remez` (tests/reference/ddc_reference.py) and the
//!   PFB's Σw from the Hann × sinc formula in f64 here; and in its wideband channel at A/2·Σw·g;
//! - a `?delays` load of D = 6.7 samples and phase p on pol 0 of the narrowband output gives,
//!   between the pols, p − 2π·D·(j − N/2)·fs/(2N·decimation)/fs in tone channel j (katgpucbf's
//!   narrowband `test_delay_slope`; fengine_delay_convention.md §3): D rounds to a coarse delay
//!   of 7, which alignment to the subsampling turns into 6 (6 mod 4 = 2, so a wideband-style
//!   π/2·(c mod 4) term would show as π);
//! - heaps carry katgpucbf's F-heap items; the delay sensor, `?gain` and the Prometheus
//!   counters exist per narrowband output.

mod common;

use std::f64::consts::{PI, TAU};
use std::process::Command;
use std::time::{Duration, Instant};

use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::recv::{HeapStream, HeapStreamConfig};
use common::{free_udp_port, spawn_logging, Kill, KATCP_LOG, PROMETHEUS_LOG};
use num_complex::Complex64;

const FS: f64 = 1e6;
const SPH: usize = 32;
/// Narrowband channels and decimation; spectra are 2·N·DEC samples apart in both modes.
const N: usize = 64;
const DEC: usize = 2;
const WIDE: usize = 128;
const TAPS: usize = 16;
/// Narrowband tone channels; wideband channel = 72 + j − 32.
const TONES: [usize; 5] = [16, 24, 32, 40, 48];
const AMPLITUDE: f64 = 0.05;
const GAIN: f64 = 0.3;

/// Σw of katgpucbf's PFB weights (Hann × sinc over taps·step, normalised so Σw² = 1), in f64.
fn pfb_sum(step: usize) -> f64 {
    let len = step * TAPS;
    let w: Vec<f64> = (0..len)
        .map(|i| {
            let hann = (PI * i as f64 / (len - 1) as f64).sin().powi(2);
            let x = (i as f64 + 0.5) / step as f64 - TAPS as f64 / 2.0;
            hann * if x == 0.0 {
                1.0
            } else {
                (PI * x).sin() / (PI * x)
            }
        })
        .collect();
    w.iter().sum::<f64>() / w.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// |H(f)| of scipy's DDC filter (×√S, as katgpucbf scales it) at f cycles per sample.
fn ddc_response(h: &[f64], f: f64) -> f64 {
    h.iter()
        .enumerate()
        .map(|(k, &v)| Complex64::from_polar(v, TAU * f * k as f64))
        .sum::<Complex64>()
        .norm()
}

/// The F heaps of one output: (timestamp, feng_raw) of complete data heaps.
fn drain(
    rx: &mut UdpReceiver,
    stream: &mut HeapStream,
    batch: &mut RecvBatch,
    channels: usize,
    out: &mut Vec<(u64, Vec<i8>)>,
) {
    let mut heaps = Vec::new();
    if let Received::Packets(_) = rx.recv_batch(batch).unwrap() {
        for p in batch.iter() {
            stream.add_packet(p, &mut heaps);
        }
    }
    for h in heaps {
        let Some((ts, feng, first, raw)) = common::f_heap_items(&h) else {
            continue; // descriptors
        };
        assert!(h.complete);
        assert_eq!((feng, first), (1, 0));
        assert_eq!(
            ts % (SPH * 256) as u64,
            0,
            "heap timestamps on the heap grid"
        );
        assert_eq!(raw.len(), channels * SPH * 4);
        out.push((ts, raw.iter().map(|&b| b as i8).collect()));
    }
}

/// Channel k, spectrum s, pol p of a heap (channel, spectrum, pol, re/im).
fn value(raw: &[i8], k: usize, s: usize, pol: usize) -> Complex64 {
    let at = ((k * SPH + s) * 2 + pol) * 2;
    Complex64::new(f64::from(raw[at]), f64::from(raw[at + 1]))
}

/// The narrowband output's mode: subsampling S, PFB points M, the sub-options that select it,
/// and the reference filter design's arguments (tests/reference/ddc_reference.py, with
/// katgpucbf's default of 16 × S taps).
struct Mode {
    s: usize,
    m: usize,
    extra: &'static str,
    reference: Vec<String>,
}

#[test]
fn narrowband_tones_delays_and_a_wideband_output_from_one_engine() {
    run(Mode {
        s: DEC,
        m: 2 * N,
        extra: "",
        reference: ["weights", "discard", "32", "2", "0.005"]
            .map(String::from)
            .to_vec(),
    });
}

#[test]
fn narrowband_no_discard_tones_and_delays_end_to_end() {
    // ¾ of the output band (FS/(2·DEC)) flat: the tones reach |j − N/2| = 16 of 24 channels.
    run(Mode {
        s: 2 * DEC,
        m: N,
        extra: ",pass_bandwidth=187500",
        reference: ["weights", "nodiscard", "64", "4", "0.75", "0.005"]
            .map(String::from)
            .to_vec(),
    });
}

fn run(mode: Mode) {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    let mut wide_rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 32 << 20).unwrap();
    let mut nb_rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 32 << 20).unwrap();
    let (wide_port, nb_port) = (
        wide_rx.local_addr().unwrap().port(),
        nb_rx.local_addr().unwrap().port(),
    );
    let in_port = free_udp_port();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let sync = (now - 50.0).floor();
    let centre = 72.0 * FS / 256.0;
    let (_feng, addrs) = spawn_logging(
        Command::new(cbf)
            .args(["fengine", "--src", &format!("127.0.0.1:{in_port}")])
            .args([
                "--adc-sample-rate",
                &FS.to_string(),
                "--sync-time",
                &sync.to_string(),
            ])
            .args(["--recv-chunk-samples", "65536", "--max-delay-diff", "16"])
            .args(["--jones-per-batch", &(WIDE * SPH).to_string()])
            .args([
                "--feng-id",
                "1",
                "--array-size",
                "4",
                "--gain",
                &GAIN.to_string(),
            ])
            .args(["--katcp-host", "127.0.0.1", "--katcp-port", "0"])
            .args(["--prometheus-port", "0", "--duration", "12"])
            .args([
                "--wideband",
                &format!("name=wide,channels={WIDE},dst=127.0.0.1:{wide_port}"),
            ])
            .args([
                "--narrowband",
                &format!(
                    "name=nb,channels={N},centre_frequency={centre},decimation={DEC},\
                     dst=127.0.0.1:{nb_port},jones_per_batch={}{}",
                    N * SPH,
                    mode.extra
                ),
            ])
            .env("RUST_LOG", "info"),
        &[KATCP_LOG, PROMETHEUS_LOG],
    );
    let (katcp_port, metrics) = (addrs[0].port(), addrs[1]);
    std::thread::sleep(Duration::from_millis(800));
    let spacing = 8.0 * FS / 256.0;
    let first = centre + (TONES[0] as f64 - 32.0) * FS / 256.0;
    let _dsim = Kill(
        Command::new(cbf)
            .args(["dsim", "--adc-sample-rate", &FS.to_string()])
            .args(["--period", "65536", "--duration", "9", "--katcp-port", "0"])
            .args(["--sync-time", &sync.to_string()])
            .args([
                "--signals",
                &format!("multicw(5, {AMPLITUDE}, 0, {first}, {spacing});"),
                &format!("127.0.0.1:{in_port}"),
                &format!("127.0.0.1:{in_port}"),
            ])
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(1000));
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 2.0;
    let t0 = ((start - sync) * FS).round() as u64;
    let (d_samples, phase) = (6.7, 0.4);
    let q = |v: &[&str]| serde_json::to_string(v).unwrap();
    let katcp = |reqs: &[String]| -> Vec<serde_json::Value> {
        let mut args = vec!["127.0.0.1".to_string(), katcp_port.to_string()];
        args.extend(reqs.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_reference("katcp_client.py", &args)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let model = format!("{},0:{phase},0", d_samples / FS);
    let r = katcp(&[q(&["delays", "nb", &start.to_string(), &model, "0,0:0,0"])]);
    assert_eq!(r[0]["status"], "ok", "{}", r[0]);

    let (mut wide, mut nb) = (Vec::new(), Vec::new());
    let mut wide_stream = HeapStream::new(HeapStreamConfig::default());
    let mut nb_stream = HeapStream::new(HeapStreamConfig::default());
    let mut wide_batch = RecvBatch::new(64, wide_rx.slot_size(9200));
    let mut nb_batch = RecvBatch::new(64, nb_rx.slot_size(9200));
    let deadline = Instant::now() + Duration::from_secs(9);
    let after = |nb: &[(u64, Vec<i8>)]| nb.iter().filter(|(ts, _)| *ts >= t0).count();
    while Instant::now() < deadline && after(&nb) < 8 {
        drain(
            &mut wide_rx,
            &mut wide_stream,
            &mut wide_batch,
            WIDE,
            &mut wide,
        );
        drain(&mut nb_rx, &mut nb_stream, &mut nb_batch, N, &mut nb);
    }
    assert!(wide.len() >= 10, "only {} wideband heaps", wide.len());
    assert!(
        after(&nb) >= 8,
        "only {} narrowband heaps after the load",
        after(&nb)
    );

    // Amplitudes: mean power per tone channel over heaps after the first two.
    let a = AMPLITUDE * 511.0;
    let h: Vec<f64> = common::run_reference_bytes("ddc_reference.py", &mode.reference, &[])
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let amplitude = |heaps: &[(u64, Vec<i8>)], k: usize, pol: usize| -> f64 {
        let used = &heaps[2..];
        let power: f64 = used
            .iter()
            .flat_map(|(_, raw)| (0..SPH).map(move |s| value(raw, k, s, pol).norm_sqr()))
            .sum();
        (power / (used.len() * SPH) as f64).sqrt()
    };
    for &j in &TONES {
        let df = (j as f64 - N as f64 / 2.0) / (mode.m * mode.s) as f64;
        let want_nb = a / 2.0 * ddc_response(&h, df) * pfb_sum(mode.m) * GAIN;
        let want_wide = a / 2.0 * pfb_sum(2 * WIDE) * GAIN;
        assert!(want_nb > 20.0 && want_nb < 120.0, "set-up: {want_nb}");
        for pol in 0..2 {
            let got = amplitude(&nb, j, pol);
            assert!(
                (got / want_nb - 1.0).abs() < 0.03,
                "narrowband channel {j} pol {pol}: {got:.2} vs {want_nb:.2}"
            );
            let k = 72 + j - 32;
            let got = amplitude(&wide, k, pol);
            assert!(
                (got / want_wide - 1.0).abs() < 0.03,
                "wideband channel {k} pol {pol}: {got:.2} vs {want_wide:.2}"
            );
        }
    }
    // Away from the tones (two channels or more), only quantisation noise: under 2 LSB where
    // the tones are about 60.
    for k in (0..N).filter(|k| TONES.iter().all(|t| t.abs_diff(*k) >= 2)) {
        let got = amplitude(&nb, k, 0);
        assert!(got < 2.0, "narrowband channel {k}: {got:.2}");
    }

    // The phase slope between the pols from the first spectrum at or after t0.
    let mut cross = [Complex64::default(); TONES.len()];
    for (ts, raw) in &nb {
        for s in (0..SPH).filter(|&s| ts + (s * mode.m * mode.s) as u64 >= t0) {
            for (i, &j) in TONES.iter().enumerate() {
                cross[i] += value(raw, j, s, 0) * value(raw, j, s, 1).conj();
            }
        }
    }
    for (i, &j) in TONES.iter().enumerate() {
        let channel_bw = FS / 2.0 / DEC as f64 / N as f64;
        let want = phase - TAU * (d_samples / FS) * channel_bw * (j as f64 - N as f64 / 2.0);
        let err = (cross[i].arg() - want + PI).rem_euclid(TAU) - PI;
        assert!(
            err.to_degrees().abs() < 1.0,
            "channel {j}: {:.2}° vs {:.2}°",
            cross[i].arg().to_degrees(),
            want.to_degrees()
        );
    }

    // Per-output control and metrics.
    let r = katcp(&[
        q(&["sensor-value", "nb.input0.delay"]),
        q(&["sensor-value", "nb.dither-seed"]),
        q(&["gain", "nb", "1"]),
    ]);
    let delay = r[0]["informs"][0][4].as_str().unwrap();
    assert!(delay.starts_with(&format!("({t0}, ")), "{delay}");
    assert_eq!(r[1]["status"], "ok", "{}", r[1]);
    assert_eq!(r[2]["args"].as_array().unwrap().len(), N, "{}", r[2]);
    let mut conn = std::net::TcpStream::connect(metrics).unwrap();
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut conn, &mut text).unwrap();
    for stream in ["nb", "wide"] {
        let prefix = format!("fgpu_output_heaps_total{{stream=\"{stream}\"}}");
        let line = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{prefix}:\n{text}"));
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 8.0, "{line}");
    }
}
