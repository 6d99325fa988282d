//! Every Prometheus counter family katgpucbf's fgpu and xbgpu expose is exposed by cbf's
//! engines under the same name, `_total` suffix included (Python prometheus_client's naming),
//! from start-up, before any input. The name lists are copied from katgpucbf's source
//! (`fgpu/recv.py`, `fgpu/send.py`, `xbgpu/recv.py`, `xbgpu/xsend.py`, `xbgpu/bsend.py`), not
//! from cbf's tables.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_udp_port, spawn_logging, PROMETHEUS_LOG};

const FGPU: [&str; 14] = [
    "input_heaps",
    "input_chunks",
    "input_samples",
    "input_bytes",
    "input_missing_heaps",
    "input_clipped_samples",
    "input_too_old_heaps",
    "input_metadata_heaps",
    "input_bad_timestamp_heaps",
    "output_heaps",
    "output_bytes",
    "output_samples",
    "output_skipped_heaps",
    "output_clipped_samples",
];

const XBGPU: [&str; 20] = [
    "input_heaps",
    "input_chunks",
    "input_bytes",
    "input_missing_heaps",
    "input_samples",
    "input_incomplete_heaps",
    "input_too_old_heaps",
    "input_metadata_heaps",
    "input_bad_timestamp_heaps",
    "input_bad_feng_id_heaps",
    "output_x_heaps",
    "output_x_bytes",
    "output_x_visibilities",
    "output_x_clipped_visibilities",
    "output_x_skipped_accs",
    "output_x_incomplete_accs",
    "output_b_heaps",
    "output_b_bytes",
    "output_b_samples",
    "output_b_clipped_samples",
];

/// cbf's own send families (`engine::metrics::SEND_METRICS`), per stream and send interface:
/// there from start-up too, though their labels come from the outputs' send streams.
const SEND: [&str; 5] = [
    "output_interface_bytes",
    "output_interface_downs",
    "output_lost_heaps",
    "output_interface_lost_packets",
    "output_interface_lost_heaps",
];

/// `/metrics` of a process as soon as it answers (within 30 s).
fn scrape(addr: std::net::SocketAddr) -> String {
    let started = Instant::now();
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            return text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no /metrics on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each family has a counter sample (at 0 before input) named `{ns}_{name}_total`.
fn check(text: &str, namespace: &str, names: &[&str]) {
    for name in names {
        let full = format!("{namespace}_{name}_total");
        assert!(
            text.contains(&format!("# TYPE {full} counter")),
            "{full} missing:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&full) && l.ends_with(" 0")),
            "{full} has no sample at start-up:\n{text}"
        );
    }
}

#[test]
fn fgpu_families_from_start_up() {
    let (_engine, addrs) = spawn_logging(
        Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args([
                "fengine",
                "--src",
                &format!("127.0.0.1:{}", free_udp_port()),
            ])
            .args(["--adc-sample-rate", "1712e6", "--sync-time", "0"])
            .args(["--katcp-port", "0", "--katcp-host", "127.0.0.1"])
            .args(["--prometheus-port", "0"])
            .args(["--recv-chunk-samples", "4194304"])
            .args(["--wideband", "name=wide,channels=1024,dst=127.0.0.1:9"])
            .env("RUST_LOG", "info"),
        &[PROMETHEUS_LOG],
    );
    let text = scrape(addrs[0]);
    check(&text, "fgpu", &FGPU);
    check(&text, "fgpu", &SEND);
}

#[test]
fn xbgpu_families_from_start_up() {
    let (_engine, addrs) = spawn_logging(
        Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args(["xbengine", &format!("127.0.0.1:{}", free_udp_port())])
            .args(["--array-size", "4", "--channels", "1024"])
            .args([
                "--channels-per-substream",
                "256",
                "--samples-between-spectra",
                "2048",
            ])
            .args(["--jones-per-batch", "262144", "--adc-sample-rate", "1712e6"])
            .args([
                "--sync-time",
                "0",
                "--katcp-port",
                "0",
                "--katcp-host",
                "127.0.0.1",
            ])
            .args(["--prometheus-port", "0"])
            .args([
                "--corrprod",
                "name=bl,dst=127.0.0.1:9,heap_accumulation_threshold=4",
            ])
            .args(["--beam", "name=b0,dst=127.0.0.1:9,pol=0"])
            .env("RUST_LOG", "info"),
        &[PROMETHEUS_LOG],
    );
    let text = scrape(addrs[0]);
    check(&text, "xbgpu", &XBGPU);
    check(&text, "xbgpu", &SEND);
}
