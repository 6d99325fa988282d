//! The XB-engine end to end, in-process over loopback, against spead2 and numpy
//! (`tests/reference/xb_peer.py`): spead2 plays every F-engine with random data (full scale
//! included, one heap withheld), aiokatcp steers the beams before and during the run, spead2
//! receives the X and beam heaps, and numpy's correlation and beam sums of the very data sent
//! are the reference: X heaps exact (flagged baselines exactly where predicted), beams within
//! 1 LSB with dither off, beam_ants exact, a steering change in force from the
//! steady-state timestamp the engine reported.

mod common;

use std::net::SocketAddrV4;
use std::time::Duration;

use cbf::engine::control::ControlConfig;
use cbf::engine::recv::{RecvTransport, SourceConfig};
use cbf::engine::Shutdown;
use cbf::fengine::BackendKind;
use cbf::xbengine::output::{BeamOutput, CorrprodOutput};
use cbf::xbengine::{Engine, XbengineConfig};
use serde_json::{json, Value};

const ANTS: usize = 4;
const CHANNELS: usize = 256;
const CPS: usize = 64;
const C0: u64 = 64;
const SPH: usize = 16;
const BATCHES_PER_CHUNK: usize = 4;
const THRESHOLD: u64 = 3;
const ADC: f64 = 512e6;

fn local(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new([127, 0, 0, 1].into(), port)
}

fn config(in_port: u16, x_port: u16, beam_ports: [u16; 2], bits: u32) -> XbengineConfig {
    XbengineConfig {
        source: SourceConfig {
            src: format!("127.0.0.1:{in_port}"),
            interface: None,
            buffer: 32 << 20,
            threads: 1,
            transport: RecvTransport::Udp,
            dpdk: None,
            comp_vectors: vec![],
            ibv_mprq: Default::default(),
            busy_poll: None,
            numa_node: None,
        },
        array_size: ANTS,
        channels: CHANNELS,
        channels_per_substream: CPS,
        samples_between_spectra: 2 * CHANNELS as u64,
        channel_offset_value: C0,
        bandwidth: None,
        jones_per_batch: CHANNELS * SPH,
        sample_bits: bits,
        heaps_per_fengine_per_chunk: BATCHES_PER_CHUNK,
        recv_reorder_tol: 1,
        send_enabled: true,
        adc_sample_rate: ADC,
        sync_time: 0.0,
        corrprods: vec![CorrprodOutput {
            name: "bl".into(),
            dst: local(x_port),
            heap_accumulation_threshold: THRESHOLD,
        }],
        beams: vec![
            BeamOutput {
                name: "b0".into(),
                dst: local(beam_ports[0]),
                pol: 0,
                dither: false,
            },
            BeamOutput {
                name: "b1".into(),
                dst: local(beam_ports[1]),
                pol: 1,
                dither: false,
            },
        ],
        frb_beams: vec![],
        backend: BackendKind::Cpu,
        gpu_device: 0,
        cpu_threads: 2,
        send_rate_factor: 0.0,
        send_packet_payload: 8192,
        send_interfaces: vec![],
        send_ttl: 1,
        send_buffer: 4 << 20,
        send_transport: cbf::engine::send::SendTransport::Udp,
        dither_seed: 7,
        duration: None,
        control: ControlConfig {
            host: [127, 0, 0, 1].into(),
            katcp_port: 0,
            prometheus_port: None,
        },
        affinity: Default::default(),
    }
}

/// Steering as katcp requests (for the engine) and as numbers (for numpy).
fn steering(weights: [f64; ANTS], delays: [(f64, f64); ANTS], gain: f64) -> Value {
    json!({"weights": weights, "delays": delays, "gain": gain})
}

