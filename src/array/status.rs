//! `cbf array status`: every engine of a plan read where the plan says it listens — its health
//! sensors over katcp (`?sensor-value`: `device-status`, and whether it is in sync: an
//! XB-engine's `<corrprod>.rx.synchronised`, an F-engine's `input0/1.rx.timestamp` being
//! nominal, which they are while data arrives) and its counters over Prometheus, read twice
//! an interval apart for the rates (katgpucbf's engines keep their counters there, not in
//! sensors: facts §1.8). One row per engine; an engine that cannot be reached is a row that
//! says so. Every connection has a timeout, so a status of any plan takes about the interval
//! plus, at worst, a few timeouts.
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::plan::{EngineKind, EnginePlan, Plan};
use crate::control::katcp::client::Client;
use crate::control::scrape;

/// Loss counters by cause (the counters' bare names, without the program's namespace and
/// `_total`), and the name each has in the table. Descriptor heaps (`input_metadata_heaps`)
/// are not losses.
pub const LOSS_CAUSES: [(&str, &str); 8] = [
    ("input_missing_heaps", "missing"),
    ("input_too_old_heaps", "too-old"),
    ("input_incomplete_heaps", "incomplete"),
    ("input_bad_timestamp_heaps", "bad-timestamp"),
    ("input_bad_feng_id_heaps", "bad-feng-id"),
    ("input_far_future_heaps", "far-future"),
    ("input_kernel_dropped_packets", "kernel-dropped-packets"),
    ("output_skipped_heaps", "skipped"),
];
/// Counters of heaps and bytes in and out, by the counters' bare names (an XB-engine's
/// outputs are counted per kind: X, beam, FRB).
const IN_HEAPS: [&str; 1] = ["input_heaps"];
const IN_BYTES: [&str; 1] = ["input_bytes"];
const OUT_HEAPS: [&str; 4] = [
    "output_heaps",
    "output_x_heaps",
    "output_b_heaps",
    "output_frb_heaps",
];
const OUT_BYTES: [&str; 4] = [
    "output_bytes",
    "output_x_bytes",
    "output_b_bytes",
    "output_frb_bytes",
];

/// One engine as read.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    pub name: String,
    pub kind: EngineKind,
    /// `host:port` of its katcp server.
    pub katcp: String,
    /// Why its katcp server could not be read (then the sensors are `None`).
    pub katcp_error: Option<String>,
    /// Why its Prometheus counters could not be read (then the counters are empty).
    pub metrics_error: Option<String>,
    /// `device-status`: `ok`, `degraded`, `fail`.
    pub device_status: Option<String>,
    /// Whether it is in sync (see the module doc); `None` for a dsim or when unknown.
    pub synchronised: Option<bool>,
    /// Every counter, by bare name, summed over its labels (the second reading).
    pub counters: BTreeMap<String, f64>,
    /// The same counters' rates per second over the interval.
    pub rates: BTreeMap<String, f64>,
}

impl EngineStatus {
    fn sum(map: &BTreeMap<String, f64>, names: &[&str]) -> f64 {
        names
            .iter()
            .filter_map(|n| map.get(*n))
            .fold(0.0, |a, v| a + v)
    }
    pub fn heaps_in(&self) -> f64 {
        Self::sum(&self.counters, &IN_HEAPS)
    }
    pub fn heaps_out(&self) -> f64 {
        Self::sum(&self.counters, &OUT_HEAPS)
    }
    /// Losses by cause (table name → count), the causes that have any.
    pub fn losses(&self) -> Vec<(&'static str, f64)> {
        LOSS_CAUSES
            .iter()
            .filter_map(|(c, label)| {
                self.counters
                    .get(*c)
                    .filter(|&&v| v > 0.0)
                    .map(|&v| (*label, v))
            })
            .collect()
    }
}

/// The first IPv4 address of `host:port` (the engines listen on IPv4).
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("{host} has no IPv4 address"))
}

/// Counters by bare name (`fgpu_input_heaps_total{pol="0"}` → `input_heaps`), summed over
/// their labels.
fn counters(samples: &[scrape::Sample]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples {
        let Some(bare) = s
            .name
            .strip_suffix("_total")
            .and_then(|n| n.split_once('_'))
            .map(|(_, b)| b)
        else {
            continue;
        };
        *out.entry(bare.to_string()).or_insert(0.0) += s.value;
    }
    out
}

