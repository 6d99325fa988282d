//! The XB-engine's `--frb-beam` outputs end to end (issue 17), in-process over loopback,
//! against spead2 and numpy (`tests/reference/frb_peer.py`): spead2 plays every F-engine
//! (int8, one heap withheld), aiokatcp sets complex dish weights with `?frb-weights` (one per
//! dish, one per input, a range of channels' own and a channel's own), spead2
//! receives the FRB heaps, and numpy's **direct** beamforming (seed 004 eq. 2–3 with weights,
//! both polarisations, complex128, no FFT) of the very data sent is the reference: by the main
//! theorem the engine's FFT-and-resample intensities must equal it, for a partly filled grid,
//! a Cartesian beam grid and arbitrary (θ, θ′), at T_ds 1, 3 and 40. A second run puts a point
//! source in the sky and finds its beam brightest; a third re-points a list mid-stream with
//! `?frb-beams` (tracking beams) and checks each heap against the positions in force.

mod common;

use std::path::{Path, PathBuf};

use cbf::dsp::frb::DishGrid;
use cbf::dsp::frb_resample::FrbBeams;
use cbf::engine::control::ControlConfig;
use cbf::engine::recv::{RecvTransport, SourceConfig};
use cbf::engine::Shutdown;
use cbf::fengine::BackendKind;
use cbf::xbengine::frb_output::FrbBeamOutput;
use cbf::xbengine::{Engine, XbengineConfig, XbengineReport};
use serde_json::{json, Value};

