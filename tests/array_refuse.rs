//! A description that cannot make a working array is refused with an error naming the key at
//! fault: one case per class of inconsistency (channel counts, F→X reach, NIC rates, PCIe,
//! cores, room for the engines, ports, multicast groups, names), each made by changing one
//! thing in an example that plans.

use std::path::PathBuf;

use cbf::array::{self, ArrayConfig, ArrayError};

fn example(name: &str) -> ArrayConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    array::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn four() -> ArrayConfig {
    example("array-4ant.toml")
}

fn meerkat() -> ArrayConfig {
    example("array-meerkat.toml")
}

/// The key named by planning `cfg`, and the message.
fn refused(cfg: &ArrayConfig) -> (String, String) {
    match array::plan::plan(cfg) {
        Err(ArrayError::Config { key, message }) => (key, message),
        Err(other) => panic!("not a config error: {other}"),
        Ok(_) => panic!("planned"),
    }
}

fn key(cfg: &ArrayConfig) -> String {
    refused(cfg).0
}

#[test]
fn the_examples_plan() {
    array::plan::plan(&four()).unwrap();
    array::plan::plan(&meerkat()).unwrap();
}

#[test]
fn channel_counts_must_divide() {
    let mut c = four();
    c.bands[0].x_engines = 3;
    assert_eq!(key(&c), "bands[0].x_engines");
    let mut c = four();
    c.bands[0].channels = 1000;
    assert_eq!(key(&c), "bands[0].channels");
    // A batch must be whole spectra, and its span of input samples must divide the
    // F-engine's 2^25-sample input chunk.
    for jpb in [1000, 1536 * 1024, 1 << 25, usize::MAX] {
        let mut c = four();
        c.bands[0].jones_per_batch = jpb;
        assert_eq!(key(&c), "bands[0].jones_per_batch", "{jpb}");
    }
    let mut c = four();
    c.bands[0].int_time = 0.001;
    assert_eq!(key(&c), "bands[0].int_time");
    let mut c = four();
    c.bands[0].beams[1].pol = 2;
    assert_eq!(key(&c), "bands[0].beams[1].pol");
}

/// Every F-engine output must reach every XB-engine: the F→X groups, when given, are one
/// range with one group per XB-engine.
#[test]
fn every_fengine_output_reaches_every_xengine() {
    let mut c = four();
    c.bands[0].fx_dst = Some("239.20.0.0+2:7148".into());
    let (k, m) = refused(&c);
    assert_eq!(k, "bands[0].fx_dst");
    assert!(m.contains("3 groups for 2 XB-engines"), "{m}");
    c.bands[0].fx_dst = Some("239.20.0.0:7148,239.20.0.5:7148".into());
    assert_eq!(key(&c), "bands[0].fx_dst");
    c.bands[0].fx_dst = Some("239.20.0.0+1:7148".into());
    let plan = array::plan::plan(&c).unwrap();
    assert_eq!(plan.bands[0].fx_groups, "239.20.0.0+1:7148");
    // A plan whose XB-engine listens elsewhere is caught by the check on the finished plan.
    let mut broken = plan.clone();
    let x = broken
        .engines
        .iter_mut()
        .find(|e| e.name == "l-xb-01")
        .unwrap();
    x.inputs = vec!["239.20.0.7:7148".into()];
    let err = array::plan::check_fx(&broken).unwrap_err();
    assert_eq!(err.key(), Some("bands[0].x_engines"), "{err}");
}

#[test]
fn nic_rates_must_fit() {
    let mut c = meerkat();
    c.nodes[3].nics[1].speed_gbps = 50.0;
    let (k, m) = refused(&c);
    assert_eq!(k, "nodes[3].nics[1].speed_gbps");
    assert!(m.contains("70.33 Gb/s in"), "{m}");
    let mut c = four();
    c.nodes[0].nics[0].speed_gbps = 1.0;
    assert_eq!(key(&c), "nodes[0].nics[0].speed_gbps");
}

