//! The first check: the plan of a small array, run locally by `cbf array run --local`
//! (a dsim per antenna → CPU F-engines → two CPU XB-engines, 8 processes over loopback),
//! delivers a correlated tone end to end, and every engine's counters, read by
//! `cbf array status --local --json`, are consistent.
//!
//! References, independent of the code under test:
//! - the tone's channel from its frequency: channel c is centred on c · fs / (2 · channels)
//!   (a critically sampled real PFB, channel 0 at DC), so 671875 Hz at 2 MS/s and 64 channels
//!   is channel 43 (`tests/data/array-local.toml`), in the second XB-engine's range;
//! - every antenna sees the same tone at the same timestamps, so each cross-correlation has
//!   its peak there with phase 0;
//! - the X heap layout (xeng_raw (channels, baselines × 4, 2) int32 little-endian, baseline
//!   (a1, a2) = a2(a2+1)/2 + a1, missing baselines marked −2^31) from the facts file §X heap;
//! - conservation of heaps: each F heap goes to one XB-engine, so what the F-engines sent and
//!   the XB-engines received differ at most by what is in flight in the XB-engines' windows.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::items::{ItemValue, FREQUENCY_ID, XENG_RAW_ID};
use cbf::spead::recv::{HeapStream, HeapStreamConfig};

const ANTENNAS: usize = 3;
const CHANNELS: usize = 64;
const ADC_SAMPLE_RATE: f64 = 2e6;
const TONE_HZ: f64 = 671875.0;
/// Complete dumps each XB-engine must deliver before the counters are read.
const DUMPS: usize = 4;

fn config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/array-local.toml")
}

/// Σ over complete dumps of each channel's visibilities, per (baseline, product).
#[derive(Default)]
struct Gathered {
    sums: BTreeMap<(usize, usize), Vec<(f64, f64)>>,
    /// Complete dumps per first channel (per XB-engine).
    complete: BTreeMap<u64, usize>,
}

fn baseline(a1: usize, a2: usize) -> usize {
    a2 * (a2 + 1) / 2 + a1
}

/// Receive X heaps on `addr` until `stop`, adding complete dumps to `g`.
fn capture(
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    g: Arc<Mutex<Gathered>>,
) -> std::thread::JoinHandle<()> {
    let mut rx = UdpReceiver::bind(&[addr], None, 8 << 20).unwrap();
    std::thread::spawn(move || {
        let n_bl = ANTENNAS * (ANTENNAS + 1) / 2;
        let mut stream = HeapStream::new(HeapStreamConfig::default());
        let mut batch = RecvBatch::new(64, rx.slot_size(9200));
        let mut heaps = Vec::new();
        while !stop.load(Relaxed) {
            if let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
                for p in batch.iter() {
                    stream.add_packet(p, &mut heaps);
                }
            }
            for h in heaps.drain(..) {
                let (Some(first), Some(ItemValue::Bytes(raw))) = (
                    h.item(FREQUENCY_ID).and_then(|v| v.as_u64()),
                    h.item(XENG_RAW_ID),
                ) else {
                    continue;
                };
                let v: Vec<i32> = raw
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let cps = CHANNELS / 2;
                if v.len() != cps * n_bl * 8 || v.contains(&i32::MIN) {
                    continue;
                }
                let mut g = g.lock().unwrap();
                *g.complete.entry(first).or_default() += 1;
                for a2 in 0..ANTENNAS {
                    for a1 in 0..=a2 {
                        for prod in [0, 3] {
                            let s = g
                                .sums
                                .entry((baseline(a1, a2), prod))
                                .or_insert_with(|| vec![(0.0, 0.0); CHANNELS]);
                            for c in 0..cps {
                                let o = ((c * n_bl + baseline(a1, a2)) * 4 + prod) * 2;
                                let ch = first as usize + c;
                                s[ch].0 += f64::from(v[o]);
                                s[ch].1 += f64::from(v[o + 1]);
                            }
                        }
                    }
                }
            }
        }
    })
}

