//! `cbf array plan` on the example arrays: every generated command line is parsed by cbf's own
//! clap parser and validated by its engine, and the parsed flags (not the plan's own fields)
//! are checked for a consistent array: feng-ids, channel ranges that tile the band, every
//! XB-engine's source being the matching group of every F-engine's output, one katcp and one
//! Prometheus port per engine per node, one owner per core, cores on the NUMA node of the NIC.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Command as Process;

use clap::Parser;

use cbf::array::config::parse_cpu_list;
use cbf::array::{self, ArrayConfig, Plan};
use cbf::cli::{Cli, Command};
use cbf::fengine::output::WidebandOutput;
use cbf::net::parse_endpoints;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

fn load(name: &str) -> (ArrayConfig, Plan) {
    let text = std::fs::read_to_string(example(name)).unwrap();
    let cfg = array::parse(&text).unwrap();
    let plan = array::plan::plan(&cfg).unwrap();
    (cfg, plan)
}

const LOCAL_SYNC_TIME: f64 = 1.75e9;

fn load_local(name: &str) -> (ArrayConfig, Plan) {
    let text = std::fs::read_to_string(example(name)).unwrap();
    let cfg = array::parse(&text).unwrap();
    let run = array::local::LocalRun {
        binary: "/opt/here/cbf".into(),
        sync_time: LOCAL_SYNC_TIME,
    };
    let plan = array::plan::plan_local(&cfg, &run).unwrap();
    (cfg, plan)
}

