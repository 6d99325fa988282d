//! A thread's CPU time and its pinning to one core, for the per-core network benchmarks
//! (`net_transports`, `net_send`).

use std::time::Duration;

/// The calling thread's CPU time, user and system.
pub fn thread_cpu() -> Duration {
    // SAFETY: a zeroed rusage is valid; getrusage fills it for the calling thread.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
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