#[test]
fn pcie_links_must_fit() {
    let mut c = meerkat();
    c.nodes[25].gpus[0].pcie_width = 2;
    assert_eq!(key(&c), "nodes[25].gpus[0].pcie_width");
    let mut c = meerkat();
    c.nodes[0].gpus[1].pcie_gbytes_per_s = Some(8.0);
    assert_eq!(key(&c), "nodes[0].gpus[1].pcie_gbytes_per_s");
    let mut c = meerkat();
    c.nodes[0].gpus[1].pcie_gen = 7;
    assert_eq!(key(&c), "nodes[0].gpus[1].pcie_gen");
}

#[test]
fn no_two_engines_claim_a_core() {
    // A core on two NUMA nodes could go to two engines.
    let mut c = four();
    c.nodes[0].numa.push(array::config::Numa {
        cores: "15-20".into(),
    });
    assert_eq!(key(&c), "nodes[0].numa[1].cores");
    // Too few cores for the engines on the NUMA node.
    let mut c = four();
    c.nodes[0].numa[0].cores = "0-14".into();
    let (k, m) = refused(&c);
    assert_eq!(k, "nodes[0].numa[0].cores");
    assert!(m.contains("l-xb-01"), "{m}");
}

#[test]
fn there_must_be_room_for_every_engine() {
    let mut c = meerkat();
    c.nodes.pop();
    let (k, m) = refused(&c);
    assert_eq!(k, "nodes");
    assert!(m.contains("l-xb-60"), "{m}");
    let mut c = four();
    c.nodes[0].cpu_engines = 9;
    assert_eq!(key(&c), "nodes");
    // A GPU with no NIC on its NUMA node would send its engines' traffic across sockets.
    let mut c = meerkat();
    c.nodes[0].numa.push(array::config::Numa {
        cores: "32-63".into(),
    });
    c.nodes[0].gpus[1].numa = 1;
    assert_eq!(key(&c), "nodes[0].gpus[1].numa");
}

#[test]
fn control_ports_must_not_meet() {
    let mut c = four();
    c.network.prometheus_port_base = 7205;
    assert_eq!(key(&c), "network.prometheus_port_base");
    let mut c = four();
    c.network.katcp_port_base = 65530;
    assert_eq!(key(&c), "network.katcp_port_base");
}

#[test]
fn multicast_groups_are_one_consistent_allocation() {
    let mut c = four();
    c.network.multicast = "239.10.0.0/28".into();
    assert_eq!(key(&c), "network.multicast");
    c.network.multicast = "10.0.0.0/8".into();
    assert_eq!(key(&c), "network.multicast");
    let mut c = four();
    c.network.digitiser_groups_per_pol = u32::MAX;
    assert_eq!(key(&c), "network.multicast");
    // A digitiser stream given by hand inside the allocated F→X groups.
    let mut c = four();
    c.antennas[1].digitiser.insert(
        "l".into(),
        vec!["239.10.0.12:7148".into(), "239.10.0.40:7148".into()],
    );
    let (k, m) = refused(&c);
    assert_eq!(k, "antennas[1].digitiser.l");
    assert!(m.contains("F-engine outputs"), "{m}");
    c.antennas[1].digitiser.insert("x".into(), vec![]);
    assert_eq!(key(&c), "antennas[1].digitiser.x");
}

#[test]
fn names_and_values_are_checked() {
    let mut c = four();
    c.array.name = "Test_4".into();
    assert_eq!(key(&c), "array.name");
    let mut c = four();
    c.antennas[2].name = "m001".into();
    assert_eq!(key(&c), "antennas[2].name");
    let mut c = four();
    c.array.sync_time = f64::NAN;
    assert_eq!(key(&c), "array.sync_time");
    let mut c = four();
    c.nodes[0].nics[0].address = "localhost".into();
    assert_eq!(key(&c), "nodes[0].nics[0].address");
    let mut c = four();
    c.bands[0].adc_sample_rate = 0.0;
    assert_eq!(key(&c), "bands[0].adc_sample_rate");
}

