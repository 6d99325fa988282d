//! `cbf array status`: every engine of a plan read where the plan says it listens — its health
//! sensors over katcp (`?sensor-value`: `device-status`, and whether it is in sync: an
//! XB-engine's `<corrprod>.rx.synchronised`, an F-engine's `input0/1.rx.timestamp` being
//! nominal, which they are while data arrives) and its counters over Prometheus, read twice
//! an interval apart for the rates (katgpucbf's engines keep their counters there, not in
//! sensors: facts §1.8). One row per engine; an engine that cannot be reached is a row that
//! says so. Every connection has a timeout, so a status of any plan takes about the interval
//! plus, at worst, a few timeouts.
//!
//! Without a plan ([`parse_endpoints`]: a bare list of katcp endpoints, each with its
//! Prometheus port or the planner's default offset), an engine's kind comes from its
//! `#version-list katcp-device` (`cbf-fengine-…`, `cbf-xbengine-…`, `cbf-dsim-…`) and an
//! XB-engine's correlation-product name from its `?sensor-list` (the sensor ending in
//! `.rx.synchronised`).
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

/// Most endpoints `--endpoints` takes (each is read by its own thread); the largest example
/// plan has 453 engines.
pub const MAX_ENDPOINTS: usize = 2048;
/// The Prometheus port of an endpoint given without one: its katcp port plus this, as the
/// planner's default bases (`network.katcp_port_base` 7200, `prometheus_port_base` 9200) give.
pub const DEFAULT_PROMETHEUS_OFFSET: u16 = 2000;

/// An engine to read: where its katcp and Prometheus servers listen, and what it is when
/// known beforehand (from a plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub kind: Option<EngineKind>,
    pub host: String,
    pub katcp_port: u16,
    pub prometheus_port: u16,
    /// An XB-engine's correlation-product output (its sync sensor's prefix), when known.
    pub corrprod: Option<String>,
}

impl Target {
    fn of(e: &EnginePlan, corrprod: String) -> Target {
        Target {
            name: e.name.clone(),
            kind: Some(e.kind),
            host: e.node.clone(),
            katcp_port: e.katcp_port,
            prometheus_port: e.prometheus_port,
            corrprod: Some(corrprod),
        }
    }
}

/// `host:katcp[:prometheus],...` (the Prometheus port defaults to the katcp port +
/// [`DEFAULT_PROMETHEUS_OFFSET`]); each endpoint is its own name. `Err` says which is wrong.
pub fn parse_endpoints(text: &str) -> Result<Vec<Target>, String> {
    let mut out: Vec<Target> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if out.len() == MAX_ENDPOINTS {
            return Err(format!("more than {MAX_ENDPOINTS} endpoints"));
        }
        let bad = |why: &str| format!("{item:?}: {why} (host:katcp-port[:prometheus-port])");
        let mut parts = item.split(':');
        let host = parts.next().unwrap_or_default();
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad("no host"));
        }
        let port = |p: Option<&str>| p.and_then(|p| p.parse::<u16>().ok()).filter(|&p| p > 0);
        let katcp_port = port(parts.next()).ok_or_else(|| bad("no katcp port"))?;
        let prometheus_port = match parts.next() {
            Some(p) => port(Some(p)).ok_or_else(|| bad("bad Prometheus port"))?,
            None => katcp_port
                .checked_add(DEFAULT_PROMETHEUS_OFFSET)
                .ok_or_else(|| bad("katcp port + 2000 is past 65535: give the Prometheus port"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many ':'"));
        }
        let name = format!("{host}:{katcp_port}");
        if out.iter().any(|t| t.name == name) {
            return Err(bad("listed twice"));
        }
        out.push(Target {
            name,
            kind: None,
            host: host.to_string(),
            katcp_port,
            prometheus_port,
            corrprod: None,
        });
    }
    Ok(out)
}

/// One engine as read.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    pub name: String,
    /// `None` when neither a plan nor the engine's katcp server said.
    pub kind: Option<EngineKind>,
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

/// The kind an engine's katcp server names in `#version-list katcp-device cbf-<kind>-<version>`.
fn kind_of(c: &mut Client) -> Option<EngineKind> {
    let r = c.request("version-list", &[]).ok()?;
    let device = r
        .informs
        .iter()
        .find(|m| m.args.first().is_some_and(|a| a == "katcp-device"))?;
    let program = device.args.get(1)?;
    [
        ("cbf-fengine-", EngineKind::Fengine),
        ("cbf-xbengine-", EngineKind::Xbengine),
        ("cbf-dsim-", EngineKind::Dsim),
    ]
    .into_iter()
    .find(|(p, _)| program.starts_with(p))
    .map(|(_, k)| k)
}

/// An XB-engine's correlation-product output: the prefix of its `<corrprod>.rx.synchronised`.
fn corrprod_of(c: &mut Client) -> Option<String> {
    let r = c.request("sensor-list", &[]).ok()?;
    r.informs.iter().find_map(|m| {
        m.args
            .first()?
            .strip_suffix(".rx.synchronised")
            .map(String::from)
    })
}

fn unread(t: &Target, katcp_error: Option<String>) -> EngineStatus {
    EngineStatus {
        name: t.name.clone(),
        kind: t.kind,
        katcp: format!("{}:{}", t.host, t.katcp_port),
        katcp_error,
        metrics_error: None,
        device_status: None,
        synchronised: None,
        counters: BTreeMap::new(),
        rates: BTreeMap::new(),
    }
}

