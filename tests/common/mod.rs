//! Shared helpers for integration tests: the Python reference environment and free ports.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The Python with spead2/numpy/scipy/aiokatcp that `tools/test` prepares. Tests that need it
/// fail (never skip) when it is missing, saying how to make it.
pub fn python() -> PathBuf {
    let p = std::env::var_os("CBF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    assert!(
        p.exists(),
        "reference Python {} not found: run tools/test (or tools/setup-python) first",
        p.display()
    );
    p
}

pub fn reference_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(name)
}

/// Run a reference script to completion and return its stdout lines; panics with stderr on failure.
pub fn run_reference(script: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new(python())
        .arg(reference_script(script))
        .args(args)
        .output()
        .expect("cannot start reference Python");
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A UDP port that was free a moment ago on 127.0.0.1.
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Run a reference script with `stdin` bytes and return its stdout bytes; panics on failure.
pub fn run_reference_bytes(script: &str, args: &[String], stdin: &[u8]) -> Vec<u8> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(python())
        .arg(reference_script(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start reference Python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write to reference script");
    let out = child.wait_with_output().expect("reference script");
    assert!(out.status.success(), "{script} {args:?} failed");
    out.stdout
}

/// What an engine logs when its katcp server listens (`engine::control`), with `katcp=` the
/// address bound.
pub const KATCP_LOG: (&str, &str) = ("katcp server listening", "katcp");
/// What an engine logs when its Prometheus endpoint listens, with `addr=` the address bound.
pub const PROMETHEUS_LOG: (&str, &str) = ("Prometheus metrics at /metrics", "addr");

/// Start `cmd` with its stderr read on a thread, and wait (up to 30 s) for a log line with
/// each `(marker, key)` of `wanted`; returns the child and, in `wanted`'s order, the address
/// each line gives as `key=ADDR`. Tests that give an engine port 0 learn its ports this way,
/// where a port picked free beforehand (`free_tcp_port`) can be taken by another test in
/// between. The thread echoes every line to this test's stderr and keeps the pipe drained
/// until the child exits.
pub fn spawn_logging(
    cmd: &mut Command,
    wanted: &[(&str, &str)],
) -> (Kill, Vec<std::net::SocketAddr>) {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot start the engine");
    let stderr = child.stderr.take().expect("stderr");
    let mut child = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("{line}");
            let _ = tx.send(line);
        }
    });
    let mut found: Vec<Option<std::net::SocketAddr>> = vec![None; wanted.len()];
    let deadline = Instant::now() + Duration::from_secs(30);
    while found.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let status = child.0.try_wait();
            panic!("no log line with each of {wanted:?} within 30 s; the child: {status:?}");
        };
        for ((marker, key), slot) in wanted.iter().zip(&mut found) {
            if line.contains(marker) {
                let prefix = format!("{key}=");
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(&prefix))
                    .and_then(|a| a.trim_matches('"').parse().ok());
                *slot = Some(addr.unwrap_or_else(|| panic!("no {prefix}ADDR in {line:?}")));
            }
        }
    }
    (child, found.into_iter().flatten().collect())
}

/// A child process killed (and reaped) when the test ends, however it ends.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Record digitiser heaps of white noise to a pcap file, one packet per heap, as `cbf dsim`
/// would send them (10-bit, `hs` samples per heap, a pattern of `period` samples, 2 MS/s):
/// heap indices `heaps` of both polarisations, less those `dropped(pol, heap)` names.
/// Returns the heaps written.
pub fn record_noise(
    path: &std::path::Path,
    hs: u64,
    period: u64,
    heaps: impl IntoIterator<Item = u64>,
    dropped: impl Fn(usize, u64) -> bool,
) -> u64 {
    use cbf::net::pcap::PcapDump;
    use cbf::sim::dsim::{DigitiserConfig, DigitiserHeaps};
    use cbf::sim::signal::{Expr, Signal};
    use cbf::spead::send::PacketGenerator;
    use cbf::spead::Flavour;

    let cfg = DigitiserConfig {
        adc_sample_rate: 2e6,
        sample_bits: 10,
        heap_samples: hs as usize,
        period: period as usize,
        first_id: 0,
        dither_seed: 1,
    };
    let sig = Signal {
        expr: Expr::Wgn { std: 0.1, seed: 3 },
        dither: true,
    };
    let dig = DigitiserHeaps::new(cfg, &[sig.clone(), sig]);
    let mut dump = PcapDump::create(path).unwrap();
    let src = "10.0.0.1:7000".parse().unwrap();
    let dst = "239.1.1.1:7148".parse().unwrap();
    let mut written = 0;
    for h in heaps {
        for pol in 0..2 {
            if dropped(pol, h) {
                continue;
            }
            let heap = dig.heap(pol, h * hs);
            let cnt = 2 * (2 * h + pol as u64) + 2;
            let mut g = PacketGenerator::new(&heap, cnt, Flavour::SPEAD_64_48, 8192).unwrap();
            let mut buf = Vec::new();
            g.next_packet(&mut buf).unwrap();
            dump.write(src, dst, &buf).unwrap();
            written += 1;
        }
    }
    dump.finish().unwrap();
    written
}

/// An F-engine data heap's (timestamp, feng_id, frequency, feng_raw); `None` for a heap without
/// them (descriptors).
pub fn f_heap_items(h: &cbf::spead::recv::ReceivedHeap) -> Option<(u64, u64, u64, &[u8])> {
    use cbf::spead::items::{ItemValue, FENG_ID_ID, FENG_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID};
    match (
        h.item(TIMESTAMP_ID),
        h.item(FENG_ID_ID),
        h.item(FREQUENCY_ID),
        h.item(FENG_RAW_ID),
    ) {
        (
            Some(ItemValue::Immediate(ts)),
            Some(ItemValue::Immediate(feng)),
            Some(ItemValue::Immediate(first)),
            Some(ItemValue::Bytes(raw)),
        ) => Some((ts, feng, first, raw)),
        _ => None,
    }
}
