//! Tells the tests which instruction sets the build host has (`cfg(yomi_host_avx2)`,
//! `cfg(yomi_host_avxvnni)`, `cfg(yomi_host_avx512f)`, `cfg(yomi_host_avx512vnni)`,
//! `cfg(yomi_host_amx)`), so that a kernel's parity test is ignored (reported as not run, never
//! counted as passing) on a machine that cannot run it, and runs on one that can. The kernels
//! themselves choose by run-time detection (`Isa::is_supported` in `src/quant/mod.rs` and
//! `amx::available` in `src/quant/amx.rs`, whose conditions these repeat); tests run where they
//! are built. A build reused on another machine keeps the first host's answer; a test it let
//! run on a CPU without the ISA fails and says to rebuild (`require` and `require_amx` in the
//! tests). Not rerun per boot: that would recompile the crate and all above it every time.
//!
//! AMX counts only where the OS hands out the tile data state too: CPUID's AMX-TILE and
//! AMX-INT8 bits, and on Linux `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` granted to
//! this build script's process (the same request `amx::available` makes; a kernel or sandbox
//! that refuses it refuses the tests' process alike). Elsewhere there is no AMX path.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avx2)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avxvnni)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avx512f)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_avx512vnni)");
    println!("cargo::rustc-check-cfg=cfg(yomi_host_amx)");
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
        if is_x86_feature_detected!("avx512f") {
            println!("cargo::rustc-cfg=yomi_host_avx512f");
        }
        let avx512vnni = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if avx512vnni {
            println!("cargo::rustc-cfg=yomi_host_avx512vnni");
        }
        if avx512vnni && amx_int8() {
            println!("cargo::rustc-cfg=yomi_host_amx");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native_x86;
    println!("cargo::rerun-if-changed=build.rs");
}

/// CPUID's AMX-TILE and AMX-INT8 (leaf 7, EDX bits 24 and 25) and the OS's tile data state for
/// this process, as `amx::available` asks them.
#[cfg(target_arch = "x86_64")]
fn amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx >> 24 & 1 == 1 && edx >> 25 & 1 == 1 && request_tile_state()
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: true when the kernel granted it.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> bool {
    /// `SYS_arch_prctl` on x86-64 Linux.
    const SYS_ARCH_PRCTL: i64 = 158;
    /// `arch_prctl` request: permission for an extended state component.
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    /// The AMX tile data state component.
    const XFEATURE_XTILEDATA: u64 = 18;
    let ret: i64;
    // SAFETY: the `arch_prctl` system call with a request that only changes this process's
    // permitted extended state (it reads and writes no user memory); `syscall` clobbers rcx
    // and r11, declared below, and returns in rax.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// No AMX path off Linux (`amx::available` says no there too).
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_state() -> bool {
    false
}
