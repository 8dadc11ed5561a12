//! The CUDA backend's switches: one [`CudaOptions`] value given to [`CudaDevice::open_with`]
//! (or [`crate::model::attach`]), which everything running on that device reads
//! ([`CudaDevice::options`]). This crate reads no environment: the `yomi` binary fills these
//! from its `YOMI_CUDA_*` variables and the kernel cache folder from `XDG_CACHE_HOME`/`HOME`
//! (see its `settings.rs`).
//!
//! [`CudaDevice::open_with`]: crate::CudaDevice::open_with
//! [`CudaDevice::options`]: crate::CudaDevice::options

use std::path::PathBuf;

use crate::attention::ATTN_MMA_MIN_ROWS;

/// How the CUDA backend runs. `Default` is what the `yomi` binary does with no `YOMI_CUDA_*`
/// variable set, except for the kernel cache (none by default: see
/// [`CudaOptions::kernel_cache_dir`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Replay passes of up to `MAX_ROWS` rows as CUDA graphs (default true;
    /// `YOMI_CUDA_GRAPHS=0` turns it off).
    pub graphs: bool,
    /// Rank each logits row on the device and copy back its top-64 candidates only (default
    /// true); false copies every pass's full logits rows back (`YOMI_CUDA_TOPK=0`).
    pub topk: bool,
    /// Fuse projections of one input into one matrix at upload (the GDN in-projection, the
    /// attention q/k/v, the MLP's gate|up, with the SwiGLU epilogue of the bf16 gate|up GEMV and
    /// the GDN conv folded into the q/k/v split); default true, false keeps them apart for
    /// comparisons (`YOMI_CUDA_FUSE=0`).
    pub fuse: bool,
    /// Launch with programmatic dependent launch on devices of compute capability 9.0 and later
    /// (default false; `YOMI_CUDA_PDL=1`; see `launch.rs`).
    pub pdl: bool,
    /// Passes of at least this many rows take the tensor-core attention kernel where the device
    /// and head size allow it; None keeps attention on the CUDA cores (default
    /// `Some(ATTN_MMA_MIN_ROWS)`; `YOMI_CUDA_ATTN_MMA=<rows>`, `=0` for None).
    pub attn_mma_from: Option<usize>,
    /// Run linear layers of more than 32 rows through cuBLAS when libcublas loads (default
    /// true); false takes yomi's own tensor-core GEMM kernel (`YOMI_CUDA_CUBLAS=0`).
    pub cublas: bool,
    /// Run linear layers of more than 32 rows as GEMMs (default true); false runs them as
    /// consecutive 32-row GEMV launches, the reference (`YOMI_CUDA_GEMM=0`).
    pub gemm: bool,
    /// Keep the activations' low bf16 plane in the GEMM (about 16 significant bits; default
    /// true); false drops it: bf16 activations, faster, relative error about 1.5e-3
    /// (`YOMI_CUDA_GEMM_LO=0`).
    pub gemm_lo: bool,
    /// Ask the engine for prefill passes of `CHUNK_ROWS` rows, so each weight is read once per
    /// chunk (default true); false leaves the engine's own prefill size (`YOMI_CUDA_CHUNK=0`).
    pub chunk: bool,
    /// Where compiled kernels (PTX) are cached between processes; None compiles them in every
    /// process. Default None; the `yomi` binary passes
    /// [`crate::kernels::cache_dir_from`]`(XDG_CACHE_HOME, HOME)`.
    pub kernel_cache_dir: Option<PathBuf>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            graphs: true,
            topk: true,
            fuse: true,
            pdl: false,
            attn_mma_from: Some(ATTN_MMA_MIN_ROWS),
            cublas: true,
            gemm: true,
            gemm_lo: true,
            chunk: true,
            kernel_cache_dir: None,
        }
    }
}
