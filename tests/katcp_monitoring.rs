//! katcp monitoring as katgpucbf's clients do it (issue 14): aiokatcp's `SensorWatcher`
//! syncs to a running F-engine (it lists the sensors and subscribes to them all with bulk
//! `?sensor-sampling ... auto`), sees a sensor change that a request caused, and the standard
//! requests `?client-list`, `?log-level` and `?halt` (a clean stop: the engine exits 0) work.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_udp_port, spawn_logging, KATCP_LOG};

#[test]
fn aiokatcp_watches_an_engine_and_halts_it() {
    let (mut engine, addrs) = spawn_logging(
        Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args([
                "fengine",
                "--src",
                &format!("127.0.0.1:{}", free_udp_port()),
            ])
            .args(["--adc-sample-rate", "1712e6", "--sync-time", "0"])
            .args(["--katcp-port", "0", "--katcp-host", "127.0.0.1"])
            .args(["--recv-chunk-samples", "4194304", "--dither-seed", "7"])
            .args(["--wideband", "name=wide,channels=1024,dst=127.0.0.1:9"])
            .stdout(Stdio::null())
            .env("RUST_LOG", "info"),
        &[KATCP_LOG],
    );
    let port = addrs[0].port();
    let lines = common::run_reference(
        "katcp_watch.py",
        &[
            "127.0.0.1",
            &port.to_string(),
            "wide.input0.eq",
            r#"["gain", "wide", "0", "0.5"]"#,
            "device-status",
            "rx.device-status",
            "input0.rx.timestamp",
            "input1.rx.missing-unixtime",
            "time.state",
            "time.synchronised",
            "wide.dither-seed",
            "wide.input1.feng-clip-cnt",
        ],
    );
    let out: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let health = &out["health"];
    assert!(out["sensors"].as_u64().unwrap() >= 8, "{out}");
    let every = |g: &str| format!("[{}]", vec![g; 1024].join(", "));
    assert_eq!(out["before"], every("1+0j"), "{out}");
    assert_eq!(out["after"], every("0.5+0j"), "{out}");
    assert_eq!(out["status"], "NOMINAL", "{out}");
    // No input has come: the receive sensors are in error, so both aggregates are degraded
    // (katgpucbf's behaviour before data); nothing is missing yet.
    assert_eq!(health["input0.rx.timestamp"][1], "ERROR", "{health}");
    assert_eq!(
        health["input1.rx.missing-unixtime"][1], "NOMINAL",
        "{health}"
    );
    assert_eq!(
        health["rx.device-status"],
        serde_json::json!(["degraded", "WARN"]),
        "{health}"
    );
    assert_eq!(
        health["device-status"],
        serde_json::json!(["degraded", "WARN"]),
        "{health}"
    );
    assert!(health["time.state"][0].is_string(), "{health}");
    // The clock as adjtimex reports it (unsynchronised inside this test's container).
    assert!(health["time.synchronised"][0] == "1" || health["time.synchronised"][0] == "0");
    assert_eq!(health["wide.dither-seed"][0], "7", "{health}");
    assert_eq!(health["wide.input1.feng-clip-cnt"][0], "0", "{health}");
    assert_eq!(out["clients"].as_array().unwrap().len(), 1, "{out}");
    assert_eq!(out["log_level_set"], "debug", "{out}");
    assert_eq!(out["log_level"], "debug", "{out}");
    assert_eq!(out["halt"], "ok", "{out}");
    // ?halt is a clean stop.
    let started = Instant::now();
    let status = loop {
        if let Some(s) = engine.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still running after ?halt"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
