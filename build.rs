//! Builds the C shims of the optional kernel-bypass transports (`ffi/`), each only with its
//! cargo feature, so that the default build needs no C library beyond libc.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    dpdk();
    #[cfg(feature = "ibv")]
    ibv();
}

/// `ffi/dpdk_shim.c` against the system's DPDK (Debian: `libdpdk-dev`), found by pkg-config.
/// DPDK's own cflags carry `-include rte_config.h` and `-march=corei7`, which the pkg-config
/// crate does not pass on: the shim includes `rte_config.h` first itself, and the flag is given
/// here (DPDK's headers need at least SSE4.2).
#[cfg(feature = "dpdk")]
fn dpdk() {
    println!("cargo:rerun-if-changed=ffi/dpdk_shim.c");
    let lib = pkg_config::Config::new()
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            panic!("feature `dpdk` needs DPDK's development files (apt-get install libdpdk-dev pkg-config): {e}")
        });
    let mut build = cc::Build::new();
    build
        .file("ffi/dpdk_shim.c")
        .flag("-march=corei7")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(true);
    for path in &lib.include_paths {
        build.include(path);
    }
    build.compile("cbf_dpdk_shim");
}

/// `ffi/ibv_shim.c`: the inline verbs (post, poll, notify, flow steering) that the `ibverbs`
/// crate cannot bind; `ffi/ibv_mprq_shim.c`: the mlx5 direct verbs of the multi-packet
/// (striding) receive queue. Linked with the system's libibverbs and libmlx5 (both from
/// rdma-core: libibverbs-dev, whose pkg-config file `libmlx5.pc` names the latter).
#[cfg(feature = "ibv")]
fn ibv() {
    println!("cargo:rerun-if-changed=ffi/ibv_shim.c");
    println!("cargo:rerun-if-changed=ffi/ibv_mprq_shim.c");
    let mlx5 = pkg_config::Config::new()
        .probe("libmlx5")
        .unwrap_or_else(|e| {
            panic!("feature `ibv` needs rdma-core's libmlx5 (apt-get install libibverbs-dev pkg-config): {e}")
        });
    let mut build = cc::Build::new();
    build
        .file("ffi/ibv_shim.c")
        .file("ffi/ibv_mprq_shim.c")
        .warnings(true)
        .extra_warnings(true);
    for path in &mlx5.include_paths {
        build.include(path);
    }
    build.compile("cbf_ibv_shim");
    println!("cargo:rustc-link-lib=ibverbs");
}
