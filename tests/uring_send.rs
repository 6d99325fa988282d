//! `--send-transport uring` from the command line (issue 15): `cbf dsim` sends through io_uring's
//! zero-copy `sendmsg` to `cbf capture` over loopback, and every heap arrives complete, as many
//! as over kernel UDP sockets (`udp`, run the same way beside it). The byte-for-byte equality of
//! the two senders' packets is `net::uring_send`'s unit tests'.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::{free_udp_port, Kill};

/// Heaps dsim sends per polarisation.
const HEAPS: u64 = 400;

/// The capture's last stats line after dsim sent `HEAPS` heaps per pol over `transport`.
fn capture_of_dsim(transport: &str) -> serde_json::Value {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    let port = free_udp_port();
    let dst = format!("127.0.0.1:{port}");
    let mut capture = Kill(
        Command::new(cbf)
            .args(["capture", "--stats", "--duration", "6", &dst])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let dsim = Command::new(cbf)
        .args(["dsim", "--adc-sample-rate", "1e7", "--period", "4096"])
        .args(["--katcp-port", "0", "--max-heaps", &HEAPS.to_string()])
        .args(["--send-transport", transport, &dst, &dst])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&dsim.stderr);
    assert!(dsim.status.success(), "dsim over {transport}: {log}");
    assert_eq!(
        log.contains("sending through io_uring's zero-copy sendmsg"),
        transport == "uring",
        "dsim over {transport}: {log}"
    );
    let mut text = String::new();
    capture
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert!(capture.0.wait().unwrap().success());
    let last = text.lines().last().expect("capture printed nothing");
    serde_json::from_str(last).unwrap()
}

#[test]
fn dsim_over_io_uring_delivers_every_heap_complete_as_udp_does() {
    let uring = capture_of_dsim("uring");
    let udp = capture_of_dsim("udp");
    for (name, stats) in [("uring", &uring), ("udp", &udp)] {
        let heaps = stats["heaps"].as_u64().unwrap();
        // Both pols' data heaps, plus descriptors and stop heaps.
        assert!(heaps >= 2 * HEAPS, "{name}: {heaps} heaps: {stats}");
        assert_eq!(stats["incomplete_heaps_evicted"], 0, "{name}: {stats}");
    }
    assert_eq!(
        uring["heaps"], udp["heaps"],
        "uring {uring} against udp {udp}"
    );
}