/// The value of sensor `name` and whether its status is nominal, or `None`.
fn sensor(c: &mut Client, name: &str) -> Option<(String, bool)> {
    let r = c.request("sensor-value", &[name]).ok()?;
    let args = &r.informs.first()?.args;
    // #sensor-value timestamp count name status value
    Some((args.get(4)?.clone(), args.get(3)? == "nominal"))
}

/// Read one engine: a first counter reading at `start`, the second and the sensors after
/// `interval`.
fn read(e: &EnginePlan, corrprod: &str, interval: Duration, timeout: Duration) -> EngineStatus {
    let mut st = EngineStatus {
        name: e.name.clone(),
        kind: e.kind,
        katcp: format!("{}:{}", e.node, e.katcp_port),
        katcp_error: None,
        metrics_error: None,
        device_status: None,
        synchronised: None,
        counters: BTreeMap::new(),
        rates: BTreeMap::new(),
    };
    let start = Instant::now();
    let prom = resolve(&e.node, e.prometheus_port);
    let first = prom
        .clone()
        .and_then(|a| scrape::scrape(a, timeout).map_err(|err| err.to_string()));
    std::thread::sleep(interval.saturating_sub(start.elapsed()));
    let t0 = Instant::now();
    match prom.and_then(|a| scrape::scrape(a, timeout).map_err(|err| err.to_string())) {
        Ok(second) => {
            st.counters = counters(&second);
            if let Ok(first) = first {
                let before = counters(&first);
                let dt = (interval + t0.elapsed() / 2).as_secs_f64();
                for (k, v) in &st.counters {
                    let was = before.get(k).copied().unwrap_or(0.0);
                    st.rates.insert(k.clone(), (v - was).max(0.0) / dt);
                }
            }
        }
        Err(err) => st.metrics_error = Some(err),
    }
    let addr = resolve(&e.node, e.katcp_port);
    match addr.and_then(|a| Client::connect(a, timeout).map_err(|err| err.to_string())) {
        Ok(mut c) => {
            st.device_status = sensor(&mut c, "device-status").map(|(v, _)| v);
            st.synchronised = match e.kind {
                EngineKind::Dsim => None,
                EngineKind::Fengine => {
                    let a = sensor(&mut c, "input0.rx.timestamp");
                    let b = sensor(&mut c, "input1.rx.timestamp");
                    a.zip(b).map(|(a, b)| a.1 && b.1)
                }
                EngineKind::Xbengine => {
                    sensor(&mut c, &format!("{corrprod}.rx.synchronised")).map(|(v, _)| v == "1")
                }
            };
            if st.device_status.is_none() && e.kind != EngineKind::Dsim {
                st.katcp_error = Some("no device-status sensor".into());
            }
        }
        Err(err) => st.katcp_error = Some(err),
    }
    st
}

/// Read every engine of `plan` at once: counters `interval` apart, each connection within
/// `timeout`.
pub fn status(plan: &Plan, interval: Duration, timeout: Duration) -> Vec<EngineStatus> {
    let corrprod = |band: &str| {
        plan.bands
            .iter()
            .find(|b| b.name == band)
            .map_or(String::new(), |b| b.corrprod.clone())
    };
    std::thread::scope(|s| {
        let readers: Vec<_> = plan
            .engines
            .iter()
            .map(|e| {
                let cp = corrprod(&e.band);
                s.spawn(move || read(e, &cp, interval, timeout))
            })
            .collect();
        readers
            .into_iter()
            .zip(&plan.engines)
            .map(|(r, e)| {
                r.join().unwrap_or_else(|_| EngineStatus {
                    name: e.name.clone(),
                    kind: e.kind,
                    katcp: format!("{}:{}", e.node, e.katcp_port),
                    katcp_error: Some("reader failed".into()),
                    metrics_error: None,
                    device_status: None,
                    synchronised: None,
                    counters: BTreeMap::new(),
                    rates: BTreeMap::new(),
                })
            })
            .collect()
    })
}

