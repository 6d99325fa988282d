//! `cbf affinity` on correlator-class hosts (issue 15): hwloc XML exports of two-socket hosts
//! (`tests/data/hwloc/`, written by `tools/hwloc-topology.py`, whose docstring describes each)
//! are loaded through hwloc and cbf's loader, and the plans checked against what the files were
//! written to hold: which GPU is on which socket and root complex, which NIC is whose, the
//! cores of each socket. Also this machine's own topology, which has no GPU.
#![cfg(feature = "hwloc")]

use std::path::{Path, PathBuf};
use std::process::Command;

use cbf::affinity::hwloc::load;
use cbf::affinity::plan::{place, EngineKind, Request, Warning};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hwloc")
        .join(name)
}

fn fengines(n: usize) -> Request {
    Request {
        engines: vec![(EngineKind::Fengine, n)],
        recv_threads: 2,
    }
}

#[test]
fn a_two_socket_host_with_a_gpu_and_nic_per_socket() {
    let host = load(Some(&data("dual-socket-2gpu-2nic.xml"))).unwrap();
    assert_eq!(host.hostname.as_deref(), Some("cbf-node01"));
    // 24 cores a socket, two hardware threads each: socket s core c is s*24+c and 48+s*24+c.
    assert_eq!(host.numa_nodes.len(), 2);
    for (s, node) in host.numa_nodes.iter().enumerate() {
        assert_eq!(node.os_index, s);
        assert_eq!(node.cores.len(), 24);
        assert_eq!(node.cores[5], [s * 24 + 5, 48 + s * 24 + 5]);
    }
    let g: Vec<_> = host
        .gpus
        .iter()
        .map(|g| {
            (
                g.index,
                g.index_from.as_str(),
                g.pci.bus_id.as_str(),
                g.pci.numa.clone(),
            )
        })
        .collect();
    assert_eq!(
        g,
        [
            (0, "cuda", "0000:19:00.0", vec![0]),
            (1, "cuda", "0000:9a:00.0", vec![1])
        ]
    );
    assert_eq!(host.gpus[0].pci.root.as_deref(), Some("0000:[16-1a]"));
    // The BMC's VGA device is no GPU; the management port is a NIC but no data NIC.
    let n: Vec<_> = host
        .nics
        .iter()
        .map(|n| (n.interface.as_str(), n.rdma.as_deref()))
        .collect();
    assert_eq!(
        n,
        [
            ("eno1", None),
            ("ens1f0", Some("mlx5_0")),
            ("ens1f1", Some("mlx5_1")),
            ("ens2f0", Some("mlx5_2")),
            ("ens2f1", Some("mlx5_3"))
        ]
    );
    let p = place(&host, &fengines(2));
    assert_eq!(p.warnings, []);
    assert_eq!(
        p.engines[1].flags,
        [
            "--backend=cuda",
            "--gpu-device=1",
            "--recv-interface=ens2f0",
            "--send-interface=ens2f0",
            "--recv-affinity=26,27",
            "--send-affinity=25",
            "--main-affinity=24"
        ]
    );
}

#[test]
fn a_gpu_and_nic_on_different_sockets_are_warned_about() {
    let host = load(Some(&data("dual-socket-gpu-nic-apart.xml"))).unwrap();
    let p = place(&host, &fengines(1));
    let e = &p.engines[0];
    // The 100 GbE port on socket 1, not the management port beside the GPU; cores by the GPU.
    assert_eq!((e.nic.as_deref(), e.numa), (Some("ens2f0"), Some(0)));
    assert_eq!(
        p.warnings,
        [
            Warning::CrossNuma {
                gpu: 0,
                nic: "ens2f0".into()
            },
            Warning::CrossRoot {
                gpu: 0,
                nic: "ens2f0".into(),
                gpu_root: "0000:[16-19]".into(),
                nic_root: "0000:[97-9a]".into()
            }
        ]
    );
}

#[test]
fn two_gpus_and_one_nic_share_it_with_a_warning_for_the_far_gpu() {
    let host = load(Some(&data("dual-socket-2gpu-1nic.xml"))).unwrap();
    let p = place(&host, &fengines(2));
    let nics: Vec<_> = p.engines.iter().map(|e| e.nic.as_deref()).collect();
    // GPU 1 takes the NIC's other port (the least used) on socket 0.
    assert_eq!(nics, [Some("ens1f0"), Some("ens1f1")]);
    assert_eq!(p.engines[1].numa, Some(1));
    assert!(
        p.warnings
            .iter()
            .any(|w| matches!(w, Warning::CrossNuma { gpu: 1, .. })),
        "{:?}",
        p.warnings
    );
    assert!(
        !p.warnings.iter().any(|w| matches!(
            w,
            Warning::CrossNuma { gpu: 0, .. } | Warning::CrossRoot { gpu: 0, .. }
        )),
        "{:?}",
        p.warnings
    );
}

#[test]
fn one_socket_with_two_root_complexes() {
    let host = load(Some(&data("single-socket-2root.xml"))).unwrap();
    // Known to NVML only: its number is NVML's (PCI order).
    assert_eq!(host.gpus[0].index_from, "nvml");
    let p = place(&host, &fengines(1));
    assert!(
        matches!(&p.warnings[..], [Warning::CrossRoot { gpu: 0, .. }]),
        "{:?}",
        p.warnings
    );
}

#[test]
fn the_command_prints_json_and_runs_on_this_host() {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    let out = Command::new(cbf)
        .args([
            "affinity",
            "--json",
            "--engines",
            "fengine=1,xbengine=1",
            "--topology",
        ])
        .arg(data("dual-socket-2gpu-2nic.xml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["host"]["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(v["engines"][1]["kind"], "xbengine");
    assert_eq!(v["engines"][1]["gpu"], 1);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0);

    // This VM has no GPU: the plan says so instead of failing.
    let out = Command::new(cbf).arg("affinity").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("no CUDA GPU found"), "{text}");
    assert!(text.contains("cbf fengine --backend=cpu"), "{text}");

    // A file that is not a topology is refused naming the flag.
    let out = Command::new(cbf)
        .args(["affinity", "--topology"])
        .arg(file!())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--topology"), "{err}");
}

/// The XML files are what `tools/hwloc-topology.py` writes (so the script documents them).
#[test]
fn the_files_match_their_generator() {
    let python = std::env::var("CBF_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = std::env::temp_dir().join(format!("cbf-hwloc-{}", std::process::id()));
    let status = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/hwloc-topology.py"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let fresh = std::fs::read(entry.path()).unwrap();
        let kept = std::fs::read(data(entry.file_name().to_str().unwrap())).unwrap();
        assert!(
            fresh == kept,
            "{:?} differs from the generator's",
            entry.file_name()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