const ANTS: usize = 7;
/// The 3×4 grid, partly filled: antenna a sits at DISHES[a].
const GRID: (usize, usize) = (3, 4);
const DISHES: [(usize, usize); ANTS] = [(2, 1), (0, 0), (1, 1), (0, 3), (2, 3), (0, 2), (2, 0)];
const CHANNELS: usize = 16;
const CPS: usize = 4;
const C0: u64 = 4;
/// 30 spectra per heap, 4 batches per chunk: 120 spectra, divisible by T_ds 1, 3 and 40.
const SPH: usize = 30;
const BATCHES_PER_CHUNK: usize = 4;

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("cbf-xbengine-frb-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The dish map file, written as an operator would.
fn dish_map(dir: &Path) -> String {
    let p = dir.join("dishes.txt");
    let mut text = String::from("# m n, one line per antenna\n");
    for (m, n) in DISHES {
        text += &format!("{m} {n}\n");
    }
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A beams file of arbitrary (θ, θ′), some outside one period of the field.
fn beams_file(dir: &Path, name: &str, beams: &[(f64, f64)]) -> String {
    let p = dir.join(name);
    let text: String = beams.iter().map(|(a, b)| format!("{a} {b}\n")).collect();
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn frb(spec: &str) -> FrbBeamOutput {
    FrbBeamOutput::parse(spec).unwrap()
}

fn config(in_port: u16, frb_beams: Vec<FrbBeamOutput>) -> XbengineConfig {
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
        sample_bits: 8,
        heaps_per_fengine_per_chunk: BATCHES_PER_CHUNK,
        recv_reorder_tol: 1,
        send_enabled: true,
        adc_sample_rate: 512e6,
        sync_time: 0.0,
        corrprods: vec![],
        beams: vec![],
        frb_beams,
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

/// Run the engine and the peer with `outputs` (JSON per output: port, weights, t_ds, beams)
/// and `extra` peer settings; the peer's verdict, the engine's report and its Prometheus
/// page once the peer is done (empty without `--prometheus-port`).
fn run(
    cfg: XbengineConfig,
    in_port: u16,
    outputs: Value,
    requests: Value,
    extra: Value,
) -> (Value, XbengineReport, String) {
    let shutdown = Shutdown::manual();
    let engine = Engine::new(cfg, shutdown.clone()).unwrap();
    let katcp_port = engine.katcp_addr().port();
    let prometheus = engine.prometheus_addr();
    let handle = std::thread::spawn(move || engine.run());
    let mut peer = json!({
        "ants": ANTS, "channels": CHANNELS, "cps": CPS, "c0": C0, "sph": SPH,
        "sbs": 2 * CHANNELS, "grid": [GRID.0, GRID.1], "dishes": DISHES,
        // Batches 8–15 (chunks 2 and 3) are checked; three more chunks push them out.
        "first_batch": 8, "batches": 8, "extra": 3 * BATCHES_PER_CHUNK,
        "batches_per_chunk": BATCHES_PER_CHUNK,
        "in_port": in_port, "katcp_port": katcp_port, "packet": 1024, "rate": 50e6,
        "outputs": outputs, "requests": requests, "expect_heaps": 3,
    });
    for (k, v) in extra.as_object().unwrap() {
        peer[k] = v.clone();
    }
    let out = common::run_reference("frb_peer.py", &[&peer.to_string()]);
    let mut metrics = String::new();
    if let Some(addr) = prometheus {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        s.read_to_string(&mut metrics).unwrap();
    }
    shutdown.request();
    let report = handle.join().unwrap().unwrap();
    let verdict: Value =
        serde_json::from_str(out.last().expect("no output from frb_peer.py")).unwrap();
    eprintln!("peer: {verdict}\nengine: {report:?}");
    (verdict, report, metrics)
}

/// Python-style complex weights for `?frb-weights`, `n` of them.
fn weights(seed: u64, n: usize) -> Vec<String> {
    (0..n as u64)
        .map(|a| {
            let u = |k: u64| ((seed * 31 + a * 7 + k * 13) % 17) as f64 / 17.0 - 0.5;
            format!("{}{:+}j", 0.5 + u(1), u(2))
        })
        .collect()
}

/// The peer's weight table (channel, dish, pol) for per-input `inputs` (2 per dish) in every
/// channel but those of `own` (local channel, its per-input weights).
fn table(inputs: &[String], own: &[(usize, Vec<String>)]) -> Value {
    let per_channel = |c: usize| -> Value {
        let w = own.iter().find(|o| o.0 == c).map_or(inputs, |o| &o.1[..]);
        json!(w.chunks(2).collect::<Vec<_>>())
    };
    json!((0..CPS).map(per_channel).collect::<Vec<_>>())
}

#[test]
fn resampled_beams_equal_direct_beamforming() {
    let dir = scratch_dir();
    let map = dish_map(&dir);
    let list40 = [
        (0.3, -1.7),
        (2.9, 0.0),
        (-1.25, 3.6),
        (7.1, -5.3),
        (0.0, 0.0),
    ];
    let list1 = [(1.0, 1.0), (-0.6, 2.2), (1.45, -0.35), (-2.0, -1.99)];
    let ports = [
        common::free_udp_port(),
        common::free_udp_port(),
        common::free_udp_port(),
    ];
    let specs = [
        format!(
            "name=fa,dst=127.0.0.1:{},grid=3x4,dish_map={map},t_ds=3,beams=5x6",
            ports[0]
        ),
        format!(
            "name=fb,dst=127.0.0.1:{},grid=3×4,dish_map={map},t_ds=40,beams={}",
            ports[1],
            beams_file(&dir, "b40.txt", &list40)
        ),
        format!(
            "name=fc,dst=127.0.0.1:{},grid=3x4,dish_map={map},t_ds=1,beams={},scale=0.002",
            ports[2],
            beams_file(&dir, "b1.txt", &list1)
        ),
    ];
    let outputs: Vec<FrbBeamOutput> = specs.iter().map(|s| frb(s)).collect();
    assert_eq!(outputs[0].grid, DishGrid::new(3, 4, &DISHES).unwrap());
    assert!(matches!(outputs[0].beams, FrbBeams::Product { .. }));
    let in_port = common::free_udp_port();
    // fa: one weight per dish (both pols, every channel); fb: one per input; fc: one per
    // dish, then channels C0 + 1 and C0 + 2 (the range C0+1:C0+3) their own per input, and
    // C0 + 3 its own.
    let request = |name: &str, channels: Option<String>, w: &[String]| {
        let mut r = vec![json!("frb-weights"), json!(name)];
        r.extend(channels.map(|c| json!(format!("channel={c}"))));
        r.extend(w.iter().map(|w| json!(w)));
        json!(r)
    };
    let (w1, w3) = (weights(11, 2 * ANTS), weights(13, 2 * ANTS));
    let own: Vec<(usize, Vec<String>)> = vec![(1, w1.clone()), (2, w1.clone()), (3, w3.clone())];
    let mut requests = vec![
        request("fa", None, &weights(0, ANTS)),
        request("fb", None, &weights(1, 2 * ANTS)),
        request("fc", None, &weights(2, ANTS)),
        request("fc", Some(format!("{}:{}", C0 + 1, C0 + 3)), &w1),
        request("fc", Some(format!("{}", C0 + 3)), &w3),
    ];
    // Refused: one weight too few, a bad number, a stream that is no FRB output.
    requests.push(json!(["frb-weights", "fa", "1", "1"]));
    let mut bad = vec![json!("frb-weights"), json!("fb")];
    bad.extend((0..ANTS).map(|i| json!(if i == 3 { "1+xj" } else { "1" })));
    requests.push(json!(bad));
    requests.push(json!(["frb-weights", "nope", "1"]));
    let both_pols =
        |w: Vec<String>| -> Vec<String> { w.iter().flat_map(|v| [v.clone(), v.clone()]).collect() };
    let peer_outputs = json!([
        {"port": ports[0], "weights": table(&both_pols(weights(0, ANTS)), &[]), "t_ds": 3, "grid": [5, 6]},
        {"port": ports[1], "weights": table(&weights(1, 2 * ANTS), &[]), "t_ds": 40, "list": list40},
        {"port": ports[2], "weights": table(&both_pols(weights(2, ANTS)), &own), "t_ds": 1, "list": list1, "scale": 0.002},
    ]);
    let (v, report, _) = run(
        config(in_port, outputs),
        in_port,
        peer_outputs,
        json!(requests),
        // Antenna 3 misses batch 13 (chunk 3); the descriptor (every 5 s) is awaited once.
        json!({"seed": 17, "mode": "random", "lim": 50, "missing": [[5, 3]], "descriptor": true}),
    );
    let replies = v["katcp"].as_array().unwrap();
    for r in &replies[..5] {
        assert_eq!(r[0], "ok", "{r}");
    }
    for r in &replies[5..] {
        assert_eq!(r[0], "fail", "{r}");
    }
    assert!(
        replies[5][1].as_str().unwrap().contains("expected 7 or 14"),
        "{}",
        replies[5]
    );
    let beams = [30, 5, 4];
    let slow = [40, 3, 120];
    for (i, o) in v["outputs"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            o["checked"], 2,
            "output {i}: both checked chunks arrive: {o}"
        );
        assert!(o["max_err"].as_f64().unwrap() < 2e-3, "output {i}: {o}");
        assert_eq!(o["bad_ants"], 0, "output {i}: {o}");
        assert_eq!(o["frequency_ok"], true, "output {i}");
        assert_eq!(
            o["descriptor"],
            json!([[CPS, slow[i], beams[i]], "float16"]),
            "output {i}"
        );
        let (name, t) = &report.frb[i];
        assert_eq!(name, ["fa", "fb", "fc"][i]);
        assert!(t.heaps >= 2 && t.clipped == 0, "{t:?}");
        // Every chunk's heap goes out, the last one (collected a chunk late) at the end.
        assert_eq!(t.heaps, report.input.chunks, "{t:?} {:?}", report.input);
        assert_eq!(t.bytes, t.heaps * (CPS * slow[i] * beams[i] * 2) as u64);
    }
    assert!(report.input.missing >= 1);
}

#[test]
fn a_point_source_peaks_in_its_beam() {
    let dir = scratch_dir();
    let map = dish_map(&dir);
    let port = common::free_udp_port();
    // beams=6x8 on the 3×4 grid: θ_i = 3(i − 3)/6, θ′_j = 4(j − 4)/8; the source sits at
    // beam i = 4, j = 1: (0.5, −1.5).
    let spec = format!("name=fp,dst=127.0.0.1:{port},grid=3x4,dish_map={map},t_ds=3,beams=6x8");
    let in_port = common::free_udp_port();
    let ones: Vec<String> = vec!["1".into(); 2 * ANTS];
    let mut cfg = config(in_port, vec![frb(&spec)]);
    cfg.control.prometheus_port = Some(0);
    let (v, report, metrics) = run(
        cfg,
        in_port,
        json!([{"port": port, "weights": table(&ones, &[]), "t_ds": 3, "grid": [6, 8]}]),
        json!([]),
        json!({"seed": 3, "mode": "point", "amplitude": 20.0, "source": [0.5, -1.5],
               "source_beam": 4 * 8 + 1, "missing": [], "descriptor": false}),
    );
    let o = &v["outputs"][0];
    assert_eq!(o["checked"], 2, "{o}");
    assert_eq!(o["peaks"], 2 * CPS * 40, "{o}");
    assert_eq!(o["wrong_peak"], 0, "{o}");
    assert!(o["max_err"].as_f64().unwrap() < 2e-3, "{o}");
    let heaps = report.frb[0].1.heaps;
    assert!(heaps >= 2);
    // Counted per output as the beams are (the page was read after the checked heaps went out).
    for name in ["heaps", "bytes", "samples", "clipped_samples"] {
        let family = format!("xbgpu_output_frb_{name}_total{{stream=\"fp\"}}");
        assert!(metrics.contains(&family), "{family} missing:\n{metrics}");
    }
    let sent: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("xbgpu_output_frb_heaps_total{stream=\"fp\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!((2..=heaps).contains(&sent), "{sent} of {heaps}");
}

/// Tracking beams (`?frb-beams`): a list is re-pointed mid-stream through aiokatcp. Every heap
/// from the chunk that `{name}.beams` names on equals numpy's direct beamforming at the new
/// positions, every earlier one at the old; the sensor lists the new positions and its
/// timestamp is no later than `steady-state-timestamp` after the request. A grid output beside
/// it is unaffected; refusals (a count other than the list's, a grid output, a malformed pair,
/// a position out of range, an unknown stream) fail naming the fault and change nothing.
#[test]
fn repointed_beams_hold_from_the_chunk_the_sensor_names() {
    let dir = scratch_dir();
    let map = dish_map(&dir);
    let list = [
        (0.3, -1.7),
        (2.9, 0.0),
        (-1.25, 3.6),
        (7.1, -5.3),
        (0.0, 0.0),
    ];
    // On the half-integer grid, a hair off it, beyond one period, and anywhere.
    let list2 = [
        (1.5, -2.0),
        (0.5 + 1e-9, 1.0),
        (-7.3, 9.1),
        (0.1, 0.2),
        (2.75, -0.4),
    ];
    let ports = [common::free_udp_port(), common::free_udp_port()];
    let specs = [
        format!(
            "name=fr,dst=127.0.0.1:{},grid=3x4,dish_map={map},t_ds=3,beams={}",
            ports[0],
            beams_file(&dir, "track.txt", &list)
        ),
        format!(
            "name=fg,dst=127.0.0.1:{},grid=3x4,dish_map={map},t_ds=3,beams=5x6",
            ports[1]
        ),
    ];
    let in_port = common::free_udp_port();
    let pair = |(a, b): (f64, f64)| json!(format!("{a}:{b}"));
    let mut set = vec![json!("frb-beams"), json!("fr")];
    set.extend(list2.iter().map(|&p| pair(p)));
    let mut five = vec![json!("frb-beams"), json!("fr")];
    five.extend(list.iter().map(|&p| pair(p)));
    let mut requests = vec![
        json!(["frb-beams", "fr"]),
        json!(["frb-beams", "fr", "1:1", "2:2"]),
        json!(["frb-beams", "fg", "0:0"]),
    ];
    for bad in ["1,1", "2e6:0", "nan:1"] {
        let mut r = five.clone();
        r[3] = json!(bad);
        requests.push(json!(r));
    }
    requests.push(json!(["frb-beams", "nope", "0:0"]));
    let ones: Vec<String> = vec!["1".into(); 2 * ANTS];
    let (v, report, _) = run(
        config(in_port, specs.iter().map(|s| frb(s)).collect()),
        in_port,
        json!([
            {"port": ports[0], "weights": table(&ones, &[]), "t_ds": 3, "list": list,
             "name": "fr", "list2": list2},
            {"port": ports[1], "weights": table(&ones, &[]), "t_ds": 3, "grid": [5, 6]},
        ]),
        json!(requests),
        // Six chunks checked, the re-point after the third is sent and a heap of "fr" has come
        // back (the peer polls fr.tx.next-timestamp), so at least one heap precedes it.
        json!({"seed": 23, "mode": "random", "lim": 50, "missing": [], "descriptor": false,
               "batches": 6 * BATCHES_PER_CHUNK, "split": 3 * BATCHES_PER_CHUNK,
               "requests2": [set], "expect_heaps": 6}),
    );
    let replies = v["katcp"].as_array().unwrap();
    let read: Vec<String> = list.iter().map(|(a, b)| format!("{a}:{b}")).collect();
    let read_back: Vec<(f64, f64)> = replies[0].as_array().unwrap()[1..]
        .iter()
        .map(|p| {
            let (a, b) = p.as_str().unwrap().split_once(':').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    assert_eq!(replies[0][0], "ok", "{}", replies[0]);
    assert_eq!(read_back, list, "{read:?}");
    let fails = [
        "expected 5, received 2",
        "fg forms a grid of beams",
        "beam 1: \"1,1\" is not θ:θ′",
        "beam 1: \"2e6:0\"",
        "beam 1: \"nan:1\"",
        "no FRB beam output named \"nope\"",
    ];
    for (r, says) in replies[1..7].iter().zip(fails) {
        assert_eq!(r[0], "fail", "{r}");
        assert!(
            r[1].as_str().unwrap().contains(says),
            "{r} should say {says}"
        );
    }
    assert_eq!(replies[7], json!(["ok"]), "the re-point");
    let steady = v["steady"].as_u64().unwrap();
    let o = &v["outputs"][0];
    assert_eq!(o["checked"], 6, "{o}");
    assert_eq!(o["sensor_positions_ok"], true, "{o}");
    let effective = o["effective"].as_u64().unwrap();
    assert!(
        effective > 0 && effective <= steady,
        "{effective} vs steady {steady}"
    );
    assert!(
        o["before"].as_u64().unwrap() >= 1 && o["after"].as_u64().unwrap() >= 1,
        "heaps on both sides of the re-point: {o}"
    );
    assert!(o["max_err"].as_f64().unwrap() < 2e-3, "{o}");
    let g = &v["outputs"][1];
    assert_eq!(g["checked"], 6, "{g}");
    assert!(g["max_err"].as_f64().unwrap() < 2e-3, "{g}");
    assert_eq!(report.frb.len(), 2);
}
