//! Pinning a thread to one CPU core (katgpucbf's `--affinity`/`--send-affinity`: "core for
//! output-handling thread"). Written on `libc::sched_setaffinity` directly: the one call is
//! all that is needed, and `core_affinity` cannot report why a pin failed (it returns a bool),
//! which an operator placing threads by hand must see.

use std::io;

/// Largest core number accepted (the size of the kernel's `cpu_set_t`).
pub const MAX_CORE: usize = libc::CPU_SETSIZE as usize - 1;

/// Bind the calling thread to `core`. Fails (naming the core) when the core does not exist
/// or is outside the process's allowed set (a cgroup or `taskset`).
pub fn pin_current_thread(core: usize) -> io::Result<()> {
    if core > MAX_CORE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("core {core} is beyond {MAX_CORE}"),
        ));
    }
    // SAFETY: cpu_set_t is plain bits, zero is a valid (empty) set, CPU_SET is given a core
    // below CPU_SETSIZE, and pid 0 names the calling thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("core {core}: {e}")))
    }
}

/// The cores the calling thread may run on (its affinity mask: the machine's cores less what a
/// cgroup or `taskset` took away), so that a configuration naming another is refused at
/// start-up rather than failing in a thread later.
pub fn allowed_cores() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain bits, zero is a valid set, the kernel fills it.
    let (rc, set) = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        (rc, set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET only reads the set, for cores below CPU_SETSIZE.
    Ok((0..=MAX_CORE)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
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
}