/// The rows as a table for a person: status, sync, rates in and out (heaps/s and Gb/s), and
/// losses by cause since the engine started.
pub fn table(rows: &[EngineStatus]) -> Vec<Vec<String>> {
    let mut out = vec![[
        "ENGINE",
        "KATCP",
        "STATUS",
        "SYNC",
        "IN heaps/s",
        "IN Gb/s",
        "OUT heaps/s",
        "OUT Gb/s",
        "LOSSES",
    ]
    .map(String::from)
    .to_vec()];
    for r in rows {
        let unreachable = match (&r.katcp_error, &r.metrics_error) {
            (Some(k), Some(m)) => Some(format!("unreachable: katcp: {k}; metrics: {m}")),
            _ => None,
        };
        if let Some(why) = unreachable {
            out.push(vec![r.name.clone(), r.katcp.clone(), why]);
            continue;
        }
        let rate = |names: &[&str], scale: f64| {
            if !names.iter().any(|n| r.rates.contains_key(*n)) {
                "-".to_string()
            } else {
                format!("{:.3}", EngineStatus::sum(&r.rates, names) * scale)
            }
        };
        let losses = r.losses();
        let mut lost = if losses.is_empty() {
            "none".to_string()
        } else {
            losses
                .iter()
                .map(|(c, v)| format!("{c}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        if let Some(m) = &r.metrics_error {
            lost = format!("metrics: {m}");
        }
        out.push(vec![
            r.name.clone(),
            r.katcp.clone(),
            r.device_status.clone().unwrap_or_else(|| {
                r.katcp_error
                    .clone()
                    .map_or("-".into(), |e| format!("katcp: {e}"))
            }),
            r.synchronised
                .map_or("-".into(), |s| if s { "yes" } else { "no" }.into()),
            rate(&IN_HEAPS, 1.0),
            rate(&IN_BYTES, 8e-9),
            rate(&OUT_HEAPS, 1.0),
            rate(&OUT_BYTES, 8e-9),
            lost,
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_lose_their_namespace_and_sum_their_labels() {
        let s = scrape::parse(
            "fgpu_input_heaps_total{pol=\"0\"} 10\n\
             fgpu_input_heaps_total{pol=\"1\"} 12\n\
             fgpu_input_missing_heaps_total{pol=\"1\"} 2\n\
             dsim_time_error_s 0.5\n",
        );
        let c = counters(&s);
        assert_eq!(c.get("input_heaps"), Some(&22.0));
        assert_eq!(c.get("input_missing_heaps"), Some(&2.0));
        assert_eq!(c.len(), 2);
        let st = EngineStatus {
            name: "f".into(),
            kind: EngineKind::Fengine,
            katcp: String::new(),
            katcp_error: None,
            metrics_error: None,
            device_status: None,
            synchronised: None,
            counters: c,
            rates: BTreeMap::new(),
        };
        assert_eq!(st.heaps_in(), 22.0);
        assert_eq!(st.losses(), [("missing", 2.0)]);
    }

    #[test]
    fn an_unreachable_engine_is_a_row() {
        // A port nobody listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let plan_engine = |kind| EnginePlan {
            name: "l-f-m000".into(),
            kind,
            band: "l".into(),
            node: "127.0.0.1".into(),
            numa: 0,
            nic: "lo".into(),
            nic_address: "127.0.0.1".into(),
            gpu: None,
            cores: vec![],
            katcp_port: port,
            prometheus_port: port,
            inputs: vec![],
            outputs: vec![],
            feng_id: None,
            channels: None,
            rx_gbps: 0.0,
            tx_gbps: 0.0,
            h2d_gbytes_per_s: 0.0,
            d2h_gbytes_per_s: 0.0,
            memory_gib: 0,
            rdma_resource: None,
            env: BTreeMap::new(),
            argv: vec![],
        };
        let st = read(
            &plan_engine(EngineKind::Fengine),
            "bl",
            Duration::ZERO,
            Duration::from_millis(500),
        );
        assert!(st.katcp_error.is_some() && st.metrics_error.is_some());
        let t = table(&[st]);
        assert!(t[1][2].starts_with("unreachable"), "{:?}", t[1]);
    }
}
