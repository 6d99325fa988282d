//! The calling thread's CPU affinity mask, as the kernel holds it (`sched_getaffinity`,
//! `sched_setaffinity`): the one wrapper of those calls, below both of their users, the
//! engines' thread pinning (`engine::affinity`) and the undoing of what DPDK's EAL does to the
//! thread that starts it (`net::dpdk`'s `eal_affinity`). Written on `libc` directly: the calls
//! are all that is needed, and an error must say why a pin failed (an operator placing threads
//! by hand must see it).

use std::io;

/// Largest core number a mask can hold (the size of the kernel's `cpu_set_t`).
pub const MAX_CORE: usize = libc::CPU_SETSIZE as usize - 1;

/// A set of cores, in the kernel's layout.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The cores the calling thread may run on now (its mask: the machine's cores less what a
    /// cgroup, `taskset` or an earlier pin took away).
    pub fn of_current_thread() -> io::Result<CpuSet> {
        // SAFETY: cpu_set_t is plain bits, zero is a valid set, the kernel fills it; pid 0
        // names the calling thread.
        let (rc, set) = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            (rc, set)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CpuSet(set))
    }

    /// The set of `cores`; refused (naming the core) past [`MAX_CORE`].
    pub fn of_cores(cores: &[usize]) -> io::Result<CpuSet> {
        if let Some(c) = cores.iter().find(|&&c| c > MAX_CORE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("core {c} is beyond {MAX_CORE}"),
            ));
        }
        // SAFETY: cpu_set_t is plain bits, zero is a valid (empty) set, and CPU_SET is given
        // cores below CPU_SETSIZE.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cores {
                libc::CPU_SET(c, &mut set);
            }
            set
        };
        Ok(CpuSet(set))
    }

    /// Make this the calling thread's mask. The kernel refuses (EINVAL) a set with no core
    /// that exists and that the process may use.
    pub fn apply_to_current_thread(&self) -> io::Result<()> {
        // SAFETY: a valid set of the size given; pid 0 names the calling thread.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The cores in the set, ascending.
    pub fn cores(&self) -> Vec<usize> {
        // SAFETY: CPU_ISSET only reads the set, for cores below CPU_SETSIZE.
        (0..=MAX_CORE)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &self.0) })
            .collect()
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CpuSet").field(&self.cores()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's allowed cores as `/proc` lists them (`Cpus_allowed_list`, e.g.
    /// `0-3,8`): the kernel's own account, not read through these calls.
    fn proc_allowed() -> Vec<usize> {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        let mut cores = Vec::new();
        for part in list.split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            cores.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
        }
        cores
    }

    /// What a set holds is what it was made of; the thread's mask is what `/proc` says, a set
    /// applied becomes it, and the old mask applied again restores it. On a thread of its
    /// own, so that the test's others keep theirs.
    #[test]
    fn masks_agree_with_proc() {
        assert_eq!(CpuSet::of_cores(&[5, 0, 3]).unwrap().cores(), [0, 3, 5]);
        assert!(CpuSet::of_cores(&[MAX_CORE + 1]).is_err());
        std::thread::spawn(|| {
            let before = CpuSet::of_current_thread().unwrap();
            assert_eq!(before.cores(), proc_allowed());
            let last = *before.cores().last().unwrap();
            CpuSet::of_cores(&[last])
                .unwrap()
                .apply_to_current_thread()
                .unwrap();
            assert_eq!(proc_allowed(), [last]);
            before.apply_to_current_thread().unwrap();
            assert_eq!(proc_allowed(), before.cores());
        })
        .join()
        .unwrap();
        // No core the process may use: refused.
        let none = CpuSet::of_cores(&[]).unwrap();
        let refused = std::thread::spawn(move || none.apply_to_current_thread())
            .join()
            .unwrap();
        assert!(refused.is_err());
    }
}
