//! Pinning threads to CPU cores (katgpucbf's `--recv-affinity`, `--send-affinity`,
//! `--main-affinity` and dsim's `--affinity`), through [`crate::net::cpu_set`], the one
//! wrapper of the kernel's affinity calls (`core_affinity` cannot report why a pin failed: it
//! returns a bool, and an operator placing threads by hand must see why).
//!
//! [`EngineAffinity`] is where an engine's data-path threads run. Its memory follows: the
//! receive chunks are allocated and first touched by a thread bound to the receive cores
//! ([`on_cores`]), so that under Linux's default (local) memory policy their pages land on those
//! cores' NUMA node, where the NIC writes them (seed 000 §Network receive).

use std::io;

use super::ConfigError;
use crate::net::cpu_set::CpuSet;

/// Largest core number accepted (the size of the kernel's `cpu_set_t`).
pub use crate::net::cpu_set::MAX_CORE;

/// Bind the calling thread to `core`. Fails (naming the core) when the core does not exist
/// or is outside the process's allowed set (a cgroup or `taskset`).
pub fn pin_current_thread(core: usize) -> io::Result<()> {
    pin_current_thread_to(&[core])
}

/// Bind the calling thread to the set `cores` (the kernel picks among them). Fails, naming the
/// cores, when one does not exist or none is in the process's allowed set.
pub fn pin_current_thread_to(cores: &[usize]) -> io::Result<()> {
    CpuSet::of_cores(cores)?
        .apply_to_current_thread()
        .map_err(|e| io::Error::new(e.kind(), format!("core {}: {e}", list(cores))))
}

/// `cores` as a comma-separated list, for messages and command lines.
pub fn list(cores: &[usize]) -> String {
    cores
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The cores the calling thread may run on (its affinity mask: the machine's cores less what a
/// cgroup or `taskset` took away), so that a configuration naming another is refused at
/// start-up rather than failing in a thread later.
pub fn allowed_cores() -> io::Result<Vec<usize>> {
    Ok(CpuSet::of_current_thread()?.cores())
}

/// Where an engine's data-path threads run: katgpucbf's `--recv-affinity` (one entry per
/// receive thread), `--send-affinity` (the output-handling threads) and `--main-affinity` (the
/// processing thread, which drives the GPU). Every field empty: nothing bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineAffinity {
    /// Per receive thread, its core; `None` is katgpucbf's -1 (that thread not bound).
    pub recv: Vec<Option<usize>>,
    /// Cores dealt to the send threads in turn: one core binds every send thread to it, as
    /// katgpucbf's single output thread pool.
    pub send: Vec<usize>,
    /// The processing thread's cores; with the CPU backend the workers it starts inherit them.
    pub main: Vec<usize>,
}

impl EngineAffinity {
    /// The core of receive thread `i`, if bound.
    pub fn recv_core(&self, i: usize) -> Option<usize> {
        self.recv.get(i).copied().flatten()
    }

    /// The core of send thread `i`, if bound.
    pub fn send_core(&self, i: usize) -> Option<usize> {
        (!self.send.is_empty()).then(|| self.send[i % self.send.len()])
    }

    /// The bound receive cores, each once: where the receive chunks are first touched.
    pub fn recv_cores(&self) -> Vec<usize> {
        let mut cores: Vec<usize> = self.recv.iter().flatten().copied().collect();
        cores.sort_unstable();
        cores.dedup();
        cores
    }

    /// Every core named must be one this process may run on (refused now rather than failing
    /// in a thread later), and `--recv-affinity` must give one entry per receive thread.
    pub fn validate(&self, recv_threads: usize) -> Result<(), ConfigError> {
        if !self.recv.is_empty() && self.recv.len() != recv_threads {
            return Err(ConfigError::new(
                "--recv-affinity",
                format!(
                    "{} entries for {recv_threads} receive threads (one core per thread, -1 for \
                     a thread left unbound)",
                    self.recv.len()
                ),
            ));
        }
        let named: [(&'static str, Vec<usize>); 3] = [
            ("--recv-affinity", self.recv_cores()),
            ("--send-affinity", self.send.clone()),
            ("--main-affinity", self.main.clone()),
        ];
        if named.iter().all(|(_, cores)| cores.is_empty()) {
            return Ok(());
        }
        let allowed = allowed_cores().map_err(|e| ConfigError::new("--main-affinity", e))?;
        for (flag, cores) in named {
            if let Some(c) = cores.iter().find(|c| !allowed.contains(c)) {
                return Err(ConfigError::new(
                    flag,
                    format!(
                        "core {c} is not one this process may run on ({})",
                        ranges(&allowed)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Most entries in one core list: one per core the kernel's CPU set can name.
pub const MAX_CORE_LIST: usize = MAX_CORE + 1;

/// A katgpucbf core list (`--recv-affinity 0,1,-1`): core numbers up to [`MAX_CORE`], -1 for
/// "not bound", at most [`MAX_CORE_LIST`] entries. `Err` says what is wrong.
pub fn parse_core_list(text: &str) -> Result<Vec<Option<usize>>, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() > MAX_CORE_LIST {
        return Err(format!("more than {MAX_CORE_LIST} entries"));
    }
    parts
        .into_iter()
        .map(|p| match p.parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(c) if (0..=MAX_CORE as i64).contains(&c) => Ok(Some(c as usize)),
            _ => Err(format!(
                "{p:?} is not a core number (0 to {MAX_CORE}) or -1 (not bound)"
            )),
        })
        .collect()
}

/// `cores` (sorted) as Linux CPU-list ranges (`0-3,8`), for messages and reports.
pub fn ranges(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Run `f` on a new thread named `name` (at most 15 bytes, Linux's limit) bound to `cores`
/// (unbound when empty), wait for it and return what it returns; a panic in `f` goes on in
/// the caller. The engines' processing loops run so, and the receive chunks are allocated so:
/// memory `f` touches first is placed by the kernel's first-touch rule on those cores' NUMA
/// node.
pub fn on_cores<T: Send>(
    name: &str,
    cores: &[usize],
    f: impl FnOnce() -> T + Send,
) -> io::Result<T> {
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, || {
                if !cores.is_empty() {
                    pin_current_thread_to(cores)?;
                }
                Ok(f())
            })?;
        worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The core the calling thread runs on now.
    fn current_core() -> usize {
        // SAFETY: sched_getcpu has no arguments and only reads the current CPU.
        unsafe { libc::sched_getcpu() as usize }
    }

    #[test]
    fn a_pinned_thread_runs_on_its_core_and_a_missing_core_is_refused() {
        let last = *allowed_cores().unwrap().last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            for _ in 0..100 {
                std::thread::yield_now();
                assert_eq!(current_core(), last);
            }
        })
        .join()
        .unwrap();
        let err = std::thread::spawn(|| pin_current_thread(MAX_CORE).unwrap_err())
            .join()
            .unwrap();
        assert!(err.to_string().contains(&MAX_CORE.to_string()), "{err}");
        assert!(pin_current_thread(MAX_CORE + 1).is_err());
    }

    #[test]
    fn core_lists_print_as_linux_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[]), "");
        assert_eq!(list(&[4, 2]), "4,2");
    }
}
