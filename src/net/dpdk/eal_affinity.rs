//! What `rte_eal_init` does to the calling thread's CPU affinity, and undoing it (issue 15).
//!
//! DPDK's EAL makes the thread that initialises it the *main lcore*: it sets that thread's
//! affinity to the main lcore's one core (`eal_thread_init_main`, DPDK 22.11). In cbf that
//! thread is an engine's start-up thread, which then runs the processing loop and spawns the
//! receive, send and worker threads, all of which inherit the mask: after
//! `--recv-transport dpdk` or `--send-transport dpdk` the whole engine would be confined to one
//! core, unless `--main-affinity` happened to say otherwise. cbf polls its DPDK queues from its
//! own threads, pinned by `--recv-affinity`/`--send-affinity`, and uses no lcore, so the EAL's
//! choice of main lcore means nothing to it. The mask ([`CpuSet`]) is taken before the EAL starts
//! and put back after it.
//!
//! Except when the operator's EAL arguments name cores ([`names_cores`]: `-l`, `--lcores`,
//! `-c`, `--main-lcore`): then the confinement was asked for (a DPDK operator's habit is to
//! give the process its cores that way), so it is kept, and the mask the EAL left is logged.

use crate::net::cpu_set::CpuSet;

/// EAL options that name the cores (and so the main lcore), in both spellings of each:
/// `-l 0-3` / `-l0-3`, `--lcores 0` / `--lcores=0`, `-c 0x3` / `-c0x3`, `--main-lcore 1` /
/// `--main-lcore=1`.
const CORE_OPTIONS: [&str; 4] = ["-l", "--lcores", "-c", "--main-lcore"];

/// Whether the EAL arguments `args` (whitespace-separated, as `--dpdk-args` takes them) name
/// cores explicitly.
pub fn names_cores(args: &str) -> bool {
    args.split_whitespace().any(|arg| {
        CORE_OPTIONS.iter().any(|opt| {
            let rest = arg.strip_prefix(opt);
            match rest {
                Some("") => true,
                // `--lcores=0`; `-l0` and `-c3` (a short option's value may follow at once).
                Some(r) if opt.starts_with("--") => r.starts_with('='),
                Some(_) => true,
                None => false,
            }
        })
    })
}

/// After `rte_eal_init` (whatever it answered): put `before` back on the calling thread, or,
/// when the arguments named cores, log the mask the EAL left. A restore that fails is logged:
/// the engine runs on, confined, rather than not at all.
pub fn after_eal_init(args: &str, before: &CpuSet) {
    let after = CpuSet::of_current_thread().map(|a| a.cores());
    if names_cores(args) {
        tracing::info!(
            before = ?before.cores(),
            after = ?after,
            "the DPDK EAL arguments name cores: the calling thread keeps the main lcore's affinity the EAL set"
        );
        return;
    }
    match before.apply_to_current_thread() {
        Ok(()) => tracing::debug!(
            cores = ?before.cores(),
            eal_set = ?after,
            "the calling thread's affinity restored after the DPDK EAL pinned it"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            cores = ?after,
            "cannot restore the calling thread's affinity after the DPDK EAL: it stays on the main lcore"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_options_are_recognised_in_both_spellings() {
        for args in [
            "-l 0 --no-huge",
            "-l0-3 --vdev=net_ring0",
            "--no-pci --lcores 0@1",
            "--lcores=(0-1)@2",
            "-c 0x3",
            "-c3",
            "--vdev=net_null0 --main-lcore 1",
            "--main-lcore=1",
        ] {
            assert!(names_cores(args), "{args}");
        }
        for args in [
            "",
            "--no-huge --no-pci -m 64 --vdev=net_null0",
            "--log-level=error --file-prefix=cbf-l",
            "-a 0000:17:00.0 --lcoresx 1",
            "--main-lcores=1 -m 256",
        ] {
            assert!(!names_cores(args), "{args}");
        }
    }

    /// The mask put back is the mask taken, read back from the kernel (the thread is narrowed
    /// to one core in between, as the EAL narrows it).
    #[test]
    fn a_saved_mask_is_restored() {
        std::thread::spawn(|| {
            let before = CpuSet::of_current_thread().unwrap();
            let first = before.cores()[0];
            CpuSet::of_cores(&[first])
                .unwrap()
                .apply_to_current_thread()
                .unwrap();
            assert_eq!(CpuSet::of_current_thread().unwrap().cores(), [first]);
            after_eal_init("--no-huge", &before);
            assert_eq!(CpuSet::of_current_thread().unwrap().cores(), before.cores());
        })
        .join()
        .unwrap();
    }
}
