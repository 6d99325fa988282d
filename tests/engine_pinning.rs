//! katgpucbf's placement flags on the engines (issue 15): `cbf fengine` and `cbf xbengine`
//! started with `--recv-affinity`, `--send-affinity` and `--main-affinity` name their data-path
//! threads, and the kernel reports each bound to its core and last run there
//! (`/proc/PID/task/TID`: `comm`, `Cpus_allowed_list`, and the `processor` field of `stat`),
//! not what the engine believes it did.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cbf::engine::affinity::allowed_cores;

/// A UDP port nothing sends to (the engines idle on it).
fn quiet_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Per thread of `pid`: (name, allowed cores as the kernel lists them, last core run on).
fn threads(pid: u32) -> Vec<(String, String, usize)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let dir = t.path();
            let read = |f: &str| std::fs::read_to_string(Path::new(&dir).join(f)).ok();
            let name = read("comm")?.trim().to_string();
            let allowed = read("status")?
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
                .trim()
                .to_string();
            // Fields after the parenthesised name; `processor` is field 39 of stat(5).
            let stat = read("stat")?;
            let after = &stat[stat.rfind(')')? + 2..];
            let processor = after.split(' ').nth(39 - 3)?.parse().ok()?;
            Some((name, allowed, processor))
        })
        .collect()
}

/// Start `cbf ARGS`, wait until every thread in `expect` (name, core) exists, check each is
/// bound to its core alone and last ran there, then stop the engine.
fn check(mut args: Vec<String>, expect: &[(&str, usize)]) {
    args.extend(
        [
            "--katcp-port=0",
            "--katcp-host=127.0.0.1",
            "--duration=60",
            "--sync-time=0",
        ]
        .map(String::from),
    );
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let seen = loop {
        let now = threads(child.id());
        if expect.iter().all(|(n, _)| now.iter().any(|t| t.0 == *n)) {
            break now;
        }
        if child.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "threads {expect:?} not all seen in {now:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    for (name, core) in expect {
        let (_, allowed, processor) = seen.iter().find(|t| t.0 == *name).unwrap();
        assert_eq!(allowed, &core.to_string(), "{name}: {seen:?}");
        assert_eq!(processor, core, "{name} last ran elsewhere: {seen:?}");
    }
    // Every thread name fits Linux's 15 bytes, so none was cut short into another's.
    let names: Vec<&String> = seen.iter().map(|t| &t.0).collect();
    assert!(names.iter().all(|n| n.len() <= 15), "{names:?}");
}

#[test]
fn engine_threads_run_on_their_cores() {
    let cores = allowed_cores().unwrap();
    let (first, last) = (cores[0], *cores.last().unwrap());
    let port = quiet_port();
    let f = [
        "fengine".to_string(),
        format!("127.0.0.1:{port}"),
        "--adc-sample-rate=2e6".into(),
        "--recv-chunk-samples=65536".into(),
        "--jones-per-batch=4096".into(),
        "--max-delay-diff=0".into(),
        format!("--wideband=name=wide,channels=64,dst=127.0.0.1:{port}"),
        format!("--recv-affinity={last}"),
        format!("--send-affinity={first}"),
        format!("--main-affinity={last}"),
    ];
    check(
        f.to_vec(),
        &[
            ("fengine-rx0", last),
            ("fengine-tx0", first),
            ("fengine-main", last),
        ],
    );
    // Two receive threads from two entries (-1 leaves the second unbound: not checked), two
    // corrprod send threads on the one send core.
    let x = [
        "xbengine".to_string(),
        format!("127.0.0.1:{port},127.0.0.1:{}", quiet_port()),
        "--array-size=2".into(),
        "--channels=64".into(),
        "--channels-per-substream=64".into(),
        "--samples-between-spectra=128".into(),
        "--jones-per-batch=4096".into(),
        "--heaps-per-fengine-per-chunk=2".into(),
        "--adc-sample-rate=2e6".into(),
        "--cpu-threads=1".into(),
        format!("--corrprod=name=a,dst=127.0.0.1:{port},heap_accumulation_threshold=4"),
        format!("--corrprod=name=b,dst=127.0.0.1:{port},heap_accumulation_threshold=4"),
        format!("--recv-affinity={first},-1"),
        format!("--send-affinity={last}"),
        format!("--main-affinity={first}"),
    ];
    check(
        x.to_vec(),
        &[
            ("xbengine-rx0", first),
            ("xbengine-tx0", last),
            ("xbengine-tx1", last),
            ("xbengine-main", first),
        ],
    );
}

/// A core outside the process's allowed set is refused at start-up, naming the flag.
#[test]
fn a_core_not_allowed_is_refused_by_flag() {
    let cores = allowed_cores().unwrap();
    let outside = (0..1024).find(|c| !cores.contains(c)).unwrap();
    for flag in ["--recv-affinity", "--send-affinity", "--main-affinity"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cbf"))
            .args([
                "fengine",
                "127.0.0.1:1",
                "--adc-sample-rate=2e6",
                "--sync-time=0",
                "--recv-chunk-samples=65536",
                "--jones-per-batch=4096",
                "--max-delay-diff=0",
                "--wideband=name=wide,channels=64,dst=127.0.0.1:9",
                &format!("{flag}={outside}"),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(&format!("{flag}: core {outside} is not one")),
            "{err}"
        );
    }
}