/// Unknown and missing keys are refused by the parser, which names them.
#[test]
fn unknown_and_missing_keys_are_named() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/array-4ant.toml"),
    )
    .unwrap();
    let typo = text.replace("x_engines = 2", "xengines = 2");
    let err = array::parse(&typo).unwrap_err().to_string();
    assert!(err.contains("xengines"), "{err}");
    let missing = text.replace("channels = 1024\n", "");
    let err = array::parse(&missing).unwrap_err().to_string();
    assert!(err.contains("channels"), "{err}");
}

/// The engines' own validators stand behind the plan: a dsim signal program the dsim refuses
/// is refused when the plan's command lines are checked, naming the engine and the flag.
#[test]
fn command_lines_the_engines_refuse_are_refused() {
    let mut c = four();
    c.dsim.signals = Some("cw(0.2, 1e6)".into());
    let plan = array::plan::plan(&c).unwrap();
    let err = cbf::cli::array::check_command_lines(&plan)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("l-dsim-m000") && err.contains("--signals"),
        "{err}"
    );
}

/// The F-engines' chunk must hold whole digitiser heaps, and the PFB footprint with the delay
/// allowance.
#[test]
fn the_fengine_chunk_must_fit_its_tail() {
    for chunk in [0, 1000, 1 << 31] {
        let mut c = four();
        c.bands[0].recv_chunk_samples = chunk;
        assert_eq!(key(&c), "bands[0].recv_chunk_samples", "{chunk}");
    }
    // 1024 channels × 16 taps × 2 = 32768 samples of footprint: a 2^16 chunk (with 2^15-sample
    // batches) holds it with up to 32768 samples of delay allowance.
    let mut c = four();
    c.bands[0].recv_chunk_samples = 1 << 16;
    c.bands[0].jones_per_batch = 1 << 14;
    c.bands[0].max_delay_diff = 1 << 15;
    array::plan::plan(&c).unwrap();
    c.bands[0].max_delay_diff = (1 << 15) + 1;
    assert_eq!(key(&c), "bands[0].max_delay_diff");
    c.bands[0].max_delay_diff = usize::MAX;
    assert_eq!(key(&c), "bands[0].max_delay_diff");
}

/// A local run starts a bounded number of processes, on ports that do not meet, and maps the
/// groups to loopback addresses that are neither the loopback network's nor its broadcast.
#[test]
fn a_local_run_is_small_and_its_ports_and_addresses_are_sound() {
    let run = array::local::LocalRun {
        binary: "/bin/cbf".into(),
        sync_time: 1e9,
    };
    let local = |cfg: &ArrayConfig| match array::plan::plan_local(cfg, &run) {
        Err(ArrayError::Config { key, message }) => (key, message),
        Err(other) => panic!("not a config error: {other}"),
        Ok(_) => panic!("planned"),
    };
    array::plan::plan_local(&four(), &run).unwrap();
    let (k, m) = local(&meerkat());
    assert_eq!(k, "antennas");
    assert!(m.contains("at most 16"), "{m}");
    // 7 antennas: 7 dsims + 7 F-engines + 2 XB-engines = 16; 8 are too many.
    let mut c = four();
    for a in 4..7 {
        let mut ant = c.antennas[0].clone();
        ant.name = format!("m{a:03}");
        c.antennas.push(ant);
    }
    c.nodes[0].cpu_engines = 16;
    c.nodes[0].numa[0].cores = "0-63".into();
    array::plan::plan_local(&c, &run).unwrap();
    let mut ant = c.antennas[0].clone();
    ant.name = "m007".into();
    c.antennas.push(ant);
    assert_eq!(local(&c).0, "antennas");
    let mut c = four();
    c.network.prometheus_port_base = c.network.katcp_port_base + 9;
    assert_eq!(local(&c).0, "network.prometheus_port_base");
    c.network.prometheus_port_base = 65530;
    assert_eq!(local(&c).0, "network.prometheus_port_base");
    let mut c = four();
    c.network.multicast = "239.0.0.0/24".into();
    assert_eq!(local(&c).0, "network.multicast");
}