fn requests(beam: &str, s: &Value) -> Vec<Value> {
    let mut w = vec![json!("beam-weights"), json!(beam)];
    w.extend(
        s["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| json!(v.to_string())),
    );
    let mut d = vec![json!("beam-delays"), json!(beam)];
    d.extend(s["delays"].as_array().unwrap().iter().map(|p| {
        json!(format!(
            "{}:{}",
            p[0].as_f64().unwrap(),
            p[1].as_f64().unwrap()
        ))
    }));
    let g = vec![
        json!("beam-quant-gains"),
        json!(beam),
        json!(s["gain"].as_f64().unwrap().to_string()),
    ];
    vec![json!(w), json!(d), json!(g)]
}

/// Run the engine (receiving through `transport`) and the peer; the peer's verdicts and the
/// engine's report.
fn run(bits: u32, transport: RecvTransport) -> (Value, cbf::xbengine::XbengineReport) {
    let (in_port, x_port) = (common::free_udp_port(), common::free_udp_port());
    let beam_ports = [common::free_udp_port(), common::free_udp_port()];
    let shutdown = Shutdown::manual();
    let mut cfg = config(in_port, x_port, beam_ports, bits);
    cfg.source.transport = transport;
    let engine = Engine::new(cfg, shutdown.clone()).unwrap();
    let katcp_port = engine.katcp_addr().port();
    let handle = std::thread::spawn(move || engine.run());
    // b0 looks at pol 0 with uneven weights and delays up to 0.2 µs (1.3 rad per channel at
    // 1 MHz spacing); b1 at pol 1. During the run b0's weights and b1's delays change.
    let s0 = steering(
        [1.0, 0.5, -1.0, 0.25],
        [(0.0, 0.0), (2e-7, 0.3), (-1.5e-7, -1.0), (5e-8, 2.0)],
        0.5,
    );
    let s0b = steering(
        [0.25, 1.0, 0.5, -0.5],
        [(0.0, 0.0), (2e-7, 0.3), (-1.5e-7, -1.0), (5e-8, 2.0)],
        0.5,
    );
    let s1 = steering([1.0; ANTS], [(0.0, 0.0); ANTS], 0.125);
    let s1b = steering(
        [1.0; ANTS],
        [(1e-7, 0.0), (0.0, 1.0), (3e-8, 0.0), (0.0, -2.0)],
        0.125,
    );
    let mut requests1 = requests("b0", &s0);
    requests1.extend(requests("b1", &s1));
    let mut requests2 = vec![requests("b0", &s0b)[0].clone()];
    requests2.push(requests("b1", &s1b)[1].clone());
    let cfg = json!({
        "seed": 11 + bits,
        "ants": ANTS, "channels": CHANNELS, "cps": CPS, "c0": C0, "sph": SPH,
        "sbs": 2 * CHANNELS, "bits": bits, "bandwidth": ADC / 2.0,
        // Batches 6–17 checked: the first chunk (batches 4–7) is partial, dumps are
        // 6–8 (crossing the chunk boundary at 8), 9–11, 12–14, 15–17.
        "first_batch": 6, "batches": 12, "extra": 3 * BATCHES_PER_CHUNK,
        "threshold": THRESHOLD,
        // The steering changes after batches 6–13 went out: chunk 1 (batches 4–7) has left
        // the window by then, so the change lands inside the run.
        "split": 8,
        // Antenna 2 misses relative batch 4 (absolute 10: the dump of batches 9–11).
        "missing": [[4, 2]],
        "in_port": in_port, "x_port": x_port, "katcp_port": katcp_port,
        "packet": 1024, "rate": 50e6,
        "beams": [
            {"pol": 0, "port": beam_ports[0], "steering1": s0, "steering2": s0b},
            {"pol": 1, "port": beam_ports[1], "steering1": s1, "steering2": s1b},
        ],
        "requests1": requests1, "requests2": requests2,
        "expect_dumps": 4, "expect_beam_heaps": 12,
    });
    let out = common::run_reference("xb_peer.py", &[&cfg.to_string()]);
    shutdown.request();
    let report = handle.join().unwrap().unwrap();
    let verdict: Value =
        serde_json::from_str(out.last().expect("no output from xb_peer.py")).unwrap();
    (verdict, report)
}

fn check(v: &Value, report: &cbf::xbengine::XbengineReport) {
    eprintln!("peer: {v}\nengine: {report:?}");
    for r in v["katcp"].as_array().unwrap() {
        assert_eq!(r[0], "ok", "katcp: {r}");
    }
    let dumps = v["x"]["dumps"].as_array().unwrap();
    assert_eq!(dumps.len(), 4, "{v}");
    for (i, d) in dumps.iter().enumerate() {
        assert_eq!(d["received"], true, "dump {i} not received: {d}");
        assert_eq!(d["mismatches"], 0, "dump {i}: {d}");
        assert_eq!(d["frequency"], C0, "dump {i}");
        // Antenna 2's four baselines flagged in dump 1 only.
        let want_flagged = if i == 1 { 4 } else { 0 };
        assert_eq!(d["flagged_baselines"], want_flagged, "dump {i}: {d}");
    }
    assert_eq!(
        v["x"]["descriptor"],
        json!([[CPS, ANTS * (ANTS + 1) / 2 * 4, 2], "int32"]),
        "xeng_raw as described"
    );
    for (b, pb) in v["beams"].as_array().unwrap().iter().enumerate() {
        assert!(pb["heaps"].as_u64().unwrap() >= 12, "beam {b}: {pb}");
        assert!(pb["max_err"].as_f64().unwrap() <= 1.0, "beam {b}: {pb}");
        assert_eq!(pb["bad_ants"], 0, "beam {b}: beam_ants {pb}");
        assert_eq!(pb["neither"], 0, "beam {b}: {pb}");
        assert_eq!(pb["frequency_ok"], true, "beam {b}");
        assert!(pb["after_steady"].as_u64().unwrap() > 0, "beam {b}: {pb}");
        assert_eq!(pb["bad_after_steady"], 0, "beam {b}: {pb}");
    }
    let steady = v["steady"][1].as_u64().unwrap();
    assert!(
        steady > 6 * (SPH * 2 * CHANNELS) as u64,
        "steady-state timestamp {steady}"
    );
    let (name, x) = &report.x[0];
    assert_eq!(name, "bl");
    assert!(x.incomplete_accs >= 1, "{x:?}");
    assert!(report.input.missing >= 1);
    assert_eq!(report.rx.rejected_heaps[..3], [0, 0, 0], "{:?}", report.rx);
}

#[test]
fn x_and_beams_match_numpy_8bit() {
    let (v, report) = run(8, RecvTransport::Udp);
    check(&v, &report);
}

#[test]
fn x_and_beams_match_numpy_4bit() {
    let (v, report) = run(4, RecvTransport::Udp);
    check(&v, &report);
}

/// The io_uring transport (issue 15) under the same engine and the same checks.
#[test]
fn x_and_beams_match_numpy_through_io_uring() {
    let (v, report) = run(8, RecvTransport::Uring);
    check(&v, &report);
}

#[test]
fn shutdown_stops_an_idle_engine() {
    let p = common::free_udp_port();
    let shutdown = Shutdown::manual();
    let engine = Engine::new(config(p, p, [p, p], 8), shutdown.clone()).unwrap();
    let handle = std::thread::spawn(move || engine.run());
    std::thread::sleep(Duration::from_millis(300));
    shutdown.request();
    let report = handle.join().unwrap().unwrap();
    assert_eq!(report.input.chunks, 0);
}

/// Every request through aiokatcp, good and bad, the sensors katgpucbf's clients read, and
/// the Prometheus names.
#[test]
fn katcp_requests_sensors_and_metrics() {
    let p = common::free_udp_port();
    let mut cfg = config(p, p, [p, p], 8);
    cfg.control.prometheus_port = Some(0);
    let shutdown = Shutdown::manual();
    let engine = Engine::new(cfg, shutdown.clone()).unwrap();
    let katcp = engine.katcp_addr().port().to_string();
    let prom = engine.prometheus_addr().unwrap();
    let handle = std::thread::spawn(move || engine.run());
    let q = |v: &[&str]| serde_json::to_string(v).unwrap();
    let requests = [
        (q(&["capture-start", "bl"]), "ok"),
        (q(&["capture-start", "b0", "123456"]), "ok"),
        (q(&["capture-stop", "b1"]), "ok"),
        (q(&["capture-start", "nope"]), "fail"),
        (q(&["capture-start", "bl", "soon"]), "fail"),
        (q(&["capture-stop"]), "fail"),
        (q(&["beam-weights", "b0", "1", "2", "3", "4"]), "ok"),
        (q(&["beam-weights", "b0", "1", "2"]), "fail"),
        (q(&["beam-weights", "bl", "1", "2", "3", "4"]), "fail"),
        (q(&["beam-weights", "b0", "1", "nan", "3", "4"]), "fail"),
        (
            q(&["beam-delays", "b1", "1e-9:0.5", "0:0", "0:0", "-2e-9:-1"]),
            "ok",
        ),
        (
            q(&["beam-delays", "b1", "1e-9", "0:0", "0:0", "0:0"]),
            "fail",
        ),
        (
            q(&["beam-delays", "b1", "10:0", "0:0", "0:0", "0:0"]),
            "fail",
        ),
        (q(&["beam-quant-gains", "b1", "0.25"]), "ok"),
        (q(&["beam-quant-gains", "b1", "x"]), "fail"),
        (q(&["beam-quant-gains", "b1"]), "fail"),
        (q(&["gain", "b1"]), "invalid"),
        (q(&["sensor-value", "b0.weight"]), "ok"),
        (q(&["sensor-value", "b1.delay"]), "ok"),
        (q(&["sensor-value", "b1.quantiser-gain"]), "ok"),
        (q(&["sensor-value", "bl.chan-range"]), "ok"),
        (q(&["sensor-value", "b0.dither-seed"]), "ok"),
        (q(&["sensor-value", "bl.xeng-clip-cnt"]), "ok"),
        (q(&["sensor-value", "bl.rx.synchronised"]), "ok"),
        (q(&["sensor-value", "bl.tx.next-timestamp"]), "ok"),
        (q(&["sensor-value", "b0.beng-clip-cnt"]), "ok"),
        (q(&["sensor-value", "steady-state-timestamp"]), "ok"),
    ];
    let mut args = vec!["127.0.0.1", katcp.as_str()];
    args.extend(requests.iter().map(|(r, _)| r.as_str()));
    let replies: Vec<Value> = common::run_reference("katcp_client.py", &args)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), requests.len());
    for ((req, want), got) in requests.iter().zip(&replies) {
        assert_eq!(got["status"], *want, "{req}: {got}");
    }
    let value = |i: usize| replies[i]["informs"][0][4].as_str().unwrap().to_string();
    assert_eq!(value(17), "[1.0, 2.0, 3.0, 4.0]");
    assert!(
        value(18).ends_with(", 1e-9, 0.5, 0.0, 0.0, 0.0, 0.0, -2e-9, -1.0)"),
        "{}",
        value(18)
    );
    assert_eq!(value(19), "0.25");
    assert_eq!(value(20), "(64, 127)");
    assert_eq!(value(21), "7");
    let metrics = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(prom).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    // Counters appear once the engine has processed a chunk; their help lines are there from
    // the start.
    for name in [
        "xbgpu_input_heaps",
        "xbgpu_input_missing_heaps",
        "xbgpu_input_too_old_heaps",
        "xbgpu_input_incomplete_heaps",
        "xbgpu_input_bad_feng_id_heaps",
        "xbgpu_input_bad_timestamp_heaps",
        "xbgpu_input_metadata_heaps",
        "xbgpu_output_x_heaps",
        "xbgpu_output_x_visibilities",
        "xbgpu_output_x_clipped_visibilities",
        "xbgpu_output_x_skipped_accs",
        "xbgpu_output_x_incomplete_accs",
        "xbgpu_output_b_heaps",
        "xbgpu_output_b_samples",
        "xbgpu_output_b_clipped_samples",
    ] {
        assert!(
            metrics.contains(&format!("# HELP {name}_total ")),
            "{name} missing:\n{metrics}"
        );
    }
    shutdown.request();
    handle.join().unwrap().unwrap();
}