/// Read one engine: a first counter reading at `start`, the second and the sensors after
/// `interval`.
fn read(t: &Target, interval: Duration, timeout: Duration) -> EngineStatus {
    let mut st = unread(t, None);
    let start = Instant::now();
    let prom = resolve(&t.host, t.prometheus_port);
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
    let addr = resolve(&t.host, t.katcp_port);
    match addr.and_then(|a| Client::connect(a, timeout).map_err(|err| err.to_string())) {
        Ok(mut c) => {
            st.device_status = sensor(&mut c, "device-status").map(|(v, _)| v);
            if st.kind.is_none() {
                st.kind = kind_of(&mut c);
            }
            st.synchronised = match st.kind {
                None | Some(EngineKind::Dsim) => None,
                Some(EngineKind::Fengine) => {
                    let a = sensor(&mut c, "input0.rx.timestamp");
                    let b = sensor(&mut c, "input1.rx.timestamp");
                    a.zip(b).map(|(a, b)| a.1 && b.1)
                }
                Some(EngineKind::Xbengine) => t
                    .corrprod
                    .clone()
                    .or_else(|| corrprod_of(&mut c))
                    .and_then(|cp| sensor(&mut c, &format!("{cp}.rx.synchronised")))
                    .map(|(v, _)| v == "1"),
            };
            if st.device_status.is_none() && st.kind != Some(EngineKind::Dsim) {
                st.katcp_error = Some("no device-status sensor".into());
            }
        }
        Err(err) => st.katcp_error = Some(err),
    }
    st
}

/// The engines of `plan`, to read.
pub fn targets(plan: &Plan) -> Vec<Target> {
    let corrprod = |band: &str| {
        plan.bands
            .iter()
            .find(|b| b.name == band)
            .map_or(String::new(), |b| b.corrprod.clone())
    };
    plan.engines
        .iter()
        .map(|e| Target::of(e, corrprod(&e.band)))
        .collect()
}

/// Read every engine of `targets` at once: counters `interval` apart, each connection within
/// `timeout`.
pub fn status(targets: &[Target], interval: Duration, timeout: Duration) -> Vec<EngineStatus> {
    std::thread::scope(|s| {
        let readers: Vec<_> = targets
            .iter()
            .map(|t| s.spawn(move || read(t, interval, timeout)))
            .collect();
        readers
            .into_iter()
            .zip(targets)
            .map(|(r, t)| {
                r.join()
                    .unwrap_or_else(|_| unread(t, Some("reader failed".into())))
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
            kind: Some(EngineKind::Fengine),
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
            &Target::of(&plan_engine(EngineKind::Fengine), "bl".into()),
            Duration::ZERO,
            Duration::from_millis(500),
        );
        assert!(st.katcp_error.is_some() && st.metrics_error.is_some());
        let t = table(&[st]);
        assert!(t[1][2].starts_with("unreachable"), "{:?}", t[1]);
    }

    #[test]
    fn endpoints_parse_and_refuse() {
        let t = parse_endpoints("cbf-x00:7201, 10.0.0.1:7200:9300").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].name.as_str(),
                t[0].host.as_str(),
                t[0].katcp_port,
                t[0].prometheus_port
            ),
            ("cbf-x00:7201", "cbf-x00", 7201, 9201)
        );
        assert_eq!((t[1].katcp_port, t[1].prometheus_port), (7200, 9300));
        assert!(t.iter().all(|t| t.kind.is_none() && t.corrprod.is_none()));
        for bad in [
            "",
            "host",
            ":7200",
            "h:0",
            "h:x",
            "h:7200:",
            "h:7200:9200:1",
            "h:65000",
            "h:7200,h:7200",
            "a b:7200",
        ] {
            assert!(parse_endpoints(bad).is_err(), "{bad}");
        }
        let many = vec!["h:1"; MAX_ENDPOINTS + 1].join(",");
        assert!(parse_endpoints(&many).is_err());
    }

    /// A bare endpoint: the kind from the server's `katcp-device` version, an XB-engine's
    /// sync sensor found by its suffix.
    #[test]
    fn an_endpoint_says_what_it_is() {
        use crate::control::katcp::{Handler, Sensors, Server};
        struct Nothing;
        impl Handler for Nothing {
            fn requests(&self) -> Vec<(&'static str, &'static str)> {
                vec![]
            }
            fn handle(&self, _: &str, _: &[String]) -> Option<Result<Vec<String>, String>> {
                None
            }
        }
        let serve = |program: &str, sync: bool| {
            let s = std::sync::Arc::new(Sensors::default());
            s.add("device-status", "", "", "discrete", "ok");
            s.add("bl.rx.synchronised", "", "", "boolean", u8::from(sync));
            Server::new(s, std::sync::Arc::new(Nothing), program)
                .serve("127.0.0.1:0".parse().unwrap())
                .unwrap()
        };
        for (program, sync, kind) in [
            ("cbf-xbengine", true, Some(EngineKind::Xbengine)),
            ("cbf-xbengine", false, Some(EngineKind::Xbengine)),
            ("cbf-dsim", true, Some(EngineKind::Dsim)),
            ("other", true, None),
        ] {
            let addr = serve(program, sync);
            // No Prometheus server on the port after it, which the row says.
            let t = parse_endpoints(&format!("127.0.0.1:{}:{}", addr.port(), 1)).unwrap();
            let st = read(&t[0], Duration::ZERO, Duration::from_millis(500));
            assert_eq!(st.kind, kind, "{program}");
            assert_eq!(st.device_status.as_deref(), Some("ok"));
            let want = (kind == Some(EngineKind::Xbengine)).then_some(sync);
            assert_eq!(st.synchronised, want, "{program}");
            assert!(st.katcp_error.is_none() && st.metrics_error.is_some());
        }
    }
}
