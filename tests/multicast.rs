//! IPv4 multicast across a real link: two network namespaces joined by a veth pair, made by the
//! test (the root namespace would route multicast off the machine). `cbf dsim` sends from one
//! namespace, `cbf capture` joins groups on a named interface in the other. Needs root and
//! iproute2 (`.ci/run` installs it); without them the test fails, saying so.

use std::process::{Command, Stdio};

struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip (install iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?} failed (the multicast test needs root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dsim_to_capture_over_multicast_between_namespaces() {
    let id = std::process::id() % 100_000;
    let (a, b) = (format!("cbf-a-{id}"), format!("cbf-b-{id}"));
    let (va, vb) = (format!("cva{id}"), format!("cvb{id}"));
    ip(&["netns", "add", &a]);
    let _guard_a = Netns {
        names: vec![a.clone()],
    };
    ip(&["netns", "add", &b]);
    let _guard_b = Netns {
        names: vec![b.clone()],
    };
    ip(&[
        "link", "add", &va, "mtu", "9000", "type", "veth", "peer", "name", &vb, "mtu", "9000",
    ]);
    ip(&["link", "set", &va, "netns", &a]);
    ip(&["link", "set", &vb, "netns", &b]);
    ip(&["-n", &a, "addr", "add", "10.99.0.1/24", "dev", &va]);
    ip(&["-n", &b, "addr", "add", "10.99.0.2/24", "dev", &vb]);
    for (ns, dev) in [(&a, &va), (&b, &vb)] {
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&["-n", ns, "link", "set", dev, "up"]);
    }
    ip(&["-n", &a, "route", "add", "224.0.0.0/4", "dev", &va]);

    let cbf = env!("CARGO_BIN_EXE_cbf");
    let n = 40u64;
    // Capture joins .10 and .11 only. dsim sends pol 0 to .10 and pol 1 round-robin to .11 and
    // .12, so exactly n + n/2 data heaps (plus one descriptor heap per joined group) arrive.
    let expect = n + n / 2 + 2;
    let capture = Command::new("ip")
        .args([
            "netns",
            "exec",
            &b,
            cbf,
            "capture",
            "239.10.10.10+1:7148",
            "--interface",
            &vb,
        ])
        .args(["--count", &expect.to_string(), "--duration", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            &a,
            cbf,
            "dsim",
            "--adc-sample-rate",
            "100e6",
            "--period",
            "65536",
        ])
        .args([
            "--max-heaps",
            &n.to_string(),
            "--interface",
            &va,
            "--ttl",
            "2",
        ])
        .args(["239.10.10.10:7148", "239.10.10.11+1:7148"])
        .status()
        .unwrap();
    assert!(status.success());
    let out = capture.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "capture failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let heaps: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<u64> = heaps
        .iter()
        .filter(|h| h["complete"] == true)
        .filter_map(|h| {
            h["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["id"] == "0x3101")
                .map(|i| i["immediate"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        ids.iter().filter(|&&i| i == 0).count() as u64,
        n,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ids.iter().filter(|&&i| i == 1).count() as u64, n / 2);
    assert_eq!(heaps.len() as u64, expect);
}
