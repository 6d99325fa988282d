//! `cbf dsim` under a real katcp client (aiokatcp): `?signals` changes the output exactly at the
//! timestamp it replies with, in all of its send threads; sensors describe the output; bad
//! requests fail and the simulator keeps running.

mod common;

use std::process::Command;

use common::{spawn_logging, KATCP_LOG, PROMETHEUS_LOG};
use std::time::{Duration, Instant};

use cbf::dsp::samples::unpack;
use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::items::{ItemValue, ADC_SAMPLES_ID, DIGITISER_ID_ID, TIMESTAMP_ID};
use cbf::spead::recv::{HeapStream, HeapStreamConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What a 10-bit heap holds: every sample 0.5 or 0.25 of full scale (±1 LSB of dither), or
/// neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Half,
    Quarter,
    Other,
}

impl Level {
    fn of(raw: &[u8]) -> Level {
        let mut codes = vec![0i32; 4096];
        unpack(raw, 10, &mut codes);
        let all = |want: f64| codes.iter().all(|&c| (f64::from(c) - want).abs() <= 1.0);
        if all(511.0 * 0.5) {
            Level::Half
        } else if all(511.0 * 0.25) {
            Level::Quarter
        } else {
            Level::Other
        }
    }
}

#[test]
fn signals_request_takes_effect_at_the_reported_timestamp() {
    let mut rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 16 << 20).unwrap();
    let dest = rx.local_addr().unwrap().to_string();
    // Every heap from the start, read as it comes: (digitiser id, timestamp, level).
    let log = Arc::new(Mutex::new(Vec::<(u64, u64, Level)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let latest = {
        let log = Arc::clone(&log);
        move || log.lock().unwrap().iter().map(|e| e.1).max().unwrap_or(0)
    };
    let reader = {
        let (log, stop) = (Arc::clone(&log), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut stream = HeapStream::new(HeapStreamConfig::default());
            let mut batch = RecvBatch::new(64, rx.slot_size(9200));
            let mut heaps = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
                    for p in batch.iter() {
                        stream.add_packet(p, &mut heaps);
                    }
                }
                for h in heaps.drain(..) {
                    if let (
                        Some(ItemValue::Immediate(ts)),
                        Some(ItemValue::Immediate(id)),
                        Some(ItemValue::Bytes(raw)),
                    ) = (
                        h.item(TIMESTAMP_ID),
                        h.item(DIGITISER_ID_ID),
                        h.item(ADC_SAMPLES_ID),
                    ) {
                        log.lock().unwrap().push((id, ts, Level::of(raw)));
                    }
                }
            }
            std::mem::take(&mut *log.lock().unwrap())
        })
    };
    let (_dsim, addrs) = spawn_logging(
        Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args([
                "dsim",
                "--adc-sample-rate",
                "20e6",
                "--max-period",
                "65536",
                "--signals",
                "0.5;",
                "--dither-seed",
                "3",
                // The switch must land at one timestamp in every send thread.
                "--send-threads",
                "3",
            ])
            .args(["--katcp-port", "0", "--katcp-host", "127.0.0.1", &dest])
            .args(["--prometheus-port", "0"])
            .env("RUST_LOG", "info"),
        &[KATCP_LOG, PROMETHEUS_LOG],
    );
    let (port, metrics) = (addrs[0].port(), addrs[1]);
    let replies: Vec<serde_json::Value> = common::run_reference(
        "katcp_client.py",
        &[
            "127.0.0.1",
            &port.to_string(),
            r#"["sensor-value", "signals"]"#,
            r#"["signals", "0.25;", "16384"]"#,
            r#"["signals", "cw(1);"]"#,
            r#"["signals", "0.1;", "5000"]"#,
            r#"["signals", "0.1;", "1048576"]"#,
            r#"["bogus"]"#,
            r#"["time"]"#,
            r#"["sensor-value", "period"]"#,
            r#"["sensor-value", "signals"]"#,
        ],
    )
    .iter()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let status = |i: usize| replies[i]["status"].as_str().unwrap().to_string();
    assert_eq!(replies[0]["informs"][0][4], "0.5;");
    assert_eq!(status(1), "ok");
    let switch: u64 = replies[1]["args"][0].as_str().unwrap().parse().unwrap();
    assert_eq!(switch % 4096, 0);
    assert_eq!(status(2), "fail", "{:?}", replies[2]);
    assert!(
        replies[3]["args"][0].as_str().unwrap().contains("multiple"),
        "{:?}",
        replies[3]
    );
    assert!(
        replies[4]["args"][0].as_str().unwrap().contains("maximum"),
        "{:?}",
        replies[4]
    );
    assert_eq!(status(5), "invalid");
    let t: f64 = replies[6]["args"][0].as_str().unwrap().parse().unwrap();
    assert!(
        (t - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64())
        .abs()
            < 60.0
    );
    assert_eq!(replies[7]["informs"][0][4], "16384");
    assert_eq!(replies[8]["informs"][0][4], "0.25;");

    // Heaps before the switch carry 0.5 (±1 LSB of dither), heaps from it on carry 0.25, and
    // every heap within 3 groups of 8 on either side of it arrived, so that a thread
    // switching early or late would be seen.
    let deadline = Instant::now() + Duration::from_secs(20);
    while latest() < switch + 64 * 4096 {
        assert!(Instant::now() < deadline, "no heaps well past the switch");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let heaps = reader.join().unwrap();
    let (mut before, mut after) = (0, 0);
    for &(_, ts, level) in &heaps {
        let want = if ts < switch {
            Level::Half
        } else {
            Level::Quarter
        };
        assert_eq!(level, want, "timestamp {ts}, switch {switch}");
        if ts < switch {
            before += 1;
        } else {
            after += 1;
        }
    }
    assert!(before > 0 && after >= 20, "before {before}, after {after}");
    let near: std::collections::BTreeSet<(u64, u64)> = heaps
        .iter()
        .map(|&(id, ts, _)| (id, ts))
        .filter(|&(_, ts)| ts + 24 * 4096 >= switch && ts < switch + 24 * 4096)
        .collect();
    // One destination list: one polarisation, 24 heaps on each side.
    assert_eq!(
        near.len(),
        48,
        "heaps missing around the switch at {switch}: {near:?}"
    );

    // Prometheus: katgpucbf's dsim metric names, with values that move.
    std::thread::sleep(Duration::from_millis(1100)); // metrics refresh once a second
    let mut s = std::net::TcpStream::connect(metrics).unwrap();
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(value("dsim_output_heaps_total ") > 0.0);
    assert!(value("dsim_output_bytes_total ") > value("dsim_output_heaps_total ") * 5120.0);
    assert!(value("dsim_time_error_s ").abs() < 1.0, "{text}");
}
