//! `cbf fsim` (sim::Fsim, in-process) received by spead2 (tests/reference/spead2_peer.py
//! `recv-fsim`), two X-engine destinations on loopback: every heap's items, shape, cnt,
//! frequency and timestamp, and its payload against numpy's recomputation of the payload
//! formula (katgpucbf's, 8-bit; random, 4-bit); the left-out F-engines' heaps are absent exactly
//! where asked; `--max-heaps` stops it with exactly that many batches; Prometheus and katcp.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

use cbf::engine::control::ControlConfig;
use cbf::engine::{unix_now, Shutdown};
use cbf::sim::fsim::Payload;
use cbf::sim::{Fsim, FsimConfig, FsimReport};
use common::{free_udp_port, Kill};

const ANTS: usize = 4;
const CHANNELS: usize = 64;
const CPS: usize = 16;
/// Spectra per heap: jones_per_batch / channels.
const SPH: usize = 8;
/// ADC samples between batches: SPH × 2 × CHANNELS.
const STEP: u64 = (SPH * 2 * CHANNELS) as u64;
const ADC: f64 = 1e5;

fn config(ports: [u16; 2], payload: Payload, bits: u32) -> FsimConfig {
    FsimConfig {
        array_size: ANTS,
        channels: CHANNELS,
        channels_per_substream: CPS,
        samples_between_spectra: None,
        jones_per_batch: SPH * CHANNELS,
        adc_sample_rate: ADC,
        sync_time: unix_now() - 100.0,
        send_rate_factor: 1.0,
        send_packet_payload: 8192,
        send_interfaces: vec![],
        send_transport: cbf::engine::send::SendTransport::Udp,
        send_ttl: 1,
        max_heaps: None,
        duration: None,
        run_once: false,
        payload,
        sample_bits: bits,
        missing_fengines: vec![],
        missing_timestamps: None,
        dests: ports
            .iter()
            .map(|&p| SocketAddrV4::new(Ipv4Addr::LOCALHOST, p))
            .collect(),
        control: ControlConfig {
            host: Ipv4Addr::LOCALHOST.into(),
            katcp_port: 0,
            prometheus_port: None,
        },
    }
}