/// SPEAD-64-48 immediates of one packet, decoded here by hand (independently of cbf's codec):
/// (timestamp, feng_id, heap length, payload offset, payload length).
fn packet_key(p: &[u8]) -> Option<(u64, u64, u64, u64, u64)> {
    if p.len() < 8 || p[0] != 0x53 || p[1] != 4 || p[2] != 2 || p[3] != 6 {
        return None;
    }
    let n = usize::from(u16::from_be_bytes([p[6], p[7]]));
    let mut v = [None; 5];
    for i in 0..n {
        let b = p.get(8 + 8 * i..16 + 8 * i)?;
        let r = u64::from_be_bytes(b.try_into().ok()?);
        if r >> 63 == 0 {
            continue;
        }
        let slot = match (r >> 48) & 0x7fff {
            0x1600 => 0,
            0x4101 => 1,
            0x2 => 2,
            0x3 => 3,
            0x4 => 4,
            _ => continue,
        };
        v[slot] = Some(r & ((1 << 48) - 1));
    }
    Some((v[0]?, v[1]?, v[2]?, v[3]?, v[4]?))
}

/// Dropped, reordered and duplicated F packets (net::fault's injector in a relay between the
/// F-engines and the engine) change only the dumps and beam heaps of the heaps they broke: the
/// numpy reference is computed with exactly the heaps that lost a packet taken as missing, and
/// must still match exactly (X) and within 1 LSB (beams); losses are counted.
#[test]
fn faults_change_only_what_they_touch() {
    use cbf::net::fault::{FaultInjector, Faults};
    use cbf::net::udp::UdpReceiver;
    use cbf::net::{PacketReceiver, Received, RecvBatch};
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let (in_port, x_port) = (common::free_udp_port(), common::free_udp_port());
    let beam_ports = [common::free_udp_port(), common::free_udp_port()];
    let relay_port = common::free_udp_port();
    let shutdown = Shutdown::manual();
    let engine = Engine::new(config(in_port, x_port, beam_ports, 8), shutdown.clone()).unwrap();
    let katcp_port = engine.katcp_addr().port();
    let handle = std::thread::spawn(move || engine.run());
    let faults = Faults {
        drop: 0.02,
        reorder: 0.05,
        duplicate: 0.05,
        ..Faults::default()
    };
    let rx = UdpReceiver::bind(&[local(relay_port)], None, 32 << 20).unwrap();
    let mut relay = FaultInjector::new(rx, faults, 2024, 9200);
    let stop = Arc::new(AtomicBool::new(false));
    let relay_thread = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            let out = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut batch = RecvBatch::new(64, relay.slot_size(9200));
            // Per heap: its length and the distinct payload offsets that got through.
            let mut heaps: BTreeMap<(u64, u64), (u64, BTreeMap<u64, u64>)> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                if let Received::Packets(_) = relay.recv_batch(&mut batch).unwrap() {
                    for p in batch.iter() {
                        if let Some((ts, feng, len, off, plen)) = packet_key(p) {
                            heaps
                                .entry((ts, feng))
                                .or_insert((len, BTreeMap::new()))
                                .1
                                .insert(off, plen);
                        }
                        out.send_to(p, local(in_port)).unwrap();
                    }
                }
            }
            (heaps, relay.counts)
        }
    });
    let s = steering([1.0; ANTS], [(0.0, 0.0); ANTS], 0.25);
    let mut requests1 = requests("b0", &s);
    requests1.extend(requests("b1", &s));
    let (first, batches, extra) = (6u64, 12u64, 3 * BATCHES_PER_CHUNK as u64);
    let heap_step = (SPH * 2 * CHANNELS) as u64;
    let cfg = json!({
        "seed": 5, "ants": ANTS, "channels": CHANNELS, "cps": CPS, "c0": C0, "sph": SPH,
        "sbs": 2 * CHANNELS, "bits": 8, "bandwidth": ADC / 2.0,
        "first_batch": first, "batches": batches, "extra": extra, "split": 8,
        "threshold": THRESHOLD, "missing": [], "missing_from_stdin": true,
        "in_port": relay_port, "x_port": x_port, "katcp_port": katcp_port,
        "packet": 1024, "rate": 50e6,
        "beams": [
            {"pol": 0, "port": beam_ports[0], "steering1": s, "steering2": s},
            {"pol": 1, "port": beam_ports[1], "steering1": s, "steering2": s},
        ],
        "requests1": requests1, "requests2": [],
        "expect_dumps": 3, "expect_beam_heaps": 10,
    });
    let mut peer = Command::new(common::python())
        .arg(common::reference_script("xb_peer.py"))
        .arg(cfg.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(peer.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "sent");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (heaps, counts) = relay_thread.join().unwrap();
    // Heaps of the checked batches that lost a packet (or every packet: absent from the map).
    let mut missing = BTreeSet::new();
    for b in 0..batches {
        for a in 0..ANTS as u64 {
            let whole = heaps
                .get(&((first + b) * heap_step, a))
                .is_some_and(|(len, parts)| parts.values().sum::<u64>() == *len);
            if !whole {
                missing.insert((b, a));
            }
        }
    }
    let list: Vec<[u64; 2]> = missing.iter().map(|&(b, a)| [b, a]).collect();
    writeln!(peer.stdin.take().unwrap(), "{}", json!(list)).unwrap();
    let v: Value = serde_json::from_str(&lines.last().unwrap().unwrap()).unwrap();
    assert!(peer.wait().unwrap().success());
    shutdown.request();
    let report = handle.join().unwrap().unwrap();
    eprintln!("faults {counts:?}, broken heaps {list:?}\npeer {v}\nengine {report:?}");
    assert!(
        counts.dropped > 0 && counts.duplicated > 0 && counts.reordered > 0,
        "{counts:?}"
    );
    assert!(
        !missing.is_empty(),
        "the faults broke no heap of the checked batches"
    );
    for d in v["x"]["dumps"].as_array().unwrap() {
        if d["skipped"] == true {
            assert_eq!(d["received"], false, "{d}");
            continue;
        }
        assert_eq!(d["received"], true, "{d}");
        assert_eq!(d["mismatches"], 0, "{d}");
    }
    for pb in v["beams"].as_array().unwrap() {
        assert!(pb["heaps"].as_u64().unwrap() >= 10, "{pb}");
        assert!(pb["max_err"].as_f64().unwrap() <= 1.0, "{pb}");
        assert_eq!(pb["bad_ants"], 0, "{pb}");
        assert_eq!(pb["neither"], 0, "{pb}");
    }
    // Every duplicate is seen and counted by the receiver; every broken heap is missing.
    assert!(
        report.rx.duplicate_packets >= counts.duplicated.min(1),
        "{:?}",
        report.rx
    );
    assert!(report.input.missing >= missing.len() as u64, "{report:?}");
}
