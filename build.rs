//! Builds the C shims of the optional kernel-bypass transports (`ffi/`), each behind its cargo
//! feature, so that the default build needs no C library beyond libc.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "ibv")]
    ibv();
}

/// `ffi/ibv_shim.c`: the inline verbs (post, poll, notify, flow steering) that the `ibverbs`
/// crate cannot bind; linked with the system's libibverbs (libibverbs-dev).
#[cfg(feature = "ibv")]
fn ibv() {
    println!("cargo:rerun-if-changed=ffi/ibv_shim.c");
    cc::Build::new()
        .file("ffi/ibv_shim.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("cbf_ibv_shim");
    println!("cargo:rustc-link-lib=ibverbs");
}