/// Run fsim in-process (the configuration edited by `edit` once spead2 is ready) while spead2
/// listens for `seconds`; returns fsim's report, its katcp and Prometheus addresses and
/// spead2's heaps.
fn run_with_spead2(
    ports: [u16; 2],
    kind: Payload,
    bits: u32,
    seconds: f64,
    edit: impl FnOnce(&mut FsimConfig),
) -> (
    FsimReport,
    std::net::SocketAddr,
    Option<std::net::SocketAddr>,
    Vec<serde_json::Value>,
) {
    let (payload, seed) = match kind {
        Payload::Katgpucbf => ("katgpucbf", 0),
        Payload::Random { seed } => ("random", seed),
    };
    let mut spead2 = Kill(
        Command::new(common::python())
            .arg(common::reference_script("spead2_peer.py"))
            .args(["recv-fsim", &seconds.to_string(), &ANTS.to_string()])
            .args([&STEP.to_string(), &bits.to_string(), payload])
            .arg(seed.to_string())
            .args(ports.map(|p| p.to_string()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(spead2.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let mut c = config(ports, kind, bits);
    edit(&mut c);
    let fsim = Fsim::new(c, Shutdown::manual()).unwrap();
    let (katcp, prometheus) = (fsim.katcp_addr(), fsim.prometheus_addr());
    let report = fsim.run().unwrap();
    let heaps = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    (report, katcp, prometheus, heaps)
}

/// Checks every heap and returns, per destination, the set of (timestamp, feng_id) received.
fn check_heaps(
    heaps: &[serde_json::Value],
    ports: [u16; 2],
    bits: u32,
) -> Vec<BTreeSet<(u64, u64)>> {
    let ts0 = heaps
        .iter()
        .map(|h| h["timestamp"].as_u64().unwrap())
        .min()
        .expect("spead2 received nothing");
    assert_eq!(ts0 % STEP, 0, "first timestamp off the batch grid");
    let mut got = vec![BTreeSet::new(); 2];
    for h in heaps {
        let d = ports
            .iter()
            .position(|&p| h["port"] == p)
            .expect("unknown port");
        let (ts, feng) = (
            h["timestamp"].as_u64().unwrap(),
            h["feng_id"].as_u64().unwrap(),
        );
        assert_eq!(h["frequency"], d * CPS, "{h}");
        assert_eq!(h["shape"], serde_json::json!([CPS, SPH, 2, 2]), "{h}");
        if bits == 8 {
            assert_eq!(h["dtype"], "int8", "{h}");
        }
        assert_eq!(h["payload_ok"], true, "{h}");
        assert_eq!((ts - ts0) % STEP, 0, "{h}");
        // cnt = feng_id + j·array_size for the j-th batch.
        let j = (ts - ts0) / STEP;
        assert_eq!(h["cnt"], feng + j * ANTS as u64, "{h}");
        assert!(feng < ANTS as u64);
        assert!(got[d].insert((ts, feng)), "duplicate heap {h}");
    }
    got
}

/// katgpucbf's payload, 8-bit: F-engine 2 left out for five batches in the middle of the run.
#[test]
fn spead2_receives_katgpucbf_heaps_with_a_gap() {
    let ports = [free_udp_port(), free_udp_port()];
    let batches = 200u64; // about 2 s at 1e5 samples/s and 1024 samples per batch
    let mut gap = (0, 0);
    let (report, katcp, prometheus, heaps) =
        run_with_spead2(ports, Payload::Katgpucbf, 8, 5.0, |c| {
            c.max_heaps = Some(batches);
            c.control.prometheus_port = Some(0);
            // The gap starts 0.5 s from now on the data's clock (fsim sends in real time).
            let now_ts = ((unix_now() - c.sync_time) * ADC) as u64;
            let gap_start = (now_ts + (0.5 * ADC) as u64).div_ceil(STEP) * STEP;
            gap = (gap_start, gap_start + 5 * STEP);
            c.missing_fengines = vec![2];
            c.missing_timestamps = Some(gap);
        });
    let got = check_heaps(&heaps, ports, 8);
    let ts0 = report.first_timestamp;
    let end = ts0 + batches * STEP;
    assert!(
        ts0 < gap.0 && gap.1 <= end,
        "the gap {gap:?} is not inside the run [{ts0}, {end})"
    );
    // Exactly `batches` batches, every F-engine's heap in each but F-engine 2's in the gap.
    let mut want = BTreeSet::new();
    for j in 0..batches {
        let ts = ts0 + j * STEP;
        for f in 0..ANTS as u64 {
            if !(f == 2 && (gap.0..gap.1).contains(&ts)) {
                want.insert((ts, f));
            }
        }
    }
    for (d, g) in got.iter().enumerate() {
        assert_eq!(
            g.len(),
            want.len(),
            "destination {d}: missing {:?}, unexpected {:?}",
            want.difference(g).take(5).collect::<Vec<_>>(),
            g.difference(&want).take(5).collect::<Vec<_>>()
        );
        assert_eq!(*g, want, "destination {d}");
    }
    assert_eq!(report.batches, batches);
    assert_eq!(report.heaps, 2 * want.len() as u64);

    // Prometheus under katgpucbf's names, equal to what was sent.
    let mut s = std::net::TcpStream::connect(prometheus.expect("a Prometheus endpoint")).unwrap();
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    assert!(
        text.contains(&format!("fsim_output_heaps_total {}", report.heaps)),
        "{text}"
    );
    let payload = report.heaps * (CPS * SPH * 4) as u64;
    assert!(
        text.contains(&format!("fsim_output_bytes_total {payload}")),
        "{text}"
    );
    assert!(text.contains("fsim_time_error_s{stream=\"1\"}"), "{text}");

    // katcp: the standard requests, and the settings as sensors.
    let replies: Vec<serde_json::Value> = common::run_reference(
        "katcp_client.py",
        &[
            "127.0.0.1",
            &katcp.port().to_string(),
            r#"["sensor-value", "array-size"]"#,
            r#"["sensor-value", "missing-timestamps"]"#,
            r#"["bogus"]"#,
        ],
    )
    .iter()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert_eq!(replies[0]["informs"][0][4], ANTS.to_string());
    assert_eq!(replies[1]["informs"][0][4], format!("{}:{}", gap.0, gap.1));
    assert_ne!(replies[2]["status"], "ok");
}

/// Random payload, 4-bit packed: F-engine 1 left out throughout; the 8-batch pattern wraps.
#[test]
fn spead2_receives_random_four_bit_heaps_without_a_missing_fengine() {
    let ports = [free_udp_port(), free_udp_port()];
    let batches = 12u64;
    let (report, _, _, heaps) = run_with_spead2(ports, Payload::Random { seed: 77 }, 4, 3.0, |c| {
        c.max_heaps = Some(batches);
        c.missing_fengines = vec![1];
    });
    let got = check_heaps(&heaps, ports, 4);
    let ts0 = report.first_timestamp;
    for g in &got {
        let want: BTreeSet<(u64, u64)> = (0..batches)
            .flat_map(|j| [0, 2, 3].map(|f| (ts0 + j * STEP, f)))
            .collect();
        assert_eq!(*g, want);
    }
    assert_eq!(report.heaps, 2 * 3 * batches);
}
