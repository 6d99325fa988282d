//! Logs to a file or pipe carry no ANSI colour codes (journald and `2> file` showed escape
//! sequences); a terminal still gets colour, which a test cannot see.

mod common;

use std::process::Command;

#[test]
fn piped_logs_are_plain_text() {
    let port = common::free_udp_port();
    let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["dsim", "--adc-sample-rate", "1e6", "--max-heaps", "2"])
        .args(["--katcp-port", "0", "--katcp-host", "127.0.0.1"])
        .arg(format!("127.0.0.1:{port}"))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
}
