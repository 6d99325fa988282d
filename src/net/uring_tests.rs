//! Unit tests of `net::uring`: its NAPI busy-poll registration.

use super::*;
use crate::net::recv_socket::with_syscall_refused;

/// `IORING_REGISTER_NAPI`, the opcode of `io_uring_register` (not in the libc crate).
const REGISTER_NAPI: u32 = 27;

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: uname fills a zeroed utsname.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid utsname to fill.
    assert_eq!(unsafe { libc::uname(&mut u) }, 0);
    // SAFETY: release is NUL-terminated by the kernel.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// `--recv-busy-poll` on the io_uring path: the ring holds the timeout afterwards (the
/// kernel hands the settings in force back on a second registration); a kernel before 6.9
/// refuses, naming the errno.
#[test]
fn busy_poll_is_registered_with_the_ring() {
    let eps = ["127.0.0.1:0".parse().unwrap()];
    let mut r = UringReceiver::bind(&eps, None, 1 << 16, 1500).unwrap();
    match r.set_busy_poll(50) {
        Ok(held) => assert_eq!(held, 50),
        Err(e) => {
            assert!(!kernel_at_least(6, 9), "refused on a kernel with NAPI: {e}");
            assert!(e.to_string().contains("IORING_REGISTER_NAPI"), "{e}");
        }
    }
}

/// A kernel without io_uring NAPI busy polling (before 6.9: EINVAL, made here by a seccomp
/// filter) is reported with the errno named.
#[test]
fn a_refused_registration_names_the_errno() {
    let e = with_syscall_refused(
        libc::SYS_io_uring_register,
        vec![(1, REGISTER_NAPI)],
        libc::EINVAL as u16,
        || {
            let eps = ["127.0.0.1:0".parse().unwrap()];
            UringReceiver::bind(&eps, None, 1 << 16, 1500)
                .unwrap()
                .set_busy_poll(50)
        },
    )
    .expect_err("IORING_REGISTER_NAPI refused by the filter");
    let text = e.to_string();
    assert!(
        text.contains("IORING_REGISTER_NAPI") && text.contains("EINVAL"),
        "{text}"
    );
}
