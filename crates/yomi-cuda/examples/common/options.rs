//! The CUDA switches of the `yomi` binary for this crate's example programs and GPU tests: the
//! `YOMI_CUDA_*` variables and the kernel cache folder (`XDG_CACHE_HOME`, `HOME`), read here as
//! the binary reads them (their meaning: `crates/yomi-cli/src/settings.rs`) into the
//! [`CudaOptions`] a device is opened with. The library reads no environment.

use yomi_cuda::CudaOptions;

/// The options the environment gives (the rest default); panics on a value the binary refuses.
pub fn cuda_options_from_env() -> CudaOptions {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let flag = |name: &str, default: bool| match var(name).as_deref().map(str::trim) {
        None => default,
        Some("1") => true,
        Some("0") => false,
        Some(v) => panic!("{name}={v:?}: expected 0 or 1"),
    };
    let d = CudaOptions::default();
    CudaOptions {
        graphs: flag("YOMI_CUDA_GRAPHS", d.graphs),
        topk: flag("YOMI_CUDA_TOPK", d.topk),
        fuse: flag("YOMI_CUDA_FUSE", d.fuse),
        pdl: flag("YOMI_CUDA_PDL", d.pdl),
        attn_mma_from: match var("YOMI_CUDA_ATTN_MMA") {
            None => d.attn_mma_from,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => panic!("YOMI_CUDA_ATTN_MMA={v:?}: expected a row count (0: off)"),
            },
        },
        cublas: flag("YOMI_CUDA_CUBLAS", d.cublas),
        gemm: flag("YOMI_CUDA_GEMM", d.gemm),
        gemm_lo: flag("YOMI_CUDA_GEMM_LO", d.gemm_lo),
        chunk: flag("YOMI_CUDA_CHUNK", d.chunk),
        kernel_cache_dir: yomi_cuda::kernels::cache_dir_from(
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        ),
    }
}
