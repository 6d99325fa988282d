//! doc/scaling.md against the planner: `cbf array plan --json` plans the three example arrays
//! (MeerKAT, MeerKAT+, SKA-Mid-sized), and every row of the doc's two tables must equal the row
//! computed here from that JSON — engine, node, GPU, NIC and multicast-group counts, the
//! busiest NIC and PCIe link, per-engine rates, and each GPU's load against the rates measured
//! in bench/RESULTS.md. A change to the planner or an example that moves a quoted number fails
//! here, with the row the doc should now hold.
//!
//! The counts come from the plan's engines (distinct nodes, (node, GPU) and (node, NIC) pairs,
//! distinct multicast addresses in every engine's inputs and outputs), not from the band
//! figures the planner derived them from; the GPU loads are recomputed from the band's sample
//! rate, channel split and antenna count (facts §1.2–§1.5 stream formats).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// bench/RESULTS.md, "GPU F-engine", 2026-11-24 (issue 14), whole GPU path, final code: the
/// lowest of the four rows (35.8–37.9 G digitiser samples/s, both polarisations), H100.
const F_GPU_GSPS: f64 = 35.8;
/// bench/RESULTS.md, "GPU XB-engine", 2026-11-26 (v8), whole GPU XB path at 80 antennas with
/// xbgpu's 32-spectrum heaps: 24.3 G complex input samples/s, H100 (the lowest row up to 256
/// antennas; 26.3 at 256 antennas).
const XB_GPU_GSPS: f64 = 24.3;

const EXAMPLES: [&str; 3] = [
    "array-meerkat.toml",
    "array-meerkat-plus.toml",
    "array-ska-mid.toml",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plan_json(example: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(["array", "plan", "--json"])
        .arg(root().join("examples").join(example))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{example}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn engines<'a>(plan: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    plan["engines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |e| e["kind"] == kind)
}

fn distinct<'a>(items: impl Iterator<Item = &'a Value>, keys: &[&str]) -> usize {
    items
        .map(|e| keys.iter().map(|k| e[*k].to_string()).collect::<Vec<_>>())
        .collect::<BTreeSet<_>>()
        .len()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

/// The busiest link of a plan's `nics` or `gpus`, as a percentage of its capacity.
fn busiest(links: &Value) -> f64 {
    links
        .as_array()
        .unwrap()
        .iter()
        .map(|l| 100.0 * f(&l["rx"]).max(f(&l["tx"])) / f(&l["capacity"]))
        .fold(0.0, f64::max)
}

/// Most engines of `kind` on one GPU.
fn per_gpu(plan: &Value, kind: &str) -> usize {
    let mut count = std::collections::BTreeMap::new();
    for e in engines(plan, kind) {
        *count
            .entry((e["node"].to_string(), e["gpu"].to_string()))
            .or_insert(0) += 1;
    }
    count.into_values().max().unwrap()
}

/// The doc's first table: what the array needs.
fn needs_row(example: &str, plan: &Value) -> String {
    let all = plan["engines"].as_array().unwrap();
    let band = &plan["bands"][0];
    let fs = engines(plan, "fengine").count();
    let xs = engines(plan, "xbengine").count();
    let mut groups = BTreeSet::new();
    for e in all {
        for list in e["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .chain(e["outputs"].as_array().unwrap())
        {
            for a in cbf::net::parse_endpoints(list.as_str().unwrap()).unwrap() {
                assert!(a.ip().is_multicast(), "{a}");
                groups.insert(a);
            }
        }
    }
    // The doc's breakdown: 8 groups per polarisation per antenna (MeerKAT's digitisers), and
    // per XB-engine one F→X group, one correlation-product group and one per beam.
    let beams = band["beam_groups"].as_array().unwrap().len();
    assert_eq!(groups.len(), 16 * fs + (2 + beams) * xs, "{example}");
    format!(
        "| `{example}` | {fs} | {} | {xs} × {} | {} | {} | {} | {} | {} | {} | {} | {:.0} % | {:.0} % |",
        band["channels"],
        band["channels_per_xengine"],
        beams,
        distinct(engines(plan, "fengine"), &["node"]),
        distinct(engines(plan, "xbengine"), &["node"]),
        distinct(all.iter(), &["node"]),
        distinct(all.iter(), &["node", "gpu"]),
        distinct(all.iter(), &["node", "nic"]),
        groups.len(),
        busiest(&plan["nics"]),
        busiest(&plan["gpus"]),
    )
}

/// The doc's second table: per-engine rates, and each GPU's load against its measured rate.
fn rates_row(example: &str, plan: &Value) -> String {
    let band = &plan["bands"][0];
    let adc = f(&band["adc_sample_rate"]);
    let channels = f(&band["channels"]);
    let cps = f(&band["channels_per_xengine"]);
    let ants = engines(plan, "fengine").count() as f64;
    let first = |kind| engines(plan, kind).next().unwrap().clone();
    let (fe, xe) = (first("fengine"), first("xbengine"));
    // An F-engine channelises both polarisations' ADC samples; an XB-engine takes every
    // antenna's share of its channels: spectra/s = adc / (2 × channels), two pols each.
    let f_gsps = 2.0 * adc / 1e9;
    let xb_gsps = ants * cps * adc / (2.0 * channels) * 2.0 / 1e9;
    let (nf, nx) = (per_gpu(plan, "fengine"), per_gpu(plan, "xbengine"));
    let f_load = nf as f64 * f_gsps;
    let xb_load = nx as f64 * xb_gsps;
    format!(
        "| `{example}` | {:.1} / {:.1} | {:.1} / {:.1} | {nf} × {f_gsps:.2} = {f_load:.2} GS/s = {:.0} % | {nx} × {xb_gsps:.2} = {xb_load:.2} GS/s = {:.0} % |",
        f(&fe["rx_gbps"]),
        f(&fe["tx_gbps"]),
        f(&xe["rx_gbps"]),
        f(&xe["tx_gbps"]),
        100.0 * f_load / F_GPU_GSPS,
        100.0 * xb_load / XB_GPU_GSPS,
    )
}

#[test]
fn the_scaling_doc_quotes_the_plans() {
    let doc = std::fs::read_to_string(root().join("doc/scaling.md")).unwrap();
    let lines: Vec<&str> = doc.lines().collect();
    let mut wrong = Vec::new();
    for example in EXAMPLES {
        let plan = plan_json(example);
        // Every described node runs an engine: the examples describe no idle hardware.
        let text = std::fs::read_to_string(root().join("examples").join(example)).unwrap();
        let cfg = cbf::array::parse(&text).unwrap();
        assert_eq!(
            distinct(plan["engines"].as_array().unwrap().iter(), &["node"]),
            cfg.nodes.len(),
            "{example}"
        );
        for row in [needs_row(example, &plan), rates_row(example, &plan)] {
            if !lines.contains(&row.as_str()) {
                wrong.push(row);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "doc/scaling.md lacks these rows (the plans' figures):\n{}",
        wrong.join("\n")
    );
}
