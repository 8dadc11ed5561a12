//! Tells the tests which instruction sets the build host has (`cfg(yomi_host_avx2)`,
//! `cfg(yomi_host_avxvnni)`, `cfg(yomi_host_avx512vnni)`), so that a kernel's parity test is
//! ignored (reported as not run, never counted as passing) on a machine that cannot run it,
//! and runs on one that can. The kernels themselves choose by run-time detection
//! (`Isa::is_supported` in `src/quant/mod.rs`, whose conditions these repeat); tests run where
//! they are built. A build reused on another machine keeps the first host's answer; a test it
//! let run on a CPU without the ISA fails and says to rebuild (`require` in the tests). Not
//! rerun per boot: that would recompile the crate and all above it every time.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avx2)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avxvnni)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avx512vnni)");
    // The build script runs on the build host: only a native x86-64 build may ask it.
    let native_x86 = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::env::var("HOST") == std::env::var("TARGET");
    #[cfg(target_arch = "x86_64")]
    if native_x86 {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if avx2 {
            println!("cargo::rustc-cfg=yomi_host_avx2");
        }
        if avx2 && is_x86_feature_detected!("avxvnni") {
            println!("cargo::rustc-cfg=yomi_host_avxvnni");
        }
        if avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
        {
            println!("cargo::rustc-cfg=yomi_host_avx512vnni");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native_x86;
    println!("cargo::rerun-if-changed=build.rs");
}
