//! A thread's CPU time and its pinning to one core, for the per-core network benchmarks
//! (`net_transports`, `net_send`).

use std::time::Duration;

/// The calling thread's CPU time, user and system, to the nanosecond.
///
/// `CLOCK_THREAD_CPUTIME_ID` brings the scheduler's runtime up to date before reading it, where
/// `getrusage(RUSAGE_THREAD)` (used before the twenty-fourth session) reports it as of the
/// running thread's last tick (250 Hz here) or context switch: its figures came in steps of
/// 4 ms, which in the 12–20 ms prefilled runs of `net_transports` is a step of 20–33 %.
pub fn thread_cpu() -> Duration {
    // SAFETY: a zeroed timespec is valid; clock_gettime fills it for the calling thread.
    let t = unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t);
        t
    };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Pin the calling thread to `core` (best effort: a machine with one core keeps both threads).
pub fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
