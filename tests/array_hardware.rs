//! `cbf array plan` with a node's hardware from `cbf affinity --json` (`[[nodes]] hardware`):
//! the JSON of a two-socket host (`tests/data/hwloc/dual-socket-2gpu-2nic.xml`, with the IPv4
//! addresses and link speeds a live node would add) gives the node's NUMA nodes, data NICs and
//! GPUs, and the plan puts each engine on a GPU with a NIC and cores of that GPU's socket, as
//! the file says the socket is built. Hand-written hardware beside the file, and a file without
//! addresses (an XML export's), are refused naming `nodes[0].hardware`.
#![cfg(feature = "hwloc")]

use std::path::{Path, PathBuf};
use std::process::Command;

use cbf::array;

const DESCRIPTION: &str = r#"
[array]
name = "hw"
sync_time = 1700000000.0
backend = "cuda"

[network]
multicast = "239.10.0.0/24"

[[bands]]
name = "l"
adc_sample_rate = 1712000000.0
centre_frequency = 1284000000.0
channels = 4096
x_engines = 1

[[antennas]]
name = "m000"

[[nodes]]
hostname = "cbf-node01"
roles = ["fengine", "xbengine"]
hardware = "node.json"
"#;

/// `cbf affinity --json` of the two-socket host, with `live` applied to each NIC's JSON.
fn affinity_json(live: impl Fn(usize, &mut serde_json::Value)) -> String {
    let xml =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hwloc/dual-socket-2gpu-2nic.xml");
    let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["affinity", "--json", "--topology"])
        .arg(xml)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (k, nic) in v["host"]["nics"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        live(k, nic);
    }
    v.to_string()
}

/// A directory holding the description (with `extra` appended to its node) and `node.json`.
fn write(tag: &str, json: &str, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cbf-array-hw-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("array.toml"), format!("{DESCRIPTION}{extra}")).unwrap();
    std::fs::write(dir.join("node.json"), json).unwrap();
    dir
}

#[test]
fn a_node_described_by_cbf_affinity_is_planned() {
    let json = affinity_json(|k, nic| {
        nic["address"] = format!("10.0.{k}.1").into();
        nic["speed_gbps"] = 100.0.into();
    });
    let dir = write("ok", &json, "");
    let cfg = array::read(&dir.join("array.toml")).unwrap();
    let node = &cfg.nodes[0];
    let cores: Vec<&str> = node.numa.iter().map(|n| n.cores.as_str()).collect();
    // Physical cores only: socket s has s*24 .. s*24+23; the siblings 48.. are left out.
    assert_eq!(cores, ["0-23", "24-47"]);
    // The management port (eno1, listed first) is no data NIC.
    let nics: Vec<(&str, &str, usize)> = node
        .nics
        .iter()
        .map(|n| (n.name.as_str(), n.address.as_str(), n.numa))
        .collect();
    assert_eq!(
        nics,
        [
            ("ens1f0", "10.0.1.1", 0),
            ("ens1f1", "10.0.2.1", 0),
            ("ens2f0", "10.0.3.1", 1),
            ("ens2f1", "10.0.4.1", 1)
        ]
    );
    let gpus: Vec<(usize, usize, Option<f64>)> = node
        .gpus
        .iter()
        .map(|g| (g.index, g.numa, g.pcie_gbytes_per_s))
        .collect();
    assert_eq!(gpus, [(0, 0, Some(63.015385)), (1, 1, Some(63.015385))]);

    let plan = array::plan::plan(&cfg).unwrap();
    for e in plan.engines.iter().filter(|e| e.gpu.is_some()) {
        let socket = node
            .gpus
            .iter()
            .find(|g| Some(g.index) == e.gpu)
            .unwrap()
            .numa;
        assert_eq!(e.numa, socket, "{}", e.name);
        let nic = node.nics.iter().find(|n| n.name == e.nic).unwrap();
        assert_eq!(nic.numa, socket, "{}", e.name);
        assert!(
            e.cores
                .iter()
                .all(|c| (socket * 24..socket * 24 + 24).contains(c)),
            "{}: {:?}",
            e.name,
            e.cores
        );
    }
    assert_eq!(plan.engines.iter().filter(|e| e.gpu.is_some()).count(), 2);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hand_written_hardware_beside_the_file_and_missing_addresses_are_refused() {
    let live = affinity_json(|k, nic| {
        nic["address"] = format!("10.0.{k}.1").into();
        nic["speed_gbps"] = 100.0.into();
    });
    let dir = write("both", &live, "\n[[nodes.numa]]\ncores = \"0-3\"\n");
    let err = array::read(&dir.join("array.toml")).unwrap_err();
    assert_eq!(err.key(), Some("nodes[0].hardware"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();

    // As an XML export gives it: no addresses.
    let dir = write("bare", &affinity_json(|_, _| {}), "");
    let err = array::read(&dir.join("array.toml")).unwrap_err();
    assert_eq!(err.key(), Some("nodes[0].hardware"), "{err}");
    assert!(
        err.to_string().contains("ens1f0 has no IPv4 address"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
