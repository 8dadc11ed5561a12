//! yomi's CUDA backend (DESIGN §5): whole models on an NVIDIA GPU behind `--device cuda|auto`.
//!
//! - `backend.rs`: the op set of `yomi_core::backend` on the device, so the architecture files
//!   of `yomi-models` run here as on the CPU (fused projections read through strided views,
//!   mixer cores in pieces of 32 rows, the pending → commit contract of DESIGN §4).
//!   The executor that runs a loaded model's passes through it (weights uploaded once, a device
//!   state per sequence, CUDA graphs per pass shape) is `yomi_engine::cuda`: this crate knows
//!   nothing of models.
//! - The ops, each checked against its yomi-cpu twin by the `#[ignore]`d tests in
//!   `tests/gpu*.rs` (H200 numbers in bench/RESULTS.md): RMSNorm, RoPE, SwiGLU (`ops.rs`,
//!   `glue.rs`); GEMV over T ≤ 32 rows for f32/bf16/f16 (`gemv.cu`, SIMT and tensor-core
//!   kernels) and GGUF blocks Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K (`quant.rs`, `gemv_quant.cu`, with a
//!   quantized embedding gather), and a GEMM past 32 rows (`gemm.rs`: cuBLAS on bf16 planes of
//!   the weights and activations, or yomi's own tensor-core kernel over the tile layout); up
//!   to 32 rows chosen so a row's result does not depend on T (batch
//!   invariance: speculative output equals plain output), with a SwiGLU epilogue for a fused
//!   bf16 gate|up; Gated DeltaNet one-row step and tree verify (`gdn.cu`); tree attention over
//!   the KV cache, split-K, on tensor cores (3xTF32) or CUDA cores (`attention.rs`); tree conv1d
//!   (`conv.rs`, also folded into the GDN q/k/v split); the glue of a pass (embedding, splits,
//!   gates, K/V store, gathers); and the top-64 candidates of each logits row for sampling on
//!   the host (`topk.rs`).
//!
//! Built on cudarc with dynamic loading: the crate builds and its tests pass on machines with no
//! CUDA at all. Every entry point first checks that the library it needs can be loaded
//! (`is_culib_present`) and runs cudarc behind `catch_unwind`, because cudarc panics instead of
//! returning an error when a library is missing; the caller always gets a [`CudaError`].
//!
//! Kernels live in `kernels/*.cu` (plus the prelude `kernels/common.cuh`), are embedded with
//! `include_str!`, compiled by NVRTC for the device's own architecture (`sm_XY` from its compute
//! capability) on first use and cached as PTX in [`CudaOptions::kernel_cache_dir`] (the `yomi`
//! binary's is `$XDG_CACHE_HOME/yomi/kernels/`, falling back to `~/.cache/yomi/kernels/`),
//! keyed by a hash of the source, the options and the NVRTC version. They need no CUDA headers,
//! so no include directory is looked up.
//!
//! Every switch of the backend is a field of [`CudaOptions`], given to the device when it is
//! opened; the crate reads no environment.

pub mod attention;
pub mod backend;
mod conv;
mod device;
mod error;
mod gemm;
mod glue;
pub use gemm::GemmRoute;
pub use glue::{AttnPrepSources, GdnConvArgs, GdnGateArgs};
pub mod kernels;
mod launch;
mod ops;
mod options;
mod quant;
mod topk;

pub use attention::{
    ATTN_HEAD_DIMS, ATTN_KEY_BATCH, ATTN_MAX_GROUP, ATTN_MAX_SPLITS, AttnDims, AttnPlan,
    AttnScratch, AttnScratchShape, ancestor_bits, attn_mma_smem, attn_plan, attn_plan_for,
    split_range,
};
pub use conv::CONV_MAX_K;
pub use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
pub use device::{CudaDevice, ModuleInfo};
pub use error::{CudaError, Result};
pub use ops::{
    DeviceMatrix, GEMM_MIN_ROWS, GateUpMatrix, GdnDeviceRows, GdnShape, GemvKernel, WeightDtype,
    bf16_tile_index, bf16_tiles_len, gate_up_source_row, gemv_variant, interleave_gate_up,
    linear_kernel, tc_warps,
};
pub use options::CudaOptions;
pub use quant::QuantFormat;
pub use topk::{TOPK, TOPK_ROW_WORDS, TopkScratch, unpack_top};

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Whether the CUDA driver library can be loaded (no panic, no driver call).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded (no panic, no NVRTC call).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the NVRTC library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// True when a CUDA driver is present and reports at least one device. Never panics.
pub fn cuda_available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// Number of CUDA devices, or why there are none to count.
pub fn device_count() -> Result<usize> {
    guard("device_count", || {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let n =
            CudaContext::device_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
        Ok(n.max(0) as usize)
    })
}

/// Runs `f`, turning a panic inside cudarc into [`CudaError::Panic`].
pub(crate) fn guard<T>(what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = if let Some(s) = p.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = p.downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic payload".to_string()
            };
            Err(CudaError::Panic { what, msg })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without libcuda (CI, the developers' machines) nothing panics: the
    /// availability check is false and opening a device is an error with a clear message.
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if driver_present() {
            eprintln!("libcuda is present here; the no-driver behaviour is not checked");
            return;
        }
        assert!(!cuda_available());
        let e = CudaDevice::open(0).expect_err("open must fail without a driver");
        assert!(matches!(e, CudaError::NoDriver), "{e:?}");
        assert_eq!(e.to_string(), "no CUDA driver (libcuda.so) found");
        let e = device_count().unwrap_err();
        assert!(e.to_string().contains("no CUDA driver (libcuda.so) found"));
    }

    #[test]
    fn guard_turns_a_panic_into_an_error() {
        let r: Result<()> = guard("test", || panic!("boom"));
        match r {
            Err(CudaError::Panic { what, msg }) => {
                assert_eq!(what, "test");
                assert_eq!(msg, "boom");
            }
            other => panic!("unexpected {other:?}"),
        }
        let r: Result<u32> = guard("test", || panic!("{}", String::from("dyn")));
        assert!(r.unwrap_err().to_string().contains("dyn"));
    }
}