#[test]
fn a_local_array_correlates_a_tone_with_consistent_counters() {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    // The plan's correlation-product addresses (they do not depend on binary or sync time).
    let text = std::fs::read_to_string(config()).unwrap();
    let cfg = cbf::array::parse(&text).unwrap();
    let run = cbf::array::local::LocalRun {
        binary: cbf.into(),
        sync_time: 0.0,
    };
    let plan = cbf::array::plan::plan_local(&cfg, &run).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let gathered = Arc::new(Mutex::new(Gathered::default()));
    let captures: Vec<_> = plan
        .engines
        .iter()
        .filter(|e| e.kind == cbf::array::EngineKind::Xbengine)
        .map(|e| {
            let addr: SocketAddrV4 = e.outputs[0].parse().unwrap();
            capture(addr, Arc::clone(&stop), Arc::clone(&gathered))
        })
        .collect();
    assert_eq!(captures.len(), 2);

    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("array_local.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut launcher = common::Kill(
        Command::new(cbf)
            .args(["array", "run", "--local", "--duration", "60"])
            .arg(config())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap(),
    );
    // Wait for complete dumps from both XB-engines (a deadline, not a timing check).
    let started = Instant::now();
    loop {
        let done = {
            let g = gathered.lock().unwrap();
            g.complete.len() == 2 && g.complete.values().all(|&n| n >= DUMPS)
        };
        if done {
            break;
        }
        assert!(
            launcher.0.try_wait().unwrap().is_none(),
            "the launcher stopped: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(
            started.elapsed() < Duration::from_secs(50),
            "no {DUMPS} complete dumps from each XB-engine: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Counters in steady state, through the status command.
    let status = Command::new(cbf)
        .args(["array", "status", "--local", "--json", "--interval", "1"])
        .arg(config())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&status.stdout).unwrap();

    // The same engines as bare endpoints, no description: each says what it is over katcp,
    // and an XB-engine's sync sensor is found without the plan's output name.
    let list: Vec<String> = plan
        .engines
        .iter()
        .map(|e| format!("127.0.0.1:{}:{}", e.katcp_port, e.prometheus_port))
        .collect();
    let bare = Command::new(cbf)
        .args([
            "array",
            "status",
            "--json",
            "--interval",
            "0",
            "--endpoints",
        ])
        .arg(list.join(","))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(bare.status.success(), "{bare:?}");
    let bare: Vec<serde_json::Value> = serde_json::from_slice(&bare.stdout).unwrap();
    assert_eq!(bare.len(), plan.engines.len());
    for (r, e) in bare.iter().zip(&plan.engines) {
        assert_eq!(r["kind"], e.kind.as_str(), "{r}");
        if e.kind != cbf::array::EngineKind::Dsim {
            assert_eq!(r["synchronised"], true, "{r}");
        }
    }

    // Stop the launcher as Ctrl-C would: it stops every engine and exits 0.
    cbf::engine::terminate(&mut launcher.0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(s) = launcher.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the launcher did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    stop.store(true, Relaxed);
    for c in captures {
        c.join().unwrap();
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(code.success(), "{code:?}: {log_text}");
    assert!(log_text.contains("stopped (Stopped)"), "{log_text}");
    for e in &plan.engines {
        assert!(
            log_text.contains(&format!("cbf array run: {}: exit status: 0", e.name)),
            "{}: {log_text}",
            e.name
        );
    }

    // The tone: every cross-correlation peaks in the channel its frequency names, phase 0.
    let expected = (TONE_HZ / (ADC_SAMPLE_RATE / (2.0 * CHANNELS as f64))).round() as usize;
    assert_eq!(expected, 43);
    let g = gathered.lock().unwrap();
    for a2 in 0..ANTENNAS {
        for a1 in 0..a2 {
            for prod in [0, 3] {
                let s = &g.sums[&(baseline(a1, a2), prod)];
                let power: Vec<f64> = s.iter().map(|(re, im)| re.hypot(*im)).collect();
                let peak = (0..CHANNELS)
                    .max_by(|&a, &b| power[a].total_cmp(&power[b]))
                    .unwrap();
                assert_eq!(
                    peak, expected,
                    "baseline ({a1}, {a2}) product {prod}: {power:?}"
                );
                let mut rest: Vec<f64> = power.clone();
                rest.remove(peak);
                rest.sort_by(f64::total_cmp);
                let median = rest[rest.len() / 2];
                assert!(power[peak] > 100.0 * median, "{power:?}");
                let (re, im) = s[peak];
                assert!(im.atan2(re).abs() < 0.05, "phase {}", im.atan2(re));
            }
        }
    }

    // Counters: every engine reachable and in sync, no loss in steady state, heaps conserved.
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {rows:?}"))
    };
    let counter = |r: &serde_json::Value, k: &str| r["counters"][k].as_f64().unwrap_or(0.0);
    let (mut f_sent, mut x_received, mut dsim_sent, mut f_received) = (0.0, 0.0, 0.0, 0.0);
    for e in &plan.engines {
        let r = row(&e.name);
        assert!(r["metrics_error"].is_null(), "{r}");
        let rates = r["rates"].as_object().unwrap();
        for (cause, _) in cbf::array::status::LOSS_CAUSES {
            let rate = rates.get(cause).and_then(|v| v.as_f64()).unwrap_or(0.0);
            assert_eq!(rate, 0.0, "{}: {cause} in steady state: {r}", e.name);
        }
        match e.kind {
            cbf::array::EngineKind::Dsim => dsim_sent += counter(r, "output_heaps"),
            cbf::array::EngineKind::Fengine => {
                assert!(r["katcp_error"].is_null(), "{r}");
                assert_eq!(r["synchronised"], true, "{r}");
                f_sent += counter(r, "output_heaps");
                f_received += counter(r, "input_heaps");
            }
            cbf::array::EngineKind::Xbengine => {
                assert!(r["katcp_error"].is_null(), "{r}");
                assert_eq!(r["synchronised"], true, "{r}");
                x_received += counter(r, "input_heaps");
            }
        }
    }
    // The engines publish their counters per chunk (an F-engine's: 4 batches; an XB-engine's:
    // 32 batches, with up to 2 chunks held in its receive window), a dsim's every second, and
    // status reads them all at about the same moment: the totals agree within that much.
    let x_lag = (ANTENNAS * 2 * (3 * 32 + 1)) as f64;
    let f_chunk = (ANTENNAS * 2 * 4) as f64;
    assert!(
        x_received > 0.0 && x_received <= f_sent + f_chunk && f_sent - x_received <= x_lag,
        "F-engines sent {f_sent} heaps, XB-engines received {x_received}"
    );
    let dsim_per_s = 2.0 * ADC_SAMPLE_RATE / 4096.0;
    let f_lag = ANTENNAS as f64 * (1.2 * dsim_per_s + 4.0 * 64.0);
    assert!(
        f_received > 0.0 && (dsim_sent - f_received).abs() <= f_lag,
        "dsims sent {dsim_sent} heaps, F-engines received {f_received}"
    );
}

/// An engine that stops by itself (here: its katcp port is taken) ends the run: the launcher
/// stops the others and exits non-zero naming it.
#[test]
fn a_run_ends_when_an_engine_dies() {
    let cbf = env!("CARGO_BIN_EXE_cbf");
    // The same array on its own groups and ports, so that it does not meet the other test.
    let text = std::fs::read_to_string(config())
        .unwrap()
        .replace("239.27.31.0/24", "239.27.32.0/24")
        .replace("27310", "27510")
        .replace("27410", "27610");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cfg_path = dir.join("array-local-dies.toml");
    std::fs::write(&cfg_path, text).unwrap();
    // l-xb-00 is the plan's 7th engine: katcp port 27510 + 6.
    let _taken = std::net::TcpListener::bind("127.0.0.1:27516").unwrap();
    let out = Command::new(cbf)
        .args(["array", "run", "--local", "--duration", "60"])
        .arg(&cfg_path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("engine l-xb-00 stopped by itself (exit status: 1)"),
        "{err}"
    );
}
