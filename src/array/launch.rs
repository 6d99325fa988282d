//! Running a local plan ([`super::plan::plan_local`]): every engine a child process of this
//! one, started from its planned argv and env, its output passed on line by line with its name
//! in front, and all of them stopped together — on the caller's stop flag (Ctrl-C), after the
//! run's duration, or as soon as any one of them exits, which is reported with its exit status
//! as the run's failure. A launcher for tests and demos, not a scheduler: nothing is
//! restarted.
//!
//! Stopping goes stage by stage against the data's flow — the simulators, then the F-engines,
//! then the XB-engines — so that each stage's last heaps reach a consumer still running: SIGTERM
//! to a stage's engines (they stop cleanly and print their counters), then, after at most
//! [`GRACE`], SIGKILL to any that has not exited, then the next stage. The children run in a
//! process group of their own, so a terminal's Ctrl-C reaches only the launcher, which then
//! stops them in this one way.
#![deny(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::plan::{EngineKind, Plan};
use crate::engine::{terminate, Shutdown};

/// How long the engines have to stop after SIGTERM before they are killed.
pub const GRACE: Duration = Duration::from_secs(5);
/// How often the children are looked at.
const POLL: Duration = Duration::from_millis(50);
/// Longest line of a child's output passed on whole; a longer one is cut into pieces.
const MAX_LINE: u64 = 64 << 10;

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The run's duration passed.
    Duration,
    /// The caller's stop flag was raised (Ctrl-C, SIGTERM).
    Stopped,
    /// An engine exited by itself.
    Died { engine: String, status: ExitStatus },
}

/// How each engine ended, in the plan's order, and why the run did.
#[derive(Debug)]
pub struct RunReport {
    pub ending: Ending,
    /// Each engine's exit status, `None` where it had to be killed after [`GRACE`].
    pub engines: Vec<(String, Option<ExitStatus>)>,
}

impl RunReport {
    /// A run succeeds when it was ended from outside and every engine then stopped cleanly.
    pub fn success(&self) -> bool {
        !matches!(self.ending, Ending::Died { .. })
            && self
                .engines
                .iter()
                .all(|(_, s)| s.is_some_and(|s| s.success()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("engine {engine}: cannot start {binary}: {source}")]
    Spawn {
        engine: String,
        binary: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One running engine and the threads passing its output on.
struct Running {
    name: String,
    /// Position in the data's flow: 0 for XB-engines, 1 for F-engines, 2 for simulators.
    stage: u8,
    child: Child,
    pipes: Vec<JoinHandle<()>>,
}

/// Copy `from` to `to` line by line, each line prefixed with `prefix`; lines are written
/// whole under `to`'s lock, so engines' lines do not interleave mid-line.
fn relay<W: Write + Send + 'static>(
    from: impl Read + Send + 'static,
    prefix: String,
    to: Arc<Mutex<W>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("relay-{prefix}"))
        .spawn(move || {
            let mut from = BufReader::new(from);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut from).take(MAX_LINE).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut out = to.lock().unwrap_or_else(|e| e.into_inner());
                let _ = out.write_all(format!("{prefix} | ").as_bytes());
                let _ = out.write_all(&line);
                let _ = out.flush();
            }
        })
}

/// Start the plan's engines (XB-engines first, then F-engines, then dsims, so that each stream
/// has its receiver before its sender) and supervise them until the run ends; their output
/// goes to `stdout` and `stderr`, each line prefixed with the engine's name.
pub fn run<O, E>(
    plan: &Plan,
    duration: Option<Duration>,
    stop: &Shutdown,
    stdout: O,
    stderr: E,
) -> Result<RunReport, LaunchError>
where
    O: Write + Send + 'static,
    E: Write + Send + 'static,
{
    let (stdout, stderr) = (Arc::new(Mutex::new(stdout)), Arc::new(Mutex::new(stderr)));
    let width = plan.engines.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let mut order: Vec<usize> = (0..plan.engines.len()).collect();
    let rank = |k: EngineKind| -> u8 {
        match k {
            EngineKind::Xbengine => 0,
            EngineKind::Fengine => 1,
            EngineKind::Dsim => 2,
        }
    };
    order.sort_by_key(|&i| rank(plan.engines[i].kind));
    let mut running: Vec<(usize, Running)> = Vec::new();
    for i in order {
        let e = &plan.engines[i];
        let started = Command::new(&e.argv[0])
            .args(&e.argv[1..])
            .envs(&e.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn();
        let mut child = match started {
            Ok(c) => c,
            Err(source) => {
                stop_all(running.iter_mut().map(|(_, r)| r));
                return Err(LaunchError::Spawn {
                    engine: e.name.clone(),
                    binary: e.argv[0].clone(),
                    source,
                });
            }
        };
        let prefix = format!("{:width$}", e.name);
        let mut pipes = Vec::new();
        if let Some(out) = child.stdout.take() {
            pipes.push(relay(out, prefix.clone(), Arc::clone(&stdout))?);
        }
        if let Some(err) = child.stderr.take() {
            pipes.push(relay(err, prefix, Arc::clone(&stderr))?);
        }
        running.push((
            i,
            Running {
                name: e.name.clone(),
                stage: rank(e.kind),
                child,
                pipes,
            },
        ));
    }
    let start = Instant::now();
    let ending = loop {
        if stop.requested() {
            break Ending::Stopped;
        }
        if duration.is_some_and(|d| start.elapsed() >= d) {
            break Ending::Duration;
        }
        let mut died = None;
        for (_, r) in running.iter_mut() {
            if let Some(status) = r.child.try_wait()? {
                died = Some(Ending::Died {
                    engine: r.name.clone(),
                    status,
                });
                break;
            }
        }
        if let Some(d) = died {
            break d;
        }
        std::thread::sleep(POLL);
    };
    let statuses = stop_all(running.iter_mut().map(|(_, r)| r));
    let mut engines: Vec<(usize, String, Option<ExitStatus>)> = running
        .into_iter()
        .zip(statuses)
        .map(|((i, r), s)| {
            for p in r.pipes {
                let _ = p.join();
            }
            (i, r.name, s)
        })
        .collect();
    engines.sort_by_key(|(i, _, _)| *i);
    Ok(RunReport {
        ending,
        engines: engines.into_iter().map(|(_, n, s)| (n, s)).collect(),
    })
}

/// Stop every engine still running, the latest stage first (see the module doc); each one's
/// exit status, in `running`'s order, `None` where it had to be killed.
fn stop_all<'a>(running: impl Iterator<Item = &'a mut Running>) -> Vec<Option<ExitStatus>> {
    let mut all: Vec<(usize, &mut Running)> = running.enumerate().collect();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; all.len()];
    for stage in (0..=2).rev() {
        let mut group: Vec<&mut (usize, &mut Running)> =
            all.iter_mut().filter(|(_, r)| r.stage == stage).collect();
        for (_, r) in group.iter_mut() {
            if let Err(e) = terminate(&mut r.child) {
                tracing::warn!(engine = r.name, "cannot send SIGTERM: {e}");
            }
        }
        let deadline = Instant::now() + GRACE;
        loop {
            for (i, r) in group.iter_mut() {
                if statuses[*i].is_none() {
                    statuses[*i] = r.child.try_wait().ok().flatten();
                }
            }
            if group.iter().all(|(i, _)| statuses[*i].is_some()) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(POLL);
        }
        for (i, r) in group.iter_mut() {
            if statuses[*i].is_none() {
                tracing::warn!(
                    engine = r.name,
                    "still running {GRACE:?} after SIGTERM: killed"
                );
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }
    statuses
}