/// The distinct addresses of endpoint lists, in order.
fn addresses(lists: &[String]) -> Vec<std::net::SocketAddrV4> {
    let mut all: Vec<_> = lists
        .iter()
        .flat_map(|l| parse_endpoints(l).unwrap())
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Parse and validate every command line; check the array they make up.
fn check_command_lines(name: &str, antennas: usize, x_engines: usize, dsims: usize) {
    let (cfg, plan) = load(name);
    check_plan(&cfg, &plan, antennas, x_engines, dsims, cfg.array.sync_time);
}

fn check_plan(
    cfg: &ArrayConfig,
    plan: &Plan,
    antennas: usize,
    x_engines: usize,
    dsims: usize,
    sync_time: f64,
) {
    assert_eq!(plan.engines.len(), dsims + antennas + x_engines);
    let band = &cfg.bands[0];
    let mut feng_ids = Vec::new();
    let mut f_dst: Vec<Vec<std::net::SocketAddrV4>> = Vec::new();
    let mut x_src = BTreeMap::new();
    let mut dsim_out = HashSet::new();
    let mut f_in = HashSet::new();
    let mut ports: BTreeMap<&str, HashSet<u16>> = BTreeMap::new();
    let mut cores: BTreeMap<&str, HashSet<usize>> = BTreeMap::new();
    for e in &plan.engines {
        let cli = Cli::try_parse_from(&e.argv)
            .unwrap_or_else(|err| panic!("{}: {err}\n{:?}", e.name, e.argv));
        match cli.command {
            Command::Fengine(a) => {
                let c = a.config().unwrap();
                c.validate().unwrap();
                assert_eq!(c.array_size as usize, antennas);
                assert_eq!(c.sync_time, sync_time);
                feng_ids.push(c.feng_id);
                let out = WidebandOutput::parse(&a.wideband[0]).unwrap();
                assert_eq!(out.channels, band.channels);
                f_dst.push(out.dst);
                f_in.insert(addresses(std::slice::from_ref(&c.source.src)));
            }
            Command::Xbengine(a) => {
                let c = a.config().unwrap();
                c.validate().unwrap();
                assert_eq!(c.array_size, antennas);
                assert_eq!(c.channels, band.channels);
                assert_eq!(c.channels_per_substream * x_engines, band.channels);
                assert_eq!(c.samples_between_spectra, 2 * band.channels as u64);
                let src = parse_endpoints(&c.source.src).unwrap();
                assert_eq!(src.len(), 1, "{}", e.name);
                let x = c.channel_offset_value as usize / c.channels_per_substream;
                assert!(x_src.insert(x, src[0]).is_none(), "{x} twice");
            }
            Command::Dsim(a) => {
                let mut c = a.config().unwrap();
                assert_eq!(c.affinity, e.cores);
                // The cores are the planned node's, not this host's.
                c.affinity.clear();
                c.validate().unwrap();
                dsim_out.insert(addresses(&a.dest));
            }
            other => panic!("{}: {other:?}", e.name),
        }
        let p = ports.entry(&e.node).or_default();
        assert!(
            p.insert(e.katcp_port) && p.insert(e.prometheus_port),
            "{}",
            e.name
        );
        if e.node == "localhost" {
            continue; // a local run: not placed on the description's cores
        }
        let node = cfg.nodes.iter().find(|n| n.hostname == e.node).unwrap();
        let numa = parse_cpu_list(&node.numa[e.numa].cores).unwrap();
        let nic = node.nics.iter().find(|n| n.name == e.nic).unwrap();
        assert_eq!(nic.numa, e.numa, "{}: NIC on another NUMA node", e.name);
        if let Some(g) = e.gpu {
            let gpu = node.gpus.iter().find(|x| x.index == g).unwrap();
            assert_eq!(gpu.numa, e.numa, "{}: GPU on another NUMA node", e.name);
        }
        let held = cores.entry(&e.node).or_default();
        for c in &e.cores {
            assert!(
                numa.contains(c),
                "{}: core {c} not on NUMA node {}",
                e.name,
                e.numa
            );
            assert!(held.insert(*c), "{}: core {c} claimed twice", e.name);
        }
    }
    feng_ids.sort_unstable();
    assert_eq!(feng_ids, (0..antennas as u64).collect::<Vec<_>>());
    // Every XB-engine, one per channel range, hears the matching group of every F-engine.
    assert_eq!(
        x_src.keys().copied().collect::<Vec<_>>(),
        (0..x_engines).collect::<Vec<_>>()
    );
    for dst in &f_dst {
        assert_eq!(dst.len(), x_engines);
        for (x, src) in &x_src {
            assert_eq!(dst[*x], *src);
        }
    }
    if dsims > 0 {
        assert_eq!(dsim_out, f_in, "each F-engine receives one dsim's streams");
    }
}

/// The local plan of the 4-antenna example: the same array, every stream a unicast loopback
/// address (each digitiser stream one address for both polarisations), every engine on
/// this host with its own ports, this host's binary and the run's sync time, XB-engines
/// sending without ?capture-start, nothing pinned.
#[test]
fn the_local_4_antenna_array_is_consistent() {
    let (cfg, plan) = load_local("array-4ant.toml");
    check_plan(&cfg, &plan, 4, 2, 4, LOCAL_SYNC_TIME);
    let mut katcp = HashSet::new();
    for e in &plan.engines {
        assert_eq!(e.argv[0], "/opt/here/cbf");
        assert_eq!(e.node, "localhost");
        assert!(e.cores.is_empty());
        assert!(katcp.insert(e.katcp_port) && katcp.insert(e.prometheus_port));
        assert!(e
            .argv
            .windows(2)
            .any(|w| w == ["--katcp-host", "127.0.0.1"]));
        for s in e.inputs.iter().chain(&e.outputs) {
            for a in parse_endpoints(s).unwrap() {
                assert!(a.ip().is_loopback(), "{}: {a}", e.name);
            }
        }
        match e.kind {
            array::EngineKind::Dsim => {
                assert!(!e.argv.iter().any(|a| a == "--affinity"));
                assert_eq!(
                    e.outputs[0], e.outputs[1],
                    "both polarisations to one address"
                );
            }
            array::EngineKind::Fengine => {
                assert_eq!(parse_endpoints(&e.inputs[0]).unwrap().len(), 1);
            }
            array::EngineKind::Xbengine => {
                assert!(e.argv.iter().any(|a| a == "--send-enabled"));
            }
        }
    }
}

#[test]
fn the_4_antenna_array_is_consistent() {
    check_command_lines("array-4ant.toml", 4, 2, 4);
}

#[test]
fn the_meerkat_array_is_consistent() {
    check_command_lines("array-meerkat.toml", 80, 64, 0);
    let (_, plan) = load("array-meerkat.toml");
    // katgpucbf's figures: 512 channels per XB-engine, 0.5 s dumps.
    assert_eq!(plan.bands[0].channels_per_xengine, 512);
    assert!((plan.bands[0].dump_seconds - 0.5).abs() < 1e-3);
    for e in &plan.engines {
        let gpu = e.gpu.expect("a CUDA engine has a GPU").to_string();
        assert_eq!(e.env["CUDA_VISIBLE_DEVICES"], gpu);
        assert!(e.argv.windows(2).any(|w| w == ["--gpu-device", "0"]));
    }
}

/// The binary prints the table and the JSON form of the same plan.
#[test]
fn the_cli_prints_the_plan() {
    let bin = env!("CARGO_BIN_EXE_cbf");
    let path = example("array-4ant.toml");
    let out = Process::new(bin)
        .args(["array", "plan"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for name in ["l-dsim-m000", "l-f-m003", "l-xb-01", "localhost"] {
        assert!(table.contains(name), "{name} missing from\n{table}");
    }
    let out = Process::new(bin)
        .args(["array", "plan", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let engines = json["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 10);
    let (_, plan) = load("array-4ant.toml");
    for (j, e) in engines.iter().zip(&plan.engines) {
        let argv: Vec<String> = serde_json::from_value(j["argv"].clone()).unwrap();
        assert_eq!(argv, e.argv);
    }
}

/// The larger examples of doc/scaling.md (tests/array_scaling.rs checks the doc's figures).
#[test]
fn the_meerkat_plus_and_ska_mid_arrays_are_consistent() {
    check_command_lines("array-meerkat-plus.toml", 144, 128, 0);
    check_command_lines("array-ska-mid.toml", 197, 256, 0);
}
