//! `rte_eal_init` pins its calling thread to the main lcore (issue 15); cbf puts the thread's
//! mask back, so that an engine started with `--recv-transport dpdk` or `--send-transport dpdk`
//! does not run, with every thread it spawns later, on one core. With `--features dpdk`: a
//! receiver opened on `net_null` (which starts the EAL, with no `-l`, so the EAL takes every
//! allowed core as an lcore and pins this thread to the first) leaves the thread's mask, and
//! that of a thread spawned after, as it was, read back with `engine::affinity::allowed_cores`
//! (`sched_getaffinity`, not the code under test). One EAL per process: this file is its own
//! test binary with one test. Arguments that name cores keep the EAL's pinning: that choice is
//! `eal_affinity::names_cores`, unit-tested.

#[cfg(feature = "dpdk")]
#[test]
fn the_eal_leaves_the_calling_threads_affinity_as_it_was() {
    use cbf::engine::affinity::allowed_cores;
    use cbf::net::dpdk::{open_receiver, DpdkConfig};

    let before = allowed_cores().unwrap();
    if before.len() < 2 {
        eprintln!("skipped: one allowed core, nothing for the EAL to narrow ({before:?})");
        return;
    }
    let cfg = DpdkConfig {
        eal_args: format!(
            "--no-huge --no-pci -m 64 --no-shconf --file-prefix=cbfaff{} --log-level=error \
             --vdev=net_null0",
            std::process::id()
        ),
        port: "0".into(),
    };
    let rx = open_receiver(&cfg, &["239.10.10.10:7148".parse().unwrap()]).unwrap();
    assert_eq!(allowed_cores().unwrap(), before, "the calling thread");
    let spawned = std::thread::spawn(|| allowed_cores().unwrap())
        .join()
        .unwrap();
    assert_eq!(spawned, before, "a thread spawned after the EAL started");
    drop(rx);
}
